//! What a streamed listing keeps between sends ([`Stream`], at the
//! connection's home shard) and between chunk requests ([`Served`], at
//! every shard): the data of `keys.rs`, named by the shard's state.

use crate::core::table::ListingId;
use crate::core::{ListForm, Token};

/// One shard's latest chunk of a listing, at the home: its encoded
/// entries, merged into the output up to `pos`.
pub(in crate::shard) struct ShardChunk {
    pub(super) buf: Vec<u8>,
    pub(super) pos: usize,
    /// The shard has sent its last entries.
    pub(super) done: bool,
}

/// A streamed answer in progress, at the connection's home shard.
pub(in crate::shard) struct Stream {
    /// Names the listing on every shard (with this shard's index).
    pub(super) id: u64,
    /// The connection; `None` once it is gone or answered.
    pub(super) token: Option<Token>,
    pub(super) form: ListForm,
    pub(super) parts: Vec<ShardChunk>,
    pub(super) count: u64,
    pub(super) opened: bool,
    /// A round of requests is in flight.
    pub(super) round: bool,
    /// The round in flight is a `KeysClose`.
    pub(super) closing: bool,
    /// A part failed (refused, log failure, overflowed).
    pub(super) failed: bool,
    /// The connection's output is with the driver (or about to be).
    pub(super) sending: bool,
}

/// A listing this shard keeps for a requester.
pub(in crate::shard) struct Served {
    pub(super) from: usize,
    pub(super) stream: u64,
    pub(super) id: ListingId,
    pub(super) chunk: u32,
}
