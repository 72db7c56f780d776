//! Leading and not: a leader that loses leadership steps down (closes its
//! clients, fails its proposals, orphans its sessions), and a leader that
//! starts serving pushes lease deadlines back and orphans' holds become
//! leases (the rules in the parent module's header).

use super::*;

impl Shard {
    /// The leader lost leadership: close every client connection, fail the
    /// proposal in flight and what waits behind it, orphan the sessions.
    pub(super) fn step_down(&mut self, why: &str) {
        // Sessions homed on other shards of this node that hold or wait
        // here: their holds are in the log but no longer this shard's to
        // keep for them (a new leader turns them into leases and expires
        // them): each session ends at its home, whose client stops
        // believing. The home shard ends the ones homed here itself below.
        let me = self.me;
        let mut kills = Vec::new();
        self.table.for_each_owner(|sid, home| {
            let to = (sid >> 56) as usize;
            if to != me {
                kills.push((to, sid, home));
            }
        });
        // So are the sessions that only watch keys here.
        self.unwatch_all(&mut kills);
        for (to, sid, home) in kills {
            self.cmds.push(Cmd::Sess {
                to,
                msg: Box::new(crate::shard::msg::SessMsg::Detach { sid, home }),
            });
        }
        for slot in 0..self.conns.len() as u32 {
            let c = &self.conns[slot as usize];
            if matches!(c.state, State::Free | State::Closing | State::Migrating) {
                continue;
            }
            let c = &mut self.conns[slot as usize];
            if c.port != Port::Lock {
                continue;
            }
            if c.sid != 0 {
                // A session homed here: its holds on the other shards of
                // this node outlive it as leases (their groups may still
                // lead; its client learns of the end from the close).
                let (sid, mask) = (c.sid, c.mask);
                for to in (0..self.shards).filter(|&t| t != self.me) {
                    if self.shards <= 64 && mask & (1u64 << to) == 0 {
                        continue;
                    }
                    self.cmds.push(Cmd::Sess {
                        to,
                        msg: Box::new(crate::shard::msg::SessMsg::Orphan { sid }),
                    });
                }
            }
            if self.conns[slot as usize].fwd.is_some() {
                // A follower's request: it hears over the link what a
                // client of ours learns from the close (`-` for a Lock
                // withdrawn from its queue, else an unknown outcome).
                let answer = self.forwarded_closing_answer(slot);
                if let State::Queued { waiter } = self.conns[slot as usize].state {
                    self.table.withdraw(waiter);
                }
                let c = &mut self.conns[slot as usize];
                c.grant = None;
                c.out.clear();
                self.free_forwarded(slot, answer);
                continue;
            }
            let c = &mut self.conns[slot as usize];
            if let State::Queued { waiter } = c.state {
                self.table.withdraw(waiter);
            }
            let c = &mut self.conns[slot as usize];
            c.dead = true;
            c.read_closed = true;
            c.grant = None;
            c.out.clear();
            self.close(slot);
        }
        let r = self.journal.replica_mut().expect("replica");
        if let Some((_, _, buf)) = r.proposal.take() {
            let log = &mut r.batch;
            log.proposal_landed(Err(()), buf);
        }
        // The sessions' queued requests go first: queued behind the
        // records now voided, they could stand in an undo's way (a
        // semaphore's n fixed meanwhile).
        self.table.drop_session_waiters();
        self.fail_pending(Voided::LeadershipLost, why, 0);
        let r = self.journal.replica_mut().expect("replica");
        r.view.serving[r.group].store(false, Ordering::Release);
        r.was_serving = false;
        self.table.drop_owners();
        // Nothing this node decides now is proposed.
        self.fx.clear();
    }

    /// Publishes whether this shard serves; extends every lease deadline
    /// when serving begins.
    pub(super) fn note_serving(&mut self) {
        let Some(r) = self.journal.replica_mut() else {
            return;
        };
        let serving = r.replica.serving();
        if serving == r.was_serving {
            return;
        }
        r.was_serving = serving;
        r.view.serving[r.group].store(serving, Ordering::Release);
        let (group, term, id) = (r.group, r.replica.term(), r.replica.id());
        if serving {
            let keep_us = r.session_keep_ms * 1000;
            let first = r.served_term != term;
            // A new term: an election timeout for every lease. The same
            // term after the lease lapsed (the loop stalled, a quorum was
            // out of reach): the time clients could not renew, at most an
            // election timeout.
            let by = if first {
                r.election_us
            } else {
                self.now
                    .mono_us
                    .saturating_sub(r.stopped_serving_us)
                    .min(r.election_us)
            };
            r.served_term = term;
            // Local only: the pushed-back deadlines are not replicated, so
            // a later leader does not know them (seed 3474 of the cluster
            // simulator: a time left told to a resumed client after this
            // push can outlast the next leader's deadline: not fixed yet).
            self.table.extend_leases(by);
            // Session holds owned by nobody: a former leader's sessions, or
            // this one's whose releases could not commit while it did not
            // serve (their sessions ended).
            let now = self.now;
            self.table.expire_orphans(keep_us, now);
            // Replicated sessions nobody has: kept for a resume.
            self.arm_resume_windows();
            log!(
                Level::Info,
                "raft_serving",
                "group={} node={} term={} leases_extended_ms={} first_in_term={}",
                group,
                id,
                term,
                by / 1000,
                first
            );
        } else {
            log!(
                if self.stopping {
                    Level::Info
                } else {
                    Level::Warn
                },
                "raft_not_serving",
                "group={} node={} term={} reason=\"leader lease lapsed\"",
                group,
                id,
                term
            );
        }
    }
}
