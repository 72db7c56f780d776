//! Command line, target URLs and the run configuration.
//!
//! Everything is parsed up front into a [`Config`]; the engine never looks at
//! strings again. Durations carry units in their names (`_ns`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use crate::dist::Dist;
pub use ringlock::protocol::session::Access;

/// Which lock service the load generator talks to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Locking-Center protocol (ringlockd, the floor server, the Go original).
    Ringlock,
    /// ringlockd's session protocol: Hello, then Acquire (hold = session)
    /// and Release with the grant's token, on one persistent connection.
    Session,
    /// Redis: `SET key token NX PX ttl` + compare-and-delete script.
    Redis,
    /// PostgreSQL: `pg_advisory_lock` / `pg_advisory_unlock` on a pinned session.
    Postgres {
        user: String,
        db: String,
        password: String,
    },
    /// MySQL / MariaDB: `GET_LOCK` / `RELEASE_LOCK` on a pinned session.
    Mysql { user: String, password: String },
    /// etcd v3 lock service through its HTTP/JSON gateway (`/v3/lock/lock`).
    Etcd,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub kind: Kind,
    pub host: String,
    pub port: u16,
}

impl Target {
    pub fn scheme(&self) -> &'static str {
        match self.kind {
            Kind::Ringlock => "ringlock",
            Kind::Session => "ringlock-session",
            Kind::Redis => "redis",
            Kind::Postgres { .. } => "postgres",
            Kind::Mysql { .. } => "mysql",
            Kind::Etcd => "etcd",
        }
    }

    pub fn resolve(&self) -> Result<SocketAddr, String> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}:{}: {e}", self.host, self.port))?
            .next()
            .ok_or_else(|| format!("no address for {}:{}", self.host, self.port))
    }

    /// Whether a lock survives the connection that took it. Session-bound
    /// locks (PostgreSQL advisory locks, MySQL GET_LOCK, ringlockd session
    /// holds) are released by the server when the session ends, so a
    /// connection per request is meaningless for them.
    pub fn lock_outlives_connection(&self) -> bool {
        !matches!(
            self.kind,
            Kind::Postgres { .. } | Kind::Mysql { .. } | Kind::Session
        )
    }
}

/// Every scheme `--target` takes (aliases after a slash).
pub const SCHEMES: &str =
    "ringlock/lc, ringlock-session, redis, postgres/postgresql, mysql/mariadb, etcd";

/// Parse `scheme://[user[:pass]@]host:port[/db]`.
pub fn parse_target(url: &str) -> Result<Target, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("target {url:?}: expected scheme://host:port"))?;
    let (userinfo, hostpart) = match rest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, rest),
    };
    let (hostport, path) = match hostpart.split_once('/') {
        Some((hp, p)) => (hp, p),
        None => (hostpart, ""),
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']'),
            Some(
                p.parse::<u16>()
                    .map_err(|_| format!("target {url:?}: bad port {p:?}"))?,
            ),
        ),
        None => (hostport, None),
    };
    if host.is_empty() {
        return Err(format!("target {url:?}: missing host"));
    }
    let (user, password) = match userinfo {
        Some(u) => match u.split_once(':') {
            Some((a, b)) => (a.to_string(), b.to_string()),
            None => (u.to_string(), String::new()),
        },
        None => (String::new(), String::new()),
    };
    let (kind, default_port) = match scheme {
        "ringlock" | "lc" => (Kind::Ringlock, 22119),
        "ringlock-session" => (Kind::Session, 22119),
        "redis" => (Kind::Redis, 6379),
        "postgres" | "postgresql" => {
            let user = if user.is_empty() {
                "postgres".to_string()
            } else {
                user
            };
            let db = if path.is_empty() {
                user.clone()
            } else {
                path.to_string()
            };
            (Kind::Postgres { user, db, password }, 5432)
        }
        "mysql" | "mariadb" => {
            let user = if user.is_empty() {
                "root".to_string()
            } else {
                user
            };
            (Kind::Mysql { user, password }, 3306)
        }
        // Not `http`: an HTTP URL names no lock service (it used to mean
        // etcd's gateway on 2379 without saying so).
        "etcd" => (Kind::Etcd, 2379),
        other => {
            return Err(format!(
                "target {url:?}: unknown scheme {other:?} (known: {SCHEMES}{})",
                if other.starts_with("http") {
                    "; etcd's HTTP/JSON gateway is etcd://HOST:PORT"
                } else {
                    ""
                }
            ))
        }
    };
    Ok(Target {
        kind,
        host: host.to_string(),
        port: port.unwrap_or(default_port),
    })
}

/// Parse `250us`, `3ms`, `2s`, `1m`, or a bare number of seconds.
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let scale = match unit {
        "" | "s" => 1e9,
        "ms" => 1e6,
        "us" | "µs" => 1e3,
        "ns" => 1.0,
        "m" | "min" => 60e9,
        _ => return Err(format!("bad duration unit in {s:?} (use ns, us, ms, s, m)")),
    };
    if !(value >= 0.0 && value.is_finite()) {
        return Err(format!("bad duration {s:?}"));
    }
    Ok((value * scale).round() as u64)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// Lock (blocking), hold, unlock.
    LockUnlock,
    /// TryLock; if granted, hold and unlock; if busy, the attempt is done.
    TryLock,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnMode {
    /// A new TCP connection for every request, as Locking-Center clients do.
    PerRequest,
    /// One connection per client, reused for every request.
    Persistent,
    /// A new connection for every cycle (its greeting, Lock, Unlock, then
    /// close): connection churn for the protocols whose locks die with the
    /// connection (sessions, SQL), and with TLS one handshake per cycle.
    PerCycle,
}

impl ConnMode {
    pub fn name(self) -> &'static str {
        match self {
            ConnMode::PerRequest => "per-request",
            ConnMode::Persistent => "persistent",
            ConnMode::PerCycle => "per-cycle",
        }
    }
}

/// `--tls-certs-dir` / `--tls-client`: speak TLS 1.3 to a ringlockd lock
/// port started with `--certs-dir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsOpts {
    /// The directory with `ca.crt` (and the client's certificate).
    pub certs_dir: PathBuf,
    /// Present `client.NAME.crt` / `client.NAME.key` from `certs_dir`.
    pub client: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub target: Target,
    pub connections: usize,
    /// Total arrival rate in cycles/s over all connections; 0 = closed loop.
    pub rate_per_s: f64,
    pub duration_ns: u64,
    pub warmup_ns: u64,
    /// How long to wait for cycles still in flight at the end.
    pub drain_ns: u64,
    pub keys: u32,
    pub dist: Dist,
    pub hold_ns: u64,
    pub mix: Mix,
    pub conn_mode: ConnMode,
    /// Redis only: pause between SET NX attempts while the key is taken.
    pub retry_backoff_ns: u64,
    /// Redis lock TTL (PX), also the etcd lease TTL and the keep-alive a
    /// ringlockd session asks for in its Hello.
    pub lock_ttl_ms: u64,
    pub key_prefix: String,
    pub seed: u64,
    pub json: bool,
    pub hgrm_path: Option<String>,
    /// Write every lock latency with its intended start (monotonic ns).
    pub latency_log: Option<String>,
    pub progress: bool,
    pub label: String,
    /// Epoll threads; thread t drives clients t, t + threads, … (default 1).
    pub threads: usize,
    /// Pin thread t to `pin_cpus[t % len]`; `None` = leave the affinity alone.
    pub pin_cpus: Option<Vec<usize>>,
    /// TLS to the target (ringlock targets only); `None` = plaintext.
    pub tls: Option<TlsOpts>,
    /// Stop after this many cycles in all (warm-up included), split evenly
    /// over the clients; the run ends when they are done or at `duration`.
    pub cycles: Option<u64>,
    /// How a ringlock-session Acquire asks for its key (`--access`); with
    /// `--writers`, the readers' access.
    pub access: Access,
    /// `--writers N`: clients 0..N ask exclusively (writers), the others
    /// with `access` (readers); the run then keeps every Acquire's times
    /// and reports the writers' FIFO evidence (`crate::fifo`). 0 = off.
    pub writers: usize,
    /// `--fifo-guard`: the send-order jitter allowed for (`crate::fifo`).
    pub fifo_guard_ns: u64,
}

/// Most CPUs a `--pin-cpus` list may name (the size of `cpu_set_t`).
pub const MAX_CPU: usize = 1024;

/// Parse a CPU list as `taskset -c` takes it: `0,1`, `2-9`, `0-3,8`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let bad = |why: &str| format!("bad --pin-cpus {s:?}: {why} (e.g. 0,1 or 2-9)");
    let mut cpus = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let lo: usize = lo.parse().map_err(|_| bad("not a CPU number"))?;
        let hi: usize = hi.parse().map_err(|_| bad("not a CPU number"))?;
        if lo > hi {
            return Err(bad("range runs backwards"));
        }
        if hi >= MAX_CPU {
            return Err(bad(&format!("CPUs go up to {}", MAX_CPU - 1)));
        }
        for cpu in lo..=hi {
            if cpus.contains(&cpu) {
                return Err(bad(&format!("CPU {cpu} named twice")));
            }
            cpus.push(cpu);
        }
    }
    Ok(cpus)
}

/// What `--version` prints (returned through the error path, like USAGE).
pub const VERSION: &str = concat!("ringlock-loadgen ", env!("CARGO_PKG_VERSION"), "\n");

pub const USAGE: &str = "\
ringlock-loadgen: open/closed-loop load for lock services

USAGE: ringlock-loadgen --target URL [options]

Targets:
  ringlock://HOST:PORT            Locking-Center protocol (ringlockd, floor-server)
  ringlock-session://HOST:PORT    ringlockd session protocol: Hello, Acquire (session hold), Release by token
  redis://HOST:PORT               SET NX PX + compare-and-delete (EVALSHA)
  postgres://USER@HOST:PORT/DB    pg_advisory_lock / pg_advisory_unlock (trust or cleartext auth)
  mysql://USER:PASS@HOST:PORT     GET_LOCK / RELEASE_LOCK (MySQL, MariaDB)
  etcd://HOST:PORT                etcd v3 lock API through the HTTP/JSON gateway
  (aliases: lc:// = ringlock://, postgresql://, mariadb://; any other scheme, http:// included,
  is refused; a port left out is the service's default: 22119, 6379, 5432, 3306, 2379)
  ringlock:// and ringlock-session:// speak TLS 1.3 with --tls-certs-dir (ringlockd --certs-dir)

Exit status: 0 when some request succeeded (errors are in the report); 1 when every request
failed (nothing listens, auth refused, ...: the report is printed, then one line says why)
or the run could not start; 2 for a usage error.

Options:
  --connections N      clients, one connection each (default 1)
  --rate R             total cycles/s over all connections, each gets R/N;
                       0 = closed loop (default 0)
  --duration D         measured time (default 10s; units ns/us/ms/s/m)
  --warmup D           unmeasured lead-in (default 1s)
  --drain D            wait for in-flight cycles after the end (default 5s)
  --keys N             key space size (default 1000)
  --dist DIST          uniform | zipf:S | hot | private (key = client id) (default uniform)
  --hold D             time inside the critical section (default 0)
  --mix MIX            lock-unlock | try-lock (default lock-unlock)
  --access A           ringlock-session: exclusive | shared | semaphore:N, how each
                       Acquire asks for its key (default exclusive)
  --writers N          ringlock-session, beside --access shared|semaphore:N: a mixed run in
                       one process, clients 0..N-1 writers (exclusive), the others readers
                       (--access); reports readers' and writers' lock wait apart and every
                       writer Acquire's FIFO evidence: excess (its wait not explained by
                       the Releases of the operations ahead of it) and overtakes (reader
                       Acquires sent later, granted first); docs/loadgen.md, Mixed runs
                       (default 0: off)
  --fifo-guard D       --writers: send-order jitter allowed for: an Acquire sent up to D
                       after a writer's counts as ahead of it (default 50us)
  --conn-mode MODE     persistent | per-request | per-cycle (default persistent);
                       per-cycle: a new connection per lock+unlock cycle (any target)
  --cycles N           stop after N cycles in all (warm-up included; split evenly over
                       the clients), or at the end of --duration if that comes first
  --retry-backoff D    redis: pause between SET NX attempts (default 100us, +-50% jitter)
  --lock-ttl-ms MS     redis PX / etcd lease TTL / ringlock-session keep-alive (default 30000)
  --key-prefix P       key prefix (default lg)
  --seed N             RNG seed (default 1)
  --label TEXT         free text echoed in the report
  --json               last stdout line: one JSON object with the results
  --hgrm FILE          write the corrected lock-latency histogram as .hgrm
  --latency-log FILE   write every recorded lock latency, one line `START_NS LATENCY_NS`
                       (intended start, CLOCK_MONOTONIC; kept in memory, written at the end),
                       to cut a run into time windows (scripts/tls-bench.sh's storm)
  --no-progress        no per-second progress line on stderr
  --threads N          epoll threads; thread t drives clients t, t+N, ... (default 1,
                       at most --connections); percentiles merge all threads
  --pin-cpus LIST      pin thread t to the t-th CPU of LIST (0,1 or 2-9; wraps
                       around when shorter than --threads); default: no pinning
  --tls-certs-dir DIR  ringlock:// and ringlock-session:// over TLS 1.3: verify the server
                       against DIR/ca.crt and the target's host name or IP (ringlockd
                       --certs-dir; `ringlock cert` makes DIR); every connection is a
                       full handshake, timed in the report's `connect + TLS handshake` row
  --tls-client NAME    present DIR/client.NAME.crt (+ .key) as the client certificate
  -h, --help           this help;  -V, --version  the version
";

pub fn parse_args<I>(args: I) -> Result<Config, String>
where
    I: IntoIterator<Item = std::ffi::OsString>,
{
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut target = None;
    let mut cfg = Config {
        target: Target {
            kind: Kind::Ringlock,
            host: "127.0.0.1".into(),
            port: 22119,
        },
        connections: 1,
        rate_per_s: 0.0,
        duration_ns: 10_000_000_000,
        warmup_ns: 1_000_000_000,
        drain_ns: 5_000_000_000,
        keys: 1000,
        dist: Dist::Uniform,
        hold_ns: 0,
        mix: Mix::LockUnlock,
        conn_mode: ConnMode::Persistent,
        retry_backoff_ns: 100_000,
        lock_ttl_ms: 30_000,
        key_prefix: "lg".into(),
        seed: 1,
        json: false,
        hgrm_path: None,
        latency_log: None,
        progress: true,
        label: String::new(),
        access: Access::Exclusive,
        writers: 0,
        fifo_guard_ns: crate::fifo::DEFAULT_GUARD_NS,
        threads: 1,
        pin_cpus: None,
        tls: None,
        cycles: None,
    };
    let mut tls_dir = None;
    let mut tls_client = None;
    let s = |v: std::ffi::OsString| {
        v.into_string()
            .map_err(|_| "argument is not UTF-8".to_string())
    };
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        match arg {
            Long("target") | Short('t') => {
                target = Some(parse_target(&s(p.value().map_err(|e| e.to_string())?)?)?)
            }
            Long("connections") | Short('c') => {
                cfg.connections = s(p.value().map_err(|e| e.to_string())?)?
                    .parse()
                    .map_err(|_| "bad --connections")?
            }
            Long("rate") | Short('r') => {
                cfg.rate_per_s = s(p.value().map_err(|e| e.to_string())?)?
                    .parse()
                    .map_err(|_| "bad --rate")?
            }
            Long("duration") | Short('d') => {
                cfg.duration_ns = parse_duration_ns(&s(p.value().map_err(|e| e.to_string())?)?)?
            }
            Long("warmup") => {
                cfg.warmup_ns = parse_duration_ns(&s(p.value().map_err(|e| e.to_string())?)?)?
            }
            Long("drain") => {
                cfg.drain_ns = parse_duration_ns(&s(p.value().map_err(|e| e.to_string())?)?)?
            }
            Long("keys") | Short('k') => {
                cfg.keys = s(p.value().map_err(|e| e.to_string())?)?
                    .parse()
                    .map_err(|_| "bad --keys")?
            }
            Long("dist") => cfg.dist = Dist::parse(&s(p.value().map_err(|e| e.to_string())?)?)?,
            Long("hold") => {
                cfg.hold_ns = parse_duration_ns(&s(p.value().map_err(|e| e.to_string())?)?)?
            }
            Long("mix") => {
                cfg.mix = match s(p.value().map_err(|e| e.to_string())?)?.as_str() {
                    "lock-unlock" | "lock" => Mix::LockUnlock,
                    "try-lock" | "trylock" => Mix::TryLock,
                    o => return Err(format!("bad --mix {o:?} (lock-unlock | try-lock)")),
                }
            }
            Long("conn-mode") => {
                cfg.conn_mode = match s(p.value().map_err(|e| e.to_string())?)?.as_str() {
                    "persistent" => ConnMode::Persistent,
                    "per-request" => ConnMode::PerRequest,
                    "per-cycle" => ConnMode::PerCycle,
                    o => {
                        return Err(format!(
                            "bad --conn-mode {o:?} (persistent | per-request | per-cycle)"
                        ))
                    }
                }
            }
            Long("retry-backoff") => {
                cfg.retry_backoff_ns =
                    parse_duration_ns(&s(p.value().map_err(|e| e.to_string())?)?)?
            }
            Long("lock-ttl-ms") => {
                cfg.lock_ttl_ms = s(p.value().map_err(|e| e.to_string())?)?
                    .parse()
                    .map_err(|_| "bad --lock-ttl-ms")?
            }
            Long("key-prefix") => cfg.key_prefix = s(p.value().map_err(|e| e.to_string())?)?,
            Long("seed") => {
                cfg.seed = s(p.value().map_err(|e| e.to_string())?)?
                    .parse()
                    .map_err(|_| "bad --seed")?
            }
            Long("label") => cfg.label = s(p.value().map_err(|e| e.to_string())?)?,
            Long("access") => {
                cfg.access = parse_access(&s(p.value().map_err(|e| e.to_string())?)?)?
            }
            Long("writers") => {
                cfg.writers = s(p.value().map_err(|e| e.to_string())?)?
                    .parse()
                    .map_err(|_| "bad --writers")?
            }
            Long("fifo-guard") => {
                cfg.fifo_guard_ns = parse_duration_ns(&s(p.value().map_err(|e| e.to_string())?)?)?
            }
            Long("json") => cfg.json = true,
            Long("hgrm") => cfg.hgrm_path = Some(s(p.value().map_err(|e| e.to_string())?)?),
            Long("latency-log") => {
                cfg.latency_log = Some(s(p.value().map_err(|e| e.to_string())?)?)
            }
            Long("no-progress") => cfg.progress = false,
            Long("threads") => {
                cfg.threads = s(p.value().map_err(|e| e.to_string())?)?
                    .parse()
                    .map_err(|_| "bad --threads")?
            }
            Long("pin-cpus") => {
                cfg.pin_cpus = Some(parse_cpu_list(&s(p
                    .value()
                    .map_err(|e| e.to_string())?)?)?)
            }
            Long("cycles") => {
                cfg.cycles = Some(
                    s(p.value().map_err(|e| e.to_string())?)?
                        .parse()
                        .map_err(|_| "bad --cycles")?,
                )
            }
            Long("tls-certs-dir") => {
                tls_dir = Some(PathBuf::from(p.value().map_err(|e| e.to_string())?))
            }
            Long("tls-client") => tls_client = Some(s(p.value().map_err(|e| e.to_string())?)?),
            Long("help") | Short('h') => return Err(USAGE.to_string()),
            Long("version") | Short('V') => return Err(VERSION.to_string()),
            other => return Err(format!("{}\n{USAGE}", other.unexpected())),
        }
    }
    cfg.target = target.ok_or_else(|| format!("--target is required\n{USAGE}"))?;
    if cfg.connections == 0 {
        return Err("--connections must be at least 1".into());
    }
    if cfg.keys == 0 {
        return Err("--keys must be at least 1".into());
    }
    if cfg.threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    if cfg.threads > cfg.connections {
        return Err(format!(
            "--threads {} exceeds --connections {}: every thread drives at least one client",
            cfg.threads, cfg.connections
        ));
    }
    if cfg.rate_per_s < 0.0 || !cfg.rate_per_s.is_finite() {
        return Err("--rate must be >= 0".into());
    }
    if cfg.conn_mode == ConnMode::PerRequest && !cfg.target.lock_outlives_connection() {
        return Err(format!(
            "--conn-mode per-request is not applicable to {}: its locks are bound to the \
             session and released when the connection closes",
            cfg.target.scheme()
        ));
    }
    if cfg.mix == Mix::TryLock && cfg.target.kind == Kind::Etcd {
        return Err(
            "--mix try-lock is not available for etcd: its lock API has no try-lock".into(),
        );
    }
    if cfg.access != Access::Exclusive && cfg.target.kind != Kind::Session {
        return Err(format!(
            "--access {}: shared and semaphore holds are ringlock-session:// only, not {}",
            access_name(cfg.access),
            cfg.target.scheme()
        ));
    }
    if cfg.writers > 0 {
        if cfg.target.kind != Kind::Session {
            return Err(format!(
                "--writers: mixed readers and writers are ringlock-session:// only, not {}",
                cfg.target.scheme()
            ));
        }
        if cfg.access == Access::Exclusive {
            return Err(
                "--writers: the readers' --access must be shared or semaphore:N \
                 (the writers are exclusive)"
                    .into(),
            );
        }
        if cfg.mix != Mix::LockUnlock {
            return Err("--writers: lock-unlock only (a try-lock never waits in the queue)".into());
        }
        if cfg.writers > cfg.connections {
            return Err(format!(
                "--writers {} exceeds --connections {}",
                cfg.writers, cfg.connections
            ));
        }
    }
    if cfg.cycles == Some(0) {
        return Err("--cycles must be at least 1".into());
    }
    match (tls_dir, tls_client) {
        (None, Some(_)) => return Err("--tls-client needs --tls-certs-dir".into()),
        (None, None) => {}
        (Some(certs_dir), client) => {
            if !matches!(cfg.target.kind, Kind::Ringlock | Kind::Session) {
                return Err(format!(
                    "--tls-certs-dir: TLS is implemented for ringlock:// and \
                     ringlock-session:// targets, not {}",
                    cfg.target.scheme()
                ));
            }
            cfg.tls = Some(TlsOpts { certs_dir, client });
        }
    }
    if cfg.key_prefix.len() > 100 {
        return Err("--key-prefix too long".into());
    }
    Ok(cfg)
}

/// `exclusive`, `shared` or `semaphore:N` (N >= 1).
fn parse_access(v: &str) -> Result<Access, String> {
    match v {
        "exclusive" => Ok(Access::Exclusive),
        "shared" => Ok(Access::Shared),
        _ => match v.strip_prefix("semaphore:").map(str::parse::<u32>) {
            Some(Ok(n)) if n >= 1 => Ok(Access::Semaphore(n)),
            _ => Err(format!(
                "bad --access {v:?} (exclusive | shared | semaphore:N, N >= 1)"
            )),
        },
    }
}

/// How `--access` names `a` (the report's wording too).
pub fn access_name(a: Access) -> String {
    match a {
        Access::Exclusive => "exclusive".into(),
        Access::Shared => "shared".into(),
        Access::Semaphore(n) => format!("semaphore:{n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("3s").unwrap(), 3_000_000_000);
        assert_eq!(parse_duration_ns("250us").unwrap(), 250_000);
        assert_eq!(parse_duration_ns("1.5ms").unwrap(), 1_500_000);
        assert_eq!(parse_duration_ns("2").unwrap(), 2_000_000_000);
        assert_eq!(parse_duration_ns("1m").unwrap(), 60_000_000_000);
        assert!(parse_duration_ns("3 parsecs").is_err());
        assert!(parse_duration_ns("").is_err());
    }

    #[test]
    fn targets() {
        let t = parse_target("ringlock://127.0.0.1:22119").unwrap();
        assert_eq!(
            (t.kind, t.host.as_str(), t.port),
            (Kind::Ringlock, "127.0.0.1", 22119)
        );
        let t = parse_target("postgres://bench@127.0.0.1:5433/lockdb").unwrap();
        assert_eq!(
            t.kind,
            Kind::Postgres {
                user: "bench".into(),
                db: "lockdb".into(),
                password: String::new()
            }
        );
        assert_eq!(t.port, 5433);
        let t = parse_target("mysql://u:p@localhost:3307").unwrap();
        assert_eq!(
            t.kind,
            Kind::Mysql {
                user: "u".into(),
                password: "p".into()
            }
        );
        let t = parse_target("ringlock-session://127.0.0.1").unwrap();
        assert_eq!((t.kind, t.port), (Kind::Session, 22119));
        let t = parse_target("redis://127.0.0.1").unwrap();
        assert_eq!(t.port, 6379);
        assert!(parse_target("ftp://x:1").is_err());
        assert!(parse_target("127.0.0.1:1").is_err());
        for bad in ["http://127.0.0.1:2379", "https://h", "memcached://h:1"] {
            let e = parse_target(bad).unwrap_err();
            assert!(
                e.contains("unknown scheme") && e.contains("etcd"),
                "{bad}: {e}"
            );
        }
        assert!(parse_target("http://h:1")
            .unwrap_err()
            .contains("etcd://HOST:PORT"));
        assert_eq!(parse_target("etcd://h").unwrap().port, 2379);
        assert!(parse_target("redis://h:99999").is_err());
    }

    #[test]
    fn args_and_rules() {
        let a = |v: &[&str]| parse_args(v.iter().map(std::ffi::OsString::from));
        let c = a(&[
            "--target",
            "redis://127.0.0.1:1",
            "--connections",
            "4",
            "--rate",
            "1000",
            "--dist",
            "zipf:0.99",
            "--hold",
            "1ms",
            "--json",
        ])
        .unwrap();
        assert_eq!(c.connections, 4);
        assert_eq!(c.hold_ns, 1_000_000);
        assert!(c.json);
        assert!(a(&[
            "--target",
            "postgres://u@h:1/d",
            "--conn-mode",
            "per-request"
        ])
        .is_err());
        let e = a(&[
            "--target",
            "ringlock-session://h:1",
            "--conn-mode",
            "per-request",
        ])
        .unwrap_err();
        assert!(e.contains("bound to the session"), "{e}");
        assert!(a(&["--connections", "1"]).is_err());
        assert!(a(&["--target", "etcd://h:1", "--mix", "try-lock"]).is_err());
    }

    #[test]
    fn access_is_for_session_targets() {
        let a = |v: &[&str]| parse_args(v.iter().map(std::ffi::OsString::from));
        let s = |acc: &str| a(&["--target", "ringlock-session://h:1", "--access", acc]);
        assert_eq!(
            a(&["--target", "ringlock-session://h:1"]).unwrap().access,
            Access::Exclusive
        );
        assert_eq!(s("shared").unwrap().access, Access::Shared);
        assert_eq!(s("semaphore:4").unwrap().access, Access::Semaphore(4));
        assert_eq!(s("exclusive").unwrap().access, Access::Exclusive);
        for bad in ["semaphore:0", "semaphore:", "semaphore:x", "reader"] {
            let e = s(bad).unwrap_err();
            assert!(e.contains("bad --access"), "{bad}: {e}");
        }
        let e = a(&["--target", "ringlock://h:1", "--access", "shared"]).unwrap_err();
        assert!(e.contains("ringlock-session:// only"), "{e}");
        // The other way round is fine: exclusive is every target's.
        a(&["--target", "redis://h:1", "--access", "exclusive"]).unwrap();
    }

    #[test]
    fn writers_make_a_mixed_session_run() {
        let a = |v: &[&str]| parse_args(v.iter().map(std::ffi::OsString::from));
        let c = a(&["--target", "ringlock-session://h:1"]).unwrap();
        assert_eq!((c.writers, c.fifo_guard_ns), (0, 50_000), "defaults");
        let c = a(&[
            "--target",
            "ringlock-session://h:1",
            "--connections",
            "10",
            "--access",
            "shared",
            "--writers",
            "1",
            "--fifo-guard",
            "20us",
        ])
        .unwrap();
        assert_eq!((c.writers, c.fifo_guard_ns), (1, 20_000));
        let session = ["--target", "ringlock-session://h:1", "--connections", "2"];
        let with = |extra: &[&str]| a(&[&session[..], extra].concat());
        for (extra, says) in [
            (&["--writers", "1"][..], "must be shared or semaphore"),
            (
                &["--writers", "1", "--access", "shared", "--mix", "try-lock"],
                "lock-unlock only",
            ),
            (
                &["--writers", "3", "--access", "shared"],
                "exceeds --connections",
            ),
            (&["--writers", "x"], "bad --writers"),
        ] {
            let e = with(extra).unwrap_err();
            assert!(e.contains(says), "{extra:?}: {e}");
        }
        with(&["--writers", "2", "--access", "semaphore:3"]).unwrap();
        let e = a(&["--target", "ringlock://h:1", "--writers", "1"]).unwrap_err();
        assert!(e.contains("ringlock-session:// only"), "{e}");
    }

    #[test]
    fn tls_per_cycle_and_cycle_caps() {
        let a = |v: &[&str]| parse_args(v.iter().map(std::ffi::OsString::from));
        let c = a(&["--target", "ringlock-session://h:1"]).unwrap();
        assert_eq!(
            (c.tls, c.cycles),
            (None, None),
            "defaults: plaintext, no cap"
        );
        let c = a(&[
            "--target",
            "ringlock-session://h:1",
            "--tls-certs-dir",
            "/certs",
            "--tls-client",
            "bench",
            "--conn-mode",
            "per-cycle",
            "--cycles",
            "1000",
        ])
        .unwrap();
        assert_eq!(
            c.tls,
            Some(TlsOpts {
                certs_dir: "/certs".into(),
                client: Some("bench".into())
            })
        );
        assert_eq!((c.conn_mode, c.cycles), (ConnMode::PerCycle, Some(1000)));
        let c = a(&["--target", "ringlock://h:1", "--tls-certs-dir", "d"]).unwrap();
        assert_eq!(c.tls.unwrap().client, None);
        // Per-cycle is fine for session-bound locks (the lock dies with
        // the connection after its Unlock).
        assert!(a(&["--target", "postgres://u@h:1/d", "--conn-mode", "per-cycle"]).is_ok());
        let e = a(&["--target", "ringlock://h:1", "--tls-client", "x"]).unwrap_err();
        assert!(e.contains("needs --tls-certs-dir"), "{e}");
        let e = a(&["--target", "redis://h:1", "--tls-certs-dir", "d"]).unwrap_err();
        assert!(e.contains("not redis"), "{e}");
        assert!(a(&["--target", "ringlock://h:1", "--cycles", "0"]).is_err());
        assert!(a(&["--target", "ringlock://h:1", "--cycles", "x"]).is_err());
    }

    #[test]
    fn threads_and_cpu_lists() {
        let a = |v: &[&str]| parse_args(v.iter().map(std::ffi::OsString::from));
        let c = a(&["--target", "ringlock://h:1"]).unwrap();
        assert_eq!(
            (c.threads, c.pin_cpus),
            (1, None),
            "defaults: one thread, no pinning"
        );
        let c = a(&[
            "--target",
            "ringlock://h:1",
            "--connections",
            "8",
            "--threads",
            "4",
            "--pin-cpus",
            "2-3,0",
        ])
        .unwrap();
        assert_eq!(c.threads, 4);
        assert_eq!(c.pin_cpus, Some(vec![2, 3, 0]));
        let err = a(&[
            "--target",
            "ringlock://h:1",
            "--connections",
            "2",
            "--threads",
            "3",
        ])
        .unwrap_err();
        assert!(err.contains("exceeds --connections"), "{err}");
        assert!(a(&["--target", "ringlock://h:1", "--threads", "0"]).is_err());
        assert_eq!(parse_cpu_list("0,1").unwrap(), vec![0, 1]);
        assert_eq!(parse_cpu_list("2-5").unwrap(), vec![2, 3, 4, 5]);
        for bad in ["", "a", "3-1", "1,1", "0-1024", "1-", "-2"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?} accepted");
        }
    }
}
