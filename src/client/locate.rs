//! Finding the cluster from the addresses a client was given: the node
//! directory ([`crate::protocol::locate`]: Locate on the lock port, `CADR`
//! on the admin port), the admin addresses it yields, and the walk of the
//! lock addresses that passes over a node answering `-` because it does
//! not serve (a cluster's follower).
//!
//! - **Admin addresses.** Unless the builder was given
//!   [`admin_addr`](super::ClientBuilder::admin_addr), the first admin
//!   command asks each lock address for its directory, whose first entry
//!   is that node's own admin address. A server without Locate (a
//!   Locking-Center server, an older ringlockd) leaves the old rule: the
//!   lock port + 1. The answer is kept; one made while an address did not
//!   answer at all is asked again after [`PARTIAL_KEEP`].
//! - **The walk.** A Locking-Center request goes first to the address
//!   that last served. A node that answers `-` is asked for its
//!   directory: if it serves, `-` is the answer; if not (a follower, a
//!   candidate), the request goes on to the leader it names (also when
//!   that address was not given) or the next address, and a round that
//!   ends without an answer (an election) is tried again after a pause
//!   under the retry policy. A server without Locate passes a `-` on to
//!   the next address while there is one (an older cluster's follower).

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::protocol::locate::{Directory, NodeAddrs};
use crate::protocol::session::{self as sp, Located};

use super::addr::DEFAULT_PORT;
use super::conn;
use super::stream::Dial;

/// How long admin addresses found while some lock address did not answer
/// are used before they are looked for again.
pub const PARTIAL_KEEP: Duration = Duration::from_secs(10);

/// Where the admin commands go, and how they are dialled (the names a
/// TLS dial verifies, discovered ones included).
#[derive(Debug)]
pub(super) struct Admin {
    pub addrs: Vec<SocketAddr>,
    pub dial: Dial,
}

/// The admin addresses as last found: given, discovered, or the guess.
#[derive(Debug)]
pub(super) struct AdminCache {
    pub admin: Arc<Admin>,
    /// Final (given, or every lock address answered); otherwise found at.
    pub until: Option<Instant>,
}

/// Why a Locate gave no directory.
#[derive(Debug)]
pub(super) enum LocateFail {
    /// The server answered, but not with a directory: a server without
    /// Locate (`-`, or a close), or a refusal (`tls_required`, ...).
    NoDirectory,
    /// It could not be reached or did not answer in time.
    Unreachable(io::Error),
}

/// One Locate on `addr` (its own connection), bounded by the timeouts.
pub(super) fn locate_at(
    dial: &Dial,
    addr: &SocketAddr,
    connect_timeout: Duration,
    io_timeout: Duration,
) -> std::result::Result<Directory, LocateFail> {
    let mut sock = dial
        .connect(addr, connect_timeout)
        .map_err(LocateFail::Unreachable)?;
    let _ = sock.set_nodelay(true);
    let mut frame = Vec::with_capacity(sp::HEADER + 1);
    sp::encode_locate(1, &mut frame);
    sock.set_write_timeout(Some(io_timeout))
        .and_then(|()| sock.write_all(&frame))
        .map_err(LocateFail::Unreachable)?;
    let deadline = Instant::now() + io_timeout;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    loop {
        match sp::decode_located(&buf) {
            Ok(Some(Located::Directory(d))) => return Ok(d),
            // Refused (`tls_required`, ...), or a server without Locate.
            Ok(Some(Located::Refused(..))) | Err(_) => return Err(LocateFail::NoDirectory),
            Ok(None) => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LocateFail::Unreachable(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no directory from {addr} within {io_timeout:?}"),
            )));
        }
        sock.set_read_timeout(Some(conn::nonzero(left)))
            .map_err(LocateFail::Unreachable)?;
        match sock.read(&mut chunk) {
            // A server without Locate closes (after `-`, or at once).
            Ok(0) => return Err(LocateFail::NoDirectory),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(LocateFail::Unreachable(e)),
        }
    }
}

/// An address a directory gives (`HOST:PORT`) as socket addresses: an
/// unspecified host is the one `reached` was dialled at; a host name is
/// resolved, and remembered in `dial` for TLS verification. `None` for
/// an empty or unusable address.
pub(super) fn resolve_advertised(text: &str, reached: IpAddr, dial: &mut Dial) -> Vec<SocketAddr> {
    let Ok((host, port)) = super::addr::split_host_port(text, DEFAULT_PORT) else {
        return Vec::new();
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        let ip = if ip.is_unspecified() { reached } else { ip };
        return vec![SocketAddr::new(ip, port)];
    }
    let found: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map(|a| a.collect())
        .unwrap_or_default();
    for a in &found {
        dial.name(*a, host);
    }
    found
}

/// Which lock-port address a Locking-Center request tries next (see the
/// module docs).
#[derive(Default)]
pub(super) struct Walk {
    /// The addresses that answered `-` in this round.
    pub(super) refused: Vec<SocketAddr>,
    /// Lock addresses of members the directories named (a leader not in
    /// the client's list).
    pub(super) extra: Vec<SocketAddr>,
    /// Names of the extra addresses, for a TLS dial.
    pub(super) dial: Option<Dial>,
    /// A node that refused said it does not serve: a round that ends
    /// without an answer is an election, waited out.
    pub(super) election: bool,
    /// The address to try first in the next round (a named leader).
    pub(super) first: Option<SocketAddr>,
}
