//! A client connection: plain TCP, or TLS over it (rustls, blocking).
//!
//! [`Stream`] is used through `&Stream` like `&TcpStream` is: one thread
//! may read while others write (the session client's I/O thread reads,
//! callers write their requests). With TLS both sides share one rustls
//! connection under a mutex, held only while records are encrypted or
//! decrypted, never across a blocking socket call; a second mutex orders
//! writers, so records leave in the order they were sealed.
//!
//! What is verified ([`Dial`]): the server's certificate chains to the
//! CA bundle (`ca.crt`), names a node, and is valid for the host the
//! caller dialled (its DNS name, or the IP address for an IP literal) —
//! an address a `not leader` hint named is verified the same way against
//! the hint's host. Nothing is written before the handshake completed, so
//! an auth token or a session id never reaches a server that was not
//! verified.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
#[cfg(feature = "tls")]
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[cfg(feature = "tls")]
use rustls::pki_types::ServerName;

#[cfg(feature = "tls")]
use crate::tls::ClientTls;

/// How a client dials: plaintext, or TLS with these certificates, and the
/// host name each configured address was given as (for verification).
#[derive(Clone, Debug, Default)]
pub struct Dial {
    #[cfg(feature = "tls")]
    tls: Option<ClientTls>,
    names: HashMap<SocketAddr, String>,
}

impl Dial {
    /// Plaintext.
    pub fn plain() -> Dial {
        Dial::default()
    }

    /// TLS with `tls`; `names`: the host each address was dialled by (an
    /// address without one is verified by its IP address).
    #[cfg(feature = "tls")]
    pub fn tls(tls: ClientTls, names: impl IntoIterator<Item = (SocketAddr, String)>) -> Dial {
        Dial {
            tls: Some(tls),
            names: names.into_iter().collect(),
        }
    }

    pub fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// Remembers that `addr` is dialled by `host` (a hint's host).
    pub(crate) fn name(&mut self, addr: SocketAddr, host: &str) {
        self.names.entry(addr).or_insert_with(|| host.to_string());
    }

    #[cfg(feature = "tls")]
    fn server_name(&self, addr: &SocketAddr) -> io::Result<ServerName<'static>> {
        match self.names.get(addr) {
            Some(host) => ServerName::try_from(host.clone()).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{host:?} cannot be verified as a server name: {e}"),
                )
            }),
            None => Ok(ServerName::IpAddress(addr.ip().into())),
        }
    }

    /// Connects to `addr` within `timeout` and, with TLS, completes the
    /// handshake within the same bound.
    pub(crate) fn connect(&self, addr: &SocketAddr, timeout: Duration) -> io::Result<Stream> {
        let deadline = Instant::now() + timeout;
        let sock = connect(addr, timeout)?;
        #[cfg(not(feature = "tls"))]
        {
            let _ = deadline;
            Ok(Stream { sock })
        }
        #[cfg(feature = "tls")]
        self.handshake(sock, addr, deadline, timeout)
    }

    #[cfg(feature = "tls")]
    fn handshake(
        &self,
        sock: TcpStream,
        addr: &SocketAddr,
        deadline: Instant,
        timeout: Duration,
    ) -> io::Result<Stream> {
        let Some(tls) = &self.tls else {
            return Ok(Stream { sock, tls: None });
        };
        let name = self.server_name(addr)?;
        let shown = format!("{name:?}");
        let mut conn = rustls::ClientConnection::new(tls.config(), name)
            .map_err(|e| io::Error::other(format!("TLS: {e}")))?;
        let (rt, wt) = (sock.read_timeout()?, sock.write_timeout()?);
        while conn.is_handshaking() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no TLS handshake with {addr} within {timeout:?}"),
                ));
            }
            sock.set_read_timeout(Some(left))?;
            sock.set_write_timeout(Some(left))?;
            conn.complete_io(&mut &sock).map_err(|e| match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no TLS handshake with {addr} within {timeout:?}"),
                ),
                _ => tls_error(addr, &shown, e),
            })?;
        }
        // Client Finished, and anything else rustls has, goes out now.
        while conn.wants_write() {
            conn.write_tls(&mut &sock)?;
        }
        sock.set_read_timeout(rt)?;
        sock.set_write_timeout(wt)?;
        Ok(Stream {
            sock,
            tls: Some(TlsSide {
                conn: Mutex::new(conn),
                write: Mutex::new(()),
            }),
        })
    }
}

/// Connects to `addr` within `timeout`, refusing a connection to itself.
///
/// With nothing listening on a port of the ephemeral range of this host
/// (a local server that is down, its port freed), a connect may be given
/// that same port as its own and complete to itself (TCP's simultaneous
/// open): every byte sent then comes back as the "server's" answer. A
/// client retrying a dead local server would read its own request as the
/// reply (seen: `KEYS` read back as a count of 1 398 359 371 keys), so
/// such a connection is closed and reported as refused, which callers
/// retry like any other (Go's dialer does the same).
fn connect(addr: &SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    refuse_self(TcpStream::connect_timeout(addr, timeout)?)
}

/// `sock` unless it is connected to itself (see [`connect`]).
fn refuse_self(sock: TcpStream) -> io::Result<TcpStream> {
    match (sock.local_addr(), sock.peer_addr()) {
        (Ok(local), Ok(peer)) if local == peer => Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("nothing listens on {peer} (the connection reached itself)"),
        )),
        _ => Ok(sock),
    }
}

/// A handshake error, said so a user can act on it.
#[cfg(feature = "tls")]
fn tls_error(addr: &SocketAddr, name: &str, e: io::Error) -> io::Error {
    let text = e.to_string();
    io::Error::new(
        e.kind(),
        format!(
            "TLS handshake with {addr} as {name} failed: {text}{}",
            tls_hint(&text)
        ),
    )
}

/// What a rustls error means for the user, if it is a common one.
#[cfg(feature = "tls")]
fn tls_hint(text: &str) -> &'static str {
    if text.contains("NotValidForName") || text.contains("not valid for name") {
        " (the server's certificate does not name the host dialled: dial a host its \
         certificate names, or make it again with that host)"
    } else if text.contains("UnknownIssuer") || text.contains("BadSignature") {
        " (the server's certificate is not signed by a CA in ca.crt)"
    } else if text.contains("Expired") || text.contains("NotValidYet") {
        " (a certificate is outside its validity period)"
    } else if text.contains("CertificateRequired") {
        " (the server requires a client certificate: give --client NAME, \
         ClientTls::load(dir, Some(NAME)))"
    } else if text.contains("BadCertificate")
        || text.contains("UnknownCA")
        || text.contains("DecryptError")
    {
        " (the server refused this client's certificate: is it signed by the server's CA?)"
    } else {
        ""
    }
}

/// A record-layer failure after the handshake (an alert from the server,
/// such as its refusal of this client's certificate).
#[cfg(feature = "tls")]
fn tls_io(e: rustls::Error) -> io::Error {
    let text = e.to_string();
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("TLS: {text}{}", tls_hint(&text)),
    )
}

#[cfg(feature = "tls")]
struct TlsSide {
    conn: Mutex<rustls::ClientConnection>,
    /// Held for a whole write: records are sealed and written in order.
    write: Mutex<()>,
}

#[cfg(feature = "tls")]
impl TlsSide {
    fn conn(&self) -> MutexGuard<'_, rustls::ClientConnection> {
        // rustls' state is consistent between calls; a panic elsewhere
        // while holding the lock leaves nothing half-done here.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One connection to a server (see the module).
pub struct Stream {
    sock: TcpStream,
    #[cfg(feature = "tls")]
    tls: Option<TlsSide>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("sock", &self.sock)
            .field("tls", &self.is_tls())
            .finish()
    }
}

impl Stream {
    /// A plaintext connection already made.
    #[cfg(test)]
    pub(crate) fn plain(sock: TcpStream) -> Stream {
        Stream {
            sock,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    pub fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// The socket under it (timeouts, options, polling).
    pub fn tcp(&self) -> &TcpStream {
        &self.sock
    }

    /// Plaintext already decrypted and not yet read: a reader must not
    /// wait for the socket before taking it.
    pub fn buffered(&self) -> bool {
        #[cfg(feature = "tls")]
        if let Some(t) = &self.tls {
            // `process_new_packets` reports what is ready without reading.
            return t
                .conn()
                .process_new_packets()
                .map(|st| st.plaintext_bytes_to_read() > 0)
                .unwrap_or(true);
        }
        false
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.sock.shutdown(how)
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(d)
    }

    pub fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.sock.set_write_timeout(d)
    }

    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.sock.set_nodelay(on)
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.sock.peer_addr()
    }

    #[cfg(feature = "tls")]
    fn read_tls(&self, t: &TlsSide, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut cipher = [0u8; 16 * 1024];
        loop {
            {
                let mut c = t.conn();
                let st = c.process_new_packets().map_err(tls_io)?;
                if st.plaintext_bytes_to_read() > 0 {
                    return c.reader().read(buf);
                }
                if st.peer_has_closed() {
                    return Ok(0);
                }
            }
            // The socket read happens without the lock: writers go on.
            let n = (&self.sock).read(&mut cipher)?;
            let mut c = t.conn();
            if n == 0 {
                // A close without close_notify: the end of the stream
                // all the same (the server may have been killed).
                return Ok(0);
            }
            let mut data = &cipher[..n];
            while !data.is_empty() {
                if c.read_tls(&mut data)? == 0 {
                    break;
                }
                c.process_new_packets().map_err(tls_io)?;
            }
        }
    }

    #[cfg(feature = "tls")]
    fn write_tls(&self, t: &TlsSide, data: &[u8]) -> io::Result<()> {
        let _order = t.write.lock().unwrap_or_else(|p| p.into_inner());
        let mut sealed = Vec::with_capacity(data.len() + 64);
        {
            let mut c = t.conn();
            c.writer().write_all(data)?;
            while c.wants_write() {
                c.write_tls(&mut sealed)?;
            }
        }
        (&self.sock).write_all(&sealed)
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        #[cfg(feature = "tls")]
        if let Some(t) = &self.tls {
            return self.read_tls(t, buf);
        }
        (&self.sock).read(buf)
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        #[cfg(feature = "tls")]
        if let Some(t) = &self.tls {
            return self.write_tls(t, buf).map(|()| buf.len());
        }
        (&self.sock).write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        #[cfg(feature = "tls")]
        if let Some(t) = &self.tls {
            return self.write_tls(t, buf);
        }
        (&self.sock).write_all(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        (&*self).write_all(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A socket bound to a port and connected to that same port completes
    /// to itself (what a connect to a dead local port may do by chance):
    /// refused, while an ordinary connection passes.
    #[cfg(feature = "server")]
    #[test]
    fn a_connection_to_itself_is_refused() {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        let me = s.local_addr().unwrap().as_socket().unwrap();
        s.connect(&me.into())
            .expect("a simultaneous open with itself");
        let sock: TcpStream = s.into();
        assert_eq!(sock.peer_addr().unwrap(), me);
        let err = refuse_self(sock).expect_err("connected to itself");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        assert!(err.to_string().contains("reached itself"), "{err}");

        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ok = connect(&l.local_addr().unwrap(), Duration::from_secs(5));
        assert!(ok.is_ok(), "{ok:?}");
    }
}
