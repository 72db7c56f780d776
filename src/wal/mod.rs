//! The write-ahead log: record format ([`record`], pure), group-commit
//! bookkeeping ([`mod@log`], pure) and recovery at start-up (this module: the
//! one place that reads the log file, before any loop runs).
//!
//! Rule: a reply produced when `tail_lsn > durable_lsn` is held until
//! `durable_lsn` reaches the `tail_lsn` of that moment. A failed write or
//! fdatasync voids every record past `durable_lsn`: the shard undoes their
//! effects, answers `-`, and the log is rewritten into a fresh file before
//! any further `+`. See docs/wal.md.

pub mod log;
pub mod plan;
pub mod record;
mod refusal;
pub mod set;
pub mod startup;

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use std::ops::ControlFlow;

use crate::core::{HeldRef, Now, Table};

use record::{RecordRef, Scanned, MAGIC};

pub use log::REWRITE_RETRY_US;

/// The files of an open log: the log itself, its directory (fsynced after
/// a rename) and the names the driver's chains use.
pub struct LogFiles {
    pub path: PathBuf,
    pub temp_path: CString,
    pub path_c: CString,
    pub file: File,
    pub dir: File,
    /// Valid bytes of `file` after recovery.
    pub file_len: u64,
    /// Bytes of `file` that exist: the records, then zeros written and
    /// synced by [`preallocate`] (recovery leaves it at `file_len`).
    pub alloc_len: u64,
}

impl LogFiles {
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
    pub fn dir_fd(&self) -> RawFd {
        self.dir.as_raw_fd()
    }
}

/// Closes a replaced log file off the event loop. The rename already
/// removed its name, so this last close frees the whole file (a truncate
/// that can take milliseconds on ext4); a background thread pays for it
/// instead of every request waiting behind it. Once per compaction, never
/// per request; if the thread cannot be started the file is closed here.
pub fn retire(old: File) {
    use std::sync::mpsc::{channel, Sender};
    use std::sync::{Mutex, OnceLock};
    static REAPER: OnceLock<Option<Mutex<Sender<File>>>> = OnceLock::new();
    let reaper = REAPER.get_or_init(|| {
        let (tx, rx) = channel::<File>();
        std::thread::Builder::new()
            .name("ringlock-wal-reaper".into())
            .spawn(move || {
                for f in rx {
                    drop(f);
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    match reaper {
        Some(tx) => {
            let tx = tx.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = tx.send(old) {
                drop(e.0);
            }
        }
        None => drop(old),
    }
}

/// Preallocated space ends on this boundary, so growth can write its zeros
/// with O_DIRECT (aligned offset, length and buffer).
pub const PREALLOCATE_ALIGN: u64 = 4096;

/// A background compaction writes its snapshot in pieces of this size,
/// each fdatasynced before the next is written. Written at once, a
/// snapshot of a million holders (~50 MB) is one long writeback, and every
/// append's fdatasync meanwhile waits for the disk to flush it (measured:
/// answers held 100–340 ms); in pieces, an append's flush waits for at most
/// one piece.
pub const SNAPSHOT_PIECE_BYTES: usize = 256 * 1024;

/// The zeros that preallocation writes from (start-up here, growth through
/// the ring in the driver): one read-only anonymous mapping of
/// [`crate::config::WAL_PREALLOCATE_MAX_BYTES`], made on first use and
/// kept for the process's life. Page-aligned, as O_DIRECT needs; nothing
/// can write it (a write would fault), so in-flight writes may share it;
/// and its pages are the kernel's shared zero page, so it costs no memory
/// however much of it is read. (A static array of zeros sits in the
/// binary's read-only data: 8 MiB more executable, paged in from it by
/// every preallocation and counted in the server's resident memory.)
pub fn zeros() -> io::Result<&'static [u8]> {
    use std::sync::OnceLock;
    const LEN: usize = crate::config::WAL_PREALLOCATE_MAX_BYTES as usize;
    static MAP: OnceLock<Result<usize, i32>> = OnceLock::new();
    let map = MAP.get_or_init(|| {
        // SAFETY: a new private anonymous mapping, no memory of ours is
        // passed; it is never unmapped (unmapping it would leave in-flight
        // growth writes and the 'static slice below pointing at nothing).
        // Every durable test server maps it (tests/wal_prealloc_crash.rs).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM))
        } else {
            Ok(p as usize)
        }
    });
    match *map {
        // SAFETY: LEN readable bytes (an anonymous mapping reads as zeros)
        // that stay mapped for the process's life and that nothing can
        // write (PROT_READ), so a shared 'static slice over them is sound.
        // Every durable test server preallocates from it
        // (tests/wal_prealloc_crash.rs checks the zeros on disk and that
        // they cost no resident memory).
        Ok(addr) => Ok(unsafe { std::slice::from_raw_parts(addr as *const u8, LEN) }),
        Err(e) => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Extends `file` from `from` (its end) with at least `bytes` of zeros,
/// up to the next [`PREALLOCATE_ALIGN`] boundary, written and fdatasynced,
/// so appends into that space overwrite zeros: their fdatasync then has no
/// file size and no unwritten extent to commit. A `fallocate` first asks
/// for the space in one piece; a file system without it still gets the
/// zeros. Returns the new end. Blocking: start-up only.
pub fn preallocate(file: &File, from: u64, bytes: u64) -> io::Result<u64> {
    let to = (from + bytes).next_multiple_of(PREALLOCATE_ALIGN);
    // SAFETY: a plain syscall on a descriptor `file` keeps open; no memory
    // is passed. On a closed or reused fd it would allocate space in the
    // wrong file; start-up of every durable test server runs it and
    // tests/wal_prealloc_crash.rs checks the zeros land in the log.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, from as i64, (to - from) as i64) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(e);
        }
    }
    use std::os::unix::fs::FileExt;
    let zeros = zeros()?;
    // Up to the next boundary, that can be more than the zeros at hand.
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64);
        file.write_all_at(&zeros[..n as usize], at)?;
        at += n;
    }
    file.sync_data()?;
    Ok(to)
}

/// Recovery outcome, for the start-up log line.
#[derive(Debug, Default)]
pub struct Recovered {
    pub records: usize,
    pub held: usize,
    /// Written bytes past the last whole record (a torn write), dropped.
    pub torn_bytes: u64,
    /// Zeros after everything written: preallocated space (or an append
    /// whose size reached the disk before its data), dropped and
    /// preallocated again.
    pub zero_tail_bytes: u64,
    pub truncated_at: Option<u64>,
    pub file_bytes: u64,
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("paths from the command line contain no NUL")
}

fn fsync_dir(dir: &File) -> io::Result<()> {
    dir.sync_all()
}

/// Opens (or creates) the log at `path`, replays it into `table`, and
/// truncates a torn tail. Refuses corruption unless `truncate_at` names
/// exactly the corrupt offset, and refuses `truncate_at` on a log that has
/// no corruption there. Blocking: runs before the loop starts.
pub fn open(
    path: &Path,
    table: &mut Table,
    truncate_at: Option<u64>,
    now: Now,
) -> Result<(LogFiles, Recovered), String> {
    open_with(path, table, Truncate::exactly(truncate_at), now)
}

/// Start-up's order of work on a log, before anything is served from it.
/// After a crash of the process (kill -9) the page cache still holds
/// records whose fdatasync never completed; replay reads them, and the
/// restarted server answers from what it replayed. So the log and its
/// directory are synced *first*: a power cut after the restart cannot take
/// back what the server already answered from (PostgreSQL syncs its data
/// directory before crash recovery for the same reason). [`open`] runs
/// these steps in order; the simulator (`tests/sim`) runs the same list
/// over its disk model and fails when a restarted shard serves from bytes
/// that are not durable.
pub const STARTUP: [Startup; 3] = [Startup::SyncLog, Startup::SyncDir, Startup::Replay];

/// One step of [`STARTUP`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Startup {
    /// fsync the log file: what the page cache holds becomes durable.
    SyncLog,
    /// fsync its directory: the file's name, and a rename that finished.
    SyncDir,
    /// Replay the log into the table.
    Replay,
}

/// Hands the log file of `len` bytes to `replay` through a read-only map;
/// the valid length.
fn replay_file(
    file: &File,
    len: u64,
    shown: &str,
    replay: &mut dyn FnMut(&[u8]) -> Result<u64, String>,
) -> Result<u64, String> {
    if len == 0 {
        return replay(&[]);
    }
    // SAFETY: the map is read-only and dropped before the file is
    // modified; nothing else writes the log while we start (a second
    // server on the same path is the operator's error — see docs). A
    // write or truncation while mapped would make replay read torn
    // records (or fault past the end); tests/wal_recovery.rs and
    // tests/wal_crash.rs replay real logs through this map.
    // Populated up front: one pass reads it all, and faulting it in
    // page by page would cost more than the replay.
    let map = unsafe { memmap2::MmapOptions::new().populate().map(file) }
        .map_err(|e| format!("{shown}: cannot map log: {e}"))?;
    replay(&map)
}

/// What `--wal-truncate-at` means for one log.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Truncate {
    at: Option<u64>,
    /// A clean log is refused when `at` is given (one log: the operator
    /// named this one). Several logs: `at` applies to the one that is
    /// corrupt, and a clean log is opened as if it was not given.
    strict: bool,
}

impl Truncate {
    pub(crate) fn exactly(at: Option<u64>) -> Truncate {
        Truncate { at, strict: true }
    }
    pub(crate) fn if_corrupt(at: Option<u64>) -> Truncate {
        Truncate { at, strict: false }
    }
}

pub(crate) fn open_with(
    path: &Path,
    table: &mut Table,
    truncate: Truncate,
    now: Now,
) -> Result<(LogFiles, Recovered), String> {
    let shown = path.display().to_string();
    let mut rec = None;
    let files = open_file(path, MAGIC, &mut |data| {
        let (valid, r) = replay_with(data, &shown, table, truncate, now)?;
        rec = Some(r);
        Ok(valid)
    })?;
    let rec = rec.expect("STARTUP replays the log");
    Ok((files, rec))
}

/// Opens (or creates) a log file and runs [`STARTUP`] on it: fsync the
/// file and its directory, then `replay` over the file's bytes (mapped
/// read-only), which returns the length of its valid prefix. A file with
/// less than `new_image` valid is started afresh as `new_image` (written
/// and synced with its directory); a torn tail is truncated. Shared by a
/// single node's log and a cluster node's (whose image is different).
pub fn open_file(
    path: &Path,
    new_image: &[u8],
    replay: &mut dyn FnMut(&[u8]) -> Result<u64, String>,
) -> Result<LogFiles, String> {
    let shown = path.display();
    let dir_path = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dir = File::open(&dir_path).map_err(|e| {
        format!(
            "{}: cannot open the log's directory: {e}",
            dir_path.display()
        )
    })?;
    let mut temp = path.as_os_str().to_owned();
    temp.push(".compact.tmp");
    let temp = PathBuf::from(temp);
    // A rewrite interrupted before its rename: the old log is intact.
    if temp.exists() {
        std::fs::remove_file(&temp)
            .map_err(|e| format!("{}: cannot remove stale temp file: {e}", temp.display()))?;
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("{shown}: cannot open log: {e}"))?;
    let len = file.metadata().map_err(|e| format!("{shown}: {e}"))?.len();
    let mut replayed = None;
    for step in STARTUP {
        match step {
            Startup::SyncLog => file
                .sync_all()
                .map_err(|e| format!("{shown}: fsync before replay failed: {e}"))?,
            Startup::SyncDir => fsync_dir(&dir)
                .map_err(|e| format!("{}: fsync before replay failed: {e}", dir_path.display()))?,
            Startup::Replay => {
                replayed = Some(replay_file(&file, len, &shown.to_string(), replay)?)
            }
        }
    }
    let valid_len = replayed.expect("STARTUP replays the log");
    let mut file_len = valid_len;
    if valid_len < new_image.len() as u64 {
        // New, or torn during creation: start a fresh log.
        file.set_len(0).map_err(|e| format!("{shown}: {e}"))?;
        use std::io::{Seek, SeekFrom};
        file.seek(SeekFrom::Start(0))
            .map_err(|e| format!("{shown}: {e}"))?;
        file.write_all(new_image)
            .map_err(|e| format!("{shown}: cannot write log header: {e}"))?;
        file_len = new_image.len() as u64;
        file.sync_all()
            .map_err(|e| format!("{shown}: fsync failed: {e}"))?;
        fsync_dir(&dir).map_err(|e| format!("{}: fsync failed: {e}", dir_path.display()))?;
    } else if valid_len < len {
        file.set_len(valid_len)
            .map_err(|e| format!("{shown}: cannot truncate torn tail: {e}"))?;
        file.sync_all()
            .map_err(|e| format!("{shown}: fsync failed: {e}"))?;
    }
    Ok(LogFiles {
        path: path.to_path_buf(),
        temp_path: cstr(&temp),
        path_c: cstr(path),
        file,
        dir,
        file_len,
        alloc_len: file_len,
    })
}

/// Replays a log image into `table`: the pure half of recovery, shared by
/// start-up (over the mapped file) and the simulator (over its disk).
/// Returns the length of the valid prefix (a torn tail is dropped) or why
/// the log must not be used. `shown` names the log in messages.
///
/// One pass: each record is applied as the scan reaches it, its names
/// borrowed from `data`, so nothing is allocated per record. When the log
/// is refused, `table` holds what the records before the refusal made of
/// it; replaying the same log again over that is harmless (each key ends
/// as its last record says).
pub fn replay(
    data: &[u8],
    shown: &str,
    table: &mut Table,
    truncate_at: Option<u64>,
    now: Now,
) -> Result<(u64, Recovered), String> {
    replay_with(data, shown, table, Truncate::exactly(truncate_at), now)
}

fn replay_with(
    data: &[u8],
    shown: &str,
    table: &mut Table,
    truncate: Truncate,
    now: Now,
) -> Result<(u64, Recovered), String> {
    let mut rec = Recovered {
        file_bytes: data.len() as u64,
        ..Default::default()
    };
    let mut over_limit = false;
    let apply = |r: RecordRef<'_>| {
        let flow = apply_replayed(table, r, now);
        over_limit |= flow.is_break();
        flow
    };
    let scanned = if data.is_empty() {
        Scanned::Ok {
            records: 0,
            valid_len: 0,
            torn_bytes: 0,
        }
    } else {
        record::scan_each(data, apply)
    };
    let valid_len = match scanned {
        Scanned::Ok {
            records,
            valid_len,
            torn_bytes,
        } => {
            if let (Some(t), true) = (truncate.at, truncate.strict) {
                return Err(format!(
                    "{shown}: --wal-truncate-at {t} given, but the log has no corruption at that offset; refusing to truncate"
                ));
            }
            rec.records = records;
            split_dropped_tail(data, valid_len, torn_bytes, &mut rec);
            valid_len
        }
        Scanned::BadMagic => {
            return Err(format!(
                "{shown}: not a ringlock log (bad magic); refusing to start. Move the file away or point --data-path elsewhere"
            ))
        }
        Scanned::Stopped { .. } => {
            debug_assert!(over_limit);
            return Err(format!(
                "{shown}: the log holds more keys than --max-keys allows; raise the limit"
            ));
        }
        Scanned::Corrupt {
            offset,
            reason,
            records_before,
        } => {
            if truncate.at != Some(offset) {
                let intact = &data[..(offset as usize).min(data.len())];
                return Err(refusal::corrupt_log(
                    shown,
                    offset,
                    reason,
                    records_before,
                    intact,
                ));
            }
            // Everything before the offset was applied, nothing after.
            rec.truncated_at = Some(offset);
            rec.records = records_before;
            offset
        }
    };
    rec.held = table.held_keys();
    Ok((valid_len, rec))
}

/// Applies one record of a single node's log to `table` at start-up;
/// `Break` when the table has no room for a holder (`--max-keys`).
fn apply_replayed(table: &mut Table, r: RecordRef<'_>, now: Now) -> ControlFlow<()> {
    match r {
        RecordRef::Acquire(h) if h.mode == crate::core::HoldMode::Session => {
            // Its session did not survive: the key is free (of a
            // shared or semaphore key, this holder's place, after the
            // record removed the holders it excludes), the grant id
            // (fencing token) still counts.
            if h.access == crate::core::Access::Exclusive {
                table.restore_release(h.key, now);
            } else {
                let h = HeldRef { session: 0, ..h };
                table.restore(h, now);
                table.restore_release_grant(h.key, h.grant_id, now);
            }
            table.raise_next_grant_id(h.grant_id + 1);
        }
        RecordRef::Acquire(h) => {
            // A single node keeps no session across a restart: a
            // replicated session's lease or persistent hold (only in a
            // cluster's log, never here) would be nobody's.
            let h = HeldRef { session: 0, ..h };
            if !table.restore(h, now) {
                return ControlFlow::Break(());
            }
        }
        RecordRef::SessionOpen { session, .. } => {
            table.raise_next_grant_id((session & (crate::core::REPLICATED_SESSION - 1)) + 1)
        }
        RecordRef::SessionEnd { .. } => {}
        RecordRef::Release { key, grant_id } => table.restore_release_record(key, grant_id, now),
        RecordRef::GrantMark { next_grant_id } => table.raise_next_grant_id(next_grant_id),
        RecordRef::Extend {
            key,
            grant_id,
            expires_unix_ms,
        } => {
            let left_ms = expires_unix_ms.saturating_sub(now.unix_ms);
            let mono_us = now.mono_us.saturating_add(left_ms.saturating_mul(1000));
            table.set_expiry(key, grant_id, expires_unix_ms, mono_us);
        }
    }
    ControlFlow::Continue(())
}

/// Splits the tail dropped after `valid_len` (`torn_bytes` long) into what
/// was written (torn) and the zeros after it (preallocated space, not
/// damage). Found from the end, so it costs only the length of the zero
/// tail.
fn split_dropped_tail(data: &[u8], valid_len: u64, torn_bytes: u64, rec: &mut Recovered) {
    let written_end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1) as u64;
    let zeros_from = written_end.max(valid_len);
    rec.zero_tail_bytes = (data.len() as u64).saturating_sub(zeros_from);
    rec.torn_bytes = torn_bytes - rec.zero_tail_bytes;
}

/// Applies one replicated entry's records to a replica's table (cluster
/// mode; pure). `leader_unix_ms` is the proposing leader's clock when it
/// proposed the entry: a deadline in a record is read as the duration it
/// had left then, counted on this node's monotonic clock from `now` (when
/// the entry is applied, which is no earlier than when it was decided), so
/// clock differences between nodes never shorten a lease. A session hold
/// is kept as a session hold owned by nobody: only the leader knows its
/// session, and a new leader turns it into a lease when it starts serving
/// ([`Table::expire_orphans`]). Refuses a batch that does not parse (it was
/// checked before it was proposed: damage here is a bug or a corrupt log).
pub fn apply_replicated(
    records: &[u8],
    leader_unix_ms: u64,
    table: &mut Table,
    now: Now,
) -> Result<usize, String> {
    let rel = Now {
        mono_us: now.mono_us,
        unix_ms: leader_unix_ms,
    };
    let mut over_limit = false;
    let n = record::each_in_batch(records, |r| match r {
        RecordRef::Acquire(h) => {
            if !table.restore(h, rel) {
                over_limit = true;
            } else if h.mode == crate::core::HoldMode::Lease {
                // Kept on this node's own wall clock, so that a snapshot it
                // takes later reads the same time left.
                let left_ms = h.expires_unix_ms.saturating_sub(leader_unix_ms);
                let mono_us = now.mono_us.saturating_add(left_ms.saturating_mul(1000));
                table.set_expiry(
                    h.key,
                    h.grant_id,
                    now.unix_ms.saturating_add(left_ms),
                    mono_us,
                );
            }
        }
        RecordRef::Release { key, grant_id } => table.restore_release_record(key, grant_id, rel),
        RecordRef::SessionOpen {
            session,
            keepalive_ms,
        } => table.session_opened(session, keepalive_ms),
        RecordRef::SessionEnd { session } => {
            table.session_closed(session);
        }
        RecordRef::GrantMark { next_grant_id } => table.raise_next_grant_id(next_grant_id),
        RecordRef::Extend {
            key,
            grant_id,
            expires_unix_ms,
        } => {
            let left_ms = expires_unix_ms.saturating_sub(leader_unix_ms);
            let mono_us = now.mono_us.saturating_add(left_ms.saturating_mul(1000));
            table.set_expiry(key, grant_id, now.unix_ms.saturating_add(left_ms), mono_us);
        }
    })
    .map_err(|why| format!("a replicated entry does not parse: {why}"))?;
    if over_limit {
        return Err("a replicated entry holds more keys than --max-keys allows".into());
    }
    Ok(n)
}
