//! Watching a key's holders (session ops Watch and Unwatch,
//! `docs/protocol.md` "Watching a key"), on the key's owner shard.
//!
//! A Watch is answered with one Event `holder` per holder the key has
//! now, then its Reply `ok`; from then on every grant and every release of
//! the key is an Event to each watcher, made from the table's effects in
//! the order the table decided them. Events travel as session answers do
//! ([`Shard::send_out`]): behind this shard's log, in order per pair of
//! shards, so a watcher never sees a change that a crash could undo, and
//! sees the changes of one key in their order. A watch takes no slot and
//! blocks nobody; it lasts until Unwatch or the end of its session's
//! connection (a Resume does not carry watches: the client watches again
//! and gets the key's holders as they are then).

use super::msg::SessOut;
use super::session::reply;
use super::watchset::Watcher;
use super::Shard;
use crate::core::{Effect, HeldRef, Name, ReleaseCause, Source, Token};
use crate::metrics::SessionOp;
use crate::protocol::session::{EventKind, Status};

impl Shard {
    /// Watch: `key`'s holders now, then the Reply.
    pub(super) fn watch_op(&mut self, sid: u64, home: Token, rid: u32, key: Name) {
        if self.watches.len() >= self.cfg.max_waiters {
            self.count_sess(SessionOp::Watch, Status::Limit);
            self.send_out(sid, home, reply(rid, Status::Limit));
            return;
        }
        let mut now_held = Vec::new();
        self.table.for_each_holder_of(key.as_bytes(), |h, _| {
            now_held.push(event(rid, EventKind::Holder, &h));
        });
        self.watches.add(key.as_bytes(), Watcher { sid, home, rid });
        for out in now_held {
            self.send_out(sid, home, out);
        }
        self.metrics.watches_changed(1);
        self.count_sess(SessionOp::Watch, Status::Ok);
        self.send_out(sid, home, reply(rid, Status::Ok));
    }

    /// Unwatch: ends the session's watch `target` of `key` (`not queued`
    /// when it has none). No Event of that watch follows its Reply.
    pub(super) fn unwatch_op(&mut self, sid: u64, home: Token, rid: u32, target: u32, key: Name) {
        let st = if self.watches.remove(key.as_bytes(), sid, target) {
            self.metrics.watches_changed(-1);
            Status::Ok
        } else {
            Status::NotQueued
        };
        self.count_sess(SessionOp::Unwatch, st);
        self.send_out(sid, home, reply(rid, st));
    }

    /// Session `sid` ended (or moved to another connection): its watches
    /// here end.
    pub(super) fn unwatch_session(&mut self, sid: u64) {
        let before = self.watches.len();
        self.watches.remove_session(sid);
        self.metrics
            .watches_changed(self.watches.len() as i64 - before as i64);
    }

    /// This shard's group stopped serving: every watch here ends, and a
    /// watcher must not be left waiting for Events that no longer come:
    /// each watcher's session homed on another shard is added once to
    /// `detach` as `(home shard, session, connection)` (the caller detaches
    /// them with the sessions that hold or wait here; a client resumes on
    /// the serving node and watches again). Sessions homed here close with
    /// this shard's connections.
    pub(super) fn unwatch_all(&mut self, detach: &mut Vec<(usize, u64, Token)>) {
        let all = self.watches.take_all();
        self.metrics.watches_changed(-(all.len() as i64));
        for w in all {
            let to = super::session::home_of(w.sid);
            let listed = detach
                .iter()
                .any(|&(_, sid, home)| sid == w.sid && home == w.home);
            if to != self.me && !listed {
                detach.push((to, w.sid, w.home));
            }
        }
    }

    /// A grant or a release of a watched key: an Event to each watcher.
    pub(super) fn watch_effect(&mut self, e: &Effect) {
        let (kind, out_of) = match *e {
            Effect::Granted {
                key_slot, grant_id, ..
            } => {
                let (h, _) = self.table.granted(key_slot, grant_id);
                (EventKind::Granted, h)
            }
            Effect::Released {
                released,
                grant_id,
                cause,
                ..
            } => (kind_of(cause), self.table.released(released, grant_id)),
            _ => return,
        };
        let first = event(0, kind, &out_of);
        self.watch_send(first);
    }

    /// A Proclaim of holder `grant_id` of key slot `key_slot` (the table
    /// holds it under its new source): the key's watchers are told.
    pub(super) fn watch_proclaimed(&mut self, key_slot: u32, grant_id: u64) {
        let (h, _) = self.table.granted(key_slot, grant_id);
        let first = event(0, EventKind::Proclaimed, &h);
        self.watch_send(first);
    }

    /// Sends Event `first` (its rid set for each) to every watcher of its
    /// key.
    fn watch_send(&mut self, first: SessOut) {
        let SessOut::Event { key, .. } = first else {
            return;
        };
        let mut to = std::mem::take(&mut self.watch_scratch);
        self.watches.of(key.as_bytes(), &mut to);
        if to.is_empty() {
            self.watch_scratch = to;
            return;
        }
        for w in to.drain(..) {
            let mut out = first;
            if let SessOut::Event { rid, .. } = &mut out {
                *rid = w.rid;
            }
            self.metrics.watch_event();
            self.send_out(w.sid, w.home, out);
        }
        self.watch_scratch = to;
    }
}

/// What a release tells a watcher.
fn kind_of(cause: ReleaseCause) -> EventKind {
    match cause {
        ReleaseCause::Unlock | ReleaseCause::Released | ReleaseCause::Undelivered => {
            EventKind::Released
        }
        ReleaseCause::Expired => EventKind::Expired,
        ReleaseCause::ResetByKey | ReleaseCause::ResetBySource => EventKind::Reset,
        ReleaseCause::SessionEnded => EventKind::SessionEnded,
    }
}

fn event(rid: u32, kind: EventKind, h: &HeldRef<'_>) -> SessOut {
    SessOut::Event {
        rid,
        kind,
        token: h.grant_id,
        hold: h.mode,
        access: h.access,
        key: Name::new(h.key).expect("keys are at most KEY_MAX"),
        source: Source::new(h.source).expect("sources are at most SOURCE_MAX"),
    }
}
