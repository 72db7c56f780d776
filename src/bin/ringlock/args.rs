//! The command line: clap's definitions of every option and subcommand,
//! the help texts, and parsing into one line on any error.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use ringlock::client::{Error, KEY_LEN_MAX};
use ringlock::config::parse_duration;

use crate::exit::{usage, Fail, EX_USAGE};
use crate::failure::client_fail;
use crate::{bytes, cert};

pub(crate) const EXIT_STATUS: &str = "\
Exit status:
  CMD's own status for lock/try-lock (128+N if it died of signal N), else 0
  64   usage error: bad option, address, key or source (nothing was sent)
  69   server unavailable (could not connect within --retry)
  70   internal error
  73   completions --dir, man --dir: DIR or a file in it cannot be created (cert: ringlock cert --help)
  74   i/o error mid-request (or the key could not be released after CMD)
  75   lock not obtained (try-lock or --timeout 0: held; lock: --timeout passed);
       reset: a key changed holder after it was listed (that key was not reset)
  76   the server refused the request or broke the protocol; --shared/--limit: the
       server does not offer them (nothing was sent), or KEY is held with another --limit
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
released or reset, whatever happens to ringlock). --shared holds KEY shared with other --shared
holders, --limit N as one of at most N holders (a semaphore); without either KEY is exclusive.
A server that does not offer them (a ringlockd older than lock modes; mysql://) is never
asked for an exclusive lock instead: ringlock exits 76 (mysql://: 64).
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
pub(crate) struct Cli {
    /// Lock port; a host without a port means port 22119
    #[arg(
        long,
        env = "RINGLOCK_ADDR",
        value_name = "HOST[:PORT]",
        default_value = "127.0.0.1:22119"
    )]
    pub(crate) addr: String,

    /// Admin port, used by `keys` and to say who holds a key [default: each --addr
    /// node's own, as it tells; lock port + 1 from a server that cannot tell];
    /// `cluster` commands take one or more nodes', comma-separated, and find the others
    #[arg(long, env = "RINGLOCK_ADMIN_ADDR", value_name = "HOST[:PORT]")]
    pub(crate) admin_addr: Option<String>,

    /// Source name sent with lock and try-lock (up to 255 bytes; 127 with --persistent), shown by `keys` [default: the server uses your IP]
    #[arg(long, env = "RINGLOCK_SOURCE", value_name = "NAME")]
    pub(crate) source: Option<OsString>,

    /// The server's --auth-token-file secret, for session and --ttl locks
    #[arg(long, env = "RINGLOCK_AUTH_TOKEN_FILE", value_name = "FILE")]
    pub(crate) auth_token_file: Option<PathBuf>,

    /// TLS: a directory holding ca.crt (the CA that signed the servers'
    /// certificates; each server must be dialled by a host its certificate
    /// names), and client.NAME.crt/.key for --client
    #[arg(long, env = "RINGLOCK_CERTS_DIR", value_name = "DIR")]
    pub(crate) certs_dir: Option<PathBuf>,

    /// With --certs-dir: present client.NAME.crt (made by `ringlock cert
    /// create-client`); it stands for the auth token where the server checks it
    #[arg(long, env = "RINGLOCK_CLIENT", value_name = "NAME")]
    pub(crate) client: Option<String>,

    /// Keep retrying an unreachable server for D (0 = one attempt); without
    /// --retry a refused connection (nothing listens) fails at once
    #[arg(long, value_name = "D", default_value = "10s", value_parser = parse_duration)]
    pub(crate) retry: Duration,

    /// How KEY and SRC arguments (and --source) are written
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = KeyFormat::Raw, long_help = KEY_FORMATS)]
    pub(crate) key_format: KeyFormat,

    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum KeyFormat {
    /// The argument's bytes as they are
    Raw,
    /// The escaped form `ringlock keys` prints
    Escaped,
    /// Hex digits, two per byte
    Hex,
}

/// How `lock` and `try-lock` hold the key.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldArgs {
    /// Take a lease of D instead of a session lock: the server frees it D
    /// after the last extend, even while ringlock's connection is open
    /// (ringlock extends it every D/3 while CMD runs)
    #[arg(long, value_name = "D", value_parser = parse_duration, conflicts_with = "persistent")]
    pub(crate) ttl: Option<Duration>,
    /// Locking-Center semantics: KEY stays held if ringlock dies, until a reset
    #[arg(long)]
    pub(crate) persistent: bool,
    /// Hold KEY shared (a reader lock): any number of --shared holders run
    /// at once; an exclusive holder waits for them all, and a waiting one
    /// is not overtaken by later --shared requests
    #[arg(long, conflicts_with_all = ["persistent", "limit"])]
    pub(crate) shared: bool,
    /// Hold one of N slots of KEY (a semaphore): at most N holders run at
    /// once. Every holder and waiter of KEY must give the same N (exit 76
    /// otherwise)
    #[arg(long, value_name = "N", value_parser = parse_limit, conflicts_with = "persistent")]
    pub(crate) limit: Option<u32>,
    /// When the lock is lost while CMD runs, CMD gets SIGTERM, then SIGKILL D later
    #[arg(
        long,
        value_name = "D",
        default_value = "10s",
        value_parser = parse_duration,
        conflicts_with = "persistent"
    )]
    pub(crate) kill_after: Duration,
    /// The lock's keep-alive. ringlockd: the session keep-alive deadline
    /// asked of the server (it may clamp it; it frees the lock D after it
    /// last heard from ringlock, which pings every D/3, at most every 10s)
    /// [default: the server's]. mysql://: how often the lock's session is
    /// pinged [default: 30s]
    #[arg(long, value_name = "D", value_parser = parse_keepalive, conflicts_with = "persistent")]
    pub(crate) keepalive: Option<Duration>,
    /// A keep-alive ping unanswered for D means the lock is lost (CMD is
    /// stopped, exit 79). ringlockd: it can only shorten the session's own
    /// (D/3 of the keep-alive, at most 10s). mysql:// [default: 10s]
    #[arg(long, value_name = "D", value_parser = parse_keepalive, conflicts_with = "persistent")]
    pub(crate) ping_timeout: Option<Duration>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
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
    /// Watch KEY's holders: print them, then one line per change, as it happens
    ///
    /// Lines: EVENT TOKEN MODE ACCESS SOURCE, where EVENT is holder (held
    /// when the watch began), granted, released, expired, reset or
    /// session_ended; MODE session, lease or persistent; ACCESS exclusive,
    /// shared or semaphore/N. A line `resync` (after the connection failed
    /// and the watch began again on a new one) is followed by the holders
    /// as they are then: changes in between are not replayed. Runs until
    /// interrupted or --count changes; exits 69 if the session ends and
    /// cannot be resumed, 76 if the server does not offer watches.
    Watch {
        /// The key to watch
        #[arg(value_name = "KEY")]
        key: OsString,
        /// One JSON object per line: event, key, key_hex, token, mode,
        /// access, slots, source, source_hex (key and source null unless
        /// valid UTF-8 without control characters)
        #[arg(long)]
        json: bool,
        /// Exit 0 after N changes (holder lines are not changes)
        #[arg(long, value_name = "N")]
        count: Option<u64>,
    },
    /// Leader election: campaign for NAME with VALUE and run CMD while leader; --listen prints the leader
    ///
    /// A campaign is a session lock on the key NAME whose source is VALUE
    /// (1 to 255 bytes): candidates are elected in the order they
    /// campaigned, and when the leader's CMD ends, or ringlock dies, its
    /// session ends and the next candidate is elected at once. CMD gets
    /// RINGLOCK_TOKEN, the leadership's fencing token. A leader that loses
    /// its session while CMD runs stops CMD and exits 79, as lock does.
    /// With --listen: print the leader now and on every change (`leader
    /// TOKEN VALUE`, or `none` while nobody leads).
    Elect {
        /// Print the leader on every change instead of campaigning
        #[arg(long, conflicts_with_all = ["value", "timeout"])]
        listen: bool,
        /// With --listen: one JSON object per line
        #[arg(long, requires = "listen")]
        json: bool,
        /// With --listen: exit 0 after N changes of leader
        #[arg(long, value_name = "N", requires = "listen")]
        count: Option<u64>,
        /// Give up campaigning after D and exit 75; 0: only if nobody leads
        #[arg(long, value_name = "D", value_parser = parse_duration)]
        timeout: Option<Duration>,
        /// When leadership is lost while CMD runs, CMD gets SIGTERM, then SIGKILL D later
        #[arg(long, value_name = "D", default_value = "10s", value_parser = parse_duration)]
        kill_after: Duration,
        /// The campaign's session keep-alive (as for lock)
        #[arg(long, value_name = "D", value_parser = parse_keepalive)]
        keepalive: Option<Duration>,
        /// A keep-alive ping unanswered for D loses leadership (as for lock)
        #[arg(long, value_name = "D", value_parser = parse_keepalive)]
        ping_timeout: Option<Duration>,
        /// The election's name (the key campaigned for)
        #[arg(value_name = "NAME")]
        name: OsString,
        /// What the leader proclaims (its source, 1 to 255 bytes)
        #[arg(value_name = "VALUE", required_unless_present = "listen")]
        value: Option<OsString>,
        /// The command to run while leader (after `--`)
        #[arg(value_name = "CMD", last = true, required_unless_present = "listen", num_args = 1..)]
        command: Vec<OsString>,
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
pub(crate) enum ClusterCmd {
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

pub(crate) fn parse_args(
    args: impl IntoIterator<Item = OsString>,
) -> Result<(Cli, ArgMatches), Fail> {
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

/// `--keepalive` and `--ping-timeout`: a duration of 1ms or more, in the
/// whole milliseconds a session's Hello carries (at most 2^32-1 ms, about
/// 49 days).
pub(crate) fn parse_keepalive(text: &str) -> Result<Duration, String> {
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

/// `--limit N`: a semaphore's slot count, 1 or more.
pub(crate) fn parse_limit(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(0) => Err("a semaphore has at least 1 slot".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!(
            "{text:?} is not a slot count from 1 to {}: {e}",
            u32::MAX
        )),
    }
}

/// An argument's bytes in the chosen format.
pub(crate) fn arg_bytes(arg: &OsStr, fmt: KeyFormat) -> Result<Vec<u8>, String> {
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
