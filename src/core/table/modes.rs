//! Lock modes (issue #33): where a key's holders are (inline, or shares
//! on its [`Multi`]), how a request's [`Access`] fits beside them, and
//! the bookkeeping of shares, semaphore counts and keys left with a
//! grantable queue head. The queue and release paths that use them are
//! in `table.rs`.

use super::*;

impl Table {
    /// Where grant `grant_id` holds key slot `k`, if `k` is a live key
    /// that it holds.
    pub(super) fn grant_in(&self, k: u32, grant_id: u64) -> Option<At> {
        self.keys.get(k as usize)?;
        self.find_grant(k, grant_id)
    }

    /// Where grant `grant_id` holds the live key slot `k`, if it does:
    /// the inline holder is one comparison, a share one probe of
    /// `share_of`.
    pub(super) fn find_grant(&self, k: u32, grant_id: u64) -> Option<At> {
        let e = &self.keys[k as usize];
        if e.holder.is_some_and(|h| h.grant_id == grant_id) {
            return Some(At::Inline);
        }
        // An exclusive key has no share: no probe.
        self.others_front(k)?;
        let &x = self.share_of.get(&grant_id)?;
        (self.shares[x as usize].key == k).then_some(At::Share(x))
    }

    #[inline]
    pub(super) fn holder_at(&self, k: u32, at: At) -> &Holder {
        match at {
            At::Inline => self.keys[k as usize].holder.as_ref().expect("held"),
            At::Share(x) => &self.shares[x as usize].holder,
        }
    }

    #[inline]
    pub(super) fn holder_at_mut(&mut self, k: u32, at: At) -> &mut Holder {
        match at {
            At::Inline => self.keys[k as usize].holder.as_mut().expect("held"),
            At::Share(x) => &mut self.shares[x as usize].holder,
        }
    }

    /// Live key slot `k`'s [`Multi`], if it has one.
    #[inline]
    pub(super) fn multi(&self, k: u32) -> Option<&Multi> {
        let m = self.keys[k as usize].multi;
        (m != NIL).then(|| &self.multis[m as usize])
    }

    /// Live key slot `k`'s [`Multi`], made if it has none.
    pub(super) fn multi_make(&mut self, k: u32) -> &mut Multi {
        if self.keys[k as usize].multi == NIL {
            let m = self.multis.insert(Multi {
                others: List::new(),
                held_as: Class::Exclusive,
                slots: 0,
                sem_users: 0,
            });
            self.keys[k as usize].multi = m as u32;
        }
        &mut self.multis[self.keys[k as usize].multi as usize]
    }

    /// Drops key slot `k`'s [`Multi`] once nothing needs it: no share, no
    /// semaphore request, and no inline holder that is not exclusive.
    #[inline]
    pub(super) fn multi_drop_if_unused(&mut self, k: u32) {
        if self.keys[k as usize].multi != NIL {
            self.multi_drop_if_unused_slow(k);
        }
    }

    fn multi_drop_if_unused_slow(&mut self, k: u32) {
        let e = &self.keys[k as usize];
        if e.multi == NIL {
            return;
        }
        let m = &self.multis[e.multi as usize];
        if m.others.is_empty()
            && m.sem_users == 0
            && (e.holder.is_none() || m.held_as == Class::Exclusive)
        {
            self.multis.remove(e.multi as usize);
            self.keys[k as usize].multi = NIL;
        }
    }

    /// The first share of key slot `k`, if it has one.
    #[inline]
    pub(super) fn others_front(&self, k: u32) -> Option<u32> {
        self.multi(k)?.others.front()
    }

    /// Key slot `k`'s semaphore `n` (0: none fixed).
    #[inline]
    pub(super) fn slots(&self, k: u32) -> u32 {
        self.multi(k).map_or(0, |m| m.slots)
    }

    /// How key slot `k` is held (meaningless while it is free).
    #[inline]
    pub(super) fn class(&self, k: u32) -> Class {
        self.multi(k).map_or(Class::Exclusive, |m| m.held_as)
    }

    /// True while somebody holds live key slot `k`.
    #[inline]
    pub(super) fn is_held(&self, k: u32) -> bool {
        let e = &self.keys[k as usize];
        e.holder.is_some() || (e.multi != NIL && !self.multis[e.multi as usize].others.is_empty())
    }

    /// How many hold live key slot `k`.
    #[inline]
    pub(super) fn holder_count(&self, k: u32) -> u32 {
        self.keys[k as usize].holder.is_some() as u32 + self.multi(k).map_or(0, |m| m.others.len())
    }

    /// How the holders of held key slot `k` hold it.
    #[inline]
    pub(super) fn access_of(&self, k: u32) -> Access {
        access_in(&self.keys[k as usize], &self.multis)
    }

    /// The access of waiter `w` (a semaphore's `n` is its key's).
    #[inline]
    pub(super) fn waiter_access(&self, w: u32) -> Access {
        let wt = &self.waiters[w as usize];
        match wt.class {
            Class::Exclusive => Access::Exclusive,
            Class::Shared => Access::Shared,
            Class::Semaphore => Access::Semaphore(self.slots(wt.key)),
        }
    }

    /// True when a request of class `c` may hold key slot `k` beside its
    /// holders now (the queue aside). A semaphore's `n` is the key's (a
    /// request of another `n` was refused before it got here).
    #[inline]
    pub(super) fn compatible(&self, k: u32, c: Class) -> bool {
        let e = &self.keys[k as usize];
        if e.multi == NIL {
            // Free, or held by an exclusive holder: the hand-off path asks
            // nothing else.
            return e.holder.is_none();
        }
        self.compatible_multi(k, c)
    }

    fn compatible_multi(&self, k: u32, c: Class) -> bool {
        if !self.is_held(k) {
            return true;
        }
        let m = self.multi(k).expect("a multi");
        match (m.held_as, c) {
            (Class::Shared, Class::Shared) => true,
            (Class::Semaphore, Class::Semaphore) => self.holder_count(k) < m.slots,
            _ => false,
        }
    }

    /// The holder that stands for key `k` where one is asked for
    /// ([`Table::holder_of`], [`Table::grant_of`], a `KEYS` entry): an
    /// exclusive key's holder, else the oldest of its holders.
    pub(super) fn first_holder(&self, k: u32) -> Option<&Holder> {
        first_of(&self.keys[k as usize], &self.multis, &self.shares)
    }

    /// Makes `conn` a holder of key slot `k` beside its inline holder: a
    /// new share (its waiter of the budget taken by the caller).
    pub(super) fn hold_share(
        &mut self,
        k: u32,
        source: u32,
        endpoint: Endpoint,
        conn: Token,
        spec: Spec,
    ) -> u32 {
        self.listing_note(k);
        let x = self.shares.insert(Share {
            key: k,
            holder: Self::holder_of_spec(source, endpoint, conn, spec),
            links: [Link::default(); 4],
        }) as u32;
        let dup = self.share_of.insert(spec.grant_id, x);
        assert!(dup.is_none(), "grant {} held twice", spec.grant_id);
        self.took(k, spec.access, true);
        self.next_grant_id = self.next_grant_id.max(spec.grant_id + 1);
        {
            let m = self.keys[k as usize].multi;
            let (multis, shares) = (&mut self.multis, &mut self.shares);
            multis[m as usize].others.push_back(shares, x, S_KEY);
        }
        {
            let (sources, shares) = (&mut self.sources, &mut self.shares);
            sources[source as usize].shares.push_back(shares, x, S_SRC);
        }
        self.shares_by_age.push_back(&mut self.shares, x, S_AGE);
        if spec.owner != NIL {
            let (owners, shares) = (&mut self.owners, &mut self.shares);
            owners[spec.owner as usize]
                .shares
                .push_back(shares, x, S_OWN);
        }
        if spec.mode == HoldMode::Lease {
            self.leases
                .push(Reverse((spec.expires_mono_us, k, spec.grant_id)));
        }
        x
    }

    /// Bookkeeping of a holder added to key slot `k` (`was_held`: it had
    /// one already). An exclusive holder of a key without a [`Multi`]
    /// (always, but while semaphore requests wait) touches nothing.
    #[inline]
    pub(super) fn took(&mut self, k: u32, access: Access, was_held: bool) {
        if !was_held {
            self.held += 1;
        }
        if access == Access::Exclusive && self.keys[k as usize].multi == NIL {
            return;
        }
        self.took_multi(k, access);
    }

    fn took_multi(&mut self, k: u32, access: Access) {
        let m = self.multi_make(k);
        m.held_as = Class::of(access);
        if let Access::Semaphore(n) = access {
            m.slots = n;
            m.sem_users += 1;
        }
        match access {
            Access::Exclusive => {}
            Access::Shared => self.shared_holders += 1,
            Access::Semaphore(_) => self.semaphore_holders += 1,
        }
    }

    /// Bookkeeping of a holder removed from key slot `k`.
    #[inline]
    pub(super) fn gave_up(&mut self, k: u32) {
        let e = &self.keys[k as usize];
        if e.multi == NIL {
            // An exclusive holder was the only one.
            debug_assert!(e.holder.is_none());
            self.held -= 1;
            return;
        }
        self.gave_up_multi(k);
    }

    fn gave_up_multi(&mut self, k: u32) {
        if !self.is_held(k) {
            self.held -= 1;
        }
        let m = self.keys[k as usize].multi;
        let m = &mut self.multis[m as usize];
        match m.held_as {
            Class::Exclusive => {}
            Class::Shared => self.shared_holders -= 1,
            Class::Semaphore => {
                self.semaphore_holders -= 1;
                m.sem_users -= 1;
                if m.sem_users == 0 {
                    m.slots = 0;
                }
            }
        }
        self.multi_drop_if_unused(k);
    }

    /// Where [`Table::first_holder`] is.
    #[inline]
    pub(super) fn first_at(&self, k: u32) -> Option<At> {
        let e = &self.keys[k as usize];
        if e.multi == NIL {
            return e.holder.map(|_| At::Inline);
        }
        let x = self.others_front(k);
        match (e.holder, x) {
            (Some(h), Some(x)) if self.shares[x as usize].holder.grant_id < h.grant_id => {
                Some(At::Share(x))
            }
            (Some(_), _) => Some(At::Inline),
            (None, Some(x)) => Some(At::Share(x)),
            (None, None) => None,
        }
    }

    /// Removes share `x`, without an effect; gives its waiter of the
    /// budget back.
    pub(super) fn unhold_share(&mut self, x: u32) -> Holder {
        let (k, h) = {
            let s = &self.shares[x as usize];
            (s.key, s.holder)
        };
        self.listing_note(k);
        {
            let m = self.keys[k as usize].multi;
            let (multis, shares) = (&mut self.multis, &mut self.shares);
            multis[m as usize].others.unlink(shares, x, S_KEY);
        }
        {
            let (sources, shares) = (&mut self.sources, &mut self.shares);
            sources[h.source as usize].shares.unlink(shares, x, S_SRC);
        }
        if h.owner != NIL {
            let (owners, shares) = (&mut self.owners, &mut self.shares);
            owners[h.owner as usize].shares.unlink(shares, x, S_OWN);
        }
        if let Some(w) = self.share_walk {
            // Keep the walk's ends on shares that still hold.
            let shares = &self.shares;
            self.share_walk = w.leaving(
                x,
                || List::next_of(shares, x, S_AGE),
                || List::prev_of(shares, x, S_AGE),
            );
        }
        self.shares_by_age.unlink(&mut self.shares, x, S_AGE);
        self.share_of.remove(&h.grant_id);
        self.shares.remove(x as usize);
        self.budget.free_waiters(1);
        self.gave_up(k);
        self.source_drop_if_unused(h.source);
        h
    }

    /// True when held key slot `k`'s queue head is compatible with its
    /// holders (which [`Table::grant_ready`] never leaves so).
    #[inline]
    pub(super) fn head_grantable(&self, k: u32) -> bool {
        // An exclusive holder admits nobody; a free key with waiters is an
        // undo's, which `settle` grants.
        if self.keys[k as usize].multi == NIL || !self.is_held(k) {
            return false;
        }
        self.keys[k as usize]
            .queue
            .front()
            .is_some_and(|w| self.compatible(k, self.waiters[w as usize].class))
    }

    /// Grants what became grantable when a waiter left the head of a
    /// shared or semaphore key's queue in an operation that cannot grant
    /// (it has no time or no effects: [`Table::withdraw`],
    /// [`Table::cancel`], [`Table::orphan_owner`], [`Table::drop_owners`],
    /// [`Table::adopt`]); the caller runs it after them. Operations with
    /// time and effects run it themselves. A table that only ever holds
    /// keys exclusively never has anything here (a waiter leaving never
    /// unblocks an exclusive holder's queue).
    pub fn grant_unblocked(&mut self, now: Now, fx: &mut Effects) {
        while let Some(k) = self.unblocked.pop() {
            // A slot since freed is skipped; one reused by another key
            // grants only what that key may grant now.
            if self.keys.contains(k as usize) && self.is_held(k) {
                self.grant_ready(k, now, fx);
            }
        }
    }
}

/// How the holders of held key entry `e` hold it (see [`Table::access_of`]).
pub(super) fn access_in(e: &KeyEntry, multis: &Slab<Multi>) -> Access {
    if e.multi == NIL {
        return Access::Exclusive;
    }
    let m = &multis[e.multi as usize];
    match m.held_as {
        Class::Exclusive => Access::Exclusive,
        Class::Shared => Access::Shared,
        Class::Semaphore => Access::Semaphore(m.slots),
    }
}

/// The holder that stands for key entry `e` (see [`Table::first_holder`]).
pub(super) fn first_of<'a>(
    e: &'a KeyEntry,
    multis: &Slab<Multi>,
    shares: &'a Slab<Share>,
) -> Option<&'a Holder> {
    let other = (e.multi != NIL)
        .then(|| multis[e.multi as usize].others.front())
        .flatten()
        .map(|x| &shares[x as usize].holder);
    match (e.holder.as_ref(), other) {
        (Some(a), Some(b)) if b.grant_id < a.grant_id => Some(b),
        (Some(a), _) => Some(a),
        (None, b) => b,
    }
}
