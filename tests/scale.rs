//! Large tables and large logs, with the real binary: the lock port is not
//! served from a table that recovery has not finished (a connection that
//! arrives meanwhile is refused, never answered from a partial table and
//! never lost once accepted), and `/readyz` says ready only then.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ringlock::core::{HeldRef, HoldMode};
use ringlock::wal::record;

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:09}").into_bytes()
}

/// Writes a log of `n` Acquire records of distinct keys (`key(0)` …),
/// as a server that granted them would have.
fn write_log(path: &Path, n: usize) {
    let mut img = record::MAGIC.to_vec();
    record::encode_grant_mark(1, &mut img);
    for i in 0..n {
        let k = key(i);
        record::encode_acquire(
            HeldRef {
                key: &k,
                source: b"src",
                endpoint: SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 40_000)),
                acquired_unix_ms: 1_700_000_000_000 + i as u64,
                grant_id: 1 + i as u64,
                mode: HoldMode::Persistent,
                expires_unix_ms: 0,
                session: 0,
                access: ringlock::core::Access::Exclusive,
            },
            &mut img,
        );
    }
    std::fs::write(path, img).expect("write the log");
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("an ephemeral port")
        .port()
}

/// What one attempt to reach the lock port found.
#[derive(Debug, PartialEq)]
enum Probe {
    Refused,
    /// The answer, and whether the log was still mapped (being replayed)
    /// right after the connection was accepted.
    Answered(u8, bool),
}

fn probe(addr: SocketAddr, frame: &[u8], replaying: impl Fn() -> bool) -> Probe {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return Probe::Refused;
    };
    let during = replaying();
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    s.write_all(frame).expect("send the TryLock");
    let mut b = [0u8; 1];
    // Accepted means answered: a connection that is accepted and then
    // dropped (EOF, reset, timeout) fails here.
    s.read_exact(&mut b)
        .expect("an accepted connection is answered");
    Probe::Answered(b[0], during)
}

fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

fn log_mapped(pid: u32, log: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains(log))
}

/// While recovery replays the log (the server has it mapped, which
/// `/proc/PID/maps` shows) the lock port refuses connections; the first
/// connection it accepts already sees every held key of the log (a TryLock
/// of the log's last key answers `#`: never an answer from a partial
/// table, never a connection accepted and dropped), and by then `/readyz`
/// answers 200 (it is not served at all before).
#[test]
fn the_lock_port_opens_only_on_a_recovered_table() {
    const N: usize = 150_000;
    let dir = TempDir::new("scale-recovery-order");
    let log = dir.path("locks.wal");
    write_log(&log, N);
    let log_shown = std::fs::canonicalize(&log)
        .expect("the log exists")
        .to_string_lossy()
        .into_owned();
    let (lock_port, metrics_port) = (free_port(), free_port());
    let lock: SocketAddr = ([127, 0, 0, 1], lock_port).into();
    let metrics: SocketAddr = ([127, 0, 0, 1], metrics_port).into();
    let last = frame(5, &key(N - 1), Some(b"other"));
    let (pid_tx, pid_rx) = std::sync::mpsc::channel::<u32>();
    let prober = std::thread::spawn(move || {
        let pid = pid_rx.recv().expect("the server's pid");
        let mut refused = 0u64;
        loop {
            let mapped = log_mapped(pid, &log_shown);
            match probe(lock, &last, || log_mapped(pid, &log_shown)) {
                Probe::Refused => {
                    refused += mapped as u64;
                    // While the lock port is closed, so is /readyz.
                    assert_ne!(
                        http_status(metrics, "/readyz"),
                        Some(200),
                        "ready before the lock port serves"
                    );
                    std::thread::yield_now();
                }
                Probe::Answered(b, during) => {
                    // The log still mapped once the connection was
                    // accepted: the port was open during the replay.
                    assert!(
                        !during,
                        "the lock port accepted a connection during recovery"
                    );
                    let ready = http_status(metrics, "/readyz");
                    return (refused, b, ready);
                }
            }
        }
    });
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlockd"));
    cmd.args(["--bind", &lock.to_string(), "--admin-bind", "127.0.0.1:0"])
        .args(["--metrics-bind", &metrics.to_string(), "--threads", "1"])
        .args(["--max-keys", &N.to_string()])
        .arg("--data-path")
        .arg(&log);
    let s = Server::spawn_logged_with(cmd, &[], |pid| pid_tx.send(pid).expect("the prober waits"))
        .unwrap_or_else(|(code, err)| panic!("ringlockd exited ({code}): {err}"));
    let (refused_during_replay, answer, ready) =
        prober.join().expect("the prober saw the start-up");
    assert!(
        refused_during_replay > 0,
        "no probe ran while the log was mapped: the test saw nothing of the recovery"
    );
    assert_eq!(
        answer, b'#',
        "the first accepted connection was answered from an incomplete table"
    );
    assert_eq!(ready, Some(200), "/readyz once the lock port answers");
    let line = s
        .startup_log
        .iter()
        .find(|l| l.contains("event=recovery "))
        .expect("a recovery line");
    assert!(line.contains(&format!(" records={} ", N + 1)), "{line}");
    assert!(line.contains(&format!(" held_keys={N} ")), "{line}");
}

/// A log written before binary endpoints (version-1 records) is still
/// replayed with its holders intact, a newer server appends version-2
/// records to it, and the mixed log replays again.
#[test]
fn a_version_1_log_is_read_appended_to_and_read_again() {
    let dir = TempDir::new("scale-v1-log");
    let log = dir.path("locks.wal");
    let mut img = record::MAGIC.to_vec();
    let eps = ["10.1.2.3:4567", "[2001:db8::7]:65000"];
    for (i, ep) in eps.iter().enumerate() {
        let k = key(i);
        record::encode_acquire_v1(
            HeldRef {
                key: &k,
                source: b"old",
                endpoint: ep.parse().expect("an endpoint"),
                acquired_unix_ms: 1_700_000_000_000,
                grant_id: 10 + i as u64,
                mode: HoldMode::Persistent,
                expires_unix_ms: 0,
                session: 0,
                access: ringlock::core::Access::Exclusive,
            },
            &mut img,
        );
    }
    std::fs::write(&log, &img).expect("write the log");
    let path = log.to_str().expect("a UTF-8 path");
    let want = |held: &[KeyInfo]| {
        let got: Vec<(Vec<u8>, &[u8], &str)> = held
            .iter()
            .map(|h| (h.key.clone(), &h.source[..], h.endpoint.as_str()))
            .collect();
        assert_eq!(
            &got[..2],
            &[(key(0), &b"old"[..], eps[0]), (key(1), &b"old"[..], eps[1])]
        );
    };
    let mut s = Server::start(&["--threads", "1", "--data-path", path]);
    want(&keys(s.admin_addr));
    assert_eq!(s.connect().try_lock(b"new", b"new"), b'+');
    s.kill9();
    let s = Server::start(&["--threads", "1", "--data-path", path]);
    let held = keys(s.admin_addr);
    want(&held);
    assert_eq!(held.len(), 3);
    assert_eq!(held[2].key, b"new");
    let data = std::fs::read(&log).expect("read the log");
    assert_eq!(
        data[img.len() + 8],
        record::ACQUIRE,
        "appended as a version-2 Acquire"
    );
}

/// `VmRSS` of a process, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server's status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("a VmRSS line");
    kb * 1024
}

/// Holds `key(0..n)` with TryLocks pipelined 16 deep over `conns`.
fn hold_all(conns: &mut [Conn], n: usize) {
    let mut next = 0;
    let mut buf = Vec::new();
    let mut sent = vec![0usize; conns.len()];
    while next < n {
        for (c, sent) in conns.iter_mut().zip(sent.iter_mut()) {
            buf.clear();
            *sent = 0;
            while *sent < 16 && next < n {
                buf.extend_from_slice(&frame(5, &key(next), Some(b"src")));
                next += 1;
                *sent += 1;
            }
            c.send(&buf);
        }
        for (c, &sent) in conns.iter_mut().zip(sent.iter()) {
            for _ in 0..sent {
                assert_eq!(c.read_byte(), b'+', "a TryLock of a free key");
            }
        }
    }
}

/// The server's RSS per held key, with a key limit ten times what is
/// held: about 170 bytes today (release build, 100 000 to 1 000 000 keys;
/// scale-bench). The bound is twice that and more: inline 128-byte names
/// (about 450) or tables sized for the limit (about 2 400) fail it.
#[test]
fn a_held_key_costs_the_server_at_most_400_bytes_of_rss() {
    const N: usize = 100_000;
    let s = Server::start(&["--threads", "1", "--max-keys", "1000000"]);
    // Connections first: their buffers are not key memory.
    let mut conns: Vec<Conn> = (0..32).map(|_| s.connect()).collect();
    let before = rss_bytes(s.pid());
    hold_all(&mut conns, N);
    let after = rss_bytes(s.pid());
    let per_key = (after as f64 - before as f64) / N as f64;
    eprintln!("RSS per held key: {per_key:.0} bytes");
    assert!(
        per_key <= 400.0,
        "a held key costs the server {per_key:.0} bytes of RSS (bound 400)"
    );
    assert_eq!(keys(s.admin_addr).len(), N);
}

/// A field of `/proc/<pid>/status` in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server's status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a {field} line"));
    kb * 1024
}

/// One shard serving `n` held keys recovered from a log written here
/// (the lock port opens only on the recovered table).
fn server_holding(name: &str, n: usize) -> (TempDir, Server) {
    let dir = TempDir::new(name);
    let log = dir.path("locks.wal");
    write_log(&log, n);
    let path = log.to_str().expect("a UTF-8 path");
    let s = Server::start(&[
        "--threads",
        "1",
        "--max-keys",
        &(n + 1).to_string(),
        "--data-path",
        path,
    ]);
    assert_eq!(s.connect().try_lock(&key(n - 1), b"other"), b'#');
    (dir, s)
}

/// A KEYS answer is streamed from the table, not built whole: with a
/// million held keys its peak extra RSS (VmHWM after `clear_refs` reset it,
/// minus VmRSS before) stays under 16 MB — about 4 MB of sorted key slots
/// plus bounded chunks. Building the list of holders first (~310 bytes a
/// key) or the whole encoded answer (~45 MB here) fails it. The answer is
/// still every key, sorted, with the fields it was granted with.
#[test]
fn a_keys_answer_of_a_million_keys_costs_the_server_at_most_16_mb() {
    const N: usize = 1_000_000;
    const BOUND: u64 = 16 << 20;
    let (_dir, s) = server_holding("scale-keys-stream", N);
    let mut admin = TcpStream::connect(s.admin_addr).expect("connect admin");
    admin
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    // Peak RSS from here on: recovery's peak is not the answer's.
    std::fs::write(format!("/proc/{}/clear_refs", s.pid()), "5").expect("reset VmHWM");
    let before = status_bytes(s.pid(), "VmRSS");
    admin.write_all(b"KEYS").expect("write KEYS");
    let mut r = std::io::BufReader::with_capacity(1 << 16, admin);
    let mut n = [0u8; 4];
    r.read_exact(&mut n).expect("the count");
    assert_eq!(u32::from_le_bytes(n) as usize, N);
    let sized = |r: &mut std::io::BufReader<TcpStream>| {
        let mut l = [0u8; 1];
        r.read_exact(&mut l).expect("a size");
        let mut v = vec![0u8; l[0] as usize];
        r.read_exact(&mut v).expect("a name");
        v
    };
    for i in 0..N {
        let k = sized(&mut r);
        assert_eq!(k, key(i), "entry {i} in key order");
        assert_eq!(sized(&mut r), b"src");
        let ep = SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 40_000)).to_string();
        assert_eq!(sized(&mut r), ep.as_bytes());
        let mut t = [0u8; 8];
        r.read_exact(&mut t).expect("a time");
        assert_eq!(
            i64::from_le_bytes(t),
            ((1_700_000_000_000 + i as u64) / 1000) as i64
        );
    }
    let peak = status_bytes(s.pid(), "VmHWM");
    let extra = peak.saturating_sub(before);
    eprintln!(
        "KEYS of {N} keys: extra peak RSS {:.1} MB",
        extra as f64 / (1 << 20) as f64
    );
    assert!(
        extra <= BOUND,
        "a KEYS of {N} keys cost the server {extra} bytes of RSS (bound {BOUND})"
    );
}

/// What one run of `ringlock keys` printed and cost.
struct CliRun {
    lines: usize,
    /// The highest VmHWM seen, and how many samples saw it.
    peak: u64,
    samples: usize,
}

/// Runs the real `ringlock keys ARGS` against `s` with its output on a
/// pipe, hands each line to `check` as it arrives, and samples the
/// process's peak RSS (VmHWM) at the first line and every 1000th: it is
/// alive then, blocked on the pipe (its output is far bigger than the
/// pipe), and VmHWM keeps its highest value, a list collected before
/// printing included.
fn cli_keys(s: &Server, args: &[&str], mut check: impl FnMut(usize, &[u8])) -> CliRun {
    use std::io::BufRead;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .env_remove("RINGLOCK_ADDR")
        .env_remove("RINGLOCK_ADMIN_ADDR")
        .args(["--addr", &s.lock_addr.to_string()])
        .args(["--admin-addr", &s.admin_addr.to_string()])
        .arg("keys")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ringlock");
    let pid = child.id();
    let hwm = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(kb * 1024)
    };
    let mut out = std::io::BufReader::with_capacity(1 << 16, child.stdout.take().expect("piped"));
    let mut run = CliRun {
        lines: 0,
        peak: 0,
        samples: 0,
    };
    let mut line = Vec::new();
    loop {
        line.clear();
        if out.read_until(b'\n', &mut line).expect("read the output") == 0 {
            break;
        }
        if run.lines.is_multiple_of(1000) {
            if let Some(b) = hwm() {
                run.peak = run.peak.max(b);
                run.samples += 1;
            }
        }
        check(run.lines, &line);
        run.lines += 1;
    }
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut err)
        .expect("read stderr");
    let status = child.wait().expect("wait for ringlock");
    assert!(status.success(), "ringlock keys {args:?}: {status}: {err}");
    assert_eq!(err, "", "nothing on stderr");
    run
}

/// `ringlock keys` prints a million held keys as it reads them: its peak
/// RSS stays under 32 MB (about 6 MB in a debug build: a 64 KiB receive
/// buffer, the first 1000 rows held back for the column widths, a 64 KiB
/// output buffer), in the table and in JSON, and it lists every key
/// exactly once, in order. Collecting the list before printing (about
/// 200 MB) fails it.
#[test]
fn ringlock_keys_of_a_million_keys_stays_under_32_mb() {
    const N: usize = 1_000_000;
    const BOUND: u64 = 32 << 20;
    let (_dir, s) = server_holding("scale-cli-keys", N);
    let table = cli_keys(&s, &[], |i, line| {
        if i == 0 {
            assert!(line.starts_with(b"KEY "), "the header first");
        } else {
            let k = key(i - 1);
            assert!(
                line.starts_with(&k) && line[k.len()] == b' ',
                "row {i} is {:?}",
                String::from_utf8_lossy(&k)
            );
        }
    });
    let json = cli_keys(&s, &["--json"], |i, line| {
        if i == 0 {
            assert_eq!(line, b"[\n");
        } else if i <= N {
            let want = format!("{{\"key\":\"{}\",", String::from_utf8_lossy(&key(i - 1)));
            assert!(line.starts_with(want.as_bytes()), "object {i}");
            assert_eq!(line.ends_with(b"},\n"), i < N, "object {i}");
        } else {
            assert_eq!(line, b"]\n", "the array closed");
        }
    });
    for (what, run, lines) in [("table", &table, N + 1), ("JSON", &json, N + 2)] {
        eprintln!(
            "ringlock keys ({what}) of {N} keys: peak RSS {:.1} MB ({} samples)",
            run.peak as f64 / (1 << 20) as f64,
            run.samples
        );
        assert_eq!(run.lines, lines, "{what}: every key exactly once");
        assert!(run.samples >= 100, "{what}: {} samples", run.samples);
        assert!(
            run.peak <= BOUND,
            "ringlock keys ({what}) of {N} keys peaked at {} bytes of RSS (bound {BOUND})",
            run.peak
        );
    }
}
