//! `ringlock keys`: the held-key table and its JSON form, written as the
//! keys arrive.
//!
//! Every cell that comes from the server (key, source, endpoint) goes
//! through [`bytes::escape`], so the table has exactly one line per key and
//! no control byte, whatever the keys contain. The JSON form carries the
//! exact bytes (see [`Printer::json`]). The listing's [`ListForm`] says
//! what the server sent: `KEYH` has a line per holder (each reader of a
//! shared key, each holder of a semaphore) with token, mode, lease time
//! left and access; `KEYX` (a server before lock modes) a line per key
//! without the access; `KEYS` (Locking-Center) neither. Cells a server
//! does not send are `-` (`null` in JSON).
//!
//! Memory does not grow with the number of keys: the listing is read as a
//! stream ([`ringlock::client::KeyStream`]) and each key is written once it
//! arrives, except that the table holds back its first [`WIDTH_ROWS`] rows
//! to choose its column widths.

use std::io::{self, Write};
use std::time::{Duration, SystemTime};

use ringlock::client::{Error, KeyInfo};
use ringlock::core::{Access, ListForm};

use crate::bytes;

/// How many rows the table holds back to choose its column widths: a
/// listing of at most this many keys is aligned exactly (as wide as its
/// widest cell per column); in a longer one a later cell wider than its
/// column pushes the rest of its own row right, still two spaces apart.
pub const WIDTH_ROWS: usize = 1000;

/// How the keys are written.
pub enum Printer {
    Table(Table),
    Json(Json),
}

/// Why a listing stopped before its end.
#[derive(Debug)]
pub enum Stop {
    /// Reading the listing failed; `written` keys were already written
    /// (their output is incomplete: a table without its last rows, a JSON
    /// array left open).
    Listing { err: Error, written: u64 },
    /// Writing the output failed (a closed pipe, a full disk).
    Output(io::Error),
}

impl Printer {
    /// The table, header first, columns separated by two spaces.
    pub fn table(now: SystemTime, dates: bool, form: ListForm) -> Printer {
        Printer::Table(Table::new(now, dates, form))
    }

    /// A JSON array, one object per line:
    ///
    /// ```text
    /// {"key":"deploy/prod","key_hex":"6465706c6f792f70726f64","source":"svc-a","source_hex":"7376632d61","endpoint":"10.0.0.7:50912","acquired_unix_s":1764449301,"held_s":42,"mode":"lease","token":1764449301000123,"lease_ms_left":2500,"access":"semaphore","slots":3}
    /// ```
    ///
    /// `key_hex` and `source_hex` always carry the exact bytes. `key` and
    /// `source` are the same bytes as a string when they are valid UTF-8
    /// without control characters, and `null` otherwise. `mode` and `token`
    /// are `null` when the server has no `KEYX`; `lease_ms_left` is `null`
    /// unless the key is held as a lease; `access` (`exclusive`, `shared`,
    /// `semaphore`) is `null` when the server has no `KEYH`, and `slots` is
    /// a semaphore's N, `null` otherwise.
    pub fn json(now: SystemTime, form: ListForm) -> Printer {
        Printer::Json(Json {
            now,
            form,
            written: 0,
        })
    }

    /// Writes every key of `keys` to `out` as it comes, then the end of
    /// the output. Does not flush `out`.
    pub fn print(
        mut self,
        keys: impl Iterator<Item = Result<KeyInfo, Error>>,
        out: &mut impl Write,
    ) -> Result<(), Stop> {
        for k in keys {
            match k {
                Ok(k) => self.key(&k, out).map_err(Stop::Output)?,
                Err(err) => {
                    return Err(Stop::Listing {
                        err,
                        written: self.written(),
                    })
                }
            }
        }
        self.finish(out).map_err(Stop::Output)
    }

    fn key(&mut self, k: &KeyInfo, out: &mut impl Write) -> io::Result<()> {
        match self {
            Printer::Table(t) => t.key(k, out),
            Printer::Json(j) => j.key(k, out),
        }
    }

    fn finish(&mut self, out: &mut impl Write) -> io::Result<()> {
        match self {
            Printer::Table(t) => t.finish(out),
            Printer::Json(j) => j.finish(out),
        }
    }

    /// Keys written to the output so far (held-back rows are not).
    fn written(&self) -> u64 {
        match self {
            Printer::Table(t) => t.written,
            Printer::Json(j) => j.written,
        }
    }
}

/// The table: the header and the first [`WIDTH_ROWS`] rows are held back
/// until the widths are known, later rows are written at once.
pub struct Table {
    now: SystemTime,
    dates: bool,
    form: ListForm,
    /// The header and the rows not written yet (until `widths` is known).
    held: Vec<Vec<String>>,
    widths: Option<Vec<usize>>,
    written: u64,
}

impl Table {
    fn new(now: SystemTime, dates: bool, form: ListForm) -> Table {
        let mut head: Vec<String> = [
            "KEY", "SOURCE", "ENDPOINT", "HELD", "MODE", "TOKEN", "LEASE", "ACCESS",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if dates {
            head.push("ACQUIRED (UTC)".into());
        }
        Table {
            now,
            dates,
            form,
            held: vec![head],
            widths: None,
            written: 0,
        }
    }

    fn row(&self, k: &KeyInfo) -> Vec<String> {
        let mut row = vec![
            bytes::escape(&k.key),
            // An empty source is shown as "-" so the columns stay aligned.
            if k.source.is_empty() {
                "-".into()
            } else {
                bytes::escape(&k.source)
            },
            bytes::escape(k.endpoint.as_bytes()),
            format_held(k.held_for(self.now)),
        ];
        if self.form != ListForm::Keys {
            row.push(k.mode.name().into());
            row.push(k.token.to_string());
            row.push(k.lease_left_ms.map_or("-".into(), format_left));
        } else {
            row.extend(["-".into(), "-".into(), "-".into()]);
        }
        row.push(k.access.map_or("-".into(), format_access));
        if self.dates {
            row.push(format_utc(k.acquired_unix_s));
        }
        row
    }

    fn key(&mut self, k: &KeyInfo, out: &mut impl Write) -> io::Result<()> {
        let row = self.row(k);
        match &self.widths {
            Some(widths) => {
                write_row(&row, widths, out)?;
                self.written += 1;
            }
            None => {
                self.held.push(row);
                // The header is held too.
                if self.held.len() > WIDTH_ROWS {
                    self.write_held(out)?;
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut impl Write) -> io::Result<()> {
        if self.widths.is_none() {
            self.write_held(out)?;
        }
        Ok(())
    }

    /// Chooses the widths from the rows held back and writes them.
    fn write_held(&mut self, out: &mut impl Write) -> io::Result<()> {
        let cols = self.held[0].len();
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                self.held
                    .iter()
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for (i, row) in std::mem::take(&mut self.held).iter().enumerate() {
            write_row(row, &widths, out)?;
            self.written += u64::from(i > 0);
        }
        self.widths = Some(widths);
        Ok(())
    }
}

/// One line: every cell but the last padded to its column's width and
/// followed by two spaces, no trailing whitespace.
fn write_row(row: &[String], widths: &[usize], out: &mut impl Write) -> io::Result<()> {
    let mut line = String::new();
    for (c, cell) in row.iter().enumerate() {
        if c + 1 == row.len() {
            line.push_str(cell);
        } else {
            line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
        }
    }
    let mut line = line.trim_end().to_string();
    line.push('\n');
    out.write_all(line.as_bytes())
}

/// The JSON array, opened by its first key (or written `[]` when there is
/// none).
pub struct Json {
    now: SystemTime,
    form: ListForm,
    written: u64,
}

impl Json {
    fn key(&mut self, k: &KeyInfo, out: &mut impl Write) -> io::Result<()> {
        let text = |b: &[u8]| bytes::printable_utf8(b).map_or("null".into(), bytes::json_str);
        let extended = self.form != ListForm::Keys;
        write!(
            out,
            "{}{{\"key\":{},\"key_hex\":\"{}\",\"source\":{},\"source_hex\":\"{}\",\"endpoint\":{},\"acquired_unix_s\":{},\"held_s\":{},\"mode\":{},\"token\":{},\"lease_ms_left\":{},\"access\":{},\"slots\":{}}}",
            if self.written == 0 { "[\n" } else { ",\n" },
            text(&k.key),
            bytes::hex(&k.key),
            text(&k.source),
            bytes::hex(&k.source),
            bytes::json_str(&k.endpoint),
            k.acquired_unix_s,
            k.held_for(self.now).as_secs(),
            if extended { format!("\"{}\"", k.mode.name()) } else { "null".into() },
            if extended { k.token.to_string() } else { "null".into() },
            match (extended, k.lease_left_ms) {
                (true, Some(ms)) => ms.to_string(),
                _ => "null".into(),
            },
            k.access.map_or("null".into(), |a| format!("\"{}\"", a.name())),
            match k.access {
                Some(Access::Semaphore(n)) => n.to_string(),
                _ => "null".into(),
            },
        )?;
        self.written += 1;
        Ok(())
    }

    fn finish(&mut self, out: &mut impl Write) -> io::Result<()> {
        out.write_all(if self.written == 0 { b"[]\n" } else { b"\n]\n" })
    }
}

/// How a holder holds its key: `exclusive`, `shared`, `semaphore:N`.
pub fn format_access(a: Access) -> String {
    match a {
        Access::Semaphore(n) => format!("semaphore:{n}"),
        a => a.name().into(),
    }
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

pub use ringlock::log::format_utc;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn print(p: Printer, keys: &[KeyInfo]) -> String {
        let mut out = Vec::new();
        p.print(keys.iter().cloned().map(Ok), &mut out)
            .expect("printed");
        String::from_utf8(out).expect("UTF-8 output")
    }

    fn form(extended: bool) -> ListForm {
        if extended {
            ListForm::Keyx
        } else {
            ListForm::Keys
        }
    }

    fn table(keys: &[KeyInfo], now: SystemTime, dates: bool, extended: bool) -> String {
        print(Printer::table(now, dates, form(extended)), keys)
    }

    fn to_json(keys: &[KeyInfo], now: SystemTime, extended: bool) -> String {
        print(Printer::json(now, form(extended)), keys)
    }

    fn info(key: &[u8], source: &[u8], at: i64) -> KeyInfo {
        KeyInfo {
            key: key.to_vec(),
            source: source.to_vec(),
            endpoint: "127.0.0.1:5".into(),
            acquired_unix_s: at,
            token: 0,
            mode: ringlock::core::HoldMode::Persistent,
            lease_left_ms: None,
            access: None,
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
                "-",
                "-"
            ]
        );
        let row: Vec<&str> = t.lines().nth(2).expect("row").split_whitespace().collect();
        assert_eq!(row, ["\\xff", "-", "127.0.0.1:5", "1s", "-", "-", "-", "-"]);
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
            [
                "KEY", "SOURCE", "ENDPOINT", "HELD", "MODE", "TOKEN", "LEASE", "ACCESS",
                "ACQUIRED", "(UTC)"
            ]
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
                "-",
                "1970-01-01T00:01:39Z"
            ]
        );
        let row: Vec<&str> = t.lines().nth(2).expect("row").split_whitespace().collect();
        assert_eq!(&row[4..7], ["session", "9", "-"]);
        let j = to_json(&[lease, sess], now, true);
        assert!(
            j.contains("\"mode\":\"lease\",\"token\":1700000000000123,\"lease_ms_left\":2500,\"access\":null,\"slots\":null}"),
            "{j}"
        );
        assert!(
            j.contains("\"mode\":\"session\",\"token\":9,\"lease_ms_left\":null,\"access\":null,\"slots\":null}"),
            "{j}"
        );
        assert_eq!(format_left(850), "850ms");
        assert_eq!(format_left(61_000), "1m01s");
    }

    /// A writer that counts the lines written so far, shared with the
    /// key source, which checks what was printed before it gave a key.
    struct Lines(std::rc::Rc<std::cell::Cell<usize>>);

    impl Write for Lines {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let n = b.iter().filter(|&&c| c == b'\n').count();
            self.0.set(self.0.get() + n);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Keys are written as they come: the JSON array has each key before
    /// the next one is read, the table each row after the first
    /// WIDTH_ROWS (which choose the widths) before the next is read.
    #[test]
    fn keys_are_written_before_the_next_is_read() {
        let now = UNIX_EPOCH + Duration::from_secs(100);
        let n = WIDTH_ROWS + 50;
        for json in [false, true] {
            let lines = std::rc::Rc::new(std::cell::Cell::new(0));
            let seen = lines.clone();
            let keys = (0..n).map(|i| {
                // Lines out before key i is handed over.
                let want = match (json, i) {
                    (true, 0) => 0,
                    (true, i) => i, // "[" + (i - 1) objects
                    (false, i) if i < WIDTH_ROWS => 0,
                    (false, i) => i + 1, // header + i rows
                };
                assert_eq!(seen.get(), want, "json {json}, before key {i}");
                Ok(info(format!("key-{i:05}").as_bytes(), b"s", 99))
            });
            let p = if json {
                Printer::json(now, ListForm::Keys)
            } else {
                Printer::table(now, false, ListForm::Keys)
            };
            p.print(keys, &mut Lines(lines.clone())).expect("printed");
            assert_eq!(lines.get(), n + if json { 2 } else { 1 });
        }
    }

    /// The first WIDTH_ROWS rows choose the widths; a wider cell later
    /// pushes its own row's next cells right, still two spaces apart.
    #[test]
    fn long_tables_keep_the_first_rows_widths() {
        let now = UNIX_EPOCH + Duration::from_secs(100);
        let mut keys: Vec<KeyInfo> = (0..WIDTH_ROWS)
            .map(|i| info(format!("k{i}").as_bytes(), b"s", 99))
            .collect();
        keys.push(info(b"a-much-longer-key", b"s", 99));
        keys.push(info(b"k", b"s", 99));
        let t = table(&keys, now, false, false);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), WIDTH_ROWS + 3);
        // KEY is as wide as "k999": 4 columns, then two spaces.
        assert!(lines[0].starts_with("KEY   SOURCE  "), "{:?}", lines[0]);
        assert!(lines[1].starts_with("k0    s       "), "{:?}", lines[1]);
        assert_eq!(
            lines[WIDTH_ROWS + 1],
            "a-much-longer-key  s       127.0.0.1:5  1s    -     -      -      -"
        );
        assert!(lines[WIDTH_ROWS + 2].starts_with("k     s       127.0.0.1:5  1s"));
        for l in &lines[1..] {
            assert_eq!(l.split_whitespace().count(), 8, "{l:?}");
        }
        // Up to WIDTH_ROWS keys: aligned by the widest, as a whole table.
        let t = table(&keys[WIDTH_ROWS - 1..WIDTH_ROWS + 1], now, false, false);
        assert!(
            t.lines()
                .nth(1)
                .unwrap()
                .starts_with("k999               s  "),
            "{t}"
        );
    }

    /// A listing that fails stops the output where it is: a short table
    /// writes nothing (its rows were held back), a JSON array is left
    /// open, and the caller learns how many keys were written.
    #[test]
    fn a_failed_listing_is_not_completed() {
        let now = UNIX_EPOCH + Duration::from_secs(100);
        let keys = || {
            [
                Ok(info(b"a", b"s", 99)),
                Ok(info(b"b", b"s", 99)),
                Err(Error::Protocol("cut".into())),
                Ok(info(b"c", b"s", 99)),
            ]
            .into_iter()
        };
        let mut out = Vec::new();
        match Printer::table(now, false, ListForm::Keys).print(keys(), &mut out) {
            Err(Stop::Listing { written: 0, .. }) => assert!(out.is_empty()),
            other => panic!("{other:?}"),
        }
        let mut out = Vec::new();
        match Printer::json(now, ListForm::Keys).print(keys(), &mut out) {
            Err(Stop::Listing { written: 2, .. }) => {
                let text = String::from_utf8(out).unwrap();
                assert!(text.starts_with("[\n{\"key\":\"a\""), "{text}");
                assert!(!text.contains(']'), "left open: {text}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// From `KEYH`: the ACCESS column and JSON's `access`/`slots`.
    #[test]
    fn keyh_rows_show_the_access() {
        let now = UNIX_EPOCH + Duration::from_secs(100);
        let mut rows = Vec::new();
        for (key, access) in [
            (b"r", Access::Shared),
            (b"s", Access::Semaphore(3)),
            (b"x", Access::Exclusive),
        ] {
            let mut k = info(key, b"svc", 99);
            k.access = Some(access);
            rows.push(k);
        }
        let t = print(Printer::table(now, false, ListForm::Keyh), &rows);
        let last: Vec<&str> = t
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().last().unwrap())
            .collect();
        assert_eq!(last, ["shared", "semaphore:3", "exclusive"], "{t}");
        let j = print(Printer::json(now, ListForm::Keyh), &rows);
        assert!(j.contains("\"access\":\"shared\",\"slots\":null}"), "{j}");
        assert!(j.contains("\"access\":\"semaphore\",\"slots\":3}"), "{j}");
        assert!(
            j.contains("\"access\":\"exclusive\",\"slots\":null}"),
            "{j}"
        );
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
            "[\n{\"key\":\"k\\\"1\",\"key_hex\":\"6b2231\",\"source\":\"svc\",\"source_hex\":\"737663\",\"endpoint\":\"127.0.0.1:5\",\"acquired_unix_s\":90,\"held_s\":10,\"mode\":null,\"token\":null,\"lease_ms_left\":null,\"access\":null,\"slots\":null},\n\
             {\"key\":null,\"key_hex\":\"ff1b\",\"source\":\"\",\"source_hex\":\"\",\"endpoint\":\"127.0.0.1:5\",\"acquired_unix_s\":100,\"held_s\":0,\"mode\":null,\"token\":null,\"lease_ms_left\":null,\"access\":null,\"slots\":null}\n]\n"
        );
        assert_eq!(to_json(&[], now, true), "[]\n");
    }
}
