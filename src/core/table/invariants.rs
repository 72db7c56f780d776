//! The table's structural invariants, checked by tests and debug
//! assertions.

use super::*;

impl Table {
    /// Checks every structural invariant (tests and debug assertions).
    pub fn check_invariants(&self) {
        let mut held = 0;
        for (k, e) in self.keys.iter() {
            let name = self.names.get(e.name);
            assert_eq!(self.find_key(name), Some(k as u32));
            assert_eq!(
                e.hash,
                self.key_index.hash(name),
                "stale hash of key slot {k}"
            );
            assert!(
                e.holder.is_some(),
                "free key {} left in the table",
                crate::log::Quoted(name)
            );
            held += 1;
            let mut n = 0;
            let mut cur = e.queue.front();
            while let Some(w) = cur {
                assert_eq!(self.waiters[w as usize].key, k as u32);
                n += 1;
                cur = List::next_of(&self.waiters, w, W_KEY);
            }
            assert_eq!(n, e.queue.len());
        }
        assert_eq!(held, self.by_age.len() as usize);
        assert_eq!(self.key_index.len(), self.keys.len());
        assert_eq!(self.source_index.len(), self.sources.len());
        assert_eq!(
            self.names.len(),
            self.keys.len() + self.sources.len() + self.dead_names.len(),
            "a name stored for nothing (or twice)"
        );
        let mut src_waiting = 0;
        for (slot, s) in self.sources.iter() {
            assert_eq!(self.find_source(self.names.get(s.name)), Some(slot as u32));
            assert!(
                !(s.held.is_empty() && s.waiting.is_empty()),
                "unused source kept"
            );
            src_waiting += s.waiting.len() as usize;
        }
        assert_eq!(src_waiting, self.waiters.len());
        assert_eq!(self.owner_index.len(), self.owners.len());
        for (o, e) in self.owners.iter() {
            assert_eq!(self.owner_index.get(&e.id), Some(&(o as u32)));
            let mut cur = e.held.front();
            while let Some(k) = cur {
                let h = self.keys[k as usize].holder.expect("owner's key held");
                assert_eq!(h.owner, o as u32, "held key on another owner's list");
                cur = List::next_of(&self.keys, k, K_OWN);
            }
            let mut cur = e.waiting.front();
            while let Some(w) = cur {
                assert_eq!(self.waiters[w as usize].owner, o as u32);
                cur = List::next_of(&self.waiters, w, W_OWN);
            }
        }
    }
}
