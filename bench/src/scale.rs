//! `scale-bench`: what a held key costs ringlockd, and how long a restart
//! takes to bring a large log back.
//!
//! For every size N (default 10 000, 100 000 and 1 000 000 keys; 13-byte
//! keys `key-000000001`, source `src`) it starts a fresh `ringlockd`, opens
//! its client connections (Persist), reads the server's RSS, holds N
//! distinct keys with pipelined TryLocks, and reads the RSS again:
//!
//! - in memory and durable (`--data-path`), each once with `--max-keys N`
//!   and once with `--max-keys N × --limit-factor` (default 10), so that
//!   "what is held, not the configured limit, decides memory" is visible;
//! - durable runs are then `kill -9`ed and restarted on the same log: the
//!   replay time the server reports (`event=recovery duration_us=`), the
//!   time from the restart's spawn to its listening line, to the first
//!   answer (a TryLock of a held key answers `#`), and to a complete admin
//!   `KEYS` answer listing all N keys; and the RSS after the restart;
//! - Redis as the peer: `INFO memory` (`used_memory`, `used_memory_rss`)
//!   before and after `SET key src` of the same N names.
//!
//! With `--compaction-load SECS` it measures instead what a background
//! compaction of a large table costs other clients: for every size N a
//! durable server holds N keys, then `ringlock-loadgen` runs 64 persistent
//! clients cycling lock+unlock on their own keys (closed loop) for SECS
//! seconds, while the log grows past twice the live records and the
//! server compacts it (a snapshot of N holders). The same run is made with
//! compaction off (`--compact-floor-bytes` 1 TiB), alternating, for
//! `--rounds` rounds; every `--ringlockd LABEL=PATH` given is run in each
//! round, so two builds are compared in one session. Reported: the
//! compactions that finished during the load (and the server's own
//! `duration_us` for each), cycles/s, lock p50/p99/p99.9/p99.99/max.
//!
//! RSS is `VmRSS` from `/proc/PID/status` (every thread of the server).
//! The client connections are opened before the first reading, so their
//! buffers are not counted as key memory. Prints one markdown table (also
//! to `--out FILE`), headed by the commit, kernel and CPU. The sizes are
//! figures of one run: rerun to see the spread. See docs/bench.md.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const SOURCE: &[u8] = b"src";
/// TryLock frames in flight per connection: 16 × 19 bytes stays far below
/// the 512 undecoded bytes a lock-port connection may hold.
const DEPTH: usize = 16;

#[derive(Clone)]
struct Opts {
    ringlockd: PathBuf,
    /// `--ringlockd LABEL=PATH`, in the order given (compaction mode).
    binaries: Vec<(String, PathBuf)>,
    compaction_load: Option<u64>,
    rounds: usize,
    loadgen: PathBuf,
    loadgen_cpus: Option<String>,
    redis: Option<PathBuf>,
    sizes: Vec<usize>,
    limit_factor: usize,
    conns: usize,
    threads: usize,
    server_cpus: Option<String>,
    modes: Vec<String>,
    dir: PathBuf,
    out: Option<PathBuf>,
}

const HELP: &str = "\
scale-bench — RSS per held key and recovery time of ringlockd, Redis memory beside it

USAGE:
    scale-bench [OPTIONS]

OPTIONS:
    --ringlockd PATH     the server binary (default: target/release/ringlockd, or
                         $CARGO_TARGET_DIR/release/ringlockd); with --compaction-load it
                         may be LABEL=PATH and given more than once
    --compaction-load S  measure compaction under load instead: N keys held, 64 clients
                         cycling for S seconds, compaction on and off (see above)
    --rounds R           rounds of the compaction measurement (default 2)
    --loadgen PATH       ringlock-loadgen (default: beside the default ringlockd)
    --loadgen-cpus LIST  run the load generator under taskset -c LIST
    --redis-server PATH  Redis for the peer row (default: redis-server on PATH; 'none' skips it)
    --sizes LIST         held keys per run, comma-separated (default 10000,100000,1000000)
    --limit-factor F     the second --max-keys of every mode is N × F (default 10; 1 = only N)
    --modes LIST         of memory,durable,redis (default: all three)
    --conns N            client connections (default 256)
    --server-threads N   ringlockd --threads (default 1)
    --server-cpus LIST   run ringlockd under taskset -c LIST
    --dir DIR            where durable runs put their logs (default: the system temp dir)
    --out FILE           also write the table to FILE
";

fn parse() -> Result<Opts, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    let mut o = Opts {
        ringlockd: target.join("release/ringlockd"),
        binaries: Vec::new(),
        compaction_load: None,
        rounds: 2,
        loadgen: target.join("release/ringlock-loadgen"),
        loadgen_cpus: None,
        redis: Some(PathBuf::from("redis-server")),
        sizes: vec![10_000, 100_000, 1_000_000],
        limit_factor: 10,
        conns: 256,
        threads: 1,
        server_cpus: None,
        modes: vec!["memory".into(), "durable".into(), "redis".into()],
        dir: std::env::temp_dir(),
        out: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        let num = |v: String, what: &str| -> Result<usize, String> {
            v.parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{what}: expected a positive number, got {v:?}"))
        };
        match a.as_str() {
            "--ringlockd" => {
                let v = val()?;
                let (label, path) = match v.split_once('=') {
                    Some((l, p)) => (l.to_string(), PathBuf::from(p)),
                    None => (v.clone(), PathBuf::from(&v)),
                };
                o.ringlockd = path.clone();
                o.binaries.push((label, path));
            }
            "--compaction-load" => {
                o.compaction_load = Some(num(val()?, "--compaction-load")? as u64)
            }
            "--rounds" => o.rounds = num(val()?, "--rounds")?,
            "--loadgen" => o.loadgen = val()?.into(),
            "--loadgen-cpus" => o.loadgen_cpus = Some(val()?),
            "--redis-server" => {
                let v = val()?;
                o.redis = (v != "none").then(|| v.into());
            }
            "--sizes" => {
                o.sizes = val()?
                    .split(',')
                    .map(|s| num(s.trim().to_string(), "--sizes"))
                    .collect::<Result<_, _>>()?
            }
            "--limit-factor" => o.limit_factor = num(val()?, "--limit-factor")?,
            "--modes" => {
                o.modes = val()?.split(',').map(|s| s.trim().to_string()).collect();
                if let Some(m) = o
                    .modes
                    .iter()
                    .find(|m| !["memory", "durable", "redis"].contains(&m.as_str()))
                {
                    return Err(format!("--modes: unknown mode {m:?}"));
                }
            }
            "--conns" => o.conns = num(val()?, "--conns")?,
            "--server-threads" => o.threads = num(val()?, "--server-threads")?,
            "--server-cpus" => o.server_cpus = Some(val()?),
            "--dir" => o.dir = val()?.into(),
            "--out" => o.out = Some(val()?.into()),
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {a:?} (see --help)")),
        }
    }
    if o.binaries.is_empty() {
        o.binaries.push(("ringlockd".into(), o.ringlockd.clone()));
    }
    Ok(o)
}

fn key(i: usize) -> [u8; 13] {
    let mut k = *b"key-000000000";
    let mut n = i;
    for b in k[4..].iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
    k
}

fn try_lock_frame(i: usize, out: &mut Vec<u8>) {
    out.push(5);
    out.push(13);
    out.extend_from_slice(&key(i));
    out.push(SOURCE.len() as u8);
    out.extend_from_slice(SOURCE);
}

/// `VmRSS` of `pid` in bytes.
fn rss_bytes(pid: u32) -> Result<u64, String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("/proc/{pid}/status: {e}"))?;
    let line = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or("no VmRSS line")?;
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or("bad VmRSS line")?;
    Ok(kb * 1024)
}

struct Ringlockd {
    child: Child,
    lock: SocketAddr,
    admin: SocketAddr,
    /// Stderr lines before the listening line (the recovery report).
    startup: Vec<String>,
    /// Spawn → listening line.
    listening_after: Duration,
    spawned_at: Instant,
    /// Its `event=compaction…` lines after the listening line.
    events: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Ringlockd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    line[start..].split_whitespace().next()
}

/// Log floor that never compacts (the memory and recovery runs: the fill
/// would rewrite the log).
const NO_COMPACTION: u64 = 1 << 40;

fn start_ringlockd(o: &Opts, max_keys: usize, data: Option<&Path>) -> Result<Ringlockd, String> {
    start_ringlockd_with(o, max_keys, data, NO_COMPACTION)
}

fn start_ringlockd_with(
    o: &Opts,
    max_keys: usize,
    data: Option<&Path>,
    compact_floor: u64,
) -> Result<Ringlockd, String> {
    let mut cmd = match &o.server_cpus {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cpus]).arg(&o.ringlockd);
            c
        }
        None => Command::new(&o.ringlockd),
    };
    cmd.args(["--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"])
        .args(["--threads", &o.threads.to_string()])
        .args(["--max-keys", &max_keys.to_string()])
        .args(["--max-connections", &(o.conns + 64).to_string()])
        // No client of this benchmark sits idle long, but a 1 M-key fill
        // must not be cut short by the default idle timeout either.
        .args(["--idle-timeout-ms", "0"])
        .env_remove("DATA_PATH")
        .env_remove("BIND_ADDRESS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(p) = data {
        cmd.arg("--data-path")
            .arg(p)
            .args(["--compact-floor-bytes", &compact_floor.to_string()]);
    }
    let spawned_at = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", o.ringlockd.display()))?;
    let stderr = child.stderr.take().ok_or("no stderr pipe")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut startup = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(line) if line.contains("event=listening") => {
                let listening_after = spawned_at.elapsed();
                let lock = field(&line, "lock").and_then(|v| v.parse().ok());
                let admin = field(&line, "admin").and_then(|v| v.parse().ok());
                let (Some(lock), Some(admin)) = (lock, admin) else {
                    return Err(format!("no addresses in {line:?}"));
                };
                // Keep draining stderr so the server never blocks on it,
                // and keep its compaction lines.
                let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
                let kept = events.clone();
                std::thread::spawn(move || {
                    for line in rx {
                        if line.contains("event=compaction") {
                            kept.lock().expect("events lock").push(line);
                        }
                    }
                });
                return Ok(Ringlockd {
                    events,
                    child,
                    lock,
                    admin,
                    startup,
                    listening_after,
                    spawned_at,
                });
            }
            Ok(line) => startup.push(line),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("ringlockd did not start:\n{}", startup.join("\n")));
            }
        }
    }
}

fn persistent(addr: SocketAddr) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.write_all(&[6]).map_err(|e| e.to_string())?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b).map_err(|e| e.to_string())?;
    if b[0] != b'+' {
        return Err(format!("Persist answered {:?}", b[0] as char));
    }
    Ok(s)
}

/// Holds keys `0..n` over `conns` (pipelined TryLocks, `DEPTH` in flight
/// per connection); every answer must be `+`.
fn hold(conns: &mut [TcpStream], n: usize) -> Result<(), String> {
    let workers = conns.len().min(16);
    let per = conns.len().div_ceil(workers);
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        for chunk in conns.chunks_mut(per) {
            let next = &next;
            hs.push(s.spawn(move || -> Result<(), String> {
                let mut buf = Vec::with_capacity(DEPTH * 20);
                let mut sent = vec![0usize; chunk.len()];
                let mut ans = [0u8; DEPTH];
                loop {
                    let mut any = false;
                    for (c, sent) in chunk.iter_mut().zip(sent.iter_mut()) {
                        buf.clear();
                        *sent = 0;
                        while *sent < DEPTH {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if i >= n {
                                break;
                            }
                            try_lock_frame(i, &mut buf);
                            *sent += 1;
                        }
                        if *sent > 0 {
                            c.write_all(&buf).map_err(|e| format!("send: {e}"))?;
                            any = true;
                        }
                    }
                    for (c, &sent) in chunk.iter_mut().zip(sent.iter()) {
                        c.read_exact(&mut ans[..sent])
                            .map_err(|e| format!("answer: {e}"))?;
                        if let Some(b) = ans[..sent].iter().find(|&&b| b != b'+') {
                            return Err(format!("a TryLock answered {:?}", *b as char));
                        }
                    }
                    if !any {
                        return Ok(());
                    }
                }
            }));
        }
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a client thread panicked".into()))
            })
            .collect::<Result<Vec<()>, String>>()
            .map(|_| ())
    })
}

/// Sends `KEYS` and reads the whole answer; returns the number of keys.
fn keys_count(admin: SocketAddr) -> Result<usize, String> {
    let mut s = TcpStream::connect(admin).map_err(|e| format!("connect {admin}: {e}"))?;
    s.write_all(b"KEYS").map_err(|e| e.to_string())?;
    let mut r = BufReader::with_capacity(1 << 20, s);
    let mut count = [0u8; 4];
    r.read_exact(&mut count).map_err(|e| format!("KEYS: {e}"))?;
    let count = u32::from_le_bytes(count) as usize;
    let mut scratch = [0u8; 255];
    for _ in 0..count {
        // key, source, endpoint (each u8-sized), then i64 acquired.
        for _ in 0..3 {
            let mut len = [0u8; 1];
            r.read_exact(&mut len).map_err(|e| format!("KEYS: {e}"))?;
            r.read_exact(&mut scratch[..len[0] as usize])
                .map_err(|e| format!("KEYS: {e}"))?;
        }
        r.read_exact(&mut scratch[..8])
            .map_err(|e| format!("KEYS: {e}"))?;
    }
    Ok(count)
}

#[derive(Default)]
struct Row {
    system: String,
    mode: String,
    max_keys: String,
    held: usize,
    rss_before: u64,
    rss_after: u64,
    log_bytes: Option<u64>,
    replay_ms: Option<f64>,
    listening_ms: Option<f64>,
    first_answer_ms: Option<f64>,
    keys_ms: Option<f64>,
    rss_restart: Option<u64>,
    note: String,
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1 << 20) as f64)
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("".into(), |v| format!("{v:.0}"))
}

fn run_ringlockd(o: &Opts, n: usize, max_keys: usize, durable: bool) -> Result<Row, String> {
    let dir = o
        .dir
        .join(format!("scale-bench-{}-{n}-{max_keys}", std::process::id()));
    let log = dir.join("locks.wal");
    if durable {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let result = (|| {
        let server = start_ringlockd(o, max_keys, durable.then_some(log.as_path()))?;
        let mut conns = (0..o.conns)
            .map(|_| persistent(server.lock))
            .collect::<Result<Vec<_>, _>>()?;
        let pid = server.child.id();
        let rss_before = rss_bytes(pid)?;
        hold(&mut conns, n)?;
        let rss_after = rss_bytes(pid)?;
        drop(conns);
        let mut row = Row {
            system: "ringlockd".into(),
            mode: if durable { "durable" } else { "memory" }.into(),
            max_keys: max_keys.to_string(),
            held: n,
            rss_before,
            rss_after,
            ..Row::default()
        };
        if !durable {
            return Ok(row);
        }
        row.log_bytes = std::fs::metadata(&log).ok().map(|m| m.len());
        drop(server); // kill -9 (SIGKILL), then reaped
        let restarted = start_ringlockd(o, max_keys, Some(&log))?;
        row.listening_ms = Some(restarted.listening_after.as_secs_f64() * 1e3);
        row.replay_ms = restarted
            .startup
            .iter()
            .find(|l| l.contains("event=recovery "))
            .and_then(|l| field(l, "duration_us"))
            .and_then(|v| v.parse::<f64>().ok())
            .map(|us| us / 1e3);
        let mut c = TcpStream::connect(restarted.lock).map_err(|e| e.to_string())?;
        let mut f = Vec::new();
        try_lock_frame(n / 2, &mut f);
        c.write_all(&f).map_err(|e| e.to_string())?;
        let mut b = [0u8; 1];
        c.read_exact(&mut b).map_err(|e| e.to_string())?;
        if b[0] != b'#' {
            return Err(format!(
                "after the restart a held key answered {:?}, not '#'",
                b[0] as char
            ));
        }
        row.first_answer_ms = Some(restarted.spawned_at.elapsed().as_secs_f64() * 1e3);
        row.rss_restart = Some(rss_bytes(restarted.child.id())?);
        let listed = keys_count(restarted.admin)?;
        row.keys_ms = Some(restarted.spawned_at.elapsed().as_secs_f64() * 1e3);
        if listed != n {
            return Err(format!(
                "KEYS listed {listed} keys after the restart, not {n}"
            ));
        }
        Ok(row)
    })();
    if durable {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// One run of the compaction measurement.
struct LoadRow {
    label: String,
    round: usize,
    held: usize,
    compaction: bool,
    /// `duration_us` of every compaction that finished during the load.
    compactions_ms: Vec<f64>,
    cycles_per_s: f64,
    /// Lock latency p50, p99, p99.9, p99.99, max (µs).
    lat: [f64; 5],
    errors: f64,
    /// The probe's round trips p50, p99, p99.9, max (µs): a TryLock of a
    /// held key every millisecond, answered `#` without touching the log,
    /// so it measures the event loop, not the disk.
    probe: [f64; 4],
    probes: usize,
}

/// Sends a TryLock of held key `i` every millisecond until `stop`,
/// returning each round trip in µs (every answer must be `#`).
fn probe_loop(
    addr: SocketAddr,
    i: usize,
    cpus: Option<String>,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<Vec<u32>, String> {
    if let Some(c) = cpus.and_then(|c| c.split(',').next().and_then(|v| v.parse::<usize>().ok())) {
        // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes
        // inside it (it ignores a CPU number past the set's size), and
        // sched_setaffinity reads exactly `size_of` bytes of it. Passing a
        // larger size would let the kernel read past the set. No test runs
        // the probe (benchmark only); a set the kernel refuses is an error
        // return, ignored: the probe then runs unpinned.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(c, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    let mut s = persistent(addr)?;
    let mut frame = Vec::new();
    try_lock_frame(i, &mut frame);
    let mut out = Vec::with_capacity(64 * 1024);
    let mut b = [0u8; 1];
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let t = Instant::now();
        s.write_all(&frame).map_err(|e| format!("probe: {e}"))?;
        s.read_exact(&mut b).map_err(|e| format!("probe: {e}"))?;
        out.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        if b[0] != b'#' {
            return Err(format!("the probe's TryLock answered {:?}", b[0] as char));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(out)
}

fn percentiles(mut v: Vec<u32>) -> [f64; 4] {
    if v.is_empty() {
        return [0.0; 4];
    }
    v.sort_unstable();
    let at = |p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)] as f64;
    [
        at(0.5),
        at(0.99),
        at(0.999),
        *v.last().expect("not empty") as f64,
    ]
}

fn run_compaction_load(
    o: &Opts,
    label: &str,
    round: usize,
    n: usize,
    compaction: bool,
    secs: u64,
) -> Result<LoadRow, String> {
    const CLIENTS: usize = 64;
    let dir = o
        .dir
        .join(format!("scale-bench-compaction-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let log = dir.join("locks.wal");
    let result = (|| {
        // The default floor (1 MiB): with N keys held, the log is compacted
        // once the cycles have appended as much again as the holders take.
        let floor = if compaction { 1 << 20 } else { NO_COMPACTION };
        let server = start_ringlockd_with(o, n + CLIENTS + 64, Some(&log), floor)?;
        let mut conns = (0..o.conns)
            .map(|_| persistent(server.lock))
            .collect::<Result<Vec<_>, _>>()?;
        hold(&mut conns, n)?;
        drop(conns);
        server.events.lock().expect("events lock").clear();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (lock_addr, cpus) = (server.lock, o.loadgen_cpus.clone());
        std::thread::scope(|sc| {
            let probe = sc.spawn(|| probe_loop(lock_addr, n / 2, cpus, &stop));
            let load = (|| {
                let mut cmd = match &o.loadgen_cpus {
                    Some(cpus) => {
                        let mut c = Command::new("taskset");
                        c.args(["-c", cpus]).arg(&o.loadgen);
                        c
                    }
                    None => Command::new(&o.loadgen),
                };
                let out = cmd
                    .arg("--target")
                    .arg(format!("ringlock://{}", server.lock))
                    .args(["--connections", &CLIENTS.to_string()])
                    .args(["--keys", &CLIENTS.to_string()])
                    .args(["--duration", &format!("{secs}s"), "--warmup", "1s"])
                    .args([
                        "--conn-mode",
                        "persistent",
                        "--dist",
                        "private",
                        "--rate",
                        "0",
                    ])
                    .args(["--no-progress", "--json"])
                    .stderr(Stdio::inherit())
                    .output()
                    .map_err(|e| format!("{}: {e}", o.loadgen.display()))?;
                if !out.status.success() {
                    return Err(format!("ringlock-loadgen exited with {}", out.status));
                }
                let text = String::from_utf8_lossy(&out.stdout);
                let line = text
                    .lines()
                    .last()
                    .ok_or("no output from ringlock-loadgen")?;
                let v = ringlock_bench::json::parse(line)?;
                let num = |path: &str| v.num(path).ok_or_else(|| format!("no {path} in {line}"));
                let compactions_ms = server
                    .events
                    .lock()
                    .expect("events lock")
                    .iter()
                    .filter(|l| l.contains("event=compaction_done"))
                    .filter_map(|l| field(l, "duration_us").and_then(|d| d.parse::<f64>().ok()))
                    .map(|us| us / 1e3)
                    .collect();
                Ok(LoadRow {
                    label: label.to_string(),
                    round,
                    held: n,
                    compaction,
                    compactions_ms,
                    cycles_per_s: num("ops_per_sec")?,
                    lat: [
                        num("latency_us.p50")?,
                        num("latency_us.p99")?,
                        num("latency_us.p999")?,
                        num("latency_us.p9999")?,
                        num("latency_us.max")?,
                    ],
                    errors: num("errors")?,
                    probe: [0.0; 4],
                    probes: 0,
                })
            })();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let samples = probe
                .join()
                .unwrap_or_else(|_| Err("the probe thread panicked".into()));
            let mut row = load?;
            let samples = samples?;
            row.probes = samples.len();
            row.probe = percentiles(samples);
            Ok(row)
        })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn load_table(rows: &[LoadRow]) -> String {
    let mut s = String::from(
        "\n| build | round | held keys | compaction | compactions during load (server `duration_us`, ms) | cycles/s | lock p50 µs | p99 µs | p99.9 µs | p99.99 µs | max µs | errors | probe p50 µs | probe p99 µs | probe p99.9 µs | **probe max µs** |\n\
         |---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let c = if r.compactions_ms.is_empty() {
            "0".to_string()
        } else {
            let ms: Vec<String> = r.compactions_ms.iter().map(|m| format!("{m:.0}")).collect();
            format!("{} ({})", r.compactions_ms.len(), ms.join(", "))
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | **{:.0}** |\n",
            r.label,
            r.round,
            r.held,
            if r.compaction {
                "on (1 MiB floor)"
            } else {
                "off"
            },
            c,
            r.cycles_per_s,
            r.lat[0],
            r.lat[1],
            r.lat[2],
            r.lat[3],
            r.lat[4],
            r.errors,
            r.probe[0],
            r.probe[1],
            r.probe[2],
            r.probe[3],
        ));
    }
    s
}

fn main_compaction(o: &Opts, secs: u64) -> bool {
    let mut rows = Vec::new();
    let mut failed = false;
    for &n in &o.sizes {
        for round in 1..=o.rounds {
            // Alternate the order of builds and of on/off between rounds,
            // so drift over the session hits all alike.
            let mut runs: Vec<(&(String, PathBuf), bool)> = Vec::new();
            for b in &o.binaries {
                for on in [true, false] {
                    runs.push((b, on));
                }
            }
            if round % 2 == 0 {
                runs.reverse();
            }
            for ((label, path), on) in runs {
                // The same options with this build as the server.
                let ob = Opts {
                    ringlockd: path.clone(),
                    ..o.clone()
                };
                eprintln!("scale-bench: {label} round {round} held={n} compaction={on}");
                match run_compaction_load(&ob, label, round, n, on, secs) {
                    Ok(r) => {
                        eprintln!(
                            "scale-bench:   compactions={:?} cycles/s={:.0} p99={:.0} max={:.0}",
                            r.compactions_ms, r.cycles_per_s, r.lat[1], r.lat[4]
                        );
                        rows.push(r);
                    }
                    Err(e) => {
                        eprintln!("scale-bench: {label} held={n} compaction={on}: {e}");
                        failed = true;
                    }
                }
            }
        }
    }
    let report = format!(
        "{}- load: ringlock-loadgen, 64 persistent connections, closed loop, lock+unlock of private keys, {secs} s after 1 s warm-up (load generator CPUs {})\n{}",
        header(o),
        o.loadgen_cpus.as_deref().unwrap_or("any"),
        load_table(&rows)
    );
    print!("{report}");
    if let Some(p) = &o.out {
        if let Err(e) = std::fs::write(p, &report) {
            eprintln!("scale-bench: {}: {e}", p.display());
            failed = true;
        }
    }
    !failed
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// One RESP command; returns the raw reply line (and a bulk body if any).
fn redis_cmd(r: &mut BufReader<TcpStream>, args: &[&[u8]]) -> Result<Vec<u8>, String> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    r.get_mut().write_all(&out).map_err(|e| e.to_string())?;
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line).map_err(|e| e.to_string())?;
    if line.first() == Some(&b'$') {
        let len: usize = std::str::from_utf8(&line[1..])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or("bad bulk length")?;
        let mut body = vec![0u8; len + 2];
        r.read_exact(&mut body).map_err(|e| e.to_string())?;
        body.truncate(len);
        return Ok(body);
    }
    Ok(line)
}

fn info_field(info: &[u8], name: &str) -> Result<u64, String> {
    let text = String::from_utf8_lossy(info);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("INFO has no {name}"))
}

fn run_redis(bin: &Path, o: &Opts, n: usize) -> Result<Row, String> {
    let port = free_port()?;
    let mut cmd = match &o.server_cpus {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cpus]).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let mut child = cmd
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid = child.id();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + Duration::from_secs(20);
    let stream = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => {
                if let Ok(Some(st)) = child.try_wait() {
                    return Err(format!("redis-server exited: {st}"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                let _ = child.kill();
                return Err(format!("redis-server did not listen: {e}"));
            }
        }
    };
    let _guard = Kill(child);
    let mut r = BufReader::with_capacity(1 << 16, stream);
    let before = redis_cmd(&mut r, &[b"INFO", b"memory"])?;
    let rss_before = rss_bytes(pid)?;
    // Pipelined SETs, 1000 per round trip.
    let mut i = 0;
    let mut line = Vec::new();
    while i < n {
        let end = (i + 1000).min(n);
        let mut out = Vec::with_capacity((end - i) * 48);
        for j in i..end {
            out.extend_from_slice(b"*3\r\n$3\r\nSET\r\n$13\r\n");
            out.extend_from_slice(&key(j));
            out.extend_from_slice(b"\r\n$3\r\n");
            out.extend_from_slice(SOURCE);
            out.extend_from_slice(b"\r\n");
        }
        r.get_mut().write_all(&out).map_err(|e| e.to_string())?;
        for _ in i..end {
            line.clear();
            r.read_until(b'\n', &mut line).map_err(|e| e.to_string())?;
            if line != b"+OK\r\n" {
                return Err(format!("SET answered {:?}", String::from_utf8_lossy(&line)));
            }
        }
        i = end;
    }
    let after = redis_cmd(&mut r, &[b"INFO", b"memory"])?;
    let size = redis_cmd(&mut r, &[b"DBSIZE"])?;
    let size: usize = std::str::from_utf8(&size[1..])
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or("bad DBSIZE answer")?;
    if size != n {
        return Err(format!("DBSIZE is {size}, not {n}"));
    }
    let used =
        info_field(&after, "used_memory")? as i64 - info_field(&before, "used_memory")? as i64;
    Ok(Row {
        system: "redis".into(),
        mode: "memory".into(),
        max_keys: "-".into(),
        held: n,
        rss_before,
        rss_after: rss_bytes(pid)?,
        note: format!("used_memory +{:.0} B/key", used as f64 / n as f64),
        ..Row::default()
    })
}

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

fn header(o: &Opts) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let dirty = if sh("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty() {
        ""
    } else {
        " (with uncommitted changes)"
    };
    format!(
        "# Held-key memory and recovery (scale-bench)\n\n\
         - commit: {}{dirty}\n- kernel: {}\n- CPU: {} × {} (server threads {}, server CPUs {})\n\
         - keys: 13 bytes (`key-000000001`), source `src`, held with TryLock over {} persistent connections\n\
         - log directory: {} ({})\n- command: `scale-bench {}`\n",
        sh("git", &["rev-parse", "--short", "HEAD"]),
        sh("uname", &["-r"]),
        cpu,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        o.threads,
        o.server_cpus.as_deref().unwrap_or("any"),
        o.conns,
        o.dir.display(),
        sh("stat", &["-f", "-c", "%T", &o.dir.to_string_lossy()]),
        std::env::args().skip(1).collect::<Vec<_>>().join(" "),
    )
}

fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "\n| system | mode | --max-keys | held keys | RSS before MiB | RSS after MiB | **bytes per held key** | log MiB | replay ms | restart → listening ms | → first answer ms | → KEYS complete ms | RSS after restart MiB | note |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let per = (r.rss_after as f64 - r.rss_before as f64) / r.held as f64;
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | **{:.0}** | {} | {} | {} | {} | {} | {} | {} |\n",
            r.system,
            r.mode,
            r.max_keys,
            r.held,
            mib(r.rss_before),
            mib(r.rss_after),
            per,
            r.log_bytes.map_or("".into(), mib),
            opt_ms(r.replay_ms),
            opt_ms(r.listening_ms),
            opt_ms(r.first_answer_ms),
            opt_ms(r.keys_ms),
            r.rss_restart.map_or("".into(), mib),
            r.note,
        ));
    }
    s
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("scale-bench: {e}");
            std::process::exit(64);
        }
    };
    if !o.ringlockd.exists() && o.modes.iter().any(|m| m != "redis") {
        eprintln!(
            "scale-bench: {} not found (cargo build --release --bin ringlockd, or --ringlockd PATH)",
            o.ringlockd.display()
        );
        std::process::exit(1);
    }
    if let Some(secs) = o.compaction_load {
        if let Some((_, p)) = o.binaries.iter().find(|(_, p)| !p.exists()) {
            eprintln!("scale-bench: {} not found", p.display());
            std::process::exit(1);
        }
        std::process::exit(if main_compaction(&o, secs) { 0 } else { 1 });
    }
    let mut rows = Vec::new();
    let mut failed = false;
    let mut limits = vec![1];
    if o.limit_factor > 1 {
        limits.push(o.limit_factor);
    }
    for &n in &o.sizes {
        for mode in &o.modes {
            let runs: Vec<(usize, bool)> = match mode.as_str() {
                "memory" => limits.iter().map(|f| (n * f, false)).collect(),
                "durable" => limits.iter().map(|f| (n * f, true)).collect(),
                _ => Vec::new(),
            };
            for (max_keys, durable) in runs {
                eprintln!("scale-bench: ringlockd {mode} held={n} max_keys={max_keys}");
                match run_ringlockd(&o, n, max_keys, durable) {
                    Ok(r) => rows.push(r),
                    Err(e) => {
                        eprintln!("scale-bench: {mode} held={n} max_keys={max_keys}: {e}");
                        failed = true;
                    }
                }
            }
            if mode == "redis" {
                match &o.redis {
                    Some(bin) => {
                        eprintln!("scale-bench: redis held={n}");
                        match run_redis(bin, &o, n) {
                            Ok(r) => rows.push(r),
                            Err(e) => {
                                eprintln!("scale-bench: redis held={n}: {e}");
                                failed = true;
                            }
                        }
                    }
                    None => eprintln!("scale-bench: redis skipped (--redis-server none)"),
                }
            }
        }
    }
    let report = format!("{}{}", header(&o), table(&rows));
    print!("{report}");
    if let Some(p) = &o.out {
        if let Err(e) = std::fs::write(p, &report) {
            eprintln!("scale-bench: {}: {e}", p.display());
            failed = true;
        }
    }
    if failed {
        std::process::exit(1);
    }
}
