//! A whole frame received before a half-close is executed and answered.
//!
//! The client pipelines Unlock and TryLock of a free key in one write and
//! half-closes at once (`TCP_NODELAY`, no delay between the write and the
//! `shutdown`), so the FIN usually arrives in the same tick as the frames.
//! The TryLock's grant only waits for the tick's send, so it is delivered:
//! `++`, and the key is held afterwards. It used to be given back as if it
//! waited for the log (`+-`, the key free, an undelivered grant counted).

mod common;

use common::*;
use std::io::Read;

fn pipelined_half_close(threads: &str) {
    let srv = Server::start(&["--threads", threads, "--metrics-bind", "127.0.0.1:0"]);
    for i in 0..200 {
        // One key, and the peer's address as the source (empty source
        // field): the shape that reproduced it nearly every time.
        let key = "k0";
        let mut c = Conn::persistent(srv.lock_addr);
        let mut req = frame(2, b"u", None);
        req.extend_from_slice(&frame(5, key.as_bytes(), Some(b"")));
        c.send(&req);
        c.half_close();
        let mut answers = Vec::new();
        c.s.read_to_end(&mut answers).expect("read to EOF");
        assert_eq!(
            answers, b"++",
            "{threads} shard(s), round {i}: Unlock+TryLock then half-close"
        );
        // The TryLock really holds the key ...
        assert_eq!(
            once(srv.lock_addr, &frame(5, key.as_bytes(), Some(b"other"))),
            b'#',
            "{threads} shard(s), round {i}: {key} is held"
        );
        assert_eq!(once(srv.lock_addr, &frame(2, key.as_bytes(), None)), b'+');
    }
    // ... and no grant was given back as undelivered.
    assert_eq!(
        metric(srv.metrics(), "ringlock_undelivered_grants_total"),
        0.0,
        "{threads} shard(s)"
    );
}

#[test]
fn pipelined_unlock_and_trylock_before_a_half_close_are_both_answered_one_shard() {
    pipelined_half_close("1");
}

#[test]
fn pipelined_unlock_and_trylock_before_a_half_close_are_both_answered_two_shards() {
    pipelined_half_close("2");
}

#[test]
fn pipelined_unlock_and_trylock_before_a_half_close_are_both_answered_four_shards() {
    pipelined_half_close("4");
}

/// The event order behind it, driven on the shard itself (no timing): the
/// Unlock's send completes and the EOF arrives in the same tick, the send
/// first. The send completion pumps the TryLock, whose `+` then only
/// waits for the end of the tick; the EOF must not give that grant back.
#[test]
fn a_grant_ready_in_the_tick_that_sees_the_eof_is_delivered() {
    use ringlock::config::Config;
    use ringlock::core::{Limits, Now, Table};
    use ringlock::metrics::Metrics;
    use ringlock::shard::conn::Port;
    use ringlock::shard::{Cmd, Shard};
    use std::sync::Arc;

    let now = Now {
        mono_us: 1_000_000,
        unix_ms: 1_700_000_000_000,
    };
    let cfg = Config::new("127.0.0.1:0".parse().expect("address"));
    let table = Table::new(Limits {
        max_keys: 16,
        max_waiters: 16,
    });
    let mut shard = Shard::new(cfg, table, None, Arc::new(Metrics::new()), now);
    let mut cmds = Vec::new();
    // Runs the end of a tick; the bytes each connection is sent.
    let end_tick = |shard: &mut Shard, cmds: &mut Vec<Cmd>| -> Vec<u8> {
        shard.end_tick();
        shard.take_cmds(cmds);
        let mut sent = Vec::new();
        for c in cmds.drain(..) {
            if let Cmd::Send(t) = c {
                shard.take_output(t, &mut sent);
            }
        }
        sent
    };
    shard.begin_tick(now);
    let peer = "127.0.0.9:5000".parse().expect("address");
    let t = shard.on_accept(Port::Lock, peer).expect("accepted");
    shard.on_recv(t, &[6]);
    assert_eq!(end_tick(&mut shard, &mut cmds), b"+", "Persist");
    shard.begin_tick(now);
    shard.on_send_done(t, Ok(()));
    let mut req = frame(2, b"u", None);
    req.extend_from_slice(&frame(5, b"k0", Some(b"")));
    shard.on_recv(t, &req);
    assert_eq!(end_tick(&mut shard, &mut cmds), b"+", "Unlock");
    // One tick: the Unlock's send completes, then the EOF.
    shard.begin_tick(now);
    shard.on_send_done(t, Ok(()));
    shard.on_peer_closed(t, None);
    assert_eq!(
        end_tick(&mut shard, &mut cmds),
        b"+",
        "the TryLock's answer after the EOF"
    );
    assert!(
        shard.table().holder_of(b"k0").is_some(),
        "the TryLock's grant was given back"
    );
}
