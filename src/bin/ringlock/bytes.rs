//! Keys (1..=127 bytes) and sources (0..=255) are arbitrary bytes. This module
//! turns them into text that is safe on a terminal and back.
//!
//! The escaped form (what `ringlock keys` prints, and what
//! `--key-format escaped` reads):
//! - printable ASCII other than space and `\` stands for itself;
//! - `\\` is a backslash, `\n` `\r` `\t` the usual controls;
//! - `\xNN` (two hex digits) is one byte: every other control byte, space,
//!   DEL, and each byte of a sequence that is not valid UTF-8;
//! - valid UTF-8 beyond ASCII stands for itself, except characters that can
//!   move the cursor or hide text (C1 controls, bidirectional overrides,
//!   zero-width and other invisible format characters, non-ASCII
//!   whitespace), which are `\u{HHHH}`.
//!
//! So an escaped cell never contains a control byte, a space or a line
//! break: a hostile key can neither drive the terminal nor forge a row or a
//! column, and the same text given back with `--key-format escaped` names
//! exactly the same bytes.

/// Characters that are valid UTF-8 but unsafe or invisible on a terminal.
fn needs_unicode_escape(c: char) -> bool {
    c.is_control()
        || c.is_whitespace()
        || matches!(c,
            '\u{00AD}'                  // soft hyphen
            | '\u{034F}'                // combining grapheme joiner
            | '\u{061C}'                // Arabic letter mark
            | '\u{115F}' | '\u{1160}'   // Hangul fillers
            | '\u{17B4}' | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'   // Mongolian variation selectors, vowel separator
            | '\u{200B}'..='\u{200F}'   // zero-width space/joiners, LRM, RLM
            | '\u{202A}'..='\u{202E}'   // bidirectional embeddings and overrides
            | '\u{2060}'..='\u{206F}'   // word joiner, invisible operators, isolates
            | '\u{3164}'                // Hangul filler
            | '\u{FE00}'..='\u{FE0F}'   // variation selectors
            | '\u{FEFF}'                // byte order mark
            | '\u{FFA0}'
            | '\u{FFF9}'..='\u{FFFB}'   // interlinear annotation
            | '\u{E0000}'..='\u{E007F}' // tags
        )
}

/// The escaped form of `bytes` (see the module docs).
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if c.is_ascii() && (c.is_ascii_control() || c == ' ') => {
                    out.push_str(&format!("\\x{:02x}", c as u8))
                }
                c if needs_unicode_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Reads the escaped form back into bytes. Any backslash sequence other
/// than the ones [`escape`] writes is an error, so a typo is never taken
/// literally.
pub fn unescape(text: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let b = text[i];
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        let Some(&kind) = text.get(i + 1) else {
            return Err("a trailing '\\' escapes nothing (write \\\\ for a backslash)".into());
        };
        i += 2;
        match kind {
            b'\\' => out.push(b'\\'),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'x' => {
                let hex = text.get(i..i + 2).ok_or("\\x needs two hex digits")?;
                out.push(hex_byte(hex).ok_or("\\x needs two hex digits")?);
                i += 2;
            }
            b'u' => {
                let rest = &text[i..];
                let close = rest
                    .iter()
                    .position(|&b| b == b'}')
                    .filter(|_| rest.first() == Some(&b'{'))
                    .ok_or("\\u needs the form \\u{HEX}")?;
                let digits = std::str::from_utf8(&rest[1..close]).map_err(|_| "bad \\u{...}")?;
                let c = u32::from_str_radix(digits, 16)
                    .ok()
                    .filter(|_| (1..=6).contains(&digits.len()))
                    .and_then(char::from_u32)
                    .ok_or_else(|| format!("\\u{{{digits}}} is not a Unicode scalar value"))?;
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                i += close + 1;
            }
            other => {
                return Err(format!(
                    "unknown escape \\{} (known: \\\\ \\n \\r \\t \\xNN \\u{{HEX}})",
                    escape(&[other])
                ))
            }
        }
    }
    Ok(out)
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    Some(hex_digit(two[0])? << 4 | hex_digit(two[1])?)
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads hex (either case, an even number of digits) into bytes.
pub fn unhex(text: &[u8]) -> Result<Vec<u8>, String> {
    if !text.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits ({})", text.len()));
    }
    text.chunks(2)
        .map(|two| hex_byte(two).ok_or_else(|| format!("not hex: {:?}", escape(two))))
        .collect()
}

/// A JSON string literal for `text` (RFC 8259: quote, backslash and every
/// control character escaped).
pub fn json_str(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c.is_control() => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The bytes as text for JSON when they are valid UTF-8 without control
/// characters; `None` otherwise (the caller then relies on the hex field).
pub fn printable_utf8(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes)
        .ok()
        .filter(|s| !s.chars().any(char::is_control))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_leaves_no_control_byte_space_or_newline() {
        let hostile = b"ok/\x1b[31mRED\x1b[0m\nFAKE-KEY  fake-src  10.9.9.9:1  0s";
        let e = escape(hostile);
        assert_eq!(
            e,
            "ok/\\x1b[31mRED\\x1b[0m\\nFAKE-KEY\\x20\\x20fake-src\\x20\\x2010.9.9.9:1\\x20\\x200s"
        );
        assert!(!e.bytes().any(|b| b.is_ascii_control() || b == b' '));
        assert_eq!(
            escape(b"a\\b\t\r\x7f\xff\xc3"),
            "a\\\\b\\t\\r\\x7f\\xff\\xc3"
        );
        assert_eq!(
            escape("é→\u{202e}\u{85}\u{a0}".as_bytes()),
            "é→\\u{202e}\\u{85}\\u{a0}"
        );
    }

    #[test]
    fn unescape_inverts_escape() {
        for bytes in [
            &b"plain/key"[..],
            b"ok/\x1b[31mRED\x1b[0m\nFAKE  x",
            b"\\x41 is not A",
            b"\xff\xfe\x00\x01",
            "é\u{202e}ü\u{200b}".as_bytes(),
        ] {
            let e = escape(bytes);
            assert_eq!(unescape(e.as_bytes()).as_deref(), Ok(bytes), "{e}");
        }
        // Every byte on its own, and every pair (covers partial UTF-8).
        for a in 0..=255u8 {
            assert_eq!(unescape(escape(&[a]).as_bytes()), Ok(vec![a]));
            for b in [0u8, b'\\', b'x', 0x80, 0xbf, 0xc3, 0xff] {
                let v = vec![a, b];
                assert_eq!(unescape(escape(&v).as_bytes()), Ok(v));
            }
        }
        assert_eq!(unescape(br"\x4A\x4a"), Ok(b"JJ".to_vec()));
        for bad in [
            &br"\"[..],
            br"\q",
            br"\x4",
            br"\xZZ",
            br"\u{}",
            br"\u{110000}",
            br"\u{d800}",
            br"\u41",
        ] {
            assert!(unescape(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn hex_round_trips_and_rejects_junk() {
        assert_eq!(hex(b"\x00\xffA"), "00ff41");
        assert_eq!(unhex(b"00FFa1"), Ok(vec![0, 0xff, 0xa1]));
        assert!(unhex(b"abc").is_err());
        assert!(unhex(b"zz").is_err());
    }

    #[test]
    fn json_strings_escape_controls() {
        assert_eq!(
            json_str("a\"b\\c\n\u{1b}\u{85}é"),
            "\"a\\\"b\\\\c\\n\\u001b\\u0085é\""
        );
        assert_eq!(printable_utf8(b"deploy/prod"), Some("deploy/prod"));
        assert_eq!(printable_utf8(b"a\x1bb"), None);
        assert_eq!(printable_utf8(b"\xff"), None);
    }
}
