//! The `ringlock_raft_*` series of a cluster node: each shard's replication
//! gauges, the followers' lag, the commit latency and forwarding outcomes.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::cluster::check::Reason;

use super::histogram::{seconds_histogram, Histogram, LatencyHistogram, LATENCY_BOUNDS_US};
use super::text::{counter, gauge, header};

/// One shard's replication figures, as its loop last published them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftGauges {
    pub term: u64,
    /// The leader this shard knows of (0: none).
    pub leader_id: u64,
    /// This node leads the shard's group.
    pub leader: bool,
    /// This shard answers lock requests.
    pub serving: bool,
    pub commit: u64,
    pub applied: u64,
    /// Times the known leader changed (a counter kept by the loop).
    pub leader_changes: u64,
    /// Locking-Center requests this shard holds until a leader it can
    /// reach serves (an election, or the link to the leader down).
    pub forwards_parked: u64,
}

pub(super) struct RaftShard {
    term: AtomicU64,
    pub(super) leader_id: AtomicU64,
    leader: AtomicU64,
    pub(super) serving: AtomicU64,
    commit: AtomicU64,
    applied: AtomicU64,
    leader_changes: AtomicU64,
    forwards_parked: AtomicU64,
    /// Per peer (in `RaftMetrics::peers` order); `u64::MAX`: not known
    /// (this node does not lead the group).
    follower_lag: Box<[AtomicU64]>,
    /// Peer messages refused before raft-rs saw them, per reason (in
    /// `Reason::ALL` order; counters kept by the loop).
    dropped: [AtomicU64; Reason::COUNT],
}

/// The `ringlock_raft_*` series of a cluster node: per shard gauges, the
/// leader's view of each follower's lag (labels: the static peer ids, so
/// the label set is bounded), and one commit latency histogram (proposal
/// to committed and applied, observed by the leader).
pub struct RaftMetrics {
    pub(super) node: u64,
    /// The other voters, sorted.
    peers: Box<[u64]>,
    pub(super) shards: Box<[RaftShard]>,
    commit_us: LatencyHistogram,
    /// Locking-Center forwarding, node-wide: `[answered, failed]` on the
    /// forwarding side, and the requests served for other nodes.
    forwarded: [AtomicU64; 2],
    forwards_served: AtomicU64,
}

/// How a forwarded Locking-Center request ended on the node that forwarded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardOutcome {
    /// The leader's answer was passed on.
    Answered,
    /// The leader or the link went away first: the connection closed
    /// unanswered (outcome unknown), or `-` for a request that waited out
    /// its bound for a leader (nothing was done).
    Failed,
}

const LAG_UNKNOWN: u64 = u64::MAX;

/// A per-shard series: name, help, type, and how to read it.
type PerShard = (
    &'static str,
    &'static str,
    &'static str,
    fn(&RaftShard) -> u64,
);

impl RaftMetrics {
    pub(super) fn new(node: u64, voters: &[u64], shards: usize) -> RaftMetrics {
        let mut peers: Vec<u64> = voters.iter().copied().filter(|&v| v != node).collect();
        peers.sort_unstable();
        peers.dedup();
        RaftMetrics {
            node,
            shards: (0..shards)
                .map(|_| RaftShard {
                    term: AtomicU64::new(0),
                    leader_id: AtomicU64::new(0),
                    leader: AtomicU64::new(0),
                    serving: AtomicU64::new(0),
                    commit: AtomicU64::new(0),
                    applied: AtomicU64::new(0),
                    leader_changes: AtomicU64::new(0),
                    forwards_parked: AtomicU64::new(0),
                    follower_lag: peers.iter().map(|_| AtomicU64::new(LAG_UNKNOWN)).collect(),
                    dropped: [const { AtomicU64::new(0) }; Reason::COUNT],
                })
                .collect(),
            peers: peers.into(),
            commit_us: Histogram::new(&LATENCY_BOUNDS_US),
            forwarded: [const { AtomicU64::new(0) }; 2],
            forwards_served: AtomicU64::new(0),
        }
    }

    /// A request this node forwarded to the leader ended.
    pub fn forwarded(&self, outcome: ForwardOutcome) {
        self.forwarded[outcome as usize].fetch_add(1, Relaxed);
    }

    /// A request another node forwarded was taken up here.
    pub fn forward_served(&self) {
        self.forwards_served.fetch_add(1, Relaxed);
    }

    /// Shard `shard`'s figures (once per tick; relaxed stores only).
    pub fn set_shard(&self, shard: usize, g: &RaftGauges) {
        let s = &self.shards[shard];
        s.term.store(g.term, Relaxed);
        s.leader_id.store(g.leader_id, Relaxed);
        s.leader.store(u64::from(g.leader), Relaxed);
        s.serving.store(u64::from(g.serving), Relaxed);
        s.commit.store(g.commit, Relaxed);
        s.applied.store(g.applied, Relaxed);
        s.leader_changes.store(g.leader_changes, Relaxed);
        s.forwards_parked.store(g.forwards_parked, Relaxed);
    }

    /// Shard `shard`'s counts of refused peer messages, per reason (in
    /// [`Reason::ALL`] order; relaxed stores only).
    pub fn set_dropped(&self, shard: usize, dropped: &[u64; Reason::COUNT]) {
        for (a, &n) in self.shards[shard].dropped.iter().zip(dropped) {
            a.store(n, Relaxed);
        }
    }

    /// Follower `peer`'s lag behind the leader's log in shard `shard`;
    /// `None` forgets it (this node no longer leads). Unknown peers are
    /// ignored.
    pub fn set_follower_lag(&self, shard: usize, peer: u64, lag: Option<u64>) {
        if let Some(i) = self.peers.iter().position(|&p| p == peer) {
            self.shards[shard].follower_lag[i].store(lag.unwrap_or(LAG_UNKNOWN), Relaxed);
        }
    }

    /// Forgets every follower's lag of shard `shard` (not the leader).
    pub fn clear_follower_lag(&self, shard: usize) {
        for a in self.shards[shard].follower_lag.iter() {
            a.store(LAG_UNKNOWN, Relaxed);
        }
    }

    /// One proposal committed and applied `us` after it was proposed.
    pub fn observe_commit_us(&self, us: u64) {
        self.commit_us.observe(us);
    }

    /// The Raft and forwarding series of a cluster node.
    pub(super) fn render(&self, w: &mut String) {
        gauge(
            w,
            "raft_node_id",
            "This node's id in its cluster (--node-id).",
            self.node,
        );
        self.render_per_shard_series(w);
        self.render_follower_lag(w);
        self.render_dropped_messages(w);
        self.render_forwarding(w);
        seconds_histogram(
            w,
            "raft_commit_latency_seconds",
            "Time from a leader's proposal to its entry committed and applied.",
            std::iter::once(&self.commit_us),
        );
    }

    /// The series with one value per shard: term, leader, serving, commit
    /// and apply progress.
    fn render_per_shard_series(&self, w: &mut String) {
        let per_shard: [PerShard; 9] = [
            ("raft_term", "Current Raft term, per shard (Raft group).", "gauge", |s| {
                s.term.load(Relaxed)
            }),
            (
                "raft_leader_id",
                "The leader this node knows of, per shard; 0 when none is known.",
                "gauge",
                |s| s.leader_id.load(Relaxed),
            ),
            (
                "raft_leader",
                "1 while this node leads the shard's Raft group.",
                "gauge",
                |s| s.leader.load(Relaxed),
            ),
            (
                "raft_serving",
                "1 while this node answers lock requests for the shard (leader, lease held).",
                "gauge",
                |s| s.serving.load(Relaxed),
            ),
            (
                "raft_leader_changes_total",
                "Times the leader this node knows of changed to another node, per shard (the first leader it learns of included).",
                "counter",
                |s| s.leader_changes.load(Relaxed),
            ),
            (
                "raft_commit_index",
                "Highest log index known to be committed, per shard.",
                "gauge",
                |s| s.commit.load(Relaxed),
            ),
            (
                "raft_applied_index",
                "Highest log index applied to this node's lock table, per shard.",
                "gauge",
                |s| s.applied.load(Relaxed),
            ),
            (
                "raft_apply_lag",
                "Committed entries not yet applied (commit index - applied index), per shard.",
                "gauge",
                |s| s.commit.load(Relaxed).saturating_sub(s.applied.load(Relaxed)),
            ),
            (
                "lc_forwards_parked",
                "Locking-Center requests this node holds for the leader, per shard: no leader is known (an election) or the link to it is down; sent once one can take them, answered - past three election timeouts (nothing was done).",
                "gauge",
                |s| s.forwards_parked.load(Relaxed),
            ),
        ];
        for (name, help, kind, value) in per_shard {
            header(w, name, help, kind);
            for (i, s) in self.shards.iter().enumerate() {
                let _ = writeln!(w, "ringlock_{name}{{shard=\"{i}\"}} {}", value(s));
            }
        }
    }

    /// Each follower's lag, per shard and peer (known by the leader only).
    fn render_follower_lag(&self, w: &mut String) {
        header(
            w,
            "raft_follower_lag",
            "Entries a follower's log is behind the leader's (last index - matched index), per shard and peer; exported by the leader only.",
            "gauge",
        );
        for (i, s) in self.shards.iter().enumerate() {
            for (p, lag) in self.peers.iter().zip(s.follower_lag.iter()) {
                let lag = lag.load(Relaxed);
                if lag != LAG_UNKNOWN {
                    let _ = writeln!(
                        w,
                        "ringlock_raft_follower_lag{{shard=\"{i}\",peer=\"{p}\"}} {lag}"
                    );
                }
            }
        }
    }

    /// The peers' Raft messages dropped unread, by reason.
    fn render_dropped_messages(&self, w: &mut String) {
        header(
            w,
            "raft_messages_dropped_total",
            "Raft messages from peers dropped before raft-rs saw them (a message no correct peer sends), by reason, summed over shards.",
            "counter",
        );
        for r in Reason::ALL {
            let n: u64 = self
                .shards
                .iter()
                .map(|s| s.dropped[r.index()].load(Relaxed))
                .sum();
            let _ = writeln!(
                w,
                "ringlock_raft_messages_dropped_total{{reason=\"{}\"}} {n}",
                r.label()
            );
        }
    }

    /// Locking-Center requests forwarded to the leader, and those served
    /// for other nodes.
    fn render_forwarding(&self, w: &mut String) {
        header(
            w,
            "lc_forwarded_total",
            "Locking-Center requests this node passed to the leader because it does not serve, by outcome: the leader's answer relayed, or failed (the leader or its link went away first: the connection closed unanswered, or - for a request that waited out its bound for a leader).",
            "counter",
        );
        for (i, label) in ["answered", "failed"].iter().enumerate() {
            let _ = writeln!(
                w,
                "ringlock_lc_forwarded_total{{outcome=\"{label}\"}} {}",
                self.forwarded[i].load(Relaxed)
            );
        }
        counter(
            w,
            "lc_forwards_served_total",
            "Locking-Center requests other nodes forwarded to this one (as the leader) and it took up.",
            self.forwards_served.load(Relaxed),
        );
    }
}
