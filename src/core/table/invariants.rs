//! The table's structural invariants, checked by tests and debug
//! assertions.

use super::*;

impl Table {
    /// Checks every structural invariant (tests and debug assertions).
    pub fn check_invariants(&self) {
        let mut t = KeyTally::default();
        for (k, e) in self.keys.iter() {
            self.check_key(k as u32, e, &mut t);
        }
        let KeyTally {
            held,
            shared,
            semaphore,
            inline,
            others,
            multis,
        } = t;
        assert_eq!(held, self.held, "held keys miscounted");
        assert_eq!(
            (shared, semaphore),
            (self.shared_holders, self.semaphore_holders),
            "holders by access miscounted"
        );
        assert_eq!(inline, self.by_age.len() as usize);
        assert_eq!(others, self.shares.len(), "a share on no key's list");
        assert_eq!(multis, self.multis.len(), "a multi of no key");
        assert_eq!(self.share_of.len(), self.shares.len());
        assert_eq!(self.shares_by_age.len() as usize, self.shares.len());
        assert_eq!(self.key_index.len(), self.keys.len());
        assert_eq!(self.source_index.len(), self.sources.len());
        assert_eq!(
            self.names.len(),
            self.keys.len() + self.sources.len() + self.dead_names.len(),
            "a name stored for nothing (or twice)"
        );
        self.check_sources();
        self.check_owners();
    }

    /// Checks one held key: its name, holders, shares, queue and multi;
    /// adds what it holds to `t`, compared with the table's counts after.
    fn check_key(&self, k: u32, e: &KeyEntry, t: &mut KeyTally) {
        let name = self.names.get(e.name);
        assert_eq!(self.find_key(name), Some(k));
        assert_eq!(
            e.hash,
            self.key_index.hash(name),
            "stale hash of key slot {k}"
        );
        let count = self.holder_count(k);
        assert!(
            count > 0,
            "free key {} left in the table",
            crate::log::Quoted(name)
        );
        t.held += 1;
        t.inline += e.holder.is_some() as usize;
        let (class, slots) = (self.class(k), self.slots(k));
        match class {
            Class::Exclusive => {}
            Class::Shared => t.shared += count as usize,
            Class::Semaphore => t.semaphore += count as usize,
        }
        Self::check_holders_fit_class(e, name, class, count, slots);
        let n = self.check_key_shares(k, e, name);
        assert_eq!(n, self.multi(k).map_or(0, |m| m.others.len()));
        t.others += n as usize;
        t.multis += (e.multi != NIL) as usize;
        let sem_waiting = self.check_key_queue(k, e);
        let sem_held = if class == Class::Semaphore { count } else { 0 };
        let sem_users = self.multi(k).map_or(0, |m| m.sem_users);
        assert_eq!(
            sem_users,
            sem_held + sem_waiting,
            "semaphore users miscounted"
        );
        assert_eq!(
            slots != 0,
            sem_users != 0,
            "a semaphore's n kept for nobody"
        );
        // The multi exists exactly while something needs it.
        let needs_multi =
            sem_users != 0 || self.others_front(k).is_some() || class != Class::Exclusive;
        assert_eq!(
            e.multi != NIL,
            needs_multi,
            "multi of {} kept for nothing, or missing",
            crate::log::Quoted(name)
        );
        // FIFO: a head compatible with the holders would have been
        // granted, unless an operation that cannot grant left it so.
        if let Some(w) = e.queue.front() {
            assert!(
                !self.compatible(k, self.waiters[w as usize].class) || self.unblocked.contains(&k),
                "the head of {}'s queue may hold it and waits",
                crate::log::Quoted(name)
            );
        }
    }

    /// Checks that a key's `count` holders fit how it is held: one inline
    /// exclusive holder, or at most a semaphore's `slots`.
    fn check_holders_fit_class(e: &KeyEntry, name: &[u8], class: Class, count: u32, slots: u32) {
        match class {
            Class::Exclusive => {
                assert_eq!(
                    count,
                    1,
                    "an exclusive holder of {} is not alone",
                    crate::log::Quoted(name)
                );
                assert!(e.holder.is_some(), "an exclusive holder is not inline");
            }
            Class::Shared => {}
            Class::Semaphore => assert!(
                slots >= 1 && count <= slots,
                "{} holders of {}, a semaphore of {}",
                count,
                crate::log::Quoted(name),
                slots
            ),
        }
    }

    /// Checks the shares on key `k`'s list (the holders besides the inline
    /// one); their number.
    fn check_key_shares(&self, k: u32, e: &KeyEntry, name: &[u8]) -> u32 {
        let mut n = 0;
        let mut cur = self.others_front(k);
        while let Some(x) = cur {
            let s = &self.shares[x as usize];
            assert_eq!(s.key, k, "a share on another key's list");
            assert_eq!(
                self.share_of.get(&s.holder.grant_id),
                Some(&x),
                "share of grant {} not found by it",
                s.holder.grant_id
            );
            assert!(
                e.holder.is_none_or(|h| h.grant_id != s.holder.grant_id),
                "grant {} holds {} twice",
                s.holder.grant_id,
                crate::log::Quoted(name)
            );
            n += 1;
            cur = List::next_of(&self.shares, x, S_KEY);
        }
        n
    }

    /// Checks the waiters in key `k`'s queue; how many wait for a
    /// semaphore.
    fn check_key_queue(&self, k: u32, e: &KeyEntry) -> u32 {
        let mut n = 0;
        let mut sem_waiting = 0;
        let mut cur = e.queue.front();
        while let Some(w) = cur {
            let wt = &self.waiters[w as usize];
            assert_eq!(wt.key, k);
            if wt.class == Class::Semaphore {
                sem_waiting += 1;
            }
            n += 1;
            cur = List::next_of(&self.waiters, w, W_KEY);
        }
        assert_eq!(n, e.queue.len());
        sem_waiting
    }

    /// Checks every source against what it holds, shares and waits for.
    fn check_sources(&self) {
        let (mut src_waiting, mut src_held, mut src_shares) = (0, 0, 0);
        for (slot, s) in self.sources.iter() {
            assert_eq!(self.find_source(self.names.get(s.name)), Some(slot as u32));
            assert!(
                !(s.held.is_empty() && s.shares.is_empty() && s.waiting.is_empty()),
                "unused source kept"
            );
            src_waiting += s.waiting.len() as usize;
            src_held += s.held.len() as usize;
            let mut cur = s.shares.front();
            while let Some(x) = cur {
                assert_eq!(self.shares[x as usize].holder.source, slot as u32);
                src_shares += 1;
                cur = List::next_of(&self.shares, x, S_SRC);
            }
        }
        assert_eq!(src_waiting, self.waiters.len());
        assert_eq!(src_held, self.by_age.len() as usize);
        assert_eq!(src_shares, self.shares.len());
    }

    /// Checks every owner's lists of held keys, shares and waiters.
    fn check_owners(&self) {
        assert_eq!(self.owner_index.len(), self.owners.len());
        for (o, e) in self.owners.iter() {
            assert_eq!(self.owner_index.get(&e.id), Some(&(o as u32)));
            let mut cur = e.held.front();
            while let Some(k) = cur {
                let h = self.keys[k as usize].holder.expect("owner's key held");
                assert_eq!(h.owner, o as u32, "held key on another owner's list");
                cur = List::next_of(&self.keys, k, K_OWN);
            }
            let mut cur = e.shares.front();
            while let Some(x) = cur {
                let h = self.shares[x as usize].holder;
                assert_eq!(h.owner, o as u32, "share on another owner's list");
                cur = List::next_of(&self.shares, x, S_OWN);
            }
            let mut cur = e.waiting.front();
            while let Some(w) = cur {
                assert_eq!(self.waiters[w as usize].owner, o as u32);
                cur = List::next_of(&self.waiters, w, W_OWN);
            }
        }
    }
}

/// What the held keys add up to, checked against the table's counters.
#[derive(Default)]
struct KeyTally {
    held: usize,
    shared: usize,
    semaphore: usize,
    inline: usize,
    others: usize,
    multis: usize,
}
