//! Recovery and replication: holders restored from the log or a snapshot,
//! the table walked for a snapshot, grants undone or settled.

use super::*;

impl Table {
    /// Recovery: installs a holder read from the log (no connection, nobody
    /// to answer). Replaces any holder the key had. Refuses (false) past
    /// the key limit.
    pub fn restore_holder(&mut self, h: &HeldKey, now: Now) -> bool {
        self.restore(h.as_ref(), now)
    }

    /// [`Table::restore_holder`] by reference (replay, over the log image).
    pub fn restore(&mut self, h: HeldRef<'_>, now: Now) -> bool {
        if h.key.len() > NAME_MAX || h.source.len() > NAME_MAX {
            return false;
        }
        let Ok((k, new)) = self.key_get_or_insert(h.key) else {
            return false;
        };
        if !new && self.keys[k as usize].holder.is_some() {
            self.unhold(k);
        }
        let Some(s) = self.source_get_or_insert(h.source) else {
            self.key_drop_if_unused(k);
            return false;
        };
        // A replicated session's hold stays its session's: owned by an
        // entry without a connection until a resume adopts it.
        let owner = if h.session & REPLICATED_SESSION != 0 {
            match self.owner_open(h.session, ORPHAN) {
                Some(o) => o,
                None => {
                    self.source_drop_if_unused(s);
                    self.key_drop_if_unused(k);
                    return false;
                }
            }
        } else {
            NIL
        };
        // A lease keeps the time it had left on the wall clock (the
        // monotonic clock does not survive a restart).
        let lease = h.mode == HoldMode::Lease;
        let left_ms = h.expires_unix_ms.saturating_sub(now.unix_ms);
        let spec = Spec {
            grant_id: h.grant_id,
            acquired_unix_ms: h.acquired_unix_ms,
            acquired_mono_us: now.mono_us,
            mode: h.mode,
            owner,
            expires_mono_us: if lease {
                // Saturating: a deadline read from a log is not trusted to
                // fit (the server caps TTLs, a hand-made log need not).
                now.mono_us.saturating_add(left_ms.saturating_mul(1000))
            } else {
                0
            },
            expires_unix_ms: if lease { h.expires_unix_ms } else { 0 },
        };
        self.hold(k, s, Endpoint::from(h.endpoint), NO_CONN, spec);
        true
    }

    /// Recovery: a release read from the log.
    pub fn restore_release(&mut self, key: &(impl AsRef<[u8]> + ?Sized), _now: Now) {
        if let Some(k) = self.find_key(key.as_ref()) {
            if self.keys[k as usize].holder.is_some() {
                let h = self.unhold(k);
                self.owner_drop_if_empty_orphan(h.owner);
            }
            self.key_drop_if_unused(k);
        }
    }

    /// Forgets owner entry `o` if it is an orphan with nothing left (a
    /// follower's entry of a replicated session whose last hold was
    /// released by the log).
    pub(super) fn owner_drop_if_empty_orphan(&mut self, o: u32) {
        if o == NIL {
            return;
        }
        let e = &self.owners[o as usize];
        if e.tag == ORPHAN && e.held.is_empty() && e.waiting.is_empty() {
            let id = e.id;
            self.owner_index.remove(&id);
            self.owners.remove(o as usize);
        }
    }

    /// Visits every held key in grant order (oldest first), by reference:
    /// no allocation, no copy of a name.
    pub fn for_each_held(&self, mut f: impl FnMut(HeldRef<'_>)) {
        let mut cur = self.by_age.front();
        while let Some(k) = cur {
            if let Some(h) = self.held_ref(k) {
                f(h);
            }
            cur = List::next_of(&self.keys, k, K_AGE);
        }
    }

    /// Starts a walk over the keys held now, in grant order, to be visited
    /// a chunk at a time by [`Table::walk_step`] while the table keeps
    /// changing in between (a background snapshot of a million holders
    /// must not stop the loop for the time it takes to encode them all).
    ///
    /// Each key is visited with its state at the time of its visit, or not
    /// at all when it was released before. A log snapshot built this way
    /// is exact once every record appended since the walk began is
    /// replayed after it: each record sets its key's state absolutely
    /// (a hold replaces any holder, a release frees the key, an extend
    /// names its grant), so a key's last record since the start decides,
    /// and a key with none is visited as it has been since.
    ///
    /// A walk already in progress is restarted.
    pub fn walk_begin(&mut self) {
        self.walk = match (self.by_age.front(), self.by_age.back()) {
            (Some(next), Some(last)) => Some(Walk { next, last }),
            _ => None,
        };
    }

    /// Visits up to `max` more keys of the walk; true when it is complete.
    pub fn walk_step(&mut self, max: usize, mut f: impl FnMut(HeldRef<'_>)) -> bool {
        for _ in 0..max {
            let Some(w) = self.walk else { return true };
            if let Some(h) = self.held_ref(w.next) {
                f(h);
            }
            self.walk = if w.next == w.last {
                None
            } else {
                List::next_of(&self.keys, w.next, K_AGE).map(|next| Walk { next, ..w })
            };
        }
        self.walk.is_none()
    }

    /// Abandons the walk in progress, if any.
    pub fn walk_end(&mut self) {
        self.walk = None;
    }

    /// Durability failure: takes back a grant whose log record never became
    /// durable. The key is left free (even with waiters) until [`settle`]
    /// runs, so that a series of undos in reverse log order sees exactly
    /// the state each record was applied to.
    ///
    /// [`settle`]: Table::settle
    pub fn undo_grant(
        &mut self,
        key: &(impl AsRef<[u8]> + ?Sized),
        grant_id: u64,
        _now: Now,
    ) -> bool {
        let Some(key_slot) = self.find_key(key.as_ref()) else {
            return false;
        };
        let held_by_grant = self.keys[key_slot as usize]
            .holder
            .is_some_and(|h| h.grant_id == grant_id);
        if held_by_grant {
            self.unhold(key_slot);
        }
        held_by_grant
    }

    /// After undos: a free key is granted to its next waiter, or dropped.
    pub fn settle(&mut self, key: &(impl AsRef<[u8]> + ?Sized), now: Now, fx: &mut Effects) {
        if let Some(k) = self.find_key(key.as_ref()) {
            if self.keys[k as usize].holder.is_none() {
                self.grant_next(k, now, fx);
            }
        }
    }

    /// Grant id of the current holder of `key`, if held.
    pub fn grant_of(&self, key: &(impl AsRef<[u8]> + ?Sized)) -> Option<u64> {
        let k = self.find_key(key.as_ref())?;
        self.keys[k as usize].holder.map(|h| h.grant_id)
    }
}
