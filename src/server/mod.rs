//! The event loop: one thread, one io_uring, no async runtime.
//!
//! # Tick order
//! 1. `submit_and_wait` (with a timeout only while a partial frame is
//!    pending, to enforce the frame read timeout);
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
use crate::core::{Effect, Effects, LockMode, Name, Now, ReleaseCause, Reply, Table, Token};
use crate::io::{self as ring_io, Op};
use crate::log::Level;
use crate::metrics::{self, Metrics};
use crate::protocol::{self, admin, Action, Decoded};
use conn::{Conn, Port};

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
    pub fn bind(cfg: Config, metrics: Arc<Metrics>) -> io::Result<Server> {
        let lock_listener = bind(cfg.bind, "lock")?;
        let admin_listener = bind(cfg.admin_bind, "admin")?;
        let ring = build_ring(cfg.max_connections)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot create io_uring: {e}")))?;
        let signal_fd = block_signals()?;
        let table = Table::new(crate::core::Limits {
            max_keys: cfg.max_keys,
            max_waiters: cfg.max_waiters,
        });
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
        self.metrics.set_ready();
        while !self.stopping {
            self.wait()?;
            self.now = now();
            self.drain();
            let mut cqes = std::mem::take(&mut self.cqes);
            for &(ud, res, flags) in &cqes {
                self.dispatch(ud, res, flags);
            }
            cqes.clear();
            self.cqes = cqes;
            self.apply_effects();
            self.expire_frames();
            self.flush();
            self.publish_gauges();
        }
        self.shutdown();
        Ok(())
    }

    fn wait(&mut self) -> io::Result<()> {
        let timeout_us = self.partial.front().map(|slot| {
            let c = &self.conns[slot as usize];
            let deadline = c.partial_since_us + self.cfg.frame_timeout_ms * 1000;
            deadline.saturating_sub(now().mono_us).max(1000)
        });
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
                } else if res != -libc::ECANCELED || !self.stopping {
                    log!(
                        Level::Warn,
                        "accept_error",
                        "port={:?} errno={}",
                        port,
                        -res
                    );
                }
                if !io_uring::cqueue::more(flags) && !self.stopping {
                    self.arm_accept(port);
                }
            }
            Op::Recv | Op::Send | Op::Cancel => {
                let Some(c) = self.conns.get(slot as usize) else {
                    panic!("{op:?} completion for slot {slot} that never existed");
                };
                if c.gen != gen {
                    panic!(
                        "{op:?} completion for slot {slot} gen {gen}, slot is at gen {}",
                        c.gen
                    );
                }
                match op {
                    Op::Recv => self.on_recv(slot, res),
                    Op::Send => self.on_send(slot, res),
                    _ => {}
                }
            }
            Op::Close | Op::Refuse | Op::Ignore => {}
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
            Op::WalWrite | Op::WalSync => {
                panic!("log completion without a log (user_data {ud:#x})")
            }
        }
    }

    fn accepted(&mut self, port: Port, fd: RawFd) {
        if self.open_conns >= self.cfg.max_connections || self.stopping {
            self.metrics.connection_refused();
            log!(
                Level::Warn,
                "limit_reached",
                "limit=max_connections value={}",
                self.cfg.max_connections
            );
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
        let peer = peer_of(fd);
        self.conns[slot as usize].open(fd, port, peer);
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
                    self.conns[slot as usize].peer
                );
                self.hang_up(slot);
            }
        }
        self.maybe_close(slot);
    }

    fn on_send(&mut self, slot: u32, res: i32) {
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
                e => log!(Level::Warn, "send_error", "errno={} peer={}", e, c.peer),
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

    /// Executes one lock-port frame; false when more bytes are needed.
    fn pump_lock(&mut self, slot: u32) -> bool {
        let token = self.token(slot);
        let c = &self.conns[slot as usize];
        let peer = c.peer;
        let (action, key, source, len) = match protocol::decode(&c.rbuf) {
            Decoded::Incomplete => return false,
            Decoded::Bad(why) => {
                log!(
                    Level::Debug,
                    "bad_frame",
                    "peer={} reason=\"{}\"",
                    peer,
                    why
                );
                self.metrics
                    .request(metrics::Action::Lock, metrics::Outcome::Error);
                self.reject(slot);
                return false;
            }
            Decoded::Frame { req, len } => {
                // Sizes were validated by the decoder (1..=127 / 0..=127).
                let key = Name::new(req.key).expect("decoder bounds keys to 127 bytes");
                let mut source =
                    Name::new(req.source).expect("decoder bounds sources to 127 bytes");
                if source.is_empty() {
                    source = ip_name(&peer);
                }
                (req.action, key, source, len)
            }
        };
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
                self.table.reset_by_key(Some(token), &key, now, fx)
            }
            Action::ResetBySource => {
                self.metrics.reset(true);
                self.table.reset_by_source(Some(token), &source, now, fx)
            }
        }
        self.conns[slot as usize].action = Some(action);
        self.apply_effects();
        true
    }

    /// Executes one admin command; false when more bytes are needed.
    fn pump_admin(&mut self, slot: u32) -> bool {
        let c = &self.conns[slot as usize];
        let peer = c.peer;
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
                    why
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
        self.mark_dirty(slot);
        self.apply_effects();
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
            self.conns[slot as usize].peer,
            why
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
            Effect::Released { held_us, cause, .. } => {
                self.metrics.observe_hold_us(held_us);
                let _ = cause == ReleaseCause::Undelivered;
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
        self.mark_dirty(slot);
    }

    /// The connection hung up (EOF, error) or broke the protocol: withdraw
    /// its waiter, give back a grant it was never told about, close.
    fn hang_up(&mut self, slot: u32) {
        let now = self.now;
        let c = &mut self.conns[slot as usize];
        if c.closing {
            return;
        }
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
                c.peer,
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
