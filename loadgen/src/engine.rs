//! The load engine: one thread, one epoll instance, one timerfd, and a state
//! machine per client.
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
//!
//! Only cycles whose intended start lies in `[warmup_end, end)` are recorded;
//! cycles still open at `end` get `drain` time to finish, and the ones that
//! do not are counted as `incomplete` errors (never silently dropped).
//!
//! Ownership: the engine owns every socket; a client's `gen` changes on every
//! new connection so a stale epoll event for a closed socket is ignored.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

use hdrhistogram::Histogram;

use crate::config::{Config, ConnMode, Mix};
use crate::dist::{KeyPicker, Rng};
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
        self.server + self.connect + self.io + self.protocol + self.not_held + self.incomplete
    }
}

pub struct Stats {
    pub lock: Histogram<u64>,
    pub lock_uncorrected: Histogram<u64>,
    pub unlock: Histogram<u64>,
    pub cycle: Histogram<u64>,
    pub queue_wait: Histogram<u64>,
    pub handoff: Histogram<u64>,
    pub cycles: u64,
    pub grants: u64,
    pub busy: u64,
    pub retries: u64,
    pub connects: u64,
    pub errors: Errors,
    pub first_error: Option<String>,
    pub grants_per_client: Vec<u64>,
    /// Length of the measured window.
    pub measured_ns: u64,
    /// Time from the end of the window until the last open cycle finished.
    pub drain_used_ns: u64,
    /// CPU time the load generator itself used (user, system), seconds.
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Between cycles, waiting for the next intended start.
    Idle,
    Connecting,
    Handshaking,
    AwaitReply,
    /// Inside the critical section, waiting for the hold to end.
    Holding,
    /// Redis spin: waiting to retry SET NX.
    Backoff,
}

struct Client {
    id: usize,
    stream: Option<TcpStream>,
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
}

#[derive(Clone, Copy, Default)]
struct KeyState {
    holder: Option<u32>,
    waiters: u32,
    last_release_ns: u64,
}

struct Engine<'a> {
    cfg: &'a Config,
    addr: SocketAddr,
    epfd: RawFd,
    tfd: RawFd,
    armed_ns: u64,
    timers: BinaryHeap<Reverse<(u64, usize, u64)>>,
    clients: Vec<Client>,
    keys: Vec<KeyState>,
    picker: KeyPicker,
    stats: Stats,
    warm_end_ns: u64,
    end_ns: u64,
    interval: Histogram<u64>,
    interval_cycles: u64,
    interval_errors: u64,
}

/// Run the configured load and return what it measured.
pub fn run(cfg: &Config) -> Result<Stats, String> {
    let addr = cfg.target.resolve()?;
    // SAFETY: plain syscalls on fresh descriptors we own; checked below.
    let (epfd, tfd) = unsafe {
        // Timers fire when asked, not up to 50 µs later (default timer slack).
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
        (
            libc::epoll_create1(libc::EPOLL_CLOEXEC),
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            ),
        )
    };
    if epfd < 0 || tfd < 0 {
        return Err(format!(
            "epoll/timerfd: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: TIMER_TOKEN,
    };
    // SAFETY: epfd and tfd are valid descriptors; ev lives across the call.
    if unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, tfd, &mut ev) } < 0 {
        return Err(format!(
            "epoll_ctl timerfd: {}",
            std::io::Error::last_os_error()
        ));
    }
    let nkeys = cfg.keys as usize;
    let per_client_rate = cfg.rate_per_s / cfg.connections as f64;
    let period_ns = if per_client_rate > 0.0 {
        (1e9 / per_client_rate).round().max(1.0) as u64
    } else {
        0
    };
    let mut seed_rng = Rng::new(cfg.seed);
    let clients = (0..cfg.connections)
        .map(|id| Client {
            id,
            stream: None,
            gen: 0,
            phase: Phase::Idle,
            op: Op::Lock,
            codec: new_codec(
                &cfg.target,
                id,
                cfg.lock_ttl_ms,
                cfg.conn_mode == ConnMode::Persistent,
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
            period_ns,
            timer_seq: 0,
            rng: Rng::new(seed_rng.next_u64()),
        })
        .collect();
    let start = now_ns() + 1_000_000;
    let mut e = Engine {
        cfg,
        addr,
        epfd,
        tfd,
        armed_ns: 0,
        timers: BinaryHeap::new(),
        clients,
        keys: vec![KeyState::default(); nkeys],
        picker: KeyPicker::new(cfg.dist.clone(), cfg.keys),
        stats: Stats {
            lock: new_hist(),
            lock_uncorrected: new_hist(),
            unlock: new_hist(),
            cycle: new_hist(),
            queue_wait: new_hist(),
            handoff: new_hist(),
            cycles: 0,
            grants: 0,
            busy: 0,
            retries: 0,
            connects: 0,
            errors: Errors::default(),
            first_error: None,
            grants_per_client: vec![0; cfg.connections],
            measured_ns: cfg.duration_ns,
            drain_used_ns: 0,
            cpu_user_s: 0.0,
            cpu_sys_s: 0.0,
        },
        warm_end_ns: start + cfg.warmup_ns,
        end_ns: start + cfg.warmup_ns + cfg.duration_ns,
        interval: new_hist(),
        interval_cycles: 0,
        interval_errors: 0,
    };
    // Spread the first arrivals over one period so clients do not fire in lockstep.
    for i in 0..cfg.connections {
        let offset = if period_ns > 0 {
            period_ns * i as u64 / cfg.connections as u64
        } else {
            0
        };
        e.schedule(i, start + offset);
    }
    e.schedule(NO_CLIENT, start + PROGRESS_EVERY_NS);
    let result = e.event_loop(start);
    // SAFETY: both descriptors are ours and no longer used.
    unsafe {
        libc::close(e.tfd);
        libc::close(e.epfd);
    }
    result?;
    let (user, sys) = own_cpu_s();
    e.stats.cpu_user_s = user;
    e.stats.cpu_sys_s = sys;
    Ok(e.stats)
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
                self.tfd,
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
                libc::epoll_wait(self.epfd, events.as_mut_ptr(), events.len() as i32, 100)
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
                    unsafe { libc::read(self.tfd, buf.as_mut_ptr().cast(), 8) };
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
            let phase = if elapsed_ns <= self.cfg.warmup_ns {
                "warmup"
            } else {
                "run"
            };
            let p = |q: f64| self.interval.value_at_quantile(q) as f64 / 1e3;
            eprintln!(
                "[{:6.1}s {phase:>6}] cycles/s={:<8} lock p50={:.1}us p99={:.1}us max={:.1}us errors={} open={}",
                elapsed_ns as f64 / 1e9,
                self.interval_cycles,
                p(0.5),
                p(0.99),
                self.interval.max() as f64 / 1e3,
                self.interval_errors,
                self.busy_clients(),
            );
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
        if intended_ns >= self.end_ns {
            return;
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
        let k = &mut self.keys[c.key as usize];
        match op {
            Op::Lock | Op::TryLock => {
                if !c.registered {
                    c.registered = true;
                    c.contended = k.holder.is_some() || k.waiters > 0;
                    k.waiters += 1;
                    c.waiting = true;
                }
            }
            Op::Unlock => {
                if c.holding {
                    c.holding = false;
                    if k.holder == Some(c.id as u32) {
                        k.holder = None;
                    }
                    k.last_release_ns = now;
                }
            }
        }
        self.flush(idx);
    }

    fn connect(&mut self, idx: usize) {
        self.stats.connects += 1;
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
                    libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, stream.as_raw_fd(), &mut ev)
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

    fn on_connected(&mut self, idx: usize) {
        let c = &mut self.clients[idx];
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
        {
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
        while !self.clients[idx].rbuf.is_empty() {
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
        if eof && self.clients[idx].stream.is_some() {
            match self.clients[idx].phase {
                Phase::Connecting | Phase::Handshaking | Phase::AwaitReply => {
                    self.fail(idx, ErrKind::Io, "connection closed by the server".into())
                }
                _ => self.close(idx),
            }
        }
    }

    fn close(&mut self, idx: usize) {
        let c = &mut self.clients[idx];
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
                let k = &mut self.keys[c.key as usize];
                if c.waiting {
                    c.waiting = false;
                    k.waiters = k.waiters.saturating_sub(1);
                }
                k.holder = Some(c.id as u32);
                c.holding = true;
                if c.measured {
                    let st = &mut self.stats;
                    st.grants += 1;
                    st.grants_per_client[c.id] += 1;
                    record(&mut st.lock, now - c.cycle_start_ns);
                    record(&mut self.interval, now - c.cycle_start_ns);
                    record(&mut st.lock_uncorrected, now - c.lock_first_send_ns);
                    if c.contended {
                        record(&mut st.queue_wait, now - c.lock_first_send_ns);
                        if k.last_release_ns > c.lock_first_send_ns {
                            record(&mut st.handoff, now - k.last_release_ns);
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
                let k = &mut self.keys[c.key as usize];
                if c.waiting {
                    c.waiting = false;
                    k.waiters = k.waiters.saturating_sub(1);
                }
                if c.measured {
                    self.stats.busy += 1;
                    record(&mut self.stats.lock, now - c.cycle_start_ns);
                    record(&mut self.interval, now - c.cycle_start_ns);
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
                if self.stats.first_error.is_none() {
                    self.stats.first_error = Some(format!("{op:?}: {e}"));
                }
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

    /// Forget any waiter/holder registration of this client's current cycle.
    fn release_bookkeeping(&mut self, idx: usize) {
        let c = &mut self.clients[idx];
        let k = &mut self.keys[c.key as usize];
        if c.waiting {
            c.waiting = false;
            k.waiters = k.waiters.saturating_sub(1);
        }
        if c.holding {
            c.holding = false;
            if k.holder == Some(c.id as u32) {
                k.holder = None;
            }
        }
    }

    fn fail(&mut self, idx: usize, kind: ErrKind, msg: String) {
        let now = now_ns();
        if self.clients[idx].in_cycle && self.clients[idx].measured {
            let e = &mut self.stats.errors;
            match kind {
                ErrKind::Connect => e.connect += 1,
                ErrKind::Io => e.io += 1,
                ErrKind::Protocol => e.protocol += 1,
            }
            self.interval_errors += 1;
        }
        if self.stats.first_error.is_none() {
            self.stats.first_error = Some(msg);
        }
        self.release_bookkeeping(idx);
        self.close(idx);
        if self.clients[idx].in_cycle {
            self.end_cycle(idx, now, true);
        }
    }

    fn end_cycle(&mut self, idx: usize, now: u64, failed: bool) {
        let c = &mut self.clients[idx];
        if c.measured && !failed {
            self.stats.cycles += 1;
            self.interval_cycles += 1;
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
        if next < self.end_ns {
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
        if open > 0 && self.stats.first_error.is_none() {
            self.stats.first_error = Some(format!(
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
                }
            }
            self.close(idx);
        }
    }
}

#[derive(Clone, Copy)]
enum ErrKind {
    Connect,
    Io,
    Protocol,
}

/// CPU time this process has used so far: (user, system) seconds.
fn own_cpu_s() -> (f64, f64) {
    // SAFETY: rusage is plain old data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
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
