//! One thread per locker that watches the pinned connection of every held
//! lock while it is idle, so that a session the server ends (`KILL`, a
//! restart, a dropped or reset TCP connection) is reported lost within
//! milliseconds instead of at the next keep-alive ping.
//!
//! How: the thread `poll`s the idle connections' descriptors (readable, or
//! the peer hung up) together with a wake-up bell. Between our own
//! statements a connection has nothing to read (every answer was read in
//! full), so any event on it means the server closed it or sent something
//! unasked, which it does only when it ends the session. The thread never
//! reads: it asks the lease to look ([`Watched::check`]), and the lease
//! peeks under its own lock, the one every user of the connection takes
//! before touching it. So the watcher never races the driver: a ping, an
//! `extend` or the release holds the connection exclusively, and a check
//! that finds it busy, or gone, does nothing.
//!
//! The descriptor set is rebuilt after every wake-up, from the leases that
//! are idle at that moment. An event from a descriptor that changed hands
//! in between (busy with a ping, closed, reused) is harmless for the same
//! reason: the check decides, not the event. Whoever makes a connection
//! idle again (a ping that succeeded) rings the bell so that it is watched
//! again; a new lease rings it when it registers. Readiness is a level, so
//! an end of stream that arrived while the connection was out of the set
//! shows as soon as it is back.
//!
//! Why one thread per locker and not one per lease: as for the keep-alive
//! timer (`keeper`), most locks are short; a registration is a map insert
//! and one `write` to the bell. The map holds weak references: a dropped
//! lease never waits for this thread.
//!
//! A loss found here runs its handlers on a short-lived thread of its own,
//! so that a slow handler does not hold up the watch of every other lease.
//!
//! The ping stays: a black-holed path (no FIN, no RST) shows nothing here.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::sock::{self, Bell};

/// What the watcher watches: a lease and its pinned connection.
pub(crate) trait Watched: Send + Sync + 'static {
    /// The connection's descriptor if it is idle now (nobody uses it, and
    /// the lease is neither released nor lost); `None` leaves it out.
    fn idle_fd(&self) -> Option<RawFd>;
    /// `fd` reported an event: look (under the lease's own lock) and report
    /// the loss if the connection, still idle, is gone.
    fn check(&self, fd: RawFd);
}

pub(crate) struct Watcher<T: Watched> {
    state: Mutex<State<T>>,
}

struct State<T> {
    leases: BTreeMap<u64, Weak<T>>,
    next_id: u64,
    /// The running thread's bell (None: no thread yet).
    bell: Option<Arc<Bell>>,
    shutdown: bool,
}

impl<T: Watched> Watcher<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Watcher {
            state: Mutex::new(State {
                leases: BTreeMap::new(),
                next_id: 0,
                bell: None,
                shutdown: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Plain inserts, removes and assignments: a poisoned lock still
        // holds consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts watching `lease` (and the thread, on first use); its id.
    pub(crate) fn watch(self: &Arc<Self>, lease: Weak<T>) -> std::io::Result<u64> {
        let mut st = self.lock();
        let bell = match &st.bell {
            Some(bell) => Arc::clone(bell),
            None => {
                let bell = Arc::new(Bell::new()?);
                let (me, b) = (Arc::clone(self), Arc::clone(&bell));
                sock::spawn_quiet("ringlock-mysql-watch", move || me.run(&b))?;
                st.bell = Some(Arc::clone(&bell));
                bell
            }
        };
        let id = st.next_id;
        st.next_id += 1;
        st.leases.insert(id, lease);
        drop(st);
        bell.ring();
        Ok(id)
    }

    /// Stops watching lease `id` (its release began). No wake-up: the
    /// lease is left out at the next rebuild, and until then an event from
    /// its descriptor is checked and ignored.
    pub(crate) fn unwatch(&self, id: u64) {
        self.lock().leases.remove(&id);
    }

    /// A connection became idle again: rebuild the set.
    pub(crate) fn wake(&self) {
        if let Some(bell) = &self.lock().bell {
            bell.ring();
        }
    }

    /// Stops the thread (the locker is gone, and so is every lease).
    pub(crate) fn shutdown(&self) {
        let mut st = self.lock();
        st.shutdown = true;
        if let Some(bell) = &st.bell {
            bell.ring();
        }
    }

    fn run(self: Arc<Self>, bell: &Bell) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut whom: Vec<Weak<T>> = Vec::new();
        loop {
            // Drained before the snapshot: a ring from here on wakes the
            // poll below at once.
            bell.drain();
            let leases: Vec<Weak<T>> = {
                let mut st = self.lock();
                if st.shutdown {
                    return;
                }
                st.leases.retain(|_, w| w.strong_count() > 0);
                st.leases.values().cloned().collect()
            };
            fds.clear();
            whom.clear();
            fds.push(libc::pollfd {
                fd: bell.fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            // Each lease's own lock is taken with the watcher's released:
            // the lease calls wake/unwatch under no lock of its own either,
            // so there is no lock order to keep.
            for w in leases {
                let Some(lease) = w.upgrade() else { continue };
                if let Some(fd) = lease.idle_fd() {
                    fds.push(libc::pollfd {
                        fd,
                        events: libc::POLLIN | libc::POLLRDHUP,
                        revents: 0,
                    });
                    whom.push(w);
                }
            }
            if sock::poll_all(&mut fds).is_err() {
                // Only EINVAL/ENOMEM: nothing to do but try again; the
                // keep-alive ping still covers every lease meanwhile.
                std::thread::yield_now();
                continue;
            }
            for (pfd, w) in fds[1..].iter().zip(&whom) {
                if pfd.revents != 0 {
                    if let Some(lease) = w.upgrade() {
                        lease.check(pfd.fd);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A "lease" on one end of a loopback TCP pair; reports what its check
    /// peeked.
    struct Probe {
        conn: TcpStream,
        idle: Mutex<bool>,
        seen: Mutex<mpsc::Sender<&'static str>>,
    }

    impl Watched for Probe {
        fn idle_fd(&self) -> Option<RawFd> {
            (*self.idle.lock().unwrap()).then(|| self.conn.as_raw_fd())
        }
        fn check(&self, fd: RawFd) {
            assert_eq!(fd, self.conn.as_raw_fd());
            if !*self.idle.lock().unwrap() {
                return;
            }
            let what = match sock::peek(fd) {
                sock::Peek::Quiet => return,
                sock::Peek::Closed => "closed",
                sock::Peek::Data(_) => "data",
                sock::Peek::Failed(_) => "failed",
            };
            *self.idle.lock().unwrap() = false;
            let _ = self.seen.lock().unwrap().send(what);
        }
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn reports_a_close_and_unasked_data_on_idle_connections_only() {
        let watcher = Watcher::<Probe>::new();
        let (tx, rx) = mpsc::channel();
        let probe = |conn, idle| {
            Arc::new(Probe {
                conn,
                idle: Mutex::new(idle),
                seen: Mutex::new(tx.clone()),
            })
        };
        let (c1, s1) = pair();
        let (c2, mut s2) = pair();
        let (c3, s3) = pair();
        let closed = probe(c1, true);
        let spoken = probe(c2, true);
        let busy = probe(c3, false);
        for p in [&closed, &spoken, &busy] {
            watcher.watch(Arc::downgrade(p)).unwrap();
        }
        let bound = Duration::from_secs(30);
        drop(s1);
        assert_eq!(rx.recv_timeout(bound), Ok("closed"));
        s2.write_all(b"\xff").unwrap();
        assert_eq!(rx.recv_timeout(bound), Ok("data"));
        // A busy connection is not looked at, even once it is closed...
        drop(s3);
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        // ...until it is idle again and the set is rebuilt.
        *busy.idle.lock().unwrap() = true;
        watcher.wake();
        assert_eq!(rx.recv_timeout(bound), Ok("closed"));
        watcher.shutdown();
    }
}
