//! The table's unit and property tests.

use super::*;
use crate::core::Source;
use proptest::prelude::*;
use std::collections::{HashMap, VecDeque};

fn ep(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}
fn n(s: &str) -> Name {
    Name::new(s.as_bytes()).unwrap()
}
fn t() -> Table {
    Table::new(Limits {
        max_keys: 64,
        max_waiters: 64,
    })
}
fn at(us: u64) -> Now {
    Now {
        mono_us: us,
        unix_ms: 1_700_000_000_000 + us / 1000,
    }
}
/// A Lock or TryLock from `conn` at `us` µs (endpoint 127.0.0.1:1).
fn lk(
    tb: &mut Table,
    fx: &mut Effects,
    conn: Token,
    key: &str,
    src: &str,
    mode: LockMode,
    us: u64,
) -> Option<u32> {
    tb.lock(conn, &n(key), &n(src), ep(1), mode, at(us), fx)
}

fn granted(fx: &Effects) -> Vec<Token> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Granted { conn, .. } => Some(*conn),
            _ => None,
        })
        .collect()
}
fn replies(fx: &Effects) -> Vec<(Token, Reply)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Reply { conn, reply } => Some((*conn, *reply)),
            Effect::Granted { conn, .. } => Some((*conn, Reply::Ok)),
            _ => None,
        })
        .collect()
}

#[test]
fn fifo_handoff_and_withdrawal_from_the_middle() {
    let mut tb = t();
    let mut fx = Vec::new();
    lk(&mut tb, &mut fx, 1, "k", "a", LockMode::Blocking, 0);
    let mut ws = Vec::new();
    for c in 2..=6 {
        ws.push(lk(&mut tb, &mut fx, c, "k", "b", LockMode::Blocking, c).unwrap());
    }
    assert_eq!(granted(&fx), vec![1]);
    tb.withdraw(ws[1]); // conn 3 hangs up
    tb.check_invariants();
    fx.clear();
    for (i, want) in [2, 4, 5, 6].iter().enumerate() {
        tb.unlock(100 + i as u64, &n("k"), at(100), &mut fx);
        assert_eq!(granted(&fx), vec![*want]);
        fx.clear();
        tb.check_invariants();
    }
    tb.unlock(200, &n("k"), at(200), &mut fx);
    assert_eq!(replies(&fx), vec![(200, Reply::Ok)]);
    assert_eq!(tb.key_entries(), 0);
    tb.check_invariants();
}

#[test]
fn try_lock_and_unlock_of_free_key() {
    let mut tb = t();
    let mut fx = Vec::new();
    tb.unlock(9, &n("free"), at(0), &mut fx);
    assert_eq!(replies(&fx), vec![(9, Reply::Ok)]);
    fx.clear();
    lk(&mut tb, &mut fx, 1, "k", "a", LockMode::Try, 0);
    lk(&mut tb, &mut fx, 2, "k", "a", LockMode::Try, 0);
    assert_eq!(replies(&fx), vec![(1, Reply::Ok), (2, Reply::Busy)]);
    tb.check_invariants();
}

#[test]
fn reset_by_source_answers_its_waiters_and_frees_its_keys() {
    let mut tb = t();
    let mut fx = Vec::new();
    lk(&mut tb, &mut fx, 1, "k1", "s", LockMode::Blocking, 0);
    lk(&mut tb, &mut fx, 2, "k2", "s", LockMode::Blocking, 0);
    lk(&mut tb, &mut fx, 3, "k1", "other", LockMode::Blocking, 0);
    lk(&mut tb, &mut fx, 4, "k3", "other", LockMode::Blocking, 0);
    lk(&mut tb, &mut fx, 5, "k3", "s", LockMode::Blocking, 0);
    fx.clear();
    tb.reset_by_source(Some(99), &n("s"), at(10), &mut fx);
    tb.check_invariants();
    let r = replies(&fx);
    assert!(r.contains(&(5, Reply::Withdrawn)));
    assert!(r.contains(&(3, Reply::Ok)), "k1 handed to the other source");
    assert_eq!(r.last(), Some(&(99, Reply::Ok)));
    assert!(tb.holder_of(b"k2").is_none());
    assert_eq!(
        tb.holder_of(b"k1").unwrap().source,
        Source::new(b"other").unwrap()
    );
    assert_eq!(tb.held_keys(), 2);
}

#[test]
fn reset_if_releases_only_the_holder_with_that_token_and_hands_over() {
    let mut tb = t();
    let mut fx = Vec::new();
    lk(&mut tb, &mut fx, 1, "k", "a", LockMode::Blocking, 0);
    lk(&mut tb, &mut fx, 2, "k", "b", LockMode::Blocking, 0);
    let first = tb.grant_of(b"k").expect("held");
    fx.clear();
    // Another token, or a key nobody holds: nothing changes.
    assert!(!tb.reset_if(b"k", first + 1, at(5), &mut fx));
    assert!(!tb.reset_if(b"free", 1, at(5), &mut fx));
    assert!(fx.is_empty());
    assert_eq!(tb.grant_of(b"k"), Some(first));
    // The holder's token: released, and the waiter is granted the key.
    assert!(tb.reset_if(b"k", first, at(10), &mut fx));
    tb.check_invariants();
    assert_eq!(granted(&fx), vec![2]);
    let second = tb.grant_of(b"k").expect("handed over");
    assert!(second > first);
    assert_eq!(
        tb.holder_of(b"k").unwrap().source,
        Source::new(b"b").unwrap()
    );
    // The old token cannot reset the new holder.
    fx.clear();
    assert!(!tb.reset_if(b"k", first, at(20), &mut fx));
    assert_eq!(tb.grant_of(b"k"), Some(second));
    assert!(tb.reset_if(b"k", second, at(30), &mut fx));
    assert_eq!(tb.held_keys(), 0);
    tb.check_invariants();
}

#[test]
fn undelivered_grant_is_released_only_if_still_held_by_it() {
    let mut tb = t();
    let mut fx = Vec::new();
    lk(&mut tb, &mut fx, 1, "k", "a", LockMode::Blocking, 0);
    let Effect::Granted {
        key_slot, grant_id, ..
    } = fx[0]
    else {
        panic!()
    };
    lk(&mut tb, &mut fx, 2, "k", "a", LockMode::Blocking, 0);
    fx.clear();
    assert!(tb.release_grant(key_slot, grant_id, at(5), &mut fx));
    assert_eq!(granted(&fx), vec![2]);
    fx.clear();
    assert!(!tb.release_grant(key_slot, grant_id, at(5), &mut fx));
    assert!(fx.is_empty());
}

#[test]
fn limits_refuse_instead_of_growing() {
    let mut tb = Table::new(Limits {
        max_keys: 2,
        max_waiters: 1,
    });
    let mut fx = Vec::new();
    lk(&mut tb, &mut fx, 1, "a", "s", LockMode::Blocking, 0);
    lk(&mut tb, &mut fx, 2, "b", "s", LockMode::Blocking, 0);
    lk(&mut tb, &mut fx, 3, "c", "s", LockMode::Blocking, 0);
    assert!(tb
        .lock(
            4,
            &n("a"),
            &n("s"),
            ep(1),
            LockMode::Blocking,
            at(0),
            &mut fx
        )
        .is_some());
    assert!(tb
        .lock(
            5,
            &n("a"),
            &n("s"),
            ep(1),
            LockMode::Blocking,
            at(0),
            &mut fx
        )
        .is_none());
    assert_eq!(
        replies(&fx),
        vec![
            (1, Reply::Ok),
            (2, Reply::Ok),
            (3, Reply::Limit),
            (5, Reply::Limit)
        ]
    );
    tb.check_invariants();
}

#[test]
fn oldest_hold_follows_grant_order() {
    let mut tb = t();
    let mut fx = Vec::new();
    lk(&mut tb, &mut fx, 1, "a", "s", LockMode::Blocking, 1000);
    lk(&mut tb, &mut fx, 2, "b", "s", LockMode::Blocking, 2000);
    assert_eq!(tb.oldest_acquired_unix_ms(), Some(at(1000).unix_ms));
    tb.unlock(3, &n("a"), at(3000), &mut fx);
    assert_eq!(tb.oldest_acquired_unix_ms(), Some(at(2000).unix_ms));
}

#[derive(Debug, Clone)]
enum Op {
    Lock(u8, u8, bool),
    Unlock(u8),
    ResetKey(u8),
    ResetSource(u8),
    Withdraw(usize),
    Undeliver(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, 0u8..3, any::<bool>()).prop_map(|(k, s, t)| Op::Lock(k, s, t)),
        2 => (0u8..4).prop_map(Op::Unlock),
        1 => (0u8..4).prop_map(Op::ResetKey),
        1 => (0u8..3).prop_map(Op::ResetSource),
        1 => any::<usize>().prop_map(Op::Withdraw),
        1 => any::<usize>().prop_map(Op::Undeliver),
    ]
}

/// key -> (holder conn, holder source, queue of (conn, source))
type ModelKeys = HashMap<u8, (Token, u8, VecDeque<(Token, u8)>)>;

#[derive(Default)]
struct Model {
    keys: ModelKeys,
}

impl Model {
    fn release(&mut self, k: u8, out: &mut Vec<(Token, Reply)>) {
        if let Some(e) = self.keys.get_mut(&k) {
            if let Some((c, s)) = e.2.pop_front() {
                e.0 = c;
                e.1 = s;
                out.push((c, Reply::Ok));
            } else {
                self.keys.remove(&k);
            }
        }
    }
}

proptest! {
    /// The table agrees with a naive model on every reply and every
    /// holder, and keeps its invariants, under random operations.
    #[test]
    fn table_matches_model(ops in proptest::collection::vec(op(), 1..200)) {
        let mut tb = t();
        let mut m = Model::default();
        let mut fx = Vec::new();
        let mut waiters: Vec<(Token, u32)> = Vec::new(); // queued (conn, waiter slot)
        let mut grants: HashMap<Token, (u32, u64)> = HashMap::new();
        for (i, o) in ops.into_iter().enumerate() {
            fx.clear();
            let now = at(i as u64);
            let mut want: Vec<(Token, Reply)> = Vec::new();
            let conn = i as Token + 1;
            match o {
                Op::Lock(k, s, try_) => {
                    let kn = n(&format!("k{k}"));
                    let sn = n(&format!("s{s}"));
                    let mode = if try_ { LockMode::Try } else { LockMode::Blocking };
                    let w = tb.lock(conn, &kn, &sn, ep(1), mode, now, &mut fx);
                    match m.keys.get_mut(&k) {
                        None => { m.keys.insert(k, (conn, s, VecDeque::new())); want.push((conn, Reply::Ok)); }
                        Some(_) if try_ => want.push((conn, Reply::Busy)),
                        Some(e) => { e.2.push_back((conn, s)); }
                    }
                    if let Some(w) = w { waiters.push((conn, w)); }
                }
                Op::Unlock(k) | Op::ResetKey(k) => {
                    let kn = n(&format!("k{k}"));
                    if matches!(o, Op::Unlock(_)) { tb.unlock(conn, &kn, now, &mut fx) } else { tb.reset_by_key(Some(conn), &kn, now, &mut fx) }
                    m.release(k, &mut want);
                    want.push((conn, Reply::Ok));
                }
                Op::ResetSource(s) => {
                    tb.reset_by_source(Some(conn), &n(&format!("s{s}")), now, &mut fx);
                    let mut keys: Vec<u8> = m.keys.keys().copied().collect();
                    keys.sort();
                    for k in &keys {
                        let e = m.keys.get_mut(k).unwrap();
                        let before: Vec<_> = e.2.drain(..).collect();
                        for (c, ws) in before {
                            if ws == s { want.push((c, Reply::Withdrawn)); } else { e.2.push_back((c, ws)); }
                        }
                    }
                    for k in keys {
                        if m.keys[&k].1 == s { m.release(k, &mut want); }
                    }
                    want.push((conn, Reply::Ok));
                }
                Op::Withdraw(i) => {
                    if !waiters.is_empty() {
                        let (c, w) = waiters.remove(i % waiters.len());
                        tb.withdraw(w);
                        for e in m.keys.values_mut() { e.2.retain(|(wc, _)| *wc != c); }
                    }
                }
                Op::Undeliver(i) => {
                    let mut held: Vec<_> = grants.iter().map(|(c, g)| (*c, *g)).collect();
                    held.sort();
                    if !held.is_empty() {
                        let (c, (slot, gid)) = held[i % held.len()];
                        grants.remove(&c);
                        let did = tb.release_grant(slot, gid, now, &mut fx);
                        let mk = m.keys.iter().find(|(_, e)| e.0 == c).map(|(k, _)| *k);
                        prop_assert_eq!(did, mk.is_some());
                        if let Some(k) = mk { m.release(k, &mut want); }
                    }
                }
            }
            for e in &fx {
                match e {
                    Effect::Granted { conn, key_slot, grant_id, .. } => { grants.insert(*conn, (*key_slot, *grant_id)); waiters.retain(|(c, _)| c != conn); }
                    Effect::Reply { conn, .. } => waiters.retain(|(c, _)| c != conn),
                    Effect::Released { holder_conn, .. } => { grants.remove(holder_conn); }
                    Effect::LimitReached { .. } => {}
                }
            }
            // Order among different keys is not specified; compare as multisets.
            let mut got = replies(&fx);
            got.sort_by_key(|(c, r)| (*c, r.byte()));
            want.sort_by_key(|(c, r)| (*c, r.byte()));
            prop_assert_eq!(got, want);
            tb.check_invariants();
            prop_assert_eq!(tb.held_keys(), m.keys.len());
            prop_assert_eq!(tb.queued_waiters(), m.keys.values().map(|e| e.2.len()).sum::<usize>());
        }
    }
}

#[derive(Debug, Clone)]
enum SOp {
    /// session, key, mode 0..3, ttl ms, wait: 0 try, 1 forever, 2.. ms
    Acquire(u8, u8, u8, u8, u8),
    Release(u8, u8, bool),
    Extend(u8, u8, u8),
    Cancel(u8, usize),
    End(u8),
    Advance(u8),
    LcUnlock(u8),
}

fn sop() -> impl Strategy<Value = SOp> {
    prop_oneof![
        5 => (0u8..3, 0u8..3, 0u8..3, 1u8..30, 0u8..6).prop_map(|(s, k, m, t, w)| SOp::Acquire(s, k, m, t, w)),
        2 => (0u8..3, 0u8..3, any::<bool>()).prop_map(|(s, k, c)| SOp::Release(s, k, c)),
        2 => (0u8..3, 0u8..3, 1u8..30).prop_map(|(s, k, t)| SOp::Extend(s, k, t)),
        1 => (0u8..3, any::<usize>()).prop_map(|(s, i)| SOp::Cancel(s, i)),
        1 => (0u8..3).prop_map(SOp::End),
        3 => (0u8..20).prop_map(SOp::Advance),
        1 => (0u8..3).prop_map(SOp::LcUnlock),
    ]
}

proptest! {
    /// Sessions, leases and deadlines under random operations: FIFO
    /// among each key's live waiters (a cancelled, timed-out or ended
    /// waiter is never granted), tokens strictly increase per key, a
    /// lease never outlives its deadline once `expire` ran and is never
    /// expired before it, an ended session keeps no session hold and no
    /// waiter, and a stale token changes nothing.
    #[test]
    fn sessions_and_leases_keep_their_promises(ops in proptest::collection::vec(sop(), 1..250)) {
        const BIT: u64 = 1 << 63;
        let mut tb = t();
        let mut fx = Vec::new();
        let mut now_us = 0u64;
        // Session ids: bumped when a session ends (a new one replaces it).
        let mut sid = [1u64, 2, 3];
        let mut next_sid = 4;
        let mut rid = 0u32;
        // Our view: queue per key of conn tokens, holder per key
        // (conn, token, mode, lease deadline).
        let mut queues: HashMap<u8, VecDeque<Token>> = HashMap::new();
        let mut holder: HashMap<u8, (Token, u64, HoldMode, u64)> = HashMap::new();
        let mut last_token: HashMap<u8, u64> = HashMap::new();
        let mut conn_key: HashMap<Token, u8> = HashMap::new();
        let kn = |k: u8| n(&format!("k{k}"));
        for o in ops {
            fx.clear();
            let now = at(now_us);
            match o {
                SOp::Acquire(s, k, m, ttl, w) => {
                    let owner = tb.owner_open(sid[s as usize], s as u64).expect("room");
                    rid += 1;
                    let conn = BIT | (owner as u64) << 32 | rid as u64;
                    conn_key.insert(conn, k);
                    let mode = [HoldMode::Persistent, HoldMode::Session, HoldMode::Lease][m as usize];
                    let (lm, deadline) = match w {
                        0 => (LockMode::Try, None),
                        1 => (LockMode::Blocking, None),
                        w => (LockMode::Blocking, Some(now_us + w as u64 * 1000)),
                    };
                    let opts = LockOpts { mode, ttl_ms: ttl as u32, owner, deadline_us: deadline };
                    if tb.lock_with(conn, &kn(k), &n("src"), ep(1), lm, opts, now, &mut fx).is_some() {
                        queues.entry(k).or_default().push_back(conn);
                    }
                }
                SOp::Release(s, k, current) => {
                    let owner = tb.owner_open(sid[s as usize], s as u64).expect("room");
                    let token = match holder.get(&k) { Some(h) if current => h.1, Some(h) => h.1 + 1, None => 7 };
                    let before = holder.get(&k).copied();
                    let r = tb.release_token(owner, &kn(k), token, now, &mut fx);
                    let may = before.is_some_and(|h| h.1 == token && (h.2 != HoldMode::Session || (h.0 >> 32) & 0x7FFF_FFFF == owner as u64));
                    prop_assert_eq!(r == Checked::Ok, may, "release {:?} of {:?}", r, before);
                    if r != Checked::Ok { prop_assert!(fx.is_empty(), "a refused release changed something"); }
                }
                SOp::Extend(s, k, ttl) => {
                    let owner = tb.owner_open(sid[s as usize], s as u64).expect("room");
                    if let Some(h) = holder.get(&k).copied() {
                        if let Ok(x) = tb.extend(owner, &kn(k), h.1, ttl as u32, now) {
                            prop_assert_eq!(h.2, HoldMode::Lease);
                            holder.insert(k, (h.0, h.1, h.2, x.expires_mono_us));
                        }
                    }
                    prop_assert!(tb.extend(owner, &kn(k), 12345, 5, now).is_err());
                }
                SOp::Cancel(s, i) => {
                    let owner = tb.owner_open(sid[s as usize], s as u64).expect("room");
                    let mine: Vec<Token> = queues.values().flatten().copied()
                        .filter(|c| (c >> 32) & 0x7FFF_FFFF == owner as u64).collect();
                    if !mine.is_empty() {
                        let c = mine[i % mine.len()];
                        let k = *queues.iter().find(|(_, q)| q.contains(&c)).expect("queued").0;
                        // Another key: nothing is cancelled.
                        prop_assert!(!tb.cancel(owner, c, kn(k.wrapping_add(1)).as_bytes(), &mut fx));
                        prop_assert!(tb.cancel(owner, c, kn(k).as_bytes(), &mut fx));
                    }
                }
                SOp::End(s) => {
                    let old = sid[s as usize];
                    let owner = tb.owner_open(old, s as u64).expect("room");
                    tb.owner_end(old, now, &mut fx);
                    for q in queues.values_mut() { q.retain(|c| (c >> 32) & 0x7FFF_FFFF != owner as u64); }
                    // Leases and persistent holds outlive it, owned by nobody.
                    for h in holder.values_mut() {
                        if (h.0 >> 32) & 0x7FFF_FFFF == owner as u64 && h.2 != HoldMode::Session { h.0 = NO_CONN; }
                    }
                    sid[s as usize] = next_sid;
                    next_sid += 1;
                }
                SOp::Advance(ms) => {
                    now_us += ms as u64 * 1000;
                    tb.expire(at(now_us), &mut fx);
                }
                SOp::LcUnlock(k) => tb.unlock(999, &kn(k), now, &mut fx),
            }
            let now_us_ = now_us;
            for e in &fx {
                match *e {
                    Effect::Granted { conn, key_slot, grant_id, waited_us } => {
                        let (g, expires_mono_us) = tb.granted(key_slot, grant_id);
                        prop_assert_eq!(g.grant_id, grant_id);
                        let mode = g.mode;
                        let k = conn_key[&conn];
                        prop_assert!(!holder.contains_key(&k), "two holders of k{}", k);
                        if waited_us.is_some() {
                            let q = queues.get_mut(&k).expect("queued");
                            prop_assert_eq!(q.pop_front(), Some(conn), "FIFO on k{}", k);
                        }
                        let last = last_token.insert(k, grant_id).unwrap_or(0);
                        prop_assert!(grant_id > last, "token {} after {}", grant_id, last);
                        holder.insert(k, (conn, grant_id, mode, expires_mono_us));
                    }
                    Effect::Released { released, grant_id, cause, .. } => {
                        let key = tb.released(released, grant_id).key;
                        let k = (0..3u8).find(|k| kn(*k).as_bytes() == key).expect("known key");
                        let h = holder.remove(&k).expect("released a held key");
                        prop_assert_eq!(h.1, grant_id);
                        if cause == ReleaseCause::Expired {
                            prop_assert!(h.3 <= now_us_, "expired early");
                        }
                    }
                    Effect::Reply { conn, reply } => {
                        if let Some(&k) = conn_key.get(&conn) {
                            if matches!(reply, Reply::TimedOut | Reply::Cancelled) {
                                let q = queues.get_mut(&k).expect("queued");
                                let before = q.len();
                                q.retain(|c| *c != conn);
                                prop_assert_eq!(q.len() + 1, before, "answered a waiter not queued");
                            }
                        }
                    }
                    Effect::LimitReached { .. } => {}
                }
            }
            tb.check_invariants();
            // After expire ran, no lease outlives its deadline.
            if matches!(o, SOp::Advance(_)) {
                for (k, h) in &holder {
                    if h.2 == HoldMode::Lease {
                        prop_assert!(h.3 > now_us, "lease on k{} past its deadline", k);
                    }
                }
            }
            prop_assert_eq!(tb.held_keys(), holder.len());
            prop_assert_eq!(tb.queued_waiters(), queues.values().map(|q| q.len()).sum::<usize>());
        }
    }
}

/// A release's effect names the holder by index, not by copy: the key and
/// source stay readable (even when the key and its source are dropped by
/// the release) until the effects are applied, and an index from before
/// `effects_applied` is refused rather than misread.
#[test]
fn a_released_holder_is_readable_until_its_effects_are_applied() {
    let mut tb = t();
    let mut fx = Vec::new();
    lk(
        &mut tb,
        &mut fx,
        1,
        "gone",
        "only-source",
        LockMode::Blocking,
        0,
    );
    tb.effects_applied();
    fx.clear();
    tb.unlock(2, b"gone", at(5), &mut fx);
    let Some(&Effect::Released {
        released, grant_id, ..
    }) = fx.iter().find(|e| matches!(e, Effect::Released { .. }))
    else {
        panic!("no release effect: {fx:?}")
    };
    // The key entry and its only source are gone from the table ...
    assert!(tb.holder_of(b"gone").is_none());
    assert_eq!(tb.key_entries(), 0);
    // ... but the effect still reads the holder as it was.
    let h = tb.released(released, grant_id);
    assert_eq!((h.key, h.source), (&b"gone"[..], &b"only-source"[..]));
    tb.check_invariants();
    tb.effects_applied();
    tb.check_invariants();
    let stale = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tb.released(released, grant_id).grant_id
    }));
    assert!(
        stale.is_err(),
        "a released holder read after effects_applied"
    );
}

#[test]
fn an_effect_carries_no_name() {
    assert!(std::mem::size_of::<Effect>() <= 64);
}
