//! `--max-keys` and `--max-waiters` bound the whole server as given, on
//! any number of shards (they used to apply per shard, so the limit grew
//! with the CPU count). Keys spread over every shard; exactly the limit is
//! granted or queued, the rest answered `-`, and what is freed can be
//! taken again.

mod common;

use common::*;
use std::io::Read;
use std::time::Duration;

const MAX_KEYS: usize = 8;
const MAX_WAITERS: usize = 3;

/// Sends a Lock of a held key on a new connection and returns whether it
/// was queued (`true`: the queued gauge rose) or refused (`-`).
fn queue_or_refuse(srv: &Server, key: &[u8], queued: &mut usize) -> (bool, Conn) {
    let mut c = Conn::connect(srv.lock_addr);
    c.send(&frame(1, key, Some(b"w")));
    c.s.set_nonblocking(true).expect("nonblocking");
    for _ in 0..10_000 {
        let mut b = [0u8; 1];
        match c.s.read(&mut b) {
            Ok(1) => {
                assert_eq!(b[0], b'-', "a Lock of a held key answered at once");
                return (false, c);
            }
            Ok(_) => panic!("EOF without an answer"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("read: {e}"),
        }
        if metric(srv.metrics(), "ringlock_queued_waiters") as usize == *queued + 1 {
            *queued += 1;
            return (true, c);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("neither queued nor refused");
}

fn limits_are_server_wide(threads: &str) {
    let srv = Server::start(&[
        "--threads",
        threads,
        "--max-keys",
        &MAX_KEYS.to_string(),
        "--max-waiters",
        &MAX_WAITERS.to_string(),
        "--metrics-bind",
        "127.0.0.1:0",
    ]);
    // 40 distinct keys hash over every shard: only MAX_KEYS are granted.
    let names: Vec<Vec<u8>> = (0..40).map(|i| format!("key-{i}").into_bytes()).collect();
    let mut granted = Vec::new();
    for k in &names {
        match once(srv.lock_addr, &frame(5, k, Some(b"s"))) {
            b'+' => granted.push(k.clone()),
            b'-' => {}
            other => panic!("TryLock of a fresh key answered {:?}", other as char),
        }
    }
    assert_eq!(granted.len(), MAX_KEYS, "{threads} shard(s): keys granted");
    assert_eq!(keys(srv.admin_addr).len(), MAX_KEYS);
    // Lock requests on held keys (of every shard): only MAX_WAITERS queue.
    let mut queued = 0;
    let mut waiting = Vec::new();
    let mut refused = 0;
    for i in 0..10 {
        let (q, c) = queue_or_refuse(&srv, &granted[i % granted.len()], &mut queued);
        if q {
            waiting.push(c);
        } else {
            refused += 1;
        }
    }
    assert_eq!(
        (waiting.len(), refused),
        (MAX_WAITERS, 10 - MAX_WAITERS),
        "{threads} shard(s): waiters queued and refused"
    );
    // Freed keys and waiters go back to the server's budget.
    drop(waiting);
    wait_metric(srv.metrics(), "ringlock_queued_waiters", 0.0);
    for k in &granted {
        assert_eq!(once(srv.lock_addr, &frame(2, k, None)), b'+');
    }
    let again = names
        .iter()
        .rev()
        .filter(|k| once(srv.lock_addr, &frame(5, k, Some(b"s"))) == b'+')
        .count();
    assert_eq!(again, MAX_KEYS, "{threads} shard(s): keys granted again");
}

#[test]
fn key_and_waiter_limits_are_the_servers_one_shard() {
    limits_are_server_wide("1");
}

#[test]
fn key_and_waiter_limits_are_the_servers_two_shards() {
    limits_are_server_wide("2");
}

#[test]
fn key_and_waiter_limits_are_the_servers_four_shards() {
    limits_are_server_wide("4");
}
