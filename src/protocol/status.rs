//! `CLST` (admin port, extension): each shard's replication state, as the
//! node that answers sees it. Answered by every node, leader or not (a
//! follower refuses the lock-table commands), and by a single-node server
//! with the count 0: "not a cluster member".
//!
//! Answer, integers little-endian:
//!
//! ```text
//! u32 count                        0: this server is not a cluster member
//! count × record, sorted by shard:
//!   u32 shard   u64 node   u8 role   u8 flags
//!   u64 term    u64 leader u64 commit u64 applied u64 last_index
//!   u8 followers, then followers × [u64 node][u64 matched][u8 active]
//! ```
//!
//! `role`: 0 follower, 1 pre-candidate, 2 candidate, 3 leader. `flags`:
//! bit 0 serving (this shard answers lock requests), bit 1 the leader
//! lease holds. `leader` 0: none known. The followers are listed by the
//! leader only (none elsewhere): `matched` is the highest log index known
//! to be in that follower's log (its lag is `last_index - matched`),
//! `active` whether it was heard from within the last election timeout.
//! The format is fixed: more fields would come under a new command name.

/// Most records an answer may carry (a node has at most this many shards).
pub const RECORDS_MAX: u32 = 4096;
/// Bytes of a record without its followers.
const RECORD_FIXED: usize = 4 + 8 + 1 + 1 + 5 * 8 + 1;
const FOLLOWER_BYTES: usize = 8 + 8 + 1;

/// A replica's role in its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Follower,
    PreCandidate,
    Candidate,
    Leader,
}

impl Role {
    pub fn byte(self) -> u8 {
        match self {
            Role::Follower => 0,
            Role::PreCandidate => 1,
            Role::Candidate => 2,
            Role::Leader => 3,
        }
    }
    pub fn from_byte(b: u8) -> Option<Role> {
        Some(match b {
            0 => Role::Follower,
            1 => Role::PreCandidate,
            2 => Role::Candidate,
            3 => Role::Leader,
            _ => return None,
        })
    }
    /// The role's name, as `ringlock cluster status` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Follower => "follower",
            Role::PreCandidate => "pre-candidate",
            Role::Candidate => "candidate",
            Role::Leader => "leader",
        }
    }
    /// The role a replica names itself (`Replica::role_name`).
    pub fn from_name(name: &str) -> Option<Role> {
        [
            Role::Follower,
            Role::PreCandidate,
            Role::Candidate,
            Role::Leader,
        ]
        .into_iter()
        .find(|r| r.name() == name)
    }
}

/// One follower as its leader sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Follower {
    pub node: u64,
    pub matched: u64,
    pub active: bool,
}

/// One shard's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardStatus {
    pub shard: u32,
    /// The answering node.
    pub node: u64,
    pub role: Role,
    pub serving: bool,
    pub lease_valid: bool,
    pub term: u64,
    /// 0: no leader known.
    pub leader: u64,
    pub commit: u64,
    pub applied: u64,
    pub last_index: u64,
    /// Listed by the leader only.
    pub followers: Vec<Follower>,
}

impl ShardStatus {
    /// How far `f` is behind this (leader's) log.
    pub fn lag(&self, f: &Follower) -> u64 {
        self.last_index.saturating_sub(f.matched)
    }
}

/// Encodes a `CLST` answer (no records: not a cluster member).
pub fn encode(records: &[ShardStatus], out: &mut Vec<u8>) {
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for r in records {
        out.extend_from_slice(&r.shard.to_le_bytes());
        out.extend_from_slice(&r.node.to_le_bytes());
        out.push(r.role.byte());
        out.push(u8::from(r.serving) | (u8::from(r.lease_valid) << 1));
        for v in [r.term, r.leader, r.commit, r.applied, r.last_index] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let n = r.followers.len().min(u8::MAX as usize);
        out.push(n as u8);
        for f in &r.followers[..n] {
            out.extend_from_slice(&f.node.to_le_bytes());
            out.extend_from_slice(&f.matched.to_le_bytes());
            out.push(u8::from(f.active));
        }
    }
}

/// Parses a whole `CLST` answer from the front of `buf`: `Ok(None)` while
/// it is incomplete, `Ok(Some((records, consumed)))` once whole (no
/// records: not a cluster member), `Err` for bytes no server sends.
pub fn decode(buf: &[u8]) -> Result<Option<(Vec<ShardStatus>, usize)>, String> {
    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
    }
    let Some(count) = buf.get(..4) else {
        return Ok(None);
    };
    let count = u32::from_le_bytes(count.try_into().expect("4 bytes"));
    if count > RECORDS_MAX {
        return Err(format!(
            "CLST: {count} shard records exceed the limit of {RECORDS_MAX}"
        ));
    }
    let mut at = 4;
    let mut records = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let Some(b) = buf.get(at..at + RECORD_FIXED) else {
            return Ok(None);
        };
        let role = Role::from_byte(b[12]).ok_or_else(|| format!("CLST: unknown role {}", b[12]))?;
        if b[13] & !0b11 != 0 {
            return Err(format!("CLST: unknown flags {:#04x}", b[13]));
        }
        let n = b[RECORD_FIXED - 1] as usize;
        at += RECORD_FIXED;
        let Some(fb) = buf.get(at..at + n * FOLLOWER_BYTES) else {
            return Ok(None);
        };
        let mut followers = Vec::with_capacity(n);
        for f in fb.chunks_exact(FOLLOWER_BYTES) {
            followers.push(Follower {
                node: u64_at(f, 0),
                matched: u64_at(f, 8),
                active: match f[16] {
                    0 => false,
                    1 => true,
                    x => return Err(format!("CLST: follower active byte {x}")),
                },
            });
        }
        at += n * FOLLOWER_BYTES;
        records.push(ShardStatus {
            shard: u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")),
            node: u64_at(b, 4),
            role,
            serving: b[13] & 1 != 0,
            lease_valid: b[13] & 2 != 0,
            term: u64_at(b, 14),
            leader: u64_at(b, 22),
            commit: u64_at(b, 30),
            applied: u64_at(b, 38),
            last_index: u64_at(b, 46),
            followers,
        });
    }
    Ok(Some((records, at)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn leader() -> ShardStatus {
        ShardStatus {
            shard: 1,
            node: 2,
            role: Role::Leader,
            serving: true,
            lease_valid: true,
            term: 7,
            leader: 2,
            commit: 40,
            applied: 39,
            last_index: 41,
            followers: vec![
                Follower {
                    node: 1,
                    matched: 41,
                    active: true,
                },
                Follower {
                    node: 3,
                    matched: 12,
                    active: false,
                },
            ],
        }
    }

    #[test]
    fn round_trips_and_waits_for_the_whole_answer() {
        let follower = ShardStatus {
            shard: 0,
            role: Role::Follower,
            serving: false,
            lease_valid: false,
            followers: Vec::new(),
            ..leader()
        };
        let recs = vec![follower, leader()];
        let mut b = Vec::new();
        encode(&recs, &mut b);
        assert_eq!(b.len(), 4 + 2 * RECORD_FIXED + 2 * FOLLOWER_BYTES);
        for cut in 0..b.len() {
            assert_eq!(decode(&b[..cut]).unwrap(), None, "cut at {cut}");
        }
        let (got, used) = decode(&b).unwrap().unwrap();
        assert_eq!((got.as_slice(), used), (recs.as_slice(), b.len()));
        assert_eq!(got[1].lag(&got[1].followers[1]), 29);
        // Not a cluster member: count 0.
        let mut b = Vec::new();
        encode(&[], &mut b);
        assert_eq!(b, [0, 0, 0, 0]);
        assert_eq!(decode(&b).unwrap(), Some((Vec::new(), 4)));
    }

    #[test]
    fn refuses_what_no_server_sends() {
        let mut b = Vec::new();
        encode(&[leader()], &mut b);
        let mut bad = b.clone();
        bad[4 + 12] = 9;
        assert!(decode(&bad).unwrap_err().contains("role"));
        let mut bad = b.clone();
        bad[4 + 13] = 4;
        assert!(decode(&bad).unwrap_err().contains("flags"));
        assert!(decode(&(RECORDS_MAX + 1).to_le_bytes())
            .unwrap_err()
            .contains("limit"));
        for r in [
            Role::Follower,
            Role::PreCandidate,
            Role::Candidate,
            Role::Leader,
        ] {
            assert_eq!(Role::from_name(r.name()), Some(r));
            assert_eq!(Role::from_byte(r.byte()), Some(r));
        }
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes);
        }
    }
}
