//! A session watching every key, its answers delayed and split like any
//! client's: **every change reaches it once, in order** — a grant of a
//! token larger than any the key had, a release of a holder it was told
//! of, a proclaim of a holder it was told of, never more holders than the
//! key's access allows nor holders of different accesses — and whenever it
//! has read everything the server sent, its picture of each key's holders
//! (tokens, sources and accesses) is the server's.

use std::collections::{BTreeMap, VecDeque};

use ringlock::core::{Access, Table, Token};
use ringlock::protocol::session::{self as sp, Answer, Req};

use super::Rng;

/// A key's holders as the watcher knows them: token → (source, access).
pub type Picture = BTreeMap<u64, (Vec<u8>, Access)>;

#[derive(Default)]
pub struct Watcher {
    pub token: Option<Token>,
    /// Bytes the server sent, not yet read.
    pub to_client: VecDeque<u8>,
    rx: Vec<u8>,
    pub welcomed: bool,
    /// Watch rids answered `ok` (by key index).
    watching: Vec<bool>,
    holders: Vec<Picture>,
    /// The largest token it was told of, per key.
    top: Vec<u64>,
    last_ping_us: u64,
    pub events: u64,
    /// Of them, proclaims.
    pub proclaims: u64,
    /// Pictures compared with the server's.
    pub compared: u64,
}

/// The rid of the watcher's Watch of key `k`.
fn watch_rid(k: usize) -> u32 {
    100 + k as u32
}

/// The holders of `key` in `table` as a watcher pictures them.
pub fn picture_of(table: &Table, key: &[u8]) -> Picture {
    let mut p = Picture::new();
    table.for_each_holder_of(key, |h, a| {
        p.insert(h.grant_id, (h.source.to_vec(), a));
    });
    p
}

impl Watcher {
    /// A watcher on connection `token`, and the frames it sends first: its
    /// Hello, then a Watch of every key.
    pub fn open(
        token: Token,
        keys: &[&[u8]],
        keepalive_ms: u32,
        now_us: u64,
    ) -> (Watcher, Vec<u8>) {
        let w = Watcher {
            token: Some(token),
            watching: vec![false; keys.len()],
            holders: vec![BTreeMap::new(); keys.len()],
            top: vec![0; keys.len()],
            last_ping_us: now_us,
            ..Watcher::default()
        };
        let mut b = Vec::new();
        let hello = Req::Hello {
            version: sp::VERSION,
            keepalive_ms,
            auth: b"",
        };
        sp::encode(1, &hello, &mut b);
        for (k, key) in keys.iter().enumerate() {
            sp::encode(watch_rid(k), &Req::Watch { key }, &mut b);
        }
        (w, b)
    }

    /// A Ping to send, well within the keep-alive.
    pub fn ping(&mut self, now_us: u64, keepalive_ms: u32) -> Option<Vec<u8>> {
        if now_us < self.last_ping_us + keepalive_ms as u64 * 1000 / 4 {
            return None;
        }
        self.last_ping_us = now_us;
        let mut b = Vec::new();
        sp::encode(2, &Req::Ping, &mut b);
        Some(b)
    }

    /// True when it has read everything the server handed over.
    pub fn caught_up(&self) -> bool {
        self.welcomed && self.to_client.is_empty() && self.rx.is_empty()
    }

    /// Reads some of what the server sent (all of it with `all`), and
    /// checks each change against what it was told before.
    pub fn read(
        &mut self,
        rng: &mut Rng,
        all: bool,
        keys: &[&[u8]],
        trace_at: Option<u64>,
    ) -> Result<(), String> {
        if self.to_client.is_empty() {
            return Ok(());
        }
        let n = if all {
            self.to_client.len()
        } else {
            1 + rng.below(self.to_client.len() as u64) as usize
        };
        self.rx.extend(self.to_client.drain(..n));
        loop {
            let hello = (!self.welcomed).then_some(1);
            let Some((a, n)) = sp::decode_answer(&self.rx, hello)? else {
                return Ok(());
            };
            self.rx.drain(..n);
            if let Some(now) = trace_at {
                eprintln!("[{now}] watcher {a:?}");
            }
            self.answer(a, keys)?;
        }
    }

    fn answer(&mut self, a: Answer, keys: &[&[u8]]) -> Result<(), String> {
        match a {
            Answer::Welcome { .. } => self.welcomed = true,
            Answer::Reply { rid: 2, .. } => {}
            Answer::Reply { rid, status, .. } => {
                let k = (0..keys.len())
                    .find(|&k| watch_rid(k) == rid)
                    .ok_or(format!("a reply to rid {rid}, never sent"))?;
                if status != sp::Status::Ok || self.watching[k] {
                    return Err(format!("watch {rid} answered {status:?}"));
                }
                self.watching[k] = true;
                // The listing: holders the key may have together.
                fits(keys[k], &self.holders[k])?;
            }
            Answer::Event {
                rid,
                kind,
                token,
                key,
                source,
                access,
                ..
            } => {
                let k = (0..keys.len())
                    .find(|&k| watch_rid(k) == rid && keys[k] == key.as_slice())
                    .ok_or(format!("an event of rid {rid} for {key:?}"))?;
                let (listing, h) = (!self.watching[k], &mut self.holders[k]);
                match kind {
                    sp::EventKind::Holder if listing => {
                        h.insert(token, (source, access));
                    }
                    sp::EventKind::Holder => return Err("a holder event after the reply".into()),
                    _ if listing => return Err(format!("{kind:?} before the watch's reply")),
                    sp::EventKind::Granted => {
                        if token <= self.top[k] || h.insert(token, (source, access)).is_some() {
                            return Err(format!(
                                "granted {token} on {key:?}, not above {} or told twice",
                                self.top[k]
                            ));
                        }
                        fits(&key, h)?;
                        self.events += 1;
                    }
                    // The holder stays (its source changed), as it held.
                    sp::EventKind::Proclaimed => {
                        let Some(was) = h.get_mut(&token) else {
                            return Err(format!(
                                "proclaimed {token} on {key:?}: not a holder it knew"
                            ));
                        };
                        if was.1 != access {
                            return Err(format!(
                                "proclaimed {token} on {key:?} as {access:?}, granted as {:?}",
                                was.1
                            ));
                        }
                        was.0 = source;
                        self.events += 1;
                        self.proclaims += 1;
                    }
                    _ => {
                        match h.remove(&token) {
                            Some((_, a)) if a == access => {}
                            was => {
                                return Err(format!(
                                    "{kind:?} {token} ({access:?}) on {key:?}: it knew {was:?}"
                                ))
                            }
                        }
                        self.events += 1;
                    }
                }
                self.top[k] = self.top[k].max(token);
            }
            other => return Err(format!("unexpected {other:?}")),
        }
        Ok(())
    }

    /// Having read everything the server sent, its picture of key `k` is
    /// `server` (the key's owner's); keys not watched yet are skipped.
    pub fn compare(&mut self, k: usize, key: &[u8], server: &Picture) -> Result<(), String> {
        if !self.caught_up() || !self.watching[k] {
            return Ok(());
        }
        self.compared += 1;
        if *server != self.holders[k] {
            return Err(format!(
                "the watcher read everything and believes {key:?} is held by {:?}; the server says {server:?}",
                self.holders[k]
            ));
        }
        Ok(())
    }
}

/// Holders a key may have together: of one access, an exclusive one
/// alone, a semaphore of `n` at most `n`.
fn fits(key: &[u8], h: &Picture) -> Result<(), String> {
    let Some((_, a)) = h.values().next() else {
        return Ok(());
    };
    let ok = h.values().all(|(_, b)| b == a)
        && match a {
            Access::Exclusive => h.len() == 1,
            Access::Shared => true,
            Access::Semaphore(n) => *n >= 1 && h.len() <= *n as usize,
        };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{key:?} told of holders that cannot hold together: {h:?}"
        ))
    }
}
