//! `ringlock`: the command-line client, a distributed flock(1).
//!
//! ```text
//! ringlock [OPTIONS] lock [--timeout D] [--ttl D | --persistent] [--kill-after D]
//!          [--keepalive D] [--ping-timeout D] KEY -- CMD [ARGS...]
//! ringlock [OPTIONS] try-lock [--ttl D | --persistent] [--kill-after D]
//!          [--keepalive D] [--ping-timeout D] KEY -- CMD [ARGS...]
//! ringlock [OPTIONS] unlock KEY
//! ringlock [OPTIONS] reset KEY...
//! ringlock [OPTIONS] reset --source SRC
//! ringlock [OPTIONS] keys [-d] [--json] [--older-than D]
//! ringlock [--admin-addr A,B,C] cluster status [--json] [--timeout D]
//! ringlock [--admin-addr A,B,C] cluster transfer-leader | add | remove | replace ...
//! ringlock cert create-ca | create-node | create-client | list --certs-dir DIR ...
//! ringlock completions SHELL [--dir DIR] | ringlock man [--dir DIR]
//! ```
//!
//! Parsing is clap's; everything a user can get wrong ends with exactly one
//! line on stderr starting `ringlock: ` and exit 64, before any traffic.
//! Exit codes are listed in [`args::EXIT_STATUS`] and docs/client.md.
//!
//! `lock` and `try-lock` hold a *session* lock by default (the server frees
//! it the moment this process's connection closes, `kill -9` included), a
//! lease with `--ttl` (extended every TTL/3 while CMD runs) or a
//! Locking-Center lock with `--persistent`. A session or lease lock (or a
//! MySQL lock, `--addr mysql://…`) that is lost while CMD runs stops CMD
//! (see `child`) and exits [`EX_LOST`], by one path for every backend
//! ([`held::run_under_lease`]).

mod args;
mod bytes;
mod cert;
mod child;
mod cluster;
mod cluster_cmd;
mod conn;
mod discover;
mod docfiles;
mod held;
mod keys;
mod members;
mod mysql_backend;
mod persistent;
mod retry;
mod session;
mod tlsopt;

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::CommandFactory;
use ringlock::client::{Error, Wait, DEFAULT_PORT, KEY_LEN_MAX, SOURCE_LEN_MAX};

use args::{parse_args, Cli, ClusterCmd, Cmd, KeyFormat};
use child::got_signal;
use cluster_cmd::{cluster_nodes, cluster_status, cluster_transfer};
use conn::{listed, reset_listed, Conn};
use mysql_backend::mysql_cmd;
use persistent::lock_and_run;
use session::session_lock_and_run;

pub(crate) const EX_USAGE: u8 = 64;
pub(crate) const EX_UNAVAILABLE: u8 = 69;
pub(crate) const EX_SOFTWARE: u8 = 70;
pub(crate) const EX_IOERR: u8 = 74;
pub(crate) const EX_TEMPFAIL: u8 = 75;
pub(crate) const EX_CONFIG: u8 = 78;
pub(crate) const EX_PROTOCOL: u8 = 76;
/// The session or lease lock was lost while CMD ran (CMD was stopped).
pub(crate) const EX_LOST: u8 = 79;
pub(crate) const EX_CANNOT_EXEC: u8 = 126;
pub(crate) const EX_NOT_FOUND: u8 = 127;

/// A failure that ends the process: exit code and its one-line message.
pub(crate) struct Fail(pub u8, pub String);

pub(crate) fn usage(msg: impl std::fmt::Display) -> Fail {
    Fail(EX_USAGE, format!("{msg} (see ringlock --help)"))
}

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

fn main() -> ExitCode {
    match run(std::env::args_os()) {
        Ok(code) => ExitCode::from(code),
        Err(Fail(code, msg)) => {
            let hint = if code == EX_UNAVAILABLE {
                retry::hint()
            } else {
                ""
            };
            let _ = writeln!(io::stderr(), "ringlock: {msg}{hint}");
            ExitCode::from(code)
        }
    }
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
        Cmd::Completions { shell, dir } => {
            return docfiles::completions(Cli::command(), *shell, dir.as_deref(), &out);
        }
        Cmd::Man { dir } => return docfiles::man(Cli::command(), dir.as_deref(), &out),
        Cmd::Cert { cmd } => return cert::run(cmd),
        _ => tlsopt::init(cli.certs_dir.as_deref(), cli.client.as_deref())?,
    }
    match &cli.cmd {
        Cmd::Cluster {
            cmd: ClusterCmd::Status { json, timeout },
        } => return cluster_status(&cli, &matches, *json, *timeout),
        Cmd::Cluster {
            cmd: ClusterCmd::TransferLeader { node, timeout },
        } => return cluster_transfer(&cli, &matches, node.unwrap_or(0), *timeout),
        Cmd::Cluster { cmd } => {
            let (op, timeout) = match cmd {
                ClusterCmd::Add {
                    node,
                    addr,
                    timeout,
                } => (
                    members::Op::Add {
                        node: *node,
                        addr: addr.clone(),
                    },
                    *timeout,
                ),
                ClusterCmd::Remove { node, timeout } => {
                    (members::Op::Remove { node: *node }, *timeout)
                }
                ClusterCmd::Replace {
                    old,
                    new,
                    addr,
                    timeout,
                } => (
                    members::Op::Replace {
                        old: *old,
                        new: *new,
                        addr: addr.clone(),
                    },
                    *timeout,
                ),
                ClusterCmd::Status { .. } | ClusterCmd::TransferLeader { .. } => {
                    unreachable!("answered above")
                }
            };
            let (nodes, auth) = cluster_nodes(&cli, &matches)?;
            return members::run(&nodes, auth.as_deref(), timeout, op);
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
            hold,
            command,
        } => {
            let key = key_arg(key, fmt)?;
            // flock -w 0: never queue behind a holder.
            let try_only = timeout.is_some_and(|t| t.is_zero());
            if hold.persistent {
                let t = if try_only { None } else { *timeout };
                return lock_and_run(&conn, &key, t, command, try_only);
            }
            let wait = match timeout {
                _ if try_only => Wait::Try,
                Some(t) => Wait::For(*t),
                None => Wait::Forever,
            };
            session_lock_and_run(&conn, &key, wait, hold, command)
        }
        Cmd::TryLock { key, hold, command } => {
            let key = key_arg(key, fmt)?;
            if hold.persistent {
                return lock_and_run(&conn, &key, None, command, true);
            }
            session_lock_and_run(&conn, &key, Wait::Try, hold, command)
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
            force,
        } => {
            // Check every key before sending any, so a typo resets nothing.
            let keys = keys
                .iter()
                .map(|k| key_arg(k, fmt))
                .collect::<Result<Vec<_>, _>>()?;
            if !force {
                // Only the keys asked for are kept from the listing.
                match conn.client.keyx_stream().and_then(|s| listed(s, &keys)) {
                    Ok(list) => return reset_listed(&conn, &keys, &list),
                    // A server without KEYX (Locking-Center) has no
                    // compare-and-reset either: a plain reset, said so.
                    Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        note("the server has no compare-and-reset (KEYX); resetting whoever holds each key");
                    }
                    Err(e) => return Err(client_fail(&e, "reset: listing the holders")),
                }
            }
            let table = conn.keys_for_notes(&keys);
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
            // KEYX has token, mode and lease; a server without it (the
            // original Locking-Center) closes at once, and KEYS still works.
            let stream = match conn.client.keyx_stream() {
                Ok(stream) => stream,
                Err(Error::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => conn
                    .client
                    .keys_stream()
                    .map_err(|e| client_fail(&e, "keys (admin port)"))?,
                Err(e) => return Err(client_fail(&e, "keys (admin port)")),
            };
            let now = SystemTime::now();
            let extended = stream.extended();
            // Each key is written as it arrives: memory does not grow with
            // the number of keys.
            let listed = stream.filter(|k| match (k, older_than) {
                (Ok(k), Some(min)) => k.held_for(now) >= *min,
                _ => true,
            });
            let printer = if *json {
                keys::Printer::json(now, extended)
            } else {
                keys::Printer::table(now, *dates, extended)
            };
            let mut stdout = io::BufWriter::with_capacity(64 << 10, io::stdout().lock());
            let done = printer.print(listed, &mut stdout);
            let flushed = stdout.flush();
            match done.and(flushed.map_err(keys::Stop::Output)) {
                Ok(()) => Ok(0),
                // A closed pipe (`ringlock keys | head`) is not an error
                // worth a line.
                Err(keys::Stop::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => Ok(0),
                Err(keys::Stop::Output(e)) => {
                    Err(Fail(EX_IOERR, format!("keys: writing the listing: {e}")))
                }
                Err(keys::Stop::Listing { err, written: 0 }) => {
                    Err(client_fail(&err, "keys (admin port)"))
                }
                Err(keys::Stop::Listing { err, written }) => Err(client_fail(
                    &err,
                    &format!("keys (admin port): the listing stopped after {written} keys"),
                )),
            }
        }
        Cmd::Completions { .. } | Cmd::Man { .. } | Cmd::Cluster { .. } | Cmd::Cert { .. } => {
            unreachable!("handled above")
        }
    }
}

/// A note on a successful command (stderr, exit status unchanged).
pub(crate) fn note(msg: &str) {
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
pub(crate) fn key_arg(arg: &OsStr, fmt: KeyFormat) -> Result<Vec<u8>, Fail> {
    let key = arg_bytes(arg, fmt).map_err(|e| usage(format!("key {e}")))?;
    if key.is_empty() || key.len() > KEY_LEN_MAX {
        let err = Error::InvalidKey { len: key.len() };
        return Err(client_fail(&err, &format!("key '{}'", bytes::escape(&key))));
    }
    Ok(key)
}

/// How to give `key` back on a command line, for messages.
pub(crate) fn shell_key(key: &[u8]) -> String {
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

pub(crate) fn fmt_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        keys::format_held(d)
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests;
