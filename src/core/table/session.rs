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
            shares: List::new(),
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

    /// The first hold of owner entry `o`: `(key slot, where)`.
    fn owner_first(&self, o: u32) -> Option<(u32, At)> {
        let e = &self.owners[o as usize];
        if let Some(k) = e.held.front() {
            return Some((k, At::Inline));
        }
        e.shares
            .front()
            .map(|x| (self.shares[x as usize].key, At::Share(x)))
    }

    /// The hold of owner entry `o` after `(k, at)` (inline holds, then
    /// shares).
    fn owner_next(&self, o: u32, k: u32, at: At) -> Option<(u32, At)> {
        match at {
            At::Inline => match List::next_of(&self.keys, k, K_OWN) {
                Some(n) => Some((n, At::Inline)),
                None => self.owners[o as usize]
                    .shares
                    .front()
                    .map(|x| (self.shares[x as usize].key, At::Share(x))),
            },
            At::Share(x) => List::next_of(&self.shares, x, S_OWN)
                .map(|x| (self.shares[x as usize].key, At::Share(x))),
        }
    }

    /// Every holder in grant order (inline holders, then shares): the
    /// first, as `(key slot, where)`.
    pub(super) fn age_first(&self) -> Option<(u32, At)> {
        if let Some(k) = self.by_age.front() {
            return Some((k, At::Inline));
        }
        self.shares_by_age
            .front()
            .map(|x| (self.shares[x as usize].key, At::Share(x)))
    }

    /// The holder after `(k, at)` in [`Table::age_first`]'s order.
    pub(super) fn age_next(&self, k: u32, at: At) -> Option<(u32, At)> {
        match at {
            At::Inline => match List::next_of(&self.keys, k, K_AGE) {
                Some(n) => Some((n, At::Inline)),
                None => self
                    .shares_by_age
                    .front()
                    .map(|x| (self.shares[x as usize].key, At::Share(x))),
            },
            At::Share(x) => List::next_of(&self.shares, x, S_AGE)
                .map(|x| (self.shares[x as usize].key, At::Share(x))),
        }
    }

    /// Holder `(k, at)` of owner entry `o` outlives its session: owned by
    /// nobody, without a connection.
    fn disown(&mut self, o: u32, k: u32, at: At) {
        match at {
            At::Inline => {
                let (owners, keys) = (&mut self.owners, &mut self.keys);
                owners[o as usize].held.unlink(keys, k, K_OWN);
            }
            At::Share(x) => {
                let (owners, shares) = (&mut self.owners, &mut self.shares);
                owners[o as usize].shares.unlink(shares, x, S_OWN);
            }
        }
        let h = self.holder_at_mut(k, at);
        h.owner = NIL;
        h.conn = NO_CONN;
    }

    /// Session holder `(k, at)` becomes a lease ending `keep_us` from now.
    fn session_to_lease(&mut self, k: u32, at: At, keep_us: u64, now: Now) {
        let h = self.holder_at_mut(k, at);
        h.mode = HoldMode::Lease;
        h.expires_mono_us = now.mono_us.saturating_add(keep_us);
        h.expires_unix_ms = now.unix_ms.saturating_add(keep_us / 1000);
        let (d, g) = (h.expires_mono_us, h.grant_id);
        self.leases.push(Reverse((d, k, g)));
    }

    /// Session `id` ended: its queued requests are withdrawn (nobody to
    /// answer), its session holds released (each key to its next waiters)
    /// and its leases and persistent holds outlive it, owned by nobody.
    pub fn owner_end(&mut self, id: u64, now: Now, fx: &mut Effects) {
        let Some(o) = self.owner_index.remove(&id) else {
            return;
        };
        while let Some(w) = self.owners[o as usize].waiting.front() {
            let waiter = self.detach_waiter(w);
            self.source_drop_if_unused(waiter.source);
        }
        while let Some((k, at)) = self.owner_first(o) {
            if self.holder_at(k, at).mode == HoldMode::Session {
                self.clear_at(k, at, now, ReleaseCause::SessionEnded, fx);
                self.grant_ready(k, now, fx);
            } else {
                self.disown(o, k, at);
            }
        }
        self.owners.remove(o as usize);
        self.grant_unblocked(now, fx);
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
        let Some((k, at)) = self.checked(owner, key, token) else {
            return self.why_not(owner, key, token);
        };
        self.clear_at(k, at, now, ReleaseCause::Released, fx);
        self.grant_ready(k, now, fx);
        Checked::Ok
    }

    /// The holder `token` of `key`, if `owner` may act on it: a session
    /// hold only its own session, other holds whoever names the token.
    fn checked(&self, owner: u32, key: &[u8], token: u64) -> Option<(u32, At)> {
        let k = self.find_key(key)?;
        let at = self.find_grant(k, token)?;
        let h = self.holder_at(k, at);
        (h.mode != HoldMode::Session || h.owner == owner).then_some((k, at))
    }

    fn why_not(&self, owner: u32, key: &[u8], token: u64) -> Checked {
        let held = self
            .find_key(key)
            .and_then(|k| Some(*self.holder_at(k, self.find_grant(k, token)?)));
        match held {
            Some(h) if h.owner != owner => Checked::NotOwner,
            Some(_) => Checked::Ok,
            None => Checked::Stale,
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
        let Some((k, at)) = self.checked(owner, key, token) else {
            return Err(self.why_not(owner, key, token));
        };
        let name = self.key_name(k);
        if self.holder_at(k, at).mode != HoldMode::Lease {
            return Err(Checked::NotLease);
        }
        self.listing_note(k);
        let h = self.holder_at_mut(k, at);
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

    /// Proclaim: the hold `token` of `key` is held under `source` from now
    /// on, its token, mode, access and deadline unchanged; who may is as
    /// for a release. Refused past the limit on names
    /// ([`Checked::Limit`]); nothing changes on a refusal.
    pub fn proclaim(
        &mut self,
        owner: u32,
        key: &(impl AsRef<[u8]> + ?Sized),
        token: u64,
        source: &[u8],
    ) -> Result<Proclaimed, Checked> {
        let key = key.as_ref();
        let Some((k, at)) = self.checked(owner, key, token) else {
            return Err(self.why_not(owner, key, token));
        };
        let prev = self
            .ref_of(k, self.holder_at(k, at))
            .to_owned()
            .expect("keys are at most KEY_MAX, sources at most SOURCE_MAX");
        if !self.relabel(k, at, source) {
            return Err(Checked::Limit);
        }
        Ok(Proclaimed { key_slot: k, prev })
    }

    /// Sets the source of holder `grant_id` of `key` (a proclaim undone).
    /// False if it is not a holder, or past the limit on names.
    pub fn set_source(
        &mut self,
        key: &(impl AsRef<[u8]> + ?Sized),
        grant_id: u64,
        source: &[u8],
    ) -> bool {
        let Some(k) = self.find_key(key.as_ref()) else {
            return false;
        };
        let Some(at) = self.find_grant(k, grant_id) else {
            return false;
        };
        self.relabel(k, at, source)
    }

    /// Moves holder `(k, at)` to source `source` (its source entry's lists
    /// follow; the old entry is dropped once unused).
    fn relabel(&mut self, k: u32, at: At, source: &[u8]) -> bool {
        if source.len() > SOURCE_MAX {
            return false;
        }
        let old = self.holder_at(k, at).source;
        let Some(s) = self.source_get_or_insert(source) else {
            return false;
        };
        if s == old {
            return true;
        }
        self.listing_note(k);
        match at {
            At::Inline => {
                let (sources, keys) = (&mut self.sources, &mut self.keys);
                sources[old as usize].held.unlink(keys, k, K_SRC);
                sources[s as usize].held.push_back(keys, k, K_SRC);
            }
            At::Share(x) => {
                let (sources, shares) = (&mut self.sources, &mut self.shares);
                sources[old as usize].shares.unlink(shares, x, S_SRC);
                sources[s as usize].shares.push_back(shares, x, S_SRC);
            }
        }
        self.holder_at_mut(k, at).source = s;
        self.source_drop_if_unused(old);
        true
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
        let Some(at) = self.find_grant(k, grant_id) else {
            return false;
        };
        if self.holder_at(k, at).mode != HoldMode::Lease {
            return false;
        }
        self.listing_note(k);
        let h = self.holder_at_mut(k, at);
        h.expires_unix_ms = unix_ms;
        h.expires_mono_us = mono_us;
        self.leases.push(Reverse((mono_us, k, grant_id)));
        true
    }

    /// A new leader's promise (cluster mode): every lease deadline moves
    /// `by_us` later, none earlier (a deadline is a lower bound; the old
    /// leader may have extended it in an entry this node has not applied).
    /// Every holder of a shared key too.
    pub fn extend_leases(&mut self, by_us: u64) {
        let mut cur = self.age_first();
        while let Some((k, at)) = cur {
            cur = self.age_next(k, at);
            let h = self.holder_at_mut(k, at);
            if h.mode != HoldMode::Lease {
                continue;
            }
            h.expires_mono_us = h.expires_mono_us.saturating_add(by_us);
            h.expires_unix_ms = h.expires_unix_ms.saturating_add(by_us / 1000);
            let (d, g) = (h.expires_mono_us, h.grant_id);
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
        while let Some((k, at)) = self.owner_first(o) {
            self.disown(o, k, at);
            if self.holder_at(k, at).mode == HoldMode::Session {
                self.session_to_lease(k, at, keep_us, now);
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
        self.drop_session_waiters();
        let mut cur = self.age_first();
        while let Some((k, at)) = cur {
            cur = self.age_next(k, at);
            let owner = self.holder_at(k, at).owner;
            if owner != NIL && self.replicated_owner(owner) == 0 {
                self.disown(owner, k, at);
            }
            self.holder_at_mut(k, at).conn = NO_CONN;
        }
        let ids: Vec<u64> = self.owner_index.keys().copied().collect();
        for id in ids {
            if id & REPLICATED_SESSION != 0 {
                let o = self.owner_index[&id];
                self.orphan_entry(o);
                continue;
            }
            if let Some(o) = self.owner_index.remove(&id) {
                self.owners.remove(o as usize);
            }
        }
    }

    /// Drops every queued request of every session, answering none (a
    /// leader stepping down closes their connections; a resumed client
    /// asks again). No effect. A cluster leader that steps down does this
    /// *before* undoing its records still in flight: a request queued
    /// meanwhile may have fixed a semaphore's `n` that an undone Release
    /// gives back to its holder with another (its queueing depended on the
    /// voided records), and the undo must find the key as those records
    /// left it.
    pub fn drop_session_waiters(&mut self) {
        let owners: Vec<u32> = self.owners.iter().map(|(o, _)| o as u32).collect();
        for o in owners {
            while let Some(w) = self.owners[o as usize].waiting.front() {
                let waiter = self.detach_waiter(w);
                self.source_drop_if_unused(waiter.source);
            }
        }
    }

    /// A leader starts serving (cluster mode): the session holds it has
    /// are owned by sessions of an earlier leader, which it does not know.
    /// Their clients counted on them until at most a keep-alive after their
    /// last answered renewal, which was before now: each becomes a lease
    /// ending `keep_us` from now, owned by nobody. No effect.
    pub fn expire_orphans(&mut self, keep_us: u64, now: Now) {
        let mut cur = self.age_first();
        while let Some((k, at)) = cur {
            cur = self.age_next(k, at);
            let h = self.holder_at(k, at);
            if h.mode != HoldMode::Session || h.owner != NIL {
                continue;
            }
            self.session_to_lease(k, at, keep_us, now);
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
        let mut cur = self.owner_first(o);
        while let Some((k, at)) = cur {
            cur = self.owner_next(o, k, at);
            self.holder_at_mut(k, at).conn = NO_CONN;
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
        let mut cur = self.owner_first(o);
        while let Some((k, at)) = cur {
            cur = self.owner_next(o, k, at);
            let h = self.holder_at(k, at);
            f(self.ref_of(k, h), h.expires_mono_us);
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
    /// session has queued). Of a shared or semaphore key's queue, the
    /// requests behind it may be grantable now: [`Table::grant_unblocked`].
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
            let live = self.grant_in(k, gid).filter(|&at| {
                let h = self.holder_at(k, at);
                h.mode == HoldMode::Lease && h.expires_mono_us == d
            });
            if let Some(at) = live {
                self.clear_at(k, at, now, ReleaseCause::Expired, fx);
                self.grant_ready(k, now, fx);
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
        self.grant_unblocked(now, fx);
        // Outdated entries pile up only through extends; rebuild when they
        // outnumber the live leases (amortised over those extends).
        if self.leases.len() > 1024 && self.leases.len() > 4 * self.holders() {
            let mut leases = std::mem::take(&mut self.leases);
            leases.retain(|&Reverse((d, k, gid))| {
                self.grant_in(k, gid)
                    .is_some_and(|at| self.holder_at(k, at).expires_mono_us == d)
            });
            self.leases = leases;
        }
    }

    /// The lease deadline (monotonic µs) of grant `grant_id` on `key`, if
    /// it holds the key as a lease (inspection: the cluster simulator's
    /// lease bound).
    pub fn lease_deadline_us(&self, key: &[u8], grant_id: u64) -> Option<u64> {
        let k = self.find_key(key)?;
        let h = self.holder_at(k, self.find_grant(k, grant_id)?);
        (h.mode == HoldMode::Lease).then_some(h.expires_mono_us)
    }
}
