//! Locking-Center requests on a cluster node that does not serve: passed
//! to the serving leader over the peer link and answered from there, so
//! an unmodified Locking-Center client configured with any one node is
//! served.
//!
//! **The follower** (the node the client reached) decodes the request,
//! applies its own policies (TLS, `--lc-admin-actions`), moves the
//! connection to the key's shard as usual, and sends the whole frame with
//! the client's address as a Forward on the link of that shard's group to
//! the node it knows as group 0's leader (the node every group follows).
//! The connection waits in [`State::Forwarded`] until the leader's Answer,
//! which it relays like its own answer. It sends only while a link *from*
//! the leader is up (the answer's way back) and its link *to* the leader
//! is ready (TLS handshake done); with no leader known (an election),
//! either link down, a Forward the link could not take, or told by the
//! node it asked that it does not serve, the request never left and is
//! **parked**, and sent once a leader and its links are, for up to
//! [`Forwards::PARK_ELECTIONS`] election timeouts, then answered `-`
//! (nothing was done): a failover costs a follower's client a wait, not an
//! error. A Persist reveals no lock state and is answered locally; session
//! frames are never forwarded (sessions follow `not leader` themselves).
//!
//! **The leader** serves a Forward on a slot without a socket
//! ([`super::conn::Conn::fwd`]): the same decoding, table, durability gate
//! and metrics as a client of its own, one request per slot. Its answer
//! leaves only when its records are committed and applied (the gate), goes
//! back as an Answer, and frees the slot. A leader that does not serve
//! answers `-` at once and never forwards again.
//!
//! Rules (the contract of `docs/cluster.md`, "Locking-Center clients on
//! any node"):
//! - **Never a `+` the leader did not commit**: the follower relays only
//!   what the leader's gate let out.
//! - **`-` only for what did not happen; a close when nobody knows.** A
//!   leader that refuses a Forward (it is full), withdraws a queued Lock
//!   (stepping down, stopping), or a request parked past its time, is
//!   answered `-`: nothing was done. When the outcome is unknown — the link to or from the
//!   leader fails, a Forward cannot be sent, the node it went to stops
//!   being the leader this node knows (within an election timeout of a
//!   cut-off) and does not answer within [`Forwards::ORPHAN_TICKS`]
//!   ticks, or the leader stepped down with the answer decided but not
//!   committed — the client's connection is closed without an answer,
//!   exactly as a direct connection to that leader would have been: the
//!   client does not know whether it happened (docs/cluster.md: its safe
//!   clean-up is a ResetBySource of its own source). The request is
//!   withdrawn at the leader, best effort.
//! - **Hang-up withdraws**: a client that hangs up while its request waits
//!   has it withdrawn at the leader (Withdraw); a leader whose link to a
//!   follower fails withdraws every request of that follower.
//! - **No ghost from an undelivered `+`**: an Answer `+` carries its grant;
//!   if the client is gone before the `+` reaches its kernel, or the
//!   request was already answered `-`, the follower sends GiveBack and the
//!   leader releases that grant if it still holds.
//! - **Peers are not trusted blindly**: forwarding frames are decoded
//!   exactly ([`crate::cluster::wire::decode_forwarding`]); one no correct
//!   peer sends closes the link; a Forward is served only on a link whose
//!   node the TLS certificate (or Hello) named, and counts against the
//!   connection limit like a client.

pub(super) mod state;

use super::cmd::Cmd;
use super::conn::{Port, State};
use super::Shard;
use crate::cluster::wire::{self, Forwarding, Grant};
use crate::core::Token;
use crate::log::Level;
use crate::metrics::ForwardOutcome;
use state::{Forwards, Waiting};

impl Shard {
    // ----- the follower's side -------------------------------------------------

    /// Whether the Locking-Center request at the head of `slot`'s buffer is
    /// forwarded (this node does not serve, is a cluster member and not
    /// stopping; a client's request, not one forwarded to it).
    pub(super) fn forwards_requests(&self, slot: u32) -> bool {
        let c = &self.conns[slot as usize];
        self.journal.is_replicated()
            && !self.stopping
            && c.fwd.is_none()
            && c.sid == 0
            && c.port == Port::Lock
            // Locking-Center actions only (Persist included: answered here).
            && matches!(c.rbuf.first(), Some(1..=6))
    }

    /// The node a forwarded request goes to now: the leader this node
    /// knows of, when a link from it is up (its answer's way back) and the
    /// link to it is ready (the request's way there).
    fn forward_node(&self) -> Option<u64> {
        let (leader, me) = self.known_leader()?;
        let linked = self.forwards.inbound.get(&leader).is_some_and(|&n| n > 0)
            && self.forwards.ready.contains(&leader);
        (leader != 0 && leader != me && linked && !self.stopping).then_some(leader)
    }

    /// Parks the decoded frame `rbuf[..len]` of `slot` as a forwarded
    /// request and sends it if a leader is known (else at the next tick
    /// one is, within [`Forwards::PARK_ELECTIONS`] election timeouts).
    pub(super) fn forward(&mut self, slot: u32, len: usize, action: crate::protocol::Action) {
        let token = self.token(slot);
        let id = self.forwards.next_id;
        self.forwards.next_id += 1;
        let election_us = self.journal.election_us();
        let c = &mut self.conns[slot as usize];
        let req = c.rbuf[..len].to_vec();
        c.rbuf.drain(..len);
        c.action = Some(action);
        c.state = State::Forwarded { id };
        let until_us = self.now.mono_us + Forwards::PARK_ELECTIONS * election_us;
        self.forwards.waiting.insert(
            id,
            Waiting {
                token,
                node: 0,
                req,
                client: c.peer,
                until_us,
                retry_us: 0,
                orphan_us: 0,
            },
        );
        log!(
            Level::Debug,
            "lc_forward",
            "conn={:#x} id={} action={:?}",
            token,
            id,
            action
        );
        self.send_forward(id);
    }

    /// Sends parked request `id` to the leader, if one is known and it is
    /// not waiting out a refusal.
    fn send_forward(&mut self, id: u64) {
        let Some(node) = self.forward_node() else {
            return;
        };
        let now = self.now.mono_us;
        let term = self.journal.term().unwrap_or(0);
        let Some(w) = self.forwards.waiting.get_mut(&id) else {
            return;
        };
        if w.node != 0 || w.retry_us > now {
            return;
        }
        w.node = node;
        w.orphan_us = 0;
        let mut frame = Vec::with_capacity(48 + w.req.len());
        wire::encode_forward(id, term, w.client, &w.req, &mut frame);
        self.cmds.push(Cmd::PeerMust { node, frame });
    }

    /// The leader's answer to request `id` (from `node`'s link).
    fn forward_answered(&mut self, node: u64, id: u64, answer: u8, grant: Option<Grant>) {
        let slot = match self.forwards.waiting.get(&id) {
            Some(w) if w.node == node => {
                let token = w.token;
                if answer == wire::ANSWER_NOT_LEADER {
                    // Nothing done there: parked again, sent where this
                    // node's view says next (that node again after a tick:
                    // a leader elected and not yet serving).
                    let retry_us = self.now.mono_us + crate::cluster::TICK_US;
                    let w = self.forwards.waiting.get_mut(&id).expect("waiting");
                    w.park_again(retry_us);
                    return;
                }
                self.forwards.waiting.remove(&id);
                self.conn_of(token)
                    .filter(|&s| self.conns[s as usize].state == (State::Forwarded { id }))
            }
            // Not a request of ours to that node: a grant is given back.
            _ => None,
        };
        let Some(slot) = slot else {
            if let Some(g) = grant {
                self.give_back_remote(node, g);
            }
            return;
        };
        if let Some(m) = self.metrics.raft() {
            m.forwarded(ForwardOutcome::Answered);
        }
        if answer == wire::ANSWER_UNKNOWN {
            // The leader cannot tell: nor can we; the client sees what a
            // direct connection to it would have.
            self.conns[slot as usize].dead = true;
            self.close(slot);
            return;
        }
        self.forward_reply(slot, answer);
        self.conns[slot as usize].fwd_grant = grant.map(|g| (node, g));
    }

    /// Answers a forwarded request's connection. (`requests_total` counts
    /// it on the leader only, so that a sum over nodes counts it once;
    /// here it is `lc_forwarded_total`.)
    fn forward_reply(&mut self, slot: u32, answer: u8) {
        let c = &mut self.conns[slot as usize];
        c.state = State::Answered;
        c.out.push(answer);
        self.mark_dirty(slot);
    }

    /// The forwarded request `id` is given up here: withdrawn at the
    /// leader it went to, best effort (its answer, if one comes, is then
    /// ignored, a `+` given back).
    pub(super) fn forward_abandoned(&mut self, id: u64) {
        if let Some(w) = self.forwards.waiting.remove(&id) {
            if w.node != 0 {
                let mut frame = Vec::with_capacity(16);
                wire::encode_withdraw(id, &mut frame);
                self.cmds.push(Cmd::Peer {
                    node: w.node,
                    frame,
                });
            }
        }
    }

    /// Requests waiting for a leader this node can send them to.
    pub(super) fn forwards_parked(&self) -> u64 {
        self.forwards.parked().count() as u64
    }

    /// Whether forwarded request `id` was sent (its outcome is then the
    /// leader's) rather than parked (nothing done yet).
    pub(super) fn forward_sent(&self, id: u64) -> bool {
        self.forwards.waiting.get(&id).is_some_and(|w| w.node != 0)
    }

    /// Request `id` of connection `token` has an unknown outcome: the
    /// connection closes without an answer (withdrawn at the leader).
    fn forward_failed(&mut self, id: u64, token: Token) {
        if let Some(m) = self.metrics.raft() {
            m.forwarded(ForwardOutcome::Failed);
        }
        // close() withdraws it (forward_abandoned).
        match self.conn_of(token) {
            Some(slot) if self.conns[slot as usize].state == (State::Forwarded { id }) => {
                self.conns[slot as usize].dead = true;
                self.close(slot);
            }
            _ => self.forward_abandoned(id),
        }
    }

    /// Fails every sent request `pick` picks (closed: its outcome is
    /// unknown), and logs why.
    fn fail_sent(&mut self, pick: impl Fn(&Waiting) -> bool, why: &str) {
        let gone: Vec<(u64, Token)> = self
            .forwards
            .waiting
            .iter()
            .filter(|(_, w)| w.node != 0 && pick(w))
            .map(|(&id, w)| (id, w.token))
            .collect();
        if gone.is_empty() {
            return;
        }
        log!(
            Level::Info,
            "lc_forwards_failed",
            "shard={} requests={} reason=\"{}\"",
            self.me,
            gone.len(),
            crate::log::Escaped(why)
        );
        let mut nodes: Vec<u64> = gone
            .iter()
            .filter_map(|(id, _)| self.forwards.waiting.get(id).map(|w| w.node))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        for (id, token) in gone {
            self.forward_failed(id, token);
        }
        // What is still on its way there must never arrive: its clients
        // were told the outcome is unknown, and may act on it now.
        for node in nodes {
            self.cmds.push(Cmd::PeerReset { node });
        }
    }

    /// A forwarded `+` that did not reach its client: the leader releases
    /// the grant if it still holds (best effort).
    pub(super) fn give_back_remote(&mut self, node: u64, grant: Grant) {
        self.metrics.undelivered_grant();
        let mut frame = Vec::with_capacity(20);
        wire::encode_give_back(grant, &mut frame);
        self.cmds.push(Cmd::Peer { node, frame });
    }

    /// Once per replication tick: requests sent to a node that is no
    /// longer the leader this node knows of fail (closed: outcome
    /// unknown); parked ones are sent once a leader is known, or answered
    /// `-` (nothing was done) when their time is up.
    pub(super) fn check_forwards(&mut self) {
        if self.forwards.waiting.is_empty() {
            return;
        }
        let Some((leader, _)) = self.known_leader() else {
            return;
        };
        // A request sent to a node that is no longer the leader waits
        // ORPHAN_TICKS for that node's answer, then fails.
        let now = self.now.mono_us;
        let mut due = false;
        for w in self.forwards.waiting.values_mut() {
            if w.node == 0 || w.node == leader {
                w.orphan_us = 0;
            } else if w.orphan_us == 0 {
                w.orphan_us = now + Forwards::ORPHAN_TICKS * crate::cluster::TICK_US;
            } else if w.orphan_us <= now {
                due = true;
            }
        }
        if due {
            self.fail_sent(
                |w| w.orphan_us != 0 && w.orphan_us <= now,
                "the leader they went to is no longer the one this node knows, and did not answer",
            );
        }
        if self.may_serve() {
            // This node leads now: what waited for a leader is its own.
            self.serve_parked_here();
        }
        let parked: Vec<(u64, Token, bool)> = self
            .forwards
            .parked()
            .map(|(id, w)| (id, w.token, w.until_us <= now))
            .collect();
        for (id, token, expired) in parked {
            if !expired {
                self.send_forward(id);
                continue;
            }
            // Never sent anywhere: nothing was done; the client may retry.
            self.forwards.waiting.remove(&id);
            if let Some(m) = self.metrics.raft() {
                m.forwarded(ForwardOutcome::Failed);
            }
            if let Some(slot) = self.conn_of(token) {
                if self.conns[slot as usize].state == (State::Forwarded { id }) {
                    self.forward_reply(slot, b'-');
                }
            }
        }
    }

    /// Parked requests of a node that has begun to serve go back to their
    /// connections and are executed here, in the order they came.
    fn serve_parked_here(&mut self) {
        let parked = self.forwards.parked().map(|(id, _)| id).collect::<Vec<_>>();
        for id in parked {
            let w = self.forwards.waiting.remove(&id).expect("parked");
            let Some(slot) = self.conn_of(w.token) else {
                continue;
            };
            let c = &mut self.conns[slot as usize];
            if c.state != (State::Forwarded { id }) {
                continue;
            }
            // As if it had just been received: ahead of anything pipelined
            // behind it; a one-shot connection's one request again.
            c.rbuf.splice(0..0, w.req);
            c.state = State::Idle;
            if !c.persistent {
                c.action = None;
            }
            self.pump(slot);
            self.apply_effects();
        }
    }

    // ----- links ------------------------------------------------------------------

    /// A link from `node` came up (its Hello was accepted).
    pub(super) fn forward_link_up(&mut self, node: u64) {
        *self.forwards.inbound.entry(node).or_insert(0) += 1;
        self.send_parked_forwards();
    }

    /// The link to `node` is ready to carry requests (from the driver: its
    /// TLS handshake is done, or, without TLS, it connected): requests
    /// parked for want of it go now.
    pub fn on_peer_link_ready(&mut self, node: u64) {
        self.forwards.ready.insert(node);
        self.send_parked_forwards();
        self.apply_effects();
    }

    /// Sends the parked requests a leader can take now (their order kept).
    fn send_parked_forwards(&mut self) {
        if self.forward_node().is_none() {
            return;
        }
        let parked = self.forwards.parked().map(|(id, _)| id).collect::<Vec<_>>();
        for id in parked {
            self.send_forward(id);
        }
    }

    /// The link to `node` failed (from the driver): it carries no request
    /// until it is ready again, and those it carried fail.
    pub(super) fn forward_link_down(&mut self, node: u64) {
        self.forwards.ready.remove(&node);
        self.forward_link_lost(node, "the link to the leader failed");
    }

    /// A link from `node` failed (the driver): answers it was carrying may
    /// be lost, so requests waiting on `node` fail, and requests `node`
    /// forwarded here are withdrawn.
    pub fn on_peer_inbound_down(&mut self, node: u64) {
        if let Some(n) = self.forwards.inbound.get_mut(&node) {
            *n = n.saturating_sub(1);
        }
        self.forward_link_lost(node, "the link from the leader failed");
        self.apply_effects();
    }

    /// `frame`, for `node`, must arrive but could not be queued on its
    /// link (down, or full; the driver closes a full one after this). A
    /// Forward that never left this node did nothing anywhere: it is
    /// parked again, for the next leader or link that can take it. Any
    /// other frame is as if the link failed; an Answer `+` that never left
    /// cannot have reached its client: its grant is given back here.
    pub fn on_peer_undeliverable(&mut self, node: u64, frame: &[u8]) {
        let decoded = match wire::next_frame(frame, wire::FRAME_MAX) {
            Ok(Some((kind, payload, _))) => wire::decode_forwarding(kind, payload).ok(),
            _ => None,
        };
        match decoded {
            Some(Forwarding::Forward { id, .. }) => {
                if let Some(w) = self.forwards.waiting.get_mut(&id) {
                    if w.node == node {
                        w.park_again(0);
                        log!(
                            Level::Debug,
                            "lc_forward_parked",
                            "id={} peer={} reason=\"the link to the leader cannot take it\"",
                            id,
                            node
                        );
                    }
                }
                // Not ready: nothing more goes there until it is again.
                self.forwards.ready.remove(&node);
            }
            Some(Forwarding::Answer {
                grant: Some(grant), ..
            }) if self.may_serve() => {
                self.metrics.undelivered_grant();
                let now = self.now;
                self.table
                    .release_grant(grant.0, grant.1, now, &mut self.fx);
                self.forward_link_lost(node, "the link to the follower is down");
            }
            _ => self.forward_link_lost(node, "the link to the peer is down"),
        }
        self.apply_effects();
    }

    /// The way to or from `node` is broken.
    fn forward_link_lost(&mut self, node: u64, why: &str) {
        self.fail_sent(|w| w.node == node, why);
        // The leader's side: that follower's requests lose their way back.
        let theirs: Vec<u32> = self
            .forwards
            .serving
            .range((node, 0)..=(node, u64::MAX))
            .map(|(_, &slot)| slot)
            .collect();
        for slot in theirs {
            // Each as its own hang-up: giving a grant back may grant the
            // next waiter, maybe another of these, before it is looked at.
            if self.conns[slot as usize]
                .fwd
                .is_some_and(|(n, _)| n == node)
            {
                self.die(slot);
                self.apply_effects();
            }
        }
    }

    // ----- the leader's side ---------------------------------------------------------

    /// A forwarding frame from the link of `link` (its Hello's node). `Err`:
    /// one no correct peer sends (the driver closes the link).
    pub fn on_forwarding(&mut self, link: u64, kind: u8, payload: &[u8]) -> Result<(), String> {
        if !self.journal.is_replicated() {
            return Err("forwarding to a node that is not a cluster member".into());
        }
        match wire::decode_forwarding(kind, payload)? {
            Forwarding::Forward {
                id,
                term,
                client,
                frame,
            } => self.serve_forwarded(link, id, term, client, frame),
            Forwarding::Answer { id, answer, grant } => {
                self.forward_answered(link, id, answer, grant)
            }
            Forwarding::Withdraw { id } => {
                if let Some(&slot) = self.forwards.serving.get(&(link, id)) {
                    let c = &mut self.conns[slot as usize];
                    // As a client's hang-up: a queued Lock is withdrawn, a
                    // grant whose `+` waits for the log given back.
                    if c.state != State::Answered || c.grant.is_some() {
                        self.die(slot);
                    }
                }
            }
            Forwarding::GiveBack { grant } => {
                // Only a serving leader changes its table; a grant given
                // back elsewhere stays held (as after a failover).
                if self.may_serve() {
                    self.metrics.undelivered_grant();
                    let now = self.now;
                    self.table
                        .release_grant(grant.0, grant.1, now, &mut self.fx);
                }
            }
        }
        self.apply_effects();
        Ok(())
    }

    /// Takes up request `id` of node `link` on a slot of its own.
    fn serve_forwarded(
        &mut self,
        link: u64,
        id: u64,
        term: u64,
        client: std::net::SocketAddr,
        frame: &[u8],
    ) {
        let refuse = |s: &mut Shard, answer: u8, why: &str| {
            log!(
                Level::Debug,
                "lc_forward_refused",
                "from={} id={} reason=\"{}\"",
                link,
                id,
                why
            );
            let mut out = Vec::with_capacity(32);
            wire::encode_answer(id, answer, None, &mut out);
            s.cmds.push(Cmd::PeerMust {
                node: link,
                frame: out,
            });
        };
        if self.forwards.serving.contains_key(&(link, id)) {
            // A second request under one id: not a correct peer's.
            refuse(self, b'-', "a request id already in use");
            return;
        }
        if !self.may_serve() {
            // Never forwarded on: a node that does not serve says so.
            refuse(self, wire::ANSWER_NOT_LEADER, "not the leader");
            return;
        }
        if self.journal.term() != Some(term) {
            // Sent to this node as the leader of another term: maybe long
            // ago (its follower may have given it up since), maybe by a
            // follower that has not heard of this term yet. Nothing done;
            // a follower still waiting sends it again.
            refuse(self, wire::ANSWER_NOT_LEADER, "sent in another term");
            return;
        }
        if self.open_conns >= self.cfg.max_connections + self.cfg.admin_connections {
            self.metrics.connection_refused();
            refuse(self, b'-', "max_connections");
            return;
        }
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.conns.push(super::conn::Conn::new());
                (self.conns.len() - 1) as u32
            }
        };
        self.open_conns += 1;
        let c = &mut self.conns[slot as usize];
        c.open(Port::Lock, client);
        c.fwd = Some((link, id));
        // The follower applied the client-port policies (TLS, the
        // plaintext refusals) to its client; the link is mutual TLS.
        c.tls = true;
        c.rbuf.extend_from_slice(frame);
        self.forwards.serving.insert((link, id), slot);
        if let Some(m) = self.metrics.raft() {
            m.forward_served();
        }
        self.pump(slot);
    }

    /// Leader: what a forwarded slot closed before its answer left tells
    /// its follower (see [`Shard::free_forwarded`]): a request not yet
    /// executed or waiting in a queue did nothing; one decided and waiting
    /// for the log, or gathering other shards' parts, may yet commit.
    pub(super) fn forwarded_closing_answer(&self, slot: u32) -> Option<u8> {
        let c = &self.conns[slot as usize];
        if c.dead {
            return None;
        }
        Some(match c.state {
            State::Idle | State::Executing | State::Queued { .. } => b'-',
            _ => wire::ANSWER_UNKNOWN,
        })
    }

    /// Leader: `slot`'s answer may leave (from `flush`): it goes back to
    /// the node that forwarded it, with its grant, and the slot is freed.
    pub(super) fn send_forwarded(&mut self, slot: u32) {
        let c = &mut self.conns[slot as usize];
        let (node, id) = c.fwd.expect("a forwarded slot");
        let answer = c.out.first().copied().unwrap_or(wire::ANSWER_UNKNOWN);
        // Handed to the link: the follower gives it back if its client is
        // gone (GiveBack), so it is no longer this slot's to give back.
        let grant = c.grant.take();
        c.out.clear();
        let mut frame = Vec::with_capacity(32);
        wire::encode_answer(id, answer, grant, &mut frame);
        self.cmds.push(Cmd::PeerMust { node, frame });
        self.free_forwarded(slot, None);
    }

    /// Leader: frees a forwarded slot closed before its answer left,
    /// telling its follower `answer` first (`-`: a Lock withdrawn from its
    /// queue, nothing done; [`wire::ANSWER_UNKNOWN`]: decided, not
    /// committed; `None`: nothing, the follower gave it up or its link
    /// failed).
    pub(super) fn free_forwarded(&mut self, slot: u32, answer: Option<u8>) {
        let c = &mut self.conns[slot as usize];
        let (node, id) = c.fwd.expect("a forwarded slot");
        if let Some(answer) = answer {
            let mut frame = Vec::with_capacity(32);
            wire::encode_answer(id, answer, None, &mut frame);
            self.cmds.push(Cmd::PeerMust { node, frame });
        }
        if c.partial_link.linked {
            self.partial.unlink(&mut self.conns, slot, 0);
        }
        self.untouch(slot);
        self.keys_gone(slot);
        let c = &mut self.conns[slot as usize];
        c.state = State::Closing;
        c.release();
        self.free_slots.push(slot);
        self.open_conns -= 1;
        self.forwards.serving.remove(&(node, id));
    }
}
