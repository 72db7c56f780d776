//! The shard's bookkeeping of replicated sessions ([`Resumes`]): who has
//! each session homed here, resumes being gathered, and the windows after
//! which a session nobody resumed ends. `resume.rs` keeps the rules.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::core::idmap::IdMap;
use crate::core::Token;
use crate::shard::msg::HeldOut;

/// A Resume waiting for every shard's list of the session's holds.
pub(in crate::shard) struct Pending {
    pub(in crate::shard) sid: u64,
    pub(in crate::shard) rid: u32,
    pub(in crate::shard) left: usize,
    pub(in crate::shard) held: Vec<HeldOut>,
}

/// The shard's bookkeeping of replicated sessions.
#[derive(Default)]
pub struct Resumes {
    /// Replicated sessions homed here → the connection that has each
    /// (stale entries are harmless: checked with `session_conn`).
    pub(in crate::shard) attached: IdMap<u64, Token>,
    /// Resumes being gathered, by the resuming connection.
    pub(in crate::shard) pending: IdMap<Token, Pending>,
    /// `(mono µs, session)`: a session homed here that no connection has
    /// ends then unless resumed — if that is still its window in
    /// `window_at` (an entry armed by an earlier serving start, or before a
    /// resume, is stale: a window only moves later).
    pub(in crate::shard) windows: BinaryHeap<Reverse<(u64, u64)>>,
    pub(in crate::shard) window_at: IdMap<u64, u64>,
    /// `(mono µs, session)`: an orphan owner entry of this shard's table
    /// ends then unless adopted (current in `orphan_at`, as above).
    pub(in crate::shard) orphans: BinaryHeap<Reverse<(u64, u64)>>,
    pub(in crate::shard) orphan_at: IdMap<u64, u64>,
    /// Every window is armed anew when the node serves next: this shard
    /// saw its node not serve, or let a session or owner entry lose its
    /// connection (or undid records) while it did not. Its own group may
    /// have led throughout — another group of the node lost its leader and
    /// won it back — and then `note_serving` sees no start to arm them at.
    pub(in crate::shard) rearm: bool,
}

impl Resumes {
    /// Session `sid` homed here ends at `at` unless resumed first.
    pub(in crate::shard) fn arm_window(&mut self, sid: u64, at: u64) {
        self.window_at.insert(sid, at);
        self.windows.push(Reverse((at, sid)));
    }

    /// This shard's orphan entry of `sid` ends at `at` unless adopted.
    pub(in crate::shard) fn arm_orphan(&mut self, sid: u64, at: u64) {
        self.orphan_at.insert(sid, at);
        self.orphans.push(Reverse((at, sid)));
    }

    pub fn next_deadline_us(&self) -> Option<u64> {
        let w = self.windows.peek().map(|r| r.0 .0);
        let o = self.orphans.peek().map(|r| r.0 .0);
        w.into_iter().chain(o).min()
    }
}
