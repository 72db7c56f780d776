//! Crash test: clients lock and unlock while the real server is killed
//! with SIGKILL at random moments, 50+ cycles over one log. After every
//! restart each key acknowledged with `+` (and not since unlocked with `+`)
//! is still held, each acknowledged unlock stays unlocked, and no key is
//! ever held by two clients at once.

mod common;

use common::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const THREADS: usize = 4;
const KEYS_PER_THREAD: usize = 4;
const CYCLES: usize = 50;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    Held,
    Free,
    /// A request was sent but its answer never arrived (crash).
    Unknown,
}

fn start(path: &str) -> Server {
    Server::start(&["--data-path", path, "--compact-floor-bytes", "4096"])
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

fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

fn key(t: usize, k: usize) -> Vec<u8> {
    format!("t{t}-k{k}").into_bytes()
}

/// Runs client threads until the server dies; updates the model.
fn clients(
    addr: SocketAddr,
    model: Arc<Mutex<HashMap<Vec<u8>, Known>>>,
    seed: u64,
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<()>> {
    let inside = Arc::new(AtomicBool::new(false));
    (0..THREADS)
        .map(|t| {
            let (model, stop, ops, inside) =
                (model.clone(), stop.clone(), ops.clone(), inside.clone());
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
                        let Some(a) = ask(
                            &mut s,
                            &frame(5, b"shared", Some(format!("t{t}").as_bytes())),
                        ) else {
                            return;
                        };
                        if a == b'+' {
                            assert!(
                                !inside.swap(true, Ordering::SeqCst),
                                "two holders of the shared key"
                            );
                            std::thread::yield_now();
                            inside.store(false, Ordering::SeqCst);
                            if ask(&mut s, &frame(2, b"shared", None)).is_none() {
                                return;
                            }
                        }
                        continue;
                    }
                    let k = key(t, (r >> 8) as usize % KEYS_PER_THREAD);
                    let state = model.lock().unwrap()[&k];
                    let (f, want) = match state {
                        Known::Held => (frame(2, &k, None), Known::Free),
                        _ => (frame(1, &k, Some(format!("t{t}").as_bytes())), Known::Held),
                    };
                    model.lock().unwrap().insert(k.clone(), Known::Unknown);
                    match ask(&mut s, &f) {
                        Some(b'+') => {
                            model.lock().unwrap().insert(k, want);
                            ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(other) => panic!(
                            "unexpected answer {other} for {:?}",
                            String::from_utf8_lossy(&k)
                        ),
                        None => return, // crashed: stays Unknown
                    }
                }
            })
        })
        .collect()
}

#[test]
fn acknowledged_state_survives_random_kill_9() {
    let dir = std::env::temp_dir().join(format!("ringlock-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("crash.wal");
    let path_s = path.to_str().unwrap().to_string();
    let _ = std::fs::remove_file(&path);
    let model: Arc<Mutex<HashMap<Vec<u8>, Known>>> = Arc::new(Mutex::new(
        (0..THREADS)
            .flat_map(|t| (0..KEYS_PER_THREAD).map(move |k| (key(t, k), Known::Free)))
            .collect(),
    ));
    let mut seed = 0x1234_5678_9ABC_DEF1u64 ^ std::process::id() as u64;
    let mut total_ops = 0;
    let mut compactions_seen = false;
    for cycle in 0..CYCLES {
        let mut server = start(&path_s);
        // Verify the recovered table against every acknowledged answer.
        let held: HashMap<Vec<u8>, KeyInfo> = keys(server.admin_addr)
            .into_iter()
            .map(|k| (k.key.clone(), k))
            .collect();
        {
            let mut m = model.lock().unwrap();
            for (k, known) in m.iter_mut() {
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
        }
        if let Some(h) = held.get(&b"shared"[..]) {
            // A holder of the shared key died with the server: that key is
            // held by nobody now, and must refuse a second owner until reset.
            assert_eq!(
                once(server.lock_addr, &frame(5, b"shared", Some(b"probe"))),
                b'#',
                "{h:?}"
            );
            assert_eq!(once(server.lock_addr, &frame(3, b"shared", None)), b'+');
        }
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicUsize::new(0));
        let handles = clients(
            server.lock_addr,
            model.clone(),
            xorshift(&mut seed),
            stop.clone(),
            ops.clone(),
        );
        // Let some traffic through, then kill at a random moment.
        let want_ops = 20 + (xorshift(&mut seed) % 200) as usize;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while ops.load(Ordering::Relaxed) < want_ops && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().expect("client thread panicked");
        }
        total_ops += ops.load(Ordering::Relaxed);
        while let Ok(line) = server.log.try_recv() {
            compactions_seen |= line.contains("event=compaction_done");
        }
    }
    // A final restart checks the last cycle too.
    let server = start(&path_s);
    let held: Vec<Vec<u8>> = keys(server.admin_addr).into_iter().map(|k| k.key).collect();
    for (k, known) in model.lock().unwrap().iter() {
        match known {
            Known::Held => assert!(held.contains(k)),
            Known::Free => assert!(!held.contains(k)),
            Known::Unknown => {}
        }
    }
    assert!(total_ops >= CYCLES * 20, "too little traffic: {total_ops}");
    assert!(compactions_seen, "the test should cross compactions too");
    let _ = std::fs::remove_dir_all(&dir);
}
