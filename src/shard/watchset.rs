//! The watches an owner shard keeps (session op Watch, `docs/protocol.md`
//! "Watching a key"): which sessions are told about which of its keys.
//! The data only; what a watch does is in [`super::watch`].

use std::collections::HashMap;

use crate::core::Token;

/// One watch: the session, the connection its answers go to, and the
/// Watch's rid (every Event of the watch carries it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watcher {
    pub sid: u64,
    pub home: Token,
    pub rid: u32,
}

/// Every watch on this shard's keys, by key, in the order they began.
#[derive(Default)]
pub struct Watches {
    by_key: HashMap<Box<[u8]>, Vec<Watcher>>,
    /// How many watches each session has here (a session without one is
    /// skipped at its end without a scan).
    by_session: HashMap<u64, u32>,
    count: usize,
}

impl Watches {
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn add(&mut self, key: &[u8], w: Watcher) {
        self.by_key.entry(key.into()).or_default().push(w);
        *self.by_session.entry(w.sid).or_default() += 1;
        self.count += 1;
    }

    /// The watchers of `key`, appended to `out` in the order they began.
    pub fn of(&self, key: &[u8], out: &mut Vec<Watcher>) {
        if let Some(v) = self.by_key.get(key) {
            out.extend_from_slice(v);
        }
    }

    /// Ends session `sid`'s watch `rid` of `key`; false if there is none.
    pub fn remove(&mut self, key: &[u8], sid: u64, rid: u32) -> bool {
        let Some(v) = self.by_key.get_mut(key) else {
            return false;
        };
        let Some(i) = v.iter().position(|w| w.sid == sid && w.rid == rid) else {
            return false;
        };
        v.remove(i);
        if v.is_empty() {
            self.by_key.remove(key);
        }
        self.forget(sid, 1);
        true
    }

    /// Ends every watch of session `sid` here.
    pub fn remove_session(&mut self, sid: u64) {
        if !self.by_session.contains_key(&sid) {
            return;
        }
        let mut gone = 0;
        self.by_key.retain(|_, v| {
            let before = v.len();
            v.retain(|w| w.sid != sid);
            gone += before - v.len();
            !v.is_empty()
        });
        self.forget(sid, gone as u32);
    }

    /// Ends every watch here, returning the watchers.
    pub fn take_all(&mut self) -> Vec<Watcher> {
        let all = self.by_key.drain().flat_map(|(_, v)| v).collect();
        self.by_session.clear();
        self.count = 0;
        all
    }

    fn forget(&mut self, sid: u64, n: u32) {
        if let Some(c) = self.by_session.get_mut(&sid) {
            *c -= n;
            if *c == 0 {
                self.by_session.remove(&sid);
            }
        }
        self.count -= n as usize;
    }

    /// Consistency (tests, simulators): the counts match the lists.
    pub fn check(&self) {
        let listed: usize = self.by_key.values().map(Vec::len).sum();
        assert_eq!(listed, self.count, "watch count drifted");
        let by_session: u32 = self.by_session.values().sum();
        assert_eq!(
            by_session as usize, self.count,
            "per-session watch counts drifted"
        );
        assert!(
            self.by_key.values().all(|v| !v.is_empty()),
            "an empty watch list kept"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(sid: u64, rid: u32) -> Watcher {
        Watcher { sid, home: 1, rid }
    }

    #[test]
    fn watches_are_kept_per_key_in_order_and_removed_per_watch_or_session() {
        let mut ws = Watches::default();
        ws.add(b"a", w(1, 10));
        ws.add(b"a", w(2, 20));
        ws.add(b"b", w(1, 11));
        ws.check();
        let mut out = Vec::new();
        ws.of(b"a", &mut out);
        assert_eq!(out, vec![w(1, 10), w(2, 20)]);
        assert!(!ws.remove(b"a", 1, 11), "rid 11 watches b, not a");
        assert!(ws.remove(b"a", 2, 20));
        ws.check();
        ws.remove_session(1);
        ws.check();
        assert!(ws.is_empty());
        ws.add(b"c", w(3, 1));
        assert_eq!(ws.take_all(), vec![w(3, 1)]);
        ws.check();
        assert!(ws.is_empty());
    }
}
