//! The randomized model test of lock modes: random requests, releases,
//! expiries and resets against a model, every rule checked after each.

use super::*;

#[derive(Debug, Clone)]
enum Op {
    /// session (3: none), key, access 0..6, hold 0..3, ttl ms, wait:
    /// 0 try, 1 forever, 2.. ms, source
    Acquire(u8, u8, u8, u8, u8, u8, u8),
    /// a holder (by index), with its token or a stale one, by a session
    Release(usize, bool, u8),
    Extend(usize, u8),
    Unlock(u8),
    ResetKey(u8),
    ResetIf(usize),
    ResetSource(u8),
    Undeliver(usize),
    /// a queued request (by index): withdrawn or cancelled
    Leave(usize, bool),
    End(u8),
    Advance(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..4, 0u8..3, 0u8..6, 0u8..3, 1u8..30, 0u8..6, 0u8..3)
            .prop_map(|(s, k, a, h, t, w, src)| Op::Acquire(s, k, a, h, t, w, src)),
        4 => (any::<usize>(), prop::bool::weighted(0.9), 0u8..4)
            .prop_map(|(i, cur, s)| Op::Release(i, cur, s)),
        1 => (any::<usize>(), 1u8..30).prop_map(|(i, t)| Op::Extend(i, t)),
        1 => (0u8..3).prop_map(Op::Unlock),
        1 => (0u8..3).prop_map(Op::ResetKey),
        1 => any::<usize>().prop_map(Op::ResetIf),
        1 => (0u8..3).prop_map(Op::ResetSource),
        1 => any::<usize>().prop_map(Op::Undeliver),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(i, c)| Op::Leave(i, c)),
        1 => (0u8..3).prop_map(Op::End),
        2 => (0u8..20).prop_map(Op::Advance),
    ]
}

/// What the model knows of a request, queued or holding.
#[derive(Clone, Copy, Debug)]
struct Req {
    conn: Token,
    key: u8,
    access: Access,
    mode: HoldMode,
    /// Session index, or 3 for none.
    sess: u8,
    src: u8,
    /// Waiter slot while queued.
    slot: u32,
}

#[derive(Clone, Copy, Debug)]
struct Held {
    req: Req,
    token: u64,
    key_slot: u32,
    /// A lease's deadline (mono µs).
    expires: u64,
    /// The session still owns it (a lease or persistent hold outlives its
    /// session, owned by nobody).
    owned: bool,
}

#[derive(Default)]
struct Model {
    holders: HashMap<u8, Vec<Held>>,
    queues: HashMap<u8, VecDeque<Req>>,
    last_token: HashMap<u8, u64>,
    reqs: HashMap<Token, Req>,
}

/// True when `a` may hold beside `holders` (the queue aside).
fn fits(holders: &[Held], a: Access) -> bool {
    if holders.is_empty() {
        return true;
    }
    match a {
        Access::Exclusive => false,
        Access::Shared => holders.iter().all(|h| h.req.access == Access::Shared),
        Access::Semaphore(n) => {
            holders.iter().all(|h| h.req.access == a) && (holders.len() as u32) < n
        }
    }
}

impl Model {
    fn holders(&self, k: u8) -> &[Held] {
        self.holders.get(&k).map_or(&[], |v| v.as_slice())
    }
    fn queue_empty(&self, k: u8) -> bool {
        self.queues.get(&k).is_none_or(|q| q.is_empty())
    }
    /// The `n` a semaphore request on `k` must name, if one is fixed.
    fn fixed_n(&self, k: u8) -> Option<u32> {
        let held = self.holders(k).iter().map(|h| h.req.access);
        let queued = self.queues.get(&k).into_iter().flatten().map(|r| r.access);
        held.chain(queued).find_map(|a| match a {
            Access::Semaphore(n) => Some(n),
            _ => None,
        })
    }
    fn all_held(&self) -> Vec<Held> {
        let mut v: Vec<Held> = self.holders.values().flatten().copied().collect();
        v.sort_by_key(|h| h.token);
        v
    }
    fn all_queued(&self) -> Vec<Req> {
        let mut v: Vec<Req> = self.queues.values().flatten().copied().collect();
        v.sort_by_key(|r| r.conn);
        v
    }
}

fn kname(k: u8) -> String {
    format!("k{k}")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    /// Random operations on three keys in every access, hold mode and
    /// wait. After every one: an exclusive holder is alone; a semaphore
    /// never has more than its n holders; every grant is the head of its
    /// key's queue (or the queue was empty) and compatible with the
    /// holders, so nobody is granted past an earlier waiter; no waiter is
    /// left at a head it could hold; a semaphore of another n is refused
    /// and changes nothing; tokens strictly increase per key; per-holder
    /// operations release exactly their holders; the table's holders and
    /// queues are the model's and its own invariants hold; and every
    /// holder replayed into a new table gives the same holders.
    #[test]
    fn lock_modes_keep_their_rules(ops in proptest::collection::vec(op(), 1..300)) {
        let mut tb = t();
        let mut m = Model::default();
        let mut fx = Vec::new();
        let mut now_us = 0u64;
        // Session ids by index (bumped when one ends), and their entries.
        let mut sid = [1u64, 2, 3];
        let mut next_sid = 4;
        let mut rid = 0u64;
        for o in ops {
            fx.clear();
            let now = at(now_us);
            // Holders the operation must release, exactly (None: any).
            let mut must_release: Option<Vec<u64>> = None;
            let mut refused_unchanged = None;
            match o {
                Op::Acquire(s, k, a, h, ttl, w, src) => {
                    let owner = if s < 3 { tb.owner_open(sid[s as usize], s as u64).unwrap() } else { NIL };
                    rid += 1;
                    let conn = rid;
                    let access = [X, S, S, sem(2), sem(2), sem(3)][a as usize];
                    let mode = [HoldMode::Persistent, HoldMode::Session, HoldMode::Lease][h as usize];
                    let mode = if owner == NIL && mode == HoldMode::Session { HoldMode::Persistent } else { mode };
                    let (lm, deadline) = match w {
                        0 => (LockMode::Try, None),
                        1 => (LockMode::Blocking, None),
                        w => (LockMode::Blocking, Some(now_us + w as u64 * 1000)),
                    };
                    let opts = LockOpts { mode, ttl_ms: ttl as u32, owner, deadline_us: deadline };
                    let mismatch = match access {
                        Access::Semaphore(n) => m.fixed_n(k).is_some_and(|f| f != n),
                        _ => false,
                    };
                    let grantable = m.queue_empty(k) && fits(m.holders(k), access);
                    let mut req = Req { conn, key: k, access, mode, sess: s, src, slot: NIL };
                    m.reqs.insert(conn, req);
                    if mismatch {
                        refused_unchanged = Some((holding_all(&tb), tb.next_grant_id(), tb.queued_waiters()));
                    }
                    let slot = tb.lock_access(conn, &kname(k), &format!("s{src}"), ep(), lm, opts, access, now, &mut fx);
                    if mismatch {
                        prop_assert!(slot.is_none());
                        prop_assert_eq!(replies(&fx), vec![(conn, Reply::ModeMismatch)]);
                        prop_assert_eq!(fx.len(), 1);
                    } else if grantable {
                        prop_assert!(slot.is_none());
                        prop_assert_eq!(granted(&fx), vec![conn], "a grantable request waited");
                    } else if lm == LockMode::Try {
                        prop_assert_eq!(replies(&fx), vec![(conn, Reply::Busy)]);
                    } else {
                        let slot = slot.expect("queued");
                        req.slot = slot;
                        m.queues.entry(k).or_default().push_back(req);
                        prop_assert!(fx.is_empty(), "{:?}", fx);
                    }
                }
                Op::Release(i, current, s) => {
                    let all = m.all_held();
                    if !all.is_empty() {
                        let h = all[i % all.len()];
                        let owner = if s < 3 { tb.owner_open(sid[s as usize], s as u64).unwrap() } else { NIL };
                        let tok = if current { h.token } else { h.token + 1_000_000 };
                        let may = current && (h.req.mode != HoldMode::Session
                            || (h.owned && h.req.sess == s && owner != NIL));
                        let r = tb.release_token(owner, &kname(h.req.key), tok, now, &mut fx);
                        prop_assert_eq!(r == Checked::Ok, may, "release {:?} of {:?}", r, h);
                        must_release = Some(if may { vec![h.token] } else { vec![] });
                    }
                }
                Op::Extend(i, ttl) => {
                    let all = m.all_held();
                    if !all.is_empty() {
                        let h = all[i % all.len()];
                        let owner = if h.req.sess < 3 && h.owned { tb.owner_open(sid[h.req.sess as usize], h.req.sess as u64).unwrap() } else { NIL };
                        let r = tb.extend(owner, &kname(h.req.key), h.token, ttl as u32, now);
                        prop_assert_eq!(r.is_ok(), h.req.mode == HoldMode::Lease, "{:?}", r);
                        if let Ok(x) = r {
                            let e = m.holders.get_mut(&h.req.key).unwrap().iter_mut().find(|x| x.token == h.token).unwrap();
                            e.expires = x.expires_mono_us;
                        }
                    }
                }
                Op::Unlock(k) | Op::ResetKey(k) => {
                    must_release = Some(m.holders(k).iter().map(|h| h.token).collect());
                    if matches!(o, Op::Unlock(_)) {
                        tb.unlock(0, &kname(k), now, &mut fx);
                    } else {
                        tb.reset_by_key(None, &kname(k), now, &mut fx);
                    }
                }
                Op::ResetIf(i) => {
                    let all = m.all_held();
                    if !all.is_empty() {
                        let h = all[i % all.len()];
                        prop_assert!(tb.reset_if(&kname(h.req.key), h.token, now, &mut fx));
                        must_release = Some(vec![h.token]);
                    }
                }
                Op::ResetSource(src) => {
                    must_release = Some(m.all_held().iter().filter(|h| h.req.src == src).map(|h| h.token).collect());
                    tb.reset_by_source(None, &format!("s{src}"), now, &mut fx);
                    // Each of its waiters is answered, and none granted.
                    let mine: Vec<Token> = m.all_queued().iter().filter(|r| r.src == src).map(|r| r.conn).collect();
                    for c in mine {
                        prop_assert!(replies(&fx).contains(&(c, Reply::Withdrawn)));
                    }
                }
                Op::Undeliver(i) => {
                    let all = m.all_held();
                    if !all.is_empty() {
                        let h = all[i % all.len()];
                        prop_assert!(tb.release_grant(h.key_slot, h.token, now, &mut fx));
                        must_release = Some(vec![h.token]);
                    }
                }
                Op::Leave(i, cancel) => {
                    let q = m.all_queued();
                    if !q.is_empty() {
                        let r = q[i % q.len()];
                        if cancel && r.sess < 3 {
                            let owner = tb.owner_open(sid[r.sess as usize], r.sess as u64).unwrap();
                            prop_assert!(tb.cancel(owner, r.conn, kname(r.key).as_bytes(), &mut fx));
                        } else {
                            tb.withdraw(r.slot);
                            m.queues.get_mut(&r.key).unwrap().retain(|x| x.conn != r.conn);
                        }
                        tb.grant_unblocked(now, &mut fx);
                        must_release = Some(vec![]);
                    }
                }
                Op::End(s) => {
                    let _ = tb.owner_open(sid[s as usize], s as u64).unwrap();
                    must_release = Some(m.all_held().iter()
                        .filter(|h| h.req.sess == s && h.owned && h.req.mode == HoldMode::Session)
                        .map(|h| h.token).collect());
                    tb.owner_end(sid[s as usize], now, &mut fx);
                    // Its queued requests go unanswered.
                    for q in m.queues.values_mut() { q.retain(|r| r.sess != s); }
                    for hs in m.holders.values_mut() {
                        for h in hs.iter_mut().filter(|h| h.req.sess == s) { h.owned = false; }
                    }
                    sid[s as usize] = next_sid;
                    next_sid += 1;
                    // Requests of the ended session are no longer its.
                    for r in m.reqs.values_mut().filter(|r| r.sess == s) { r.sess = 3; }
                    for hs in m.holders.values_mut() {
                        for h in hs.iter_mut().filter(|h| h.req.sess == s) { h.req.sess = 3; }
                    }
                }
                Op::Advance(ms) => {
                    now_us += ms as u64 * 1000;
                    must_release = Some(m.all_held().iter()
                        .filter(|h| h.req.mode == HoldMode::Lease && h.expires <= now_us)
                        .map(|h| h.token).collect());
                    tb.expire(at(now_us), &mut fx);
                }
            }
            // The effects, in order, against the rules.
            let mut released_now: Vec<u64> = Vec::new();
            for e in fx.iter() {
                match *e {
                    Effect::Granted { conn, key_slot, grant_id, waited_us } => {
                        let req = m.reqs[&conn];
                        let k = req.key;
                        if waited_us.is_some() {
                            let q = m.queues.get_mut(&k).expect("queued");
                            let head = q.pop_front().map(|r| r.conn);
                            prop_assert_eq!(head, Some(conn), "granted past an earlier waiter on k{}", k);
                        } else {
                            prop_assert!(m.queue_empty(k), "granted at once past a waiter on k{}", k);
                        }
                        prop_assert!(fits(m.holders(k), req.access),
                            "{:?} granted beside {:?}", req.access, m.holders(k));
                        let last = m.last_token.insert(k, grant_id).unwrap_or(0);
                        prop_assert!(grant_id > last, "token {} after {} on k{}", grant_id, last, k);
                        let (g, expires) = tb.granted(key_slot, grant_id);
                        prop_assert_eq!(g.grant_id, grant_id);
                        prop_assert_eq!(tb.granted_access(key_slot, grant_id), req.access);
                        let owned = req.sess < 3;
                        m.holders.entry(k).or_default().push(Held { req, token: grant_id, key_slot, expires, owned });
                    }
                    Effect::Released { released, grant_id, cause, .. } => {
                        let key = tb.released(released, grant_id).key.to_vec();
                        let k = (0..3u8).find(|k| kname(*k).as_bytes() == key).expect("known key");
                        let hs = m.holders.get_mut(&k).expect("held");
                        let i = hs.iter().position(|h| h.token == grant_id).expect("a holder");
                        let h = hs.remove(i);
                        prop_assert_eq!(tb.released_access(released, grant_id), h.req.access);
                        if cause == ReleaseCause::Expired {
                            prop_assert!(h.expires <= now_us, "expired early");
                        }
                        released_now.push(grant_id);
                    }
                    Effect::Reply { conn, reply } => {
                        if matches!(reply, Reply::TimedOut | Reply::Cancelled | Reply::Withdrawn) {
                            let k = m.reqs[&conn].key;
                            let q = m.queues.get_mut(&k).expect("queued");
                            let before = q.len();
                            q.retain(|r| r.conn != conn);
                            prop_assert_eq!(q.len() + 1, before, "answered a request not queued");
                        }
                    }
                    Effect::LimitReached { .. } => {}
                }
            }
            if let Some(mut want) = must_release {
                want.sort();
                released_now.sort();
                prop_assert_eq!(released_now, want, "released other holders than {:?}", o);
            }
            if let Some(before) = refused_unchanged {
                prop_assert_eq!((holding_all(&tb), tb.next_grant_id(), tb.queued_waiters()), before);
            }
            // After every operation.
            tb.check_invariants();
            for k in 0..3u8 {
                let hs = m.holders(k);
                if hs.iter().any(|h| h.req.access == X) {
                    prop_assert_eq!(hs.len(), 1, "an exclusive holder of k{} is not alone", k);
                }
                for h in hs {
                    if let Access::Semaphore(n) = h.req.access {
                        prop_assert!(hs.len() as u32 <= n, "{} holders of a semaphore of {}", hs.len(), n);
                    }
                }
                if let Some(head) = m.queues.get(&k).and_then(|q| q.front()) {
                    prop_assert!(!fits(hs, head.access), "k{}'s head {:?} could hold it", k, head);
                }
                // The table agrees.
                let mut want: Vec<(u64, Access)> = hs.iter().map(|h| (h.token, h.req.access)).collect();
                want.sort_by_key(|x| x.0);
                let got: Vec<(u64, Access)> = tb.holders_of(kname(k).as_bytes()).iter().map(|(h, a)| (h.grant_id, *a)).collect();
                prop_assert_eq!(got, want);
                let queued: Vec<Token> = m.queues.get(&k).into_iter().flatten().map(|r| r.conn).collect();
                prop_assert_eq!(waiting(&tb, &kname(k)), queued);
            }
            prop_assert_eq!(tb.held_keys(), (0..3u8).filter(|k| !m.holders(*k).is_empty()).count());
            prop_assert_eq!(tb.holders(), m.all_held().len());
            // Every holder replayed into a new table (what a snapshot's
            // records will do) gives the same holders, each as it held.
            let mut copy = t();
            let mut ok = true;
            tb.for_each_holder(|h, a| ok &= copy.restore_access(h, a, now));
            prop_assert!(ok);
            copy.check_invariants();
            for k in 0..3u8 {
                let key = kname(k);
                let of = |t: &Table| -> Vec<(u64, Access)> {
                    t.holders_of(key.as_bytes()).iter().map(|(h, a)| (h.grant_id, *a)).collect()
                };
                prop_assert_eq!(of(&copy), of(&tb));
            }
            tb.effects_applied();
        }
    }
}

/// Every holder of the test keys: `(key, grant id)`.
fn holding_all(tb: &Table) -> Vec<(u8, u64)> {
    let mut v = Vec::new();
    for k in 0..3u8 {
        for (h, _) in tb.holders_of(kname(k).as_bytes()) {
            v.push((k, h.grant_id));
        }
    }
    v
}
