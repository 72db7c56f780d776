//! The server-wide capacity of keys and waiters.
//!
//! `--max-keys` and `--max-waiters` bound the whole server as the user
//! wrote them, however many shards there are. Every shard's table takes
//! from one shared [`Budget`] when it creates a key entry or a waiter and
//! gives back when it frees one; lookups, grants and releases of existing
//! keys never touch it. The count is exact: a take is a compare-and-swap
//! that succeeds only below the limit, so the server never holds more than
//! the limit, on any number of shards.
//!
//! Invariant: `keys` (`waiters`) equals the sum of the key entries
//! (waiters) of the tables sharing the budget; `Table`'s own invariant
//! check compares its part, and a table gives back what it holds when it
//! is dropped.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use super::types::Limits;

/// A count on its own cache line: shards take from the two counts
/// independently.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Padded(AtomicUsize);

#[derive(Debug)]
struct Counts {
    keys: Padded,
    waiters: Padded,
    limits: Limits,
}

/// Shared capacity of key entries and waiters (cheap to clone: one `Arc`).
#[derive(Clone, Debug)]
pub struct Budget(Arc<Counts>);

impl Budget {
    pub fn new(limits: Limits) -> Budget {
        Budget(Arc::new(Counts {
            keys: Padded::default(),
            waiters: Padded::default(),
            limits,
        }))
    }

    pub fn limits(&self) -> Limits {
        self.0.limits
    }

    /// Key entries in use, server-wide.
    pub fn keys(&self) -> usize {
        self.0.keys.0.load(Relaxed)
    }

    /// Waiters queued, server-wide.
    pub fn waiters(&self) -> usize {
        self.0.waiters.0.load(Relaxed)
    }

    pub(crate) fn take_key(&self) -> bool {
        take(&self.0.keys.0, self.0.limits.max_keys)
    }

    pub(crate) fn free_keys(&self, n: usize) {
        give(&self.0.keys.0, n, "key");
    }

    pub(crate) fn take_waiter(&self) -> bool {
        take(&self.0.waiters.0, self.0.limits.max_waiters)
    }

    pub(crate) fn free_waiters(&self, n: usize) {
        give(&self.0.waiters.0, n, "waiter");
    }
}

fn take(n: &AtomicUsize, max: usize) -> bool {
    n.fetch_update(Relaxed, Relaxed, |v| (v < max).then_some(v + 1))
        .is_ok()
}

fn give(n: &AtomicUsize, k: usize, what: &str) {
    let before = n.fetch_sub(k, Relaxed);
    assert!(before >= k, "gave back {k} {what}(s) of {before} taken");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_stop_at_the_limit_and_resume_after_a_give() {
        let b = Budget::new(Limits {
            max_keys: 2,
            max_waiters: 1,
        });
        let other = b.clone();
        assert!(b.take_key());
        assert!(other.take_key());
        assert!(!b.take_key(), "a third key past max_keys 2");
        assert!(other.take_waiter());
        assert!(!b.take_waiter());
        b.free_keys(1);
        assert!(other.take_key());
        assert_eq!((b.keys(), b.waiters()), (2, 1));
    }

    #[test]
    fn concurrent_takes_never_pass_the_limit() {
        let b = Budget::new(Limits {
            max_keys: 1000,
            max_waiters: 0,
        });
        let taken: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let b = b.clone();
                    s.spawn(move || (0..600).filter(|_| b.take_key()).count())
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("taker")).sum()
        });
        assert_eq!(taken, 1000);
        assert_eq!(b.keys(), 1000);
    }
}
