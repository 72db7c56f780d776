//! The few socket calls the driver does not offer: a read bound per
//! statement (`SO_RCVTIMEO` on the connection's descriptor),
//! cutting a connection from another thread (`shutdown`), waiting on a
//! cancel token with a deadline (`poll`), and what the connection watcher
//! needs: a non-blocking peek at an idle connection, a wake-up bell
//! (`eventfd`) and an unbounded `poll` over many descriptors.
//!
//! Who may call [`cut`] on a descriptor: only a thread that holds the lock
//! under which the connection's owner announced it (the owner cannot drop
//! the connection, closing the descriptor, while that lock is held). That
//! rule is what makes a cross-thread `shutdown` safe from descriptor reuse.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

fn timeval(d: Option<Duration>) -> libc::timeval {
    // Zero means "no timeout" to the kernel, so a zero bound becomes 1 µs.
    let d = match d {
        None => Duration::ZERO,
        Some(d) => d.max(Duration::from_micros(1)),
    };
    libc::timeval {
        tv_sec: d.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    }
}

fn set(fd: RawFd, opt: libc::c_int, d: Option<Duration>) -> io::Result<()> {
    let tv = timeval(d);
    // SAFETY: passes a pointer to a live timeval and its exact size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn get(fd: RawFd, opt: libc::c_int) -> io::Result<Option<Duration>> {
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into the live timeval.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut tv as *mut libc::timeval).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let d = Duration::new(tv.tv_sec.max(0) as u64, (tv.tv_usec.max(0) as u32) * 1000);
    Ok((!d.is_zero()).then_some(d))
}

/// The read timeout a connection had when it was checked out, restored
/// before it goes back to the pool.
///
/// Writes are not bounded per statement: ours are a few dozen bytes and
/// cannot block unless the peer stopped reading megabytes ago; the pool's
/// own write timeout (set by [`Locker::pool_opts`](super::Locker::pool_opts))
/// covers that. Leaving them alone saves three syscalls per lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Saved {
    read: Option<Duration>,
}

impl Saved {
    pub(crate) fn take(fd: RawFd) -> io::Result<Saved> {
        Ok(Saved {
            read: get(fd, libc::SO_RCVTIMEO)?,
        })
    }

    pub(crate) fn restore(&self, fd: RawFd) -> io::Result<()> {
        set(fd, libc::SO_RCVTIMEO, self.read)
    }
}

/// Bounds every read of the next statement by `d` (its answer must start
/// arriving within `d`; our answers are one small packet).
pub(crate) fn bound_reads(fd: RawFd, d: Duration) -> io::Result<()> {
    set(fd, libc::SO_RCVTIMEO, Some(d))
}

/// Cuts the connection: a read blocked in another thread returns at once,
/// and the peer sees the end of the stream (which ends a MySQL session as
/// soon as the server reads it). See the module docs for who may call it.
pub(crate) fn cut(fd: RawFd) {
    // SAFETY: no memory arguments; the caller guarantees `fd` is still the
    // connection's descriptor (module docs). ENOTCONN is harmless.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

/// Why [`wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The first descriptor became readable (the cancel token).
    First,
    /// The second descriptor became readable (the "done" signal).
    Second,
    /// The deadline passed.
    Deadline,
}

/// Waits until `first` or `second` is readable or `deadline` passes. A
/// negative descriptor is ignored; `first` wins a tie.
pub(crate) fn wait(first: RawFd, second: RawFd, deadline: Option<Instant>) -> io::Result<Wake> {
    loop {
        let timeout_ms: libc::c_int = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Wake::Deadline);
                }
                // Round up so we never wake early and spin.
                left.as_micros()
                    .div_ceil(1000)
                    .min(libc::c_int::MAX as u128) as libc::c_int
            }
        };
        let mut fds = [
            libc::pollfd {
                fd: first,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: second,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: a live array of two pollfds; negative fds are ignored.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if fds[0].revents != 0 {
            return Ok(Wake::First);
        }
        if fds[1].revents != 0 {
            return Ok(Wake::Second);
        }
    }
}

/// What a peek at an idle connection found. Idle means every answer to our
/// own statements was read in full, so anything the kernel holds for it was
/// sent unasked.
#[derive(Debug)]
pub(crate) enum Peek {
    /// Nothing to read: the connection is as we left it.
    Quiet,
    /// The server closed its end (end of stream).
    Closed,
    /// Bytes the server sent unasked (the first few of them): it does that
    /// only when it ends the session (an error packet before the close).
    Data(Vec<u8>),
    /// The socket reports an error (a reset, a timeout of the kernel's own).
    Failed(io::Error),
}

/// Looks at what is waiting on `fd` without taking it and without blocking.
/// The caller must own the connection for the call's duration (nobody else
/// reads it meanwhile), or the answer may describe someone else's bytes.
pub(crate) fn peek(fd: RawFd) -> Peek {
    let mut buf = [0u8; 128];
    loop {
        // SAFETY: the kernel writes at most `buf.len()` bytes into the live
        // buffer; MSG_PEEK leaves them queued and MSG_DONTWAIT never blocks,
        // whatever the socket's mode. A descriptor that is not a socket only
        // yields an error (reported as Failed). tests/mysql_faults.rs
        // (a_killed_session_…) fails if this does not see the server's close.
        let n = unsafe {
            libc::recv(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n > 0 {
            return Peek::Data(buf[..n as usize].to_vec());
        }
        if n == 0 {
            return Peek::Closed;
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::WouldBlock => return Peek::Quiet,
            io::ErrorKind::Interrupted => continue,
            _ => return Peek::Failed(err),
        }
    }
}

/// An `eventfd` that wakes a thread blocked in [`poll_all`]: ringing is one
/// `write`, and the bell stays rung until [`Bell::drain`].
#[derive(Debug)]
pub(crate) struct Bell(OwnedFd);

impl Bell {
    pub(crate) fn new() -> io::Result<Bell> {
        // SAFETY: eventfd has no memory arguments; on success we own the fd.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(Bell(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub(crate) fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to our own eventfd. It
        // cannot fail short of a counter overflow (2^64 - 2 rings), which
        // would still leave the bell rung. The watcher's unit test
        // (watcher::tests) hangs if a ring is lost.
        unsafe {
            libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    /// Un-rings it (before the wake-up's work, so a ring during that work
    /// is not lost).
    pub(crate) fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live local; the fd is
        // non-blocking, so an un-rung bell only yields EAGAIN.
        unsafe {
            libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
        }
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Waits, without a timeout, until one of `fds` reports an event (their
/// `revents` say which).
pub(crate) fn poll_all(fds: &mut [libc::pollfd]) -> io::Result<()> {
    loop {
        // SAFETY: a live slice of pollfds and its exact length; the kernel
        // writes only their `revents`. A closed or reused descriptor in it
        // yields POLLNVAL or a spurious event, which the caller re-checks
        // under the connection's own lock (watcher module docs).
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if rc >= 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Spawns one of this backend's threads with every blockable signal
/// blocked in it (and in the threads it starts), so that the application's
/// signal handlers never run there: a program that forwards signals to a
/// child, as the CLI does, needs each signal to reach its own threads, and a
/// signal handled on a library thread between two of its steps would be
/// lost to it.
pub(crate) fn spawn_quiet(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> io::Result<std::thread::JoinHandle<()>> {
    // SAFETY: both sigsets live on the stack; sigfillset initialises `all`
    // and pthread_sigmask writes the old mask into `old` before it is read.
    // The calling thread's own mask is restored before returning, so a
    // signal meant for it is only deferred for the spawn's duration.
    // tests/mysql_contract.rs (background_threads_block_signals) fails if
    // a thread of this backend can take a signal.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let spawned = std::thread::Builder::new().name(name.into()).spawn(f);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        spawned
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn timeouts_round_trip_and_restore() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let fd = c.as_raw_fd();
        let saved = Saved::take(fd).unwrap();
        assert_eq!(saved.read, None);
        bound_reads(fd, Duration::from_millis(1500)).unwrap();
        // The kernel keeps these in jiffies: allow its rounding.
        let near = |got: Option<Duration>, want: u64| {
            let got = got.expect("a timeout is set").as_millis() as u64;
            assert!(got.abs_diff(want) <= 10, "{got} ms, want {want} ms");
        };
        near(c.read_timeout().unwrap(), 1500);
        c.set_read_timeout(Some(Duration::from_secs(7))).unwrap();
        let seven = Saved::take(fd).unwrap();
        saved.restore(fd).unwrap();
        assert_eq!(c.read_timeout().unwrap(), None);
        seven.restore(fd).unwrap();
        near(c.read_timeout().unwrap(), 7000);
    }
}
