//! What a streamed listing keeps between sends ([`Stream`], at the
//! connection's home shard) and between chunk requests ([`Served`], at
//! every shard): the data of `keys.rs`, named by the shard's state.

use crate::core::table::ListingId;
use crate::core::{ListForm, Token};

/// One shard's latest chunk of a listing, at the home: its encoded
/// entries, merged into the output up to `pos`.
pub(in crate::shard) struct ShardChunk {
    pub(in crate::shard) buf: Vec<u8>,
    pub(in crate::shard) pos: usize,
    /// The shard has sent its last entries.
    pub(in crate::shard) done: bool,
}

/// A streamed answer in progress, at the connection's home shard.
pub(in crate::shard) struct Stream {
    /// Names the listing on every shard (with this shard's index).
    pub(in crate::shard) id: u64,
    /// The connection; `None` once it is gone or answered.
    pub(in crate::shard) token: Option<Token>,
    pub(in crate::shard) form: ListForm,
    pub(in crate::shard) parts: Vec<ShardChunk>,
    pub(in crate::shard) count: u64,
    pub(in crate::shard) opened: bool,
    /// A round of requests is in flight.
    pub(in crate::shard) round: bool,
    /// The round in flight is a `KeysClose`.
    pub(in crate::shard) closing: bool,
    /// A part failed (refused, log failure, overflowed).
    pub(in crate::shard) failed: bool,
    /// The connection's output is with the driver (or about to be).
    pub(in crate::shard) sending: bool,
}

/// A listing this shard keeps for a requester.
pub(in crate::shard) struct Served {
    pub(in crate::shard) from: usize,
    pub(in crate::shard) stream: u64,
    pub(in crate::shard) id: ListingId,
    pub(in crate::shard) chunk: u32,
}
