//! The I/O thread's system calls and its handler threads: `poll(2)` with
//! a deadline, the `eventfd` that wakes it, and the short-lived threads
//! that run the handlers of a loss while the I/O thread goes on.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::lease::PendingLoss;

/// Runs the handlers of `claims` on a thread of their own (inline if no
/// thread can be started).
pub(super) fn notify_elsewhere(claims: Vec<PendingLoss>) {
    if claims.is_empty() {
        return;
    }
    let slot = Arc::new(Mutex::new(Some(claims)));
    let theirs = Arc::clone(&slot);
    let spawned = std::thread::Builder::new()
        .name("ringlock-session-lost".into())
        .spawn(move || run_claims(&theirs));
    if spawned.is_err() {
        run_claims(&slot);
    }
}

fn run_claims(slot: &Mutex<Option<Vec<PendingLoss>>>) {
    let claims = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    for p in claims.into_iter().flatten() {
        p.notify();
    }
}

pub(super) fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// `poll(2)` until `until` (rounded up to whole milliseconds, so it never
/// wakes early and spins); EINTR is a normal return.
pub(super) fn poll(fds: &mut [libc::pollfd], until: Instant) -> io::Result<()> {
    let left = until.saturating_duration_since(Instant::now());
    let ms = left
        .as_micros()
        .div_ceil(1000)
        .min(libc::c_int::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a live, exclusively borrowed slice of pollfds and its
    // length is passed with it; a longer length would let the kernel write
    // `revents` past the slice. Every test of tests/session_fake.rs and
    // tests/session_client.rs runs the I/O thread through this poll.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        for f in fds.iter_mut() {
            f.revents = 0;
        }
    }
    Ok(())
}

/// A counter `eventfd` that wakes the I/O thread's poll.
pub(super) struct EventFd(OwnedFd);

impl EventFd {
    pub(super) fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd has no memory arguments; we own the returned fd
        // (checked below: a failure is an error, never a descriptor). Every
        // Session of tests/session_fake.rs creates one.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns; owning
        // one that something else also closes would close a reused number
        // under it. Dropping a Session closes it once
        // (session_client::dropping_the_last_handle_ends_the_session).
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub(super) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    pub(super) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to our own eventfd; a
        // full counter (EAGAIN) already means "wake up". A wrong size would
        // be EINVAL and the wake-up lost: a release or cancel would then wait
        // for the next ping (tests/session_fake.rs bounds those waits).
        unsafe {
            libc::write(self.fd(), (&one as *const u64).cast(), 8);
        }
    }

    pub(super) fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live local from our own
        // non-blocking eventfd; a shorter buffer is EINVAL and the counter
        // would stay set, so poll would spin (the I/O thread's waits in
        // tests/session_fake.rs would then never sleep, not fail).
        unsafe {
            libc::read(self.fd(), (&mut v as *mut u64).cast(), 8);
        }
    }
}
