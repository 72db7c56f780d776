//! `lock`/`try-lock --persistent`: the Locking-Center lock around CMD,
//! held until released or reset whatever happens to ringlock.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ringlock::client::{CancelToken, Error, LateGrant, LockOptions};

use crate::bytes;
use crate::child::{got_signal, install_handlers, CANCEL_FD};
use crate::conn::Conn;
use crate::exit::{Fail, EX_SOFTWARE, EX_TEMPFAIL};
use crate::failure::client_fail;
use crate::held::run_while_held;
use crate::show::{fmt_duration, shell_key};

pub(crate) fn lock_and_run(
    conn: &Conn,
    key: &[u8],
    timeout: Option<Duration>,
    argv: &[OsString],
    try_only: bool,
) -> Result<u8, Fail> {
    let client = &conn.client;
    let shown = bytes::escape(key);
    install_handlers()?;
    let mut guard = if try_only {
        match client.try_lock(key) {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                return Err(Fail(
                    EX_TEMPFAIL,
                    format!(
                        "{shown} is held by {}; not running the command",
                        conn.holder_of(key)
                    ),
                ))
            }
            Err(e) => return Err(client_fail(&e, &format!("try-lock {shown}"))),
        }
    } else {
        let token =
            CancelToken::new().map_err(|e| Fail(EX_SOFTWARE, format!("cancel token: {e}")))?;
        let mut opts = LockOptions::new()
            .late_grant(LateGrant::Release)
            .cancel(token.clone());
        if let Some(t) = timeout {
            opts = opts.timeout(t);
        }
        CANCEL_FD.store(std::os::fd::AsRawFd::as_raw_fd(&token), Ordering::SeqCst);
        let result = client.lock_with(key, &opts);
        CANCEL_FD.store(-1, Ordering::SeqCst);
        match result {
            Ok(guard) => guard,
            Err(Error::Timeout) => {
                let waited = timeout
                    .map(|t| format!(" after {}", fmt_duration(t)))
                    .unwrap_or_default();
                return Err(Fail(
                    EX_TEMPFAIL,
                    format!(
                        "lock {shown}: timed out{waited}; held by {}",
                        conn.holder_of(key)
                    ),
                ));
            }
            Err(Error::Cancelled) => {
                return Err(Fail(
                    128u8.wrapping_add(got_signal() as u8),
                    format!(
                        "lock {shown}: interrupted by signal {}, request withdrawn",
                        got_signal()
                    ),
                ))
            }
            Err(e) => return Err(client_fail(&e, &format!("lock {shown}"))),
        }
    };

    let env = [("RINGLOCK_KEY", OsString::from_vec(key.to_vec()))];
    // A persistent lock outlives ringlock anyway: no connection to inherit
    // (CMD still dies with ringlock: see `child`).
    run_while_held(argv, &env, &[], || {
        guard.release().map_err(|e| {
            format!(
                "releasing {shown} failed: {e} (use `ringlock unlock {}`)",
                shell_key(key)
            )
        })
    })
}
