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
    pub(super) sid: u64,
    pub(super) rid: u32,
    pub(super) left: usize,
    pub(super) held: Vec<HeldOut>,
}

/// The shard's bookkeeping of replicated sessions.
#[derive(Default)]
pub struct Resumes {
    /// Replicated sessions homed here → the connection that has each
    /// (stale entries are harmless: checked with `session_conn`).
    pub(super) attached: IdMap<u64, Token>,
    /// Resumes being gathered, by the resuming connection.
    pub(super) pending: IdMap<Token, Pending>,
    /// `(mono µs, session)`: a session homed here that no connection has
    /// ends then unless resumed — if that is still its window in
    /// `window_at` (an entry armed by an earlier serving start, or before a
    /// resume, is stale: a window only moves later).
    pub(super) windows: BinaryHeap<Reverse<(u64, u64)>>,
    pub(super) window_at: IdMap<u64, u64>,
    /// `(mono µs, session)`: an orphan owner entry of this shard's table
    /// ends then unless adopted (current in `orphan_at`, as above).
    pub(super) orphans: BinaryHeap<Reverse<(u64, u64)>>,
    pub(super) orphan_at: IdMap<u64, u64>,
    /// Every window is armed anew when the node serves next: this shard
    /// saw its node not serve, or let a session or owner entry lose its
    /// connection (or undid records) while it did not. Its own group may
    /// have led throughout — another group of the node lost its leader and
    /// won it back — and then `note_serving` sees no start to arm them at.
    pub(super) rearm: bool,
}

impl Resumes {
    /// Session `sid` homed here ends at `at` unless resumed first.
    pub(super) fn arm_window(&mut self, sid: u64, at: u64) {
        self.window_at.insert(sid, at);
        self.windows.push(Reverse((at, sid)));
    }

    /// This shard's orphan entry of `sid` ends at `at` unless adopted.
    pub(super) fn arm_orphan(&mut self, sid: u64, at: u64) {
        self.orphan_at.insert(sid, at);
        self.orphans.push(Reverse((at, sid)));
    }

    pub fn next_deadline_us(&self) -> Option<u64> {
        let w = self.windows.peek().map(|r| r.0 .0);
        let o = self.orphans.peek().map(|r| r.0 .0);
        w.into_iter().chain(o).min()
    }
}
