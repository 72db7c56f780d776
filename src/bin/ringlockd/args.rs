//! `ringlockd`'s flags: clap's [`Args`] with the help text, the deprecated
//! and command-line-only flags, and the value parsers every source of a
//! setting (flag, variable, file) goes through.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{ArgAction, Parser};
use ringlock::config::{self, LcAdminActions};
use ringlock::log::Level;

pub(super) const AFTER_HELP: &str = "\
Durations are a number and a unit: 250ms, 10s, 1.5m, 2h, 50us. A number without a unit is \
refused (is --keepalive 10 seconds or milliseconds?), except 0.

Each setting is taken from, first found: its flag; its environment variable, RINGLOCK_ and the \
flag's name in capitals with _ for - (--max-keys: RINGLOCK_MAX_KEYS; a switch takes 1/0, \
true/false, yes/no, on/off; an empty variable counts as unset); its key in the --config file; \
its default. --wal-truncate-at, --force-new-cluster and --check-config are command-line flags \
only.

Deprecated, still read, warned about at start (event=deprecated_flag, deprecated_env): \
--liveness-timeout-ms, --idle-timeout-ms, --frame-timeout-ms, --keepalive-ms, \
--min-keepalive-ms, --max-keepalive-ms, --min-ttl-ms, --max-ttl-ms, --bind-retry-ms (a number \
of milliseconds: write --keepalive 10s for --keepalive-ms 10000) and --idle-poll-us \
(microseconds: --idle-poll 50us); the environment variables BIND_ADDRESS and DATA_PATH \
(RINGLOCK_BIND, RINGLOCK_DATA_PATH).

Exit status: 0 after SIGINT/SIGTERM (or --help, --version, a passing --check-config); 64 a \
usage or configuration error (one line on stderr, nothing was opened); 1 a failure at start \
(a port in use, a log refused) or while serving.";

/// The settings, as flags. Durations are whole milliseconds (microseconds
/// for `--idle-poll`); `None` is "not given": the file or the default
/// decides.
#[derive(Parser, Debug)]
#[command(
    name = "ringlockd",
    version,
    about = "ringlockd — a Locking-Center compatible lock server on io_uring",
    after_help = AFTER_HELP,
    args_override_self = true,
    max_term_width = 100
)]
pub(super) struct Args {
    /// Lock port address (default 127.0.0.1:22119; ':22119' means all interfaces)
    ///
    /// No authentication: any client of this port can unlock or reset ANY key
    /// (Locking-Center semantics), so bind it where only trusted hosts reach it.
    #[arg(long, value_name = "ADDR", value_parser = config::parse_addr, help_heading = "Ports")]
    pub(super) bind: Option<SocketAddr>,

    /// Admin port address (default: loopback, lock port + 1)
    #[arg(long, value_name = "ADDR", value_parser = config::parse_addr, help_heading = "Ports")]
    pub(super) admin_bind: Option<SocketAddr>,

    /// Serve Prometheus /metrics and the probes /livez, /readyz, /healthz over HTTP (default: off)
    #[arg(long, value_name = "ADDR", value_parser = config::parse_addr, help_heading = "Ports")]
    pub(super) metrics_bind: Option<SocketAddr>,

    /// /livez (and /readyz, /healthz) fail once an event loop made no progress for D (default 10s, at least 1s)
    #[arg(long, value_name = "D", value_parser = ms(config::LIVENESS_TIMEOUT_MS_MIN, u64::MAX), help_heading = "Ports")]
    pub(super) liveness_timeout: Option<u64>,

    /// Retry binding a port still in use for up to D (default 10s; 0 = no retry)
    ///
    /// While a crashed predecessor's socket is closing, binding is retried; a port a
    /// live process listens on fails at once, naming it.
    #[arg(long, value_name = "D", value_parser = ms(0, u64::MAX), help_heading = "Ports")]
    pub(super) bind_retry: Option<u64>,

    /// Write-ahead log; held keys survive restarts (default: in memory)
    #[arg(long, value_name = "FILE", help_heading = "Storage")]
    pub(super) data_path: Option<PathBuf>,

    /// Drop a corrupt log tail starting at byte OFFSET (command line only)
    ///
    /// The offset the refusal message names; keep a copy of the log first.
    #[arg(long, value_name = "OFFSET", value_parser = byte_offset, help_heading = "Storage")]
    pub(super) wal_truncate_at: Option<u64>,

    /// Never compact the log below N bytes (default 1048576)
    ///
    /// Above it, compact when the log is twice what the held keys need.
    #[arg(long, value_name = "N", value_parser = count(1), help_heading = "Storage")]
    pub(super) compact_floor_bytes: Option<u64>,

    /// Keep N zero-filled bytes ahead of the log's end (default 1048576; 0 = off)
    ///
    /// Rounded up to 4 KiB, so an append overwrites zeros and its fdatasync has no
    /// file size to commit; 0 = off, every append grows the file; else 4096 to 8388608.
    #[arg(long, value_name = "N", value_parser = preallocate, help_heading = "Storage")]
    pub(super) wal_preallocate_bytes: Option<u64>,

    /// Open lock-port connections beyond N are answered '-' and closed (default 10000)
    #[arg(long, value_name = "N", value_parser = count(1), help_heading = "Limits")]
    pub(super) max_connections: Option<u64>,

    /// Admin-port connections, counted apart (default 16)
    ///
    /// So a flood of lock-port connections cannot lock the operator out.
    #[arg(long, value_name = "N", value_parser = count(1), help_heading = "Limits")]
    pub(super) admin_connections: Option<u64>,

    /// Distinct held keys, server-wide (all shards together); a Lock beyond it is answered '-' (default 100000)
    #[arg(long, value_name = "N", value_parser = count(1), help_heading = "Limits")]
    pub(super) max_keys: Option<u64>,

    /// Queued Lock requests, server-wide; beyond it '-' (default 100000)
    #[arg(long, value_name = "N", value_parser = count(1), help_heading = "Limits")]
    pub(super) max_waiters: Option<u64>,

    /// Close a connection with no request in flight and no traffic for D (default 60s; 0 = never)
    ///
    /// Queued waiters are not idle; sessions follow their keep-alive.
    #[arg(long, value_name = "D", value_parser = ms(0, u64::MAX), help_heading = "Limits")]
    pub(super) idle_timeout: Option<u64>,

    /// A request frame must complete within D of its first byte (default 10s)
    #[arg(long, value_name = "D", value_parser = ms(1, u64::MAX), help_heading = "Limits")]
    pub(super) frame_timeout: Option<u64>,

    /// Before an idle event loop sleeps it keeps polling for D (default 50us; 0 = sleep at once; at most 10ms)
    ///
    /// Yielding the CPU between polls, so a request arriving meanwhile finds it awake;
    /// costs up to D of CPU per idle spell; only where every shard has a CPU of its own.
    #[arg(long, value_name = "D", value_parser = us(0, config::IDLE_POLL_US_MAX), help_heading = "Limits")]
    pub(super) idle_poll: Option<u64>,

    /// Shards: event-loop threads, each pinned to one CPU of the affinity mask (default: one per CPU in the mask)
    ///
    /// Keys are spread over them by a fixed hash.
    #[arg(long, value_name = "N", value_parser = threads, help_heading = "Limits")]
    pub(super) threads: Option<usize>,

    /// A session ends when nothing arrives from its client for D, unless its Hello asks for another deadline (default 10s)
    #[arg(long, value_name = "D", value_parser = ms(1, KEEPALIVE_MAX_MS), help_heading = "Sessions and leases")]
    pub(super) keepalive: Option<u64>,

    /// Smallest keep-alive deadline a Hello may ask for (default 300ms)
    #[arg(long, value_name = "D", value_parser = ms(1, KEEPALIVE_MAX_MS), help_heading = "Sessions and leases")]
    pub(super) min_keepalive: Option<u64>,

    /// Largest keep-alive deadline a Hello may ask for (default 10m)
    #[arg(long, value_name = "D", value_parser = ms(1, KEEPALIVE_MAX_MS), help_heading = "Sessions and leases")]
    pub(super) max_keepalive: Option<u64>,

    /// Shortest lease TTL accepted (default 10ms)
    #[arg(long, value_name = "D", value_parser = ms(1, KEEPALIVE_MAX_MS), help_heading = "Sessions and leases")]
    pub(super) min_ttl: Option<u64>,

    /// Longest lease TTL accepted (default 24h)
    #[arg(long, value_name = "D", value_parser = ms(1, KEEPALIVE_MAX_MS), help_heading = "Sessions and leases")]
    pub(super) max_ttl: Option<u64>,

    /// A shared secret: the file's bytes, trailing whitespace removed, 1 to 255 bytes
    ///
    /// Session clients must present it in their Hello, and admin connections must
    /// send AUTH first when --admin-bind is not loopback. (The ringlock CLI reads the
    /// same RINGLOCK_AUTH_TOKEN_FILE.)
    #[arg(long, value_name = "FILE", help_heading = "Security")]
    pub(super) auth_token_file: Option<PathBuf>,

    /// Who may send the Locking-Center Unlock, ResetByKey and ResetBySource on the lock port (default any)
    ///
    /// They have no owner check: every client, clients on loopback, or nobody.
    #[arg(long, value_name = "any|loopback|off", value_parser = lc_admin_actions, help_heading = "Security")]
    pub(super) lc_admin_actions: Option<LcAdminActions>,

    /// ca.crt, node.crt, node.key (made by `ringlock cert`)
    ///
    /// Mutual TLS on every peer (Raft) link, a link's node id taken from its
    /// certificate; TLS on the lock port (sessions need it) and the admin port (TLS
    /// only, a client certificate or the auth token also on loopback); SIGHUP re-reads
    /// the directory. A cluster node needs it unless --insecure (docs/security.md).
    #[arg(long, value_name = "DIR", help_heading = "Security")]
    pub(super) certs_dir: Option<PathBuf>,

    /// With --certs-dir: lock and admin clients must present a client certificate signed by the CA
    #[arg(long, action = ArgAction::SetTrue, value_parser = switch, help_heading = "Security")]
    pub(super) client_cert_auth: bool,

    /// With --certs-dir: still serve plaintext Locking-Center requests on the lock port
    ///
    /// Their clients cannot speak TLS; sessions still need TLS.
    #[arg(long, action = ArgAction::SetTrue, value_parser = switch, help_heading = "Security")]
    pub(super) lc_plaintext: bool,

    /// With --certs-dir: the lock and admin ports also take plaintext clients (sessions, admin commands), as without certificates
    ///
    /// TLS stays available, peer links stay mutual TLS. For a network only trusted
    /// hosts reach; warned at start.
    #[arg(long, action = ArgAction::SetTrue, value_parser = switch, help_heading = "Security")]
    pub(super) client_plaintext: bool,

    /// Cluster mode without certificates: anyone who reaches a Raft port can join, stall, read or rewrite the cluster
    ///
    /// Only for a network nobody else reaches; warned at start, ringlock_insecure 1 in
    /// /metrics.
    #[arg(long, action = ArgAction::SetTrue, value_parser = switch, help_heading = "Security")]
    pub(super) insecure: bool,

    /// Cluster mode: this node's id (1, 2, ...)
    #[arg(long, value_name = "N", value_parser = node_id, help_heading = "Cluster")]
    pub(super) node_id: Option<u64>,

    /// Cluster mode: every node's Raft address, this one's included (default: one node)
    ///
    /// Node n's shard g listens on its PORT + g, so leave --threads ports between
    /// nodes. Needs --node-id and --data-path; every node runs the same --threads and
    /// --peers. Only the leader serves: see docs/cluster.md.
    #[arg(long, value_name = "1=HOST:PORT,...", help_heading = "Cluster")]
    pub(super) peers: Option<String>,

    /// Cluster mode: this node, with an empty --data-path, joins a running cluster
    ///
    /// `ringlock cluster add`/`replace` adds it, instead of founding one with --peers
    /// as voters; ignored once its log holds anything.
    #[arg(long, action = ArgAction::SetTrue, value_parser = switch, help_heading = "Cluster")]
    pub(super) join: bool,

    /// Disaster recovery (cluster mode, command line only): make this node the only voter
    ///
    /// When most nodes are lost for good, start the surviving node with the longest
    /// log with this flag once: it becomes the only voter of every shard, every entry
    /// in its log is kept (committed or not), and its log is rewritten so. Remove the
    /// flag before the next start; add new nodes with `ringlock cluster add`.
    #[arg(long, help_heading = "Cluster")]
    pub(super) force_new_cluster: bool,

    /// Cluster mode: compact each shard's log into a snapshot every N applied entries (default 10000)
    #[arg(long, value_name = "N", value_parser = compact_entries, help_heading = "Cluster")]
    pub(super) raft_compact_entries: Option<u64>,

    /// error | warn | info | debug (default info)
    #[arg(long, value_name = "LEVEL", value_parser = log_level, help_heading = "Configuration")]
    pub(super) log_level: Option<Level>,

    /// Read settings from a TOML file: one `key = value` line per flag, the key spelled as the flag
    ///
    /// keepalive = "10s", max-keys = 100000, join = true, peers = "1=a:22200,2=b:22200".
    /// Strings for addresses, paths and durations, integers for counts, booleans for
    /// switches; an unknown key or a wrong type is refused with its line. Flags and
    /// RINGLOCK_* variables override it. Example: deploy/ringlockd.toml.
    #[arg(long, value_name = "FILE", help_heading = "Configuration")]
    pub(super) config: Option<PathBuf>,

    /// Check the settings (flags, environment, --config file) and print the effective ones as a config file, then exit
    ///
    /// Exit 0 if the server would start with them, 64 (one line on stderr) if not.
    /// Ports, certificates and the log are not opened: those are checked at start.
    #[arg(long, help_heading = "Configuration")]
    pub(super) check_config: bool,

    // Deprecated spellings (hidden; listed after the options in --help).
    #[arg(long, hide = true, value_name = "MS", value_parser = count(config::LIVENESS_TIMEOUT_MS_MIN))]
    pub(super) liveness_timeout_ms: Option<u64>,
    #[arg(long, hide = true, value_name = "MS", value_parser = number)]
    pub(super) bind_retry_ms: Option<u64>,
    #[arg(long, hide = true, value_name = "MS", value_parser = count(0))]
    pub(super) idle_timeout_ms: Option<u64>,
    #[arg(long, hide = true, value_name = "MS", value_parser = count(1))]
    pub(super) frame_timeout_ms: Option<u64>,
    #[arg(long, hide = true, value_name = "US", value_parser = idle_poll_us)]
    pub(super) idle_poll_us: Option<u64>,
    #[arg(long, hide = true, value_name = "MS", value_parser = count(1))]
    pub(super) keepalive_ms: Option<u64>,
    #[arg(long, hide = true, value_name = "MS", value_parser = count(1))]
    pub(super) min_keepalive_ms: Option<u64>,
    #[arg(long, hide = true, value_name = "MS", value_parser = count(1))]
    pub(super) max_keepalive_ms: Option<u64>,
    #[arg(long, hide = true, value_name = "MS", value_parser = count(1))]
    pub(super) min_ttl_ms: Option<u64>,
    #[arg(long, hide = true, value_name = "MS", value_parser = count(1))]
    pub(super) max_ttl_ms: Option<u64>,
}

/// Largest keep-alive and TTL setting: they travel as u32 milliseconds, and
/// u32::MAX means "none".
pub(super) const KEEPALIVE_MAX_MS: u64 = u32::MAX as u64 - 1;

/// Deprecated flag → its replacement (clap ids), and whether it counts
/// microseconds (else milliseconds).
pub(super) const DEPRECATED: [(&str, &str, bool); 10] = [
    ("liveness_timeout_ms", "liveness_timeout", false),
    ("bind_retry_ms", "bind_retry", false),
    ("idle_timeout_ms", "idle_timeout", false),
    ("frame_timeout_ms", "frame_timeout", false),
    ("idle_poll_us", "idle_poll", true),
    ("keepalive_ms", "keepalive", false),
    ("min_keepalive_ms", "min_keepalive", false),
    ("max_keepalive_ms", "max_keepalive", false),
    ("min_ttl_ms", "min_ttl", false),
    ("max_ttl_ms", "max_ttl", false),
];

/// Flags with neither an environment variable nor a file key: one-time
/// operator actions a variable or a file would repeat at every start, and
/// the two that are about this run only. Why, for the file's refusal.
pub(super) const COMMAND_LINE_ONLY: [(&str, &str); 5] = [
    (
        "wal-truncate-at",
        "a one-time consent to drop a corrupt log tail: give --wal-truncate-at on the command line, once",
    ),
    (
        "force-new-cluster",
        "one-time disaster recovery: give --force-new-cluster on the command line, once",
    ),
    ("check-config", "give --check-config on the command line"),
    ("config", "a config file cannot name another"),
    ("help", "not a setting"),
];

// ---- value parsers: the message says what is wrong, the caller names the
// flag, variable or file line it came from.

/// A switch's variable: true/false, 1/0, yes/no, on/off (the flag alone
/// is `true`).
pub(super) fn switch(v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "expected true or false (or 1/0, yes/no, on/off), got {v:?}"
        )),
    }
}

pub(super) fn number(v: &str) -> Result<u64, String> {
    v.parse().map_err(|_| format!("not a number: {v:?}"))
}

/// A number of at least `min` (the deprecated millisecond flags and counts).
pub(super) fn count(
    min: u64,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |v| {
        let n = number(v)?;
        if n < min {
            return Err(format!("must be at least {min}"));
        }
        Ok(n)
    }
}

pub(super) fn ms(
    min: u64,
    max: u64,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |v| config::duration_ms(v, min, max)
}

pub(super) fn us(
    min: u64,
    max: u64,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |v| config::duration_us(v, min, max)
}

pub(super) fn idle_poll_us(v: &str) -> Result<u64, String> {
    let n = number(v)?;
    if n > config::IDLE_POLL_US_MAX {
        return Err(format!(
            "at most {} (µs), not {n}",
            config::IDLE_POLL_US_MAX
        ));
    }
    Ok(n)
}

pub(super) fn preallocate(v: &str) -> Result<u64, String> {
    let (min, max) = (
        config::WAL_PREALLOCATE_MIN_BYTES,
        config::WAL_PREALLOCATE_MAX_BYTES,
    );
    let range = format!("0 (off) or {min} to {max} bytes");
    // One message for every refusal: a value past u64 is out of range too,
    // not "not a number".
    let n = match v.parse::<u64>() {
        Ok(n) => n,
        Err(_) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => u64::MAX,
        Err(_) => return Err(format!("{range}, not {v:?}")),
    };
    if n != 0 && !(min..=max).contains(&n) {
        return Err(format!("{range}, not {v}"));
    }
    Ok(n)
}

pub(super) fn threads(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a number of shards from 1 to 1024, got {v:?}"
        )),
    }
}

pub(super) fn byte_offset(v: &str) -> Result<u64, String> {
    v.parse().map_err(|_| format!("not a byte offset: {v:?}"))
}

pub(super) fn node_id(v: &str) -> Result<u64, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("expected a node id (1 or more), got {v:?}"))
}

pub(super) fn compact_entries(v: &str) -> Result<u64, String> {
    v.trim()
        .parse()
        .ok()
        .filter(|&n: &u64| n > 0)
        .ok_or_else(|| format!("expected a count of 1 or more, got {v:?}"))
}

pub(super) fn lc_admin_actions(v: &str) -> Result<LcAdminActions, String> {
    LcAdminActions::parse(v).ok_or_else(|| format!("expected any, loopback or off, got {v:?}"))
}

pub(super) fn log_level(v: &str) -> Result<Level, String> {
    Level::parse(v).ok_or_else(|| format!("unknown level {v:?}"))
}
