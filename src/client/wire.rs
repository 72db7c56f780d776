//! Pure frame codec for the client side of PROTOCOL.md Parts 1 and 2.
//!
//! No sockets and no clocks here: everything is bytes in, bytes or values
//! out, so the codec is unit-tested without a server. Validation happens here
//! too, which is what guarantees that a bad key never reaches the network.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::error::Error;

/// Longest key the protocol can carry (its size is one signed byte).
pub const KEY_LEN_MAX: usize = 127;
/// Longest source name the protocol can carry (its size is one signed byte).
pub const SOURCE_LEN_MAX: usize = 127;

/// Upper bound on a `KEYS` answer we are willing to buffer. A server holding
/// this many bytes of keys is either broken or hostile; either way we stop.
pub(crate) const KEYS_ANSWER_BYTES_MAX: usize = 256 << 20;

/// Lock-port action bytes (PROTOCOL.md Part 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Action {
    Lock = 1,
    Unlock = 2,
    ResetByKey = 3,
    ResetBySource = 4,
    TryLock = 5,
}

/// One-byte answers on the lock port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `+`: granted / done.
    Ok,
    /// `#`: TryLock found the key held.
    Held,
    /// `-`: the server refused the request.
    Refused,
}

pub(crate) fn decode_reply(byte: u8) -> Result<Reply, Error> {
    match byte {
        b'+' => Ok(Reply::Ok),
        b'#' => Ok(Reply::Held),
        b'-' => Ok(Reply::Refused),
        other => Err(Error::Protocol(format!(
            "unexpected answer byte 0x{other:02x}"
        ))),
    }
}

/// Checks a key against the protocol's 1..=127 byte rule.
pub(crate) fn validate_key(key: &[u8]) -> Result<(), Error> {
    if key.is_empty() || key.len() > KEY_LEN_MAX {
        return Err(Error::InvalidKey { len: key.len() });
    }
    Ok(())
}

/// Checks a source against the protocol's 0..=127 byte rule.
pub(crate) fn validate_source(source: &[u8]) -> Result<(), Error> {
    if source.len() > SOURCE_LEN_MAX {
        return Err(Error::InvalidSource { len: source.len() });
    }
    Ok(())
}

/// Encodes a lock-port request. `source` is present exactly for the actions
/// whose frame carries one (Lock and TryLock); ResetBySource puts its source
/// in the `key` position because the frame has a single size-prefixed field.
///
/// Callers validate first; the asserts document that they did.
pub(crate) fn encode(action: Action, field: &[u8], source: Option<&[u8]>) -> Vec<u8> {
    assert!(field.len() <= KEY_LEN_MAX, "field validated by caller");
    let with_source = matches!(action, Action::Lock | Action::TryLock);
    assert_eq!(with_source, source.is_some(), "frame shape for {action:?}");
    let source = source.unwrap_or(&[]);
    assert!(source.len() <= SOURCE_LEN_MAX, "source validated by caller");
    let mut frame = Vec::with_capacity(3 + field.len() + source.len());
    frame.push(action as u8);
    frame.push(field.len() as u8);
    frame.extend_from_slice(field);
    if with_source {
        frame.push(source.len() as u8);
        frame.extend_from_slice(source);
    }
    frame
}

/// One held key as reported by the admin port's `KEYS` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    /// The key, as raw bytes (keys need not be UTF-8).
    pub key: Vec<u8>,
    /// The holder's source name (its IP address if it sent none).
    pub source: Vec<u8>,
    /// The holder's connection as the server saw it, `ip:port`.
    pub endpoint: String,
    /// When the key was granted, in Unix seconds.
    pub acquired_unix_s: i64,
}

impl KeyInfo {
    /// The key as text, with invalid UTF-8 replaced.
    pub fn key_lossy(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }

    /// The source as text, with invalid UTF-8 replaced.
    pub fn source_lossy(&self) -> String {
        String::from_utf8_lossy(&self.source).into_owned()
    }

    /// When the key was granted.
    pub fn acquired(&self) -> SystemTime {
        if self.acquired_unix_s >= 0 {
            UNIX_EPOCH + Duration::from_secs(self.acquired_unix_s as u64)
        } else {
            UNIX_EPOCH - Duration::from_secs(self.acquired_unix_s.unsigned_abs())
        }
    }

    /// How long the key has been held at `now` (zero if the clocks disagree).
    pub fn held_for(&self, now: SystemTime) -> Duration {
        now.duration_since(self.acquired())
            .unwrap_or(Duration::ZERO)
    }
}

/// Parses a complete `KEYS` answer from the front of `buf`.
///
/// Returns `Ok(None)` while the answer is still incomplete, so the caller can
/// read more and call again; `Ok(Some((keys, consumed)))` once it is whole.
pub(crate) fn parse_keys(buf: &[u8]) -> Result<Option<(Vec<KeyInfo>, usize)>, Error> {
    let mut at = 0usize;
    let Some(count) = take(buf, &mut at, 4) else {
        return Ok(None);
    };
    let count = u32::from_le_bytes(count.try_into().expect("took 4 bytes"));
    // Each entry is at least 3 size bytes + 8 time bytes; a count that cannot
    // fit in the bound is corruption, not a reason to preallocate.
    if count as usize > KEYS_ANSWER_BYTES_MAX / 11 {
        return Err(Error::Protocol(format!(
            "KEYS count {count} is implausible"
        )));
    }
    let mut keys = Vec::with_capacity((count as usize).min(4096));
    for _ in 0..count {
        let Some(key) = take_sized(buf, &mut at) else {
            return Ok(None);
        };
        let Some(source) = take_sized(buf, &mut at) else {
            return Ok(None);
        };
        let Some(endpoint) = take_sized(buf, &mut at) else {
            return Ok(None);
        };
        let Some(acquired) = take(buf, &mut at, 8) else {
            return Ok(None);
        };
        keys.push(KeyInfo {
            key: key.to_vec(),
            source: source.to_vec(),
            endpoint: String::from_utf8_lossy(endpoint).into_owned(),
            acquired_unix_s: i64::from_le_bytes(acquired.try_into().expect("took 8 bytes")),
        });
    }
    Ok(Some((keys, at)))
}

fn take<'a>(buf: &'a [u8], at: &mut usize, len: usize) -> Option<&'a [u8]> {
    let slice = buf.get(*at..*at + len)?;
    *at += len;
    Some(slice)
}

fn take_sized<'a>(buf: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let len = *take(buf, at, 1)?.first().expect("took 1 byte") as usize;
    take(buf, at, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_match_protocol_table() {
        assert_eq!(
            encode(Action::Lock, b"k1", Some(b"src")),
            b"\x01\x02k1\x03src".to_vec()
        );
        assert_eq!(
            encode(Action::TryLock, b"k", Some(b"")),
            b"\x05\x01k\x00".to_vec()
        );
        assert_eq!(encode(Action::Unlock, b"k1", None), b"\x02\x02k1".to_vec());
        assert_eq!(
            encode(Action::ResetByKey, b"k", None),
            b"\x03\x01k".to_vec()
        );
        assert_eq!(
            encode(Action::ResetBySource, b"", None),
            b"\x04\x00".to_vec()
        );
        let long = vec![b'x'; KEY_LEN_MAX];
        let frame = encode(Action::Unlock, &long, None);
        assert_eq!(frame[1], 127);
        assert_eq!(frame.len(), 2 + 127);
    }

    #[test]
    fn key_and_source_limits() {
        assert!(matches!(
            validate_key(b""),
            Err(Error::InvalidKey { len: 0 })
        ));
        assert!(validate_key(&[b'a'; 127]).is_ok());
        assert!(matches!(
            validate_key(&[b'a'; 128]),
            Err(Error::InvalidKey { len: 128 })
        ));
        assert!(validate_source(b"").is_ok());
        assert!(validate_source(&[b'a'; 127]).is_ok());
        assert!(matches!(
            validate_source(&[b'a'; 128]),
            Err(Error::InvalidSource { len: 128 })
        ));
    }

    #[test]
    fn replies() {
        assert_eq!(decode_reply(b'+').unwrap(), Reply::Ok);
        assert_eq!(decode_reply(b'#').unwrap(), Reply::Held);
        assert_eq!(decode_reply(b'-').unwrap(), Reply::Refused);
        assert!(matches!(decode_reply(b'x'), Err(Error::Protocol(_))));
    }

    fn keys_answer() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&2u32.to_le_bytes());
        for (k, s, e, t) in [
            ("a", "svc", "127.0.0.1:5000", 1_700_000_000i64),
            ("b/c", "", "10.0.0.1:1", -1),
        ] {
            for f in [k, s, e] {
                b.push(f.len() as u8);
                b.extend_from_slice(f.as_bytes());
            }
            b.extend_from_slice(&t.to_le_bytes());
        }
        b
    }

    #[test]
    fn keys_parse_whole_and_every_prefix() {
        let buf = keys_answer();
        for cut in 0..buf.len() {
            assert!(parse_keys(&buf[..cut]).unwrap().is_none(), "prefix {cut}");
        }
        let (keys, used) = parse_keys(&buf).unwrap().unwrap();
        assert_eq!(used, buf.len());
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].key_lossy(), "a");
        assert_eq!(keys[0].source_lossy(), "svc");
        assert_eq!(keys[0].endpoint, "127.0.0.1:5000");
        assert_eq!(keys[0].acquired_unix_s, 1_700_000_000);
        assert_eq!(
            keys[0].held_for(UNIX_EPOCH + Duration::from_secs(1_700_000_010)),
            Duration::from_secs(10)
        );
        assert_eq!(keys[1].acquired(), UNIX_EPOCH - Duration::from_secs(1));
        assert_eq!(parse_keys(&0u32.to_le_bytes()).unwrap().unwrap().0, vec![]);
    }

    #[test]
    fn keys_rejects_absurd_count() {
        assert!(parse_keys(&u32::MAX.to_le_bytes()).is_err());
    }
}
