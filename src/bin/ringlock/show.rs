//! Values as messages show them: a duration, and a key as a shell command
//! line would give it back.

use std::time::Duration;

use crate::{bytes, keys};

/// How to give `key` back on a command line, for messages.
pub(crate) fn shell_key(key: &[u8]) -> String {
    let escaped = bytes::escape(key);
    let plain = escaped.as_bytes() == key
        && key
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-:@%+,=".contains(b));
    if plain {
        escaped
    } else {
        format!("--key-format escaped '{}'", escaped.replace('\'', "'\\''"))
    }
}

pub(crate) fn fmt_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        keys::format_held(d)
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}
