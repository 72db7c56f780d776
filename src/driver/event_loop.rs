//! The event loop's state, [`Loop`] (one shard and the io_uring that
//! serves it, on one thread), its `Drop` (buffers still lent are leaked),
//! `dispatch` (a completion → its handler) and `execute` (a shard command
//! → its handler). The handlers are the `impl Loop` blocks of the files
//! around it (`ring.rs`, `conn.rs`, `clienttls.rs`, `logio.rs`, `peer/`);
//! the types of `Loop`'s fields are in files none of which imports this
//! one.

use std::io;
use std::net::TcpListener;
use std::os::fd::RawFd;
use std::sync::Arc;

use io_uring::{opcode, types, IoUring};

use super::buf::Slot;
use super::conn_slot::DConn;
use super::logio_state::{self, LogIo};
use super::mesh::{MeshEnd, Msg, Shared};
use super::peer::links::Peers;
use super::user_data::{self as ring_io, Op};
use super::{clienttls_state, poll};
use crate::core::Token;
use crate::log::Level;
use crate::shard::conn::Port;
use crate::shard::{Cmd, Shard};
use crate::wal::log::Chain;
use crate::wal::plan::Stream;

/// One event loop: a shard and the io_uring that serves it, on one thread.
pub(super) struct Loop {
    pub(super) ring: IoUring,
    pub(super) lock_listener: TcpListener,
    pub(super) admin_listener: TcpListener,
    /// Only shard 0 reads the signalfd; it tells the others to stop.
    pub(super) signal_fd: Option<RawFd>,
    pub(super) signal_buf: Box<libc::signalfd_siginfo>,
    pub(super) conns: Vec<DConn>,
    pub(super) shard: Shard,
    pub(super) log: Option<LogIo>,
    pub(super) cqes: Vec<(u64, i32, u32)>,
    pub(super) cmds: Vec<Cmd>,
    /// Log chains concluded without a completion (the temp file could not
    /// be opened), delivered to the shard after the commands.
    pub(super) landings: Vec<(Chain, Result<(), i32>, Vec<u8>)>,
    /// Connections closed in this pass, reported to the shard after it.
    pub(super) closed: Vec<Token>,
    pub(super) stop_requested: bool,
    /// Links to the other shards (none with one shard).
    pub(super) mesh: Option<MeshEnd>,
    /// What the shard threads share (see [`Shared`]): every shard's ring
    /// fd (the doorbells' targets), the metrics, `--certs-dir`'s
    /// certificates (shard 0 reloads them on SIGHUP, every shard's new
    /// connections take the current set).
    pub(super) shared: Arc<Shared>,
    pub(super) inbox: Vec<Msg>,
    /// `Config::idle_poll_us`, 0 where shards share a CPU.
    pub(super) idle_poll_us: u64,
    /// The poll window now, adapted to how soon events come (at most
    /// `idle_poll_us`).
    pub(super) poll: poll::PollWindow,
    /// Cluster mode: the Raft links of this shard.
    pub(super) peers: Option<Peers>,
    /// `--certs-dir`: TLS on the lock and admin ports.
    pub(super) client_tls: Option<clienttls_state::ClientTls>,
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
    pub(super) fn dispatch(&mut self, ud: u64, res: i32, flags: u32) {
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
                // socket, which no other op uses and nothing else closes.
                // Closed twice, the second close could hit a reused
                // number (another connection's socket, cut under it);
                // never closed, every refusal leaks a descriptor.
                // tests/refuse_leak.rs counts the descriptors after 600
                // refusals on 1, 2 and 4 shards and checks that the server
                // serves a new connection afterwards.
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
        let Some(c) = self.shared.certs.as_ref() else {
            log!(
                Level::Info,
                "signal",
                "signo=SIGHUP action=none reason=\"no --certs-dir\""
            );
            return;
        };
        match c.reload() {
            Ok(()) => {
                self.shared.metrics.security.cert_reload(true);
                self.shared
                    .metrics
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
                self.shared.metrics.security.cert_reload(false);
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

    pub(super) fn execute(&mut self, cmd: Cmd) {
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
