//! The io_uring driver: the only place with `unsafe` I/O. It owns every
//! file descriptor and every buffer lent to the kernel, turns completions
//! into shard events and shard commands into submissions.
//!
//! # Ownership
//! - A connection's receive buffer and send buffer are [`buf::Slot`]s: while
//!   an op runs they are [`buf::Lent`] (no accessor); the bytes come back
//!   only with the op's final completion. The shard never sees them: it
//!   gets received bytes as a slice copied into its own buffer, and its
//!   answers by swapping buffers ([`Shard::take_output`]).
//! - A log chain's buffer moves from the shard to the driver with the
//!   command and back with [`Shard::on_log_landed`].
//! - A socket is closed only when no op references it; only then does the
//!   shard hear [`Shard::on_closed`] and recycle the slot.
//!
//! # Tick
//! `submit_and_wait` (at most a heartbeat interval, so that an idle loop
//! still proves it is alive) → drain every CQE into a local array (no handler runs
//! inside the drain) → dispatch each as a shard event → `end_tick` (frame
//! expiry, log batch, durable answers) → execute the shard's commands.
//! `user_data` = op | generation | slot ([`user_data`]); 0 is never used.

pub mod buf;
mod conn;
pub mod faults;
mod logio;
pub mod mesh;
pub mod poll;
mod ring;
mod sys;
pub mod user_data;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use io_uring::{opcode, types, IoUring};

use crate::config::Config;
use crate::core::{Table, Token};
use crate::log::Level;
use crate::metrics::Metrics;
use crate::shard::conn::Port;
use crate::shard::{Cmd, Shard};
use crate::wal::log::{Chain, Log};
use crate::wal::plan::Stream;
use crate::wal::{self, LogFiles};
use buf::Slot;
use conn::DConn;
use faults::Faults;
use logio::LogIo;
use mesh::{MeshEnd, Msg};
use ring::build_ring;
use sys::{block_signals, fit_fd_limit, listen, now, pin_to};
use user_data::{self as ring_io, Op};

pub use sys::allowed_cpus;

/// One event loop: a shard and the io_uring that serves it, on one thread.
struct Loop {
    ring: IoUring,
    lock_listener: TcpListener,
    admin_listener: TcpListener,
    /// Only shard 0 reads the signalfd; it tells the others to stop.
    signal_fd: Option<RawFd>,
    signal_buf: Box<libc::signalfd_siginfo>,
    conns: Vec<DConn>,
    shard: Shard,
    log: Option<LogIo>,
    metrics: Arc<Metrics>,
    cqes: Vec<(u64, i32, u32)>,
    cmds: Vec<Cmd>,
    /// Log chains concluded without a completion (the temp file could not
    /// be opened), delivered to the shard after the commands.
    landings: Vec<(Chain, Result<(), i32>, Vec<u8>)>,
    /// Connections closed in this pass, reported to the shard after it.
    closed: Vec<Token>,
    stop_requested: bool,
    /// Links to the other shards (none with one shard).
    mesh: Option<MeshEnd>,
    /// Every shard's ring fd (the doorbells' targets).
    ring_fds: Arc<Vec<AtomicI32>>,
    inbox: Vec<Msg>,
    /// `Config::idle_poll_us`, 0 where shards share a CPU.
    idle_poll_us: u64,
    /// The poll window now, adapted to how soon events come (at most
    /// `idle_poll_us`).
    poll: poll::PollWindow,
}

impl Drop for Loop {
    /// Ops may still be in flight when the server stops (armed receives):
    /// their buffers are leaked, never freed under the kernel.
    fn drop(&mut self) {
        for c in &mut self.conns {
            for slot in [&mut c.recv, &mut c.send] {
                if let Slot::Kernel(l) = std::mem::replace(slot, Slot::Moving) {
                    l.leak();
                }
            }
        }
        if let Some(io) = self.log.as_mut() {
            io.leak_in_flight();
        }
    }
}

/// What one shard starts with: its listeners, its recovered table and log.
struct Part {
    lock: TcpListener,
    admin: TcpListener,
    table: Table,
    log: Option<(LogFiles, Log)>,
    faults: Faults,
}

/// The server before it runs: logs recovered, every shard's listeners
/// bound, signals blocked. [`Server::run`] starts one event loop per shard.
pub struct Server {
    cfg: Config,
    metrics: Arc<Metrics>,
    parts: Vec<Part>,
    signal_fd: RawFd,
    lock_addr: SocketAddr,
    admin_addr: SocketAddr,
    cpus: Vec<usize>,
}

impl Server {
    /// Recovers the logs (durable mode), binds both ports for every shard
    /// and blocks SIGINT/SIGTERM (threads started afterwards inherit the
    /// mask); nothing is served yet. The ports are bound only after every
    /// log is replayed: while recovery runs a client is refused (and
    /// retries) instead of waiting in the listen backlog for an unknown
    /// time, and nothing can be answered from a partial table
    /// (tests/scale.rs watches the start-up).
    pub fn bind(mut cfg: Config, metrics: Arc<Metrics>) -> io::Result<Server> {
        let cpus = allowed_cpus();
        if cfg.threads == 0 {
            cfg.threads = cpus.len();
        }
        fit_fd_limit(&mut cfg);
        let n = cfg.threads;
        if metrics.shards() < n {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the metrics registry has {} loop slots for {n} shards",
                    metrics.shards()
                ),
            ));
        }
        let limits = crate::core::Limits {
            max_keys: cfg.max_keys,
            max_waiters: cfg.max_waiters,
        };
        // One budget for every shard: the limits are the server's.
        let budget = crate::core::Budget::new(limits);
        let mut tables: Vec<Table> = (0..n).map(|_| Table::with_budget(budget.clone())).collect();
        let mut logs: Vec<Option<(LogFiles, Log)>> = (0..n).map(|_| None).collect();
        if let Some(path) = &cfg.data_path {
            let started = std::time::Instant::now();
            let opened = wal::set::open(path, &mut tables, cfg.wal_truncate_at, now())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let us = started.elapsed().as_micros() as u64;
            metrics.set_recovery_us(us);
            for (i, (files, rec)) in opened.into_iter().enumerate() {
                log!(
                    Level::Info,
                    "recovery",
                    "shard={} path={} records={} held_keys={} file_bytes={} torn_tail_bytes={} zero_tail_bytes={} truncated_at={} duration_us={}",
                    i,
                    crate::log::path(&files.path),
                    rec.records,
                    rec.held,
                    rec.file_bytes,
                    rec.torn_bytes,
                    rec.zero_tail_bytes,
                    rec.truncated_at.map_or("none".to_string(), |o| o.to_string()),
                    us
                );
                if rec.torn_bytes > 0 {
                    log!(
                        Level::Warn,
                        "torn_tail_dropped",
                        "path={} bytes={}",
                        crate::log::path(&files.path),
                        rec.torn_bytes
                    );
                }
                if let Some(o) = rec.truncated_at {
                    log!(
                        Level::Warn,
                        "corrupt_tail_truncated",
                        "path={} offset={} by=operator",
                        crate::log::path(&files.path),
                        o
                    );
                }
                let mut files = files;
                if cfg.wal_preallocate_bytes > 0 {
                    // Before serving: the first appends already land in
                    // zeros. Recovery left the file ending at its last record.
                    match wal::preallocate(&files.file, files.file_len, cfg.wal_preallocate_bytes) {
                        Ok(end) => files.alloc_len = end,
                        Err(e) => log!(
                            Level::Warn,
                            "wal_preallocate_failed",
                            "path={} bytes={} error=\"{}\" effect=appends_grow_the_file",
                            crate::log::path(&files.path),
                            cfg.wal_preallocate_bytes,
                            e
                        ),
                    }
                }
                let log = Log::new(files.file_len, &tables[i], cfg.compact_floor_bytes);
                logs[i] = Some((files, log));
            }
        }
        let multi = n > 1;
        let mut parts = Vec::with_capacity(n);
        let mut lock_addr = cfg.bind;
        let mut admin_addr = cfg.admin_bind;
        for (i, (table, log)) in tables.into_iter().zip(logs).enumerate() {
            let lock = listen(lock_addr, "lock", cfg.bind_retry_ms, multi, i == 0)?;
            let admin = listen(admin_addr, "admin", cfg.bind_retry_ms, multi, i == 0)?;
            if i == 0 {
                // Port 0 picks a port once; every other shard joins it.
                lock_addr = lock.local_addr()?;
                admin_addr = admin.local_addr()?;
            }
            let faults = Faults::parse(cfg.faults.as_deref().unwrap_or("")).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("RINGLOCK_FAULTS: {e}"))
            })?;
            parts.push(Part {
                lock,
                admin,
                table,
                log,
                faults,
            });
        }
        let signal_fd = block_signals()?;
        Ok(Server {
            cfg,
            metrics,
            parts,
            signal_fd,
            lock_addr,
            admin_addr,
            cpus,
        })
    }

    pub fn lock_addr(&self) -> SocketAddr {
        self.lock_addr
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The configuration in force (limits may have been fitted at bind).
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Serves until SIGINT/SIGTERM: shard 0 on the calling thread, every
    /// other shard on a thread of its own, each pinned to one CPU of the
    /// affinity mask. Returns after every shard answered its queued
    /// waiters `-`.
    pub fn run(mut self) -> io::Result<()> {
        let n = self.parts.len();
        if n > self.cpus.len() && self.cfg.idle_poll_us > 0 {
            // A polling shard would take turns with the others on its CPU.
            log!(
                Level::Info,
                "idle_poll_off",
                "shards={} cpus={} reason=\"shards share CPUs\"",
                n,
                self.cpus.len()
            );
            self.cfg.idle_poll_us = 0;
        }
        let ring_fds: Arc<Vec<AtomicI32>> = Arc::new((0..n).map(|_| AtomicI32::new(-1)).collect());
        let barrier = Arc::new(std::sync::Barrier::new(n));
        let all_conns: Arc<crate::shard::ConnCounts> = Arc::new(Default::default());
        let mut meshes: Vec<Option<MeshEnd>> = if n > 1 {
            mesh::build(n).into_iter().map(Some).collect()
        } else {
            vec![None]
        };
        let pin = n > 1;
        let mut handles = Vec::new();
        let mut parts = self.parts.into_iter().enumerate();
        let (_, first) = parts.next().expect("at least one shard");
        for (i, part) in parts {
            let cfg = self.cfg.clone();
            let metrics = self.metrics.clone();
            let mesh = meshes[i].take();
            let (fds, barrier, all) = (ring_fds.clone(), barrier.clone(), all_conns.clone());
            let cpu = self.cpus[i % self.cpus.len()];
            let h = std::thread::Builder::new()
                .name(format!("ringlock-shard-{i}"))
                .spawn(move || {
                    run_shard(
                        i, n, cpu, pin, cfg, metrics, part, mesh, None, fds, barrier, all,
                    )
                })?;
            handles.push(h);
        }
        let cpu = self.cpus[0];
        let mesh = meshes[0].take();
        let mut result = run_shard(
            0,
            n,
            cpu,
            pin,
            self.cfg,
            self.metrics,
            first,
            mesh,
            Some(self.signal_fd),
            ring_fds,
            barrier,
            all_conns,
        );
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a shard thread panicked")));
            if result.is_ok() {
                result = r;
            }
        }
        result
    }
}

/// Builds shard `i`'s loop on this thread (the ring must be created by the
/// thread that submits to it) and runs it.
#[allow(clippy::too_many_arguments)] // the parts of one shard, moved in once
fn run_shard(
    i: usize,
    n: usize,
    cpu: usize,
    pin: bool,
    cfg: Config,
    metrics: Arc<Metrics>,
    part: Part,
    mesh: Option<MeshEnd>,
    signal_fd: Option<RawFd>,
    ring_fds: Arc<Vec<AtomicI32>>,
    barrier: Arc<std::sync::Barrier>,
    all_conns: Arc<crate::shard::ConnCounts>,
) -> io::Result<()> {
    let pinned = pin && pin_to(cpu);
    let built = Loop::new(
        i,
        n,
        cfg,
        metrics,
        part,
        mesh,
        signal_fd,
        ring_fds.clone(),
        all_conns,
    );
    // Everyone publishes its ring (or that it has none) before anyone runs:
    // a doorbell needs the target's ring fd.
    let fd = built.as_ref().map_or(-2, |l| l.ring.as_raw_fd());
    ring_fds[i].store(fd, Ordering::Release);
    barrier.wait();
    let mut lp = built?;
    if ring_fds.iter().any(|f| f.load(Ordering::Acquire) < 0) {
        return Err(io::Error::other("another shard failed to start"));
    }
    log!(
        Level::Info,
        "shard_start",
        "shard={} of={} cpu={} pinned={}",
        i,
        n,
        cpu,
        pinned
    );
    lp.run()
}

impl Loop {
    #[allow(clippy::too_many_arguments)] // the parts of one shard, moved in once
    fn new(
        index: usize,
        n: usize,
        cfg: Config,
        metrics: Arc<Metrics>,
        part: Part,
        mesh: Option<MeshEnd>,
        signal_fd: Option<RawFd>,
        ring_fds: Arc<Vec<AtomicI32>>,
        all_conns: Arc<crate::shard::ConnCounts>,
    ) -> io::Result<Loop> {
        let ring = build_ring(cfg.max_connections, n)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot create io_uring: {e}")))?;
        let cap = cfg.max_connections.min(65_536);
        let (log, log_io) = match part.log {
            None => (None, None),
            Some((files, log)) => (
                Some(log),
                Some(LogIo::new(files, part.faults, cfg.wal_preallocate_bytes)),
            ),
        };
        let idle_poll_us = cfg.idle_poll_us;
        let mut shard = Shard::new(cfg, part.table, log, metrics.clone(), now());
        shard.place(index, n, all_conns);
        Ok(Loop {
            ring,
            lock_listener: part.lock,
            admin_listener: part.admin,
            signal_fd,
            // SAFETY: signalfd_siginfo is plain old data; all-zero is valid.
            signal_buf: Box::new(unsafe { std::mem::zeroed() }),
            conns: Vec::with_capacity(cap),
            shard,
            log: log_io,
            metrics,
            cqes: Vec::with_capacity(4096),
            cmds: Vec::with_capacity(1024),
            landings: Vec::with_capacity(2),
            closed: Vec::with_capacity(1024),
            stop_requested: false,
            mesh,
            ring_fds,
            inbox: Vec::new(),
            idle_poll_us,
            poll: poll::PollWindow::new(idle_poll_us),
        })
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
                } else if res != -libc::ECANCELED {
                    log!(
                        Level::Warn,
                        "accept_error",
                        "port={:?} errno={} error=\"{}\"",
                        port,
                        -res,
                        crate::log::Escaped(io::Error::from_raw_os_error(-res))
                    );
                }
                if !io_uring::cqueue::more(flags) && !self.stop_requested {
                    self.arm_accept(port);
                }
            }
            // A cancel references no buffer; a close needs nothing.
            Op::Cancel | Op::Close | Op::Ignore => {}
            // The refusal's `-` is done (sent or not): close its socket.
            Op::Refuse => {
                let close = opcode::Close::new(types::Fd(slot as RawFd))
                    .build()
                    .user_data(ring_io::encode(Op::Ignore, 0, 0));
                // SAFETY: references no buffer; the fd is the refused
                // socket, which no other op uses.
                unsafe { self.push(close) };
            }
            Op::Recv => self.on_recv(ud, gen, slot, res),
            Op::Send => self.on_send(ud, gen, slot, res),
            Op::Signal => {
                if res > 0 {
                    log!(
                        Level::Info,
                        "signal",
                        "signo={} action=shutdown",
                        self.signal_buf.ssi_signo
                    );
                    self.stop_requested = true;
                    if let Some(mesh) = self.mesh.as_mut() {
                        let me = mesh.me;
                        for to in (0..mesh.shards()).filter(|&t| t != me) {
                            let _ = mesh.send(to, Msg::Stop);
                        }
                    }
                } else {
                    self.arm_signal();
                }
            }
            // A doorbell: messages are taken every tick.
            Op::Mesh => {}
            Op::WalWrite if slot >= logio::STEP_GROW_ALLOC => self.on_grow_op(slot, res),
            Op::WalWrite => self.on_chain_op(Stream::Records, slot, res),
            Op::WalSync => self.on_chain_op(Stream::Compact, slot, res),
        }
    }

    fn execute(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Send(token) => self.send_answers(token),
            Cmd::Close(token) => self.close_conn(token),
            Cmd::Farewell(token) => self.farewell(token),
            Cmd::Log { chain, buf } => self.start_chain(chain, buf),
            Cmd::DiscardTemp => self.discard_temp(),
            Cmd::Scatter { id, op } => {
                let me = self.shard.index();
                let n = self.mesh.as_ref().map_or(1, |m| m.shards());
                for to in (0..n).filter(|&t| t != me) {
                    let msg = Msg::Request {
                        from: me,
                        id,
                        op: op.clone(),
                    };
                    let mesh = self.mesh.as_mut().expect("more than one shard");
                    if mesh.send(to, msg).is_err() {
                        self.shard.on_reply(id, crate::shard::RemoteResult::Failed);
                    }
                }
                self.shard.on_remote(me, id, op);
            }
            Cmd::Reply { to, id, result } => {
                if to == self.shard.index() {
                    self.shard.on_reply(id, result);
                } else {
                    let mesh = self.mesh.as_mut().expect("a reply to another shard");
                    mesh.send(to, Msg::Reply { id, result })
                        .expect("replies are never refused");
                }
            }
            Cmd::Sess { to, msg } => {
                let mesh = self
                    .mesh
                    .as_mut()
                    .expect("session traffic to another shard");
                mesh.send(to, Msg::Sess(msg))
                    .expect("session messages are never refused");
            }
            Cmd::Migrate { token, to } => self.migrate(token, to),
        }
    }
}
