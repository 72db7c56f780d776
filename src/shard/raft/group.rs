//! A shard's replica of its Raft group ([`GroupReplica`]): its state and
//! how it is built from a recovered cluster log. What it does with the
//! shard (proposals, applying, serving) is in `raft.rs` and beside it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use super::failstop::{FailKind, FailStop};
use super::stats::Stats;
use super::view::NodeView;
use crate::cluster::check::{Reason, Refusal};
use crate::cluster::replica::{Output, Replica};
use crate::cluster::{store, wire};
use crate::log::Level;
use crate::wal::log::Log;

/// At most one log line per reason of refusal, per shard, in this long.
pub(super) const DROP_LOG_QUIET_US: u64 = 10_000_000;

/// A listing a follower answers once its read barrier is applied.
pub(super) struct ParkedRead {
    pub(super) id: u64,
    pub(super) index: Option<u64>,
    pub(super) asked_us: u64,
    pub(super) from: usize,
    pub(super) request: u64,
    pub(super) op: crate::shard::msg::RemoteOp,
}

/// A shard's replication state.
pub struct GroupReplica {
    pub(in crate::shard) replica: Replica,
    /// The batcher of the shard's records: each batch is one proposal
    /// ([`Log::replicated`]).
    pub(in crate::shard) batch: Log,
    /// The cluster log file's writer (raw records; compacted by rewriting
    /// it as a snapshot and the entries after it, `compact`).
    pub(super) file: Log,
    /// `(file lsn, ready number)`: a ready is persisted once its records'
    /// lsn is durable.
    pub(super) persisting: VecDeque<(u64, u64)>,
    /// The proposal in flight: `(index, term, records)`.
    pub(super) proposal: Option<(u64, u64, Vec<u8>)>,
    pub(super) out: Output,
    /// What the replication metrics are computed from.
    pub(super) stats: Stats,
    pub(super) next_tick_us: u64,
    pub(super) group: usize,
    /// The term whose leases were extended when serving began.
    pub(super) served_term: u64,
    pub(super) was_serving: bool,
    /// When this shard last stopped serving (mono µs).
    pub(super) stopped_serving_us: u64,
    /// Client addresses of the nodes, learned from their link Hellos.
    pub(super) client_addrs: BTreeMap<u64, String>,
    pub(super) my_client_addr: String,
    pub(super) view: Arc<NodeView>,
    pub(in crate::shard) election_us: u64,
    /// How long a stepped-down leader's session holds stay held.
    pub(super) session_keep_ms: u64,
    /// Why this node must stop, once set (see [`FailStop`]).
    pub(super) fatal: Option<FailStop>,
    /// Peer messages refused before raft-rs saw them, by reason
    /// ([`crate::cluster::check::Reason`]).
    pub(super) dropped: [u64; Reason::COUNT],
    /// Per reason: no log line about a refusal before this (mono µs).
    pub(super) drop_quiet_until_us: [u64; Reason::COUNT],
    pub(super) last_transfer_tick: u64,
    /// A stopping leader runs until it handed over, or until this.
    pub(super) hand_over_until_us: u64,
    /// When a stopping node was first seen handed over (mono µs; 0
    /// before): it lingers a little past it (see [`Shard::stop_done`]).
    pub(super) handed_at_us: u64,
    /// Listings parked on a follower until its read barrier is applied:
    /// `(barrier id, index once known, asked at µs, from, request id, op)`.
    pub(super) reads: Vec<ParkedRead>,
    pub(super) next_read: u64,
    /// A compaction whose rewrite is in flight: its snapshot.
    pub(super) compacting: Option<raft::eraftpb::Snapshot>,
    pub(super) compact_entries: u64,
    pub(super) identity: store::Identity,
    /// The recovered log's snapshot, installed into the table by
    /// [`Shard::enable_cluster`].
    pub(super) initial: Option<raft::eraftpb::Snapshot>,
    /// Each member's Raft address as given (`HOST:PORT` of its shard 0's
    /// link; shard *g* listens on the port + *g*): the `--peers` of a new
    /// group, then what the snapshots and configuration changes say.
    pub(super) addrs: BTreeMap<u64, String>,
    /// This node left the group (a configuration change removed it).
    pub(super) removed: bool,
    /// A follower needs a newer snapshot: compact at the next chance.
    pub(super) snapshot_wanted: bool,
    /// `--force-new-cluster`, until the log rewritten as this node alone
    /// is durable: no membership change yet.
    pub(super) forced: bool,
    /// The configuration notices this shard's messages carry, by peer
    /// (the encoded [`crate::cluster::replica::EXCLUDED_FIELD`]), as of
    /// `NodeView::conf_gen` `excluded_gen`.
    pub(super) excluded_notes: BTreeMap<u64, Vec<u8>>,
    pub(super) excluded_gen: u64,
    /// Logged that a peer said this node is excluded (once per notice).
    pub(super) excluded_logged: bool,
}

impl GroupReplica {
    pub fn new(
        replica: Replica,
        file: Log,
        group: usize,
        view: Arc<NodeView>,
        my_client_addr: String,
        election_us: u64,
        session_keep_ms: u64,
    ) -> GroupReplica {
        GroupReplica {
            replica,
            batch: Log::replicated(),
            file,
            persisting: VecDeque::new(),
            proposal: None,
            out: Output::default(),
            stats: Stats::default(),
            next_tick_us: 0,
            group,
            served_term: 0,
            was_serving: false,
            stopped_serving_us: 0,
            client_addrs: BTreeMap::new(),
            my_client_addr,
            view,
            election_us,
            session_keep_ms,
            fatal: None,
            dropped: [0; Reason::COUNT],
            drop_quiet_until_us: [0; Reason::COUNT],
            last_transfer_tick: 0,
            hand_over_until_us: 0,
            handed_at_us: 0,
            reads: Vec::new(),
            next_read: 1,
            compacting: None,
            compact_entries: crate::cluster::COMPACT_ENTRIES,
            identity: store::Identity {
                node: 0,
                group: group as u32,
                groups: 0,
                voters: Vec::new(),
            },
            initial: None,
            addrs: BTreeMap::new(),
            removed: false,
            snapshot_wanted: false,
            forced: false,
            excluded_notes: BTreeMap::new(),
            excluded_gen: u64::MAX,
            excluded_logged: false,
        }
    }
    /// A committed entry (or a snapshot) could not be applied: the node
    /// stops (the driver logs it and exits, see [`FailStop`]).
    pub(super) fn apply_failed(&mut self, index: u64, why: String) {
        self.fail(FailKind::Apply, Some(index), why);
    }

    /// The node must stop: the first reason stays.
    pub(super) fn fail(&mut self, kind: FailKind, index: Option<u64>, why: String) {
        if self.fatal.is_none() {
            self.fatal = Some(FailStop {
                group: self.group,
                index,
                why,
                kind,
            });
        }
    }

    /// A peer's message was refused (before raft-rs saw it): counted, and
    /// logged unless a refusal for the same reason was logged in the last
    /// 10 s.
    pub(super) fn refused(&mut self, link: u64, refusal: &Refusal, now_us: u64) {
        let i = refusal.reason.index();
        self.dropped[i] += 1;
        if now_us < self.drop_quiet_until_us[i] {
            return;
        }
        self.drop_quiet_until_us[i] = now_us + DROP_LOG_QUIET_US;
        log!(
            Level::Warn,
            "raft_message_dropped",
            "group={} link_node={} reason={} dropped_total={} detail=\"{}\"",
            self.group,
            link,
            refusal.reason.label(),
            self.dropped[i],
            crate::log::Escaped(&refusal.detail)
        );
    }

    pub fn file(&self) -> &Log {
        &self.file
    }

    /// The identity a node's log of `group` carries.
    pub fn identity(
        cluster: &crate::cluster::ClusterConfig,
        group: usize,
        groups: usize,
    ) -> store::Identity {
        store::Identity {
            node: cluster.node_id,
            group: group as u32,
            groups: groups as u32,
            // A joining node learns its cluster's from the first Hello.
            voters: if cluster.join {
                Vec::new()
            } else {
                cluster.voters()
            },
        }
    }

    /// The Hello this shard's links send (`groups`: the node's shards).
    pub fn hello(&self, groups: usize) -> Option<wire::Hello> {
        Some(wire::Hello {
            node: self.replica.id(),
            group: self.group as u32,
            groups: groups as u32,
            voters: self.identity.voters.clone(),
            client_addr: self.my_client_addr.clone(),
        })
    }

    /// Every other member's link for this shard (the links to dial).
    pub fn link_peers(&self) -> Vec<(u64, std::net::SocketAddr)> {
        let me = self.replica.id();
        self.addrs
            .iter()
            .filter(|(&id, _)| id != me)
            .filter_map(|(&id, a)| Some((id, link_addr(a, self.group)?)))
            .collect()
    }

    /// The replica of `group` on this node, from its log's image (the
    /// whole file, [`store::new_image`] for a new node). Refuses a log
    /// written by another node, group or cluster shape. `seed` spreads
    /// election timeouts; `now_unix_ms` is irrelevant to replay (entries
    /// are applied later, by raft-rs re-delivering the committed ones).
    #[allow(clippy::too_many_arguments)] // a replica's parts, given once
    pub fn start(
        cluster: &crate::cluster::ClusterConfig,
        group: usize,
        groups: usize,
        image: &[u8],
        shown: &str,
        view: Arc<NodeView>,
        my_client_addr: String,
        session_keep_ms: u64,
        seed: u64,
    ) -> Result<GroupReplica, String> {
        let r = store::replay(image, shown)?;
        GroupReplica::from_replayed(
            cluster,
            group,
            groups,
            r,
            shown,
            view,
            my_client_addr,
            session_keep_ms,
            seed,
        )
    }

    /// [`GroupReplica::start`] over a log already replayed.
    #[allow(clippy::too_many_arguments)] // a replica's parts, given once
    pub fn from_replayed(
        cluster: &crate::cluster::ClusterConfig,
        group: usize,
        groups: usize,
        r: store::Replayed,
        shown: &str,
        view: Arc<NodeView>,
        my_client_addr: String,
        session_keep_ms: u64,
        seed: u64,
    ) -> Result<GroupReplica, String> {
        let want = GroupReplica::identity(cluster, group, groups);
        // The founding voters are the cluster's identity, whatever the
        // membership became since (and whatever --peers says now).
        let founding = match &r.identity {
            Some(id) if (id.node, id.group, id.groups) == (want.node, want.group, want.groups) => {
                id.voters.clone()
            }
            Some(id) => {
                return Err(format!(
                    "{shown}: this log belongs to node {} (shard {} of {}), not to node {} (shard \
                     {} of {}); refusing to start. Every node of a cluster runs the same --threads, \
                     and each keeps its own --data-path",
                    id.node, id.group, id.groups, want.node, want.group, want.groups
                ))
            }
            None => return Err(format!("{shown}: the cluster log has no identity record")),
        };
        // The members' addresses: a snapshot's, else (a log that never
        // changed membership) --peers.
        let addrs: BTreeMap<u64, String> = match &r.members {
            Some(m) => m.addrs.clone(),
            None => cluster
                .peers
                .iter()
                .map(|(&id, a)| (id, a.to_string()))
                .collect(),
        };
        let mut r = r;
        let mut addrs = addrs;
        let voters = if cluster.force_new {
            force_alone(cluster, group, &mut r, &mut addrs)
        } else {
            founding.clone()
        };
        let initial =
            (r.recovered.snapshot.get_metadata().index > 0).then(|| r.recovered.snapshot.clone());
        let replica = Replica::new(
            crate::cluster::replica::ReplicaConfig {
                id: cluster.node_id,
                // The log's founders (a joining node's: none until its
                // first Hello, then the ones it adopted; this node alone
                // when forced).
                voters,
                election_ticks: cluster.election_ticks,
                heartbeat_ticks: cluster.heartbeat_ticks,
                seed: seed ^ group as u64,
            },
            r.recovered,
        )?;
        let file = Log::raw(r.valid_len);
        let mut part = GroupReplica::new(
            replica,
            file,
            group,
            view,
            my_client_addr,
            cluster.election_us(),
            session_keep_ms,
        );
        part.identity = store::Identity {
            voters: founding,
            ..want
        };
        part.addrs = addrs;
        part.snapshot_wanted = cluster.force_new;
        part.forced = cluster.force_new;
        part.compact_entries = cluster.compact_entries.max(1);
        part.initial = initial;
        Ok(part)
    }
}

/// `--force-new-cluster` (disaster recovery): this node alone, every entry
/// it has kept. Configuration history is void (blanked to empty entries),
/// only this node's address is kept, and the log is rewritten as a
/// snapshot naming only this node once everything is applied
/// (`GroupReplica::snapshot_wanted`). Returns the voters: this node.
fn force_alone(
    cluster: &crate::cluster::ClusterConfig,
    group: usize,
    r: &mut store::Replayed,
    addrs: &mut BTreeMap<u64, String>,
) -> Vec<u64> {
    let me = cluster.node_id;
    let alone = raft::eraftpb::ConfState::from((vec![me], vec![]));
    if r.recovered.snapshot.get_metadata().index > 0 {
        r.recovered
            .snapshot
            .mut_metadata()
            .set_conf_state(alone.clone());
    }
    let mut blanked = 0;
    for e in r.recovered.entries.iter_mut() {
        if Replica::is_change(e) {
            e.set_entry_type(raft::eraftpb::EntryType::EntryNormal);
            e.data = Vec::new().into();
            blanked += 1;
        }
    }
    let mine = addrs
        .get(&me)
        .cloned()
        .or_else(|| cluster.peers.get(&me).map(|a| a.to_string()));
    addrs.clear();
    if let Some(a) = mine {
        addrs.insert(me, a);
    }
    log!(
        Level::Warn,
        "raft_forced_new_cluster",
        "group={} node={} entries_kept={} changes_voided={} action=\"this node is the only \
             voter; its log is rewritten once applied; remove --force-new-cluster before the next \
             start\"",
        group,
        me,
        r.recovered.entries.len(),
        blanked
    );
    vec![me]
}

/// The address of shard `group`'s link of a member whose shard 0 links
/// on `addr` (`HOST:PORT`, resolved now).
pub(super) fn link_addr(addr: &str, group: usize) -> Option<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let mut a = addr.to_socket_addrs().ok()?.next()?;
    a.set_port(a.port().checked_add(group as u16)?);
    Some(a)
}
