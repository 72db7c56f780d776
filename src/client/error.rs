//! The client's typed errors.
//!
//! `Error` is `Clone` (I/O errors are shared behind an `Arc`) so that a
//! guard can hand the result of its single release to every later caller.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

/// Everything a client operation can fail with.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The key is empty or longer than 127 bytes. Raised before any
    /// network traffic.
    InvalidKey {
        /// The offending key's length in bytes.
        len: usize,
    },
    /// The source name is longer than 127 bytes (a Locking-Center lock's;
    /// 255 for a reset by source). Raised before any network
    /// traffic (at build time for the client's own source).
    InvalidSource {
        /// The offending source's length in bytes.
        len: usize,
    },
    /// The server address cannot be used: a malformed `HOST:PORT`, a port
    /// outside 1..=65535, or a host name that does not resolve. Raised by
    /// [`ClientBuilder::build`](super::ClientBuilder::build), before any
    /// connection is opened.
    InvalidAddress {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server answered `-`: it refused the request (a limit, bad input,
    /// or a `ResetBySource` that cancelled this queued lock).
    Refused,
    /// The server could not be reached: connecting (or reconnecting) failed
    /// until the retry policy gave up.
    Unavailable {
        /// The address of the last attempt (lock or admin port).
        addr: SocketAddr,
        /// How many connection attempts were made.
        attempts: u32,
        /// The last attempt's error.
        last: Arc<io::Error>,
    },
    /// The lock was not granted before the caller's deadline. The request
    /// was withdrawn exactly: no lock is held on the caller's behalf.
    Timeout,
    /// The lock wait was cancelled through a [`CancelToken`](super::CancelToken).
    /// As with `Timeout`, no lock is held on the caller's behalf.
    Cancelled,
    /// An I/O error on an established connection (including a read or write
    /// that exceeded the client's I/O timeout: kind `TimedOut`/`WouldBlock`).
    /// The message says when the outcome on the server is unknown.
    Io(Arc<io::Error>),
    /// The server sent something the protocol does not allow.
    Protocol(String),
}

impl Error {
    pub(crate) fn io(err: io::Error) -> Self {
        Error::Io(Arc::new(err))
    }

    pub(crate) fn io_context(err: &io::Error, context: &str) -> Self {
        Error::Io(Arc::new(io::Error::new(
            err.kind(),
            format!("{context}: {err}"),
        )))
    }

    /// True for errors raised before any network traffic (bad arguments).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::InvalidKey { .. } | Error::InvalidSource { .. } | Error::InvalidAddress { .. }
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidKey { len } => {
                write!(f, "invalid key: {len} bytes (a key is 1 to 127 bytes)")
            }
            Error::InvalidSource { len } => {
                write!(
                    f,
                    "invalid source: {len} bytes (a Locking-Center source is at most 127 bytes, \
                     a session's at most 255)"
                )
            }
            Error::InvalidAddress { addr, reason } => {
                write!(f, "invalid address {addr:?}: {reason}")
            }
            Error::Refused => write!(f, "the server refused the request"),
            Error::Unavailable {
                addr,
                attempts,
                last,
            } => {
                let plural = if *attempts == 1 { "" } else { "s" };
                write!(
                    f,
                    "server {addr} unavailable after {attempts} attempt{plural}: {last}"
                )
            }
            Error::Timeout => write!(f, "timed out waiting for the lock"),
            Error::Cancelled => write!(f, "lock wait cancelled"),
            Error::Io(err) => write!(f, "i/o error: {err}"),
            Error::Protocol(what) => write!(f, "protocol error: {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Unavailable { last, .. } => Some(last.as_ref()),
            Error::Io(err) => Some(err.as_ref()),
            _ => None,
        }
    }
}

/// Shorthand for `Result<T, ringlock::client::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
