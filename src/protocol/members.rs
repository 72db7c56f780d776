//! Cluster membership on the admin port (extensions, ringlockd only).
//!
//! `CMEM`: each shard's membership as the answering node applied it
//! (every node answers, leader or not). Integers little-endian:
//!
//! ```text
//! u32 count                        0: this server is not a cluster member
//! count × record, sorted by shard:
//!   u32 shard   u64 node   u8 flags
//!   u8 n, n × u64 voters
//!   u8 n, n × u64 outgoing voters  (non-empty: a joint change in progress)
//!   u8 n, n × u64 learners
//!   u16 n, n × [u64 node][u8 len][HOST:PORT]   each member's Raft address
//! ```
//!
//! `flags`: bit 0 a change is in progress (proposed and not yet applied,
//! or joint), bit 1 this node is no longer a member (it was removed).
//!
//! `CCHG`: a membership change, asked of the serving leader, made in every
//! shard's group:
//!
//! ```text
//! "CCHG" · u8 op · u64 node · u64 other · u8 len · address (len bytes)
//! ```
//!
//! `op`: 1 add `node` as a learner at `address` (its shard 0's Raft
//! address), 2 promote the learner `node` to voter (refused until it has
//! caught up), 3 remove `node`, 4 replace voter `node` by the caught-up
//! learner `other` (one joint change: both at once). `other` and the
//! address are zero/empty where the op has none. The answer is `+` once
//! every shard's leader proposed it (it is applied shortly after: watch
//! `CMEM`), else `-`; both followed by `u16 len` and that many bytes of
//! UTF-8 saying why (empty after `+`).

use std::collections::BTreeMap;

/// Most records an answer may carry (a node has at most this many shards).
pub const RECORDS_MAX: u32 = 4096;
/// The longest address a change may carry.
pub const ADDR_MAX: usize = 255;

/// A membership change (`CCHG`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Add `node` as a learner; `addr` is its shard 0's Raft address.
    AddLearner { node: u64, addr: String },
    /// Promote the learner `node` to voter once it has caught up.
    Promote { node: u64 },
    /// Remove `node` (voter or learner).
    Remove { node: u64 },
    /// Replace voter `old` by the caught-up learner `new`, in one joint
    /// change.
    Replace { old: u64, new: u64 },
}

impl Change {
    /// The request's bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let (op, node, other, addr): (u8, u64, u64, &str) = match self {
            Change::AddLearner { node, addr } => (1, *node, 0, addr.as_str()),
            Change::Promote { node } => (2, *node, 0, ""),
            Change::Remove { node } => (3, *node, 0, ""),
            Change::Replace { old, new } => (4, *old, *new, ""),
        };
        let addr = &addr.as_bytes()[..addr.len().min(ADDR_MAX)];
        out.extend_from_slice(b"CCHG");
        out.push(op);
        out.extend_from_slice(&node.to_le_bytes());
        out.extend_from_slice(&other.to_le_bytes());
        out.push(addr.len() as u8);
        out.extend_from_slice(addr);
    }

    /// The length of the request at the front of `buf` (which starts with
    /// `CCHG`), `None` while incomplete.
    pub fn frame_len(buf: &[u8]) -> Option<usize> {
        let n = *buf.get(21)? as usize;
        (buf.len() >= 22 + n).then_some(22 + n)
    }

    /// Decodes a whole request (`CCHG` included), or says why not.
    pub fn decode(buf: &[u8]) -> Result<Change, String> {
        let len = Change::frame_len(buf).ok_or("a CCHG request cut short")?;
        let u64_at = |at: usize| u64::from_le_bytes(buf[at..at + 8].try_into().expect("8"));
        let (node, other) = (u64_at(5), u64_at(13));
        let addr = std::str::from_utf8(&buf[22..len])
            .map_err(|_| "the address is not UTF-8".to_string())?
            .to_string();
        if node == 0 {
            return Err("node 0 is not a node id".into());
        }
        Ok(match buf[4] {
            1 if addr.is_empty() => return Err("adding a node needs its address".into()),
            1 => Change::AddLearner { node, addr },
            2 => Change::Promote { node },
            3 => Change::Remove { node },
            4 if other == 0 || other == node => {
                return Err("a replacement needs another node id".into())
            }
            4 => Change::Replace {
                old: node,
                new: other,
            },
            op => return Err(format!("unknown membership change {op}")),
        })
    }
}

/// Encodes a `CCHG` answer.
pub fn encode_answer(result: &Result<(), String>, out: &mut Vec<u8>) {
    let (c, msg) = match result {
        Ok(()) => (b'+', ""),
        Err(m) => (b'-', m.as_str()),
    };
    let msg = &msg.as_bytes()[..msg.len().min(u16::MAX as usize)];
    out.push(c);
    out.extend_from_slice(&(msg.len() as u16).to_le_bytes());
    out.extend_from_slice(msg);
}

/// Parses a whole `CCHG` answer: `Ok(None)` while incomplete.
pub fn decode_answer(buf: &[u8]) -> Result<Option<Result<(), String>>, String> {
    let (Some(&c), Some(l)) = (buf.first(), buf.get(1..3)) else {
        return Ok(None);
    };
    let n = u16::from_le_bytes(l.try_into().expect("2")) as usize;
    let Some(msg) = buf.get(3..3 + n) else {
        return Ok(None);
    };
    let msg = String::from_utf8_lossy(msg).into_owned();
    match c {
        b'+' => Ok(Some(Ok(()))),
        b'-' => Ok(Some(Err(msg))),
        other => Err(format!("CCHG: answer byte {other:#04x}")),
    }
}

/// One shard's membership (`CMEM`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberStatus {
    pub shard: u32,
    /// The answering node.
    pub node: u64,
    pub change_in_progress: bool,
    /// The answering node is no longer a member.
    pub removed: bool,
    pub voters: Vec<u64>,
    /// The previous voters while a joint change is in progress.
    pub outgoing: Vec<u64>,
    pub learners: Vec<u64>,
    /// Each member's Raft address (its shard 0's link).
    pub addrs: BTreeMap<u64, String>,
}

/// Encodes a `CMEM` answer (no records: not a cluster member).
pub fn encode(records: &[MemberStatus], out: &mut Vec<u8>) {
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for r in records {
        out.extend_from_slice(&r.shard.to_le_bytes());
        out.extend_from_slice(&r.node.to_le_bytes());
        out.push(u8::from(r.change_in_progress) | (u8::from(r.removed) << 1));
        for list in [&r.voters, &r.outgoing, &r.learners] {
            let n = list.len().min(u8::MAX as usize);
            out.push(n as u8);
            for v in &list[..n] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        let n = r.addrs.len().min(u16::MAX as usize);
        out.extend_from_slice(&(n as u16).to_le_bytes());
        for (id, a) in r.addrs.iter().take(n) {
            out.extend_from_slice(&id.to_le_bytes());
            let a = &a.as_bytes()[..a.len().min(ADDR_MAX)];
            out.push(a.len() as u8);
            out.extend_from_slice(a);
        }
    }
}

/// Parses a whole `CMEM` answer from the front of `buf`: `Ok(None)` while
/// incomplete, `Ok(Some((records, consumed)))` once whole.
pub fn decode(buf: &[u8]) -> Result<Option<(Vec<MemberStatus>, usize)>, String> {
    struct Rd<'a>(&'a [u8], usize);
    impl Rd<'_> {
        fn take(&mut self, n: usize) -> Option<&[u8]> {
            let s = self.0.get(self.1..self.1 + n)?;
            self.1 += n;
            Some(s)
        }
        fn u8(&mut self) -> Option<u8> {
            Some(self.take(1)?[0])
        }
        fn u16(&mut self) -> Option<u16> {
            Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
        }
        fn u32(&mut self) -> Option<u32> {
            Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
        }
        fn u64(&mut self) -> Option<u64> {
            Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
        }
        fn ids(&mut self) -> Option<Vec<u64>> {
            let n = self.u8()?;
            (0..n).map(|_| self.u64()).collect()
        }
    }
    let mut rd = Rd(buf, 0);
    let Some(count) = rd.u32() else {
        return Ok(None);
    };
    if count > RECORDS_MAX {
        return Err(format!(
            "CMEM: {count} shard records exceed the limit of {RECORDS_MAX}"
        ));
    }
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let rec = (|| {
            let shard = rd.u32()?;
            let node = rd.u64()?;
            let flags = rd.u8()?;
            let voters = rd.ids()?;
            let outgoing = rd.ids()?;
            let learners = rd.ids()?;
            let n = rd.u16()?;
            let mut addrs = BTreeMap::new();
            for _ in 0..n {
                let id = rd.u64()?;
                let l = rd.u8()? as usize;
                let a = String::from_utf8_lossy(rd.take(l)?).into_owned();
                addrs.insert(id, a);
            }
            Some(MemberStatus {
                shard,
                node,
                change_in_progress: flags & 1 != 0,
                removed: flags & 2 != 0,
                voters,
                outgoing,
                learners,
                addrs,
            })
        })();
        match rec {
            Some(r) => out.push(r),
            None => return Ok(None),
        }
    }
    Ok(Some((out, rd.1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_and_answers_round_trip_and_bad_ones_are_named() {
        for c in [
            Change::AddLearner {
                node: 4,
                addr: "10.0.0.4:22200".into(),
            },
            Change::Promote { node: 4 },
            Change::Remove { node: 3 },
            Change::Replace { old: 3, new: 4 },
        ] {
            let mut b = Vec::new();
            c.encode(&mut b);
            assert_eq!(Change::frame_len(&b), Some(b.len()));
            assert_eq!(Change::frame_len(&b[..b.len() - 1]), None);
            assert_eq!(Change::decode(&b), Ok(c));
        }
        let mut b = Vec::new();
        Change::Remove { node: 0 }.encode(&mut b);
        assert!(Change::decode(&b).unwrap_err().contains("node 0"));
        let mut b = Vec::new();
        Change::Replace { old: 3, new: 3 }.encode(&mut b);
        assert!(Change::decode(&b).unwrap_err().contains("another node"));
        let mut b = Vec::new();
        Change::AddLearner {
            node: 4,
            addr: String::new(),
        }
        .encode(&mut b);
        assert!(Change::decode(&b).unwrap_err().contains("address"));
        b[4] = 9;
        assert!(Change::decode(&b).unwrap_err().contains("unknown"));

        for r in [Ok(()), Err("node 3 is the last voter".to_string())] {
            let mut b = Vec::new();
            encode_answer(&r, &mut b);
            assert_eq!(decode_answer(&b[..b.len() - 1]).unwrap_or(None), None);
            assert_eq!(decode_answer(&b), Ok(Some(r)));
        }
    }

    #[test]
    fn member_status_round_trips_whole_or_not_at_all() {
        let recs = vec![
            MemberStatus {
                shard: 0,
                node: 2,
                change_in_progress: true,
                removed: false,
                voters: vec![1, 2, 4],
                outgoing: vec![1, 2, 3],
                learners: vec![],
                addrs: [(1, "a:1"), (2, "b:2"), (4, "ringlock-4.ringlock:22200")]
                    .into_iter()
                    .map(|(i, a)| (i, a.to_string()))
                    .collect(),
            },
            MemberStatus {
                shard: 1,
                node: 2,
                removed: true,
                ..Default::default()
            },
        ];
        let mut b = Vec::new();
        encode(&recs, &mut b);
        assert_eq!(decode(&b), Ok(Some((recs, b.len()))));
        for cut in 0..b.len() {
            assert_eq!(decode(&b[..cut]), Ok(None), "cut at {cut}");
        }
    }
}
