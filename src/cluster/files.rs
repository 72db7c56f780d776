//! A node's cluster logs on disk: one file per group, named from
//! `--data-path`; a node restarted with another `--threads` refused (it
//! would vote with no memory of its votes); each file synced, mapped and
//! replayed ([`crate::wal::open_file`], a new one written with its
//! group's identity), a version-1 log marked version 2, its recovery said
//! in the server's log, its file preallocated. What the shard builds from
//! a replayed log is `shard::raft::group`'s.

use std::path::{Path, PathBuf};

use super::store;
use crate::log::Level;
use crate::wal::{self, LogFiles};

/// One group's log, opened and replayed.
pub struct GroupLog {
    pub path: PathBuf,
    pub files: LogFiles,
    pub replayed: store::Replayed,
}

/// The file of group `g` of `groups` under `path`: `path` itself for a
/// node of one group, `path.groupG` for each of several.
pub fn group_path(path: &Path, g: usize, groups: usize) -> PathBuf {
    if groups == 1 {
        path.to_path_buf()
    } else {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".group{g}"));
        p.into()
    }
}

/// Opens node `node`'s `groups` logs under `path` (see the module's
/// rules); `identity(g)` is what a new log of group `g` starts with.
pub fn open(
    path: &Path,
    groups: usize,
    node: u64,
    identity: impl Fn(usize) -> store::Identity,
    preallocate_bytes: u64,
) -> Result<Vec<GroupLog>, String> {
    // A node restarted with another --threads would start fresh logs
    // beside its old ones and vote with no memory of its votes: refused.
    let other = if groups == 1 {
        group_path(path, 0, 2)
    } else {
        path.to_path_buf()
    };
    if other.exists() {
        return Err(format!(
            "{} exists: this node ran with another --threads; every node of a cluster keeps the \
             --threads it was started with",
            other.display()
        ));
    }
    (0..groups)
        .map(|g| {
            open_group(
                &group_path(path, g, groups),
                g,
                node,
                &identity(g),
                preallocate_bytes,
            )
        })
        .collect()
}

fn open_group(
    p: &Path,
    g: usize,
    node: u64,
    id: &store::Identity,
    preallocate_bytes: u64,
) -> Result<GroupLog, String> {
    let shown = p.display().to_string();
    let image = store::new_image(id);
    let mut replayed = None;
    let mut files = wal::open_file(p, &image, &mut |data| {
        let r = store::replay(data, &shown)?;
        let valid = if r.identity.is_none() { 0 } else { r.valid_len };
        replayed = Some(r);
        Ok(valid)
    })?;
    let mut r = replayed.expect("replayed");
    if r.identity.is_none() {
        r = store::replay(&image, &shown)?;
    }
    if r.version == store::MAGIC_V1[7] {
        // A log from before membership changes: read as it is; marked
        // version 2 (an 8-byte overwrite in the first sector), so that
        // the ringlockd before this one refuses it by name.
        use std::os::unix::fs::FileExt;
        files
            .file
            .write_all_at(store::MAGIC, 0)
            .and_then(|_| files.file.sync_data())
            .map_err(|e| format!("{shown}: cannot mark the log format version 2: {e}"))?;
        log!(
            Level::Info,
            "raft_log_upgraded",
            "shard={} path={} from_version=1 to_version=2",
            g,
            crate::log::path(p)
        );
    }
    log!(
        Level::Info,
        "recovery",
        "shard={} path={} mode=cluster node={} entries={} term={} vote={} commit={} torn_tail_bytes={}",
        g,
        crate::log::path(p),
        node,
        r.recovered.entries.len(),
        r.recovered.hard_state.term,
        r.recovered.hard_state.vote,
        r.recovered.hard_state.commit,
        r.torn_bytes
    );
    if preallocate_bytes > 0 {
        if let Ok(end) = wal::preallocate(&files.file, files.file_len, preallocate_bytes) {
            files.alloc_len = end;
        }
    }
    Ok(GroupLog {
        path: p.to_path_buf(),
        files,
        replayed: r,
    })
}
