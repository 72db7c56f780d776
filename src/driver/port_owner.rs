//! Who holds a port that a bind found in use: a live listener (another
//! ringlockd, any server) or the socket of a predecessor that died and is
//! still closing.
//!
//! `listen` retries an address in use for `--bind-retry-ms` because, after
//! `kill -9`, the dead process's io_uring may keep its listener bound for a
//! while. Waiting is pointless when a live process listens there, so before
//! the first retry the listener is looked up:
//!
//! 1. `/proc/net/tcp` and `tcp6` list every listening socket with its
//!    address, port, owner uid and inode;
//! 2. a live process that has one of those inodes among its descriptors
//!    (`/proc/PID/fd/*` → `socket:[INODE]`) owns it: fail at once, naming
//!    it. A dead predecessor's socket is held by its ring only (the fd
//!    table went away with the process), and a process still exiting
//!    (`PF_EXITING`) or a zombie does not count, so no live process is
//!    found and the retry goes on.
//! 3. Another user's descriptors cannot be read without privilege: when the
//!    socket belongs to another uid and we are not root, a connection is
//!    tried instead, and one that is accepted and neither reset nor closed
//!    within 100 ms is taken as a live server. (A connect alone cannot tell:
//!    a dying predecessor's listener still completes the handshake, then
//!    resets the connection; a live lock port is silent until asked.)
//!
//! Anything else (no `/proc`, no such listener, an unreadable table) is
//! `None`: the caller keeps retrying, as before.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// `PF_EXITING` in /proc/PID/stat's flags: the process is being torn down.
const PF_EXITING: u64 = 0x4;

/// One listening socket from `/proc/net/tcp{,6}`.
#[derive(Debug, PartialEq, Eq)]
struct Listening {
    addr: SocketAddr,
    uid: u32,
    inode: u64,
}

/// A live listener on `addr`, described for the error line ("pid 4242
/// (ringlockd) listens there"), or `None` when none can be seen.
pub(super) fn live_listener(addr: SocketAddr) -> Option<String> {
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            found.extend(
                parse_table(&text)
                    .into_iter()
                    .filter(|l| conflicts(l.addr, addr)),
            );
        }
    }
    if found.is_empty() {
        return None;
    }
    if let Some((pid, comm)) = owner(&found) {
        return Some(format!("pid {pid} ({comm}) listens there"));
    }
    // SAFETY: geteuid cannot fail and touches no memory. A wrong uid would
    // only pick the slower probe for our own sockets; tests/busy_port.rs's
    // live-port test names the holder's pid, which needs this path.
    let me = unsafe { libc::geteuid() };
    if me == 0 || found.iter().all(|l| l.uid == me) {
        // We could read every candidate's descriptors: nobody holds it.
        return None;
    }
    let uid = found.iter().find(|l| l.uid != me).map_or(0, |l| l.uid);
    accepts_and_stays(addr).then(|| format!("a server of uid {uid} accepts connections there"))
}

/// Whether a listener on `theirs` takes the port `ours` asks for: same
/// port, and the same address or either one the wildcard.
fn conflicts(theirs: SocketAddr, ours: SocketAddr) -> bool {
    let unspecified = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.is_unspecified(),
        IpAddr::V6(v6) => v6.is_unspecified(),
    };
    let canonical = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    theirs.port() == ours.port()
        && (unspecified(theirs.ip())
            || unspecified(ours.ip())
            || canonical(theirs.ip()) == canonical(ours.ip()))
}

/// The listening sockets of one `/proc/net/tcp` or `tcp6` table.
fn parse_table(text: &str) -> Vec<Listening> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
            if f.len() < 10 || f[3] != "0A" {
                return None;
            }
            Some(Listening {
                addr: parse_addr(f[1])?,
                uid: f[7].parse().ok()?,
                inode: f[9].parse().ok()?,
            })
        })
        .collect()
}

/// `0100007F:5FA7` (IPv4) or 32 hex digits and a port (IPv6): each 32-bit
/// word as the kernel printed it, the network-order bytes read as a native
/// integer.
fn parse_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = ip.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The first live process (not a zombie) that has one of the sockets open.
fn owner(found: &[Listening]) -> Option<(u32, String)> {
    let wanted: Vec<String> = found
        .iter()
        .map(|l| format!("socket:[{}]", l.inode))
        .collect();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| wanted.iter().any(|w| target.as_os_str() == w.as_str()))
        });
        if !holds {
            continue;
        }
        // Fields after the comm: state (3), ..., flags (9). A zombie holds
        // nothing; a process that is exiting (PF_EXITING, `kill -9` a moment
        // ago) will let go without help: both are waited for.
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let rest: Vec<&str> = stat
            .rsplit_once(") ")
            .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
        let exiting = rest
            .get(6)
            .and_then(|f| f.parse::<u64>().ok())
            .is_some_and(|flags| flags & PF_EXITING != 0);
        if exiting || rest.first().is_some_and(|st| st.starts_with(['Z', 'X'])) {
            continue;
        }
        let comm = std::fs::read_to_string(entry.path().join("comm"))
            .map(|c| c.trim_end().to_string())
            .unwrap_or_else(|_| "?".into());
        return Some((pid, comm));
    }
    None
}

/// A connection to `addr` (loopback for a wildcard) is accepted and is
/// neither reset nor closed within 100 ms.
fn accepts_and_stays(addr: SocketAddr) -> bool {
    let target = match addr.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(v6) if v6.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    };
    let Ok(mut conn) = TcpStream::connect_timeout(&target, Duration::from_millis(200)) else {
        return false;
    };
    if conn
        .set_read_timeout(Some(Duration::from_millis(100)))
        .is_err()
    {
        return false;
    }
    let mut byte = [0u8; 1];
    match conn.read(&mut byte) {
        // It spoke first: alive.
        Ok(n) if n > 0 => true,
        // Closed or reset: a dying listener's queue being flushed.
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn parses_the_kernels_tables() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 0100007F:5FA7 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 123456 1 0000000000000000 100 0 0 10 0\n\
           1: 0100007F:5FA7 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 654321 1 0000000000000000 20 4 30 10 -1\n\
           2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0\n";
        assert_eq!(
            parse_table(v4),
            [
                Listening {
                    addr: "127.0.0.1:24487".parse().unwrap(),
                    uid: 1000,
                    inode: 123456
                },
                Listening {
                    addr: "0.0.0.0:22".parse().unwrap(),
                    uid: 0,
                    inode: 777
                },
            ]
        );
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 42 1 0000000000000000 100 0 0 10 0\n";
        assert_eq!(
            parse_table(v6)[0].addr,
            "[::1]:8080".parse::<SocketAddr>().unwrap()
        );
    }

    #[test]
    fn wildcards_conflict_with_every_address_of_the_port() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(conflicts(a("0.0.0.0:80"), a("127.0.0.1:80")));
        assert!(conflicts(a("127.0.0.1:80"), a("0.0.0.0:80")));
        assert!(conflicts(a("[::]:80"), a("10.0.0.1:80")));
        assert!(conflicts(a("[::ffff:127.0.0.1]:80"), a("127.0.0.1:80")));
        assert!(!conflicts(a("127.0.0.1:80"), a("127.0.0.2:80")));
        assert!(!conflicts(a("0.0.0.0:81"), a("0.0.0.0:80")));
    }

    #[test]
    fn a_listener_of_this_process_is_found_and_named() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let who = live_listener(addr).expect("our own listener is live");
        assert!(
            who.starts_with(&format!("pid {} (", std::process::id())),
            "{who}"
        );
        drop(l);
        assert_eq!(live_listener(addr), None, "nothing listens any more");
    }
}
