//! A raw peer (Raft) link to a node, opened the way another node opens
//! one: a TCP connection to the node's Raft listener of one shard, a Hello
//! naming a node, then Raft frames — whatever the test puts in them.
//!
//! The hostile-peer tests speak to nodes through this helper only. Peer
//! links are mutual TLS (a node certificate to link at all), so the link
//! is opened with the real certificate of the node it claims to be (node
//! 1's for a claim no certificate can make, such as node 0): the checks
//! these tests exercise are for authenticated peers (a bug or a bad disk
//! on another node). On an `--insecure` cluster it is plain TCP.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ringlock::cluster::wire;

use super::cluster::Cluster;

enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn sock(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &t.sock,
        }
    }

    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.write_all(b),
            Stream::Tls(t) => t.write_all(b).and_then(|_| t.flush()),
        }
    }

    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(b),
            Stream::Tls(t) => t.read(b),
        }
    }
}

pub struct PeerLink {
    s: Stream,
}

impl PeerLink {
    /// Connects to node `target`'s Raft listener for shard `group` (of
    /// `groups`) — over TLS with the certificate of `claimed_node` unless
    /// the cluster runs `--insecure` — and sends a Hello claiming to be
    /// node `claimed_node` of the cluster founded by `voters`. Its client
    /// address is empty: the node then names no address for the claimed
    /// node's clients (rather than a wrong one).
    pub fn open(
        c: &Cluster,
        target: usize,
        claimed_node: u64,
        group: u32,
        groups: u32,
        voters: &[u64],
    ) -> PeerLink {
        let addr = SocketAddr::from(([127, 0, 0, 1], c.raft_ports[target] + group as u16));
        let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to the peer port {addr}: {e}"));
        sock.set_nodelay(true).expect("nodelay");
        let mut s = if c.insecure() {
            Stream::Plain(sock)
        } else {
            // The claimed node's own certificate; node 1's for a claim no
            // certificate names (the node refuses the mismatch).
            let as_node = if (1..=c.nodes.len() as u64).contains(&claimed_node) {
                claimed_node
            } else {
                1
            };
            let tls =
                ringlock::tls::NodeTls::load(&c.certs_dir(as_node as usize - 1), Some(as_node))
                    .expect("the node's certificates");
            let conn = rustls::ClientConnection::new(
                tls.peer_dialer(target as u64 + 1),
                ringlock::tls::peer_server_name(target as u64 + 1),
            )
            .expect("a TLS client");
            Stream::Tls(Box::new(rustls::StreamOwned::new(conn, sock)))
        };
        let mut b = Vec::new();
        wire::encode_hello(
            &wire::Hello {
                node: claimed_node,
                group,
                groups,
                voters: voters.to_vec(),
                client_addr: String::new(),
            },
            &mut b,
        );
        s.write_all(&b).expect("send the Hello");
        PeerLink { s }
    }

    /// Sends `m` as a peer sends a Raft message (its encoding, with this
    /// version's features announcement).
    pub fn send_raft(&mut self, m: &raft::eraftpb::Message) {
        self.send_payload(&ringlock::cluster::replica::encode_message(m));
    }

    /// Sends `payload` as one frame of `kind`, whatever it holds.
    pub fn send_frame(&mut self, kind: u8, payload: &[u8]) {
        let mut b = Vec::new();
        wire::frame(kind, payload, &mut b);
        self.s.write_all(&b).expect("send a frame");
    }

    /// Sends `payload` as one Raft frame, whatever it holds.
    pub fn send_payload(&mut self, payload: &[u8]) {
        let mut b = Vec::new();
        wire::frame(wire::KIND_RAFT, payload, &mut b);
        self.s.write_all(&b).expect("send a Raft frame");
    }

    /// The node has not closed the link (it never writes on a link it
    /// accepted: a read that would block means open).
    pub fn is_open(&mut self) -> bool {
        self.s.sock().set_nonblocking(true).expect("nonblocking");
        let mut b = [0u8; 1];
        let open = matches!(self.s.read(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock);
        self.s.sock().set_nonblocking(false).expect("blocking");
        open
    }
}
