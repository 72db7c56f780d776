//! Fail-stop: why a replica stops its whole node, and what the driver
//! says and exits with.

/// Why a replica stops its node (fail-stop), and what the driver says when
/// it ends the process: the shard stops stepping, ticking and applying at
/// once, and the driver logs one line (group, entry, why) and exits with
/// [`FailStop::exit_code`], every shard with it — never a process that
/// runs on with a dead shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailStop {
    pub group: usize,
    /// The entry (or snapshot index) that could not be applied.
    pub index: Option<u64>,
    pub why: String,
    pub kind: FailKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailKind {
    /// A committed entry, or a snapshot, of this node's own log could not
    /// be applied (a bad disk, or a bug): it stays in the log, so the node
    /// stops again at every start until it is replaced.
    Apply,
    /// The log's write or fdatasync failed: a replica that cannot persist
    /// must not vote or acknowledge.
    Log,
}

impl FailStop {
    /// The process's exit status ([`crate::cluster::EXIT_APPLY_FAILED`],
    /// [`crate::cluster::EXIT_LOG_FAILED`]).
    pub fn exit_code(&self) -> u8 {
        match self.kind {
            FailKind::Apply => crate::cluster::EXIT_APPLY_FAILED,
            FailKind::Log => crate::cluster::EXIT_LOG_FAILED,
        }
    }

    /// The log line's event.
    pub fn event(&self) -> &'static str {
        match self.kind {
            FailKind::Apply => "raft_apply_failed",
            FailKind::Log => "raft_log_failed",
        }
    }

    /// What an operator does about it.
    pub fn action(&self) -> &'static str {
        match self.kind {
            FailKind::Apply => {
                "this node's own log holds it, so the node stops again at every start: replace \
                 the node (ringlock cluster replace, or remove it and add it back with an empty \
                 --data-path)"
            }
            FailKind::Log => "check the disk of --data-path, then start the node again",
        }
    }
}
