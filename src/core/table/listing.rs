//! Listings: the admin `KEYS`/`KEYX` answer of one table, produced a chunk
//! at a time from the table itself instead of a copy of every holder.
//!
//! A listing is the set of holders at the moment it began, sorted by key.
//! [`Table::listing_begin`] keeps only the held key *slots*, sorted by
//! name (4 bytes a key). Entries are encoded when their turn comes, from
//! the live holder, which is still the one of the start: the first time a
//! listed holder that is not yet encoded is about to change (released,
//! reset, expired, extended, undone), [`Table::listing_note`] encodes it
//! as it was at the start and keeps those bytes in its place (what a
//! change costs is the encoded entry, typically ~60 bytes, at most once
//! per listed key). An entry's lease time left is counted from the start.
//!
//! What a listing keeps for changed holders is bounded by
//! [`SAVED_BYTES_MAX`]; a listing that would need more is *overflowed*
//! and answers nothing more (its connection is closed: a client reading
//! faster than the keys change never sees it).

use super::cursor::{Listing, SAVED};
use super::modes::{access_in, first_of};
use super::*;

impl Table {
    /// Starts a listing of the keys held now (the answer's count is the
    /// second value). Costs 4 bytes per held key until it ends.
    pub fn listing_begin(&mut self, now_unix_ms: u64) -> (ListingId, u32) {
        let mut slots = Vec::with_capacity(self.held_keys());
        let mut cur = self.by_age.front();
        while let Some(k) = cur {
            if self.keys[k as usize].holder.is_some() {
                slots.push(k);
            }
            cur = List::next_of(&self.keys, k, K_AGE);
        }
        // Keys that only shares hold (their inline holder left first).
        let mut cur = self.shares_by_age.front();
        while let Some(x) = cur {
            let k = self.shares[x as usize].key;
            if self.keys[k as usize].holder.is_none() {
                slots.push(k);
            }
            cur = List::next_of(&self.shares, x, S_AGE);
        }
        let (names, keys) = (&self.names, &self.keys);
        slots.sort_unstable_by(|&a, &b| {
            names
                .get(keys[a as usize].name)
                .cmp(names.get(keys[b as usize].name))
        });
        // A key is one entry, however many hold it (the one that stands
        // for it: `Table::first_holder`).
        slots.dedup();
        let count = slots.len() as u32;
        let l = Listing {
            slots,
            next: 0,
            saved: Vec::new(),
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

    /// Appends the next entries of listing `id` to `out` (KEYS form, or
    /// KEYX with `extended`) until `out` grew by at least `max_bytes` or
    /// the listing is over; an ended listing is freed.
    pub fn listing_next(
        &mut self,
        id: ListingId,
        extended: bool,
        max_bytes: usize,
        out: &mut Vec<u8>,
    ) -> Step {
        let start = out.len();
        let l = self.listings[id.0 as usize]
            .as_mut()
            .expect("a listing in progress");
        if l.overflowed {
            self.listings[id.0 as usize] = None;
            return Step::Overflowed;
        }
        let (l, keys, names, sources, multis, shares) = (
            l,
            &self.keys,
            &self.names,
            &self.sources,
            &self.multis,
            &self.shares,
        );
        while l.next < l.slots.len() && out.len() - start < max_bytes {
            let s = l.slots[l.next];
            l.next += 1;
            if s & SAVED != 0 {
                let at = (s & !SAVED) as usize;
                let len = entry_len(&l.saved[at..], true);
                let keep = if extended { len } else { len - 13 };
                out.extend_from_slice(&l.saved[at..at + keep]);
            } else {
                let e = &keys[s as usize];
                let h = first_of(e, multis, shares)
                    .expect("a listed holder is noted before it changes");
                held_ref_of(names, sources, e, h, access_in(e, multis))
                    .encode_admin(extended, l.unix_ms, out);
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

    /// Key `k`'s holders are about to change (any of them: the one that
    /// stands for the key may be another after): every listing that still
    /// has to encode it as it was keeps its entry now. O(log listed) name
    /// comparisons per listing in progress; nothing without one (a
    /// check inlined where holders change).
    #[inline]
    pub(super) fn listing_note(&mut self, k: u32) {
        if !self.listings.is_empty() {
            self.listing_note_slow(k);
        }
    }

    #[inline(never)]
    fn listing_note_slow(&mut self, k: u32) {
        let (keys, names, sources) = (&self.keys, &self.names, &self.sources);
        let e = &keys[k as usize];
        let Some(h) = first_of(e, &self.multis, &self.shares) else {
            return;
        };
        let name = names.get(e.name);
        for l in self.listings.iter_mut().flatten() {
            if l.overflowed {
                continue;
            }
            // A still-listed slot has the name it had at the start (its
            // holder never changed, so neither did its key entry); a
            // changed one is found by its saved entry's key.
            let pending = &l.slots[l.next..];
            let found = pending.binary_search_by(|&s| {
                if s & SAVED != 0 {
                    let at = (s & !SAVED) as usize;
                    let kl = l.saved[at] as usize;
                    l.saved[at + 1..at + 1 + kl].cmp(name)
                } else {
                    names.get(keys[s as usize].name).cmp(name)
                }
            });
            // Found as a slot means this very holder (names are unique
            // among live keys); found as saved means it changed before:
            // the start state is kept already.
            let Ok(i) = found else { continue };
            if pending[i] != k {
                continue;
            }
            let at = l.saved.len();
            if at >= SAVED_BYTES_MAX {
                // Free what it kept: the listing answers nothing more.
                l.overflowed = true;
                l.saved = Vec::new();
                l.slots = Vec::new();
                l.next = 0;
                continue;
            }
            held_ref_of(names, sources, e, h, access_in(e, &self.multis)).encode_admin(
                true,
                l.unix_ms,
                &mut l.saved,
            );
            let i = l.next + i;
            l.slots[i] = SAVED | at as u32;
        }
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
