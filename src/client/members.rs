//! Cluster membership on the admin port (`CMEM`, `CCHG`; ringlockd
//! extensions, see [`crate::protocol::members`]).

use super::stream::Stream;
use std::io::{self, Read};

use super::retry::Streak;
use super::{Client, Error, Result, RetryPolicy};
pub use crate::protocol::members::{Change, MemberStatus};

/// What a membership command closed without an answer probably met.
const CLOSED_WHY: &str = "not the leader, or a server without membership changes";

impl Client {
    /// Every shard's membership as the node behind the admin address
    /// applied it (`CMEM`): voters, learners, the outgoing voters of a
    /// change in progress, each member's Raft address. `Ok(None)`: not a
    /// cluster member. Read-only: retried per the retry policy, except
    /// that a server without `CMEM` (it closes at once) is an
    /// [`Error::Io`] of kind `UnexpectedEof`.
    pub fn cluster_members(&self) -> Result<Option<Vec<MemberStatus>>> {
        self.admin_records(b"CMEM", CLOSED_WHY, |b| {
            Ok(crate::protocol::members::decode(b)?.map(|(r, _)| r))
        })
    }

    /// A read-only admin command answered by per-shard records (`CLST`,
    /// `CMEM`): `Ok(None)` for none (not a cluster member). Retried per the
    /// retry policy, except a connection closed without an answer (a server
    /// without the command), an [`Error::Io`] of kind `UnexpectedEof`.
    pub(super) fn admin_records<T>(
        &self,
        cmd: &[u8; 4],
        closed_why: &str,
        decode: impl Fn(&[u8]) -> std::result::Result<Option<Vec<T>>, String>,
    ) -> Result<Option<Vec<T>>> {
        let mut streak = Streak::new(self.cfg.retry);
        loop {
            let (mut conn, peer) = self.connect_admin(&mut streak)?;
            let err = match self.send_admin(&mut conn, cmd) {
                Ok(()) => match self.read_answer(&mut conn, closed_why, &decode) {
                    Ok(recs) => return Ok((!recs.is_empty()).then_some(recs)),
                    Err(Error::Io(err)) if err.kind() == io::ErrorKind::UnexpectedEof => {
                        return Err(Error::Io(err))
                    }
                    Err(Error::Io(err)) => io::Error::new(err.kind(), err.to_string()),
                    Err(other) => return Err(other),
                },
                Err(err) => err,
            };
            self.backoff(&mut streak, err, peer, None, None)?;
        }
    }

    /// Asks the serving leader behind the admin address to make `change`
    /// in every shard's group (`CCHG`). `Ok(Ok(()))` once every shard's
    /// leader proposed it (watch [`cluster_members`](Self::cluster_members)
    /// for it to be applied); `Ok(Err(why))` when the leader refused it
    /// (not the leader, another change in progress, the last voter, a
    /// learner not caught up, ...). Not retried: it changes the cluster.
    pub fn change_members(&self, change: &Change) -> Result<std::result::Result<(), String>> {
        let mut streak = Streak::new(RetryPolicy::none());
        let (mut conn, _) = self.connect_admin(&mut streak)?;
        let mut cmd = Vec::new();
        change.encode(&mut cmd);
        self.send_admin(&mut conn, &cmd).map_err(Error::io)?;
        self.read_answer(
            &mut conn,
            CLOSED_WHY,
            crate::protocol::members::decode_answer,
        )
    }

    /// Reads one whole admin answer (`decode` says when it is whole), after
    /// the `+` of an AUTH when a token is set; `closed_why` says what a
    /// connection closed before any answer probably means.
    pub(super) fn read_answer<T>(
        &self,
        conn: &mut Stream,
        closed_why: &str,
        decode: impl Fn(&[u8]) -> std::result::Result<Option<T>, String>,
    ) -> Result<T> {
        conn.set_read_timeout(Some(self.cfg.io_timeout))
            .map_err(Error::io)?;
        if self.cfg.admin_auth.is_some() {
            let mut b = [0u8; 1];
            conn.read_exact(&mut b).map_err(Error::io)?;
            if b[0] != b'+' {
                return Err(Error::Refused);
            }
        }
        let mut buf = Vec::with_capacity(512);
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(v) = decode(&buf).map_err(Error::Protocol)? {
                return Ok(v);
            }
            match conn.read(&mut chunk) {
                Ok(0) => {
                    return Err(Error::io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        if buf.is_empty() {
                            format!("admin connection closed without an answer ({closed_why})")
                        } else {
                            "admin connection closed mid-answer".to_string()
                        },
                    )))
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(e)),
            }
        }
    }
}
