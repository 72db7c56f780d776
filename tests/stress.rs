//! Scale and mutual-exclusion tests against the real binary.

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn raise_nofile() {
    // SAFETY: getrlimit/setrlimit on a stack struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max.min(65_536);
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
}

fn wait_fds(s: &Server, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = s.open_fds();
        if n <= want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "server still has {n} fds open, expected {want}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn ten_thousand_waiters_granted_in_order_without_leaking_fds() {
    raise_nofile();
    const N: usize = 10_000;
    // One shard: arrival order is made definite by a round trip on another
    // connection, which orders nothing across shards (tests/shards.rs has
    // FIFO across shards).
    let s = Server::start(&["--max-connections", "12000", "--threads", "1"]);
    let mut ctl = s.connect();
    assert_eq!(ctl.unlock(b"warm"), b'+');
    let baseline = s.open_fds();
    assert_eq!(ctl.lock(b"big", b"holder"), b'+');
    let mut waiters = Vec::with_capacity(N);
    for i in 0..N {
        let mut c = s.connect();
        c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.send(&frame(1, b"big", Some(format!("w{i}").as_bytes())));
        waiters.push(c);
        // Arrival order is what FIFO promises: make each arrival definite.
        assert_eq!(ctl.unlock(b"__sync__"), b'+');
    }
    assert_eq!(s.open_fds(), baseline + N);
    for (i, w) in waiters.iter_mut().enumerate() {
        assert_eq!(ctl.unlock(b"big"), b'+');
        assert_eq!(w.read_byte(), b'+', "waiter {i} was not next");
    }
    assert_eq!(ctl.unlock(b"big"), b'+');
    drop(waiters);
    drop(ctl);
    wait_fds(&s, baseline - 1);
    assert!(keys(s.admin_addr).is_empty());
}

#[test]
fn mutual_exclusion_under_contention() {
    const THREADS: usize = 16;
    const ROUNDS: usize = 150;
    let s = Server::start(&[]);
    let addr = s.lock_addr;
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (counter, inside) = (counter.clone(), inside.clone());
            std::thread::spawn(move || {
                let mut persistent = Conn::persistent(addr);
                for r in 0..ROUNDS {
                    // Mix connection styles: half the rounds use a fresh
                    // connection per request, as Locking-Center clients do.
                    let fresh = (t + r) % 2 == 0;
                    let got = if fresh {
                        once(
                            addr,
                            &frame(1, b"counter", Some(format!("t{t}").as_bytes())),
                        )
                    } else {
                        persistent.lock(b"counter", format!("t{t}").as_bytes())
                    };
                    assert_eq!(got, b'+');
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    // A deliberately racy read-modify-write.
                    let v = counter.load(Ordering::Relaxed);
                    std::thread::yield_now();
                    counter.store(v + 1, Ordering::Relaxed);
                    inside.store(false, Ordering::SeqCst);
                    let un = if fresh {
                        once(addr, &frame(2, b"counter", None))
                    } else {
                        persistent.unlock(b"counter")
                    };
                    assert_eq!(un, b'+');
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("client thread");
    }
    assert_eq!(
        counter.load(Ordering::Relaxed),
        (THREADS * ROUNDS) as u64,
        "lost update"
    );
    assert!(keys(s.admin_addr).is_empty());
}
