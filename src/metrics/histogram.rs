//! Fixed-bucket histograms, and their rendering in seconds.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::text::header;

/// Upper bounds (inclusive, microseconds) of the latency buckets:
/// 10 µs … 10 s in 1-2.5-5 steps.
pub const LATENCY_BOUNDS_US: [u64; 19] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Upper bounds (inclusive) of the records-per-WAL-batch buckets: 1 … 1024.
pub const BATCH_BOUNDS: [u64; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// A fixed-bucket histogram: `N` bounded buckets plus one overflow slot
/// (`M == N + 1`), all plain counters, and a running sum in the observed unit.
pub struct Histogram<const N: usize, const M: usize> {
    bounds: &'static [u64; N],
    pub(super) buckets: [AtomicU64; M],
    sum: AtomicU64,
}

impl<const N: usize, const M: usize> Histogram<N, M> {
    pub(super) const fn new(bounds: &'static [u64; N]) -> Self {
        assert!(M == N + 1, "one overflow bucket after the bounded ones");
        Histogram {
            bounds,
            buckets: [const { AtomicU64::new(0) }; M],
            sum: AtomicU64::new(0),
        }
    }

    /// Records one observation: two relaxed `fetch_add`s, no allocation.
    pub fn observe(&self, value: u64) {
        // Linear scan: at most 19 compares on data that sits in one or two
        // cache lines; cheaper than a branchy binary search at this size.
        let mut slot = N;
        for (i, &bound) in self.bounds.iter().enumerate() {
            if value <= bound {
                slot = i;
                break;
            }
        }
        self.buckets[slot].fetch_add(1, Relaxed);
        self.sum.fetch_add(value, Relaxed);
    }

    /// Total observations (the `+Inf` bucket).
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }

    /// Sum of observed values, in the observed unit.
    pub fn sum(&self) -> u64 {
        self.sum.load(Relaxed)
    }
}

pub(super) type LatencyHistogram = Histogram<19, 20>;
pub(super) type BatchHistogram = Histogram<11, 12>;

/// One histogram in seconds: the sum of `hs` (one per event loop).
pub(super) fn seconds_histogram<'a>(
    w: &mut String,
    name: &str,
    help: &str,
    hs: impl Iterator<Item = &'a LatencyHistogram> + Clone,
) {
    header(w, name, help, "histogram");
    let bucket = |i: usize| -> u64 { hs.clone().map(|h| h.buckets[i].load(Relaxed)).sum() };
    let mut cumulative = 0;
    for (i, &bound_us) in LATENCY_BOUNDS_US.iter().enumerate() {
        cumulative += bucket(i);
        let _ = write!(w, "ringlock_{name}_bucket{{le=\"");
        push_seconds(w, bound_us);
        let _ = writeln!(w, "\"}} {cumulative}");
    }
    cumulative += bucket(LATENCY_BOUNDS_US.len());
    let _ = writeln!(w, "ringlock_{name}_bucket{{le=\"+Inf\"}} {cumulative}");
    let _ = write!(w, "ringlock_{name}_sum ");
    push_seconds(w, hs.map(|h| h.sum()).sum());
    w.push('\n');
    let _ = writeln!(w, "ringlock_{name}_count {cumulative}");
}

/// Writes `us` microseconds as exact decimal seconds: 0, 0.00001, 2.5, 10.
pub(super) fn push_seconds(w: &mut String, us: u64) {
    let whole = us / 1_000_000;
    let _ = write!(w, "{whole}");
    let mut frac = us % 1_000_000;
    if frac != 0 {
        let mut digits = 6;
        while frac.is_multiple_of(10) {
            frac /= 10;
            digits -= 1;
        }
        let _ = write!(w, ".{frac:0digits$}");
    }
}
