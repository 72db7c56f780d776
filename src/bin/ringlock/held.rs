//! CMD run while a lock is held, for every backend: the lock released after,
//! and a lock lost before or while CMD runs reported (CMD stopped, exit 79).

use std::ffi::OsString;
use std::io::{self, Write};
use std::time::Duration;

use ringlock::lease::{Lease, LostLock};

use crate::child::{self, got_signal, mask_signals, run_child};
use crate::exit::{Fail, EX_IOERR, EX_LOST};
use crate::show::fmt_duration;

/// The lost-lock handler of every lock `lock`/`try-lock` holds over a
/// session or MySQL: stops CMD ([`child::lock_lost`]), whatever noticed the
/// loss (a Lost push, a failed ping, a closed connection).
pub(crate) fn stop_on_loss(
    shown: String,
    kill_after: Duration,
) -> impl Fn(&Lease, &LostLock) + Send + Sync + 'static {
    move |lease, lost| child::lock_lost(lost_line(&shown, lease, lost), kill_after)
}

/// Runs CMD under `lease`, whose lost handler is [`stop_on_loss`], and
/// releases it after (`before_release` runs first; `hint` says what frees
/// the lock when the release fails). The one path for every backend that
/// can lose a lock: lost before CMD starts, CMD is not run; lost while it
/// runs, CMD was stopped; both exit [`EX_LOST`] with one line. Lost after
/// CMD ended is a failed release.
pub(crate) fn run_under_lease(
    lease: &Lease,
    shown: &str,
    argv: &[OsString],
    env: &[(&str, OsString)],
    kill_after: Duration,
    before_release: impl FnOnce(),
    hint: &str,
) -> Result<u8, Fail> {
    if let Some(lost) = child::lost() {
        return Err(Fail(
            EX_LOST,
            format!("{}; the command was not started", lost.line),
        ));
    }
    // CMD inherits the lock's connection, so the server cannot see it end
    // (and free the lock) before CMD is dead: see `child`.
    let keep: Vec<_> = lease.connection_fd().into_iter().collect();
    let status = run_while_held(argv, env, &keep, || {
        before_release();
        match child::lost() {
            // Reported below, once.
            Some(lost) if lost.signalled => Ok(()),
            // Lost after CMD ended: CMD ran under the lock as far as anyone
            // can tell, but the release could not be confirmed.
            Some(lost) => Err(format!("releasing {shown} failed: {}", lost.line)),
            None => lease
                .release()
                .map_err(|e| format!("releasing {shown} failed: {e} ({hint})")),
        }
    });
    match child::lost() {
        Some(lost) if lost.signalled => {
            let killed = if lost.killed {
                format!(", then SIGKILL after {}", fmt_duration(kill_after))
            } else {
                String::new()
            };
            Err(Fail(
                EX_LOST,
                format!(
                    "{} while the command ran; it got SIGTERM{killed}",
                    lost.line
                ),
            ))
        }
        _ => status,
    }
}

/// One line for a lost lock: key, token (MySQL locks have none) and why.
pub(crate) fn lost_line(shown: &str, lease: &Lease, lost: &LostLock) -> String {
    let token = lease
        .token()
        .map(|t| format!(" (token {t})"))
        .unwrap_or_default();
    let mut line = format!("lost the lock on {shown}{token}: {}", lost.reason());
    if let Some(cause) = lost.cause() {
        line.push_str(&format!(" ({cause})"));
    }
    line.replace(['\n', '\r'], " ")
}

/// Runs the command while the lock is held, then releases it (`release`
/// says why it could not). The command's exit status is the result; a
/// failed release turns a successful command into EX_IOERR.
pub(crate) fn run_while_held(
    argv: &[OsString],
    env: &[(&str, OsString)],
    keep_fds: &[std::os::fd::RawFd],
    release: impl FnOnce() -> Result<(), String>,
) -> Result<u8, Fail> {
    // From here on a signal must reach the child or, before it exists, stop
    // us from starting it; blocking closes the gap between spawn and
    // recording its pid. The child unblocks them itself (see run_child).
    mask_signals(true);
    let status = if got_signal() != 0 {
        Err(Fail(
            128u8.wrapping_add(got_signal() as u8),
            format!(
                "interrupted by signal {} before the command started",
                got_signal()
            ),
        ))
    } else {
        run_child(argv, env, keep_fds)
    };
    match (status, release()) {
        (Ok(code), Ok(())) => Ok(code),
        (Ok(code), Err(why)) => {
            let _ = writeln!(io::stderr(), "ringlock: {why}");
            Ok(if code == 0 { EX_IOERR } else { code })
        }
        (Err(fail), _) => Err(fail),
    }
}
