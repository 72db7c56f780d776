//! A cluster of real `ringlockd` processes on loopback whose Raft links
//! run through [`FaultProxy`]s: one proxy per ordered pair of nodes, so a
//! test can cut any link one way or both.
//!
//! Nodes run with certificates (`--certs-dir`: mutual TLS on every Raft
//! link) made by the real `ringlock cert` CLI, one CA per cluster, unless
//! `extra` holds `--insecure` (tests whose subject is not TLS may, and
//! say so). Their lock and admin ports also take plaintext clients
//! (`--client-plaintext`): the suites' own clients speak plaintext, and
//! the client ports' TLS is the subject of tests/client_tls.rs; a test
//! that wants TLS-only client ports puts `--tls-clients-only` in `extra`
//! (the harness's marker, not a server flag).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use super::fault_proxy::FaultProxy;
use super::{Server, TempDir};

pub struct Cluster {
    pub nodes: Vec<Option<Server>>,
    /// Each node's own Raft listener port (shard 0; shard g on + g).
    pub raft_ports: Vec<u16>,
    /// `(from, to)` → the proxies `from` dials to reach `to`, one per shard
    /// on consecutive ports (shard g's at the first one's port + g).
    pub proxies: HashMap<(usize, usize), Vec<FaultProxy>>,
    pub dir: TempDir,
    pub threads: usize,
    pub extra: Vec<String>,
    /// Node → its lock address of the last start (kept after a kill).
    pub lock_addrs: Vec<SocketAddr>,
    /// Node → started with `--join` (added to the running cluster, its
    /// links direct, without proxies).
    pub join: Vec<bool>,
    /// Node → its fixed `(lock, admin)` ports ([`Cluster::start_fixed_ports`]);
    /// empty: port 0 (the kernel picks).
    pub client_ports: Vec<(u16, u16)>,
}

/// Runs `ringlock cert ARGS` (the real CLI); panics with its stderr.
pub fn cert_cli(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringlock"))
        .arg("cert")
        .args(args)
        .output()
        .expect("run ringlock cert");
    assert!(
        out.status.success(),
        "ringlock cert {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `n` listeners on consecutive free ports, below the kernel's ephemeral
/// range (32768 and up by default): a node restarted after `kill -9` binds
/// its Raft ports again, and an ephemeral port (any outgoing connection's)
/// must not have taken one meanwhile.
fn consecutive_listeners(n: usize) -> Vec<TcpListener> {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Spread over test processes by pid, then walked by every call.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 20_000 + (std::process::id() % 500) as u16 * 20;
    let _ = NEXT.compare_exchange(0, start, Ordering::Relaxed, Ordering::Relaxed);
    'outer: for _ in 0..2000 {
        let mut base = NEXT.fetch_add(n as u16, Ordering::Relaxed);
        if base as usize + n >= 32_000 {
            NEXT.store(20_000, Ordering::Relaxed);
            base = 20_000;
        }
        let mut held = Vec::new();
        for k in 0..n {
            match TcpListener::bind(("127.0.0.1", base + k as u16)) {
                Ok(l) => held.push(l),
                Err(_) => continue 'outer,
            }
        }
        return held;
    }
    panic!("no {n} consecutive free ports between 20000 and 32000");
}

impl Cluster {
    /// Starts `n` nodes with `threads` shards each (`extra`: more flags for
    /// every node) and waits for a leader.
    pub fn start(n: usize, threads: usize, extra: &[&str]) -> Cluster {
        Cluster::start_ports(n, threads, extra, false)
    }

    /// As [`Cluster::start`], with the lock and admin ports laid out as in
    /// README's cluster example: node i's lock port is node 1's + i and
    /// its admin port, in another block, node 1's admin port + i. A lock
    /// port + 1 is the next node's lock port (or nothing), never an admin
    /// port: a client that guesses "admin = lock + 1" meets a lock port.
    pub fn start_fixed_ports(n: usize, threads: usize, extra: &[&str]) -> Cluster {
        Cluster::start_ports(n, threads, extra, true)
    }

    fn start_ports(n: usize, threads: usize, extra: &[&str], fixed: bool) -> Cluster {
        // Held while the proxies bind theirs, so that no proxy takes a
        // node's port; released just before the nodes start.
        let reserved: Vec<Vec<TcpListener>> =
            (0..n).map(|_| consecutive_listeners(threads)).collect();
        let raft_ports: Vec<u16> = reserved
            .iter()
            .map(|ls| ls[0].local_addr().expect("addr").port())
            .collect();
        let mut proxies = HashMap::new();
        for from in 0..n {
            for (to, &port) in raft_ports.iter().enumerate() {
                if from != to {
                    let ps = consecutive_listeners(threads)
                        .into_iter()
                        .enumerate()
                        .map(|(g, l)| {
                            let up = SocketAddr::from(([127, 0, 0, 1], port + g as u16));
                            FaultProxy::start_on(l, up)
                        })
                        .collect();
                    proxies.insert((from, to), ps);
                }
            }
        }
        let mut c = Cluster {
            nodes: (0..n).map(|_| None).collect(),
            raft_ports,
            proxies,
            dir: TempDir::new("cluster"),
            threads,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            lock_addrs: vec![SocketAddr::from(([127, 0, 0, 1], 0)); n],
            join: vec![false; n],
            client_ports: Vec::new(),
        };
        let client_blocks = fixed.then(|| (consecutive_listeners(n), consecutive_listeners(n)));
        if let Some((lock, admin)) = &client_blocks {
            let port = |l: &TcpListener| l.local_addr().expect("addr").port();
            c.client_ports = lock
                .iter()
                .zip(admin)
                .map(|(l, a)| (port(l), port(a)))
                .collect();
        }
        drop(client_blocks);
        drop(reserved);
        for i in 0..n {
            c.start_node(i);
        }
        c.leader(Duration::from_secs(20));
        c
    }

    /// The `--peers` node `i` is started with: itself at its real port,
    /// every other node at the proxy `i` dials for it.
    fn peers_for(&self, i: usize) -> String {
        (0..self.nodes.len())
            .map(|j| {
                let a = match self.proxies.get(&(i, j)) {
                    Some(p) if i != j => p[0].addr(),
                    _ => self.raft_addr(j),
                };
                format!("{}={}", j + 1, a)
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Node `i`'s own Raft address (its shard 0's listener).
    pub fn raft_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.raft_ports[i]))
    }

    /// Starts one more node, with `--join` and an empty data path, its
    /// links direct (no proxies); its index. It serves nobody until a
    /// membership change adds it.
    pub fn add_node(&mut self) -> usize {
        let reserved = consecutive_listeners(self.threads);
        let i = self.nodes.len();
        self.raft_ports
            .push(reserved[0].local_addr().expect("addr").port());
        self.nodes.push(None);
        self.lock_addrs.push(SocketAddr::from(([127, 0, 0, 1], 0)));
        self.join.push(true);
        drop(reserved);
        self.start_node(i);
        i
    }

    /// Proxies in front of node `i`'s Raft listeners, one per shard on
    /// consecutive ports: name the first one's address as the node's in a
    /// membership change and every member reaches it through them (its
    /// own links stay as they are).
    pub fn front(&self, i: usize) -> Vec<FaultProxy> {
        let port = self.raft_ports[i];
        consecutive_listeners(self.threads)
            .into_iter()
            .enumerate()
            .map(|(g, l)| {
                FaultProxy::start_on(l, SocketAddr::from(([127, 0, 0, 1], port + g as u16)))
            })
            .collect()
    }

    /// The admin addresses of the running nodes, comma-separated (for
    /// `ringlock --admin-addr`).
    pub fn admin_list(&self) -> String {
        self.nodes
            .iter()
            .flatten()
            .map(|s| s.admin_addr.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn data_path(&self, i: usize) -> std::path::PathBuf {
        self.dir.path(&format!("node{}.log", i + 1))
    }

    /// The CA key of this cluster's certificates (made on first use).
    pub fn ca_key(&self) -> std::path::PathBuf {
        let key = self.dir.path("ca.key");
        if !key.exists() {
            let ca = self.dir.path("ca");
            cert_cli(&[
                "create-ca",
                "--certs-dir",
                ca.to_str().expect("utf-8"),
                "--ca-key",
                key.to_str().expect("utf-8"),
            ]);
        }
        key
    }

    /// Node `i`'s certs dir (`ca.crt`, `node.crt`, `node.key` for node id
    /// `i + 1`), made on first use.
    pub fn certs_dir(&self, i: usize) -> std::path::PathBuf {
        let dir = self.dir.path(&format!("certs{}", i + 1));
        if !dir.join("node.crt").exists() {
            let key = self.ca_key();
            std::fs::create_dir_all(&dir).expect("certs dir");
            std::fs::copy(self.dir.path("ca").join("ca.crt"), dir.join("ca.crt"))
                .expect("copy ca.crt");
            cert_cli(&[
                "create-node",
                "--certs-dir",
                dir.to_str().expect("utf-8"),
                "--ca-key",
                key.to_str().expect("utf-8"),
                "--node-id",
                &(i + 1).to_string(),
                "127.0.0.1",
                "localhost",
            ]);
        }
        dir
    }

    /// Runs without certificates (`--insecure` among the flags).
    pub fn insecure(&self) -> bool {
        self.extra.iter().any(|a| a == "--insecure")
    }

    pub fn start_node(&mut self, i: usize) {
        if let Err(e) = self.try_start_node(i) {
            panic!("node {} did not start: {e}", i + 1);
        }
    }

    /// Starts node `i`; its stderr when it exits instead.
    pub fn try_start_node(&mut self, i: usize) -> Result<(), String> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlockd"));
        let (lock, admin) = self.client_ports.get(i).copied().unwrap_or((0, 0));
        cmd.args([
            "--bind",
            &format!("127.0.0.1:{lock}"),
            "--admin-bind",
            &format!("127.0.0.1:{admin}"),
        ]);
        let id = (i + 1).to_string();
        let peers = self.peers_for(i);
        let path = self.data_path(i);
        let threads = self.threads.to_string();
        let mut args: Vec<String> = vec![
            "--node-id".into(),
            id,
            "--peers".into(),
            peers,
            "--data-path".into(),
            path.to_string_lossy().into_owned(),
            "--threads".into(),
            threads,
        ];
        if self.join[i] {
            args.push("--join".into());
        }
        let tls_only = self.extra.iter().any(|a| a == "--tls-clients-only");
        if !self.insecure() {
            args.push("--certs-dir".into());
            args.push(self.certs_dir(i).to_string_lossy().into_owned());
            if !tls_only {
                args.push("--client-plaintext".into());
            }
        }
        if !self.extra.iter().any(|a| a == "--metrics-bind") {
            // `serves` asks /readyz: every node answers Locking-Center
            // requests (followers forward them), only the leader is ready.
            args.push("--metrics-bind".into());
            args.push("127.0.0.1:0".into());
        }
        args.extend(
            self.extra
                .iter()
                .filter(|a| *a != "--tls-clients-only")
                .cloned(),
        );
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let s = Server::spawn(cmd, &refs)?;
        self.lock_addrs[i] = s.lock_addr;
        self.nodes[i] = Some(s);
        Ok(())
    }

    /// Shard `g`'s log file of node `i`.
    pub fn log_path(&self, i: usize, g: usize) -> std::path::PathBuf {
        let p = self.data_path(i);
        if self.threads == 1 {
            p
        } else {
            let mut s = p.into_os_string();
            s.push(format!(".group{g}"));
            s.into()
        }
    }

    pub fn kill9(&mut self, i: usize) {
        if let Some(mut s) = self.nodes[i].take() {
            s.kill9();
        }
    }

    pub fn signal(&self, i: usize, sig: libc::c_int) {
        let pid = self.nodes[i].as_ref().expect("running").pid() as libc::pid_t;
        // SAFETY: kill(2) on our own child's pid; no memory involved.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
    }

    /// Cuts node `i` off from every other node, both ways.
    pub fn isolate(&self, i: usize) {
        for ((from, to), ps) in &self.proxies {
            if *from == i || *to == i {
                for p in ps {
                    p.partition();
                }
            }
        }
    }

    /// Blackholes what node `from` sends to node `to` (every shard's
    /// link); the other direction still passes.
    pub fn cut_one_way(&self, from: usize, to: usize) {
        for p in &self.proxies[&(from, to)] {
            p.set_mode(
                super::fault_proxy::Dir::Forward,
                super::fault_proxy::Mode::Blackhole,
            );
        }
    }

    pub fn heal(&self) {
        for p in self.proxies.values().flatten() {
            p.heal();
        }
    }

    /// Whether node `i` serves now (is the leader that answers requests
    /// itself): its `/readyz` says so. (A follower answers Locking-Center
    /// requests too, forwarding them, so an answer on the lock port does
    /// not tell.)
    pub fn serves(&self, i: usize) -> bool {
        let Some(s) = &self.nodes[i] else {
            return false;
        };
        match s.metrics_addr {
            Some(m) => ready(m),
            None => panic!(
                "node {} runs without --metrics-bind: `serves` asks /readyz",
                i + 1
            ),
        }
    }

    /// The serving node, waiting up to `bound` for one.
    pub fn leader(&self, bound: Duration) -> usize {
        let t = Instant::now();
        loop {
            for i in 0..self.nodes.len() {
                if self.serves(i) {
                    return i;
                }
            }
            if t.elapsed() > bound {
                let logs: Vec<String> = self
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        format!(
                            "node {}: {}",
                            i + 1,
                            if s.is_some() { "up" } else { "down" }
                        )
                    })
                    .collect();
                panic!("no node served within {bound:?}: {logs:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A persistent connection to node `i`'s lock port.
    pub fn conn(&self, i: usize) -> super::Conn {
        super::Conn::persistent(self.nodes[i].as_ref().expect("running").lock_addr)
    }
}

/// Shards per node for the cluster suites: `RINGLOCK_TEST_THREADS` (as the
/// other suites; scripts/test.sh runs them with 1 and 2), default 1.
pub fn test_threads() -> usize {
    std::env::var("RINGLOCK_TEST_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// `GET /readyz` on a metrics address answers 200 (the serving leader).
pub fn ready(metrics: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&metrics, Duration::from_millis(300)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(1000)));
    if s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut b = [0u8; 12];
    let mut n = 0;
    while n < b.len() {
        match s.read(&mut b[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    b[..n].starts_with(b"HTTP/1.1 200") || b[..n].starts_with(b"HTTP/1.0 200")
}

/// Persist (action 6) on a fresh connection: `+` from any node that
/// answers Locking-Center requests (the leader, or a follower that
/// forwards them).
pub fn probe(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(&[6]).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(1) if b[0] == b'+')
}

/// One request on a fresh persistent connection to `addr`: the answer byte,
/// or `None` when the connection closed or timed out first.
pub fn request(addr: SocketAddr, frame: &[u8], timeout: Duration) -> Option<u8> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(&[6]).ok()?;
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(1) if b[0] == b'+' => {}
        _ => return None,
    }
    s.write_all(frame).ok()?;
    match s.read(&mut b) {
        Ok(1) => Some(b[0]),
        _ => None,
    }
}
