//! `lock`/`try-lock` over a session (the default) or a `--ttl` lease: the
//! lock around CMD, the lease kept extended, and session failures' exit codes.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use ringlock::client::{Access, Acquire, CancelToken, Hold, Session, Wait};
use ringlock::lease::{self, Lease};

use crate::args::HoldArgs;
use crate::bytes;
use crate::child::{got_signal, install_handlers, mask_signals, CANCEL_FD};
use crate::conn::Conn;
use crate::exit::{Fail, EX_SOFTWARE, EX_TEMPFAIL};
use crate::failure::lease_fail;
use crate::held::{run_under_lease, stop_on_loss};
use crate::show::fmt_duration;

/// A session (or `--ttl` lease) lock around CMD: the lock is lost if
/// ringlock's session ends, and a loss while CMD runs stops CMD (`child`)
/// and exits [`EX_LOST`](crate::exit::EX_LOST) with one line saying why.
pub(crate) fn session_lock_and_run(
    conn: &Conn,
    key: &[u8],
    wait: Wait,
    hold: &HoldArgs,
    argv: &[OsString],
) -> Result<u8, Fail> {
    let shown = bytes::escape(key);
    let verb = if wait == Wait::Try {
        "try-lock"
    } else {
        "lock"
    };
    let what = acquire_spec(wait, hold);
    install_handlers()?;
    // The session's threads (and those they start) inherit a mask that
    // blocks the forwarded signals, so each such signal reaches this
    // thread: the handler's work (cancel the wait, forward to CMD) is
    // ordered with this thread's steps, as in a single-threaded ringlock.
    mask_signals(true);
    let session = conn.session(&format!("{verb} {shown}"), hold);
    mask_signals(false);
    let session = session?;
    let lease = acquire_interruptibly(&session, conn, key, &shown, verb, what, hold.kill_after)?;
    let token = lease.token().unwrap_or(0);
    // A lease is extended every TTL/3 while CMD runs: two extends may be
    // lost or late before it expires.
    let (stop, stopped) = mpsc::channel::<()>();
    // Blocked from here on (run_while_held keeps them so until CMD runs):
    // the extend thread inherits the mask.
    mask_signals(true);
    let extender = start_extender(&lease, hold.ttl, stopped)?;
    let env = [
        ("RINGLOCK_KEY", OsString::from_vec(key.to_vec())),
        ("RINGLOCK_TOKEN", OsString::from(token.to_string())),
    ];
    let hint = match hold.ttl {
        Some(_) => "the lease expires on its own",
        None => "the server frees it when this session ends",
    };
    let stop_extending = || {
        drop(stop);
        if let Some(h) = extender {
            let _ = h.join();
        }
    };
    let result = run_under_lease(
        &lease,
        &shown,
        argv,
        &env,
        hold.kill_after,
        stop_extending,
        hint,
    );
    // Processes CMD left behind hold a copy of the connection: end the
    // session now rather than at its keep-alive deadline.
    session.close();
    result
}

/// The request `lock`/`try-lock` makes: a lease of `--ttl` or a session
/// lock, exclusive unless `--shared` or `--limit N`.
fn acquire_spec(wait: Wait, hold: &HoldArgs) -> Acquire {
    Acquire {
        hold: match hold.ttl {
            Some(ttl) => Hold::Lease(ttl),
            None => Hold::Session,
        },
        wait,
        access: match (hold.shared, hold.limit) {
            (true, _) => Access::Shared,
            (false, Some(n)) => Access::Semaphore(n),
            (false, None) => Access::Exclusive,
        },
    }
}

/// `what` of `key` in `session`, withdrawn by a forwarded signal (which
/// cancels the wait); a loss after the grant stops CMD (`kill_after`).
fn acquire_interruptibly(
    session: &Session,
    conn: &Conn,
    key: &[u8],
    shown: &str,
    verb: &str,
    what: Acquire,
    kill_after: Duration,
) -> Result<Lease, Fail> {
    let cancel = CancelToken::new().map_err(|e| Fail(EX_SOFTWARE, format!("cancel token: {e}")))?;
    let opts = lease::LockOptions::new()
        .cancel(cancel.clone())
        .on_lost(stop_on_loss(shown.to_string(), kill_after));
    CANCEL_FD.store(std::os::fd::AsRawFd::as_raw_fd(&cancel), Ordering::SeqCst);
    if got_signal() != 0 {
        // It arrived before the handler could cancel anything.
        cancel.cancel();
    }
    let result = session.acquire(key, what, &opts);
    CANCEL_FD.store(-1, Ordering::SeqCst);
    result.map_err(|e| acquire_fail(&e, conn, key, shown, verb, what, session))
}

/// What ringlock exits with when `verb` (`lock` or `try-lock`) of `key`
/// (shown as `shown`) was not granted: busy, interrupted, or failed.
fn acquire_fail(
    e: &lease::Error,
    conn: &Conn,
    key: &[u8],
    shown: &str,
    verb: &str,
    what: Acquire,
    session: &Session,
) -> Fail {
    match e {
        lease::Error::Timeout => Fail(
            EX_TEMPFAIL,
            busy_message(conn, key, shown, what.access, what.wait),
        ),
        lease::Error::Cancelled => Fail(
            128u8.wrapping_add(got_signal() as u8),
            format!(
                "{verb} {shown}: interrupted by signal {}, request withdrawn",
                got_signal()
            ),
        ),
        e => lease_fail(e, Some(session), &format!("{verb} {shown}")),
    }
}

/// Why a lock was not had in time (or at once, for try-lock): who holds
/// `key` (shown as `shown`) and what else keeps a request of `access` out.
fn busy_message(conn: &Conn, key: &[u8], shown: &str, access: Access, wait: Wait) -> String {
    // Shared and semaphore requests also wait for an earlier
    // waiter, and a semaphore for a free slot.
    let holder = conn.holder_of(key);
    let held = match access {
        Access::Exclusive => format!("held by {holder}"),
        Access::Shared => format!(
            "held other than --shared, or an earlier request waits for it (a holder: \
             {holder})"
        ),
        Access::Semaphore(n) => {
            let taken = if n == 1 {
                "its one slot is taken".to_string()
            } else {
                format!("all {n} slots are taken")
            };
            format!(
                "held: {taken}, it is held other than with --limit {n}, or an earlier \
                 request waits for it (a holder: {holder})"
            )
        }
    };
    match wait {
        Wait::For(t) => {
            format!("lock {shown}: timed out after {}; {held}", fmt_duration(t))
        }
        _ => format!("{shown} is {held}; not running the command"),
    }
}

/// For a lease (`ttl`), the thread that extends it every TTL/3 until
/// `stopped`; none for a session lock.
fn start_extender(
    lease: &Lease,
    ttl: Option<Duration>,
    stopped: mpsc::Receiver<()>,
) -> Result<Option<std::thread::JoinHandle<()>>, Fail> {
    Ok(match ttl {
        Some(ttl) => {
            let lease = lease.clone();
            Some(
                std::thread::Builder::new()
                    .name("ringlock-extend".into())
                    .spawn(move || keep_extending(&lease, ttl / 3, &stopped))
                    .map_err(|e| Fail(EX_SOFTWARE, format!("starting the extend thread: {e}")))?,
            )
        }
        None => None,
    })
}

/// Extends `lease` every `every` until told to stop or the lease is gone.
fn keep_extending(lease: &Lease, every: Duration, stop: &mpsc::Receiver<()>) {
    loop {
        match stop.recv_timeout(every) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        match lease.extend() {
            Ok(_) => {}
            // The handler has it from here.
            Err(lease::Error::Lost(_) | lease::Error::Released) => return,
            // A failed extend is retried; if the failures last, the lease
            // expires on this side first and the loss is reported.
            Err(_) => {}
        }
    }
}
