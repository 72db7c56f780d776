//! What the simulators share: their random number generator and the model
//! of a session client (what it sent, and what it believes it holds, by
//! the rules of the client library), the lock-mode checks (`modes.rs`)
//! and the watcher (`watcher.rs`).
#![allow(dead_code)]

pub mod modes;
pub mod watcher;

#[allow(unused_imports)]
pub use modes::{believers, check_believers, check_key, pick_access, Causal, KeySeen, Modes};
#[allow(unused_imports)]
pub use watcher::Watcher;

use std::collections::{BTreeMap, VecDeque};

use ringlock::core::{Access, HoldMode};
use ringlock::protocol::session::{self as sp, Answer, Req, Status, WAIT_FOREVER};

/// xorshift64: deterministic per seed, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// A session request the client sent and has no answer for yet.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    pub key: usize,
    /// Acquire: the hold mode and TTL; Extend: Lease and the TTL; Release,
    /// Cancel, Ping: None.
    pub hold: Option<(HoldMode, u32)>,
    pub at_us: u64,
    /// An Extend (its answer renews a lease still believed, never one the
    /// client released meanwhile).
    pub extend: bool,
    /// An Acquire's access (exclusive for every other request).
    pub access: Access,
}

/// A hold the client believes it has.
#[derive(Clone, Copy, Debug)]
pub struct Belief {
    pub token: u64,
    pub mode: HoldMode,
    /// A lease: believed until this instant (send time + TTL).
    pub until_us: u64,
    /// The access it asked for (and was granted: a semaphore of another
    /// `n` than the key's is refused).
    pub access: Access,
}

/// One session client's view, kept as the client library keeps it.
#[derive(Default)]
pub struct SessionView {
    pub welcomed: bool,
    pub next_rid: u32,
    pub sent: BTreeMap<u32, Sent>,
    /// Send time of the latest request whose answer arrived.
    pub alive_since_us: u64,
    /// Acquires sent and not answered: (rid, key).
    pub queued: Vec<(u32, usize)>,
    pub holds: BTreeMap<usize, Belief>,
    /// Acquires may be shared or semaphores (once the Welcome offers
    /// [`sp::FLAG_MODES`]); else every one is exclusive, as before
    /// issue #33, and the random choices are the ones they were.
    pub modes: bool,
    /// The Welcome's flags.
    pub flags: u8,
    /// No Acquire of a key it believes it holds or has an Acquire
    /// outstanding for: one hold per key at most, as a model that keeps
    /// one belief per key across a resume needs (a second shared grant
    /// would otherwise be held, unbelieved, for the session's life).
    pub one_per_key: bool,
}

/// What an answer changed, for the simulators' counters.
#[derive(Default)]
pub struct Counted {
    pub grants: u64,
    pub lost: u64,
    /// Grants of shared and of semaphore Acquires.
    pub shared: u64,
    pub semaphore: u64,
    /// Semaphore Acquires answered `mode_mismatch`.
    pub mismatches: u64,
}

impl SessionView {
    /// Encodes `req` into `out` under the next request id and remembers it
    /// (`what`: its key and hold; `None` for a Hello, Release, Cancel, Ping).
    pub fn send(
        &mut self,
        req: &Req<'_>,
        what: Option<Sent>,
        now_us: u64,
        out: &mut VecDeque<u8>,
    ) -> u32 {
        self.next_rid += 1;
        let rid = self.next_rid;
        let mut b = Vec::new();
        sp::encode(rid, req, &mut b);
        out.extend(b);
        self.sent.insert(
            rid,
            what.unwrap_or(Sent {
                key: 0,
                hold: None,
                at_us: now_us,
                extend: false,
                access: Access::Exclusive,
            }),
        );
        rid
    }

    /// One random request on key `k` of `keys`: an Acquire (session or
    /// lease; try, bounded or unbounded wait), a Release or Extend of a
    /// believed hold, a Ping, a Cancel of a queued Acquire. False: the
    /// client hangs up instead.
    pub fn random_request(
        &mut self,
        rng: &mut Rng,
        k: usize,
        keys: &[&[u8]],
        now_us: u64,
        out: &mut VecDeque<u8>,
    ) -> bool {
        self.random_request_ttl(rng, k, keys, now_us, out, 65)
    }

    /// [`SessionView::random_request`] with lease TTLs of 5 ms up to
    /// `max_ttl_ms` (exclusive; at least 6).
    pub fn random_request_ttl(
        &mut self,
        rng: &mut Rng,
        k: usize,
        keys: &[&[u8]],
        now_us: u64,
        out: &mut VecDeque<u8>,
        max_ttl_ms: u64,
    ) -> bool {
        let span = max_ttl_ms.max(6) - 5;
        match rng.below(100) {
            0..=39
                if self.one_per_key
                    && (self.holds.contains_key(&k) || self.queued.iter().any(|q| q.1 == k)) => {}
            0..=39 => {
                let (hold, ttl) = if rng.chance(500) {
                    (HoldMode::Lease, 5 + rng.below(span) as u32)
                } else {
                    (HoldMode::Session, 0)
                };
                let wait = match rng.below(3) {
                    0 => 0,
                    1 => WAIT_FOREVER,
                    _ => 1 + rng.below(40) as u32,
                };
                // Drawn only with modes on: an exclusive-only client's
                // choices stay the ones they were.
                let access = if self.modes && self.flags & sp::FLAG_MODES != 0 {
                    pick_access(rng, k)
                } else {
                    Access::Exclusive
                };
                let rid = self.send(
                    &Req::Acquire {
                        hold,
                        ttl_ms: ttl,
                        wait_ms: wait,
                        key: keys[k],
                        source: b"",
                        access,
                    },
                    Some(Sent {
                        key: k,
                        hold: Some((hold, ttl)),
                        at_us: now_us,
                        extend: false,
                        access,
                    }),
                    now_us,
                    out,
                );
                self.queued.push((rid, k));
            }
            40..=59 => {
                // Stop believing first: a release ends the critical section.
                if let Some(b) = self.holds.remove(&k) {
                    let req = Req::Release {
                        token: b.token,
                        key: keys[k],
                    };
                    self.send(&req, None, now_us, out);
                }
            }
            60..=74 => {
                if let Some(b) = self.holds.get(&k).copied() {
                    if b.mode == HoldMode::Lease {
                        let ttl = 5 + rng.below(span) as u32;
                        let req = Req::Extend {
                            token: b.token,
                            ttl_ms: ttl,
                            key: keys[k],
                        };
                        let what = Sent {
                            key: k,
                            hold: Some((HoldMode::Lease, ttl)),
                            at_us: now_us,
                            extend: true,
                            access: b.access,
                        };
                        // A shorter TTL may take effect the moment the
                        // server reads it: believed no longer than that.
                        if let Some(b) = self.holds.get_mut(&k) {
                            b.until_us = b.until_us.min(now_us + ttl as u64 * 1000);
                        }
                        self.send(&req, Some(what), now_us, out);
                    }
                }
            }
            75..=84 => {
                self.send(&Req::Ping, None, now_us, out);
            }
            85..=92 => {
                if !self.queued.is_empty() {
                    let (rid, k) = self.queued[rng.below(self.queued.len() as u64) as usize];
                    let req = Req::Cancel {
                        target: rid,
                        key: keys[k],
                    };
                    self.send(&req, None, now_us, out);
                }
            }
            93..=96 => {
                // A new source for a hold it believes (an election's
                // proclaim): changes no belief.
                if let Some(b) = self.holds.get(&k).copied() {
                    let source: &[u8] = [&b"v1"[..], b"v2", b""][rng.below(3) as usize];
                    let req = Req::Proclaim {
                        token: b.token,
                        key: keys[k],
                        source,
                    };
                    self.send(&req, None, now_us, out);
                }
            }
            _ => return false,
        }
        true
    }

    /// Applies one answer from the server; `Err` when the server broke the
    /// protocol (an answer to nothing sent).
    pub fn answer(&mut self, a: Answer, keys: &[&[u8]]) -> Result<Counted, String> {
        let mut n = Counted::default();
        match a {
            Answer::Held { rid, .. } => {
                return Err(format!("a Held frame (rid {rid}) with no Resume sent"))
            }
            Answer::Event { rid, .. } | Answer::OtherEvent { rid, .. } => {
                return Err(format!("an Event frame (rid {rid}) with no Watch sent"))
            }
            Answer::Welcome { welcome, .. } => {
                self.flags = welcome.flags;
                self.welcomed = true;
                self.alive_since_us = self.sent.get(&1).map_or(0, |s| s.at_us);
            }
            Answer::Reply {
                rid, status, token, ..
            } => {
                let s = self
                    .sent
                    .remove(&rid)
                    .ok_or_else(|| format!("reply to unknown rid {rid}"))?;
                self.alive_since_us = self.alive_since_us.max(s.at_us);
                self.queued.retain(|&(r, _)| r != rid);
                match (s.hold, status) {
                    // An Extend renews a lease the client still believes it
                    // holds; one it released meanwhile stays released.
                    (Some(_), Status::Ok)
                        if s.extend && self.holds.get(&s.key).is_none_or(|b| b.token != token) => {}
                    (Some((mode, ttl)), Status::Ok) if token != 0 => {
                        if !s.extend {
                            n.grants += 1;
                            match s.access {
                                Access::Exclusive => {}
                                Access::Shared => n.shared += 1,
                                Access::Semaphore(_) => n.semaphore += 1,
                            }
                        }
                        // An Extend sent after this one and not answered
                        // yet may shorten the lease any moment now.
                        let mut until_us = s.at_us + ttl as u64 * 1000;
                        for later in self.sent.values() {
                            if let (true, Some((_, t))) =
                                (later.extend && later.key == s.key, later.hold)
                            {
                                if later.at_us >= s.at_us {
                                    until_us = until_us.min(later.at_us + t as u64 * 1000);
                                }
                            }
                        }
                        self.holds.insert(
                            s.key,
                            Belief {
                                token,
                                mode,
                                until_us,
                                access: s.access,
                            },
                        );
                    }
                    // Only a semaphore names an `n` that can differ.
                    (hold, Status::ModeMismatch) => {
                        if hold.is_none() || s.extend || !matches!(s.access, Access::Semaphore(_)) {
                            return Err(format!(
                                "rid {rid} answered mode_mismatch: not a semaphore Acquire \
                                 ({:?}, {}, extend {})",
                                s.hold,
                                s.access.name(),
                                s.extend
                            ));
                        }
                        n.mismatches += 1;
                    }
                    // An Extend too late: the lease is gone.
                    (Some((HoldMode::Lease, _)), Status::Stale)
                        if self
                            .holds
                            .get(&s.key)
                            .is_some_and(|b| b.mode == HoldMode::Lease) =>
                    {
                        self.holds.remove(&s.key);
                    }
                    _ => {}
                }
            }
            Answer::Lost { key, token, .. } => {
                n.lost += 1;
                let k = keys
                    .iter()
                    .position(|x| *x == key.as_slice())
                    .ok_or("Lost for an unknown key")?;
                if self.holds.get(&k).is_some_and(|b| b.token == token) {
                    self.holds.remove(&k);
                }
            }
            Answer::Refused { status, .. } => {
                return Err(format!("the server refused the session: {}", status.name()))
            }
        }
        Ok(n)
    }

    /// Whether a belief is still valid at `now_us` by the client rules: a
    /// lease until its send time + TTL, a session hold until the last
    /// answered send + the keep-alive, a persistent hold until released.
    pub fn valid(&self, b: &Belief, now_us: u64, keepalive_us: u64) -> bool {
        match b.mode {
            HoldMode::Lease => now_us < b.until_us,
            HoldMode::Session => now_us < self.alive_since_us + keepalive_us,
            HoldMode::Persistent => true,
        }
    }
}
