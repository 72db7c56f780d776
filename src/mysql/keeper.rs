//! One timer thread per locker that starts each lease's keep-alive when its
//! first ping falls due.
//!
//! Why not a thread per lease from the start: most locks are held for less
//! than the keep-alive interval (30 s by default) and never ping; starting
//! and stopping a thread for each of them would cost more than the
//! `GET_LOCK` round trip itself. Registering a lease here is a map insert
//! under a mutex and never wakes the timer thread: a new lease is due one
//! interval from now, and the thread never sleeps longer than one interval,
//! so it always wakes in time. Once a lease's first ping is due, it gets
//! its own keep-alive thread (pings may hang for up to the ping timeout and
//! must not delay other leases' pings).
//!
//! Invariant: an entry is in `due` until it is dispatched or cancelled,
//! never both; the map holds weak references, so a dropped lease never
//! waits for this thread.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// A lease's place in the timer: its first due time and a unique id.
pub(crate) type Slot = (Instant, u64);

/// What the timer starts when a lease falls due.
pub(crate) trait Due: Send + Sync + 'static {
    /// Starts the lease's keep-alive; its first ping is due at `due`.
    fn start(self: Arc<Self>, due: Instant);
}

pub(crate) struct Keeper<T: Due> {
    interval: Duration,
    state: Mutex<State<T>>,
    wake: Condvar,
}

struct State<T> {
    due: BTreeMap<Slot, Weak<T>>,
    next_id: u64,
    /// When the timer thread will wake next (None: no thread yet).
    wakes_at: Option<Instant>,
    running: bool,
    shutdown: bool,
}

impl<T: Due> Keeper<T> {
    pub(crate) fn new(interval: Duration) -> Arc<Self> {
        Arc::new(Keeper {
            interval,
            state: Mutex::new(State {
                due: BTreeMap::new(),
                next_id: 0,
                wakes_at: None,
                running: false,
                shutdown: false,
            }),
            wake: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Every update is a plain insert/remove/assignment: a poisoned lock
        // still holds consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `lease` to start one interval from now.
    pub(crate) fn schedule(self: &Arc<Self>, lease: Weak<T>) -> std::io::Result<Slot> {
        let mut st = self.lock();
        if !st.running {
            let me = Arc::clone(self);
            super::sock::spawn_quiet("ringlock-mysql-keeper", move || me.run())?;
            st.running = true;
        }
        let id = st.next_id;
        st.next_id += 1;
        let slot = (Instant::now() + self.interval, id);
        st.due.insert(slot, lease);
        // Only a due time earlier than the thread's next wake needs a wake-up;
        // with one interval for all leases that never happens (module docs),
        // but the check keeps this correct if that ever changes.
        if st.wakes_at.is_some_and(|w| slot.0 < w) {
            self.wake.notify_one();
        }
        Ok(slot)
    }

    /// Forgets `slot` if it has not started yet.
    pub(crate) fn cancel(&self, slot: Slot) {
        self.lock().due.remove(&slot);
    }

    /// Stops the timer thread (the locker is gone, and so is every lease).
    pub(crate) fn shutdown(&self) {
        self.lock().shutdown = true;
        self.wake.notify_one();
    }

    fn run(self: Arc<Self>) {
        let mut ready: Vec<(Arc<T>, Instant)> = Vec::new();
        let mut st = self.lock();
        loop {
            if st.shutdown {
                return;
            }
            let now = Instant::now();
            while let Some((&slot, _)) = st.due.first_key_value() {
                if slot.0 > now {
                    break;
                }
                if let Some(lease) = st.due.remove(&slot).and_then(|w| w.upgrade()) {
                    ready.push((lease, slot.0));
                }
            }
            if !ready.is_empty() {
                drop(st);
                for (lease, due) in ready.drain(..) {
                    lease.start(due);
                }
                st = self.lock();
                continue;
            }
            let idle_wake = now + self.interval;
            let wake = st
                .due
                .first_key_value()
                .map_or(idle_wake, |(slot, _)| slot.0.min(idle_wake));
            st.wakes_at = Some(wake);
            st = self
                .wake
                .wait_timeout(st, wake.saturating_duration_since(now))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    struct Probe(Mutex<mpsc::Sender<Instant>>);

    impl Due for Probe {
        fn start(self: Arc<Self>, due: Instant) {
            let _ = self.0.lock().unwrap().send(due);
        }
    }

    #[test]
    fn starts_due_leases_once_skips_cancelled_and_dropped_ones() {
        let keeper = Keeper::<Probe>::new(Duration::from_millis(5));
        let (tx, rx) = mpsc::channel();
        let started = Arc::new(Probe(Mutex::new(tx.clone())));
        let cancelled = Arc::new(Probe(Mutex::new(tx.clone())));
        let dropped = Arc::new(Probe(Mutex::new(tx)));
        let slot = keeper.schedule(Arc::downgrade(&started)).unwrap();
        let gone = keeper.schedule(Arc::downgrade(&cancelled)).unwrap();
        keeper.cancel(gone);
        keeper.schedule(Arc::downgrade(&dropped)).unwrap();
        drop(dropped);
        let due = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the lease started");
        assert_eq!(due, slot.0);
        assert!(Instant::now() >= slot.0, "never before its due time");
        // The sender in `cancelled` is still alive, so the channel stays
        // open; nothing else may arrive once the map is empty.
        let idle = || keeper.lock().due.is_empty();
        while !idle() {
            std::thread::yield_now();
        }
        assert!(
            rx.try_recv().is_err(),
            "a cancelled or dropped lease never starts"
        );
        keeper.shutdown();
        drop(cancelled);
    }
}
