//! Log compaction: the log rewritten as a snapshot of the applied table
//! (with the membership) plus the entries after it, and a snapshot made the
//! table (the recovered one at start, or one a leader sent).

use crate::cluster::store;
use crate::log::Level;
use crate::shard::Shard;

impl Shard {
    /// Compacts the log into a snapshot once enough entries were applied
    /// since the last one, and the log has nothing in flight: the new file
    /// is the snapshot of the applied table, the hard state and the entries
    /// after it, written beside the log and renamed over it.
    pub(in crate::shard) fn maybe_compact(&mut self) {
        let Some(r) = self.journal.replica_mut() else {
            return;
        };
        let applied = r.replica.raft_applied();
        // A follower that needs a newer snapshot than the newest one (a
        // node added since) gets one made now.
        let wanted = r.replica.is_leader() && r.replica.take_snapshot_wanted();
        r.snapshot_wanted |= wanted;
        if r.fatal.is_some()
            || r.compacting.is_some()
            || !r.file.idle()
            || applied <= r.replica.snapshot_index()
            || (applied < r.replica.snapshot_index() + r.compact_entries && !r.snapshot_wanted)
        {
            return;
        }
        r.snapshot_wanted = false;
        let mut table = Vec::with_capacity(64 * 1024);
        self.applied_snapshot(&mut table);
        let r = self.journal.replica_mut().expect("replica");
        let members = store::Members {
            conf: r.replica.conf_state(),
            addrs: r.addrs.clone(),
        };
        let snap = r
            .replica
            .make_snapshot(applied, store::snapshot_data(&members, &table));
        let mut image = store::new_image(&r.identity);
        store::encode_snapshot(&snap, &mut image);
        r.replica.tail_records(applied, &mut image);
        log!(
            Level::Info,
            "raft_compaction_start",
            "group={} snapshot_index={} bytes={}",
            r.group,
            applied,
            image.len()
        );
        r.file.rewrite_with(image);
        r.compacting = Some(snap);
    }

    /// The table as of the last applied entry, as a snapshot's data: the
    /// live table less what is still waiting for its commit (taken back
    /// with the undo list, newest first), behind this node's clock.
    pub(in crate::shard) fn applied_snapshot(&self, out: &mut Vec<u8>) {
        use crate::core::HeldKey;
        use crate::shard::gate::Undo;
        // Ordered maps: the snapshot's bytes depend only on the table
        // (and lock names, chosen by clients, are never hashed here).
        use std::collections::BTreeMap;
        let now = self.now;
        let mut records = Vec::with_capacity(64 * 1024);
        crate::wal::record::encode_grant_mark(self.table.next_grant_id(), &mut records);
        // Holders a pending record touched, by (key, grant id) → the
        // holder as applied (`None`: not held then); the replicated
        // sessions homed here as applied. By grant, not by key: a shared
        // or semaphore key has several holders, and the others stay as
        // they are (keyed by key, a pending Extend of one share left the
        // key's oldest holder alone in the snapshot and dropped the rest).
        let mut touched: BTreeMap<Vec<u8>, BTreeMap<u64, Option<HeldKey>>> = BTreeMap::new();
        let holder = |key: &[u8], grant_id: u64| {
            let hs = self.table.holders_of(key);
            hs.into_iter()
                .map(|(h, _)| h)
                .find(|h| h.grant_id == grant_id)
        };
        let mut sessions: BTreeMap<u64, u32> = self.table.sessions_homed().collect();
        for u in self.durability.undo_newest_first() {
            match u {
                Undo::SessionOpen { sid } => {
                    sessions.remove(sid);
                }
                Undo::SessionEnd { sid, keepalive_ms } => {
                    sessions.insert(*sid, *keepalive_ms);
                }
                Undo::Acquire { key, grant_id } => {
                    let k = touched.entry(key.as_bytes().to_vec()).or_default();
                    k.insert(*grant_id, None);
                }
                Undo::Release { prev } => {
                    let k = touched.entry(prev.key.as_bytes().to_vec()).or_default();
                    k.insert(prev.grant_id, Some(*prev));
                }
                Undo::Proclaim { prev } => {
                    let (key, g) = (prev.key.as_bytes(), prev.grant_id);
                    let k = touched.entry(key.to_vec()).or_default();
                    if let Some(h) = k.entry(g).or_insert_with(|| holder(key, g)) {
                        h.source = prev.source;
                    }
                }
                Undo::Extend(x) => {
                    let (key, g) = (x.key.as_bytes(), x.grant_id);
                    let k = touched.entry(key.to_vec()).or_default();
                    if let Some(h) = k.entry(g).or_insert_with(|| holder(key, g)) {
                        h.expires_unix_ms = x.prev_unix_ms;
                    }
                }
            }
        }
        for (&sid, &ka) in &sessions {
            crate::wal::record::encode_session_open(sid, ka, &mut records);
        }
        self.table.for_each_held(|h| {
            if !touched
                .get(h.key)
                .is_some_and(|k| k.contains_key(&h.grant_id))
            {
                crate::wal::record::encode_acquire(h, &mut records);
            }
        });
        for h in touched.values().flat_map(|k| k.values()).flatten() {
            crate::wal::record::encode_acquire(h.as_ref(), &mut records);
        }
        store::proposal(now.unix_ms, &records, out);
    }
}

/// Makes `table` the table a snapshot's data describes: every holder is
/// released, then the snapshot's records are applied. The number of keys
/// it holds.
pub(in crate::shard) fn install(
    table: &mut crate::core::Table,
    data: &[u8],
    now: crate::core::Now,
) -> Result<usize, String> {
    let (_, data) = store::split_snapshot(data)?;
    let Some((unix_ms, records)) = store::split_proposal(data) else {
        return Err("too short".into());
    };
    let mut keys = Vec::new();
    table.for_each_held(|h| keys.push(h.key.to_vec()));
    for k in &keys {
        table.restore_release(k.as_slice(), now);
    }
    table.sessions_forget();
    crate::wal::apply_replicated(records, unix_ms, table, now)?;
    Ok(table.held_keys())
}
