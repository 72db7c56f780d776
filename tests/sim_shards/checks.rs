//! The checks made after every step (see the main file's header), and
//! the watcher: a session on one shard watching every key.

use std::net::SocketAddr;

use ringlock::core::HoldMode;
use ringlock::shard::conn::Port;
use ringlock::shard::owner;

use super::{World, KEEPALIVE_MS, KEYS};
use crate::sim_common::{believers, check_believers, check_key, watcher, Watcher};

impl World {
    pub(super) fn check(&mut self) {
        for s in &self.shards {
            s.check_invariants();
        }
        let now = self.now.mono_us;
        for (k, key) in KEYS.iter().enumerate() {
            let o = owner(key, self.n);
            let table = self.shards[o].table();
            if let Err(e) = check_key(table, key, &mut self.seen[k]) {
                self.fail(format!("at {now}, owner shard {o}: {e}"));
            }
            for (i, s) in self.shards.iter().enumerate() {
                if i != o && s.table().holder_of(key).is_some() {
                    self.fail(format!("{key:?} held on shard {i}, owned by {o}"));
                }
            }
            let believers = believers(
                self.clients.iter().map(|cl| &cl.view),
                k,
                now,
                KEEPALIVE_MS as u64 * 1000,
            );
            if let Err(e) = check_believers(key, &believers) {
                self.fail(format!("at {now}: {e}"));
            }
            if believers.is_empty() {
                continue;
            }
            let holders = table.holders_of(key);
            for &(i, b) in &believers {
                let ok = holders.iter().any(|(h, a)| {
                    *a == b.access
                        && if b.mode == HoldMode::Persistent {
                            h.source.as_bytes() == self.clients[i].source.as_slice()
                        } else {
                            h.grant_id == b.token
                        }
                });
                if !ok {
                    self.fail(format!(
                        "client {i} believes it holds {key:?} ({b:?}) at {now}; the owner's \
                         holders are {holders:?}"
                    ));
                }
            }
        }
    }

    // ----- the watcher --------------------------------------------------

    /// Opens the watcher's session on its shard (a Hello, then a Watch of
    /// every key), and pings it well within its keep-alive. Its own frames
    /// reach the shard at once; the server's reach it late and split.
    pub(super) fn watcher_step(&mut self) {
        let now_us = self.now.mono_us;
        let s = self.watcher_shard;
        if self.watcher_closed {
            return;
        }
        let Some(token) = self.watcher.token else {
            let peer = SocketAddr::from(([127, 0, 0, 1], 9_999));
            let t = self.shards[s]
                .on_accept(Port::Lock, peer)
                .expect("a slot for the watcher");
            let (w, b) = Watcher::open(t, KEYS, KEEPALIVE_MS, now_us);
            self.watcher = w;
            self.shards[s].on_recv(t, &b);
            return;
        };
        if let Some(b) = self.watcher.ping(now_us, KEEPALIVE_MS) {
            self.shards[s].on_recv(token, &b);
        }
    }

    /// The watcher reads some of what its shard sent (all: `all`).
    pub(super) fn deliver_to_watcher(&mut self, all: bool) {
        let trace = std::env::var_os("SIM_TRACE")
            .is_some()
            .then_some(self.now.mono_us);
        if let Err(e) = self.watcher.read(&mut self.rng, all, KEYS, trace) {
            self.fail(format!("watcher: {e}"));
        }
    }

    /// With nothing in flight between shards (every event on its way to
    /// the watcher's shard arrived) and everything it was sent read, the
    /// watcher's picture of each key is its owner's.
    pub(super) fn check_watcher(&mut self) {
        if !self.watcher.caught_up() || self.mesh.values().any(|q| !q.is_empty()) {
            return;
        }
        for (k, key) in KEYS.iter().enumerate() {
            let o = owner(key, self.n);
            let server = watcher::picture_of(self.shards[o].table(), key);
            if let Err(e) = self.watcher.compare(k, key, &server) {
                self.fail(e);
            }
        }
    }
}
