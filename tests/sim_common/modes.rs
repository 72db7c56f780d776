//! Lock modes (issue #33) in the simulators: what a client asks for, and
//! the invariants checked after every step.
//!
//! - **Beliefs** ([`check_believers`]): the clients that believe they hold
//!   one key at one instant asked for the same access; an exclusive
//!   believer is alone, a semaphore of `n` has at most `n` believers.
//! - **The server's table** ([`check_key`], against what the previous
//!   check saw of the key): an exclusive holder is alone, a semaphore has
//!   at most `n` holders; a holder keeps the access (and `n`) it was
//!   granted with; every new grant's token is above every token the key
//!   had; the queue stays in arrival order; and **no grant overtakes a
//!   waiter**: while a request queued at the previous check still waits,
//!   the only new holders are requests that were queued ahead of it.
//! - **Tokens by causality** ([`Causal`]): a grant answered to anyone
//!   before an Acquire on the same key was sent has a smaller token than
//!   that Acquire's grant, whatever the accesses.

use std::collections::BTreeMap;

use ringlock::core::Queued;
use ringlock::core::{Access, Table, NO_CONN};

use super::{Belief, Counted, Rng, SessionView};

/// A random access for an Acquire on key `k`: half exclusive, a quarter
/// shared, a quarter a semaphore, mostly of the key's own `n` (2 or 3)
/// and now and then of 1 to 3 slots, which may differ from the key's and
/// be answered `mode_mismatch`.
pub fn pick_access(rng: &mut Rng, k: usize) -> Access {
    match rng.below(4) {
        0 | 1 => Access::Exclusive,
        2 => Access::Shared,
        _ if rng.chance(200) => Access::Semaphore(1 + rng.below(3) as u32),
        _ => Access::Semaphore(2 + (k % 2) as u32),
    }
}

/// The clients that believe they hold key `k` at `now_us`, by index
/// (their beliefs still valid by the client rules), for
/// [`check_believers`].
pub fn believers<'a>(
    views: impl Iterator<Item = &'a SessionView>,
    k: usize,
    now_us: u64,
    keepalive_us: u64,
) -> Vec<(usize, Belief)> {
    views
        .enumerate()
        .filter_map(|(i, v)| {
            let b = *v.holds.get(&k)?;
            v.valid(&b, now_us, keepalive_us).then_some((i, b))
        })
        .collect()
}

/// The believers of one key at one instant (client, belief) can all be
/// right: one access among them, an exclusive one alone, a semaphore of
/// `n` at most `n`.
pub fn check_believers(key: &[u8], bs: &[(usize, Belief)]) -> Result<(), String> {
    let Some((_, first)) = bs.first() else {
        return Ok(());
    };
    let key = String::from_utf8_lossy(key);
    if let Some((c, b)) = bs.iter().find(|(_, b)| b.access != first.access) {
        return Err(format!(
            "clients believe they hold {key:?} as {:?} and (client {c}) {:?}: {bs:?}",
            first.access, b.access
        ));
    }
    match first.access {
        Access::Exclusive if bs.len() > 1 => Err(format!("two owners of {key:?}: {bs:?}")),
        Access::Semaphore(n) if bs.len() > n as usize => Err(format!(
            "{} believers of {key:?}, a semaphore of {n}: {bs:?}",
            bs.len()
        )),
        _ => Ok(()),
    }
}

/// What the previous check saw of one key on its owner's table.
#[derive(Clone, Debug, Default)]
pub struct KeySeen {
    queue: Vec<Queued>,
    /// (grant id, whose: session id or connection, access), by grant id.
    holders: Vec<(u64, u64, Access)>,
    /// The largest token the key ever had.
    top: u64,
    /// Checks that found a request still waiting from the previous one
    /// (the FIFO rule had something to say), and new grants it judged.
    pub fifo_checks: u64,
    pub fifo_grants: u64,
    /// Checks that found the key with several holders.
    pub multi: u64,
    /// The table as the previous check saw it: (next grant id, waiters,
    /// holders). Unchanged, nothing this check judges can have changed.
    table_was: (u64, usize, usize),
}

/// Checks key `key` of `table` (its owner's) against what the previous
/// check saw, and remembers what it sees now.
pub fn check_key(table: &Table, key: &[u8], seen: &mut KeySeen) -> Result<(), String> {
    let name = || String::from_utf8_lossy(key).into_owned();
    // No grant since (every grant takes the next id), and as many waiters
    // and holders: skipped, which is sound — a waiter may have left and
    // another come, but a later grant is judged against the requests
    // queued at the last check, and those queued ahead of one still
    // waiting were all queued then.
    let now = (
        table.next_grant_id(),
        table.queued_waiters(),
        table.holders(),
    );
    if now == seen.table_was {
        return Ok(());
    }
    seen.table_was = now;
    let mut queue = Vec::new();
    table.queue_of(key, &mut queue);
    if queue.is_empty()
        && seen.queue.is_empty()
        && seen.holders.is_empty()
        && table.holder_count_of(key) == 0
    {
        return Ok(());
    }
    let whose = table.holder_ids_of(key);
    let mut holders: Vec<(u64, u64, Access)> = Vec::with_capacity(whose.len());
    let mut bad = None;
    table.for_each_holder_of(key, |h, a| {
        if h.access != a {
            bad = Some(format!(
                "holder {} listed as {:?}, the key as {a:?}",
                h.grant_id, h.access
            ));
        }
        match whose.binary_search_by_key(&h.grant_id, |w| w.0) {
            Ok(i) => holders.push((h.grant_id, whose[i].1, a)),
            Err(_) => bad = Some(format!("holder {} is nobody's", h.grant_id)),
        }
    });
    if let Some(e) = bad {
        return Err(format!("{:?}: {e}", name()));
    }
    holders.sort_unstable_by_key(|h| h.0);
    if holders.len() != whose.len() {
        return Err(format!(
            "{:?}: holders {holders:?}, whose {whose:?}",
            name()
        ));
    }
    // 1, 2: one access among the holders; an exclusive one alone; a
    // semaphore's n at least 1 and no more holders than n.
    if let Some(&(_, _, a)) = holders.first() {
        if holders.iter().any(|h| h.2 != a) {
            return Err(format!(
                "{:?}: holders of different accesses {holders:?}",
                name()
            ));
        }
        match a {
            Access::Exclusive if holders.len() > 1 => {
                return Err(format!(
                    "{:?}: an exclusive holder not alone: {holders:?}",
                    name()
                ))
            }
            Access::Semaphore(n) if n == 0 || holders.len() > n as usize => {
                return Err(format!(
                    "{:?}: {} holders of a semaphore of {n}: {holders:?}",
                    name(),
                    holders.len()
                ))
            }
            _ => {}
        }
        if holders.len() > 1 {
            seen.multi += 1;
        }
    }
    // A holder keeps its access (a semaphore its n: a request naming
    // another n changes nothing); 4: a new grant's token is above every
    // token the key had.
    let mut fresh: Vec<(u64, u64, Access)> = Vec::new();
    for &(g, who, a) in &holders {
        match seen.holders.binary_search_by_key(&g, |h| h.0) {
            Ok(i) if seen.holders[i].2 != a => {
                return Err(format!(
                    "{:?}: holder {g} was granted as {:?} and now holds as {a:?}",
                    name(),
                    seen.holders[i].2
                ))
            }
            Ok(_) => {}
            Err(_) if g <= seen.top => {
                return Err(format!(
                    "{:?}: new holder with token {g}, not above {} (the key's largest so far)",
                    name(),
                    seen.top
                ))
            }
            Err(_) => fresh.push((g, who, a)),
        }
    }
    // Queued in arrival order, never reordered.
    if queue.windows(2).any(|w| w[0].seq >= w[1].seq) {
        return Err(format!(
            "{:?}: queue out of arrival order: {queue:?}",
            name()
        ));
    }
    // 3: no grant ahead of an earlier waiter. The first request queued at
    // the previous check that still waits: every request ahead of it then
    // is gone; a new holder must be one of those (by whose it is) — not
    // one queued behind it, nor one that came since.
    let waits = |seq: u64| queue.iter().any(|q| q.seq == seq);
    if let Some(i) = seen.queue.iter().position(|q| waits(q.seq)) {
        seen.fifo_checks += 1;
        let waiter = seen.queue[i];
        let mut ahead: Vec<u64> = seen.queue[..i].iter().map(|q| q.who).collect();
        for &(g, who, a) in &fresh {
            seen.fifo_grants += 1;
            // A hold whose session ended since it was granted (a lease
            // outlives it) is nobody's: any request ahead may be it.
            let mine = ahead.iter().position(|&c| c == who);
            match mine.or((who == NO_CONN && !ahead.is_empty()).then_some(0)) {
                Some(j) => {
                    ahead.swap_remove(j);
                }
                None => {
                    return Err(format!(
                        "{:?}: granted {a:?} (token {g}, to {who:#x}) while \
                         {:?} (of {:#x}, queued #{}) still waits ahead of it; \
                         queued then {:?}, now {queue:?}",
                        name(),
                        waiter.access,
                        waiter.who,
                        waiter.seq,
                        seen.queue
                    ))
                }
            }
        }
    }
    seen.top = seen.top.max(holders.last().map_or(0, |h| h.0));
    seen.queue = queue;
    seen.holders = holders;
    Ok(())
}

/// Tokens by causality, per key: the largest token answered to any
/// client so far, and for each Acquire in flight that value when it was
/// sent; its grant must be above it.
#[derive(Default)]
pub struct Causal {
    answered: BTreeMap<usize, u64>,
    /// (client, rid) → (key, the floor when it was sent).
    floors: BTreeMap<(usize, u32), (usize, u64)>,
    pub checked: u64,
}

impl Causal {
    /// Client `c` sent Acquire `rid` on key `k`.
    pub fn sent(&mut self, c: usize, rid: u32, k: usize) {
        let floor = self.answered.get(&k).copied().unwrap_or(0);
        self.floors.insert((c, rid), (k, floor));
    }

    /// Client `c`'s Acquire `rid` was answered with a grant of `token`
    /// (none recorded: not checked, only counted as answered).
    pub fn granted(&mut self, c: usize, rid: u32, k: usize, token: u64) -> Result<(), String> {
        if let Some((kk, floor)) = self.floors.remove(&(c, rid)) {
            if kk == k {
                self.checked += 1;
                if token <= floor {
                    return Err(format!(
                        "client {c}'s Acquire rid {rid} was granted token {token}, not above \
                         {floor}, a token answered before it was sent"
                    ));
                }
            }
        }
        let m = self.answered.entry(k).or_insert(0);
        *m = (*m).max(token);
        Ok(())
    }

    /// Client `c`'s requests are forgotten (a new session numbers from 1).
    pub fn forget(&mut self, c: usize) {
        self.floors.retain(|&(cc, _), _| cc != c);
    }
}

/// Lock-mode counters over a test's runs.
#[derive(Default, Debug)]
pub struct Modes {
    pub shared: u64,
    pub semaphore: u64,
    pub mismatches: u64,
    /// Checks that found a key with several holders.
    pub multi: u64,
    pub fifo_checks: u64,
    pub fifo_grants: u64,
    pub causal: u64,
}

impl Modes {
    pub fn add(&mut self, n: &Counted) {
        self.shared += n.shared;
        self.semaphore += n.semaphore;
        self.mismatches += n.mismatches;
    }

    pub fn add_seen(&mut self, s: &KeySeen) {
        self.multi += s.multi;
        self.fifo_checks += s.fifo_checks;
        self.fifo_grants += s.fifo_grants;
    }

    pub fn merge(&mut self, o: &Modes) {
        self.shared += o.shared;
        self.semaphore += o.semaphore;
        self.mismatches += o.mismatches;
        self.multi += o.multi;
        self.fifo_checks += o.fifo_checks;
        self.fifo_grants += o.fifo_grants;
        self.causal += o.causal;
    }
}
