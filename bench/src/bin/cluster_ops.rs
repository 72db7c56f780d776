//! `cluster-ops`: what clients of a 3-node cluster (ringlock or etcd) see
//! while the cluster is operated on, e.g. restarted node by node
//! (`scripts/cluster-ops-bench.sh` does the operating).
//!
//! ```text
//! cluster-ops run   --system ringlock|etcd --nodes A,B,C|--nodes-file F --dir CTL --out FILE.json
//!                   [--workers 8] [--scenario NAME] [--max-s 600] [--io-timeout-ms 3000]
//!                   [--pause-us 1000] [--key-prefix P]
//! cluster-ops ready --system ringlock|etcd --nodes A,B,C [--wait-ms 30000]
//!                   [--progress CTL/cycles --cycles 20] [--min-commit N]
//! cluster-ops table FILE.json...
//! ```
//!
//! - `run` starts W workers, each doing lock+unlock cycles on its own key,
//!   until the file `CTL/stop` appears (or `--max-s` passes: then it exits
//!   1). Every 20 ms it writes the total of completed cycles to
//!   `CTL/cycles`. At the stop it reads `CTL/marks` (the script's account
//!   of its restarts and replacements, see `ringlock_bench::ops`), and
//!   writes one JSON object to FILE: per worker and per operation the
//!   longest gap between two completed cycles, the retries and walks
//!   (definitions in `ops`). With `--nodes-file` the address list is that
//!   file's (addresses separated by commas or white space), read again
//!   every 20 ms: when it changes (a node replaced by a new one), a worker
//!   takes the new list the next time it moves on from an address, going
//!   on from the address it was at when that is still listed.
//!   - ringlock (`--nodes`: the lock ports): Locking-Center frames on a
//!     persistent connection (Persist), as `tests/cluster_ops.rs` does. A
//!     node that does not serve answers the Persist `-`: the worker walks on
//!     to the next address. A failed Lock or Unlock leaves its outcome
//!     unknown, so the cycle starts again with a ResetBySource of the
//!     worker's own source (it releases only the worker's own key).
//!   - etcd (`--nodes`: the client URLs' host:port): its v3 lock API through
//!     the gRPC-JSON gateway on a keep-alive HTTP/1.1 connection, as
//!     `ringlock-loadgen` drives it; one lease per worker (TTL longer than
//!     the run, so no keep-alive is needed). Worker w starts at member
//!     w mod 3 (etcd members all serve). A failed Lock is sent again with
//!     the same lease (etcd's Lock is idempotent per lease and name), a
//!     failed Unlock likewise.
//!
//!   On any failure a worker drops its connection and moves to the next
//!   address in the list.
//! - `ready` waits until the cluster serves with every node up and caught
//!   up, and prints the serving node's index (1-based; for etcd the leader
//!   member): ringlock: every node answers `CLST` on its admin port
//!   (`--nodes`: the admin ports), one node serves every shard, all name
//!   it leader, and every follower matched the leader's commit index as it
//!   was when the wait began; etcd: every member answers its status, all
//!   name the same leader, and every member's raft index reached the
//!   leader's as it was when the wait began. With `--progress` it also
//!   waits until that file's count grew by `--cycles` (the workload runs);
//!   with `--min-commit N`, until the leader's commit index (etcd: its raft
//!   index) reached N in every shard (so that a log compacted every N
//!   entries or fewer has been compacted).
//! - `table` prints the markdown rows of the runs' JSON files.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ringlock_bench::json;
use ringlock_bench::ops::{self, Trouble, WorkerLog};
use ringlock_bench::ops_table;
use ringlock_loadgen::proto::etcd::{base64, json_string_field, take_response};

const CONNECT_TIMEOUT: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, PartialEq, Debug)]
enum System {
    Ringlock,
    Etcd,
}

struct Args {
    system: Option<System>,
    nodes: Vec<SocketAddr>,
    nodes_file: Option<PathBuf>,
    workers: usize,
    dir: Option<PathBuf>,
    out: Option<PathBuf>,
    scenario: String,
    max: Duration,
    io_timeout: Duration,
    pause: Duration,
    key_prefix: String,
    wait: Duration,
    progress: Option<PathBuf>,
    cycles: u64,
    min_commit: u64,
    files: Vec<String>,
}

fn addr(s: &str) -> Result<SocketAddr, String> {
    s.to_socket_addrs()
        .map_err(|e| format!("bad address {s:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("bad address {s:?}"))
}

/// Addresses separated by commas or white space.
fn addr_list(s: &str) -> Result<Vec<SocketAddr>, String> {
    s.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|a| !a.is_empty())
        .map(addr)
        .collect()
}

fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        system: None,
        nodes: Vec::new(),
        nodes_file: None,
        workers: 8,
        dir: None,
        out: None,
        scenario: "rolling-restart".into(),
        max: Duration::from_secs(600),
        io_timeout: Duration::from_millis(3000),
        pause: Duration::from_micros(1000),
        key_prefix: format!("co{}", std::process::id()),
        wait: Duration::from_secs(30),
        progress: None,
        cycles: 20,
        min_commit: 0,
        files: Vec::new(),
    };
    let val = |it: &mut dyn Iterator<Item = String>, f: &str| {
        it.next().ok_or_else(|| format!("{f} needs a value"))
    };
    while let Some(f) = it.next() {
        match f.as_str() {
            "--system" => {
                a.system = Some(match val(&mut it, "--system")?.as_str() {
                    "ringlock" => System::Ringlock,
                    "etcd" => System::Etcd,
                    o => return Err(format!("--system takes ringlock or etcd, got {o:?}")),
                })
            }
            "--nodes" => a.nodes = addr_list(&val(&mut it, "--nodes")?)?,
            "--nodes-file" => a.nodes_file = Some(val(&mut it, "--nodes-file")?.into()),
            "--workers" => a.workers = num("--workers", it.next())?,
            "--dir" => a.dir = Some(val(&mut it, "--dir")?.into()),
            "--out" => a.out = Some(val(&mut it, "--out")?.into()),
            "--scenario" => a.scenario = val(&mut it, "--scenario")?,
            "--max-s" => a.max = Duration::from_secs(num("--max-s", it.next())?),
            "--io-timeout-ms" => {
                a.io_timeout = Duration::from_millis(num("--io-timeout-ms", it.next())?)
            }
            "--pause-us" => a.pause = Duration::from_micros(num("--pause-us", it.next())?),
            "--key-prefix" => a.key_prefix = val(&mut it, "--key-prefix")?,
            "--wait-ms" => a.wait = Duration::from_millis(num("--wait-ms", it.next())?),
            "--progress" => a.progress = Some(val(&mut it, "--progress")?.into()),
            "--cycles" => a.cycles = num("--cycles", it.next())?,
            "--min-commit" => a.min_commit = num("--min-commit", it.next())?,
            s if !s.starts_with('-') => a.files.push(s.to_string()),
            s => return Err(format!("unknown argument {s}")),
        }
    }
    if a.workers == 0 || a.workers > 1000 {
        return Err("--workers must be 1..=1000".into());
    }
    if a.key_prefix.is_empty() || a.key_prefix.len() > 64 {
        return Err("--key-prefix must be 1..=64 bytes".into());
    }
    if a.io_timeout.is_zero() {
        return Err("--io-timeout-ms must be positive".into());
    }
    if !a
        .scenario
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err("--scenario is letters, digits and '-'".into());
    }
    Ok(a)
}

fn connect(addr: SocketAddr, io_timeout: Duration) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(io_timeout))?;
    s.set_write_timeout(Some(io_timeout))?;
    Ok(s)
}

/// One worker's counters for the cycle in progress, and what it keeps.
struct Rec {
    t0: Instant,
    log: WorkerLog,
    retries: u32,
    walks: u32,
    timeouts: u32,
    done: Arc<AtomicU64>,
}

impl Rec {
    fn cycle_done(&mut self) {
        let at_us = self.t0.elapsed().as_micros() as u64;
        self.log.done_us.push(at_us);
        if self.retries > 0 || self.walks > 0 {
            self.log.troubles.push(Trouble {
                at_us,
                retries: self.retries,
                walks: self.walks,
                timeouts: self.timeouts,
            });
        }
        self.retries = 0;
        self.walks = 0;
        self.timeouts = 0;
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    fn finish(mut self) -> WorkerLog {
        self.log.pending_retries = u64::from(self.retries);
        self.log.pending_walks = u64::from(self.walks);
        self.log.pending_timeouts = u64::from(self.timeouts);
        self.log
    }

    /// A request failed: a retry (`e` says whether it timed out).
    fn retry(&mut self, e: &Fail) {
        self.retries += 1;
        self.timeouts += u32::from(matches!(e, Fail::Timeout));
    }
}

/// The workers' address list, which the run's main thread replaces when
/// `--nodes-file` changes; `version` counts the replacements.
struct NodeList {
    version: AtomicU64,
    list: Mutex<Arc<Vec<SocketAddr>>>,
}

impl NodeList {
    fn set(&self, list: Vec<SocketAddr>) {
        *self.list.lock().expect("no worker panics holding the list") = Arc::new(list);
        self.version.fetch_add(1, Ordering::Release);
    }
}

struct Worker {
    nodes: Arc<Vec<SocketAddr>>,
    /// The list's version `nodes` is.
    seen: u64,
    shared: Arc<NodeList>,
    next: usize,
    io_timeout: Duration,
    pause: Duration,
    stop: Arc<AtomicBool>,
}

impl Worker {
    /// A failure on the current node: on to the next address (of the
    /// latest list).
    fn move_on(&mut self) {
        self.refresh();
        self.next += 1;
    }

    /// Takes the latest list, if it changed: at the address this worker is
    /// at when that is still listed, else at the same position.
    fn refresh(&mut self) {
        let v = self.shared.version.load(Ordering::Acquire);
        if v == self.seen {
            return;
        }
        let at = self.addr();
        self.next %= self.nodes.len();
        let list = self
            .shared
            .list
            .lock()
            .expect("no worker panics holding the list")
            .clone();
        if let Some(i) = list.iter().position(|&a| a == at) {
            self.next = i;
        }
        self.nodes = list;
        self.seen = v;
    }

    fn addr(&self) -> SocketAddr {
        self.nodes[self.next % self.nodes.len()]
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

fn lc_frame(action: u8, key: &[u8], src: Option<&[u8]>) -> Vec<u8> {
    let mut f = vec![action, key.len() as u8];
    f.extend_from_slice(key);
    if let Some(s) = src {
        f.push(s.len() as u8);
        f.extend_from_slice(s);
    }
    f
}

/// Why a request failed.
#[derive(Debug, PartialEq)]
enum Fail {
    /// No answer within the I/O timeout.
    Timeout,
    /// Closed, reset, or answered otherwise than asked.
    Other,
}

fn fail(e: io::Error) -> Fail {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Fail::Timeout,
        _ => Fail::Other,
    }
}

/// One request, answered `+`.
fn ask(s: &mut TcpStream, req: &[u8]) -> Result<(), Fail> {
    s.write_all(req).map_err(fail)?;
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(1) if b[0] == b'+' => Ok(()),
        Ok(_) => Err(Fail::Other),
        Err(e) => Err(fail(e)),
    }
}

fn ringlock_worker(mut wk: Worker, id: usize, prefix: &str, rec: &mut Rec) {
    let key = format!("{prefix}-k{id}").into_bytes();
    let src = format!("{prefix}-w{id}").into_bytes();
    let lock = lc_frame(1, &key, Some(&src));
    let unlock = lc_frame(2, &key, None);
    let reset = lc_frame(4, &src, None);
    let mut conn: Option<TcpStream> = None;
    // Whether the last Lock or Unlock's outcome is unknown.
    let mut dirty = false;
    while !wk.stopped() {
        let Some(s) = conn.as_mut() else {
            // Find the node that serves: Persist answered `+`.
            let got = connect(wk.addr(), wk.io_timeout)
                .ok()
                .and_then(|mut s| ask(&mut s, &[6]).is_ok().then_some(s));
            if got.is_none() {
                rec.walks += 1;
                wk.move_on();
                thread::sleep(wk.pause);
            }
            conn = got;
            continue;
        };
        if dirty {
            if let Err(e) = ask(s, &reset) {
                rec.retry(&e);
                conn = None;
                wk.move_on();
                continue;
            }
        }
        dirty = false;
        if let Err(e) = ask(s, &lock).and_then(|_| ask(s, &unlock)) {
            rec.retry(&e);
            dirty = true;
            conn = None;
            wk.move_on();
            continue;
        }
        rec.cycle_done();
    }
}

/// A keep-alive HTTP/1.1 connection to one etcd member.
struct Http {
    s: TcpStream,
    host: String,
    buf: Vec<u8>,
}

impl Http {
    fn open(addr: SocketAddr, io_timeout: Duration) -> io::Result<Http> {
        Ok(Http {
            s: connect(addr, io_timeout)?,
            host: addr.to_string(),
            buf: Vec::new(),
        })
    }

    /// POST a JSON body: (status, body).
    fn post(&mut self, path: &str, body: &str) -> Result<(u16, Vec<u8>), Fail> {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        self.s.write_all(req.as_bytes()).map_err(fail)?;
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(r) = take_response(&mut self.buf).map_err(|_| Fail::Other)? {
                return Ok(r);
            }
            match self.s.read(&mut chunk) {
                Ok(0) => return Err(Fail::Other),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(fail(e)),
            }
        }
    }

    /// A 200 answer's body.
    fn ok(&mut self, path: &str, body: &str) -> Result<Vec<u8>, Fail> {
        match self.post(path, body)? {
            (200, b) => Ok(b),
            _ => Err(Fail::Other),
        }
    }
}

fn etcd_worker(mut wk: Worker, id: usize, prefix: &str, lease_ttl_s: u64, rec: &mut Rec) {
    wk.next = id % wk.nodes.len();
    let name = base64(format!("{prefix}-k{id}").as_bytes());
    let mut conn: Option<Http> = None;
    let mut lease: Option<String> = None;
    while !wk.stopped() {
        let Some(h) = conn.as_mut() else {
            match Http::open(wk.addr(), wk.io_timeout) {
                Ok(h) => conn = Some(h),
                Err(_) => {
                    rec.walks += 1;
                    wk.move_on();
                    thread::sleep(wk.pause);
                }
            }
            continue;
        };
        let Some(lease_id) = lease.clone() else {
            // Before the first cycle: not counted as a retry.
            lease = h
                .ok("/v3/lease/grant", &format!("{{\"TTL\":{lease_ttl_s}}}"))
                .ok()
                .and_then(|b| json_string_field(&b, "ID"));
            if lease.is_none() {
                conn = None;
                wk.move_on();
                thread::sleep(wk.pause);
            }
            continue;
        };
        let cycle = h
            .ok(
                "/v3/lock/lock",
                &format!("{{\"name\":\"{name}\",\"lease\":\"{lease_id}\"}}"),
            )
            .and_then(|b| json_string_field(&b, "key").ok_or(Fail::Other))
            .and_then(|k| h.ok("/v3/lock/unlock", &format!("{{\"key\":\"{k}\"}}")));
        if let Err(e) = cycle {
            rec.retry(&e);
            conn = None;
            wk.move_on();
            continue;
        }
        rec.cycle_done();
    }
}

fn write_atomic(path: &Path, text: &str) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn run(a: &Args) -> Result<bool, String> {
    let system = a.system.ok_or("run needs --system")?;
    let dir = a.dir.as_deref().ok_or("run needs --dir")?;
    let out = a.out.as_deref().ok_or("run needs --out")?;
    let read_list = |p: &Path| -> Result<(String, Vec<SocketAddr>), String> {
        let t = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let l = addr_list(&t).map_err(|e| format!("{}: {e}", p.display()))?;
        if l.is_empty() {
            return Err(format!("{}: no address", p.display()));
        }
        Ok((t, l))
    };
    let (mut list_text, first) = match &a.nodes_file {
        Some(p) => read_list(p)?,
        None => (String::new(), a.nodes.clone()),
    };
    if first.is_empty() {
        return Err("run needs --nodes or --nodes-file".into());
    }
    let shared = Arc::new(NodeList {
        version: AtomicU64::new(0),
        list: Mutex::new(Arc::new(first)),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let t0_unix = unix_now();
    let lease_ttl_s = a.max.as_secs() + 60;
    let mut counters = Vec::new();
    let mut handles = Vec::new();
    for id in 0..a.workers {
        let done = Arc::new(AtomicU64::new(0));
        counters.push(done.clone());
        let wk = Worker {
            nodes: shared.list.lock().expect("not shared yet").clone(),
            seen: 0,
            shared: shared.clone(),
            next: 0,
            io_timeout: a.io_timeout,
            pause: a.pause,
            stop: stop.clone(),
        };
        let prefix = a.key_prefix.clone();
        handles.push(thread::spawn(move || {
            let mut rec = Rec {
                t0,
                log: WorkerLog::default(),
                retries: 0,
                walks: 0,
                timeouts: 0,
                done,
            };
            match system {
                System::Ringlock => ringlock_worker(wk, id, &prefix, &mut rec),
                System::Etcd => etcd_worker(wk, id, &prefix, lease_ttl_s, &mut rec),
            }
            rec.finish()
        }));
    }
    let (cycles_file, stop_file) = (dir.join("cycles"), dir.join("stop"));
    // The total, then each worker's count.
    let progress = || {
        let c: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let each: Vec<String> = c.iter().map(u64::to_string).collect();
        format!("{} {}\n", c.iter().sum::<u64>(), each.join(" "))
    };
    let mut timed_out = false;
    while !stop_file.exists() {
        if t0.elapsed() >= a.max {
            timed_out = true;
            break;
        }
        write_atomic(&cycles_file, &progress())
            .map_err(|e| format!("{}: {e}", cycles_file.display()))?;
        if let Some(p) = &a.nodes_file {
            // The script replaces the file whole (rename), so a read sees
            // one version or the other.
            let t = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            if t != list_text {
                let (t, l) = read_list(p)?;
                eprintln!(
                    "cluster-ops: {:.3} s: addresses now {}",
                    t0.elapsed().as_secs_f64(),
                    t.trim()
                );
                shared.set(l);
                list_text = t;
            }
        }
        thread::sleep(Duration::from_millis(20));
    }
    let stop_us = t0.elapsed().as_micros() as u64;
    stop.store(true, Ordering::Relaxed);
    let logs: Vec<WorkerLog> = handles
        .into_iter()
        .map(|h| h.join().expect("worker"))
        .collect();
    let duration_s = stop_us as f64 / 1e6;
    let marks = match std::fs::read_to_string(dir.join("marks")) {
        Ok(t) => ops::parse_marks(&t)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("marks: {e}")),
    };
    let rs = ops::restarts(&marks)?;
    let analysis = ops::analyse(t0_unix, stop_us, &logs, &rs);
    let head = format!(
        "\"system\":\"{}\",\"scenario\":\"{}\",\"workers\":{},\"io_timeout_ms\":{},\"pause_us\":{},\"timed_out\":{timed_out}",
        match system {
            System::Ringlock => "ringlock-cluster",
            System::Etcd => "etcd-cluster",
        },
        a.scenario,
        a.workers,
        a.io_timeout.as_millis(),
        a.pause.as_micros(),
    );
    let text = ops::to_json(&analysis, &rs, &head, duration_s);
    std::fs::write(out, format!("{text}\n")).map_err(|e| format!("{}: {e}", out.display()))?;
    let idle = analysis.workers.iter().filter(|w| w.cycles == 0).count();
    if idle > 0 {
        eprintln!("cluster-ops: {idle} worker(s) completed no cycle");
    }
    if timed_out {
        eprintln!("cluster-ops: no stop within --max-s {}", a.max.as_secs());
    }
    Ok(idle == 0 && !timed_out)
}

/// `CTL/cycles`: the total, then each worker's count.
fn read_counts(p: &Path) -> Option<Vec<u64>> {
    let t = std::fs::read_to_string(p).ok()?;
    t.split_whitespace().map(|w| w.parse().ok()).collect()
}

/// Why the workload has not yet progressed enough since `base`: the total
/// grew by `cycles` and every worker completed a cycle.
/// An empty `base` (no file yet when the wait began) counts from zero.
fn progressed(base: &[u64], now: &[u64], cycles: u64) -> Result<(), String> {
    let zeros = vec![0; now.len()];
    let base = if base.is_empty() { &zeros[..] } else { base };
    let (Some(b), Some(n)) = (base.first(), now.first()) else {
        return Err("no progress file yet".into());
    };
    if *n < b + cycles {
        return Err(format!(
            "the workload did {} of {cycles} cycles",
            n.saturating_sub(*b)
        ));
    }
    match now.iter().zip(base).skip(1).position(|(n, b)| n <= b) {
        Some(w) => Err(format!("worker {w} completed no cycle yet")),
        None if now.len() != base.len() => Err("the progress file changed shape".into()),
        None => Ok(()),
    }
}

/// One look at a ringlock cluster: Ok(leader index) when it is ready;
/// `target` keeps the leader's commit indexes from the first full look.
fn ringlock_ready(
    nodes: &[SocketAddr],
    min_commit: u64,
    target: &mut Vec<(u32, u64)>,
) -> Result<usize, String> {
    use ringlock::protocol::status::Role;
    let mut all = Vec::new();
    for &n in nodes {
        let c = ringlock::client::Client::builder(n)
            .admin_addr(n)
            .retry(ringlock::client::RetryPolicy::none())
            .connect_timeout(CONNECT_TIMEOUT)
            .io_timeout(Duration::from_secs(1))
            .build()
            .map_err(|e| e.to_string())?;
        match c.cluster_status() {
            Ok(Some(recs)) if !recs.is_empty() => all.push(recs),
            Ok(_) => return Err(format!("{n} is not a cluster member")),
            Err(e) => return Err(format!("{n} does not answer: {e}")),
        }
    }
    let serving: Vec<usize> = (0..all.len())
        .filter(|&i| all[i].iter().all(|s| s.serving))
        .collect();
    let &[l] = serving.as_slice() else {
        return Err(format!("{} nodes serve every shard", serving.len()));
    };
    let id = all[l][0].node;
    if let Some(r) = all.iter().flatten().find(|r| r.leader != id) {
        return Err(format!(
            "node {} names {} leader of shard {}",
            r.node, r.leader, r.shard
        ));
    }
    if target.is_empty() {
        *target = all[l].iter().map(|s| (s.shard, s.commit)).collect();
    }
    if let Some(s) = all[l].iter().find(|s| s.commit < min_commit) {
        return Err(format!(
            "shard {}: commit index {} of {min_commit}",
            s.shard, s.commit
        ));
    }
    for s in &all[l] {
        let want = target.iter().find(|t| t.0 == s.shard).map_or(0, |t| t.1);
        if s.role != Role::Leader || s.followers.len() + 1 != nodes.len() {
            return Err(format!(
                "shard {}: the leader lists {} followers",
                s.shard,
                s.followers.len()
            ));
        }
        if let Some(f) = s.followers.iter().find(|f| !f.active || f.matched < want) {
            return Err(format!(
                "shard {}: node {} matched {} of {want}",
                s.shard, f.node, f.matched
            ));
        }
    }
    Ok(l + 1)
}

/// etcd's status of one member: (member id, leader id, raft index).
fn etcd_status(n: SocketAddr) -> Result<(String, String, u64), String> {
    let mut h = Http::open(n, Duration::from_secs(1)).map_err(|e| format!("{n}: {e}"))?;
    let b = h
        .ok("/v3/maintenance/status", "{}")
        .map_err(|e| format!("{n}: no status ({e:?})"))?;
    let f = |k: &str| json_string_field(&b, k).ok_or_else(|| format!("{n}: no {k} in status"));
    Ok((
        f("member_id")?,
        f("leader")?,
        f("raftIndex")?.parse().unwrap_or(0),
    ))
}

fn etcd_ready(
    nodes: &[SocketAddr],
    min_index: u64,
    target: &mut Vec<(u32, u64)>,
) -> Result<usize, String> {
    let st: Vec<_> = nodes
        .iter()
        .map(|&n| etcd_status(n))
        .collect::<Result<_, _>>()?;
    let leader = &st[0].1;
    if leader == "0" || st.iter().any(|s| &s.1 != leader) {
        return Err("the members do not agree on a leader".into());
    }
    let l = st
        .iter()
        .position(|s| &s.0 == leader)
        .ok_or("the leader is not one of --nodes")?;
    if target.is_empty() {
        target.push((0, st[l].2));
    }
    if st[l].2 < min_index {
        return Err(format!("raft index {} of {min_index}", st[l].2));
    }
    match st.iter().position(|s| s.2 < target[0].1) {
        Some(i) => Err(format!(
            "member {} at raft index {} of {}",
            i + 1,
            st[i].2,
            target[0].1
        )),
        None => Ok(l + 1),
    }
}

fn ready(a: &Args) -> Result<(), String> {
    let system = a.system.ok_or("ready needs --system")?;
    if a.nodes.is_empty() {
        return Err("ready needs --nodes".into());
    }
    let t = Instant::now();
    let base = a
        .progress
        .as_deref()
        .map(|p| read_counts(p).unwrap_or_default());
    let mut target = Vec::new();
    loop {
        let r = match system {
            System::Ringlock => ringlock_ready(&a.nodes, a.min_commit, &mut target),
            System::Etcd => etcd_ready(&a.nodes, a.min_commit, &mut target),
        };
        let why = match (r, a.progress.as_deref().zip(base.as_deref())) {
            (Ok(l), None) => return println_ok(l),
            (Ok(l), Some((p, b))) => {
                match progressed(b, &read_counts(p).unwrap_or_default(), a.cycles) {
                    Ok(()) => return println_ok(l),
                    Err(e) => e,
                }
            }
            (Err(e), _) => e,
        };
        if t.elapsed() >= a.wait {
            return Err(format!("not ready within {} ms: {why}", a.wait.as_millis()));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn println_ok(l: usize) -> Result<(), String> {
    println!("{l}");
    Ok(())
}

fn table(a: &Args) -> Result<(), String> {
    if a.files.is_empty() {
        return Err("table needs the runs' JSON files".into());
    }
    let mut runs = Vec::new();
    for p in &a.files {
        let t = std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"))?;
        runs.push(json::parse(t.trim()).map_err(|e| format!("{p}: {e}"))?);
    }
    print!("{}", ops_table::table(&runs));
    Ok(())
}

fn main() -> ExitCode {
    let mut it = std::env::args().skip(1);
    let cmd = it.next().unwrap_or_default();
    let args = match parse(it) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cluster-ops: {e}");
            return ExitCode::from(64);
        }
    };
    let r = match cmd.as_str() {
        "run" => run(&args),
        "ready" => ready(&args).map(|_| true),
        "table" => table(&args).map(|_| true),
        "-h" | "--help" => {
            println!("usage: cluster-ops run|ready|table ... (see the source's header)");
            Ok(true)
        }
        _ => Err(format!("unknown command {cmd:?} (run, ready, table)")),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("cluster-ops: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments() {
        let p = |v: &[&str]| parse(v.iter().map(|s| s.to_string()));
        assert!(p(&["--system", "redis"]).is_err());
        assert!(p(&["--workers", "0"]).is_err());
        assert!(p(&["--nodes", "nohost"]).is_err());
        assert!(p(&["--bogus"]).is_err());
        assert!(p(&["--scenario", "a b"]).is_err());
        assert!(p(&["--io-timeout-ms", "0"]).is_err());
        let a = p(&[
            "--system",
            "etcd",
            "--nodes",
            "127.0.0.1:1,127.0.0.1:2",
            "x.json",
        ])
        .unwrap();
        assert_eq!(
            (a.system, a.nodes.len(), a.workers),
            (Some(System::Etcd), 2, 8)
        );
        assert_eq!(a.files, ["x.json"]);
    }

    #[test]
    fn progress_needs_the_total_and_every_worker() {
        assert!(progressed(&[10, 5, 5], &[30, 20, 10], 20).is_ok());
        assert!(progressed(&[10, 5, 5], &[29, 19, 10], 20).is_err());
        let e = progressed(&[10, 5, 5], &[40, 35, 5], 20).unwrap_err();
        assert!(e.contains("worker 1"), "{e}");
        assert!(progressed(&[], &[40, 35, 5], 20).is_ok());
        assert!(progressed(&[], &[40, 40, 0], 20).is_err());
        assert!(progressed(&[], &[], 20).is_err());
        assert!(progressed(&[0, 0], &[40, 35, 5], 20).is_err());
    }

    #[test]
    fn a_worker_takes_a_changed_list_where_it_is() {
        let l = |v: &[u16]| -> Vec<SocketAddr> {
            v.iter()
                .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
                .collect()
        };
        assert_eq!(
            addr_list("127.0.0.1:1, 127.0.0.1:2\n127.0.0.1:3\n").unwrap(),
            l(&[1, 2, 3])
        );
        assert!(addr_list("127.0.0.1:1,nohost").is_err());
        let shared = Arc::new(NodeList {
            version: AtomicU64::new(0),
            list: Mutex::new(Arc::new(l(&[1, 2, 3]))),
        });
        let mut wk = Worker {
            nodes: Arc::new(l(&[1, 2, 3])),
            seen: 0,
            shared: shared.clone(),
            next: 1,
            io_timeout: Duration::from_secs(1),
            pause: Duration::ZERO,
            stop: Arc::new(AtomicBool::new(false)),
        };
        // At 2 when 4 is added: on from 2 in the new list.
        shared.set(l(&[4, 1, 2, 3]));
        wk.move_on();
        assert_eq!(wk.addr(), l(&[3])[0]);
        // At 3 (position 3) when 3 goes: position 3 of [1, 2, 5] is 1,
        // and on from there.
        shared.set(l(&[1, 2, 5]));
        wk.move_on();
        assert_eq!((wk.addr(), wk.seen), (l(&[2])[0], 2));
        wk.move_on();
        assert_eq!(wk.addr(), l(&[5])[0]);
    }

    #[test]
    fn frames() {
        assert_eq!(lc_frame(1, b"k", Some(b"s")), [1, 1, b'k', 1, b's']);
        assert_eq!(lc_frame(4, b"src", None), [4, 3, b's', b'r', b'c']);
    }
}
