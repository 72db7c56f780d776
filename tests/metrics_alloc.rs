//! Proves the update path the lock loop calls never allocates, with a
//! counting global allocator (its own test binary, so nothing else shares it).

use ringlock::metrics::{Action, Metrics, Outcome, SessionOp, SESSION_STATUSES};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Only the measuring thread counts; the test harness may allocate elsewhere.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: delegates every call to the system allocator unchanged; the counter
// is a plain atomic and the thread-local is const-initialised (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn updates_never_allocate() {
    let m = Metrics::new();
    COUNTING.with(|c| c.set(true));
    for i in 0..10_000u64 {
        for action in Action::ALL {
            for outcome in Outcome::ALL {
                m.request(action, outcome);
            }
        }
        for op in SessionOp::ALL {
            for status in SESSION_STATUSES {
                m.session_request(op, status);
                m.at(0).session_request(op, status);
            }
        }
        m.set_held_keys(i);
        m.set_queued_waiters(i);
        m.set_open_connections(i);
        m.grant();
        m.handoff();
        m.hangup_withdrawal();
        m.undelivered_grant();
        m.reset(i % 2 == 0);
        m.connection_refused();
        m.frame_timeout();
        m.observe_queue_wait_us(i * 1_000);
        m.observe_hold_us(i * 10_000);
        m.set_oldest_acquired_unix_ms(i);
        m.observe_fdatasync_us(i);
        m.observe_wal_batch(i, i * 64);
        m.wal_compaction();
        m.wal_io_error();
        m.set_recovery_us(i);
        m.set_ready();
        m.loop_heartbeat(0, i);
    }
    COUNTING.with(|c| c.set(false));
    assert_eq!(ALLOCATIONS.load(Ordering::Relaxed), 0);
}

#[test]
fn rendering_into_a_warm_buffer_does_not_allocate() {
    let m = Metrics::new();
    m.set_oldest_acquired_unix_ms(1);
    let mut out = String::with_capacity(64 * 1024);
    m.render(&mut out, 2_000);
    COUNTING.with(|c| c.set(true));
    out.clear();
    m.render(&mut out, 3_000);
    COUNTING.with(|c| c.set(false));
    assert_eq!(ALLOCATIONS.load(Ordering::Relaxed), 0);
}

#[test]
fn raft_updates_never_allocate() {
    let m = Metrics::new_loops(2);
    m.enable_raft(1, &[1, 2, 3], 2);
    let r = m.raft().expect("enabled");
    COUNTING.with(|c| c.set(true));
    for i in 0..10_000u64 {
        for shard in 0..2 {
            r.set_shard(
                shard,
                &ringlock::metrics::RaftGauges {
                    term: i,
                    leader_id: 1,
                    leader: i % 2 == 0,
                    serving: i % 3 == 0,
                    commit: i,
                    applied: i,
                    leader_changes: i,
                    forwards_parked: i,
                },
            );
            r.set_follower_lag(shard, 2, Some(i));
            r.set_follower_lag(shard, 3, None);
            r.clear_follower_lag(shard);
        }
        r.observe_commit_us(i);
    }
    COUNTING.with(|c| c.set(false));
    assert_eq!(ALLOCATIONS.load(Ordering::Relaxed), 0);
}
