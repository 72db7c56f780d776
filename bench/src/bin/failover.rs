//! `failover`: how long clients of a replicated ringlockd cluster wait after
//! its leader is killed (`kill -9`), measured from the client side.
//!
//! ```text
//! failover probe  --nodes A,B,C [--wait-ms 30000] [--all-up]
//! failover trial  --nodes A,B,C --leader I --pid PID --metrics M [--key P]
//!               [--logs L1,L2,L3] [--timeout-ms 30000] [--pause-us 1000] [--trial N]
//! failover report FILE.jsonl
//! ```
//!
//! Nodes are the lock ports (`host:port`), in node order; `I` is 1-based.
//!
//! - `probe` finds the node that serves: the one whose directory (Locate)
//!   says it serves (a follower answers Locking-Center requests too, by
//!   forwarding them, so an answer does not tell). Prints its index. With
//!   `--all-up` it also waits until every other node answers a Persist +
//!   TryLock + Unlock of a fresh key (a node that is still starting does
//!   not).
//! - `trial` runs one failover: it takes key K with a Lock on the leader
//!   (the holder's connection is then closed by the server; the key stays
//!   held, as in Locking-Center), queues a second client's Lock on K behind
//!   it (checked on the leader's `/metrics`: `ringlock_queued_waiters`),
//!   sends SIGKILL (or, with `--signal term`, SIGTERM: a graceful stop,
//!   in which the leader hands its leadership over before it exits) to the
//!   leader's PID and measures from just before the signal:
//!   - (a) the first `+` to a Persist + TryLock of a fresh key, tried against
//!     every node in a loop (one thread per node, `--pause-us` between
//!     attempts, short timeouts): the first grant by the new leader;
//!   - (b) the waiter's grant: its connection dies with the old leader (its
//!     queued Lock is the old leader's, answered by nothing), so it
//!     reconnects and queues again, node after node, until one answers
//!     `+`; the holder meanwhile reconnects, node after node, and
//!     releases K where it is served (Persist + TryLock K + Unlock K: the
//!     TryLock must answer `#`, K still held after the failover, or the
//!     trial reports the key lost). So (b) = the waiter re-queued at the
//!     new leader and granted after its holder released there.
//!
//!   - (c) the session's resume: a session opened on the leader before the
//!     kill (a Hello; `session_resumable` says whether its welcome had the
//!     resumable flag) holds key `K-s` as a session hold; after the kill
//!     it sends a Resume, node after node, until one answers with a
//!     welcome; `session_kept` says whether that answer listed `K-s` with
//!     the token the session was granted (a replicated session keeps its
//!     holds through the failover), `c_ms` when it came.
//!
//!   With `--logs` (each node's log file, in node order) it also reports
//!   from the new leader's log when it was elected and when it began to
//!   serve (`elected_ms`, `serving_ms`, from the kill).
//!
//!   Prints one JSON line; exits 1 if a measure did not complete within
//!   `--timeout-ms` or K was lost.
//! - `report` reads the trial lines and prints one JSON object: per measure
//!   the count, p50, p99 (nearest rank: with 20 trials that is the largest)
//!   and max in milliseconds.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

const LOCK: u8 = 1;
const UNLOCK: u8 = 2;
const TRYLOCK: u8 = 5;
const PERSIST: u8 = 6;

/// Short, so that a dead or not-yet-serving node costs little.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(100);
/// Long enough for a commit on a loaded 2-CPU machine (three nodes share
/// one CPU): a leader that answers later than this is retried, not missed.
const READ_TIMEOUT: Duration = Duration::from_millis(1000);

fn frame(action: u8, key: &str, src: Option<&str>) -> Vec<u8> {
    let mut f = vec![action, key.len() as u8];
    f.extend_from_slice(key.as_bytes());
    if let Some(s) = src {
        f.push(s.len() as u8);
        f.extend_from_slice(s.as_bytes());
    }
    f
}

fn connect(addr: SocketAddr, read_timeout: Duration) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(read_timeout))?;
    s.set_write_timeout(Some(CONNECT_TIMEOUT))?;
    Ok(s)
}

/// Read up to `n` answer bytes: fewer when the server closes first.
fn read_answers(s: &mut TcpStream, n: usize) -> io::Result<Vec<u8>> {
    let mut got = Vec::with_capacity(n);
    let mut buf = [0u8; 16];
    while got.len() < n {
        match s.read(&mut buf[..n - got.len()]) {
            Ok(0) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) if got.is_empty() => return Err(e),
            Err(_) => break,
        }
    }
    Ok(got)
}

/// One connection: send `req`, read up to `n` answers.
fn exchange(addr: SocketAddr, req: &[u8], n: usize) -> io::Result<Vec<u8>> {
    let mut s = connect(addr, READ_TIMEOUT)?;
    s.write_all(req)?;
    read_answers(&mut s, n)
}

fn fresh(tag: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0);
    format!("fo-{tag}-{}-{t}-{n}", std::process::id())
}

/// Does this node serve (is it the leader)? Its directory says so
/// (Locate): every node answers Locking-Center requests, a follower by
/// forwarding them to the leader, so an answer does not tell.
fn serves(addr: SocketAddr) -> bool {
    let Ok(c) = ringlock::client::Client::builder(addr)
        .connect_timeout(CONNECT_TIMEOUT)
        .io_timeout(READ_TIMEOUT)
        .build()
    else {
        return false;
    };
    matches!(c.locate(), Ok(Some(d)) if d.serving)
}

/// Does this node answer requests at all (a node still starting does
/// not)? A fresh key taken and released, through it.
fn answers(addr: SocketAddr) -> bool {
    let k = fresh("up");
    let mut req = vec![PERSIST];
    req.extend(frame(TRYLOCK, &k, Some("fo-probe")));
    req.extend(frame(UNLOCK, &k, None));
    matches!(exchange(addr, &req, 3), Ok(a) if !a.is_empty())
}

struct Args {
    nodes: Vec<SocketAddr>,
    leader: usize,
    pid: i32,
    metrics: Option<SocketAddr>,
    key: String,
    timeout: Duration,
    pause: Duration,
    wait: Duration,
    all_up: bool,
    trial: u64,
    file: Option<String>,
    logs: Vec<String>,
    /// The signal sent to the leader: SIGKILL (a crash) or SIGTERM (a
    /// graceful stop: it hands its leadership over before it exits).
    signal: i32,
}

fn addr(s: &str) -> Result<SocketAddr, String> {
    s.to_socket_addrs()
        .map_err(|e| format!("bad address {s:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("bad address {s:?}"))
}

fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        nodes: Vec::new(),
        leader: 0,
        pid: 0,
        metrics: None,
        key: fresh("k"),
        timeout: Duration::from_secs(30),
        pause: Duration::from_micros(1000),
        wait: Duration::from_secs(30),
        all_up: false,
        trial: 0,
        file: None,
        logs: Vec::new(),
        signal: libc::SIGKILL,
    };
    while let Some(f) = it.next() {
        match f.as_str() {
            "--nodes" => {
                let v = it.next().ok_or("--nodes needs a value")?;
                a.nodes = v.split(',').map(addr).collect::<Result<_, _>>()?;
            }
            "--leader" => a.leader = num("--leader", it.next())?,
            "--pid" => a.pid = num("--pid", it.next())?,
            "--metrics" => a.metrics = Some(addr(&it.next().ok_or("--metrics needs a value")?)?),
            "--key" => a.key = it.next().ok_or("--key needs a value")?,
            "--timeout-ms" => a.timeout = Duration::from_millis(num("--timeout-ms", it.next())?),
            "--pause-us" => a.pause = Duration::from_micros(num("--pause-us", it.next())?),
            "--wait-ms" => a.wait = Duration::from_millis(num("--wait-ms", it.next())?),
            "--trial" => a.trial = num("--trial", it.next())?,
            "--all-up" => a.all_up = true,
            "--signal" => {
                a.signal = match it.next().as_deref() {
                    Some("kill") => libc::SIGKILL,
                    Some("term") => libc::SIGTERM,
                    other => return Err(format!("--signal takes kill or term, got {other:?}")),
                }
            }
            "--logs" => {
                let v = it.next().ok_or("--logs needs a value")?;
                a.logs = v.split(',').map(str::to_string).collect();
            }
            s if !s.starts_with('-') && a.file.is_none() => a.file = Some(s.to_string()),
            s => return Err(format!("unknown argument {s}")),
        }
    }
    if a.key.is_empty() || a.key.len() > 100 {
        return Err("--key must be 1..=100 bytes".into());
    }
    Ok(a)
}

fn probe(a: &Args) -> Result<(), String> {
    if a.nodes.is_empty() {
        return Err("--nodes is required".into());
    }
    let deadline = Instant::now() + a.wait;
    loop {
        let leader = a.nodes.iter().position(|&n| serves(n));
        if let Some(i) = leader {
            let others_up = !a.all_up
                || a.nodes
                    .iter()
                    .enumerate()
                    .all(|(j, &n)| j == i || answers(n));
            if others_up {
                println!("{}", i + 1);
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(match leader {
                None => format!("no node served within {} ms", a.wait.as_millis()),
                Some(_) => format!("a node did not answer within {} ms", a.wait.as_millis()),
            });
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// `ringlock_queued_waiters` from the node's `/metrics`.
fn queued_waiters(m: SocketAddr) -> io::Result<u64> {
    let mut s = TcpStream::connect_timeout(&m, CONNECT_TIMEOUT)?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    body.lines()
        .find_map(|l| l.strip_prefix("ringlock_queued_waiters "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .ok_or_else(|| io::Error::other("no ringlock_queued_waiters in /metrics"))
}

/// True once the process is gone or a zombie: its sockets are closed then.
fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command's closing parenthesis.
        Ok(s) => s
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
            .unwrap_or(true),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn opt_ms(d: Option<Duration>) -> String {
    d.map(|d| format!("{:.3}", ms(d)))
        .unwrap_or_else(|| "null".into())
}

enum Event {
    /// (a): node index, time after the kill, attempts over all nodes.
    FirstGrant(usize, Duration),
    /// The holder's release: time, and whether K was still held (TryLock `#`).
    HolderReleased(Duration, bool),
    /// (b): node index, time; and when the old connection was seen dead.
    WaiterGranted(usize, Duration, Option<Duration>),
    /// (c): time, and whether the resumed session still held its key.
    Resumed(Duration, bool),
}

/// A session on `node` holding `key` as a session hold: the connection,
/// the session id, whether it is resumable, the token.
fn session_holding(node: SocketAddr, key: &str) -> Result<(TcpStream, u64, bool, u64), String> {
    use ringlock::protocol::session::{self as sp, Answer, HoldMode, Req};
    let mut s = connect(node, READ_TIMEOUT).map_err(|e| format!("session: {e}"))?;
    let mut b = Vec::new();
    sp::encode(
        1,
        &Req::Hello {
            version: sp::VERSION,
            keepalive_ms: 0,
            auth: b"",
        },
        &mut b,
    );
    sp::encode(
        2,
        &Req::Acquire {
            hold: HoldMode::Session,
            ttl_ms: 0,
            wait_ms: 0,
            key: key.as_bytes(),
            source: b"fo-session",
            access: ringlock::protocol::session::Access::Exclusive,
        },
        &mut b,
    );
    s.write_all(&b).map_err(|e| format!("session: {e}"))?;
    let mut buf = Vec::new();
    let (mut sid, mut flags, mut token) = (None, 0, None);
    while sid.is_none() || token.is_none() {
        match read_answer(&mut s, &mut buf, Some(1))? {
            Answer::Welcome { welcome, .. } => {
                sid = Some(welcome.session_id);
                flags = welcome.flags;
            }
            Answer::Reply {
                rid: 2,
                status: sp::Status::Ok,
                token: t,
                ..
            } => token = Some(t),
            other => return Err(format!("session: answered {other:?}")),
        }
    }
    Ok((
        s,
        sid.expect("set"),
        flags & sp::FLAG_RESUMABLE != 0,
        token.expect("set"),
    ))
}

/// The next session answer on `s`.
fn read_answer(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    hello_rid: Option<u32>,
) -> Result<ringlock::protocol::session::Answer, String> {
    loop {
        if let Some((a, n)) = ringlock::protocol::session::decode_answer(buf, hello_rid)? {
            buf.drain(..n);
            return Ok(a);
        }
        let mut chunk = [0u8; 1024];
        match s.read(&mut chunk) {
            Ok(0) => return Err("closed".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// One Resume of session `sid` on `node`: `Some(listed)` when it was
/// answered with a welcome (`listed`: `key` with `token` among the Held
/// frames), `None` for a refusal or no answer.
fn resume_once(node: SocketAddr, sid: u64, key: &str, token: u64) -> Option<bool> {
    use ringlock::protocol::session::{self as sp, Answer, Req};
    let mut s = connect(node, READ_TIMEOUT).ok()?;
    let mut b = Vec::new();
    sp::encode(
        1,
        &Req::Resume {
            version: sp::VERSION,
            session_id: sid,
            auth: b"",
        },
        &mut b,
    );
    s.write_all(&b).ok()?;
    let mut buf = Vec::new();
    let mut listed = false;
    loop {
        match read_answer(&mut s, &mut buf, Some(1)).ok()? {
            Answer::Held {
                key: k, token: t, ..
            } => {
                listed |= k == key.as_bytes() && t == token;
            }
            Answer::Welcome { .. } => return Some(listed),
            _ => return None,
        }
    }
}

fn trial(a: &Args) -> Result<bool, String> {
    let n = a.nodes.len();
    if n == 0 || a.leader == 0 || a.leader > n || a.pid <= 0 {
        return Err("trial needs --nodes, --leader (1-based) and --pid".into());
    }
    let metrics = a
        .metrics
        .ok_or("trial needs --metrics (the leader's metrics address)")?;
    let leader = a.nodes[a.leader - 1];
    let key = a.key.clone();

    // The holder: a one-shot Lock; the server closes after the `+`.
    let got = exchange(leader, &frame(LOCK, &key, Some("fo-holder")), 1)
        .map_err(|e| format!("holder's Lock on the leader: {e}"))?;
    if got != b"+" {
        return Err(format!("holder's Lock on the leader answered {got:?}"));
    }
    // The waiter: queued behind it on the leader.
    let mut waiter = connect(leader, READ_TIMEOUT).map_err(|e| format!("waiter: {e}"))?;
    let mut req = vec![PERSIST];
    req.extend(frame(LOCK, &key, Some("fo-waiter")));
    waiter.write_all(&req).map_err(|e| format!("waiter: {e}"))?;
    let p = read_answers(&mut waiter, 1).map_err(|e| format!("waiter's Persist: {e}"))?;
    if p != b"+" {
        return Err(format!("waiter's Persist answered {p:?}"));
    }
    let queued_by = Instant::now() + Duration::from_secs(5);
    loop {
        match queued_waiters(metrics) {
            Ok(q) if q >= 1 => break,
            Ok(_) => {}
            Err(e) => return Err(format!("leader's /metrics at {metrics}: {e}")),
        }
        if Instant::now() >= queued_by {
            return Err("the waiter's Lock did not show as queued on the leader within 5 s".into());
        }
        thread::sleep(Duration::from_millis(2));
    }
    // After the kill the waiter blocks in read until its connection dies.
    waiter
        .set_read_timeout(Some(a.timeout))
        .map_err(|e| e.to_string())?;
    // (c): a session holding K-s.
    let skey = format!("{key}-s");
    let (session, sid, resumable, stoken) = session_holding(leader, &skey)?;

    let done = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(n + 4));
    let (tx, rx) = mpsc::channel::<Event>();
    let t0_cell: Arc<std::sync::OnceLock<Instant>> = Arc::new(std::sync::OnceLock::new());
    let mut handles = Vec::new();

    // (a): one poller per node.
    for (i, &node) in a.nodes.iter().enumerate() {
        let (done, start, tx, t0c, pause) = (
            done.clone(),
            start.clone(),
            tx.clone(),
            t0_cell.clone(),
            a.pause,
        );
        handles.push(thread::spawn(move || {
            start.wait();
            let t0 = *t0c.get().expect("t0 set before the start");
            while !done.load(Ordering::Relaxed) {
                let k = fresh("a");
                let mut req = vec![PERSIST];
                req.extend(frame(TRYLOCK, &k, Some("fo-poll")));
                if let Ok(mut s) = connect(node, READ_TIMEOUT) {
                    if s.write_all(&req).is_ok() {
                        if let Ok(ans) = read_answers(&mut s, 2) {
                            if ans == b"++" {
                                let t = t0.elapsed();
                                let _ = tx.send(Event::FirstGrant(i, t));
                                // Leave nothing held behind.
                                let _ = s.write_all(&frame(UNLOCK, &k, None));
                                let _ = read_answers(&mut s, 1);
                                return;
                            }
                        }
                    }
                }
                thread::sleep(pause);
            }
        }));
    }
    // The holder: releases K wherever it is served.
    {
        let (done, start, tx, t0c, pause, nodes, key) = (
            done.clone(),
            start.clone(),
            tx.clone(),
            t0_cell.clone(),
            a.pause,
            a.nodes.clone(),
            key.clone(),
        );
        handles.push(thread::spawn(move || {
            start.wait();
            let t0 = *t0c.get().expect("t0 set before the start");
            let mut req = vec![PERSIST];
            req.extend(frame(TRYLOCK, &key, Some("fo-holder-check")));
            req.extend(frame(UNLOCK, &key, None));
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                if let Ok(ans) = exchange(nodes[i % nodes.len()], &req, 3) {
                    if ans.len() == 3 && ans[0] == b'+' && ans[2] == b'+' {
                        // `#`: K still held (by the holder, or already by
                        // nobody else: the waiter is granted only after
                        // this release). `+`: K was free, lost.
                        let _ = tx.send(Event::HolderReleased(t0.elapsed(), ans[1] == b'#'));
                        return;
                    }
                }
                i += 1;
                thread::sleep(pause);
            }
        }));
    }
    // The waiter: sees its connection die, then queues again until granted.
    {
        let (done, start, tx, t0c, pause, nodes, key) = (
            done.clone(),
            start.clone(),
            tx.clone(),
            t0_cell.clone(),
            a.pause,
            a.nodes.clone(),
            key.clone(),
        );
        handles.push(thread::spawn(move || {
            start.wait();
            let t0 = *t0c.get().expect("t0 set before the start");
            // Anything but a grant: EOF, a reset, or `-`.
            let old = read_answers(&mut waiter, 1);
            if matches!(&old, Ok(a) if a == b"+") {
                let _ = tx.send(Event::WaiterGranted(usize::MAX, t0.elapsed(), None));
                return;
            }
            let closed = Some(t0.elapsed());
            drop(waiter);
            let mut req = vec![PERSIST];
            req.extend(frame(LOCK, &key, Some("fo-waiter")));
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                let node = i % nodes.len();
                // A queued Lock may wait for the holder's release: a
                // longer read than the probes', bounded so that a node
                // that took the frame and then lost its leadership does
                // not hold the waiter forever.
                if let Ok(mut s) = connect(nodes[node], Duration::from_secs(3)) {
                    if s.write_all(&req).is_ok() {
                        if let Ok(ans) = read_answers(&mut s, 2) {
                            if ans == b"++" {
                                let _ = tx.send(Event::WaiterGranted(node, t0.elapsed(), closed));
                                let _ = s.write_all(&frame(UNLOCK, &key, None));
                                let _ = read_answers(&mut s, 1);
                                return;
                            }
                        }
                    }
                }
                i += 1;
                thread::sleep(pause);
            }
        }));
    }
    // The session: resumes on whichever node serves.
    {
        let (done, start, tx, t0c, pause, nodes) = (
            done.clone(),
            start.clone(),
            tx.clone(),
            t0_cell.clone(),
            a.pause,
            a.nodes.clone(),
        );
        handles.push(thread::spawn(move || {
            start.wait();
            let t0 = *t0c.get().expect("t0 set before the start");
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                if let Some(kept) = resume_once(nodes[i % nodes.len()], sid, &skey, stoken) {
                    let _ = tx.send(Event::Resumed(t0.elapsed(), kept));
                    return;
                }
                i += 1;
                thread::sleep(pause);
            }
        }));
    }
    drop(tx);

    let t0 = Instant::now();
    let t0_unix = unix_now();
    // SAFETY: kill(2) with a PID the caller named and a valid signal number
    // touches no memory of this process; the worst a wrong PID does is
    // signal another process, which the script prevents by passing the PID
    // of the ringlockd it started (scripts/cluster-bench.sh).
    let rc = unsafe { libc::kill(a.pid, a.signal) };
    if rc != 0 {
        done.store(true, Ordering::Relaxed);
        let _ = t0_cell.set(t0);
        start.wait();
        return Err(format!("kill {}: {}", a.pid, io::Error::last_os_error()));
    }
    let _ = t0_cell.set(t0);
    // Start the clients once the old leader's sockets are closed, so no
    // probe can be answered by it.
    while !dead(a.pid) {
        if t0.elapsed() > Duration::from_secs(5) {
            break;
        }
        std::hint::spin_loop();
    }
    let dead_at = t0.elapsed();
    start.wait();

    let deadline = t0 + a.timeout;
    let (mut first, mut released, mut granted) = (None, None, None);
    let mut kept = true;
    let mut waiter_closed = None;
    // Only a resumable session is waited for.
    let mut resumed: Option<(Duration, bool)> = None;
    while first.is_none()
        || released.is_none()
        || granted.is_none()
        || (resumable && resumed.is_none())
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Event::FirstGrant(i, t)) => first = Some((i, t)),
            Ok(Event::HolderReleased(t, k)) => {
                released = Some(t);
                kept = k;
            }
            Ok(Event::WaiterGranted(i, t, c)) => {
                granted = Some((i, t));
                waiter_closed = c;
            }
            Ok(Event::Resumed(t, k)) => resumed = Some((t, k)),
            Err(_) => break,
        }
    }
    done.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    drop(session);
    let old_grant = matches!(granted, Some((usize::MAX, _)));
    // The new leader's own account: when it won the election and when it
    // began to serve (its log's event=raft_leader and event=raft_serving).
    let ev = match first.and_then(|(i, _)| a.logs.get(i)) {
        Some(path) => leader_events(path, t0_unix),
        None => LeaderEvents::default(),
    };
    // Terms the election took: 1 when the first candidate won; more when
    // a vote was refused or split and another election timeout passed.
    let old_term = a
        .logs
        .get(a.leader - 1)
        .and_then(|p| last_leader_term(p, t0_unix));
    let rounds = ev.term.zip(old_term).map(|(n, o)| n.saturating_sub(o));
    // Links between the survivors found broken while the cluster had no
    // leader: a send to a peer restarted since the link was dialed fails
    // (EPIPE), and the Raft message it carried is lost.
    let until = t0_unix + ev.serving.or(first.map(|f| ms(f.1))).unwrap_or(0.0) / 1e3;
    let stale: Option<usize> = (!a.logs.is_empty()).then(|| {
        a.logs
            .iter()
            .enumerate()
            .filter(|(j, _)| j + 1 != a.leader)
            .map(|(_, p)| stale_link_breaks(p, t0_unix, until, a.leader))
            .sum()
    });
    let new_leader = first.map(|(i, _)| (i + 1).to_string());
    println!(
        "{{\"trial\":{},\"killed\":{},\"new_leader\":{},\"kill_to_dead_ms\":{:.3},\"elected_ms\":{},\"serving_ms\":{},\"old_term\":{},\"new_term\":{},\"term_increase\":{},\"stale_links\":{},\"a_ms\":{},\"b_ms\":{},\"holder_release_ms\":{},\"waiter_closed_ms\":{},\"key_kept\":{},\"waiter_granted_by_dead_leader\":{},\"session_resumable\":{},\"c_ms\":{},\"session_kept\":{}}}",
        a.trial,
        a.leader,
        new_leader.unwrap_or_else(|| "null".into()),
        ms(dead_at),
        opt_num(ev.elected),
        opt_num(ev.serving),
        opt_int(old_term),
        opt_int(ev.term),
        opt_int(rounds),
        opt_int(stale.map(|n| n as u64)),
        opt_ms(first.map(|f| f.1)),
        opt_ms(granted.filter(|_| !old_grant).map(|g| g.1)),
        opt_ms(released),
        opt_ms(waiter_closed),
        kept,
        old_grant,
        resumable,
        opt_ms(resumed.map(|r| r.0)),
        resumed.is_some_and(|r| r.1),
    );
    let session_ok = !resumable || resumed.is_some_and(|r| r.1);
    Ok(first.is_some()
        && released.is_some()
        && granted.is_some()
        && kept
        && !old_grant
        && session_ok)
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn opt_int(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "null".into())
}

fn opt_num(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.3}"))
        .unwrap_or_else(|| "null".into())
}

/// The `ts` of a ringlockd log line as Unix seconds: RFC 3339 in UTC
/// (`ts=2026-12-06T11:39:15.205Z`), or the Unix seconds of older builds
/// (`ts=1796557155.205`).
fn line_ts(line: &str) -> Option<f64> {
    let ts = line.strip_prefix("ts=")?.split(' ').next()?;
    if let Ok(secs) = ts.parse() {
        return Some(secs);
    }
    let (date, time) = ts.strip_suffix('Z')?.split_once('T')?;
    let mut ymd = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (ymd.next()??, ymd.next()??, ymd.next()??);
    let mut hms = time.splitn(3, ':');
    let h: i64 = hms.next()?.parse().ok()?;
    let mi: i64 = hms.next()?.parse().ok()?;
    let s: f64 = hms.next()?.parse().ok()?;
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(((days * 24 + h) * 60 + mi) as f64 * 60.0 + s)
}

/// `term=N` of an `event=raft_leader` line.
fn line_term(line: &str) -> Option<u64> {
    line.split(' ')
        .find_map(|f| f.strip_prefix("term="))?
        .parse()
        .ok()
}

/// What the new leader's log says after the kill.
#[derive(Debug, Default, PartialEq)]
struct LeaderEvents {
    /// Milliseconds after the kill of the first `event=raft_leader` line.
    elected: Option<f64>,
    /// ... and of the first `event=raft_serving` line after it.
    serving: Option<f64>,
    /// The term it was elected in.
    term: Option<u64>,
}

/// The log's clock is the wall clock with millisecond resolution, so
/// these are good to about a millisecond.
fn leader_events(path: &str, since_unix: f64) -> LeaderEvents {
    let mut ev = LeaderEvents::default();
    let Ok(text) = std::fs::read_to_string(path) else {
        return ev;
    };
    // The log's ts is rounded to the millisecond: a line of the same
    // millisecond as the kill counts.
    let since = since_unix - 0.0005;
    for line in text.lines() {
        let Some(ts) = line_ts(line).filter(|&t| t >= since) else {
            continue;
        };
        let at = ((ts - since_unix) * 1e3).max(0.0);
        if ev.elected.is_none() && line.contains(" event=raft_leader ") {
            ev.elected = Some(at);
            ev.term = line_term(line);
        } else if ev.elected.is_some() && line.contains(" event=raft_serving ") {
            ev.serving = Some(at);
            break;
        }
    }
    ev
}

/// The term of the killed leader: its log's last `event=raft_leader` line
/// before the kill.
fn last_leader_term(path: &str, before_unix: f64) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .filter(|l| {
            l.contains(" event=raft_leader ")
                && line_ts(l).is_some_and(|t| t <= before_unix + 0.0005)
        })
        .filter_map(line_term)
        .next_back()
}

/// `event=peer_link_down` lines of a log between two instants, except
/// those for the killed node (its links go down because it is dead).
fn stale_link_breaks(path: &str, from_unix: f64, to_unix: f64, killed: usize) -> usize {
    let Ok(text) = std::fs::read_to_string(path) else {
        return 0;
    };
    let dead = format!(" peer={killed} ");
    text.lines()
        .filter(|l| l.contains(" event=peer_link_down ") && !l.contains(&dead))
        .filter(|l| line_ts(l).is_some_and(|t| t >= from_unix - 0.0005 && t <= to_unix + 0.0005))
        .count()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn report(a: &Args) -> Result<(), String> {
    let file = a.file.as_deref().ok_or("report needs the trials file")?;
    let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
    let mut trials = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        trials
            .push(ringlock_bench::json::parse(line).map_err(|e| format!("{file}:{}: {e}", n + 1))?);
    }
    let mut out = format!("{{\"trials\":{}", trials.len());
    for m in [
        "a_ms",
        "b_ms",
        "c_ms",
        "elected_ms",
        "serving_ms",
        "holder_release_ms",
        "waiter_closed_ms",
        "kill_to_dead_ms",
    ] {
        let mut v: Vec<f64> = trials.iter().filter_map(|t| t.num(m)).collect();
        v.sort_by(f64::total_cmp);
        let name = m.trim_end_matches("_ms");
        if v.is_empty() {
            out += &format!(",\"{name}\":{{\"count\":0}}");
        } else {
            out += &format!(
                ",\"{name}\":{{\"count\":{},\"min_ms\":{:.3},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3}}}",
                v.len(),
                v[0],
                percentile(&v, 50.0),
                percentile(&v, 99.0),
                v[v.len() - 1]
            );
        }
    }
    let lost = trials
        .iter()
        .filter(|t| {
            matches!(
                t.get("key_kept"),
                Some(ringlock_bench::json::Value::Bool(false))
            )
        })
        .count();
    let mut rounds: Vec<(u64, usize)> = Vec::new();
    for r in trials.iter().filter_map(|t| t.num("term_increase")) {
        let r = r as u64;
        match rounds.iter_mut().find(|(k, _)| *k == r) {
            Some((_, n)) => *n += 1,
            None => rounds.push((r, 1)),
        }
    }
    rounds.sort();
    // (a) with and without a stale link between the survivors in the
    // election.
    for (name, pick) in [("a_no_stale_link", false), ("a_stale_link", true)] {
        let mut v: Vec<f64> = trials
            .iter()
            .filter(|t| t.num("stale_links").is_some_and(|n| (n > 0.0) == pick))
            .filter_map(|t| t.num("a_ms"))
            .collect();
        v.sort_by(f64::total_cmp);
        out += &match v.len() {
            0 => format!(",\"{name}\":{{\"count\":0}}"),
            n => format!(
                ",\"{name}\":{{\"count\":{n},\"min_ms\":{:.3},\"p50_ms\":{:.3},\"max_ms\":{:.3}}}",
                v[0],
                percentile(&v, 50.0),
                v[n - 1]
            ),
        };
    }
    let rounds: Vec<String> = rounds.iter().map(|(k, n)| format!("\"{k}\":{n}")).collect();
    out += &format!(",\"term_increase\":{{{}}}", rounds.join(","));
    let sessions_lost = trials
        .iter()
        .filter(|t| {
            matches!(
                t.get("session_kept"),
                Some(ringlock_bench::json::Value::Bool(false))
            )
        })
        .count();
    out += &format!(",\"keys_lost\":{lost},\"sessions_lost\":{sessions_lost}}}");
    println!("{out}");
    Ok(())
}

fn main() -> ExitCode {
    let mut it = std::env::args().skip(1);
    let cmd = it.next().unwrap_or_default();
    let args = match parse(it) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("failover: {e}");
            return ExitCode::from(64);
        }
    };
    let r = match cmd.as_str() {
        "probe" => probe(&args).map(|_| true),
        "trial" => trial(&args),
        "report" => report(&args).map(|_| true),
        "-h" | "--help" => {
            println!("usage: failover probe|trial|report ... (see the source's header)");
            Ok(true)
        }
        _ => Err(format!("unknown command {cmd:?} (probe, trial, report)")),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("failover: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_locking_center_frames() {
        assert_eq!(frame(LOCK, "ab", Some("s")), [1, 2, b'a', b'b', 1, b's']);
        assert_eq!(frame(UNLOCK, "ab", None), [2, 2, b'a', b'b']);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 10.0);
        assert_eq!(percentile(&v, 99.0), 20.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn log_times_in_either_form() {
        let at = |l: &str| line_ts(l).unwrap();
        assert!((at("ts=2026-12-06T11:39:15.205Z level=info") - 1_796_557_155.205).abs() < 1e-6);
        assert!((at("ts=1970-01-01T00:00:00.000Z level=info")).abs() < 1e-9);
        assert!((at("ts=2000-03-01T00:00:01.500Z x") - 951_868_801.5).abs() < 1e-6);
        assert!((at("ts=1796557155.205 level=info") - 1_796_557_155.205).abs() < 1e-6);
        assert_eq!(line_ts("ts=yesterday level=info"), None);
        assert_eq!(line_ts("level=info"), None);
    }

    #[test]
    fn leader_events_after_the_kill_only() {
        let path = std::env::temp_dir().join(format!("failover-log-{}", std::process::id()));
        std::fs::write(
            &path,
            "ts=1970-01-01T00:01:40.000Z level=info event=raft_leader group=0 node=2 term=1\n\
             ts=1970-01-01T00:01:40.010Z level=info event=raft_serving group=0 node=2 term=1\n\
             ts=1970-01-01T00:01:41.250Z level=info event=raft_leader group=0 node=2 term=3\n\
             ts=1970-01-01T00:01:41.275Z level=info event=raft_serving group=0 node=2 term=3\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let ev = leader_events(p, 101.0);
        let old = last_leader_term(p, 101.0);
        std::fs::remove_file(&path).unwrap();
        assert!((ev.elected.unwrap() - 250.0).abs() < 0.01, "{ev:?}");
        assert!((ev.serving.unwrap() - 275.0).abs() < 0.01, "{ev:?}");
        assert_eq!((old, ev.term), (Some(1), Some(3)));
    }

    #[test]
    fn stale_links_exclude_the_killed_peer_and_other_times() {
        let path = std::env::temp_dir().join(format!("failover-links-{}", std::process::id()));
        std::fs::write(
            &path,
            "ts=99.000 level=warn event=peer_link_down shard=0 peer=2 errno=32\n\
             ts=100.100 level=warn event=peer_link_down shard=0 peer=3 errno=32\n\
             ts=100.200 level=warn event=peer_link_down shard=0 peer=2 errno=32\n\
             ts=100.300 level=info event=peer_link_up shard=0 peer=2\n\
             ts=102.000 level=warn event=peer_link_down shard=0 peer=2 errno=32\n",
        )
        .unwrap();
        let n = stale_link_breaks(path.to_str().unwrap(), 100.0, 101.0, 3);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn bad_arguments_are_refused() {
        let p = |v: &[&str]| parse(v.iter().map(|s| s.to_string()));
        assert!(p(&["--leader", "x"]).is_err());
        assert!(p(&["--nodes", "nohost"]).is_err());
        assert!(p(&["--bogus"]).is_err());
        assert!(p(&["--signal", "hup"]).is_err());
        assert!(p(&["--key", ""]).is_err());
        let a = p(&["--nodes", "127.0.0.1:1,127.0.0.1:2", "--leader", "2"]).unwrap();
        assert_eq!((a.nodes.len(), a.leader), (2, 2));
    }
}
