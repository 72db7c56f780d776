//! **No lease ends before its lower bound**: a lease a session client
//! believes it holds (until its Acquire/Extend send time + TTL, by the
//! client library's rules) has, on the serving node, a deadline no earlier
//! than that instant. The "lost grant" check sees an early expiry only
//! once the serving node has released the key; this one sees a deadline
//! that is too early the moment a node serves with it (a new leader that
//! computed it short, before anything expires).

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use ringlock::core::HoldMode;

use super::{World, KEYS};

impl World {
    /// The global instant at which node `i`'s monotonic clock reads `mono_us`.
    pub(super) fn global_at(&self, i: usize, mono_us: u64) -> u64 {
        let nd = &self.nodes[i];
        nd.global_base + mono_us.saturating_sub(nd.clock_base) * 1000 / nd.rate
    }

    /// Serving node `i`'s deadline of key `k` against session client
    /// `c`'s belief in it (its holder by token, already checked).
    pub(super) fn check_lease_bound(&self, i: usize, k: usize, c: usize) {
        let cl = &self.clients[c];
        let Some(b) = cl.view.holds.get(&k) else {
            return;
        };
        if b.mode != HoldMode::Lease {
            return;
        }
        let s = self.nodes[i].shard(self.owner(k)).expect("serving");
        let Some(d) = s.table().lease_deadline_us(KEYS[k], b.token) else {
            self.fail(format!(
                "session client {c} believes a lease of {:?} (token {}) that node {} serves as no lease",
                String::from_utf8_lossy(KEYS[k]),
                b.token,
                i + 1
            ));
        };
        let ends = self.global_at(i, d);
        CHECKED.fetch_add(1, Relaxed);
        MIN_MARGIN_US.fetch_min(ends.saturating_sub(b.until_us), Relaxed);
        // Beliefs checked on a node other than the first that served them:
        // leases that outlived a failover.
        let first = FIRST_SERVER.with(|m| *m.borrow_mut().entry((self.seed, b.token)).or_insert(i));
        if first != i {
            MOVED.fetch_add(1, Relaxed);
            MIN_MOVED_MARGIN_US.fetch_min(ends.saturating_sub(b.until_us), Relaxed);
        }
        if ends < b.until_us {
            self.fail(format!(
                "lease ends early: session client {c} believes {:?} (token {}) until t={} but \
                 serving node {} ends it at t={ends} ({} µs before)",
                String::from_utf8_lossy(KEYS[k]),
                b.token,
                b.until_us,
                i + 1,
                b.until_us - ends
            ));
        }
    }
}

thread_local! {
    static FIRST_SERVER: std::cell::RefCell<std::collections::BTreeMap<(u64, u64), usize>> =
        Default::default();
}
static MOVED: AtomicU64 = AtomicU64::new(0);
static MIN_MOVED_MARGIN_US: AtomicU64 = AtomicU64::new(u64::MAX);
static CHECKED: AtomicU64 = AtomicU64::new(0);
static MIN_MARGIN_US: AtomicU64 = AtomicU64::new(u64::MAX);

/// For the run's summary: how many believed leases were checked, and the
/// least time a serving node's deadline had left beyond a belief.
pub fn summary() -> String {
    format!(
        "{} believed leases checked against their deadline, least margin {} µs; \
         {} on a later server than their first, least margin {} µs",
        CHECKED.load(Relaxed),
        MIN_MARGIN_US.load(Relaxed),
        MOVED.load(Relaxed),
        MIN_MOVED_MARGIN_US.load(Relaxed)
    )
}
