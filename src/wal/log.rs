//! Group-commit bookkeeping of the write-ahead log: a pure state machine.
//!
//! It owns the record buffers and sequence numbers and decides which write
//! chain goes out next; it never touches a file. The shard asks it for the
//! next [`Chain`] and hands the chain's buffer to the driver (ownership moves
//! with the command, so a buffer the kernel is writing cannot be touched
//! here); the driver gives the buffer back with the chain's outcome.
//!
//! Sequence numbers (LSN): every appended record gets the next LSN.
//! - `tail_lsn`: the last record appended (in memory).
//! - `durable_lsn`: the last record known durable (write + fdatasync done).
//! - One chain that covers records is in flight at a time; records appended
//!   meanwhile gather in `filling` and go out as the next batch as soon as
//!   the flight lands (group commit, no timer).
//!
//! A failed chain voids every record past `durable_lsn`: the shard undoes
//! their effects and answers `-`; the log is then rewritten from the table
//! into a fresh file (a blocking rewrite: no `+` until it is durable).
//!
//! Background compaction: when the file is past the floor and twice what
//! the live holders need, the table is snapshotted into a temp file while
//! appends go on in the old log; records appended meanwhile are also kept
//! in `carry`, written after the snapshot in a short finishing chain
//! (write, fdatasync, rename over the log, fsync the directory).
//!
//! The snapshot is encoded [`SNAPSHOT_CHUNK_KEYS`] holders per tick (see
//! [`Log::encode_step`] and [`Table::walk_begin`]), so a table of a million
//! holders costs each tick tens of microseconds rather than one tick tens
//! of milliseconds. `carry` starts when the encoding starts: every record
//! appended after the first chunk is replayed after the snapshot, which
//! makes the piecewise snapshot exact.

use crate::core::{HeldRef, Name, Table};

use super::record::{self, MAGIC};

/// While the log is broken (a write or fsync failed and the rewrite did
/// too), a rewrite is retried this often.
pub const REWRITE_RETRY_US: u64 = 1_000_000;

/// Holders a background snapshot encodes per tick. At ~50 ns each (a
/// record is ~50 bytes) a chunk costs ~100 µs of one tick; a million
/// holders take ~500 ticks.
pub const SNAPSHOT_CHUNK_KEYS: usize = 2048;

/// The write chains the driver knows how to run. Every chain is one
/// write of the whole buffer (the driver finishes short writes itself)
/// followed by the steps named here; its outcome is all-or-error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chain {
    /// Write at `offset` of the log, fdatasync the log.
    Append { offset: u64 },
    /// Create the temp file, write at 0, fdatasync, rename over the log,
    /// fsync the directory. The driver switches to the new file on success.
    Rewrite,
    /// Create the temp file, write the snapshot at 0, fdatasync.
    Snapshot,
    /// Write at `offset` of the temp file, fdatasync, rename over the log,
    /// fsync the directory; the driver switches files on success.
    Finish { offset: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flight {
    None,
    /// An append covering records up to `lsn`.
    Append {
        lsn: u64,
        records: u64,
        bytes: u64,
    },
    /// A blocking rewrite covering everything up to `lsn`.
    Rewrite {
        lsn: u64,
        records: u64,
        bytes: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactPhase {
    /// The snapshot is being encoded, a chunk per tick, into `snap`.
    Encoding,
    /// The snapshot chain is in flight.
    Snapshot,
    /// The snapshot is durable in the temp file; the finishing step waits
    /// for no append to be in flight.
    Ready,
    /// The finishing chain is in flight; appends wait (new records belong
    /// to the new file).
    Finishing,
}

struct Compaction {
    phase: CompactPhase,
    /// The snapshot being encoded; moved to the driver by its chain.
    snap: Vec<u8>,
    /// Durable bytes of the temp file (the snapshot).
    temp_len: u64,
    carry: Vec<u8>,
    carry_records: u64,
    snapshot_records: u64,
    finish_lsn: u64,
    finish_bytes: u64,
    started_us: u64,
    /// Abandoned (records it may contain were voided): its chain's outcome
    /// is discarded and the temp file removed.
    aborted: bool,
}

/// What one landed chain means, for the shard's log lines and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landed {
    Append {
        records: u64,
        bytes: u64,
        took_us: u64,
    },
    Rewrite {
        records: u64,
        bytes: u64,
        took_us: u64,
    },
    SnapshotDone,
    Compacted {
        bytes: u64,
        snapshot_records: u64,
        carried_records: u64,
        took_us: u64,
    },
    /// A chain of an abandoned compaction completed (either way).
    AbandonedDone,
    /// The append or rewrite failed: every record past the durable point
    /// is void (the shard undoes them).
    Failed {
        rewrite: bool,
    },
    /// The snapshot or finishing step failed: the old log is untouched.
    /// `voided` says whether appended records went with it (finishing step:
    /// the carry's records exist only in the failed file).
    CompactionFailed {
        voided: bool,
    },
}

/// What [`Log::next_chain`] decided.
#[derive(Debug)]
pub enum Next {
    /// Submit this chain with this buffer.
    Chain(Chain, Vec<u8>),
    /// A replicated log's batch: propose these records as one Raft entry
    /// (the buffer comes back with [`Log::proposal_landed`]).
    Propose(Vec<u8>),
    /// Nothing to submit now.
    Idle,
    /// The log is broken and cannot take records until its rewrite: fail
    /// the requests waiting for it now rather than hold them for an
    /// unknown time.
    FailPending,
}

struct BrokenLog;

pub struct Log {
    file_len: u64,
    filling: Vec<u8>,
    filling_records: u64,
    /// The empty buffer that becomes `filling` when `filling` goes out.
    spare: Option<Vec<u8>>,
    flight: Flight,
    flight_started_us: u64,
    /// The compaction chain is in flight (its buffer is the driver's).
    compact_inflight: bool,
    tail_lsn: u64,
    durable_lsn: u64,
    live_bytes: u64,
    broken: bool,
    retry_at_us: u64,
    compact_floor_bytes: u64,
    compaction: Option<Compaction>,
    compact_retry_after_us: u64,
    snapshot_chunk: usize,
    /// A replica's batcher (cluster mode): batches become Raft proposals,
    /// "durable" means committed and applied; no file, no compaction.
    replicated: bool,
    /// A cluster log's compaction: the whole new file, to be written as
    /// the next chain (a [`Chain::Rewrite`]).
    rewrite: Option<Vec<u8>>,
}

impl Log {
    /// A log whose file holds `file_len` valid bytes, replayed into `table`.
    pub fn new(file_len: u64, table: &Table, compact_floor_bytes: u64) -> Log {
        let mut live = 0;
        table.for_each_held(|h| live += record::acquire_len(h) as u64);
        Log::with_live(file_len, live, compact_floor_bytes)
    }

    /// [`Log::new`] with its table's live bytes already counted.
    fn with_live(file_len: u64, live: u64, compact_floor_bytes: u64) -> Log {
        Log {
            file_len,
            filling: Vec::with_capacity(64 * 1024),
            filling_records: 0,
            spare: Some(Vec::with_capacity(64 * 1024)),
            flight: Flight::None,
            flight_started_us: 0,
            compact_inflight: false,
            tail_lsn: 0,
            durable_lsn: 0,
            live_bytes: live,
            broken: false,
            retry_at_us: 0,
            compact_floor_bytes,
            compaction: None,
            compact_retry_after_us: 0,
            snapshot_chunk: SNAPSHOT_CHUNK_KEYS,
            replicated: false,
            rewrite: None,
        }
    }

    /// A replica's record batcher (cluster mode): the shard's records
    /// gather here as in a single node's log, but a batch goes out as a
    /// Raft proposal ([`Next::Propose`]) and is durable once its entry is
    /// committed and applied ([`Log::proposal_landed`]). One proposal is in
    /// flight at a time, so group commit spans the cluster: records that
    /// arrive meanwhile form the next entry. A failed proposal (leadership
    /// lost) voids its records without marking anything broken. It never
    /// compacts (the cluster log's own writer does), so it starts with no
    /// live bytes counted.
    pub fn replicated() -> Log {
        let mut l = Log::with_live(0, 0, u64::MAX);
        l.replicated = true;
        l
    }

    /// A cluster log file's writer: raw records (Raft entries, hard state)
    /// appended as a single node's records are; compacted only by a
    /// rewrite its owner asks for (a snapshot and the entries after it),
    /// so it counts no live bytes.
    pub fn raw(file_len: u64) -> Log {
        Log::with_live(file_len, 0, u64::MAX)
    }

    pub fn is_replicated(&self) -> bool {
        self.replicated
    }

    /// True when nothing is in flight or waiting to be written.
    pub fn idle(&self) -> bool {
        !self.busy() && self.filling.is_empty() && self.rewrite.is_none()
    }

    /// Replaces the file by `image` (a cluster log's compaction) as the
    /// next chain: temp file, write, fdatasync, rename, directory fsync.
    /// Only while [`Log::idle`]: the image must hold everything appended.
    pub fn rewrite_with(&mut self, image: Vec<u8>) {
        assert!(self.idle(), "a rewrite over records not yet written");
        self.rewrite = Some(image);
    }

    /// Appends raw records (the cluster log's: Raft entries, hard state,
    /// identity), which `write` encodes straight into the batch being
    /// filled (no copy); `None` when it wrote nothing, else the lsn they
    /// are durable at, as one record of the batch.
    pub fn append_raw(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> Option<u64> {
        let before = self.filling.len();
        write(&mut self.filling);
        if self.filling.len() == before {
            return None;
        }
        self.filling_records += 1;
        self.tail_lsn += 1;
        Some(self.tail_lsn)
    }

    /// The proposal given out by [`Next::Propose`] was committed and
    /// applied (`Ok`) or will never be (`Err`: this node lost leadership,
    /// or raft-rs refused it); its buffer comes back.
    pub fn proposal_landed(&mut self, result: Result<(), ()>, mut buf: Vec<u8>) -> Landed {
        debug_assert!(self.replicated);
        let flight = std::mem::replace(&mut self.flight, Flight::None);
        buf.clear();
        self.spare = Some(buf);
        let Flight::Append {
            lsn,
            records,
            bytes,
        } = flight
        else {
            panic!("a proposal landed with none in flight");
        };
        if result.is_err() {
            self.void_pending(0);
            return Landed::Failed { rewrite: false };
        }
        self.durable_lsn = lsn;
        Landed::Append {
            records,
            bytes,
            took_us: 0,
        }
    }

    /// The same log encoding `n` holders of a background snapshot per tick
    /// (tests: a few, so a walk spans many ticks of changes).
    pub fn with_snapshot_chunk(mut self, n: usize) -> Log {
        self.snapshot_chunk = n.max(1);
        self
    }

    /// True while a background snapshot is being encoded: the shard needs
    /// a tick soon, event or not.
    pub fn encoding(&self) -> bool {
        self.compaction
            .as_ref()
            .is_some_and(|c| c.phase == CompactPhase::Encoding)
    }

    /// Encodes the next chunk of a background snapshot, if one is being
    /// encoded (once per tick, before [`Log::next_chain`]).
    pub fn encode_step(&mut self, table: &mut Table) {
        let chunk = self.snapshot_chunk;
        let Some(c) = self.compaction.as_mut() else {
            return;
        };
        if c.phase != CompactPhase::Encoding {
            return;
        }
        let (snap, records) = (&mut c.snap, &mut c.snapshot_records);
        let done = table.walk_step(chunk, |h| {
            record::encode_acquire(h, snap);
            *records += 1;
        });
        if done {
            c.temp_len = c.snap.len() as u64;
            c.phase = CompactPhase::Snapshot;
        }
    }

    pub fn tail_lsn(&self) -> u64 {
        self.tail_lsn
    }
    pub fn durable_lsn(&self) -> u64 {
        self.durable_lsn
    }
    pub fn pending(&self) -> bool {
        self.tail_lsn > self.durable_lsn
    }
    pub fn broken(&self) -> bool {
        self.broken
    }
    pub fn file_len(&self) -> u64 {
        self.file_len
    }
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }
    /// When a broken log's next rewrite attempt is due (for the wait).
    pub fn retry_at_us(&self) -> Option<u64> {
        (self.broken && self.flight == Flight::None).then_some(self.retry_at_us)
    }
    /// True while a chain that covers records is in flight.
    pub fn in_flight(&self) -> bool {
        self.flight != Flight::None
    }
    /// True while any chain is in flight (the driver holds a buffer).
    pub fn busy(&self) -> bool {
        self.flight != Flight::None || self.compact_inflight
    }

    fn carry_from(&mut self, start: usize) {
        if let Some(c) = self.compaction.as_mut() {
            if c.phase != CompactPhase::Finishing && !c.aborted {
                c.carry.extend_from_slice(&self.filling[start..]);
                c.carry_records += 1;
            }
        }
    }

    pub fn append_acquire(&mut self, h: HeldRef<'_>) -> u64 {
        let start = self.filling.len();
        record::encode_acquire(h, &mut self.filling);
        self.carry_from(start);
        self.live_bytes += record::acquire_len(h) as u64;
        self.filling_records += 1;
        self.tail_lsn += 1;
        self.tail_lsn
    }

    /// A holder written anew (a proclaim: the same grant id, another
    /// source), replacing `prev`'s record as the live one: replay and
    /// followers install it over the holder of the same grant id.
    pub fn append_reacquire(&mut self, prev: HeldRef<'_>, now: HeldRef<'_>) -> u64 {
        let lsn = self.append_acquire(now);
        self.live_bytes = self
            .live_bytes
            .saturating_sub(record::acquire_len(prev) as u64);
        lsn
    }

    /// A lease's new deadline. The live size does not change: a compacted
    /// log holds the lease's Hold record with its latest deadline.
    pub fn append_extend(&mut self, key: &Name, grant_id: u64, expires_unix_ms: u64) -> u64 {
        let start = self.filling.len();
        record::encode_extend(key.as_bytes(), grant_id, expires_unix_ms, &mut self.filling);
        self.carry_from(start);
        self.filling_records += 1;
        self.tail_lsn += 1;
        self.tail_lsn
    }

    /// A replicated session opened (cluster mode only). Counted live: a
    /// compacted log holds the open sessions' SessionOpen records.
    pub fn append_session_open(&mut self, session: u64, keepalive_ms: u32) -> u64 {
        let start = self.filling.len();
        record::encode_session_open(session, keepalive_ms, &mut self.filling);
        self.carry_from(start);
        self.live_bytes += (self.filling.len() - start) as u64;
        self.filling_records += 1;
        self.tail_lsn += 1;
        self.tail_lsn
    }

    /// A replicated session ended (cluster mode only).
    pub fn append_session_end(&mut self, session: u64) -> u64 {
        let start = self.filling.len();
        record::encode_session_end(session, &mut self.filling);
        self.carry_from(start);
        self.live_bytes = self
            .live_bytes
            .saturating_sub((record::HEADER + 1 + 8 + 4) as u64);
        self.filling_records += 1;
        self.tail_lsn += 1;
        self.tail_lsn
    }

    /// The release of `holder` (as it was).
    pub fn append_release(&mut self, holder: HeldRef<'_>) -> u64 {
        let start = self.filling.len();
        record::encode_release(holder.key, holder.grant_id, &mut self.filling);
        self.carry_from(start);
        self.live_bytes = self
            .live_bytes
            .saturating_sub(record::acquire_len(holder) as u64);
        self.filling_records += 1;
        self.tail_lsn += 1;
        self.tail_lsn
    }

    fn should_compact(&self, now_us: u64) -> bool {
        !self.broken
            && self.compaction.is_none()
            && !self.compact_inflight
            && now_us >= self.compact_retry_after_us
            && self.file_len > self.compact_floor_bytes
            && self.file_len > 2 * (self.live_bytes + MAGIC.len() as u64)
    }

    /// What every rewritten log starts with: the magic, then the grant mark
    /// (grant ids continue above it after a restart).
    fn snapshot_head(table: &Table, buf: &mut Vec<u8>) {
        buf.extend_from_slice(MAGIC);
        record::encode_grant_mark(table.next_grant_id(), buf);
    }

    /// The whole snapshot in one go (the blocking rewrite after a failure,
    /// which holds every answer anyway).
    fn snapshot(table: &Table, buf: &mut Vec<u8>) -> u64 {
        buf.clear();
        Self::snapshot_head(table, buf);
        let mut records = 0;
        table.for_each_held(|h| {
            record::encode_acquire(h, buf);
            records += 1;
        });
        records
    }

    /// The next chain to submit, with its buffer (which now belongs to the
    /// driver until [`Log::landed`]).
    pub fn next_chain(&mut self, table: &mut Table, now_us: u64) -> Next {
        if self.replicated {
            if self.flight != Flight::None || self.filling.is_empty() {
                return Next::Idle;
            }
            return Next::Propose(self.take_batch(now_us));
        }
        match self.next(table, now_us) {
            Ok(Some((chain, buf))) => Next::Chain(chain, buf),
            Ok(None) => Next::Idle,
            Err(BrokenLog) => Next::FailPending,
        }
    }

    fn next(
        &mut self,
        table: &mut Table,
        now_us: u64,
    ) -> Result<Option<(Chain, Vec<u8>)>, BrokenLog> {
        if self.replicated {
            unreachable!("a replicated log's batches are taken with next_chain");
        }
        if self.flight == Flight::None {
            if let Some(buf) = self.rewrite.take() {
                self.flight = Flight::Rewrite {
                    lsn: self.tail_lsn,
                    records: 0,
                    bytes: buf.len() as u64,
                };
                self.flight_started_us = now_us;
                return Ok(Some((Chain::Rewrite, buf)));
            }
        }
        if let Some(c) = self.compaction.as_mut() {
            if c.phase == CompactPhase::Finishing {
                return Ok(None);
            }
            if c.phase == CompactPhase::Ready && !c.aborted && self.flight == Flight::None {
                return Ok(Some(self.start_finishing()));
            }
            if c.phase == CompactPhase::Snapshot && !self.compact_inflight {
                // Encoded: the snapshot goes out now, beside any append
                // (the driver runs both chains, on different files).
                self.compact_inflight = true;
                return Ok(Some((Chain::Snapshot, std::mem::take(&mut c.snap))));
            }
        }
        if self.flight != Flight::None {
            return Ok(None);
        }
        if self.broken {
            if now_us < self.retry_at_us || self.compact_inflight {
                // An abandoned compaction still owns the temp file until its
                // chain lands; the rewrite waits for it.
                return if self.pending() {
                    Err(BrokenLog)
                } else {
                    Ok(None)
                };
            }
            let mut buf = self
                .spare
                .take()
                .expect("no flight: the spare buffer is home");
            let records = Self::snapshot(table, &mut buf);
            // The rewrite covers everything appended so far.
            self.filling.clear();
            self.filling_records = 0;
            self.flight = Flight::Rewrite {
                lsn: self.tail_lsn,
                records,
                bytes: buf.len() as u64,
            };
            self.flight_started_us = now_us;
            return Ok(Some((Chain::Rewrite, buf)));
        }
        if self.filling.is_empty() {
            // Compaction rides on traffic: an idle log stays as it is.
            return Ok(None);
        }
        if self.should_compact(now_us) {
            // The grant mark first: every grant id a record after the
            // walk's start carries is above it.
            let mut snap = Vec::with_capacity(self.live_bytes as usize + 64);
            Self::snapshot_head(table, &mut snap);
            table.walk_begin();
            self.compaction = Some(Compaction {
                phase: CompactPhase::Encoding,
                snap,
                temp_len: 0,
                carry: Vec::with_capacity(64 * 1024),
                carry_records: 0,
                snapshot_records: 0,
                finish_lsn: 0,
                finish_bytes: 0,
                started_us: now_us,
                aborted: false,
            });
            // Records appended from now on are carried. This tick's batch
            // is not: its effects are in the table the walk reads, and it
            // goes to the old log below as usual.
        }
        let buf = self.take_batch(now_us);
        Ok(Some((
            Chain::Append {
                offset: self.file_len,
            },
            buf,
        )))
    }

    /// The batch in `filling` goes out (an append, or a replica's
    /// proposal): it becomes the flight, the spare buffer the next batch.
    fn take_batch(&mut self, now_us: u64) -> Vec<u8> {
        let fresh = self
            .spare
            .take()
            .expect("no flight: the spare buffer is home");
        let buf = std::mem::replace(&mut self.filling, fresh);
        self.flight = Flight::Append {
            lsn: self.tail_lsn,
            records: self.filling_records,
            bytes: buf.len() as u64,
        };
        self.filling_records = 0;
        self.flight_started_us = now_us;
        buf
    }

    fn start_finishing(&mut self) -> (Chain, Vec<u8>) {
        let tail = self.tail_lsn;
        let c = self.compaction.as_mut().expect("a compaction");
        let buf = std::mem::take(&mut c.carry);
        c.finish_lsn = tail;
        c.finish_bytes = buf.len() as u64;
        c.phase = CompactPhase::Finishing;
        let offset = c.temp_len;
        // These records now live only in the new file.
        self.filling.clear();
        self.filling_records = 0;
        self.compact_inflight = true;
        (Chain::Finish { offset }, buf)
    }

    /// The driver finished `chain` (`Ok`) or it failed (`Err(errno)`), and
    /// gives its buffer back.
    pub fn landed(
        &mut self,
        chain: Chain,
        result: Result<(), i32>,
        mut buf: Vec<u8>,
        now_us: u64,
    ) -> Landed {
        match chain {
            Chain::Append { .. } | Chain::Rewrite => {
                let flight = std::mem::replace(&mut self.flight, Flight::None);
                buf.clear();
                self.spare = Some(buf);
                let took_us = now_us.saturating_sub(self.flight_started_us);
                if result.is_err() {
                    self.void_pending(now_us);
                    return Landed::Failed {
                        rewrite: chain == Chain::Rewrite,
                    };
                }
                match flight {
                    Flight::Append {
                        lsn,
                        records,
                        bytes,
                    } => {
                        self.file_len += bytes;
                        self.durable_lsn = lsn;
                        Landed::Append {
                            records,
                            bytes,
                            took_us,
                        }
                    }
                    Flight::Rewrite {
                        lsn,
                        records,
                        bytes,
                    } => {
                        self.file_len = bytes;
                        self.durable_lsn = lsn;
                        self.broken = false;
                        Landed::Rewrite {
                            records,
                            bytes,
                            took_us,
                        }
                    }
                    Flight::None => panic!("log chain landed with nothing in flight"),
                }
            }
            Chain::Snapshot | Chain::Finish { .. } => {
                self.compact_inflight = false;
                let c = self
                    .compaction
                    .as_mut()
                    .expect("a compaction chain without a compaction");
                if c.aborted {
                    self.compaction = None;
                    return Landed::AbandonedDone;
                }
                if result.is_err() {
                    let finishing = c.phase == CompactPhase::Finishing;
                    self.compaction = None;
                    self.compact_retry_after_us = now_us + REWRITE_RETRY_US;
                    if finishing {
                        // The carried records were taken out of `filling`:
                        // they exist only in the failed file.
                        self.void_pending(now_us);
                    }
                    return Landed::CompactionFailed { voided: finishing };
                }
                if c.phase == CompactPhase::Snapshot {
                    c.phase = CompactPhase::Ready;
                    return Landed::SnapshotDone;
                }
                let c = self.compaction.take().expect("a compaction");
                self.file_len = c.temp_len + c.finish_bytes;
                self.durable_lsn = self.durable_lsn.max(c.finish_lsn);
                Landed::Compacted {
                    bytes: self.file_len,
                    snapshot_records: c.snapshot_records,
                    carried_records: c.carry_records,
                    took_us: now_us.saturating_sub(c.started_us),
                }
            }
        }
    }

    /// Abandons a background compaction whose snapshot may contain voided
    /// records. True when the temp file must be discarded now (nothing of
    /// it is in flight); otherwise its chain's landing cleans up.
    pub fn abort_compaction(&mut self, table: &mut Table) -> bool {
        let Some(c) = self.compaction.as_mut() else {
            return false;
        };
        if c.phase == CompactPhase::Encoding {
            // Nothing written yet: no temp file to discard.
            table.walk_end();
            self.compaction = None;
            return false;
        }
        if self.compact_inflight {
            c.aborted = true;
            return false;
        }
        self.compaction = None;
        true
    }

    /// Voids every record past `durable_lsn` and marks the log broken.
    fn void_pending(&mut self, now_us: u64) {
        self.filling.clear();
        self.filling_records = 0;
        self.durable_lsn = self.tail_lsn;
        if self.replicated {
            // Nothing to rewrite: the table is rolled back to the applied
            // entries, which are the log.
            return;
        }
        // Requests failed fast while a retry is already scheduled must not
        // postpone it: clients retrying more often than the interval would
        // keep the log broken for ever.
        if !self.broken || now_us >= self.retry_at_us {
            self.retry_at_us = now_us + REWRITE_RETRY_US;
        }
        self.broken = true;
    }

    /// Voids pending records without a failed chain (requests failed fast
    /// while the log is broken).
    pub fn void_for_broken(&mut self, now_us: u64) {
        self.void_pending(now_us);
    }

    /// Recomputes live bytes after an undo (undo is rare).
    pub fn recount_live(&mut self, table: &Table) {
        let mut live = 0;
        table.for_each_held(|h| live += record::acquire_len(h) as u64);
        self.live_bytes = live;
    }
}
