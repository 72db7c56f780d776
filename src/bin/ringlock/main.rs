//! `ringlock`: the command-line client, a distributed flock(1).
//!
//! ```text
//! ringlock [GLOBAL OPTIONS] lock KEY [--timeout D] -- CMD [ARGS...]
//! ringlock [GLOBAL OPTIONS] try-lock KEY -- CMD [ARGS...]
//! ringlock [GLOBAL OPTIONS] unlock KEY
//! ringlock [GLOBAL OPTIONS] reset KEY...
//! ringlock [GLOBAL OPTIONS] reset --source SRC
//! ringlock [GLOBAL OPTIONS] keys [-d]
//! ```
//!
//! Signals: while `lock` waits, SIGINT/SIGTERM/SIGHUP withdraw the request
//! exactly (a grant that races the signal is released) and exit 128+sig.
//! While the command runs they are forwarded to it (terminal-generated ones
//! already reached it through the process group and are not sent twice);
//! the key is released after the command ends.
//!
//! Exit codes are listed in `USAGE` below and in docs/client.md.

use std::io::{self, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, SystemTime};

use lexopt::prelude::*;
use ringlock::client::{CancelToken, Client, Error, LateGrant, LockOptions, RetryPolicy};

const EX_USAGE: u8 = 64;
const EX_UNAVAILABLE: u8 = 69;
const EX_SOFTWARE: u8 = 70;
const EX_IOERR: u8 = 74;
const EX_TEMPFAIL: u8 = 75;
const EX_PROTOCOL: u8 = 76;
const EX_CANNOT_EXEC: u8 = 126;
const EX_NOT_FOUND: u8 = 127;

const DEFAULT_ADDR: &str = "127.0.0.1:22119";

const USAGE: &str = "\
usage: ringlock [OPTIONS] COMMAND ...

Commands:
  lock KEY [--timeout D] -- CMD [ARGS...]  wait for KEY, run CMD, release KEY
  try-lock KEY -- CMD [ARGS...]            run CMD only if KEY is free now
  unlock KEY                               release KEY (whoever holds it)
  reset KEY...                             operator reset of held keys
  reset --source SRC                       release every key held by SRC
  keys [-d]                                list held keys (admin port)

Options (before the command):
  --addr HOST:PORT        lock port [env RINGLOCK_ADDR, default 127.0.0.1:22119]
  --admin-addr HOST:PORT  admin port [env RINGLOCK_ADMIN_ADDR, default lock port + 1]
  --source NAME           source name sent with locks [env RINGLOCK_SOURCE, default: IP]
  --retry D               keep retrying an unreachable server for D [default 10s, 0 = once]
  -h, --help              this help (also: ringlock COMMAND --help)

Durations: 250ms, 10s, 1.5m, 2h (a bare number is seconds).

Exit status:
  CMD's own status for lock/try-lock (128+N if it died of signal N), else 0
  64  usage error (bad option, bad key: nothing was sent)
  69  server unavailable (could not connect within --retry)
  70  internal error
  74  i/o error mid-request (or the key could not be released after CMD)
  75  lock not obtained (try-lock: held by someone else; lock: --timeout passed)
  76  the server refused the request or broke the protocol
  126 CMD could not be executed;  127 CMD not found
  128+N  interrupted by signal N while waiting (the request was withdrawn)
";

const HELP_LOCK: &str = "\
usage: ringlock lock KEY [--timeout D] -- CMD [ARGS...]
Waits for KEY (FIFO), runs CMD, and releases KEY when CMD ends, however it
ends. Exits with CMD's status (128+N if it died of signal N). SIGINT, SIGTERM
and SIGHUP are forwarded to CMD. With --timeout, gives up after D and exits 75.
";
const HELP_TRY_LOCK: &str = "\
usage: ringlock try-lock KEY -- CMD [ARGS...]
Runs CMD holding KEY if KEY is free right now; otherwise exits 75 without
running it.
";
const HELP_UNLOCK: &str = "\
usage: ringlock unlock KEY
Releases KEY whoever holds it (the protocol has no owner check).
";
const HELP_RESET: &str = "\
usage: ringlock reset KEY...
       ringlock reset --source SRC
Releases the holders of the given keys (waiters keep their places), or every
key held by source SRC (its queued locks are refused).
";
const HELP_KEYS: &str = "\
usage: ringlock keys [-d]
Lists held keys: KEY, SOURCE, ENDPOINT, HELD (for how long).
  -d, --dates   also show when each key was acquired (UTC)
";

/// A failure that ends the process: exit code and its one-line message.
struct Fail(u8, String);

fn usage(msg: impl std::fmt::Display) -> Fail {
    Fail(EX_USAGE, format!("{msg} (see ringlock --help)"))
}

impl From<lexopt::Error> for Fail {
    fn from(e: lexopt::Error) -> Fail {
        usage(e)
    }
}

fn client_fail(err: &Error, what: &str) -> Fail {
    let code = match err {
        Error::InvalidKey { .. } | Error::InvalidSource { .. } => EX_USAGE,
        Error::Unavailable { .. } => EX_UNAVAILABLE,
        Error::Timeout => EX_TEMPFAIL,
        Error::Refused | Error::Protocol(_) => EX_PROTOCOL,
        Error::Io(_) => EX_IOERR,
        Error::Cancelled => 128u8.wrapping_add(got_signal() as u8),
        _ => EX_SOFTWARE,
    };
    Fail(code, format!("{what}: {err}"))
}

struct Global {
    addr: String,
    admin_addr: Option<String>,
    source: String,
    retry: Duration,
}

enum Cmd {
    Lock {
        key: String,
        timeout: Option<Duration>,
        argv: Vec<std::ffi::OsString>,
    },
    TryLock {
        key: String,
        argv: Vec<std::ffi::OsString>,
    },
    Unlock {
        key: String,
    },
    Reset {
        keys: Vec<String>,
    },
    ResetSource {
        source: String,
    },
    Keys {
        dates: bool,
    },
    Help(&'static str),
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => ExitCode::from(code),
        Err(Fail(code, msg)) => {
            let _ = writeln!(io::stderr(), "ringlock: {msg}");
            ExitCode::from(code)
        }
    }
}

fn run() -> Result<u8, Fail> {
    let (global, cmd) = parse(lexopt::Parser::from_env())?;
    if let Cmd::Help(text) = cmd {
        let _ = io::stdout().write_all(text.as_bytes());
        return Ok(0);
    }
    let addr = if global.addr.contains(':') {
        global.addr.clone()
    } else {
        format!("{}:22119", global.addr)
    };
    let retry = if global.retry.is_zero() {
        RetryPolicy::none()
    } else {
        RetryPolicy {
            max_elapsed: global.retry,
            ..RetryPolicy::default()
        }
    };
    let mut builder = Client::builder(addr.as_str())
        .source(global.source.clone())
        .retry(retry);
    if let Some(admin) = &global.admin_addr {
        builder = builder.admin_addr(admin.as_str());
    }
    let client = builder
        .build()
        .map_err(|e| client_fail(&e, &format!("address {addr}")))?;
    match cmd {
        Cmd::Lock { key, timeout, argv } => lock_and_run(&client, &key, timeout, &argv, false),
        Cmd::TryLock { key, argv } => lock_and_run(&client, &key, None, &argv, true),
        Cmd::Unlock { key } => {
            client
                .unlock(&key)
                .map_err(|e| client_fail(&e, &format!("unlock {key}")))?;
            Ok(0)
        }
        Cmd::Reset { keys } => {
            // Validate all before sending any, so a typo resets nothing.
            for key in &keys {
                if key.is_empty() || key.len() > ringlock::client::KEY_LEN_MAX {
                    let err = Error::InvalidKey { len: key.len() };
                    return Err(client_fail(&err, &format!("reset {key:?}")));
                }
            }
            for key in &keys {
                client
                    .reset_by_key(key)
                    .map_err(|e| client_fail(&e, &format!("reset {key}")))?;
            }
            Ok(0)
        }
        Cmd::ResetSource { source } => {
            client
                .reset_by_source(&source)
                .map_err(|e| client_fail(&e, &format!("reset --source {source}")))?;
            Ok(0)
        }
        Cmd::Keys { dates } => {
            let keys = client.keys().map_err(|e| client_fail(&e, "keys"))?;
            print_keys(&keys, dates);
            Ok(0)
        }
        Cmd::Help(_) => unreachable!("handled above"),
    }
}

fn parse(mut p: lexopt::Parser) -> Result<(Global, Cmd), Fail> {
    let mut global = Global {
        addr: std::env::var("RINGLOCK_ADDR").unwrap_or_else(|_| DEFAULT_ADDR.into()),
        admin_addr: std::env::var("RINGLOCK_ADMIN_ADDR").ok(),
        source: std::env::var("RINGLOCK_SOURCE").unwrap_or_default(),
        retry: Duration::from_secs(10),
    };
    let mut sub: Option<String> = None;
    let mut positional: Vec<String> = Vec::new();
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    let mut timeout = None;
    let mut dates = false;
    let mut reset_source: Option<String> = None;
    while let Some(arg) = p.next()? {
        match (sub.as_deref(), arg) {
            (None, Long("addr")) => global.addr = p.value()?.string()?,
            (None, Long("admin-addr")) => global.admin_addr = Some(p.value()?.string()?),
            (None, Long("source")) => global.source = p.value()?.string()?,
            (None, Long("retry")) => global.retry = parse_duration(&p.value()?.string()?)?,
            (None, Short('h') | Long("help")) => return Ok((global, Cmd::Help(USAGE))),
            (None, Value(v)) => sub = Some(v.string()?),
            (Some(s), Short('h') | Long("help")) => {
                let text = match s {
                    "lock" => HELP_LOCK,
                    "try-lock" => HELP_TRY_LOCK,
                    "unlock" => HELP_UNLOCK,
                    "reset" => HELP_RESET,
                    "keys" => HELP_KEYS,
                    _ => USAGE,
                };
                return Ok((global, Cmd::Help(text)));
            }
            (Some("lock"), Short('t') | Long("timeout")) => {
                timeout = Some(parse_duration(&p.value()?.string()?)?)
            }
            (Some("keys"), Short('d') | Long("dates")) => dates = true,
            (Some("reset"), Long("source")) => reset_source = Some(p.value()?.string()?),
            (Some("lock" | "try-lock"), Value(v)) if !positional.is_empty() => {
                // The command starts here; its own options are not ours.
                argv.push(v);
                argv.extend(p.raw_args()?);
            }
            (Some(_), Value(v)) => positional.push(v.string()?),
            (_, other) => return Err(other.unexpected().into()),
        }
    }
    let Some(sub) = sub else {
        return Err(usage("missing command"));
    };
    let one_key = |positional: &mut Vec<String>| -> Result<String, Fail> {
        match positional.len() {
            0 => Err(usage(format!("{sub}: missing KEY"))),
            1 => Ok(positional.remove(0)),
            _ => Err(usage(format!(
                "{sub}: unexpected argument {:?}",
                positional[1]
            ))),
        }
    };
    let cmd = match sub.as_str() {
        "lock" | "try-lock" => {
            let key = one_key(&mut positional)?;
            if argv.is_empty() {
                return Err(usage(format!("{sub}: missing command after `--`")));
            }
            if sub == "lock" {
                Cmd::Lock { key, timeout, argv }
            } else {
                Cmd::TryLock { key, argv }
            }
        }
        "unlock" => Cmd::Unlock {
            key: one_key(&mut positional)?,
        },
        "reset" => match (reset_source, positional.is_empty()) {
            (Some(source), true) => Cmd::ResetSource { source },
            (None, false) => Cmd::Reset { keys: positional },
            (Some(_), false) => return Err(usage("reset: give KEYs or --source, not both")),
            (None, true) => return Err(usage("reset: missing KEY or --source SRC")),
        },
        "keys" => {
            if let Some(extra) = positional.first() {
                return Err(usage(format!("keys: unexpected argument {extra:?}")));
            }
            Cmd::Keys { dates }
        }
        other => return Err(usage(format!("unknown command {other:?}"))),
    };
    Ok((global, cmd))
}

/// Parses `250ms`, `10s`, `1.5m`, `2h` or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, Fail> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(usage(format!("bad duration {text:?}"))),
    };
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * scale < 1e9 => {
            Ok(Duration::from_secs_f64(v * scale))
        }
        _ => Err(usage(format!("bad duration {text:?}"))),
    }
}

// ---- signals -------------------------------------------------------------

/// The child's pid while it runs (0 otherwise).
static CHILD_PID: AtomicI32 = AtomicI32::new(0);
/// The cancel token's eventfd while a lock wait is in progress (-1 otherwise).
static CANCEL_FD: AtomicI32 = AtomicI32::new(-1);
/// The last forwarded-or-cancelling signal received.
static GOT_SIGNAL: AtomicI32 = AtomicI32::new(0);

const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn got_signal() -> i32 {
    GOT_SIGNAL.load(Ordering::SeqCst)
}

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // Async-signal-safe only: atomics, kill(2), write(2).
    GOT_SIGNAL.store(sig, Ordering::SeqCst);
    let pid = CHILD_PID.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
        let code = unsafe { (*info).si_code };
        // A terminal's ^C (SI_KERNEL) already reached the child through the
        // foreground process group; sending it again would double it.
        if code != libc::SI_KERNEL {
            // SAFETY: plain syscall; `pid` is an unreaped child (see run_child).
            unsafe { libc::kill(pid, sig) };
        }
    } else {
        let fd = CANCEL_FD.load(Ordering::SeqCst);
        if fd >= 0 {
            CancelToken::cancel_fd(fd);
        }
    }
}

fn install_handlers() -> Result<(), Fail> {
    for sig in FORWARDED {
        // SAFETY: a zeroed sigaction is valid; we set the handler and flags
        // and pass pointers to live locals.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(Fail(
                EX_SOFTWARE,
                format!("sigaction: {}", io::Error::last_os_error()),
            ));
        }
    }
    Ok(())
}

/// Blocks (or unblocks) the forwarded signals in this thread.
fn mask_signals(block: bool) {
    // SAFETY: builds a sigset on the stack and passes it to pthread_sigmask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in FORWARDED {
            libc::sigaddset(&mut set, sig);
        }
        let how = if block {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

// ---- lock / try-lock -----------------------------------------------------

fn lock_and_run(
    client: &Client,
    key: &str,
    timeout: Option<Duration>,
    argv: &[std::ffi::OsString],
    try_only: bool,
) -> Result<u8, Fail> {
    install_handlers()?;
    let mut guard = if try_only {
        match client.try_lock(key) {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                return Err(Fail(
                    EX_TEMPFAIL,
                    format!("{key} is held by someone else; not running the command"),
                ))
            }
            Err(e) => return Err(client_fail(&e, &format!("try-lock {key}"))),
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
                let waited = timeout.map(|t| format!(" after {t:?}")).unwrap_or_default();
                return Err(Fail(EX_TEMPFAIL, format!("lock {key}: timed out{waited}")));
            }
            Err(Error::Cancelled) => {
                return Err(Fail(
                    128u8.wrapping_add(got_signal() as u8),
                    format!(
                        "lock {key}: interrupted by signal {}, request withdrawn",
                        got_signal()
                    ),
                ))
            }
            Err(e) => return Err(client_fail(&e, &format!("lock {key}"))),
        }
    };

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
        run_child(argv)
    };
    let released = guard.release();
    match (status, released) {
        (Ok(code), Ok(())) => Ok(code),
        (Ok(code), Err(e)) => {
            let _ = writeln!(
                io::stderr(),
                "ringlock: releasing {key} failed: {e} (use `ringlock unlock {key}`)"
            );
            Ok(if code == 0 { EX_IOERR } else { code })
        }
        (Err(fail), _) => Err(fail),
    }
}

/// Runs the command with the forwarded signals blocked on entry; returns its
/// exit code (128+N for death by signal N).
fn run_child(argv: &[std::ffi::OsString]) -> Result<u8, Fail> {
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]);
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (sigaction, pthread_sigmask) on locals.
    unsafe {
        command.pre_exec(|| {
            // Our mask is inherited across exec (std does not reset it), and
            // a signal landing before exec must not run our handler in the
            // child: default dispositions first, then unblock.
            for sig in FORWARDED {
                libc::signal(sig, libc::SIG_DFL);
            }
            mask_signals(false);
            Ok(())
        });
    }
    let spawned = command.spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            mask_signals(false);
            let code = match e.kind() {
                io::ErrorKind::NotFound => EX_NOT_FOUND,
                _ => EX_CANNOT_EXEC,
            };
            return Err(Fail(code, format!("{}: {e}", argv[0].to_string_lossy())));
        }
    };
    let pid = child.id() as i32;
    CHILD_PID.store(pid, Ordering::SeqCst);
    mask_signals(false);
    // Wait without reaping, so the pid cannot be recycled while the handler
    // may still signal it; then forget it and reap.
    loop {
        // SAFETY: siginfo is plain data the kernel fills in.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits on our own child; `info` is a live out-parameter.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            break;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            break; // child.wait() below reports it.
        }
    }
    CHILD_PID.store(0, Ordering::SeqCst);
    let status = child
        .wait()
        .map_err(|e| Fail(EX_SOFTWARE, format!("waiting for the command: {e}")))?;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        (None, None) => EX_SOFTWARE,
    })
}

// ---- keys ----------------------------------------------------------------

fn print_keys(keys: &[ringlock::client::KeyInfo], dates: bool) {
    let now = SystemTime::now();
    let mut rows: Vec<Vec<String>> = vec![["KEY", "SOURCE", "ENDPOINT", "HELD"]
        .iter()
        .map(|s| s.to_string())
        .collect()];
    if dates {
        rows[0].push("ACQUIRED (UTC)".into());
    }
    for k in keys {
        let mut row = vec![
            k.key_lossy(),
            k.source_lossy(),
            k.endpoint.clone(),
            format_held(k.held_for(now)),
        ];
        if dates {
            row.push(format_utc(k.acquired_unix_s));
        }
        rows.push(row);
    }
    let cols = rows[0].len();
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == cols {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let _ = io::stdout().write_all(out.as_bytes());
}

fn format_held(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60),
        _ => format!("{}d{:02}h{:02}m", s / 86_400, s / 3600 % 24, s / 60 % 60),
    }
}

/// Unix seconds to `YYYY-MM-DDTHH:MM:SSZ` (Howard Hinnant's civil_from_days).
fn format_utc(unix_s: i64) -> String {
    let days = unix_s.div_euclid(86_400);
    let secs = unix_s.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("250ms").ok(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(parse_duration("10").ok(), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5m").ok(), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h").ok(), Some(Duration::from_secs(7200)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn utc_and_held_formatting() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(format_utc(-1), "1969-12-31T23:59:59Z");
        assert_eq!(format_held(Duration::from_secs(5)), "5s");
        assert_eq!(format_held(Duration::from_secs(65)), "1m05s");
        assert_eq!(format_held(Duration::from_secs(3725)), "1h02m05s");
        assert_eq!(format_held(Duration::from_secs(90_061)), "1d01h01m");
    }

    fn parse_args(args: &[&str]) -> Result<(Global, Cmd), Fail> {
        parse(lexopt::Parser::from_args(args.iter().copied()))
    }

    #[test]
    fn parses_commands() {
        let (g, cmd) = parse_args(&[
            "--addr",
            "h:1",
            "--source",
            "me",
            "lock",
            "k",
            "--timeout",
            "2s",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .ok()
        .expect("valid");
        assert_eq!(g.addr, "h:1");
        assert_eq!(g.source, "me");
        match cmd {
            Cmd::Lock { key, timeout, argv } => {
                assert_eq!(key, "k");
                assert_eq!(timeout, Some(Duration::from_secs(2)));
                assert_eq!(argv, ["sh", "-c", "exit 3"]);
            }
            _ => panic!("lock expected"),
        }
        assert!(matches!(
            parse_args(&["reset", "--source", "s"]).ok().map(|x| x.1),
            Some(Cmd::ResetSource { .. })
        ));
        assert!(matches!(
            parse_args(&["keys", "-d"]).ok().map(|x| x.1),
            Some(Cmd::Keys { dates: true })
        ));
        assert!(matches!(
            parse_args(&["lock", "--help"]).ok().map(|x| x.1),
            Some(Cmd::Help(HELP_LOCK))
        ));
        for bad in [
            &["lock", "k"][..],
            &["lock"],
            &[],
            &["frob"],
            &["unlock", "a", "b"],
            &["reset"],
            &["keys", "--nope"],
        ] {
            assert!(matches!(parse_args(bad), Err(Fail(EX_USAGE, _))), "{bad:?}");
        }
    }
}
