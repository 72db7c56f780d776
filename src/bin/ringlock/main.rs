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
//! Exit codes are listed in [`EXIT_STATUS`] and docs/client.md.
//!
//! `lock` and `try-lock` hold a *session* lock by default (the server frees
//! it the moment this process's connection closes, `kill -9` included), a
//! lease with `--ttl` (extended every TTL/3 while CMD runs) or a
//! Locking-Center lock with `--persistent`. A session or lease lock (or a
//! MySQL lock, `--addr mysql://…`) that is lost while CMD runs stops CMD
//! (see `child`) and exits [`EX_LOST`], by one path for every backend
//! ([`run_under_lease`]).

mod bytes;
mod cert;
mod child;
mod cluster;
mod discover;
mod docfiles;
mod keys;
mod members;
mod retry;
mod tlsopt;

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use ringlock::client::{
    Acquire, CancelToken, Client, Error, Hold, KeyInfo, KeyStream, LateGrant, LockOptions,
    RetryPolicy, Session, ToServerAddrs, Wait, DEFAULT_PORT, KEY_LEN_MAX, SOURCE_LEN_MAX,
};
use ringlock::config::parse_duration;
use ringlock::lease::{self, Lease, LostLock};

use child::{got_signal, install_handlers, mask_signals, run_child, CANCEL_FD};

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

const EXIT_STATUS: &str = "\
Exit status:
  CMD's own status for lock/try-lock (128+N if it died of signal N), else 0
  64   usage error: bad option, address, key or source (nothing was sent)
  69   server unavailable (could not connect within --retry)
  70   internal error
  73   completions --dir, man --dir: DIR or a file in it cannot be created (cert: ringlock cert --help)
  74   i/o error mid-request (or the key could not be released after CMD)
  75   lock not obtained (try-lock or --timeout 0: held; lock: --timeout passed);
       reset: a key changed holder after it was listed (that key was not reset)
  76   the server refused the request or broke the protocol
  78   --certs-dir/--client: a certificate or key that does not load
  79   the lock was lost while CMD ran: CMD got SIGTERM (SIGKILL after --kill-after)
       (a session, --ttl or mysql:// lock)
  126  CMD could not be executed;  127  CMD not found (the key was released)
  128+N  interrupted by signal N while waiting (the request was withdrawn)
  cluster status: 0 some node serves and every answer names it the leader of every
       shard; 69 no node answered; 75 no node serves, or the nodes disagree on the
       leader, by --timeout (default 5s: an election is waited out); 76 no node is a
       cluster member

A cluster is found from any of its nodes: without --admin-addr, each --addr node says
its own admin address; `cluster` commands add every member the given nodes list; a
node that does not serve is passed over (a session follows its `not leader`, a
Locking-Center request its directory's leader).

Environment:
  RINGLOCK_ADDR, RINGLOCK_ADMIN_ADDR, RINGLOCK_SOURCE  defaults of --addr, --admin-addr, --source
  RINGLOCK_AUTH_TOKEN_FILE  default of --auth-token-file
  CMD gets RINGLOCK_KEY (the key) and, for session and --ttl locks, RINGLOCK_TOKEN (its fencing token)

Durations: 250ms, 10s, 1.5m, 2h, 50us (a bare number is seconds; ringlockd wants the unit).
lock/try-lock hold a session lock by default: the server frees it when ringlock's connection
closes (kill -9 included) or its keep-alive stops. If ringlock dies, CMD (and its process group)
dies first, whatever the hold. --ttl D takes a lease instead (freed D after
the last extend; ringlock extends every D/3); --persistent a Locking-Center lock (held until
released or reset, whatever happens to ringlock).
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

    /// Admin port, used by `keys` and to say who holds a key [default: each --addr
    /// node's own, as it tells; lock port + 1 from a server that cannot tell];
    /// `cluster` commands take one or more nodes', comma-separated, and find the others
    #[arg(long, env = "RINGLOCK_ADMIN_ADDR", value_name = "HOST[:PORT]")]
    admin_addr: Option<String>,

    /// Source name sent with lock and try-lock, shown by `keys` [default: the server uses your IP]
    #[arg(long, env = "RINGLOCK_SOURCE", value_name = "NAME")]
    source: Option<OsString>,

    /// The server's --auth-token-file secret, for session and --ttl locks
    #[arg(long, env = "RINGLOCK_AUTH_TOKEN_FILE", value_name = "FILE")]
    auth_token_file: Option<PathBuf>,

    /// TLS: a directory holding ca.crt (the CA that signed the servers'
    /// certificates; each server must be dialled by a host its certificate
    /// names), and client.NAME.crt/.key for --client
    #[arg(long, env = "RINGLOCK_CERTS_DIR", value_name = "DIR")]
    certs_dir: Option<PathBuf>,

    /// With --certs-dir: present client.NAME.crt (made by `ringlock cert
    /// create-client`); it stands for the auth token where the server checks it
    #[arg(long, env = "RINGLOCK_CLIENT", value_name = "NAME")]
    client: Option<String>,

    /// Keep retrying an unreachable server for D (0 = one attempt); without
    /// --retry a refused connection (nothing listens) fails at once
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

/// How `lock` and `try-lock` hold the key.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
struct HoldArgs {
    /// Take a lease of D instead of a session lock: the server frees it D
    /// after the last extend, even while ringlock's connection is open
    /// (ringlock extends it every D/3 while CMD runs)
    #[arg(long, value_name = "D", value_parser = parse_duration, conflicts_with = "persistent")]
    ttl: Option<Duration>,
    /// Locking-Center semantics: KEY stays held if ringlock dies, until a reset
    #[arg(long)]
    persistent: bool,
    /// When the lock is lost while CMD runs, CMD gets SIGTERM, then SIGKILL D later
    #[arg(
        long,
        value_name = "D",
        default_value = "10s",
        value_parser = parse_duration,
        conflicts_with = "persistent"
    )]
    kill_after: Duration,
    /// The lock's keep-alive. ringlockd: the session keep-alive deadline
    /// asked of the server (it may clamp it; it frees the lock D after it
    /// last heard from ringlock, which pings every D/3, at most every 10s)
    /// [default: the server's]. mysql://: how often the lock's session is
    /// pinged [default: 30s]
    #[arg(long, value_name = "D", value_parser = parse_keepalive, conflicts_with = "persistent")]
    keepalive: Option<Duration>,
    /// A keep-alive ping unanswered for D means the lock is lost (CMD is
    /// stopped, exit 79). ringlockd: it can only shorten the session's own
    /// (D/3 of the keep-alive, at most 10s). mysql:// [default: 10s]
    #[arg(long, value_name = "D", value_parser = parse_keepalive, conflicts_with = "persistent")]
    ping_timeout: Option<Duration>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Wait for KEY (first come, first served), run CMD, release KEY when CMD ends
    ///
    /// Exits with CMD's status (128+N if it died of signal N). SIGINT, SIGTERM
    /// and SIGHUP are forwarded to CMD; KEY is released after CMD ends,
    /// however it ends. A signal while still waiting withdraws the request
    /// and exits 128+N. A session (default), --ttl or mysql:// lock that is
    /// lost while CMD runs stops CMD (SIGTERM, SIGKILL after --kill-after)
    /// and exits 79.
    Lock {
        /// Give up after D and exit 75; 0 means do not wait at all (like try-lock)
        #[arg(long, value_name = "D", value_parser = parse_duration)]
        timeout: Option<Duration>,
        #[command(flatten)]
        hold: HoldArgs,
        /// The key to hold
        #[arg(value_name = "KEY")]
        key: OsString,
        /// The command to run while holding KEY (after `--`)
        #[arg(value_name = "CMD", last = true, required = true, num_args = 1..)]
        command: Vec<OsString>,
    },
    /// Run CMD holding KEY only if KEY is free right now; otherwise exit 75 and say who holds it
    TryLock {
        #[command(flatten)]
        hold: HoldArgs,
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
        /// Reset whoever holds KEY when the reset arrives. Without it the
        /// holder is listed first and only that holder is reset (by its
        /// fencing token), so a client that took KEY in between keeps it
        #[arg(long, conflicts_with = "by_source")]
        force: bool,
    },
    /// List held keys (admin port): KEY, SOURCE, ENDPOINT, HELD, MODE, TOKEN, LEASE
    ///
    /// MODE is persistent, session or lease; TOKEN the grant's fencing token;
    /// LEASE a lease's time left (`-` otherwise; all three `-` from a server
    /// without KEYX). Keys and sources are printed in the escaped form (\\ \n
    /// \r \t \xNN, \u{HEX}; a space is \x20), so every key is one line and
    /// one column; give a key back with `--key-format escaped`. `--json`
    /// carries the exact bytes.
    Keys {
        /// Also show when each key was acquired (UTC)
        #[arg(short = 'd', long)]
        dates: bool,
        /// Print a JSON array, one object per key: key, key_hex, source,
        /// source_hex, endpoint, acquired_unix_s, held_s, mode, token,
        /// lease_ms_left (key and source are null unless valid UTF-8 without
        /// control characters, the _hex fields always carry the exact bytes;
        /// mode and token are null from a server without KEYX, lease_ms_left
        /// unless the key is a lease)
        #[arg(long)]
        json: bool,
        /// Only keys held for at least D (e.g. 5m): the stuck-lock check
        #[arg(long, value_name = "D", value_parser = parse_duration)]
        older_than: Option<Duration>,
    },
    /// Replicated clusters (ringlockd --peers): status, transfer-leader, add, remove, replace
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// TLS certificates: make the CA and node and client certificates, list them
    #[command(arg_required_else_help = false)]
    Cert {
        #[command(subcommand)]
        cmd: cert::CertCmd,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell), or write it into --dir
    ///
    /// On stdout, or with --dir DIR written to DIR (created if missing)
    /// under the name the shell's completion loader looks for: bash
    /// `ringlock` (e.g. --dir ~/.local/share/bash-completion/completions),
    /// zsh `_ringlock` (a folder of $fpath), fish `ringlock.fish`
    /// (--dir ~/.config/fish/completions). The path written is printed.
    Completions {
        #[arg(value_enum, value_name = "SHELL")]
        shell: clap_complete::Shell,
        /// Write the script into DIR (created if missing) instead of stdout
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Print the man page (roff) on stdout, or write every page into --dir
    ///
    /// Without --dir: ringlock.1 on stdout. With --dir DIR: DIR is created
    /// if missing and ringlock.1 and one page per subcommand
    /// (ringlock-lock.1, ringlock-cluster-status.1, ...) are written into
    /// it, one path printed per page. After `cargo install`:
    /// `ringlock man --dir ~/.cargo/share/man/man1`; man-db then finds
    /// them while ~/.cargo/bin is on PATH (else add the folder above man1
    /// to MANPATH).
    Man {
        /// Write ringlock.1 and every subcommand's page into DIR (created if missing)
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterCmd {
    /// Hand the leadership of every shard to another node, then wait until it serves
    ///
    /// Finds the serving node among the cluster's nodes (--admin-addr, or
    /// --addr, and every member they list), waiting out an election up to
    /// --timeout, asks it to hand over to NODE (default: its most caught-up
    /// follower), and waits up to --timeout for another node to serve every
    /// shard; prints that node. Exit 0 when it does, 75 when it did not in
    /// time or the leader refused (NODE is not a peer, or it is the leader
    /// itself), 69 when no node serves. Use before stopping the leader's
    /// host.
    TransferLeader {
        /// The node to take over (its --node-id); default: the leader's choice
        node: Option<u32>,
        /// How long to wait for a serving node, then for the new one
        #[arg(long, value_name = "D", default_value = "5s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Add a node: it joins as a learner, catches up, then becomes a voter
    ///
    /// Start the new node first (ringlockd --join --node-id NODE --peers ...
    /// with an empty --data-path). Then this asks the serving node (found
    /// from --admin-addr, or --addr, and every member they list; an
    /// election is waited out, up to --timeout) to add NODE as a learner
    /// at ADDR (its Raft address, as in --peers) in every shard, waits
    /// until it holds everything committed (a far-behind node is sent a
    /// snapshot), and promotes it. Running it again finishes an
    /// interrupted add. Exit 0 when NODE is a voter of every shard, 75 when
    /// refused (the message says why: another change in progress, already a
    /// member, ...) or not done within --timeout, 69 when ADDR cannot be
    /// reached from this host or no node serves.
    Add {
        /// The new node's --node-id
        node: u64,
        /// Its Raft address, HOST:PORT (its shard 0; shard g uses PORT + g)
        addr: String,
        /// How long to wait for each step (a serving node, catching up, the change applied)
        #[arg(long, value_name = "D", default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Remove a node from every shard's group (a leader hands over first)
    ///
    /// The removed node stops serving and is no longer replicated to; stop
    /// it afterwards. Refused: removing the last voter, a node that is not a
    /// member, a change while another is in progress. Exit codes as for add.
    Remove {
        /// The node's --node-id
        node: u64,
        /// How long to wait for each step
        #[arg(long, value_name = "D", default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Replace voter OLD by a new node NEW in one joint change
    ///
    /// NEW (started with --join and an empty --data-path) is added as a
    /// learner at ADDR and caught up; then one joint-consensus change makes
    /// NEW a voter and removes OLD together, so the number of voters never
    /// drops. OLD may be down (the usual case: its host died). Exit codes as
    /// for add.
    Replace {
        /// The node that leaves
        old: u64,
        /// The node that takes its place
        new: u64,
        /// NEW's Raft address, HOST:PORT
        addr: String,
        /// How long to wait for each step
        #[arg(long, value_name = "D", default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Each node's role, term, leader, commit and applied index per shard, and each follower's lag
    ///
    /// Asks every node at once: those named by --admin-addr (or, without
    /// it, by --addr) and every other member they list, one second to
    /// connect and two to answer: a node that does not answer is a `down`
    /// row, not a failure. While no node serves or the nodes disagree (an
    /// election), asks again until --timeout. LAG is how many log entries a
    /// follower is behind the leader's log, as the leader reports it (`?`
    /// when the leader did not answer). Exit 0 when some node serves and
    /// every node that answered names it the leader of every shard; 69 when
    /// no node answered; 75 when none serves or they disagree by --timeout;
    /// 76 when none is a cluster member.
    Status {
        /// How long to wait out an election (0: answer at once)
        #[arg(long, value_name = "D", default_value = "5s", value_parser = parse_duration)]
        timeout: Duration,
        /// Print a JSON array, one object per node: addr, up, member, error,
        /// shards (shard, node, role, term, leader, commit, applied,
        /// last_index, serving, lease_valid, lag, followers: node, matched,
        /// lag, active)
        #[arg(long)]
        json: bool,
    },
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

/// clap's message, on one line, with the usage it printed.
fn one_line(err: &clap::Error) -> String {
    if err.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        return "missing command: lock, try-lock, unlock, reset, keys, cluster, cert, completions or man \
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

/// The nodes' admin addresses for `ringlock cluster` and the admin auth
/// token: --admin-addr, or each --addr node's own (as its directory
/// says), and every other member they list (see `discover`).
#[allow(clippy::type_complexity)] // the two things every cluster command needs
fn cluster_nodes(
    cli: &Cli,
    matches: &ArgMatches,
) -> Result<(Vec<(String, Vec<SocketAddr>)>, Option<Vec<u8>>), Fail> {
    let from_env = |id: &str| matches.value_source(id) == Some(ValueSource::EnvVariable);
    let auth = match &cli.auth_token_file {
        Some(path) => {
            Some(read_auth_token(path).map_err(|e| usage(format!("--auth-token-file: {e}")))?)
        }
        None => None,
    };
    let given = match &cli.admin_addr {
        Some(a) => cluster::parse_addrs(
            a,
            if from_env("admin_addr") {
                "RINGLOCK_ADMIN_ADDR"
            } else {
                "--admin-addr"
            },
        )?,
        None => discover::admin_from_lock(
            &cli.addr,
            if from_env("addr") {
                "RINGLOCK_ADDR"
            } else {
                "--addr"
            },
        )?,
    };
    Ok((discover::with_members(given, auth.as_deref()), auth))
}

/// `ringlock cluster transfer-leader [NODE]`: the serving node (waited
/// for, up to `timeout`) hands over; waits (as long) until another node
/// serves every shard.
fn cluster_transfer(
    cli: &Cli,
    matches: &ArgMatches,
    to: u32,
    timeout: Duration,
) -> Result<u8, Fail> {
    let (nodes, auth) = cluster_nodes(cli, matches)?;
    let serving = |answers: &[cluster::NodeAnswer]| -> Option<usize> {
        answers.iter().position(|n| {
            matches!(&n.result, Ok(Some(shards)) if !shards.is_empty() && shards.iter().all(|s| s.serving))
        })
    };
    let t = std::time::Instant::now();
    let old = loop {
        let answers = cluster::query(&nodes, auth.as_deref());
        if let Some(old) = serving(&answers) {
            break old;
        }
        if t.elapsed() >= timeout {
            return Err(Fail(
                EX_UNAVAILABLE,
                format!(
                    "no node serves every shard (waited {}; see ringlock cluster status)",
                    fmt_duration(timeout)
                ),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let b = ringlock::client::Client::builder(nodes[old].1.as_slice())
        .admin_addr(nodes[old].0.as_str())
        .io_timeout(std::time::Duration::from_secs(2));
    let mut b = tlsopt::client(b);
    if let Some(t) = &auth {
        b = b.admin_auth_token(t.clone());
    }
    let client = b.build().map_err(|e| Fail(EX_USAGE, e.to_string()))?;
    if let Err(e) = client.transfer_leader(to) {
        return Err(Fail(
            EX_TEMPFAIL,
            format!(
                "{} refused the hand-over: {e} (is node {to} a peer, other than the leader?)",
                nodes[old].0
            ),
        ));
    }
    let t = std::time::Instant::now();
    let mut asked = t;
    while t.elapsed() < timeout {
        let answers = cluster::query(&nodes, auth.as_deref());
        let now_serving = serving(&answers);
        if now_serving == Some(old) && asked.elapsed() > std::time::Duration::from_millis(700) {
            // The leader serves again: it gave the hand-over up (raft-rs
            // does after an election timeout when the target is not caught
            // up yet, e.g. just promoted on a busy host). Ask again.
            let _ = client.transfer_leader(to);
            asked = std::time::Instant::now();
        }
        if let Some(new) = now_serving.filter(|&n| n != old) {
            let id = match &answers[new].result {
                Ok(Some(shards)) => shards[0].node,
                _ => 0,
            };
            let _ = writeln!(io::stdout(), "node {id} ({}) serves", nodes[new].0);
            return Ok(0);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(Fail(
        EX_TEMPFAIL,
        format!("no other node served within {}", fmt_duration(timeout)),
    ))
}

/// `ringlock cluster status`: every node (`cluster_nodes`) asked at once,
/// again while an election runs (up to `timeout`); the table (or JSON) on
/// stdout, the verdict as exit status with its reason on stderr.
fn cluster_status(
    cli: &Cli,
    matches: &ArgMatches,
    json: bool,
    timeout: Duration,
) -> Result<u8, Fail> {
    let (nodes, auth) = cluster_nodes(cli, matches)?;
    let t = std::time::Instant::now();
    let answers = loop {
        let answers = cluster::query(&nodes, auth.as_deref());
        if cluster::verdict(&answers).0 != EX_TEMPFAIL || t.elapsed() >= timeout {
            break answers;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = if json {
        cluster::to_json(&answers)
    } else {
        cluster::table(&answers) + &cluster::membership(&answers)
    };
    let _ = io::stdout().write_all(text.as_bytes());
    let _ = io::stdout().flush();
    match cluster::verdict(&answers) {
        (0, _) => Ok(0),
        (code, why) => Err(Fail(code, why.unwrap_or_default())),
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
/// default) never delays or fails the command itself. Session locks open
/// their own connection ([`Conn::session`]).
struct Conn {
    client: Client,
    probe: Client,
    /// `--addr` as given (host names kept for TLS verification).
    lock_text: String,
    source: Vec<u8>,
    retry: RetryPolicy,
    /// `--retry` was given on the command line (see `retry`).
    retry_asked: bool,
    auth: Option<Vec<u8>>,
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
        // Resolved here for a message that names the flag; the builders take the text.
        let _lock: Vec<SocketAddr> =
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
        let auth = match &cli.auth_token_file {
            Some(path) => Some(read_auth_token(path).map_err(|e| {
                usage(format!(
                    "{}: {e}",
                    named(
                        "auth_token_file",
                        "--auth-token-file",
                        "RINGLOCK_AUTH_TOKEN_FILE"
                    )
                ))
            })?),
            None => None,
        };
        let retry_asked = matches.value_source("retry") == Some(ValueSource::CommandLine);
        let build = |retry: RetryPolicy, quick: bool| {
            let mut b = Client::builder(cli.addr.as_str())
                .source(source.clone())
                .retry(retry)
                .on_retry(retry::handler(retry_asked));
            if let Some(t) = &auth {
                b = b.admin_auth_token(t.clone());
            }
            if admin.is_some() {
                b = b.admin_addr(cli.admin_addr.as_deref().unwrap_or_default());
            }
            b = tlsopt::client(b);
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
            lock_text: cli.addr.clone(),
            source,
            retry,
            retry_asked,
            auth,
        })
    }

    /// Opens a session with the lock port (retried like every request),
    /// with `--keepalive` and `--ping-timeout` if given. A replicated
    /// session (a cluster's) is resumed on another `--addr` when its
    /// connection fails, so CMD goes on: its locks are lost (and CMD
    /// stopped, exit 79) only if the session ends or the resume does not
    /// keep them. Each resume is noted on stderr.
    fn session(&self, what: &str, hold: &HoldArgs) -> Result<Session, Fail> {
        let mut b = tlsopt::session(Session::builder(self.lock_text.as_str()))
            .source(self.source.clone())
            .retry(self.retry)
            .on_retry(retry::handler(self.retry_asked))
            .on_resume(note);
        if let Some(auth) = &self.auth {
            b = b.auth_token(auth.clone());
        }
        if let Some(k) = hold.keepalive {
            b = b.keepalive(k);
        }
        if let Some(t) = hold.ping_timeout {
            b = b.ping_timeout(t);
        }
        b.connect().map_err(|e| lease_fail(&e, None, what))
    }

    /// The held keys among `keys`, from one quick `KEYS`, or `None` when
    /// the admin port does not answer.
    fn keys_for_notes(&self, keys: &[Vec<u8>]) -> Option<Vec<KeyInfo>> {
        listed(self.probe.keys_stream().ok()?, keys).ok()
    }

    /// Whether any held key matches, or `None` when that cannot be known.
    fn held(&self, pred: impl Fn(&KeyInfo) -> bool) -> Option<bool> {
        for k in self.probe.keys_stream().ok()? {
            if pred(&k.ok()?) {
                return Some(true);
            }
        }
        Some(false)
    }

    /// "source S (endpoint E) for 1m05s", or why that is unknown.
    fn holder_of(&self, key: &[u8]) -> String {
        let found = self.probe.keys_stream().and_then(|mut s| {
            s.find(|k| k.as_ref().map_or(true, |k| k.key == key))
                .transpose()
        });
        match found {
            Ok(Some(k)) => format!(
                "source {} (endpoint {}) for {}",
                bytes::escape(&k.source),
                bytes::escape(k.endpoint.as_bytes()),
                keys::format_held(k.held_for(SystemTime::now()))
            ),
            Ok(None) => "someone else (no longer listed: it may be free now)".into(),
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

/// A session (or `--ttl` lease) lock around CMD: the lock is lost if
/// ringlock's session ends, and a loss while CMD runs stops CMD (`child`)
/// and exits [`EX_LOST`] with one line saying why.
fn session_lock_and_run(
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
    let what = Acquire {
        hold: match hold.ttl {
            Some(ttl) => Hold::Lease(ttl),
            None => Hold::Session,
        },
        wait,
    };
    install_handlers()?;
    // The session's threads (and those they start) inherit a mask that
    // blocks the forwarded signals, so each such signal reaches this
    // thread: the handler's work (cancel the wait, forward to CMD) is
    // ordered with this thread's steps, as in a single-threaded ringlock.
    mask_signals(true);
    let session = conn.session(&format!("{verb} {shown}"), hold);
    mask_signals(false);
    let session = session?;
    let cancel = CancelToken::new().map_err(|e| Fail(EX_SOFTWARE, format!("cancel token: {e}")))?;
    let opts = lease::LockOptions::new()
        .cancel(cancel.clone())
        .on_lost(stop_on_loss(shown.clone(), hold.kill_after));
    CANCEL_FD.store(std::os::fd::AsRawFd::as_raw_fd(&cancel), Ordering::SeqCst);
    if got_signal() != 0 {
        // It arrived before the handler could cancel anything.
        cancel.cancel();
    }
    let result = session.acquire(key, what, &opts);
    CANCEL_FD.store(-1, Ordering::SeqCst);
    let lease = match result {
        Ok(lease) => lease,
        Err(lease::Error::Timeout) => {
            let msg = match wait {
                Wait::For(t) => format!(
                    "lock {shown}: timed out after {}; held by {}",
                    fmt_duration(t),
                    conn.holder_of(key)
                ),
                _ => format!(
                    "{shown} is held by {}; not running the command",
                    conn.holder_of(key)
                ),
            };
            return Err(Fail(EX_TEMPFAIL, msg));
        }
        Err(lease::Error::Cancelled) => {
            return Err(Fail(
                128u8.wrapping_add(got_signal() as u8),
                format!(
                    "{verb} {shown}: interrupted by signal {}, request withdrawn",
                    got_signal()
                ),
            ))
        }
        Err(e) => return Err(lease_fail(&e, Some(&session), &format!("{verb} {shown}"))),
    };
    let token = lease.token().unwrap_or(0);
    // A lease is extended every TTL/3 while CMD runs: two extends may be
    // lost or late before it expires.
    let (stop, stopped) = mpsc::channel::<()>();
    // Blocked from here on (run_while_held keeps them so until CMD runs):
    // the extend thread inherits the mask.
    mask_signals(true);
    let extender = match hold.ttl {
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
    };
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

/// The lost-lock handler of every lock `lock`/`try-lock` holds over a
/// session or MySQL: stops CMD ([`child::lock_lost`]), whatever noticed the
/// loss (a Lost push, a failed ping, a closed connection).
fn stop_on_loss(
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
fn run_under_lease(
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
fn lost_line(shown: &str, lease: &Lease, lost: &LostLock) -> String {
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

/// Exit code and message for a session-path failure.
fn lease_fail(e: &lease::Error, session: Option<&Session>, what: &str) -> Fail {
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
        _ => EX_SOFTWARE,
    };
    Fail(code, format!("{what}: {e}"))
}

/// The entries of a listing whose key is one of `keys`: whatever the
/// number of held keys, only those are kept in memory.
fn listed(stream: KeyStream, keys: &[Vec<u8>]) -> Result<Vec<KeyInfo>, Error> {
    stream
        .filter(|k| k.as_ref().map_or(true, |k| keys.contains(&k.key)))
        .collect()
}

/// `reset KEY...` without `--force`: each held key is reset only if the
/// holder just listed (and shown on stderr) still holds it, by its fencing
/// token; a key that changed holder in between is left alone (exit 75).
fn reset_listed(conn: &Conn, keys: &[Vec<u8>], list: &[KeyInfo]) -> Result<u8, Fail> {
    let mut entries: Vec<(&[u8], u64)> = Vec::new();
    for key in keys {
        match list.iter().find(|k| &k.key == key) {
            Some(k) => {
                note(&format!(
                    "resetting {}: held by {} at {} since {}s ago ({} hold, token {})",
                    bytes::escape(key),
                    bytes::escape(&k.source),
                    bytes::escape(k.endpoint.as_bytes()),
                    k.held_for(std::time::SystemTime::now()).as_secs(),
                    k.mode.name(),
                    k.token
                ));
                entries.push((key.as_slice(), k.token));
            }
            None => note(&format!(
                "{} was not held; nothing was reset",
                bytes::escape(key)
            )),
        }
    }
    if entries.is_empty() {
        return Ok(0);
    }
    let done = conn
        .client
        .reset_if(&entries)
        .map_err(|e| client_fail(&e, "reset"))?;
    let mut changed = false;
    for ((key, token), reset) in entries.iter().zip(done) {
        if !reset {
            changed = true;
            note(&format!(
                "{}: its holder changed after it was listed (token {} no longer holds it); nothing was reset, run reset again to see the new holder",
                bytes::escape(key),
                token
            ));
        }
    }
    Ok(if changed { EX_TEMPFAIL } else { 0 })
}

/// The secret of `--auth-token-file`: the file's bytes without trailing
/// whitespace, 1 to 255 of them (what the server reads from its own).
fn read_auth_token(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let mut bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    while bytes.last().is_some_and(|b| b.is_ascii_whitespace()) {
        bytes.pop();
    }
    if bytes.is_empty() || bytes.len() > 255 {
        return Err(format!(
            "{}: a token is 1 to 255 bytes, got {}",
            path.display(),
            bytes.len()
        ));
    }
    Ok(bytes)
}

/// Runs the command while the lock is held, then releases it (`release`
/// says why it could not). The command's exit status is the result; a
/// failed release turns a successful command into EX_IOERR.
fn run_while_held(
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

/// `--addr mysql://USER[:PASSWORD]@HOST[:PORT]`: `lock` and `try-lock` over
/// MySQL/MariaDB `GET_LOCK` (the `mysql` cargo feature), with the same exit
/// codes. The lock lives in the session: the server frees it when the
/// connection ends, so `unlock`, `reset` and `keys` do not apply.
fn mysql_cmd(cli: &Cli, fmt: KeyFormat) -> Result<u8, Fail> {
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

/// `--keepalive` and `--ping-timeout`: a duration of 1ms or more, in the
/// whole milliseconds a session's Hello carries (at most 2^32-1 ms, about
/// 49 days).
fn parse_keepalive(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d < Duration::from_millis(1) {
        return Err(format!("{text:?} is too short (at least 1ms)"));
    }
    if d.as_millis() > u128::from(u32::MAX) {
        return Err(format!(
            "{text:?} is too long (at most {}ms, about 49 days)",
            u32::MAX
        ));
    }
    Ok(d)
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
                hold,
                command,
            } => {
                assert_eq!(key, "k");
                assert_eq!(timeout, Some(Duration::from_secs(2)));
                assert_eq!(command, ["sh", "-c", "exit 3"]);
                assert_eq!(
                    hold,
                    HoldArgs {
                        ttl: None,
                        persistent: false,
                        kill_after: Duration::from_secs(10),
                        keepalive: None,
                        ping_timeout: None,
                    },
                    "a session lock by default"
                );
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
        match parse(&[
            "try-lock",
            "--ttl",
            "1.5s",
            "--kill-after",
            "2s",
            "k",
            "--",
            "true",
        ])
        .map(|c| c.cmd)
        {
            Ok(Cmd::TryLock { hold, .. }) => assert_eq!(
                hold,
                HoldArgs {
                    ttl: Some(Duration::from_millis(1500)),
                    persistent: false,
                    kill_after: Duration::from_secs(2),
                    keepalive: None,
                    ping_timeout: None,
                }
            ),
            other => panic!("try-lock expected, got {other:?}"),
        }
        assert!(matches!(
            parse(&["lock", "--persistent", "k", "--", "true"]).map(|c| c.cmd),
            Ok(Cmd::Lock {
                hold: HoldArgs {
                    persistent: true,
                    ..
                },
                ..
            })
        ));
        for bad in [
            &["lock", "--ttl", "1s", "--persistent", "k", "--", "true"][..],
            &[
                "lock",
                "--persistent",
                "--kill-after",
                "1s",
                "k",
                "--",
                "true",
            ],
            &["lock", "--ttl", "soon", "k", "--", "true"],
            &["lock", "k"],
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
    fn keepalive_and_ping_timeout() {
        match parse(&[
            "lock",
            "--keepalive",
            "250ms",
            "--ping-timeout",
            "1.5",
            "k",
            "--",
            "true",
        ])
        .map(|c| c.cmd)
        {
            Ok(Cmd::Lock { hold, .. }) => {
                assert_eq!(hold.keepalive, Some(Duration::from_millis(250)));
                assert_eq!(hold.ping_timeout, Some(Duration::from_millis(1500)));
            }
            other => panic!("lock expected, got {other:?}"),
        }
        match parse(&[
            "try-lock",
            "--ttl",
            "3s",
            "--keepalive",
            "2s",
            "k",
            "--",
            "true",
        ])
        .map(|c| c.cmd)
        {
            Ok(Cmd::TryLock { hold, .. }) => {
                assert_eq!(hold.keepalive, Some(Duration::from_secs(2)));
                assert_eq!(hold.ping_timeout, None);
            }
            other => panic!("try-lock expected, got {other:?}"),
        }
        assert_eq!(parse_keepalive("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(
            parse_keepalive("4294967295ms"),
            Ok(Duration::from_millis(u64::from(u32::MAX)))
        );
        assert_eq!(
            parse_keepalive("0"),
            Err("\"0\" is too short (at least 1ms)".into())
        );
        assert_eq!(
            parse_keepalive("0.5ms"),
            Err("\"0.5ms\" is too short (at least 1ms)".into())
        );
        assert!(parse_keepalive("4294967296ms")
            .unwrap_err()
            .contains("is too long (at most 4294967295ms"));
        assert!(parse_keepalive("soon")
            .unwrap_err()
            .contains("bad duration"));
        for bad in [
            &["lock", "--keepalive", "0", "k", "--", "true"][..],
            &["lock", "--ping-timeout", "-1s", "k", "--", "true"],
            &["lock", "--keepalive", "soon", "k", "--", "true"],
            &[
                "lock",
                "--keepalive",
                "1s",
                "--persistent",
                "k",
                "--",
                "true",
            ],
            &[
                "try-lock",
                "--ping-timeout",
                "1s",
                "--persistent",
                "k",
                "--",
                "true",
            ],
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
