//! The replicated shard's log file: Raft's entries and hard state as
//! records of our own format, appended through the shard's write path
//! (group commit, the write planner, preallocation) and replayed at start;
//! and [`Store`], the same log as raft-rs reads it (its `Storage`, in
//! memory: the file is its durable copy).
//!
//! ```text
//! file   := magic "RLRAFT\0\x02" · record*
//! record := crc32c u32 (over len, type, payload) · len u32 (type +
//!           payload) · type u8 · payload
//! 1 Identity  node u64 · group u32 · groups u32 · n u8 · voter u64 × n
//! 2 Entry     index u64 · term u64 · kind u8 · data (a batch of lock
//!             records, see `wal::record`, behind the leader's clock at
//!             proposal: unix_ms u64)
//! 3 HardState term u64 · vote u64 · commit u64
//! 4 Snapshot  index u64 · term u64 · n u8 · voter u64 × n · data (the
//!             table as of that index: lock records behind the snapshotting
//!             node's clock, as a proposal's; since version 2 behind the
//!             membership, see below)
//! ```
//!
//! Version 2 (membership changes) adds, in front of a snapshot's data,
//! the membership as of its index — the whole configuration (voters,
//! learners, the outgoing voters of a joint configuration) and every
//! member's Raft address:
//!
//! ```text
//! members := "RLMEMB\0\x01" · len u32 · conf state (raft-rs protobuf) ·
//!            n u16 · (node u64 · len u8 · "HOST:PORT") × n
//! ```
//!
//! A version-1 log (no membership change ever happened: the members are
//! the voters of its records, their addresses the `--peers`) is read, and
//! its magic is rewritten to version 2 when the node starts; a ringlockd
//! that reads only version 1 then refuses it, naming both versions.
//!
//! A compacted log is the magic, the identity, one Snapshot, the hard state
//! and the entries after the snapshot (written to a temp file, synced and
//! renamed over the log). A snapshot received from the leader is appended;
//! it replaces every entry before it.
//!
//! Replay follows Raft's rule: an entry at index *i* replaces every entry
//! at *i* or after (a new leader overwrote an uncommitted suffix); the last
//! hard state wins. A record cut short or failing its checksum at the end
//! of what was written is a torn append (never acknowledged: its fdatasync
//! did not complete) and is dropped; damage followed by more records is
//! corruption, and the node refuses to start rather than vote or
//! acknowledge with a log it cannot trust.

use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage};

pub const MAGIC: &[u8; 8] = b"RLRAFT\0\x02";
/// What the replica recovered from its log (empty for a new node).
#[derive(Clone, Debug, Default)]
pub struct Recovered {
    pub hard_state: HardState,
    /// The newest snapshot (`index` 0: none); entries follow it.
    pub snapshot: Snapshot,
    pub entries: Vec<Entry>,
}

/// The format before membership changes: read, and upgraded at start.
pub const MAGIC_V1: &[u8; 8] = b"RLRAFT\0\x01";
const MEMBERS_MAGIC: &[u8; 8] = b"RLMEMB\0\x01";
const HEAD: usize = 9;
const T_IDENTITY: u8 = 1;
const T_ENTRY: u8 = 2;
const T_HARD_STATE: u8 = 3;
const T_SNAPSHOT: u8 = 4;

/// Who wrote a log: a node refuses a log of another node, group or
/// cluster shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub node: u64,
    pub group: u32,
    pub groups: u32,
    pub voters: Vec<u64>,
}

/// A new cluster log: the magic and the identity record.
pub fn new_image(id: &Identity) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    encode_identity(id, &mut b);
    b
}

/// Appends one record of `kind` to `out`, `payload` writing its payload
/// in place (no intermediate buffer): `[crc32c][u32 len][kind][payload]`,
/// `len` counting the kind and the payload, the crc covering `len` on.
fn frame(kind: u8, out: &mut Vec<u8>, payload: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    out.push(kind);
    payload(out);
    let len = (out.len() - start - 8) as u32;
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

pub fn encode_identity(id: &Identity, out: &mut Vec<u8>) {
    frame(T_IDENTITY, out, |p| {
        p.extend_from_slice(&id.node.to_le_bytes());
        p.extend_from_slice(&id.group.to_le_bytes());
        p.extend_from_slice(&id.groups.to_le_bytes());
        p.push(id.voters.len() as u8);
        for v in &id.voters {
            p.extend_from_slice(&v.to_le_bytes());
        }
    });
}

/// An entry's record: its data is copied once, from raft-rs's entry into
/// the cluster log's buffer.
pub fn encode_entry(e: &Entry, out: &mut Vec<u8>) {
    frame(T_ENTRY, out, |p| {
        p.extend_from_slice(&e.index.to_le_bytes());
        p.extend_from_slice(&e.term.to_le_bytes());
        p.push(e.get_entry_type() as u8);
        p.extend_from_slice(&e.data);
    });
}

pub fn encode_hard_state(hs: &HardState, out: &mut Vec<u8>) {
    frame(T_HARD_STATE, out, |p| {
        p.extend_from_slice(&hs.term.to_le_bytes());
        p.extend_from_slice(&hs.vote.to_le_bytes());
        p.extend_from_slice(&hs.commit.to_le_bytes());
    });
}

pub fn encode_snapshot(s: &Snapshot, out: &mut Vec<u8>) {
    let m = s.get_metadata();
    let voters = &m.get_conf_state().voters;
    frame(T_SNAPSHOT, out, |p| {
        p.extend_from_slice(&m.index.to_le_bytes());
        p.extend_from_slice(&m.term.to_le_bytes());
        p.push(voters.len() as u8);
        for v in voters {
            p.extend_from_slice(&v.to_le_bytes());
        }
        p.extend_from_slice(&s.data);
    });
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// What a replay found.
#[derive(Debug, Default)]
pub struct Replayed {
    pub identity: Option<Identity>,
    pub recovered: Recovered,
    /// Length of the valid prefix (what follows is dropped).
    pub valid_len: u64,
    pub records: usize,
    pub torn_bytes: u64,
    /// The format version of the file (its magic's last byte; 0: empty).
    pub version: u8,
    /// The membership as of the snapshot (a version-2 snapshot's).
    pub members: Option<Members>,
}

/// A group's membership as of a snapshot: the configuration and each
/// member's Raft address (the address of its shard 0's link).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Members {
    pub conf: ConfState,
    pub addrs: std::collections::BTreeMap<u64, String>,
}

/// A configuration change's context: the added nodes' addresses, one
/// `ID=HOST:PORT` per line.
pub fn encode_addrs(addrs: &[(u64, String)]) -> Vec<u8> {
    let mut out = String::new();
    for (id, a) in addrs {
        out.push_str(&format!("{id}={a}\n"));
    }
    out.into_bytes()
}

/// The addresses of [`encode_addrs`] (lines that do not parse are skipped).
pub fn decode_addrs(context: &[u8]) -> Vec<(u64, String)> {
    String::from_utf8_lossy(context)
        .lines()
        .filter_map(|l| {
            let (id, a) = l.split_once('=')?;
            Some((id.trim().parse().ok()?, a.trim().to_string()))
        })
        .collect()
}

/// A snapshot's data: the membership, then the table (a proposal).
pub fn snapshot_data(members: &Members, table: &[u8]) -> Vec<u8> {
    use protobuf::Message as _;
    let conf = members.conf.write_to_bytes().expect("encode a conf state");
    let mut out = MEMBERS_MAGIC.to_vec();
    let len_at = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(conf.len() as u32).to_le_bytes());
    out.extend_from_slice(&conf);
    out.extend_from_slice(&(members.addrs.len() as u16).to_le_bytes());
    for (id, a) in &members.addrs {
        out.extend_from_slice(&id.to_le_bytes());
        let a = &a.as_bytes()[..a.len().min(255)];
        out.push(a.len() as u8);
        out.extend_from_slice(a);
    }
    let len = (out.len() - len_at - 4) as u32;
    out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
    out.extend_from_slice(table);
    out
}

/// Splits a snapshot's data into its membership (none in a version-1
/// snapshot) and the table (a proposal).
pub fn split_snapshot(data: &[u8]) -> Result<(Option<Members>, &[u8]), String> {
    use protobuf::Message as _;
    if !data.starts_with(MEMBERS_MAGIC) {
        return Ok((None, data));
    }
    let short = || "a snapshot's membership is cut short".to_string();
    let len = u32_at(data, 8).ok_or_else(short)? as usize;
    let end = 12usize
        .checked_add(len)
        .filter(|&e| e <= data.len())
        .ok_or_else(short)?;
    let m = &data[12..end];
    let clen = u32_at(m, 0).ok_or_else(short)? as usize;
    let cbytes = m.get(4..4 + clen).ok_or_else(short)?;
    let conf = ConfState::parse_from_bytes(cbytes)
        .map_err(|e| format!("a snapshot's configuration: {e}"))?;
    let mut at = 4 + clen;
    let n = u16::from_le_bytes(m.get(at..at + 2).ok_or_else(short)?.try_into().expect("2"));
    at += 2;
    let mut addrs = std::collections::BTreeMap::new();
    for _ in 0..n {
        let id = u64_at(m, at).ok_or_else(short)?;
        let l = *m.get(at + 8).ok_or_else(short)? as usize;
        let a = m.get(at + 9..at + 9 + l).ok_or_else(short)?;
        addrs.insert(id, String::from_utf8_lossy(a).into_owned());
        at += 9 + l;
    }
    Ok((Some(Members { conf, addrs }), &data[end..]))
}

/// Replays a log image (the file, magic included). An empty image is a
/// new log.
pub fn replay(data: &[u8], shown: &str) -> Result<Replayed, String> {
    let mut r = Replayed::default();
    if data.len() < MAGIC.len() {
        if MAGIC.starts_with(data) || data.iter().all(|&b| b == 0) {
            r.torn_bytes = data.len() as u64;
            return Ok(r);
        }
        return Err(format!("{shown}: not a ringlock cluster log (bad magic)"));
    }
    r.version = data[7];
    check_magic(data, shown)?;
    let written_end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let mut at = MAGIC.len();
    while at < written_end {
        let rest = &data[at..];
        let torn = |why: &str| -> Result<(), String> {
            Err(format!(
                "{shown}: record at offset {at} is damaged ({why}) and more records follow; \
                 refusing to start with a log that cannot be trusted"
            ))
        };
        let (Some(crc), Some(len)) = (u32_at(rest, 0), u32_at(rest, 4)) else {
            break; // a header cut short at the end: torn
        };
        let end = at + 8 + len as usize;
        if len == 0 || end > data.len() {
            if len == 0 || end >= written_end {
                break; // the zero tail, or a record cut short: torn
            }
            torn("bad length")?;
        }
        if crc32c::crc32c(&data[at + 4..end]) != crc {
            // Torn if nothing written follows within one append piece.
            if written_end <= end + crate::wal::record::APPEND_PIECE_BYTES {
                break;
            }
            torn("checksum mismatch")?;
        }
        let p = &data[at + HEAD..end];
        match data[at + 8] {
            T_IDENTITY => r.identity = Some(identity_record(p, shown)?),
            T_ENTRY => entry_record(&mut r, p, at, shown)?,
            T_SNAPSHOT => snapshot_record(&mut r, p, at, shown)?,
            T_HARD_STATE => hard_state_record(&mut r.recovered.hard_state, p, shown)?,
            t => return Err(format!("{shown}: unknown record type {t} at offset {at}")),
        }
        r.records += 1;
        at = end;
    }
    r.valid_len = at as u64;
    r.torn_bytes = (written_end.max(at) - at) as u64;
    Ok(r)
}

/// A log's first 8 bytes are a cluster log's magic of a version this
/// ringlockd reads (`replay` checked there are 8).
fn check_magic(data: &[u8], shown: &str) -> Result<(), String> {
    if &data[..8] != MAGIC && &data[..8] != MAGIC_V1 {
        if data[..7] == MAGIC[..7] {
            // Another version of this format: a later ringlockd wrote it
            // (or an earlier one, if this one is newer); never guessed at.
            return Err(format!(
                "{shown}: a cluster log of format version {}, this ringlockd reads versions {} \
                 and {}; start the ringlockd version that wrote it (a log is never converted \
                 to an older version)",
                data[7], MAGIC_V1[7], MAGIC[7]
            ));
        }
        if data.starts_with(crate::wal::record::MAGIC) {
            return Err(format!(
                "{shown}: this is a single-node log; a cluster node (--peers) keeps a \
                 cluster log. Start without --peers, or give this node a new --data-path"
            ));
        }
        return Err(format!("{shown}: not a ringlock cluster log (bad magic)"));
    }
    Ok(())
}

/// A T_IDENTITY record's payload.
fn identity_record(p: &[u8], shown: &str) -> Result<Identity, String> {
    let n = *p
        .get(16)
        .ok_or_else(|| format!("{shown}: short identity"))? as usize;
    let voters = (0..n)
        .map(|i| u64_at(p, 17 + 8 * i))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| format!("{shown}: short identity"))?;
    Ok(Identity {
        node: u64_at(p, 0).expect("checked"),
        group: u32_at(p, 8).expect("checked"),
        groups: u32_at(p, 12).expect("checked"),
        voters,
    })
}

/// A T_ENTRY record (payload `p`, at offset `at`) onto `r`'s entries:
/// Raft's rule (an entry replaces every one at or after its index), and
/// the entries must follow each other.
fn entry_record(r: &mut Replayed, p: &[u8], at: usize, shown: &str) -> Result<(), String> {
    let entries = &mut r.recovered.entries;
    let (Some(index), Some(term), Some(&kind)) = (u64_at(p, 0), u64_at(p, 8), p.get(16)) else {
        return Err(format!("{shown}: short entry record at offset {at}"));
    };
    let mut e = Entry {
        index,
        term,
        ..Default::default()
    };
    e.set_entry_type(match kind {
        0 => EntryType::EntryNormal,
        1 => EntryType::EntryConfChange,
        _ => EntryType::EntryConfChangeV2,
    });
    e.data = p[17..].to_vec().into();
    let snap_index = r.recovered.snapshot.get_metadata().index;
    if index <= snap_index {
        // Older than the snapshot that follows it in the file
        // cannot be; one it covers is already in it.
        return Ok(());
    }
    // Raft's rule: this entry replaces everything at or after
    // its index.
    while entries.last().is_some_and(|l| l.index >= index) {
        entries.pop();
    }
    match entries.last() {
        None if index == snap_index + 1 && snap_index > 0 => {}
        Some(l) if l.index + 1 != index => {
            return Err(format!(
                "{shown}: entry {index} at offset {at} does not follow entry {}",
                l.index
            ))
        }
        None if index != 1 => {
            return Err(format!(
                "{shown}: the first entry is {index} (a log without a snapshot \
                 starts at entry 1)"
            ))
        }
        _ => {}
    }
    entries.push(e);
    Ok(())
}

/// A T_SNAPSHOT record (payload `p`, at offset `at`): the snapshot, with
/// its members, replaces everything before it.
fn snapshot_record(r: &mut Replayed, p: &[u8], at: usize, shown: &str) -> Result<(), String> {
    let (Some(index), Some(term), Some(&n)) = (u64_at(p, 0), u64_at(p, 8), p.get(16)) else {
        return Err(format!("{shown}: short snapshot record at offset {at}"));
    };
    let n = n as usize;
    let voters = (0..n)
        .map(|i| u64_at(p, 17 + 8 * i))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| format!("{shown}: short snapshot record at offset {at}"))?;
    let mut s = Snapshot {
        data: p[17 + 8 * n..].to_vec().into(),
        ..Default::default()
    };
    let members = split_snapshot(&s.data)
        .map_err(|e| format!("{shown}: snapshot record at offset {at}: {e}"))?
        .0;
    let m = s.mut_metadata();
    m.index = index;
    m.term = term;
    m.set_conf_state(match &members {
        Some(mb) => mb.conf.clone(),
        None => ConfState::from((voters, vec![])),
    });
    r.members = members;
    r.recovered.snapshot = s;
    // Everything before a snapshot is in it.
    r.recovered.entries.clear();
    Ok(())
}

/// A T_HARD_STATE record's payload into `hs`.
fn hard_state_record(hs: &mut HardState, p: &[u8], shown: &str) -> Result<(), String> {
    hs.term = u64_at(p, 0).ok_or_else(|| format!("{shown}: short hard state"))?;
    hs.vote = u64_at(p, 8).ok_or_else(|| format!("{shown}: short hard state"))?;
    hs.commit = u64_at(p, 16).ok_or_else(|| format!("{shown}: short hard state"))?;
    Ok(())
}

/// A proposal's data: the leader's wall clock at proposal, then the lock
/// records. Deadlines in the records are read relative to that clock, so
/// every replica keeps the *duration* a lease had left, measured on its
/// own monotonic clock from when it applied the entry.
pub fn proposal(unix_ms: u64, records: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&unix_ms.to_le_bytes());
    out.extend_from_slice(records);
}

/// Splits a proposal into its clock and its records.
pub fn split_proposal(data: &[u8]) -> Option<(u64, &[u8])> {
    Some((u64_at(data, 0)?, &data[8..]))
}

// ----- raft-rs's Storage: the same log as raft-rs reads it, in memory -----

/// raft-rs's view of the log: its in-memory store for entries and hard
/// state, and the newest snapshot with its data (the store keeps only a
/// snapshot's metadata). The durable copy of all of it is the shard's log
/// file ([`super::store`]).
pub struct Store {
    pub(super) mem: MemStorage,
    pub(super) snap: Snapshot,
    /// A follower needs a snapshot newer than `snap` (one that names it:
    /// a node added since `snap` cannot install it). The shard compacts
    /// at once ([`Replica::take_snapshot_wanted`](super::replica::Replica::take_snapshot_wanted)).
    pub(super) wanted: std::cell::Cell<bool>,
}

impl Storage for Store {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }
    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }
    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.mem.term(idx)
    }
    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }
    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let cs = self.snap.get_metadata().get_conf_state();
        let names = [
            &cs.voters,
            &cs.learners,
            &cs.voters_outgoing,
            &cs.learners_next,
        ]
        .iter()
        .any(|l| l.contains(&to));
        if self.snap.get_metadata().index < request_index.max(1) || !names {
            // raft-rs asks again at the next heartbeat round.
            self.wanted.set(true);
            return Err(raft::Error::Store(
                raft::StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snap.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_keeps_the_whole_membership() {
        let mut conf = ConfState::from((vec![1, 2, 4], vec![5]));
        conf.voters_outgoing = vec![1, 2, 3];
        conf.auto_leave = true;
        let members = Members {
            conf: conf.clone(),
            addrs: [(1, "10.0.0.1:22200"), (4, "ringlock-4.ringlock:22200")]
                .into_iter()
                .map(|(i, a)| (i, a.to_string()))
                .collect(),
        };
        let mut table = Vec::new();
        proposal(77, b"records", &mut table);
        let data = snapshot_data(&members, &table);
        let (got, rest) = split_snapshot(&data).unwrap();
        assert_eq!(got.as_ref(), Some(&members));
        assert_eq!(split_proposal(rest), Some((77, &b"records"[..])));
        // A version-1 snapshot's data is the table alone.
        assert_eq!(split_snapshot(&table).unwrap(), (None, &table[..]));
        // Cut short anywhere: an error, never a guess.
        for cut in 9..data.len() - table.len() {
            assert!(split_snapshot(&data[..cut]).is_err(), "cut at {cut}");
        }
        // Through the log: the snapshot's configuration is the whole one.
        let mut f = MAGIC.to_vec();
        let mut snap = Snapshot {
            data: data.into(),
            ..Default::default()
        };
        snap.mut_metadata().index = 9;
        snap.mut_metadata().term = 2;
        snap.mut_metadata().set_conf_state(conf.clone());
        encode_snapshot(&snap, &mut f);
        let r = replay(&f, "t").unwrap();
        assert_eq!(r.recovered.snapshot.get_metadata().get_conf_state(), &conf);
        assert_eq!(r.members, Some(members));
    }

    fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        Entry {
            index,
            term,
            data: data.to_vec().into(),
            ..Default::default()
        }
    }

    #[test]
    fn replay_applies_raft_overwrite_rule_and_last_hard_state() {
        let mut f = MAGIC.to_vec();
        let id = Identity {
            node: 2,
            group: 0,
            groups: 1,
            voters: vec![1, 2, 3],
        };
        encode_identity(&id, &mut f);
        for (i, t) in [(1, 1), (2, 1), (3, 1)] {
            encode_entry(&entry(i, t, b"a"), &mut f);
        }
        let mut hs = HardState {
            term: 1,
            commit: 1,
            ..Default::default()
        };
        encode_hard_state(&hs, &mut f);
        // A new leader of term 2 overwrote index 2 onwards.
        encode_entry(&entry(2, 2, b"b"), &mut f);
        hs.term = 2;
        hs.vote = 3;
        encode_hard_state(&hs, &mut f);
        let r = replay(&f, "t").unwrap();
        assert_eq!(r.identity, Some(id));
        let got: Vec<(u64, u64)> = r
            .recovered
            .entries
            .iter()
            .map(|e| (e.index, e.term))
            .collect();
        assert_eq!(got, vec![(1, 1), (2, 2)]);
        assert_eq!(r.recovered.hard_state.term, 2);
        assert_eq!(r.recovered.hard_state.vote, 3);
        assert_eq!(r.valid_len, f.len() as u64);
    }

    #[test]
    fn torn_tail_dropped_damage_refused() {
        let mut f = MAGIC.to_vec();
        encode_entry(&entry(1, 1, b"x"), &mut f);
        let whole = f.len();
        encode_entry(&entry(2, 1, b"yyyy"), &mut f);
        // Cut the last record short: torn, dropped.
        let r = replay(&f[..f.len() - 2], "t").unwrap();
        assert_eq!(r.recovered.entries.len(), 1);
        assert_eq!(r.valid_len, whole as u64);
        // Zeros after it (preallocated space) are not damage.
        let mut z = f.clone();
        z.extend_from_slice(&[0; 4096]);
        assert_eq!(replay(&z, "t").unwrap().recovered.entries.len(), 2);
        // A flipped bit in the first record, with a record after it and
        // far more written after: refused.
        let mut bad = f.clone();
        bad[MAGIC.len() + 12] ^= 1;
        for i in 3..3000 {
            encode_entry(&entry(i, 1, b"zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"), &mut bad);
        }
        assert!(replay(&bad, "t").unwrap_err().contains("damaged"));
        // A single-node log is named as such.
        let single = crate::wal::record::MAGIC.to_vec();
        assert!(replay(&single, "t").unwrap_err().contains("single-node"));
        // A later format version is refused with both versions named, and
        // the file is left as it was (replay only reads it).
        let mut later = f.clone();
        later[7] = 3;
        let e = replay(&later, "t").unwrap_err();
        assert!(
            e.contains("format version 3") && e.contains("reads versions 1 and 2"),
            "{e}"
        );
        // Version 1 (before membership changes) is read.
        let mut v1 = f.clone();
        v1[7] = 1;
        let r = replay(&v1, "t").unwrap();
        assert_eq!((r.version, r.recovered.entries.len()), (1, 2));
    }
}
