//! What ringlock says while it retries an unreachable server, and when it
//! does not retry at all.
//!
//! The library prints nothing; its retry handler (`on_retry`) is told of
//! each failed attempt it would retry. Here:
//! - a refused connection (`ECONNREFUSED`: nothing listens at the address)
//!   on the first contact fails at once, unless `--retry` was given on the
//!   command line: waiting 10 s for a server that is not running only
//!   delays the error (give `--retry D` to wait for one that is starting);
//! - any other failure (a timeout, an unreachable network, a connection
//!   reset), and a refusal when `--retry` was given or a connection that
//!   worked breaks, is retried for the `--retry` budget (default 10 s),
//!   and the first retry of each streak says so on stderr at once: where,
//!   why, for how long.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use ringlock::client::RetryEvent;

/// A first contact was refused and not retried (the hint for the error).
static REFUSED: AtomicBool = AtomicBool::new(false);

/// The retry handler for every client and session of this run. `asked`:
/// `--retry` was given on the command line.
pub fn handler(asked: bool) -> impl Fn(&RetryEvent<'_>) -> bool + Send + Sync + 'static {
    move |ev| {
        if !asked && !ev.reconnecting && ev.error.kind() == io::ErrorKind::ConnectionRefused {
            REFUSED.store(true, Ordering::SeqCst);
            return false;
        }
        if ev.attempts == 1 {
            let _ = writeln!(
                io::stderr(),
                "ringlock: cannot reach {}: {}; retrying for up to {} (--retry)",
                ev.addr,
                ev.error,
                crate::show::fmt_duration(ev.budget)
            );
        }
        true
    }
}

/// What to add to an "unavailable" error line: why it came at once.
pub fn hint() -> &'static str {
    if REFUSED.load(Ordering::SeqCst) {
        " (nothing listens there: is the server running? `--retry D` waits up to D for one that is starting)"
    } else {
        ""
    }
}
