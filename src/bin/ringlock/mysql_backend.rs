//! `--addr mysql://…`: `lock` and `try-lock` over MySQL/MariaDB `GET_LOCK`
//! (the `mysql` cargo feature), with the same exit codes.

use std::ffi::OsString;
use std::time::Duration;

use crate::args::{key_arg, Cli, Cmd, HoldArgs, KeyFormat};
#[cfg(feature = "mysql")]
use crate::child::{got_signal, install_handlers, CANCEL_FD};
use crate::exit::{usage, Fail};
#[cfg(feature = "mysql")]
use crate::exit::{EX_IOERR, EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE};
#[cfg(feature = "mysql")]
use crate::held::{run_under_lease, stop_on_loss};
#[cfg(feature = "mysql")]
use ringlock::client::CancelToken;
#[cfg(feature = "mysql")]
use std::sync::atomic::Ordering;

/// `--addr mysql://USER[:PASSWORD]@HOST[:PORT]`: `lock` and `try-lock` over
/// MySQL/MariaDB `GET_LOCK` (the `mysql` cargo feature), with the same exit
/// codes. The lock lives in the session: the server frees it when the
/// connection ends, so `unlock`, `reset` and `keys` do not apply.
pub(crate) fn mysql_cmd(cli: &Cli, fmt: KeyFormat) -> Result<u8, Fail> {
    let (key, timeout, hold, command, try_only) = match &cli.cmd {
        Cmd::Lock {
            key,
            timeout,
            hold,
            command,
        } if hold.ttl.is_none() && !hold.persistent => (
            key,
            *timeout,
            hold,
            command,
            timeout.is_some_and(|t| t.is_zero()),
        ),
        Cmd::TryLock { key, hold, command } if hold.ttl.is_none() && !hold.persistent => {
            (key, None, hold, command, true)
        }
        Cmd::Lock { .. } | Cmd::TryLock { .. } => {
            return Err(usage(
                "--ttl and --persistent do not apply over mysql:// (a MySQL lock lives as long as its session)",
            ))
        }
        _ => {
            return Err(usage(
                "only `lock` and `try-lock` work over mysql:// (a MySQL lock belongs to the session that holds it)",
            ))
        }
    };
    if hold.shared || hold.limit.is_some() {
        return Err(usage(
            "--shared and --limit do not apply over mysql:// (GET_LOCK takes exclusive locks \
             only); nothing was locked",
        ));
    }
    let key = key_arg(key, fmt)?;
    let key = String::from_utf8(key).map_err(|_| usage("a MySQL lock name must be UTF-8 text"))?;
    mysql_lock_and_run(&cli.addr, &key, timeout, hold, command, try_only)
}

#[cfg(not(feature = "mysql"))]
fn mysql_lock_and_run(
    _addr: &str,
    _key: &str,
    _timeout: Option<Duration>,
    _hold: &HoldArgs,
    _argv: &[OsString],
    _try_only: bool,
) -> Result<u8, Fail> {
    Err(usage(
        "this ringlock was built without MySQL support (cargo feature `mysql`)",
    ))
}

#[cfg(feature = "mysql")]
fn mysql_lock_and_run(
    addr: &str,
    key: &str,
    timeout: Option<Duration>,
    hold: &HoldArgs,
    argv: &[OsString],
    try_only: bool,
) -> Result<u8, Fail> {
    use ringlock::lease::{Error as LErr, LockOptions as LOpts};
    use ringlock::mysql::{Locker, MysqlAddr, Options};
    let addr = MysqlAddr::parse(addr)
        .and_then(|a| a.with_password_from_env(|k| std::env::var_os(k)))
        .map_err(|e| usage(format!("--addr: {e}")))?;
    let mut opts = Options::new();
    if let Some(k) = hold.keepalive {
        opts = opts.keep_alive_interval(k);
    }
    if let Some(t) = hold.ping_timeout {
        opts = opts.keep_alive_ping_timeout(t);
    }
    let locker = Locker::from_addr(&addr, opts).map_err(|e| usage(format!("--addr: {e}")))?;
    // The same handler as over ringlockd: a loss (the connection watch saw
    // the session end, or a ping failed) stops CMD.
    let on_lost = std::sync::Arc::new(stop_on_loss(key.to_string(), hold.kill_after));
    let lost_opts = || {
        let h = std::sync::Arc::clone(&on_lost);
        LOpts::new().on_lost(move |lease, lost| h(lease, lost))
    };
    let fail = |e: &LErr, what: &str| {
        let code = match e {
            LErr::InvalidKey(_) | LErr::InvalidTimeout => EX_USAGE,
            LErr::Unavailable(..) => EX_UNAVAILABLE,
            LErr::Timeout => EX_TEMPFAIL,
            _ => EX_IOERR,
        };
        Fail(code, format!("{what}: {e}"))
    };
    install_handlers()?;
    let lease = if try_only {
        match locker.try_lock_with(key, &lost_opts()) {
            Ok(Some(l)) => l,
            Ok(None) => {
                return Err(Fail(
                    EX_TEMPFAIL,
                    format!("{key} is held by another session; not running the command"),
                ))
            }
            Err(e) => return Err(fail(&e, &format!("try-lock {key}"))),
        }
    } else {
        let token =
            CancelToken::new().map_err(|e| Fail(EX_SOFTWARE, format!("cancel token: {e}")))?;
        CANCEL_FD.store(std::os::fd::AsRawFd::as_raw_fd(&token), Ordering::SeqCst);
        let wait = timeout.unwrap_or(ringlock::mysql::LOCK_TIMEOUT_MAX);
        let result = locker.lock_with(key, wait, &lost_opts().cancel(token.clone()));
        CANCEL_FD.store(-1, Ordering::SeqCst);
        match result {
            Ok(l) => l,
            Err(LErr::Cancelled) => {
                return Err(Fail(
                    128u8.wrapping_add(got_signal() as u8),
                    format!(
                        "lock {key}: interrupted by signal {}, request withdrawn",
                        got_signal()
                    ),
                ))
            }
            Err(e) => return Err(fail(&e, &format!("lock {key}"))),
        }
    };
    let env = [("RINGLOCK_KEY", OsString::from(key))];
    run_under_lease(
        &lease,
        key,
        argv,
        &env,
        hold.kill_after,
        || {},
        "the server frees it when the session ends",
    )
}
