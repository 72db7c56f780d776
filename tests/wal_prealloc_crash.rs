//! Crash test for the preallocated log: with only 4 KiB of zeros kept
//! ahead of the records (`--wal-preallocate-bytes 4096`), growth steps run
//! all the time beside the appends, and the real server is killed with
//! SIGKILL at random moments, 30 cycles over one log that is never
//! compacted. After every kill the file is read as it was left, and:
//!
//! - every key acknowledged with `+` (and not since unlocked with `+`) is
//!   held after the restart, every acknowledged unlock stays unlocked, and
//!   a contended shared key never has two holders, also across a restart
//!   (the clients and these checks are tests/crash_common, shared with
//!   tests/wal_crash.rs);
//! - replay stops exactly where the records end: the recovery line counts
//!   the records an independent parse finds before the zeros, reports the
//!   zeros after them as `zero_tail_bytes` (not as a torn tail), and the
//!   restarted server writes its next records right there, with a fresh
//!   preallocation after them (up to the next 4 KiB boundary);
//! - the zeros were kept ahead while the log grew by many times the
//!   preallocation (growth happened, and no zero write clobbered a record:
//!   that would lose an acknowledged lock or leave a hole the parse finds).
//!
//! A second run delays every growth step's zero write (`RINGLOCK_FAULTS=
//! grow_delay_ms=…`), so appends reach the range about to be zeroed while
//! the step is in flight: they must wait for it, or the zeros land on
//! acknowledged records.

mod common;
mod crash_common;

use common::*;
use crash_common::*;
use std::time::Duration;

const CYCLES: usize = 30;
const PREALLOC: usize = 4096;
const CRASH: Crash = Crash {
    threads: 16,
    keys_per_thread: 4,
    prefix: "prealloc-",
};

fn start(path: &str, faults: Option<&str>) -> Server {
    start_with(path, faults, PREALLOC, &[])
}

fn start_with(path: &str, faults: Option<&str>, prealloc: usize, extra: &[&str]) -> Server {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ringlockd"));
    cmd.args(["--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"]);
    match faults {
        Some(f) => cmd.env("RINGLOCK_FAULTS", f),
        None => cmd.env_remove("RINGLOCK_FAULTS"),
    };
    let prealloc = prealloc.to_string();
    let mut args = vec![
        "--threads",
        "1",
        "--data-path",
        path,
        "--wal-preallocate-bytes",
        &prealloc,
        "--compact-floor-bytes",
        "1000000000000",
    ];
    args.extend_from_slice(extra);
    Server::spawn(cmd, &args).unwrap_or_else(|e| panic!("ringlockd did not start: {e}"))
}

/// What a log file holds, parsed independently of the server: the end of
/// its last whole record (8-byte magic; each record crc u32, len u16,
/// !len u16, then `len` bytes), how many records, and where its written
/// bytes end (one past the last non-zero byte).
struct Layout {
    records: usize,
    records_end: usize,
    written_end: usize,
    file_len: usize,
}

fn layout(data: &[u8]) -> Layout {
    assert_eq!(&data[..8], b"RLWAL\0\0\x01", "log magic");
    let (mut at, mut records) = (8, 0);
    while at + 8 <= data.len() {
        let len = u16::from_le_bytes([data[at + 4], data[at + 5]]) as usize;
        let check = u16::from_le_bytes([data[at + 6], data[at + 7]]) as usize;
        if len == 0 || len != !check & 0xffff || at + 8 + len > data.len() {
            break; // zeros (preallocated) or a torn record
        }
        at += 8 + len;
        records += 1;
    }
    Layout {
        records,
        records_end: at,
        written_end: data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1),
        file_len: data.len(),
    }
}

/// The value of `name=` in the startup line with `event=<event>`.
fn event_field(lines: &[String], event: &str, name: &str) -> Option<String> {
    let line = lines
        .iter()
        .find(|l| l.contains(&format!("event={event} ")))?;
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    Some(line[start..].split_whitespace().next()?.to_string())
}

#[test]
fn kill_9_during_preallocation_growth_keeps_every_acknowledged_lock() {
    run(None, CYCLES);
}

#[test]
fn appends_that_catch_up_with_a_slow_growth_step_wait_for_it() {
    run(Some("grow_delay_ms=20"), CYCLES / 2);
}

/// `cycles` kills at random moments over one log; see the module docs.
fn run(faults: Option<&str>, cycles: usize) {
    let dir = TempDir::new("prealloc-crash");
    let path = dir.path("locks.wal");
    let path_s = path.to_str().expect("utf-8 path").to_string();
    let model = CRASH.model();
    let mut seed = 0x005E_ED0F_CAFE_u64 ^ std::process::id() as u64;
    let mut previous: Option<Layout> = None;
    let mut grew_with_zeros_ahead = 0;
    for cycle in 0..=cycles {
        let mut server = start(&path_s, faults);
        let pre = server.startup_log.clone();
        // Replay stopped where the records end, and called the zeros after
        // them what they are.
        if let Some(before) = &previous {
            let field = |name| event_field(&pre, "recovery", name);
            assert_eq!(
                field("records"),
                Some(before.records.to_string()),
                "cycle {cycle}: {pre:?}"
            );
            let torn = before.written_end.saturating_sub(before.records_end);
            assert_eq!(
                field("torn_tail_bytes"),
                Some(torn.to_string()),
                "cycle {cycle}"
            );
            let zeros = before.file_len - before.written_end.max(before.records_end);
            assert_eq!(
                field("zero_tail_bytes"),
                Some(zeros.to_string()),
                "cycle {cycle}"
            );
        }
        // Restarted: the records, then a fresh preallocation after them.
        let now = layout(&std::fs::read(&path).expect("read the log"));
        if let Some(before) = &previous {
            assert_eq!(now.records_end, before.records_end, "cycle {cycle}");
        }
        assert_eq!(now.written_end.max(now.records_end), now.records_end);
        // (Rounded up to a 4 KiB boundary, so growth can use O_DIRECT.)
        assert_eq!(
            now.file_len,
            (now.records_end + PREALLOC).next_multiple_of(4096),
            "cycle {cycle}"
        );
        let start_end = now.records_end;

        CRASH.check_restart(cycle, &server, &model);
        if cycle == cycles {
            break;
        }

        // Some cycles stay inside the first preallocation, most run through
        // several growth steps (a cycle record is ~40 bytes).
        let client_seed = xorshift(&mut seed);
        let want_ops = 10 + (xorshift(&mut seed) % 600) as usize;
        CRASH.traffic_then_kill9(&mut server, &model, client_seed, want_ops);
        let left = layout(&std::fs::read(&path).expect("read the log"));
        if left.records_end - start_end > 2 * PREALLOC && left.file_len > left.records_end {
            grew_with_zeros_ahead += 1;
        }
        previous = Some(left);
    }
    let end = previous.expect("cycles ran").records_end;
    assert!(
        end > cycles / 2 * PREALLOC,
        "the log should grow through many preallocations: {end} bytes"
    );
    assert!(
        grew_with_zeros_ahead >= cycles / 4,
        "zeros were kept ahead in only {grew_with_zeros_ahead} of {cycles} cycles that outgrew the preallocation"
    );
}

#[test]
fn the_preallocation_flag_is_validated_and_0_turns_it_off() {
    let dir = TempDir::new("prealloc-flag");
    let path = dir.path("locks.wal");
    let range = "--wal-preallocate-bytes: 0 (off) or 4096 to 8388608 bytes";
    for (bad, why) in [
        ("100", format!("{range}, not 100")),
        ("4095", format!("{range}, not 4095")),
        ("8388609", format!("{range}, not 8388609")),
        (
            "99999999999999999999",
            format!("{range}, not 99999999999999999999"),
        ),
        ("1MiB", format!("{range}, not \"1MiB\"")),
        ("-1", format!("{range}, not \"-1\"")),
        ("", format!("{range}, not \"\"")),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringlockd"))
            .args(["--data-path", path.to_str().expect("utf-8 path")])
            .args(["--wal-preallocate-bytes", bad])
            .output()
            .expect("run ringlockd");
        assert_eq!(out.status.code(), Some(64), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.trim_end(),
            format!("ringlockd: {why} (see --help)"),
            "{bad:?}"
        );
        assert!(!path.exists(), "{bad}: a refused start made the log");
    }
    // Any size in range, the largest too, is preallocated in full, up to
    // the next 4 KiB boundary.
    for n in [4096usize, 5000, 1 << 20, 8 << 20] {
        let sized = dir.path(&format!("sized-{n}.wal"));
        let mut s = Server::start(&[
            "--threads",
            "1",
            "--data-path",
            sized.to_str().expect("utf-8 path"),
            "--wal-preallocate-bytes",
            &n.to_string(),
        ]);
        let mut c = s.connect();
        assert_eq!(c.lock(b"sized", b"s"), b'+');
        let data = std::fs::read(&sized).expect("read the log");
        let l = layout(&data);
        assert_eq!(l.records, 1);
        // The start-up preallocation followed the magic.
        assert_eq!(data.len(), (8 + n).next_multiple_of(4096), "{n}");
        s.kill9();
    }
    // Off: the file ends at its last record, before and after appends.
    let args = [
        "--threads",
        "1",
        "--data-path",
        path.to_str().expect("utf-8 path"),
        "--wal-preallocate-bytes",
        "0",
    ];
    let mut s = Server::start(&args);
    let mut c = s.connect();
    for k in 0..50 {
        assert_eq!(c.lock(format!("off-{k}").as_bytes(), b"o"), b'+');
    }
    let data = std::fs::read(&path).expect("read the log");
    let l = layout(&data);
    assert_eq!(
        (l.records, l.records_end, l.file_len),
        (50, data.len(), data.len())
    );
    s.kill9();
    let s = Server::start(&args);
    assert_eq!(keys(s.admin_addr).len(), 50);
}

/// The whole records of a log image, parsed independently of the server:
/// `(start, end, key)` of each (Acquire records of version 2: type byte,
/// grant id, acquire time, then the key as `len u8 · bytes`).
fn acquires(data: &[u8]) -> Vec<(usize, usize, Vec<u8>)> {
    let end = layout(data).records_end;
    let (mut at, mut out) = (8, Vec::new());
    while at < end {
        let len = u16::from_le_bytes([data[at + 4], data[at + 5]]) as usize;
        assert_eq!(data[at + 8], 6, "an Acquire at {at}");
        let k = at + 8 + 1 + 16;
        out.push((
            at,
            at + 8 + len,
            data[k + 1..k + 1 + data[k] as usize].to_vec(),
        ));
        at += 8 + len;
    }
    out
}

/// One append of more than two pieces (a batch of ~150 KiB of Acquires,
/// gathered behind a delayed fdatasync, with every second write cut short),
/// then, for each piece the driver wrote it in, what a power cut during
/// that piece can leave: everything before the piece synced, nothing after
/// it written, and of the piece's own sectors one lost (its first or its
/// last). Every such log must restart as a torn tail: the records before
/// the lost sector kept, the rest dropped. The pieces are the driver's own
/// (`append_piece_end`): at most 64 KiB measured from the last fdatasync,
/// also across the short writes, and ending on sector boundaries.
#[test]
fn a_power_cut_in_any_piece_of_a_large_append_restarts_as_a_torn_tail() {
    use ringlock::wal::record::{append_piece_end, APPEND_PIECE_BYTES, SECTOR_BYTES};
    let dir = TempDir::new("prealloc-pieces");
    let path = dir.path("locks.wal");
    let path_s = path.to_str().expect("utf-8 path").to_string();
    // The default preallocation: the whole batch overwrites zeros in place.
    let default_prealloc = 1 << 20;
    let mut server = start_with(
        &path_s,
        Some("fsync_delay_ms=1000,short_write_every=2"),
        default_prealloc,
        &["--metrics-bind", "127.0.0.1:0"],
    );
    let metrics = server.metrics();
    // The first append (one record) holds the log for a second: every Lock
    // sent meanwhile goes out in the next append, as one batch.
    let mut first = server.connect();
    first.send(&frame(1, b"first", Some(b"s")));
    wait_metric(metrics, "ringlock_held_keys", 1.0);
    const BULK: usize = 520;
    let name = |i: usize, what: &str| {
        let mut n = format!("{what}-{i:05}-").into_bytes();
        n.resize(127, b'x');
        n
    };
    let mut conns: Vec<Conn> = (0..BULK)
        .map(|i| {
            let mut c = Conn::connect(server.lock_addr);
            c.send(&frame(1, &name(i, "piece"), Some(&name(i, "src"))));
            c
        })
        .collect();
    wait_metric(metrics, "ringlock_held_keys", (BULK + 1) as f64);
    assert_eq!(first.read_byte(), b'+');
    for c in &mut conns {
        assert_eq!(c.read_byte(), b'+');
    }
    assert_eq!(
        (
            metric(metrics, "ringlock_wal_batch_records_count"),
            metric(metrics, "ringlock_wal_batch_records_sum")
        ),
        (2.0, (BULK + 1) as f64),
        "the Locks should have gone out as one append after the first"
    );
    server.kill9();
    let image = std::fs::read(&path).expect("read the log");
    let records = acquires(&image);
    assert_eq!(records.len(), BULK + 1);
    let (append_at, end) = (records[0].1, records[BULK].1);
    assert!(
        SECTOR_BYTES - append_at % SECTOR_BYTES >= 4,
        "the append's first sector holds at least 4 of its bytes (docs/wal.md)"
    );
    let mut pieces = Vec::new();
    let mut at = append_at;
    while at < end {
        let to = append_piece_end(at as u64, end as u64) as usize;
        assert!(to - at <= APPEND_PIECE_BYTES);
        pieces.push((at, to));
        at = to;
    }
    assert!(pieces.len() >= 3, "{pieces:?}");
    for &(from, to) in &pieces {
        for lost in [from / SECTOR_BYTES, (to - 1) / SECTOR_BYTES] {
            let mut disk = image[..to].to_vec();
            disk.resize(image.len(), 0);
            let zero_from = (lost * SECTOR_BYTES).max(from);
            let zero_to = ((lost + 1) * SECTOR_BYTES).min(to);
            disk[zero_from..zero_to].iter_mut().for_each(|b| *b = 0);
            let kept = records
                .iter()
                .position(|&(s, e, _)| disk[s..e] != image[s..e])
                .expect("the lost sector held record bytes");
            std::fs::write(&path, &disk).expect("write the torn log");
            let what = format!("piece [{from}, {to}), lost sector {lost}");
            let mut s = start_with(&path_s, None, default_prealloc, &[]);
            let pre = s.startup_log.clone();
            assert_eq!(
                event_field(&pre, "recovery", "records"),
                Some(kept.to_string()),
                "{what}: {pre:?}"
            );
            assert!(
                pre.iter().any(|l| l.contains("event=torn_tail_dropped")),
                "{what}: {pre:?}"
            );
            let mut held: Vec<Vec<u8>> = keys(s.admin_addr).into_iter().map(|k| k.key).collect();
            held.sort();
            let mut want: Vec<Vec<u8>> = records[..kept].iter().map(|r| r.2.clone()).collect();
            want.sort();
            assert_eq!(held, want, "{what}");
            s.kill9();
        }
    }
}

/// Log lines of `server` until one contains `needle`, for at most
/// `within`; every line seen is returned (the last one matched).
fn lines_until(server: &Server, needle: &str, within: Duration) -> Vec<String> {
    let deadline = std::time::Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match server.log.recv_timeout(left) {
            Ok(l) => {
                let done = l.contains(needle);
                seen.push(l);
                if done {
                    return seen;
                }
            }
            Err(e) => panic!("no log line with {needle:?} ({e}); saw {seen:?}"),
        }
    }
}

/// A growth step still running when a compaction replaces the log file,
/// and failing then, must not switch growth off for the new file: its
/// failure is logged as concerning the replaced file, and the new file is
/// preallocated by the next step as usual. (Growth steps are delayed, so
/// two compactions land inside the first step; only that step fails.)
#[test]
fn a_failed_growth_step_of_a_replaced_file_leaves_growth_on_for_the_new_one() {
    let dir = TempDir::new("prealloc-stale-grow");
    let path = dir.path("locks.wal");
    let path_s = path.to_str().expect("utf-8 path").to_string();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ringlockd"));
    cmd.args(["--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"])
        .env("RINGLOCK_FAULTS", "grow_delay_ms=3000,fail_grow_at=1");
    let server = Server::spawn(
        cmd,
        &[
            "--threads",
            "1",
            "--data-path",
            &path_s,
            "--wal-preallocate-bytes",
            "4096",
            "--compact-floor-bytes",
            "1024",
            "--log-level",
            "debug",
        ],
    )
    .unwrap_or_else(|e| panic!("ringlockd did not start: {e}"));
    let mut c = server.connect();
    // Lock and unlock one key: the log outgrows its floor with nothing
    // live, so it is compacted every ~1 KiB. The first compaction's file is
    // not preallocated, so its first append starts growth step 1 (held
    // for 3 s); the second compaction replaces that file meanwhile.
    let mut compactions = 0;
    for round in 0.. {
        assert!(round < 10_000, "no second compaction");
        assert_eq!(c.lock(b"toggle", b"t"), b'+');
        assert_eq!(c.unlock(b"toggle"), b'+');
        while let Ok(l) = server.log.try_recv() {
            assert!(
                !l.contains("event=wal_preallocate_failed") && !l.contains("event=wal_grown"),
                "growth step 1 landed before the second compaction: {l}"
            );
            compactions += usize::from(l.contains("event=compaction_done"));
        }
        if compactions >= 2 {
            break;
        }
    }
    let failed = lines_until(
        &server,
        "event=wal_preallocate_failed",
        Duration::from_secs(20),
    );
    let failed = failed.last().expect("the matched line");
    assert!(
        failed.contains("file=replaced") && failed.contains("effect=none"),
        "{failed}"
    );
    // Locks of new keys (every record live: no further compaction). The
    // first append starts step 2 on the file in use; it lands and leaves
    // zeros ahead of the records.
    assert_eq!(c.lock(b"after-0", b"a"), b'+');
    lines_until(&server, "event=wal_grown", Duration::from_secs(20));
    assert_eq!(c.lock(b"after-1", b"a"), b'+');
    let l = layout(&std::fs::read(&path).expect("read the log"));
    assert!(
        l.file_len >= l.records_end + 4096 / 2,
        "no zeros kept ahead of the new file's records: {} of {}",
        l.records_end,
        l.file_len
    );
}

/// A growth step that fails on the file in use (ENOSPC, injected) turns
/// growth off for that file: the failure is logged, appends go on growing
/// the file themselves and are all acknowledged and replayed, and the next
/// start preallocates again.
#[test]
fn a_failed_growth_step_is_logged_and_appends_go_on() {
    let dir = TempDir::new("prealloc-grow-fails");
    let path = dir.path("locks.wal");
    let path_s = path.to_str().expect("utf-8 path").to_string();
    let mut server = start(&path_s, Some("fail_grow_at=1"));
    let mut c = server.connect();
    let start_len = layout(&std::fs::read(&path).expect("read the log")).file_len;
    let mut locked = Vec::new();
    let mut failed = None;
    while failed.is_none() || layout(&std::fs::read(&path).expect("read")).records_end < start_len {
        assert!(
            locked.len() < 10_000,
            "the log never outgrew its preallocation"
        );
        let k = format!("grown-by-appends-{}", locked.len()).into_bytes();
        assert_eq!(c.lock(&k, b"g"), b'+');
        locked.push(k);
        while let Ok(l) = server.log.try_recv() {
            if l.contains("event=wal_preallocate_failed") {
                failed = Some(l);
            }
        }
    }
    let failed = failed.expect("the growth step failed");
    assert!(
        failed.contains("file=current") && failed.contains("effect=appends_grow_the_file"),
        "{failed}"
    );
    // The records went past the preallocation (the loop's condition).
    let l = layout(&std::fs::read(&path).expect("read the log"));
    assert_eq!(l.records, locked.len());
    server.kill9();
    let s = start(&path_s, None);
    let mut held: Vec<Vec<u8>> = keys(s.admin_addr).into_iter().map(|k| k.key).collect();
    held.sort();
    locked.sort();
    assert_eq!(held, locked);
    let l = layout(&std::fs::read(&path).expect("read the log"));
    assert_eq!(
        l.file_len,
        (l.records_end + PREALLOC).next_multiple_of(4096)
    );
}

/// Resident memory of process `pid` in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// The zeros preallocation writes from cost no memory: the largest
/// preallocation (8 MiB written at start-up) leaves the server's resident
/// memory where it is without preallocation, give or take 1 MiB. (Zeros kept in the binary's read-only data would be
/// paged in from the executable by every preallocation.)
#[test]
fn the_zeros_preallocation_writes_from_cost_no_memory() {
    let dir = TempDir::new("prealloc-rss");
    let rss = |n: &str| {
        let path = dir.path(&format!("rss-{n}.wal"));
        let mut s = Server::start(&[
            "--threads",
            "1",
            "--data-path",
            path.to_str().expect("utf-8 path"),
            "--wal-preallocate-bytes",
            n,
        ]);
        let mut c = s.connect();
        assert_eq!(c.lock(b"rss", b"r"), b'+');
        let kib = rss_kib(s.pid());
        s.kill9();
        kib
    };
    let (off, max) = (rss("0"), rss("8388608"));
    assert!(
        max < off + 1024,
        "8 MiB of preallocation took {} KiB of resident memory ({max} KiB against {off} KiB)",
        max.saturating_sub(off)
    );
}
