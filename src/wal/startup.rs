//! The logs a durable single node starts with: every shard's log opened
//! and replayed ([`super::set::open`]), what recovery found said in the
//! server's log, each file preallocated, each shard given its writer.

use std::path::Path;

use super::log::Log;
use super::LogFiles;
use crate::core::{Now, Table};
use crate::log::Level;

/// What to start the logs with (the server's flags).
pub struct Opening<'a> {
    pub path: &'a Path,
    /// `--wal-truncate-at`: where an operator cuts a corrupt log.
    pub truncate_at: Option<u64>,
    /// `--wal-preallocate-bytes` (0: none).
    pub preallocate_bytes: u64,
    /// `--compact-floor-bytes`.
    pub compact_floor_bytes: u64,
}

/// Opens and replays every shard's log into `tables` (one per shard),
/// logs each recovery (and a torn or truncated tail), preallocates each
/// file before serving (a failure only logged: appends then grow the
/// file), and returns each shard's files and writer, with how long the
/// whole recovery took in µs.
pub fn open_shard_logs(
    o: &Opening<'_>,
    tables: &mut [Table],
    now: Now,
) -> Result<(Vec<(LogFiles, Log)>, u64), String> {
    let started = std::time::Instant::now();
    let opened = super::set::open(o.path, tables, o.truncate_at, now)?;
    let us = started.elapsed().as_micros() as u64;
    let mut out = Vec::with_capacity(opened.len());
    for (i, (mut files, rec)) in opened.into_iter().enumerate() {
        log!(
            Level::Info,
            "recovery",
            "shard={} path={} records={} held_keys={} file_bytes={} torn_tail_bytes={} zero_tail_bytes={} truncated_at={} duration_us={}",
            i,
            crate::log::path(&files.path),
            rec.records,
            rec.held,
            rec.file_bytes,
            rec.torn_bytes,
            rec.zero_tail_bytes,
            rec.truncated_at.map_or("none".to_string(), |o| o.to_string()),
            us
        );
        if rec.torn_bytes > 0 {
            log!(
                Level::Warn,
                "torn_tail_dropped",
                "path={} bytes={}",
                crate::log::path(&files.path),
                rec.torn_bytes
            );
        }
        if let Some(o) = rec.truncated_at {
            log!(
                Level::Warn,
                "corrupt_tail_truncated",
                "path={} offset={} by=operator",
                crate::log::path(&files.path),
                o
            );
        }
        if o.preallocate_bytes > 0 {
            // Before serving: the first appends already land in zeros.
            // Recovery left the file ending at its last record.
            match super::preallocate(&files.file, files.file_len, o.preallocate_bytes) {
                Ok(end) => files.alloc_len = end,
                Err(e) => log!(
                    Level::Warn,
                    "wal_preallocate_failed",
                    "path={} bytes={} error=\"{}\" effect=appends_grow_the_file",
                    crate::log::path(&files.path),
                    o.preallocate_bytes,
                    e
                ),
            }
        }
        let log = Log::new(files.file_len, &tables[i], o.compact_floor_bytes);
        out.push((files, log));
    }
    Ok((out, us))
}
