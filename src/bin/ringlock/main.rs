//! `ringlock`: the command-line client, a distributed flock(1).
//!
//! ```text
//! ringlock [OPTIONS] lock [--timeout D] KEY -- CMD [ARGS...]
//! ringlock [OPTIONS] try-lock KEY -- CMD [ARGS...]
//! ringlock [OPTIONS] unlock KEY
//! ringlock [OPTIONS] reset KEY...
//! ringlock [OPTIONS] reset --source SRC
//! ringlock [OPTIONS] keys [-d] [--json] [--older-than D]
//! ringlock completions SHELL | ringlock man
//! ```
//!
//! Parsing is clap's; everything a user can get wrong ends with exactly one
//! line on stderr starting `ringlock: ` and exit 64, before any traffic.
//! Exit codes are listed in [`EXIT_STATUS`] and docs/client.md.

mod bytes;
mod child;
mod keys;

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use ringlock::client::{
    CancelToken, Client, Error, KeyInfo, LateGrant, LockOptions, RetryPolicy, ToServerAddrs,
    DEFAULT_PORT, KEY_LEN_MAX, SOURCE_LEN_MAX,
};

use child::{got_signal, install_handlers, mask_signals, run_child, CANCEL_FD};

pub(crate) const EX_USAGE: u8 = 64;
pub(crate) const EX_UNAVAILABLE: u8 = 69;
pub(crate) const EX_SOFTWARE: u8 = 70;
pub(crate) const EX_IOERR: u8 = 74;
pub(crate) const EX_TEMPFAIL: u8 = 75;
pub(crate) const EX_PROTOCOL: u8 = 76;
pub(crate) const EX_CANNOT_EXEC: u8 = 126;
pub(crate) const EX_NOT_FOUND: u8 = 127;

const EXIT_STATUS: &str = "\
Exit status:
  CMD's own status for lock/try-lock (128+N if it died of signal N), else 0
  64   usage error: bad option, address, key or source (nothing was sent)
  69   server unavailable (could not connect within --retry)
  70   internal error
  74   i/o error mid-request (or the key could not be released after CMD)
  75   lock not obtained (try-lock or --timeout 0: held; lock: --timeout passed)
  76   the server refused the request or broke the protocol
  126  CMD could not be executed;  127  CMD not found (the key was released)
  128+N  interrupted by signal N while waiting (the request was withdrawn)

Environment:
  RINGLOCK_ADDR, RINGLOCK_ADMIN_ADDR, RINGLOCK_SOURCE  defaults of --addr, --admin-addr, --source

Durations: 250ms, 10s, 1.5m, 2h (a bare number is seconds).
Any client of the lock port can unlock or reset any key (Locking-Center semantics).";

const KEY_FORMATS: &str = "\
Keys are bytes (1 to 127 of them). `raw` takes each KEY and SRC argument's \
bytes as they are, `escaped` reads the form `ringlock keys` prints (\\\\ \\n \
\\r \\t \\xNN \\u{HEX}), `hex` reads hex digits.";

/// A distributed flock(1) for ringlock and any Locking-Center server.
#[derive(Parser, Debug)]
#[command(
    name = "ringlock",
    version,
    about = "A distributed flock(1): run commands under locks held by a ringlock (or Locking-Center) server",
    after_help = "Run `ringlock COMMAND --help` for one command; `ringlock --help` also lists exit codes.",
    after_long_help = EXIT_STATUS,
    subcommand_required = true,
    args_override_self = true,
    disable_help_subcommand = true
)]
struct Cli {
    /// Lock port; a host without a port means port 22119
    #[arg(
        long,
        env = "RINGLOCK_ADDR",
        value_name = "HOST[:PORT]",
        default_value = "127.0.0.1:22119"
    )]
    addr: String,

    /// Admin port, used by `keys` and to say who holds a key [default: lock port + 1]
    #[arg(long, env = "RINGLOCK_ADMIN_ADDR", value_name = "HOST[:PORT]")]
    admin_addr: Option<String>,

    /// Source name sent with lock and try-lock, shown by `keys` [default: the server uses your IP]
    #[arg(long, env = "RINGLOCK_SOURCE", value_name = "NAME")]
    source: Option<OsString>,

    /// Keep retrying an unreachable server for D (0 = one attempt)
    #[arg(long, value_name = "D", default_value = "10s", value_parser = parse_duration)]
    retry: Duration,

    /// How KEY and SRC arguments (and --source) are written
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = KeyFormat::Raw, long_help = KEY_FORMATS)]
    key_format: KeyFormat,

    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum KeyFormat {
    /// The argument's bytes as they are
    Raw,
    /// The escaped form `ringlock keys` prints
    Escaped,
    /// Hex digits, two per byte
    Hex,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Wait for KEY (first come, first served), run CMD, release KEY when CMD ends
    ///
    /// Exits with CMD's status (128+N if it died of signal N). SIGINT, SIGTERM
    /// and SIGHUP are forwarded to CMD; KEY is released after CMD ends,
    /// however it ends. A signal while still waiting withdraws the request
    /// and exits 128+N.
    Lock {
        /// Give up after D and exit 75; 0 means do not wait at all (like try-lock)
        #[arg(long, value_name = "D", value_parser = parse_duration)]
        timeout: Option<Duration>,
        /// The key to hold
        #[arg(value_name = "KEY")]
        key: OsString,
        /// The command to run while holding KEY (after `--`)
        #[arg(value_name = "CMD", last = true, required = true, num_args = 1..)]
        command: Vec<OsString>,
    },
    /// Run CMD holding KEY only if KEY is free right now; otherwise exit 75 and say who holds it
    TryLock {
        /// The key to hold
        #[arg(value_name = "KEY")]
        key: OsString,
        /// The command to run while holding KEY (after `--`)
        #[arg(value_name = "CMD", last = true, required = true, num_args = 1..)]
        command: Vec<OsString>,
    },
    /// Release KEY, whoever holds it (the protocol has no owner check)
    ///
    /// Unlocking a key nobody holds succeeds (exit 0) with a note on stderr,
    /// when the admin port can tell.
    Unlock {
        /// The key to release
        #[arg(value_name = "KEY")]
        key: OsString,
    },
    /// Operator reset: release the holders of KEYs, or every key held by a source
    ///
    /// Waiters of a reset key keep their places. `--source SRC` also refuses
    /// SRC's queued locks. Any client of the lock port may do this. Keys
    /// nobody holds are noted on stderr (exit 0).
    Reset {
        /// Keys whose holders to release (all are checked before any is sent)
        #[arg(
            value_name = "KEY",
            required_unless_present = "by_source",
            conflicts_with = "by_source"
        )]
        keys: Vec<OsString>,
        /// Release every key held by source SRC instead
        #[arg(long = "source", value_name = "SRC")]
        by_source: Option<OsString>,
    },
    /// List held keys (admin port): KEY, SOURCE, ENDPOINT, HELD
    ///
    /// Keys and sources are printed in the escaped form (\\ \n \r \t \xNN,
    /// \u{HEX}; a space is \x20), so every key is one line and one column;
    /// give a key back with `--key-format escaped`. `--json` carries the
    /// exact bytes.
    Keys {
        /// Also show when each key was acquired (UTC)
        #[arg(short = 'd', long)]
        dates: bool,
        /// Print a JSON array, one object per key: key, key_hex, source,
        /// source_hex, endpoint, acquired_unix_s, held_s (key and source are
        /// null unless valid UTF-8 without control characters; the _hex
        /// fields always carry the exact bytes)
        #[arg(long)]
        json: bool,
        /// Only keys held for at least D (e.g. 5m): the stuck-lock check
        #[arg(long, value_name = "D", value_parser = parse_duration)]
        older_than: Option<Duration>,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions {
        #[arg(value_enum, value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) on stdout: `ringlock man > ringlock.1`
    Man,
}

/// A failure that ends the process: exit code and its one-line message.
pub(crate) struct Fail(pub u8, pub String);

fn usage(msg: impl std::fmt::Display) -> Fail {
    Fail(EX_USAGE, format!("{msg} (see ringlock --help)"))
}

fn client_fail(err: &Error, what: &str) -> Fail {
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

fn main() -> ExitCode {
    match run(std::env::args_os()) {
        Ok(code) => ExitCode::from(code),
        Err(Fail(code, msg)) => {
            let _ = writeln!(io::stderr(), "ringlock: {msg}");
            ExitCode::from(code)
        }
    }
}

/// clap's message, on one line, with the usage it printed.
fn one_line(err: &clap::Error) -> String {
    if err.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        return "missing command: lock, try-lock, unlock, reset, keys, completions or man \
                (see ringlock --help)"
            .into();
    }
    let text = err.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    let (head, rest) = text.split_once("\n\nUsage: ").unwrap_or((text, ""));
    let head = head
        .lines()
        .filter(|l| !l.starts_with("For more information"))
        .flat_map(str::split_whitespace)
        .collect::<Vec<_>>()
        .join(" ");
    match rest.lines().next().map(str::trim) {
        Some(usage) if !usage.is_empty() => format!("{head} (usage: {usage})"),
        _ => format!("{head} (see ringlock --help)"),
    }
}

fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<(Cli, ArgMatches), Fail> {
    let matches = match Cli::command().try_get_matches_from(args) {
        Ok(m) => m,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return Err(Fail(0, String::new()));
            }
            return Err(Fail(EX_USAGE, one_line(&e)));
        }
    };
    let cli = Cli::from_arg_matches(&matches).map_err(|e| Fail(EX_USAGE, one_line(&e)))?;
    Ok((cli, matches))
}

fn run(args: impl IntoIterator<Item = OsString>) -> Result<u8, Fail> {
    let (cli, matches) = match parse_args(args) {
        Ok(parsed) => parsed,
        // --help / --version: already printed.
        Err(Fail(0, _)) => return Ok(0),
        Err(fail) => return Err(fail),
    };
    let out = |text: &[u8]| {
        // A closed pipe (`ringlock keys | head`) is not an error worth a line.
        let _ = io::stdout().write_all(text);
    };
    match &cli.cmd {
        Cmd::Completions { shell } => {
            let mut buf = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "ringlock", &mut buf);
            out(&buf);
            return Ok(0);
        }
        Cmd::Man => {
            let mut buf = Vec::new();
            clap_mangen::Man::new(Cli::command())
                .render(&mut buf)
                .map_err(|e| Fail(EX_SOFTWARE, format!("rendering the man page: {e}")))?;
            out(&buf);
            return Ok(0);
        }
        _ => {}
    }
    let fmt = cli.key_format;
    let source = match &cli.source {
        Some(s) => arg_bytes(s, fmt).map_err(|e| usage(format!("--source: {e}")))?,
        None => Vec::new(),
    };
    if ringlock::mysql::is_mysql_addr(&cli.addr) {
        return mysql_cmd(&cli, fmt);
    }
    let conn = Conn::new(&cli, &matches, source)?;
    match &cli.cmd {
        Cmd::Lock {
            key,
            timeout,
            command,
        } => {
            let key = key_arg(key, fmt)?;
            match timeout {
                // flock -w 0: never queue behind a holder.
                Some(t) if t.is_zero() => lock_and_run(&conn, &key, None, command, true),
                t => lock_and_run(&conn, &key, *t, command, false),
            }
        }
        Cmd::TryLock { key, command } => {
            let key = key_arg(key, fmt)?;
            lock_and_run(&conn, &key, None, command, true)
        }
        Cmd::Unlock { key } => {
            let key = key_arg(key, fmt)?;
            let was_held = conn.held(|k| k.key == key);
            conn.client
                .unlock(&key)
                .map_err(|e| client_fail(&e, &format!("unlock {}", bytes::escape(&key))))?;
            if was_held == Some(false) {
                note(&format!(
                    "{} was not held; nothing was released",
                    bytes::escape(&key)
                ));
            }
            Ok(0)
        }
        Cmd::Reset {
            keys,
            by_source: None,
        } => {
            // Check every key before sending any, so a typo resets nothing.
            let keys = keys
                .iter()
                .map(|k| key_arg(k, fmt))
                .collect::<Result<Vec<_>, _>>()?;
            let table = conn.keys_for_notes();
            for key in &keys {
                conn.client
                    .reset_by_key(key)
                    .map_err(|e| client_fail(&e, &format!("reset {}", bytes::escape(key))))?;
                if table
                    .as_ref()
                    .is_some_and(|t| !t.iter().any(|k| &k.key == key))
                {
                    note(&format!(
                        "{} was not held; nothing was reset",
                        bytes::escape(key)
                    ));
                }
            }
            Ok(0)
        }
        Cmd::Reset {
            by_source: Some(src),
            ..
        } => {
            let src = arg_bytes(src, fmt).map_err(|e| usage(format!("--source: {e}")))?;
            if src.len() > SOURCE_LEN_MAX {
                return Err(client_fail(
                    &Error::InvalidSource { len: src.len() },
                    "reset --source",
                ));
            }
            // An empty source means "my own IP": the table cannot tell.
            let was_held = if src.is_empty() {
                None
            } else {
                conn.held(|k| k.source == src)
            };
            conn.client
                .reset_by_source(&src)
                .map_err(|e| client_fail(&e, &format!("reset --source {}", bytes::escape(&src))))?;
            if was_held == Some(false) {
                note(&format!(
                    "no key was held by source {}; nothing was reset",
                    bytes::escape(&src)
                ));
            }
            Ok(0)
        }
        Cmd::Keys {
            dates,
            json,
            older_than,
        } => {
            let mut list = conn
                .client
                .keys()
                .map_err(|e| client_fail(&e, "keys (admin port)"))?;
            let now = SystemTime::now();
            if let Some(min) = older_than {
                list.retain(|k| k.held_for(now) >= *min);
            }
            let text = if *json {
                keys::to_json(&list, now)
            } else {
                keys::table(&list, now, *dates)
            };
            out(text.as_bytes());
            Ok(0)
        }
        Cmd::Completions { .. } | Cmd::Man => unreachable!("handled above"),
    }
}

/// A note on a successful command (stderr, exit status unchanged).
fn note(msg: &str) {
    let _ = writeln!(io::stderr(), "ringlock: note: {msg}");
}

/// An argument's bytes in the chosen format.
fn arg_bytes(arg: &OsStr, fmt: KeyFormat) -> Result<Vec<u8>, String> {
    let raw = arg.as_bytes();
    match fmt {
        KeyFormat::Raw => Ok(raw.to_vec()),
        KeyFormat::Escaped => {
            bytes::unescape(raw).map_err(|e| format!("'{}': {e}", bytes::escape(raw)))
        }
        KeyFormat::Hex => bytes::unhex(raw).map_err(|e| format!("'{}': {e}", bytes::escape(raw))),
    }
}

/// A KEY argument, decoded and checked against the protocol's 1..=127 bytes.
fn key_arg(arg: &OsStr, fmt: KeyFormat) -> Result<Vec<u8>, Fail> {
    let key = arg_bytes(arg, fmt).map_err(|e| usage(format!("key {e}")))?;
    if key.is_empty() || key.len() > KEY_LEN_MAX {
        let err = Error::InvalidKey { len: key.len() };
        return Err(client_fail(&err, &format!("key '{}'", bytes::escape(&key))));
    }
    Ok(key)
}

/// How to give `key` back on a command line, for messages.
fn shell_key(key: &[u8]) -> String {
    let escaped = bytes::escape(key);
    let plain = escaped.as_bytes() == key
        && key
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-:@%+,=".contains(b));
    if plain {
        escaped
    } else {
        format!("--key-format escaped '{}'", escaped.replace('\'', "'\\''"))
    }
}

/// The client and what the notes need: a second client that asks `KEYS`
/// once, briefly, so an unreachable admin port (it is loopback-only by
/// default) never delays or fails the command itself.
struct Conn {
    client: Client,
    probe: Client,
}

impl Conn {
    fn new(cli: &Cli, matches: &ArgMatches, source: Vec<u8>) -> Result<Conn, Fail> {
        let named = |id: &str, flag: &str, env: &str| {
            if matches.value_source(id) == Some(ValueSource::EnvVariable) {
                env.to_string()
            } else {
                flag.to_string()
            }
        };
        let lock: Vec<SocketAddr> =
            cli.addr
                .as_str()
                .to_server_addrs(DEFAULT_PORT)
                .map_err(|e| {
                    Fail(
                        EX_USAGE,
                        format!("{}: {e}", named("addr", "--addr", "RINGLOCK_ADDR")),
                    )
                })?;
        let admin: Option<Vec<SocketAddr>> = match &cli.admin_addr {
            Some(a) => Some(a.as_str().to_server_addrs(DEFAULT_PORT + 1).map_err(|e| {
                Fail(
                    EX_USAGE,
                    format!(
                        "{}: {e}",
                        named("admin_addr", "--admin-addr", "RINGLOCK_ADMIN_ADDR")
                    ),
                )
            })?),
            None => None,
        };
        let retry = if cli.retry.is_zero() {
            RetryPolicy::none()
        } else {
            RetryPolicy {
                max_elapsed: cli.retry,
                ..RetryPolicy::default()
            }
        };
        let build = |retry: RetryPolicy, quick: bool| {
            let mut b = Client::builder(lock.as_slice())
                .source(source.clone())
                .retry(retry);
            if let Some(admin) = &admin {
                b = b.admin_addr(admin.as_slice());
            }
            if quick {
                b = b
                    .connect_timeout(Duration::from_secs(1))
                    .io_timeout(Duration::from_secs(2));
            }
            b.build()
                .map_err(|e| client_fail(&e, &named("source", "--source", "RINGLOCK_SOURCE")))
        };
        Ok(Conn {
            client: build(retry, false)?,
            probe: build(RetryPolicy::none(), true)?,
        })
    }

    /// One quick `KEYS`, or `None` when the admin port does not answer.
    fn keys_for_notes(&self) -> Option<Vec<KeyInfo>> {
        self.probe.keys().ok()
    }

    /// Whether any held key matches, or `None` when that cannot be known.
    fn held(&self, pred: impl Fn(&KeyInfo) -> bool) -> Option<bool> {
        self.keys_for_notes().map(|t| t.iter().any(pred))
    }

    /// "source S (endpoint E) for 1m05s", or why that is unknown.
    fn holder_of(&self, key: &[u8]) -> String {
        match self.probe.keys() {
            Ok(list) => match list.iter().find(|k| k.key == key) {
                Some(k) => format!(
                    "source {} (endpoint {}) for {}",
                    bytes::escape(&k.source),
                    bytes::escape(k.endpoint.as_bytes()),
                    keys::format_held(k.held_for(SystemTime::now()))
                ),
                None => "someone else (no longer listed: it may be free now)".into(),
            },
            Err(e) => format!("someone else (who is unknown: {e})"),
        }
    }
}

fn fmt_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        keys::format_held(d)
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

fn lock_and_run(
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

    run_while_held(argv, || {
        guard.release().map_err(|e| {
            format!(
                "releasing {shown} failed: {e} (use `ringlock unlock {}`)",
                shell_key(key)
            )
        })
    })
}

/// Runs the command while the lock is held, then releases it (`release`
/// says why it could not). The command's exit status is the result; a
/// failed release turns a successful command into EX_IOERR.
fn run_while_held(
    argv: &[OsString],
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
        run_child(argv)
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

/// `--addr mysql://USER[:PASSWORD]@HOST[:PORT]`: `lock` and `try-lock` over
/// MySQL/MariaDB `GET_LOCK` (the `mysql` cargo feature), with the same exit
/// codes. The lock lives in the session: the server frees it when the
/// connection ends, so `unlock`, `reset` and `keys` do not apply.
fn mysql_cmd(cli: &Cli, fmt: KeyFormat) -> Result<u8, Fail> {
    let (key, timeout, command, try_only) = match &cli.cmd {
        Cmd::Lock {
            key,
            timeout,
            command,
        } => (key, *timeout, command, timeout.is_some_and(|t| t.is_zero())),
        Cmd::TryLock { key, command } => (key, None, command, true),
        _ => {
            return Err(usage(
                "only `lock` and `try-lock` work over mysql:// (a MySQL lock belongs to the session that holds it)",
            ))
        }
    };
    let key = key_arg(key, fmt)?;
    let key = String::from_utf8(key).map_err(|_| usage("a MySQL lock name must be UTF-8 text"))?;
    mysql_lock_and_run(&cli.addr, &key, timeout, command, try_only)
}

#[cfg(not(feature = "mysql"))]
fn mysql_lock_and_run(
    _addr: &str,
    _key: &str,
    _timeout: Option<Duration>,
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
    argv: &[OsString],
    try_only: bool,
) -> Result<u8, Fail> {
    use ringlock::lease::{Error as LErr, LockOptions as LOpts};
    let locker =
        ringlock::mysql::Locker::from_url(addr).map_err(|e| usage(format!("--addr: {e}")))?;
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
        match locker.try_lock(key) {
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
        let result = locker.lock_with(key, wait, &LOpts::new().cancel(token.clone()));
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
    run_while_held(argv, || {
        lease.release().map_err(|e| {
            format!("releasing {key} failed: {e} (the server frees it when the session ends)")
        })
    })
}

/// Parses `250ms`, `10s`, `1.5m`, `2h` or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let bad = || format!("bad duration {text:?} (examples: 250ms, 10s, 1.5m, 2h)");
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * scale < 1e9 => {
            Ok(Duration::from_secs_f64(v * scale))
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    fn parse(args: &[&str]) -> Result<Cli, u8> {
        let argv = std::iter::once("ringlock").chain(args.iter().copied());
        parse_args(argv.map(OsString::from))
            .map(|(cli, _)| cli)
            .map_err(|Fail(code, _)| code)
    }

    #[test]
    fn parses_commands() {
        let cli = parse(&[
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
        .expect("valid");
        assert_eq!(cli.addr, "h:1");
        assert_eq!(cli.source.as_deref(), Some(OsStr::new("me")));
        match cli.cmd {
            Cmd::Lock {
                key,
                timeout,
                command,
            } => {
                assert_eq!(key, "k");
                assert_eq!(timeout, Some(Duration::from_secs(2)));
                assert_eq!(command, ["sh", "-c", "exit 3"]);
            }
            other => panic!("lock expected, got {other:?}"),
        }
        assert!(matches!(
            parse(&["reset", "--source", "s"]).ok().map(|c| c.cmd),
            Some(Cmd::Reset {
                by_source: Some(_),
                ..
            })
        ));
        assert!(matches!(
            parse(&["keys", "-d", "--older-than", "5m"]).ok().map(|c| c.cmd),
            Some(Cmd::Keys { dates: true, json: false, older_than: Some(d) }) if d == Duration::from_secs(300)
        ));
        for bad in [
            &["lock", "k"][..],
            &["lock"],
            &["lock", "--", "echo", "hi"],
            &["lock", "k", "echo", "hi"],
            &[],
            &["frob"],
            &["unlock", "a", "b"],
            &["reset"],
            &["reset", "k", "--source", "s"],
            &["keys", "--nope"],
            &["--retry", "soon", "keys"],
            &["completions", "tcsh"],
        ] {
            assert_eq!(parse(bad).err(), Some(EX_USAGE), "{bad:?}");
        }
    }

    #[test]
    fn key_formats() {
        assert_eq!(
            arg_bytes(OsStr::new("a\\x20b"), KeyFormat::Raw).as_deref(),
            Ok(&b"a\\x20b"[..])
        );
        assert_eq!(
            arg_bytes(OsStr::new("a\\x20b"), KeyFormat::Escaped).as_deref(),
            Ok(&b"a b"[..])
        );
        assert_eq!(
            arg_bytes(OsStr::new("ff00"), KeyFormat::Hex).as_deref(),
            Ok(&b"\xff\x00"[..])
        );
        assert!(arg_bytes(OsStr::new("\\q"), KeyFormat::Escaped).is_err());
        assert!(key_arg(OsStr::new(""), KeyFormat::Raw).is_err());
        assert!(key_arg(OsStr::new(&"k".repeat(128)), KeyFormat::Raw).is_err());
        assert_eq!(shell_key(b"deploy/prod"), "deploy/prod");
        assert_eq!(shell_key(b"a b'c"), "--key-format escaped 'a\\x20b'\\''c'");
    }
}
