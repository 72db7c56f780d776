//! Replication: every shard a Raft group across the nodes of a cluster
//! (`--node-id N --peers 1=HOST:PORT,2=…`), on raft-rs.
//!
//! Group *g* is shard *g* of every node. Its Raft traffic runs between the
//! shard-*g* loops of the nodes, over one TCP link per peer and shard
//! (node *n*'s shard *g* listens on its `--peers` port + *g*), so no Raft
//! message crosses cores inside a node.
//!
//! - [`replica`]: the group's Raft node, driven by hand (pure).
//! - [`check`]: what every peer message must be before raft-rs sees it.
//! - [`store`]: the log file's records (entries, hard state) and replay,
//!   and raft-rs's `Storage` of a replica (the same log, in memory).
//! - [`files`]: a node's log files — one per group, named from
//!   `--data-path` — opened, replayed and upgraded at start.
//! - [`wire`]: the frames of a peer link, and the fields a node adds to
//!   raft-rs's messages.
//!
//! The shard (see `shard::raft`) decides on its table as a single node
//! does, proposes the records of each batch as one entry, and holds every
//! answer until that entry is committed and applied; followers apply the
//! same records. See docs/cluster.md for what a client sees.

pub mod check;
pub mod files;
pub mod replica;
pub mod store;
pub mod wire;

use std::collections::BTreeMap;
use std::net::SocketAddr;

/// `ringlockd`'s exit status when a committed entry or a snapshot of its
/// own log cannot be applied (EX_DATAERR): the node stops (fail-stop)
/// instead of running on with a dead shard, and stops again at every
/// start, since the entry stays in its log (docs/cluster.md).
pub const EXIT_APPLY_FAILED: u8 = 65;
/// `ringlockd`'s exit status when a shard's log cannot be written or
/// synced (EX_IOERR): a replica that cannot persist must not vote or
/// acknowledge.
pub const EXIT_LOG_FAILED: u8 = 74;

/// Ticks of the replication clock per second: one tick every 10 ms.
pub const TICK_US: u64 = 10_000;
/// Default election timeout: 30 ticks (300 ms; each node waits a random
/// 300–600 ms before it stands).
pub const ELECTION_TICKS: usize = 30;
/// Default heartbeat: every 3 ticks (30 ms).
pub const HEARTBEAT_TICKS: usize = 3;
/// A shard's log is compacted into a snapshot once this many entries were
/// applied since the last one.
pub const COMPACT_ENTRIES: u64 = 10_000;

/// A node's place in its cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    pub node_id: u64,
    /// Every node's Raft address (this one's included): node → address of
    /// its shard 0; shard *g* listens on the port + *g*.
    pub peers: BTreeMap<u64, SocketAddr>,
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    /// Entries applied between two compactions of a shard's log.
    pub compact_entries: u64,
    /// `--join`: a node with a new log joins a running cluster (added by
    /// `ringlock cluster add`/`replace`) instead of founding one with the
    /// `--peers` as its voters. Ignored once the log holds anything.
    pub join: bool,
    /// `--force-new-cluster`: disaster recovery when most nodes are gone
    /// for good: this node becomes the only voter of every shard's group,
    /// its whole log committed, and rewrites its log as such.
    pub force_new: bool,
}

impl ClusterConfig {
    /// Parses `--peers 1=HOST:PORT,2=HOST:PORT,...` for node `node_id`.
    pub fn parse(node_id: u64, peers: &str) -> Result<ClusterConfig, String> {
        if node_id == 0 {
            return Err("--node-id must be 1 or more".into());
        }
        let mut map = BTreeMap::new();
        for part in peers.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (id, addr) = part.split_once('=').ok_or_else(|| {
                format!("--peers: {part:?} is not ID=HOST:PORT (example: 1=10.0.0.1:22200)")
            })?;
            let id: u64 = id.trim().parse().ok().filter(|&i| i > 0).ok_or_else(|| {
                format!("--peers: {id:?} in {part:?} is not a node id (1 or more)")
            })?;
            let addr: SocketAddr = {
                use std::net::ToSocketAddrs;
                addr.trim()
                    .to_socket_addrs()
                    .map_err(|e| format!("--peers: {addr:?} of node {id}: {e}"))?
                    .next()
                    .ok_or_else(|| format!("--peers: {addr:?} of node {id} has no address"))?
            };
            if map.insert(id, addr).is_some() {
                return Err(format!("--peers: node {id} is named twice"));
            }
        }
        if map.is_empty() {
            return Err("--peers: no nodes given".into());
        }
        if !map.contains_key(&node_id) {
            return Err(format!(
                "--peers does not name this node ({node_id}); every node's --peers lists all \
                 nodes, itself included"
            ));
        }
        Ok(ClusterConfig {
            node_id,
            peers: map,
            election_ticks: ELECTION_TICKS,
            heartbeat_ticks: HEARTBEAT_TICKS,
            compact_entries: COMPACT_ENTRIES,
            join: false,
            force_new: false,
        })
    }

    pub fn voters(&self) -> Vec<u64> {
        self.peers.keys().copied().collect()
    }

    /// The Raft address of `node`'s shard `group`.
    pub fn link_addr(&self, node: u64, group: usize) -> Option<SocketAddr> {
        let mut a = *self.peers.get(&node)?;
        a.set_port(a.port().checked_add(group as u16)?);
        Some(a)
    }

    /// The election timeout in microseconds.
    pub fn election_us(&self) -> u64 {
        self.election_ticks as u64 * TICK_US
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_and_refuse() {
        let c =
            ClusterConfig::parse(2, "1=127.0.0.1:7001, 2=127.0.0.1:7002,3=127.0.0.1:7003").unwrap();
        assert_eq!(c.voters(), vec![1, 2, 3]);
        assert_eq!(c.link_addr(3, 2).unwrap().port(), 7005);
        assert!(ClusterConfig::parse(4, "1=127.0.0.1:1")
            .unwrap_err()
            .contains("does not name"));
        assert!(ClusterConfig::parse(1, "1=127.0.0.1:1,1=127.0.0.1:2")
            .unwrap_err()
            .contains("twice"));
        assert!(ClusterConfig::parse(1, "x=127.0.0.1:1")
            .unwrap_err()
            .contains("not a node id"));
        assert!(ClusterConfig::parse(1, "1:127.0.0.1:1")
            .unwrap_err()
            .contains("ID=HOST:PORT"));
        assert!(ClusterConfig::parse(0, "1=127.0.0.1:1").is_err());
    }
}
