//! A holder's (or waiter's) connection endpoint as the table stores it:
//! 23 bytes with alignment 1, where a `SocketAddr` takes 32 with alignment
//! 4, so it packs next to the small fields of an entry.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// `[family (4 or 6)][16 address bytes (IPv4: the first 4)][port u16 LE]
/// [scope_id u32 LE]`. The IPv6 flow label is not kept (it says nothing
/// about who holds a key).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Endpoint([u8; 23]);

impl From<SocketAddr> for Endpoint {
    fn from(a: SocketAddr) -> Endpoint {
        let mut b = [0u8; 23];
        match a {
            SocketAddr::V4(a) => {
                b[0] = 4;
                b[1..5].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                b[0] = 6;
                b[1..17].copy_from_slice(&a.ip().octets());
                b[19..23].copy_from_slice(&a.scope_id().to_le_bytes());
            }
        }
        b[17..19].copy_from_slice(&a.port().to_le_bytes());
        Endpoint(b)
    }
}

impl Endpoint {
    pub fn addr(&self) -> SocketAddr {
        let b = &self.0;
        let port = u16::from_le_bytes([b[17], b[18]]);
        if b[0] == 4 {
            let ip: [u8; 4] = b[1..5].try_into().expect("4 bytes");
            SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port))
        } else {
            let ip: [u8; 16] = b[1..17].try_into().expect("16 bytes");
            let scope = u32::from_le_bytes(b[19..23].try_into().expect("4 bytes"));
            SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, scope))
        }
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.addr().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_is_small() {
        for a in [
            "127.0.0.1:22119",
            "10.1.2.3:1",
            "[::1]:65535",
            "[fe80::1%7]:80",
            "[::ffff:1.2.3.4]:9",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(Endpoint::from(a).addr(), a, "{a}");
        }
        assert_eq!(std::mem::size_of::<Endpoint>(), 23);
        assert_eq!(std::mem::align_of::<Endpoint>(), 1);
    }
}
