//! The fenced lock workload against a real 3-node cluster while faults hit
//! the leader, with a history checker.
//!
//! Workers loop over a few keys: open a session to every node's lock
//! address (again after a loss or an error), take a session hold, write to
//! an in-test resource guarded by [`ringlock::fence::FenceMap`] with the
//! grant's token, hold (mostly a few milliseconds, sometimes up to 2.5 s,
//! writing every 50 ms while the lease is not lost), release. A fault
//! thread runs a bounded schedule against the leader, twice: kill -9 and
//! restart, SIGSTOP past the election timeout, isolation both ways, a
//! one-way cut (leader → others); after each step a worker must complete a
//! cycle within [`RECOVER`], and the serving leader's KEYX must not list a
//! hold whose release was answered OK.
//!
//! The checker, on one monotonic clock ([`Instant`]):
//! 1. per key, the tokens granted are strictly increasing in grant order
//!    (by any leader), the fence accepted writes in token order, and it
//!    refused none (a refusal means a holder wrote while a newer holder
//!    already had);
//! 2. per key, no two holds overlap: a hold is believed from the moment
//!    `lock` returned until the worker called `release` or the client
//!    library declared the loss (the earliest of the `on_lost` handler's
//!    call and the worker seeing [`Lease::lost`]), as `src/client/session`
//!    documents for session holds;
//! 3. nothing acknowledged is lost: after each fault and at the end, no
//!    key is held by a token whose release was answered OK, and at the end
//!    every key is free (at once when its last hold was released OK and no
//!    acquire of unknown outcome followed, else within the orphan-lease
//!    bound);
//! 4. availability comes back after every fault.
//!
//! A violation prints the part of the history that shows it.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use ringlock::client::{Client, RetryPolicy, Session};
use ringlock::fence::FenceMap;
use ringlock::lease::{Error, Lease};

const WORKERS: usize = 4;
const KEYS: usize = 3;
const ROUNDS: usize = 2;
/// The keep-alive every session gets (the nodes' default and maximum), so
/// that a dead leader's orphaned holds are kept for K + 300 ms.
const KEEPALIVE_MS: u64 = 3000;
/// Bound on availability coming back after a fault.
const RECOVER: Duration = Duration::from_secs(20);
/// How long the leader stays stopped or cut off (past the 300 ms election
/// timeout, below the orphan-lease time, so both the resumed node and the
/// holds it leaves behind are exercised).
const FAULT_FOR: Duration = Duration::from_millis(1500);

fn key_name(k: usize) -> String {
    format!("wl/key{k}")
}

fn key_index(name: &str) -> usize {
    name.strip_prefix("wl/key")
        .and_then(|s| s.parse().ok())
        .expect("a workload key")
}

/// xorshift64*: the workload's choices (keys, hold times); the seed is
/// printed so a run's choices can be repeated (the faults' timing cannot).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One granted hold.
#[derive(Clone, Debug)]
struct Acq {
    worker: usize,
    key: usize,
    token: u64,
    session: u64,
    t_granted: Instant,
    /// When the worker called `release` (it had stopped writing).
    t_release: Option<Instant>,
    /// When the worker saw `Lease::lost()` set.
    t_seen_lost: Option<Instant>,
    /// When the release returned, and what it returned.
    t_answered: Option<Instant>,
    released_ok: bool,
    outcome: String,
}

/// A fenced write at the resource.
#[derive(Clone, Debug)]
struct Write {
    t: Instant,
    worker: usize,
    key: usize,
    token: u64,
    accepted: bool,
    highest: u64,
}

/// An acquire whose outcome the worker does not know (the session ended
/// before the answer): the server may hold it as an orphan.
#[derive(Clone, Debug)]
struct Unknown {
    worker: usize,
    key: usize,
    t_sent: Instant,
    error: String,
}

struct Shared {
    t0: Instant,
    stop: AtomicBool,
    addrs: Mutex<Vec<SocketAddr>>,
    acqs: Mutex<Vec<Acq>>,
    /// `(worker, key, token)` → when the `on_lost` handler was called.
    lost: Mutex<HashMap<(usize, usize, u64), Instant>>,
    /// Held across each fence check so the log is in the fence's order.
    writes: Mutex<Vec<Write>>,
    fences: FenceMap,
    unknown: Mutex<Vec<Unknown>>,
    /// Nanoseconds after `t0` of the latest grant whose release was
    /// answered OK (a completed cycle).
    last_cycle_ns: AtomicU64,
    cycles: AtomicU64,
    /// Workers inside a long hold now (a fault is aimed at one).
    long_holds: AtomicU64,
    faults: Mutex<Vec<(Instant, String)>>,
    /// What each worker is doing now (printed when availability fails).
    phase: Mutex<Vec<(Instant, String)>>,
    violations: Mutex<Vec<String>>,
}

impl Shared {
    fn ms(&self, t: Instant) -> String {
        format!(
            "{:.1}",
            t.saturating_duration_since(self.t0).as_secs_f64() * 1e3
        )
    }

    fn phase(&self, w: usize, what: String) {
        self.phase.lock().unwrap()[w] = (Instant::now(), what);
    }

    fn fault(&self, what: String) {
        eprintln!("[{} ms] fault: {what}", self.ms(Instant::now()));
        self.faults.lock().unwrap().push((Instant::now(), what));
    }

    /// The resource: a write with `token` for `key`, fenced.
    fn write(&self, worker: usize, key: usize, token: u64) -> bool {
        let mut log = self.writes.lock().unwrap();
        let name = key_name(key);
        let r = self.fences.apply(&name, token, || ());
        let highest = self.fences.highest(&name).unwrap_or(0);
        log.push(Write {
            t: Instant::now(),
            worker,
            key,
            token,
            accepted: r.is_ok(),
            highest,
        });
        r.is_ok()
    }
}

/// The keep-alive worker `w` asks for: half the workers the nodes'
/// maximum, half a short one, so that after a leader hangs the short ones
/// notice first and reach the new leader while a long one's holder still
/// believes (the orphan rule must cover the longest keep-alive).
fn keepalive_of(w: usize) -> Duration {
    Duration::from_millis(if w.is_multiple_of(2) {
        KEEPALIVE_MS
    } else {
        600
    })
}

fn worker(w: usize, sh: Arc<Shared>, seed: u64) {
    let mut rng = Rng(seed | 1);
    let mut attempt = 0;
    while !sh.stop.load(Ordering::SeqCst) {
        let mut addrs = sh.addrs.lock().unwrap().clone();
        // Each attempt starts at another node: a stopped one accepts the
        // connection and never answers the Hello.
        attempt += 1;
        let n = addrs.len();
        addrs.rotate_left((w + attempt) % n);
        sh.phase(w, format!("connecting to {addrs:?}"));
        let on_lost = Arc::clone(&sh);
        let opened = Session::builder(addrs)
            .source(format!("w{w}"))
            .keepalive(keepalive_of(w))
            .connect_timeout(Duration::from_millis(300))
            .retry(RetryPolicy {
                initial_backoff: Duration::from_millis(20),
                max_backoff: Duration::from_millis(200),
                max_elapsed: Duration::from_secs(2),
            })
            .on_lost(move |lease: &Lease, _lost| {
                // First thing: the loss is declared by now.
                let t = Instant::now();
                let id = (w, key_index(lease.key()), lease.token().expect("token"));
                on_lost.lost.lock().unwrap().entry(id).or_insert(t);
            })
            .connect();
        let Ok(session) = opened else { continue };
        while !sh.stop.load(Ordering::SeqCst) && session.ended().is_none() {
            let k = rng.below(KEYS as u64) as usize;
            let t_sent = Instant::now();
            sh.phase(
                w,
                format!("lock key{k} on session {}", session.session_id()),
            );
            let lease = match session.lock(key_name(k), Duration::from_secs(3)) {
                Ok(l) => l,
                Err(Error::Timeout) => continue,
                Err(e) => {
                    sh.unknown.lock().unwrap().push(Unknown {
                        worker: w,
                        key: k,
                        t_sent,
                        error: e.to_string(),
                    });
                    break;
                }
            };
            let t_granted = Instant::now();
            let token = lease.token().expect("sessions have tokens");
            let idx = {
                let mut acqs = sh.acqs.lock().unwrap();
                acqs.push(Acq {
                    worker: w,
                    key: k,
                    token,
                    session: session.session_id(),
                    t_granted,
                    t_release: None,
                    t_seen_lost: None,
                    t_answered: None,
                    released_ok: false,
                    outcome: String::new(),
                });
                acqs.len() - 1
            };
            // Long holds only on long keep-alives: those holders are the
            // last to notice a hung leader.
            let long = w.is_multiple_of(2) && rng.below(2) == 0;
            let hold_ms = if long {
                500 + rng.below(2000)
            } else {
                1 + rng.below(5)
            };
            let until = t_granted + Duration::from_millis(hold_ms);
            let mut seen_lost = None;
            if long {
                sh.long_holds.fetch_add(1, Ordering::SeqCst);
            }
            loop {
                if lease.lost().is_some() {
                    seen_lost = Some(Instant::now());
                    break;
                }
                if !sh.write(w, k, token) {
                    break;
                }
                let now = Instant::now();
                if now >= until {
                    break;
                }
                thread::sleep((until - now).min(Duration::from_millis(50)));
            }
            if long {
                sh.long_holds.fetch_sub(1, Ordering::SeqCst);
            }
            let t_release = Instant::now();
            sh.phase(w, format!("release key{k} token {token}"));
            let r = lease.release();
            let t_answered = Instant::now();
            {
                let mut acqs = sh.acqs.lock().unwrap();
                let a = &mut acqs[idx];
                a.t_release = Some(t_release);
                a.t_seen_lost = seen_lost;
                a.t_answered = Some(t_answered);
                a.released_ok = r.is_ok();
                a.outcome = match &r {
                    Ok(()) => "released".into(),
                    Err(e) => format!("release failed: {e}"),
                };
            }
            if r.is_ok() {
                let ns = t_granted.duration_since(sh.t0).as_nanos() as u64;
                sh.last_cycle_ns.fetch_max(ns, Ordering::SeqCst);
                sh.cycles.fetch_add(1, Ordering::SeqCst);
            } else {
                break;
            }
        }
        session.close();
    }
}

/// The end of a hold's belief: the earliest of the release call and the
/// loss declared (handler called, or seen by the worker).
fn belief_end(a: &Acq, lost: &HashMap<(usize, usize, u64), Instant>) -> Instant {
    let handler = lost.get(&(a.worker, a.key, a.token)).copied();
    [a.t_release, a.t_seen_lost, handler]
        .into_iter()
        .flatten()
        .min()
        .expect("every hold ends with a release call")
}

fn describe(sh: &Shared, a: &Acq, lost: &HashMap<(usize, usize, u64), Instant>) -> String {
    let opt = |t: Option<Instant>| t.map_or("-".to_string(), |t| sh.ms(t));
    format!(
        "worker {} key{} token {} session {}: granted {} ms, release called {} ms, \
         loss seen {} ms, on_lost {} ms, answered {} ms ({}); believed until {} ms",
        a.worker,
        a.key,
        a.token,
        a.session,
        sh.ms(a.t_granted),
        opt(a.t_release),
        opt(a.t_seen_lost),
        opt(lost.get(&(a.worker, a.key, a.token)).copied()),
        opt(a.t_answered),
        a.outcome,
        sh.ms(belief_end(a, lost)),
    )
}

/// Everything of `key` between `from` and `to`: holds, writes, faults.
fn excerpt(sh: &Shared, key: usize, from: Instant, to: Instant) -> String {
    let lost = sh.lost.lock().unwrap();
    let from = from.checked_sub(Duration::from_millis(50)).unwrap_or(from);
    let to = to + Duration::from_millis(50);
    let mut lines: Vec<(Instant, String)> = Vec::new();
    for a in sh.acqs.lock().unwrap().iter().filter(|a| a.key == key) {
        if a.t_granted <= to && belief_end(a, &lost) >= from {
            lines.push((a.t_granted, format!("hold  {}", describe(sh, a, &lost))));
        }
    }
    for wr in sh.writes.lock().unwrap().iter().filter(|w| w.key == key) {
        if wr.t >= from && wr.t <= to {
            lines.push((
                wr.t,
                format!(
                    "write worker {} token {} {} (fence highest {})",
                    wr.worker,
                    wr.token,
                    if wr.accepted { "accepted" } else { "REFUSED" },
                    wr.highest
                ),
            ));
        }
    }
    for u in sh.unknown.lock().unwrap().iter().filter(|u| u.key == key) {
        if u.t_sent >= from && u.t_sent <= to {
            lines.push((
                u.t_sent,
                format!(
                    "acquire worker {} of unknown outcome: {}",
                    u.worker, u.error
                ),
            ));
        }
    }
    // Faults a little further back: they explain what follows.
    let faults_from = from.checked_sub(Duration::from_secs(2)).unwrap_or(from);
    for (t, f) in sh.faults.lock().unwrap().iter() {
        if *t >= faults_from && *t <= to {
            lines.push((*t, format!("fault {f}")));
        }
    }
    lines.sort_by_key(|l| l.0);
    lines
        .into_iter()
        .map(|(t, l)| format!("  [{} ms] {l}", sh.ms(t)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits for a cycle granted after `since` to complete.
fn wait_available(sh: &Shared, since: Instant, what: &str) {
    let since_ns = since.duration_since(sh.t0).as_nanos() as u64;
    let t = Instant::now();
    while sh.last_cycle_ns.load(Ordering::SeqCst) <= since_ns {
        if t.elapsed() > RECOVER {
            for (w, (at, p)) in sh.phase.lock().unwrap().iter().enumerate() {
                eprintln!("worker {w} since {} ms: {p}", sh.ms(*at));
            }
            sh.violations.lock().unwrap().push(format!(
                "availability: no cycle completed within {RECOVER:?} after {what}"
            ));
            panic!("no cycle completed within {RECOVER:?} after {what}");
        }
        thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "[{} ms] available again after {what} ({} ms)",
        sh.ms(Instant::now()),
        t.elapsed().as_millis()
    );
}

/// Waits (up to 5 s, then faults anyway) until a worker is inside a long
/// hold, so that the fault lands on a holder that keeps believing.
fn aim(sh: &Shared) {
    let t = Instant::now();
    while sh.long_holds.load(Ordering::SeqCst) == 0 && t.elapsed() < Duration::from_secs(5) {
        thread::sleep(Duration::from_millis(5));
    }
}

/// A node other than `l` that serves, waiting up to `RECOVER`.
fn other_leader(c: &Cluster, l: usize, what: &str) -> usize {
    let t = Instant::now();
    loop {
        if let Some(i) = (0..3).filter(|&i| i != l).find(|&i| c.serves(i)) {
            return i;
        }
        assert!(t.elapsed() < RECOVER, "no other node served during {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Check 3 after a fault: the serving leader's table holds no key by a
/// token whose release was answered OK before the query.
fn check_acked_releases(c: &Cluster, sh: &Shared, after: &str) {
    let acked: HashMap<(usize, u64), Acq> = sh
        .acqs
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.released_ok)
        .map(|a| ((a.key, a.token), a.clone()))
        .collect();
    let l = c.leader(RECOVER);
    let node = c.nodes[l].as_ref().expect("serving node runs");
    let keys = Client::builder(node.lock_addr)
        .admin_addr(node.admin_addr)
        .build()
        .expect("admin client")
        .keyx()
        .expect("KEYX on the leader");
    for k in keys {
        let name = k.key_lossy();
        let Some(idx) = name.strip_prefix("wl/key").and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Some(a) = acked.get(&(idx, k.token)) {
            let lost = sh.lost.lock().unwrap().clone();
            let msg = format!(
                "acknowledged release lost (after {after}): node {} still holds {name} by \
                 token {} ({:?}), but {}\n{}",
                l + 1,
                k.token,
                k.mode,
                describe(sh, a, &lost),
                excerpt(sh, idx, a.t_granted, Instant::now())
            );
            eprintln!("{msg}");
            sh.violations.lock().unwrap().push(msg);
        }
    }
}

/// [`wait_available`], saying which nodes serve when it fails.
fn recovered(c: &Cluster, sh: &Shared, since: Instant, what: &str) {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_available(sh, since, what)
    }));
    if let Err(p) = r {
        for i in 0..c.nodes.len() {
            eprintln!("node {} serves: {}", i + 1, c.serves(i));
        }
        std::panic::resume_unwind(p);
    }
}

/// The fault schedule, `ROUNDS` times.
fn faults(c: &mut Cluster, sh: &Shared) {
    let publish = |c: &Cluster| *sh.addrs.lock().unwrap() = c.lock_addrs.clone();
    for round in 0..ROUNDS {
        // kill -9 of the leader, then its restart.
        aim(sh);
        let l = c.leader(RECOVER);
        sh.fault(format!("round {round}: kill -9 leader node {}", l + 1));
        c.kill9(l);
        let t = Instant::now();
        other_leader(c, l, "kill -9");
        recovered(c, sh, t, "kill -9 of the leader");
        check_acked_releases(c, sh, "kill -9");
        c.start_node(l);
        publish(c);
        let t = Instant::now();
        sh.fault(format!("round {round}: node {} restarted", l + 1));
        recovered(c, sh, t, "the restart");

        // SIGSTOP of the leader past the election timeout.
        aim(sh);
        let l = c.leader(RECOVER);
        sh.fault(format!("round {round}: SIGSTOP leader node {}", l + 1));
        c.signal(l, libc::SIGSTOP);
        let t = Instant::now();
        other_leader(c, l, "SIGSTOP");
        thread::sleep(FAULT_FOR.saturating_sub(t.elapsed()));
        c.signal(l, libc::SIGCONT);
        sh.fault(format!("round {round}: SIGCONT node {}", l + 1));
        recovered(c, sh, Instant::now(), "SIGSTOP of the leader");
        check_acked_releases(c, sh, "SIGSTOP");

        // The leader cut off both ways.
        aim(sh);
        let l = c.leader(RECOVER);
        sh.fault(format!("round {round}: isolate leader node {}", l + 1));
        c.isolate(l);
        let t = Instant::now();
        other_leader(c, l, "isolation");
        thread::sleep(FAULT_FOR.saturating_sub(t.elapsed()));
        c.heal();
        sh.fault(format!("round {round}: heal"));
        recovered(c, sh, Instant::now(), "isolation of the leader");
        check_acked_releases(c, sh, "isolation");

        // One way: the leader's messages to the others vanish; theirs
        // still reach it.
        aim(sh);
        let l = c.leader(RECOVER);
        sh.fault(format!("round {round}: cut node {} -> others", l + 1));
        for j in (0..3).filter(|&j| j != l) {
            c.cut_one_way(l, j);
        }
        other_leader(c, l, "the one-way cut");
        c.heal();
        sh.fault(format!("round {round}: heal"));
        recovered(c, sh, Instant::now(), "the one-way cut");
        check_acked_releases(c, sh, "the one-way cut");
    }
}

/// Checks 1 and 2 over the whole history; the violations found.
fn check_history(sh: &Shared) -> Vec<String> {
    let mut out = Vec::new();
    let lost = sh.lost.lock().unwrap().clone();
    let acqs = sh.acqs.lock().unwrap().clone();
    for key in 0..KEYS {
        let mut holds: Vec<&Acq> = acqs.iter().filter(|a| a.key == key).collect();
        holds.sort_by_key(|a| a.t_granted);
        // 1: tokens strictly increase in grant order.
        for p in holds.windows(2) {
            if p[1].token <= p[0].token {
                out.push(format!(
                    "key{key}: token {} granted after token {} (tokens must increase)\n{}",
                    p[1].token,
                    p[0].token,
                    excerpt(sh, key, p[0].t_granted, p[1].t_granted)
                ));
            }
        }
        // 2: no hold granted while an earlier one is still believed.
        let mut open: Option<&Acq> = None;
        let mut reported: Option<u64> = None;
        for a in &holds {
            if let Some(o) = open {
                let end = belief_end(o, &lost);
                if a.t_granted < end && reported != Some(o.token) {
                    reported = Some(o.token);
                    out.push(format!(
                        "key{key}: overlapping holds, {:.1} ms both believed\n  first:  {}\n  \
                         second: {}\n{}",
                        end.duration_since(a.t_granted).as_secs_f64() * 1e3,
                        describe(sh, o, &lost),
                        describe(sh, a, &lost),
                        excerpt(sh, key, a.t_granted, end)
                    ));
                }
            }
            if open.is_none_or(|o| belief_end(a, &lost) > belief_end(o, &lost)) {
                open = Some(a);
            }
        }
    }
    // 1: the fence accepted in token order and refused nothing.
    let writes = sh.writes.lock().unwrap().clone();
    let mut highest: BTreeMap<usize, u64> = BTreeMap::new();
    for wr in &writes {
        let h = highest.entry(wr.key).or_insert(0);
        if wr.accepted {
            if wr.token < *h {
                out.push(format!(
                    "key{}: the resource accepted token {} after {}\n{}",
                    wr.key,
                    wr.token,
                    h,
                    excerpt(sh, wr.key, wr.t - Duration::from_millis(200), wr.t)
                ));
            }
            *h = (*h).max(wr.token);
        } else if acqs
            .iter()
            .find(|a| a.worker == wr.worker && a.key == wr.key && a.token == wr.token)
            .is_none_or(|a| wr.t < belief_end(a, &lost))
        {
            out.push(format!(
                "key{}: worker {} wrote with token {} while it believed its hold, and the \
                 resource refused it (token {} had written)\n{}",
                wr.key,
                wr.worker,
                wr.token,
                wr.highest,
                excerpt(sh, wr.key, wr.t - Duration::from_millis(200), wr.t)
            ));
        }
    }
    out
}

/// Check 3 at the end: every key is free — at once where its last hold was
/// released OK and no acquire of unknown outcome followed — and the new
/// grant's token is above every token seen.
fn check_final(sh: &Shared, addrs: Vec<SocketAddr>) -> Vec<String> {
    let mut out = Vec::new();
    let connect = || {
        Session::builder(addrs.clone())
            .source("checker")
            .keepalive(Duration::from_millis(KEEPALIVE_MS))
            .connect()
            .expect("a checker session")
    };
    let mut session = connect();
    let acqs = sh.acqs.lock().unwrap().clone();
    let unknown = sh.unknown.lock().unwrap().clone();
    // An orphan is kept K + election timeout after a leader serves.
    let orphan_bound = Duration::from_millis(KEEPALIVE_MS + 300) + Duration::from_secs(5);
    for key in 0..KEYS {
        let last = acqs
            .iter()
            .filter(|a| a.key == key)
            .max_by_key(|a| a.t_granted);
        let max_token = acqs
            .iter()
            .filter(|a| a.key == key)
            .map(|a| a.token)
            .max()
            .unwrap_or(0);
        let mut at_once = last.is_some_and(|a| {
            a.released_ok
                && !unknown
                    .iter()
                    .any(|u| u.key == key && u.t_sent > a.t_granted)
        });
        let t = Instant::now();
        let lease = loop {
            match session.try_lock(key_name(key)) {
                Ok(Some(l)) => break Some(l),
                Ok(None) if !at_once && t.elapsed() < orphan_bound => {
                    thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => break None,
                // A leader change closed the checker's session (the
                // outcome of its try is unknown: it may now hold the key
                // as an orphan itself); a fresh session, and no "at once".
                Err(e) if t.elapsed() < orphan_bound => {
                    eprintln!("the checker's try_lock of key{key} failed ({e}); again");
                    at_once = false;
                    session = connect();
                }
                Err(e) => panic!("the checker's try_lock failed: {e}"),
            }
        };
        match lease {
            None => out.push(format!(
                "key{key} still held at the end ({}); last hold: {}",
                if at_once {
                    "its last hold was released OK"
                } else {
                    "past the orphan-lease bound"
                },
                last.map_or("none".into(), |a| describe(sh, a, &sh.lost.lock().unwrap()))
            )),
            Some(l) => {
                let tok = l.token().expect("token");
                if tok <= max_token {
                    out.push(format!(
                        "key{key}: the final grant's token {tok} is not above {max_token}"
                    ));
                }
                l.release().expect("the checker's release");
            }
        }
    }
    out
}

#[test]
fn fenced_workload_survives_leader_faults() {
    let seed = std::env::var("RINGLOCK_WORKLOAD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as u64
        });
    eprintln!("workload seed {seed} (RINGLOCK_WORKLOAD_SEED={seed} repeats the choices)");
    let ka = KEEPALIVE_MS.to_string();
    let threads = common::cluster::test_threads();
    eprintln!("workload: 3 nodes x {threads} shards");
    let mut c = Cluster::start(
        3,
        threads,
        &["--keepalive-ms", &ka, "--max-keepalive-ms", &ka],
    );
    let sh = Arc::new(Shared {
        t0: Instant::now(),
        stop: AtomicBool::new(false),
        addrs: Mutex::new(c.lock_addrs.clone()),
        acqs: Mutex::new(Vec::new()),
        lost: Mutex::new(HashMap::new()),
        writes: Mutex::new(Vec::new()),
        fences: FenceMap::new(),
        unknown: Mutex::new(Vec::new()),
        last_cycle_ns: AtomicU64::new(0),
        cycles: AtomicU64::new(0),
        long_holds: AtomicU64::new(0),
        faults: Mutex::new(Vec::new()),
        phase: Mutex::new(vec![(Instant::now(), "starting".into()); WORKERS]),
        violations: Mutex::new(Vec::new()),
    });
    let mut rng = Rng(seed | 1);
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let sh = Arc::clone(&sh);
            let s = rng.next();
            thread::spawn(move || worker(w, sh, s))
        })
        .collect();
    wait_available(&sh, sh.t0, "the start");
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| faults(&mut c, &sh)));
    if run.is_ok() {
        wait_available(&sh, Instant::now(), "the last fault");
    }
    sh.stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().expect("a worker panicked");
    }
    if run.is_ok() {
        check_acked_releases(&c, &sh, "the end");
    }
    let mut violations = sh.violations.lock().unwrap().clone();
    violations.extend(check_history(&sh));
    if run.is_ok() {
        violations.extend(check_final(&sh, c.lock_addrs.clone()));
    }
    let acqs = sh.acqs.lock().unwrap().clone();
    let lost_n = acqs.iter().filter(|a| !a.released_ok).count();
    let long_n = acqs
        .iter()
        .filter(|a| {
            a.t_release
                .is_some_and(|r| r.duration_since(a.t_granted) > Duration::from_millis(250))
        })
        .count();
    eprintln!(
        "history: {} holds ({} not released OK, {} long), {} writes, {} acquires of unknown \
         outcome, {} losses reported by on_lost",
        acqs.len(),
        lost_n,
        long_n,
        sh.writes.lock().unwrap().len(),
        sh.unknown.lock().unwrap().len(),
        sh.lost.lock().unwrap().len()
    );
    if std::env::var_os("RINGLOCK_WORKLOAD_HISTORY").is_some() {
        for key in 0..KEYS {
            eprintln!(
                "--- key{key} ---\n{}",
                excerpt(&sh, key, sh.t0, Instant::now())
            );
        }
    }
    if !violations.is_empty() || run.is_err() {
        for (i, n) in c.nodes.iter().enumerate() {
            if let Some(n) = n {
                let lines: Vec<String> = n.log.try_iter().collect();
                let tail = lines.len().saturating_sub(80);
                eprintln!(
                    "--- node {} log (last {} lines) ---",
                    i + 1,
                    lines.len() - tail
                );
                for l in &lines[tail..] {
                    eprintln!("{l}");
                }
            }
        }
    }
    for v in &violations {
        eprintln!("VIOLATION: {v}");
    }
    if let Err(p) = run {
        std::panic::resume_unwind(p);
    }
    assert!(
        violations.is_empty(),
        "{} violation(s), first: {}",
        violations.len(),
        violations[0]
    );
    assert!(sh.cycles.load(Ordering::SeqCst) > 0);
}
