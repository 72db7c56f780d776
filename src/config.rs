//! Every limit and default in one place.
//!
//! `ringlockd` reads each setting from, in this order of precedence, its
//! command-line flag, its environment variable (`RINGLOCK_` and the flag's
//! name in capitals, `-` as `_`), its key in the `--config` TOML file (the
//! flag's name without the dashes, see [`file`](mod@file)), and the default below.
//! Durations are a number and a unit, `250ms`, `10s`, `1.5m`, `2h` (also
//! `us`): see [`parse_duration_as`].
//!
//! | setting | flag / env / file key | default |
//! |---|---|---|
//! | lock port address | `--bind` / `RINGLOCK_BIND` / `bind` | `127.0.0.1:22119` |
//! | admin port address | `--admin-bind` | loopback, lock port + 1 |
//! | metrics address | `--metrics-bind` | off |
//! | write-ahead log | `--data-path` / `RINGLOCK_DATA_PATH` / `data-path` | off (in memory) |
//! | max connections (lock port) | `--max-connections` | 10 000 |
//! | admin port connections, apart from those | `--admin-connections` | 16 |
//! | idle connection timeout | `--idle-timeout` | `60s` (0 = never) |
//! | idle event loop polling before it sleeps | `--idle-poll` | `50us` (0 = sleep at once, at most `10ms`) |
//! | max keys (server-wide) | `--max-keys` | 100 000 |
//! | max queued waiters (server-wide) | `--max-waiters` | 100 000 |
//! | frame read timeout | `--frame-timeout` | `10s` |
//! | compaction floor | `--compact-floor-bytes` | 1 MiB |
//! | zero-filled space kept ahead of the log's end | `--wal-preallocate-bytes` | 1 MiB (0 = off, at most 8 MiB) |
//! | bind retry while a port is still in use | `--bind-retry` | `10s` |
//! | shards (event-loop threads) | `--threads` | one per CPU in the affinity mask |
//! | liveness timeout | `--liveness-timeout` | `10s` (at least `1s`) |
//! | session keep-alive deadline (default, bounds) | `--keepalive`, `--min-keepalive`, `--max-keepalive` | `10s` (`300ms` .. `10m`) |
//! | lease TTL bounds | `--min-ttl`, `--max-ttl` | `10ms` .. `24h` |
//! | shared secret for session Hellos and a non-loopback admin port | `--auth-token-file` | none |
//! | who may Unlock / ResetByKey / ResetBySource on the lock port | `--lc-admin-actions` | `any` |
//!
//! Every flag has its environment variable and file key, named by the rule
//! above (`--max-keys`: `RINGLOCK_MAX_KEYS`, `max-keys`), except the
//! one-time operator actions `--wal-truncate-at` and `--force-new-cluster`
//! and `--check-config`, which are command-line flags only. Deprecated
//! but still read, with a warning: the millisecond flags (`--keepalive-ms
//! 10000` for `--keepalive 10s`, and `--idle-poll-us`), and the
//! environment variables `BIND_ADDRESS` and `DATA_PATH`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

#[cfg(feature = "server")]
pub mod file;

pub const DEFAULT_LOCK_PORT: u16 = 22119;
/// Receive buffer of a lock-port connection: two whole frames, so a client
/// may send its next request before the previous answer arrives.
pub const LOCK_RECV_BUF: usize = 512;
/// Submission queue entries.
pub const RING_ENTRIES: u32 = 4096;
/// An event loop wakes at least this often, idle or not, and publishes a
/// heartbeat each time (liveness reads it; see `metrics`).
pub const HEARTBEAT_INTERVAL_MS: u64 = 500;
/// Default `--liveness-timeout`: a loop silent this long is hung (it
/// wakes every [`HEARTBEAT_INTERVAL_MS`] even when idle).
pub const LIVENESS_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Smallest accepted `--liveness-timeout`: two heartbeat intervals, so one
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

/// What a number without a unit means to [`parse_duration_as`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BareNumber {
    /// Seconds: the `ringlock` CLI's `--timeout 5`.
    Seconds,
    /// Refused, except 0: `ringlockd`'s flags, environment and config file
    /// (`--keepalive 10` could mean seconds or, after `--keepalive-ms`,
    /// milliseconds; the refusal asks for the unit instead of guessing).
    Refused,
}

/// Parses `250ms`, `10s`, `1.5m`, `2h`, `500us` or a bare number of
/// seconds: the `ringlock` CLI's durations. See [`parse_duration_as`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    parse_duration_as(text, BareNumber::Seconds)
}

/// Parses a duration: a decimal number (`10`, `1.5`, `.5`) and a unit,
/// `us`, `ms`, `s`, `m` or `h`, nothing else (no sign, no space, no
/// exponent), below 10^9 seconds. The decimal is read exactly (`0.3s` is
/// 300 ms, not 299.999...); digits below a nanosecond are dropped. A
/// number without a unit reads as `bare` says.
pub fn parse_duration_as(text: &str, bare: BareNumber) -> Result<Duration, String> {
    const NS: u128 = 1_000_000_000;
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let bad = || format!("bad duration {text:?} (examples: 250ms, 10s, 1.5m, 2h)");
    let unit_ns: u128 = match unit {
        "" => NS,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => NS,
        "m" => 60 * NS,
        "h" => 3600 * NS,
        _ => return Err(bad()),
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(bad());
    }
    // 18 fractional digits are below a nanosecond of an hour.
    let frac = &frac[..frac.len().min(18)];
    let digits = |d: &str| -> Result<u128, String> {
        if d.is_empty() {
            Ok(0)
        } else {
            d.parse().map_err(|_| bad())
        }
    };
    let (int_v, frac_v) = (digits(int)?, digits(frac)?);
    if unit.is_empty() && bare == BareNumber::Refused && (int_v, frac_v) != (0, 0) {
        return Err(format!(
            "{text:?} has no unit: write {text}s or {text}ms (units: us, ms, s, m, h)"
        ));
    }
    let ns = int_v
        .checked_mul(unit_ns)
        .map(|n| n + frac_v * unit_ns / 10u128.pow(frac.len() as u32))
        .filter(|&n| n < 1_000_000_000 * NS)
        .ok_or_else(bad)?;
    Ok(Duration::from_nanos(ns as u64))
}

/// A `ringlockd` duration in whole milliseconds from `min_ms` to `max_ms`
/// (a bare number refused, see [`BareNumber::Refused`]).
pub fn duration_ms(text: &str, min_ms: u64, max_ms: u64) -> Result<u64, String> {
    let d = parse_duration_as(text, BareNumber::Refused)?;
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!("{text} is not a whole number of milliseconds"));
    }
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms < min_ms {
        return Err(format!("at least {}, not {text}", format_ms(min_ms)));
    }
    if ms > max_ms {
        return Err(format!("at most {}, not {text}", format_ms(max_ms)));
    }
    Ok(ms)
}

/// [`duration_ms`] in whole microseconds.
pub fn duration_us(text: &str, min_us: u64, max_us: u64) -> Result<u64, String> {
    let d = parse_duration_as(text, BareNumber::Refused)?;
    if d.subsec_nanos() % 1_000 != 0 {
        return Err(format!("{text} is not a whole number of microseconds"));
    }
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    if us < min_us {
        return Err(format!("at least {}, not {text}", format_us(min_us)));
    }
    if us > max_us {
        return Err(format!("at most {}, not {text}", format_us(max_us)));
    }
    Ok(us)
}

/// Milliseconds written as a duration [`duration_ms`] reads back
/// exactly, in the largest unit that divides them: `24h`, `10m`, `10s`,
/// `250ms`, `0s`.
pub fn format_ms(ms: u64) -> String {
    match ms {
        0 => "0s".into(),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// [`format_ms`] for microseconds: `50us`, `10ms`.
pub fn format_us(us: u64) -> String {
    if us.is_multiple_of(1000) {
        format_ms(us / 1000)
    } else {
        format!("{us}us")
    }
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

    #[test]
    fn durations_read_exactly() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("250ms"), Ok(ms(250)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0.3s"), Ok(ms(300)), "exact, not 299.999...");
        assert_eq!(parse_duration(".5s"), Ok(ms(500)));
        assert_eq!(parse_duration("1."), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("50us"), Ok(Duration::from_micros(50)));
        assert_eq!(
            parse_duration("1.0000000001s"),
            Ok(Duration::new(1, 0)),
            "below a nanosecond is dropped"
        );
        assert_eq!(
            parse_duration("999999999.999999999s"),
            Ok(Duration::new(999_999_999, 999_999_999))
        );
        for bad in [
            "",
            ".",
            "5x",
            "-1s",
            "1e3s",
            " 1s",
            "1 s",
            "1.2.3s",
            "1s ",
            "inf",
            "1000000000s",
            "99999999999999999999999999999999999999999h",
        ] {
            assert_eq!(
                parse_duration(bad),
                Err(format!(
                    "bad duration {bad:?} (examples: 250ms, 10s, 1.5m, 2h)"
                )),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn server_durations_need_a_unit_and_whole_units() {
        let refused = |t| parse_duration_as(t, BareNumber::Refused);
        assert_eq!(refused("0"), Ok(Duration::ZERO), "zero is zero in any unit");
        assert_eq!(refused("0.0"), Ok(Duration::ZERO));
        assert_eq!(
            refused("10"),
            Err("\"10\" has no unit: write 10s or 10ms (units: us, ms, s, m, h)".into())
        );
        assert_eq!(refused("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(duration_ms("1.5s", 1, 100_000), Ok(1500));
        assert_eq!(duration_ms("0", 0, 100_000), Ok(0));
        assert_eq!(
            duration_ms("1.5ms", 1, 100_000),
            Err("1.5ms is not a whole number of milliseconds".into())
        );
        assert_eq!(
            duration_ms("999ms", 1000, 100_000),
            Err("at least 1s, not 999ms".into())
        );
        assert_eq!(
            duration_ms("2m", 1, 100_000),
            Err("at most 100s, not 2m".into())
        );
        assert_eq!(duration_us("50us", 0, 10_000), Ok(50));
        assert_eq!(duration_us("10ms", 0, 10_000), Ok(10_000));
        assert_eq!(
            duration_us("11ms", 0, 10_000),
            Err("at most 10ms, not 11ms".into())
        );
        assert_eq!(
            duration_us("0.5us", 0, 10_000),
            Err("0.5us is not a whole number of microseconds".into())
        );
    }

    #[test]
    fn formatted_durations_read_back() {
        for (ms, text) in [
            (0, "0s"),
            (250, "250ms"),
            (1500, "1500ms"),
            (10_000, "10s"),
            (600_000, "10m"),
            (86_400_000, "24h"),
            (4_294_967_294, "4294967294ms"),
        ] {
            assert_eq!(format_ms(ms), text);
            assert_eq!(duration_ms(text, 0, u64::MAX), Ok(ms), "{text}");
        }
        assert_eq!(format_us(50), "50us");
        assert_eq!(format_us(10_000), "10ms");
        assert_eq!(duration_us(&format_us(1234), 0, u64::MAX), Ok(1234));
    }
}
