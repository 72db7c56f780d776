//! Fencing: the protected resource refuses writes that carry an older
//! token than the newest it has seen.
//!
//! # Why a lock alone cannot protect a resource
//! A lock server can only decide who holds a key *now*. The holder acts on
//! the resource *later*: between "I hold the lock" and the moment its write
//! lands, the process may stop for any length of time — a stop-the-world
//! pause, `SIGSTOP`, a swapped-out page, a VM migration, a write stuck in a
//! network buffer. If that pause outlasts its lease (or its session's
//! keep-alive), the server frees the key and grants it to the next client,
//! which starts writing. Then the first holder resumes and, still believing
//! it owns the lock, writes too: two owners, one resource. No check the
//! holder makes beforehand helps, because the check and the write are not
//! one atomic step — the pause can fall right between them.
//!
//! Only the resource sees both writes, so only the resource can order
//! them. Every ringlockd grant carries a 64-bit **fencing token** that
//! strictly increases for a key (across unlocks, resets, expiry, restarts;
//! `docs/protocol.md`, "Fencing tokens"). The writer sends its token with
//! every write; the resource remembers the highest token it has accepted
//! and refuses anything lower. The paused holder's token is lower than its
//! successor's, so its late write is refused instead of applied.
//!
//! # Using it
//! On the storage side, keep one [`Fence`] per lock key (or a
//! [`FenceMap`] keyed by it) and pass every write through
//! [`Fence::apply`], which checks the token and runs the write while no
//! other write can slip in between:
//!
//! ```
//! use ringlock::fence::{Fence, Stale};
//!
//! let fence = Fence::new();
//! let mut balance = 100;
//! // The holder of token 7 writes, twice: an equal token is the same holder.
//! fence.apply(7, || balance -= 10).expect("first token");
//! fence.apply(7, || balance -= 10).expect("same holder again");
//! // Its successor got token 9 and writes.
//! fence.apply(9, || balance += 50).expect("newer holder");
//! // The first holder wakes up from a pause and tries once more: refused.
//! assert_eq!(fence.apply(7, || balance = 0), Err(Stale { seen: 9, got: 7 }));
//! assert_eq!(balance, 130);
//! ```
//!
//! On the client side the token comes from the grant,
//! [`Lease::token`](crate::lease::Lease::token):
//!
//! ```no_run
//! # fn store_write(_token: u64, _data: &[u8]) -> Result<(), String> { Ok(()) }
//! fn write_while_holding(lease: &ringlock::lease::Lease, data: &[u8]) -> Result<(), String> {
//!     // ringlockd grants always carry a token; MySQL GET_LOCK has none,
//!     // and a resource it protects cannot be fenced.
//!     let token = lease.token().ok_or("this backend issues no fencing tokens")?;
//!     store_write(token, data) // the store runs `fence.apply(token, ...)`
//! }
//! ```
//!
//! `examples/fence.rs` shows the whole failure prevented against a real
//! `ringlockd`: a holder stopped past its lease, its successor's write, and
//! the stale write refused.
//!
//! # What the fence needs from its user
//! - **One fence per lock key.** Tokens increase per key; two keys' tokens
//!   are not comparable (they come from different counters on a sharded
//!   server).
//! - **Check and write together.** [`Fence::check_and_advance`] followed by
//!   a write elsewhere leaves a window in which a newer holder's write can
//!   land first and be overwritten by the older one's. Use
//!   [`Fence::apply`], or make the comparison part of the store's own
//!   atomic step (for SQL, `UPDATE … SET …, fence = $token WHERE id = $id
//!   AND fence <= $token`).
//! - **Remember the highest token as long as the data.** A fence that
//!   forgets (a store restarted without it) accepts the next stale write.
//!   Persist [`Fence::highest`] with the data and restore it with
//!   [`Fence::starting_at`].
//! - Token 0 is never issued by ringlockd (it means "no token" on the
//!   wire): a fence that has seen any real token refuses it as stale.
//!
//! This module is std only and builds without any optional feature.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// A write refused because its token is older than the newest the fence
/// has accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stale {
    /// The highest token the fence had accepted.
    pub seen: u64,
    /// The token the refused write carried (`got < seen`).
    pub got: u64,
}

impl fmt::Display for Stale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stale fencing token {}: token {} was already accepted (the lock changed hands since this writer got it)",
            self.got, self.seen
        )
    }
}

impl std::error::Error for Stale {}

/// The high-water mark of one resource (one lock key). Thread-safe: share
/// it by reference or in an `Arc`.
#[derive(Debug, Default)]
pub struct Fence {
    /// The highest accepted token. A mutex rather than an atomic so that
    /// [`Fence::apply`] can hold it across the write: accepted writes then
    /// run one at a time in non-decreasing token order.
    highest: Mutex<u64>,
}

impl Fence {
    /// A fence that has seen no token.
    pub const fn new() -> Fence {
        Fence {
            highest: Mutex::new(0),
        }
    }

    /// A fence restored from a persisted [`highest`](Fence::highest): it
    /// refuses every token below `highest`.
    pub const fn starting_at(highest: u64) -> Fence {
        Fence {
            highest: Mutex::new(highest),
        }
    }

    /// The highest token accepted so far (0: none, or a fresh fence).
    pub fn highest(&self) -> u64 {
        *self.lock()
    }

    /// Accepts `token` if it is at least the highest seen (an equal token
    /// is the same holder writing again) and makes it the new highest;
    /// refuses an older one and changes nothing. Only the check: a write
    /// that follows it outside the fence can still be overtaken, see
    /// [`Fence::apply`].
    pub fn check_and_advance(&self, token: u64) -> Result<(), Stale> {
        advance(&mut self.lock(), token)
    }

    /// Runs `write` if `token` is accepted (as by
    /// [`check_and_advance`](Fence::check_and_advance)), with the fence held
    /// until it returns, so that no write with another token runs
    /// meanwhile: the writes this fence lets through happen in
    /// non-decreasing token order. A refused token runs nothing.
    ///
    /// The token counts as seen once accepted, even if `write` then fails or
    /// panics: an older holder stays refused either way. Keep `write` short;
    /// writers of this resource wait for it.
    pub fn apply<R>(&self, token: u64, write: impl FnOnce() -> R) -> Result<R, Stale> {
        let mut highest = self.lock();
        advance(&mut highest, token)?;
        Ok(write())
    }

    fn lock(&self) -> MutexGuard<'_, u64> {
        // A panic inside `apply`'s write poisons the mutex; the number it
        // guards is still consistent (it was advanced before the write ran).
        self.highest.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn advance(highest: &mut u64, token: u64) -> Result<(), Stale> {
    if token < *highest {
        return Err(Stale {
            seen: *highest,
            got: token,
        });
    }
    *highest = token;
    Ok(())
}

/// One [`Fence`] per key, created on first use: for a store that protects
/// many resources, each under its own lock key.
///
/// A key's fence is kept for the map's lifetime (forgetting it would let
/// the next stale write through), so the map grows with the number of
/// distinct keys it has seen; [`FenceMap::snapshot`] and
/// [`FenceMap::from_snapshot`] persist and restore it.
#[derive(Debug, Default)]
pub struct FenceMap {
    fences: Mutex<HashMap<Box<[u8]>, Arc<Fence>>>,
}

impl FenceMap {
    pub fn new() -> FenceMap {
        FenceMap::default()
    }

    /// A map restored from `(key, highest token)` pairs, as
    /// [`snapshot`](FenceMap::snapshot) returns them.
    pub fn from_snapshot<K: AsRef<[u8]>>(entries: impl IntoIterator<Item = (K, u64)>) -> FenceMap {
        let fences = entries
            .into_iter()
            .map(|(k, t)| (Box::from(k.as_ref()), Arc::new(Fence::starting_at(t))))
            .collect();
        FenceMap {
            fences: Mutex::new(fences),
        }
    }

    /// The fence of `key` (created, having seen nothing, on first use).
    /// Writers of one key contend on that key's fence only.
    pub fn fence(&self, key: impl AsRef<[u8]>) -> Arc<Fence> {
        let key = key.as_ref();
        let mut map = self.lock();
        if let Some(f) = map.get(key) {
            return Arc::clone(f);
        }
        let f = Arc::new(Fence::new());
        map.insert(Box::from(key), Arc::clone(&f));
        f
    }

    /// [`Fence::check_and_advance`] on `key`'s fence.
    pub fn check_and_advance(&self, key: impl AsRef<[u8]>, token: u64) -> Result<(), Stale> {
        self.fence(key).check_and_advance(token)
    }

    /// [`Fence::apply`] on `key`'s fence: writes of other keys are not held
    /// up by it.
    pub fn apply<R>(
        &self,
        key: impl AsRef<[u8]>,
        token: u64,
        write: impl FnOnce() -> R,
    ) -> Result<R, Stale> {
        self.fence(key).apply(token, write)
    }

    /// The highest token accepted for `key`; `None` if the key was never
    /// fenced.
    pub fn highest(&self, key: impl AsRef<[u8]>) -> Option<u64> {
        self.lock().get(key.as_ref()).map(|f| f.highest())
    }

    /// Number of keys with a fence.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Every key with its highest token, sorted by key (to persist).
    pub fn snapshot(&self) -> Vec<(Vec<u8>, u64)> {
        let mut v: Vec<(Vec<u8>, u64)> = self
            .lock()
            .iter()
            .map(|(k, f)| (k.to_vec(), f.highest()))
            .collect();
        v.sort();
        v
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Box<[u8]>, Arc<Fence>>> {
        // Nothing panics while the map is held; a poisoned map is intact.
        self.fences.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::thread;

    #[test]
    fn equal_is_allowed_older_is_refused_and_changes_nothing() {
        let f = Fence::new();
        assert_eq!(f.highest(), 0);
        assert_eq!(f.check_and_advance(5), Ok(()));
        assert_eq!(f.check_and_advance(5), Ok(()), "one holder writes again");
        assert_eq!(f.check_and_advance(4), Err(Stale { seen: 5, got: 4 }));
        assert_eq!(f.highest(), 5, "a refusal changes nothing");
        assert_eq!(f.check_and_advance(u64::MAX), Ok(()));
        assert_eq!(
            f.check_and_advance(0),
            Err(Stale {
                seen: u64::MAX,
                got: 0
            })
        );
    }

    #[test]
    fn apply_runs_the_write_only_when_accepted() {
        let f = Fence::starting_at(10);
        let mut ran = 0;
        assert_eq!(f.apply(9, || ran += 1), Err(Stale { seen: 10, got: 9 }));
        assert_eq!(ran, 0, "a stale write never runs");
        assert_eq!(f.apply(10, || 42), Ok(42));
        assert_eq!(f.apply(11, || 43), Ok(43));
        assert_eq!(f.highest(), 11);
        let msg = Stale { seen: 11, got: 3 }.to_string();
        assert!(
            msg.contains("stale fencing token 3") && msg.contains("11"),
            "{msg}"
        );
    }

    #[test]
    fn a_panicking_write_keeps_the_fence_usable() {
        let f = Arc::new(Fence::new());
        let f2 = Arc::clone(&f);
        let r = thread::spawn(move || f2.apply(7, || panic!("the store failed"))).join();
        assert!(r.is_err(), "the write's panic reaches its caller");
        assert_eq!(f.highest(), 7, "the token counted as seen");
        assert_eq!(f.check_and_advance(6), Err(Stale { seen: 7, got: 6 }));
        assert_eq!(f.apply(8, || "ok"), Ok("ok"));
    }

    /// Many writers with interleaved tokens: every write the fence lets
    /// through is recorded, inside `apply`, in the order it ran. That
    /// sequence never decreases, every refusal names a token below what had
    /// been accepted, and the highest token offered is accepted.
    #[test]
    fn concurrent_writes_land_in_non_decreasing_token_order() {
        const THREADS: u64 = 8;
        const PER_THREAD: u64 = 2_000;
        let fence = Arc::new(Fence::new());
        let log = Arc::new(Mutex::new(Vec::new()));
        let start = Arc::new(Barrier::new(THREADS as usize));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (fence, log, start) = (fence.clone(), log.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    let mut refused = 0u64;
                    for i in 0..PER_THREAD {
                        // Tokens interleave across threads and each thread
                        // also retries an older one, so refusals happen.
                        let token = i * THREADS + t + if i % 3 == 0 { 0 } else { 1 };
                        let older = token.saturating_sub(THREADS * 2);
                        for tok in [token, older] {
                            match fence.apply(tok, || log.lock().expect("log").push(tok)) {
                                Ok(()) => {}
                                Err(s) => {
                                    assert!(s.got < s.seen, "{s:?}");
                                    assert_eq!(s.got, tok);
                                    refused += 1;
                                }
                            }
                        }
                    }
                    refused
                })
            })
            .collect();
        let refused: u64 = handles.into_iter().map(|h| h.join().expect("writer")).sum();
        let log = log.lock().expect("log");
        assert!(
            log.windows(2).all(|w| w[0] <= w[1]),
            "accepted writes went backwards"
        );
        assert_eq!(log.len() as u64 + refused, THREADS * PER_THREAD * 2);
        assert!(refused > 0, "the test offered no stale token");
        let max_offered = (PER_THREAD - 1) * THREADS + (THREADS - 1) + 1;
        assert_eq!(fence.highest(), max_offered);
        assert_eq!(log.last(), Some(&max_offered));
    }

    /// `check_and_advance` alone under contention: the fence's value only
    /// grows, and a thread whose token was accepted saw no higher token
    /// accepted before its own.
    #[test]
    fn concurrent_checks_never_lower_the_mark() {
        let fence = Arc::new(Fence::new());
        let handles: Vec<_> = (0..8u64)
            .map(|t| {
                let fence = fence.clone();
                thread::spawn(move || {
                    let mut last_seen = 0;
                    for i in 0..5_000u64 {
                        let tok = (i * 7 + t * 13) % 10_007;
                        let before = fence.highest();
                        assert!(before >= last_seen, "the mark went down");
                        last_seen = before;
                        if fence.check_and_advance(tok).is_ok() {
                            assert!(fence.highest() >= tok);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("checker");
        }
        let max = (0..8u64)
            .flat_map(|t| (0..5_000u64).map(move |i| (i * 7 + t * 13) % 10_007))
            .max()
            .expect("tokens");
        assert_eq!(fence.highest(), max);
    }

    #[test]
    fn fence_map_keeps_one_mark_per_key() {
        let m = FenceMap::new();
        assert!(m.is_empty());
        assert_eq!(m.highest("a"), None);
        m.check_and_advance("a", 100).expect("a first");
        m.check_and_advance(b"b".as_slice(), 5)
            .expect("b has its own mark, below a's");
        assert_eq!(m.apply("a", 99, || ()), Err(Stale { seen: 100, got: 99 }));
        assert_eq!(m.apply("b", 6, || 1), Ok(1));
        assert_eq!(m.len(), 2);
        assert!(Arc::ptr_eq(&m.fence("a"), &m.fence("a")));
        let snap = m.snapshot();
        assert_eq!(snap, vec![(b"a".to_vec(), 100), (b"b".to_vec(), 6)]);
        let restored = FenceMap::from_snapshot(snap);
        assert_eq!(
            restored.check_and_advance("b", 5),
            Err(Stale { seen: 6, got: 5 }),
            "a restored map still refuses what the old one had passed"
        );
    }

    #[test]
    fn fence_map_under_concurrency() {
        let m = Arc::new(FenceMap::new());
        let handles: Vec<_> = (0..8u64)
            .map(|t| {
                let m = m.clone();
                thread::spawn(move || {
                    for i in 0..2_000u64 {
                        let key = format!("k{}", i % 4);
                        let _ = m.apply(&key, i * 8 + t, || ());
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("writer");
        }
        assert_eq!(m.len(), 4);
        for k in 0..4u64 {
            // The largest token offered for key k: the last i with i % 4 == k, thread 7.
            let i = 2_000 - 4 + k;
            assert_eq!(m.highest(format!("k{k}")), Some(i * 8 + 7));
        }
    }
}
