//! `ringlock keys`: the held-key table and its JSON form.
//!
//! Every cell that comes from the server (key, source, endpoint) goes
//! through [`bytes::escape`], so the table has exactly one line per key and
//! no control byte, whatever the keys contain. The JSON form carries the
//! exact bytes (see [`to_json`]). `extended` says the list came from `KEYX`
//! (with token, mode and lease time left); from a server that only has
//! `KEYS` those cells are `-` (`null` in JSON).

use std::time::{Duration, SystemTime};

use ringlock::client::KeyInfo;

use crate::bytes;

/// The table, header first, columns separated by two spaces.
pub fn table(keys: &[KeyInfo], now: SystemTime, dates: bool, extended: bool) -> String {
    let mut rows: Vec<Vec<String>> = vec![[
        "KEY", "SOURCE", "ENDPOINT", "HELD", "MODE", "TOKEN", "LEASE",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()];
    if dates {
        rows[0].push("ACQUIRED (UTC)".into());
    }
    for k in keys {
        let mut row = vec![
            bytes::escape(&k.key),
            // An empty source is shown as "-" so the columns stay aligned.
            if k.source.is_empty() {
                "-".into()
            } else {
                bytes::escape(&k.source)
            },
            bytes::escape(k.endpoint.as_bytes()),
            format_held(k.held_for(now)),
        ];
        if extended {
            row.push(k.mode.name().into());
            row.push(k.token.to_string());
            row.push(k.lease_left_ms.map_or("-".into(), format_left));
        } else {
            row.extend(["-".into(), "-".into(), "-".into()]);
        }
        if dates {
            row.push(format_utc(k.acquired_unix_s));
        }
        rows.push(row);
    }
    let cols = rows[0].len();
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == cols {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A JSON array, one object per line:
///
/// ```text
/// {"key":"deploy/prod","key_hex":"6465706c6f792f70726f64","source":"svc-a","source_hex":"7376632d61","endpoint":"10.0.0.7:50912","acquired_unix_s":1764449301,"held_s":42,"mode":"lease","token":1764449301000123,"lease_ms_left":2500}
/// ```
///
/// `key_hex` and `source_hex` always carry the exact bytes. `key` and
/// `source` are the same bytes as a string when they are valid UTF-8
/// without control characters, and `null` otherwise. `mode` and `token`
/// are `null` when the server has no `KEYX`; `lease_ms_left` is `null`
/// unless the key is held as a lease.
pub fn to_json(keys: &[KeyInfo], now: SystemTime, extended: bool) -> String {
    let text = |b: &[u8]| bytes::printable_utf8(b).map_or("null".into(), bytes::json_str);
    let mut out = String::from("[");
    for (i, k) in keys.iter().enumerate() {
        out.push_str(if i == 0 { "\n" } else { ",\n" });
        out.push_str(&format!(
            "{{\"key\":{},\"key_hex\":\"{}\",\"source\":{},\"source_hex\":\"{}\",\"endpoint\":{},\"acquired_unix_s\":{},\"held_s\":{},\"mode\":{},\"token\":{},\"lease_ms_left\":{}}}",
            text(&k.key),
            bytes::hex(&k.key),
            text(&k.source),
            bytes::hex(&k.source),
            bytes::json_str(&k.endpoint),
            k.acquired_unix_s,
            k.held_for(now).as_secs(),
            if extended { format!("\"{}\"", k.mode.name()) } else { "null".into() },
            if extended { k.token.to_string() } else { "null".into() },
            match (extended, k.lease_left_ms) {
                (true, Some(ms)) => ms.to_string(),
                _ => "null".into(),
            },
        ));
    }
    out.push_str(if keys.is_empty() { "]\n" } else { "\n]\n" });
    out
}

/// A lease's time left: `850ms`, `2.5s`, then as [`format_held`].
pub fn format_left(ms: u32) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", f64::from(ms) / 1000.0),
        _ => format_held(Duration::from_millis(u64::from(ms))),
    }
}

/// `5s`, `1m05s`, `1h02m05s`, `1d01h01m`.
pub fn format_held(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60),
        _ => format!("{}d{:02}h{:02}m", s / 86_400, s / 3600 % 24, s / 60 % 60),
    }
}

/// Unix seconds to `YYYY-MM-DDTHH:MM:SSZ` (Howard Hinnant's civil_from_days).
pub fn format_utc(unix_s: i64) -> String {
    let days = unix_s.div_euclid(86_400);
    let secs = unix_s.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn info(key: &[u8], source: &[u8], at: i64) -> KeyInfo {
        KeyInfo {
            key: key.to_vec(),
            source: source.to_vec(),
            endpoint: "127.0.0.1:5".into(),
            acquired_unix_s: at,
            token: 0,
            mode: ringlock::core::HoldMode::Persistent,
            lease_left_ms: None,
        }
    }

    #[test]
    fn utc_and_held_formatting() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(format_utc(-1), "1969-12-31T23:59:59Z");
        assert_eq!(format_held(Duration::from_secs(5)), "5s");
        assert_eq!(format_held(Duration::from_secs(65)), "1m05s");
        assert_eq!(format_held(Duration::from_secs(3725)), "1h02m05s");
        assert_eq!(format_held(Duration::from_secs(90_061)), "1d01h01m");
    }

    #[test]
    fn table_has_one_line_per_key_whatever_the_bytes() {
        let now = UNIX_EPOCH + Duration::from_secs(100);
        let keys = [
            info(b"a\nFAKE  src  1.2.3.4:5  0s", b"\x1b[2J", 40),
            info(b"\xff", b"", 99),
        ];
        let t = table(&keys, now, false, false);
        assert_eq!(t.lines().count(), 3, "{t}");
        assert!(
            !t.bytes().any(|b| b.is_ascii_control() && b != b'\n'),
            "{t:?}"
        );
        let row: Vec<&str> = t.lines().nth(1).expect("row").split_whitespace().collect();
        assert_eq!(
            row,
            [
                "a\\nFAKE\\x20\\x20src\\x20\\x201.2.3.4:5\\x20\\x200s",
                "\\x1b[2J",
                "127.0.0.1:5",
                "1m00s",
                "-",
                "-",
                "-"
            ]
        );
        let row: Vec<&str> = t.lines().nth(2).expect("row").split_whitespace().collect();
        assert_eq!(row, ["\\xff", "-", "127.0.0.1:5", "1s", "-", "-", "-"]);
    }

    #[test]
    fn keyx_columns_show_mode_token_and_lease_left() {
        let now = UNIX_EPOCH + Duration::from_secs(100);
        let mut lease = info(b"l", b"s", 99);
        lease.mode = ringlock::core::HoldMode::Lease;
        lease.token = 1_700_000_000_000_123;
        lease.lease_left_ms = Some(2_500);
        let mut sess = info(b"s", b"s", 99);
        sess.mode = ringlock::core::HoldMode::Session;
        sess.token = 9;
        let t = table(&[lease.clone(), sess.clone()], now, true, true);
        let head: Vec<&str> = t.lines().next().expect("head").split_whitespace().collect();
        assert_eq!(
            head,
            ["KEY", "SOURCE", "ENDPOINT", "HELD", "MODE", "TOKEN", "LEASE", "ACQUIRED", "(UTC)"]
        );
        let row: Vec<&str> = t.lines().nth(1).expect("row").split_whitespace().collect();
        assert_eq!(
            row,
            [
                "l",
                "s",
                "127.0.0.1:5",
                "1s",
                "lease",
                "1700000000000123",
                "2.5s",
                "1970-01-01T00:01:39Z"
            ]
        );
        let row: Vec<&str> = t.lines().nth(2).expect("row").split_whitespace().collect();
        assert_eq!(&row[4..7], ["session", "9", "-"]);
        let j = to_json(&[lease, sess], now, true);
        assert!(
            j.contains("\"mode\":\"lease\",\"token\":1700000000000123,\"lease_ms_left\":2500}"),
            "{j}"
        );
        assert!(
            j.contains("\"mode\":\"session\",\"token\":9,\"lease_ms_left\":null}"),
            "{j}"
        );
        assert_eq!(format_left(850), "850ms");
        assert_eq!(format_left(61_000), "1m01s");
    }

    #[test]
    fn json_carries_the_exact_bytes() {
        let now = UNIX_EPOCH + Duration::from_secs(100);
        let j = to_json(
            &[info(b"k\"1", b"svc", 90), info(b"\xff\x1b", b"", 100)],
            now,
            false,
        );
        assert_eq!(
            j,
            "[\n{\"key\":\"k\\\"1\",\"key_hex\":\"6b2231\",\"source\":\"svc\",\"source_hex\":\"737663\",\"endpoint\":\"127.0.0.1:5\",\"acquired_unix_s\":90,\"held_s\":10,\"mode\":null,\"token\":null,\"lease_ms_left\":null},\n\
             {\"key\":null,\"key_hex\":\"ff1b\",\"source\":\"\",\"source_hex\":\"\",\"endpoint\":\"127.0.0.1:5\",\"acquired_unix_s\":100,\"held_s\":0,\"mode\":null,\"token\":null,\"lease_ms_left\":null}\n]\n"
        );
        assert_eq!(to_json(&[], now, true), "[]\n");
    }
}
