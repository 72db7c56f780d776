//! Runs the load generator (in-process) against the real floor-server binary
//! for about a second in each connection mode and checks the figures add up;
//! checks the floor's close-first mode on raw sockets; runs the load
//! generator on two threads against the floor and against a counting server
//! and checks that every request is accounted for exactly once.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringlock_bench::frame::{frame_len, Frame};

use ringlock_loadgen::{config, engine, report};

struct Floor(Child);

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_floor() -> (Floor, String) {
    start_floor_with(&[])
}

fn start_floor_with(extra: &[&str]) -> (Floor, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_floor-server"))
        .args(["--bind", "127.0.0.1:0"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("floor-server starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut line = String::new();
    BufReader::new(stderr)
        .read_line(&mut line)
        .expect("floor-server prints its address");
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("lock="))
        .unwrap_or_else(|| panic!("no lock= in {line:?}"))
        .to_string();
    (Floor(child), addr)
}

fn run(args: &[&str]) -> (config::Config, engine::Stats) {
    let cfg = config::parse_args(args.iter().map(std::ffi::OsString::from)).expect("valid args");
    let stats = engine::run(&cfg).expect("run completes");
    (cfg, stats)
}

#[test]
fn loadgen_against_floor() {
    let (_floor, addr) = start_floor();
    let target = format!("ringlock://{addr}");

    // Open loop, persistent connections: the achieved rate must match the target.
    let (cfg, st) = run(&[
        "--target",
        &target,
        "--connections",
        "4",
        "--rate",
        "2000",
        "--duration",
        "0.5s",
        "--warmup",
        "0.1s",
        "--keys",
        "100",
        "--no-progress",
    ]);
    assert_eq!(st.errors.total(), 0, "{:?} {:?}", st.errors, st.first_error);
    let ops = report::ops_per_sec(&st);
    // Loose lower bound: CI runs this beside other CPU-heavy tests on 2 cores.
    assert!(
        (1000.0..2300.0).contains(&ops),
        "open loop achieved {ops}/s for a 2000/s target"
    );
    assert_eq!(st.lock.len(), st.grants);
    assert_eq!(st.connects, 4);
    let json = report::to_json(&cfg, &st);
    for field in [
        "\"ops_per_sec\":",
        "\"errors\":0",
        "\"p50\":",
        "\"p9999\":",
        "\"max\":",
    ] {
        assert!(json.contains(field), "{field} missing in {json}");
    }

    // Closed loop, a connection per request, try-lock on one hot key.
    let (_, st) = run(&[
        "--target",
        &target,
        "--connections",
        "2",
        "--duration",
        "0.3s",
        "--warmup",
        "0.1s",
        "--conn-mode",
        "per-request",
        "--mix",
        "try-lock",
        "--dist",
        "hot",
        "--no-progress",
    ]);
    assert_eq!(st.errors.total(), 0, "{:?} {:?}", st.errors, st.first_error);
    assert!(st.cycles > 10, "only {} cycles", st.cycles);
    // The floor grants everything, so each cycle took two connections.
    assert!(
        st.connects >= 2 * st.cycles,
        "{} connects for {} cycles",
        st.connects,
        st.cycles
    );
}

#[test]
fn refused_connections_are_errors_not_hangs() {
    // Bind and drop to get a port that (almost certainly) nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let target = format!("ringlock://127.0.0.1:{port}");
    let (_, st) = run(&[
        "--target",
        &target,
        "--duration",
        "0.2s",
        "--warmup",
        "0s",
        "--no-progress",
    ]);
    assert_eq!(st.cycles, 0);
    assert!(st.errors.connect > 0);
}

/// Read until EOF (bounded by a read timeout, so a server that never closes
/// fails the test instead of hanging it).
fn read_to_eof(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("set read timeout");
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .expect("the server closes the connection (EOF before the timeout)");
    out
}

fn read_exact_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("set read timeout");
    let mut buf = vec![0; n];
    s.read_exact(&mut buf).expect("answer arrives");
    buf
}

const LOCK_K: &[u8] = b"\x01\x01k\x01s";
const UNLOCK_K: &[u8] = b"\x02\x01k";

#[test]
fn close_first_floor_closes_one_shot_connections_after_the_answer() {
    let (_floor, addr) = start_floor_with(&["--close-first"]);

    // One-shot: the answer, then EOF from the server.
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.write_all(LOCK_K).expect("send");
    assert_eq!(
        read_to_eof(&mut s),
        b"+",
        "one answer, then the server's FIN"
    );

    // The request split over two writes is still one request.
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.write_all(&LOCK_K[..2]).expect("send");
    std::thread::sleep(Duration::from_millis(20)); // lets the halves arrive apart (not synchronisation)
    s.write_all(&LOCK_K[2..]).expect("send");
    assert_eq!(read_to_eof(&mut s), b"+");

    // Pipelined after the one request: not served, one '-', then EOF.
    let mut s = TcpStream::connect(&addr).expect("connect");
    let mut two = LOCK_K.to_vec();
    two.extend_from_slice(UNLOCK_K);
    s.write_all(&two).expect("send");
    assert_eq!(read_to_eof(&mut s), b"+-");

    // Persist first: several requests, and the connection stays open.
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.write_all(b"\x06").expect("send");
    assert_eq!(read_exact_n(&mut s, 1), b"+", "Persist is answered");
    for _ in 0..3 {
        s.write_all(LOCK_K).expect("send");
        assert_eq!(read_exact_n(&mut s, 1), b"+");
        s.write_all(UNLOCK_K).expect("send");
        assert_eq!(read_exact_n(&mut s, 1), b"+");
    }
    s.shutdown(std::net::Shutdown::Write).expect("half-close");
    assert_eq!(read_to_eof(&mut s), b"", "closed once the client is done");
}

#[test]
fn default_floor_leaves_the_close_to_the_client() {
    let (_floor, addr) = start_floor();
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.write_all(LOCK_K).expect("send");
    assert_eq!(read_exact_n(&mut s, 1), b"+");
    // Still open: a second request without Persist is answered too.
    s.write_all(UNLOCK_K).expect("send");
    assert_eq!(read_exact_n(&mut s, 1), b"+");
}

#[test]
fn per_request_load_against_the_close_first_floor() {
    let (_floor, addr) = start_floor_with(&["--close-first"]);
    let (_, st) = run(&[
        "--target",
        &format!("ringlock://{addr}"),
        "--connections",
        "4",
        "--duration",
        "0.3s",
        "--warmup",
        "0s",
        "--conn-mode",
        "per-request",
        "--dist",
        "private",
        "--keys",
        "4",
        "--no-progress",
    ]);
    assert_eq!(st.errors.total(), 0, "{:?} {:?}", st.errors, st.first_error);
    assert!(st.cycles > 10, "only {} cycles", st.cycles);
    // Warm-up 0: every cycle is measured; each took a Lock and an Unlock
    // connection, and the server closing first broke none of them.
    assert_eq!(st.connects, 2 * st.cycles);
}

fn parse(args: &[&str]) -> config::Config {
    config::parse_args(args.iter().map(std::ffi::OsString::from)).expect("valid args")
}

#[test]
fn two_threads_against_the_floor_merge_exactly() {
    let (_floor, addr) = start_floor_with(&["--close-first"]);
    let cfg = parse(&[
        "--target",
        &format!("ringlock://{addr}"),
        "--connections",
        "6",
        "--threads",
        "2",
        "--duration",
        "0.4s",
        "--warmup",
        "0s",
        "--conn-mode",
        "per-request",
        "--dist",
        "private",
        "--keys",
        "6",
        "--no-progress",
    ]);
    let parts = engine::run_parts(&cfg).expect("run completes");
    assert_eq!(parts.len(), 2, "one result per thread");
    // Disjoint clients: thread t served exactly clients t, t + 2, t + 4.
    for (t, p) in parts.iter().enumerate() {
        for (id, &g) in p.grants_per_client.iter().enumerate() {
            if id % 2 == t {
                assert!(g > 0, "thread {t} never served its client {id}");
            } else {
                assert_eq!(g, 0, "thread {t} counted client {id} of the other thread");
            }
        }
        assert_eq!(p.errors.total(), 0, "{:?} {:?}", p.errors, p.first_error);
    }
    let lock_counts: u64 = parts.iter().map(|p| p.lock.len()).sum();
    let cycle_counts: u64 = parts.iter().map(|p| p.cycle.len()).sum();
    let grants: u64 = parts.iter().map(|p| p.grants).sum();
    let cycles: u64 = parts.iter().map(|p| p.cycles).sum();
    let connects: u64 = parts.iter().map(|p| p.connects).sum();
    let max_lock = parts.iter().map(|p| p.lock.max()).max().expect("two parts");
    let st = engine::merge(parts);
    assert_eq!(
        st.lock.len(),
        lock_counts,
        "merged histogram = sum of the threads'"
    );
    assert_eq!(st.cycle.len(), cycle_counts);
    assert_eq!(st.lock.max(), max_lock);
    assert_eq!(
        (st.grants, st.cycles, st.connects),
        (grants, cycles, connects)
    );
    assert_eq!(st.lock.len(), st.grants, "every grant recorded once");
    assert_eq!(st.grants_per_client.iter().sum::<u64>(), st.grants);
    assert_eq!(
        st.connects,
        2 * st.cycles,
        "every cycle: one Lock and one Unlock connection"
    );
    let json = report::to_json(&cfg, &st);
    assert!(json.contains("\"threads\":2,"), "{json}");
    assert!(json.contains(&format!("\"cycles\":{cycles},")), "{json}");
}

/// A Locking-Center server that grants everything and counts, per action,
/// every frame it answered (persistent connections only: it never closes
/// first). One thread per connection: the test opens two.
struct Counting {
    addr: String,
    /// Frames answered, indexed by action byte.
    frames: Arc<[AtomicU64; 8]>,
}

fn start_counting_server() -> Counting {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("bound").to_string();
    let frames: Arc<[AtomicU64; 8]> = Arc::new(Default::default());
    let counts = Arc::clone(&frames);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let counts = Arc::clone(&counts);
            std::thread::spawn(move || {
                conn.set_nodelay(true).expect("nodelay");
                let mut pending = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    pending.extend_from_slice(&buf[..n]);
                    let mut answers = Vec::new();
                    while let Frame::Complete(len) = frame_len(&pending) {
                        // Counted before it is answered: once the client has
                        // its answer, the count includes the request.
                        counts[pending[0] as usize & 7].fetch_add(1, Ordering::SeqCst);
                        pending.drain(..len);
                        answers.push(b'+');
                    }
                    if conn.write_all(&answers).is_err() {
                        return;
                    }
                }
            });
        }
    });
    Counting { addr, frames }
}

#[test]
fn two_threads_every_request_reaches_the_server_once() {
    let server = start_counting_server();
    // One client per thread on one hot key: every contended grant the load
    // generator sees is contention between its two threads.
    let cfg = parse(&[
        "--target",
        &format!("ringlock://{}", server.addr),
        "--connections",
        "2",
        "--threads",
        "2",
        "--duration",
        "0.4s",
        "--warmup",
        "0s",
        "--dist",
        "hot",
        "--keys",
        "1",
        "--no-progress",
    ]);
    let st = engine::run(&cfg).expect("run completes");
    assert_eq!(st.errors.total(), 0, "{:?} {:?}", st.errors, st.first_error);
    assert!(st.cycles > 10, "only {} cycles", st.cycles);
    let count = |action: usize| server.frames[action].load(Ordering::SeqCst);
    assert_eq!(count(6), 2, "one Persist per connection");
    assert_eq!(st.connects, 2);
    assert_eq!(
        count(1),
        st.grants,
        "every Lock the server answered is one grant"
    );
    assert_eq!(
        count(2),
        st.cycles,
        "every Unlock the server answered is one cycle"
    );
    assert_eq!(st.lock.len(), st.grants);
    assert!(
        st.grants_per_client.iter().all(|&g| g > 0),
        "both threads' clients ran: {:?}",
        st.grants_per_client
    );
    assert!(
        !st.queue_wait.is_empty(),
        "contention between the threads' clients is seen (shared key state)"
    );
}

#[test]
fn pinning_to_a_cpu_outside_the_mask_is_a_clear_error() {
    let (_floor, addr) = start_floor();
    let target = format!("ringlock://{addr}");
    let cfg = parse(&[
        "--target",
        &target,
        "--connections",
        "2",
        "--threads",
        "2",
        "--pin-cpus",
        "1023",
        "--duration",
        "0.1s",
        "--warmup",
        "0s",
        "--no-progress",
    ]);
    let err = match engine::run(&cfg) {
        Ok(_) => panic!("pinning to CPU 1023 succeeded on a machine without it"),
        Err(e) => e,
    };
    assert!(err.contains("pinning to CPU 1023"), "{err}");
    // A CPU of the allowed set works.
    let (_, st) = run(&[
        "--target",
        &target,
        "--connections",
        "2",
        "--threads",
        "2",
        "--pin-cpus",
        "0",
        "--duration",
        "0.1s",
        "--warmup",
        "0s",
        "--no-progress",
    ]);
    assert_eq!(st.errors.total(), 0, "{:?} {:?}", st.errors, st.first_error);
    assert!(st.cycles > 0);
}
