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
//!
//! # Files
//! Each child module adds an `impl Loop` block over the private fields of
//! `Loop` (defined here) or is a leaf the loop uses:
//! - `mod.rs`: the `Loop` struct, its `Drop` (buffers still lent are
//!   leaked), `dispatch` (a completion → its handler) and `execute` (a
//!   shard command → its handler).
//! - `start.rs`: [`Server`] — log recovery, listeners, signal mask, one
//!   thread per shard with CPU pinning — and `Loop::new`.
//! - `ring.rs`: ring sizing and set-up, `push`/`reserve_sq`, the wait
//!   (heartbeat-bounded, after the idle poll), the drain, the tick loop
//!   `run`, and the mesh's intake and doorbells.
//! - `conn.rs`: a connection's driver side (`DConn`): accept or refuse,
//!   receive, send, close, migration between shards.
//! - `logio.rs`: the log's I/O, steered by the write planner.
//! - `peer/`: cluster mode's Raft links to the other nodes (`mod.rs`: the
//!   limits, dialing and outbound links; `inbound.rs`: accepted links).
//! - `tlsio.rs`: rustls over the loop's own buffers (ciphertext in and
//!   out; no thread, no socket call); `certs.rs`: the node's certificates,
//!   shared by every shard and replaced whole on SIGHUP.
//! - `sys.rs`: the libc calls outside the ring (bind, peer address, fd
//!   limit, signalfd, CPU affinity, clocks); [`allowed_cpus`].
//! - [`buf`]: the buffer lent to the kernel and its owner states.
//! - [`user_data`]: the `user_data` codec.
//! - [`poll`]: the adaptive idle-poll window.
//! - [`mesh`]: the message queues between shards.
//! - [`faults`]: test-only fault injection into the log's I/O.

pub mod buf;
pub mod certs;
mod clienttls;
mod clienttls_state;
mod conn;
mod conn_slot;
pub mod faults;
mod logio;
mod logio_state;
pub mod mesh;
mod peer;
pub mod poll;
mod port_owner;
mod ring;
mod start;
mod sys;
mod tlsio;
pub mod user_data;

use std::io;
use std::net::TcpListener;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicI32;
use std::sync::Arc;

use io_uring::{opcode, types, IoUring};

use crate::core::Token;
use crate::log::Level;
use crate::metrics::Metrics;
use crate::shard::conn::Port;
use crate::shard::{Cmd, Shard};
use crate::wal::log::Chain;
use crate::wal::plan::Stream;
use buf::Slot;
use conn_slot::DConn;
use logio_state::LogIo;
use mesh::{MeshEnd, Msg};
use user_data::{self as ring_io, Op};

/// Accepted peer links waiting for their TLS handshake and Hello, per
/// shard (a new one evicts the oldest).
pub use peer::links::PENDING_MAX as PEER_PENDING_MAX;

pub use start::Server;
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
    /// Cluster mode: the Raft links of this shard.
    peers: Option<peer::links::Peers>,
    /// `--certs-dir`: the node's certificates; shard 0 reloads them on
    /// SIGHUP, every shard's new connections take the current set.
    certs: Option<Arc<certs::Certs>>,
    /// `--certs-dir`: TLS on the lock and admin ports.
    client_tls: Option<clienttls_state::ClientTls>,
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
        if let Some(p) = self.peers.as_mut() {
            p.leak_in_flight();
        }
    }
}

impl Loop {
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
                // socket, which no other op uses and nothing else closes
                // (a second close could hit a reused number: another
                // connection's socket). tests/refuse_leak.rs counts the
                // descriptors after 600 refusals on 1, 2 and 4 shards.
                unsafe { self.push(close) };
            }
            Op::Recv => self.on_recv(ud, gen, slot, res),
            Op::Send => self.on_send(ud, gen, slot, res),
            Op::Signal => {
                if res > 0 && self.signal_buf.ssi_signo == libc::SIGHUP as u32 {
                    self.reload_certs();
                    self.arm_signal();
                } else if res > 0 {
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
            Op::Peer => self.on_peer_op(ud, gen, slot, res, flags),
            Op::WalWrite if slot >= logio_state::STEP_GROW_ALLOC => self.on_grow_op(slot, res),
            Op::WalWrite => self.on_chain_op(Stream::Records, slot, res),
            Op::WalSync => self.on_chain_op(Stream::Compact, slot, res),
        }
    }

    /// SIGHUP: re-reads `--certs-dir` (validated whole first; on an error
    /// the certificates in use stay, and the log says why).
    fn reload_certs(&mut self) {
        let Some(c) = self.certs.as_ref() else {
            log!(
                Level::Info,
                "signal",
                "signo=SIGHUP action=none reason=\"no --certs-dir\""
            );
            return;
        };
        match c.reload() {
            Ok(()) => {
                self.metrics.security.cert_reload(true);
                self.metrics
                    .security
                    .set_cert_not_after_s(c.not_after_unix_s());
                log!(
                    Level::Info,
                    "certs_reloaded",
                    "dir={} action=\"new connections use them; live ones keep theirs\"",
                    crate::log::path(c.dir())
                );
            }
            Err(e) => {
                self.metrics.security.cert_reload(false);
                log!(
                    Level::Error,
                    "certs_reload_failed",
                    "dir={} error=\"{}\" action=\"kept the certificates in use\"",
                    crate::log::path(c.dir()),
                    crate::log::Escaped(&e)
                );
            }
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
            // Dropped when its link cannot take it: Raft retransmits.
            Cmd::Peer { node, frame } => {
                let _ = self.send_peer(node, &frame);
            }
            Cmd::PeerMust { node, frame } => self.send_peer_must(node, frame),
            Cmd::PeerReset { node } => self.reset_peer(node),
            Cmd::PeerLink { node, addr } => self.set_peer_link(node, addr),
        }
    }
}
