//! Every limit and default in one place.
//!
//! | setting | flag / env | default |
//! |---|---|---|
//! | lock port address | `--bind` / `BIND_ADDRESS` | `127.0.0.1:22119` |
//! | admin port address | `--admin-bind` | loopback, lock port + 1 |
//! | metrics address | `--metrics-bind` | off |
//! | write-ahead log | `--data-path` / `DATA_PATH` | off (in memory) |
//! | max connections (lock port) | `--max-connections` | 10 000 |
//! | admin port connections, apart from those | `--admin-connections` | 16 |
//! | idle connection timeout | `--idle-timeout-ms` | 60 000 (0 = never) |
//! | max keys (server-wide) | `--max-keys` | 100 000 |
//! | max queued waiters (server-wide) | `--max-waiters` | 100 000 |
//! | frame read timeout | `--frame-timeout-ms` | 10 000 |
//! | compaction floor | `--compact-floor-bytes` | 1 MiB |
//! | zero-filled space kept ahead of the log's end | `--wal-preallocate-bytes` | 1 MiB (0 = off, at most 8 MiB) |
//! | bind retry while a port is still in use | `--bind-retry-ms` | 10 000 |
//! | shards (event-loop threads) | `--threads` / `RINGLOCK_THREADS` | one per CPU in the affinity mask |
//! | liveness timeout | `--liveness-timeout-ms` | 10 000 |
//! | session keep-alive deadline (default, bounds) | `--keepalive-ms`, `--min-keepalive-ms`, `--max-keepalive-ms` | 10 000 (300 .. 600 000) |
//! | lease TTL bounds | `--min-ttl-ms`, `--max-ttl-ms` | 10 .. 86 400 000 (a day) |
//! | shared secret for session Hellos and a non-loopback admin port | `--auth-token-file` | none |
//! | who may Unlock / ResetByKey / ResetBySource on the lock port | `--lc-admin-actions` | `any` |

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

pub const DEFAULT_LOCK_PORT: u16 = 22119;
/// Receive buffer of a lock-port connection: two whole frames, so a client
/// may send its next request before the previous answer arrives.
pub const LOCK_RECV_BUF: usize = 512;
/// Submission queue entries.
pub const RING_ENTRIES: u32 = 4096;
/// An event loop wakes at least this often, idle or not, and publishes a
/// heartbeat each time (liveness reads it; see `metrics`).
pub const HEARTBEAT_INTERVAL_MS: u64 = 500;
/// Default `--liveness-timeout-ms`: a loop silent this long is hung (it
/// wakes every [`HEARTBEAT_INTERVAL_MS`] even when idle).
pub const LIVENESS_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Smallest accepted `--liveness-timeout-ms`: two heartbeat intervals, so one
/// late wake-up is never mistaken for a hung loop.
pub const LIVENESS_TIMEOUT_MS_MIN: u64 = 2 * HEARTBEAT_INTERVAL_MS;
/// Largest `--wal-preallocate-bytes`: one growth step is one write from a
/// static zero buffer of this size.
pub const WAL_PREALLOCATE_MAX_BYTES: u64 = 8 << 20;
/// Smallest non-zero `--wal-preallocate-bytes`: one page.
pub const WAL_PREALLOCATE_MIN_BYTES: u64 = 4096;

/// Default of [`Config::idle_poll_us`].
pub const IDLE_POLL_US_DEFAULT: u64 = 50;
/// Largest accepted [`Config::idle_poll_us`]: polling longer than this
/// buys nothing a sleep would not (the next request is that far away).
pub const IDLE_POLL_US_MAX: u64 = 10_000;

#[derive(Clone, Debug)]
pub struct Config {
    pub bind: SocketAddr,
    pub admin_bind: SocketAddr,
    pub metrics_bind: Option<SocketAddr>,
    pub data_path: Option<PathBuf>,
    pub max_connections: usize,
    /// Admin-port connections, counted apart from `max_connections`.
    pub admin_connections: usize,
    /// A connection with no request in flight and no bytes pending is
    /// closed after this long without traffic (0: never). Session
    /// connections follow their keep-alive deadline instead.
    pub idle_timeout_ms: u64,
    /// Before an idle event loop sleeps, it polls its ring for up to this
    /// long (yielding the CPU to anything runnable between polls), so that
    /// the next request finds it awake instead of waking a halted CPU
    /// (tens of microseconds on a VM). 0: sleep at once. Only when each
    /// shard has a CPU of its own.
    pub idle_poll_us: u64,
    pub max_keys: usize,
    pub max_waiters: usize,
    pub frame_timeout_ms: u64,
    /// The log is never compacted below this size.
    pub compact_floor_bytes: u64,
    /// Zero-filled, synced space kept ahead of the log's end, so an append
    /// overwrites zeros and its fdatasync has no file size to commit (0:
    /// off, the file grows with every append). See docs/wal.md.
    pub wal_preallocate_bytes: u64,
    /// Operator's explicit consent to drop a corrupt log tail at this offset.
    pub wal_truncate_at: Option<u64>,
    /// Test-only storage fault injection (`RINGLOCK_FAULTS`).
    pub faults: Option<String>,
    /// After `kill -9` the predecessor's io_uring can keep its listener
    /// bound for a while: binding is retried this long.
    pub bind_retry_ms: u64,
    /// Shards (event loops, one thread each); 0 = one per CPU of the
    /// process's affinity mask.
    pub threads: usize,
    /// `/livez` (and `/readyz`, `/healthz`) fail once an event loop's last
    /// heartbeat is older than this.
    pub liveness_timeout_ms: u64,
    /// A session's keep-alive deadline when its Hello asks for none, and the
    /// bounds a requested one is clamped to.
    pub keepalive_ms: u32,
    pub min_keepalive_ms: u32,
    pub max_keepalive_ms: u32,
    /// Bounds of a lease's TTL.
    pub min_ttl_ms: u32,
    pub max_ttl_ms: u32,
    /// The shared secret (`--auth-token-file`): session Hellos must carry
    /// it, and so must an admin connection when the admin port is not on
    /// loopback.
    pub auth_token: Option<Vec<u8>>,
    /// Who may use the lock port's destructive Locking-Center actions.
    pub lc_admin_actions: LcAdminActions,
    /// `--certs-dir`: `ca.crt`, `node.crt`, `node.key`; mutual TLS on the
    /// peer (Raft) links. Re-read on SIGHUP.
    pub certs_dir: Option<PathBuf>,
    /// `--insecure`: a cluster without certificates (its peer links are
    /// open to anyone who reaches them). Refused without `--peers`.
    pub insecure: bool,
    /// `--client-cert-auth` (needs `--certs-dir`): TLS clients of the lock
    /// and admin ports must present a client certificate signed by the CA.
    pub client_cert_auth: bool,
    /// `--lc-plaintext` (needs `--certs-dir`): plaintext Locking-Center
    /// requests are still served on the lock port (its clients cannot
    /// speak TLS); session frames always need TLS then.
    pub lc_plaintext: bool,
    /// `--client-plaintext` (needs `--certs-dir`): the lock and admin
    /// ports also take plaintext clients, as without certificates (TLS
    /// stays available; the peer links stay mutual TLS).
    pub client_plaintext: bool,
}

impl Config {
    /// Sessions and admin connections must come over TLS (`--certs-dir`
    /// without `--client-plaintext`).
    pub fn client_tls_required(&self) -> bool {
        self.certs_dir.is_some() && !self.client_plaintext
    }

    /// Plaintext Locking-Center requests are refused on the lock port.
    pub fn lc_tls_required(&self) -> bool {
        self.client_tls_required() && !self.lc_plaintext
    }

    /// Every admin connection must authenticate (a client certificate or
    /// the auth token), also on loopback: some authentication is
    /// configured (a token, or certificates the port requires TLS for).
    pub fn admin_auth_required(&self) -> bool {
        self.auth_token.is_some() || self.client_tls_required()
    }
}

/// `--lc-admin-actions`: Unlock, ResetByKey and ResetBySource on the lock
/// port have no owner check (Locking-Center semantics); this restricts who
/// may send them. Session releases are owner-checked and always allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LcAdminActions {
    /// Every client (Locking-Center behaviour).
    Any,
    /// Only clients connecting from a loopback address.
    Loopback,
    /// Nobody: Locking-Center clients may Lock and TryLock only.
    Off,
}

impl LcAdminActions {
    pub fn parse(s: &str) -> Option<LcAdminActions> {
        match s {
            "any" => Some(LcAdminActions::Any),
            "loopback" => Some(LcAdminActions::Loopback),
            "off" => Some(LcAdminActions::Off),
            _ => None,
        }
    }

    /// May a client at `peer` send Unlock / ResetByKey / ResetBySource?
    pub fn allows(self, peer: &std::net::SocketAddr) -> bool {
        match self {
            LcAdminActions::Any => true,
            LcAdminActions::Loopback => peer.ip().is_loopback(),
            LcAdminActions::Off => false,
        }
    }
}

/// Constant-time comparison of a presented secret with the configured one.
pub fn token_matches(want: &[u8], got: &[u8]) -> bool {
    let mut diff = (want.len() != got.len()) as u8;
    for (i, w) in want.iter().enumerate() {
        diff |= w ^ got.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// Reads the shared secret from `path`: the file's bytes without trailing
/// whitespace, 1 to 255 bytes.
pub fn read_auth_token(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let mut b =
        std::fs::read(path).map_err(|e| format!("--auth-token-file {}: {e}", path.display()))?;
    while b.last().is_some_and(|c| c.is_ascii_whitespace()) {
        b.pop();
    }
    if b.is_empty() || b.len() > 255 {
        return Err(format!(
            "--auth-token-file {}: the token must be 1 to 255 bytes, not {}",
            path.display(),
            b.len()
        ));
    }
    Ok(b)
}

impl Config {
    /// Defaults for a lock port address; the admin port is loopback on the
    /// next port (or an ephemeral port when the lock port is ephemeral).
    pub fn new(bind: SocketAddr) -> Config {
        Config {
            bind,
            admin_bind: default_admin(bind),
            metrics_bind: None,
            data_path: None,
            max_connections: 10_000,
            admin_connections: 16,
            idle_timeout_ms: 60_000,
            idle_poll_us: IDLE_POLL_US_DEFAULT,
            max_keys: 100_000,
            max_waiters: 100_000,
            frame_timeout_ms: 10_000,
            compact_floor_bytes: 1 << 20,
            wal_preallocate_bytes: 1 << 20,
            wal_truncate_at: None,
            faults: None,
            bind_retry_ms: 10_000,
            threads: 0,
            liveness_timeout_ms: LIVENESS_TIMEOUT_MS_DEFAULT,
            keepalive_ms: 10_000,
            min_keepalive_ms: 300,
            max_keepalive_ms: 600_000,
            min_ttl_ms: 10,
            max_ttl_ms: 86_400_000,
            auth_token: None,
            lc_admin_actions: LcAdminActions::Any,
            certs_dir: None,
            insecure: false,
            client_cert_auth: false,
            lc_plaintext: false,
            client_plaintext: false,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::new(SocketAddr::from((Ipv4Addr::LOCALHOST, DEFAULT_LOCK_PORT)))
    }
}

pub fn default_admin(bind: SocketAddr) -> SocketAddr {
    let port = if bind.port() == 0 {
        0
    } else {
        bind.port().wrapping_add(1)
    };
    let ip = if bind.ip().is_ipv6() {
        IpAddr::from(std::net::Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::from(Ipv4Addr::LOCALHOST)
    };
    SocketAddr::new(ip, port)
}

/// Parses an address the way Locking-Center's `BIND_ADDRESS` does: `:22119`
/// means all interfaces; `host:port` and `ip:port` as usual.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("invalid port in address {s:?}"))?;
        return Ok(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.to_socket_addrs()
        .map_err(|e| format!("invalid address {s:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("address {s:?} resolves to nothing"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locking_center_address_forms() {
        assert_eq!(
            parse_addr(":22119").unwrap(),
            "0.0.0.0:22119".parse().unwrap()
        );
        assert_eq!(
            parse_addr("127.0.0.1:1").unwrap(),
            "127.0.0.1:1".parse().unwrap()
        );
        assert!(parse_addr("nonsense").is_err());
        assert!(parse_addr(":99999").is_err());
        assert_eq!(
            default_admin("0.0.0.0:22119".parse().unwrap()),
            "127.0.0.1:22120".parse().unwrap()
        );
        assert_eq!(default_admin("127.0.0.1:0".parse().unwrap()).port(), 0);
    }

    #[test]
    fn lc_admin_policy_and_token_comparison() {
        let lo: SocketAddr = "127.0.0.1:5".parse().unwrap();
        let lo6: SocketAddr = "[::1]:5".parse().unwrap();
        let far: SocketAddr = "10.1.2.3:5".parse().unwrap();
        assert!(LcAdminActions::Any.allows(&far));
        assert!(LcAdminActions::Loopback.allows(&lo) && LcAdminActions::Loopback.allows(&lo6));
        assert!(!LcAdminActions::Loopback.allows(&far));
        assert!(!LcAdminActions::Off.allows(&lo));
        assert_eq!(
            LcAdminActions::parse("loopback"),
            Some(LcAdminActions::Loopback)
        );
        assert_eq!(LcAdminActions::parse("all"), None);
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abc", b"abd"));
        assert!(!token_matches(b"abc", b"ab"));
        assert!(!token_matches(b"abc", b"abcd"));
        assert!(!token_matches(b"abc", b""));
    }
}
