//! Messages between shards, as the mesh carries them (the driver's
//! `mesh` queues, or the simulator's): the scatter/gather of admin and
//! reset commands over every shard's keys ([`RemoteOp`] out,
//! [`RemoteResult`] back), a connection handed to another shard
//! ([`Detached`]), and session traffic between a session's home shard and
//! the owners of its keys ([`SessMsg`]; see [`super::session`]).
//!
//! This file imports only what sits below the shard (`core`, `protocol`)
//! and the connection's [`Port`], never the shard itself: `shard/mod.rs`
//! and `session.rs` both use these types without importing each other.
//! They are re-exported at their former paths (`shard::{RemoteOp,
//! RemoteResult, Detached}`, `shard::session::{SessMsg, SessOp, SessOut,
//! SESS_BIT}`).

use std::net::SocketAddr;

use super::conn::Port;
use crate::core::{Access, HoldMode, Name, Source, Token};
use crate::protocol::session::{EventKind, LostWhy, Status};

/// An operation one shard asks every shard to run on its part of the keys.
#[derive(Clone, Debug)]
pub enum RemoteOp {
    /// KEYS/KEYX/KEYH streamed (see the shard's `keys` module): start a
    /// listing of `form` of this shard's holders named by (requester,
    /// `stream`); answer its count and first chunk of about `chunk` bytes.
    KeysOpen {
        stream: u64,
        form: crate::core::ListForm,
        chunk: u32,
    },
    /// The next chunk of listing `stream` from each shard named in `want`
    /// (the others answer `Done`).
    KeysMore { stream: u64, want: Vec<u32> },
    /// The reader of listing `stream` left: drop it.
    KeysClose { stream: u64 },
    /// RSET: reset the named keys this shard owns.
    ResetKeys(Vec<Name>),
    /// RSBS, or ResetBySource on the lock port: reset these sources (up
    /// to 255 bytes: a session's source).
    ResetSources(Vec<Source>),
    /// RSTK: reset each key this shard owns if its holder has the token.
    ResetIf(Vec<(Name, u64)>),
    /// CLST: this shard's replication state (read-only, answered at once).
    ClusterStatus,
    /// XFER: hand this shard's leadership to node `to` (0: the most
    /// caught-up follower); answered once the transfer started.
    TransferLeader { to: u64 },
    /// CMEM: this shard's membership.
    Members,
    /// CCHG: make this membership change in this shard's group.
    ChangeMembers(crate::protocol::members::Change),
}

#[derive(Clone, Debug)]
pub enum RemoteResult {
    /// Shard `shard`'s next chunk of a listing: encoded entries sorted by
    /// key (and its count, in the answer to `KeysOpen`).
    KeysPart {
        shard: u32,
        count: u32,
        bytes: Vec<u8>,
        step: crate::core::table::Step,
    },
    Done,
    /// RSTK: the indices (into the request) of the keys reset.
    Reset(Vec<u32>),
    /// The log could not make the effects durable (they were undone).
    Failed,
    /// CLST: one shard's record.
    Status(Box<crate::protocol::status::ShardStatus>),
    /// CMEM: one shard's membership.
    Members(Box<crate::protocol::members::MemberStatus>),
    /// CCHG: this shard refused the change, and why.
    Refused(String),
}

/// A connection moving to another shard: what it was in the middle of.
#[derive(Debug)]
pub struct Detached {
    pub port: Port,
    pub peer: SocketAddr,
    pub persistent: bool,
    /// A one-shot connection that already had its request served.
    pub served: bool,
    pub read_closed: bool,
    /// The connection speaks TLS, and the client certificate's name.
    pub tls: bool,
    pub cert_client: Option<Box<str>>,
    /// Received bytes not yet decoded (the request that caused the move
    /// comes first).
    pub rbuf: Vec<u8>,
}

/// Marks a table connection token as a session request.
pub const SESS_BIT: u64 = 1 << 63;

/// A session request as its key's owner shard runs it.
#[derive(Clone, Debug)]
pub enum SessOp {
    Acquire {
        hold: HoldMode,
        ttl_ms: u32,
        wait_ms: u32,
        key: Name,
        source: Source,
        access: Access,
    },
    Release {
        token: u64,
        key: Name,
    },
    Extend {
        token: u64,
        ttl_ms: u32,
        key: Name,
    },
    Cancel {
        target: u32,
        key: Name,
    },
    Watch {
        key: Name,
    },
    Unwatch {
        target: u32,
        key: Name,
    },
    Proclaim {
        token: u64,
        key: Name,
        source: Source,
    },
}

/// Something for a session's client.
// An Event carries its key and its source (up to 255 bytes) inline, as a
// Lost its key: nothing is allocated per event; the enum is copied a few
// times per answer.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug)]
pub enum SessOut {
    Reply {
        rid: u32,
        status: Status,
        token: u64,
        ttl_left_ms: u32,
    },
    Lost {
        key: Name,
        token: u64,
        why: LostWhy,
    },
    /// A holder of a watched key, or a change of its holders.
    Event {
        rid: u32,
        kind: EventKind,
        token: u64,
        hold: HoldMode,
        access: Access,
        key: Name,
        source: Source,
    },
}

/// One hold of a session as a Resume lists it: key, token, mode, lease
/// TTL left in ms (`NO_TTL` for other modes).
pub type HeldOut = (Name, u64, HoldMode, u32);

/// Session traffic between shards.
#[derive(Clone, Debug)]
pub enum SessMsg {
    /// home → owner: run a request.
    Op {
        sid: u64,
        home: Token,
        rid: u32,
        peer: SocketAddr,
        op: SessOp,
    },
    /// home → owner: the session ended.
    End { sid: u64 },
    /// home → owner (cluster mode): the session ended because its home
    /// shard lost its leader; its client may believe in its holds until its
    /// keep-alive runs out, so they become leases that outlive that
    /// instead of being released.
    Orphan { sid: u64 },
    /// owner → home: an answer or a Lost push.
    Out { sid: u64, home: Token, out: SessOut },
    /// owner → home: what the owner answered was undone (its log failed):
    /// end the session.
    Kill { sid: u64, home: Token },
    /// owner → home (cluster mode): the owner's group lost its leader
    /// (or its answer was voided by that loss); a replicated session is
    /// detached (its client resumes it on the next leader), any other ends
    /// as on `Kill`.
    Detach { sid: u64, home: Token },
    /// home → owner: a Resume gave replicated session `sid` to connection
    /// `home`: route to it, drop the earlier connection's queued requests,
    /// and answer with the session's holds here.
    Adopt { sid: u64, home: Token },
    /// owner → home: the answer to `Adopt` (behind the owner's log).
    Adopted {
        sid: u64,
        home: Token,
        held: Vec<HeldOut>,
    },
}
