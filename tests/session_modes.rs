//! Shared and semaphore holds over the session protocol, against the real
//! server: readers granted together, a waiting writer never overtaken by
//! later readers (one FIFO queue per key), a semaphore's limit and a
//! request naming another limit, a waiter leaving the head of the queue
//! (Cancel, a closed session) unblocking the readers behind it, and the
//! Locking-Center protocol staying exclusive, and the holds of a durable
//! server across kill -9. Raw frames over TCP.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{Conn, Server};
use ringlock::protocol::session::{
    self as sp, Access, Answer, HoldMode, Req, Status, WAIT_FOREVER,
};

struct Sess {
    s: TcpStream,
    buf: Vec<u8>,
    next: u32,
    flags: u8,
}

impl Sess {
    fn open(addr: SocketAddr) -> Sess {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut x = Sess {
            s,
            buf: Vec::new(),
            next: 1,
            flags: 0,
        };
        let rid = x.send(&Req::Hello {
            version: sp::VERSION,
            keepalive_ms: 0,
            auth: b"",
        });
        match x.read(Some(rid)) {
            Answer::Welcome { welcome, .. } => {
                assert_eq!(welcome.status, Status::Ok);
                x.flags = welcome.flags;
            }
            other => panic!("hello answered {other:?}"),
        }
        x
    }

    fn send(&mut self, req: &Req<'_>) -> u32 {
        let rid = self.next;
        self.next += 1;
        let mut b = Vec::new();
        sp::encode(rid, req, &mut b);
        self.s.write_all(&b).expect("send");
        rid
    }

    fn read(&mut self, hello: Option<u32>) -> Answer {
        loop {
            if let Some((a, n)) = sp::decode_answer(&self.buf, hello).expect("well-formed answer") {
                self.buf.drain(..n);
                return a;
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => panic!("connection closed"),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// The next reply, which must answer `rid`: `(status, token)`.
    fn reply(&mut self, rid: u32) -> (Status, u64) {
        match self.read(None) {
            Answer::Reply {
                rid: r,
                status,
                token,
                ..
            } => {
                assert_eq!(r, rid, "answers in the order they were decided");
                (status, token)
            }
            other => panic!("expected the reply to {rid}, got {other:?}"),
        }
    }

    fn acquire_send(&mut self, key: &str, access: Access, wait_ms: u32) -> u32 {
        self.send(&Req::Acquire {
            hold: HoldMode::Session,
            ttl_ms: 0,
            wait_ms,
            key: key.as_bytes(),
            source: b"modes",
            access,
        })
    }

    fn acquire(&mut self, key: &str, access: Access, wait_ms: u32) -> (Status, u64) {
        let rid = self.acquire_send(key, access, wait_ms);
        self.reply(rid)
    }

    fn release(&mut self, key: &str, token: u64) -> Status {
        let rid = self.send(&Req::Release {
            token,
            key: key.as_bytes(),
        });
        self.reply(rid).0
    }
}

fn granted(r: (Status, u64)) -> u64 {
    assert_eq!(r.0, Status::Ok, "expected a grant");
    assert!(r.1 != 0);
    r.1
}

#[test]
fn readers_share_and_a_waiting_writer_is_not_overtaken() {
    let srv = Server::start(&[]);
    let mut r1 = Sess::open(srv.lock_addr);
    assert_ne!(
        r1.flags & sp::FLAG_MODES,
        0,
        "an in-memory server serves modes"
    );
    let mut r2 = Sess::open(srv.lock_addr);
    let mut w = Sess::open(srv.lock_addr);
    let mut r3 = Sess::open(srv.lock_addr);

    let t1 = granted(r1.acquire("doc", Access::Shared, 0));
    let t2 = granted(r2.acquire("doc", Access::Shared, 0));
    assert!(t2 > t1, "every grant its own, increasing token");
    // An exclusive try is refused while readers hold.
    assert_eq!(w.acquire("doc", Access::Exclusive, 0).0, Status::Busy);
    let wr = w.acquire_send("doc", Access::Exclusive, WAIT_FOREVER);
    // A reader arriving behind the waiting writer waits too (a try is
    // refused), though the holders are readers.
    assert_eq!(r3.acquire("doc", Access::Shared, 0).0, Status::Busy);
    let r3r = r3.acquire_send("doc", Access::Shared, WAIT_FOREVER);
    // One reader's release leaves the other holding: the writer waits.
    assert_eq!(r1.release("doc", t1), Status::Ok);
    assert_eq!(r2.release("doc", t2), Status::Ok);
    let tw = granted(w.reply(wr));
    assert!(tw > t2);
    assert_eq!(w.release("doc", tw), Status::Ok);
    let t3 = granted(r3.reply(r3r));
    assert!(t3 > tw);
    // A release names its own grant: the writer's old token is stale.
    assert_eq!(w.release("doc", tw), Status::Stale);
    assert_eq!(r3.release("doc", t3), Status::Ok);
}

#[test]
fn a_semaphore_admits_its_limit_and_refuses_another_limit() {
    let srv = Server::start(&[]);
    let mut a = Sess::open(srv.lock_addr);
    let mut b = Sess::open(srv.lock_addr);
    let mut c = Sess::open(srv.lock_addr);
    let ta = granted(a.acquire("pool", Access::Semaphore(2), 0));
    let tb = granted(b.acquire("pool", Access::Semaphore(2), 0));
    assert_eq!(c.acquire("pool", Access::Semaphore(2), 0).0, Status::Busy);
    assert_eq!(
        c.acquire("pool", Access::Semaphore(3), WAIT_FOREVER).0,
        Status::ModeMismatch,
        "the key's limit is fixed by its holders"
    );
    let cr = c.acquire_send("pool", Access::Semaphore(2), WAIT_FOREVER);
    assert_eq!(a.release("pool", ta), Status::Ok);
    let tc = granted(c.reply(cr));
    assert!(tc > tb && tb > ta);
    assert_eq!(b.release("pool", tb), Status::Ok);
    assert_eq!(c.release("pool", tc), Status::Ok);
    // Free again: the next first holder fixes another limit.
    let t = granted(a.acquire("pool", Access::Semaphore(5), 0));
    assert_eq!(a.release("pool", t), Status::Ok);
}

#[test]
fn a_writer_leaving_the_queue_head_lets_the_readers_behind_it_in() {
    let srv = Server::start(&[]);
    let mut r1 = Sess::open(srv.lock_addr);
    let mut w = Sess::open(srv.lock_addr);
    let mut r2 = Sess::open(srv.lock_addr);
    let t1 = granted(r1.acquire("doc", Access::Shared, 0));
    let wr = w.acquire_send("doc", Access::Exclusive, WAIT_FOREVER);
    assert_eq!(r2.acquire("doc", Access::Shared, 0).0, Status::Busy);
    let r2r = r2.acquire_send("doc", Access::Shared, WAIT_FOREVER);
    // The writer cancels: the reader behind it joins the reader holding.
    let cr = w.send(&Req::Cancel {
        target: wr,
        key: b"doc",
    });
    assert_eq!(w.reply(wr).0, Status::Cancelled);
    assert_eq!(w.reply(cr).0, Status::Ok);
    let t2 = granted(r2.reply(r2r));
    assert!(t2 > t1);

    // Again with the writer's session closed instead.
    let mut w2 = Sess::open(srv.lock_addr);
    let mut r3 = Sess::open(srv.lock_addr);
    w2.acquire_send("doc", Access::Exclusive, WAIT_FOREVER);
    assert_eq!(r3.acquire("doc", Access::Shared, 0).0, Status::Busy);
    let r3r = r3.acquire_send("doc", Access::Shared, WAIT_FOREVER);
    drop(w2);
    let t3 = granted(r3.reply(r3r));
    assert!(t3 > t2);
}

#[test]
fn locking_center_clients_stay_exclusive_and_old_frames_too() {
    let srv = Server::start(&[]);
    let mut r = Sess::open(srv.lock_addr);
    let t = granted(r.acquire("doc", Access::Shared, 0));
    // A Locking-Center TryLock of a key readers hold fails.
    let mut lc = Conn::connect(srv.lock_addr);
    assert_ne!(lc.try_lock(b"doc", b"lc"), b'+');
    // An Acquire without the access trailer (an older client) is exclusive.
    let mut old = Sess::open(srv.lock_addr);
    let mut frame = Vec::new();
    sp::encode(
        77,
        &Req::Acquire {
            hold: HoldMode::Session,
            ttl_ms: 0,
            wait_ms: 0,
            key: b"doc",
            source: b"old",
            access: Access::Exclusive,
        },
        &mut frame,
    );
    old.s.write_all(&frame).expect("send");
    assert_eq!(old.reply(77).0, Status::Busy);
    assert_eq!(r.release("doc", t), Status::Ok);
    // A malformed access is `invalid` and changes nothing.
    let mut bad = Vec::new();
    sp::encode(
        78,
        &Req::Acquire {
            hold: HoldMode::Session,
            ttl_ms: 0,
            wait_ms: 0,
            key: b"doc",
            source: b"old",
            access: Access::Shared,
        },
        &mut bad,
    );
    // Shared with 3 slots: the slots are only for a semaphore.
    let n = bad.len();
    bad[n - 4..].copy_from_slice(&3u32.to_le_bytes());
    old.s.write_all(&bad).expect("send");
    assert_eq!(old.reply(78).0, Status::Invalid);
    let mut lc = Conn::connect(srv.lock_addr);
    assert_eq!(lc.try_lock(b"doc", b"lc"), b'+');
}

#[test]
fn shared_and_semaphore_holds_survive_kill_9_and_restart() {
    let dir = common::TempDir::new("modes-wal");
    let wal = dir.path("locks.wal");
    let path = wal.to_str().expect("utf-8 path").to_string();
    let mut srv = Server::start(&["--data-path", &path]);
    let mut a = Sess::open(srv.lock_addr);
    assert_ne!(a.flags & sp::FLAG_MODES, 0, "a durable server serves modes");
    let hold = |s: &mut Sess, key: &str, hold: HoldMode, ttl_ms: u32, access: Access| {
        let rid = s.send(&Req::Acquire {
            hold,
            ttl_ms,
            wait_ms: 0,
            key: key.as_bytes(),
            source: b"modes",
            access,
        });
        granted(s.reply(rid))
    };
    let p1 = hold(&mut a, "doc", HoldMode::Persistent, 0, Access::Shared);
    let l1 = hold(&mut a, "doc", HoldMode::Lease, 600_000, Access::Shared);
    let s1 = hold(&mut a, "doc", HoldMode::Session, 0, Access::Shared);
    let q1 = hold(
        &mut a,
        "pool",
        HoldMode::Persistent,
        0,
        Access::Semaphore(2),
    );
    // Released before the crash: must stay released.
    let gone = hold(&mut a, "doc", HoldMode::Persistent, 0, Access::Shared);
    assert_eq!(a.release("doc", gone), Status::Ok);
    srv.kill9();
    drop(a);
    let srv = Server::start(&["--data-path", &path]);
    let mut b = Sess::open(srv.lock_addr);
    // Held shared: a writer is refused, a reader joins.
    assert_eq!(b.acquire("doc", Access::Exclusive, 0).0, Status::Busy);
    let r = granted(b.acquire("doc", Access::Shared, 0));
    assert!(r > gone, "tokens keep increasing across the restart");
    // The persistent hold and the lease came back, each by its own token;
    // the session hold and the released one did not.
    assert_eq!(b.release("doc", s1), Status::Stale);
    assert_eq!(b.release("doc", gone), Status::Stale);
    assert_eq!(b.release("doc", p1), Status::Ok);
    assert_eq!(b.release("doc", l1), Status::Ok);
    assert_eq!(b.acquire("doc", Access::Exclusive, 0).0, Status::Busy);
    assert_eq!(b.release("doc", r), Status::Ok);
    granted(b.acquire("doc", Access::Exclusive, 0));
    // The semaphore kept its n: another n is refused, one more slot is free.
    assert_eq!(
        b.acquire("pool", Access::Semaphore(3), 0).0,
        Status::ModeMismatch
    );
    let q2 = granted(b.acquire("pool", Access::Semaphore(2), 0));
    assert_eq!(b.acquire("pool", Access::Semaphore(2), 0).0, Status::Busy);
    assert_eq!(b.release("pool", q1), Status::Ok);
    assert_eq!(b.release("pool", q2), Status::Ok);
}
