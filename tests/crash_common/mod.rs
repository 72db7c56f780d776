//! The client side of the `kill -9` crash tests (tests/wal_crash.rs,
//! tests/wal_prealloc_crash.rs), shared so that both check the same
//! things: client threads lock and unlock their own keys and contend for
//! one shared key until the server dies, a model records what each
//! answer acknowledged, and after every restart [`Crash::check_restart`]
//! holds the recovered table to it:
//!
//! - every key acknowledged with `+` (and not since unlocked with `+`) is
//!   held, every acknowledged unlock stays unlocked;
//! - the shared key never has two holders at once while the server runs,
//!   and after a restart a holder that died with the server still excludes
//!   everyone else (`#`) until the key is reset: a restart never hands a
//!   held key to a second owner.
#![allow(dead_code)]

use crate::common::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the answers so far say about a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known {
    Held,
    Free,
    /// A request was sent but its answer never arrived (the server died).
    Unknown,
}

pub type Model = Arc<Mutex<HashMap<Vec<u8>, Known>>>;

/// The key every client contends for.
pub const SHARED: &[u8] = b"shared";

/// One crash test's clients: `threads` threads, each with its own
/// `keys_per_thread` keys named `<prefix>t<thread>-k<n>`.
pub struct Crash {
    pub threads: usize,
    pub keys_per_thread: usize,
    pub prefix: &'static str,
}

pub fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// One request on a persistent connection; `None` when the server died.
fn ask(s: &mut TcpStream, bytes: &[u8]) -> Option<u8> {
    s.write_all(bytes).ok()?;
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(1) => Some(b[0]),
        _ => None,
    }
}

impl Crash {
    pub fn key(&self, t: usize, k: usize) -> Vec<u8> {
        format!("{}t{t}-k{k}", self.prefix).into_bytes()
    }

    /// Every key free, as before the first start.
    pub fn model(&self) -> Model {
        Arc::new(Mutex::new(
            (0..self.threads)
                .flat_map(|t| (0..self.keys_per_thread).map(move |k| (t, k)))
                .map(|(t, k)| (self.key(t, k), Known::Free))
                .collect(),
        ))
    }

    /// Runs the clients until they have `want_ops` acknowledged operations
    /// (or 10 s passed), then `kill -9`s the server at that moment and
    /// joins them. Returns the operations acknowledged.
    pub fn traffic_then_kill9(
        &self,
        server: &mut Server,
        model: &Model,
        seed: u64,
        want_ops: usize,
    ) -> usize {
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicUsize::new(0));
        let handles = self.clients(server.lock_addr, model, seed, &stop, &ops);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while ops.load(Ordering::Relaxed) < want_ops && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().expect("client thread panicked");
        }
        ops.load(Ordering::Relaxed)
    }

    /// Starts the client threads; they run until the server dies or
    /// `stop` is set, counting acknowledged operations in `ops`.
    pub fn clients(
        &self,
        addr: SocketAddr,
        model: &Model,
        seed: u64,
        stop: &Arc<AtomicBool>,
        ops: &Arc<AtomicUsize>,
    ) -> Vec<std::thread::JoinHandle<()>> {
        let inside = Arc::new(AtomicBool::new(false));
        (0..self.threads)
            .map(|t| {
                let (model, stop, ops, inside) =
                    (model.clone(), stop.clone(), ops.clone(), inside.clone());
                let keys: Vec<Vec<u8>> =
                    (0..self.keys_per_thread).map(|k| self.key(t, k)).collect();
                std::thread::spawn(move || {
                    let mut seed = seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let Ok(mut s) = TcpStream::connect(addr) else {
                        return;
                    };
                    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
                    // Opt in to several requests on this connection.
                    if ask(&mut s, &[6]) != Some(b'+') {
                        return;
                    }
                    while !stop.load(Ordering::Relaxed) {
                        let r = xorshift(&mut seed);
                        if r.is_multiple_of(5) {
                            // Contended shared key: mutual exclusion across clients.
                            let src = format!("t{t}");
                            let Some(a) = ask(&mut s, &frame(5, SHARED, Some(src.as_bytes())))
                            else {
                                return;
                            };
                            if a == b'+' {
                                assert!(
                                    !inside.swap(true, Ordering::SeqCst),
                                    "two holders of the shared key"
                                );
                                std::thread::yield_now();
                                inside.store(false, Ordering::SeqCst);
                                if ask(&mut s, &frame(2, SHARED, None)).is_none() {
                                    return;
                                }
                            }
                            continue;
                        }
                        let k = &keys[(r >> 8) as usize % keys.len()];
                        let state = model.lock().expect("model")[k];
                        let (f, want) = match state {
                            Known::Held => (frame(2, k, None), Known::Free),
                            _ => (frame(1, k, Some(format!("t{t}").as_bytes())), Known::Held),
                        };
                        model
                            .lock()
                            .expect("model")
                            .insert(k.clone(), Known::Unknown);
                        match ask(&mut s, &f) {
                            Some(b'+') => {
                                model.lock().expect("model").insert(k.clone(), want);
                                ops.fetch_add(1, Ordering::Relaxed);
                            }
                            Some(other) => panic!(
                                "unexpected answer {other} for {:?}",
                                String::from_utf8_lossy(k)
                            ),
                            None => return, // crashed: stays Unknown
                        }
                    }
                })
            })
            .collect()
    }

    /// After a restart: holds the recovered table to every acknowledged
    /// answer, continues the model from what the server has, and checks
    /// (then resets) a shared key whose holder died with the server.
    pub fn check_restart(&self, cycle: usize, server: &Server, model: &Model) {
        let held: HashMap<Vec<u8>, KeyInfo> = keys(server.admin_addr)
            .into_iter()
            .map(|k| (k.key.clone(), k))
            .collect();
        for (k, known) in model.lock().expect("model").iter_mut() {
            match *known {
                Known::Held => assert!(
                    held.contains_key(k),
                    "cycle {cycle}: acknowledged lock of {:?} lost",
                    String::from_utf8_lossy(k)
                ),
                Known::Free => assert!(
                    !held.contains_key(k),
                    "cycle {cycle}: acknowledged unlock of {:?} undone",
                    String::from_utf8_lossy(k)
                ),
                Known::Unknown => {}
            }
            // Continue from what the server actually has.
            *known = if held.contains_key(k) {
                Known::Held
            } else {
                Known::Free
            };
        }
        if let Some(h) = held.get(SHARED) {
            // Its holder died with the server: the key is held by nobody
            // now, and must refuse a second owner until it is reset.
            assert_eq!(
                once(server.lock_addr, &frame(5, SHARED, Some(b"probe"))),
                b'#',
                "cycle {cycle}: {h:?}"
            );
            assert_eq!(once(server.lock_addr, &frame(3, SHARED, None)), b'+');
        }
    }
}
