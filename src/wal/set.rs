//! The logs of several shards: where they live, and how a restart with a
//! different number of shards keeps every held key.
//!
//! - One shard and no manifest: the log is the file `--data-path` names,
//!   exactly as with a single event loop (and as before shards existed).
//! - Otherwise a manifest `PATH.shards` names a generation G and a shard
//!   count N, and shard i's log is `PATH.g<G>.<i>`.
//! - Starting with a shard count other than the manifest's (or than 1 for a
//!   single log) reshards: every log of the committed generation is
//!   replayed into one table; generation G+1 is written, one log per new
//!   shard, each holding exactly the keys [`crate::core::route::owner`] assigns it
//!   (with source, endpoint, acquire time and grant id) and opening with a
//!   grant mark of the highest next grant id, so grant ids never go back;
//!   every new log is fsynced, then the directory; then the manifest is
//!   replaced atomically (temp file, fsync, rename, directory fsync) — the
//!   commit point; only then are the old logs removed. A crash before the
//!   commit leaves the old generation in force (the new files are removed
//!   at the next start); after it, the new one. `event=reshard` is logged
//!   only when there were logs to move: a first start with several shards
//!   on an empty data path writes generation 1 the same way, silently.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::record::{self, MAGIC};
use super::{LogFiles, Recovered};
use crate::core::{Now, Table};

fn manifest_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".shards");
    PathBuf::from(p)
}

/// Shard `i`'s log in generation `g`.
pub fn shard_path(path: &Path, g: u64, i: usize) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".g{g}.{i}"));
    PathBuf::from(p)
}

fn dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn fsync_dir(path: &Path) -> Result<(), String> {
    let dir = dir_of(path);
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("{}: cannot fsync the directory: {e}", dir.display()))
}

/// `(generation, shards)` of the manifest, if there is one.
fn read_manifest(path: &Path) -> Result<Option<(u64, usize)>, String> {
    let m = manifest_path(path);
    let text = match std::fs::read_to_string(&m) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(format!(
                "{}: cannot read the shard manifest: {e}",
                m.display()
            ))
        }
    };
    let mut lines = text.lines();
    let bad = || {
        format!(
            "{}: not a ringlock shard manifest; refusing to start",
            m.display()
        )
    };
    if lines.next() != Some("ringlock-shards 1") {
        return Err(bad());
    }
    let g = lines
        .next()
        .and_then(|l| l.strip_prefix("generation "))
        .and_then(|v| v.parse().ok())
        .ok_or_else(bad)?;
    let n = lines
        .next()
        .and_then(|l| l.strip_prefix("shards "))
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n >= 1)
        .ok_or_else(bad)?;
    Ok(Some((g, n)))
}

fn write_file_synced(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| format!("{}: cannot create: {e}", path.display()))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("{}: cannot write: {e}", path.display()))
}

/// Removes logs of generations other than `keep` (an interrupted reshard's
/// leftovers) and a stale manifest temp file.
fn remove_strays(path: &Path, keep: Option<u64>) -> Result<(), String> {
    let dir = dir_of(path);
    let Some(base) = path.file_name().and_then(|b| b.to_str()) else {
        return Ok(());
    };
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(_) => return Ok(()),
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(base) else {
            continue;
        };
        let stray = if rest == ".shards.tmp" {
            true
        } else if let Some(g) = rest
            .strip_prefix(".g")
            .and_then(|r| r.split('.').next())
            .and_then(|g| g.parse::<u64>().ok())
        {
            Some(g) != keep
        } else {
            false
        };
        if stray {
            std::fs::remove_file(e.path()).map_err(|err| {
                format!("{}: cannot remove a stale log: {err}", e.path().display())
            })?;
        }
    }
    Ok(())
}

/// Opens one of several logs. `--wal-truncate-at` names an offset in the
/// log whose refusal printed it: a log that opens cleanly is opened without
/// it; only a log that is refused is retried with it (and still refused
/// unless it is corrupt at exactly that offset).
fn open_one(
    path: &Path,
    table: &mut Table,
    truncate_at: Option<u64>,
    now: Now,
) -> Result<(LogFiles, Recovered), String> {
    super::open_with(path, table, super::Truncate::if_corrupt(truncate_at), now)
}

/// Opens the logs for `tables.len()` shards, resharding if the count
/// changed, and replays each into its shard's table.
pub fn open(
    path: &Path,
    tables: &mut [Table],
    truncate_at: Option<u64>,
    now: Now,
) -> Result<Vec<(LogFiles, Recovered)>, String> {
    let n = tables.len();
    let manifest = read_manifest(path)?;
    remove_strays(path, manifest.map(|(g, _)| g))?;
    match manifest {
        None if n == 1 => {
            return Ok(vec![super::open(path, &mut tables[0], truncate_at, now)?]);
        }
        Some((g, old)) if old == n => {
            let mut out = Vec::with_capacity(n);
            for (i, t) in tables.iter_mut().enumerate() {
                out.push(open_one(&shard_path(path, g, i), t, truncate_at, now)?);
            }
            return Ok(out);
        }
        _ => {}
    }
    // Reshard: replay the committed generation into one table.
    let (old_files, next_g): (Vec<PathBuf>, u64) = match manifest {
        None => (
            if path.exists() {
                vec![path.to_path_buf()]
            } else {
                Vec::new()
            },
            1,
        ),
        Some((g, old)) => ((0..old).map(|i| shard_path(path, g, i)).collect(), g + 1),
    };
    let mut merged = Table::new(tables[0].limits());
    for f in &old_files {
        let (files, _) = open_one(f, &mut merged, truncate_at, now)?;
        drop(files);
    }
    let mut bufs: Vec<Vec<u8>> = (0..n)
        .map(|_| {
            let mut b = MAGIC.to_vec();
            record::encode_grant_mark(merged.next_grant_id(), &mut b);
            b
        })
        .collect();
    let mut moved = 0usize;
    merged.for_each_held(|h| {
        record::encode_acquire(h, &mut bufs[crate::core::route::owner(h.key, n)]);
        moved += 1;
    });
    for (i, b) in bufs.iter().enumerate() {
        write_file_synced(&shard_path(path, next_g, i), b)?;
    }
    fsync_dir(path)?;
    // The commit point.
    let mut tmp = manifest_path(path).into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    write_file_synced(
        &tmp,
        format!("ringlock-shards 1\ngeneration {next_g}\nshards {n}\n").as_bytes(),
    )?;
    std::fs::rename(&tmp, manifest_path(path))
        .map_err(|e| format!("{}: cannot install the shard manifest: {e}", path.display()))?;
    fsync_dir(path)?;
    for f in &old_files {
        std::fs::remove_file(f)
            .map_err(|e| format!("{}: cannot remove the old log: {e}", f.display()))?;
    }
    fsync_dir(path)?;
    // A first start with several shards over an empty data path creates
    // generation 1 the same way, but moves nothing: not a reshard.
    if !old_files.is_empty() {
        crate::log!(
            crate::log::Level::Info,
            "reshard",
            "path={} from_shards={} to_shards={} generation={} held_keys={}",
            crate::log::path(path),
            manifest.map_or(1, |(_, o)| o),
            n,
            next_g,
            moved
        );
    }
    let mut out = Vec::with_capacity(n);
    for (i, t) in tables.iter_mut().enumerate() {
        out.push(super::open(&shard_path(path, next_g, i), t, None, now)?);
    }
    Ok(out)
}
