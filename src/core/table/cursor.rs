//! What a listing in progress keeps, its id and what each of its steps
//! produced: the table holds the listings, `listing` runs them (and says
//! how listings work).

use crate::core::types::ListForm;

/// Bytes of saved (changed-before-sent) entries a listing may keep.
pub const SAVED_BYTES_MAX: usize = 8 << 20;

/// A `slots` entry with this bit is an offset into `saved`, not a holder.
pub(super) const SAVED: u32 = 1 << 31;
/// A `slots` entry with this bit (and not [`SAVED`]) is a share index;
/// without either, a key slot (its inline holder).
pub(super) const SHARE: u32 = 1 << 30;

/// Names a listing of a table (from
/// [`Table::listing_begin`](super::Table::listing_begin)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListingId(pub(super) u32);

pub(super) struct Listing {
    /// The holders listed, as they were at the start, sorted by key and
    /// then token: a key slot (its inline holder), `SHARE | index` (a
    /// share), or `SAVED | offset` of an entry whose holder changed since
    /// (its start state is there).
    pub(super) slots: Vec<u32>,
    /// Entries before `next` were encoded already.
    pub(super) next: usize,
    /// Encoded entries (`KEYH` form, the longest) of holders that changed
    /// before their turn.
    pub(super) saved: Vec<u8>,
    /// What the listing answers.
    pub(super) form: ListForm,
    /// The start, for lease time left.
    pub(super) unix_ms: u64,
    pub(super) overflowed: bool,
}

/// What [`Table::listing_next`](super::Table::listing_next) produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Some entries; more follow.
    More,
    /// The last entries (possibly none): the listing is over (ended).
    Done,
    /// Holders changed faster than the listing was read: it is ended.
    Overflowed,
}

/// The length of the encoded entry of `form` at the front of `b`; `b`
/// holds at least one whole entry.
pub fn entry_len(b: &[u8], form: ListForm) -> usize {
    let mut at = 0;
    for _ in 0..3 {
        at += 1 + b[at] as usize;
    }
    at + 8 + form.tail_len()
}
