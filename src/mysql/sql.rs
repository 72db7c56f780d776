//! The statements and what their answers mean (pure: no I/O).
//!
//! Statements go out as text with the key quoted by the driver's own
//! escaping (aware of `NO_BACKSLASH_ESCAPES`), not as prepared statements:
//! a prepare is a round trip per session, and with a pool that resets
//! sessions it would be paid on every acquire and every release. The shapes
//! are the contract's: `SELECT COALESCE(GET_LOCK(key, seconds), -1)` and
//! `SELECT COALESCE(RELEASE_LOCK(key), -1)`, so NULL arrives as -1.

use std::time::Duration;

use crate::lease::Error;

/// The longest key, in characters (code points): MySQL's limit for lock
/// names. MariaDB accepts longer ones; the limit is kept so that a key
/// works on both.
pub const KEY_CHARS_MAX: usize = 64;

/// Longer lock timeouts are sent as this (ten years): far beyond any real
/// wait, and far below what the server treats as an error.
pub const LOCK_TIMEOUT_MAX: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The keep-alive: evaluates an expression and returns no result set, so
/// there are no rows to drain.
pub(crate) const KEEP_ALIVE: &str = "DO 1";

/// Refuses keys outside 1..=64 characters (counted as code points, not
/// bytes: a 64-character key may be 256 bytes of UTF-8).
pub(crate) fn validate_key(key: &str) -> Result<(), Error> {
    let mut chars = key.chars();
    let ok = chars.next().is_some() && chars.nth(KEY_CHARS_MAX - 1).is_none();
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidKey(format!(
            "must be 1..{KEY_CHARS_MAX} characters"
        )))
    }
}

fn quote(key: &str, no_backslash_escapes: bool) -> String {
    ::mysql::Value::from(key).as_sql(no_backslash_escapes)
}

/// `d` as fractional seconds with microsecond precision, e.g. `1.500000`.
pub(crate) fn seconds(d: Duration) -> String {
    let d = d.min(LOCK_TIMEOUT_MAX);
    format!("{}.{:06}", d.as_secs(), d.subsec_micros())
}

pub(crate) fn get_lock(key: &str, timeout: Duration, no_backslash_escapes: bool) -> String {
    format!(
        "SELECT COALESCE(GET_LOCK({}, {}), -1)",
        quote(key, no_backslash_escapes),
        seconds(timeout)
    )
}

pub(crate) fn release_lock(key: &str, no_backslash_escapes: bool) -> String {
    format!(
        "SELECT COALESCE(RELEASE_LOCK({}), -1)",
        quote(key, no_backslash_escapes)
    )
}

/// 1 if this session holds `key`, else 0 (used by `extend`).
pub(crate) fn held_here(key: &str, no_backslash_escapes: bool) -> String {
    format!(
        "SELECT COALESCE(IS_USED_LOCK({}) = CONNECTION_ID(), 0)",
        quote(key, no_backslash_escapes)
    )
}

/// What a `GET_LOCK` answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grant {
    /// 1: this session holds the lock.
    Acquired,
    /// 0: the wait timed out; another session holds it.
    TimedOut,
    /// Anything else (-1 for NULL: an error such as a killed query, or no
    /// row at all): a failure, distinct from a timeout.
    Failed(Option<i64>),
}

pub(crate) fn grant(answer: Option<i64>) -> Grant {
    match answer {
        Some(1) => Grant::Acquired,
        Some(0) => Grant::TimedOut,
        other => Grant::Failed(other),
    }
}

/// Why a `RELEASE_LOCK` answer other than 1 means "lock lost".
pub(crate) fn release_problem(answer: Option<i64>) -> Option<String> {
    match answer {
        Some(1) => None,
        Some(0) => Some("RELEASE_LOCK returned 0: another session holds it".into()),
        Some(-1) => Some("RELEASE_LOCK returned NULL: no such lock".into()),
        Some(n) => Some(format!("RELEASE_LOCK returned {n}")),
        None => Some("RELEASE_LOCK returned no row".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_counted_in_characters() {
        assert!(
            validate_key(&"é".repeat(64)).is_ok(),
            "64 chars = 128 bytes is allowed"
        );
        assert!(validate_key("k").is_ok());
        let err = validate_key(&"é".repeat(65)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid lock key: must be 1..64 characters"
        );
        assert!(validate_key("").is_err());
        assert!(validate_key(&"a".repeat(65)).is_err());
    }

    #[test]
    fn answers_map_to_the_contracts_outcomes() {
        assert_eq!(grant(Some(1)), Grant::Acquired);
        assert_eq!(grant(Some(0)), Grant::TimedOut);
        // A server answering 2 (or NULL, sent as -1) did not grant: failure,
        // not timeout.
        assert_eq!(grant(Some(2)), Grant::Failed(Some(2)));
        assert_eq!(grant(Some(-1)), Grant::Failed(Some(-1)));
        assert_eq!(grant(None), Grant::Failed(None));
        assert_eq!(release_problem(Some(1)), None);
        for lost in [Some(0), Some(-1), Some(2), None] {
            assert!(release_problem(lost).is_some(), "{lost:?} is lock lost");
        }
    }

    #[test]
    fn statements_quote_the_key_and_send_fractional_seconds() {
        assert_eq!(
            get_lock("a'b\\c", Duration::from_millis(1500), false),
            "SELECT COALESCE(GET_LOCK('a\\'b\\\\c', 1.500000), -1)"
        );
        assert_eq!(
            release_lock("a'b", true),
            "SELECT COALESCE(RELEASE_LOCK('a''b'), -1)"
        );
        assert_eq!(seconds(Duration::MAX), "315360000.000000");
        assert_eq!(seconds(Duration::from_micros(1)), "0.000001");
    }
}
