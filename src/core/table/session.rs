//! Sessions, leases and deadlines: the entries of the sessions that hold
//! or wait, their tokens, leases extended and expired, orphans kept and
//! adopted, requests cancelled, waits that time out.

use super::*;

impl Table {
    /// The table's entry for session `id` (created on first use), whose
    /// holds and queued requests it tracks; `tag` is the caller's routing
    /// data, returned by [`Table::owner_info`]. `None`: over the limit (one
    /// session per possible key or waiter).
    pub fn owner_open(&mut self, id: u64, tag: u64) -> Option<u32> {
        if let Some(&o) = self.owner_index.get(&id) {
            return Some(o);
        }
        if self.owners.len() >= self.limits().max_keys + self.limits().max_waiters {
            return None;
        }
        let o = self.owners.insert(OwnerEntry {
            id,
            tag,
            held: List::new(),
            waiting: List::new(),
        }) as u32;
        self.owner_index.insert(id, o);
        Some(o)
    }

    /// `(id, tag)` of a live owner entry.
    pub fn owner_info(&self, o: u32) -> Option<(u64, u64)> {
        self.owners.get(o as usize).map(|e| (e.id, e.tag))
    }

    /// Sessions this table tracks.
    pub fn sessions(&self) -> usize {
        self.owners.len()
    }

    /// Session `id` ended: its queued requests are withdrawn (nobody to
    /// answer), its session holds released (each key to its next waiter)
    /// and its leases and persistent holds outlive it, owned by nobody.
    pub fn owner_end(&mut self, id: u64, now: Now, fx: &mut Effects) {
        let Some(o) = self.owner_index.remove(&id) else {
            return;
        };
        while let Some(w) = self.owners[o as usize].waiting.front() {
            let waiter = self.detach_waiter(w);
            self.source_drop_if_unused(waiter.source);
        }
        while let Some(k) = self.owners[o as usize].held.front() {
            let h = self.keys[k as usize]
                .holder
                .expect("an owner's key is held");
            if h.mode == HoldMode::Session {
                self.clear_holder(k, now, ReleaseCause::SessionEnded, fx);
                self.grant_next(k, now, fx);
            } else {
                let (owners, keys) = (&mut self.owners, &mut self.keys);
                owners[o as usize].held.unlink(keys, k, K_OWN);
                let h = self.keys[k as usize].holder.as_mut().expect("held");
                h.owner = NIL;
                h.conn = NO_CONN;
            }
        }
        self.owners.remove(o as usize);
    }

    /// Releases `key` if `token` is its current grant and `owner` may:
    /// a session hold only by its own session, other holds by whoever
    /// names the token.
    pub fn release_token(
        &mut self,
        owner: u32,
        key: &(impl AsRef<[u8]> + ?Sized),
        token: u64,
        now: Now,
        fx: &mut Effects,
    ) -> Checked {
        let key = key.as_ref();
        let Some(k) = self.checked(owner, key, token) else {
            return self.why_not(owner, key, token);
        };
        self.clear_holder(k, now, ReleaseCause::Released, fx);
        self.grant_next(k, now, fx);
        Checked::Ok
    }

    pub(super) fn checked(&self, owner: u32, key: &[u8], token: u64) -> Option<u32> {
        let k = self.find_key(key)?;
        let h = self.keys[k as usize].holder?;
        (h.grant_id == token && (h.mode != HoldMode::Session || h.owner == owner)).then_some(k)
    }

    pub(super) fn why_not(&self, owner: u32, key: &[u8], token: u64) -> Checked {
        match self
            .find_key(key)
            .and_then(|k| self.keys[k as usize].holder)
        {
            Some(h) if h.grant_id == token && h.owner != owner => Checked::NotOwner,
            Some(h) if h.grant_id == token => Checked::Ok,
            _ => Checked::Stale,
        }
    }

    /// Extends the lease `token` of `key` to `ttl_ms` from now.
    pub fn extend(
        &mut self,
        owner: u32,
        key: &(impl AsRef<[u8]> + ?Sized),
        token: u64,
        ttl_ms: u32,
        now: Now,
    ) -> Result<Extended, Checked> {
        let key = key.as_ref();
        let Some(k) = self.checked(owner, key, token) else {
            return Err(self.why_not(owner, key, token));
        };
        let name = self.key_name(k);
        if self.keys[k as usize].holder.map(|h| h.mode) != Some(HoldMode::Lease) {
            return Err(Checked::NotLease);
        }
        self.listing_note(k);
        let h = self.keys[k as usize].holder.as_mut().expect("checked");
        let x = Extended {
            key: name,
            grant_id: token,
            expires_unix_ms: now.unix_ms + ttl_ms as u64,
            expires_mono_us: now.mono_us + ttl_ms as u64 * 1000,
            prev_unix_ms: h.expires_unix_ms,
            prev_mono_us: h.expires_mono_us,
        };
        h.expires_unix_ms = x.expires_unix_ms;
        h.expires_mono_us = x.expires_mono_us;
        self.leases.push(Reverse((x.expires_mono_us, k, token)));
        Ok(x)
    }

    /// Sets lease `grant_id` of `key` to expire at the given times (an
    /// extend read from the log, or undone). False if it is not the holder.
    pub fn set_expiry(
        &mut self,
        key: &(impl AsRef<[u8]> + ?Sized),
        grant_id: u64,
        unix_ms: u64,
        mono_us: u64,
    ) -> bool {
        let Some(k) = self.find_key(key.as_ref()) else {
            return false;
        };
        let listed = self.keys[k as usize]
            .holder
            .is_some_and(|h| h.grant_id == grant_id && h.mode == HoldMode::Lease);
        if listed {
            self.listing_note(k);
        }
        match self.keys[k as usize].holder.as_mut() {
            Some(h) if h.grant_id == grant_id && h.mode == HoldMode::Lease => {
                h.expires_unix_ms = unix_ms;
                h.expires_mono_us = mono_us;
                self.leases.push(Reverse((mono_us, k, grant_id)));
                true
            }
            _ => false,
        }
    }

    /// A new leader's promise (cluster mode): every lease deadline moves
    /// `by_us` later, none earlier (a deadline is a lower bound; the old
    /// leader may have extended it in an entry this node has not applied).
    /// Each moved deadline is pushed to `out`: the leader replicates them
    /// (Extend records) before it answers anything, so that what it tells
    /// a client of a lease's time left is what every later leader knows.
    pub fn extend_leases(&mut self, by_us: u64, out: &mut Vec<Extended>) {
        let mut cur = self.by_age.front();
        while let Some(k) = cur {
            cur = List::next_of(&self.keys, k, K_AGE);
            if self.keys[k as usize].holder.map(|h| h.mode) != Some(HoldMode::Lease) {
                continue;
            }
            let key = self.key_name(k);
            let h = self.keys[k as usize].holder.as_mut().expect("held");
            let (prev_unix_ms, prev_mono_us) = (h.expires_unix_ms, h.expires_mono_us);
            h.expires_mono_us = h.expires_mono_us.saturating_add(by_us);
            h.expires_unix_ms = h.expires_unix_ms.saturating_add(by_us / 1000);
            let (d, g) = (h.expires_mono_us, h.grant_id);
            out.push(Extended {
                key,
                grant_id: g,
                expires_unix_ms: h.expires_unix_ms,
                expires_mono_us: d,
                prev_unix_ms,
                prev_mono_us,
            });
            self.leases.push(Reverse((d, k, g)));
        }
    }

    /// Session `id` ended with its leader (cluster mode): its queued
    /// requests are withdrawn; its session holds become leases ending
    /// `keep_us` from now, owned by nobody (its client may still believe in
    /// them until its keep-alive runs out); its other holds outlive it as
    /// on [`Table::owner_end`]. No effect.
    /// A replicated session (the [`REPLICATED_SESSION`] bit) instead keeps
    /// its holds, its entry turned [`ORPHAN`]: a new leader, or this one
    /// after a resume, knows them as the session's.
    pub fn orphan_owner(&mut self, id: u64, keep_us: u64, now: Now) {
        if id & REPLICATED_SESSION != 0 {
            if let Some(&o) = self.owner_index.get(&id) {
                self.orphan_entry(o);
            }
            return;
        }
        let Some(o) = self.owner_index.remove(&id) else {
            return;
        };
        while let Some(w) = self.owners[o as usize].waiting.front() {
            let waiter = self.detach_waiter(w);
            self.source_drop_if_unused(waiter.source);
        }
        while let Some(k) = self.owners[o as usize].held.front() {
            let (owners, keys) = (&mut self.owners, &mut self.keys);
            owners[o as usize].held.unlink(keys, k, K_OWN);
            let h = self.keys[k as usize]
                .holder
                .as_mut()
                .expect("an owner's key is held");
            h.owner = NIL;
            h.conn = NO_CONN;
            if h.mode == HoldMode::Session {
                h.mode = HoldMode::Lease;
                h.expires_mono_us = now.mono_us.saturating_add(keep_us);
                h.expires_unix_ms = now.unix_ms.saturating_add(keep_us / 1000);
                let (d, g) = (h.expires_mono_us, h.grant_id);
                self.leases.push(Reverse((d, k, g)));
            }
        }
        self.owners.remove(o as usize);
    }

    /// Visits every session this table tracks: `(id, tag)`.
    pub fn for_each_owner(&self, mut f: impl FnMut(u64, u64)) {
        for (_, e) in self.owners.iter() {
            f(e.id, e.tag);
        }
    }

    /// This node stopped leading (cluster mode): its sessions went with
    /// their connections, but their holds are in the replicated log and
    /// their clients may still believe in them. Every hold loses its owner
    /// and connection (a session hold stays a session hold, owned by
    /// nobody, as the other replicas hold it, until a leader starts serving:
    /// [`Table::expire_orphans`]); every owner entry and its queued
    /// requests are dropped. No effect.
    ///
    /// A replicated session's entry stays, [`ORPHAN`], with its holds (its
    /// queued requests are dropped): they are the log's, and its client
    /// may resume it on the next leader.
    pub fn drop_owners(&mut self) {
        let mut cur = self.by_age.front();
        while let Some(k) = cur {
            cur = List::next_of(&self.keys, k, K_AGE);
            let Some(h) = self.keys[k as usize].holder else {
                continue;
            };
            if h.owner != NIL && self.replicated_owner(h.owner) == 0 {
                let (owners, keys) = (&mut self.owners, &mut self.keys);
                owners[h.owner as usize].held.unlink(keys, k, K_OWN);
                let h = self.keys[k as usize].holder.as_mut().expect("held");
                h.owner = NIL;
            }
            let h = self.keys[k as usize].holder.as_mut().expect("held");
            h.conn = NO_CONN;
        }
        let ids: Vec<u64> = self.owner_index.keys().copied().collect();
        for id in ids {
            if id & REPLICATED_SESSION != 0 {
                let o = self.owner_index[&id];
                self.orphan_entry(o);
                continue;
            }
            if let Some(o) = self.owner_index.remove(&id) {
                while let Some(w) = self.owners[o as usize].waiting.front() {
                    let waiter = self.detach_waiter(w);
                    self.source_drop_if_unused(waiter.source);
                }
                self.owners.remove(o as usize);
            }
        }
    }

    /// A leader starts serving (cluster mode): the session holds it has
    /// are owned by sessions of an earlier leader, which it does not know.
    /// Their clients counted on them until at most a keep-alive after their
    /// last answered renewal, which was before now: each becomes a lease
    /// ending `keep_us` from now, owned by nobody. No effect.
    pub fn expire_orphans(&mut self, keep_us: u64, now: Now) {
        let mut cur = self.by_age.front();
        while let Some(k) = cur {
            cur = List::next_of(&self.keys, k, K_AGE);
            let Some(h) = self.keys[k as usize].holder.as_mut() else {
                continue;
            };
            if h.mode != HoldMode::Session || h.owner != NIL {
                continue;
            }
            h.mode = HoldMode::Lease;
            h.expires_mono_us = now.mono_us.saturating_add(keep_us);
            h.expires_unix_ms = now.unix_ms.saturating_add(keep_us / 1000);
            let (d, g) = (h.expires_mono_us, h.grant_id);
            self.leases.push(Reverse((d, k, g)));
        }
    }

    /// Turns owner entry `o` [`ORPHAN`]: its queued requests are dropped
    /// unanswered (waiters are a connection's), its holds stay, without a
    /// connection. No effect.
    pub(super) fn orphan_entry(&mut self, o: u32) {
        while let Some(w) = self.owners[o as usize].waiting.front() {
            let waiter = self.detach_waiter(w);
            self.source_drop_if_unused(waiter.source);
        }
        let mut cur = self.owners[o as usize].held.front();
        while let Some(k) = cur {
            cur = List::next_of(&self.keys, k, K_OWN);
            if let Some(h) = self.keys[k as usize].holder.as_mut() {
                h.conn = NO_CONN;
            }
        }
        self.owners[o as usize].tag = ORPHAN;
    }

    /// A resume of replicated session `id`, now routed by `tag`: its
    /// queued requests (an earlier connection's) are dropped unanswered,
    /// and `f` visits each hold it has, with a lease's deadline on the
    /// monotonic clock (0 for other modes). A session this table has no
    /// entry for has no holds here. No effect.
    pub fn adopt(&mut self, id: u64, tag: u64, mut f: impl FnMut(HeldRef<'_>, u64)) {
        let Some(&o) = self.owner_index.get(&id) else {
            return;
        };
        self.orphan_entry(o);
        self.owners[o as usize].tag = tag;
        let mut cur = self.owners[o as usize].held.front();
        while let Some(k) = cur {
            cur = List::next_of(&self.keys, k, K_OWN);
            if let (Some(r), Some(h)) = (self.held_ref(k), self.keys[k as usize].holder) {
                f(r, h.expires_mono_us);
            }
        }
    }

    /// Replicated sessions this table keeps for nobody ([`ORPHAN`]).
    pub fn orphans(&self) -> Vec<u64> {
        self.owners
            .iter()
            .filter(|(_, e)| e.tag == ORPHAN)
            .map(|(_, e)| e.id)
            .collect()
    }

    /// Ends replicated session `id` here if nobody resumed it (still
    /// [`ORPHAN`]): as [`Table::owner_end`]. False if it was resumed or
    /// is gone.
    pub fn end_orphan(&mut self, id: u64, now: Now, fx: &mut Effects) -> bool {
        match self.owner_index.get(&id) {
            Some(&o) if self.owners[o as usize].tag == ORPHAN => {
                self.owner_end(id, now, fx);
                true
            }
            _ => false,
        }
    }

    /// Withdraws the queued request of session `owner` whose connection
    /// token is `conn` and answers it [`Reply::Cancelled`]. False when no
    /// such request is queued (it was answered already). O(requests the
    /// session has queued).
    pub fn cancel(&mut self, owner: u32, conn: Token, key: &[u8], fx: &mut Effects) -> bool {
        let Some(e) = self.owners.get(owner as usize) else {
            return false;
        };
        let mut cur = e.waiting.front();
        while let Some(w) = cur {
            let wt = &self.waiters[w as usize];
            // The request (rid) *and* its key must match: a Cancel that
            // names another key cancels nothing.
            if wt.conn == conn && self.names.get(self.keys[wt.key as usize].name) == key {
                let waiter = self.detach_waiter(w);
                self.source_drop_if_unused(waiter.source);
                fx.push(Effect::Reply {
                    conn,
                    reply: Reply::Cancelled,
                });
                return true;
            }
            cur = List::next_of(&self.waiters, w, W_OWN);
        }
        false
    }

    /// The earliest lease or wait deadline (monotonic µs), if any. It may be
    /// an outdated entry: waking for it early is harmless.
    pub fn next_expiry_us(&self) -> Option<u64> {
        let l = self.leases.peek().map(|Reverse((d, _, _))| *d);
        let w = self.waits.peek().map(|Reverse((d, _, _))| *d);
        match (l, w) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Expires every lease and every wait whose deadline is at or before
    /// `now`: a lease is released (the key goes to its next waiter), a
    /// waiter answered [`Reply::TimedOut`]. Costs O(expired + outdated heap
    /// entries), independent of how many keys are held.
    pub fn expire(&mut self, now: Now, fx: &mut Effects) {
        while let Some(&Reverse((d, k, gid))) = self.leases.peek() {
            if d > now.mono_us {
                break;
            }
            self.leases.pop();
            let live = self
                .keys
                .get(k as usize)
                .and_then(|e| e.holder)
                .is_some_and(|h| {
                    h.grant_id == gid && h.mode == HoldMode::Lease && h.expires_mono_us == d
                });
            if live {
                self.clear_holder(k, now, ReleaseCause::Expired, fx);
                self.grant_next(k, now, fx);
            }
        }
        while let Some(&Reverse((d, w, seq))) = self.waits.peek() {
            if d > now.mono_us {
                break;
            }
            self.waits.pop();
            if self.waiters.get(w as usize).is_some_and(|x| x.seq == seq) {
                let waiter = self.detach_waiter(w);
                self.source_drop_if_unused(waiter.source);
                fx.push(Effect::Reply {
                    conn: waiter.conn,
                    reply: Reply::TimedOut,
                });
            }
        }
        // Outdated entries pile up only through extends; rebuild when they
        // outnumber the live leases (amortised over those extends).
        if self.leases.len() > 1024 && self.leases.len() > 4 * self.by_age.len() as usize {
            let keys = &self.keys;
            self.leases.retain(|Reverse((d, k, gid))| {
                keys.get(*k as usize)
                    .and_then(|e| e.holder)
                    .is_some_and(|h| h.grant_id == *gid && h.expires_mono_us == *d)
            });
        }
    }

    /// The lease deadline of `key`'s holder (monotonic µs), if it is a lease.
    pub fn lease_deadline_us(&self, key: &[u8]) -> Option<u64> {
        let k = self.find_key(key)?;
        let h = self.keys[k as usize].holder?;
        (h.mode == HoldMode::Lease).then_some(h.expires_mono_us)
    }
}
