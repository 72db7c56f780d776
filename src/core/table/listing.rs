//! Listings: the admin `KEYS`/`KEYX`/`KEYH` answer of one table, produced
//! a chunk at a time from the table itself instead of a copy of every
//! holder.
//!
//! A listing is the set of holders at the moment it began, sorted by key
//! and then token: every holder for `KEYH`, each key's oldest for `KEYS`
//! and `KEYX` ([`ListForm`]). [`Table::listing_begin`] keeps only where
//! each listed holder is (its key slot, or its share), 4 bytes a holder.
//! Entries are encoded when their turn comes, from the live holder, which
//! is still the one of the start: the first time any holder of a key is
//! about to change (released, reset, expired, extended, proclaimed,
//! undone, joined by another), [`Table::listing_note`] encodes that key's
//! listed holders not yet sent as they were at the start and keeps those
//! bytes in their place (what a change costs is the encoded entries,
//! typically ~70 bytes each, at most once per listed holder). An entry's
//! lease time left is counted from the start.
//!
//! What a listing keeps for changed holders is bounded by
//! [`SAVED_BYTES_MAX`]; a listing that would need more is *overflowed*
//! and answers nothing more (its connection is closed: a client reading
//! faster than the keys change never sees it).

use super::cursor::{Listing, SAVED, SHARE};
use super::modes::access_in;
use super::*;

impl Table {
    /// Starts a listing of `form` of the holders now (the answer's count
    /// is the second value). Costs 4 bytes per listed holder until it
    /// ends.
    pub fn listing_begin(&mut self, now_unix_ms: u64, form: ListForm) -> (ListingId, u32) {
        let slots = if form.every_holder() {
            self.every_holder()
        } else {
            self.oldest_holders()
        };
        let count = slots.len() as u32;
        let l = Listing {
            slots,
            next: 0,
            saved: Vec::new(),
            form,
            unix_ms: now_unix_ms,
            overflowed: false,
        };
        let i = match self.listings.iter().position(Option::is_none) {
            Some(i) => {
                self.listings[i] = Some(l);
                i
            }
            None => {
                self.listings.push(Some(l));
                self.listings.len() - 1
            }
        };
        (ListingId(i as u32), count)
    }

    /// Every holder (inline ones by key slot, shares by `SHARE | index`),
    /// sorted by key and token.
    fn every_holder(&self) -> Vec<u32> {
        let mut slots = self.inline_holders();
        let mut cur = self.shares_by_age.front();
        while let Some(x) = cur {
            slots.push(SHARE | x);
            cur = List::next_of(&self.shares, x, S_AGE);
        }
        let (names, keys, shares) = (&self.names, &self.keys, &self.shares);
        slots.sort_unstable_by_key(|&s| {
            let (k, h) = live(keys, shares, s);
            (names.get(keys[k as usize].name), h.grant_id)
        });
        slots
    }

    /// The holder that stands for each held key ([`Table::first_holder`]),
    /// sorted by key.
    fn oldest_holders(&self) -> Vec<u32> {
        let mut held = self.inline_holders();
        // Keys that only shares hold (their inline holder left first).
        let mut cur = self.shares_by_age.front();
        while let Some(x) = cur {
            let k = self.shares[x as usize].key;
            if self.keys[k as usize].holder.is_none() {
                held.push(k);
            }
            cur = List::next_of(&self.shares, x, S_AGE);
        }
        let (names, keys) = (&self.names, &self.keys);
        held.sort_unstable_by(|&a, &b| {
            names
                .get(keys[a as usize].name)
                .cmp(names.get(keys[b as usize].name))
        });
        held.dedup();
        held.iter()
            .map(|&k| match self.first_at(k).expect("a held key") {
                At::Inline => k,
                At::Share(x) => SHARE | x,
            })
            .collect()
    }

    /// The key slots with an inline holder, in grant order.
    fn inline_holders(&self) -> Vec<u32> {
        let mut slots = Vec::with_capacity(self.held_keys());
        let mut cur = self.by_age.front();
        while let Some(k) = cur {
            if self.keys[k as usize].holder.is_some() {
                slots.push(k);
            }
            cur = List::next_of(&self.keys, k, K_AGE);
        }
        slots
    }

    /// Appends the next entries of listing `id` to `out` until `out` grew
    /// by at least `max_bytes` or the listing is over; an ended listing is
    /// freed.
    pub fn listing_next(&mut self, id: ListingId, max_bytes: usize, out: &mut Vec<u8>) -> Step {
        let start = out.len();
        let l = self.listings[id.0 as usize]
            .as_mut()
            .expect("a listing in progress");
        if l.overflowed {
            self.listings[id.0 as usize] = None;
            return Step::Overflowed;
        }
        let (keys, names, sources, multis, shares) = (
            &self.keys,
            &self.names,
            &self.sources,
            &self.multis,
            &self.shares,
        );
        let cut = ListForm::Keyh.tail_len() - l.form.tail_len();
        while l.next < l.slots.len() && out.len() - start < max_bytes {
            let s = l.slots[l.next];
            l.next += 1;
            if s & SAVED != 0 {
                let at = (s & !SAVED) as usize;
                let len = entry_len(&l.saved[at..], ListForm::Keyh);
                out.extend_from_slice(&l.saved[at..at + len - cut]);
            } else {
                let (k, h) = live(keys, shares, s);
                let e = &keys[k as usize];
                held_ref_of(names, sources, e, h, access_in(e, multis))
                    .encode_admin(l.form, l.unix_ms, out);
            }
        }
        if l.next == l.slots.len() {
            self.listings[id.0 as usize] = None;
            Step::Done
        } else {
            Step::More
        }
    }

    /// Abandons listing `id` (its reader went away).
    pub fn listing_end(&mut self, id: ListingId) {
        self.listings[id.0 as usize] = None;
    }

    /// Listings in progress (for invariant checks and tests).
    pub fn listings(&self) -> usize {
        self.listings.iter().flatten().count()
    }

    /// Key `k`'s holders are about to change (any of them, or one is
    /// added): every listing that still has to encode one of them as it
    /// was keeps its entry now. O(log listed) name comparisons per listing
    /// in progress; nothing without one (a check inlined where holders
    /// change).
    #[inline]
    pub(super) fn listing_note(&mut self, k: u32) {
        if !self.listings.is_empty() {
            self.listing_note_slow(k);
        }
    }

    #[inline(never)]
    fn listing_note_slow(&mut self, k: u32) {
        let (keys, names, sources, shares) = (&self.keys, &self.names, &self.sources, &self.shares);
        let e = &keys[k as usize];
        let name = names.get(e.name);
        let access = access_in(e, &self.multis);
        for l in self.listings.iter_mut().flatten() {
            if l.overflowed {
                continue;
            }
            // A still-listed holder's key has the name it had at the start
            // (the holder never changed, so neither did its key entry); a
            // changed one is found by its saved entry's key. The key's
            // entries are together: those after the first not before
            // `name`, until one is after it.
            let listed = |s: u32, saved: &[u8]| -> std::cmp::Ordering {
                if s & SAVED != 0 {
                    let at = (s & !SAVED) as usize;
                    let kl = saved[at] as usize;
                    saved[at + 1..at + 1 + kl].cmp(name)
                } else {
                    let (lk, _) = live(keys, shares, s);
                    names.get(keys[lk as usize].name).cmp(name)
                }
            };
            let first =
                l.next + l.slots[l.next..].partition_point(|&s| listed(s, &l.saved).is_lt());
            let mut i = first;
            while i < l.slots.len() && listed(l.slots[i], &l.saved).is_eq() {
                let s = l.slots[i];
                i += 1;
                if s & SAVED != 0 {
                    // Changed before: the start state is kept already.
                    continue;
                }
                // A live holder of this name is one of this very key's
                // (names are unique among live keys).
                let (lk, h) = live(keys, shares, s);
                debug_assert_eq!(lk, k);
                let at = l.saved.len();
                if at >= SAVED_BYTES_MAX {
                    // Free what it kept: the listing answers nothing more.
                    l.overflowed = true;
                    l.saved = Vec::new();
                    l.slots = Vec::new();
                    l.next = 0;
                    break;
                }
                held_ref_of(names, sources, e, h, access).encode_admin(
                    ListForm::Keyh,
                    l.unix_ms,
                    &mut l.saved,
                );
                l.slots[i - 1] = SAVED | at as u32;
            }
        }
    }
}

/// The key slot and holder that listed entry `s` (not a saved one) names.
fn live<'a>(keys: &'a Slab<KeyEntry>, shares: &'a Slab<Share>, s: u32) -> (u32, &'a Holder) {
    if s & SHARE != 0 {
        let sh = &shares[(s & !SHARE) as usize];
        (sh.key, &sh.holder)
    } else {
        (
            s,
            keys[s as usize]
                .holder
                .as_ref()
                .expect("a listed holder is noted before it changes"),
        )
    }
}

fn held_ref_of<'a>(
    names: &'a Arena,
    sources: &'a Slab<SourceEntry>,
    e: &KeyEntry,
    h: &Holder,
    access: Access,
) -> HeldRef<'a> {
    HeldRef {
        key: names.get(e.name),
        source: names.get(sources[h.source as usize].name),
        endpoint: h.endpoint.addr(),
        acquired_unix_ms: h.acquired_unix_ms,
        grant_id: h.grant_id,
        mode: h.mode,
        expires_unix_ms: h.expires_unix_ms,
        session: 0,
        access,
    }
}
