//! The load generator over TLS against the real `ringlockd`, with
//! certificates made by the real `ringlock cert` CLI: session and
//! Locking-Center loads (persistent, a connection per request, a
//! connection per cycle) finish with no error and one timed handshake per
//! connection, the server counts the same handshakes; a wrong CA, or TLS
//! to a plaintext server, ends in errors within the run's time, never a
//! hang.
//!
//! The binaries: `$RINGLOCKD` and `$RINGLOCK` when set; otherwise this
//! test builds them (`cargo build -p ringlock --bin ringlockd --bin
//! ringlock`, a no-op when they are fresh) into the target directory and
//! profile this test was built in, and runs them from there.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use ringlock_loadgen::{config, engine};

struct Bins {
    ringlockd: PathBuf,
    ringlock: PathBuf,
}

fn bins() -> &'static Bins {
    static BINS: OnceLock<Bins> = OnceLock::new();
    BINS.get_or_init(|| {
        if let (Some(d), Some(c)) = (std::env::var_os("RINGLOCKD"), std::env::var_os("RINGLOCK")) {
            return Bins {
                ringlockd: d.into(),
                ringlock: c.into(),
            };
        }
        // target/<profile>/ringlock-loadgen: build the server's binaries
        // beside it, with the same profile and target directory.
        let loadgen = Path::new(env!("CARGO_BIN_EXE_ringlock-loadgen"));
        let profile_dir = loadgen.parent().expect("the binary is in a directory");
        let target_dir = profile_dir.parent().expect("a profile directory");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev".to_string(),
            Some(p) => p.to_string(),
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        // Not the variables cargo sets for this test's process: build
        // scripts that read them (ring's reads CARGO_MANIFEST_DIR) would
        // be rerun, and so would everything after them, here and again in
        // the next plain `cargo build`.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if [
                "CARGO_PKG_",
                "CARGO_MANIFEST_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
            ]
            .iter()
            .any(|p| name.starts_with(p))
                || ["CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR", "OUT_DIR"].contains(&&*name)
            {
                build.env_remove(&*name);
            }
        }
        let status = build
            .args(["build", "--quiet", "-p", "ringlock"])
            .args(["--bin", "ringlockd", "--bin", "ringlock"])
            .args(["--profile", &profile])
            .arg("--target-dir")
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build for ringlockd and ringlock");
        assert!(
            status.success(),
            "building ringlockd and ringlock failed ({status}); or set RINGLOCKD and RINGLOCK"
        );
        Bins {
            ringlockd: profile_dir.join("ringlockd"),
            ringlock: profile_dir.join("ringlock"),
        }
    })
}

/// A private directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        let p = std::env::temp_dir().join(format!(
            "ringlock-loadgen-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `ringlock cert ARGS...`, which must succeed.
fn cert(args: &[&str]) {
    let o = Command::new(&bins().ringlock)
        .arg("cert")
        .args(args)
        .output()
        .expect("run ringlock cert");
    assert!(
        o.status.success(),
        "ringlock cert {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A CA (its key beside the certs dir) and a certs dir with `ca.crt`, node
/// 1's certificate for 127.0.0.1 and localhost, and client `lg`'s.
fn make_certs(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    let key = root.join(format!("{name}.ca.key"));
    let (d, k) = (dir.to_str().unwrap(), key.to_str().unwrap());
    cert(&["create-ca", "--certs-dir", d, "--ca-key", k]);
    cert(&[
        "create-node",
        "--certs-dir",
        d,
        "--ca-key",
        k,
        "--node-id",
        "1",
        "127.0.0.1",
        "localhost",
    ]);
    cert(&["create-client", "--certs-dir", d, "--ca-key", k, "lg"]);
    dir
}

struct Server {
    child: Child,
    lock: String,
    metrics: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn field(line: &str, name: &str) -> Option<String> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    Some(line[start..].split_whitespace().next()?.to_string())
}

/// `ringlockd` on loopback ports, one shard, with `extra` arguments.
fn start_server(extra: &[&str]) -> Server {
    let mut child = Command::new(&bins().ringlockd)
        .args(["--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"])
        .args(["--metrics-bind", "127.0.0.1:0", "--threads", "1"])
        .args(extra)
        .env_remove("BIND_ADDRESS")
        .env_remove("DATA_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringlockd");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                // Nobody listens any more: drain so the server never blocks.
                continue;
            }
        }
    });
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) if line.contains("event=listening") => {
                return Server {
                    lock: field(&line, "lock").expect("lock= in the listening line"),
                    metrics: field(&line, "metrics").expect("metrics= in the listening line"),
                    child,
                };
            }
            Ok(line) => seen.push(line),
            Err(e) => {
                let _ = child.kill();
                panic!("ringlockd did not listen ({e}): {}", seen.join("\n"));
            }
        }
    }
}

/// One sample of the server's /metrics.
fn metric(server: &Server, name: &str) -> f64 {
    let mut c = TcpStream::connect(&server.metrics).expect("connect to /metrics");
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    c.read_to_string(&mut body).expect("read /metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{body}"))
}

fn run(args: &[&str]) -> (engine::Stats, Duration) {
    let mut all = vec!["--no-progress"];
    all.extend_from_slice(args);
    let cfg = config::parse_args(all.iter().map(std::ffi::OsString::from)).expect("valid args");
    let t0 = Instant::now();
    let stats = engine::run(&cfg).expect("the run completes");
    (stats, t0.elapsed())
}

fn assert_clean(what: &str, s: &engine::Stats) {
    assert_eq!(
        s.errors.total(),
        0,
        "{what}: errors {:?} (first: {:?})",
        s.errors,
        s.first_error
    );
    assert!(s.cycles > 0, "{what}: no cycle completed");
    assert_eq!(s.grants, s.cycles, "{what}: one grant per cycle");
    assert_eq!(
        s.handshake.len(),
        s.connects,
        "{what}: one timed handshake per connection"
    );
    assert!(
        s.handshake.min() > 0,
        "{what}: handshakes take time ({} connections)",
        s.connects
    );
}

#[test]
fn session_and_lc_loads_over_tls_have_no_error() {
    let tmp = TempDir::new("tls");
    let certs = make_certs(&tmp.0, "certs");
    let certs = certs.to_str().unwrap();
    let server = start_server(&["--certs-dir", certs]);
    let ok_before = metric(&server, "ringlock_tls_handshakes_total{result=\"ok\"}");
    let session = format!("ringlock-session://{}", server.lock);
    let lc = format!("ringlock://{}", server.lock);
    let short = ["--duration", "400ms", "--warmup", "100ms"];
    let mut connections = 0;

    // Sessions, persistent connections: one handshake per client.
    let mut args = vec!["--target", &session, "--tls-certs-dir", certs];
    args.extend_from_slice(&["--connections", "4", "--keys", "50"]);
    args.extend_from_slice(&short);
    let (s, _) = run(&args);
    assert_clean("session", &s);
    assert_eq!(s.connects, 4, "session: one connection per client");
    connections += s.connects;

    // Locking-Center with a client certificate, persistent, two threads.
    let mut args = vec!["--target", &lc, "--tls-certs-dir", certs];
    args.extend_from_slice(&["--tls-client", "lg", "--connections", "4"]);
    args.extend_from_slice(&["--threads", "2"]);
    args.extend_from_slice(&short);
    let (s, _) = run(&args);
    assert_clean("lc persistent", &s);
    assert_eq!(s.connects, 4, "lc persistent: one connection per client");
    connections += s.connects;

    // Locking-Center, a connection (and a handshake) per request: the
    // server closes each after its answer.
    let mut args = vec!["--target", &lc, "--tls-certs-dir", certs];
    args.extend_from_slice(&["--conn-mode", "per-request", "--connections", "2"]);
    args.extend_from_slice(&short);
    let (s, _) = run(&args);
    assert_clean("lc per-request", &s);
    assert!(
        s.connects >= 2 * s.cycles_all,
        "lc per-request: a connection for the Lock and one for the Unlock \
         ({} connects, {} cycles)",
        s.connects,
        s.cycles_all
    );
    connections += s.connects;

    // Sessions, a connection per cycle, 40 cycles in all: the handshake
    // storm's mode.
    let mut args = vec!["--target", &session, "--tls-certs-dir", certs];
    args.extend_from_slice(&["--conn-mode", "per-cycle", "--connections", "4"]);
    args.extend_from_slice(&["--cycles", "40", "--warmup", "0", "--duration", "30s"]);
    // The engine keeps the samples; the binary writes them (not run here).
    args.extend_from_slice(&["--latency-log", "unused"]);
    let (s, took) = run(&args);
    assert_clean("session per-cycle", &s);
    assert_eq!(
        s.samples.len() as u64,
        s.lock.len(),
        "one sample per lock latency"
    );
    assert!(
        s.samples
            .iter()
            .all(|&(start, _)| (s.started_ns..s.ended_ns).contains(&start)),
        "samples start within the run ({}..{})",
        s.started_ns,
        s.ended_ns
    );
    assert_eq!(
        (s.cycles, s.connects),
        (40, 40),
        "session per-cycle: 40 cycles, a connection each"
    );
    assert!(
        took < Duration::from_secs(25),
        "--cycles ends the run when they are done ({took:?})"
    );
    connections += s.connects;

    // The server counted the same handshakes, all good.
    let ok = metric(&server, "ringlock_tls_handshakes_total{result=\"ok\"}") - ok_before;
    assert_eq!(ok as u64, connections, "server-side successful handshakes");
    assert_eq!(
        metric(&server, "ringlock_tls_handshakes_total{result=\"failed\"}"),
        0.0
    );
    assert!(metric(&server, "ringlock_tls_handshake_seconds_total") > 0.0);
}

#[test]
fn a_wrong_ca_or_a_plaintext_server_gives_errors_not_a_hang() {
    let tmp = TempDir::new("tls-wrong");
    let certs = make_certs(&tmp.0, "certs");
    let other = make_certs(&tmp.0, "other");
    let (certs, other) = (certs.to_str().unwrap(), other.to_str().unwrap());
    let server = start_server(&["--certs-dir", certs]);
    let bounded = ["--duration", "500ms", "--warmup", "0", "--drain", "1s"];
    for target in [
        format!("ringlock-session://{}", server.lock),
        format!("ringlock://{}", server.lock),
    ] {
        let mut args = vec!["--target", &target, "--tls-certs-dir", other];
        args.extend_from_slice(&["--connections", "2"]);
        args.extend_from_slice(&bounded);
        let (s, took) = run(&args);
        assert!(
            s.errors.tls > 0 && s.grants == 0 && s.cycles_all == 0,
            "{target} with another CA: {:?}, {} grants",
            s.errors,
            s.grants
        );
        let first = s.first_error.unwrap_or_default();
        assert!(
            first.contains("TLS handshake") && first.contains("UnknownIssuer"),
            "{target}: {first}"
        );
        assert!(took < Duration::from_secs(5), "{target}: took {took:?}");
    }
    assert!(metric(&server, "ringlock_tls_handshakes_total{result=\"failed\"}") > 0.0);

    // Plaintext sessions to the TLS-only port are refused with tls_required.
    let target = format!("ringlock-session://{}", server.lock);
    let mut args = vec!["--target", &target, "--connections", "1"];
    args.extend_from_slice(&bounded);
    let (s, _) = run(&args);
    assert!(s.errors.total() > 0 && s.grants == 0, "{:?}", s.errors);
    let first = s.first_error.unwrap_or_default();
    assert!(first.contains("tls_required"), "{first}");

    // TLS to a server without certificates: an error (whatever the server
    // makes of a ClientHello), within the run's time.
    let plain = start_server(&[]);
    let target = format!("ringlock-session://{}", plain.lock);
    let mut args = vec!["--target", &target, "--tls-certs-dir", certs];
    args.extend_from_slice(&["--connections", "2"]);
    args.extend_from_slice(&bounded);
    let (s, took) = run(&args);
    assert!(
        s.errors.total() > 0 && s.grants == 0,
        "TLS to a plaintext server: {:?}",
        s.errors
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
}
