//! Pure frame codec for the client side of the lock port and the admin
//! port (docs/protocol.md).
//!
//! No sockets and no clocks here: everything is bytes in, bytes or values
//! out, so the codec is unit-tested without a server. Validation happens here
//! too, which is what guarantees that a bad key never reaches the network.

use super::error::Error;

/// Longest key the protocol can carry (its size is one signed byte).
pub const KEY_LEN_MAX: usize = 127;
/// Longest source name the protocol can carry (its size is one signed byte).
pub const SOURCE_LEN_MAX: usize = 127;
/// Longest source a session may hold under (its size byte is unsigned),
/// which the admin port's `RSBS` can name.
pub(crate) const SESSION_SOURCE_LEN_MAX: usize = crate::client::session::SOURCE_LEN_MAX;

pub(crate) use crate::protocol::Action;

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

/// Encodes a lock-port request with the server's own codec
/// ([`crate::protocol::encode`]). `source` is present exactly for the
/// actions whose frame carries one (Lock and TryLock); ResetBySource puts
/// its source in `field` because its frame has a single size-prefixed field.
///
/// Callers validate first; the asserts document that they did.
pub(crate) fn encode(action: Action, field: &[u8], source: Option<&[u8]>) -> Vec<u8> {
    assert!(field.len() <= KEY_LEN_MAX, "field validated by caller");
    let with_source = matches!(action, Action::Lock | Action::TryLock);
    assert_eq!(with_source, source.is_some(), "frame shape for {action:?}");
    let source = source.unwrap_or(&[]);
    assert!(source.len() <= SOURCE_LEN_MAX, "source validated by caller");
    let mut frame = Vec::with_capacity(3 + field.len() + source.len());
    match action {
        Action::ResetBySource => crate::protocol::encode(action, &[], field, &mut frame),
        _ => crate::protocol::encode(action, field, source, &mut frame),
    }
    frame
}

pub use crate::protocol::admin::KeyInfo;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::admin::decode_keys as parse_keys;
    use std::time::{Duration, UNIX_EPOCH};

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
