//! Durable mode under storage faults, with the real binary (issue 3
//! "Tests", DURABILITY.md rule 4):
//! - `RINGLOCK_FAULTS` short writes everywhere (appends and compaction
//!   rewrites): nothing fails, all acknowledged state survives `kill -9`;
//! - a failed fdatasync / a failed write: the affected Lock or Unlock gets
//!   `-` (never `+`), its effect is undone (KEYS), a concurrent TryLock never
//!   sees the voided grant, the server keeps serving and later requests get
//!   `+` once the log was rewritten; after `kill -9` the log replays exactly
//!   what was acknowledged;
//! - a real full filesystem (a small tmpfs, when the machine allows
//!   mounting one).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::TryRecvError;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- helpers

/// ringlockd on `log`, with `RINGLOCK_FAULTS=faults` when given.
fn start(log: &Path, faults: Option<&str>, extra: &[&str]) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlockd"));
    cmd.args(["--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"])
        .arg("--data-path")
        .arg(log);
    match faults {
        Some(f) => cmd.env("RINGLOCK_FAULTS", f),
        None => cmd.env_remove("RINGLOCK_FAULTS"),
    };
    Server::spawn(cmd, extra).unwrap_or_else(|e| panic!("ringlockd did not start: {e}"))
}

/// Every log line the server printed so far (non-blocking).
fn drain(s: &Server) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        match s.log.try_recv() {
            Ok(l) => out.push(l),
            Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => return out,
        }
    }
}

/// Sends one request on a fresh connection; the answer and how long it took.
fn timed(s: &Server, bytes: &[u8]) -> (u8, Duration) {
    let t = Instant::now();
    let b = once(s.lock_addr, bytes);
    (b, t.elapsed())
}

fn lock(s: &Server, key: &[u8], src: &[u8]) -> u8 {
    once(s.lock_addr, &frame(1, key, Some(src)))
}

fn try_lock(s: &Server, key: &[u8], src: &[u8]) -> u8 {
    once(s.lock_addr, &frame(5, key, Some(src)))
}

fn unlock(s: &Server, key: &[u8]) -> u8 {
    once(s.lock_addr, &frame(2, key, None))
}

fn key_names(s: &Server) -> Vec<Vec<u8>> {
    keys(s.admin_addr).into_iter().map(|k| k.key).collect()
}

/// A round trip on another connection: once it answers, every frame sent
/// before it has been handled (the loop is one thread, arrivals in order).
/// An Unlock of a free key makes no log record.
fn sync(s: &Server) {
    assert_eq!(unlock(s, b"__sync__"), b'+');
}

/// Waits for a log line with `needle`, returning it (bounded).
fn wait_line(s: &Server, needle: &str) -> String {
    s.wait_log(needle)
}

/// Restart on the same log: KEYS must be exactly `want` (acknowledged state,
/// with source, endpoint and acquire time).
fn restart_matches(s: &mut Server, log: &Path, want: &[KeyInfo]) {
    s.kill9();
    let r = start(log, None, &[]);
    assert_eq!(
        keys(r.admin_addr),
        want,
        "restart does not replay what was acknowledged"
    );
    let mut r = r;
    r.kill9();
}

// ------------------------------------------------------------ short writes

#[test]
fn short_writes_everywhere_lose_nothing() {
    let dir = TempDir::new("short");
    let log = dir.path("wal.log");
    for every in ["1", "2", "3"] {
        let _ = std::fs::remove_file(&log);
        // A tiny compaction floor: rewrites happen too, and take short
        // writes like appends do.
        let spec = format!("short_write_every={every}");
        let mut s = start(&log, Some(&spec), &["--compact-floor-bytes", "300"]);
        let mut conns: Vec<Conn> = (0..4).map(|_| s.connect()).collect();
        let mut held = std::collections::BTreeSet::new();
        for round in 0..25u32 {
            for (i, c) in conns.iter_mut().enumerate() {
                let k = format!("k{i}-{}", round % 7);
                if held.remove(&k) {
                    assert_eq!(c.unlock(k.as_bytes()), b'+', "every={every} unlock {k}");
                    continue;
                }
                assert_eq!(c.lock(k.as_bytes(), b"sw"), b'+', "every={every} lock {k}");
                if round % 3 == 0 {
                    held.insert(k);
                } else {
                    assert_eq!(c.unlock(k.as_bytes()), b'+', "every={every} unlock {k}");
                }
            }
        }
        // Concurrent requests share batches (and their short writes).
        for (i, c) in conns.iter_mut().enumerate() {
            c.send(&frame(1, format!("burst{i}").as_bytes(), Some(b"b")));
        }
        for c in conns.iter_mut() {
            assert_eq!(c.read_byte(), b'+');
        }
        let want = keys(s.admin_addr);
        // Every line up to the kill (the reader ends at EOF).
        s.kill9();
        let lines: Vec<String> =
            std::iter::from_fn(|| s.log.recv_timeout(Duration::from_secs(5)).ok()).collect();
        let errors: Vec<_> = lines
            .iter()
            .filter(|l| l.contains("event=wal_io_error") || l.contains("wal_records_voided"))
            .collect();
        assert!(
            errors.is_empty(),
            "every={every}: short writes caused failures: {errors:?}"
        );
        assert!(
            lines.iter().any(|l| l.contains("event=compaction_done")),
            "every={every}: no compaction ran; the test would not cover rewrites"
        );
        assert_eq!(want.len(), held.len() + 4, "every={every}");
        restart_matches(&mut s, &log, &want);
    }
}

// -------------------------------------------------------- failed fdatasync

#[test]
fn failed_fsync_answers_minus_undoes_and_recovers_after_rewrite() {
    let dir = TempDir::new("fsync");
    let log = dir.path("wal.log");
    // fsyncs: 1 lock a · 2 lock b (fails) · 3 rewrite · 4 lock c ·
    // 5 unlock a (fails) · 6 rewrite · 7 unlock a · 8 lock q ·
    // 9 unlock q + grant to waiter (fails) · 10 rewrite.
    let mut s = start(
        &log,
        Some("fail_fsync_at=2,fail_fsync_at=5,fail_fsync_at=9"),
        &[],
    );
    assert_eq!(lock(&s, b"a", b"sa"), b'+');
    let held_a = keys(s.admin_addr);

    let (b, took) = timed(&s, &frame(1, b"b", Some(b"sb")));
    assert_eq!(b, b'-', "a Lock whose fdatasync failed must get '-'");
    assert!(took < Duration::from_secs(3), "'-' took {took:?}");
    let err = wait_line(&s, "event=wal_io_error");
    assert!(
        err.contains("op=append") && err.contains("errno=5"),
        "{err}"
    );
    wait_line(&s, "event=wal_records_voided");
    assert_eq!(keys(s.admin_addr), held_a, "KEYS shows the voided grant");
    // The server keeps serving what it safely can: a held key answers '#',
    // the admin port answers; a TryLock needing the log never gets '+'
    // before the rewrite.
    assert_eq!(try_lock(&s, b"a", b"x"), b'#');
    // Within the retry interval the log cannot take a record: a TryLock
    // that would need one fails fast instead of answering '+'.
    let failed_at = Instant::now();
    let t = try_lock(&s, b"b", b"x");
    let b_held = match t {
        b'-' => false,
        // Only possible once the rewrite retry (1 s later) carried it.
        b'+' if failed_at.elapsed() > Duration::from_millis(900) => true,
        other => panic!(
            "TryLock b answered {} right after the failure",
            other as char
        ),
    };
    wait_line(&s, "event=compaction_done");
    assert_eq!(key_names(&s).contains(&b"b".to_vec()), b_held);
    let _ = drain(&s);
    // The rewrite landed: later locks get '+'.
    assert_eq!(lock(&s, b"c", b"sc"), b'+');
    let before_unlock = keys(s.admin_addr);
    assert_eq!(before_unlock.len(), 2 + b_held as usize);

    // An Unlock whose release record fails: '-', and the key stays held
    // with its original holder.
    assert_eq!(
        unlock(&s, b"a"),
        b'-',
        "an Unlock whose record failed must get '-'"
    );
    wait_line(&s, "event=wal_io_error");
    assert_eq!(
        keys(s.admin_addr),
        before_unlock,
        "the failed Unlock was not undone"
    );
    assert_eq!(try_lock(&s, b"a", b"x"), b'#', "a is still held");
    wait_line(&s, "event=compaction_done");
    assert_eq!(unlock(&s, b"a"), b'+');
    if b_held {
        assert_eq!(unlock(&s, b"b"), b'+');
        eprintln!("slow machine: TryLock b landed with the rewrite; schedule shifted");
        return;
    }
    assert_eq!(key_names(&s), vec![b"c".to_vec()]);

    // A release and the next holder's grant in one failed batch: both get
    // '-', the original holder keeps the key; TryLock never sees the waiter
    // as holder.
    assert_eq!(lock(&s, b"q", b"holder"), b'+');
    let with_q = keys(s.admin_addr);
    let mut waiter = s.connect();
    waiter.send(&frame(1, b"q", Some(b"waiter")));
    sync(&s);
    let mut releaser = s.connect();
    releaser.send(&frame(2, b"q", None));
    let mut prober = s.connect();
    prober.send(&frame(5, b"q", Some(b"probe")));
    assert_eq!(releaser.read_byte(), b'-', "Unlock q in a failed batch");
    assert_eq!(
        waiter.read_byte(),
        b'-',
        "grant to the waiter in a failed batch"
    );
    let p = prober.read_byte();
    assert!(p == b'#' || p == b'-', "TryLock q answered {}", p as char);
    wait_line(&s, "event=wal_io_error");
    assert_eq!(
        keys(s.admin_addr),
        with_q,
        "q must still be held by its first holder"
    );
    wait_line(&s, "event=compaction_done");
    assert_eq!(lock(&s, b"d", b"sd"), b'+');
    let want = keys(s.admin_addr);
    assert_eq!(
        want.iter().map(|k| k.key.clone()).collect::<Vec<_>>(),
        vec![b"c".to_vec(), b"d".to_vec(), b"q".to_vec()]
    );
    restart_matches(&mut s, &log, &want);
}

// ------------------------------------------------------------ failed write

#[test]
fn failed_write_answers_minus_and_recovers_after_rewrite() {
    let dir = TempDir::new("write");
    let log = dir.path("wal.log");
    // writes: 1 lock a · 2 lock b (ENOSPC) · 3 rewrite · 4 lock c ·
    // 5 unlock a (ENOSPC) · 6 rewrite.
    let mut s = start(&log, Some("fail_write_at=2,fail_write_at=5"), &[]);
    assert_eq!(lock(&s, b"a", b"sa"), b'+');
    let held_a = keys(s.admin_addr);
    let (b, took) = timed(&s, &frame(1, b"b", Some(b"sb")));
    assert_eq!(b, b'-');
    assert!(took < Duration::from_secs(3), "'-' took {took:?}");
    let err = wait_line(&s, "event=wal_io_error");
    assert!(err.contains("errno=28"), "ENOSPC reported: {err}");
    assert_eq!(keys(s.admin_addr), held_a);
    assert_eq!(try_lock(&s, b"a", b"x"), b'#');
    wait_line(&s, "event=compaction_done");
    assert_eq!(lock(&s, b"c", b"sc"), b'+');
    let before = keys(s.admin_addr);
    assert_eq!(unlock(&s, b"a"), b'-');
    assert_eq!(
        keys(s.admin_addr),
        before,
        "the failed Unlock was not undone"
    );
    wait_line(&s, "event=compaction_done");
    // Kill now: the log was rewritten from memory, a is held.
    restart_matches(&mut s, &log, &before);
}

#[test]
fn failed_rewrite_leaves_the_old_log_and_is_retried() {
    use std::os::unix::fs::MetadataExt;
    let dir = TempDir::new("rewrite");
    let log = dir.path("wal.log");
    let temp = dir.path("wal.log.compact.tmp");
    // writes: 1 lock a · 2 lock b (its fsync fails) · 3 the rewrite (ENOSPC)
    // · 4 the retried rewrite · 5 lock c.
    let mut s = start(&log, Some("fail_fsync_at=2,fail_write_at=3"), &[]);
    let ino = std::fs::metadata(&log).unwrap().ino();
    assert_eq!(lock(&s, b"a", b"sa"), b'+');
    assert_eq!(lock(&s, b"b", b"sb"), b'-');
    let err = wait_line(&s, "event=wal_io_error");
    assert!(
        err.contains("op=append") && err.contains("errno=5"),
        "{err}"
    );
    wait_line(&s, "event=compaction_start");
    let err = wait_line(&s, "event=wal_io_error");
    assert!(
        err.contains("op=rewrite") && err.contains("errno=28"),
        "{err}"
    );
    // (Logged after the temp file is closed and removed.)
    wait_line(&s, "event=wal_records_voided");
    // The failed rewrite never replaced the log and left no temp file.
    assert_eq!(std::fs::metadata(&log).unwrap().ino(), ino, "log replaced");
    assert!(!temp.exists(), "temp file of a failed rewrite left behind");
    assert_eq!(try_lock(&s, b"a", b"x"), b'#');
    let want = keys(s.admin_addr);
    // Retried about a second later, without any client traffic.
    let done = wait_line(&s, "event=compaction_done");
    assert!(done.contains("held_keys=1"), "{done}");
    assert_ne!(
        std::fs::metadata(&log).unwrap().ino(),
        ino,
        "log not rewritten"
    );
    assert!(!temp.exists());
    assert_eq!(keys(s.admin_addr), want);
    assert_eq!(lock(&s, b"c", b"sc"), b'+');
    let want = keys(s.admin_addr);
    assert_eq!(want.len(), 2);
    restart_matches(&mut s, &log, &want);
}

// ------------------------------------------------- a real full filesystem

/// Unmounts on drop (also when the test fails).
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn fill(path: &Path) -> u64 {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("create filler");
    let chunk = [0x5Au8; 4096];
    let mut n = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(k) => n += k as u64,
            Err(_) => break,
        }
    }
    let _ = f.sync_all();
    n
}

#[test]
fn full_filesystem_fails_fast_keeps_serving_and_recovers() {
    let dir = TempDir::new("fullfs");
    let mnt = dir.path("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&mnt)
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!(
                "skipped: cannot mount a tmpfs (needs root/CAP_SYS_ADMIN): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("skipped: cannot run mount: {e}");
            return;
        }
    }
    // Declared before the server: dropped after it (the server holds the
    // log open; unmount needs it gone).
    let _mount = Mount(mnt.clone());
    let log = mnt.join("wal.log");
    let mut s = start(&log, None, &[]);
    assert_eq!(lock(&s, b"held", b"h"), b'+');
    let filler = mnt.join("filler");
    let filled = fill(&filler);
    assert!(filled > 100_000, "filler wrote {filled} bytes");

    // Appends may still fit in the log's last page; long records reach a
    // page that cannot be allocated within a few locks.
    let long_src = [b's'; 127];
    let mut acked: Vec<Vec<u8>> = vec![b"held".to_vec()];
    let mut failed = None;
    for i in 0..64u32 {
        let mut k = format!("fill-{i}-").into_bytes();
        k.resize(127, b'k');
        let (b, took) = timed(&s, &frame(1, &k, Some(&long_src)));
        assert!(
            took < Duration::from_secs(3),
            "answer took {took:?} (hang?)"
        );
        match b {
            b'+' => acked.push(k),
            b'-' => {
                failed = Some(k);
                break;
            }
            other => panic!("lock answered {}", other as char),
        }
    }
    let failed = failed.expect("no Lock failed on a full filesystem");
    let err = wait_line(&s, "event=wal_io_error");
    assert!(err.contains("errno=28"), "not reported as ENOSPC: {err}");
    acked.sort();
    assert_eq!(key_names(&s), acked, "KEYS after the failure");
    assert!(!key_names(&s).contains(&failed));

    // While full: Locks needing the log get '-' quickly; TryLock on a held
    // key answers '#'; KEYS works. Spans at least one rewrite retry.
    let t0 = Instant::now();
    let mut attempts = 0;
    while t0.elapsed() < Duration::from_millis(1500) {
        let (b, took) = timed(&s, &frame(1, b"while-full", Some(b"w")));
        assert_eq!(b, b'-', "a Lock got '+' while the disk is full");
        assert!(took < Duration::from_secs(3), "'-' took {took:?}");
        let (b, took) = timed(&s, &frame(5, b"held", Some(b"w")));
        assert_eq!(b, b'#');
        assert!(took < Duration::from_secs(3));
        attempts += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(attempts >= 3, "only {attempts} probes in 1.5 s");
    assert_eq!(key_names(&s), acked);
    assert!(s.child.try_wait().unwrap().is_none(), "server exited");

    // Space again: the rewrite retry (about once a second) succeeds and
    // Locks get '+' again.
    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match lock(&s, b"after", b"a") {
            b'+' => break,
            b'-' => {
                if Instant::now() > deadline {
                    panic!(
                        "no '+' 10 s after space was freed; server log:\n{}",
                        drain(&s).join("\n")
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            other => panic!("lock answered {}", other as char),
        }
    }
    acked.push(b"after".to_vec());
    acked.sort();
    let want = keys(s.admin_addr);
    assert_eq!(
        want.iter().map(|k| k.key.clone()).collect::<Vec<_>>(),
        acked
    );
    restart_matches(&mut s, &log, &want);
    drop(s);
}

// ------------------------------------------------- background compaction

/// Locks and unlocks keys `k0..k3` one request at a time until `done` holds
/// for the server's log (bounded), keeping a model of what the server
/// acknowledged: a `-` to a Lock means not held, a `-` to an Unlock means
/// still held (the release was undone). Returns the model.
fn cycle_until(
    s: &Server,
    held: &mut std::collections::BTreeSet<Vec<u8>>,
    minus: &mut u32,
    mut done: impl FnMut(&str) -> bool,
) {
    // A bound, not a speed check: generous, since a loaded 2-CPU machine
    // (a parallel build) runs this debug server many times slower.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = false;
    let mut i = 0u32;
    while !seen {
        assert!(
            Instant::now() < deadline,
            "condition not reached in the log"
        );
        let k = format!("k{}", i % 4).into_bytes();
        i += 1;
        let answer = if held.contains(&k) {
            unlock(s, &k)
        } else {
            lock(s, &k, b"bg")
        };
        match (held.contains(&k), answer) {
            (false, b'+') => {
                held.insert(k);
            }
            (true, b'+') => {
                held.remove(&k);
            }
            (_, b'-') => *minus += 1,
            (_, other) => panic!("unexpected answer {other}"),
        }
        for l in drain(s) {
            seen |= done(&l);
        }
    }
}

#[test]
fn failed_compaction_snapshot_leaves_the_log_alone_and_is_retried() {
    let dir = TempDir::new("bg-snap");
    let log = dir.path("wal.log");
    let mut s = start(
        &log,
        Some("fail_compact_write_at=1"),
        &["--compact-floor-bytes", "300"],
    );
    let mut held = std::collections::BTreeSet::new();
    let mut minus = 0;
    cycle_until(&s, &mut held, &mut minus, |l| {
        l.contains("event=compaction_failed")
    });
    assert_eq!(
        minus, 0,
        "a failed background compaction must not fail requests"
    );
    // The retry (a second later) succeeds and takes over the log.
    cycle_until(&s, &mut held, &mut minus, |l| {
        l.contains("event=compaction_done")
    });
    assert_eq!(minus, 0);
    let want: Vec<Vec<u8>> = held.iter().cloned().collect();
    assert_eq!(key_names(&s), want);
    let acked = keys(s.admin_addr);
    restart_matches(&mut s, &log, &acked);
}

/// Locks (action 1) or unlocks (2) keys `h-{i}` for `i` in `range` over
/// one persistent connection, 16 frames in flight; every answer must be
/// `+`. Returns the server's log lines seen meanwhile.
fn pipelined(s: &Server, c: &mut Conn, action: u8, range: std::ops::Range<usize>) -> Vec<String> {
    let mut lines = Vec::new();
    let keys: Vec<usize> = range.collect();
    for batch in keys.chunks(16) {
        let mut frames = Vec::new();
        for i in batch {
            let k = format!("h-{i:06}");
            let src: Option<&[u8]> = (action == 1).then_some(b"p");
            frames.extend_from_slice(&frame(action, k.as_bytes(), src));
        }
        c.send(&frames);
        for _ in batch {
            assert_eq!(
                c.read_byte(),
                b'+',
                "a pipelined request was not answered '+'"
            );
        }
        lines.extend(drain(s));
    }
    lines
}

#[test]
fn a_large_snapshot_is_written_in_pieces_and_a_failed_piece_fails_nothing() {
    let dir = TempDir::new("bg-pieces");
    let log = dir.path("wal.log");
    // The second write of the compaction: the snapshot's second piece when
    // the snapshot is written in pieces (it is ~0.6 MB here, pieces are
    // 256 KiB); the finishing step if it were written at once, which would
    // void requests (see the test below).
    let mut s = start(
        &log,
        Some("fail_compact_write_at=2"),
        &["--compact-floor-bytes", "300", "--max-keys", "100000"],
    );
    let mut c = s.connect();
    // 24 000 holders, then 12 000 released: the log is past twice the live
    // records and the snapshot holds ~12 000 records.
    let mut lines = pipelined(&s, &mut c, 1, 0..24_000);
    lines.extend(pipelined(&s, &mut c, 2, 0..12_000));
    let mut held = std::collections::BTreeSet::new();
    let mut minus = 0;
    if !lines.iter().any(|l| l.contains("event=compaction_failed")) {
        cycle_until(&s, &mut held, &mut minus, |l| {
            lines.push(l.to_string());
            l.contains("event=compaction_failed")
        });
    }
    assert_eq!(minus, 0, "a failed snapshot piece must not fail requests");
    assert!(
        !lines.iter().any(|l| l.contains("step=finish")),
        "the second compaction write was the finishing step: the snapshot went out at once"
    );
    // The retry (a second later) succeeds and takes over the log.
    cycle_until(&s, &mut held, &mut minus, |l| {
        l.contains("event=compaction_done")
    });
    assert_eq!(minus, 0);
    let listed = key_names(&s);
    assert_eq!(
        listed.len(),
        12_000 + held.len(),
        "held keys after the compaction"
    );
    let acked = keys(s.admin_addr);
    restart_matches(&mut s, &log, &acked);
}

#[test]
fn failed_compaction_finish_undoes_exactly_what_was_answered_minus() {
    let dir = TempDir::new("bg-finish");
    let log = dir.path("wal.log");
    let mut s = start(
        &log,
        Some("fail_compact_write_at=2"),
        &["--compact-floor-bytes", "300"],
    );
    let mut held = std::collections::BTreeSet::new();
    let mut minus = 0;
    // The finishing write (the carry after the snapshot) fails: records
    // only it held are void, the log is rewritten, service resumes.
    cycle_until(&s, &mut held, &mut minus, |l| {
        l.contains("event=wal_io_error") && l.contains("op=compaction")
    });
    cycle_until(&s, &mut held, &mut minus, |l| {
        l.contains("event=compaction_done")
    });
    assert!(
        minus > 0,
        "requests during the broken window are answered '-'"
    );
    // Afterwards every request succeeds again.
    let mut after = 0;
    cycle_until(&s, &mut held, &mut after, |_| true);
    for _ in 0..20 {
        cycle_until(&s, &mut held, &mut after, |_| true);
    }
    assert_eq!(after, 0, "requests failed after the rewrite");
    let want: Vec<Vec<u8>> = held.iter().cloned().collect();
    assert_eq!(
        key_names(&s),
        want,
        "the table matches what was acknowledged"
    );
    let acked = keys(s.admin_addr);
    restart_matches(&mut s, &log, &acked);
}

// ------------------------------------------- a grant nobody can be told of

/// One metric's value from the server's /metrics (plain HTTP/1.1 GET).
fn metric(s: &Server, name: &str) -> f64 {
    use std::io::{Read, Write};
    let addr = s.metrics_addr.expect("started with --metrics-bind");
    let mut c = std::net::TcpStream::connect(addr).expect("connect metrics");
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut body = String::new();
    c.read_to_string(&mut body).expect("response");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name}"))
}

fn wait_metric(s: &Server, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(s, name) != want {
        assert!(Instant::now() < deadline, "{name} never reached {want}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_waiter_that_leaves_while_its_grant_waits_for_the_log_is_never_a_holder() {
    let dir = TempDir::new("undelivered");
    let log = dir.path("wal.log");
    // Every fdatasync starts 400 ms after its write: answers wait that long.
    let mut s = start(
        &log,
        Some("fsync_delay_ms=400"),
        &["--metrics-bind", "127.0.0.1:0"],
    );
    let mut holder = s.connect();
    assert_eq!(holder.lock(b"k", b"h"), b'+');
    let mut w = s.connect_oneshot();
    w.send(&frame(1, b"k", Some(b"w")));
    wait_metric(&s, "ringlock_queued_waiters", 1.0);
    // The unlock hands k to w in memory; both answers wait for the log.
    holder.send(&frame(2, b"k", None));
    wait_metric(&s, "ringlock_grants_total", 2.0);
    // w leaves before its `+` could be sent (half-close: EOF reaches the
    // server whoever else holds a copy of the socket).
    w.half_close();
    assert_eq!(
        w.read_byte_or_eof(),
        None,
        "a `+` reached a waiter that left"
    );
    assert_eq!(holder.read_byte(), b'+', "the unlock is acknowledged");
    wait_metric(&s, "ringlock_undelivered_grants_total", 1.0);
    assert!(keys(s.admin_addr).is_empty(), "no ghost holder");
    // The give-back is durable too.
    s.kill9();
    let r = start(&log, None, &[]);
    assert!(
        keys(r.admin_addr).is_empty(),
        "the ghost came back after restart"
    );
}
