//! The message printed when the log is corrupt and the server refuses to
//! start. It is the operator's only guide at that moment, so it says what
//! is known (offset, intact records, the keys whose state is in doubt) and
//! gives the exact command to proceed: this process's own command line with
//! `--wal-truncate-at OFFSET` added, so no other flag is lost.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use super::record::{self, Record, Scan};

/// How many keys in doubt the message names before "and N more".
const KEYS_SHOWN_MAX: usize = 10;

/// The refusal for a log whose first damaged record starts at `offset`.
/// `intact` is the log image before that offset (it scans clean).
pub(super) fn corrupt_log(
    shown: &str,
    offset: u64,
    reason: &str,
    records_before: usize,
    intact: &[u8],
) -> String {
    let (noun, verb) = if records_before == 1 {
        ("record", "is")
    } else {
        ("records", "are")
    };
    let command = restart_command(std::env::args_os().collect(), offset);
    format!(
        "{shown}: corrupt log at byte offset {offset} ({reason}); {records_before} {noun} before it {verb} intact. Refusing to start.\n\
         {}\n\
         To drop the record at that offset and everything after it, keep a copy (cp {shown} {shown}.bak) and start once with --wal-truncate-at {offset} added:\n  \
         {command}\n\
         Under systemd or Kubernetes, add --wal-truncate-at {offset} to ExecStart= or to the container's args for that one start, then remove it (docs/wal.md, \"A corrupt log\").",
        in_doubt(intact)
    )
}

/// The keys held as of the last intact record. Each may have been released
/// after it, and a grant recorded after the offset is lost altogether.
fn in_doubt(intact: &[u8]) -> String {
    let Scan::Ok { records, .. } = record::scan(intact) else {
        return "The keys held before the damage could not be listed.".into();
    };
    let mut held = BTreeSet::new();
    for r in &records {
        match r {
            Record::Acquire(h) => {
                held.insert(h.key.as_bytes().to_vec());
            }
            Record::Release { key, .. } => {
                held.remove(key.as_bytes());
            }
            Record::GrantMark { .. }
            | Record::Extend { .. }
            | Record::SessionOpen { .. }
            | Record::SessionEnd { .. } => {}
        }
    }
    let lost = "grants recorded after the offset are lost, so a client may believe it holds a key this log does not show; check the clients before you truncate";
    if held.is_empty() {
        return format!("No key was held as of the last intact record; {lost}.");
    }
    // Escaped: keys are arbitrary bytes and this goes to a terminal.
    let names: Vec<String> = held
        .iter()
        .take(KEYS_SHOWN_MAX)
        .map(|k| format!("\"{}\"", k.escape_ascii()))
        .collect();
    let more = held.len().saturating_sub(KEYS_SHOWN_MAX);
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    let plural = if held.len() == 1 { "key" } else { "keys" };
    format!(
        "State in doubt: {} {plural} held as of the last intact record ({}{tail}) may have been released after it, and {lost}.",
        held.len(),
        names.join(", ")
    )
}

/// `argv` with `--wal-truncate-at OFFSET` placed right after the data path
/// (any earlier `--wal-truncate-at` dropped), quoted for a POSIX shell.
fn restart_command(argv: Vec<OsString>, offset: u64) -> String {
    let mut args = argv.into_iter();
    let mut out = vec![args.next().unwrap_or_else(|| "ringlockd".into())];
    let flag: [OsString; 2] = ["--wal-truncate-at".into(), offset.to_string().into()];
    let mut placed = false;
    while let Some(arg) = args.next() {
        let bytes = arg.as_bytes();
        if bytes == b"--wal-truncate-at" {
            args.next();
            continue;
        }
        if bytes.starts_with(b"--wal-truncate-at=") {
            continue;
        }
        let data_path = bytes == b"--data-path";
        out.push(arg.clone());
        if data_path {
            if let Some(path) = args.next() {
                out.push(path);
            }
        }
        if data_path || bytes.starts_with(b"--data-path=") {
            out.extend(flag.iter().cloned());
            placed = true;
        }
    }
    if !placed {
        // The path came from the environment or a --config file: the
        // flag goes at the end.
        out.extend(flag);
    }
    out.iter()
        .map(|a| shell_quote(a.as_bytes()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(arg: &[u8]) -> String {
    let safe = !arg.is_empty()
        && arg
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-:=@%+,".contains(b));
    let text = String::from_utf8_lossy(arg);
    if safe {
        text.into_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(args: &[&str]) -> String {
        restart_command(args.iter().map(OsString::from).collect(), 77)
    }

    #[test]
    fn the_command_keeps_every_other_flag() {
        assert_eq!(
            cmd(&["/usr/local/bin/ringlockd", "--bind", "0.0.0.0:22119", "--data-path", "/data/r.wal", "--log-level", "info"]),
            "/usr/local/bin/ringlockd --bind 0.0.0.0:22119 --data-path /data/r.wal --wal-truncate-at 77 --log-level info"
        );
        assert_eq!(
            cmd(&[
                "ringlockd",
                "--data-path=/d/x",
                "--wal-truncate-at",
                "5",
                "--max-keys",
                "9"
            ]),
            "ringlockd --data-path=/d/x --wal-truncate-at 77 --max-keys 9"
        );
        assert_eq!(
            cmd(&["ringlockd", "--wal-truncate-at=5"]),
            "ringlockd --wal-truncate-at 77"
        );
        assert_eq!(
            cmd(&["ringlockd", "--data-path", "/my logs/it's.wal"]),
            "ringlockd --data-path '/my logs/it'\\''s.wal' --wal-truncate-at 77"
        );
        assert_eq!(cmd(&[]), "ringlockd --wal-truncate-at 77");
    }

    #[test]
    fn the_message_pluralises_and_lists_keys_in_doubt() {
        let one = corrupt_log("/d/x", 9, "bad checksum", 1, b"");
        assert!(one.contains("1 record before it is intact"), "{one}");
        let many = corrupt_log("/d/x", 9, "bad checksum", 3, b"");
        assert!(many.contains("3 records before it are intact"), "{many}");
        assert!(many.contains("docs/wal.md"), "{many}");
        assert!(many.contains("systemd or Kubernetes"), "{many}");
    }

    #[test]
    fn keys_in_doubt_are_those_held_before_the_damage_escaped() {
        use crate::core::{HeldKey, Name};
        let held = |k: &[u8], id| HeldKey {
            key: Name::new(k).expect("valid name"),
            source: Name::new(b"src").expect("valid name"),
            endpoint: "10.1.2.3:4567".parse().expect("address"),
            acquired_unix_ms: 1_700_000_000_123,
            grant_id: id,
            mode: crate::core::HoldMode::Persistent,
            expires_unix_ms: 0,
            session: 0,
            access: crate::core::Access::Exclusive,
        };
        let mut image = record::MAGIC.to_vec();
        record::encode_acquire(held(b"a", 1).as_ref(), &mut image);
        record::encode_acquire(held(b"b\n\x1b[2J", 2).as_ref(), &mut image);
        record::encode_acquire(held(b"c", 3).as_ref(), &mut image);
        record::encode_release(b"a", 1, &mut image);
        let text = in_doubt(&image);
        assert!(text.contains("2 keys held"), "{text}");
        assert!(text.contains("(\"b\\n\\x1b[2J\", \"c\")"), "{text}");
        assert!(!text.contains('\x1b') && !text.contains("\"a\""), "{text}");
        let mut image = record::MAGIC.to_vec();
        for i in 0..12u64 {
            record::encode_acquire(held(format!("k{i:02}").as_bytes(), i).as_ref(), &mut image);
        }
        assert!(
            in_doubt(&image).contains("k09\" and 2 more)"),
            "{}",
            in_doubt(&image)
        );
    }
}
