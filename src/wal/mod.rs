//! The write-ahead log: group commit state, recovery, compaction planning.
//!
//! Ownership: the event loop owns the [`Wal`]; this module never blocks in
//! the steady state. It keeps the log's buffers and sequence numbers and
//! tells the loop what to submit; the loop submits write+fdatasync through
//! its ring and reports completions back.
//!
//! Sequence numbers (LSN): every appended record gets the next LSN.
//! - `tail_lsn`: the last record appended (in memory).
//! - `durable_lsn`: the last record known durable (write + fdatasync done).
//! - One batch is in flight at a time; records appended meanwhile gather in
//!   `filling` and go out as the next batch as soon as the flight lands.
//!
//! Rule: a reply produced when `tail_lsn > durable_lsn` is held until
//! `durable_lsn` reaches the `tail_lsn` of that moment (DURABILITY.md rules
//! 1–3). A failed write or fdatasync voids every record past `durable_lsn`
//! (rule 4): the loop undoes their effects, answers `-`, and the log is
//! rewritten into a fresh file (compaction) before any further `+`.

pub mod record;
mod refusal;

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::core::{HeldKey, Name, Now, Table};
use record::{Record, Scan, MAGIC};

/// While the log is broken (a write or fsync failed and the rewrite did
/// too), a rewrite is retried this often.
pub const REWRITE_RETRY_US: u64 = 1_000_000;

/// Test-only fault injection (`RINGLOCK_FAULTS`, see docs/wal.md): makes
/// the n-th write short or fail with ENOSPC, or the n-th fdatasync fail
/// with EIO. Counting starts at 1 and covers appends and rewrites.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    pub short_write_every: u64,
    pub fail_write_at: Vec<u64>,
    pub fail_fsync_at: Vec<u64>,
    /// The n-th write of a background compaction (snapshot or finishing)
    /// fails with ENOSPC; counted separately from `writes`.
    pub fail_compact_write_at: Vec<u64>,
    /// Every append's fdatasync starts this long after its write (a linked
    /// timeout in the chain): widens the window in which answers wait for
    /// the log, so tests can act inside it deterministically.
    pub fsync_delay: Option<Box<io_uring::types::Timespec>>,
    compact_writes: u64,
    writes: u64,
    fsyncs: u64,
}

impl Faults {
    /// Parses `short_write_every=N,fail_write_at=N,fail_fsync_at=N` (the
    /// last two may repeat).
    pub fn parse(spec: &str) -> Result<Faults, String> {
        let mut f = Faults::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("fault {part:?}: expected name=number"))?;
            let n: u64 = v
                .parse()
                .map_err(|_| format!("fault {part:?}: not a number"))?;
            match k {
                "short_write_every" => f.short_write_every = n,
                "fail_write_at" => f.fail_write_at.push(n),
                "fail_fsync_at" => f.fail_fsync_at.push(n),
                "fail_compact_write_at" => f.fail_compact_write_at.push(n),
                "fsync_delay_ms" => {
                    f.fsync_delay = Some(Box::new(
                        io_uring::types::Timespec::new()
                            .sec(n / 1000)
                            .nsec(((n % 1000) * 1_000_000) as u32),
                    ))
                }
                _ => return Err(format!("unknown fault {k:?}")),
            }
        }
        Ok(f)
    }

    /// Called per submitted write: how many of `len` bytes to submit, and
    /// the write's number (writes of the append and compaction chains may
    /// be in flight together, so each chain keeps its own number).
    pub fn write_len(&mut self, len: usize) -> (usize, u64) {
        self.writes += 1;
        if self.short_write_every > 0
            && self.writes.is_multiple_of(self.short_write_every)
            && len > 1
        {
            return (len / 2, self.writes);
        }
        (len, self.writes)
    }

    /// Called per submitted compaction write: whether it is to fail.
    pub fn compact_write_fails(&mut self) -> bool {
        self.compact_writes += 1;
        self.fail_compact_write_at.contains(&self.compact_writes)
    }

    /// Whether write number `no` will be failed.
    pub fn write_will_fail(&self, no: u64) -> bool {
        self.fail_write_at.contains(&no)
    }

    /// Called per write completion: the result to act on.
    pub fn write_result(&mut self, res: i32, no: u64) -> i32 {
        if self.fail_write_at.contains(&no) {
            return -libc::ENOSPC;
        }
        res
    }

    /// Called per fdatasync completion (the counter advances here).
    pub fn fsync_result(&mut self, res: i32) -> i32 {
        self.fsyncs += 1;
        if self.fail_fsync_at.contains(&self.fsyncs) && res >= 0 {
            return -libc::EIO;
        }
        res
    }
}

/// What is in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flight {
    None,
    /// An append of `flight` at `file_len`, covering up to `lsn`.
    Append {
        lsn: u64,
    },
    /// A rewrite of the whole table into the temp file, covering up to `lsn`.
    Rewrite {
        lsn: u64,
        temp_fd: RawFd,
    },
}

/// Phases of a background compaction (the log is healthy; appends to the
/// old log go on meanwhile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactPhase {
    /// Writing the snapshot of the table into the temp file.
    Snapshot,
    /// The snapshot is durable in the temp file; waiting for no append to
    /// be in flight.
    Ready,
    /// Writing the records appended since the snapshot (`carry`) into the
    /// temp file, then fdatasync, rename over the log, fsync the directory.
    /// Appends wait for this short step: new records go to the new file.
    Finishing,
}

/// A background compaction: the whole table is written to a temp file
/// while group commit goes on in the old log; every record appended after
/// the snapshot is also kept in `carry`; at the end the carry is written
/// after the snapshot and the temp file is renamed over the log. A crash at
/// any step leaves the old log (complete) or the new one (complete).
pub struct Compaction {
    pub temp_fd: RawFd,
    pub phase: CompactPhase,
    /// Bytes of the current phase's write (snapshot, then carry).
    pub buf: Vec<u8>,
    pub written: usize,
    /// Bytes of the temp file that are durable (the snapshot).
    pub temp_len: u64,
    /// Records appended after the snapshot, as written to the old log.
    pub carry: Vec<u8>,
    pub carry_records: u64,
    pub snapshot_records: u64,
    /// The LSN the new file covers once finished.
    pub finish_lsn: u64,
    pub error: Option<i32>,
    /// The current write was submitted alone (injected fault).
    pub short: bool,
    pub write_no: u64,
    /// The current write is made to fail (fault injection).
    pub fail_injected: bool,
    /// A chain of this compaction is in flight (its buffers are the
    /// kernel's until the chain's last completion).
    pub inflight: bool,
    /// Abandoned while in flight: clean up at the chain's last completion.
    pub aborted: bool,
    pub started_us: u64,
    /// The rename happened (the temp path no longer exists).
    pub renamed: bool,
}

pub struct Wal {
    pub path: PathBuf,
    pub temp_path: CString,
    pub path_c: CString,
    pub file: File,
    pub dir: File,
    /// Bytes of the current file that are written (and durable once the
    /// in-flight batch lands).
    pub file_len: u64,
    pub filling: Vec<u8>,
    pub filling_records: u64,
    pub flight_buf: Vec<u8>,
    /// Bytes of `flight_buf` the kernel has confirmed written.
    pub flight_written: usize,
    pub flight_records: u64,
    pub flight: Flight,
    /// The write in flight was shortened or will be failed by an injected
    /// fault: it was submitted without the rest of its chain, as the kernel
    /// would have cancelled it, and its completion concludes the flight.
    pub flight_short: bool,
    pub flight_error: Option<i32>,
    pub flight_started_us: u64,
    pub tail_lsn: u64,
    pub durable_lsn: u64,
    /// Bytes the live holders' records take (what a rewrite would write).
    pub live_bytes: u64,
    /// A write or fsync failed: rewrite before any further `+`.
    pub broken: bool,
    pub retry_at_us: u64,
    pub faults: Faults,
    /// Below this size the log is never compacted.
    pub compact_floor_bytes: u64,
    /// Write number of the in-flight append (fault injection).
    pub flight_write_no: u64,
    pub compaction: Option<Compaction>,
    /// After a failed background compaction, the next one waits until then.
    pub compact_retry_after_us: u64,
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

/// Recovery outcome, for the start-up log line.
#[derive(Debug, Default)]
pub struct Recovered {
    pub records: usize,
    pub held: usize,
    pub torn_bytes: u64,
    pub truncated_at: Option<u64>,
    pub file_bytes: u64,
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("paths from the command line contain no NUL")
}

fn fsync_dir(dir: &File) -> io::Result<()> {
    dir.sync_all()
}

/// Size of the Acquire record for a holder (tracks `live_bytes`).
pub fn acquire_len(h: &HeldKey) -> u64 {
    let mut ep = [0u8; 64];
    let n = {
        let mut cur = io::Cursor::new(&mut ep[..]);
        write!(cur, "{}", h.endpoint).expect("a socket address fits in 64 bytes");
        cur.position()
    };
    (record::HEADER + 1 + 16 + 3) as u64 + h.key.len() as u64 + h.source.len() as u64 + n
}

impl Wal {
    /// Opens (or creates) the log at `path`, replays it into `table`, and
    /// truncates a torn tail. Refuses corruption unless `truncate_at` names
    /// exactly the corrupt offset. Blocking: runs before the loop starts.
    pub fn open(
        path: &Path,
        table: &mut Table,
        truncate_at: Option<u64>,
        now: Now,
        faults: Faults,
    ) -> Result<(Wal, Recovered), String> {
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
        let mut rec = Recovered {
            file_bytes: len,
            ..Default::default()
        };
        let scan = if len == 0 {
            Scan::Ok {
                records: Vec::new(),
                valid_len: 0,
                torn_bytes: 0,
            }
        } else {
            // SAFETY: the map is read-only and dropped before the file is
            // modified; nothing else writes the log while we start (a second
            // server on the same path is the operator's error — see docs).
            let map = unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| format!("{shown}: cannot map log: {e}"))?;
            record::scan(&map)
        };
        let (records, valid_len) = match scan {
            Scan::Ok {
                records,
                valid_len,
                torn_bytes,
            } => {
                rec.torn_bytes = torn_bytes;
                (records, valid_len)
            }
            Scan::BadMagic => {
                return Err(format!(
                    "{shown}: not a ringlock log (bad magic); refusing to start. Move the file away or point --data-path elsewhere"
                ))
            }
            Scan::Corrupt {
                offset,
                reason,
                records_before,
            } => {
                if truncate_at != Some(offset) {
                    // SAFETY: as above; the map is dropped before returning.
                    let map = unsafe { memmap2::Mmap::map(&file) }
                        .map_err(|e| format!("{shown}: cannot map log: {e}"))?;
                    let intact = &map[..(offset as usize).min(map.len())];
                    return Err(refusal::corrupt_log(
                        &shown.to_string(),
                        offset,
                        reason,
                        records_before,
                        intact,
                    ));
                }
                rec.truncated_at = Some(offset);
                let map = unsafe { memmap2::Mmap::map(&file) }
                    .map_err(|e| format!("{shown}: cannot map log: {e}"))?;
                match record::scan(&map[..offset as usize]) {
                    Scan::Ok { records, .. } => (records, offset),
                    _ => unreachable!("the prefix before the first corruption scans clean"),
                }
            }
        };
        if let Some(t) = truncate_at {
            if rec.truncated_at.is_none() {
                return Err(format!(
                    "{shown}: --wal-truncate-at {t} given, but the log has no corruption at that offset; refusing to truncate"
                ));
            }
        }
        for r in &records {
            match r {
                Record::Acquire(h) => {
                    if !table.restore_holder(h, now) {
                        return Err(format!(
                            "{shown}: the log holds more keys than --max-keys allows; raise the limit"
                        ));
                    }
                }
                Record::Release { key, .. } => table.restore_release(key, now),
                Record::GrantMark { next_grant_id } => table.raise_next_grant_id(*next_grant_id),
            }
        }
        rec.records = records.len();
        rec.held = table.held_keys();
        let mut file_len = valid_len;
        if valid_len < MAGIC.len() as u64 {
            // New, or torn during creation: start a fresh log.
            file.set_len(0).map_err(|e| format!("{shown}: {e}"))?;
            use std::io::{Seek, SeekFrom};
            file.seek(SeekFrom::Start(0))
                .map_err(|e| format!("{shown}: {e}"))?;
            file.write_all(MAGIC)
                .map_err(|e| format!("{shown}: cannot write log header: {e}"))?;
            file_len = MAGIC.len() as u64;
            file.sync_all()
                .map_err(|e| format!("{shown}: fsync failed: {e}"))?;
            fsync_dir(&dir).map_err(|e| format!("{}: fsync failed: {e}", dir_path.display()))?;
        } else if valid_len < len {
            file.set_len(valid_len)
                .map_err(|e| format!("{shown}: cannot truncate torn tail: {e}"))?;
            file.sync_all()
                .map_err(|e| format!("{shown}: fsync failed: {e}"))?;
        }
        let live_bytes = table.held_list().iter().map(acquire_len).sum();
        Ok((
            Wal {
                path: path.to_path_buf(),
                temp_path: cstr(&temp),
                path_c: cstr(path),
                file,
                dir,
                file_len,
                filling: Vec::with_capacity(64 * 1024),
                filling_records: 0,
                flight_buf: Vec::with_capacity(64 * 1024),
                flight_written: 0,
                flight_records: 0,
                flight: Flight::None,
                flight_short: false,
                flight_error: None,
                flight_started_us: 0,
                tail_lsn: 0,
                durable_lsn: 0,
                live_bytes,
                broken: false,
                retry_at_us: 0,
                faults,
                compact_floor_bytes: 1 << 20,
                flight_write_no: 0,
                compaction: None,
                compact_retry_after_us: 0,
            },
            rec,
        ))
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    pub fn dir_fd(&self) -> RawFd {
        self.dir.as_raw_fd()
    }

    pub fn pending(&self) -> bool {
        self.tail_lsn > self.durable_lsn
    }

    /// Copies the record appended at `start` of `filling` into a running
    /// compaction's carry (before its finishing step).
    fn carry_from(&mut self, start: usize) {
        if let Some(c) = self.compaction.as_mut() {
            if c.phase != CompactPhase::Finishing && !c.aborted {
                c.carry.extend_from_slice(&self.filling[start..]);
                c.carry_records += 1;
            }
        }
    }

    pub fn append_acquire(&mut self, h: &HeldKey) -> u64 {
        let start = self.filling.len();
        record::encode_acquire(h, &mut self.filling);
        self.carry_from(start);
        self.live_bytes += acquire_len(h);
        self.filling_records += 1;
        self.tail_lsn += 1;
        self.tail_lsn
    }

    pub fn append_release(&mut self, key: &Name, grant_id: u64, holder: &HeldKey) -> u64 {
        let start = self.filling.len();
        record::encode_release(key, grant_id, &mut self.filling);
        self.carry_from(start);
        self.live_bytes = self.live_bytes.saturating_sub(acquire_len(holder));
        self.filling_records += 1;
        self.tail_lsn += 1;
        self.tail_lsn
    }

    /// True when the log must be rewritten before any further `+` (after
    /// an I/O failure): a blocking rewrite.
    pub fn should_rewrite(&self) -> bool {
        self.broken
    }

    /// True when a background compaction should start: the log is past the
    /// floor and twice what the live holders need.
    pub fn should_compact(&self, now_us: u64) -> bool {
        !self.broken
            && self.compaction.is_none()
            && now_us >= self.compact_retry_after_us
            && self.file_len > self.compact_floor_bytes
            && self.file_len > 2 * (self.live_bytes + MAGIC.len() as u64)
    }

    fn open_temp(&self) -> io::Result<RawFd> {
        // SAFETY: valid C string; flags create a new private file.
        let fd = unsafe {
            libc::open(
                self.temp_path.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
                0o644,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }

    /// Starts a background compaction: snapshots the table (which reflects
    /// every record up to `tail_lsn`) into a buffer for the temp file.
    /// Opening the temp file is one short blocking syscall per compaction.
    pub fn start_compaction(&mut self, table: &Table, now_us: u64) -> io::Result<()> {
        debug_assert!(self.compaction.is_none());
        let temp_fd = self.open_temp()?;
        let mut buf = Vec::with_capacity(self.live_bytes as usize + MAGIC.len());
        buf.extend_from_slice(MAGIC);
        record::encode_grant_mark(table.next_grant_id(), &mut buf);
        let mut records = 0;
        table.for_each_held(|h| {
            record::encode_acquire(h, &mut buf);
            records += 1;
        });
        self.compaction = Some(Compaction {
            temp_fd,
            phase: CompactPhase::Snapshot,
            buf,
            written: 0,
            temp_len: 0,
            carry: Vec::with_capacity(64 * 1024),
            carry_records: 0,
            snapshot_records: records,
            finish_lsn: 0,
            error: None,
            short: false,
            write_no: 0,
            fail_injected: false,
            inflight: false,
            aborted: false,
            started_us: now_us,
            renamed: false,
        });
        Ok(())
    }

    /// The snapshot is durable in the temp file.
    pub fn compaction_snapshot_done(&mut self) {
        let c = self.compaction.as_mut().expect("a compaction");
        c.temp_len = c.buf.len() as u64;
        c.buf.clear();
        c.written = 0;
        c.phase = CompactPhase::Ready;
    }

    /// Moves the carry (which includes every record still in `filling`)
    /// into the finishing write. Only with no append in flight: everything
    /// before the carry is durable in the old log and in the snapshot.
    pub fn start_finishing(&mut self) {
        debug_assert!(self.flight == Flight::None);
        let tail = self.tail_lsn;
        let c = self.compaction.as_mut().expect("a compaction");
        std::mem::swap(&mut c.buf, &mut c.carry);
        c.carry.clear();
        c.written = 0;
        c.finish_lsn = tail;
        c.phase = CompactPhase::Finishing;
        // These records now live only in the new file.
        self.filling.clear();
        self.filling_records = 0;
    }

    /// The new file is complete, durable and named: switch to it. Returns
    /// the old log's handle (to close) and the compaction (for reporting).
    pub fn finish_done(&mut self) -> (File, Compaction) {
        let c = self.compaction.take().expect("a compaction");
        // SAFETY: temp_fd was opened by start_compaction and is owned from
        // here on by the File.
        let new = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(c.temp_fd) };
        let old = std::mem::replace(&mut self.file, new);
        self.file_len = c.temp_len + c.buf.len() as u64;
        self.durable_lsn = self.durable_lsn.max(c.finish_lsn);
        (old, c)
    }

    /// One `compaction_start` line: a `background` compaction or a
    /// `blocking` rewrite after an I/O error.
    pub fn log_compaction_start(&self, mode: &str) {
        crate::log!(
            crate::log::Level::Info,
            "compaction_start",
            "path={} log_bytes={} live_bytes={} broken={} mode={}",
            self.path.display(),
            self.file_len,
            self.live_bytes,
            self.broken,
            mode
        );
    }

    /// Closes a temp file that no in-flight op references, and removes it
    /// unless it was already renamed over the log.
    pub fn discard_temp(&self, fd: RawFd, renamed: bool) {
        // SAFETY: the caller guarantees no op references `fd`; it is ours.
        unsafe { libc::close(fd) };
        if !renamed {
            // SAFETY: valid C string owned by the Wal.
            unsafe { libc::unlink(self.temp_path.as_ptr()) };
        }
    }

    /// Abandons the background compaction. Returns the temp file to close
    /// (and unlink unless renamed) when nothing of it is in flight; else it
    /// is cleaned up at its chain's last completion.
    pub fn abort_compaction(&mut self) -> Option<Compaction> {
        let c = self.compaction.as_mut()?;
        if c.inflight {
            c.aborted = true;
            return None;
        }
        self.compaction.take()
    }

    /// Moves `filling` into flight as an append. The caller submits it.
    pub fn start_append(&mut self, now_us: u64) {
        debug_assert!(self.flight == Flight::None && !self.filling.is_empty());
        std::mem::swap(&mut self.filling, &mut self.flight_buf);
        self.filling.clear();
        self.flight_records = self.filling_records;
        self.filling_records = 0;
        self.flight_written = 0;
        self.flight_short = false;
        self.flight_error = None;
        self.flight_started_us = now_us;
        self.flight = Flight::Append { lsn: self.tail_lsn };
    }

    /// Prepares a rewrite: the whole table into a fresh temp file. Covers
    /// everything appended so far (`filling` is subsumed and dropped).
    /// Opening the temp file is one short blocking syscall, once per
    /// compaction, never per request.
    pub fn start_rewrite(&mut self, table: &Table, now_us: u64) -> io::Result<()> {
        debug_assert!(self.flight == Flight::None);
        let fd = self.open_temp()?;
        self.flight_buf.clear();
        self.flight_buf.extend_from_slice(MAGIC);
        record::encode_grant_mark(table.next_grant_id(), &mut self.flight_buf);
        let mut records = 0;
        table.for_each_held(|h| {
            record::encode_acquire(h, &mut self.flight_buf);
            records += 1;
        });
        self.filling.clear();
        self.filling_records = 0;
        self.flight_records = records;
        self.flight_written = 0;
        self.flight_short = false;
        self.flight_error = None;
        self.flight_started_us = now_us;
        self.flight = Flight::Rewrite {
            lsn: self.tail_lsn,
            temp_fd: fd,
        };
        Ok(())
    }

    /// The in-flight batch landed: everything it covers is durable.
    /// Returns the file descriptor to close after a rewrite (the old log).
    pub fn flight_done(&mut self) -> Option<File> {
        let old = match self.flight {
            Flight::None => panic!("flight_done without a flight"),
            Flight::Append { lsn } => {
                self.file_len += self.flight_buf.len() as u64;
                self.durable_lsn = lsn;
                None
            }
            Flight::Rewrite { lsn, temp_fd } => {
                // SAFETY: temp_fd was opened by start_rewrite and is owned
                // from here on by the File.
                let new = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(temp_fd) };
                let old = std::mem::replace(&mut self.file, new);
                self.file_len = self.flight_buf.len() as u64;
                self.durable_lsn = lsn;
                self.broken = false;
                Some(old)
            }
        };
        self.flight = Flight::None;
        self.flight_buf.clear();
        old
    }

    /// The in-flight batch failed: every record past `durable_lsn` is void.
    /// The caller undoes their effects. Returns the temp fd to close, if
    /// the failed flight was a rewrite.
    pub fn flight_failed(&mut self, now_us: u64) -> Option<RawFd> {
        let temp = match self.flight {
            Flight::Rewrite { temp_fd, .. } => Some(temp_fd),
            _ => None,
        };
        self.void_pending(now_us);
        temp
    }

    /// Voids every record past `durable_lsn` and marks the log broken.
    pub fn void_pending(&mut self, now_us: u64) {
        self.flight = Flight::None;
        self.flight_buf.clear();
        self.filling.clear();
        self.filling_records = 0;
        self.durable_lsn = self.tail_lsn;
        // Requests failed fast while a retry is already scheduled must not
        // postpone it: clients retrying more often than the interval would
        // keep the log broken for ever. A failed attempt (or the first
        // failure) schedules the next one.
        if !self.broken || now_us >= self.retry_at_us {
            self.retry_at_us = now_us + REWRITE_RETRY_US;
        }
        self.broken = true;
    }

    /// Recomputes live bytes after an undo (undo is rare).
    pub fn recount_live(&mut self, table: &Table) {
        let mut live = 0;
        table.for_each_held(|h| live += acquire_len(h));
        self.live_bytes = live;
    }
}
