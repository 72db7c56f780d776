//! One-line, key=value event logs on stderr, filtered by level.
//!
//! Only notable events are logged (start, recovery, compaction, I/O errors,
//! limits, operator resets); nothing is logged per request on the hot path.
//!
//! # Logs are data
//! A line is `ts=… level=… event=… key=value …` in logfmt (`ts` in UTC,
//! RFC 3339 with milliseconds: `ts=2026-12-06T11:39:15.205Z`), and nothing a
//! client sends can add a field, end a line or make two different values look
//! alike. Every value that is not a fixed token of ours goes through one of
//! the wrappers below:
//! - [`Quoted`]: bytes a client chose (keys, sources, admin commands), always
//!   in double quotes;
//! - [`Bytes`] and [`Value`]: bytes or a `Display` value (paths, errors,
//!   debug dumps), bare when they are one safe token, otherwise quoted;
//! - [`Escaped`]: a `Display` value inside a quoted value the format string
//!   already spells out (`reason=\"{}\"`).
//!
//! Inside quotes `"` is `\"`, `\` is `\\`, newline, carriage return and tab
//! are `\n`, `\r`, `\t`, and every other byte that is not printable UTF-8 is
//! `\xNN` (two lowercase hex digits): C0/C1 control characters, DEL, bytes of
//! invalid UTF-8, and the characters Unicode does not print (format and
//! separator characters such as bidi overrides, zero-width spaces, U+2028;
//! unassigned and private-use code points; combining marks, even after a
//! base letter). The escaping is injective: unescaping gives back the exact
//! original bytes.
//! A bare value is non-empty printable ASCII without space, `"`, `=` or `\`.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU8, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "error" => Level::Error,
            "warn" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);

pub fn set_level(l: Level) {
    LEVEL.store(l as u8, Ordering::Relaxed);
}

pub fn enabled(l: Level) -> bool {
    l as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one log line: `ts=… level=… event=… <fields>`, where `ts` is
/// the time in UTC, RFC 3339 with milliseconds: `ts=2026-12-06T11:39:15.205Z`
/// (fixed width, one bare token, sorts as text in time order).
pub fn write(l: Level, event: &str, fields: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let ts = Timestamp(std::time::SystemTime::now());
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "ts={} level={} event={} {}",
        ts,
        l.name(),
        event,
        fields
    );
}

/// A log line's time: `2026-12-06T11:39:15.205Z` (UTC, RFC 3339, milliseconds;
/// a time before 1970 as 1970-01-01T00:00:00.000Z: a clock set that far
/// back is wrong anyway).
#[derive(Clone, Copy)]
pub struct Timestamp(pub std::time::SystemTime);

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self
            .0
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let (year, month, day) = civil_from_days((d.as_secs() / 86_400) as i64);
        let secs = d.as_secs() % 86_400;
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            d.subsec_millis()
        )
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's civil_from_days).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `log!(Level::Info, "listening", "lock={} admin={}", a, b)`
#[macro_export]
macro_rules! log {
    ($lvl:expr, $event:expr) => {
        if $crate::log::enabled($lvl) {
            $crate::log::write($lvl, $event, format_args!(""));
        }
    };
    ($lvl:expr, $event:expr, $($arg:tt)+) => {
        if $crate::log::enabled($lvl) {
            $crate::log::write($lvl, $event, format_args!($($arg)+));
        }
    };
}

/// Client-chosen bytes as a logfmt value, always in double quotes:
/// `key={}` with `Quoted(b"jobs/a b")` writes `key="jobs/a b"`.
#[derive(Clone, Copy)]
pub struct Quoted<'a>(pub &'a [u8]);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        escape(f, self.0)?;
        f.write_char('"')
    }
}

/// Bytes as a logfmt value: bare when they are one safe token (`/data/x.wal`),
/// quoted and escaped otherwise (`"/my data/x.wal"`). For paths.
#[derive(Clone, Copy)]
pub struct Bytes<'a>(pub &'a [u8]);

impl fmt::Display for Bytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if is_bare(self.0) {
            // Bare means printable ASCII: valid UTF-8 by construction.
            f.write_str(std::str::from_utf8(self.0).map_err(|_| fmt::Error)?)
        } else {
            Quoted(self.0).fmt(f)
        }
    }
}

/// A path as a logfmt value, with its exact bytes (`Path::display` would
/// replace bytes that are not UTF-8).
pub fn path(p: &std::path::Path) -> Bytes<'_> {
    use std::os::unix::ffi::OsStrExt;
    Bytes(p.as_os_str().as_bytes())
}

/// Any value as a logfmt value: bare when its text is one safe token, quoted
/// and escaped otherwise. `{}` formats its `Display` text, `{:?}` its `Debug`
/// text, so `grant={:?}` with `Value(&grant)` writes `grant="Some((3, 7))"`.
#[derive(Clone, Copy)]
pub struct Value<T>(pub T);

impl<T: fmt::Display> fmt::Display for Value<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        value(f, |w| write!(w, "{}", self.0))
    }
}

impl<T: fmt::Debug> fmt::Debug for Value<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        value(f, |w| write!(w, "{:?}", self.0))
    }
}

/// Writes what `text` produces as a bare or quoted value. Two passes over the
/// text instead of a buffer: no allocation, and the values logged here format
/// cheaply and deterministically.
fn value(
    f: &mut fmt::Formatter<'_>,
    text: impl Fn(&mut dyn fmt::Write) -> fmt::Result,
) -> fmt::Result {
    let mut check = BareCheck {
        empty: true,
        bare: true,
    };
    // BareCheck never fails; an error could only come from the value.
    text(&mut check)?;
    if check.bare && !check.empty {
        text(&mut Passthrough(f))
    } else {
        f.write_char('"')?;
        text(&mut Escaper(f))?;
        f.write_char('"')
    }
}

/// A formatter as a `dyn fmt::Write` (plain text, no escaping).
struct Passthrough<'a, 'b>(&'a mut fmt::Formatter<'b>);

impl fmt::Write for Passthrough<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write_str(s)
    }
}

/// A `Display` value escaped for the inside of a quoted value, without the
/// quotes: for format strings that spell them out, `reason=\"{}\"`.
#[derive(Clone, Copy)]
pub struct Escaped<T>(pub T);

impl<T: fmt::Display> fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(Escaper(f), "{}", self.0)
    }
}

/// Escapes everything written through it into the wrapped formatter. Each
/// `write_str` is a whole `&str`, so characters are never split.
struct Escaper<'a, 'b>(&'a mut fmt::Formatter<'b>);

impl fmt::Write for Escaper<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        escape(self.0, s.as_bytes())
    }
}

struct BareCheck {
    empty: bool,
    bare: bool,
}

impl fmt::Write for BareCheck {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.empty &= s.is_empty();
        self.bare &= s.bytes().all(is_bare_byte);
        Ok(())
    }
}

fn is_bare_byte(b: u8) -> bool {
    matches!(b, 0x21..=0x7e) && !matches!(b, b'"' | b'=' | b'\\')
}

fn is_bare(bytes: &[u8]) -> bool {
    !bytes.is_empty() && bytes.iter().copied().all(is_bare_byte)
}

/// Writes `bytes` escaped for the inside of a quoted logfmt value (the rules
/// are in the module documentation).
fn escape(out: &mut impl fmt::Write, bytes: &[u8]) -> fmt::Result {
    for chunk in bytes.utf8_chunks() {
        let valid = chunk.valid();
        // Fast path: most values are plain printable ASCII.
        let plain = valid
            .bytes()
            .take_while(|&b| matches!(b, 0x20..=0x7e) && b != b'"' && b != b'\\')
            .count();
        out.write_str(&valid[..plain])?;
        for c in valid[plain..].chars() {
            match c {
                '"' => out.write_str("\\\"")?,
                '\\' => out.write_str("\\\\")?,
                '\n' => out.write_str("\\n")?,
                '\r' => out.write_str("\\r")?,
                '\t' => out.write_str("\\t")?,
                // escape_debug quotes these two although they print.
                '\'' | ' ' => out.write_char(c)?,
                // escape_debug leaves exactly the printable characters alone
                // (Unicode's Zs other than space, Zl, Zp, Cc, Cf, Cs, Co, Cn
                // and grapheme extenders are escaped).
                c if c.escape_debug().len() == 1 => out.write_char(c)?,
                c => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        write!(out, "\\x{b:02x}")?;
                    }
                }
            }
        }
        for b in chunk.invalid() {
            write!(out, "\\x{b:02x}")?;
        }
    }
    Ok(())
}

/// Unix seconds to `YYYY-MM-DDTHH:MM:SSZ` (Howard Hinnant's civil_from_days).
pub fn format_utc(unix_s: i64) -> String {
    let (year, month, day) = civil_from_days(unix_s.div_euclid(86_400));
    let secs = unix_s.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// A time as [`format_utc`] writes it (before 1970 too).
pub fn format_utc_time(t: std::time::SystemTime) -> String {
    format_utc(match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(b: &[u8]) -> String {
        Quoted(b).to_string()
    }

    /// The inverse of `escape`, strict: any other escape is an error.
    fn unescape(s: &str) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] != b'\\' {
                out.push(b[i]);
                i += 1;
                continue;
            }
            match b.get(i + 1) {
                Some(b'"') => out.push(b'"'),
                Some(b'\\') => out.push(b'\\'),
                Some(b'n') => out.push(b'\n'),
                Some(b'r') => out.push(b'\r'),
                Some(b't') => out.push(b'\t'),
                Some(b'x') => {
                    let hex = s.get(i + 2..i + 4).ok_or("short \\x")?;
                    out.push(u8::from_str_radix(hex, 16).map_err(|e| e.to_string())?);
                    i += 2;
                }
                other => return Err(format!("bad escape {other:?}")),
            }
            i += 2;
        }
        Ok(out)
    }

    #[test]
    fn quoted_escapes_what_could_forge_a_field_or_a_line() {
        assert_eq!(q(b"jobs/nightly"), r#""jobs/nightly""#);
        assert_eq!(q(b""), r#""""#);
        assert_eq!(q(b"x=1 \""), r#""x=1 \"""#);
        assert_eq!(q(b"a\\b"), r#""a\\b""#);
        assert_eq!(q(b"l1\nl2\r\t"), r#""l1\nl2\r\t""#);
        assert_eq!(q(b"\x00\x1b[31m\x7f"), r#""\x00\x1b[31m\x7f""#);
        assert_eq!(q(b"\xff\xfe"), r#""\xff\xfe""#);
        // Printable non-ASCII stays readable; invisible or reordering
        // characters do not.
        assert_eq!(q("grüße/日本".as_bytes()), "\"grüße/日本\"");
        assert_eq!(q("a\u{202e}b".as_bytes()), r#""a\xe2\x80\xaeb""#);
        assert_eq!(q("a\u{200b}b".as_bytes()), r#""a\xe2\x80\x8bb""#);
        assert_eq!(q("a\u{85}b".as_bytes()), r#""a\xc2\x85b""#);
        assert_eq!(q("a\u{2028}b".as_bytes()), r#""a\xe2\x80\xa8b""#);
        assert_eq!(q("a\u{a0}b".as_bytes()), r#""a\xc2\xa0b""#);
        assert_eq!(q(b"it's ok"), r#""it's ok""#);
        // U+FFFD itself is printable; the byte that is not UTF-8 is not.
        assert_ne!(q("\u{fffd}".as_bytes()), q(b"\xff"));
    }

    #[test]
    fn every_byte_string_round_trips_and_stays_on_one_line() {
        let mut cases: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        cases.extend((0..=255u8).map(|b| vec![b'k', b, b'"', b, b'\\']));
        cases.push("é\u{301}\u{feff}\u{fffd}".as_bytes().to_vec());
        cases.push(b"\xe2\x80".to_vec()); // a truncated character
        for bytes in cases {
            let s = q(&bytes);
            let inner = &s[1..s.len() - 1];
            assert!(inner.chars().all(|c| c == ' ' || !c.is_control()), "{s}");
            assert!(!inner.replace("\\\\", "").replace("\\\"", "").contains('"'));
            assert_eq!(unescape(inner).as_deref(), Ok(&bytes[..]), "{s}");
        }
    }

    #[test]
    fn bare_only_when_safe() {
        assert_eq!(
            Bytes(b"/data/ringlock.wal").to_string(),
            "/data/ringlock.wal"
        );
        assert_eq!(Bytes(b"/my data/x").to_string(), r#""/my data/x""#);
        assert_eq!(Bytes(b"a=b").to_string(), r#""a=b""#);
        assert_eq!(Bytes(b"").to_string(), r#""""#);
        assert_eq!(Value(42).to_string(), "42");
        assert_eq!(Value("").to_string(), r#""""#);
        assert_eq!(format!("{:?}", Value(Some((3, 7)))), r#""Some((3, 7))""#);
        assert_eq!(format!("{:?}", Value(Some(3))), "Some(3)");
        assert_eq!(format!("{:?}", Value(None::<u32>)), "None");
        assert_eq!(Value("née").to_string(), "\"née\"");
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        use std::time::{Duration, UNIX_EPOCH};
        let at = |ms: u64| Timestamp(UNIX_EPOCH + Duration::from_millis(ms)).to_string();
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(1_796_557_155_205), "2026-12-06T11:39:15.205Z");
        assert_eq!(at(951_782_400_007), "2000-02-29T00:00:00.007Z");
        assert_eq!(at(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
        assert_eq!(
            Timestamp(UNIX_EPOCH - Duration::from_secs(1)).to_string(),
            "1970-01-01T00:00:00.000Z"
        );
        // The same calendar as format_utc.
        assert_eq!(
            &at(1_796_557_155_205)[..19],
            &format_utc(1_796_557_155)[..19]
        );
    }

    #[test]
    fn escaped_has_no_quotes_of_its_own() {
        let e = Escaped(format_args!("unknown admin command {}", Quoted(b"x=1 ")));
        assert_eq!(e.to_string(), r#"unknown admin command \"x=1 \""#);
        assert_eq!(Escaped("a\nb").to_string(), r"a\nb");
    }
}
