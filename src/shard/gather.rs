//! Work that spans shards: a connection's request that touches every shard
//! (ResetBySource, KEYS/KEYX, RSTK, the cluster commands) is scattered as
//! [`RemoteOp`]s, each shard answers behind its own durability gate, and
//! the connection's shard gathers the parts into one answer.

use super::*;

impl Shard {
    /// Starts a scatter/gather for the connection in `slot`.
    pub(super) fn scatter(&mut self, slot: u32, op: RemoteOp, lock_port: bool) {
        let id = self.next_gather_id;
        self.next_gather_id += 1;
        let token = self.token(slot);
        self.conns[slot as usize].state = State::Gathering;
        self.gathers.push(Gather {
            id,
            token,
            op: op.clone(),
            pending: self.shards,
            failed: false,
            lock_port,
            reset: Vec::new(),
            stream: 0,
            status: Vec::new(),
            members: Vec::new(),
            refused: Vec::new(),
        });
        self.cmds.push(Cmd::Scatter { id, op });
    }

    /// Another shard (or this one) asks for `op` on this shard's keys. The
    /// reply waits for this shard's log like any answer.
    pub fn on_remote(&mut self, from: usize, id: u64, op: RemoteOp) {
        let now = self.now;
        if self.park_read(from, id, &op) {
            return;
        }
        if let Some(result) = self.keys_remote(from, &op) {
            // A listing's first chunk waits for the log like any answer;
            // later chunks are holders as they were then: no wait.
            if !matches!(op, RemoteOp::KeysOpen { .. }) {
                self.cmds.push(Cmd::Reply {
                    to: from,
                    id,
                    result,
                });
                return;
            }
            return self.reply_when_durable(from, id, result);
        }
        let result = match op {
            RemoteOp::KeysOpen { .. } | RemoteOp::KeysMore { .. } | RemoteOp::KeysClose { .. } => {
                unreachable!("answered above")
            }
            RemoteOp::ClusterStatus => {
                // A read of the replica, no table effect: nothing to wait for.
                let result = match self.shard_status() {
                    Some(s) => RemoteResult::Status(Box::new(s)),
                    None => RemoteResult::Failed,
                };
                self.cmds.push(Cmd::Reply {
                    to: from,
                    id,
                    result,
                });
                return;
            }
            RemoteOp::Members | RemoteOp::ChangeMembers(_) => {
                // No table effect: answered at once.
                let result = self.members_op(&op);
                self.cmds.push(Cmd::Reply {
                    to: from,
                    id,
                    result,
                });
                return;
            }
            RemoteOp::TransferLeader { to } => {
                // No table effect: answered at once.
                let result = if self.transfer_leadership(to) {
                    RemoteResult::Done
                } else {
                    RemoteResult::Failed
                };
                self.cmds.push(Cmd::Reply {
                    to: from,
                    id,
                    result,
                });
                return;
            }
            RemoteOp::ResetKeys(keys) => {
                let (me, shards) = (self.me, self.shards);
                for key in keys.iter().filter(|k| owner(k.as_bytes(), shards) == me) {
                    self.table.reset_by_key(None, key, now, &mut self.fx);
                    self.apply_effects();
                }
                RemoteResult::Done
            }
            RemoteOp::ResetSources(sources) => {
                for s in &sources {
                    self.table.reset_by_source(None, s, now, &mut self.fx);
                    self.apply_effects();
                }
                RemoteResult::Done
            }
            RemoteOp::ResetIf(entries) => {
                let (me, shards) = (self.me, self.shards);
                let mut done = Vec::new();
                for (i, (key, token)) in entries.iter().enumerate() {
                    if owner(key.as_bytes(), shards) == me
                        && self.table.reset_if(key, *token, now, &mut self.fx)
                    {
                        done.push(i as u32);
                    }
                    self.apply_effects();
                }
                RemoteResult::Reset(done)
            }
        };
        self.reply_when_durable(from, id, result);
    }

    /// One shard's part of a scatter/gather arrived.
    pub fn on_reply(&mut self, id: u64, result: RemoteResult) {
        let Some(i) = self.gathers.iter().position(|g| g.id == id) else {
            panic!("a reply for unknown gather {id}");
        };
        let g = &mut self.gathers[i];
        g.pending -= 1;
        if g.stream != 0 {
            self.stream_reply(i, result);
            return;
        }
        add_part(g, result);
        if g.pending > 0 {
            return;
        }
        let g = self.gathers.swap_remove(i);
        let Some(slot) = self.conn_of(g.token) else {
            return; // the requester left; the resets happened regardless
        };
        let (lock_port, failed) = (g.lock_port, g.failed);
        let c = &mut self.conns[slot as usize];
        c.out.clear();
        encode_gathered(g, &mut c.out);
        if lock_port {
            let outcome = if failed {
                metrics::Outcome::Error
            } else {
                metrics::Outcome::Ok
            };
            self.metrics
                .request(metrics::Action::ResetBySource, outcome);
        }
        // Every part was durable before it replied.
        c.state = State::Answered;
        c.gate_lsn = 0;
        self.mark_dirty(slot);
    }

    /// A part of a KEYS stream's round (gather `i`): handed to the stream,
    /// the gather gone and the round done with its last part.
    fn stream_reply(&mut self, i: usize, result: RemoteResult) {
        let g = &self.gathers[i];
        let (stream, done) = (g.stream, g.pending == 0);
        if done {
            self.gathers.swap_remove(i);
        }
        self.keys_part(stream, result);
        if done {
            self.keys_round_done(stream);
        }
    }
}

/// Adds one shard's part (`result`, not a stream's) to gather `g`.
fn add_part(g: &mut Gather, result: RemoteResult) {
    match result {
        RemoteResult::KeysPart { .. } => unreachable!("stream replies are handled above"),
        RemoteResult::Done => {}
        RemoteResult::Reset(done) => {
            for i in done {
                g.reset[i as usize] = true;
            }
        }
        RemoteResult::Failed => g.failed = true,
        RemoteResult::Status(s) => g.status.push(*s),
        RemoteResult::Members(m) => g.members.push(*m),
        RemoteResult::Refused(why) => g.refused.push(why),
    }
}

/// The answer of gather `g`, every part in, written to `out`: a `CCHG`'s
/// (why shards refused), `-` when a part failed, a lock-port
/// ResetBySource's `+`, else the admin command's.
fn encode_gathered(g: Gather, out: &mut Vec<u8>) {
    if matches!(g.op, RemoteOp::ChangeMembers(_)) {
        let mut why = g.refused;
        why.sort();
        why.dedup();
        let result = if why.is_empty() && !g.failed {
            Ok(())
        } else {
            Err(why.join("; "))
        };
        protocol::members::encode_answer(&result, out);
    } else if g.failed {
        out.push(b'-');
    } else if g.lock_port {
        out.push(b'+');
    } else {
        match &g.op {
            RemoteOp::KeysOpen { .. } | RemoteOp::KeysMore { .. } | RemoteOp::KeysClose { .. } => {
                unreachable!("stream rounds are handled above")
            }
            RemoteOp::ResetKeys(_) | RemoteOp::ResetSources(_) => {
                let names = match &g.op {
                    RemoteOp::ResetKeys(keys) => keys.len(),
                    RemoteOp::ResetSources(sources) => sources.len(),
                    _ => unreachable!("matched above"),
                };
                for _ in 0..names {
                    out.push(b'+');
                }
                out.push(b'+');
            }
            RemoteOp::ResetIf(_) => {
                for &done in &g.reset {
                    out.push(if done { b'+' } else { b'#' });
                }
                out.push(b'+');
            }
            RemoteOp::ClusterStatus => {
                let mut recs = g.status;
                recs.sort_by_key(|r| r.shard);
                protocol::status::encode(&recs, out);
            }
            RemoteOp::TransferLeader { .. } => out.push(b'+'),
            RemoteOp::Members => {
                let mut recs = g.members;
                recs.sort_by_key(|r| r.shard);
                protocol::members::encode(&recs, out);
            }
            RemoteOp::ChangeMembers(_) => unreachable!("answered above"),
        }
    }
}
