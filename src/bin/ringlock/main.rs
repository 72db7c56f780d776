//! `ringlock`: the command-line client, a distributed flock(1).
//!
//! ```text
//! ringlock [OPTIONS] lock [--timeout D] [--ttl D | --persistent] [--shared | --limit N]
//!          [--kill-after D] [--keepalive D] [--ping-timeout D] KEY -- CMD [ARGS...]
//! ringlock [OPTIONS] try-lock [--ttl D | --persistent] [--shared | --limit N]
//!          [--kill-after D] [--keepalive D] [--ping-timeout D] KEY -- CMD [ARGS...]
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
//! Locking-Center lock with `--persistent`; exclusive unless `--shared`
//! (a reader among any number) or `--limit N` (one of at most N holders),
//! which only a server that offers them takes (never asked for an
//! exclusive lock instead). A session or lease lock (or a
//! MySQL lock, `--addr mysql://…`) that is lost while CMD runs stops CMD
//! (see `child`) and exits [`EX_LOST`](exit::EX_LOST), by one path for
//! every backend ([`held::run_under_lease`]).

mod args;
mod bytes;
mod cert;
mod child;
mod cluster;
mod cluster_cmd;
mod conn;
mod discover;
mod docfiles;
mod exit;
mod failure;
mod held;
mod keys;
mod members;
mod mysql_backend;
mod persistent;
mod retry;
mod session;
mod show;
mod tlsopt;
mod watch;

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{ArgMatches, CommandFactory};
use ringlock::client::session::SOURCE_LEN_MAX as SESSION_SOURCE_LEN_MAX;
use ringlock::client::{Error, Wait, SOURCE_LEN_MAX};

use args::{arg_bytes, key_arg, parse_args, Cli, ClusterCmd, Cmd, KeyFormat};
use cluster_cmd::{cluster_nodes, cluster_status, cluster_transfer};
use conn::{holders_stream, listed, reset_listed, Conn};
use exit::{note, usage, Fail, EX_IOERR, EX_UNAVAILABLE};
use failure::client_fail;
use mysql_backend::mysql_cmd;
use persistent::lock_and_run;
use session::session_lock_and_run;

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
    if let Some(code) = run_without_lock_port(&cli, &matches)? {
        return Ok(code);
    }
    let fmt = cli.key_format;
    let source = match &cli.source {
        Some(s) => arg_bytes(s, fmt).map_err(|e| usage(format!("--source: {e}")))?,
        None => Vec::new(),
    };
    if ringlock::mysql::is_mysql_addr(&cli.addr) {
        return mysql_cmd(&cli, fmt);
    }
    let source = session_source(&cli, fmt, source)?;
    let conn = Conn::new(&cli, &matches, source)?;
    run_on_conn(&cli, &conn, fmt)
}

/// The commands that need no lock port (`completions`, `man`, `cert`,
/// `cluster`): their exit status; `None` for the others, once the TLS
/// options are read.
fn run_without_lock_port(cli: &Cli, matches: &ArgMatches) -> Result<Option<u8>, Fail> {
    let out = |text: &[u8]| {
        // A closed pipe (`ringlock keys | head`) is not an error worth a line.
        let _ = io::stdout().write_all(text);
    };
    match &cli.cmd {
        Cmd::Completions { shell, dir } => {
            return docfiles::completions(Cli::command(), *shell, dir.as_deref(), &out).map(Some);
        }
        Cmd::Man { dir } => return docfiles::man(Cli::command(), dir.as_deref(), &out).map(Some),
        Cmd::Cert { cmd } => return cert::run(cmd).map(Some),
        _ => tlsopt::init(cli.certs_dir.as_deref(), cli.client.as_deref())?,
    }
    match &cli.cmd {
        Cmd::Cluster {
            cmd: ClusterCmd::Status { json, timeout },
        } => cluster_status(cli, matches, *json, *timeout).map(Some),
        Cmd::Cluster {
            cmd: ClusterCmd::TransferLeader { node, timeout },
        } => cluster_transfer(cli, matches, node.unwrap_or(0), *timeout).map(Some),
        Cmd::Cluster { cmd } => cluster_members(cli, matches, cmd).map(Some),
        _ => Ok(None),
    }
}

/// The source the session goes by: `--source` (`source`, at most
/// [`SESSION_SOURCE_LEN_MAX`] bytes), or a candidate's VALUE for `elect`.
fn session_source(cli: &Cli, fmt: KeyFormat, source: Vec<u8>) -> Result<Vec<u8>, Fail> {
    // A session's source may be up to 255 bytes; a persistent lock's (the
    // Locking-Center lock port's) up to 127, checked where one is taken.
    if source.len() > SESSION_SOURCE_LEN_MAX {
        return Err(usage(format!(
            "--source: at most {SESSION_SOURCE_LEN_MAX} bytes, got {}",
            source.len()
        )));
    }
    // A candidate's value is its session's source.
    match &cli.cmd {
        Cmd::Elect {
            value: Some(v),
            listen: false,
            ..
        } => {
            if cli.source.is_some() {
                return Err(usage(
                    "elect: VALUE is the candidate's source; --source (or RINGLOCK_SOURCE) is not used",
                ));
            }
            let v = arg_bytes(v, fmt).map_err(|e| usage(format!("elect VALUE: {e}")))?;
            if v.is_empty() || v.len() > SESSION_SOURCE_LEN_MAX {
                return Err(usage(format!(
                    "elect VALUE: 1 to {SESSION_SOURCE_LEN_MAX} bytes, got {}",
                    v.len()
                )));
            }
            Ok(v)
        }
        _ => Ok(source),
    }
}

/// The commands that talk to the lock port, over `conn`.
fn run_on_conn(cli: &Cli, conn: &Conn, fmt: KeyFormat) -> Result<u8, Fail> {
    match &cli.cmd {
        Cmd::Lock {
            key,
            timeout,
            hold,
            command,
        } => lock_cmd(conn, &key_arg(key, fmt)?, *timeout, hold, command),
        Cmd::TryLock { key, hold, command } => {
            let key = key_arg(key, fmt)?;
            if hold.persistent {
                persistent_source(conn)?;
                return lock_and_run(conn, &key, None, command, true);
            }
            session_lock_and_run(conn, &key, Wait::Try, hold, command)
        }
        Cmd::Unlock { key } => unlock(conn, key, fmt),
        Cmd::Reset {
            keys,
            by_source: None,
            force,
        } => reset_keys(conn, keys, force, fmt),
        Cmd::Reset {
            by_source: Some(src),
            ..
        } => reset_source(conn, src, fmt),
        Cmd::Keys {
            dates,
            json,
            older_than,
        } => list_keys(conn, dates, json, older_than),
        Cmd::Watch { key, json, count } => watch::run(conn, &key_arg(key, fmt)?, *json, *count),
        Cmd::Elect {
            listen: true,
            name,
            json,
            count,
            ..
        } => watch::listen(conn, &key_arg(name, fmt)?, *json, *count),
        Cmd::Elect {
            name,
            timeout,
            kill_after,
            keepalive,
            ping_timeout,
            command,
            ..
        } => {
            let key = key_arg(name, fmt)?;
            let wait = match timeout {
                Some(t) if t.is_zero() => Wait::Try,
                Some(t) => Wait::For(*t),
                None => Wait::Forever,
            };
            let hold = args::HoldArgs {
                ttl: None,
                persistent: false,
                shared: false,
                limit: None,
                kill_after: *kill_after,
                keepalive: *keepalive,
                ping_timeout: *ping_timeout,
            };
            session_lock_and_run(conn, &key, wait, &hold, command)
        }
        Cmd::Completions { .. } | Cmd::Man { .. } | Cmd::Cluster { .. } | Cmd::Cert { .. } => {
            unreachable!("handled above")
        }
    }
}

/// `lock`: a session, lease or persistent lock on `key` while `command`
/// runs; `--timeout 0` only tries.
fn lock_cmd(
    conn: &Conn,
    key: &[u8],
    timeout: Option<Duration>,
    hold: &args::HoldArgs,
    command: &[OsString],
) -> Result<u8, Fail> {
    // flock -w 0: never queue behind a holder.
    let try_only = timeout.is_some_and(|t| t.is_zero());
    if hold.persistent {
        persistent_source(conn)?;
        let t = if try_only { None } else { timeout };
        return lock_and_run(conn, key, t, command, try_only);
    }
    let wait = match timeout {
        _ if try_only => Wait::Try,
        Some(t) => Wait::For(t),
        None => Wait::Forever,
    };
    session_lock_and_run(conn, key, wait, hold, command)
}

/// `cluster add`, `remove` and `replace`: a membership change of every
/// shard's group.
fn cluster_members(cli: &Cli, matches: &ArgMatches, cmd: &ClusterCmd) -> Result<u8, Fail> {
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
        ClusterCmd::Remove { node, timeout } => (members::Op::Remove { node: *node }, *timeout),
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
    let (nodes, auth) = cluster_nodes(cli, matches)?;
    members::run(&nodes, auth.as_deref(), timeout, op)
}

/// `unlock KEY`, with a note when KEY was not held.
fn unlock(conn: &Conn, key: &OsStr, fmt: KeyFormat) -> Result<u8, Fail> {
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

/// `reset KEY...`: compare-and-reset of the holders listed first, unless
/// `--force` (or the server has no KEYX), with a note for each key that was
/// not held.
fn reset_keys(conn: &Conn, keys: &[OsString], force: &bool, fmt: KeyFormat) -> Result<u8, Fail> {
    // Check every key before sending any, so a typo resets nothing.
    let keys = keys
        .iter()
        .map(|k| key_arg(k, fmt))
        .collect::<Result<Vec<_>, _>>()?;
    if !force {
        // Only the keys asked for are kept from the listing.
        match holders_stream(&conn.client).and_then(|s| listed(s, &keys)) {
            Ok(list) => return reset_listed(conn, &keys, &list),
            // A server without KEYX (Locking-Center) has no
            // compare-and-reset either: a plain reset, said so.
            Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                note(
                    "the server has no compare-and-reset (KEYX); resetting whoever holds each key",
                );
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

/// A persistent lock is a Locking-Center lock: its source (`--source`)
/// is at most 127 bytes.
fn persistent_source(conn: &Conn) -> Result<(), Fail> {
    if conn.source.len() > SOURCE_LEN_MAX {
        return Err(usage(format!(
            "--source: a persistent lock's (the Locking-Center lock port's) is at most \
             {SOURCE_LEN_MAX} bytes, got {}",
            conn.source.len()
        )));
    }
    Ok(())
}

/// `reset --source SRC`, with a note when SRC held nothing. A SRC of
/// 128..=255 bytes (a session's) is reset by the admin port's RSBS.
fn reset_source(conn: &Conn, src: &OsStr, fmt: KeyFormat) -> Result<u8, Fail> {
    let src = arg_bytes(src, fmt).map_err(|e| usage(format!("--source: {e}")))?;
    if src.len() > SESSION_SOURCE_LEN_MAX {
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

/// `keys`: the held keys as a table or JSON, written as they arrive.
fn list_keys(
    conn: &Conn,
    dates: &bool,
    json: &bool,
    older_than: &Option<Duration>,
) -> Result<u8, Fail> {
    // KEYH lists every holder with token, mode, lease and access; a
    // server without it has KEYX (one holder a key, no access), and one
    // without that either (the original Locking-Center) closes at once:
    // KEYS still works there.
    let stream = match holders_stream(&conn.client) {
        Ok(stream) => stream,
        Err(Error::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => conn
            .client
            .keys_stream()
            .map_err(|e| client_fail(&e, "keys (admin port)"))?,
        Err(e) => return Err(client_fail(&e, "keys (admin port)")),
    };
    let now = SystemTime::now();
    let form = stream.form();
    // Each key is written as it arrives: memory does not grow with
    // the number of keys.
    let listed = stream.filter(|k| match (k, older_than) {
        (Ok(k), Some(min)) => k.held_for(now) >= *min,
        _ => true,
    });
    let printer = if *json {
        keys::Printer::json(now, form)
    } else {
        keys::Printer::table(now, *dates, form)
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
        Err(keys::Stop::Listing { err, written: 0 }) => Err(client_fail(&err, "keys (admin port)")),
        Err(keys::Stop::Listing { err, written }) => Err(client_fail(
            &err,
            &format!("keys (admin port): the listing stopped after {written} keys"),
        )),
    }
}

#[cfg(test)]
mod tests;
