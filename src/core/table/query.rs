//! Read-only questions about a table: who holds a key, who waits for it,
//! and the held keys as a list.

use super::*;

impl Table {
    /// The holder of `key`, if held: an exclusive key's holder, a shared
    /// or semaphore key's oldest ([`Table::holders_of`] lists them all).
    pub fn holder_of(&self, key: &[u8]) -> Option<HeldKey> {
        self.held_key(self.find_key(key)?)
    }

    /// Every holder of `key` with how it holds the key, oldest first (none
    /// when it is free). Allocates: inspection and admin paths.
    pub fn holders_of(&self, key: &[u8]) -> Vec<(HeldKey, Access)> {
        let mut out = Vec::new();
        self.for_each_holder_of(key, |h, a| {
            out.push((
                h.to_owned()
                    .expect("keys are at most KEY_MAX, sources at most SOURCE_MAX"),
                a,
            ))
        });
        out.sort_unstable_by_key(|(h, _)| h.grant_id);
        out
    }

    /// Visits every holder of `key` (the inline one, then the others in
    /// grant order), by reference: no allocation.
    pub fn for_each_holder_of(&self, key: &[u8], mut f: impl FnMut(HeldRef<'_>, Access)) {
        let Some(k) = self.find_key(key) else {
            return;
        };
        let access = self.access_of(k);
        let e = &self.keys[k as usize];
        if let Some(h) = e.holder.as_ref() {
            f(self.ref_of(k, h), access);
        }
        let mut cur = self.others_front(k);
        while let Some(x) = cur {
            f(self.ref_of(k, &self.shares[x as usize].holder), access);
            cur = List::next_of(&self.shares, x, S_KEY);
        }
    }

    /// How `key` is held now, if it is (a semaphore with its `n`).
    pub fn access_of_key(&self, key: &[u8]) -> Option<Access> {
        let k = self.find_key(key)?;
        self.is_held(k).then(|| self.access_of(k))
    }

    /// How many hold `key`.
    pub fn holder_count_of(&self, key: &[u8]) -> usize {
        self.find_key(key)
            .map_or(0, |k| self.holder_count(k) as usize)
    }

    /// The `n` fixed for `key`'s semaphore while a semaphore request holds
    /// or waits on it.
    pub fn semaphore_slots_of(&self, key: &[u8]) -> Option<u32> {
        let k = self.find_key(key)?;
        let n = self.slots(k);
        (n != 0).then_some(n)
    }

    pub(super) fn held_key(&self, slot: u32) -> Option<HeldKey> {
        self.held_ref(slot)?.to_owned()
    }

    /// The holder that stands for key slot `slot` ([`Table::holder_of`]),
    /// by reference (no copy of a name).
    pub(super) fn held_ref(&self, slot: u32) -> Option<HeldRef<'_>> {
        Some(self.ref_of(slot, self.first_holder(slot)?))
    }

    /// Holder `h` of key slot `k`, by reference.
    pub(super) fn ref_of(&self, k: u32, h: &Holder) -> HeldRef<'_> {
        HeldRef {
            key: self.names.get(self.keys[k as usize].name),
            source: self.names.get(self.sources[h.source as usize].name),
            endpoint: h.endpoint.addr(),
            acquired_unix_ms: h.acquired_unix_ms,
            grant_id: h.grant_id,
            mode: h.mode,
            expires_unix_ms: h.expires_unix_ms,
            session: self.replicated_owner(h.owner),
            access: self.access_of(k),
        }
    }

    /// The id of owner entry `o` if it is a replicated session's, else 0.
    pub(super) fn replicated_owner(&self, o: u32) -> u64 {
        if o == NIL {
            return 0;
        }
        let id = self.owners[o as usize].id;
        if id & REPLICATED_SESSION != 0 {
            id
        } else {
            0
        }
    }

    /// A key's name as a [`Name`] (for an effect).
    pub(super) fn key_name(&self, k: u32) -> Name {
        Name::new(self.names.get(self.keys[k as usize].name)).expect("keys are at most KEY_MAX")
    }

    /// Every holder, sorted by key (admin path: allocates).
    pub fn held_list(&self) -> Vec<HeldKey> {
        let mut out: Vec<HeldKey> = Vec::with_capacity(self.held_keys());
        self.for_each_held(|h| {
            out.push(
                h.to_owned()
                    .expect("keys are at most KEY_MAX, sources at most SOURCE_MAX"),
            )
        });
        out.sort_unstable_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
        out
    }

    /// The connections queued on `key`, in queue order (inspection: the
    /// simulator's FIFO check).
    pub fn waiters_of(&self, key: &[u8], out: &mut Vec<Token>) {
        out.clear();
        let Some(k) = self.find_key(key) else {
            return;
        };
        let mut cur = self.keys[k as usize].queue.front();
        while let Some(w) = cur {
            out.push(self.waiters[w as usize].conn);
            cur = List::next_of(&self.waiters, w, W_KEY);
        }
    }

    /// The requests queued on `key`, in queue order, each with whose it
    /// is, its arrival number and its access (inspection: the simulators'
    /// FIFO check across accesses, which also needs
    /// [`Table::holder_ids_of`]).
    pub fn queue_of(&self, key: &[u8], out: &mut Vec<Queued>) {
        out.clear();
        let Some(k) = self.find_key(key) else {
            return;
        };
        let mut cur = self.keys[k as usize].queue.front();
        while let Some(w) = cur {
            let wt = &self.waiters[w as usize];
            out.push(Queued {
                who: self.who(wt.owner, wt.conn),
                seq: wt.seq,
                access: self.waiter_access(w),
            });
            cur = List::next_of(&self.waiters, w, W_KEY);
        }
    }

    /// Each holder of `key` as (grant id, whose it is: its session's id,
    /// else its connection), oldest grant first (inspection: allocates).
    pub fn holder_ids_of(&self, key: &[u8]) -> Vec<(u64, u64)> {
        let Some(k) = self.find_key(key) else {
            return Vec::new();
        };
        let mut out: Vec<(u64, u64)> = Vec::new();
        if let Some(h) = self.keys[k as usize].holder.as_ref() {
            out.push((h.grant_id, self.who(h.owner, h.conn)));
        }
        let mut cur = self.others_front(k);
        while let Some(x) = cur {
            let h = &self.shares[x as usize].holder;
            out.push((h.grant_id, self.who(h.owner, h.conn)));
            cur = List::next_of(&self.shares, x, S_KEY);
        }
        out.sort_unstable();
        out
    }

    /// A session's id (owner entry `owner`), else connection `conn`.
    fn who(&self, owner: u32, conn: Token) -> u64 {
        if owner == NIL {
            conn
        } else {
            self.owners[owner as usize].id
        }
    }

    /// The connection token of waiter node `w`, if it is queued.
    pub fn waiter_conn(&self, w: u32) -> Option<Token> {
        self.waiters.get(w as usize).map(|w| w.conn)
    }

    /// Calls `f` with the connection token of every queued waiter.
    pub fn for_each_waiter(&self, mut f: impl FnMut(Token)) {
        for (_, w) in self.waiters.iter() {
            f(w.conn);
        }
    }

    /// The connection token of `key`'s holder (inspection; a shared or
    /// semaphore key's oldest).
    pub fn holder_conn(&self, key: &[u8]) -> Option<Token> {
        let slot = self.find_key(key)?;
        self.first_holder(slot).map(|h| h.conn)
    }

    /// Number of waiters queued on `key`.
    pub fn queue_len(&self, key: &[u8]) -> usize {
        self.find_key(key)
            .map_or(0, |s| self.keys[s as usize].queue.len() as usize)
    }
}
