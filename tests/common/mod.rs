//! Test support: starts the real `ringlockd` binary on ephemeral loopback
//! ports and speaks raw Locking-Center frames to it.
#![allow(dead_code)]

pub mod cluster;
pub mod fault_proxy;
pub mod peer_link;
pub mod raw;
pub mod session;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct Server {
    pub lock_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub child: Child,
    /// Every stderr line after the listening line, as it arrives.
    pub log: mpsc::Receiver<String>,
    /// The stderr lines printed before the listening line (recovery report).
    pub startup_log: Vec<String>,
}

/// A private directory under the system temp dir, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        let p = std::env::temp_dir().join(format!("ringlock-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn field(line: &str, name: &str) -> Option<SocketAddr> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    line[start..].split_whitespace().next()?.parse().ok()
}

impl Server {
    /// Starts `ringlockd --bind 127.0.0.1:0 --admin-bind 127.0.0.1:0 <extra>`
    /// and waits for its listening line.
    pub fn start(extra: &[&str]) -> Server {
        Server::try_start(extra).unwrap_or_else(|e| panic!("ringlockd did not start: {e}"))
    }

    /// Like `start`, but returns the server's stderr when it exits instead.
    pub fn try_start(extra: &[&str]) -> Result<Server, String> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlockd"));
        cmd.args(["--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"]);
        Server::spawn(cmd, extra)
    }

    pub fn spawn(cmd: Command, extra: &[&str]) -> Result<Server, String> {
        Server::spawn_logged(cmd, extra)
            .map_err(|(code, stderr)| format!("exited (code {code}) with stderr:\n{stderr}"))
    }

    /// Starts `cmd` and waits for its listening line. On exit instead:
    /// the exit code (-1 if killed) and everything it printed.
    pub fn spawn_logged(cmd: Command, extra: &[&str]) -> Result<Server, (i32, String)> {
        Server::spawn_logged_with(cmd, extra, |_| {})
    }

    /// [`Server::spawn_logged`], calling `spawned` with the pid as soon as
    /// the process exists (to watch its start-up).
    pub fn spawn_logged_with(
        mut cmd: Command,
        extra: &[&str],
        spawned: impl FnOnce(u32),
    ) -> Result<Server, (i32, String)> {
        if std::env::var_os("RINGLOCK_TEST_DEBUG").is_some() {
            cmd.args(["--log-level", "debug"]);
        }
        // One shard unless the test asks for more, or the suite is run with
        // RINGLOCK_TEST_THREADS=N (scripts/test.sh runs the order-independent
        // suites with 2 and 4 shards as well).
        if !extra.contains(&"--threads") {
            let n = std::env::var("RINGLOCK_TEST_THREADS").unwrap_or_else(|_| "1".into());
            cmd.args(["--threads", &n]);
        }
        cmd.args(extra)
            .env_remove("BIND_ADDRESS")
            .env_remove("DATA_PATH")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ringlockd");
        spawned(child.id());
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut pre = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(line) if line.contains("event=listening") => {
                    pin_current_thread();
                    return Ok(Server {
                        lock_addr: field(&line, "lock").expect("lock= in listening line"),
                        admin_addr: field(&line, "admin").expect("admin= in listening line"),
                        metrics_addr: field(&line, "metrics"),
                        child,
                        log: rx,
                        startup_log: pre,
                    });
                }
                Ok(line) => pre.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().expect("wait for ringlockd");
                    return Err((status.code().unwrap_or(-1), pre.join("\n")));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "ringlockd neither listened nor exited; stderr:\n{}",
                        pre.join("\n")
                    );
                }
            }
        }
    }

    /// Waits (bounded) for a log line containing `needle`.
    pub fn wait_log(&self, needle: &str) -> String {
        loop {
            match self.log.recv_timeout(Duration::from_secs(10)) {
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(e) => panic!("no log line with {needle:?}: {e}"),
            }
        }
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Counts the server's open file descriptors.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// A persistent lock-port connection (opted in with action Persist).
    pub fn connect(&self) -> Conn {
        Conn::persistent(self.lock_addr)
    }

    /// A one-shot connection, as Locking-Center clients open: the server
    /// closes it after its one answer.
    pub fn connect_oneshot(&self) -> Conn {
        Conn::connect(self.lock_addr)
    }

    /// The metrics address (the server must have `--metrics-bind`).
    pub fn metrics(&self) -> SocketAddr {
        self.metrics_addr
            .expect("server started with --metrics-bind")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            // Show what the server said when a test fails (all of it with
            // RINGLOCK_TEST_DEBUG=1, which starts servers at debug level).
            while let Ok(line) = self.log.try_recv() {
                eprintln!("ringlockd: {line}");
            }
        }
    }
}

/// Pins the calling test thread to CPU 0. Loopback packets are queued on
/// the sending CPU's backlog; from one CPU they reach the server in the
/// order they were sent, so a round trip on a second connection ("sync")
/// proves that earlier frames and hang-ups of this thread were handled. A
/// thread that migrates between CPUs has no such ordering across sockets.
/// Threads spawned afterwards inherit the mask.
pub fn pin_current_thread() {
    // SAFETY: sched_setaffinity(0) on a zeroed cpu_set_t with CPU 0 set
    // affects only the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

pub fn frame(action: u8, key: &[u8], source: Option<&[u8]>) -> Vec<u8> {
    let mut b = vec![action, key.len() as u8];
    b.extend_from_slice(key);
    if let Some(s) = source {
        b.push(s.len() as u8);
        b.extend_from_slice(s);
    }
    b
}

/// One raw lock-port connection.
pub struct Conn {
    pub s: TcpStream,
}

impl Conn {
    pub fn connect(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).expect("connect to ringlockd");
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        Conn { s }
    }

    /// Connects and opts in to several requests on the connection.
    pub fn persistent(addr: SocketAddr) -> Conn {
        let mut c = Conn::connect(addr);
        c.send(&[6]);
        assert_eq!(c.read_byte(), b'+', "Persist refused");
        c
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("write frame");
    }

    /// Reads exactly one answer byte (panics on EOF or timeout).
    pub fn read_byte(&mut self) -> u8 {
        let mut b = [0u8; 1];
        self.s.read_exact(&mut b).expect("read one answer byte");
        b[0]
    }

    /// Reads one byte, or `None` on EOF.
    pub fn read_byte_or_eof(&mut self) -> Option<u8> {
        let mut b = [0u8; 1];
        loop {
            return match self.s.read(&mut b) {
                Ok(0) => None,
                Ok(_) => Some(b[0]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
                Err(e) => panic!("read: {e}"),
            };
        }
    }

    /// True if no byte arrives within `ms` (the request is still queued).
    pub fn silent_for(&mut self, ms: u64) -> bool {
        self.s
            .set_read_timeout(Some(Duration::from_millis(ms)))
            .expect("timeout");
        let mut b = [0u8; 1];
        let r = loop {
            match self.s.read(&mut b) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        self.s
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        match r {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                true
            }
            Ok(0) => panic!("connection closed while expected to wait"),
            Ok(_) => false,
            Err(e) => panic!("read: {e}"),
        }
    }

    /// Sends a raw frame and reads its one-byte answer.
    pub fn send_and_read(&mut self, bytes: &[u8]) -> u8 {
        self.send(bytes);
        self.read_byte()
    }

    pub fn lock(&mut self, key: &[u8], src: &[u8]) -> u8 {
        self.send(&frame(1, key, Some(src)));
        self.read_byte()
    }
    pub fn try_lock(&mut self, key: &[u8], src: &[u8]) -> u8 {
        self.send(&frame(5, key, Some(src)));
        self.read_byte()
    }
    pub fn unlock(&mut self, key: &[u8]) -> u8 {
        self.send(&frame(2, key, None));
        self.read_byte()
    }
    pub fn reset_key(&mut self, key: &[u8]) -> u8 {
        self.send(&frame(3, key, None));
        self.read_byte()
    }
    pub fn reset_source(&mut self, src: &[u8]) -> u8 {
        let mut b = vec![4, src.len() as u8];
        b.extend_from_slice(src);
        self.send(&b);
        self.read_byte()
    }
    pub fn half_close(&self) {
        self.s.shutdown(Shutdown::Write).expect("shutdown write");
    }
}

/// One request on a fresh connection, as Locking-Center clients do.
pub fn once(addr: SocketAddr, bytes: &[u8]) -> u8 {
    let mut c = Conn::connect(addr);
    c.send(bytes);
    c.read_byte()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub key: Vec<u8>,
    pub source: Vec<u8>,
    pub endpoint: String,
    pub acquired_unix_secs: i64,
}

/// Admin `KEYS`, decoded independently of the server's own codec.
pub fn keys(admin: SocketAddr) -> Vec<KeyInfo> {
    let mut s = TcpStream::connect(admin).expect("connect admin");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s.write_all(b"KEYS").expect("write KEYS");
    let mut n = [0u8; 4];
    s.read_exact(&mut n).expect("KEYS count");
    let mut out = Vec::new();
    let take = |s: &mut TcpStream| {
        let mut l = [0u8; 1];
        s.read_exact(&mut l).expect("len");
        let mut v = vec![0u8; l[0] as usize];
        s.read_exact(&mut v).expect("bytes");
        v
    };
    for _ in 0..u32::from_le_bytes(n) {
        let key = take(&mut s);
        let source = take(&mut s);
        let endpoint = String::from_utf8(take(&mut s)).expect("utf-8 endpoint");
        let mut t = [0u8; 8];
        s.read_exact(&mut t).expect("time");
        out.push(KeyInfo {
            key,
            source,
            endpoint,
            acquired_unix_secs: i64::from_le_bytes(t),
        });
    }
    out
}

/// Admin command with names (`RSET` / `RSBS`); returns the answer bytes.
pub fn admin_names(admin: SocketAddr, cmd: &[u8; 4], names: &[&[u8]]) -> Vec<u8> {
    let mut s = TcpStream::connect(admin).expect("connect admin");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut b = cmd.to_vec();
    b.extend_from_slice(&(names.len() as u32).to_le_bytes());
    for n in names {
        b.push(n.len() as u8);
        b.extend_from_slice(n);
    }
    s.write_all(&b).expect("write admin command");
    let want = names.len().max(if &cmd[..] == b"RSBS" { 1 } else { 0 }) + 1;
    let mut out = vec![0u8; want];
    s.read_exact(&mut out).expect("admin answer");
    out
}

/// Runs `promtool check metrics` on `text`; true when it passes. A missing
/// promtool fails the test: CI installs it (`.ci/run`, Debian package
/// `prometheus`), and a check that silently skips proves nothing.
pub fn promtool_check_metrics(text: &str) -> bool {
    use std::process::Stdio;
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "promtool is not on PATH: install it (Debian: apt-get install prometheus; .ci/run does)"
        ),
        Err(e) => panic!("spawning promtool: {e}"),
    };
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool runs");
    if !out.status.success() {
        eprintln!(
            "promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.status.success()
}

/// One unlabelled series (`ringlock_queued_waiters`, …) from the `/metrics`
/// at `addr` (a server started with `--metrics-bind 127.0.0.1:0`; see
/// [`Server::metrics`]).
pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    let mut c = TcpStream::connect(addr).expect("connect to the metrics port");
    c.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .expect("request");
    let mut text = String::new();
    c.read_to_string(&mut text).expect("answer");
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no series {name} in:\n{text}"))
}

/// Polls `/metrics` until `name` reads `want`: the loop publishes its
/// gauges once per tick, so this is the signal that a request reached a
/// given state (queued, withdrawn, …). Bounded, so a hang fails.
pub fn wait_metric(addr: SocketAddr, name: &str, want: f64) {
    for _ in 0..10_000 {
        if metric(addr, name) == want {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("{name} never reached {want} (now {})", metric(addr, name));
}

/// `ringlock --addr LOCK --admin-addr ADMIN --retry 1s`, none of the
/// environment variables that would change what it does inherited: the
/// command line the CLI tests add their arguments to.
pub fn ringlock_cmd(lock: SocketAddr, admin: SocketAddr) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    for var in [
        "RINGLOCK_ADDR",
        "RINGLOCK_ADMIN_ADDR",
        "RINGLOCK_SOURCE",
        "RINGLOCK_AUTH_TOKEN_FILE",
        "RINGLOCK_KEY",
        "RINGLOCK_TOKEN",
    ] {
        c.env_remove(var);
    }
    c.args(["--addr", &lock.to_string()])
        .args(["--admin-addr", &admin.to_string()])
        .args(["--retry", "1s"]);
    c
}
