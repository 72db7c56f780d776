//! Durable mode, recovery with the real binary (issue 3 "Tests"):
//! - the log cut at every byte offset within its last record (torn tail);
//! - one byte flipped at every offset of middle records (corruption is
//!   refused with the record's offset; `--wal-truncate-at` proceeds only at
//!   that exact offset);
//! - the states an interrupted compaction can leave behind (a stale or
//!   partial `FILE.compact.tmp` next to an intact log).
//!
//! Logs are built through real traffic, the server is `kill -9`ed, and the
//! file is then edited the way a crash or a bad disk would.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

// ---------------------------------------------------------------- helpers

/// Starts ringlockd with a data path and returns the server together with
/// the stderr lines printed before `event=listening` (the recovery report).
/// On exit instead: the exit code and the whole stderr.
fn start_logged(log: &Path, extra: &[&str]) -> Result<(Server, Vec<String>), (i32, String)> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlockd"));
    cmd.args(["--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"])
        .arg("--data-path")
        .arg(log)
        .env_remove("RINGLOCK_FAULTS");
    Server::spawn_logged(cmd, extra).map(|s| {
        let pre = s.startup_log.clone();
        (s, pre)
    })
}

fn start_ok(log: &Path, extra: &[&str]) -> (Server, Vec<String>) {
    start_logged(log, extra)
        .unwrap_or_else(|(code, err)| panic!("ringlockd refused to start (exit {code}):\n{err}"))
}

/// The value of `name=` in the first line with `event=<event>`.
fn event_field(lines: &[String], event: &str, name: &str) -> Option<String> {
    let line = lines
        .iter()
        .find(|l| l.contains(&format!("event={event} ")))?;
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    Some(line[start..].split_whitespace().next()?.to_string())
}

/// Record start offsets of a log image, parsed independently of the
/// server (8-byte magic; each record: crc u32, len u16, !len u16, body of
/// `len` bytes). The last element is the end of the last whole record.
/// A running server keeps zero-filled space after its last record
/// (`--wal-preallocate-bytes`): the records end at the first all-zero
/// header, and everything after it must be zeros.
fn record_bounds(data: &[u8]) -> Vec<usize> {
    assert_eq!(&data[..8], b"RLWAL\0\0\x01", "log magic");
    let mut at = 8;
    let mut out = vec![at];
    while at + 8 <= data.len() {
        if data[at..at + 8].iter().all(|&b| b == 0) {
            assert!(
                data[at..].iter().all(|&b| b == 0),
                "non-zero bytes after the records end at {at}"
            );
            return out;
        }
        let len = u16::from_le_bytes([data[at + 4], data[at + 5]]) as usize;
        let check = u16::from_le_bytes([data[at + 6], data[at + 7]]) as usize;
        assert_eq!(len, !check & 0xffff, "length check at {at}");
        at += 8 + len;
        assert!(at <= data.len(), "record past the end");
        out.push(at);
    }
    assert_eq!(
        at,
        data.len(),
        "trailing bytes in a log written by a clean run"
    );
    out
}

fn lock_ok(s: &Server, key: &[u8], src: &[u8]) {
    assert_eq!(
        once(s.lock_addr, &frame(1, key, Some(src))),
        b'+',
        "lock {key:?}"
    );
}

fn unlock_ok(s: &Server, key: &[u8]) {
    assert_eq!(
        once(s.lock_addr, &frame(2, key, None)),
        b'+',
        "unlock {key:?}"
    );
}

fn file_len(p: &Path) -> usize {
    std::fs::metadata(p).expect("stat log").len() as usize
}

/// The log's records, without the preallocated zeros after them.
fn log_image(p: &Path) -> Vec<u8> {
    let mut data = std::fs::read(p).expect("read log");
    let end = *record_bounds(&data).last().expect("bounds");
    data.truncate(end);
    data
}

/// Where the log's records end (the zeros after them are preallocated).
fn written_len(p: &Path) -> usize {
    log_image(p).len()
}

/// The default `--wal-preallocate-bytes`.
const PREALLOCATED: usize = 1 << 20;

// ------------------------------------------------------------ torn tails

/// Cuts `image` at every offset in `[last, end]` of its last record and
/// restarts on each cut.
fn check_every_cut(dir: &TempDir, image: &[u8], before: &[KeyInfo], after: &[KeyInfo]) {
    let bounds = record_bounds(image);
    let last = bounds[bounds.len() - 2];
    let end = *bounds.last().unwrap();
    assert!(end - last > 8, "last record has a body");
    let path = dir.path("cut.log");
    for cut in last..=end {
        std::fs::write(&path, &image[..cut]).unwrap();
        let (mut s, pre) = start_ok(&path, &[]);
        // Zeros at the end of the cut (the high bytes of an id, say) count
        // as zero tail, not as torn bytes.
        let written = image[..cut]
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |i| i + 1)
            .max(last);
        let torn = written - last;
        let want_torn = if cut == end { 0 } else { torn };
        assert_eq!(
            event_field(&pre, "recovery", "torn_tail_bytes").as_deref(),
            Some(want_torn.to_string().as_str()),
            "cut {cut}: recovery line {pre:?}"
        );
        assert_eq!(
            event_field(&pre, "recovery", "file_bytes").as_deref(),
            Some(cut.to_string().as_str()),
            "cut {cut}"
        );
        if want_torn > 0 {
            assert_eq!(
                event_field(&pre, "torn_tail_dropped", "bytes").as_deref(),
                Some(torn.to_string().as_str()),
                "cut {cut}: no torn_tail_dropped line in {pre:?}"
            );
        } else {
            assert!(
                event_field(&pre, "torn_tail_dropped", "bytes").is_none(),
                "cut {cut}: torn tail reported for a whole log"
            );
        }
        let got = keys(s.admin_addr);
        let want = if cut == end { after } else { before };
        assert_eq!(got, want, "cut {cut} of last record [{last}, {end})");
        // Truncated to the record boundary before serving, then zeros
        // preallocated after it.
        let want_len = if cut == end { end } else { last };
        assert_eq!(
            written_len(&path),
            want_len,
            "cut {cut}: file not truncated"
        );
        assert_eq!(
            file_len(&path),
            (want_len + PREALLOCATED).next_multiple_of(4096),
            "cut {cut}: not preallocated"
        );
        s.kill9();
    }
    // The truncated file takes appends and replays them after a restart.
    std::fs::write(&path, &image[..last + (end - last) / 2]).unwrap();
    let (mut s, _) = start_ok(&path, &[]);
    lock_ok(&s, b"after-truncation", b"t");
    let want = keys(s.admin_addr);
    assert_eq!(want.len(), before.len() + 1);
    s.kill9();
    let (mut s, pre) = start_ok(&path, &[]);
    assert_eq!(
        event_field(&pre, "recovery", "torn_tail_bytes").as_deref(),
        Some("0")
    );
    assert_eq!(keys(s.admin_addr), want);
    s.kill9();
}

#[test]
fn torn_tail_cut_at_every_offset_of_the_last_record() {
    let dir = TempDir::new("torn");
    let log = dir.path("wal.log");
    let (mut s, _) = start_ok(&log, &[]);
    lock_ok(&s, b"alpha", b"svc-a");
    lock_ok(&s, b"beta", b"");
    lock_ok(&s, b"gamma", b"svc-g");
    let before_release = keys(s.admin_addr);
    // Last record: a Release.
    unlock_ok(&s, b"beta");
    let after_release = keys(s.admin_addr);
    assert_eq!(after_release.len(), 2);
    s.kill9();
    let image = log_image(&log);
    check_every_cut(&dir, &image, &before_release, &after_release);

    // Last record: an Acquire (with the longest fields a record can hold).
    let (mut s, _) = start_ok(&log, &[]);
    assert_eq!(keys(s.admin_addr), after_release, "restart lost state");
    let before_acquire = keys(s.admin_addr);
    lock_ok(&s, &[b'k'; 127], &[b's'; 127]);
    let after_acquire = keys(s.admin_addr);
    assert_eq!(after_acquire.len(), 3);
    s.kill9();
    let image = log_image(&log);
    check_every_cut(&dir, &image, &before_acquire, &after_acquire);
}

// ------------------------------------------------------------ corruption

#[test]
fn flipped_byte_in_a_middle_record_is_refused_with_its_offset() {
    let dir = TempDir::new("corrupt");
    let log = dir.path("wal.log");
    let (mut s, _) = start_ok(&log, &[]);
    // after[i]: KEYS once records 0..i are in the log.
    let mut after = vec![keys(s.admin_addr)];
    lock_ok(&s, b"one", b"src1");
    after.push(keys(s.admin_addr));
    lock_ok(&s, b"two", b"src2");
    after.push(keys(s.admin_addr));
    unlock_ok(&s, b"one");
    after.push(keys(s.admin_addr));
    lock_ok(&s, b"three", b"");
    after.push(keys(s.admin_addr));
    unlock_ok(&s, b"two");
    after.push(keys(s.admin_addr));
    s.kill9();
    let image = log_image(&log);
    let bounds = record_bounds(&image);
    assert_eq!(bounds.len(), 6, "five records");
    let path = dir.path("flip.log");
    let shown = path.display().to_string();
    // Records 1 (Acquire) and 2 (Release): in the middle of the log.
    let mut refusals = 0;
    for r in [1usize, 2] {
        let (start, end) = (bounds[r], bounds[r + 1]);
        for at in start..end {
            let mut bad = image.clone();
            bad[at] ^= if at % 2 == 0 { 0x01 } else { 0x80 };
            std::fs::write(&path, &bad).unwrap();
            match start_logged(&path, &[]) {
                Ok((mut s, _)) => {
                    s.kill9();
                    panic!("flip at byte {at} (record {r} at {start}) was accepted");
                }
                Err((code, err)) => {
                    assert_ne!(code, 0, "flip at {at}: refusal must exit non-zero");
                    assert!(err.contains(&shown), "flip at {at}: file not named:\n{err}");
                    assert!(
                        err.contains(&format!("byte offset {start} ")),
                        "flip at {at}: offset {start} not named:\n{err}"
                    );
                    assert!(
                        err.contains(&format!("--data-path {shown} --wal-truncate-at {start}")),
                        "flip at {at}: operator command missing:\n{err}"
                    );
                }
            }
            assert_eq!(
                std::fs::read(&path).unwrap(),
                bad,
                "a refusal modified the log"
            );
            refusals += 1;
        }
    }
    assert!(refusals > 40);

    // The operator's way out: truncate at exactly the named offset.
    let (start, end) = (bounds[1], bounds[2]);
    let mut bad = image.clone();
    bad[start + (end - start) / 2] ^= 0x10;
    std::fs::write(&path, &bad).unwrap();
    for wrong in [start - 1, start + 1, bounds[2], 0] {
        let w = wrong.to_string();
        match start_logged(&path, &["--wal-truncate-at", &w]) {
            Ok((mut s, _)) => {
                s.kill9();
                panic!("--wal-truncate-at {wrong} accepted; corruption is at {start}");
            }
            Err((code, err)) => {
                assert_ne!(code, 0);
                assert!(err.contains(&shown), "{err}");
            }
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bad,
            "wrong offset modified the log"
        );
    }
    let (mut s, pre) = start_ok(&path, &["--wal-truncate-at", &start.to_string()]);
    assert_eq!(
        event_field(&pre, "recovery", "truncated_at").as_deref(),
        Some(start.to_string().as_str())
    );
    assert_eq!(
        event_field(&pre, "corrupt_tail_truncated", "offset").as_deref(),
        Some(start.to_string().as_str())
    );
    assert_eq!(keys(s.admin_addr), after[1], "records before the offset");
    assert_eq!(written_len(&path), start);
    // It serves, and what it serves is durable.
    lock_ok(&s, b"four", b"src4");
    let want = keys(s.admin_addr);
    s.kill9();
    let (mut s, _) = start_ok(&path, &[]);
    assert_eq!(keys(s.admin_addr), want);
    s.kill9();

    // A clean log refuses --wal-truncate-at.
    std::fs::write(&path, &image).unwrap();
    let err = start_logged(&path, &["--wal-truncate-at", &bounds[2].to_string()])
        .err()
        .expect("--wal-truncate-at on a clean log must refuse");
    assert_ne!(err.0, 0);
    assert_eq!(std::fs::read(&path).unwrap(), image);
    let (mut s, _) = start_ok(&path, &[]);
    assert_eq!(keys(s.admin_addr), after[5]);
    s.kill9();

    // A damaged magic: not a ringlock log, refused, untouched.
    let mut bad = image.clone();
    bad[2] ^= 0xff;
    std::fs::write(&path, &bad).unwrap();
    let (code, err) = start_logged(&path, &[])
        .err()
        .expect("a bad magic must refuse");
    assert_ne!(code, 0);
    assert!(
        err.contains(&shown) && err.contains("not a ringlock log"),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bad);
}

// ------------------------------------------- interrupted compaction states

#[test]
fn stale_or_partial_compaction_temp_file_is_ignored_and_removed() {
    let dir = TempDir::new("tmp");
    let log = dir.path("wal.log");
    let (mut s, _) = start_ok(&log, &[]);
    lock_ok(&s, b"keep-1", b"a");
    lock_ok(&s, b"gone", b"b");
    lock_ok(&s, b"keep-2", b"c");
    unlock_ok(&s, b"gone");
    let want = keys(s.admin_addr);
    s.kill9();
    let image = log_image(&log);
    let bounds = record_bounds(&image);

    // A complete, valid log with different content (a rewrite that was
    // fully written and fsynced, but never renamed).
    let other = dir.path("other.log");
    let (mut o, _) = start_ok(&other, &[]);
    lock_ok(&o, b"only-in-temp", b"z");
    o.kill9();
    let other_image = log_image(&other);

    let temp = dir.path("wal.log.compact.tmp");
    let variants: Vec<(&str, Vec<u8>)> = vec![
        ("empty (created, nothing written)", Vec::new()),
        ("magic only", image[..8].to_vec()),
        ("half a record", image[..bounds[1] + 5].to_vec()),
        ("a prefix of the live records", image[..bounds[2]].to_vec()),
        ("complete but not renamed", other_image),
        ("garbage", vec![0xA5; 300]),
    ];
    for (what, bytes) in variants {
        std::fs::write(&temp, &bytes).unwrap();
        let (mut s, pre) = start_ok(&log, &[]);
        assert!(!temp.exists(), "{what}: temp file not removed");
        assert_eq!(
            keys(s.admin_addr),
            want,
            "{what}: state not from the old log"
        );
        assert_eq!(
            event_field(&pre, "recovery", "torn_tail_bytes").as_deref(),
            Some("0"),
            "{what}"
        );
        s.kill9();
        assert_eq!(log_image(&log), image, "{what}: old log changed");
    }
}

// --------------------------------------------- zeros where data never landed

/// A crash can persist a file's new size before its data: the end of an
/// append reads back as zeros. A record damaged that way, followed by
/// nothing but zeros, is a torn tail (dropped, logged, truncated), not
/// corruption; non-zero bytes after it still are.
#[test]
fn zero_filled_end_of_an_append_is_a_torn_tail() {
    let dir = TempDir::new("zeros");
    let log = dir.path("wal.log");
    let (mut s, _) = start_ok(&log, &[]);
    lock_ok(&s, b"first", b"f");
    let after_first = keys(s.admin_addr);
    lock_ok(&s, b"second", b"s");
    lock_ok(&s, b"third", b"t");
    s.kill9();
    let image = log_image(&log);
    let bounds = record_bounds(&image);
    assert_eq!(bounds.len(), 4);
    let path = dir.path("zeros.log");
    // From inside the header of record 1 to the last byte of record 2.
    for zero_from in (bounds[1] + 2..image.len()).step_by(3) {
        let mut img = image.clone();
        img[zero_from..].iter_mut().for_each(|b| *b = 0);
        img.extend_from_slice(&[0u8; 4096]);
        std::fs::write(&path, &img).unwrap();
        let (mut s, pre) = start_ok(&path, &[]);
        let valid = *bounds.iter().filter(|&&b| b <= zero_from).max().unwrap();
        // The written bytes past the last whole record are the torn tail;
        // the zeros after them are reported apart (preallocated space).
        let written = img.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let torn = written.saturating_sub(valid);
        assert_eq!(
            event_field(&pre, "torn_tail_dropped", "bytes"),
            (torn > 0).then(|| torn.to_string()),
            "zeros from {zero_from}: {pre:?}"
        );
        assert_eq!(
            event_field(&pre, "recovery", "zero_tail_bytes"),
            Some((img.len() - written.max(valid)).to_string()),
            "zeros from {zero_from}: {pre:?}"
        );
        assert_eq!(written_len(&path), valid, "zeros from {zero_from}");
        if valid == bounds[1] {
            assert_eq!(keys(s.admin_addr), after_first, "zeros from {zero_from}");
        } else {
            assert_eq!(keys(s.admin_addr).len(), 2, "zeros from {zero_from}");
        }
        s.kill9();
    }
    // Damage in record 1 with a non-zero byte after it: corruption.
    let mut img = image.clone();
    img[bounds[1] + 20] ^= 0x04;
    img[bounds[2]..].iter_mut().for_each(|b| *b = 0);
    img.extend_from_slice(&[0u8; 100]);
    img.push(7);
    std::fs::write(&path, &img).unwrap();
    let (code, err) = start_logged(&path, &[])
        .err()
        .expect("damage followed by data must refuse");
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!("byte offset {} ", bounds[1])),
        "{err}"
    );
}

// ------------------------------------------------------------ grant ids

/// Grant ids keep increasing across compaction and restart: a compacted log
/// holds only live holders, so it starts with a mark of the next id.
#[test]
fn grant_ids_never_go_back_after_compaction_and_restart() {
    let dir = TempDir::new("grant-mark");
    let path = dir.path("wal.log");
    // 10 held keys (grant ids 1..=10), then 40 cycles on `a` (11..=50).
    let (s, _) = start_ok(&path, &[]);
    let mut c = s.connect();
    for k in 0..10 {
        assert_eq!(c.lock(format!("k{k}").as_bytes(), b"g"), b'+');
    }
    for _ in 0..40 {
        assert_eq!(c.lock(b"a", b"g"), b'+');
        assert_eq!(c.unlock(b"a"), b'+');
    }
    let mut s = s;
    s.kill9();
    // Releases only: the log is compacted down to the held keys 1..=10.
    let (s, _) = start_ok(&path, &["--compact-floor-bytes", "256"]);
    for k in 0..10 {
        assert_eq!(
            once(s.lock_addr, &frame(3, format!("k{k}").as_bytes(), None)),
            b'+'
        );
    }
    s.wait_log("event=compaction_done");
    let mut s = s;
    s.kill9();
    // The next grant after a restart must be above every id ever issued.
    let (s, _) = start_ok(&path, &[]);
    lock_ok(&s, b"b", b"g");
    let mut s = s;
    s.kill9();
    let data = log_image(&path);
    let bounds = record_bounds(&data);
    let last_acquire = bounds
        .windows(2)
        // Type 6: an Acquire with a binary endpoint (1 with a text one).
        .rfind(|w| matches!(data[w[0] + 8], 1 | 6))
        .expect("an Acquire record");
    let at = last_acquire[0] + 9;
    let grant_id = u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
    assert!(
        grant_id > 50,
        "grant id went back to {grant_id} after 50 grants"
    );
}

/// `--data-path` names the log *file* (with several shards, the files
/// `PATH.shards` and `PATH.gG.I` beside it), never a directory: a directory
/// is refused at start with an error naming it, whatever the shard count,
/// and nothing is created in it.
#[test]
fn a_data_path_that_is_a_directory_is_refused() {
    let dir = TempDir::new("data-path-dir");
    let d = dir.path("logs");
    std::fs::create_dir(&d).expect("mkdir");
    for threads in ["1", "2"] {
        match start_logged(&d, &["--threads", threads]) {
            Ok(_) => panic!("ringlockd started with a directory as --data-path ({threads} shards)"),
            Err((code, err)) => {
                assert_ne!(code, 0, "{err}");
                assert!(
                    err.contains(&format!("{}: cannot open log", d.display()))
                        && err.contains("Is a directory"),
                    "{threads} shards: {err}"
                );
            }
        }
        assert_eq!(
            std::fs::read_dir(&d).expect("ls").count(),
            0,
            "created files"
        );
    }
}
