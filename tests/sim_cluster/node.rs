//! One node's driver loops, as the simulator plays them: every tick of a
//! node runs each of its shards' ticks (one `begin_tick` .. `end_tick`
//! each, as every shard's own loop would), delivering what is due to
//! each group (writes landed on its disk, Raft frames from the same
//! group of the peers), the mesh between its shards (see `mesh.rs`),
//! connections handed over, and the clients' bytes; then it runs every
//! shard's commands.

use ringlock::cluster::wire;
use ringlock::shard::Cmd;
use ringlock::wal::log::Chain;

use super::{mesh, trace, Packet, World};

impl World {
    /// One tick of node `i`: its due events, then its commands.
    pub(super) fn node_step(&mut self, i: usize) {
        if self.nodes[i].paused || !self.nodes[i].up() {
            return;
        }
        let groups = self.groups;
        let now = self.node_now(i);
        let global = self.now;
        let mut landed = Vec::new();
        for g in 0..groups {
            while self.nodes[i].inflight[g]
                .front()
                .is_some_and(|w| w.2 <= global)
            {
                let w = self.nodes[i].inflight[g].pop_front().expect("front");
                landed.push((g, w));
            }
        }
        let mut packets = Vec::new();
        let mut k = 0;
        while k < self.net.len() {
            let p = &self.net[k];
            let held = p.must && self.cut.contains(&(p.from, i));
            if p.to == i && p.at <= global && !held {
                packets.push(self.net.swap_remove(k));
            } else {
                k += 1;
            }
        }
        // Reordering: deliver due packets in a random order.
        for j in (1..packets.len()).rev() {
            let o = self.rng.below(j as u64 + 1) as usize;
            packets.swap(j, o);
        }
        let inc = self.nodes[i].incarnation;
        // The driver's receive of a Migrating connection came back: the
        // connection leaves its shard for the owner, through the mesh.
        for c in 0..self.clients.len() {
            let cl = &self.clients[c];
            let Some((ni, g, t, ci)) = cl.at else {
                continue;
            };
            let Some(to) = cl.migrate_to.filter(|_| ni == i && ci == inc && !cl.moving) else {
                continue;
            };
            self.clients[c].migrate_to = None;
            let nd = &mut self.nodes[i];
            // None: it died meanwhile; its Close command closes it.
            if let Some(d) = nd.shards[g].detach(t) {
                nd.conns.remove(&(g, t));
                nd.mesh.send(g, to, mesh::Msg::Adopt { client: c, d });
                self.clients[c].moving = true;
            }
        }
        let mut sends: Vec<(usize, Vec<u8>)> = Vec::new();
        for c in 0..self.clients.len() {
            let cl = &mut self.clients[c];
            if let Some((ni, _, _, ci)) = cl.at {
                let stopped = cl.closing || cl.moving || cl.migrate_to.is_some();
                if ni == i && ci == inc && !cl.to_server.is_empty() && !stopped {
                    let n = 1 + self.rng.below(cl.to_server.len() as u64) as usize;
                    let bytes: Vec<u8> = cl.to_server.drain(..n).collect();
                    sends.push((c, bytes));
                }
            }
        }
        for s in &mut self.nodes[i].shards {
            s.begin_tick(now);
        }
        for (g, (chain, buf, _)) in landed {
            let disk = &mut self.nodes[i].disks[g];
            match chain {
                Chain::Append { offset } => {
                    let off = offset as usize;
                    if disk.len() < off + buf.len() {
                        disk.resize(off + buf.len(), 0);
                    }
                    disk[off..off + buf.len()].copy_from_slice(&buf);
                }
                // Written beside the log, synced, renamed over it: the
                // whole new file at once (a crash before leaves the old).
                Chain::Rewrite => *disk = buf.clone(),
                other => self.fail(format!("a cluster log ran {other:?}")),
            }
            self.nodes[i].shards[g].on_log_landed(chain, Ok(()), buf);
        }
        for p in packets {
            let s = &mut self.nodes[i].shards[p.group];
            match wire::next_frame(&p.frame, wire::FRAME_MAX) {
                Ok(Some((wire::KIND_RAFT, payload, _))) => {
                    s.on_raft_message(p.from as u64 + 1, payload)
                }
                Ok(Some((kind, payload, _))) if wire::is_forwarding(kind) => {
                    if trace() {
                        eprintln!(
                            "t={global} node {} <- node {}: forwarding frame {kind}, {} bytes",
                            i + 1,
                            p.from + 1,
                            payload.len()
                        );
                    }
                    if let Err(e) = s.on_forwarding(p.from as u64 + 1, kind, payload) {
                        self.fail(format!(
                            "node {} refused a forwarding frame of node {}: {e}",
                            i + 1,
                            p.from + 1
                        ));
                    }
                }
                other => self.fail(format!("a peer frame no node sends: {other:?}")),
            }
        }
        // The node's own shards' messages (none with one shard per node).
        while let Some((to, m)) = self.nodes[i].mesh.pick(&mut self.rng) {
            self.mesh_messages += 1;
            let s = &mut self.nodes[i].shards[to];
            if let Some((c, d)) = mesh::Mesh::deliver(s, m) {
                self.adopt(i, to, c, d);
            }
        }
        for (c, bytes) in sends {
            let (_, g, t, _) = self.clients[c].at.expect("connected");
            self.nodes[i].shards[g].on_recv(t, &bytes);
        }
        self.memb_ask(i);
        for g in 0..groups {
            let s = &mut self.nodes[i].shards[g];
            s.end_tick();
            if let Some(why) = s.cluster_fatal().map(str::to_string) {
                self.fail(format!("node {} (group {g}) stopped: {why}", i + 1));
            }
            // Every peer here is a correct one: a message the checks
            // refused is a check that is wrong (or a bug in raft-rs's
            // driving that sent it).
            if let Some(d) = s.raft_dropped().filter(|d| d.iter().any(|&n| n > 0)) {
                let reasons: Vec<String> = ringlock::cluster::check::Reason::ALL
                    .iter()
                    .zip(d)
                    .filter(|(_, n)| *n > 0)
                    .map(|(r, n)| format!("{}={n}", r.label()))
                    .collect();
                self.fail(format!(
                    "node {} (group {g}) refused messages of correct peers: {}",
                    i + 1,
                    reasons.join(" ")
                ));
            }
        }
        for g in 0..groups {
            self.run_cmds(i, g);
        }
    }

    /// A connection handed over reaches shard `to` of node `i`.
    fn adopt(&mut self, i: usize, to: usize, c: usize, d: ringlock::shard::Detached) {
        let inc = self.nodes[i].incarnation;
        let s = &mut self.nodes[i].shards[to];
        match s.on_adopt(&d) {
            Some(t) => {
                self.nodes[i].conns.insert((to, t), c);
                let cl = &mut self.clients[c];
                cl.at = Some((i, to, t, inc));
                cl.moving = false;
                if trace() {
                    eprintln!(
                        "t={} client {c} adopted by shard {to} of node {}",
                        self.now,
                        i + 1
                    );
                }
                self.nodes[i].shards[to].resume(t);
            }
            // Over the limit: the driver refuses and closes it.
            None => self.client_eof(c),
        }
    }

    fn run_cmds(&mut self, i: usize, g: usize) {
        let mut cmds = Vec::new();
        self.nodes[i].shards[g].take_cmds(&mut cmds);
        for cmd in cmds {
            match cmd {
                Cmd::Send(t) => {
                    let mut out = Vec::new();
                    let s = &mut self.nodes[i].shards[g];
                    s.take_output(t, &mut out);
                    s.on_send_done(t, Ok(()));
                    if let Some(&c) = self.nodes[i].conns.get(&(g, t)) {
                        self.clients[c].to_client.extend(out);
                    }
                }
                Cmd::Close(t) => {
                    self.nodes[i].shards[g].on_closed(t);
                    if let Some(c) = self.nodes[i].conns.remove(&(g, t)) {
                        // Answers already out still reach the client.
                        let cl = &mut self.clients[c];
                        cl.closing = true;
                        cl.migrate_to = None;
                    }
                }
                Cmd::Log { chain, buf } => {
                    let prev = self.nodes[i].inflight[g].back().map_or(0, |w| w.2);
                    // A compaction writes a whole file, syncs and renames
                    // it: slower than an append, and Raft runs on meanwhile.
                    let took = match chain {
                        Chain::Rewrite => 500 + self.rng.below(5_000),
                        _ => 50 + self.rng.below(400),
                    };
                    let at = (self.now + took).max(prev);
                    self.nodes[i].inflight[g].push_back((chain, buf, at));
                }
                // The simulated network reaches every node by its id.
                Cmd::PeerLink { .. } => {}
                // A frame that must arrive rides a link as TCP does: never
                // lost or doubled, held while the link is cut; a peer that
                // is gone is reported to its sender (the driver's
                // `on_peer_undeliverable`).
                Cmd::PeerMust { node, frame } => {
                    let to = node as usize - 1;
                    let gone =
                        to >= self.nodes.len() || self.nodes[to].retired || !self.nodes[to].up();
                    if gone {
                        super::FORWARDS_CUT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        self.nodes[i].shards[g].on_peer_undeliverable(node, &frame);
                        continue;
                    }
                    super::FORWARDING_FRAMES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let at = self.now + 20 + self.rng.below(self.max_delay_us);
                    self.net.push(Packet {
                        at,
                        from: i,
                        to,
                        group: g,
                        frame,
                        must: true,
                    });
                }
                // The link is aborted: what it has not sent yet (held
                // while cut) is discarded; what is on the wire arrives.
                // The peer learns of it when the reset (or the new link's
                // Hello) reaches it: here at once, as of a crash.
                Cmd::PeerReset { node } => {
                    let to = node as usize - 1;
                    if self.cut.contains(&(i, to)) {
                        self.net
                            .retain(|p| !(p.must && p.from == i && p.to == to && p.group == g));
                    }
                    self.nodes[i].shards[g].on_peer_link_down(node);
                    let me = i as u64 + 1;
                    // The driver dials it again at once: a new link, its
                    // Hello accepted.
                    if let Some(s) = self.nodes.get_mut(to).and_then(|n| n.shards.get_mut(g)) {
                        s.on_peer_inbound_down(me);
                    }
                    if let Some(h) = self.nodes[i].shards[g].peer_hello() {
                        if to < self.nodes.len() {
                            self.deliver_hello(i, to, g, &h);
                        }
                    }
                }
                // Group g's link: to group g of the peer.
                Cmd::Peer { node, frame } => {
                    let to = node as usize - 1;
                    if to >= self.nodes.len() || self.nodes[to].retired {
                        continue;
                    }
                    if self.cut.contains(&(i, to)) || self.rng.chance(self.loss_per_mille) {
                        continue;
                    }
                    let copies = if self.rng.chance(self.dup_per_mille) {
                        2
                    } else {
                        1
                    };
                    for _ in 0..copies {
                        let at = self.now + 20 + self.rng.below(self.max_delay_us);
                        self.net.push(Packet {
                            at,
                            from: i,
                            to,
                            group: g,
                            frame: frame.clone(),
                            must: false,
                        });
                    }
                }
                Cmd::Scatter { id, op } => {
                    let groups = self.groups;
                    let nd = &mut self.nodes[i];
                    nd.mesh.scatter(&mut nd.shards[g], g, groups, id, op);
                }
                Cmd::Reply { to, id, result } => {
                    let nd = &mut self.nodes[i];
                    nd.mesh.reply(&mut nd.shards[g], g, to, id, result);
                }
                Cmd::Sess { to, msg } if to < self.groups && to != g => {
                    self.nodes[i].mesh.send(g, to, mesh::Msg::Sess(msg));
                }
                Cmd::Migrate { token, to } if to < self.groups && to != g => {
                    self.migrations += 1;
                    let Some(&c) = self.nodes[i].conns.get(&(g, token)) else {
                        self.fail(format!(
                            "shard {g} of node {} migrates a connection of nobody",
                            i + 1
                        ));
                    };
                    let cl = &mut self.clients[c];
                    if cl.session && cl.res.pending.is_some() {
                        // A Resume that reached another shard than its
                        // session's home goes home.
                        self.resume_moves += 1;
                    }
                    cl.migrate_to = Some(to);
                }
                Cmd::Farewell(_) | Cmd::DiscardTemp => {}
                other @ (Cmd::Migrate { .. } | Cmd::Sess { .. }) => self.fail(format!(
                    "shard {g} of {} sent {other:?} to a shard that is not another of its node",
                    self.groups
                )),
            }
        }
    }
}
