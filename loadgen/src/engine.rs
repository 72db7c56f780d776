//! The load engine: per thread one epoll instance, one timerfd, and a state
//! machine per client.
//!
//! Threads (`--threads N`, default 1): thread t owns clients t, t + N, …
//! (disjoint; a client never changes thread), with its own epoll, timerfd,
//! sockets and histograms; nothing is locked between them. They share one
//! start time (so their windows coincide) and the per-key bookkeeping that
//! tells contended grants apart (relaxed atomics). At the end their
//! histograms are added and their counters summed ([`merge`]). With one
//! thread the engine runs on the calling thread, as it always did.
//!
//! A *cycle* is one lock acquisition: Lock (or TryLock) → hold → Unlock.
//! Open loop: client i starts cycle k at its *intended* time
//! `t0 + offset_i + k / rate_i`, whether or not the previous cycle finished
//! in time; a late start is charged to the latency (corrected figures,
//! wrk2-style), so a stall of the server cannot hide behind a blocked client.
//! Closed loop: the next cycle starts when the previous one ends.
//!
//! Latencies are recorded in nanoseconds:
//! - `lock` (corrected): grant − intended start of the cycle;
//! - `lock_uncorrected`: grant − moment the cycle actually began (connect
//!   included in per-request mode; excludes only the late start);
//! - `unlock`: Unlock answer − end of the hold (when it was due);
//! - `cycle`: Unlock answer − intended start;
//! - `queue_wait`: grant − first send, for Locks that found the key held or
//!   queued by another client of this run (contended);
//! - `handoff`: grant − the moment the previous holder's Unlock was written,
//!   for contended grants (unlock → next waiter's `+`).
//! - `handshake`: connect start → the connection is ready for the protocol:
//!   the TCP connect, plus with TLS (`--tls-certs-dir`) the whole TLS 1.3
//!   handshake. Every connection of the run is recorded (warm-up included:
//!   persistent clients connect then); the protocol's own greeting (session
//!   Hello, SQL auth) is not in it.
//!
//! Only cycles whose intended start lies in `[warmup_end, end)` are recorded;
//! cycles still open at `end` get `drain` time to finish, and the ones that
//! do not are counted as `incomplete` errors (never silently dropped).
//!
//! TLS: a client's connection then carries a `rustls::ClientConnection`.
//! After the TCP connect, the engine drives the handshake on the
//! nonblocking socket (`write_tls` until it would block, then the
//! edge-triggered `EPOLLOUT` resumes it; `read_tls` → `process_new_packets`
//! on `EPOLLIN`); once it is done the codec runs as over plaintext: what it
//! writes goes through `writer()` and `write_tls`, what rustls decrypts is
//! appended to the read buffer, all of it before the next `epoll_wait`.
//! The plaintext path only tests `tls.is_none()` once per read and write.
//!
//! Ownership: a thread's engine owns its clients' sockets; a client's `gen`
//! changes on every new connection so a stale epoll event for a closed
//! socket is ignored.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::mpsc;
use std::sync::Arc;

use hdrhistogram::Histogram;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

use crate::config::{Config, ConnMode, Mix, TlsOpts};
use crate::dist::{KeyPicker, Rng};
use crate::fifo::{Fifo, OpRecord, NOT_GRANTED};
use crate::proto::{new_codec, Codec, Op, Reply};

const TIMER_TOKEN: u64 = u64::MAX;
const NO_CLIENT: usize = usize::MAX;
/// Pause after a failed cycle before the next one (closed loop), so a dead
/// server does not turn into a busy loop.
const ERROR_PAUSE_NS: u64 = 1_000_000;
const PROGRESS_EVERY_NS: u64 = 1_000_000_000;

pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn new_hist() -> Histogram<u64> {
    // 1 ns .. 1 hour, 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("static histogram bounds are valid")
}

fn record(h: &mut Histogram<u64>, v_ns: u64) {
    h.saturating_record(v_ns.max(1));
}

#[derive(Default, Debug, Clone)]
pub struct Errors {
    /// The server answered an error (`-`, Redis/SQL error, HTTP status).
    pub server: u64,
    /// Connect failed or was refused.
    pub connect: u64,
    /// TLS failed: the handshake (a certificate refused on either side, no
    /// common parameters) or a TLS record or alert later.
    pub tls: u64,
    /// The connection broke (reset, EOF) while a request was open.
    pub io: u64,
    /// An answer that does not parse.
    pub protocol: u64,
    /// Unlock said we did not hold the key (lock lost: TTL, reset).
    pub not_held: u64,
    /// Cycles still open when the drain time ran out.
    pub incomplete: u64,
}

impl Errors {
    pub fn total(&self) -> u64 {
        self.server
            + self.connect
            + self.tls
            + self.io
            + self.protocol
            + self.not_held
            + self.incomplete
    }
}

pub struct Stats {
    pub lock: Histogram<u64>,
    pub lock_uncorrected: Histogram<u64>,
    pub unlock: Histogram<u64>,
    pub cycle: Histogram<u64>,
    pub queue_wait: Histogram<u64>,
    pub handoff: Histogram<u64>,
    /// Connect start → ready (TCP connected; with TLS, handshake done), for
    /// every connection of the run, warm-up included.
    pub handshake: Histogram<u64>,
    pub cycles: u64,
    /// Every completed cycle, warm-up and drain included: the denominator
    /// for costs measured over the whole run (the server's CPU time).
    pub cycles_all: u64,
    pub grants: u64,
    pub busy: u64,
    pub retries: u64,
    pub connects: u64,
    pub errors: Errors,
    pub first_error: Option<String>,
    /// When `first_error` happened (monotonic ns), so merging the threads'
    /// figures keeps the one that really came first.
    first_error_ns: u64,
    /// Indexed by the global client id (every thread's vector has one slot
    /// per client of the run; a thread only counts its own clients).
    pub grants_per_client: Vec<u64>,
    /// Length of the measured window.
    pub measured_ns: u64,
    /// Time from the end of the window until the last open cycle finished.
    pub drain_used_ns: u64,
    /// CPU time the load generator used (user, system), seconds: the whole
    /// process for [`run`], the one thread for a part of [`run_parts`].
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    /// `--latency-log`: every lock latency recorded in `lock`, as
    /// (intended start of the cycle, latency), CLOCK_MONOTONIC ns; empty
    /// without the option.
    pub samples: Vec<(u64, u64)>,
    /// When the run started (the first arrivals were due) and when its
    /// last thread finished, CLOCK_MONOTONIC ns (the same clock in every
    /// process of the machine, so runs side by side can be lined up).
    pub started_ns: u64,
    pub ended_ns: u64,
    /// `--writers`: the lock latency (as `lock`) of the readers and of the
    /// writers apart; empty otherwise.
    pub lock_readers: Histogram<u64>,
    pub lock_writers: Histogram<u64>,
    /// `--writers`: every Acquire of the run (warm-up included), its send,
    /// grant and Release times; empty otherwise.
    pub ops: Vec<OpRecord>,
    /// `--writers`: the FIFO evidence worked out from `ops` ([`run`]).
    pub fifo: Option<Fifo>,
}

impl Stats {
    fn new(connections: usize, measured_ns: u64) -> Stats {
        Stats {
            lock: new_hist(),
            lock_uncorrected: new_hist(),
            unlock: new_hist(),
            cycle: new_hist(),
            queue_wait: new_hist(),
            handoff: new_hist(),
            handshake: new_hist(),
            cycles: 0,
            cycles_all: 0,
            grants: 0,
            busy: 0,
            retries: 0,
            connects: 0,
            errors: Errors::default(),
            first_error: None,
            first_error_ns: 0,
            grants_per_client: vec![0; connections],
            measured_ns,
            drain_used_ns: 0,
            cpu_user_s: 0.0,
            cpu_sys_s: 0.0,
            samples: Vec::new(),
            started_ns: 0,
            ended_ns: 0,
            lock_readers: new_hist(),
            lock_writers: new_hist(),
            ops: Vec::new(),
            fifo: None,
        }
    }

    /// Record a lock latency: the histograms, and the sample log if kept.
    #[inline]
    fn record_lock(&mut self, interval: &mut Histogram<u64>, start_ns: u64, now: u64, log: bool) {
        record(&mut self.lock, now - start_ns);
        record(interval, now - start_ns);
        if log {
            self.samples.push((start_ns, now - start_ns));
        }
    }

    fn note_error(&mut self, msg: String) {
        if self.first_error.is_none() {
            self.first_error = Some(msg);
            self.first_error_ns = now_ns();
        }
    }

    /// Fold another thread's figures into these: histograms are added
    /// (HdrHistogram addition is exact: the merged percentiles are those of
    /// all samples together), counters summed, the drain is the longest.
    fn absorb(&mut self, o: Stats) {
        for (mine, theirs) in [
            (&mut self.lock, &o.lock),
            (&mut self.lock_uncorrected, &o.lock_uncorrected),
            (&mut self.unlock, &o.unlock),
            (&mut self.cycle, &o.cycle),
            (&mut self.queue_wait, &o.queue_wait),
            (&mut self.handoff, &o.handoff),
            (&mut self.handshake, &o.handshake),
            (&mut self.lock_readers, &o.lock_readers),
            (&mut self.lock_writers, &o.lock_writers),
        ] {
            mine.add(theirs)
                .expect("every histogram of a run has the same bounds");
        }
        self.cycles += o.cycles;
        self.cycles_all += o.cycles_all;
        self.grants += o.grants;
        self.busy += o.busy;
        self.retries += o.retries;
        self.connects += o.connects;
        let (e, f) = (&mut self.errors, &o.errors);
        e.server += f.server;
        e.connect += f.connect;
        e.tls += f.tls;
        e.io += f.io;
        e.protocol += f.protocol;
        e.not_held += f.not_held;
        e.incomplete += f.incomplete;
        if let Some(msg) = o.first_error {
            if self.first_error.is_none() || o.first_error_ns < self.first_error_ns {
                self.first_error = Some(msg);
                self.first_error_ns = o.first_error_ns;
            }
        }
        if self.grants_per_client.len() < o.grants_per_client.len() {
            self.grants_per_client.resize(o.grants_per_client.len(), 0);
        }
        for (a, b) in self.grants_per_client.iter_mut().zip(&o.grants_per_client) {
            *a += b;
        }
        self.measured_ns = self.measured_ns.max(o.measured_ns);
        self.drain_used_ns = self.drain_used_ns.max(o.drain_used_ns);
        self.cpu_user_s += o.cpu_user_s;
        self.cpu_sys_s += o.cpu_sys_s;
        self.samples.extend_from_slice(&o.samples);
        self.ops.extend_from_slice(&o.ops);
        self.started_ns = self.started_ns.min(o.started_ns);
        self.ended_ns = self.ended_ns.max(o.ended_ns);
    }
}

/// Merge the figures of every thread of a run into one.
pub fn merge(parts: Vec<Stats>) -> Stats {
    let mut it = parts.into_iter();
    let mut total = it.next().expect("a run has at least one thread");
    for p in it {
        total.absorb(p);
    }
    total
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Between cycles, waiting for the next intended start.
    Idle,
    Connecting,
    /// TCP is up; the TLS handshake is running.
    TlsHandshaking,
    /// The protocol's own greeting (session Hello, SQL auth, Persist).
    Handshaking,
    AwaitReply,
    /// Inside the critical section, waiting for the hold to end.
    Holding,
    /// Redis spin: waiting to retry SET NX.
    Backoff,
}

struct Client {
    /// Global client id (source name, private key, fairness slot); the
    /// client's index in its thread's `clients` is its epoll token instead.
    id: usize,
    stream: Option<TcpStream>,
    /// The TLS session of `stream` (TLS runs only); boxed, so a plaintext
    /// client stays small.
    tls: Option<Box<ClientConnection>>,
    gen: u32,
    phase: Phase,
    /// The operation in flight, or the one to send once connected.
    op: Op,
    codec: Box<dyn Codec>,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    wpos: usize,
    key: u32,
    keybuf: Vec<u8>,
    in_cycle: bool,
    measured: bool,
    cycle_start_ns: u64,
    /// When this cycle's first Lock attempt began (its connect included).
    lock_first_send_ns: u64,
    /// The Lock of this cycle has been counted in `KeyState::waiters` logic.
    registered: bool,
    unlock_due_ns: u64,
    contended: bool,
    /// Registered as a waiter in `KeyState::waiters` for the open Lock.
    waiting: bool,
    /// Holds `key` (granted, Unlock not yet written).
    holding: bool,
    period_ns: u64,
    timer_seq: u64,
    rng: Rng,
    /// When the current connection's connect began.
    connect_start_ns: u64,
    /// Cycles this client may still start (`--cycles`; `u64::MAX` = no cap).
    cycles_left: u64,
    /// `--writers`: this client asks exclusively (a writer).
    writer: bool,
    /// `--writers`: when this cycle's Acquire was written, and when its
    /// grant arrived (for its [`OpRecord`]).
    acquire_sent_ns: u64,
    granted_ns: u64,
}

const NO_HOLDER: u32 = u32::MAX;

/// What this run's clients know about one key, shared by every thread so
/// that contention between clients of different threads is seen too. It is
/// bookkeeping for the contention figures only (never a lock): relaxed
/// atomics suffice, because the store that matters (`last_release_ns`)
/// happens before the Unlock's `write`, and the grant it explains is read
/// after a later `read` — both system calls, which order memory anyway.
struct KeyState {
    /// Global id of the client that was granted the key, or `NO_HOLDER`.
    holder: AtomicU32,
    waiters: AtomicU32,
    last_release_ns: AtomicU64,
}

impl KeyState {
    fn new() -> KeyState {
        KeyState {
            holder: AtomicU32::new(NO_HOLDER),
            waiters: AtomicU32::new(0),
            last_release_ns: AtomicU64::new(0),
        }
    }

    fn unwait(&self) {
        let _ = self
            .waiters
            .fetch_update(Relaxed, Relaxed, |w| Some(w.saturating_sub(1)));
    }

    fn unhold(&self, id: usize) {
        let _ = self
            .holder
            .compare_exchange(id as u32, NO_HOLDER, Relaxed, Relaxed);
    }
}

/// One progress interval of one thread, sent to the thread that prints.
struct Tick {
    elapsed_ns: u64,
    hist: Histogram<u64>,
    cycles: u64,
    errors: u64,
    open: usize,
}

enum ProgressSink {
    /// One thread: print the line itself (as it always did).
    Print,
    /// Several threads: the calling thread merges the intervals and prints.
    Send(mpsc::Sender<Tick>),
}

/// What every thread of a run shares: where to connect, when the run starts.
struct Plan {
    addr: SocketAddr,
    start_ns: u64,
    period_ns: u64,
    tls: Option<Tls>,
}

/// The TLS every connection of a run speaks: one rustls configuration
/// (TLS 1.3, no resumption: each connection is a full handshake) and the
/// name the server's certificate must carry.
#[derive(Clone)]
struct Tls {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
}

impl Tls {
    fn load(opts: &TlsOpts, host: &str) -> Result<Tls, String> {
        let client = ringlock::tls::ClientTls::load(&opts.certs_dir, opts.client.as_deref())
            .map_err(|e| format!("--tls-certs-dir {}: {e}", opts.certs_dir.display()))?;
        let server_name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("TLS server name {host:?}: {e}"))?;
        Ok(Tls {
            config: client.config(),
            server_name,
        })
    }
}

struct Engine<'a> {
    cfg: &'a Config,
    addr: SocketAddr,
    tls: Option<Tls>,
    /// Clients that have started their last cycle (`--cycles`).
    exhausted: usize,
    /// Keep every lock latency in `stats.samples` (`--latency-log`).
    log_samples: bool,
    /// Keep every Acquire's times in `stats.ops` (`--writers`).
    record_ops: bool,
    epfd: OwnedFd,
    tfd: OwnedFd,
    armed_ns: u64,
    timers: BinaryHeap<Reverse<(u64, usize, u64)>>,
    clients: Vec<Client>,
    keys: &'a [KeyState],
    picker: KeyPicker,
    stats: Stats,
    warm_end_ns: u64,
    end_ns: u64,
    interval: Histogram<u64>,
    interval_cycles: u64,
    interval_errors: u64,
    progress_sink: ProgressSink,
}

/// Run the configured load and return what it measured, every thread's
/// figures merged; the CPU time is that of the whole process.
/// With `--writers`, the FIFO evidence is worked out here, after the load
/// (the load generator's CPU figures are taken before it).
pub fn run(cfg: &Config) -> Result<Stats, String> {
    let mut stats = merge(run_parts(cfg)?);
    let (user, sys) = cpu_s(libc::RUSAGE_SELF);
    stats.cpu_user_s = user;
    stats.cpu_sys_s = sys;
    if cfg.writers > 0 {
        stats.fifo = Some(crate::fifo::analyse(&mut stats.ops, cfg.fifo_guard_ns));
    }
    Ok(stats)
}

/// Run the configured load on `cfg.threads` epoll threads and return each
/// thread's own figures (thread t drives clients t, t + threads, …).
/// With one thread the engine runs on the calling thread.
pub fn run_parts(cfg: &Config) -> Result<Vec<Stats>, String> {
    let addr = cfg.target.resolve()?;
    let keys: Vec<KeyState> = (0..cfg.keys).map(|_| KeyState::new()).collect();
    let per_client_rate = cfg.rate_per_s / cfg.connections as f64;
    let period_ns = if per_client_rate > 0.0 {
        (1e9 / per_client_rate).round().max(1.0) as u64
    } else {
        0
    };
    // Every thread shares one start time, so their windows coincide. Extra
    // threads get a little more lead so their start-up (histograms, epoll)
    // is done before the first arrival is due.
    let lead_ns = if cfg.threads == 1 {
        1_000_000
    } else {
        5_000_000
    };
    let tls = match &cfg.tls {
        Some(opts) => Some(Tls::load(opts, &cfg.target.host)?),
        None => None,
    };
    let plan = Plan {
        addr,
        start_ns: now_ns() + lead_ns,
        period_ns,
        tls,
    };
    if cfg.threads == 1 {
        return Ok(vec![run_thread(cfg, &plan, &keys, 0, ProgressSink::Print)?]);
    }
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        let mut handles = Vec::with_capacity(cfg.threads);
        let mut spawn_error = None;
        for t in 0..cfg.threads {
            let sink = ProgressSink::Send(tx.clone());
            let (plan, keys) = (&plan, &keys[..]);
            match std::thread::Builder::new()
                .name(format!("loadgen-{t}"))
                .spawn_scoped(scope, move || run_thread(cfg, plan, keys, t, sink))
            {
                Ok(h) => handles.push(h),
                Err(e) => {
                    spawn_error = Some(format!("starting load generator thread {t}: {e}"));
                    break;
                }
            }
        }
        drop(tx);
        print_progress(cfg, handles.len(), rx);
        let mut parts = Vec::with_capacity(handles.len());
        let mut first_err = spawn_error;
        for h in handles {
            match h.join() {
                Ok(Ok(st)) => parts.push(st),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert("a load generator thread panicked".into());
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(parts),
        }
    })
}

/// The several-thread progress line: one line per interval once every
/// thread has reported it, with the interval histograms merged. Returns when
/// every thread has dropped its sender (finished).
fn print_progress(cfg: &Config, threads: usize, rx: mpsc::Receiver<Tick>) {
    let mut pending: BTreeMap<u64, (usize, Tick)> = BTreeMap::new();
    for tick in rx {
        let at = tick.elapsed_ns;
        let complete = match pending.get_mut(&at) {
            None => {
                pending.insert(at, (1, tick));
                threads == 1
            }
            Some((n, acc)) => {
                *n += 1;
                acc.hist
                    .add(&tick.hist)
                    .expect("progress histograms share their bounds");
                acc.cycles += tick.cycles;
                acc.errors += tick.errors;
                acc.open += tick.open;
                *n == threads
            }
        };
        if complete {
            if let Some((_, t)) = pending.remove(&at) {
                print_tick(cfg, t.elapsed_ns, &t.hist, t.cycles, t.errors, t.open);
            }
        }
    }
}

fn print_tick(
    cfg: &Config,
    elapsed_ns: u64,
    hist: &Histogram<u64>,
    cycles: u64,
    errors: u64,
    open: usize,
) {
    let phase = if elapsed_ns <= cfg.warmup_ns {
        "warmup"
    } else {
        "run"
    };
    let p = |q: f64| hist.value_at_quantile(q) as f64 / 1e3;
    eprintln!(
        "[{:6.1}s {phase:>6}] cycles/s={:<8} lock p50={:.1}us p99={:.1}us max={:.1}us errors={} open={}",
        elapsed_ns as f64 / 1e9,
        cycles,
        p(0.5),
        p(0.99),
        hist.max() as f64 / 1e3,
        errors,
        open,
    );
}

/// One epoll thread: its own epoll instance, timerfd and clients.
fn run_thread(
    cfg: &Config,
    plan: &Plan,
    keys: &[KeyState],
    thread: usize,
    progress_sink: ProgressSink,
) -> Result<Stats, String> {
    if let Some(cpus) = &cfg.pin_cpus {
        pin_current_thread(cpus[thread % cpus.len()])
            .map_err(|e| format!("thread {thread}: {e}"))?;
    }
    // SAFETY: plain syscalls on fresh descriptors we own; checked below.
    let (epfd, tfd) = unsafe {
        // Timers fire when asked, not up to 50 µs later (default timer
        // slack). The slack is per thread, so every engine thread sets it.
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
        (
            libc::epoll_create1(libc::EPOLL_CLOEXEC),
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            ),
        )
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: each descriptor that was opened is owned by nothing else; the
    // OwnedFd closes it on every path (also when the other failed).
    let (epfd, tfd) = unsafe {
        (
            (epfd >= 0).then(|| OwnedFd::from_raw_fd(epfd)),
            (tfd >= 0).then(|| OwnedFd::from_raw_fd(tfd)),
        )
    };
    let (Some(epfd), Some(tfd)) = (epfd, tfd) else {
        return Err(format!("epoll/timerfd: {err}"));
    };
    let mut seed_rng = Rng::new(cfg.seed);
    // Every client's RNG seed is drawn in global id order, so a client gets
    // the same key sequence whatever thread drives it.
    let seeds: Vec<u64> = (0..cfg.connections).map(|_| seed_rng.next_u64()).collect();
    let clients = (thread..cfg.connections)
        .step_by(cfg.threads)
        .map(|id| Client {
            id,
            stream: None,
            tls: None,
            gen: 0,
            phase: Phase::Idle,
            op: Op::Lock,
            codec: new_codec(
                &cfg.target,
                id,
                cfg.lock_ttl_ms,
                cfg.conn_mode != ConnMode::PerRequest,
                if id < cfg.writers {
                    crate::config::Access::Exclusive
                } else {
                    cfg.access
                },
            ),
            rbuf: Vec::with_capacity(4096),
            wbuf: Vec::with_capacity(4096),
            wpos: 0,
            key: 0,
            keybuf: Vec::with_capacity(64),
            in_cycle: false,
            measured: false,
            cycle_start_ns: 0,
            lock_first_send_ns: 0,
            registered: false,
            unlock_due_ns: 0,
            contended: false,
            waiting: false,
            holding: false,
            period_ns: plan.period_ns,
            timer_seq: 0,
            rng: Rng::new(seeds[id]),
            connect_start_ns: 0,
            cycles_left: cycle_quota(cfg, id),
            writer: id < cfg.writers,
            acquire_sent_ns: 0,
            granted_ns: 0,
        })
        .collect::<Vec<Client>>();
    let exhausted = clients.iter().filter(|c| c.cycles_left == 0).count();
    let start = plan.start_ns;
    let mut e = Engine {
        cfg,
        addr: plan.addr,
        tls: plan.tls.clone(),
        exhausted,
        log_samples: cfg.latency_log.is_some(),
        record_ops: cfg.writers > 0,
        epfd,
        tfd,
        armed_ns: 0,
        timers: BinaryHeap::new(),
        clients,
        keys,
        picker: KeyPicker::new(cfg.dist.clone(), cfg.keys),
        stats: Stats::new(cfg.connections, cfg.duration_ns),
        warm_end_ns: start + cfg.warmup_ns,
        end_ns: start + cfg.warmup_ns + cfg.duration_ns,
        interval: new_hist(),
        interval_cycles: 0,
        interval_errors: 0,
        progress_sink,
    };
    if e.record_ops {
        // Room for this thread's Acquires up front (the --cycles share, else
        // 64 Ki); a longer run grows the vector now and then (amortised),
        // as --latency-log's samples do.
        let quota: u64 = e
            .clients
            .iter()
            .map(|c| c.cycles_left)
            .fold(0, u64::saturating_add);
        e.stats.ops.reserve(quota.min(1 << 16) as usize);
    }
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: TIMER_TOKEN,
    };
    // SAFETY: epfd and tfd are valid descriptors; ev lives across the call.
    let rc = unsafe {
        libc::epoll_ctl(
            e.epfd.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            e.tfd.as_raw_fd(),
            &mut ev,
        )
    };
    if rc < 0 {
        return Err(format!(
            "epoll_ctl timerfd: {}",
            std::io::Error::last_os_error()
        ));
    }
    // Spread the first arrivals over one period so clients do not fire in
    // lockstep; the offset follows the global id, so the schedule is the
    // same whatever the number of threads.
    for idx in 0..e.clients.len() {
        let id = e.clients[idx].id;
        let offset = if plan.period_ns > 0 {
            plan.period_ns * id as u64 / cfg.connections as u64
        } else {
            0
        };
        e.schedule(idx, start + offset);
    }
    e.schedule(NO_CLIENT, start + PROGRESS_EVERY_NS);
    e.event_loop(start)?;
    let mut stats = e.stats;
    stats.started_ns = start;
    stats.ended_ns = now_ns();
    let (user, sys) = cpu_s(libc::RUSAGE_THREAD);
    stats.cpu_user_s = user;
    stats.cpu_sys_s = sys;
    Ok(stats)
}

/// How many cycles client `id` may start: `--cycles` split over the
/// clients (the first `N mod clients` get one more), or no cap.
fn cycle_quota(cfg: &Config, id: usize) -> u64 {
    match cfg.cycles {
        None => u64::MAX,
        Some(n) => {
            let clients = cfg.connections as u64;
            n / clients + u64::from((id as u64) < n % clients)
        }
    }
}

/// Pin the calling thread to one CPU.
fn pin_current_thread(cpu: usize) -> Result<(), String> {
    // SAFETY: cpu_set_t is plain old data; CPU_SET stays inside it because
    // config checked cpu < CPU_SETSIZE.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(format!(
            "pinning to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

impl<'a> Engine<'a> {
    fn schedule(&mut self, client: usize, at_ns: u64) {
        let seq = if client == NO_CLIENT {
            0
        } else {
            let c = &mut self.clients[client];
            c.timer_seq += 1;
            c.timer_seq
        };
        self.timers.push(Reverse((at_ns, client, seq)));
    }

    fn arm(&mut self, at_ns: u64) {
        if at_ns == self.armed_ns {
            return;
        }
        self.armed_ns = at_ns;
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (at_ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (at_ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: tfd is our timerfd; spec is a valid itimerspec.
        unsafe {
            libc::timerfd_settime(
                self.tfd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
    }

    fn busy_clients(&self) -> usize {
        self.clients.iter().filter(|c| c.in_cycle).count()
    }

    fn event_loop(&mut self, start_ns: u64) -> Result<(), String> {
        let deadline = self.end_ns + self.cfg.drain_ns;
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        loop {
            let now = now_ns();
            while let Some(&Reverse((at, client, seq))) = self.timers.peek() {
                if at > now {
                    break;
                }
                self.timers.pop();
                if client == NO_CLIENT {
                    self.progress(at - start_ns);
                    self.schedule(NO_CLIENT, at + PROGRESS_EVERY_NS);
                } else if self.clients[client].timer_seq == seq {
                    self.on_timer(client, at);
                }
            }
            let now = now_ns();
            if now >= self.end_ns && self.busy_clients() == 0 {
                self.stats.drain_used_ns = now - self.end_ns;
                return Ok(());
            }
            if self.exhausted == self.clients.len() && self.busy_clients() == 0 {
                // --cycles: every client has done its share before the end.
                self.stats.measured_ns = now.saturating_sub(self.warm_end_ns);
                self.stats.drain_used_ns = 0;
                return Ok(());
            }
            if now >= deadline {
                self.stats.drain_used_ns = now - self.end_ns;
                self.abandon_open_cycles(now);
                return Ok(());
            }
            let next = self
                .timers
                .peek()
                .map_or(deadline, |t| t.0 .0)
                .min(deadline);
            self.arm(next.max(1));
            // SAFETY: events is a valid buffer of events.len() entries.
            let n = unsafe {
                libc::epoll_wait(
                    self.epfd.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as i32,
                    100,
                )
            };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(format!("epoll_wait: {err}"));
            }
            for ev in &events[..n as usize] {
                let (token, bits) = (ev.u64, ev.events);
                if token == TIMER_TOKEN {
                    let mut buf = [0u8; 8];
                    // SAFETY: reading 8 bytes into an 8-byte buffer from our timerfd.
                    unsafe { libc::read(self.tfd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
                    self.armed_ns = 0;
                    continue;
                }
                let idx = (token >> 32) as usize;
                let gen = token as u32;
                if idx >= self.clients.len()
                    || self.clients[idx].gen != gen
                    || self.clients[idx].stream.is_none()
                {
                    continue;
                }
                self.on_socket(idx, bits);
            }
        }
    }

    fn progress(&mut self, elapsed_ns: u64) {
        if self.cfg.progress {
            let open = self.busy_clients();
            match &self.progress_sink {
                ProgressSink::Print => print_tick(
                    self.cfg,
                    elapsed_ns,
                    &self.interval,
                    self.interval_cycles,
                    self.interval_errors,
                    open,
                ),
                ProgressSink::Send(tx) => {
                    // The printing thread may be gone only if the run is
                    // being torn down; a lost progress line is harmless then.
                    let _ = tx.send(Tick {
                        elapsed_ns,
                        hist: std::mem::replace(&mut self.interval, new_hist()),
                        cycles: self.interval_cycles,
                        errors: self.interval_errors,
                        open,
                    });
                }
            }
        }
        self.interval.reset();
        self.interval_cycles = 0;
        self.interval_errors = 0;
    }

    fn on_timer(&mut self, idx: usize, at_ns: u64) {
        match self.clients[idx].phase {
            Phase::Idle => self.start_cycle(idx, at_ns),
            Phase::Holding | Phase::Backoff => self.send_op(idx),
            _ => {}
        }
    }

    fn start_cycle(&mut self, idx: usize, intended_ns: u64) {
        if intended_ns >= self.end_ns || self.clients[idx].cycles_left == 0 {
            return;
        }
        self.clients[idx].cycles_left -= 1;
        if self.clients[idx].cycles_left == 0 {
            self.exhausted += 1;
        }
        let key = {
            let c = &mut self.clients[idx];
            self.picker.pick(&mut c.rng, c.id)
        };
        let c = &mut self.clients[idx];
        c.in_cycle = true;
        c.measured = intended_ns >= self.warm_end_ns;
        c.cycle_start_ns = intended_ns;
        // The attempt starts now, connect included (per-request mode).
        c.lock_first_send_ns = now_ns();
        c.registered = false;
        c.key = key;
        c.keybuf.clear();
        c.keybuf.extend_from_slice(self.cfg.key_prefix.as_bytes());
        c.keybuf.push(b':');
        c.keybuf.extend_from_slice(key.to_string().as_bytes());
        c.op = if self.cfg.mix == Mix::TryLock {
            Op::TryLock
        } else {
            Op::Lock
        };
        self.send_op(idx);
    }

    /// Write `clients[idx].op`, connecting first if needed.
    fn send_op(&mut self, idx: usize) {
        if self.clients[idx].stream.is_none() {
            self.connect(idx);
            return;
        }
        let now = now_ns();
        let c = &mut self.clients[idx];
        let op = c.op;
        c.codec.encode(op, &c.keybuf, &mut c.wbuf);
        c.phase = Phase::AwaitReply;
        let k = &self.keys[c.key as usize];
        match op {
            Op::Lock | Op::TryLock => {
                if !c.registered {
                    c.registered = true;
                    let waiters = k.waiters.fetch_add(1, Relaxed);
                    c.contended = waiters > 0 || k.holder.load(Relaxed) != NO_HOLDER;
                    c.waiting = true;
                    c.acquire_sent_ns = now;
                }
            }
            Op::Unlock => {
                if c.holding {
                    c.holding = false;
                    k.unhold(c.id);
                    // Before the write below: the next holder's grant, in
                    // whatever thread, is read after it.
                    k.last_release_ns.store(now, Relaxed);
                    if self.record_ops {
                        self.stats.ops.push(op_record(c, c.granted_ns, now));
                    }
                }
            }
        }
        self.flush(idx);
    }

    fn connect(&mut self, idx: usize) {
        self.stats.connects += 1;
        self.clients[idx].connect_start_ns = now_ns();
        match open_nonblocking(&self.addr) {
            Ok((stream, in_progress)) => {
                let c = &mut self.clients[idx];
                c.gen = c.gen.wrapping_add(1);
                let mut ev = libc::epoll_event {
                    events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET)
                        as u32,
                    u64: (idx as u64) << 32 | c.gen as u64,
                };
                // SAFETY: epfd and the stream's fd are valid; ev lives across the call.
                let rc = unsafe {
                    libc::epoll_ctl(
                        self.epfd.as_raw_fd(),
                        libc::EPOLL_CTL_ADD,
                        stream.as_raw_fd(),
                        &mut ev,
                    )
                };
                if rc < 0 {
                    let err = std::io::Error::last_os_error();
                    self.fail(idx, ErrKind::Connect, format!("epoll_ctl: {err}"));
                    return;
                }
                c.stream = Some(stream);
                c.rbuf.clear();
                c.wbuf.clear();
                c.wpos = 0;
                c.phase = Phase::Connecting;
                if !in_progress {
                    self.on_connected(idx);
                }
            }
            Err(e) => self.fail(idx, ErrKind::Connect, format!("connect {}: {e}", self.addr)),
        }
    }

    /// The TCP connect finished: start the TLS handshake, or the protocol.
    fn on_connected(&mut self, idx: usize) {
        if let Some(tls) = &self.tls {
            match ClientConnection::new(tls.config.clone(), tls.server_name.clone()) {
                Ok(conn) => {
                    let c = &mut self.clients[idx];
                    c.tls = Some(Box::new(conn));
                    c.phase = Phase::TlsHandshaking;
                    // The ClientHello; the rest on EPOLLIN / EPOLLOUT.
                    self.flush(idx);
                }
                Err(e) => self.fail(idx, ErrKind::Tls, format!("TLS: {e}")),
            }
            return;
        }
        self.on_ready(idx);
    }

    /// The connection is ready for the protocol (TCP connected; with TLS,
    /// the handshake done): time it, then greet or send the first request.
    fn on_ready(&mut self, idx: usize) {
        let c = &mut self.clients[idx];
        record(
            &mut self.stats.handshake,
            now_ns().saturating_sub(c.connect_start_ns),
        );
        if c.codec.start_connection(&mut c.wbuf) {
            c.phase = Phase::Handshaking;
            self.flush(idx);
        } else {
            self.send_op(idx);
        }
    }

    fn flush(&mut self, idx: usize) {
        let c = &mut self.clients[idx];
        let Some(stream) = c.stream.as_mut() else {
            return;
        };
        if let Some(tls) = c.tls.as_deref_mut() {
            if let Err(e) = tls_flush(tls, stream, &mut c.wbuf) {
                self.fail(idx, ErrKind::Io, e);
            }
            return;
        }
        while c.wpos < c.wbuf.len() {
            match stream.write(&c.wbuf[c.wpos..]) {
                Ok(0) => {
                    self.fail(idx, ErrKind::Io, "write returned 0".into());
                    return;
                }
                Ok(n) => c.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail(idx, ErrKind::Io, format!("write: {e}"));
                    return;
                }
            }
        }
        c.wbuf.clear();
        c.wpos = 0;
    }

    fn on_socket(&mut self, idx: usize, bits: u32) {
        if self.clients[idx].phase == Phase::Connecting {
            if bits & (libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP) as u32 == 0 {
                return;
            }
            let fd = self.clients[idx]
                .stream
                .as_ref()
                .map_or(-1, |s| s.as_raw_fd());
            match socket_error(fd) {
                Ok(()) => self.on_connected(idx),
                Err(e) => {
                    self.fail(idx, ErrKind::Connect, format!("connect {}: {e}", self.addr));
                    return;
                }
            }
        } else if bits & libc::EPOLLOUT as u32 != 0 {
            self.flush(idx);
        }
        if bits & (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
            self.on_readable(idx);
        }
    }

    fn on_readable(&mut self, idx: usize) {
        let mut eof = false;
        // The connection these bytes (and this EOF) came from. A reply can
        // close it and open the next one (per-request mode), and a server
        // that closes first sends its FIN right behind the answer: that EOF
        // belongs to the old connection, never to the new one.
        let gen = self.clients[idx].gen;
        if self.clients[idx].tls.is_some() {
            match self.tls_read(idx) {
                Some(e) => eof = e,
                None => return,
            }
        } else {
            let c = &mut self.clients[idx];
            let Some(stream) = c.stream.as_mut() else {
                return;
            };
            let mut buf = [0u8; 16384];
            loop {
                match stream.read(&mut buf) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => c.rbuf.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        self.fail(idx, ErrKind::Io, format!("read: {e}"));
                        return;
                    }
                }
            }
        }
        while self.clients[idx].gen == gen && !self.clients[idx].rbuf.is_empty() {
            let c = &mut self.clients[idx];
            match c.phase {
                Phase::Handshaking => match c.codec.handshake(&mut c.rbuf, &mut c.wbuf) {
                    Ok(true) => self.send_op(idx),
                    Ok(false) => {
                        self.flush(idx);
                        break;
                    }
                    Err(e) => {
                        self.fail(idx, ErrKind::Protocol, e);
                        return;
                    }
                },
                Phase::AwaitReply => {
                    let op = c.op;
                    match c.codec.decode(op, &mut c.rbuf) {
                        Ok(Some(reply)) => self.on_reply(idx, reply),
                        Ok(None) => break,
                        Err(e) => {
                            self.fail(idx, ErrKind::Protocol, e);
                            return;
                        }
                    }
                }
                other => {
                    let n = c.rbuf.len();
                    self.fail(
                        idx,
                        ErrKind::Protocol,
                        format!("{n} unexpected bytes while {other:?}"),
                    );
                    return;
                }
            }
        }
        if eof && self.clients[idx].gen == gen && self.clients[idx].stream.is_some() {
            match self.clients[idx].phase {
                Phase::TlsHandshaking => self.fail(
                    idx,
                    ErrKind::Tls,
                    "TLS handshake: connection closed by the server".into(),
                ),
                Phase::Connecting | Phase::Handshaking | Phase::AwaitReply => {
                    self.fail(idx, ErrKind::Io, "connection closed by the server".into())
                }
                _ => self.close(idx),
            }
        }
    }

    /// TLS: read what the socket has (until it would block), decrypt it,
    /// append the plaintext to `rbuf`, send what the handshake or an alert
    /// needs, and move on to the protocol when the handshake has just
    /// finished. `Some(eof)`, or `None` when the connection failed (closed).
    fn tls_read(&mut self, idx: usize) -> Option<bool> {
        let c = &mut self.clients[idx];
        let (Some(stream), Some(tls)) = (c.stream.as_mut(), c.tls.as_deref_mut()) else {
            return Some(false);
        };
        let mut eof = false;
        let result = loop {
            match tls.read_tls(stream) {
                Ok(0) => eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => break Err((ErrKind::Io, format!("read: {e}"))),
            }
            match tls.process_new_packets() {
                Ok(state) => {
                    let n = state.plaintext_bytes_to_read();
                    if n > 0 {
                        let old = c.rbuf.len();
                        c.rbuf.resize(old + n, 0);
                        if let Err(e) = tls.reader().read_exact(&mut c.rbuf[old..]) {
                            break Err((ErrKind::Tls, format!("TLS read: {e}")));
                        }
                    }
                    if state.peer_has_closed() {
                        eof = true;
                    }
                }
                Err(e) => {
                    // rustls queued an alert for the server: best effort.
                    let _ = tls.write_tls(stream);
                    let during = if tls.is_handshaking() {
                        "TLS handshake"
                    } else {
                        "TLS"
                    };
                    break Err((ErrKind::Tls, format!("{during}: {e}")));
                }
            }
            if eof {
                break Ok(());
            }
        };
        if let Err((kind, msg)) = result {
            self.fail(idx, kind, msg);
            return None;
        }
        let gen = c.gen;
        if tls.wants_write() {
            // The handshake's next flight, an alert, a key update.
            self.flush(idx);
            if self.clients[idx].gen != gen {
                return None;
            }
        }
        let c = &self.clients[idx];
        let done = c.phase == Phase::TlsHandshaking
            && c.tls.as_deref().is_some_and(|t| !t.is_handshaking());
        if done {
            self.on_ready(idx);
            if self.clients[idx].gen != gen {
                return None;
            }
        }
        Some(eof)
    }

    fn close(&mut self, idx: usize) {
        let c = &mut self.clients[idx];
        if let (Some(mut tls), Some(stream)) = (c.tls.take(), c.stream.as_mut()) {
            if !tls.is_handshaking() {
                // A clean end of the TLS session, best effort (one write).
                tls.send_close_notify();
                let _ = tls.write_tls(stream);
            }
        }
        // Dropping the stream closes the socket, which also removes it from epoll.
        c.stream = None;
        c.gen = c.gen.wrapping_add(1);
        c.rbuf.clear();
        c.wbuf.clear();
        c.wpos = 0;
    }

    fn on_reply(&mut self, idx: usize, reply: Reply) {
        let now = now_ns();
        let per_request = self.cfg.conn_mode == ConnMode::PerRequest;
        let op = self.clients[idx].op;
        match (op, reply) {
            (Op::Lock | Op::TryLock, Reply::Granted) => {
                let c = &mut self.clients[idx];
                let k = &self.keys[c.key as usize];
                if c.waiting {
                    c.waiting = false;
                    k.unwait();
                }
                k.holder.store(c.id as u32, Relaxed);
                c.holding = true;
                c.granted_ns = now;
                if c.measured {
                    let st = &mut self.stats;
                    st.grants += 1;
                    st.grants_per_client[c.id] += 1;
                    st.record_lock(&mut self.interval, c.cycle_start_ns, now, self.log_samples);
                    if self.record_ops {
                        let role = if c.writer {
                            &mut st.lock_writers
                        } else {
                            &mut st.lock_readers
                        };
                        record(role, now - c.cycle_start_ns);
                    }
                    record(&mut st.lock_uncorrected, now - c.lock_first_send_ns);
                    if c.contended {
                        record(&mut st.queue_wait, now - c.lock_first_send_ns);
                        let released_ns = k.last_release_ns.load(Relaxed);
                        if released_ns > c.lock_first_send_ns {
                            record(&mut st.handoff, now.saturating_sub(released_ns));
                        }
                    }
                }
                c.op = Op::Unlock;
                c.unlock_due_ns = now + self.cfg.hold_ns;
                if per_request {
                    self.close(idx);
                }
                if self.cfg.hold_ns > 0 {
                    self.clients[idx].phase = Phase::Holding;
                    let due = self.clients[idx].unlock_due_ns;
                    self.schedule(idx, due);
                } else {
                    self.send_op(idx);
                }
            }
            (Op::Lock, Reply::Retry) => {
                if self.clients[idx].measured {
                    self.stats.retries += 1;
                }
                if per_request {
                    self.close(idx);
                }
                let c = &mut self.clients[idx];
                c.phase = Phase::Backoff;
                let base = self.cfg.retry_backoff_ns;
                let jitter = if base > 0 { c.rng.below(base) } else { 0 };
                self.schedule(idx, now + base / 2 + jitter);
            }
            (Op::TryLock, Reply::Busy) => {
                let c = &mut self.clients[idx];
                let k = &self.keys[c.key as usize];
                if c.waiting {
                    c.waiting = false;
                    k.unwait();
                }
                if c.measured {
                    self.stats.busy += 1;
                    self.stats.record_lock(
                        &mut self.interval,
                        c.cycle_start_ns,
                        now,
                        self.log_samples,
                    );
                    record(&mut self.stats.lock_uncorrected, now - c.lock_first_send_ns);
                }
                if per_request {
                    self.close(idx);
                }
                self.end_cycle(idx, now, false);
            }
            (Op::Unlock, r @ (Reply::Released | Reply::NotHeld)) => {
                let c = &self.clients[idx];
                if c.measured {
                    record(&mut self.stats.unlock, now.saturating_sub(c.unlock_due_ns));
                    record(&mut self.stats.cycle, now - c.cycle_start_ns);
                    if r == Reply::NotHeld {
                        self.stats.errors.not_held += 1;
                        self.interval_errors += 1;
                    }
                }
                if per_request {
                    self.close(idx);
                }
                self.end_cycle(idx, now, false);
            }
            (_, Reply::Error(e)) => {
                let c = &mut self.clients[idx];
                c.holding = false;
                if c.measured {
                    self.stats.errors.server += 1;
                    self.interval_errors += 1;
                }
                self.stats.note_error(format!("{op:?}: {e}"));
                self.release_bookkeeping(idx);
                if per_request {
                    self.close(idx);
                }
                self.end_cycle(idx, now, true);
            }
            (op, r) => self.fail(
                idx,
                ErrKind::Protocol,
                format!("reply {r:?} does not answer {op:?}"),
            ),
        }
    }

    /// Forget any waiter/holder registration of this client's current
    /// cycle (its connection is given up, or the server refused the
    /// Acquire). With `--writers` the Acquire's record is kept: never
    /// granted, or released now (a session hold ends with its connection).
    fn release_bookkeeping(&mut self, idx: usize) {
        let now = now_ns();
        let c = &mut self.clients[idx];
        let k = &self.keys[c.key as usize];
        if c.waiting {
            c.waiting = false;
            k.unwait();
            if self.record_ops {
                self.stats.ops.push(op_record(c, NOT_GRANTED, 0));
            }
        }
        if c.holding {
            c.holding = false;
            k.unhold(c.id);
            if self.record_ops {
                self.stats.ops.push(op_record(c, c.granted_ns, now));
            }
        }
    }

    fn fail(&mut self, idx: usize, kind: ErrKind, msg: String) {
        let now = now_ns();
        if self.clients[idx].in_cycle && self.clients[idx].measured {
            let e = &mut self.stats.errors;
            match kind {
                ErrKind::Connect => e.connect += 1,
                ErrKind::Tls => e.tls += 1,
                ErrKind::Io => e.io += 1,
                ErrKind::Protocol => e.protocol += 1,
            }
            self.interval_errors += 1;
        }
        self.stats.note_error(msg);
        self.release_bookkeeping(idx);
        self.close(idx);
        if self.clients[idx].in_cycle {
            self.end_cycle(idx, now, true);
        }
    }

    fn end_cycle(&mut self, idx: usize, now: u64, failed: bool) {
        if self.cfg.conn_mode == ConnMode::PerCycle {
            self.close(idx);
        }
        let c = &mut self.clients[idx];
        if !failed {
            self.stats.cycles_all += 1;
            if c.measured {
                self.stats.cycles += 1;
                self.interval_cycles += 1;
            }
        }
        c.in_cycle = false;
        c.phase = Phase::Idle;
        let mut next = if c.period_ns > 0 {
            c.cycle_start_ns + c.period_ns
        } else {
            now
        };
        if failed {
            next = next.max(now + ERROR_PAUSE_NS);
        }
        if next < self.end_ns && c.cycles_left > 0 {
            if next <= now && !failed {
                // Closed loop, or open loop running behind: start right away
                // rather than after a trip through the timer queue (that
                // trip would be the load generator's latency, not the server's).
                self.start_cycle(idx, next);
            } else {
                self.schedule(idx, next);
            }
        } else if self.cfg.conn_mode == ConnMode::Persistent {
            self.close(idx);
        }
    }

    fn abandon_open_cycles(&mut self, now: u64) {
        let open = self
            .clients
            .iter()
            .filter(|c| c.in_cycle && c.measured)
            .count();
        if open > 0 {
            self.stats.note_error(format!(
                "{open} cycles still open when the drain time ran out"
            ));
        }
        for idx in 0..self.clients.len() {
            let c = &self.clients[idx];
            if c.in_cycle && c.measured {
                self.stats.errors.incomplete += 1;
                if c.op != Op::Unlock {
                    // Not granted yet: its lock latency is at least this long.
                    record(&mut self.stats.lock, now - c.cycle_start_ns);
                    if self.log_samples {
                        self.stats
                            .samples
                            .push((c.cycle_start_ns, now - c.cycle_start_ns));
                    }
                }
            }
            if self.clients[idx].in_cycle {
                self.release_bookkeeping(idx);
            }
            self.close(idx);
        }
    }
}

/// The [`OpRecord`] of client `c`'s current Acquire.
fn op_record(c: &Client, granted_ns: u64, released_ns: u64) -> OpRecord {
    OpRecord {
        sent_ns: c.acquire_sent_ns,
        granted_ns,
        released_ns,
        key: c.key,
        writer: c.writer,
        measured: c.measured,
    }
}

#[derive(Clone, Copy)]
enum ErrKind {
    Connect,
    Tls,
    Io,
    Protocol,
}

/// CPU time used so far by this process (`RUSAGE_SELF`) or this thread
/// (`RUSAGE_THREAD`): (user, system) seconds.
fn cpu_s(who: libc::c_int) -> (f64, f64) {
    // SAFETY: rusage is plain old data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is a valid, writable rusage.
    unsafe { libc::getrusage(who, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(ru.ru_utime), secs(ru.ru_stime))
}

/// Start a non-blocking TCP connect with TCP_NODELAY. Returns the stream and
/// whether the connect is still in progress.
fn open_nonblocking(addr: &SocketAddr) -> std::io::Result<(TcpStream, bool)> {
    let (family, storage, len) = sockaddr(addr);
    // SAFETY: plain socket calls; the fd is wrapped in a TcpStream right away
    // so it is closed on every path.
    unsafe {
        let fd = libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let one: libc::c_int = 1;
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let rc = libc::connect(fd, (&storage as *const libc::sockaddr_storage).cast(), len);
        if rc == 0 {
            return Ok((stream, false));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINPROGRESS) {
            Ok((stream, true))
        } else {
            Err(err)
        }
    }
}

/// Hand what the codec wrote (`wbuf`, emptied) to rustls, then write the
/// TLS records rustls has until the socket would block (the edge-triggered
/// `EPOLLOUT` calls again when there is room).
fn tls_flush(
    tls: &mut ClientConnection,
    stream: &mut TcpStream,
    wbuf: &mut Vec<u8>,
) -> Result<(), String> {
    if !wbuf.is_empty() {
        // Encrypted into rustls' own buffer: never blocks.
        tls.writer()
            .write_all(wbuf)
            .map_err(|e| format!("TLS write: {e}"))?;
        wbuf.clear();
    }
    while tls.wants_write() {
        match tls.write_tls(stream) {
            Ok(0) => return Err("write returned 0".into()),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("write: {e}")),
        }
    }
    Ok(())
}

fn socket_error(fd: RawFd) -> std::io::Result<()> {
    let mut err: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: err/len are valid out-parameters for SO_ERROR.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut err as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if err != 0 {
        return Err(std::io::Error::from_raw_os_error(err));
    }
    Ok(())
}

fn sockaddr(addr: &SocketAddr) -> (libc::c_int, libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            (
                libc::AF_INET,
                storage,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            (
                libc::AF_INET6,
                storage,
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        }
    }
}
