//! A raw peer (Raft) link to a node, opened the way another node opens
//! one: a TCP connection to the node's Raft listener of one shard, a Hello
//! naming a node, then Raft frames — whatever the test puts in them.
//!
//! The hostile-peer tests speak to nodes through this helper only: when
//! peer links become mutual TLS (a node certificate to link at all), only
//! [`PeerLink::open`] (and its stream) changes — the tests then open it
//! with a node certificate, since the checks they exercise are for
//! authenticated peers too (a bug or a bad disk on another node).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ringlock::cluster::wire;

pub struct PeerLink {
    s: TcpStream,
}

impl PeerLink {
    /// Connects to `addr` (a node's Raft listener for shard `group`, of
    /// `groups`) and sends a Hello claiming to be node `claimed_node` of
    /// the cluster founded by `voters`. Its client address is empty: the
    /// node then names no address for the claimed node's clients (rather
    /// than a wrong one).
    pub fn open(
        addr: SocketAddr,
        claimed_node: u64,
        group: u32,
        groups: u32,
        voters: &[u64],
    ) -> PeerLink {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to the peer port {addr}: {e}"));
        s.set_nodelay(true).expect("nodelay");
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

    /// Sends `payload` as one Raft frame, whatever it holds.
    pub fn send_payload(&mut self, payload: &[u8]) {
        let mut b = Vec::new();
        wire::frame(wire::KIND_RAFT, payload, &mut b);
        self.s.write_all(&b).expect("send a Raft frame");
    }

    /// The node has not closed the link (it never writes on a link it
    /// accepted: a read that would block means open).
    pub fn is_open(&self) -> bool {
        self.s.set_nonblocking(true).expect("nonblocking");
        let mut b = [0u8; 1];
        let open = matches!((&self.s).read(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock);
        self.s.set_nonblocking(false).expect("blocking");
        open
    }
}
