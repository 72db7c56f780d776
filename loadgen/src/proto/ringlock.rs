//! Locking-Center protocol (docs/protocol.md, lock port): one action byte, `i8` sized
//! key and source, one reply byte `+`, `-` or `#`.

use super::{Codec, Op, Reply};

pub const ACTION_LOCK: u8 = 1;
pub const ACTION_UNLOCK: u8 = 2;
pub const ACTION_TRY_LOCK: u8 = 5;

/// Action Persist (extension): opt in to several requests on one
/// connection; without it the server closes after each answer.
pub const ACTION_PERSIST: u8 = 6;

pub struct Lc {
    source: Vec<u8>,
    /// Opt in with Persist at the start of each connection.
    persistent: bool,
}

impl Lc {
    pub fn new(source: Vec<u8>, persistent: bool) -> Lc {
        assert!(
            source.len() <= 127,
            "Locking-Center sources are at most 127 bytes"
        );
        Lc { source, persistent }
    }
}

/// Append one request frame. Keys longer than 127 bytes cannot be framed.
pub fn encode_frame(op: Op, key: &[u8], source: &[u8], out: &mut Vec<u8>) {
    assert!(
        (1..=127).contains(&key.len()),
        "Locking-Center keys are 1..=127 bytes"
    );
    let action = match op {
        Op::Lock => ACTION_LOCK,
        Op::TryLock => ACTION_TRY_LOCK,
        Op::Unlock => ACTION_UNLOCK,
    };
    out.push(action);
    out.push(key.len() as u8);
    out.extend_from_slice(key);
    if op != Op::Unlock {
        out.push(source.len() as u8);
        out.extend_from_slice(source);
    }
}

impl Codec for Lc {
    fn start_connection(&mut self, out: &mut Vec<u8>) -> bool {
        if self.persistent {
            out.push(ACTION_PERSIST);
        }
        self.persistent
    }

    fn handshake(&mut self, buf: &mut Vec<u8>, _out: &mut Vec<u8>) -> Result<bool, String> {
        match buf.first() {
            None => Ok(false),
            Some(b'+') => {
                buf.remove(0);
                Ok(true)
            }
            Some(&b) => Err(format!(
                "Persist answered 0x{b:02x}: the server does not support persistent connections"
            )),
        }
    }

    fn encode(&mut self, op: Op, key: &[u8], out: &mut Vec<u8>) {
        encode_frame(op, key, &self.source, out);
    }

    fn decode(&mut self, op: Op, buf: &mut Vec<u8>) -> Result<Option<Reply>, String> {
        let Some(&b) = buf.first() else {
            return Ok(None);
        };
        buf.remove(0);
        let reply = match (b, op) {
            (b'+', Op::Unlock) => Reply::Released,
            (b'+', _) => Reply::Granted,
            (b'#', Op::TryLock) => Reply::Busy,
            (b'-', _) => Reply::Error("server answered '-'".into()),
            (other, _) => return Err(format!("unexpected reply byte 0x{other:02x} to {op:?}")),
        };
        Ok(Some(reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_match_the_spec() {
        let mut out = Vec::new();
        encode_frame(Op::Lock, b"key", b"src", &mut out);
        assert_eq!(out, b"\x01\x03key\x03src");
        out.clear();
        encode_frame(Op::Unlock, b"key", b"src", &mut out);
        assert_eq!(out, b"\x02\x03key", "Unlock carries no source");
        out.clear();
        encode_frame(Op::TryLock, b"k", b"", &mut out);
        assert_eq!(out, b"\x05\x01k\x00");
    }

    #[test]
    fn replies() {
        let mut c = Lc::new(b"s".to_vec(), false);
        let mut buf = b"+#".to_vec();
        assert_eq!(c.decode(Op::Lock, &mut buf).unwrap(), Some(Reply::Granted));
        assert_eq!(c.decode(Op::TryLock, &mut buf).unwrap(), Some(Reply::Busy));
        assert_eq!(c.decode(Op::Lock, &mut buf).unwrap(), None);
        let mut buf = b"+-".to_vec();
        assert_eq!(
            c.decode(Op::Unlock, &mut buf).unwrap(),
            Some(Reply::Released)
        );
        assert!(matches!(
            c.decode(Op::Unlock, &mut buf).unwrap(),
            Some(Reply::Error(_))
        ));
        assert!(c.decode(Op::Lock, &mut b"x".to_vec()).is_err());
        assert!(
            c.decode(Op::Lock, &mut b"#".to_vec()).is_err(),
            "# only answers TryLock"
        );
    }
}
