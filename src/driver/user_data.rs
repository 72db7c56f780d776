//! The driver's `user_data` codec: which op a completion is for, the
//! generation of the connection slot it was submitted for, and the slot.
//!
//! `user_data` packs `op (4 bits) | generation (28 bits) | slot (32 bits)`;
//! 0 is never produced (every op code is non-zero). A connection slot and
//! its buffers belong to the kernel until the *final* CQE of every op that
//! references them; the generation check drops completions aimed at a
//! previous occupant of a reused slot.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    AcceptLock = 1,
    AcceptAdmin = 2,
    Recv = 3,
    Send = 4,
    Close = 5,
    Refuse = 6,
    Signal = 7,
    Cancel = 8,
    WalWrite = 9,
    WalSync = 10,
    /// Fire-and-forget ops whose completion needs no handling.
    Ignore = 11,
    /// A doorbell from another shard (`IORING_OP_MSG_RING`).
    Mesh = 12,
    /// A cluster link's op (its kind and link in `slot`: see `peer/`).
    Peer = 13,
}

impl Op {
    fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::AcceptLock,
            2 => Op::AcceptAdmin,
            3 => Op::Recv,
            4 => Op::Send,
            5 => Op::Close,
            6 => Op::Refuse,
            7 => Op::Signal,
            8 => Op::Cancel,
            9 => Op::WalWrite,
            10 => Op::WalSync,
            11 => Op::Ignore,
            12 => Op::Mesh,
            13 => Op::Peer,
            _ => return None,
        })
    }
}

/// The shard's slot generations are this wide; the codec keeps them whole.
use crate::shard::conn::GEN_MASK;
const _: () = assert!(
    GEN_MASK == 0x0FFF_FFFF,
    "28 bits of generation in user_data"
);

pub fn encode(op: Op, gen: u32, slot: u32) -> u64 {
    ((op as u64) << 60) | (((gen & GEN_MASK) as u64) << 32) | slot as u64
}

pub fn decode(ud: u64) -> Option<(Op, u32, u32)> {
    let op = Op::from_u8((ud >> 60) as u8)?;
    Some((op, ((ud >> 32) as u32) & GEN_MASK, ud as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_roundtrip() {
        let ud = encode(Op::Send, 0x0ABC_DEF1, 77);
        assert_eq!(decode(ud), Some((Op::Send, 0x0ABC_DEF1, 77)));
        assert_ne!(encode(Op::AcceptLock, 0, 0), 0);
        assert_eq!(decode(0), None);
    }
}
