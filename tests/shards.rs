//! Several shards (`--threads N`): a key keeps every guarantee of one shard
//! whatever shard a client's connection first landed on. Connections land
//! by the kernel's SO_REUSEPORT hash, so with 4 shards and many connections
//! most requests are handed to another shard first.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const QUEUED: &str = "ringlock_queued_waiters";

fn start(threads: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--threads", threads, "--metrics-bind", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    Server::start(&args)
}

#[test]
fn fifo_on_one_hot_key_across_shards() {
    let s = start("4", &[]);
    let m = s.metrics();
    let mut holder = s.connect();
    assert_eq!(holder.lock(b"hot", b"h"), b'+');
    // Twelve waiters on fresh connections: spread over the shards, each
    // handed to the owner of "hot". Each is queued before the next sends.
    let mut waiters: Vec<Conn> = Vec::new();
    for i in 0..12 {
        let mut c = s.connect_oneshot();
        c.send(&frame(1, b"hot", Some(format!("w{i}").as_bytes())));
        wait_metric(m, QUEUED, (i + 1) as f64);
        waiters.push(c);
    }
    assert_eq!(holder.unlock(b"hot"), b'+');
    for (i, w) in waiters.iter_mut().enumerate() {
        assert_eq!(w.read_byte(), b'+', "waiter {i} not granted next");
        let held = keys(s.admin_addr);
        assert_eq!(held.len(), 1);
        assert_eq!(
            held[0].source,
            format!("w{i}").into_bytes(),
            "grant out of FIFO order"
        );
        // One-shot: the connection closes after the `+`; release on another.
        assert_eq!(once(s.lock_addr, &frame(2, b"hot", None)), b'+');
    }
    assert!(keys(s.admin_addr).is_empty());
}

#[test]
fn a_waiter_handed_to_another_shard_is_withdrawn_when_it_hangs_up() {
    let s = start("4", &[]);
    let m = s.metrics();
    let mut holder = s.connect();
    assert_eq!(holder.lock(b"w", b"h"), b'+');
    let mut stay = Vec::new();
    let mut leave = Vec::new();
    for i in 0..8 {
        let mut c = s.connect_oneshot();
        c.send(&frame(1, b"w", Some(format!("s{i}").as_bytes())));
        wait_metric(m, QUEUED, (2 * i + 1) as f64);
        stay.push(c);
        let mut g = s.connect_oneshot();
        g.send(&frame(1, b"w", Some(format!("g{i}").as_bytes())));
        wait_metric(m, QUEUED, (2 * i + 2) as f64);
        leave.push(g);
    }
    // Half of them leave (one half-closes, the other closes): withdrawn at
    // once by whichever shard serves them now.
    for (i, g) in leave.into_iter().enumerate() {
        if i % 2 == 0 {
            g.half_close();
            std::mem::forget(g); // keep the socket open, input ended
        } else {
            drop(g);
        }
    }
    wait_metric(m, QUEUED, 8.0);
    assert_eq!(holder.unlock(b"w"), b'+');
    for (i, c) in stay.iter_mut().enumerate() {
        assert_eq!(c.read_byte(), b'+', "waiter s{i}");
        let held = keys(s.admin_addr);
        assert_eq!(
            held[0].source,
            format!("s{i}").into_bytes(),
            "a withdrawn waiter was granted"
        );
        assert_eq!(once(s.lock_addr, &frame(2, b"w", None)), b'+');
    }
    assert!(keys(s.admin_addr).is_empty(), "no ghost holder");
}

#[test]
fn persistent_connection_with_keys_of_every_shard_and_pipelining() {
    let s = start("4", &[]);
    let mut c = s.connect();
    // Pipelined requests naming keys of different shards: answered in order.
    let names: Vec<String> = (0..16).map(|i| format!("k{i}")).collect();
    let mut bytes = Vec::new();
    for k in &names {
        bytes.extend_from_slice(&frame(5, k.as_bytes(), Some(b"p")));
    }
    bytes.extend_from_slice(&frame(5, b"k3", Some(b"p")));
    c.send(&bytes);
    for k in &names {
        assert_eq!(c.read_byte(), b'+', "{k}");
    }
    assert_eq!(c.read_byte(), b'#', "k3 is held: answered after the others");
    // KEYS gathers every shard, sorted by key bytes.
    let held: Vec<Vec<u8>> = keys(s.admin_addr).into_iter().map(|k| k.key).collect();
    let mut want: Vec<Vec<u8>> = names.iter().map(|k| k.clone().into_bytes()).collect();
    want.sort();
    assert_eq!(held, want);
    // RSET of some keys (each reset by its owner), ResetBySource on the
    // lock port (every shard).
    assert_eq!(
        admin_names(s.admin_addr, b"RSET", &[b"k1", b"k2", b"nope"]),
        b"++++"
    );
    assert_eq!(keys(s.admin_addr).len(), 14);
    assert_eq!(c.reset_source(b"p"), b'+');
    assert!(keys(s.admin_addr).is_empty());
    // The same connection still serves keys of every shard.
    for k in &names {
        assert_eq!(c.try_lock(k.as_bytes(), b"q"), b'+');
    }
    assert_eq!(admin_names(s.admin_addr, b"RSBS", &[b"q"]), b"++");
    assert!(keys(s.admin_addr).is_empty());
}

#[test]
fn mutual_exclusion_across_shards() {
    const THREADS: usize = 12;
    const ROUNDS: usize = 60;
    let s = start("4", &[]);
    let addr = s.lock_addr;
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = (0..THREADS)
        .map(|t| {
            let (counter, inside) = (counter.clone(), inside.clone());
            std::thread::spawn(move || {
                let mut p = Conn::persistent(addr);
                for r in 0..ROUNDS {
                    let src = format!("t{t}");
                    let fresh = (t + r) % 2 == 0;
                    let got = if fresh {
                        once(addr, &frame(1, b"shared", Some(src.as_bytes())))
                    } else {
                        p.lock(b"shared", src.as_bytes())
                    };
                    assert_eq!(got, b'+');
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    let v = counter.load(Ordering::Relaxed);
                    std::thread::yield_now();
                    counter.store(v + 1, Ordering::Relaxed);
                    inside.store(false, Ordering::SeqCst);
                    let un = if fresh {
                        once(addr, &frame(2, b"shared", None))
                    } else {
                        p.unlock(b"shared")
                    };
                    assert_eq!(un, b'+');
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("client thread");
    }
    assert_eq!(counter.load(Ordering::Relaxed), (THREADS * ROUNDS) as u64);
}

/// Highest grant id recorded in the logs next to `path` (every generation
/// file), and the next id marks.
fn max_grant_id(dir: &std::path::Path) -> u64 {
    use ringlock::wal::record::{scan, Record, Scan};
    let mut max = 0;
    for e in std::fs::read_dir(dir).expect("log dir").flatten() {
        let data = std::fs::read(e.path()).expect("read log");
        if let Scan::Ok { records, .. } = scan(&data) {
            for r in records {
                match r {
                    Record::Acquire(h) => max = max.max(h.grant_id),
                    Record::GrantMark { next_grant_id } => {
                        max = max.max(next_grant_id.saturating_sub(1))
                    }
                    Record::Release { grant_id, .. } | Record::Extend { grant_id, .. } => {
                        max = max.max(grant_id)
                    }
                    // Cluster entries only.
                    Record::SessionOpen { .. } | Record::SessionEnd { .. } => {}
                }
            }
        }
    }
    max
}

#[test]
fn restart_with_1_then_4_then_2_shards_keeps_every_held_key() {
    let dir = TempDir::new("reshard");
    let log = dir.path("locks.wal");
    let log = log.to_str().expect("utf-8 path").to_string();
    let mut held_before;
    {
        let s = start("1", &["--data-path", &log]);
        let mut c = s.connect();
        for i in 0..40 {
            assert_eq!(
                c.try_lock(
                    format!("key{i:02}").as_bytes(),
                    format!("src{}", i % 3).as_bytes()
                ),
                b'+'
            );
        }
        for i in 0..10 {
            assert_eq!(c.unlock(format!("key{i:02}").as_bytes()), b'+');
        }
        held_before = keys(s.admin_addr);
        assert_eq!(held_before.len(), 30);
    }
    let mut last_id = max_grant_id(&dir.0);
    for threads in ["4", "2", "2", "1"] {
        let mut s = start(threads, &["--data-path", &log]);
        let now = keys(s.admin_addr);
        assert_eq!(now, held_before, "after restarting with {threads} shards");
        // New grants get larger ids than any before (per key and overall).
        let mut c = s.connect();
        let k = format!("new{threads}{}", now.len());
        assert_eq!(c.try_lock(k.as_bytes(), b"n"), b'+');
        assert_eq!(c.try_lock(b"key15", b"x"), b'#', "held keys stay held");
        held_before = keys(s.admin_addr);
        s.kill9();
        let id = max_grant_id(&dir.0);
        assert!(id > last_id, "grant ids went back: {id} after {last_id}");
        last_id = id;
    }
}

/// `event=reshard` lines of a start-up (they come before `listening`).
fn reshard_lines(s: &Server) -> Vec<&str> {
    s.startup_log
        .iter()
        .filter(|l| l.contains(" event=reshard "))
        .map(String::as_str)
        .collect()
}

/// A first durable start with several shards on an empty folder creates
/// the shards' logs: nothing is moved, so nothing is logged as a reshard;
/// a later start with another count is one, and says so.
#[test]
fn a_fresh_data_path_is_not_a_reshard() {
    let dir = TempDir::new("fresh-shards");
    let log = dir.path("locks.wal");
    let log = log.to_str().expect("utf-8 path").to_string();
    let mut s = start("2", &["--data-path", &log]);
    assert_eq!(reshard_lines(&s), Vec::<&str>::new(), "{:?}", s.startup_log);
    assert_eq!(s.connect().try_lock(b"kept", b"s"), b'+');
    s.kill9();
    let mut s = start("3", &["--data-path", &log]);
    let lines = reshard_lines(&s);
    assert_eq!(lines.len(), 1, "{:?}", s.startup_log);
    assert!(
        lines[0].contains(" from_shards=2 to_shards=3 generation=2 held_keys=1"),
        "{lines:?}"
    );
    s.kill9();
    // The same with one shard first: its single log is resharded.
    let log1 = dir.path("one.wal");
    let log1 = log1.to_str().expect("utf-8 path").to_string();
    let mut s = start("1", &["--data-path", &log1]);
    assert_eq!(reshard_lines(&s), Vec::<&str>::new());
    s.kill9();
    let s = start("2", &["--data-path", &log1]);
    let lines = reshard_lines(&s);
    assert_eq!(lines.len(), 1, "{:?}", s.startup_log);
    assert!(
        lines[0].contains(" from_shards=1 to_shards=2 generation=1 held_keys=0"),
        "{lines:?}"
    );
}

#[test]
fn kill9_cycles_with_two_shards_keep_acknowledged_locks() {
    let dir = TempDir::new("shard-crash");
    let log = dir.path("locks.wal");
    let log = log.to_str().expect("utf-8 path").to_string();
    let mut acked: Vec<Vec<u8>> = Vec::new();
    for cycle in 0..6 {
        let mut s = start("2", &["--data-path", &log]);
        let now: Vec<Vec<u8>> = keys(s.admin_addr).into_iter().map(|k| k.key).collect();
        for k in &acked {
            assert!(now.contains(k), "cycle {cycle}: acknowledged {k:?} lost");
        }
        let mut c = s.connect();
        for i in 0..10 {
            let k = format!("c{cycle}k{i}").into_bytes();
            assert_eq!(c.try_lock(&k, b"s"), b'+');
            acked.push(k);
        }
        // One release per cycle, acknowledged: must not come back.
        let gone = acked.remove(0);
        assert_eq!(c.unlock(&gone), b'+');
        s.kill9();
        let s = start("2", &["--data-path", &log]);
        let now: Vec<Vec<u8>> = keys(s.admin_addr).into_iter().map(|k| k.key).collect();
        assert!(
            !now.contains(&gone),
            "cycle {cycle}: acknowledged unlock undone"
        );
    }
}

#[test]
fn sigterm_stops_every_shard_and_answers_their_waiters() {
    let mut s = start("4", &[]);
    let m = s.metrics();
    let mut holders = Vec::new();
    let mut waiters = Vec::new();
    for i in 0..8 {
        let k = format!("t{i}");
        let mut h = s.connect();
        assert_eq!(h.lock(k.as_bytes(), b"h"), b'+');
        holders.push(h);
        let mut w = s.connect_oneshot();
        w.send(&frame(1, k.as_bytes(), Some(b"w")));
        wait_metric(m, QUEUED, (i + 1) as f64);
        waiters.push(w);
    }
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(s.pid() as i32, libc::SIGTERM) };
    for w in &mut waiters {
        assert_eq!(w.read_byte_or_eof(), Some(b'-'));
    }
    let status = s.child.wait().expect("wait");
    assert!(status.success(), "exit status {status}");
}

/// A KEYS answer is streamed while the keys keep changing: it lists the
/// holders of the moment it was executed, sorted by key across shards, even
/// when every one of them is released (and new keys granted) before most of
/// the answer was read. Its answer is several MB, far more than the
/// sockets buffer, so most entries are produced after the release.
#[test]
fn a_streamed_keys_answer_lists_the_holders_of_its_start() {
    use std::io::{Read, Write};
    const N: usize = 30_000;
    let name = |i: usize| format!("{:0>120}", i * 7 % N).into_bytes();
    for threads in ["1", "2", "4"] {
        let s = start(threads, &["--max-keys", "100000"]);
        let mut c = Conn::persistent(s.lock_addr);
        for batch in (0..N).collect::<Vec<_>>().chunks(2) {
            let mut b = Vec::new();
            for &i in batch {
                b.extend_from_slice(&frame(5, &name(i), Some(b"src")));
            }
            c.send(&b);
            for _ in batch {
                assert_eq!(c.read_byte(), b'+');
            }
        }
        let mut a = std::net::TcpStream::connect(s.admin_addr).expect("connect admin");
        a.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .expect("timeout");
        a.write_all(b"KEYS").expect("KEYS");
        let mut n = [0u8; 4];
        a.read_exact(&mut n).expect("the count");
        assert_eq!(u32::from_le_bytes(n) as usize, N, "{threads} shards");
        // Every key released, others granted, before the rest is read.
        assert_eq!(admin_names(s.admin_addr, b"RSBS", &[b"src"]), b"++");
        for i in 0..100 {
            assert_eq!(c.try_lock(format!("new-{i}").as_bytes(), b"new"), b'+');
        }
        let mut got = Vec::new();
        let mut r = std::io::BufReader::new(a);
        let sized = |r: &mut std::io::BufReader<std::net::TcpStream>| {
            let mut l = [0u8; 1];
            r.read_exact(&mut l).expect("a size");
            let mut v = vec![0u8; l[0] as usize];
            r.read_exact(&mut v).expect("a name");
            v
        };
        for _ in 0..N {
            let key = sized(&mut r);
            assert_eq!(sized(&mut r), b"src");
            sized(&mut r);
            let mut t = [0u8; 8];
            r.read_exact(&mut t).expect("a time");
            got.push(key);
        }
        let mut want: Vec<Vec<u8>> = (0..N).map(name).collect();
        want.sort();
        assert!(
            got == want,
            "{threads} shards: the holders of the start, sorted"
        );
        // The connection serves the next command; the table moved on.
        let mut w = r.into_inner();
        w.write_all(b"KEYS").expect("KEYS again");
        w.read_exact(&mut n).expect("the count");
        assert_eq!(u32::from_le_bytes(n), 100);
        assert_eq!(keys(s.admin_addr).len(), 100);
    }
}
