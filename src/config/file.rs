//! `ringlockd --config FILE`: a TOML file of top-level `key = value`
//! lines, one key per flag, spelled as the flag without its dashes
//! (`keepalive = "10s"`, `max-keys = 100000`, `join = true`).
//!
//! This module reads the file into entries that keep their line numbers;
//! which keys exist and what type each takes is `ringlockd`'s (its flags),
//! and every value is then checked by the same code as the flag's. Values
//! are strings, integers or booleans; anything else (a float, a date, an
//! array, a table or a `[section]`) is kept as [`Value::Other`] for the
//! caller to refuse with its line.

use toml::de::{DeTable, DeValue};

/// One `key = value` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    /// 1-based line of the key.
    pub line: usize,
    pub value: Value,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Str(String),
    /// In decimal, whatever the file's radix (`0x10` is `16`).
    Int(String),
    Bool(bool),
    /// A TOML type no flag takes: `float`, `datetime`, `array` or `table`.
    Other(&'static str),
}

impl Value {
    /// The TOML type's name, for "expected a string, not an integer".
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Int(_) => "integer",
            Value::Bool(_) => "boolean",
            Value::Other(t) => t,
        }
    }
}

/// A file that is not valid TOML: the line and the parser's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    pub line: usize,
    pub message: String,
}

/// The file's top-level entries in the order of their lines. TOML itself
/// refuses a key given twice.
pub fn parse(text: &str) -> Result<Vec<Entry>, SyntaxError> {
    let table = DeTable::parse(text).map_err(|e| SyntaxError {
        line: e.span().map_or(1, |s| line_of(text, s.start)),
        // One line: the message without the snippet the error's Display adds.
        message: e.message().split_whitespace().collect::<Vec<_>>().join(" "),
    })?;
    let mut entries: Vec<Entry> = table
        .get_ref()
        .iter()
        .map(|(k, v)| Entry {
            key: k.get_ref().to_string(),
            line: line_of(text, k.span().start),
            value: match v.get_ref() {
                DeValue::String(s) => Value::Str(s.to_string()),
                DeValue::Integer(i) => match i128::from_str_radix(i.as_str(), i.radix()) {
                    Ok(n) => Value::Int(n.to_string()),
                    Err(_) => Value::Other("integer out of range"),
                },
                DeValue::Boolean(b) => Value::Bool(*b),
                other => Value::Other(other.type_str()),
            },
        })
        .collect();
    entries.sort_by_key(|e| e.line);
    Ok(entries)
}

/// The 1-based line of byte `offset` of `text`.
pub fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// A TOML basic string holding `s` (quotes, backslashes and control
/// characters escaped).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_keep_their_lines_and_types() {
        let text = "# a comment\n\nkeepalive = \"10s\"\nmax-keys = 1_000\njoin = true\n\
                    wal-truncate-at = 0x10\npeers = [\"1=a:1\"]\nratio = 1.5\n";
        let got = parse(text).unwrap();
        let want = [
            ("keepalive", 3, Value::Str("10s".into())),
            ("max-keys", 4, Value::Int("1000".into())),
            ("join", 5, Value::Bool(true)),
            ("wal-truncate-at", 6, Value::Int("16".into())),
            ("peers", 7, Value::Other("array")),
            ("ratio", 8, Value::Other("float")),
        ];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (e, (key, line, value)) in got.iter().zip(want) {
            assert_eq!((e.key.as_str(), e.line, &e.value), (key, line, &value));
        }
    }

    #[test]
    fn a_section_is_a_table_at_its_header_line() {
        let got = parse("bind = \":1\"\n\n[server]\nkeepalive = \"1s\"\n").unwrap();
        assert_eq!(got[1].key, "server");
        assert_eq!(got[1].line, 3);
        assert_eq!(got[1].value, Value::Other("table"));
    }

    #[test]
    fn syntax_errors_name_their_line() {
        let e = parse("bind = \":1\"\nkeepalive = 10s\n").unwrap_err();
        assert_eq!(e.line, 2, "{e:?}");
        assert!(!e.message.is_empty() && !e.message.contains('\n'), "{e:?}");
        let e = parse("a = 1\nb = 2\na = 3\n").unwrap_err();
        assert_eq!(e.line, 3, "a duplicate key: {e:?}");
    }

    #[test]
    fn quoted_strings_read_back() {
        for s in ["/etc/ringlock/token", "a \"b\" \\ c", "tab\there\u{1}"] {
            let text = format!("k = {}\n", quote(s));
            assert_eq!(
                parse(&text).unwrap()[0].value,
                Value::Str(s.into()),
                "{text}"
            );
        }
    }
}
