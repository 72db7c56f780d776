//! Every holder listed (`KEYH`), against the real `ringlockd` at 1 and 2
//! shards: three readers of a shared key, two holders of a semaphore of 3
//! and an exclusive holder are six entries, in key then token order, each
//! with its access and its own token; `KEYS` and `KEYX` still list each key
//! once, with its oldest holder (Locking-Center's shape); `ringlock keys`
//! prints a row per holder with an ACCESS column (and `access`/`slots` in
//! JSON); and `ringlock reset KEY` resets every reader of a shared key by
//! its token, so the writer waiting behind them is granted.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::session::session;
use common::{wait_metric, Server};
use ringlock::client::{Access, Client, KeyInfo, RetryPolicy};
use ringlock::core::HoldMode;

const LONG: Duration = Duration::from_secs(30);

fn client(s: &Server) -> Client {
    Client::builder(s.lock_addr)
        .admin_addr(s.admin_addr)
        .retry(RetryPolicy::none())
        .build()
        .expect("valid client")
}

fn ringlock(lock: SocketAddr, admin: SocketAddr) -> Command {
    let mut c = common::ringlock_cmd(lock, admin);
    c.stdin(Stdio::null());
    c
}

fn of<'a>(list: &'a [KeyInfo], key: &str) -> Vec<&'a KeyInfo> {
    list.iter().filter(|k| k.key == key.as_bytes()).collect()
}

#[test]
fn every_holder_is_listed_with_its_access_and_reset_by_its_token() {
    for threads in ["1", "2"] {
        let s = Server::start(&["--threads", threads, "--metrics-bind", "127.0.0.1:0"]);
        let readers: Vec<_> = (0..3).map(|_| session(s.lock_addr)).collect();
        let leases: Vec<_> = readers
            .iter()
            .map(|r| r.lock_shared("doc", LONG).expect("a reader"))
            .collect();
        let permits: Vec<_> = (0..2)
            .map(|_| {
                session(s.lock_addr)
                    .lock_permit("pool", 3, LONG)
                    .expect("a permit")
            })
            .collect();
        let solo = session(s.lock_addr).lock("solo", LONG).expect("exclusive");
        // A writer waits behind the readers.
        let writer = session(s.lock_addr);
        let on_thread = writer.clone();
        let (tx, granted) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(on_thread.lock("doc", LONG));
        });
        wait_metric(s.metrics(), "ringlock_queued_waiters", 1.0);

        let c = client(&s);
        let every = c.keyh().expect("KEYH");
        assert_eq!(every.len(), 6, "{threads} shards: {every:#?}");
        let keys: Vec<(&[u8], u64)> = every.iter().map(|k| (&k.key[..], k.token)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted, "key then token order");
        let doc = of(&every, "doc");
        assert_eq!(
            doc.iter().map(|k| Some(k.token)).collect::<Vec<_>>(),
            leases.iter().map(|l| l.token()).collect::<Vec<_>>(),
            "each reader with its own token"
        );
        assert!(doc.iter().all(|k| k.access == Some(Access::Shared)));
        assert!(doc.iter().all(|k| k.mode == HoldMode::Session));
        let pool = of(&every, "pool");
        assert_eq!(pool.len(), 2);
        assert!(pool.iter().all(|k| k.access == Some(Access::Semaphore(3))));
        assert_eq!(of(&every, "solo")[0].access, Some(Access::Exclusive));
        assert_eq!(Some(of(&every, "solo")[0].token), solo.token());

        // KEYS and KEYX: a key once, its oldest holder, no access.
        for (what, list) in [("KEYX", c.keyx().unwrap()), ("KEYS", c.keys().unwrap())] {
            assert_eq!(list.len(), 3, "{what}");
            assert!(list.iter().all(|k| k.access.is_none()), "{what}");
        }
        assert_eq!(of(&c.keyx().unwrap(), "doc")[0].token, doc[0].token);

        // `ringlock keys`: a row per holder, the ACCESS column.
        let out = ringlock(s.lock_addr, s.admin_addr)
            .arg("keys")
            .output()
            .expect("ringlock keys");
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].split_whitespace().any(|c| c == "ACCESS"), "{text}");
        assert_eq!(lines.len(), 7, "{text}");
        let access_of = |key: &str| -> Vec<&str> {
            lines[1..]
                .iter()
                .filter(|l| l.split_whitespace().next() == Some(key))
                .map(|l| l.split_whitespace().last().unwrap())
                .collect()
        };
        assert_eq!(access_of("doc"), ["shared"; 3], "{text}");
        assert_eq!(access_of("pool"), ["semaphore:3"; 2], "{text}");
        assert_eq!(access_of("solo"), ["exclusive"], "{text}");
        let out = ringlock(s.lock_addr, s.admin_addr)
            .args(["keys", "--json"])
            .output()
            .expect("ringlock keys --json");
        let json = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            json.matches("\"access\":\"shared\",\"slots\":null").count(),
            3,
            "{json}"
        );
        assert_eq!(
            json.matches("\"access\":\"semaphore\",\"slots\":3").count(),
            2,
            "{json}"
        );

        // `ringlock reset doc` resets every reader, by token: the writer
        // is granted.
        let out = ringlock(s.lock_addr, s.admin_addr)
            .args(["reset", "doc"])
            .output()
            .expect("ringlock reset");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert_eq!(err.matches("resetting doc").count(), 3, "{err}");
        assert!(err.contains("shared, token"), "{err}");
        let w = granted
            .recv_timeout(LONG)
            .expect("the writer is answered")
            .expect("granted once every reader was reset");
        let doc = of(&c.keyh().unwrap(), "doc")
            .iter()
            .map(|k| (k.token, k.access))
            .collect::<Vec<_>>();
        assert_eq!(doc, [(w.token().unwrap(), Some(Access::Exclusive))]);
        drop(permits);
    }
}
