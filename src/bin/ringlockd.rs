//! `ringlockd`: the lock server.

use std::process::ExitCode;
use std::sync::Arc;

use ringlock::config::{self, Config};
use ringlock::driver::Server;
use ringlock::log::{self, Level};
use ringlock::metrics::{self, Metrics};

const HELP: &str = "\
ringlockd — a Locking-Center compatible lock server on io_uring

USAGE:
    ringlockd [OPTIONS]

OPTIONS:
    --bind ADDR              lock port address [env BIND_ADDRESS] (default 127.0.0.1:22119;
                             ':22119' means all interfaces). No authentication: any client
                             of this port can unlock or reset ANY key (Locking-Center
                             semantics), so bind it where only trusted hosts reach it
    --admin-bind ADDR        admin port address (default: loopback, lock port + 1)
    --metrics-bind ADDR      serve Prometheus /metrics and the probes /livez, /readyz, /healthz
                             over HTTP (default: off)
    --liveness-timeout-ms MS /livez (and /readyz, /healthz) fail once an event loop made no
                             progress for MS (default 10000, at least 1000)
    --data-path FILE         write-ahead log; held keys survive restarts [env DATA_PATH]
                             (default: in memory)
    --wal-truncate-at OFFSET drop a corrupt log tail starting at byte OFFSET (the offset the
                             refusal message names; keep a copy of the log first)
    --compact-floor-bytes N  never compact the log below N bytes; above it, compact when the log is
                             twice what the held keys need (default 1048576)
    --wal-preallocate-bytes N
                             keep N zero-filled bytes ahead of the log's end (rounded up to
                             4 KiB), so an append overwrites zeros and its fdatasync has no
                             file size to commit; 0 = off, every append grows the file; else
                             4096 to 8388608 (default 1048576)
    --max-connections N      open lock-port connections beyond N are answered '-' and closed
                             (default 10000)
    --admin-connections N    admin-port connections, counted apart, so a flood of lock-port
                             connections cannot lock the operator out (default 16)
    --idle-timeout-ms MS     close a connection with no request in flight and no traffic for MS;
                             queued waiters are not idle, sessions follow their keep-alive
                             (default 60000; 0 = never)
    --idle-poll-us US        before an idle event loop sleeps it keeps polling for US (yielding
                             the CPU between polls), so a request arriving meanwhile finds it
                             awake; costs up to US of CPU per idle spell; only where every shard
                             has a CPU of its own (default 50; 0 = sleep at once; at most 10000)
    --max-keys N             distinct held keys, server-wide (all shards together); a Lock
                             beyond it is answered '-' (default 100000)
    --max-waiters N          queued Lock requests, server-wide; beyond it '-' (default 100000)
    --auth-token-file FILE   a shared secret (the file's bytes, trailing whitespace removed, 1 to
                             255 bytes): session clients must present it in their Hello, and
                             admin connections must send AUTH first when --admin-bind is not
                             loopback
    --lc-admin-actions any|loopback|off
                             who may send the Locking-Center Unlock, ResetByKey and
                             ResetBySource on the lock port (no owner check): every client,
                             clients on loopback, or nobody (default any)
    --frame-timeout-ms MS    a request frame must complete within MS of its first byte (default 10000)
    --keepalive-ms MS        a session ends when nothing arrives from its client for MS, unless its
                             Hello asks for another deadline (default 10000)
    --min-keepalive-ms MS    smallest keep-alive deadline a Hello may ask for (default 300)
    --max-keepalive-ms MS    largest keep-alive deadline a Hello may ask for (default 600000)
    --min-ttl-ms MS          shortest lease TTL accepted (default 10)
    --max-ttl-ms MS          longest lease TTL accepted (default 86400000, a day)
    --bind-retry-ms MS       while a port is still in use (a crashed predecessor's socket closing),
                             retry binding for up to MS before giving up (default 10000; 0 = no retry);
                             a port a live process listens on fails at once, naming it
    --threads N              shards: event-loop threads, each pinned to one CPU of the affinity mask,
                             keys spread over them by a fixed hash; env RINGLOCK_THREADS
                             (default: one per CPU in the mask)
    --node-id N              cluster mode: this node's id (1, 2, ...) [env RINGLOCK_NODE_ID]
    --peers 1=HOST:PORT,...  cluster mode: every node's Raft address, this one's included; node
                             n's shard g listens on its PORT + g, so leave --threads ports
                             between nodes [env RINGLOCK_PEERS]. Needs --node-id and
                             --data-path; every node runs the same --threads and --peers.
                             Only the leader serves: see docs/cluster.md (default: one node)
    --join                   cluster mode: this node, with an empty --data-path, joins a running
                             cluster (`ringlock cluster add`/`replace` adds it) instead of
                             founding one with --peers as voters; ignored once its log holds
                             anything [env RINGLOCK_JOIN=1]
    --force-new-cluster      disaster recovery (cluster mode): when most nodes are lost for good,
                             start the surviving node with the longest log with this flag once:
                             it becomes the only voter of every shard, every entry in its log
                             is kept (committed or not), and its log is rewritten so. Remove the
                             flag before the next start; add new nodes with `ringlock cluster add`
    --certs-dir DIR          ca.crt, node.crt, node.key (made by `ringlock cert`): mutual TLS
                             on every peer (Raft) link, a link's node id taken from its
                             certificate; TLS on the lock port (sessions need it) and the admin
                             port (TLS only, a client certificate or the auth token also on
                             loopback); SIGHUP re-reads the directory [env RINGLOCK_CERTS_DIR].
                             A cluster node needs it unless --insecure (docs/security.md)
    --client-cert-auth       with --certs-dir: lock and admin clients must present a client
                             certificate signed by the CA [env RINGLOCK_CLIENT_CERT_AUTH=1]
    --lc-plaintext           with --certs-dir: still serve plaintext Locking-Center requests on
                             the lock port (their clients cannot speak TLS); sessions still
                             need TLS [env RINGLOCK_LC_PLAINTEXT=1]
    --client-plaintext       with --certs-dir: the lock and admin ports also take plaintext
                             clients (sessions, admin commands) as without certificates; TLS
                             stays available, peer links stay mutual TLS. For a network only
                             trusted hosts reach [env RINGLOCK_CLIENT_PLAINTEXT=1]
    --insecure               cluster mode without certificates: anyone who reaches a Raft port
                             can join, stall, read or rewrite the cluster. Only for a network
                             nobody else reaches; warned at start, ringlock_insecure 1 in
                             /metrics [env RINGLOCK_INSECURE=1]
    --raft-compact-entries N cluster mode: compact each shard's log into a snapshot every N
                             applied entries (default 10000)
    --log-level LEVEL        error | warn | info | debug (default info)
    -h, --help               print this help
    -V, --version            print the version
";

type Cluster = Option<ringlock::cluster::ClusterConfig>;

fn parse() -> Result<Option<(Config, Level, Cluster)>, String> {
    use lexopt::prelude::*;
    let env_bind = std::env::var("BIND_ADDRESS").ok().filter(|s| !s.is_empty());
    let mut bind_retry_ms: Option<u64> = None;
    let mut preallocate: Option<u64> = None;
    let mut threads: Option<usize> = match std::env::var("RINGLOCK_THREADS") {
        Ok(v) if !v.is_empty() => Some(parse_threads(&v, "RINGLOCK_THREADS")?),
        _ => None,
    };
    let mut bind = match env_bind {
        Some(s) => config::parse_addr(&s).map_err(|e| format!("BIND_ADDRESS: {e}"))?,
        None => Config::default().bind,
    };
    let mut admin = None;
    let mut auth_token: Option<Vec<u8>> = None;
    let mut lc_admin: Option<config::LcAdminActions> = None;
    let mut cfg_metrics = None;
    let mut data_path = std::env::var_os("DATA_PATH")
        .filter(|s| !s.is_empty())
        .map(Into::into);
    let mut level = Level::Info;
    let mut node_id: Option<String> = std::env::var("RINGLOCK_NODE_ID")
        .ok()
        .filter(|s| !s.is_empty());
    let mut peers: Option<String> = std::env::var("RINGLOCK_PEERS")
        .ok()
        .filter(|s| !s.is_empty());
    let mut join = std::env::var("RINGLOCK_JOIN").is_ok_and(|v| v == "1" || v == "true");
    let mut certs_dir: Option<std::path::PathBuf> = std::env::var_os("RINGLOCK_CERTS_DIR")
        .filter(|s| !s.is_empty())
        .map(Into::into);
    let mut insecure = std::env::var("RINGLOCK_INSECURE").is_ok_and(|v| v == "1" || v == "true");
    let mut client_cert_auth =
        std::env::var("RINGLOCK_CLIENT_CERT_AUTH").is_ok_and(|v| v == "1" || v == "true");
    let mut lc_plaintext =
        std::env::var("RINGLOCK_LC_PLAINTEXT").is_ok_and(|v| v == "1" || v == "true");
    let mut client_plaintext =
        std::env::var("RINGLOCK_CLIENT_PLAINTEXT").is_ok_and(|v| v == "1" || v == "true");
    let mut compact_entries: Option<u64> = None;
    let mut force_new = false;
    let mut truncate_at = None;
    let mut limits: Vec<(&'static str, u64)> = Vec::new();
    let mut p = lexopt::Parser::from_env();
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        let flag = match arg {
            Long(s) => format!("--{s}"),
            Short(c) => format!("-{c}"),
            Value(v) => return Err(format!("unexpected argument {:?}", v.to_string_lossy())),
        };
        let mut val = |name: &str| -> Result<String, String> {
            p.value()
                .map_err(|e| e.to_string())?
                .into_string()
                .map_err(|_| format!("{name}: value is not UTF-8"))
        };
        match flag.as_str() {
            "--bind" => {
                bind = config::parse_addr(&val("--bind")?).map_err(|e| format!("--bind: {e}"))?
            }
            "--admin-bind" => {
                admin = Some(
                    config::parse_addr(&val("--admin-bind")?)
                        .map_err(|e| format!("--admin-bind: {e}"))?,
                )
            }
            "--metrics-bind" => {
                cfg_metrics = Some(
                    config::parse_addr(&val("--metrics-bind")?)
                        .map_err(|e| format!("--metrics-bind: {e}"))?,
                )
            }
            "--data-path" => data_path = Some(val("--data-path")?.into()),
            "--node-id" => node_id = Some(val("--node-id")?),
            "--peers" => peers = Some(val("--peers")?),
            "--join" => join = true,
            "--certs-dir" => certs_dir = Some(val("--certs-dir")?.into()),
            "--insecure" => insecure = true,
            "--client-cert-auth" => client_cert_auth = true,
            "--lc-plaintext" => lc_plaintext = true,
            "--client-plaintext" => client_plaintext = true,
            "--force-new-cluster" => force_new = true,
            "--raft-compact-entries" => {
                let v = val("--raft-compact-entries")?;
                compact_entries = Some(v.trim().parse().ok().filter(|&n: &u64| n > 0).ok_or_else(
                    || format!("--raft-compact-entries: expected a count of 1 or more, got {v:?}"),
                )?);
            }
            "--auth-token-file" => {
                let p: std::path::PathBuf = val("--auth-token-file")?.into();
                auth_token = Some(config::read_auth_token(&p)?);
            }
            "--lc-admin-actions" => {
                let v = val("--lc-admin-actions")?;
                lc_admin = Some(config::LcAdminActions::parse(&v).ok_or_else(|| {
                    format!("--lc-admin-actions: expected any, loopback or off, got {v:?}")
                })?);
            }
            "--wal-truncate-at" => {
                let v = val("--wal-truncate-at")?;
                truncate_at = Some(
                    v.parse::<u64>()
                        .map_err(|_| format!("--wal-truncate-at: not a byte offset: {v:?}"))?,
                );
            }
            "--log-level" => {
                let v = val("--log-level")?;
                level =
                    Level::parse(&v).ok_or_else(|| format!("--log-level: unknown level {v:?}"))?;
            }
            "--max-connections"
            | "--admin-connections"
            | "--idle-timeout-ms"
            | "--idle-poll-us"
            | "--max-keys"
            | "--max-waiters"
            | "--frame-timeout-ms"
            | "--liveness-timeout-ms"
            | "--keepalive-ms"
            | "--min-keepalive-ms"
            | "--max-keepalive-ms"
            | "--min-ttl-ms"
            | "--max-ttl-ms"
            | "--compact-floor-bytes" => {
                let name: &'static str = match flag.as_str() {
                    "--max-connections" => "max-connections",
                    "--admin-connections" => "admin-connections",
                    "--idle-timeout-ms" => "idle-timeout-ms",
                    "--idle-poll-us" => "idle-poll-us",
                    "--max-keys" => "max-keys",
                    "--max-waiters" => "max-waiters",
                    "--compact-floor-bytes" => "compact-floor-bytes",
                    "--liveness-timeout-ms" => "liveness-timeout-ms",
                    "--keepalive-ms" => "keepalive-ms",
                    "--min-keepalive-ms" => "min-keepalive-ms",
                    "--max-keepalive-ms" => "max-keepalive-ms",
                    "--min-ttl-ms" => "min-ttl-ms",
                    "--max-ttl-ms" => "max-ttl-ms",
                    _ => "frame-timeout-ms",
                };
                let v = val(name)?;
                let n: u64 = v
                    .parse()
                    .map_err(|_| format!("--{name}: not a number: {v:?}"))?;
                let min = match name {
                    "liveness-timeout-ms" => config::LIVENESS_TIMEOUT_MS_MIN,
                    "idle-timeout-ms" | "idle-poll-us" => 0,
                    _ => 1,
                };
                if n < min {
                    return Err(format!("--{name}: must be at least {min}"));
                }
                if name == "idle-poll-us" && n > config::IDLE_POLL_US_MAX {
                    return Err(format!(
                        "--idle-poll-us: at most {} (µs), not {n}",
                        config::IDLE_POLL_US_MAX
                    ));
                }
                limits.push((name, n));
            }
            "--wal-preallocate-bytes" => {
                let v = val("wal-preallocate-bytes")?;
                let (min, max) = (
                    config::WAL_PREALLOCATE_MIN_BYTES,
                    config::WAL_PREALLOCATE_MAX_BYTES,
                );
                let range = format!("--wal-preallocate-bytes: 0 (off) or {min} to {max} bytes");
                // One message for every refusal: a value past u64 is out of
                // range too, not "not a number".
                let n = match v.parse::<u64>() {
                    Ok(n) => n,
                    Err(_) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => u64::MAX,
                    Err(_) => return Err(format!("{range}, not {v:?}")),
                };
                if n != 0 && !(min..=max).contains(&n) {
                    return Err(format!("{range}, not {v}"));
                }
                preallocate = Some(n);
            }
            "--threads" => {
                let v = val("threads")?;
                threads = Some(parse_threads(&v, "--threads")?);
            }
            "--bind-retry-ms" => {
                let v = val("bind-retry-ms")?;
                bind_retry_ms = Some(
                    v.parse()
                        .map_err(|_| format!("--bind-retry-ms: not a number: {v:?}"))?,
                );
            }
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(None);
            }
            "-V" | "--version" => {
                println!("ringlockd {}", env!("CARGO_PKG_VERSION"));
                return Ok(None);
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    let mut cfg = Config::new(bind);
    cfg.auth_token = auth_token;
    if let Some(p) = lc_admin {
        cfg.lc_admin_actions = p;
    }
    cfg.threads = threads.unwrap_or_else(|| ringlock::driver::allowed_cpus().len());
    if let Some(ms) = bind_retry_ms {
        cfg.bind_retry_ms = ms;
    }
    if let Some(a) = admin {
        cfg.admin_bind = a;
    }
    cfg.metrics_bind = cfg_metrics;
    cfg.data_path = data_path;
    cfg.wal_truncate_at = truncate_at;
    if let Some(n) = preallocate {
        cfg.wal_preallocate_bytes = n;
    }
    cfg.faults = std::env::var("RINGLOCK_FAULTS")
        .ok()
        .filter(|s| !s.is_empty());
    if cfg.wal_truncate_at.is_some() && cfg.data_path.is_none() {
        return Err("--wal-truncate-at needs --data-path".into());
    }
    for &(name, n) in &limits {
        match name {
            "max-connections" => cfg.max_connections = n as usize,
            "admin-connections" => cfg.admin_connections = n as usize,
            "idle-timeout-ms" => cfg.idle_timeout_ms = n,
            "idle-poll-us" => cfg.idle_poll_us = n,
            "max-keys" => cfg.max_keys = n as usize,
            "max-waiters" => cfg.max_waiters = n as usize,
            "compact-floor-bytes" => cfg.compact_floor_bytes = n,
            "liveness-timeout-ms" => cfg.liveness_timeout_ms = n,
            "frame-timeout-ms" => cfg.frame_timeout_ms = n,
            other => {
                let v =
                    u32::try_from(n).map_err(|_| format!("--{other}: at most {}", u32::MAX - 1))?;
                let v = v.min(u32::MAX - 1);
                match other {
                    "keepalive-ms" => cfg.keepalive_ms = v,
                    "min-keepalive-ms" => cfg.min_keepalive_ms = v,
                    "max-keepalive-ms" => cfg.max_keepalive_ms = v,
                    "min-ttl-ms" => cfg.min_ttl_ms = v,
                    _ => cfg.max_ttl_ms = v,
                }
            }
        }
    }
    let keepalive_given = limits.iter().any(|(n, _)| *n == "keepalive-ms");
    if cfg.min_keepalive_ms > cfg.max_keepalive_ms {
        return Err(format!(
            "--min-keepalive-ms {} is above --max-keepalive-ms {}",
            cfg.min_keepalive_ms, cfg.max_keepalive_ms
        ));
    }
    if !keepalive_given {
        // The default follows bounds that exclude it.
        cfg.keepalive_ms = cfg
            .keepalive_ms
            .clamp(cfg.min_keepalive_ms, cfg.max_keepalive_ms);
    }
    if !(cfg.min_keepalive_ms..=cfg.max_keepalive_ms).contains(&cfg.keepalive_ms) {
        return Err(format!(
            "--keepalive-ms {} must lie within --min-keepalive-ms {} and --max-keepalive-ms {}",
            cfg.keepalive_ms, cfg.min_keepalive_ms, cfg.max_keepalive_ms
        ));
    }
    if cfg.min_ttl_ms > cfg.max_ttl_ms {
        return Err(format!(
            "--min-ttl-ms {} is above --max-ttl-ms {}",
            cfg.min_ttl_ms, cfg.max_ttl_ms
        ));
    }
    let cluster = match (node_id, peers) {
        (None, None) => None,
        (Some(_), None) => return Err("--node-id needs --peers (the cluster's nodes)".into()),
        (None, Some(_)) => {
            return Err("--peers needs --node-id (which of them this node is)".into())
        }
        (Some(id), Some(peers)) => {
            let id: u64 = id
                .trim()
                .parse()
                .map_err(|_| format!("--node-id: expected a node id (1 or more), got {id:?}"))?;
            if cfg.data_path.is_none() {
                return Err(
                    "--peers needs --data-path: a cluster node's votes and log must survive a restart"
                        .into(),
                );
            }
            let mut c = ringlock::cluster::ClusterConfig::parse(id, &peers)?;
            c.join = join;
            c.force_new = force_new;
            if join && force_new {
                return Err("--join and --force-new-cluster exclude each other".into());
            }
            if let Some(n) = compact_entries {
                c.compact_entries = n;
            }
            if certs_dir.is_none() && !insecure {
                return Err(
                    "a cluster node needs certificates: make them with `ringlock cert \
                     create-ca` and `ringlock cert create-node`, then give --certs-dir DIR \
                     (docs/security.md); or give every node --insecure to run the cluster open \
                     to anyone who can reach its Raft ports"
                        .into(),
                );
            }
            Some(c)
        }
    };
    if insecure && certs_dir.is_some() {
        return Err("--insecure and --certs-dir contradict each other: give one".into());
    }
    if insecure && cluster.is_none() {
        return Err(
            "--insecure is for a cluster (--peers) without certificates; a single node \
             runs without them unless given --certs-dir"
                .into(),
        );
    }
    if certs_dir.is_none() && (client_cert_auth || lc_plaintext || client_plaintext) {
        return Err(format!(
            "{} needs --certs-dir: without certificates the lock port speaks no TLS",
            if client_cert_auth {
                "--client-cert-auth"
            } else if lc_plaintext {
                "--lc-plaintext"
            } else {
                "--client-plaintext"
            }
        ));
    }
    if client_cert_auth && client_plaintext {
        return Err(
            "--client-cert-auth and --client-plaintext contradict each other: a plaintext \
             client presents no certificate"
                .into(),
        );
    }
    cfg.certs_dir = certs_dir;
    cfg.insecure = insecure;
    cfg.client_cert_auth = client_cert_auth;
    cfg.lc_plaintext = lc_plaintext;
    cfg.client_plaintext = client_plaintext;
    if cluster.is_none() && (join || compact_entries.is_some()) {
        return Err(format!(
            "{} is a cluster flag: it needs --node-id and --peers",
            if join {
                "--join"
            } else {
                "--raft-compact-entries"
            }
        ));
    }
    Ok(Some((cfg, level, cluster)))
}

/// A lock port other hosts can reach lets any of them unlock or reset any
/// key unless a token and a policy say otherwise: say so at start-up.
fn warn_if_exposed(cfg: &Config) {
    use config::LcAdminActions;
    if !cfg.bind.ip().is_loopback()
        && (cfg.auth_token.is_none() || cfg.lc_admin_actions == LcAdminActions::Any)
    {
        ringlock::log!(
            Level::Warn,
            "insecure_bind",
            "port=lock addr={} auth_token={} lc_admin_actions={:?} reason=\"reachable from other hosts: {}\"",
            cfg.bind,
            cfg.auth_token.is_some(),
            cfg.lc_admin_actions,
            if cfg.lc_admin_actions == LcAdminActions::Any {
                "any client can Unlock or reset any key (see --lc-admin-actions)"
            } else {
                "session clients are not authenticated (see --auth-token-file)"
            }
        );
    }
    if cfg.insecure {
        ringlock::log!(
            Level::Warn,
            "insecure_cluster",
            "reason=\"--insecure: the Raft ports take anyone; a stranger who reaches them can join, stall, read or rewrite the cluster\" action=\"make certificates with ringlock cert and start with --certs-dir\""
        );
    }
    if cfg.client_plaintext {
        ringlock::log!(
            Level::Warn,
            "client_plaintext",
            "port=lock addr={} admin={} reason=\"--client-plaintext: sessions, admin commands and their auth token may travel in clear\"",
            cfg.bind,
            cfg.admin_bind
        );
    } else if cfg.lc_plaintext {
        ringlock::log!(
            Level::Warn,
            "lc_plaintext",
            "port=lock addr={} reason=\"--lc-plaintext: Locking-Center requests travel in clear, unauthenticated; sessions still need TLS\"",
            cfg.bind
        );
    }
    if !cfg.admin_bind.ip().is_loopback() && cfg.auth_token.is_none() && cfg.certs_dir.is_none() {
        ringlock::log!(
            Level::Warn,
            "insecure_bind",
            "port=admin addr={} auth_token=false lc_admin_actions={:?} reason=\"reachable from other hosts without --auth-token-file: anyone can list and reset every key\"",
            cfg.admin_bind,
            cfg.lc_admin_actions
        );
    }
}

fn parse_threads(v: &str, what: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!(
            "{what}: expected a number of shards from 1 to 1024, got {v:?}"
        )),
    }
}

fn main() -> ExitCode {
    let (cfg, level, cluster) = match parse() {
        Ok(Some(v)) => v,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringlockd: {e} (see --help)");
            return ExitCode::from(64);
        }
    };
    log::set_level(level);
    warn_if_exposed(&cfg);
    let m = Arc::new(Metrics::new_loops(cfg.threads));
    let server = match Server::bind_cluster(cfg.clone(), m.clone(), cluster.clone()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ringlockd: {e}");
            return ExitCode::from(1);
        }
    };
    // Only after Server::bind: it blocks SIGINT/SIGTERM for the signalfd, and
    // the HTTP threads must inherit that mask, or a SIGTERM delivered to one
    // of them would kill the process instead of stopping it cleanly.
    let metrics_addr = match cfg.metrics_bind {
        Some(a) => match metrics::serve_with(
            a,
            m.clone(),
            metrics::Options {
                liveness_timeout: std::time::Duration::from_millis(cfg.liveness_timeout_ms),
                ..metrics::Options::default()
            },
        ) {
            Ok(bound) => Some(bound),
            Err(e) => {
                eprintln!("ringlockd: cannot serve metrics on {a}: {e}");
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    let metrics_field = metrics_addr
        .map(|a| format!(" metrics={a}"))
        .unwrap_or_default();
    ringlock::log!(
        Level::Info,
        "listening",
        "lock={} admin={}{} data_path={} max_connections={} shards={} node={} version={}",
        server.lock_addr(),
        server.admin_addr(),
        metrics_field,
        cfg.data_path
            .as_deref()
            .map_or(log::Bytes(b"none"), log::path),
        server.config().max_connections,
        server.config().threads,
        cluster.as_ref().map_or(0, |c| c.node_id),
        env!("CARGO_PKG_VERSION")
    );
    match server.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringlockd: {e}");
            ExitCode::from(1)
        }
    }
}
