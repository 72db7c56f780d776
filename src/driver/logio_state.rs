//! The log I/O's data: [`LogIo`] (the log's files, the write planner,
//! the chain buffers lent to the kernel, injected faults, a growth step
//! in flight: [`GrowIo`]) and the steps a log op's `user_data` slot names
//! ([`STEP_WRITE`] …, [`STEP_GROW_ALLOC`] …). The loop drives it in
//! `logio.rs`.

use std::fs::File;

use super::buf::Slot;
use super::faults::Faults;
use crate::wal::log::Chain;
use crate::wal::plan::{Stream, Writer};
use crate::wal::{self, LogFiles};

// Steps of a log chain (the `slot` field of its user_data).
pub(super) const STEP_WRITE: u32 = 0;
pub(super) const STEP_SYNC: u32 = 1;
pub(super) const STEP_RENAME: u32 = 2;
pub(super) const STEP_DIR_SYNC: u32 = 3;
pub(super) const STEP_DELAY: u32 = 4;
// Steps of a growth step of the log's preallocation (the same op code as
// the records chain, told apart by these slots).
pub(super) const STEP_GROW_ALLOC: u32 = 16;
pub(super) const STEP_GROW_WRITE: u32 = 17;
pub(super) const STEP_GROW_SYNC: u32 = 18;
pub(super) const STEP_GROW_DELAY: u32 = 19;

/// The driver's side of one log: its files, the planner, and what the
/// kernel holds.
pub(super) struct LogIo {
    pub(super) files: LogFiles,
    pub(super) temp: Option<File>,
    pub(super) faults: Faults,
    pub(super) plan: Writer,
    /// Each stream's chain buffer: lent to the kernel while a batch runs.
    pub(super) bufs: [Option<Slot>; 2],
    /// The write in flight on each stream is failed by fault injection.
    pub(super) fail_injected: [bool; 2],
    /// Ops of each stream's batch the planner does not know of (a fault's
    /// delay), still due.
    pub(super) extra_ops: [u32; 2],
    pub(super) grow: Option<GrowIo>,
    /// An append waiting for the growth step (the planner said Parked).
    pub(super) parked: Option<(Chain, Vec<u8>)>,
}

/// A growth step in flight: fallocate, write zeros, fdatasync. It runs on
/// its own open file description of the log (opened through
/// /proc/self/fd), not a dup: writeback errors are reported once per
/// description, so the step's fdatasync cannot consume an error that the
/// log's own fdatasync must still see.
pub(super) struct GrowIo {
    /// Open until the step's last completion: linked ops take their file
    /// only when they start.
    pub(super) file: File,
    pub(super) len: u64,
    pub(super) ops_left: u32,
    pub(super) error: Option<i32>,
    /// The zero write is failed by fault injection.
    pub(super) fail_injected: bool,
}

impl LogIo {
    pub(super) fn new(files: LogFiles, faults: Faults, prealloc_bytes: u64) -> LogIo {
        let mut plan = Writer::new(
            files.file_len,
            files.alloc_len,
            prealloc_bytes,
            wal::PREALLOCATE_ALIGN,
            wal::record::APPEND_PIECE_BYTES,
            wal::SNAPSHOT_PIECE_BYTES,
        );
        if prealloc_bytes > 0 && files.alloc_len == files.file_len {
            // Start-up preallocation failed (it was logged): appends grow
            // the file until a compaction switches to a new one.
            plan = plan.without_growth();
        }
        LogIo {
            files,
            temp: None,
            faults,
            plan,
            bufs: [None, None],
            fail_injected: [false, false],
            extra_ops: [0, 0],
            grow: None,
            parked: None,
        }
    }

    /// An append (or a blocking rewrite) is in flight.
    pub(super) fn appending(&self) -> bool {
        self.plan.busy(Stream::Records)
    }

    /// Leaks what the kernel may still use (the loop stops with ops in
    /// flight): a buffer is never freed under the kernel, a descriptor
    /// number never reused under a linked op.
    pub(super) fn leak_in_flight(&mut self) {
        if let Some(g) = self.grow.take() {
            std::mem::forget(g.file);
        }
        for slot in self.bufs.iter_mut().flatten() {
            if let Slot::Kernel(l) = std::mem::replace(slot, Slot::Moving) {
                l.leak();
            }
        }
    }
}
