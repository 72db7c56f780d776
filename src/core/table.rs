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
//!   same call), so a key without holders has an empty queue.
//! - A key is held with one [`Access`] at a time: by one exclusive holder,
//!   by shared holders, or by at most `n` semaphore holders. The first
//!   holder is kept inline in the key entry (`holder`: the exclusive path
//!   touches nothing else); what a shared or semaphore key needs besides
//!   is a `Multi` in its own slab (`multi`, [`NIL`] for an exclusive
//!   key, whose entry stays as small as before), whose `others` list
//!   (`S_KEY`) holds the key's other holders, `Share`s in their own
//!   slab. The inline slot may be empty while shares hold the key (its
//!   holder left first); the next grant fills it again.
//! - Waiters of one key are served in strict FIFO order (intrusive list
//!   over `waiters`, link slot `W_KEY`), whatever their access: the head
//!   is granted when it is compatible with the holders, then the next one
//!   while compatible, and nobody is granted past a waiter that is not. So
//!   the head of a held key's queue is never compatible with its holders,
//!   except for the keys noted in `unblocked` (a waiter withdrawn from the
//!   head by an operation that cannot grant: [`Table::grant_unblocked`]).
//! - Every waiter and every holder is also linked on its source's lists,
//!   so ResetBySource touches only what that source owns.
//! - Holders are linked in grant order (`K_AGE` for inline holders,
//!   `S_AGE` for shares), so the oldest hold is one of the two heads: O(1)
//!   for the stuck-lock metric.
//! - Every grant gets a unique, increasing `grant_id` (a holder's fencing
//!   token), shares included. A connection that must give back a grant it
//!   could not deliver names it by `(key slot, grant_id)`, so a slot reused
//!   by another key or another holder is never released by mistake; a
//!   share is found by its grant id (`share_of`), in O(1).
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
use super::name::{Arena, Name, NameRef, KEY_MAX, SOURCE_MAX};
use super::types::{
    Access, Checked, Effect, Effects, Extended, HeldKey, HeldRef, HoldMode, Limit, Limits,
    ListForm, LockMode, LockOpts, Now, Proclaimed, Queued, ReleaseCause, Reply, Token, NO_CONN,
    REPLICATED_SESSION,
};

// Link slots.
const W_KEY: usize = 0; // waiter on its key's queue
const W_SRC: usize = 1; // waiter on its source's waiting list
const K_SRC: usize = 0; // held key on its holder source's held list
const K_AGE: usize = 1; // held key on the table's grant-order list
const W_OWN: usize = 2; // waiter on its session's waiting list
const K_OWN: usize = 2; // held key on its session's held list
const S_KEY: usize = 0; // share on its key's list of other holders
const S_SRC: usize = 1; // share on its source's list of shares
const S_AGE: usize = 2; // share on the table's grant-order list of shares
const S_OWN: usize = 3; // share on its session's list of shares

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
    /// How it held its key.
    access: Access,
    /// Its replicated session's id, read when it was released (the owner
    /// entry may be gone by the time the effect is applied).
    session: u64,
}

/// How a held key is held: every holder of a key holds it the same way
/// (a semaphore's slot count is the key's `slots`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Exclusive,
    Shared,
    Semaphore,
}

impl Class {
    fn of(a: Access) -> Class {
        match a {
            Access::Exclusive => Class::Exclusive,
            Access::Shared => Class::Shared,
            Access::Semaphore(_) => Class::Semaphore,
        }
    }
}

struct KeyEntry {
    name: NameRef,
    /// Its index hash (see [`NameIndex::hash`]), so dropping the entry does not
    /// hash the name again.
    hash: u32,
    /// The inline holder: an exclusive key's only one, one of a shared or
    /// semaphore key's (or none while its shares hold it).
    holder: Option<Holder>,
    /// Its [`Multi`] slot while it is held shared or as a semaphore, or
    /// semaphore requests wait for it; [`NIL`] otherwise (free, or held
    /// exclusively).
    multi: u32,
    queue: List,
    links: [Link; 3],
}

// The inline holder fills the entry exactly; shared and semaphore keys
// cost exclusive ones one `u32` (and its alignment), no more.
const _: () = assert!(std::mem::size_of::<KeyEntry>() <= 144);

/// A key's state beyond an exclusive key's: kept while the key is held
/// shared or as a semaphore, or semaphore requests wait for it.
struct Multi {
    /// The holders besides the key's inline one, in grant order:
    /// [`Share`]s, link slot `S_KEY`.
    others: List,
    /// How the holders hold the key (meaningless while nobody does).
    held_as: Class,
    /// A semaphore's slot count, fixed by its first semaphore request while
    /// `sem_users` is not 0; 0 when no semaphore request holds or waits.
    slots: u32,
    /// Semaphore requests holding or queued on the key.
    sem_users: u32,
}

/// A holder besides its key's inline one (a shared or semaphore key's).
/// Its fencing token is `holder.grant_id`, which finds it (`share_of`).
struct Share {
    /// Its key slot.
    key: u32,
    holder: Holder,
    links: [Link; 4],
}

/// Where a key's holder is: inline in the key entry, or a share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    Inline,
    Share(u32),
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
    /// Its access; a semaphore's `n` is its key's (`Multi::slots`).
    class: Class,
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
    /// Its inline holds (key entries, `K_OWN`).
    held: List,
    /// Its other holds ([`Share`]s, `S_OWN`).
    shares: List,
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
    access: Access,
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
linked_by_array!(KeyEntry, Waiter, Share);

/// Link slots of a key entry or a waiter, all unlinked.
fn new_links() -> [Link; 3] {
    [Link::default(); 3]
}

struct SourceEntry {
    name: NameRef,
    hash: u32,
    /// Its inline holds (key entries, `K_SRC`).
    held: List,
    /// Its other holds ([`Share`]s, `S_SRC`).
    shares: List,
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
    /// The state of shared and semaphore keys (see [`KeyEntry::multi`]);
    /// one per key at most.
    multis: Slab<Multi>,
    /// Holders besides their keys' inline ones; each takes a waiter of the
    /// budget (`--max-waiters` bounds every request entry past a key's
    /// first holder).
    shares: Slab<Share>,
    /// Grant id → share slot, for every share.
    share_of: IdMap<u64, u32>,
    /// Shares in grant order (`S_AGE`).
    shares_by_age: List,
    /// Keys with at least one holder.
    held: usize,
    /// Holders of shared keys, and of semaphores (every other holder is
    /// exclusive): [`Table::holders_by_access`].
    shared_holders: usize,
    semaphore_holders: usize,
    /// Key slots whose queue head may have become grantable when a waiter
    /// left the head in an operation that cannot grant (no time, no
    /// effects): granted by [`Table::grant_unblocked`]. Only shared and
    /// semaphore keys ever get here. May name slots since freed or reused:
    /// granting what is grantable is right for any key.
    unblocked: Vec<u32>,
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
    /// The same walk's rest over the shares (`shares_by_age`), visited
    /// after the keys.
    share_walk: Option<Walk>,
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
        self.budget
            .free_waiters(self.waiters.len() + self.shares.len());
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

impl Walk {
    /// The walk's rest once entry `x` of its list leaves the list: an end
    /// on `x` moves inward (`next_of` / `prev_of`: `x`'s neighbours there),
    /// so the range stays the entries still listed; `None` when `x` was all
    /// that was left.
    #[inline]
    fn leaving(
        self,
        x: u32,
        next_of: impl FnOnce() -> Option<u32>,
        prev_of: impl FnOnce() -> Option<u32>,
    ) -> Option<Walk> {
        if self.next == x && self.last == x {
            None
        } else if self.next == x {
            next_of().map(|next| Walk { next, ..self })
        } else if self.last == x {
            prev_of().map(|last| Walk { last, ..self })
        } else {
            Some(self)
        }
    }
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
            multis: Slab::new(),
            shares: Slab::new(),
            share_of: id_map(),
            shares_by_age: List::new(),
            held: 0,
            shared_holders: 0,
            semaphore_holders: 0,
            unblocked: Vec::new(),
            next_grant_id: 1,
            owners: Slab::new(),
            owner_index: id_map(),
            sessions_homed: id_map(),
            leases: BinaryHeap::new(),
            waits: BinaryHeap::new(),
            next_seq: 1,
            walk: None,
            share_walk: None,
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

    /// Keys held (by one holder or several).
    pub fn held_keys(&self) -> usize {
        self.held
    }

    /// Holders, every holder of a shared or semaphore key counted.
    pub fn holders(&self) -> usize {
        self.by_age.len() as usize + self.shares.len()
    }

    /// Holders by how they hold their keys: `(exclusive, shared,
    /// semaphore)`.
    pub fn holders_by_access(&self) -> (usize, usize, usize) {
        let (s, m) = (self.shared_holders, self.semaphore_holders);
        (self.holders() - s - m, s, m)
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
        let inline = self
            .by_age
            .front()
            .and_then(|k| self.keys[k as usize].holder)
            .map(|h| h.acquired_unix_ms);
        let share = self
            .shares_by_age
            .front()
            .map(|x| self.shares[x as usize].holder.acquired_unix_ms);
        match (inline, share) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
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
                    multi: NIL,
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
                    shares: List::new(),
                    waiting: List::new(),
                }) as u32;
                v.insert(s);
                Some(s)
            }
        }
    }

    #[inline(always)]
    fn source_drop_if_unused(&mut self, s: u32) {
        let e = &self.sources[s as usize];
        if e.held.is_empty() && e.shares.is_empty() && e.waiting.is_empty() {
            self.source_drop(s);
        }
    }

    /// Drops source entry `s` (unused: no hold, no waiter).
    fn source_drop(&mut self, s: u32) {
        let e = &self.sources[s as usize];
        let (name, h) = (e.name, e.hash);
        assert!(
            self.source_index.remove(h, s),
            "source slot {s} missing from its index"
        );
        self.free_name(name);
        self.sources.remove(s as usize);
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

    /// How the holder that [`Effect::Released`] `released` refers to held
    /// its key (what an undo of that release restores it with:
    /// [`Table::restore_access`]). Checked as [`Table::released`].
    pub fn released_access(&self, released: u32, grant_id: u64) -> Access {
        self.retired
            .get(released as usize)
            .filter(|r| r.holder.grant_id == grant_id)
            .expect("a released holder read after effects_applied")
            .access
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
            access: r.access,
        }
    }

    /// The grant that [`Effect::Granted`] reports, by reference, with its
    /// lease deadline on the monotonic clock (0 for other modes): that
    /// holder of the key slot, or, if an operation of the same round
    /// released it already, that holder as it was.
    pub fn granted(&self, key_slot: u32, grant_id: u64) -> (HeldRef<'_>, u64) {
        if let Some(at) = self.grant_in(key_slot, grant_id) {
            let h = self.holder_at(key_slot, at);
            return (self.ref_of(key_slot, h), h.expires_mono_us);
        }
        let r = self.retired_grant(grant_id);
        (self.retired_ref(r), r.holder.expires_mono_us)
    }

    /// How the grant that [`Effect::Granted`] reports holds its key (what
    /// its record will need: [`Table::restore_access`]).
    pub fn granted_access(&self, key_slot: u32, grant_id: u64) -> Access {
        match self.grant_in(key_slot, grant_id) {
            Some(_) => self.access_of(key_slot),
            None => self.retired_grant(grant_id).access,
        }
    }

    fn retired_grant(&self, grant_id: u64) -> &Retired {
        self.retired
            .iter()
            .rev()
            .find(|r| r.holder.grant_id == grant_id)
            .expect("a granted holder read after effects_applied")
    }

    fn key_drop_if_unused(&mut self, k: u32) {
        let e = &self.keys[k as usize];
        if e.holder.is_some() || !e.queue.is_empty() {
            return;
        }
        let (name, h) = (e.name, e.hash);
        if e.multi != NIL {
            if self.is_held(k) {
                return;
            }
            self.multi_drop_if_unused(k);
            debug_assert_eq!(self.keys[k as usize].multi, NIL, "a multi kept for nobody");
        }
        assert!(
            self.key_index.remove(h, k),
            "key slot {k} missing from its index"
        );
        self.free_name(name);
        self.keys.remove(k as usize);
        self.budget.free_keys(1);
    }

    /// Makes `conn` a holder of key slot `k`, whose holders `spec.access`
    /// is compatible with: inline if that slot is free, else a share. A
    /// share keeps a waiter of the budget, which the caller took
    /// (`budgeted`: a granted waiter's, or one taken for it); an inline
    /// holder gives it back.
    #[inline(always)]
    fn place(
        &mut self,
        k: u32,
        source: u32,
        endpoint: Endpoint,
        conn: Token,
        spec: Spec,
        budgeted: bool,
    ) -> At {
        if self.keys[k as usize].holder.is_none() {
            if budgeted {
                self.budget.free_waiters(1);
            }
            self.hold(k, source, endpoint, conn, spec);
            At::Inline
        } else {
            assert!(budgeted, "a share without its waiter of the budget");
            At::Share(self.hold_share(k, source, endpoint, conn, spec))
        }
    }

    fn holder_of_spec(source: u32, endpoint: Endpoint, conn: Token, spec: Spec) -> Holder {
        Holder {
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
        }
    }

    /// Makes `conn` the inline holder of key slot `k` (whose inline slot
    /// is free).
    fn hold(&mut self, k: u32, source: u32, endpoint: Endpoint, conn: Token, spec: Spec) {
        let e = &mut self.keys[k as usize];
        assert!(e.holder.is_none(), "grant of a held key");
        if e.multi == NIL && spec.access == Access::Exclusive {
            // The exclusive path: a free key, nothing else to keep.
            e.holder = Some(Self::holder_of_spec(source, endpoint, conn, spec));
            self.held += 1;
        } else {
            // A free key is listed nowhere; a share holding it stays the
            // one that stands for it, unless a replayed grant id is lower.
            self.listing_note(k);
            let was_held = self.others_front(k).is_some();
            self.keys[k as usize].holder = Some(Self::holder_of_spec(source, endpoint, conn, spec));
            self.took(k, spec.access, was_held);
        }
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
    fn new_spec(&self, mode: HoldMode, ttl_ms: u32, owner: u32, access: Access, now: Now) -> Spec {
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
            access,
        }
    }

    /// Removes the holder `at` of key slot `k`; does not grant the next
    /// waiter and does not drop the key entry.
    #[inline(always)]
    fn clear_at(&mut self, k: u32, at: At, now: Now, cause: ReleaseCause, fx: &mut Effects) {
        // Retired before the unhold, which may drop the source's name
        // (kept now until the effect is applied).
        let e = &self.keys[k as usize];
        let (held, access) = match (at, e.multi) {
            (At::Inline, NIL) => (e.holder.expect("release of a free key"), Access::Exclusive),
            _ => (*self.holder_at(k, at), self.access_of(k)),
        };
        let released = self.retired.len() as u32;
        self.retired.push(Retired {
            key: e.name,
            source: self.sources[held.source as usize].name,
            holder: held,
            access,
            session: self.replicated_owner(held.owner),
        });
        let h = self.unhold_at(k, at);
        fx.push(Effect::Released {
            holder_conn: h.conn,
            released,
            grant_id: h.grant_id,
            held_us: now.mono_us.saturating_sub(h.acquired_mono_us),
            cause,
        });
    }

    /// Removes every holder of key slot `k`, oldest first, each with its
    /// effect; does not grant and does not drop the key entry.
    fn clear_all(&mut self, k: u32, now: Now, cause: ReleaseCause, fx: &mut Effects) {
        while let Some(at) = self.first_at(k) {
            self.clear_at(k, at, now, cause, fx);
        }
    }

    /// [`Table::clear_at`] without an effect (recovery and undo: nobody
    /// to tell, and nothing to allocate).
    #[inline(always)]
    fn unhold_at(&mut self, k: u32, at: At) -> Holder {
        match at {
            At::Inline => self.unhold(k),
            At::Share(x) => self.unhold_share(x),
        }
    }

    /// Removes the inline holder of key slot `k`, without an effect.
    #[inline(always)]
    fn unhold(&mut self, k: u32) -> Holder {
        self.listing_note(k);
        let e = &mut self.keys[k as usize];
        let h = e.holder.take().expect("release of a free key");
        if e.multi == NIL {
            // An exclusive holder was the only one.
            self.held -= 1;
        } else {
            self.gave_up(k);
        }
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
            let keys = &self.keys;
            self.walk = w.leaving(
                k,
                || List::next_of(keys, k, K_AGE),
                || List::prev_of(keys, k, K_AGE),
            );
        }
        self.by_age.unlink(&mut self.keys, k, K_AGE);
        self.source_drop_if_unused(h.source);
        h
    }

    /// Unlinks waiter `w` from its key queue, source and session lists and
    /// frees its slot; its waiter of the budget stays taken (the caller
    /// gives it back, or a share keeps it). Neither the key nor the source
    /// entry is dropped here.
    fn unlink_waiter(&mut self, w: u32) -> Waiter {
        let (key, source, owner, class) = {
            let e = &self.waiters[w as usize];
            (e.key, e.source, e.owner, e.class)
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
        if class == Class::Semaphore {
            let m = self.keys[key as usize].multi;
            let m = &mut self.multis[m as usize];
            m.sem_users -= 1;
            if m.sem_users == 0 {
                m.slots = 0;
            }
            self.multi_drop_if_unused(key);
        }
        self.waiters.remove(w as usize)
    }

    /// A waiter leaves its queue without a grant (answered, withdrawn,
    /// timed out, cancelled): unlinked, its waiter of the budget given
    /// back. When it was the head of a shared or semaphore key's queue, the
    /// next one may be grantable now: the key is noted in `unblocked`.
    fn detach_waiter(&mut self, w: u32) -> Waiter {
        let k = self.waiters[w as usize].key;
        let head = self.keys[k as usize].queue.front() == Some(w);
        let waiter = self.unlink_waiter(w);
        self.budget.free_waiters(1);
        if head && self.head_grantable(k) {
            self.unblocked.push(k);
        }
        waiter
    }

    /// Grants the head of key slot `k`'s queue, then each next waiter,
    /// while compatible with the holders (so consecutive readers at the
    /// head are granted together, and nobody past a waiter that is not
    /// compatible: FIFO across accesses); drops the key entry when nobody
    /// holds or waits. O(1 + grants): it stops at the first waiter it
    /// cannot grant.
    fn grant_ready(&mut self, k: u32, now: Now, fx: &mut Effects) {
        while let Some(w) = self.keys[k as usize].queue.front() {
            if !self.compatible(k, self.waiters[w as usize].class) {
                return;
            }
            // Before the unlink, which may forget the semaphore's `n`.
            let access = self.waiter_access(w);
            let waiter = self.unlink_waiter(w);
            let spec = self.new_spec(waiter.mode, waiter.ttl_ms, waiter.owner, access, now);
            self.place(k, waiter.source, waiter.endpoint, waiter.conn, spec, true);
            fx.push(Effect::Granted {
                conn: waiter.conn,
                key_slot: k,
                grant_id: spec.grant_id,
                waited_us: Some(now.mono_us.saturating_sub(waiter.enqueued_mono_us)),
            });
            if access == Access::Exclusive {
                // It admits nobody beside it.
                return;
            }
        }
        if !self.is_held(k) {
            self.key_drop_if_unused(k);
        }
    }
}

mod cursor;
mod homed;
mod invariants;
mod listing;
mod modes;
mod ops;
mod query;
mod replay;
mod session;
pub use cursor::{entry_len, ListingId, Step, SAVED_BYTES_MAX};

#[cfg(test)]
mod modes_tests;
#[cfg(test)]
mod tests;
