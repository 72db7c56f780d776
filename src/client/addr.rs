//! Server addresses: `HOST`, `HOST:PORT`, `[IPV6]:PORT` or a resolved
//! [`SocketAddr`]. A host without a port gets the lock port 22119, the same
//! rule the `ringlock` CLI applies, so `"127.0.0.1"` works everywhere.
//!
//! Parsing is pure; resolving calls the system resolver once, when the
//! client is built. Every failure is an [`Error::InvalidAddress`] that names
//! the address and the reason, so a typo is never reported as an I/O error.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, ToSocketAddrs};

use super::error::{Error, Result};

/// The default lock port (Locking-Center's).
pub const DEFAULT_PORT: u16 = 22119;

/// Something that names a lock server (or its admin port).
///
/// Implemented for strings (`"HOST"`, `"HOST:PORT"`, `"[::1]:22119"`, a bare
/// IPv6 address), socket addresses, `(host, port)` pairs and slices of
/// socket addresses. A string without a port gets `default_port`.
pub trait ToServerAddrs {
    /// Resolves to one or more socket addresses.
    fn to_server_addrs(&self, default_port: u16) -> Result<Vec<SocketAddr>>;

    /// As [`to_server_addrs`](Self::to_server_addrs), each address with
    /// the host name it was given by, if any: a TLS client verifies the
    /// server's certificate against it (an address without one is
    /// verified by its IP address).
    fn to_named_server_addrs(
        &self,
        default_port: u16,
    ) -> Result<Vec<(SocketAddr, Option<String>)>> {
        Ok(self
            .to_server_addrs(default_port)?
            .into_iter()
            .map(|a| (a, None))
            .collect())
    }
}

fn invalid(addr: &str, reason: impl Into<String>) -> Error {
    Error::InvalidAddress {
        addr: addr.to_string(),
        reason: reason.into(),
    }
}

/// Splits `text` into host and port, applying `default_port` when no port
/// is given. Does not resolve.
pub(crate) fn split_host_port(text: &str, default_port: u16) -> Result<(&str, u16)> {
    if text.is_empty() {
        return Err(invalid(text, "empty address"));
    }
    if let Some(c) = text.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            text,
            format!("contains {c:?} (a host name has no spaces or control characters)"),
        ));
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        // [IPv6] or [IPv6]:PORT
        let Some((inner, after)) = rest.split_once(']') else {
            return Err(invalid(text, "missing ']' after an IPv6 address"));
        };
        if inner.parse::<Ipv6Addr>().is_err() {
            return Err(invalid(text, format!("{inner:?} is not an IPv6 address")));
        }
        match after {
            "" => (inner, None),
            _ => match after.strip_prefix(':') {
                Some(p) => (inner, Some(p)),
                None => return Err(invalid(text, "expected ':PORT' after ']'")),
            },
        }
    } else if text.parse::<Ipv6Addr>().is_ok() {
        // A bare IPv6 address has colons but no port.
        (text, None)
    } else if let Some((host, port)) = text.rsplit_once(':') {
        if host.contains(':') {
            return Err(invalid(
                text,
                "an IPv6 address with a port is written [ADDRESS]:PORT",
            ));
        }
        (host, Some(port))
    } else {
        (text, None)
    };
    if host.is_empty() {
        return Err(invalid(text, "missing host before ':'"));
    }
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(0) => return Err(invalid(text, "port 0 (a port is 1 to 65535)")),
            Ok(n) => n,
            Err(_) => {
                return Err(invalid(
                    text,
                    format!("invalid port {p:?} (a port is 1 to 65535)"),
                ))
            }
        },
    };
    Ok((host, port))
}

/// A comma-separated list (`"a:1,b:2,c:3"`, the nodes of a cluster) is
/// every address of every item, in order: a session client tries them in
/// turn. No host name contains a comma, so the list is unambiguous.
impl ToServerAddrs for str {
    fn to_server_addrs(&self, default_port: u16) -> Result<Vec<SocketAddr>> {
        if self.contains(',') {
            let mut all = Vec::new();
            for item in self.split(',') {
                let item = item.trim();
                if item.is_empty() {
                    return Err(invalid(self, "an empty item in the address list"));
                }
                all.extend(item.to_server_addrs(default_port)?);
            }
            return Ok(all);
        }
        let (host, port) = split_host_port(self, default_port)?;
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| invalid(self, format!("cannot resolve host {host:?}: {e}")))?
            .collect();
        if addrs.is_empty() {
            return Err(invalid(
                self,
                format!("host {host:?} resolved to no address"),
            ));
        }
        Ok(addrs)
    }

    fn to_named_server_addrs(
        &self,
        default_port: u16,
    ) -> Result<Vec<(SocketAddr, Option<String>)>> {
        let mut all = Vec::new();
        for item in self.split(',') {
            let item = item.trim();
            let addrs = item.to_server_addrs(default_port)?;
            let (host, _) = split_host_port(item, default_port)?;
            all.extend(addrs.into_iter().map(|a| (a, Some(host.to_string()))));
        }
        Ok(all)
    }
}

impl ToServerAddrs for String {
    fn to_server_addrs(&self, default_port: u16) -> Result<Vec<SocketAddr>> {
        self.as_str().to_server_addrs(default_port)
    }
    fn to_named_server_addrs(
        &self,
        default_port: u16,
    ) -> Result<Vec<(SocketAddr, Option<String>)>> {
        self.as_str().to_named_server_addrs(default_port)
    }
}

impl<T: ToServerAddrs + ?Sized> ToServerAddrs for &T {
    fn to_server_addrs(&self, default_port: u16) -> Result<Vec<SocketAddr>> {
        (**self).to_server_addrs(default_port)
    }
    fn to_named_server_addrs(
        &self,
        default_port: u16,
    ) -> Result<Vec<(SocketAddr, Option<String>)>> {
        (**self).to_named_server_addrs(default_port)
    }
}

impl ToServerAddrs for SocketAddr {
    fn to_server_addrs(&self, _: u16) -> Result<Vec<SocketAddr>> {
        Ok(vec![*self])
    }
}

impl ToServerAddrs for SocketAddrV4 {
    fn to_server_addrs(&self, _: u16) -> Result<Vec<SocketAddr>> {
        Ok(vec![SocketAddr::V4(*self)])
    }
}

impl ToServerAddrs for SocketAddrV6 {
    fn to_server_addrs(&self, _: u16) -> Result<Vec<SocketAddr>> {
        Ok(vec![SocketAddr::V6(*self)])
    }
}

impl ToServerAddrs for [SocketAddr] {
    fn to_server_addrs(&self, _: u16) -> Result<Vec<SocketAddr>> {
        if self.is_empty() {
            return Err(invalid("", "no address given"));
        }
        Ok(self.to_vec())
    }
}

impl ToServerAddrs for Vec<SocketAddr> {
    fn to_server_addrs(&self, default_port: u16) -> Result<Vec<SocketAddr>> {
        self.as_slice().to_server_addrs(default_port)
    }
}

impl<const N: usize> ToServerAddrs for [SocketAddr; N] {
    fn to_server_addrs(&self, default_port: u16) -> Result<Vec<SocketAddr>> {
        self.as_slice().to_server_addrs(default_port)
    }
}

impl ToServerAddrs for (IpAddr, u16) {
    fn to_server_addrs(&self, _: u16) -> Result<Vec<SocketAddr>> {
        Ok(vec![SocketAddr::new(self.0, self.1)])
    }
}

impl ToServerAddrs for (Ipv4Addr, u16) {
    fn to_server_addrs(&self, _: u16) -> Result<Vec<SocketAddr>> {
        Ok(vec![SocketAddr::new(self.0.into(), self.1)])
    }
}

impl ToServerAddrs for (Ipv6Addr, u16) {
    fn to_server_addrs(&self, _: u16) -> Result<Vec<SocketAddr>> {
        Ok(vec![SocketAddr::new(self.0.into(), self.1)])
    }
}

impl ToServerAddrs for (&str, u16) {
    fn to_server_addrs(&self, _: u16) -> Result<Vec<SocketAddr>> {
        // The port is explicit: a host given as "[::1]" or "h:1" is a mistake.
        let shown = format!("{}:{}", self.0, self.1);
        if self.0.is_empty() {
            return Err(invalid(&shown, "empty host"));
        }
        if let Ok(ip) = self.0.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, self.1)]);
        }
        let addrs: Vec<SocketAddr> = (self.0, self.1)
            .to_socket_addrs()
            .map_err(|e| invalid(&shown, format!("cannot resolve host {:?}: {e}", self.0)))?
            .collect();
        if addrs.is_empty() {
            return Err(invalid(&shown, "resolved to no address"));
        }
        Ok(addrs)
    }
    fn to_named_server_addrs(
        &self,
        default_port: u16,
    ) -> Result<Vec<(SocketAddr, Option<String>)>> {
        Ok(self
            .to_server_addrs(default_port)?
            .into_iter()
            .map(|a| (a, Some(self.0.to_string())))
            .collect())
    }
}

impl ToServerAddrs for (String, u16) {
    fn to_server_addrs(&self, default_port: u16) -> Result<Vec<SocketAddr>> {
        (self.0.as_str(), self.1).to_server_addrs(default_port)
    }
    fn to_named_server_addrs(
        &self,
        default_port: u16,
    ) -> Result<Vec<(SocketAddr, Option<String>)>> {
        (self.0.as_str(), self.1).to_named_server_addrs(default_port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> std::result::Result<(String, u16), String> {
        split_host_port(s, 22119)
            .map(|(h, p)| (h.to_string(), p))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn comma_lists_are_every_item_in_order() {
        let a = "127.0.0.1:1, 127.0.0.2,[::1]:3".to_server_addrs(9).unwrap();
        let want: Vec<SocketAddr> = vec![
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.2:9".parse().unwrap(),
            "[::1]:3".parse().unwrap(),
        ];
        assert_eq!(a, want);
        let e = "127.0.0.1:1,,127.0.0.2".to_server_addrs(9).unwrap_err();
        assert!(e.to_string().contains("empty item"), "{e}");
    }

    #[test]
    fn hosts_get_the_default_port() {
        assert_eq!(split("127.0.0.1").unwrap(), ("127.0.0.1".into(), 22119));
        assert_eq!(
            split("locks.internal").unwrap(),
            ("locks.internal".into(), 22119)
        );
        assert_eq!(split("h:1").unwrap(), ("h".into(), 1));
        assert_eq!(split("::1").unwrap(), ("::1".into(), 22119));
        assert_eq!(split("[::1]").unwrap(), ("::1".into(), 22119));
        assert_eq!(split("[::1]:7").unwrap(), ("::1".into(), 7));
        assert_eq!(
            "127.0.0.1".to_server_addrs(22119).unwrap(),
            vec!["127.0.0.1:22119".parse::<SocketAddr>().unwrap()]
        );
    }

    #[test]
    fn bad_addresses_name_the_address_and_the_reason() {
        for (text, reason) in [
            ("127.0.0.1:99999", "invalid port \"99999\""),
            ("127.0.0.1:0", "port 0"),
            ("127.0.0.1:", "invalid port \"\""),
            ("h:x", "invalid port \"x\""),
            (":22119", "missing host"),
            ("", "empty address"),
            ("a b", "contains ' '"),
            ("[::1", "missing ']'"),
            ("[nope]:1", "not an IPv6 address"),
            ("[::1]x", "expected ':PORT'"),
            ("fe80::1:2:x", "[ADDRESS]:PORT"),
        ] {
            let err = split(text).expect_err(text);
            assert!(err.contains(reason), "{text:?}: {err}");
            assert!(err.contains(&format!("{text:?}")), "{text:?}: {err}");
        }
        let err = "127.0.0.1:99999".to_server_addrs(1).unwrap_err();
        assert!(err.is_usage(), "a bad address is a usage error");
    }
}
