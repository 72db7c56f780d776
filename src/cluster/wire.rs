//! Frames of a peer link (one TCP connection per peer and shard; the
//! connecting side speaks first).
//!
//! ```text
//! frame := len u32 (kind + payload) · kind u8 · payload
//! 1 Hello  node u64 · group u32 · groups u32 · voters n u8 · id u64 × n ·
//!          client address: len u8 · "HOST:PORT"
//! 2 Raft   a raft-rs message (protobuf)
//! ```
//!
//! A Hello whose group, number of groups or voters differ from the
//! receiver's is refused (the link is closed and the refusal logged): a
//! node never joins another cluster's or shape's traffic.

pub const KIND_HELLO: u8 = 1;
pub const KIND_RAFT: u8 = 2;
/// The largest frame accepted: a batch of entries is capped at 1 MiB by
/// the replica, but a snapshot for a lagging follower holds every held key
/// (about 60 bytes each: 256 MiB is some four million keys).
pub const FRAME_MAX: usize = 256 << 20;
/// The largest frame before a link's Hello: a Hello is at most
/// 8 + 4 + 4 + 1 + 255 × 8 + 1 + 255 bytes (2 313); whatever announces more
/// is not a peer and is closed before its bytes are waited for.
pub const HELLO_FRAME_MAX: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub node: u64,
    pub group: u32,
    pub groups: u32,
    pub voters: Vec<u64>,
    /// The node's client (lock port) address, for `not leader` hints.
    pub client_addr: String,
}

pub fn frame(kind: u8, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&((payload.len() + 1) as u32).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
}

pub fn encode_hello(h: &Hello, out: &mut Vec<u8>) {
    let mut p = Vec::with_capacity(32 + 8 * h.voters.len() + h.client_addr.len());
    p.extend_from_slice(&h.node.to_le_bytes());
    p.extend_from_slice(&h.group.to_le_bytes());
    p.extend_from_slice(&h.groups.to_le_bytes());
    p.push(h.voters.len() as u8);
    for v in &h.voters {
        p.extend_from_slice(&v.to_le_bytes());
    }
    let a = h.client_addr.as_bytes();
    p.push(a.len().min(255) as u8);
    p.extend_from_slice(&a[..a.len().min(255)]);
    frame(KIND_HELLO, &p, out);
}

pub fn decode_hello(p: &[u8]) -> Option<Hello> {
    let u64_at = |at: usize| Some(u64::from_le_bytes(p.get(at..at + 8)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(p.get(at..at + 4)?.try_into().ok()?));
    let n = *p.get(16)? as usize;
    let voters = (0..n)
        .map(|i| u64_at(17 + 8 * i))
        .collect::<Option<Vec<_>>>()?;
    let at = 17 + 8 * n;
    let alen = *p.get(at)? as usize;
    let addr = p.get(at + 1..at + 1 + alen)?;
    if p.len() != at + 1 + alen {
        return None;
    }
    Some(Hello {
        node: u64_at(0)?,
        group: u32_at(8)?,
        groups: u32_at(12)?,
        voters,
        client_addr: String::from_utf8(addr.to_vec()).ok()?,
    })
}

/// A whole frame: `(kind, payload, bytes it took)`.
pub type Frame<'a> = (u8, &'a [u8], usize);

/// The next whole frame at the start of `buf`: `(kind, payload, bytes
/// used)`, `Ok(None)` when more bytes are needed, `Err` for a frame no
/// peer sends, or one announcing more than `max` bytes (the link is
/// closed; the length is checked as soon as its 4 bytes are in, never
/// after waiting for the rest).
pub fn next_frame(buf: &[u8], max: usize) -> Result<Option<Frame<'_>>, String> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes(buf[..4].try_into().expect("4")) as usize;
    if len == 0 || len > max {
        return Err(format!("peer frame of {len} bytes (at most {max} here)"));
    }
    if buf.len() < 5 {
        return Ok(None);
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    Ok(Some((buf[4], &buf[5..4 + len], 4 + len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_roundtrip_and_partial_frames() {
        let h = Hello {
            node: 3,
            group: 1,
            groups: 2,
            voters: vec![1, 2, 3],
            client_addr: "127.0.0.1:22119".into(),
        };
        let mut b = Vec::new();
        encode_hello(&h, &mut b);
        frame(KIND_RAFT, b"xyz", &mut b);
        let (k, p, used) = next_frame(&b, HELLO_FRAME_MAX).unwrap().unwrap();
        assert_eq!(k, KIND_HELLO);
        assert_eq!(decode_hello(p), Some(h));
        assert_eq!(next_frame(&b[used..used + 6], FRAME_MAX).unwrap(), None);
        let (k, p, _) = next_frame(&b[used..], FRAME_MAX).unwrap().unwrap();
        assert_eq!((k, p), (KIND_RAFT, &b"xyz"[..]));
        assert!(next_frame(&[0, 0, 0, 0, 1], FRAME_MAX).is_err());
        assert!(decode_hello(&[1, 2, 3]).is_none());
    }

    #[test]
    fn an_oversized_length_is_refused_before_its_bytes_arrive() {
        // 256 MiB announced: refused from the 4 length bytes alone.
        let big = (256u32 << 20).to_le_bytes();
        assert!(next_frame(&big, HELLO_FRAME_MAX).is_err());
        assert!(next_frame(&big, FRAME_MAX).is_ok());
        // The largest Hello fits before the Hello.
        let h = Hello {
            node: u64::MAX,
            group: u32::MAX,
            groups: u32::MAX,
            voters: vec![u64::MAX; 255],
            client_addr: "x".repeat(255),
        };
        let mut b = Vec::new();
        encode_hello(&h, &mut b);
        assert!(b.len() <= HELLO_FRAME_MAX + 4);
        assert!(next_frame(&b, HELLO_FRAME_MAX).unwrap().is_some());
    }
}
