//! The cancel token every blocking lock wait takes, whatever the backend:
//! the lock API ([`crate::lease`]) and the Locking-Center client both
//! re-export it, so it sits below both.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// Cancels a blocking lock wait from another thread or a signal handler.
///
/// A token wraps a Linux `eventfd`. Once cancelled it stays cancelled: every
/// lock wait given this token (now or later) stops and withdraws its request
/// exactly as a deadline would, returning
/// [`lease::Error::Cancelled`](crate::lease::Error::Cancelled) or
/// [`client::Error::Cancelled`](crate::client::Error::Cancelled) (or the
/// guard, if a grant raced the cancellation and the caller chose
/// [`LateGrant::Keep`](crate::client::LateGrant::Keep)). Clones share the same state.
#[derive(Debug, Clone)]
pub struct CancelToken {
    fd: Arc<OwnedFd>,
}

impl CancelToken {
    /// Creates a token that is not cancelled.
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd has no memory arguments; we own the returned fd.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(CancelToken { fd: Arc::new(fd) })
    }

    /// Cancels every wait using this token.
    pub fn cancel(&self) {
        Self::cancel_fd(self.fd.as_raw_fd());
    }

    /// Cancels the token whose descriptor is `fd` (from [`as_raw_fd`]).
    /// Only calls `write(2)`, so it is async-signal-safe: a signal handler
    /// may call it, provided the token outlives the handler's use of `fd`.
    ///
    /// [`as_raw_fd`]: AsRawFd::as_raw_fd
    pub fn cancel_fd(fd: RawFd) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local; an invalid fd only
        // yields EBADF, which there is nobody to report to.
        unsafe {
            libc::write(fd, (&one as *const u64).cast(), 8);
        }
    }

    /// True once [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack, zero timeout.
        unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
    }
}

impl AsRawFd for CancelToken {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
