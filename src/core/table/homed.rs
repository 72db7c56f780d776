//! The replicated sessions homed on this shard: their keep-alives and the
//! ids handed out for new ones.

use super::*;

impl Table {
    /// Replicated session `id` opened (decided by this shard as leader, or
    /// read from the log), with its keep-alive. Its id's counter (the low
    /// 55 bits) came from the grant counter, which moves past it: a later
    /// leader never hands the same id out again.
    pub fn session_opened(&mut self, id: u64, keepalive_ms: u32) {
        self.sessions_homed.insert(id, keepalive_ms);
        let counter = id & (REPLICATED_SESSION - 1);
        self.raise_next_grant_id(counter + 1);
    }

    /// Replicated session `id` ended; its keep-alive if it was known.
    pub fn session_closed(&mut self, id: u64) -> Option<u32> {
        self.sessions_homed.remove(&id)
    }

    /// Forgets every replicated session homed here (a snapshot installed
    /// replaces them all).
    pub fn sessions_forget(&mut self) {
        self.sessions_homed.clear();
    }

    /// The keep-alive of replicated session `id`, if it is open.
    pub fn session_keepalive(&self, id: u64) -> Option<u32> {
        self.sessions_homed.get(&id).copied()
    }

    /// Every open replicated session homed here: `(id, keepalive_ms)`.
    pub fn sessions_homed(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.sessions_homed.iter().map(|(&id, &ka)| (id, ka))
    }

    /// A new replicated session's id: `home` in the top 8 bits, the
    /// replicated bit, and the next grant id as its counter (taken: no
    /// token will carry it).
    pub fn next_session_id(&mut self, home: usize) -> u64 {
        let counter = self.next_grant_id & (REPLICATED_SESSION - 1);
        self.next_grant_id += 1;
        (home as u64) << 56 | REPLICATED_SESSION | counter
    }
}
