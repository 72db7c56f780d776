//! The lock table: a pure state machine, no syscalls, no clock reads.
//!
//! Every operation takes the current time as an argument and appends its
//! consequences to an [`Effects`] buffer, in the order they happened. The
//! event loop turns effects into replies (and, in durable mode, log
//! records); tests drive the table directly.
//!
//! Ownership and invariants:
//! - A key exists in the table while it is held or has waiters; a key that
//!   is free **never** has waiters (a release grants the queue's head in the
//!   same call), so `holder.is_none()` implies an empty queue.
//! - Waiters of one key are served in strict FIFO order (intrusive list
//!   over `waiters`, link slot `W_KEY`).
//! - Every waiter and every held key is also linked on its source's lists,
//!   so ResetBySource touches only what that source owns.
//! - Held keys are linked in grant order (`K_AGE`), so the oldest hold is
//!   the head: O(1) for the stuck-lock metric.
//! - Every grant gets a unique, increasing `grant_id`. A connection that must
//!   give back a grant it could not deliver names it by `(key slot,
//!   grant_id)`, so a slot reused by another key or another holder is never
//!   released by mistake.
//! - Every key's and every source's bytes are stored once, in the table's
//!   [`Arena`]; entries name them by a 4-byte [`NameRef`], and each index
//!   ([`NameIndex`], one for keys, one for sources)
//!   holds `(32-bit hash, slot)` pairs. An index entry exists iff its slab
//!   entry does, and every arena name belongs to exactly one live key or
//!   source entry (`check_invariants`).
//! - Memory follows what is held, not the limits: slabs and maps start
//!   empty and grow on demand (amortised doubling) up to the limits, and
//!   keep their capacity, so a warmed-up table serves requests without
//!   allocating. A request beyond a limit is refused (`-`), never
//!   allocated for.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;

use super::idmap::{id_map, IdMap};

use slab::Slab;

use super::budget::Budget;
use super::endpoint::Endpoint;
use super::index::{Found, NameIndex};
use super::list::{Link, Linked, List, NIL};
use super::name::{Arena, Name, NameRef, NAME_MAX};
use super::types::{
    Checked, Effect, Effects, Extended, HeldKey, HeldRef, HoldMode, Limit, Limits, LockMode,
    LockOpts, Now, ReleaseCause, Reply, Token, NO_CONN, REPLICATED_SESSION,
};

// Link slots.
const W_KEY: usize = 0; // waiter on its key's queue
const W_SRC: usize = 1; // waiter on its source's waiting list
const K_SRC: usize = 0; // held key on its holder source's held list
const K_AGE: usize = 1; // held key on the table's grant-order list
const W_OWN: usize = 2; // waiter on its session's waiting list
const K_OWN: usize = 2; // held key on its session's held list

/// The routing tag of a replicated session's owner entry while no
/// connection has it (after a failover, on a follower): its holds stay
/// the session's until a resume adopts it ([`Table::adopt`]) or its
/// window passes ([`Table::end_orphan`]).
pub const ORPHAN: u64 = u64::MAX;

fn refuse(conn: Token, limit: Limit, fx: &mut Effects) {
    fx.push(Effect::LimitReached { limit });
    fx.push(Effect::Reply {
        conn,
        reply: Reply::Limit,
    });
}

#[derive(Clone, Copy, Debug)]
struct Holder {
    source: u32,
    endpoint: Endpoint,
    acquired_unix_ms: u64,
    acquired_mono_us: u64,
    grant_id: u64,
    conn: Token,
    mode: HoldMode,
    /// The session holding it (`NIL`: none, or the session ended and the
    /// hold outlives it).
    owner: u32,
    /// A lease's deadline (monotonic µs, and Unix ms for the log and
    /// operators); 0 otherwise.
    expires_mono_us: u64,
    expires_unix_ms: u64,
}

/// A released holder as it was, kept until its effect is applied.
#[derive(Clone, Copy)]
struct Retired {
    key: NameRef,
    source: NameRef,
    holder: Holder,
    /// Its replicated session's id, read when it was released (the owner
    /// entry may be gone by the time the effect is applied).
    session: u64,
}

struct KeyEntry {
    name: NameRef,
    /// Its index hash (see [`NameIndex::hash`]), so dropping the entry does not
    /// hash the name again.
    hash: u32,
    holder: Option<Holder>,
    queue: List,
    links: [Link; 3],
}

struct Waiter {
    key: u32,
    conn: Token,
    source: u32,
    endpoint: Endpoint,
    enqueued_mono_us: u64,
    mode: HoldMode,
    ttl_ms: u32,
    owner: u32,
    /// Unique per waiter: tells a wait-deadline entry from a slot reuse.
    seq: u64,
    links: [Link; 3],
}

/// A session known to this table: its held keys and queued requests.
struct OwnerEntry {
    /// The caller's session id.
    id: u64,
    /// The caller's routing tag (its connection token at home).
    tag: u64,
    held: List,
    waiting: List,
}

/// Everything a new holder gets besides its key, source and connection.
#[derive(Clone, Copy, Debug)]
struct Spec {
    grant_id: u64,
    acquired_unix_ms: u64,
    acquired_mono_us: u64,
    mode: HoldMode,
    owner: u32,
    expires_mono_us: u64,
    expires_unix_ms: u64,
}

/// Nodes whose link slots are a `links: [Link; N]` array.
macro_rules! linked_by_array {
    ($($t:ty),*) => {$(
        impl Linked for $t {
            fn link(&self, w: usize) -> &Link {
                &self.links[w]
            }
            fn link_mut(&mut self, w: usize) -> &mut Link {
                &mut self.links[w]
            }
        }
    )*};
}
linked_by_array!(KeyEntry, Waiter);

/// Link slots of a key entry or a waiter, all unlinked.
fn new_links() -> [Link; 3] {
    [Link::default(); 3]
}

struct SourceEntry {
    name: NameRef,
    hash: u32,
    held: List,
    waiting: List,
}

pub struct Table {
    /// Key entries and waiters are taken from it when created and given
    /// back when freed (server-wide `--max-keys`/`--max-waiters`).
    budget: Budget,
    /// Every key's and every source's bytes, once.
    names: Arena,
    keys: Slab<KeyEntry>,
    /// `(hash, key slot)` of every key entry.
    key_index: NameIndex,
    waiters: Slab<Waiter>,
    sources: Slab<SourceEntry>,
    /// `(hash, source slot)` of every source entry.
    source_index: NameIndex,
    by_age: List,
    next_grant_id: u64,
    owners: Slab<OwnerEntry>,
    owner_index: IdMap<u64, u32>,
    /// Replicated sessions homed on this shard that are open: id →
    /// keep-alive ms (cluster mode; see [`Table::session_opened`]).
    sessions_homed: IdMap<u64, u32>,
    /// Lease deadlines `(mono µs, key slot, grant id)`, earliest first. An
    /// extend pushes a new entry; an entry whose holder or deadline no
    /// longer matches is skipped when it surfaces, so a tick costs
    /// O(expired + outdated entries), never O(held).
    leases: BinaryHeap<Reverse<(u64, u32, u64)>>,
    /// Wait deadlines `(mono µs, waiter slot, waiter seq)`.
    waits: BinaryHeap<Reverse<(u64, u32, u64)>>,
    next_seq: u64,
    /// The walk of a snapshot taken a chunk at a time (see
    /// [`Table::walk_begin`]).
    walk: Option<Walk>,
    /// Holders released by operations whose effects are not applied yet:
    /// [`Effect::Released`] refers to them by index, so an effect copies no
    /// name. Cleared by [`Table::effects_applied`].
    retired: Vec<Retired>,
    /// Names freed while `retired` is not empty: an effect may still read
    /// them. Freed by [`Table::effects_applied`].
    dead_names: Vec<NameRef>,
    /// Admin listings in progress (see [`listing`]).
    listings: Vec<Option<listing::Listing>>,
}

impl Drop for Table {
    /// What this table took from the shared budget goes back with it.
    fn drop(&mut self) {
        self.budget.free_keys(self.keys.len());
        self.budget.free_waiters(self.waiters.len());
    }
}

/// What is left of a chunked walk over the held keys: the keys from `next`
/// to `last` on the age list. New holds are appended after `last`, and a
/// release of either end moves that end inward (see [`Table::unhold`]), so
/// the range stays exactly the keys held at the start and still held.
#[derive(Clone, Copy, Debug)]
struct Walk {
    next: u32,
    last: u32,
}

impl Table {
    /// An empty table. Nothing is reserved for the limits: a table sized
    /// for `max_keys` would be touched page by page as keys hash all over
    /// it, so the limit rather than what is held would decide memory.
    pub fn new(limits: Limits) -> Table {
        Table::with_budget(Budget::new(limits))
    }

    /// An empty table that takes its keys and waiters from `budget`,
    /// shared with the other shards' tables (server-wide limits).
    pub fn with_budget(budget: Budget) -> Table {
        Table {
            budget,
            names: Arena::new(),
            keys: Slab::new(),
            key_index: NameIndex::new(),
            waiters: Slab::new(),
            sources: Slab::new(),
            source_index: NameIndex::new(),
            by_age: List::new(),
            next_grant_id: 1,
            owners: Slab::new(),
            owner_index: id_map(),
            sessions_homed: id_map(),
            leases: BinaryHeap::new(),
            waits: BinaryHeap::new(),
            next_seq: 1,
            walk: None,
            retired: Vec::with_capacity(64),
            dead_names: Vec::with_capacity(64),
            listings: Vec::new(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.budget.limits()
    }

    /// The capacity this table shares with the other shards' tables.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    pub fn held_keys(&self) -> usize {
        self.by_age.len() as usize
    }

    pub fn queued_waiters(&self) -> usize {
        self.waiters.len()
    }

    pub fn key_entries(&self) -> usize {
        self.keys.len()
    }

    pub fn next_grant_id(&self) -> u64 {
        self.next_grant_id
    }

    /// Recovery: grant ids continue above `n` (a compacted log's mark).
    pub fn raise_next_grant_id(&mut self, n: u64) {
        self.next_grant_id = self.next_grant_id.max(n);
    }

    /// Acquire time of the longest-held key, if any key is held.
    pub fn oldest_acquired_unix_ms(&self) -> Option<u64> {
        let k = self.by_age.front()?;
        self.keys[k as usize].holder.map(|h| h.acquired_unix_ms)
    }

    /// The key slot of `key`: one probe of the index.
    fn find_key(&self, key: &[u8]) -> Option<u32> {
        let (keys, names) = (&self.keys, &self.names);
        self.key_index
            .find(key, |k| names.get(keys[k as usize].name))
    }

    fn find_source(&self, source: &[u8]) -> Option<u32> {
        let (sources, names) = (&self.sources, &self.names);
        self.source_index
            .find(source, |s| names.get(sources[s as usize].name))
    }

    /// The key slot of `key`, created (free, no waiters) if it is new:
    /// one probe of the index either way. `Err(())` past `max_keys`.
    fn key_get_or_insert(&mut self, key: &[u8]) -> Result<(u32, bool), ()> {
        let (keys, names) = (&self.keys, &self.names);
        match self
            .key_index
            .get_or_vacant(key, |k| names.get(keys[k as usize].name))
        {
            Found::Slot(k) => Ok((k, false)),
            Found::Vacant(v) => {
                // Server-wide: every shard's keys count against one
                // `--max-keys`.
                if !self.budget.take_key() {
                    return Err(());
                }
                let name = self.names.insert(key);
                let k = self.keys.insert(KeyEntry {
                    name,
                    hash: v.hash(),
                    holder: None,
                    queue: List::new(),
                    links: new_links(),
                }) as u32;
                v.insert(k);
                Ok((k, true))
            }
        }
    }

    /// The holder of `key`, if held.
    pub fn holder_of(&self, key: &[u8]) -> Option<HeldKey> {
        self.held_key(self.find_key(key)?)
    }

    fn held_key(&self, slot: u32) -> Option<HeldKey> {
        self.held_ref(slot)?.to_owned()
    }

    /// The holder of key slot `slot`, by reference (no copy of a name).
    fn held_ref(&self, slot: u32) -> Option<HeldRef<'_>> {
        let e = &self.keys[slot as usize];
        let h = e.holder?;
        Some(HeldRef {
            key: self.names.get(e.name),
            source: self.names.get(self.sources[h.source as usize].name),
            endpoint: h.endpoint.addr(),
            acquired_unix_ms: h.acquired_unix_ms,
            grant_id: h.grant_id,
            mode: h.mode,
            expires_unix_ms: h.expires_unix_ms,
            session: self.replicated_owner(h.owner),
        })
    }

    /// The id of owner entry `o` if it is a replicated session's, else 0.
    fn replicated_owner(&self, o: u32) -> u64 {
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
    fn key_name(&self, k: u32) -> Name {
        Name::new(self.names.get(self.keys[k as usize].name)).expect("names are at most NAME_MAX")
    }

    /// Every held key, sorted by key (admin path: allocates).
    pub fn held_list(&self) -> Vec<HeldKey> {
        let mut out: Vec<HeldKey> = Vec::with_capacity(self.held_keys());
        self.for_each_held(|h| out.push(h.to_owned().expect("names are at most NAME_MAX")));
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

    /// The connection token of `key`'s holder (inspection).
    pub fn holder_conn(&self, key: &[u8]) -> Option<Token> {
        let slot = self.find_key(key)?;
        self.keys[slot as usize].holder.map(|h| h.conn)
    }

    /// Number of waiters queued on `key`.
    pub fn queue_len(&self, key: &[u8]) -> usize {
        self.find_key(key)
            .map_or(0, |s| self.keys[s as usize].queue.len() as usize)
    }

    /// The source slot of `name`, created if new (one probe); `None` past
    /// the source limit (one per possible key and waiter).
    fn source_get_or_insert(&mut self, name: &[u8]) -> Option<u32> {
        let n = self.sources.len();
        // Each source entry holds or waits for something: one per key or
        // waiter at most (this shard's part of the server's limits).
        let max = self.limits().max_keys + self.limits().max_waiters;
        let (sources, names) = (&self.sources, &self.names);
        match self
            .source_index
            .get_or_vacant(name, |s| names.get(sources[s as usize].name))
        {
            Found::Slot(s) => Some(s),
            Found::Vacant(v) => {
                if n >= max {
                    return None;
                }
                let stored = self.names.insert(name);
                let s = self.sources.insert(SourceEntry {
                    name: stored,
                    hash: v.hash(),
                    held: List::new(),
                    waiting: List::new(),
                }) as u32;
                v.insert(s);
                Some(s)
            }
        }
    }

    fn source_drop_if_unused(&mut self, s: u32) {
        let e = &self.sources[s as usize];
        if e.held.is_empty() && e.waiting.is_empty() {
            let (name, h) = (e.name, e.hash);
            assert!(
                self.source_index.remove(h, s),
                "source slot {s} missing from its index"
            );
            self.free_name(name);
            self.sources.remove(s as usize);
        }
    }

    /// Frees a name, or keeps it until the pending effects are applied
    /// (a retired holder may name it).
    fn free_name(&mut self, name: NameRef) {
        if self.retired.is_empty() {
            self.names.remove(name);
        } else {
            self.dead_names.push(name);
        }
    }

    /// The effects of every operation so far have been applied: what
    /// [`Effect::Released`] referred to may go. The shard calls it after
    /// each round of effects; a caller that never does keeps every
    /// released holder and name (bounded by what it released).
    pub fn effects_applied(&mut self) {
        self.retired.clear();
        for n in self.dead_names.drain(..) {
            self.names.remove(n);
        }
    }

    /// The holder that [`Effect::Released`] `released` refers to, as it
    /// was; `grant_id` must be that effect's (checked: an index from
    /// before [`Table::effects_applied`] is refused, never misread).
    pub fn released(&self, released: u32, grant_id: u64) -> HeldRef<'_> {
        let r = self
            .retired
            .get(released as usize)
            .filter(|r| r.holder.grant_id == grant_id)
            .expect("a released holder read after effects_applied");
        self.retired_ref(r)
    }

    fn retired_ref(&self, r: &Retired) -> HeldRef<'_> {
        HeldRef {
            key: self.names.get(r.key),
            source: self.names.get(r.source),
            endpoint: r.holder.endpoint.addr(),
            acquired_unix_ms: r.holder.acquired_unix_ms,
            grant_id: r.holder.grant_id,
            mode: r.holder.mode,
            expires_unix_ms: r.holder.expires_unix_ms,
            session: r.session,
        }
    }

    /// The grant that [`Effect::Granted`] reports, by reference, with its
    /// lease deadline on the monotonic clock (0 for other modes): the key
    /// slot's holder, or, if an operation of the same round released it
    /// already, that holder as it was.
    pub fn granted(&self, key_slot: u32, grant_id: u64) -> (HeldRef<'_>, u64) {
        if let Some(h) = self.keys.get(key_slot as usize).and_then(|e| e.holder) {
            if h.grant_id == grant_id {
                let r = self.held_ref(key_slot).expect("held");
                return (r, h.expires_mono_us);
            }
        }
        let r = self
            .retired
            .iter()
            .rev()
            .find(|r| r.holder.grant_id == grant_id)
            .expect("a granted holder read after effects_applied");
        (self.retired_ref(r), r.holder.expires_mono_us)
    }

    fn key_drop_if_unused(&mut self, k: u32) {
        let e = &self.keys[k as usize];
        if e.holder.is_none() && e.queue.is_empty() {
            let (name, h) = (e.name, e.hash);
            assert!(
                self.key_index.remove(h, k),
                "key slot {k} missing from its index"
            );
            self.free_name(name);
            self.keys.remove(k as usize);
            self.budget.free_keys(1);
        }
    }

    /// Makes `conn` the holder of the free key slot `k`; the grant, for
    /// its effect.
    fn set_holder(
        &mut self,
        k: u32,
        source: u32,
        endpoint: Endpoint,
        conn: Token,
        spec: Spec,
    ) -> u64 {
        self.hold(k, source, endpoint, conn, spec);
        spec.grant_id
    }

    /// [`Table::set_holder`] without building the grant (recovery).
    fn hold(&mut self, k: u32, source: u32, endpoint: Endpoint, conn: Token, spec: Spec) {
        assert!(
            self.keys[k as usize].holder.is_none(),
            "grant of a held key"
        );
        self.keys[k as usize].holder = Some(Holder {
            source,
            endpoint,
            acquired_unix_ms: spec.acquired_unix_ms,
            acquired_mono_us: spec.acquired_mono_us,
            grant_id: spec.grant_id,
            conn,
            mode: spec.mode,
            owner: spec.owner,
            expires_mono_us: spec.expires_mono_us,
            expires_unix_ms: spec.expires_unix_ms,
        });
        self.next_grant_id = self.next_grant_id.max(spec.grant_id + 1);
        let (sources, keys) = (&mut self.sources, &mut self.keys);
        sources[source as usize].held.push_back(keys, k, K_SRC);
        self.by_age.push_back(&mut self.keys, k, K_AGE);
        if spec.owner != NIL {
            let (owners, keys) = (&mut self.owners, &mut self.keys);
            owners[spec.owner as usize].held.push_back(keys, k, K_OWN);
        }
        if spec.mode == HoldMode::Lease {
            self.leases
                .push(Reverse((spec.expires_mono_us, k, spec.grant_id)));
        }
    }

    /// The hold a new grant gets at `now`.
    fn new_spec(&self, mode: HoldMode, ttl_ms: u32, owner: u32, now: Now) -> Spec {
        let lease = mode == HoldMode::Lease;
        Spec {
            grant_id: self.next_grant_id,
            acquired_unix_ms: now.unix_ms,
            acquired_mono_us: now.mono_us,
            mode,
            owner,
            expires_mono_us: if lease {
                now.mono_us + ttl_ms as u64 * 1000
            } else {
                0
            },
            expires_unix_ms: if lease {
                now.unix_ms + ttl_ms as u64
            } else {
                0
            },
        }
    }

    /// Removes the holder of key slot `k` (which must be held); does not
    /// grant the next waiter and does not drop the key entry.
    fn clear_holder(&mut self, k: u32, now: Now, cause: ReleaseCause, fx: &mut Effects) {
        // Retired before the unhold, which may drop the source's name
        // (kept now until the effect is applied).
        let held = self.keys[k as usize].holder.expect("release of a free key");
        let released = self.retired.len() as u32;
        self.retired.push(Retired {
            key: self.keys[k as usize].name,
            source: self.sources[held.source as usize].name,
            holder: held,
            session: self.replicated_owner(held.owner),
        });
        let h = self.unhold(k);
        fx.push(Effect::Released {
            holder_conn: h.conn,
            released,
            grant_id: h.grant_id,
            held_us: now.mono_us.saturating_sub(h.acquired_mono_us),
            cause,
        });
    }

    /// [`Table::clear_holder`] without an effect (recovery and undo: nobody
    /// to tell, and nothing to allocate).
    fn unhold(&mut self, k: u32) -> Holder {
        self.listing_note(k);
        let h = self.keys[k as usize]
            .holder
            .take()
            .expect("release of a free key");
        {
            let (sources, keys) = (&mut self.sources, &mut self.keys);
            sources[h.source as usize].held.unlink(keys, k, K_SRC);
        }
        if h.owner != NIL {
            let (owners, keys) = (&mut self.owners, &mut self.keys);
            owners[h.owner as usize].held.unlink(keys, k, K_OWN);
        }
        if let Some(w) = self.walk {
            // Keep the walk's ends on keys that are still held.
            self.walk = if w.next == k && w.last == k {
                None
            } else if w.next == k {
                List::next_of(&self.keys, k, K_AGE).map(|next| Walk { next, ..w })
            } else if w.last == k {
                List::prev_of(&self.keys, k, K_AGE).map(|last| Walk { last, ..w })
            } else {
                Some(w)
            };
        }
        self.by_age.unlink(&mut self.keys, k, K_AGE);
        self.source_drop_if_unused(h.source);
        h
    }

    /// Unlinks waiter `w` from its key queue and source list and frees its
    /// slot. Neither the key nor the source entry is dropped here.
    fn detach_waiter(&mut self, w: u32) -> Waiter {
        let (key, source, owner) = {
            let e = &self.waiters[w as usize];
            (e.key, e.source, e.owner)
        };
        if owner != NIL {
            let (owners, waiters) = (&mut self.owners, &mut self.waiters);
            owners[owner as usize].waiting.unlink(waiters, w, W_OWN);
        }
        {
            let (keys, waiters) = (&mut self.keys, &mut self.waiters);
            keys[key as usize].queue.unlink(waiters, w, W_KEY);
        }
        {
            let (sources, waiters) = (&mut self.sources, &mut self.waiters);
            sources[source as usize].waiting.unlink(waiters, w, W_SRC);
        }
        self.budget.free_waiters(1);
        self.waiters.remove(w as usize)
    }

    /// Grants a free key to the head of its queue, or drops the key entry
    /// when nobody waits.
    fn grant_next(&mut self, k: u32, now: Now, fx: &mut Effects) {
        debug_assert!(self.keys[k as usize].holder.is_none());
        let Some(w) = self.keys[k as usize].queue.front() else {
            self.key_drop_if_unused(k);
            return;
        };
        let waiter = self.detach_waiter(w);
        let spec = self.new_spec(waiter.mode, waiter.ttl_ms, waiter.owner, now);
        let grant_id = self.set_holder(k, waiter.source, waiter.endpoint, waiter.conn, spec);
        fx.push(Effect::Granted {
            conn: waiter.conn,
            key_slot: k,
            grant_id,
            waited_us: Some(now.mono_us.saturating_sub(waiter.enqueued_mono_us)),
        });
    }

    /// Lock (blocking) or TryLock. `source` must already be resolved (an
    /// empty wire source is replaced by the peer IP by the caller). Returns
    /// the waiter slot when the request was queued; the caller needs it to
    /// withdraw the waiter if the connection hangs up.
    #[allow(clippy::too_many_arguments)] // mirrors the wire request plus time and output
    pub fn lock(
        &mut self,
        conn: Token,
        key: &(impl AsRef<[u8]> + ?Sized),
        source: &(impl AsRef<[u8]> + ?Sized),
        endpoint: SocketAddr,
        mode: LockMode,
        now: Now,
        fx: &mut Effects,
    ) -> Option<u32> {
        self.lock_with(
            conn,
            key,
            source,
            endpoint,
            mode,
            LockOpts::default(),
            now,
            fx,
        )
    }

    /// [`Table::lock`] with a hold mode, a session and a wait deadline.
    #[allow(clippy::too_many_arguments)] // mirrors the wire request plus time and output
    pub fn lock_with(
        &mut self,
        conn: Token,
        key: &(impl AsRef<[u8]> + ?Sized),
        source: &(impl AsRef<[u8]> + ?Sized),
        endpoint: SocketAddr,
        mode: LockMode,
        opts: LockOpts,
        now: Now,
        fx: &mut Effects,
    ) -> Option<u32> {
        let (key, source) = (key.as_ref(), source.as_ref());
        debug_assert!(!key.is_empty(), "empty keys are rejected by the codec");
        debug_assert!(key.len() <= NAME_MAX && source.len() <= NAME_MAX);
        let endpoint = Endpoint::from(endpoint);
        let Ok((k, new)) = self.key_get_or_insert(key) else {
            refuse(conn, Limit::Keys, fx);
            return None;
        };
        if !new {
            if self.keys[k as usize].holder.is_some() {
                if mode == LockMode::Try {
                    fx.push(Effect::Reply {
                        conn,
                        reply: Reply::Busy,
                    });
                    return None;
                }
                // Server-wide: every shard's waiters count against one
                // `--max-waiters`.
                if !self.budget.take_waiter() {
                    refuse(conn, Limit::Waiters, fx);
                    return None;
                }
                let Some(s) = self.source_get_or_insert(source) else {
                    self.budget.free_waiters(1);
                    refuse(conn, Limit::Sources, fx);
                    return None;
                };
                let seq = self.next_seq;
                self.next_seq += 1;
                let w = self.waiters.insert(Waiter {
                    key: k,
                    conn,
                    source: s,
                    endpoint,
                    enqueued_mono_us: now.mono_us,
                    mode: opts.mode,
                    ttl_ms: opts.ttl_ms,
                    owner: opts.owner,
                    seq,
                    links: new_links(),
                }) as u32;
                if opts.owner != NIL {
                    let (owners, waiters) = (&mut self.owners, &mut self.waiters);
                    owners[opts.owner as usize]
                        .waiting
                        .push_back(waiters, w, W_OWN);
                }
                if let Some(d) = opts.deadline_us {
                    self.waits.push(Reverse((d, w, seq)));
                }
                {
                    let (keys, waiters) = (&mut self.keys, &mut self.waiters);
                    keys[k as usize].queue.push_back(waiters, w, W_KEY);
                }
                {
                    let (sources, waiters) = (&mut self.sources, &mut self.waiters);
                    sources[s as usize].waiting.push_back(waiters, w, W_SRC);
                }
                return Some(w);
            }
            unreachable!("a free key never stays in the table");
        }
        let Some(s) = self.source_get_or_insert(source) else {
            self.key_drop_if_unused(k);
            refuse(conn, Limit::Sources, fx);
            return None;
        };
        let spec = self.new_spec(opts.mode, opts.ttl_ms, opts.owner, now);
        let grant_id = self.set_holder(k, s, endpoint, conn, spec);
        fx.push(Effect::Granted {
            conn,
            key_slot: k,
            grant_id,
            waited_us: None,
        });
        None
    }

    /// Releases `key` if held and grants it to the next waiter. Answers the
    /// requester (`conn`, if any) `+` whether or not the key was held.
    fn release_key(
        &mut self,
        conn: Option<Token>,
        key: &[u8],
        cause: ReleaseCause,
        now: Now,
        fx: &mut Effects,
    ) {
        if let Some(k) = self.find_key(key) {
            if self.keys[k as usize].holder.is_some() {
                self.clear_holder(k, now, cause, fx);
                self.grant_next(k, now, fx);
            }
        }
        if let Some(conn) = conn {
            fx.push(Effect::Reply {
                conn,
                reply: Reply::Ok,
            });
        }
    }

    /// Unlock: releases the key whoever asks (Locking-Center has no owner
    /// check) and hands it to the next waiter. A free key answers `+`.
    pub fn unlock(
        &mut self,
        conn: Token,
        key: &(impl AsRef<[u8]> + ?Sized),
        now: Now,
        fx: &mut Effects,
    ) {
        self.release_key(Some(conn), key.as_ref(), ReleaseCause::Unlock, now, fx);
    }

    /// ResetByKey: releases the holder; waiters keep their places.
    pub fn reset_by_key(
        &mut self,
        conn: Option<Token>,
        key: &(impl AsRef<[u8]> + ?Sized),
        now: Now,
        fx: &mut Effects,
    ) {
        self.release_key(conn, key.as_ref(), ReleaseCause::ResetByKey, now, fx);
    }

    /// Compare-and-reset: releases `key` only if its holder's grant is
    /// `token` (the holder an operator saw). True if it did.
    pub fn reset_if(
        &mut self,
        key: &(impl AsRef<[u8]> + ?Sized),
        token: u64,
        now: Now,
        fx: &mut Effects,
    ) -> bool {
        // One probe of the index: the slot found is the one released.
        let Some(k) = self.find_key(key.as_ref()) else {
            return false;
        };
        if self.keys[k as usize].holder.map(|h| h.grant_id) != Some(token) {
            return false;
        }
        self.clear_holder(k, now, ReleaseCause::ResetByKey, fx);
        self.grant_next(k, now, fx);
        true
    }

    /// ResetBySource: answers `-` to every queued Lock of `source`, then
    /// releases every key it holds (granting each to its next waiter).
    /// Waiters are answered first so that none of them can be granted a key
    /// its own source is giving up in the same call.
    pub fn reset_by_source(
        &mut self,
        conn: Option<Token>,
        source: &(impl AsRef<[u8]> + ?Sized),
        now: Now,
        fx: &mut Effects,
    ) {
        let source = source.as_ref();
        if let Some(s) = self.find_source(source) {
            while let Some(w) = self.sources[s as usize].waiting.front() {
                let waiter = self.detach_waiter(w);
                // The key is held (it had a queue), so it stays in the table.
                fx.push(Effect::Reply {
                    conn: waiter.conn,
                    reply: Reply::Withdrawn,
                });
            }
            while let Some(k) = self.sources[s as usize].held.front() {
                let last = self.sources[s as usize].held.len() == 1;
                self.clear_holder(k, now, ReleaseCause::ResetBySource, fx);
                self.grant_next(k, now, fx);
                if last {
                    // clear_holder dropped the (now unused) source entry.
                    break;
                }
            }
            if self.sources.contains(s as usize) && self.find_source(source) == Some(s) {
                self.source_drop_if_unused(s);
            }
        }
        if let Some(conn) = conn {
            fx.push(Effect::Reply {
                conn,
                reply: Reply::Ok,
            });
        }
    }

    /// A queued waiter's connection hung up: withdraw it. It is never
    /// granted and nothing is answered. `w` must be a live waiter slot.
    pub fn withdraw(&mut self, w: u32) {
        let waiter = self.detach_waiter(w);
        self.source_drop_if_unused(waiter.source);
        // The key is held (it had a queue); it stays.
        debug_assert!(self.keys[waiter.key as usize].holder.is_some());
    }

    /// Gives back a grant whose `+` could not be delivered. Does nothing if
    /// that grant is no longer the holder (already unlocked or reset).
    pub fn release_grant(
        &mut self,
        key_slot: u32,
        grant_id: u64,
        now: Now,
        fx: &mut Effects,
    ) -> bool {
        let held_by_grant = self
            .keys
            .get(key_slot as usize)
            .and_then(|e| e.holder)
            .is_some_and(|h| h.grant_id == grant_id);
        if held_by_grant {
            self.clear_holder(key_slot, now, ReleaseCause::Undelivered, fx);
            self.grant_next(key_slot, now, fx);
        }
        held_by_grant
    }

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
    fn owner_drop_if_empty_orphan(&mut self, o: u32) {
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

    // ----- sessions, leases, deadlines ---------------------------------------

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

    fn checked(&self, owner: u32, key: &[u8], token: u64) -> Option<u32> {
        let k = self.find_key(key)?;
        let h = self.keys[k as usize].holder?;
        (h.grant_id == token && (h.mode != HoldMode::Session || h.owner == owner)).then_some(k)
    }

    fn why_not(&self, owner: u32, key: &[u8], token: u64) -> Checked {
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
    pub fn extend_leases(&mut self, by_us: u64) {
        let mut cur = self.by_age.front();
        while let Some(k) = cur {
            cur = List::next_of(&self.keys, k, K_AGE);
            let Some(h) = self.keys[k as usize].holder.as_mut() else {
                continue;
            };
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
    fn orphan_entry(&mut self, o: u32) {
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

    // ----- the replicated sessions homed on this shard ----------------------

    /// Replicated session `id` opened (decided by this shard as leader, or
    /// read from the log), with its keep-alive. Its id's counter (the low
    /// 55 bits) came from the grant counter, which moves past it: a later
    /// leader never hands the same id out again.
    pub fn session_opened(&mut self, id: u64, keepalive_ms: u32) {
        self.sessions_homed.insert(id, keepalive_ms);
        let counter = id & (REPLICATED_SESSION - 1);
        self.raise_next_grant_id(counter + 1);
    }

    /// Replicated session `id` ended; its keep-alive if it was known.
    pub fn session_closed(&mut self, id: u64) -> Option<u32> {
        self.sessions_homed.remove(&id)
    }

    /// Forgets every replicated session homed here (a snapshot installed
    /// replaces them all).
    pub fn sessions_forget(&mut self) {
        self.sessions_homed.clear();
    }

    /// The keep-alive of replicated session `id`, if it is open.
    pub fn session_keepalive(&self, id: u64) -> Option<u32> {
        self.sessions_homed.get(&id).copied()
    }

    /// Every open replicated session homed here: `(id, keepalive_ms)`.
    pub fn sessions_homed(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.sessions_homed.iter().map(|(&id, &ka)| (id, ka))
    }

    /// A new replicated session's id: `home` in the top 8 bits, the
    /// replicated bit, and the next grant id as its counter (taken: no
    /// token will carry it).
    pub fn next_session_id(&mut self, home: usize) -> u64 {
        let counter = self.next_grant_id & (REPLICATED_SESSION - 1);
        self.next_grant_id += 1;
        (home as u64) << 56 | REPLICATED_SESSION | counter
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

mod listing;
pub use listing::{entry_len, ListingId, Step, SAVED_BYTES_MAX};

#[cfg(test)]
mod tests;
