//! Guards on what a held key costs and on what recovery does, counted
//! (not timed): a counting global allocator sees the heap bytes the lock
//! table keeps per held key and the number of allocations a replay makes.
//! Bounds are about twice today's figures, so a 2× regression fails
//! without this being a timing test. Each thread counts its own
//! allocations (the test harness runs the tests on threads of their own,
//! at the same time).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::SocketAddr;
use std::ops::ControlFlow;

use ringlock::core::{HeldRef, HoldMode, Limits, LockMode, Now, Table};
use ringlock::wal::record;

struct Counting;
/// Per thread: `(counting on, allocations, live heap bytes)`. Both tests
/// count at the same time, each on its own thread.
#[derive(Clone, Copy)]
struct Counts {
    on: bool,
    allocs: u64,
    live_bytes: i64,
}
thread_local!(static COUNTS: Cell<Counts> = const {
    Cell::new(Counts { on: false, allocs: 0, live_bytes: 0 })
});

fn count(allocs: u64, bytes: i64) {
    let _ = COUNTS.try_with(|c| {
        let mut v = c.get();
        if v.on {
            v.allocs += allocs;
            v.live_bytes += bytes;
            c.set(v);
        }
    });
}

// SAFETY: forwards every call unchanged to the system allocator and only
// adds thread-local counters (which never allocate); changing a layout or
// pointer on the way would corrupt the heap, and every test of this file
// runs through it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(1, l.size() as i64);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        count(0, -(l.size() as i64));
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count(1, n as i64 - l.size() as i64);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Runs `f` with this thread's allocations counted; returns what it
/// returned, the allocations it made and the heap bytes it left live.
fn counted<T>(f: impl FnOnce() -> T) -> (T, u64, i64) {
    COUNTS.with(|c| {
        c.set(Counts {
            on: true,
            allocs: 0,
            live_bytes: 0,
        })
    });
    let out = f();
    let v = COUNTS.with(|c| {
        let v = c.get();
        c.set(Counts { on: false, ..v });
        v
    });
    (out, v.allocs, v.live_bytes)
}

fn key(i: usize) -> [u8; 13] {
    let mut k = *b"key-000000000";
    let mut n = i;
    for b in k[4..].iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
    k
}

fn at(us: u64) -> Now {
    Now {
        mono_us: us,
        unix_ms: 1_700_000_000_000 + us / 1000,
    }
}

const N: usize = 100_000;

/// Heap bytes the table keeps per held key (13-byte keys, one 3-byte
/// source), with a limit ten times what is held: about 210 today (entry
/// slab 136 B per slot, index 8 B per bucket, 16-byte name slots, each
/// grown by doubling). Inline 128-byte names in entries and index, or
/// tables reserved for the limit, cost 450 and more.
#[test]
fn a_held_key_costs_at_most_400_heap_bytes() {
    let (table, _, bytes) = counted(|| {
        let mut t = Table::new(Limits {
            max_keys: 10 * N,
            max_waiters: 10 * N,
        });
        let mut fx = Vec::new();
        let ep = SocketAddr::from(([10, 1, 2, 3], 40_000));
        for i in 0..N {
            t.lock(
                i as u64 + 1,
                &key(i),
                b"src",
                ep,
                LockMode::Try,
                at(i as u64),
                &mut fx,
            );
            fx.clear();
        }
        t
    });
    assert_eq!(table.held_keys(), N);
    let per_key = bytes as f64 / N as f64;
    eprintln!("heap bytes per held key: {per_key:.0}");
    assert!(
        per_key <= 400.0,
        "a held key costs {per_key:.0} heap bytes (bound 400)"
    );
    table.check_invariants();
}

/// A log of `n` records: Acquires of `key(0..)`, every third key released
/// again, every 50th a lease that is extended.
fn log_image(n: usize) -> (Vec<u8>, usize) {
    let mut img = record::MAGIC.to_vec();
    record::encode_grant_mark(1, &mut img);
    let (mut records, mut held, mut i) = (1, 0, 0);
    while records < n {
        let k = key(i);
        let lease = i % 50 == 0;
        record::encode_acquire(
            HeldRef {
                key: &k,
                source: if i % 2 == 0 { b"src" } else { b"other" },
                endpoint: SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 40_000)),
                acquired_unix_ms: 1_700_000_000_000,
                grant_id: 2 + i as u64,
                mode: if lease {
                    HoldMode::Lease
                } else {
                    HoldMode::Persistent
                },
                expires_unix_ms: if lease { 1_700_000_600_000 } else { 0 },
                session: 0,
                access: ringlock::core::Access::Exclusive,
            },
            &mut img,
        );
        records += 1;
        held += 1;
        if lease {
            record::encode_extend(&k, 2 + i as u64, 1_700_000_900_000, &mut img);
            records += 1;
        }
        if i % 3 == 2 {
            record::encode_release(&k, 2 + i as u64, &mut img);
            records += 1;
            held -= 1;
        }
        i += 1;
    }
    (img, held)
}

/// Recovery is one pass with no allocation per record: the scan itself
/// allocates nothing, and replaying 100 000 records into an empty table
/// allocates only as its slabs, indexes, arena and lease heap grow (a few
/// dozen doublings; 60 today), where one allocation per record
/// would be 100 000.
#[test]
fn replay_allocates_per_doubling_not_per_record() {
    let (img, held) = log_image(N);
    let (records, scan_allocs, _) = counted(|| {
        let mut records = 0usize;
        let end = record::scan_each(&img, |_| {
            records += 1;
            ControlFlow::Continue(())
        });
        assert!(matches!(end, record::Scanned::Ok { .. }), "{end:?}");
        records
    });
    assert!(records >= N);
    assert_eq!(scan_allocs, 0, "the scan allocated");
    let mut table = Table::new(Limits {
        max_keys: 10 * N,
        max_waiters: 10 * N,
    });
    let (result, allocs, _) =
        counted(|| ringlock::wal::replay(&img, "guard", &mut table, None, at(0)));
    let (_, rec) = result.expect("the log replays");
    assert_eq!(rec.records, records);
    assert_eq!(table.held_keys(), held);
    eprintln!("allocations replaying {records} records: {allocs}");
    assert!(
        allocs <= 120,
        "replaying {records} records allocated {allocs} times (bound 120)"
    );
    table.check_invariants();
}
