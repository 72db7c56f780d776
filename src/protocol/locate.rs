//! The node directory (extension, ringlockd only): which node answers,
//! whether it serves, the leader it knows of, and each member's client
//! (lock port) and admin addresses, so that a client given one address of
//! a cluster finds the others and their admin ports (which need not be the
//! lock port + 1).
//!
//! Asked two ways, answered by every node (leader or not) and by a
//! single-node server:
//!
//! - on the lock port, **Locate**: a session-framed connection's first
//!   frame `[u8 op = 14][u32 rid][u16 bodyLen = 1][u8 version = 1]`,
//!   answered by a Reply `[0x80][rid][u16 bodyLen][u8 status = 0][record]`,
//!   then the server closes. Refusals are session Replies as for a Hello
//!   (`tls_required` in plaintext where sessions need TLS, `unsupported
//!   version`, `invalid`); a server without Locate answers the
//!   Locking-Center `-` and closes.
//! - on the admin port, **`CADR`**: answered `[u16 len][record]`, the
//!   connection stays open (after `AUTH` where one is required); a server
//!   without it closes.
//!
//! The record, integers little-endian:
//!
//! ```text
//! u8 flags     bit 0: a cluster member (--peers); bit 1: this node serves now
//! u64 node     the answering node's --node-id (0: not a cluster member)
//! u64 leader   the leader it knows of (0: none known)
//! u8 n, n × entry, the answering node first, then the other members by id:
//!   u64 node · u8 len · lock address "HOST:PORT" · u8 len · admin address "HOST:PORT"
//! ```
//!
//! An address is empty where the answering node does not know it: it
//! learns each member's lock address from that member's peer link, and
//! knows only its own admin address. A client asks a member's own lock
//! port for the rest. An address whose host is unspecified (`0.0.0.0`,
//! `[::]`: a single node bound to every interface) means the host the
//! client reached the node at. A later version may append fields after
//! the entries; a reader ignores them.

/// The Locate version this server speaks.
pub const VERSION: u8 = 1;
/// Flag: the answering node is a cluster member.
pub const FLAG_MEMBER: u8 = 1;
/// Flag: the answering node serves now (every shard leads its group).
pub const FLAG_SERVING: u8 = 2;
/// The longest address an entry carries.
pub const ADDR_MAX: usize = 255;
/// Most entries a record carries.
pub const NODES_MAX: usize = 255;
/// The largest encoded record (well under a session frame's u16 body).
pub const RECORD_MAX: usize = 17 + 1 + NODES_MAX * (8 + 2 + 2 * ADDR_MAX);

/// One member's addresses (empty: not known to the answering node).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAddrs {
    pub node: u64,
    /// Its client (lock port) address, `HOST:PORT`.
    pub lock: String,
    /// Its admin port's address, `HOST:PORT`.
    pub admin: String,
}

/// What one node answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Directory {
    /// A cluster member (`false`: a single-node server).
    pub member: bool,
    /// It serves now (a single node always does).
    pub serving: bool,
    /// Its `--node-id` (0 on a single node).
    pub node: u64,
    /// The leader it knows of (0: none).
    pub leader: u64,
    /// Itself first, then every other member by id.
    pub nodes: Vec<NodeAddrs>,
}

fn put_addr(out: &mut Vec<u8>, a: &str) {
    let b = if a.len() <= ADDR_MAX {
        a.as_bytes()
    } else {
        &[]
    };
    out.push(b.len() as u8);
    out.extend_from_slice(b);
}

impl Directory {
    /// Appends the record (at most [`NODES_MAX`] entries; an address
    /// longer than [`ADDR_MAX`] is sent empty).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut flags = 0;
        if self.member {
            flags |= FLAG_MEMBER;
        }
        if self.serving {
            flags |= FLAG_SERVING;
        }
        out.push(flags);
        out.extend_from_slice(&self.node.to_le_bytes());
        out.extend_from_slice(&self.leader.to_le_bytes());
        let n = self.nodes.len().min(NODES_MAX);
        out.push(n as u8);
        for e in &self.nodes[..n] {
            out.extend_from_slice(&e.node.to_le_bytes());
            put_addr(out, &e.lock);
            put_addr(out, &e.admin);
        }
    }

    /// The record at the start of `b` and the bytes it took; `Ok(None)`
    /// when more bytes are needed. Fields a later version appends are
    /// the caller's to skip (a framed answer says its length).
    pub fn decode(b: &[u8]) -> Result<Option<(Directory, usize)>, String> {
        let mut at = 0usize;
        macro_rules! need {
            ($n:expr) => {
                if b.len() < at + $n {
                    return Ok(None);
                }
            };
        }
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        need!(18);
        let flags = b[0];
        let node = u64_at(1);
        let leader = u64_at(9);
        let n = b[17] as usize;
        at = 18;
        let mut nodes = Vec::with_capacity(n);
        for _ in 0..n {
            need!(9);
            let id = u64_at(at);
            at += 8;
            let mut addr = || -> Result<Option<String>, String> {
                need!(1);
                let len = b[at] as usize;
                need!(1 + len);
                let s = std::str::from_utf8(&b[at + 1..at + 1 + len])
                    .map_err(|_| "an address that is not UTF-8".to_string())?
                    .to_string();
                at += 1 + len;
                Ok(Some(s))
            };
            let Some(lock) = addr()? else { return Ok(None) };
            let Some(admin) = addr()? else {
                return Ok(None);
            };
            nodes.push(NodeAddrs {
                node: id,
                lock,
                admin,
            });
        }
        Ok(Some((
            Directory {
                member: flags & FLAG_MEMBER != 0,
                serving: flags & FLAG_SERVING != 0,
                node,
                leader,
                nodes,
            },
            at,
        )))
    }

    /// The `CADR` answer: `[u16 len][record]`.
    pub fn encode_admin(&self, out: &mut Vec<u8>) {
        let mut rec = Vec::with_capacity(64);
        self.encode(&mut rec);
        out.extend_from_slice(&(rec.len() as u16).to_le_bytes());
        out.extend_from_slice(&rec);
    }

    /// A whole `CADR` answer at the start of `b` (`Ok(None)`: more bytes
    /// needed).
    pub fn decode_admin(b: &[u8]) -> Result<Option<Directory>, String> {
        let Some(len) = b.get(..2) else {
            return Ok(None);
        };
        let len = u16::from_le_bytes([len[0], len[1]]) as usize;
        let Some(rec) = b.get(2..2 + len) else {
            return Ok(None);
        };
        match Directory::decode(rec)? {
            Some((d, _)) => Ok(Some(d)),
            None => Err(format!("a CADR record cut short ({len} bytes)")),
        }
    }

    /// This node's own entry (the first).
    pub fn me(&self) -> Option<&NodeAddrs> {
        self.nodes.first()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Directory {
        Directory {
            member: true,
            serving: false,
            node: 2,
            leader: 3,
            nodes: vec![
                NodeAddrs {
                    node: 2,
                    lock: "127.0.0.1:22112".into(),
                    admin: "127.0.0.1:22122".into(),
                },
                NodeAddrs {
                    node: 1,
                    lock: "127.0.0.1:22111".into(),
                    admin: String::new(),
                },
                NodeAddrs {
                    node: 3,
                    lock: String::new(),
                    admin: String::new(),
                },
            ],
        }
    }

    #[test]
    fn a_record_roundtrips_and_needs_every_byte() {
        let d = sample();
        let mut b = Vec::new();
        d.encode(&mut b);
        assert_eq!(Directory::decode(&b).unwrap(), Some((d.clone(), b.len())));
        for cut in 0..b.len() {
            assert_eq!(Directory::decode(&b[..cut]).unwrap(), None, "cut at {cut}");
        }
        // A later version's fields after the entries are left to the caller.
        let mut longer = b.clone();
        longer.extend_from_slice(b"more");
        assert_eq!(
            Directory::decode(&longer).unwrap(),
            Some((d.clone(), b.len()))
        );
        let mut a = Vec::new();
        d.encode_admin(&mut a);
        assert_eq!(Directory::decode_admin(&a).unwrap(), Some(d));
        assert_eq!(Directory::decode_admin(&a[..a.len() - 1]).unwrap(), None);
    }

    #[test]
    fn flags_and_bad_addresses() {
        let d = Directory {
            member: false,
            serving: true,
            nodes: vec![NodeAddrs {
                node: 0,
                lock: "x".repeat(300),
                admin: "[::1]:22120".into(),
            }],
            ..Directory::default()
        };
        let mut b = Vec::new();
        d.encode(&mut b);
        assert_eq!(b[0], FLAG_SERVING);
        let (got, _) = Directory::decode(&b).unwrap().unwrap();
        assert_eq!(got.nodes[0].lock, "", "too long: sent empty");
        assert_eq!(got.me().unwrap().admin, "[::1]:22120");
        b[18 + 8 + 2] = 0xff; // the admin address's first byte
        assert!(Directory::decode(&b).is_err(), "not UTF-8");
    }
}
