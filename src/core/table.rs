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
    listings: Vec<Option<cursor::Listing>>,
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
}

mod cursor;
mod homed;
mod invariants;
mod listing;
mod query;
mod replay;
mod session;
pub use cursor::{entry_len, ListingId, Step, SAVED_BYTES_MAX};

#[cfg(test)]
mod tests;
