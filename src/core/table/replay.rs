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

    /// [`Table::restore_holder`] by reference (replay, over the log image),
    /// in the access the record says.
    pub fn restore(&mut self, h: HeldRef<'_>, now: Now) -> bool {
        self.restore_access(h, h.access, now)
    }

    /// Replay of a grant in any [`Access`]: installs holder `h` (its grant
    /// id, no connection, nobody answered) as the record says, the way
    /// [`Table::restore`] does for an exclusive hold, and what the log
    /// replay of shared and semaphore grants will call:
    /// - a holder of the same grant id is replaced;
    /// - holders that could not hold the key beside it (any, for an
    ///   exclusive grant; of another access, or a semaphore of another
    ///   `n`) are removed first: a record sets what it says absolutely, as
    ///   an exclusive grant's record always replaced any holder;
    /// - a semaphore already at its `n` loses its oldest holders until the
    ///   new one fits (a consistent log never gets here);
    /// - a shared or semaphore holder besides another takes a waiter of
    ///   the budget.
    ///
    /// Refuses (false, nothing changed but holders removed as above) past
    /// a limit, for a semaphore of no slot, and for a semaphore whose `n`
    /// differs from the one its queued requests fixed (only an undo can
    /// meet those: the log step must answer them first).
    pub fn restore_access(&mut self, h: HeldRef<'_>, access: Access, now: Now) -> bool {
        if h.key.len() > KEY_MAX || h.source.len() > SOURCE_MAX || !access.is_valid() {
            return false;
        }
        let Ok((k, new)) = self.key_get_or_insert(h.key) else {
            return false;
        };
        if !new {
            self.make_room(k, h.grant_id, access);
            let slots = self.slots(k);
            if access.slots() != 0 && slots != 0 && slots != access.slots() {
                self.key_drop_if_unused(k);
                return false;
            }
        }
        // A holder beside another is a share, with a waiter of the budget.
        let budgeted = self.keys[k as usize].holder.is_some();
        if budgeted && !self.budget.take_waiter() {
            self.key_drop_if_unused(k);
            return false;
        }
        let Some(s) = self.source_get_or_insert(h.source) else {
            if budgeted {
                self.budget.free_waiters(1);
            }
            self.key_drop_if_unused(k);
            return false;
        };
        // A replicated session's hold stays its session's: owned by an
        // entry without a connection until a resume adopts it.
        let owner = if h.session & REPLICATED_SESSION != 0 {
            match self.owner_open(h.session, ORPHAN) {
                Some(o) => o,
                None => {
                    if budgeted {
                        self.budget.free_waiters(1);
                    }
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
            access,
        };
        self.place(k, s, Endpoint::from(h.endpoint), NO_CONN, spec, budgeted);
        self.note_if_unblocked(k);
        true
    }

    /// Holders removed without a grant (replay, undo) may have let the head
    /// of `k`'s queue in: noted for [`Table::grant_unblocked`] (an undo's
    /// [`Table::settle`] grants it anyway).
    fn note_if_unblocked(&mut self, k: u32) {
        if self.keys.contains(k as usize) && self.head_grantable(k) {
            self.unblocked.push(k);
        }
    }

    /// Removes, without effects, the holders of key slot `k` that a grant
    /// `grant_id` in `access` replaces (see [`Table::restore_access`]).
    /// Their session entries stay, as a replaced exclusive holder's
    /// always did (an orphan's entry lives until it is adopted or ended).
    fn make_room(&mut self, k: u32, grant_id: u64, access: Access) {
        if let Some(at) = self.find_grant(k, grant_id) {
            self.unhold_at(k, at);
        }
        if !self.is_held(k) {
            return;
        }
        let fits = match (self.class(k), access) {
            (Class::Shared, Access::Shared) => true,
            (Class::Semaphore, Access::Semaphore(n)) => n == self.slots(k),
            _ => false,
        };
        if !fits {
            while let Some(at) = self.first_at(k) {
                self.unhold_at(k, at);
            }
            return;
        }
        if let Access::Semaphore(n) = access {
            while self.holder_count(k) >= n {
                let at = self.first_at(k).expect("held");
                self.unhold_at(k, at);
            }
        }
    }

    /// Removes holder `at` of key slot `k` without an effect, and the
    /// orphan session entry it leaves empty.
    fn unhold_restored(&mut self, k: u32, at: At) {
        let h = self.unhold_at(k, at);
        self.owner_drop_if_empty_orphan(h.owner);
    }

    /// Removes every holder of key slot `k` without an effect.
    fn unhold_all(&mut self, k: u32) {
        while let Some(at) = self.first_at(k) {
            self.unhold_restored(k, at);
        }
    }

    /// Recovery: a release read from the log: the key loses every holder.
    pub fn restore_release(&mut self, key: &(impl AsRef<[u8]> + ?Sized), _now: Now) {
        if let Some(k) = self.find_key(key.as_ref()) {
            self.unhold_all(k);
            self.key_drop_if_unused(k);
        }
    }

    /// Replay of a Release record: the holder it names goes (the others of
    /// a shared or semaphore key stay). A record naming a grant the key
    /// does not have frees a key held exclusively, as a release always did
    /// (a snapshot taken while the table changed may hold the key's later
    /// holder: its own record follows), and changes nothing on a shared or
    /// semaphore key.
    pub fn restore_release_record(
        &mut self,
        key: &(impl AsRef<[u8]> + ?Sized),
        grant_id: u64,
        now: Now,
    ) {
        if !self.restore_release_grant(key, grant_id, now) {
            if let Some(k) = self.find_key(key.as_ref()) {
                if self.access_of(k) == Access::Exclusive {
                    self.restore_release(key, now);
                }
            }
        }
    }

    /// Replay of one holder's release: the holder `grant_id` of `key`
    /// goes, the others stay; nobody is granted (the log says who is next).
    /// False when it does not hold the key.
    pub fn restore_release_grant(
        &mut self,
        key: &(impl AsRef<[u8]> + ?Sized),
        grant_id: u64,
        _now: Now,
    ) -> bool {
        let Some(k) = self.find_key(key.as_ref()) else {
            return false;
        };
        let Some(at) = self.find_grant(k, grant_id) else {
            return false;
        };
        self.unhold_restored(k, at);
        self.note_if_unblocked(k);
        self.key_drop_if_unused(k);
        true
    }

    /// Forgets owner entry `o` if it is an orphan with nothing left (a
    /// follower's entry of a replicated session whose last hold was
    /// released by the log).
    pub(super) fn owner_drop_if_empty_orphan(&mut self, o: u32) {
        if o == NIL {
            return;
        }
        let e = &self.owners[o as usize];
        if e.tag == ORPHAN && e.held.is_empty() && e.shares.is_empty() && e.waiting.is_empty() {
            let id = e.id;
            self.owner_index.remove(&id);
            self.owners.remove(o as usize);
        }
    }

    /// Visits every holder, by reference: no allocation, no copy of a
    /// name. Exclusive holders and the other keys' inline holders come in
    /// grant order (oldest first), then the other holders of shared and
    /// semaphore keys in grant order. A [`HeldRef`] does not say how its
    /// key is held: [`Table::for_each_holder`] does.
    pub fn for_each_held(&self, mut f: impl FnMut(HeldRef<'_>)) {
        self.for_each_holder(|h, _| f(h));
    }

    /// [`Table::for_each_held`] with each holder's [`Access`].
    pub fn for_each_holder(&self, mut f: impl FnMut(HeldRef<'_>, Access)) {
        let mut cur = self.by_age.front();
        while let Some(k) = cur {
            let h = self.keys[k as usize].holder.as_ref().expect("held");
            f(self.ref_of(k, h), self.access_of(k));
            cur = List::next_of(&self.keys, k, K_AGE);
        }
        let mut cur = self.shares_by_age.front();
        while let Some(x) = cur {
            let s = &self.shares[x as usize];
            f(self.ref_of(s.key, &s.holder), self.access_of(s.key));
            cur = List::next_of(&self.shares, x, S_AGE);
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
    ///
    /// The keys' inline holders come first, then every other holder of a
    /// shared or semaphore key (a share), each visited as it is then or not
    /// at all when released before: a share granted since the start is
    /// beyond the walk's end, its record among those replayed after it.
    /// Holders visited at different times were all holding since the
    /// start, so they can hold their key together; and a hold record
    /// removes the holders that could not hold beside it.
    pub fn walk_begin(&mut self) {
        self.walk = match (self.by_age.front(), self.by_age.back()) {
            (Some(next), Some(last)) => Some(Walk { next, last }),
            _ => None,
        };
        self.share_walk = match (self.shares_by_age.front(), self.shares_by_age.back()) {
            (Some(next), Some(last)) => Some(Walk { next, last }),
            _ => None,
        };
    }

    /// Visits up to `max` more holders of the walk; true when it is
    /// complete.
    pub fn walk_step(&mut self, max: usize, mut f: impl FnMut(HeldRef<'_>)) -> bool {
        for _ in 0..max {
            if let Some(w) = self.walk {
                if let Some(h) = self.keys[w.next as usize].holder.as_ref() {
                    f(self.ref_of(w.next, h));
                }
                self.walk = if w.next == w.last {
                    None
                } else {
                    List::next_of(&self.keys, w.next, K_AGE).map(|next| Walk { next, ..w })
                };
            } else if let Some(w) = self.share_walk {
                let s = &self.shares[w.next as usize];
                f(self.ref_of(s.key, &s.holder));
                self.share_walk = if w.next == w.last {
                    None
                } else {
                    List::next_of(&self.shares, w.next, S_AGE).map(|next| Walk { next, ..w })
                };
            } else {
                return true;
            }
        }
        self.walk.is_none() && self.share_walk.is_none()
    }

    /// Abandons the walk in progress, if any.
    pub fn walk_end(&mut self) {
        self.walk = None;
        self.share_walk = None;
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
        let Some(at) = self.find_grant(key_slot, grant_id) else {
            return false;
        };
        self.unhold_at(key_slot, at);
        self.note_if_unblocked(key_slot);
        true
    }

    /// After undos: a key's next waiters are granted what they may hold
    /// now (a free key's head, or more holders of a shared or semaphore
    /// key that lost one), or the key is dropped when nobody holds or
    /// waits.
    pub fn settle(&mut self, key: &(impl AsRef<[u8]> + ?Sized), now: Now, fx: &mut Effects) {
        if let Some(k) = self.find_key(key.as_ref()) {
            self.grant_ready(k, now, fx);
        }
    }

    /// Grant id of the current holder of `key`, if held (a shared or
    /// semaphore key's oldest).
    pub fn grant_of(&self, key: &(impl AsRef<[u8]> + ?Sized)) -> Option<u64> {
        let k = self.find_key(key.as_ref())?;
        self.first_holder(k).map(|h| h.grant_id)
    }
}
