//! Compaction interrupted by `kill -9` (issue 3 "Tests"): the real binary
//! with a tiny `--compact-floor-bytes`, so that the log is rewritten (temp
//! file, fdatasync, rename, directory fsync) every few requests, under load
//! from several clients, killed at random moments. After every restart each
//! key acknowledged with `+` (and not since unlocked with `+`) is held, with
//! its source, and each acknowledged unlock stays unlocked; no temp file
//! survives a start. (The states a crash leaves on disk are also built by
//! hand in tests/wal_recovery.rs.)

mod common;

use common::*;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// xorshift64*: reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the clients were told about a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Acked {
    Held,
    Free,
    /// A request was in flight when the server died: either outcome.
    Unknown,
}

/// One request, one answer byte; `None` when the server went away.
fn request(s: &mut TcpStream, bytes: &[u8]) -> Option<u8> {
    s.write_all(bytes).ok()?;
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(1) => Some(b[0]),
        _ => None,
    }
}

const CLIENTS: usize = 4;
const KEYS_PER_CLIENT: usize = 8;
const CYCLES: usize = 30;

fn key_name(client: usize, k: usize) -> Vec<u8> {
    // Long-ish names make records big enough that a rewrite takes a
    // noticeable share of the log's traffic.
    format!("client{client}-key{k}-{}", "x".repeat(40)).into_bytes()
}

/// A client that owns its keys (so a Lock never waits): flips random keys
/// between held and free until the server dies or `stop` is set.
fn client(
    addr: SocketAddr,
    id: usize,
    seed: u64,
    model: Arc<Mutex<BTreeMap<Vec<u8>, Acked>>>,
    stop: Arc<AtomicBool>,
) {
    let mut rng = Rng(seed | 1);
    let Ok(mut s) = TcpStream::connect(addr) else {
        return;
    };
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    // Opt in to several requests on this connection.
    if request(&mut s, &[6]) != Some(b'+') {
        return;
    }
    let source = format!("src{id}").into_bytes();
    while !stop.load(Ordering::Relaxed) {
        let key = key_name(id, rng.below(KEYS_PER_CLIENT as u64) as usize);
        let state = *model.lock().unwrap().get(&key).expect("key in model");
        assert_ne!(state, Acked::Unknown, "resolved before the cycle");
        model.lock().unwrap().insert(key.clone(), Acked::Unknown);
        let (frame_bytes, then) = match state {
            Acked::Held => (frame(2, &key, None), Acked::Free),
            _ if rng.below(2) == 0 => (frame(5, &key, Some(&source)), Acked::Held),
            _ => (frame(1, &key, Some(&source)), Acked::Held),
        };
        match request(&mut s, &frame_bytes) {
            Some(b'+') => {
                model.lock().unwrap().insert(key, then);
            }
            Some(other) => panic!(
                "client {id}: {} on {} answered {:?} (no faults, own key)",
                ["?", "Lock", "Unlock", "", "", "TryLock"][frame_bytes[0] as usize],
                String::from_utf8_lossy(&key),
                other as char
            ),
            // Killed mid-request: the outcome is unknown.
            None => return,
        }
    }
}

#[test]
fn kill9_during_frequent_compaction_keeps_acknowledged_state() {
    let dir = TempDir::new("compact-kill");
    let log = dir.0.join("wal.log");
    let temp = dir.0.join("wal.log.compact.tmp");
    let log_s = log.to_str().unwrap().to_string();
    let seed = std::env::var("RINGLOCK_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("seed {seed} (rerun with RINGLOCK_TEST_SEED={seed})");
    let mut rng = Rng(seed | 1);
    let args = ["--data-path", &log_s, "--compact-floor-bytes", "256"];

    let model: Arc<Mutex<BTreeMap<Vec<u8>, Acked>>> = Arc::new(Mutex::new(
        (0..CLIENTS)
            .flat_map(|c| (0..KEYS_PER_CLIENT).map(move |k| (key_name(c, k), Acked::Free)))
            .collect(),
    ));
    let (mut compactions, mut killed_mid_compaction, mut acked_total) = (0, 0, 0usize);
    for cycle in 0..CYCLES {
        let mut s = Server::start(&args);
        // Check what survived the previous kill, then resolve unknowns.
        let held: BTreeMap<Vec<u8>, KeyInfo> = keys(s.admin_addr)
            .into_iter()
            .map(|k| (k.key.clone(), k))
            .collect();
        assert!(!temp.exists(), "cycle {cycle}: temp file left after start");
        {
            let mut m = model.lock().unwrap();
            for k in held.keys() {
                assert!(m.contains_key(k), "cycle {cycle}: unknown key held: {k:?}");
            }
            for (k, st) in m.iter_mut() {
                let is_held = held.get(k);
                match *st {
                    Acked::Held => {
                        let info = is_held.unwrap_or_else(|| {
                            panic!(
                                "cycle {cycle} (seed {seed}): acknowledged lock lost: {}",
                                String::from_utf8_lossy(k)
                            )
                        });
                        let client = String::from_utf8_lossy(k)[6..7].to_string();
                        assert_eq!(info.source, format!("src{client}").into_bytes());
                    }
                    Acked::Free => assert!(
                        is_held.is_none(),
                        "cycle {cycle} (seed {seed}): acknowledged unlock undone: {}",
                        String::from_utf8_lossy(k)
                    ),
                    Acked::Unknown => {}
                }
                *st = if is_held.is_some() {
                    Acked::Held
                } else {
                    Acked::Free
                };
            }
        }
        if cycle + 1 == CYCLES {
            break;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (m, st, addr) = (model.clone(), stop.clone(), s.lock_addr);
                let seed = rng.next();
                std::thread::spawn(move || client(addr, c, seed, m, st))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(5 + rng.below(60)));
        s.kill9();
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().expect("client thread panicked");
        }
        // Lines up to the kill (the reader sees EOF after the last one).
        let mut open_compaction = false;
        while let Ok(l) = s.log.recv_timeout(Duration::from_secs(5)) {
            if l.contains("event=compaction_start") {
                open_compaction = true;
            }
            if l.contains("event=compaction_done") {
                open_compaction = false;
                compactions += 1;
            }
            assert!(
                !l.contains("event=wal_io_error") && !l.contains("wal_records_voided"),
                "cycle {cycle}: {l}"
            );
        }
        killed_mid_compaction += open_compaction as usize;
        acked_total += model
            .lock()
            .unwrap()
            .values()
            .filter(|&&v| v == Acked::Held)
            .count();
    }
    eprintln!(
        "{CYCLES} cycles: {compactions} compactions, {killed_mid_compaction} kills during one, {acked_total} acknowledged holders checked"
    );
    assert!(
        compactions >= CYCLES / 3,
        "too few compactions ({compactions}) to test them"
    );
}
