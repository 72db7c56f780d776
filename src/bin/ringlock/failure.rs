//! A failed call of the client library ([`client_fail`]) or of the lock
//! API over a session ([`lease_fail`]) as the [`Fail`] that ends the
//! process: its exit code and line.

use ringlock::client::{Error, Session};
use ringlock::lease;

use crate::child::got_signal;
use crate::exit::{
    Fail, EX_IOERR, EX_LOST, EX_PROTOCOL, EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE,
};

pub(crate) fn client_fail(err: &Error, what: &str) -> Fail {
    let code = match err {
        Error::InvalidKey { .. } | Error::InvalidSource { .. } | Error::InvalidAddress { .. } => {
            EX_USAGE
        }
        Error::Unavailable { .. } => EX_UNAVAILABLE,
        Error::Timeout => EX_TEMPFAIL,
        Error::Refused | Error::Protocol(_) => EX_PROTOCOL,
        Error::Io(_) => EX_IOERR,
        Error::Cancelled => 128u8.wrapping_add(got_signal() as u8),
        _ => EX_SOFTWARE,
    };
    Fail(code, format!("{what}: {err}"))
}

/// Exit code and message for a session-path failure.
pub(crate) fn lease_fail(e: &lease::Error, session: Option<&Session>, what: &str) -> Fail {
    use lease::Error as E;
    let code = match e {
        E::InvalidKey(_) | E::InvalidTimeout | E::InvalidArgument(_) => EX_USAGE,
        E::Unavailable(_) => EX_UNAVAILABLE,
        E::Timeout => EX_TEMPFAIL,
        E::Cancelled | E::DeadlineExceeded => 128u8.wrapping_add(got_signal() as u8),
        E::Lost(_) => EX_LOST,
        // The session failed under the request, or the server refused it.
        E::Failed { .. } if session.is_some_and(|s| s.ended().is_some()) => EX_IOERR,
        E::Failed { .. } => EX_PROTOCOL,
        E::Unreleased { .. } => EX_IOERR,
        // --shared or --limit: the server does not offer it (nothing was
        // sent), or KEY is a semaphore of another size.
        E::Unsupported(_) | E::ModeMismatch { .. } => EX_PROTOCOL,
        _ => EX_SOFTWARE,
    };
    Fail(code, format!("{what}: {e}"))
}
