//! What a shard asks its driver to do ([`Cmd`]): the one vocabulary
//! between the pure shard and the io_uring driver (or the simulator).

use super::msg::{RemoteOp, RemoteResult, SessMsg};
use crate::core::Token;
use crate::wal::log::Chain;

/// What the shard asks its driver to do, in order.
#[derive(Debug)]
pub enum Cmd {
    /// Take the connection's answer with [`Shard::take_output`](super::Shard::take_output) and send
    /// all of it; report [`Shard::on_send_done`](super::Shard::on_send_done).
    Send(Token),
    /// Stop reading, close once no op references the socket, then report
    /// [`Shard::on_closed`](super::Shard::on_closed).
    Close(Token),
    /// Run a log chain with this buffer (the driver's until it reports
    /// [`Shard::on_log_landed`](super::Shard::on_log_landed) and gives it back).
    Log { chain: Chain, buf: Vec<u8> },
    /// Close and remove the compaction temp file (unless renamed).
    DiscardTemp,
    /// Shutdown: answer `-` to this connection's queued Lock, best effort.
    Farewell(Token),
    /// The connection's next request names a key another shard owns: stop
    /// reading it, then hand it (socket and [`Shard::detach`](super::Shard::detach)ed state) to
    /// shard `to`, which continues with [`Shard::on_adopt`](super::Shard::on_adopt).
    Migrate { token: Token, to: usize },
    /// Run `op` on every shard (this one included) and report each result
    /// with [`Shard::on_reply`](super::Shard::on_reply).
    Scatter { id: u64, op: RemoteOp },
    /// The result of a remote request, for shard `to`.
    Reply {
        to: usize,
        id: u64,
        result: RemoteResult,
    },
    /// Session traffic for shard `to` (never this one): report it there
    /// with [`Shard::on_sess`](super::Shard::on_sess). Never refused or dropped.
    Sess { to: usize, msg: Box<SessMsg> },
    /// Cluster mode: send this frame on the link to `node`'s same shard
    /// (dropped if the link is down: Raft retransmits).
    Peer { node: u64, frame: Vec<u8> },
    /// Cluster mode: as `Peer`, for a frame that must arrive (a forwarded
    /// request or its answer): if it cannot be queued on an open link,
    /// the driver reports [`Shard::on_peer_undeliverable`](super::Shard::on_peer_undeliverable) (and a link
    /// too full to take it is closed), never a silent drop.
    PeerMust { node: u64, frame: Vec<u8> },
    /// Cluster mode: forwarded requests sent on this shard's link to
    /// `node` were given up (their clients told the outcome is unknown):
    /// the driver aborts that link (a TCP reset, its unsent bytes
    /// discarded) and dials it again, so that none of them can reach the
    /// leader later and run after their clients moved on.
    PeerReset { node: u64 },
    /// Cluster mode: the group's membership changed; `node`'s link for
    /// this shard goes to `addr`, or (`None`) is closed for good.
    PeerLink {
        node: u64,
        addr: Option<std::net::SocketAddr>,
    },
}
