//! When the driver receives again on a lock-port connection
//! (`Shard::wants_input`): not after a one-shot request whose answer is
//! decided and free to leave (it goes out this tick and the connection
//! closes after it — no receive to re-arm and cancel), but always where a
//! hang-up still matters: a queued Lock, an answer waiting for the log, a
//! persistent connection. Driven on the shard itself (no timing).

mod common;
use common::frame;

use std::sync::Arc;

use ringlock::config::Config;
use ringlock::core::{Limits, Now, Table, Token};
use ringlock::metrics::Metrics;
use ringlock::shard::conn::Port;
use ringlock::shard::{Cmd, Shard};
use ringlock::wal::log::Log;
use ringlock::wal::record::MAGIC;

const NOW: Now = Now {
    mono_us: 1_000_000,
    unix_ms: 1_700_000_000_000,
};

fn shard(durable: bool) -> Shard {
    let cfg = Config::new("127.0.0.1:0".parse().expect("address"));
    let table = Table::new(Limits {
        max_keys: 16,
        max_waiters: 16,
    });
    let log = durable.then(|| Log::new(MAGIC.len() as u64, &table, 1 << 20));
    let mut s = Shard::new(cfg, table, log, Arc::new(Metrics::new()), NOW);
    s.begin_tick(NOW);
    s
}

fn accept(s: &mut Shard) -> Token {
    s.on_accept(Port::Lock, "127.0.0.9:5000".parse().expect("address"))
        .expect("accepted")
}

/// Ends the tick; the bytes sent to `t`.
fn end_tick(s: &mut Shard, t: Token) -> Vec<u8> {
    s.end_tick();
    let mut cmds = Vec::new();
    s.take_cmds(&mut cmds);
    let mut sent = Vec::new();
    for c in cmds {
        if let Cmd::Send(x) = c {
            if x == t {
                s.take_output(x, &mut sent);
            }
        }
    }
    s.begin_tick(NOW);
    sent
}

#[test]
fn a_decided_one_shot_answer_needs_no_further_receive() {
    let mut s = shard(false);
    let t = accept(&mut s);
    assert!(s.wants_input(t), "nothing received yet");
    s.on_recv(t, &frame(5, b"k", Some(b"src")));
    assert!(
        !s.wants_input(t),
        "a one-shot TryLock's `+` is decided: no receive to re-arm"
    );
    assert_eq!(end_tick(&mut s, t), b"+");
}

#[test]
fn a_partial_one_shot_frame_still_wants_its_rest() {
    let mut s = shard(false);
    let t = accept(&mut s);
    let f = frame(5, b"k", Some(b"src"));
    s.on_recv(t, &f[..2]);
    assert!(s.wants_input(t), "half a frame");
    s.on_recv(t, &f[2..]);
    assert!(!s.wants_input(t));
}

#[test]
fn a_queued_one_shot_lock_keeps_receiving_to_see_its_hang_up() {
    let mut s = shard(false);
    let holder = accept(&mut s);
    s.on_recv(holder, &frame(1, b"k", Some(b"a")));
    assert_eq!(end_tick(&mut s, holder), b"+");
    let waiter = accept(&mut s);
    s.on_recv(waiter, &frame(1, b"k", Some(b"b")));
    assert!(s.wants_input(waiter), "queued: its hang-up withdraws it");
    s.on_peer_closed(waiter, None);
    assert_eq!(s.table().queued_waiters(), 0, "withdrawn at the EOF");
}

#[test]
fn a_one_shot_answer_waiting_for_the_log_keeps_receiving() {
    let mut s = shard(true);
    let t = accept(&mut s);
    s.on_recv(t, &frame(5, b"k", Some(b"src")));
    assert!(
        s.wants_input(t),
        "the `+` waits for the fdatasync: a hang-up meanwhile gives the grant back"
    );
}

#[test]
fn a_persistent_connection_keeps_receiving() {
    let mut s = shard(false);
    let t = accept(&mut s);
    s.on_recv(t, &[6]);
    assert!(s.wants_input(t), "Persist answered");
    assert_eq!(end_tick(&mut s, t), b"+");
    s.on_send_done(t, Ok(()));
    s.on_recv(t, &frame(5, b"k", Some(b"src")));
    assert!(s.wants_input(t), "a persistent connection's next request");
}
