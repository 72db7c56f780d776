//! Session clients that resume their session after a failover, as a
//! careful client does (docs/protocol.md, "Resuming a session (cluster
//! mode)"):
//! - it remembers its session id and whether the welcome was resumable;
//! - when its connection is lost and its keep-alive, counted from the last
//!   frame its session's server sent it, has not passed, it keeps what it
//!   believes (a session hold is believed while `alive_since + keep-alive`
//!   has not passed, a lease until its bound, exactly as before: the
//!   server keeps the session longer than that), connects to the next
//!   node and sends a Resume as the connection's first frame; `not
//!   leader`: the next node; `unknown session` (or any other refusal), or
//!   its keep-alive passed before it could send one: it gives up and
//!   believes nothing (what every session client did before);
//! - on the Held frames and the Welcome it reconciles:
//!   - a belief listed with the same token is kept (a lease keeps its own
//!     bound: the server promised it, and the new leader must keep it);
//!   - a belief not listed is dropped (counted lost); if it was still
//!     valid, the server lost an acknowledged grant: the run fails;
//!   - a listed hold with a token above any the client was answered for on
//!     that key, with an Acquire of that mode outstanding on the key, is
//!     that Acquire's grant: now believed (a lease until the later of the
//!     Acquire's send time + TTL and the Resume's send time + the TTL
//!     left, both lower bounds of its end), through the same token checks
//!     as any grant; with no such Acquire the run fails (a hold the
//!     session never asked for);
//!   - any other listed hold (one whose Release had no answer) is
//!     released again;
//!   - every other outstanding request is forgotten (queued Acquires are
//!     not kept across a failover; the workload carries on).
//!
//! After that every check of the main file (two owners, lost grant,
//! tokens) covers the resumed beliefs as any others, and covered them
//! while the client was between connections.
//!
//! Clients 1, 3 and 5 resume; client 7 abandons its session as before, so
//! abandoned sessions (whose holds end after the server's window) are
//! still simulated.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use ringlock::core::{Access, HoldMode};
use ringlock::protocol::session::{self as sp, Answer, Req, Status};

use super::{SessionView, World, KEEPALIVE_MS, KEYS};
use crate::sim_common::Belief;

/// One session client's resume state.
#[derive(Default)]
pub struct Res {
    /// This client resumes (else it abandons its session).
    pub enabled: bool,
    pub sid: u64,
    pub resumable: bool,
    /// The keep-alive the welcome said, µs.
    pub keepalive_us: u64,
    /// Global µs of the last frame its session's server sent it.
    pub last_rx_us: u64,
    /// Between connections, or on one with a Resume sent: not given up.
    pub resuming: bool,
    /// The Resume sent on this connection: (rid, send time).
    pub pending: Option<(u32, u64)>,
    /// Its Held frames so far: (key, token, mode, ttl left).
    pub held: Vec<(usize, u64, HoldMode, Option<u32>)>,
    /// The highest token the client was answered for, per key.
    pub known: BTreeMap<usize, u64>,
}

impl Res {
    pub fn new(enabled: bool) -> Res {
        Res {
            enabled,
            ..Res::default()
        }
    }
}

/// Counters over every seed of the test.
#[derive(Clone, Copy)]
pub enum Stat {
    /// Connections lost with the session kept (a resume begins).
    Lost,
    Sent,
    NotLeader,
    Unknown,
    /// Gave up: the keep-alive passed before a Resume could be sent.
    Expired,
    Resumed,
    /// Resumed with at least one Held frame.
    WithHolds,
    Kept,
    Learned,
    Rereleased,
    /// Beliefs dropped at a resume (no longer listed, already invalid).
    Dropped,
}

const N: usize = 11;
static STATS: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];

fn count(s: Stat) {
    STATS[s as usize].fetch_add(1, Ordering::Relaxed);
}

pub fn stat(s: Stat) -> u64 {
    STATS[s as usize].load(Ordering::Relaxed)
}

pub fn summary() -> String {
    use Stat::*;
    format!(
        "resume: {} sessions lost a connection and tried, {} Resumes sent, {} not leader, \
         {} unknown session, {} gave up (keep-alive passed), {} resumed ({} with holds listed): \
         {} holds kept, {} grants learned, {} re-released, {} beliefs dropped",
        stat(Lost),
        stat(Sent),
        stat(NotLeader),
        stat(Unknown),
        stat(Expired),
        stat(Resumed),
        stat(WithHolds),
        stat(Kept),
        stat(Learned),
        stat(Rereleased),
        stat(Dropped)
    )
}

/// Whether a client between connections still believes its holds (the
/// default, as `ringlock lock KEY -- CMD` keeps its command running across
/// a failover); `SIM_RESUME_GAP=0`: it believes nothing until its Resume is
/// answered (then what is listed), a weaker check.
pub fn gap_belief() -> bool {
    std::env::var("SIM_RESUME_GAP").as_deref() != Ok("0")
}

fn key_of(key: &[u8]) -> Option<usize> {
    KEYS.iter().position(|k| *k == key)
}

impl World {
    /// The session client's connection is gone: true when it keeps its
    /// view to resume the session, false when it gives the session up.
    pub(super) fn resume_keep(&mut self, c: usize) -> bool {
        let now = self.now;
        let cl = &mut self.clients[c];
        let r = &mut cl.res;
        r.pending = None;
        r.held.clear();
        let had = cl.view.welcomed || r.resuming;
        if r.enabled && r.resumable && had && now < r.last_rx_us + r.keepalive_us {
            if !r.resuming {
                count(Stat::Lost);
            }
            r.resuming = true;
            cl.view.welcomed = false;
            cl.rx.clear();
            return true;
        }
        if r.resuming {
            count(Stat::Expired);
        }
        cl.res = Res::new(r.enabled);
        false
    }

    /// Connecting: a client resuming sends its Resume (true), unless its
    /// keep-alive passed: then it gives up and says Hello (false).
    pub(super) fn resume_send(&mut self, c: usize) -> bool {
        let now = self.now;
        let cl = &mut self.clients[c];
        if !cl.res.resuming {
            return false;
        }
        if now >= cl.res.last_rx_us + cl.res.keepalive_us {
            count(Stat::Expired);
            cl.view = SessionView::default();
            cl.res = Res::new(cl.res.enabled);
            return false;
        }
        let req = Req::Resume {
            version: sp::VERSION,
            session_id: cl.res.sid,
            auth: b"",
        };
        let rid = cl.view.send(&req, None, now, &mut cl.to_server);
        cl.res.pending = Some((rid, now));
        count(Stat::Sent);
        if super::trace() {
            eprintln!(
                "t={now} session client {c} sends Resume rid {rid} of session {:#x}",
                cl.res.sid
            );
        }
        true
    }

    /// Before the view sees answer `a`: what the resume model takes from
    /// it. True when it was the Resume's answer (the view must not see it).
    pub(super) fn resume_answer(&mut self, c: usize, a: &Answer) -> bool {
        let now = self.now;
        let cl = &mut self.clients[c];
        if let Some((rid, _)) = cl.res.pending {
            match a {
                Answer::Held {
                    rid: r,
                    key,
                    token,
                    hold,
                    ttl_left_ms,
                } if *r == rid => {
                    let Some(k) = key_of(key) else {
                        self.fail(format!("client {c}: a Held frame for an unknown key"));
                    };
                    cl.res.held.push((k, *token, *hold, *ttl_left_ms));
                }
                Answer::Welcome { rid: r, welcome } if *r == rid => {
                    let w = *welcome;
                    self.resumed(c, w);
                }
                Answer::Reply { rid: r, status, .. } if *r == rid => {
                    // Any refusal closes: the session is given up.
                    if *status == Status::UnknownSession {
                        count(Stat::Unknown);
                        // The session is gone: so is every hold it had,
                        // and none may still be valid in its eyes.
                        let ka = KEEPALIVE_MS as u64 * 1000;
                        let valid: Vec<usize> = cl
                            .view
                            .holds
                            .iter()
                            .filter(|(_, b)| cl.view.valid(b, now, ka))
                            .map(|(&k, _)| k)
                            .collect();
                        if !valid.is_empty() {
                            let sid = cl.res.sid;
                            self.fail(format!(
                                "lost grant: session client {c}'s Resume of {sid:#x} was answered \
                                 unknown session while it still believes it holds {:?}",
                                valid
                                    .iter()
                                    .map(|&k| String::from_utf8_lossy(KEYS[k]))
                                    .collect::<Vec<_>>()
                            ));
                        }
                    } else if *status == Status::Ok {
                        self.fail(format!(
                            "client {c}: a Resume answered ok without a welcome"
                        ));
                    }
                    if super::trace() {
                        eprintln!(
                            "t={now} session client {c}: Resume refused {}",
                            status.name()
                        );
                    }
                    cl.view = SessionView::default();
                    cl.res = Res::new(cl.res.enabled);
                }
                Answer::Refused { status, .. } => {
                    // `not leader`: the connection closes, the next node.
                    if *status == Status::NotLeader {
                        count(Stat::NotLeader);
                    }
                }
                other => self.fail(format!(
                    "client {c}: {other:?} while its Resume (rid {rid}) is unanswered"
                )),
            }
            return true;
        }
        if !cl.view.welcomed {
            if let Answer::Welcome { welcome, .. } = a {
                cl.res.sid = welcome.session_id;
                cl.res.resumable = welcome.flags & sp::FLAG_RESUMABLE != 0;
                cl.res.keepalive_us = welcome.keepalive_ms as u64 * 1000;
                cl.res.last_rx_us = now;
            }
            return false;
        }
        cl.res.last_rx_us = now;
        if let Answer::Reply {
            rid,
            status: Status::Ok,
            token,
            ..
        } = a
        {
            if let Some(s) = cl.view.sent.get(rid) {
                if *token != 0 && s.hold.is_some() && !s.extend {
                    let m = cl.res.known.entry(s.key).or_insert(0);
                    *m = (*m).max(*token);
                }
            }
        }
        false
    }

    /// The Resume's welcome: the client reconciles what it believes with
    /// the Held list.
    fn resumed(&mut self, c: usize, w: sp::Welcome) {
        let now = self.now;
        let ka = KEEPALIVE_MS as u64 * 1000;
        let cl = &mut self.clients[c];
        let (_, sent_at) = cl.res.pending.take().expect("a Resume pending");
        if w.session_id != cl.res.sid || w.status != Status::Ok {
            let sid = cl.res.sid;
            self.fail(format!(
                "client {c} resumed session {sid:#x} and was welcomed to {:#x} ({})",
                w.session_id,
                w.status.name()
            ));
        }
        let held = std::mem::take(&mut cl.res.held);
        // A session may hold a key twice (shared, semaphore: a hold whose
        // Release had no answer, and a new grant), never one token twice.
        let mut listed: BTreeMap<usize, Vec<(u64, HoldMode, Option<u32>)>> = BTreeMap::new();
        for &(k, t, m, ttl) in &held {
            let l = listed.entry(k).or_default();
            if l.iter().any(|x| x.0 == t) {
                self.fail(format!(
                    "client {c}: a Resume listed {:?} token {t} twice",
                    KEYS[k]
                ));
            }
            l.push((t, m, ttl));
        }
        count(Stat::Resumed);
        if !held.is_empty() {
            count(Stat::WithHolds);
        }
        if super::trace() {
            eprintln!(
                "t={now} session client {c} resumed {:#x}: held {held:?}, believed {:?}",
                w.session_id, cl.view.holds
            );
        }
        let cl = &mut self.clients[c];
        let mut beliefs: Vec<(usize, Belief)> =
            std::mem::take(&mut cl.view.holds).into_iter().collect();
        beliefs.sort_by_key(|b| b.0);
        for (k, b) in beliefs {
            let at = listed
                .get(&k)
                .and_then(|l| l.iter().position(|x| x.0 == b.token));
            match at.map(|i| listed.get_mut(&k).expect("listed").remove(i)) {
                Some((t, m, _)) => {
                    if m != b.mode {
                        self.fail(format!(
                            "client {c}: a Resume listed {:?} token {t} as {m:?}, granted as {:?}",
                            KEYS[k], b.mode
                        ));
                    }
                    let cl = &mut self.clients[c];
                    cl.view.holds.insert(k, b);
                    count(Stat::Kept);
                }
                _ => {
                    let cl = &self.clients[c];
                    if cl.view.valid(&b, now, ka) {
                        self.fail(format!(
                            "lost grant: session client {c} resumed believing {:?} {b:?}, \
                             and its Resume listed {:?}",
                            String::from_utf8_lossy(KEYS[k]),
                            listed.get(&k)
                        ));
                    }
                    count(Stat::Dropped);
                }
            }
        }
        let mut release = Vec::new();
        let listed = listed
            .into_iter()
            .flat_map(|(k, l)| l.into_iter().map(move |x| (k, x)));
        for (k, (t, m, ttl)) in listed {
            let cl = &self.clients[c];
            let known = cl.res.known.get(&k).copied().unwrap_or(0);
            if t <= known {
                // A hold it released with no answer: release it again.
                release.push((k, t));
                continue;
            }
            let acqs: Vec<(u64, u32, Access)> = cl
                .view
                .queued
                .iter()
                .filter(|&&(_, qk)| qk == k)
                .filter_map(|(r, _)| cl.view.sent.get(r))
                .filter_map(|s| {
                    s.hold
                        .filter(|h| h.0 == m)
                        .map(|h| (s.at_us, h.1, s.access))
                })
                .collect();
            if acqs.is_empty() {
                self.fail(format!(
                    "client {c}: a Resume listed {:?} token {t} ({m:?}), which the session \
                     never asked for (outstanding: {:?}, tokens known {known})",
                    String::from_utf8_lossy(KEYS[k]),
                    cl.view.queued
                ));
            }
            // A Held frame does not say the access: the Acquire's, when
            // every candidate asked for the same; else it is released.
            let access = acqs[0].2;
            if acqs.iter().any(|a| a.2 != access) {
                release.push((k, t));
                continue;
            }
            let until_us = if m == HoldMode::Lease {
                let by_acquire = acqs
                    .iter()
                    .map(|&(at, ttl, _)| at + ttl as u64 * 1000)
                    .min();
                let by_resume = sent_at + ttl.unwrap_or(0) as u64 * 1000;
                by_acquire.unwrap_or(0).max(by_resume)
            } else {
                0
            };
            let b = Belief {
                token: t,
                mode: m,
                until_us,
                access,
            };
            let cl = &mut self.clients[c];
            cl.res.known.insert(k, t);
            // Valid by the session's new keep-alive (from the Resume).
            let alive = cl.view.alive_since_us;
            cl.view.alive_since_us = sent_at;
            let valid = cl.view.valid(&b, now, ka);
            cl.view.alive_since_us = alive;
            // One belief per key: a second hold of it is released.
            if !valid || cl.view.holds.contains_key(&k) {
                release.push((k, t));
                continue;
            }
            cl.view.holds.insert(k, b);
            count(Stat::Learned);
            self.grants += 1;
            // Exclusive holds are believed in grant order.
            if access == Access::Exclusive {
                let last = self.last_token.insert(k, t).unwrap_or(0);
                if t <= last {
                    self.fail(format!(
                        "tokens went back on {:?}: {t} learned by client {c}'s Resume after {last}",
                        String::from_utf8_lossy(KEYS[k])
                    ));
                }
            }
            let o = self.owner(k);
            self.max_acked_grant[o] = self.max_acked_grant[o].max(t);
        }
        let cl = &mut self.clients[c];
        // Every other request sent is forgotten: its answer never comes.
        cl.view.sent.clear();
        cl.view.queued.clear();
        cl.view.welcomed = true;
        cl.view.alive_since_us = sent_at;
        cl.res.resuming = false;
        cl.res.resumable = w.flags & sp::FLAG_RESUMABLE != 0;
        cl.res.keepalive_us = w.keepalive_ms as u64 * 1000;
        cl.res.last_rx_us = now;
        for (k, t) in release {
            count(Stat::Rereleased);
            let req = Req::Release {
                token: t,
                key: KEYS[k],
            };
            cl.view.send(&req, None, now, &mut cl.to_server);
        }
    }
}
