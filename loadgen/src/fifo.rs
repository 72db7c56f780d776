//! Per-writer FIFO evidence for a mixed run (`--writers N`): did every
//! writer wait only for the holders ahead of it?
//!
//! During the run the engine keeps one [`OpRecord`] per Acquire (readers'
//! and writers', warm-up included), all on one CLOCK_MONOTONIC clock (one
//! process): when the Acquire was written, when its grant arrived, when its
//! Release was written. After the run [`analyse`] looks, key by key, at
//! every measured writer Acquire W that was granted, with `G` the guard
//! (`--fifo-guard`, default 50 µs: client-side send-order jitter, two
//! Acquires written that close together may reach the server in either
//! order):
//!
//! - **ahead of W**: the operations (readers and writers) whose Acquire was
//!   sent no later than `W.sent + G` and that were granted before W was
//!   (strictly earlier grant time): the holders and waiters in front of it;
//! - `ahead_release`: the latest Release-sent time among them (0 if none);
//! - **excess** = `W.granted − max(W.sent, ahead_release)` (0 if negative):
//!   the part of W's wait that the holders ahead of it do not explain.
//!   With a FIFO server it is about one round trip (the last Release to
//!   the server, W's grant back);
//! - **overtaken_by**: the reader grants whose Acquire was sent after
//!   `W.sent + G` and that were granted before W. A reader granted before
//!   W is thus either ahead of it or an overtake, never both.
//!
//! An operation whose connection failed while it held the key gets the
//! time of the failure as its release (the server releases a session hold
//! when its connection ends). A measured writer Acquire that was never
//! granted (a server error, a broken connection, still waiting when the
//! drain ran out) is counted in `writer_acquires` but not analysed.
//!
//! Cost: O(n log n) per key (a sweep in send order with two Fenwick trees
//! over the grant times), run once after the load.

use hdrhistogram::Histogram;

/// `--fifo-guard`'s default.
pub const DEFAULT_GUARD_NS: u64 = 50_000;

/// `OpRecord::granted_ns` of an Acquire that was never granted.
pub const NOT_GRANTED: u64 = u64::MAX;

/// One Acquire of a mixed run, CLOCK_MONOTONIC ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpRecord {
    /// When the Acquire was written.
    pub sent_ns: u64,
    /// When its grant arrived, or [`NOT_GRANTED`].
    pub granted_ns: u64,
    /// When its Release was written (or its connection given up while it
    /// held the key); meaningless when not granted.
    pub released_ns: u64,
    /// The key (its index in the run's key space).
    pub key: u32,
    /// An exclusive (writer) Acquire; else a reader's (`--access`).
    pub writer: bool,
    /// The cycle's intended start lies in the measured window.
    pub measured: bool,
}

impl OpRecord {
    pub fn granted(&self) -> bool {
        self.granted_ns != NOT_GRANTED
    }
}

/// What [`analyse_key`] found for one writer Acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterFigures {
    /// The writer's index in the slice given to [`analyse_key`].
    pub index: usize,
    pub ahead_release_ns: u64,
    pub excess_ns: u64,
    pub overtaken_by: u64,
}

/// The FIFO figures of a whole run.
#[derive(Clone, Debug)]
pub struct Fifo {
    pub guard_ns: u64,
    /// Measured writer Acquires.
    pub writer_acquires: u64,
    /// Those of them that were granted, and so analysed.
    pub analysed: u64,
    /// Every analysed writer Acquire's excess (ns).
    pub excess: Histogram<u64>,
    /// Sum of `overtaken_by` over the analysed writer Acquires.
    pub overtakes: u64,
    /// Analysed writer Acquires with `overtaken_by > 0`.
    pub writers_overtaken: u64,
    /// The largest `overtaken_by` of one writer Acquire.
    pub max_overtaken_by: u64,
}

impl Fifo {
    /// Share of the analysed writer Acquires that were overtaken (0..1).
    pub fn overtaken_share(&self) -> f64 {
        if self.analysed == 0 {
            0.0
        } else {
            self.writers_overtaken as f64 / self.analysed as f64
        }
    }
}

/// Analyse every key's operations (`ops` is sorted in place by key, then
/// send time).
pub fn analyse(ops: &mut [OpRecord], guard_ns: u64) -> Fifo {
    let mut f = Fifo {
        guard_ns,
        writer_acquires: 0,
        analysed: 0,
        excess: Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
            .expect("static histogram bounds are valid"),
        overtakes: 0,
        writers_overtaken: 0,
        max_overtaken_by: 0,
    };
    ops.sort_unstable_by_key(|o| (o.key, o.sent_ns));
    f.writer_acquires = ops.iter().filter(|o| o.writer && o.measured).count() as u64;
    for group in ops.chunk_by(|a, b| a.key == b.key) {
        for w in analyse_key(group, guard_ns) {
            f.analysed += 1;
            f.excess.saturating_record(w.excess_ns.max(1));
            f.overtakes += w.overtaken_by;
            f.writers_overtaken += u64::from(w.overtaken_by > 0);
            f.max_overtaken_by = f.max_overtaken_by.max(w.overtaken_by);
        }
    }
    f
}

/// The figures of every measured, granted writer Acquire among `ops`,
/// which are the operations on one key (in any order), in send order.
pub fn analyse_key(ops: &[OpRecord], guard_ns: u64) -> Vec<WriterFigures> {
    // The granted operations in send order.
    let mut order: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].granted()).collect();
    order.sort_by_key(|&i| (ops[i].sent_ns, i));
    // Grant times, ranked: rank(g) = how many distinct grant times are
    // earlier than g, so the Fenwick prefix [0, rank(g)) is "granted
    // strictly before g".
    let mut grants: Vec<u64> = order.iter().map(|&i| ops[i].granted_ns).collect();
    grants.sort_unstable();
    grants.dedup();
    let rank = |g: u64| grants.partition_point(|&x| x < g);
    let mut reader_grants: Vec<u64> = order
        .iter()
        .filter(|&&i| !ops[i].writer)
        .map(|&i| ops[i].granted_ns)
        .collect();
    reader_grants.sort_unstable();
    // The writers to analyse, by the end of their guard window.
    let mut writers: Vec<usize> = order
        .iter()
        .copied()
        .filter(|&i| ops[i].writer && ops[i].measured)
        .collect();
    writers.sort_by_key(|&i| (ops[i].sent_ns.saturating_add(guard_ns), i));
    let mut latest_release = MaxTree::new(grants.len());
    let mut readers_in = CountTree::new(grants.len());
    let mut next = 0;
    let mut out = Vec::with_capacity(writers.len());
    for &w in &writers {
        let op = &ops[w];
        let limit = op.sent_ns.saturating_add(guard_ns);
        while next < order.len() && ops[order[next]].sent_ns <= limit {
            let o = &ops[order[next]];
            let r = rank(o.granted_ns);
            latest_release.raise(r, o.released_ns);
            if !o.writer {
                readers_in.add(r);
            }
            next += 1;
        }
        let before = rank(op.granted_ns);
        let ahead_release_ns = latest_release.max_below(before);
        let readers_before = reader_grants.partition_point(|&g| g < op.granted_ns) as u64;
        let overtaken_by = readers_before - readers_in.count_below(before);
        out.push(WriterFigures {
            index: w,
            ahead_release_ns,
            excess_ns: op
                .granted_ns
                .saturating_sub(op.sent_ns.max(ahead_release_ns)),
            overtaken_by,
        });
    }
    out.sort_by_key(|f| (ops[f.index].sent_ns, f.index));
    out
}

/// Fenwick tree of maxima: raise a slot, ask the maximum of a prefix.
struct MaxTree(Vec<u64>);

impl MaxTree {
    fn new(n: usize) -> MaxTree {
        MaxTree(vec![0; n + 1])
    }

    fn raise(&mut self, slot: usize, v: u64) {
        let mut i = slot + 1;
        while i < self.0.len() {
            self.0[i] = self.0[i].max(v);
            i += i & i.wrapping_neg();
        }
    }

    /// The maximum over slots `0..end` (0 when none was raised).
    fn max_below(&self, end: usize) -> u64 {
        let (mut i, mut m) = (end, 0);
        while i > 0 {
            m = m.max(self.0[i]);
            i -= i & i.wrapping_neg();
        }
        m
    }
}

/// Fenwick tree of counts.
struct CountTree(Vec<u64>);

impl CountTree {
    fn new(n: usize) -> CountTree {
        CountTree(vec![0; n + 1])
    }

    fn add(&mut self, slot: usize) {
        let mut i = slot + 1;
        while i < self.0.len() {
            self.0[i] += 1;
            i += i & i.wrapping_neg();
        }
    }

    /// How many were added to slots `0..end`.
    fn count_below(&self, end: usize) -> u64 {
        let (mut i, mut n) = (end, 0);
        while i > 0 {
            n += self.0[i];
            i -= i & i.wrapping_neg();
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    /// An operation on key 0, times in µs.
    fn op(writer: bool, sent: u64, granted: u64, released: u64) -> OpRecord {
        OpRecord {
            sent_ns: sent * US,
            granted_ns: granted * US,
            released_ns: released * US,
            key: 0,
            writer,
            measured: true,
        }
    }

    fn reader(sent: u64, granted: u64, released: u64) -> OpRecord {
        op(false, sent, granted, released)
    }

    fn writer(sent: u64, granted: u64, released: u64) -> OpRecord {
        op(true, sent, granted, released)
    }

    /// The figures of the one writer among `ops`.
    fn the_writer(ops: &[OpRecord]) -> WriterFigures {
        let f = analyse_key(ops, DEFAULT_GUARD_NS);
        assert_eq!(f.len(), 1, "{f:?}");
        f[0]
    }

    #[test]
    fn fifo_respected_small_excess_no_overtake() {
        // Two readers hold (hold 100 µs); the writer asks at 20 and is
        // granted 25 µs after the later of their Releases; a reader asking
        // at 100 (after the writer, past the guard) waits behind it.
        let ops = [
            reader(0, 10, 110),
            reader(5, 15, 115),
            writer(20, 140, 240),
            reader(100, 265, 365),
            reader(250, 270, 370),
        ];
        let w = the_writer(&ops);
        assert_eq!(w.index, 2);
        assert_eq!(w.ahead_release_ns, 115 * US);
        assert_eq!(w.excess_ns, 25 * US);
        assert_eq!(w.overtaken_by, 0);
        let mut v = ops.to_vec();
        let f = analyse(&mut v, DEFAULT_GUARD_NS);
        assert_eq!((f.writer_acquires, f.analysed), (1, 1));
        assert_eq!((f.overtakes, f.writers_overtaken), (0, 0));
        assert_eq!(f.overtaken_share(), 0.0);
        let p99 = f.excess.value_at_percentile(99.0);
        assert!((24 * US..=26 * US).contains(&p99), "{p99}");
    }

    #[test]
    fn a_later_reader_granted_first_is_an_overtake() {
        // The reader asking at 100 (80 µs after the writer, past the 50 µs
        // guard) is granted at 120 while the writer still waits; the
        // writer then waits for its Release (220) too: that wait is not
        // explained by what was ahead of it. A reader asking at 30, inside
        // the guard, and granted at 40 counts as ahead, not as an overtake.
        let ops = [
            reader(0, 10, 110),
            reader(5, 15, 115),
            writer(20, 250, 350),
            reader(30, 40, 140),
            reader(100, 120, 220),
        ];
        let w = the_writer(&ops);
        assert_eq!(w.overtaken_by, 1);
        assert_eq!(w.ahead_release_ns, 140 * US);
        assert_eq!(w.excess_ns, 110 * US);
        let mut v = ops.to_vec();
        let f = analyse(&mut v, DEFAULT_GUARD_NS);
        assert_eq!(
            (f.overtakes, f.writers_overtaken, f.max_overtaken_by),
            (1, 1, 1)
        );
        assert_eq!(f.overtaken_share(), 1.0);
        // With a guard of 100 µs the same reader is within the jitter
        // allowance: ahead, not an overtake.
        let g = analyse_key(&ops, 100 * US);
        assert_eq!((g[0].overtaken_by, g[0].ahead_release_ns), (0, 220 * US));
    }

    #[test]
    fn a_writer_granted_long_after_the_last_release_ahead_shows_the_gap() {
        let ops = [
            reader(0, 10, 110),
            writer(20, 600, 700),
            // Asked after the writer's grant: behind it whatever happens.
            reader(650, 700, 800),
        ];
        let w = the_writer(&ops);
        assert_eq!(w.ahead_release_ns, 110 * US);
        assert_eq!(w.excess_ns, 490 * US);
        assert_eq!(w.overtaken_by, 0);
        // Nothing ahead released after the writer asked: its whole wait is
        // excess.
        let ops = [reader(0, 10, 15), writer(20, 90, 100)];
        let w = the_writer(&ops);
        assert_eq!((w.ahead_release_ns, w.excess_ns), (15 * US, 70 * US));
    }

    #[test]
    fn writers_line_up_keys_apart_and_unfinished_acquires_are_counted() {
        let mut ops = vec![
            reader(0, 10, 110),
            // Two writers queued behind the reader: the second waits for
            // the first's Release (ahead of it), not only the reader's.
            writer(20, 130, 230),
            writer(30, 250, 350),
            // A writer still waiting when the run ended: not analysed.
            OpRecord {
                granted_ns: NOT_GRANTED,
                ..writer(40, 0, 0)
            },
            // Warm-up writers are ahead of others but not analysed.
            OpRecord {
                measured: false,
                ..writer(1, 5, 8)
            },
        ];
        // Another key's reader, asked late and granted early: no overtake
        // of key 0's writers.
        ops.push(OpRecord {
            key: 1,
            ..reader(200, 210, 220)
        });
        let f = analyse_key(&ops[..5], DEFAULT_GUARD_NS);
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].index, f[0].excess_ns), (1, 20 * US));
        assert_eq!(
            (f[1].index, f[1].ahead_release_ns, f[1].excess_ns),
            (2, 230 * US, 20 * US)
        );
        let all = analyse(&mut ops, DEFAULT_GUARD_NS);
        assert_eq!((all.writer_acquires, all.analysed), (3, 2));
        assert_eq!(all.overtakes, 0);
    }

    #[test]
    fn fenwick_trees_against_a_scan() {
        let vals = [7u64, 3, 9, 1, 4, 4, 8, 2, 6, 5];
        let mut m = MaxTree::new(vals.len());
        let mut c = CountTree::new(vals.len());
        for (slot, &v) in vals.iter().enumerate() {
            m.raise(slot, v);
            if v % 2 == 0 {
                c.add(slot);
            }
        }
        for end in 0..=vals.len() {
            assert_eq!(
                m.max_below(end),
                vals[..end].iter().copied().max().unwrap_or(0)
            );
            assert_eq!(
                c.count_below(end),
                vals[..end].iter().filter(|v| *v % 2 == 0).count() as u64
            );
        }
    }
}
