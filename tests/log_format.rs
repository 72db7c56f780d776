//! Logs are data: hostile keys, sources and admin commands go through a real
//! server at debug level, and every line it writes to stderr is parsed back
//! with a strict logfmt parser. Each value must decode to the exact bytes the
//! client sent, and no line may carry a field (or be a line) that the server
//! did not mean to write.

mod common;

use common::{admin_names, frame, once};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// One parsed line: `(key, decoded value bytes)` in order.
type Fields = Vec<(String, Vec<u8>)>;

/// Parses one log line with the grammar the server promises, and nothing
/// more lenient: `key=value` pairs separated by one space; a key is
/// `[a-z_][a-z0-9_]*`; a value is bare (printable ASCII without space, `"`,
/// `=`, `\`) or quoted, where the only escapes are `\"` `\\` `\n` `\r` `\t`
/// and `\xNN` (lowercase hex) and nothing unescaped is a control character.
/// A key may appear only once.
fn parse_logfmt(line: &[u8]) -> Result<Fields, String> {
    let text = std::str::from_utf8(line).map_err(|e| format!("not UTF-8: {e}"))?;
    let b = text.as_bytes();
    let mut fields: Fields = Vec::new();
    let mut i = 0;
    loop {
        let key_start = i;
        while i < b.len()
            && (b[i].is_ascii_lowercase()
                || b[i] == b'_'
                || (i > key_start && b[i].is_ascii_digit()))
        {
            i += 1;
        }
        if i == key_start {
            return Err(format!("no key at byte {i}"));
        }
        let key = &text[key_start..i];
        if b.get(i) != Some(&b'=') {
            return Err(format!("key {key:?} without '=' at byte {i}"));
        }
        i += 1;
        let mut value = Vec::new();
        if b.get(i) == Some(&b'"') {
            i += 1;
            loop {
                let Some(&c) = b.get(i) else {
                    return Err(format!("unterminated quoted value of {key:?}"));
                };
                match c {
                    b'"' => {
                        i += 1;
                        break;
                    }
                    b'\\' => {
                        let esc = *b.get(i + 1).ok_or("dangling backslash")?;
                        match esc {
                            b'"' => value.push(b'"'),
                            b'\\' => value.push(b'\\'),
                            b'n' => value.push(b'\n'),
                            b'r' => value.push(b'\r'),
                            b't' => value.push(b'\t'),
                            b'x' => {
                                let hex = text.get(i + 2..i + 4).ok_or("short \\x escape")?;
                                if !hex
                                    .bytes()
                                    .all(|h| h.is_ascii_digit() || (b'a'..=b'f').contains(&h))
                                {
                                    return Err(format!("bad \\x escape {hex:?}"));
                                }
                                value.push(u8::from_str_radix(hex, 16).map_err(|e| e.to_string())?);
                                i += 2;
                            }
                            other => return Err(format!("unknown escape \\{}", other as char)),
                        }
                        i += 2;
                    }
                    _ => {
                        // A whole character: it must print.
                        let ch = text[i..].chars().next().expect("inside the text");
                        if ch.is_control() {
                            return Err(format!("unescaped control character {ch:?} in {key:?}"));
                        }
                        value.extend_from_slice(ch.encode_utf8(&mut [0u8; 4]).as_bytes());
                        i += ch.len_utf8();
                    }
                }
            }
        } else {
            let start = i;
            while i < b.len() && matches!(b[i], 0x21..=0x7e) && !matches!(b[i], b'"' | b'=' | b'\\')
            {
                i += 1;
            }
            if i == start {
                return Err(format!("empty or unsafe bare value of {key:?} at byte {i}"));
            }
            value.extend_from_slice(&b[start..i]);
        }
        if fields.iter().any(|(k, _)| k == key) {
            return Err(format!("duplicate key {key:?}"));
        }
        fields.push((key.to_string(), value));
        match b.get(i) {
            None => return Ok(fields),
            Some(b' ') if i + 1 < b.len() => i += 1,
            Some(_) => return Err(format!("expected one space or the end at byte {i}")),
        }
    }
}

fn get<'a>(fields: &'a Fields, key: &str) -> &'a [u8] {
    &fields
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key:?} in {fields:?}"))
        .1
}

/// A log line's `ts` (`2026-12-06T11:39:15.205Z`: UTC, RFC 3339, exactly
/// three fraction digits) as Unix milliseconds; `None` for any other form.
fn ts_unix_ms(ts: &[u8]) -> Option<i64> {
    let t = std::str::from_utf8(ts).ok()?;
    let shape = "dddd-dd-ddTdd:dd:dd.dddZ";
    if t.len() != shape.len()
        || !t.bytes().zip(shape.bytes()).all(|(c, s)| {
            if s == b'd' {
                c.is_ascii_digit()
            } else {
                c == s
            }
        })
    {
        return None;
    }
    let n = |r: std::ops::Range<usize>| t[r].parse::<i64>().ok();
    let (y, mo, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (h, mi, s, ms) = (n(11..13)?, n(14..16)?, n(17..19)?, n(20..23)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 59 {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + h) * 60 + mi) * 60_000 + s * 1000 + ms)
}

fn unix_ms_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

#[test]
fn ts_is_read_as_rfc3339_utc_only() {
    assert_eq!(ts_unix_ms(b"1970-01-01T00:00:00.000Z"), Some(0));
    assert_eq!(
        ts_unix_ms(b"2026-12-06T11:39:15.205Z"),
        Some(1_796_557_155_205)
    );
    assert_eq!(
        ts_unix_ms(b"2000-02-29T23:59:59.999Z"),
        Some(951_868_799_999)
    );
    for bad in [
        &b"1796557155.205"[..],
        b"2026-12-06T11:39:15Z",
        b"2026-12-06T11:39:15.205",
        b"2026-12-06 11:39:15.205Z",
        b"2026-12-06T11:39:15.205+00:00",
        b"2026-13-06T11:39:15.205Z",
    ] {
        assert_eq!(ts_unix_ms(bad), None, "{}", String::from_utf8_lossy(bad));
    }
}

fn names(fields: &Fields) -> Vec<&str> {
    fields.iter().map(|(k, _)| k.as_str()).collect()
}

#[test]
fn the_parser_is_strict() {
    let ok = parse_logfmt(
        br#"ts=2026-12-06T11:39:15.205Z level=info event=x key="a\"b\\c\n\x00\xff" n=3"#,
    )
    .expect("valid");
    assert_eq!(get(&ok, "key"), b"a\"b\\c\n\x00\xff");
    for bad in [
        &br#"ts=1 key="a"b""#[..],
        br#"ts=1 key="a" key="b""#,
        br#"ts=1 key=a b"#,
        br#"ts=1  key=a"#,
        br#"ts=1 key=a "#,
        br#"ts=1 key="\q""#,
        br#"ts=1 key="\xFF""#,
        br#"ts=1 key=""#,
        b"ts=1 key=\"\x1b\"",
        b"ts=1 key=\"\xff\"",
        br#"ts=1 Key=a"#,
        br#"ts=1 key="#,
    ] {
        assert!(
            parse_logfmt(bad).is_err(),
            "accepted {:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

/// Keys and sources a client may send (1..=127 bytes each).
fn hostile() -> Vec<Vec<u8>> {
    let mut all_c0: Vec<u8> = (1..=0x1f).collect();
    all_c0.push(0);
    vec![
        b"x=1 \"".to_vec(),
        all_c0,
        b"\xff".to_vec(),
        // Would print as the same U+FFFD as the key above if logged lossily.
        b"\xfe".to_vec(),
        b"ok\nts=1 level=error event=forged key=\"x\"".to_vec(),
        b"\"\\\"\\\\\"".to_vec(),
        b"ok/\x1b[31mRED\x1b[0m\nFAKE-KEY  fake-src  10.9.9.9:1  0s".to_vec(),
        "\u{202e}txt.exe".as_bytes().to_vec(),
        b"\x7f\x80\xc3\x28 mixed".to_vec(),
        b"ends with a backslash\\".to_vec(),
        // A literal backslash-x sequence must not read back as the byte 'A'.
        b"\\x41".to_vec(),
        b"A".to_vec(),
        b"quote=\" \\\" \\\\\" end".repeat(9)[..127].to_vec(),
    ]
}

/// Bad 4-byte admin commands (each answered `-`, the connection closed).
fn hostile_commands() -> Vec<[u8; 4]> {
    vec![
        *b"x=1 ",
        *b"\n\x00\xff\"",
        *b"\\\"\r\t",
        *b"\x1b[2J",
        *b"\xff\xfe\xfd\xfc",
    ]
}

struct Daemon {
    child: std::process::Child,
    lines: mpsc::Receiver<Vec<u8>>,
    seen: Vec<Vec<u8>>,
}

impl Daemon {
    /// Starts ringlockd at debug level and reads its stderr as raw bytes (a
    /// line that is not UTF-8 must reach the parser, not stop the reader).
    fn start() -> (Daemon, SocketAddr, SocketAddr) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ringlockd"))
            .args([
                "--bind",
                "127.0.0.1:0",
                "--admin-bind",
                "127.0.0.1:0",
                "--log-level",
                "debug",
            ])
            .env_remove("BIND_ADDRESS")
            .env_remove("DATA_PATH")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ringlockd");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            loop {
                let mut line = Vec::new();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if line.last() == Some(&b'\n') {
                            line.pop();
                        }
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let mut d = Daemon {
            child,
            lines,
            seen: Vec::new(),
        };
        loop {
            let line = d
                .lines
                .recv_timeout(Duration::from_secs(20))
                .expect("ringlockd printed its listening line");
            d.seen.push(line.clone());
            if let Ok(f) = parse_logfmt(&line) {
                if get(&f, "event") == b"listening" {
                    let addr = |k| {
                        std::str::from_utf8(get(&f, k))
                            .expect("an address")
                            .parse()
                            .expect("an address")
                    };
                    let (lock, admin) = (addr("lock"), addr("admin"));
                    return (d, lock, admin);
                }
            }
        }
    }

    /// SIGTERM, then every line until stderr closes.
    fn stop(mut self) -> Vec<Vec<u8>> {
        // SAFETY: plain kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0, "SIGTERM to ringlockd");
        loop {
            match self.lines.recv_timeout(Duration::from_secs(20)) {
                Ok(line) => self.seen.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("ringlockd did not stop"),
            }
        }
        let status = self.child.wait().expect("wait for ringlockd");
        assert!(status.success(), "ringlockd exited with {status}");
        std::mem::take(&mut self.seen)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            for l in &self.seen {
                eprintln!("ringlockd: {}", String::from_utf8_lossy(l));
            }
        }
    }
}

/// Every event the server documents; anything else in the log is forged.
const EVENTS: &[&str] = &[
    "listening",
    "shard_start",
    "reshard",
    "bind_retry",
    "limit_lowered",
    "recovery",
    "torn_tail_dropped",
    "corrupt_tail_truncated",
    "compaction_start",
    "compaction_done",
    "compaction_failed",
    "wal_io_error",
    "wal_records_voided",
    "undo_failed",
    "limit_reached",
    "accept_error",
    "operator_reset",
    "reset",
    "session_open",
    "session_end",
    "bad_session_request",
    "idle_timeout",
    "auth_failed",
    "lc_action_refused",
    "insecure_bind",
    "protocol_violation",
    "recv_error",
    "send_error",
    "bad_frame",
    "bad_admin_command",
    "frame_timeout",
    "accept",
    "recv",
    "send",
    "hang_up",
    "close",
    "signal",
    "stopped",
];

#[test]
fn hostile_bytes_in_keys_sources_and_commands_parse_back_exactly() {
    let started_ms = unix_ms_now();
    let (daemon, lock, admin) = Daemon::start();
    let hostile = hostile();
    let distinct: BTreeSet<&Vec<u8>> = hostile.iter().collect();
    assert_eq!(distinct.len(), hostile.len(), "the cases are distinct");

    // Lock port: ResetByKey and ResetBySource log the key / source.
    for k in &hostile {
        assert_eq!(once(lock, &frame(3, k, None)), b'+');
    }
    for s in &hostile {
        let mut f = vec![4, s.len() as u8];
        f.extend_from_slice(s);
        assert_eq!(once(lock, &f), b'+');
    }
    // Hold every hostile key (with a hostile source), then the admin port
    // resets them by key and by source.
    for (k, s) in hostile.iter().zip(hostile.iter().rev()) {
        assert_eq!(once(lock, &frame(1, k, Some(s))), b'+');
    }
    assert_eq!(common::keys(admin).len(), hostile.len());
    let refs: Vec<&[u8]> = hostile.iter().map(Vec::as_slice).collect();
    assert_eq!(
        admin_names(admin, b"RSET", &refs),
        vec![b'+'; hostile.len() + 1]
    );
    assert_eq!(
        admin_names(admin, b"RSBS", &refs),
        vec![b'+'; hostile.len() + 1]
    );
    assert!(common::keys(admin).is_empty());
    for cmd in hostile_commands() {
        let mut s = TcpStream::connect(admin).expect("connect admin");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        s.write_all(&cmd).expect("send the command");
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).expect("answer, then close");
        assert_eq!(answer, b"-", "{cmd:?}");
    }

    let lines = daemon.stop();
    let mut reset_keys = Vec::new();
    let mut reset_sources = Vec::new();
    let mut operator_keys = Vec::new();
    let mut operator_sources = Vec::new();
    let mut bad_commands = Vec::new();
    for line in &lines {
        let shown = String::from_utf8_lossy(line);
        let f = parse_logfmt(line).unwrap_or_else(|e| panic!("{e}: {shown}"));
        assert_eq!(&names(&f)[..3], ["ts", "level", "event"], "{shown}");
        // UTC wall-clock time, RFC 3339 (give or take the clock's steps).
        let ts = ts_unix_ms(get(&f, "ts")).unwrap_or_else(|| panic!("ts form: {shown}"));
        assert!(
            (started_ms - 60_000..=unix_ms_now() + 60_000).contains(&ts),
            "ts not the time of the run: {shown}"
        );
        let event = std::str::from_utf8(get(&f, "event")).expect("event is ASCII");
        assert!(
            EVENTS.contains(&event),
            "undocumented event {event:?}: {shown}"
        );
        match event {
            "reset" | "operator_reset" => {
                let by = get(&f, "by");
                let field = if by == b"key" { "key" } else { "source" };
                assert_eq!(
                    names(&f),
                    ["ts", "level", "event", "by", field, "peer"],
                    "{shown}"
                );
                let v = get(&f, field).to_vec();
                match (event, field) {
                    ("reset", "key") => reset_keys.push(v),
                    ("reset", _) => reset_sources.push(v),
                    (_, "key") => operator_keys.push(v),
                    _ => operator_sources.push(v),
                }
            }
            "bad_admin_command" => {
                assert_eq!(
                    names(&f),
                    ["ts", "level", "event", "peer", "reason"],
                    "{shown}"
                );
                // The reason quotes the command; that quoted value is escaped
                // once more inside the reason, so it parses back in two steps.
                let reason = get(&f, "reason");
                let inner = reason
                    .strip_prefix(b"unknown admin command ")
                    .unwrap_or_else(|| panic!("{shown}"));
                let mut wrapped = b"c=".to_vec();
                wrapped.extend_from_slice(inner);
                let cmd = parse_logfmt(&wrapped).unwrap_or_else(|e| panic!("{e}: {shown}"));
                assert_eq!(names(&cmd), ["c"]);
                bad_commands.push(get(&cmd, "c").to_vec());
            }
            _ => {}
        }
    }
    assert_eq!(reset_keys, hostile);
    assert_eq!(reset_sources, hostile);
    assert_eq!(operator_keys, hostile);
    assert_eq!(operator_sources, hostile);
    let commands: Vec<Vec<u8>> = hostile_commands().iter().map(|c| c.to_vec()).collect();
    assert_eq!(bad_commands, commands);
    // Debug level was on: connection events were logged and parsed too.
    let events: BTreeSet<Vec<u8>> = lines
        .iter()
        .filter_map(|l| parse_logfmt(l).ok())
        .map(|f| get(&f, "event").to_vec())
        .collect();
    for e in ["accept", "recv", "send", "hang_up", "close", "stopped"] {
        assert!(events.contains(e.as_bytes()), "no {e} line");
    }
}
