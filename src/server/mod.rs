//! The event loop: one thread, one io_uring, no async runtime.
//!
//! # Tick order
//! 1. `submit_and_wait`, with a timeout of at most the heartbeat interval
//!    (so an idle loop still proves it is alive), shorter while a partial
//!    frame is pending (to enforce the frame read timeout);
//! 2. drain every CQE into a local array — no handler runs inside the drain;
//! 3. dispatch each completion: accepts, receives (decode → lock table →
//!    effects), sends, closes, signals, log writes;
//! 4. apply the table's effects in order: grants and releases become log
//!    records (durable mode) and replies go into each connection's output,
//!    gated on the log sequence number they depend on;
//! 5. close the log batch and submit its write+fdatasync (durable mode);
//! 6. flush every connection whose output is not gated (one send each);
//! 7. expire frames that did not complete within the read timeout.
//!
//! # Connection rules
//! - A recv is kept armed on every connection, so a hang-up (EOF or error)
//!   is seen at once: a queued waiter is withdrawn, and a grant whose `+`
//!   has not been handed to the kernel yet is released again.
//! - One request at a time: the next frame is decoded only after the
//!   previous answer was completely written.
//! - Bad input answers `-` and closes; it never reaches the lock table.

mod conn;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use io_uring::{opcode, types, IoUring};

use crate::config::{Config, LOCK_RECV_BUF, RING_ENTRIES};
use crate::core::{Effect, Effects, LockMode, Name, Now, Reply, Table, Token};
use crate::io::{self as ring_io, Op};
use crate::log::Level;
use crate::metrics::{self, Metrics};
use crate::protocol::{self, admin, Action, Decoded};
use crate::wal::{self, CompactPhase, Flight, Wal};
use conn::{Conn, Port};
use std::collections::VecDeque;

/// How to take back the in-memory effect of a log record that never became
/// durable (DURABILITY.md rule 4).
#[derive(Clone, Copy, Debug)]
enum Undo {
    Acquire { key: Name, grant_id: u64 },
    Release { prev: crate::core::HeldKey },
}

// Steps of the log's linked SQE chains (the `slot` field of user_data).
const STEP_APPEND_WRITE: u32 = 0;
const STEP_APPEND_SYNC: u32 = 1;
const STEP_REWRITE_WRITE: u32 = 2;
const STEP_REWRITE_SYNC: u32 = 3;
const STEP_RENAME: u32 = 4;
const STEP_DIR_SYNC: u32 = 5;
const STEP_COMPACT_WRITE: u32 = 6;
const STEP_COMPACT_SYNC: u32 = 7;
const STEP_FINISH_WRITE: u32 = 8;
const STEP_FINISH_SYNC: u32 = 9;
const STEP_FINISH_RENAME: u32 = 10;
const STEP_FINISH_DIR_SYNC: u32 = 11;

/// The answer sent to connections refused over the limit.
static REFUSED: [u8; 1] = [b'-'];

pub struct Server {
    cfg: Config,
    ring: IoUring,
    lock_listener: TcpListener,
    admin_listener: TcpListener,
    signal_fd: RawFd,
    signal_buf: Box<libc::signalfd_siginfo>,
    conns: Vec<Conn>,
    free_slots: Vec<u32>,
    open_conns: usize,
    table: Table,
    fx: Effects,
    fx_spare: Effects,
    dirty: Vec<u32>,
    partial: crate::core::list::List,
    metrics: Arc<Metrics>,
    cqes: Vec<(u64, i32, u32)>,
    stopping: bool,
    now: Now,
    last_oldest_ms: u64,
    wal: Option<Wal>,
    /// Limit refusals are logged at most once per second.
    limit_log_after_us: u64,
    /// Connections whose answer waits for the log: `(lsn, token)`, FIFO.
    held: VecDeque<(u64, Token)>,
    /// Undo journal of records not yet durable: `(lsn, undo)`, FIFO.
    undo: VecDeque<(u64, Undo)>,
}

fn now() -> Now {
    let mut mono = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let mut wall = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointers to stack timespecs; these clocks always exist.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut mono);
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut wall);
    }
    Now {
        mono_us: mono.tv_sec as u64 * 1_000_000 + mono.tv_nsec as u64 / 1000,
        unix_ms: wall.tv_sec as u64 * 1000 + wall.tv_nsec as u64 / 1_000_000,
    }
}

fn bind(addr: SocketAddr, what: &str) -> io::Result<TcpListener> {
    // std sets SO_REUSEADDR on Unix listeners; the backlog is the kernel's cap.
    let l = TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot bind {what} port {addr}: {e}")))?;
    // Accepted sockets inherit TCP_NODELAY from the listener on Linux: our
    // one-byte answers must never wait for Nagle.
    let one: libc::c_int = 1;
    // SAFETY: valid fd and option pointer/length.
    unsafe {
        libc::setsockopt(
            l.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &one as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        );
    }
    Ok(l)
}

fn peer_of(fd: RawFd) -> SocketAddr {
    // SAFETY: sockaddr_storage is large enough for any address family; the
    // kernel writes at most `len` bytes.
    unsafe {
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if libc::getpeername(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) != 0 {
            return SocketAddr::from(([0, 0, 0, 0], 0));
        }
        match ss.ss_family as i32 {
            libc::AF_INET => {
                let a = &*(&ss as *const _ as *const libc::sockaddr_in);
                SocketAddr::from((
                    u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                    u16::from_be(a.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let a = &*(&ss as *const _ as *const libc::sockaddr_in6);
                SocketAddr::from((a.sin6_addr.s6_addr, u16::from_be(a.sin6_port)))
            }
            _ => SocketAddr::from(([0, 0, 0, 0], 0)),
        }
    }
}

/// Every connection is a file descriptor: raise the soft RLIMIT_NOFILE to
/// what `max_connections` needs (up to the hard limit), and lower
/// `max_connections` with a warning when the hard limit is smaller, so the
/// server refuses connections cleanly (`-`) instead of failing accepts.
fn fit_fd_limit(cfg: &mut Config) {
    // Listeners, signalfd, log, directory, temp file, metrics, stdio.
    const RESERVED: u64 = 64;
    let want = cfg.max_connections as u64 + RESERVED;
    // SAFETY: get/setrlimit on a stack struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return;
        }
        if r.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want.min(r.rlim_max),
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r.rlim_cur = raised.rlim_cur;
            }
        }
        if r.rlim_cur < want {
            let fit = r.rlim_cur.saturating_sub(RESERVED).max(1) as usize;
            log!(
                Level::Warn,
                "limit_lowered",
                "limit=max_connections from={} to={} reason=\"RLIMIT_NOFILE is {}\"",
                cfg.max_connections,
                fit,
                r.rlim_cur
            );
            cfg.max_connections = fit;
        }
    }
}

fn block_signals() -> io::Result<RawFd> {
    // SAFETY: plain signal-mask manipulation on a zeroed set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }
}

fn build_ring(max_conns: usize) -> io::Result<IoUring> {
    // Every connection can have a recv and a send outstanding.
    let cq = (2 * max_conns + 1024)
        .max(2 * RING_ENTRIES as usize)
        .next_power_of_two() as u32;
    let mut b = IoUring::builder();
    b.setup_cqsize(cq)
        .setup_single_issuer()
        .setup_defer_taskrun();
    match b.build(RING_ENTRIES) {
        Ok(r) => Ok(r),
        // Older kernels lack DEFER_TASKRUN: fall back to a plain ring.
        Err(_) => IoUring::builder().setup_cqsize(cq).build(RING_ENTRIES),
    }
}

impl Server {
    /// Binds both ports and prepares the ring; nothing is served yet.
    pub fn bind(mut cfg: Config, metrics: Arc<Metrics>) -> io::Result<Server> {
        fit_fd_limit(&mut cfg);
        let lock_listener = bind(cfg.bind, "lock")?;
        let admin_listener = bind(cfg.admin_bind, "admin")?;
        let ring = build_ring(cfg.max_connections)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot create io_uring: {e}")))?;
        let mut table = Table::new(crate::core::Limits {
            max_keys: cfg.max_keys,
            max_waiters: cfg.max_waiters,
        });
        let wal = match &cfg.data_path {
            None => None,
            Some(path) => {
                let faults = match &cfg.faults {
                    Some(spec) => wal::Faults::parse(spec).map_err(|e| {
                        io::Error::new(io::ErrorKind::InvalidInput, format!("RINGLOCK_FAULTS: {e}"))
                    })?,
                    None => wal::Faults::default(),
                };
                let started = std::time::Instant::now();
                let (w, rec) = Wal::open(path, &mut table, cfg.wal_truncate_at, now(), faults)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let mut w = w;
                w.compact_floor_bytes = cfg.compact_floor_bytes;
                let us = started.elapsed().as_micros() as u64;
                metrics.set_recovery_us(us);
                log!(
                    Level::Info,
                    "recovery",
                    "path={} records={} held_keys={} file_bytes={} torn_tail_bytes={} truncated_at={} duration_us={}",
                    crate::log::path(path),
                    rec.records,
                    rec.held,
                    rec.file_bytes,
                    rec.torn_bytes,
                    rec.truncated_at.map_or("none".to_string(), |o| o.to_string()),
                    us
                );
                if rec.torn_bytes > 0 {
                    log!(
                        Level::Warn,
                        "torn_tail_dropped",
                        "path={} bytes={}",
                        crate::log::path(path),
                        rec.torn_bytes
                    );
                }
                if let Some(o) = rec.truncated_at {
                    log!(
                        Level::Warn,
                        "corrupt_tail_truncated",
                        "path={} offset={} by=operator",
                        crate::log::path(path),
                        o
                    );
                }
                Some(w)
            }
        };
        let signal_fd = block_signals()?;
        Ok(Server {
            ring,
            lock_listener,
            admin_listener,
            signal_fd,
            // SAFETY: signalfd_siginfo is plain old data; all-zero is valid.
            signal_buf: Box::new(unsafe { std::mem::zeroed() }),
            conns: Vec::with_capacity(cfg.max_connections.min(65_536)),
            free_slots: Vec::with_capacity(cfg.max_connections.min(65_536)),
            open_conns: 0,
            table,
            fx: Vec::with_capacity(1024),
            fx_spare: Vec::with_capacity(1024),
            dirty: Vec::with_capacity(1024),
            partial: crate::core::list::List::new(),
            metrics,
            cqes: Vec::with_capacity(4096),
            stopping: false,
            now: now(),
            last_oldest_ms: 0,
            wal,
            limit_log_after_us: 0,
            held: VecDeque::with_capacity(cfg.max_connections.min(65_536)),
            undo: VecDeque::with_capacity(4096),
            cfg,
        })
    }

    pub fn lock_addr(&self) -> SocketAddr {
        self.lock_listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The configuration in force (limits may have been fitted at bind).
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn table(&self) -> &Table {
        &self.table
    }

    fn push(&mut self, sqe: io_uring::squeue::Entry) {
        // SAFETY: every SQE built in this module references either a
        // connection's heap buffer (owned by the slot until the op's final
        // completion: slots are only recycled when no op is in flight), a
        // 'static buffer, or the boxed signal buffer owned by `self`.
        unsafe { ring_io::push(&mut self.ring, &sqe) }
    }

    /// Ensures `n` free submission queue entries (submitting if needed).
    fn reserve_sq(&mut self, n: usize) {
        loop {
            let sq = self.ring.submission();
            if sq.capacity() - sq.len() >= n {
                return;
            }
            drop(sq);
            match self.ring.submit() {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EINTR)) => {
                    std::thread::yield_now()
                }
                Err(e) => panic!("io_uring submit failed: {e}"),
            }
        }
    }

    fn arm_accept(&mut self, port: Port) {
        let (fd, op) = match port {
            Port::Lock => (self.lock_listener.as_raw_fd(), Op::AcceptLock),
            Port::Admin => (self.admin_listener.as_raw_fd(), Op::AcceptAdmin),
        };
        let sqe = opcode::AcceptMulti::new(types::Fd(fd))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(ring_io::encode(op, 0, 0));
        self.push(sqe);
    }

    fn arm_signal(&mut self) {
        let buf = &mut *self.signal_buf as *mut libc::signalfd_siginfo as *mut u8;
        let sqe = opcode::Read::new(
            types::Fd(self.signal_fd),
            buf,
            std::mem::size_of::<libc::signalfd_siginfo>() as u32,
        )
        .build()
        .user_data(ring_io::encode(Op::Signal, 0, 0));
        self.push(sqe);
    }

    /// Serves until SIGINT/SIGTERM. Returns after queued waiters were
    /// answered `-`.
    pub fn run(&mut self) -> io::Result<()> {
        self.arm_accept(Port::Lock);
        self.arm_accept(Port::Admin);
        self.arm_signal();
        // Recovery may have restored held keys: publish before serving.
        self.publish_gauges();
        self.metrics.set_ready();
        while !self.stopping {
            self.wait()?;
            self.now = now();
            self.metrics.loop_heartbeat(0, self.now.mono_us / 1000);
            self.drain();
            let mut cqes = std::mem::take(&mut self.cqes);
            for &(ud, res, flags) in &cqes {
                self.dispatch(ud, res, flags);
            }
            cqes.clear();
            self.cqes = cqes;
            self.apply_effects();
            self.expire_frames();
            self.wal_tick();
            self.flush();
            self.publish_gauges();
        }
        self.shutdown();
        Ok(())
    }

    fn wait(&mut self) -> io::Result<()> {
        let t = now().mono_us;
        let frame_us = self.partial.front().map(|slot| {
            let c = &self.conns[slot as usize];
            let deadline = c.partial_since_us + self.cfg.frame_timeout_ms * 1000;
            deadline.saturating_sub(t).max(1000)
        });
        let retry_us = self
            .wal
            .as_ref()
            .filter(|w| w.broken && w.flight == Flight::None)
            .map(|w| w.retry_at_us.saturating_sub(t).max(1000));
        let timeout_us = match (frame_us, retry_us) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Wake at least every heartbeat interval, idle or not: liveness reads the heartbeat.
        let beat_us = crate::config::HEARTBEAT_INTERVAL_MS * 1000;
        let timeout_us = Some(timeout_us.map_or(beat_us, |t: u64| t.min(beat_us)));
        let r = match timeout_us {
            None => self.ring.submit_and_wait(1),
            Some(us) => {
                let ts = types::Timespec::new()
                    .sec(us / 1_000_000)
                    .nsec(((us % 1_000_000) * 1000) as u32);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        match r {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("io_uring_enter failed: {e}"),
            )),
        }
    }

    fn drain(&mut self) {
        for cqe in self.ring.completion() {
            self.cqes.push((cqe.user_data(), cqe.result(), cqe.flags()));
        }
    }

    fn token(&self, slot: u32) -> Token {
        ((self.conns[slot as usize].gen as u64) << 32) | slot as u64
    }

    /// The live connection a token names, if it still exists.
    fn conn_of(&self, token: Token) -> Option<u32> {
        let slot = token as u32;
        let c = self.conns.get(slot as usize)?;
        (c.live && c.gen == (token >> 32) as u32).then_some(slot)
    }

    fn dispatch(&mut self, ud: u64, res: i32, flags: u32) {
        let Some((op, gen, slot)) = ring_io::decode(ud) else {
            panic!("completion with unknown user_data {ud:#x} (res {res})");
        };
        match op {
            Op::AcceptLock | Op::AcceptAdmin => {
                let port = if op == Op::AcceptLock {
                    Port::Lock
                } else {
                    Port::Admin
                };
                if res >= 0 {
                    self.accepted(port, res);
                } else if (res != -libc::ECANCELED || !self.stopping)
                    && self.now.mono_us >= self.limit_log_after_us
                {
                    // Rate-limited: a persistent error (EMFILE) repeats per
                    // pending connection.
                    self.limit_log_after_us = self.now.mono_us + 1_000_000;
                    log!(
                        Level::Warn,
                        "accept_error",
                        "port={:?} errno={} error=\"{}\"",
                        port,
                        -res,
                        crate::log::Escaped(io::Error::from_raw_os_error(-res))
                    );
                }
                if !io_uring::cqueue::more(flags) && !self.stopping {
                    self.arm_accept(port);
                }
            }
            // A cancel request references no buffer: the slot may already
            // have been recycled (its recv's final completion came first),
            // so its own completion carries nothing to check or do.
            Op::Cancel | Op::Close | Op::Refuse | Op::Ignore => {}
            Op::Recv | Op::Send => {
                let Some(c) = self.conns.get(slot as usize) else {
                    panic!("{op:?} completion for slot {slot} that never existed");
                };
                if c.gen != gen {
                    panic!(
                        "{op:?} completion for slot {slot} gen {gen}, slot is at gen {}",
                        c.gen
                    );
                }
                if op == Op::Recv {
                    self.on_recv(slot, res);
                } else {
                    self.on_send(slot, res);
                }
            }
            Op::Signal => {
                if res > 0 {
                    log!(
                        Level::Info,
                        "signal",
                        "signo={} action=shutdown",
                        self.signal_buf.ssi_signo
                    );
                    self.stopping = true;
                } else {
                    self.arm_signal();
                }
            }
            Op::WalWrite | Op::WalSync => self.on_wal(slot, res),
        }
    }

    fn accepted(&mut self, port: Port, fd: RawFd) {
        if self.open_conns >= self.cfg.max_connections || self.stopping {
            self.metrics.connection_refused();
            if self.now.mono_us >= self.limit_log_after_us {
                self.limit_log_after_us = self.now.mono_us + 1_000_000;
                log!(
                    Level::Warn,
                    "limit_reached",
                    "limit=max_connections value={}",
                    self.cfg.max_connections
                );
            }
            // Answer `-` and close, linked so the close waits for the send.
            let send = opcode::Send::new(types::Fd(fd), REFUSED.as_ptr(), 1)
                .build()
                .flags(io_uring::squeue::Flags::IO_LINK)
                .user_data(ring_io::encode(Op::Refuse, 0, 0));
            let close = opcode::Close::new(types::Fd(fd))
                .build()
                .user_data(ring_io::encode(Op::Refuse, 0, 0));
            self.push(send);
            self.push(close);
            return;
        }
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.conns.push(Conn::new());
                (self.conns.len() - 1) as u32
            }
        };
        self.conns[slot as usize].open(fd, port);
        log!(
            Level::Debug,
            "accept",
            "slot={} gen={} fd={} port={:?}",
            slot,
            self.conns[slot as usize].gen,
            fd,
            port
        );
        self.open_conns += 1;
        self.arm_recv(slot);
    }

    fn arm_recv(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        debug_assert!(!c.recv_inflight && !c.closing);
        let cap = match c.port {
            Port::Lock => LOCK_RECV_BUF,
            Port::Admin => {
                // The admin buffer grows (admin path only) up to the largest
                // command; at least 4 KiB free for each receive.
                if c.rbuf.capacity() - c.rbuf.len() < 4096 {
                    c.rbuf.reserve(4096);
                }
                c.rbuf.capacity()
            }
        };
        let len = c.rbuf.len();
        if len >= cap {
            // A client that keeps sending while its request is outstanding.
            self.violation(slot, "receive buffer full while a request is outstanding");
            return;
        }
        // SAFETY: the spare capacity of rbuf is heap memory owned by this
        // slot; rbuf is neither grown nor truncated while the recv is in
        // flight (`recv_inflight`), and the slot is not recycled before the
        // recv's final completion.
        let ptr = unsafe { c.rbuf.as_mut_ptr().add(len) };
        let want = (cap - len) as u32;
        c.recv_inflight = true;
        let gen = c.gen;
        let sqe = opcode::Recv::new(types::Fd(c.fd), ptr, want)
            .build()
            .user_data(ring_io::encode(Op::Recv, gen, slot));
        self.push(sqe);
    }

    fn on_recv(&mut self, slot: u32, res: i32) {
        log!(
            Level::Debug,
            "recv",
            "slot={} gen={} res={}",
            slot,
            self.conns[slot as usize].gen,
            res
        );
        self.conns[slot as usize].recv_inflight = false;
        if res > 0 {
            let c = &mut self.conns[slot as usize];
            // SAFETY: the kernel initialised `res` bytes past the old length,
            // within the capacity handed to the recv.
            unsafe { c.rbuf.set_len(c.rbuf.len() + res as usize) };
            if c.closing {
                self.maybe_close(slot);
                return;
            }
            self.pump(slot);
            let c = &self.conns[slot as usize];
            if !c.closing && !c.recv_inflight {
                self.arm_recv(slot);
            }
            self.maybe_close(slot);
            return;
        }
        match -res {
            0 => self.hang_up(slot),
            libc::EINTR | libc::EAGAIN if !self.conns[slot as usize].closing => self.arm_recv(slot),
            libc::ECANCELED => {}
            libc::ECONNRESET | libc::EPIPE | libc::ETIMEDOUT | libc::EHOSTUNREACH => {
                self.hang_up(slot)
            }
            e => {
                log!(
                    Level::Warn,
                    "recv_error",
                    "errno={} peer={}",
                    e,
                    PeerFmt(&self.conns[slot as usize])
                );
                self.hang_up(slot);
            }
        }
        self.maybe_close(slot);
    }

    fn on_send(&mut self, slot: u32, res: i32) {
        log!(
            Level::Debug,
            "send",
            "slot={} gen={} res={}",
            slot,
            self.conns[slot as usize].gen,
            res
        );
        let c = &mut self.conns[slot as usize];
        c.send_inflight = false;
        if res >= 0 {
            c.sent += res as usize;
            if c.sent < c.sending.len() {
                // Short write: send the rest.
                self.submit_send(slot);
                return;
            }
            c.sending.clear();
            c.sent = 0;
            if c.grant_in_flight {
                // The `+` is in the kernel's hands: the grant is delivered.
                c.grant = None;
                c.grant_in_flight = false;
            }
            if c.reply_done_after_send {
                c.reply_done_after_send = false;
                c.outstanding = false;
            }
            if c.close_after_send && c.out.is_empty() {
                self.begin_close(slot);
            } else if !c.closing {
                // The previous answer is out: the next buffered frame may go.
                self.pump(slot);
                let c = &self.conns[slot as usize];
                if !c.out.is_empty() {
                    self.mark_dirty(slot);
                }
            }
        } else {
            match -res {
                libc::EINTR | libc::EAGAIN => {
                    self.submit_send(slot);
                    return;
                }
                libc::EPIPE | libc::ECONNRESET | libc::ECANCELED => {}
                e => log!(Level::Warn, "send_error", "errno={} peer={}", e, PeerFmt(c)),
            }
            // The peer is gone: a `+` in this send was not delivered.
            let c = &mut self.conns[slot as usize];
            c.grant_in_flight = false;
            c.sending.clear();
            c.sent = 0;
            self.hang_up(slot);
        }
        self.maybe_close(slot);
    }

    /// Decodes and executes buffered frames while no request is outstanding.
    fn pump(&mut self, slot: u32) {
        loop {
            let c = &self.conns[slot as usize];
            if c.outstanding || c.closing || c.close_after_send || c.rbuf.is_empty() {
                break;
            }
            let port = c.port;
            let progressed = match port {
                Port::Lock => self.pump_lock(slot),
                Port::Admin => self.pump_admin(slot),
            };
            if !progressed {
                break;
            }
        }
        // Frame read timeout bookkeeping: a partial frame starts the clock.
        let c = &self.conns[slot as usize];
        let partial = !c.outstanding && !c.rbuf.is_empty() && !c.closing && !c.close_after_send;
        let linked = c.partial_link.linked;
        if partial && !linked {
            self.conns[slot as usize].partial_since_us = self.now.mono_us;
            self.partial.push_back(&mut self.conns, slot, 0);
        } else if !partial && linked {
            self.partial.unlink(&mut self.conns, slot, 0);
        }
    }

    /// The connection's peer address (looked up once, on first use).
    fn peer(&mut self, slot: u32) -> SocketAddr {
        let c = &mut self.conns[slot as usize];
        *c.peer.get_or_insert_with(|| peer_of(c.fd))
    }

    /// Executes one lock-port frame; false when more bytes are needed.
    fn pump_lock(&mut self, slot: u32) -> bool {
        let token = self.token(slot);
        let (action, key, mut source, len) = match protocol::decode(&self.conns[slot as usize].rbuf)
        {
            Decoded::Incomplete => return false,
            Decoded::Bad(why) => {
                log!(
                    Level::Debug,
                    "bad_frame",
                    "peer={} reason=\"{}\"",
                    PeerFmt(&self.conns[slot as usize]),
                    crate::log::Escaped(why)
                );
                self.metrics
                    .request(metrics::Action::Lock, metrics::Outcome::Error);
                self.reject(slot);
                return false;
            }
            // Sizes were validated by the decoder (1..=127 / 0..=127).
            Decoded::Frame { req, len } => (
                req.action,
                Name::new(req.key).expect("decoder bounds keys to 127 bytes"),
                Name::new(req.source).expect("decoder bounds sources to 127 bytes"),
                len,
            ),
        };
        // The peer address is needed to record a holder's endpoint and to
        // resolve an empty source (the peer IP); Unlock and ResetByKey never
        // pay for the lookup.
        let needs_peer = matches!(action, Action::Lock | Action::TryLock) || source.is_empty();
        let peer = if needs_peer {
            self.peer(slot)
        } else {
            SocketAddr::from(([0, 0, 0, 0], 0))
        };
        if source.is_empty() {
            // Formatted once per connection, not per request.
            let c = &mut self.conns[slot as usize];
            source = *c.peer_ip.get_or_insert_with(|| ip_name(&peer));
        }
        self.conns[slot as usize].rbuf.drain(..len);
        self.conns[slot as usize].outstanding = true;
        let now = self.now;
        let fx = &mut self.fx;
        match action {
            Action::Lock | Action::TryLock => {
                let mode = if action == Action::Lock {
                    LockMode::Blocking
                } else {
                    LockMode::Try
                };
                let w = self.table.lock(token, &key, &source, peer, mode, now, fx);
                self.conns[slot as usize].waiter = w;
            }
            Action::Unlock => self.table.unlock(token, &key, now, fx),
            Action::ResetByKey => {
                self.metrics.reset(false);
                log!(
                    Level::Info,
                    "reset",
                    "by=key key={:?} peer={}",
                    key,
                    PeerFmt(&self.conns[slot as usize])
                );
                self.table.reset_by_key(Some(token), &key, now, fx)
            }
            Action::ResetBySource => {
                self.metrics.reset(true);
                log!(
                    Level::Info,
                    "reset",
                    "by=source source={:?} peer={}",
                    source,
                    PeerFmt(&self.conns[slot as usize])
                );
                self.table.reset_by_source(Some(token), &source, now, fx)
            }
        }
        self.conns[slot as usize].action = Some(action);
        self.apply_effects();
        true
    }

    /// Executes one admin command; false when more bytes are needed.
    fn pump_admin(&mut self, slot: u32) -> bool {
        let peer = self.peer(slot);
        let c = &self.conns[slot as usize];
        let (cmd, count, len) = match admin::decode(&c.rbuf) {
            admin::Decoded::Incomplete => {
                if c.rbuf.len() >= admin::FRAME_MAX {
                    self.reject(slot);
                }
                return false;
            }
            admin::Decoded::Bad(why) => {
                log!(
                    Level::Warn,
                    "bad_admin_command",
                    "peer={} reason=\"{}\"",
                    peer,
                    crate::log::Escaped(why)
                );
                self.reject(slot);
                return false;
            }
            admin::Decoded::Frame { cmd, count, len } => (cmd, count, len),
        };
        let token = self.token(slot);
        let now = self.now;
        let mut out = std::mem::take(&mut self.conns[slot as usize].out);
        match cmd {
            admin::Command::Keys => {
                self.metrics
                    .request(metrics::Action::AdminKeys, metrics::Outcome::Ok);
                admin::encode_keys(&self.table.held_list(), &mut out);
            }
            admin::Command::Rset => {
                self.metrics
                    .request(metrics::Action::AdminRset, metrics::Outcome::Ok);
                let body = &self.conns[slot as usize].rbuf[8..len];
                for name in admin::names(body) {
                    let key = Name::new(name).expect("admin decoder bounds names to 127 bytes");
                    self.metrics.reset(false);
                    log!(
                        Level::Info,
                        "operator_reset",
                        "by=key key={:?} peer={}",
                        key,
                        peer
                    );
                    self.table.reset_by_key(None, &key, now, &mut self.fx);
                    out.push(b'+');
                }
                out.push(b'+');
            }
            admin::Command::Rsbs => {
                self.metrics
                    .request(metrics::Action::AdminRsbs, metrics::Outcome::Ok);
                let mut sources: Vec<Name> = admin::names(&self.conns[slot as usize].rbuf[8..len])
                    .map(|n| Name::new(n).expect("admin decoder bounds names to 127 bytes"))
                    .collect();
                if count == 0 {
                    sources.push(ip_name(&peer));
                }
                for s in &sources {
                    self.metrics.reset(true);
                    log!(
                        Level::Info,
                        "operator_reset",
                        "by=source source={:?} peer={}",
                        s,
                        peer
                    );
                    self.table.reset_by_source(None, s, now, &mut self.fx);
                    out.push(b'+');
                }
                out.push(b'+');
            }
        }
        let c = &mut self.conns[slot as usize];
        c.out = out;
        c.rbuf.drain(..len);
        c.outstanding = true;
        c.reply_done_after_send = true;
        let _ = token;
        self.apply_effects();
        self.gate(slot);
        true
    }

    /// Bad input: answer `-`, then close. Nothing reached the lock table.
    fn reject(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        c.rbuf.clear();
        c.out.push(b'-');
        c.close_after_send = true;
        self.mark_dirty(slot);
        self.cancel_recv(slot);
    }

    /// A protocol violation on a connection that may have a waiter queued.
    fn violation(&mut self, slot: u32, why: &str) {
        log!(
            Level::Warn,
            "protocol_violation",
            "peer={} reason=\"{}\"",
            PeerFmt(&self.conns[slot as usize]),
            crate::log::Escaped(why)
        );
        self.hang_up(slot);
    }

    fn mark_dirty(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(slot);
        }
    }

    /// Applies the table's effects in order (they may cascade: releasing an
    /// undeliverable grant can grant the next waiter).
    fn apply_effects(&mut self) {
        while !self.fx.is_empty() {
            let batch = std::mem::replace(&mut self.fx, std::mem::take(&mut self.fx_spare));
            for e in &batch {
                self.apply(e);
            }
            let mut batch = batch;
            batch.clear();
            self.fx_spare = batch;
        }
    }

    fn apply(&mut self, e: &Effect) {
        match *e {
            Effect::LimitReached { limit } => {
                // At most one line per second: a flood of refusals must not
                // turn into a flood of log lines.
                if self.now.mono_us >= self.limit_log_after_us {
                    self.limit_log_after_us = self.now.mono_us + 1_000_000;
                    log!(
                        Level::Warn,
                        "limit_reached",
                        "limit={} max_keys={} max_waiters={} held_keys={} queued={}",
                        limit.name(),
                        self.cfg.max_keys,
                        self.cfg.max_waiters,
                        self.table.held_keys(),
                        self.table.queued_waiters()
                    );
                }
            }
            Effect::Reply { conn, reply } => {
                let outcome = match reply {
                    Reply::Ok => metrics::Outcome::Ok,
                    Reply::Busy => metrics::Outcome::Busy,
                    Reply::Err => metrics::Outcome::Error,
                };
                if let Some(slot) = self.conn_of(conn) {
                    let action = self.conns[slot as usize].action;
                    if let Some(a) = action {
                        self.metrics.request(metrics_action(a), outcome);
                    }
                    self.answer(slot, reply.byte(), None);
                }
            }
            Effect::Granted {
                conn,
                grant,
                waited_us,
            } => {
                if let Some(w) = self.wal.as_mut() {
                    let h = crate::core::HeldKey {
                        key: grant.key,
                        source: grant.source,
                        endpoint: grant.endpoint,
                        acquired_unix_ms: grant.acquired_unix_ms,
                        grant_id: grant.grant_id,
                    };
                    let lsn = w.append_acquire(&h);
                    self.undo.push_back((
                        lsn,
                        Undo::Acquire {
                            key: grant.key,
                            grant_id: grant.grant_id,
                        },
                    ));
                }
                self.metrics.grant();
                if let Some(us) = waited_us {
                    self.metrics.handoff();
                    self.metrics.observe_queue_wait_us(us);
                }
                match self
                    .conn_of(conn)
                    .filter(|&s| !self.conns[s as usize].closing)
                {
                    Some(slot) => {
                        if let Some(a) = self.conns[slot as usize].action {
                            self.metrics
                                .request(metrics_action(a), metrics::Outcome::Ok);
                        }
                        self.answer(slot, b'+', Some((grant.key_slot, grant.grant_id)));
                    }
                    None => {
                        // Nobody left to tell: give the key back at once.
                        self.metrics.undelivered_grant();
                        let now = self.now;
                        self.table
                            .release_grant(grant.key_slot, grant.grant_id, now, &mut self.fx);
                    }
                }
            }
            Effect::Released {
                key,
                grant_id,
                holder,
                held_us,
                ..
            } => {
                if let Some(w) = self.wal.as_mut() {
                    let lsn = w.append_release(&key, grant_id, &holder);
                    self.undo.push_back((lsn, Undo::Release { prev: holder }));
                }
                self.metrics.observe_hold_us(held_us);
            }
        }
    }

    /// Queues the one-byte answer to the connection's outstanding request.
    fn answer(&mut self, slot: u32, byte: u8, grant: Option<(u32, u64)>) {
        let c = &mut self.conns[slot as usize];
        c.waiter = None;
        c.out.push(byte);
        c.reply_done_after_send = true;
        if grant.is_some() {
            debug_assert!(
                c.grant.is_none(),
                "two grants outstanding on one connection"
            );
            c.grant = grant;
        }
        self.gate(slot);
    }

    /// Holds the connection's output until everything the log holds now is
    /// durable; a reply never reveals state that a crash could take back.
    fn gate(&mut self, slot: u32) {
        match self.wal.as_ref().filter(|w| w.pending()) {
            Some(w) => {
                let lsn = w.tail_lsn;
                let token = self.token(slot);
                self.conns[slot as usize].gate_lsn = lsn;
                self.held.push_back((lsn, token));
            }
            None => self.mark_dirty(slot),
        }
    }

    /// The connection hung up (EOF, error) or broke the protocol: withdraw
    /// its waiter, give back a grant it was never told about, close.
    fn hang_up(&mut self, slot: u32) {
        let now = self.now;
        let c = &mut self.conns[slot as usize];
        if c.closing {
            return;
        }
        log!(
            Level::Debug,
            "hang_up",
            "slot={} gen={} waiter={:?} grant={:?} grant_in_flight={} out={}",
            slot,
            c.gen,
            crate::log::Value(c.waiter),
            crate::log::Value(c.grant),
            c.grant_in_flight,
            c.out.len()
        );
        c.closing = true;
        if let Some(w) = c.waiter.take() {
            self.table.withdraw(w);
            self.metrics.hangup_withdrawal();
        }
        let c = &mut self.conns[slot as usize];
        if !c.grant_in_flight {
            if let Some((key_slot, grant_id)) = c.grant.take() {
                c.out.clear();
                self.metrics.undelivered_grant();
                self.table
                    .release_grant(key_slot, grant_id, now, &mut self.fx);
            }
        }
        let c = &mut self.conns[slot as usize];
        c.out.clear();
        if c.partial_link.linked {
            self.partial.unlink(&mut self.conns, slot, 0);
        }
        self.cancel_recv(slot);
        self.apply_effects();
    }

    fn cancel_recv(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        if c.recv_inflight && !c.cancel_submitted {
            c.cancel_submitted = true;
            let target = ring_io::encode(Op::Recv, c.gen, slot);
            let sqe = opcode::AsyncCancel::new(target)
                .build()
                .user_data(ring_io::encode(Op::Cancel, c.gen, slot));
            self.push(sqe);
        }
    }

    /// Stop reading and close once the pending answer (`-`) is written.
    fn begin_close(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        c.closing = true;
        if c.partial_link.linked {
            self.partial.unlink(&mut self.conns, slot, 0);
        }
        self.cancel_recv(slot);
    }

    /// Closes the socket and recycles the slot once no op references it.
    fn maybe_close(&mut self, slot: u32) {
        let c = &self.conns[slot as usize];
        if !c.live || !c.closing || c.recv_inflight || c.send_inflight {
            return;
        }
        if !c.out.is_empty() && !c.close_after_send {
            return;
        }
        if c.close_after_send && !c.out.is_empty() {
            // The `-` still has to go out; flush will send it.
            return;
        }
        let fd = c.fd;
        log!(
            Level::Debug,
            "close",
            "slot={} gen={} fd={}",
            slot,
            c.gen,
            fd
        );
        let sqe = opcode::Close::new(types::Fd(fd))
            .build()
            .user_data(ring_io::encode(Op::Close, 0, slot));
        self.push(sqe);
        let c = &mut self.conns[slot as usize];
        c.release();
        self.free_slots.push(slot);
        self.open_conns -= 1;
    }

    fn submit_send(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        debug_assert!(!c.send_inflight && c.sent < c.sending.len());
        // SAFETY: `sending` is not touched until this send's completion
        // (send_inflight), and the slot is not recycled before it.
        let ptr = unsafe { c.sending.as_ptr().add(c.sent) };
        let len = (c.sending.len() - c.sent) as u32;
        c.send_inflight = true;
        let sqe = opcode::Send::new(types::Fd(c.fd), ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(ring_io::encode(Op::Send, c.gen, slot));
        self.push(sqe);
    }

    /// One send per connection with output, unless a send is in flight.
    fn flush(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        for &slot in &dirty {
            let c = &mut self.conns[slot as usize];
            c.dirty = false;
            if !c.live || c.send_inflight || c.out.is_empty() {
                continue;
            }
            if let Some(w) = &self.wal {
                if c.gate_lsn > w.durable_lsn {
                    continue;
                }
            }
            if c.closing && !c.close_after_send {
                c.out.clear();
                continue;
            }
            std::mem::swap(&mut c.out, &mut c.sending);
            c.sent = 0;
            if c.grant.is_some() {
                c.grant_in_flight = true;
            }
            self.submit_send(slot);
        }
        dirty.clear();
        self.dirty = dirty;
        // Connections that closed with nothing left to send.
        // (maybe_close is driven by completions; nothing to do here.)
    }

    /// Closes the log batch: submits the next write+fdatasync (or a whole
    /// rewrite) when nothing is in flight. No timer: a lone record goes
    /// out in the same tick that produced it.
    fn wal_tick(&mut self) {
        let now_us = self.now.mono_us;
        let Some(w) = self.wal.as_mut() else { return };
        // A background compaction's finishing step goes first; during it
        // appends wait (new records belong to the new file).
        if let Some(c) = &w.compaction {
            if c.phase == CompactPhase::Finishing {
                return;
            }
            if c.phase == CompactPhase::Ready && !c.aborted && w.flight == Flight::None {
                w.start_finishing();
                self.submit_compaction();
                return;
            }
        }
        if w.flight != Flight::None {
            return;
        }
        if w.broken && now_us < w.retry_at_us {
            // The log cannot take records until it is rewritten: fail fast
            // rather than hold clients for an unknown time.
            if w.pending() {
                self.fail_pending("log is being rewritten after an I/O error", 0);
            }
            return;
        }
        if !w.pending() && !w.broken {
            return;
        }
        if w.should_rewrite() {
            if w.compaction.is_some() {
                // An abandoned compaction still owns the temp file until
                // its chain completes; the rewrite waits for it.
                if w.pending() {
                    self.fail_pending("log is being rewritten after an I/O error", 0);
                }
                return;
            }
            if let Err(e) = w.start_rewrite(&self.table, now_us) {
                log!(
                    Level::Error,
                    "wal_io_error",
                    "op=open_temp path={} error=\"{}\"",
                    crate::log::path(&w.path),
                    crate::log::Escaped(e)
                );
                self.metrics.wal_io_error();
                self.fail_pending("cannot open the rewrite file", 0);
                return;
            }
            w.log_compaction_start("blocking");
            self.submit_wal_chain();
            return;
        }
        if w.should_compact(now_us) {
            match w.start_compaction(&self.table, now_us) {
                Ok(()) => {
                    w.log_compaction_start("background");
                    self.submit_compaction();
                }
                Err(e) => {
                    log!(
                        Level::Warn,
                        "compaction_failed",
                        "op=open_temp path={} error=\"{}\" action=\"retrying in 1 s; the log itself is unaffected\"",
                        crate::log::path(&w.path),
                        crate::log::Escaped(e)
                    );
                    self.metrics.wal_io_error();
                    w.compact_retry_after_us = now_us + wal::REWRITE_RETRY_US;
                }
            }
        }
        let w = self.wal.as_mut().expect("a log");
        w.start_append(now_us);
        self.submit_wal_chain();
    }

    /// Submits the background compaction's current write: the snapshot
    /// (write → fdatasync) or the finishing step (write carry → fdatasync →
    /// rename → fsync directory), from where it stopped.
    fn submit_compaction(&mut self) {
        let w = self.wal.as_mut().expect("a log");
        let faults = &mut w.faults;
        let c = w.compaction.as_mut().expect("a compaction");
        let rest = c.buf.len() - c.written;
        let (len, no) = faults.write_len(rest);
        c.fail_injected = faults.compact_write_fails();
        c.short = len < rest || faults.write_will_fail(no) || c.fail_injected;
        c.write_no = no;
        c.inflight = true;
        let finishing = c.phase == CompactPhase::Finishing;
        let offset = if finishing { c.temp_len } else { 0 } + c.written as u64;
        // SAFETY: the compaction's buffer is neither touched nor
        // reallocated while `inflight` (until its chain's last completion).
        let ptr = unsafe { c.buf.as_ptr().add(c.written) };
        let fd = c.temp_fd;
        let (step_w, step_s) = if finishing {
            (STEP_FINISH_WRITE, STEP_FINISH_SYNC)
        } else {
            (STEP_COMPACT_WRITE, STEP_COMPACT_SYNC)
        };
        let alone = c.short;
        let link = io_uring::squeue::Flags::IO_LINK;
        let write = opcode::Write::new(types::Fd(fd), ptr, len as u32)
            .offset(offset)
            .build()
            .user_data(ring_io::encode(Op::WalWrite, 0, step_w));
        if alone {
            self.reserve_sq(1);
            self.push(write);
            return;
        }
        let sync = opcode::Fsync::new(types::Fd(fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(ring_io::encode(Op::WalSync, 0, step_s));
        self.reserve_sq(4);
        if !finishing {
            self.push(write.flags(link));
            self.push(sync);
            return;
        }
        let w = self.wal.as_ref().expect("a log");
        // SAFETY (paths): both C strings are owned by the Wal for its life.
        let rename = opcode::RenameAt::new(
            types::Fd(libc::AT_FDCWD),
            w.temp_path.as_ptr(),
            types::Fd(libc::AT_FDCWD),
            w.path_c.as_ptr(),
        )
        .build()
        .flags(link)
        .user_data(ring_io::encode(Op::WalSync, 0, STEP_FINISH_RENAME));
        let dir_sync = opcode::Fsync::new(types::Fd(w.dir_fd()))
            .build()
            .user_data(ring_io::encode(Op::WalSync, 0, STEP_FINISH_DIR_SYNC));
        self.push(write.flags(link));
        self.push(sync.flags(link));
        self.push(rename);
        self.push(dir_sync);
    }

    /// Completions of the background compaction's chains.
    fn on_compaction(&mut self, step: u32, res: i32) {
        let now = self.now;
        let w = self.wal.as_mut().expect("a log");
        let faults = &mut w.faults;
        let c = w
            .compaction
            .as_mut()
            .expect("compaction completion without a compaction");
        let concluded = match step {
            STEP_COMPACT_WRITE | STEP_FINISH_WRITE => {
                let mut res = faults.write_result(res, c.write_no);
                if c.fail_injected {
                    res = -libc::ENOSPC;
                }
                if res < 0 {
                    c.error.get_or_insert(res);
                } else {
                    c.written += res as usize;
                }
                c.short
            }
            STEP_COMPACT_SYNC | STEP_FINISH_SYNC => {
                let res = if res == -libc::ECANCELED {
                    res
                } else {
                    faults.fsync_result(res)
                };
                if res < 0 && res != -libc::ECANCELED {
                    c.error.get_or_insert(res);
                }
                step == STEP_COMPACT_SYNC
            }
            STEP_FINISH_RENAME => {
                if res >= 0 {
                    c.renamed = true;
                } else if res != -libc::ECANCELED {
                    c.error.get_or_insert(res);
                }
                false
            }
            _ => {
                if res < 0 && res != -libc::ECANCELED {
                    c.error.get_or_insert(res);
                }
                true
            }
        };
        if !concluded {
            return;
        }
        c.inflight = false;
        let finishing = c.phase == CompactPhase::Finishing;
        if c.aborted || c.error.is_some() {
            let err = c.error;
            let aborted = c.aborted;
            let c = w.compaction.take().expect("a compaction");
            // No op references the temp fd any more (the chain completed).
            w.discard_temp(c.temp_fd, c.renamed);
            if aborted {
                return;
            }
            let err = err.expect("an error");
            self.metrics.wal_io_error();
            if !finishing {
                // The old log is intact and complete: try again later.
                w.compact_retry_after_us = now.mono_us + wal::REWRITE_RETRY_US;
                log!(
                    Level::Warn,
                    "compaction_failed",
                    "path={} errno={} error=\"{}\" action=\"retrying in 1 s; the log itself is unaffected\"",
                    crate::log::path(&w.path),
                    -err,
                    crate::log::Escaped(io::Error::from_raw_os_error(-err))
                );
                return;
            }
            // The carried records were only in the new file.
            log!(
                Level::Error,
                "wal_io_error",
                "op=compaction path={} errno={} error=\"{}\" action=\"answering '-' to requests waiting for the log, rewriting it into a new file\"",
                crate::log::path(&w.path),
                -err,
                crate::log::Escaped(io::Error::from_raw_os_error(-err))
            );
            self.fail_pending("compaction's final write failed", -err);
            return;
        }
        if c.written < c.buf.len() {
            self.submit_compaction();
            return;
        }
        if !finishing {
            w.compaction_snapshot_done();
            return;
        }
        let (old, c) = w.finish_done();
        // The replaced log: its name now belongs to the new file.
        wal::retire(old);
        let took_us = now.mono_us.saturating_sub(c.started_us);
        self.metrics.wal_compaction();
        log!(
            Level::Info,
            "compaction_done",
            "path={} bytes={} held_keys={} carried_records={} duration_us={}",
            crate::log::path(&w.path),
            c.temp_len + c.buf.len() as u64,
            c.snapshot_records,
            c.carry_records,
            took_us
        );
        self.release_durable();
    }

    /// Sends every held answer whose records are now durable.
    fn release_durable(&mut self) {
        let durable = self.wal.as_ref().map_or(0, |w| w.durable_lsn);
        while let Some(&(lsn, _)) = self.undo.front() {
            if lsn > durable {
                break;
            }
            self.undo.pop_front();
        }
        while let Some(&(lsn, token)) = self.held.front() {
            if lsn > durable {
                break;
            }
            self.held.pop_front();
            if let Some(slot) = self.conn_of(token) {
                self.mark_dirty(slot);
            }
        }
    }

    /// Submits what is left of the in-flight batch as one linked chain:
    /// append: write → fdatasync; rewrite: write → fdatasync → rename →
    /// fsync(directory). A short write breaks the chain (the rest completes
    /// with -ECANCELED); the chain is then resubmitted from where it stopped.
    fn submit_wal_chain(&mut self) {
        let w = self.wal.as_mut().expect("a log");
        let rest = w.flight_buf.len() - w.flight_written;
        debug_assert!(rest > 0);
        let (len, no) = w.faults.write_len(rest);
        w.flight_write_no = no;
        // An injected fault must end the chain where the kernel ends it
        // after a real short or failed write (a short result breaks the
        // link): such a write goes alone, and its completion concludes.
        // Otherwise the fsync, and for a rewrite the rename, would run on
        // a half-written batch.
        w.flight_short = len < rest || w.faults.write_will_fail(no);
        let alone = w.flight_short;
        // SAFETY: flight_buf is owned by the Wal and is neither touched nor
        // reallocated until the chain's final completion (flight != None).
        let ptr = unsafe { w.flight_buf.as_ptr().add(w.flight_written) };
        let link = io_uring::squeue::Flags::IO_LINK;
        let (fd, offset, rewrite) = match w.flight {
            Flight::Append { .. } => (w.fd(), w.file_len + w.flight_written as u64, false),
            Flight::Rewrite { temp_fd, .. } => (temp_fd, w.flight_written as u64, true),
            Flight::None => unreachable!("submit without a flight"),
        };
        let (step_w, step_s) = if rewrite {
            (STEP_REWRITE_WRITE, STEP_REWRITE_SYNC)
        } else {
            (STEP_APPEND_WRITE, STEP_APPEND_SYNC)
        };
        let write = opcode::Write::new(types::Fd(fd), ptr, len as u32)
            .offset(offset)
            .build()
            .user_data(ring_io::encode(Op::WalWrite, 0, step_w));
        if alone {
            self.reserve_sq(1);
            self.push(write);
            return;
        }
        let write = write.flags(link);
        let sync = opcode::Fsync::new(types::Fd(fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(ring_io::encode(Op::WalSync, 0, step_s));
        // A linked chain must reach the kernel in one submission (a link
        // does not span submissions): make room for all of it first.
        self.reserve_sq(4);
        let w = self.wal.as_ref().expect("a log");
        if rewrite {
            let old = w.temp_path.as_ptr();
            let new = w.path_c.as_ptr();
            // SAFETY (paths): both C strings are owned by the Wal for its
            // whole life.
            let rename = opcode::RenameAt::new(
                types::Fd(libc::AT_FDCWD),
                old,
                types::Fd(libc::AT_FDCWD),
                new,
            )
            .build()
            .flags(link)
            .user_data(ring_io::encode(Op::WalSync, 0, STEP_RENAME));
            let dir_sync = opcode::Fsync::new(types::Fd(w.dir_fd()))
                .build()
                .user_data(ring_io::encode(Op::WalSync, 0, STEP_DIR_SYNC));
            self.push(write);
            self.push(sync.flags(link));
            self.push(rename);
            self.push(dir_sync);
        } else {
            let delay = self
                .wal
                .as_ref()
                .and_then(|w| w.faults.fsync_delay.as_deref())
                .map(|ts| ts as *const types::Timespec);
            self.push(write);
            if let Some(ts) = delay {
                // Test-only (RINGLOCK_FAULTS=fsync_delay_ms): a timeout
                // linked between the write and the fdatasync; ETIME counts
                // as success so the chain goes on.
                // SAFETY: the Timespec is boxed in the Wal's Faults for the
                // Wal's whole life.
                let t = opcode::Timeout::new(ts)
                    .flags(types::TimeoutFlags::ETIME_SUCCESS)
                    .build()
                    .flags(link)
                    .user_data(ring_io::encode(Op::Ignore, 0, 0));
                self.push(t);
            }
            self.push(sync);
        }
    }

    fn on_wal(&mut self, step: u32, res: i32) {
        if step >= STEP_COMPACT_WRITE {
            self.on_compaction(step, res);
            return;
        }
        let now = self.now;
        let w = self.wal.as_mut().expect("log completion without a log");
        match step {
            STEP_APPEND_WRITE | STEP_REWRITE_WRITE => {
                let no = w.flight_write_no;
                let res = w.faults.write_result(res, no);
                if res < 0 {
                    w.flight_error.get_or_insert(res);
                } else {
                    w.flight_written += res as usize;
                }
                if !w.flight_short {
                    return;
                }
                // A write submitted alone (injected fault): conclude here.
            }
            STEP_APPEND_SYNC | STEP_REWRITE_SYNC => {
                let res = if res == -libc::ECANCELED {
                    res
                } else {
                    w.faults.fsync_result(res)
                };
                if res < 0 && res != -libc::ECANCELED {
                    w.flight_error.get_or_insert(res);
                }
                if step == STEP_REWRITE_SYNC {
                    return;
                }
            }
            STEP_RENAME => {
                if res < 0 && res != -libc::ECANCELED {
                    w.flight_error.get_or_insert(res);
                }
                return;
            }
            STEP_DIR_SYNC => {
                if res < 0 && res != -libc::ECANCELED {
                    w.flight_error.get_or_insert(res);
                }
            }
            _ => panic!("unknown log step {step}"),
        }
        // The chain's last completion: conclude.
        if let Some(err) = w.flight_error {
            let op = match (step, w.flight) {
                (_, Flight::Rewrite { .. }) => "rewrite",
                _ => "append",
            };
            log!(
                Level::Error,
                "wal_io_error",
                "op={} path={} errno={} error=\"{}\" action=\"answering '-' to requests waiting for the log, rewriting it into a new file\"",
                op,
                crate::log::path(&w.path),
                -err,
                crate::log::Escaped(io::Error::from_raw_os_error(-err))
            );
            self.metrics.wal_io_error();
            self.fail_pending("log write or fdatasync failed", -err);
            return;
        }
        if w.flight_written < w.flight_buf.len() {
            // Short write: continue the chain where it stopped.
            self.submit_wal_chain();
            return;
        }
        let fsync_us = now.mono_us.saturating_sub(w.flight_started_us);
        let (records, bytes) = (w.flight_records, w.flight_buf.len() as u64);
        let rewrite = matches!(w.flight, Flight::Rewrite { .. });
        let old = w.flight_done();
        self.metrics.observe_fdatasync_us(fsync_us);
        self.metrics.observe_wal_batch(records, bytes);
        if rewrite {
            if let Some(old) = old {
                wal::retire(old); // the replaced log; its name is gone
            }
            self.metrics.wal_compaction();
            log!(
                Level::Info,
                "compaction_done",
                "path={} bytes={} held_keys={} duration_us={}",
                crate::log::path(
                    self.wal
                        .as_ref()
                        .map_or(std::path::Path::new(""), |w| &w.path)
                ),
                bytes,
                records,
                fsync_us
            );
        }
        self.release_durable();
    }

    /// DURABILITY.md rule 4: every record past the durable point is void.
    /// Requests waiting for them are answered `-`, their effects undone in
    /// reverse log order, and the log is marked for a rewrite into a fresh
    /// file (an fsync error leaves the page cache untrustworthy).
    fn fail_pending(&mut self, why: &str, errno: i32) {
        let now = self.now;
        let Some(w) = self.wal.as_mut() else { return };
        let durable_before = w.durable_lsn;
        if let Some(fd) = w.flight_failed(now.mono_us) {
            // The failed rewrite's chain has completed: nothing references
            // its temp fd any more.
            w.discard_temp(fd, false);
        }
        // A background compaction's snapshot may contain the voided
        // records' effects: abandon it (now, or when its chain completes).
        if let Some(c) = w.abort_compaction() {
            w.discard_temp(c.temp_fd, c.renamed);
        }
        let mut answered = 0u64;
        while let Some((lsn, token)) = self.held.pop_front() {
            debug_assert!(lsn > durable_before);
            if let Some(slot) = self.conn_of(token) {
                let c = &mut self.conns[slot as usize];
                c.out.clear();
                c.out.push(b'-');
                c.grant = None;
                c.gate_lsn = 0;
                answered += 1;
                self.mark_dirty(slot);
            }
        }
        let mut touched: Vec<Name> = Vec::new();
        while let Some((_, u)) = self.undo.pop_back() {
            match u {
                Undo::Acquire { key, grant_id } => {
                    self.table.undo_grant(&key, grant_id, now);
                    touched.push(key);
                }
                Undo::Release { prev } => {
                    // The key is free again here: later records were undone.
                    if !self.table.restore_holder(&prev, now) {
                        log!(
                            Level::Error,
                            "undo_failed",
                            "key={:?} reason=key_limit",
                            prev.key
                        );
                    }
                }
            }
        }
        log!(
            Level::Warn,
            "wal_records_voided",
            "reason=\"{}\" errno={} answered_minus={} undone_records={}",
            crate::log::Escaped(why),
            errno,
            answered,
            touched.len()
        );
        for key in &touched {
            self.table.settle(key, now, &mut self.fx);
        }
        if let Some(w) = self.wal.as_mut() {
            w.recount_live(&self.table);
        }
        // New grants from settling are new records for the rewritten log.
        self.apply_effects();
    }

    fn expire_frames(&mut self) {
        let limit_us = self.cfg.frame_timeout_ms * 1000;
        while let Some(slot) = self.partial.front() {
            let c = &self.conns[slot as usize];
            if c.partial_since_us + limit_us > self.now.mono_us {
                break;
            }
            self.metrics.frame_timeout();
            log!(
                Level::Debug,
                "frame_timeout",
                "peer={} bytes={}",
                PeerFmt(c),
                c.rbuf.len()
            );
            self.partial.unlink(&mut self.conns, slot, 0);
            self.reject(slot);
        }
    }

    fn publish_gauges(&mut self) {
        self.metrics.set_held_keys(self.table.held_keys() as u64);
        self.metrics
            .set_queued_waiters(self.table.queued_waiters() as u64);
        self.metrics.set_open_connections(self.open_conns as u64);
        let oldest = self.table.oldest_acquired_unix_ms().unwrap_or(0);
        if oldest != self.last_oldest_ms {
            self.last_oldest_ms = oldest;
            self.metrics.set_oldest_acquired_unix_ms(oldest);
        }
    }

    /// Graceful stop: no more accepts; every queued waiter is answered `-`
    /// (best effort, the socket buffers have room for one byte); exit.
    fn shutdown(&mut self) {
        let mut answered = 0;
        for slot in 0..self.conns.len() {
            let c = &mut self.conns[slot];
            if !c.live {
                continue;
            }
            if let Some(w) = c.waiter.take() {
                self.table.withdraw(w);
                // SAFETY: a live connection's fd is open; one-byte buffer.
                unsafe {
                    libc::send(
                        self.conns[slot].fd,
                        REFUSED.as_ptr() as *const libc::c_void,
                        1,
                        libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                    );
                }
                answered += 1;
            }
        }
        log!(
            Level::Info,
            "stopped",
            "answered_waiters={} held_keys={}",
            answered,
            self.table.held_keys()
        );
    }
}

/// Formats a connection's peer for a log line, looking it up if needed.
struct PeerFmt<'a>(&'a Conn);

impl std::fmt::Display for PeerFmt<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.peer {
            Some(p) => write!(f, "{p}"),
            None => write!(f, "{}", peer_of(self.0.fd)),
        }
    }
}

fn metrics_action(a: Action) -> metrics::Action {
    match a {
        Action::Lock => metrics::Action::Lock,
        Action::Unlock => metrics::Action::Unlock,
        Action::ResetByKey => metrics::Action::ResetByKey,
        Action::ResetBySource => metrics::Action::ResetBySource,
        Action::TryLock => metrics::Action::TryLock,
    }
}

/// The peer's IP address as a source name (an empty wire source).
fn ip_name(peer: &SocketAddr) -> Name {
    use std::io::Write;
    let mut buf = [0u8; 64];
    let mut cur = io::Cursor::new(&mut buf[..]);
    write!(cur, "{}", peer.ip()).expect("an IP address fits in 64 bytes");
    let n = cur.position() as usize;
    Name::new(&buf[..n]).expect("an IP address is shorter than 127 bytes")
}
