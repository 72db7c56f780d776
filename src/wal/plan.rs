//! The log's write policy, pure: which writes, syncs, renames and growth
//! steps carry a log chain ([`Chain`]) to the disk, decided from the
//! completions it is told about. The driver submits exactly what it says
//! and reports each completion back; the simulator (`tests/sim`) drives
//! the same planner over its disk model. No syscall, no clock read.
//!
//! What it decides:
//! - **Pieces.** An append leaves at most `piece_bytes` unsynced: a larger
//!   batch goes out as write + fdatasync per piece. The piece is measured
//!   from the last *completed fdatasync* (not from the last write: after a
//!   short write the rest of the same piece goes out, never a fresh
//!   piece's worth), and ends on a sector boundary unless the append ends
//!   first ([`piece_end`]). Recovery's torn-write window rests on this
//!   (`wal::record`). A snapshot goes out in `snapshot_piece_bytes`
//!   pieces, each synced before the next, so the appends' fdatasyncs never
//!   wait behind one long writeback.
//! - **Short writes** are resumed where they stopped; a short write breaks
//!   the linked chain (the kernel completes the rest with `-ECANCELED`,
//!   which is never durability).
//! - **Growth.** With preallocation, once an append ends past half of the
//!   zeros ahead of the records, a growth step writes the next stretch of
//!   zeros beside the appends; an append that would reach into a growth
//!   step's range waits for it (parked). A failed step turns growth off
//!   for that file only.
//! - **Switching files.** A rewrite or finished compaction renames the
//!   temp file over the log: the file in use changes (its generation
//!   moves on, so a growth step of the old file says nothing about the new
//!   one, which starts unpreallocated).
//!
//! Invariants (asserted): at most one chain per stream (records:
//! Append/Rewrite; compaction: Snapshot/Finish); a batch's buffer range
//! lies within the chain's buffer; an append never has more than
//! `piece_bytes` written but unsynced.

use super::log::Chain;
use super::record::SECTOR_BYTES;

/// The two chains that can be in flight at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Appends and blocking rewrites: they cover records.
    Records = 0,
    /// The background compaction's snapshot and its finishing step.
    Compact = 1,
}

impl Stream {
    pub fn of(chain: Chain) -> Stream {
        match chain {
            Chain::Append { .. } | Chain::Rewrite => Stream::Records,
            Chain::Snapshot | Chain::Finish { .. } => Stream::Compact,
        }
    }
}

/// Which file a step acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The log file in use.
    Log,
    /// The compaction's temp file (created by [`Next::OpenTemp`]).
    Temp,
}

/// One operation of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Write `len` bytes of the chain's buffer, from `at`, to `target` at
    /// file offset `offset`.
    Write {
        target: Target,
        offset: u64,
        at: usize,
        len: usize,
    },
    /// fdatasync `target`.
    Sync { target: Target },
    /// Rename the temp file over the log.
    Rename,
    /// fsync the log's directory.
    SyncDir,
}

/// What kind of step a completion is for (the driver's `user_data`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Write,
    Sync,
    Rename,
    SyncDir,
}

impl Step {
    pub fn kind(&self) -> Kind {
        match self {
            Step::Write { .. } => Kind::Write,
            Step::Sync { .. } => Kind::Sync,
            Step::Rename => Kind::Rename,
            Step::SyncDir => Kind::SyncDir,
        }
    }
}

/// Steps to submit as one linked chain, in order: a failed or short step
/// ends it, and the kernel completes the rest with `-ECANCELED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    pub stream: Stream,
    steps: [Option<Step>; 4],
}

impl Batch {
    pub fn steps(&self) -> impl Iterator<Item = Step> + '_ {
        self.steps.iter().flatten().copied()
    }

    pub fn len(&self) -> usize {
        self.steps.iter().flatten().count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The batch's write (every batch starts with one).
    pub fn write(&self) -> Step {
        self.steps[0].expect("a batch starts with its write")
    }

    /// Only the write, cut to `len` bytes (at most its own). For fault
    /// injection, which shortens or fails a write: such a write goes
    /// alone, as the kernel ends a chain after a real short or failed one.
    pub fn write_alone(self, len: usize) -> Batch {
        let Step::Write {
            target,
            offset,
            at,
            len: full,
        } = self.write()
        else {
            unreachable!("a batch starts with its write")
        };
        assert!(len <= full, "a write cut to {len} of {full} bytes");
        Batch {
            stream: self.stream,
            steps: [
                Some(Step::Write {
                    target,
                    offset,
                    at,
                    len,
                }),
                None,
                None,
                None,
            ],
        }
    }
}

/// Zeros to write over `[from, from + len)` of the log file, then
/// fdatasync (the driver's growth step; it reports [`Writer::grown`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grow {
    pub from: u64,
    pub len: u64,
}

/// What the driver does with a chain it was handed, or next in one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Submit this batch, then report each of its steps' completions.
    Submit(Batch),
    /// Create (truncate) the temp file, then report [`Writer::temp_opened`].
    OpenTemp,
    /// An append waits for the growth step in flight: keep its buffer and
    /// start it again when [`Writer::grown`] says so.
    Parked,
    /// The batch in flight has completions still due.
    Pending,
    /// The chain concluded: hand its buffer back to the shard.
    Landed(Landing),
}

/// A concluded chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Landing {
    pub chain: Chain,
    pub result: Result<(), i32>,
    pub files: Files,
}

/// What a landing does to the driver's files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Files {
    Unchanged,
    /// The temp file was renamed over the log: it is the log file now (the
    /// old one is retired).
    Replaced,
    /// The compaction failed: close the temp file, and remove it unless
    /// `renamed` (its rename went through, so its name is the log's).
    DiscardTemp {
        renamed: bool,
    },
}

/// How a growth step ended, for the driver's log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grown {
    /// The zeros are on the disk of the file in use.
    Done {
        from: u64,
        bytes: u64,
        took_us: u64,
        append_waited: bool,
    },
    /// It failed on the file in use: growth is off for that file.
    Failed { from: u64, bytes: u64, errno: i32 },
    /// It ran on a file a rewrite or compaction has replaced since (failed
    /// or not, it says nothing about the file in use).
    Stale {
        from: u64,
        bytes: u64,
        errno: Option<i32>,
    },
}

#[derive(Clone, Copy, Debug)]
struct Run {
    chain: Chain,
    len: usize,
    written: usize,
    /// Bytes of the buffer a completed fdatasync covers.
    synced: usize,
    /// The batch's fdatasync completed without error.
    sync_ok: bool,
    /// Completions of the batch in flight still due.
    ops_left: u32,
    error: Option<i32>,
    /// Waiting for the temp file to be opened.
    opening: bool,
}

#[derive(Clone, Copy, Debug)]
struct GrowRun {
    from: u64,
    to: u64,
    generation: u64,
    started_us: u64,
    append_waited: bool,
}

/// The write planner of one log (see the module docs).
#[derive(Debug)]
pub struct Writer {
    piece_bytes: usize,
    snapshot_piece_bytes: usize,
    prealloc_bytes: u64,
    align: u64,
    /// Bytes of the log file that exist: records, then zeros written and
    /// synced.
    alloc_len: u64,
    grow: Option<GrowRun>,
    /// A growth step failed on this file: none until the file changes.
    grow_off: bool,
    /// Bumped each time the log file is replaced.
    generation: u64,
    /// An append waits for the growth step.
    parked: bool,
    /// The temp file's rename went through (for discarding it).
    temp_renamed: bool,
    runs: [Option<Run>; 2],
}

/// Where the piece of an append ending at file offset `end`, whose
/// unsynced bytes start at `synced_to`, ends: at most `piece` bytes later,
/// on a [`SECTOR_BYTES`] boundary unless the append ends first. (A piece
/// boundary inside a sector would leave the synced start of that sector
/// and zeros after it after a power cut: neither a whole zero sector nor
/// the rest of a record's own sector, which the scan would call damage.)
pub fn piece_end(synced_to: u64, end: u64, piece: usize) -> u64 {
    let sector = SECTOR_BYTES as u64;
    let cap = (synced_to + piece as u64) / sector * sector;
    assert!(cap > synced_to, "a piece is at least a sector long");
    end.min(cap)
}

impl Writer {
    /// A planner for a log file of `file_len` bytes, `alloc_len` of which
    /// exist (records, then preallocated zeros); growth steps of
    /// `prealloc_bytes` (0: no preallocation), aligned to `align`.
    pub fn new(
        file_len: u64,
        alloc_len: u64,
        prealloc_bytes: u64,
        align: u64,
        piece_bytes: usize,
        snapshot_piece_bytes: usize,
    ) -> Writer {
        assert!(piece_bytes >= SECTOR_BYTES, "a piece of at least a sector");
        Writer {
            piece_bytes,
            snapshot_piece_bytes,
            prealloc_bytes,
            align,
            alloc_len: alloc_len.max(file_len),
            grow: None,
            grow_off: false,
            generation: 0,
            parked: false,
            temp_renamed: false,
            runs: [None, None],
        }
    }

    /// No growth steps for the file in use (its start-up preallocation
    /// failed): appends grow it until it is replaced.
    pub fn without_growth(mut self) -> Writer {
        self.grow_off = true;
        self
    }

    /// A chain in flight on `stream`.
    pub fn busy(&self, stream: Stream) -> bool {
        self.runs[stream as usize].is_some()
    }

    /// The temp file's rename went through (a discard keeps its name).
    pub fn temp_renamed(&self) -> bool {
        self.temp_renamed
    }

    /// The temp file was discarded (closed, removed unless renamed).
    pub fn temp_discarded(&mut self) {
        assert!(
            self.runs[Stream::Compact as usize].is_none(),
            "the temp file discarded under a compaction chain"
        );
        self.temp_renamed = false;
    }

    /// The driver could not open a file for a growth step: appends grow
    /// the file from now on (until it is replaced).
    pub fn grow_unavailable(&mut self) {
        let g = self.grow.take().expect("a growth step was planned");
        assert!(g.generation == self.generation);
        self.grow_off = true;
    }

    /// The shard hands over a chain of `len` bytes at monotonic time
    /// `now_us`: the growth step to start beside it, if one is due, and
    /// what to do with the chain.
    pub fn start(&mut self, chain: Chain, len: usize, now_us: u64) -> (Option<Grow>, Next) {
        let stream = Stream::of(chain);
        assert!(
            self.runs[stream as usize].is_none(),
            "a second chain on the {stream:?} stream"
        );
        let mut grow = None;
        if let Chain::Append { offset } = chain {
            let end = offset + len as u64;
            let overlaps = self
                .grow
                .as_ref()
                .is_some_and(|g| g.generation == self.generation && end > g.from);
            if overlaps {
                assert!(!self.parked, "one records chain at a time");
                if let Some(g) = self.grow.as_mut() {
                    g.append_waited = true;
                }
                self.parked = true;
                return (None, Next::Parked);
            }
            grow = self.maybe_grow(end, now_us);
        }
        self.parked = false;
        let opening = matches!(chain, Chain::Rewrite | Chain::Snapshot);
        if opening {
            self.temp_renamed = false;
        }
        self.runs[stream as usize] = Some(Run {
            chain,
            len,
            written: 0,
            synced: 0,
            sync_ok: false,
            ops_left: 0,
            error: None,
            opening,
        });
        let next = if opening {
            Next::OpenTemp
        } else {
            Next::Submit(self.batch(stream))
        };
        (grow, next)
    }

    /// The temp file of `stream`'s chain was opened (`Ok`) or not.
    pub fn temp_opened(&mut self, stream: Stream, result: Result<(), i32>) -> Next {
        let run = self.runs[stream as usize]
            .as_mut()
            .expect("a chain waiting for its temp file");
        assert!(run.opening, "the temp file opened twice");
        run.opening = false;
        match result {
            Ok(()) => Next::Submit(self.batch(stream)),
            Err(e) => {
                run.error = Some(e);
                self.conclude(stream)
            }
        }
    }

    /// A growth step is due when an append ending at `end` passes half of
    /// the zeros ahead of it: zeros over the next `prealloc_bytes` past
    /// everything written or being written, so none can overwrite a record.
    fn maybe_grow(&mut self, end: u64, now_us: u64) -> Option<Grow> {
        if self.prealloc_bytes == 0
            || self.grow.is_some()
            || self.grow_off
            || end + self.prealloc_bytes / 2 <= self.alloc_len
        {
            return None;
        }
        // Aligned (O_DIRECT): past an append that outran the zeros, the
        // bytes up to the boundary lie in the block that append allocated.
        let from = self.alloc_len.max(end).next_multiple_of(self.align);
        let len = self.prealloc_bytes.next_multiple_of(self.align);
        self.grow = Some(GrowRun {
            from,
            to: from + len,
            generation: self.generation,
            started_us: now_us,
            append_waited: false,
        });
        Some(Grow { from, len })
    }

    /// The growth step concluded (its zero write and fdatasync both
    /// succeeded, or the first error). True in `.1` when a parked append
    /// may start now: the driver hands it to [`Writer::start`] again.
    pub fn grown(&mut self, result: Result<(), i32>, now_us: u64) -> (Grown, bool) {
        let g = self.grow.take().expect("a growth step in flight");
        let bytes = g.to - g.from;
        let current = g.generation == self.generation;
        let outcome = match (result, current) {
            (Ok(()), true) => {
                self.alloc_len = self.alloc_len.max(g.to);
                Grown::Done {
                    from: g.from,
                    bytes,
                    took_us: now_us.saturating_sub(g.started_us),
                    append_waited: g.append_waited,
                }
            }
            (Err(errno), true) => {
                // Only a failure on the file in use turns growth off (for
                // that file): the new file of a compaction must not lose
                // its preallocation to its predecessor's failure.
                self.grow_off = true;
                Grown::Failed {
                    from: g.from,
                    bytes,
                    errno,
                }
            }
            (r, false) => Grown::Stale {
                from: g.from,
                bytes,
                errno: r.err(),
            },
        };
        (outcome, self.parked)
    }

    /// The next batch of `stream`'s chain: from where it stopped.
    fn batch(&mut self, stream: Stream) -> Batch {
        let (piece_bytes, snapshot_piece) = (self.piece_bytes, self.snapshot_piece_bytes);
        let run = self.runs[stream as usize]
            .as_mut()
            .expect("a chain to submit");
        let rest = run.len - run.written;
        let piece = match run.chain {
            Chain::Append { offset } => {
                let end = piece_end(
                    offset + run.synced as u64,
                    offset + run.len as u64,
                    piece_bytes,
                );
                (end - offset) as usize - run.written
            }
            Chain::Snapshot => rest.min(snapshot_piece),
            // A finishing step with nothing carried writes 0 bytes (then
            // syncs and renames).
            Chain::Rewrite | Chain::Finish { .. } => rest,
        };
        if let Chain::Append { .. } = run.chain {
            // Recovery's torn-write window rests on this (wal::record).
            assert!(
                piece > 0 && run.written + piece - run.synced <= piece_bytes,
                "an append would leave {} bytes unsynced",
                run.written + piece - run.synced
            );
        }
        let (target, offset, renames) = match run.chain {
            Chain::Append { offset } => (Target::Log, offset + run.written as u64, false),
            Chain::Rewrite => (Target::Temp, run.written as u64, true),
            Chain::Snapshot => (Target::Temp, run.written as u64, false),
            Chain::Finish { offset } => (Target::Temp, offset + run.written as u64, true),
        };
        let write = Step::Write {
            target,
            offset,
            at: run.written,
            len: piece,
        };
        let sync = Step::Sync { target };
        let steps = if renames {
            [
                Some(write),
                Some(sync),
                Some(Step::Rename),
                Some(Step::SyncDir),
            ]
        } else {
            [Some(write), Some(sync), None, None]
        };
        Batch { stream, steps }
    }

    /// The driver submitted `batch` (as planned, or cut by
    /// [`Batch::write_alone`]).
    pub fn submitted(&mut self, batch: &Batch) {
        let run = self.runs[batch.stream as usize]
            .as_mut()
            .expect("a batch for a chain in flight");
        assert_eq!(run.ops_left, 0, "a batch submitted over another");
        run.sync_ok = false;
        run.ops_left = batch.len() as u32;
    }

    /// One step of `stream`'s batch completed with `res` (bytes or
    /// `-errno`, as io_uring reports it).
    pub fn completed(&mut self, stream: Stream, kind: Kind, res: i32) -> Next {
        let run = self.runs[stream as usize]
            .as_mut()
            .expect("a completion for a chain not in flight");
        assert!(run.ops_left > 0, "more completions than steps");
        match kind {
            Kind::Write => {
                if res < 0 {
                    run.error.get_or_insert(res);
                } else {
                    run.written += res as usize;
                    assert!(run.written <= run.len, "wrote past the chain's buffer");
                }
            }
            Kind::Sync => {
                if res < 0 && res != -libc::ECANCELED {
                    run.error.get_or_insert(res);
                }
                run.sync_ok = res >= 0;
            }
            Kind::Rename => {
                if res >= 0 {
                    self.temp_renamed = true;
                } else if res != -libc::ECANCELED {
                    run.error.get_or_insert(res);
                }
            }
            Kind::SyncDir => {
                if res < 0 && res != -libc::ECANCELED {
                    run.error.get_or_insert(res);
                }
            }
        }
        run.ops_left -= 1;
        if run.ops_left > 0 {
            return Next::Pending;
        }
        if run.sync_ok {
            // The fdatasync ran after the batch's write completed, so it
            // covers everything written so far.
            run.synced = run.written;
        }
        if run.error.is_none() && run.written < run.len {
            return Next::Submit(self.batch(stream));
        }
        // Never Ok without the fdatasync covering the last write: a write
        // that completes whole keeps its link, so the sync ran.
        assert!(
            run.error.is_some() || run.sync_ok,
            "{:?} concluded without its fdatasync",
            run.chain
        );
        self.conclude(stream)
    }

    fn conclude(&mut self, stream: Stream) -> Next {
        let run = self.runs[stream as usize]
            .take()
            .expect("the chain just concluded");
        let result = match run.error {
            Some(e) => Err(e),
            None => Ok(()),
        };
        let files = match (run.chain, result) {
            (Chain::Rewrite | Chain::Finish { .. }, Ok(())) => {
                // The new file ends at its last record and is not
                // preallocated: the next append starts its growth.
                self.generation += 1;
                self.temp_renamed = false;
                self.alloc_len = match run.chain {
                    Chain::Finish { offset } => offset + run.len as u64,
                    _ => run.len as u64,
                };
                self.grow_off = false;
                Files::Replaced
            }
            (Chain::Rewrite | Chain::Snapshot | Chain::Finish { .. }, Err(_)) => {
                Files::DiscardTemp {
                    renamed: self.temp_renamed,
                }
            }
            _ => Files::Unchanged,
        };
        Next::Landed(Landing {
            chain: run.chain,
            result,
            files,
        })
    }
}
