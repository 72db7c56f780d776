//! Lock modes (issue #33): shared and semaphore holds beside exclusive
//! ones, one FIFO queue per key. Unit tests of each rule, then a
//! randomized model test that checks the rules after every operation.

use super::*;
use proptest::prelude::*;
use std::collections::{HashMap, VecDeque};

const X: Access = Access::Exclusive;
const S: Access = Access::Shared;
const fn sem(n: u32) -> Access {
    Access::Semaphore(n)
}

fn ep() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 1))
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

/// A blocking persistent request of `conn` (source `s{conn}`) on `key`.
fn acq(tb: &mut Table, fx: &mut Effects, conn: Token, key: &str, a: Access) -> Option<u32> {
    let src = format!("s{conn}");
    tb.lock_access(
        conn,
        key,
        &src,
        ep(),
        LockMode::Blocking,
        LockOpts::default(),
        a,
        at(conn),
        fx,
    )
}

/// A try request of `conn` on `key`.
fn try_acq(tb: &mut Table, fx: &mut Effects, conn: Token, key: &str, a: Access) {
    let src = format!("s{conn}");
    let w = tb.lock_access(
        conn,
        key,
        &src,
        ep(),
        LockMode::Try,
        LockOpts::default(),
        a,
        at(conn),
        fx,
    );
    assert!(w.is_none(), "a try request never queues");
}

/// `(conn, grant id)` of every grant in `fx`, in order.
fn grants(fx: &Effects) -> Vec<(Token, u64)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Granted { conn, grant_id, .. } => Some((*conn, *grant_id)),
            _ => None,
        })
        .collect()
}
fn granted(fx: &Effects) -> Vec<Token> {
    grants(fx).into_iter().map(|(c, _)| c).collect()
}
fn released(fx: &Effects) -> Vec<Token> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Released { holder_conn, .. } => Some(*holder_conn),
            _ => None,
        })
        .collect()
}
fn replies(fx: &Effects) -> Vec<(Token, Reply)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Reply { conn, reply } => Some((*conn, *reply)),
            _ => None,
        })
        .collect()
}
/// Connections holding `key`, by grant order.
fn holding(tb: &Table, key: &str) -> Vec<Token> {
    let mut v: Vec<(u64, Token)> = Vec::new();
    let k = tb.find_key(key.as_bytes());
    if let Some(k) = k {
        if let Some(h) = tb.keys[k as usize].holder {
            v.push((h.grant_id, h.conn));
        }
        let mut cur = tb.others_front(k);
        while let Some(x) = cur {
            let h = tb.shares[x as usize].holder;
            v.push((h.grant_id, h.conn));
            cur = List::next_of(&tb.shares, x, S_KEY);
        }
    }
    v.sort();
    v.into_iter().map(|(_, c)| c).collect()
}
fn waiting(tb: &Table, key: &str) -> Vec<Token> {
    let mut out = Vec::new();
    tb.waiters_of(key.as_bytes(), &mut out);
    out
}
/// The grant id `conn` holds `key` with.
fn token(tb: &Table, key: &str, conn: Token) -> u64 {
    let k = tb.find_key(key.as_bytes()).expect("key");
    let mut found = None;
    if let Some(h) = tb.keys[k as usize].holder.filter(|h| h.conn == conn) {
        found = Some(h.grant_id);
    }
    let mut cur = tb.others_front(k);
    while let Some(x) = cur {
        let h = tb.shares[x as usize].holder;
        if h.conn == conn {
            found = Some(h.grant_id);
        }
        cur = List::next_of(&tb.shares, x, S_KEY);
    }
    found.unwrap_or_else(|| panic!("conn {conn} does not hold {key}"))
}
/// Releases `conn`'s hold of `key` by its token (a persistent hold: any
/// session may name it).
fn rel(tb: &mut Table, fx: &mut Effects, key: &str, conn: Token, us: u64) {
    let tok = token(tb, key, conn);
    assert_eq!(tb.release_token(NIL, key, tok, at(us), fx), Checked::Ok);
}

#[test]
fn readers_share_a_key_and_a_writer_waits_for_the_last_of_them() {
    let mut tb = t();
    let mut fx = Vec::new();
    acq(&mut tb, &mut fx, 1, "k", S);
    acq(&mut tb, &mut fx, 2, "k", S);
    assert!(
        acq(&mut tb, &mut fx, 3, "k", X).is_some(),
        "the writer queues"
    );
    assert_eq!(granted(&fx), vec![1, 2]);
    assert_eq!(holding(&tb, "k"), vec![1, 2]);
    assert_eq!(tb.access_of_key(b"k"), Some(S));
    assert_eq!(tb.held_keys(), 1);
    assert_eq!(tb.holders(), 2);
    tb.check_invariants();
    fx.clear();
    // One reader leaves: the key stays held, the writer waits.
    rel(&mut tb, &mut fx, "k", 1, 10);
    assert_eq!(released(&fx), vec![1]);
    assert!(granted(&fx).is_empty());
    assert_eq!(holding(&tb, "k"), vec![2]);
    tb.check_invariants();
    fx.clear();
    // The last one leaves: the writer holds it alone.
    rel(&mut tb, &mut fx, "k", 2, 20);
    assert_eq!(granted(&fx), vec![3]);
    assert_eq!(tb.access_of_key(b"k"), Some(X));
    assert_eq!(tb.holder_of(b"k").unwrap().grant_id, token(&tb, "k", 3));
    tb.check_invariants();
}

#[test]
fn a_waiting_writer_is_not_overtaken_by_later_readers() {
    let mut tb = t();
    let mut fx = Vec::new();
    acq(&mut tb, &mut fx, 1, "k", S);
    assert!(acq(&mut tb, &mut fx, 2, "k", X).is_some());
    // Compatible with the holder, but behind the writer: it queues, and a
    // try is busy.
    assert!(acq(&mut tb, &mut fx, 3, "k", S).is_some());
    try_acq(&mut tb, &mut fx, 4, "k", S);
    assert_eq!(granted(&fx), vec![1]);
    assert_eq!(replies(&fx), vec![(4, Reply::Busy)]);
    assert_eq!(waiting(&tb, "k"), vec![2, 3]);
    tb.check_invariants();
    fx.clear();
    rel(&mut tb, &mut fx, "k", 1, 10);
    assert_eq!(granted(&fx), vec![2], "the writer first");
    fx.clear();
    rel(&mut tb, &mut fx, "k", 2, 20);
    assert_eq!(granted(&fx), vec![3]);
    tb.check_invariants();
}

#[test]
fn consecutive_readers_at_the_head_are_granted_together() {
    let mut tb = t();
    let mut fx = Vec::new();
    acq(&mut tb, &mut fx, 1, "k", X);
    for (c, a) in [(2, S), (3, S), (4, S), (5, X), (6, S)] {
        assert!(acq(&mut tb, &mut fx, c, "k", a).is_some());
    }
    fx.clear();
    rel(&mut tb, &mut fx, "k", 1, 10);
    // In queue order, in one call; the writer behind them stops the run,
    // and the reader behind the writer waits for it.
    assert_eq!(granted(&fx), vec![2, 3, 4]);
    let toks: Vec<u64> = grants(&fx).iter().map(|g| g.1).collect();
    assert!(toks.windows(2).all(|w| w[0] < w[1]), "{toks:?}");
    assert_eq!(waiting(&tb, "k"), vec![5, 6]);
    tb.check_invariants();
    fx.clear();
    rel(&mut tb, &mut fx, "k", 3, 20);
    rel(&mut tb, &mut fx, "k", 2, 21);
    assert!(granted(&fx).is_empty());
    rel(&mut tb, &mut fx, "k", 4, 22);
    assert_eq!(granted(&fx), vec![5]);
    fx.clear();
    rel(&mut tb, &mut fx, "k", 5, 30);
    assert_eq!(granted(&fx), vec![6]);
    tb.check_invariants();
}

#[test]
fn a_semaphore_admits_n_holders_then_queues_in_order() {
    let mut tb = t();
    let mut fx = Vec::new();
    for c in 1..=3 {
        acq(&mut tb, &mut fx, c, "k", sem(3));
    }
    assert!(acq(&mut tb, &mut fx, 4, "k", sem(3)).is_some());
    assert!(acq(&mut tb, &mut fx, 5, "k", sem(3)).is_some());
    try_acq(&mut tb, &mut fx, 6, "k", sem(3));
    assert_eq!(granted(&fx), vec![1, 2, 3]);
    assert_eq!(replies(&fx), vec![(6, Reply::Busy)]);
    assert_eq!(tb.holder_count_of(b"k"), 3);
    assert_eq!(tb.semaphore_slots_of(b"k"), Some(3));
    assert_eq!(tb.access_of_key(b"k"), Some(sem(3)));
    tb.check_invariants();
    fx.clear();
    // Each slot given back goes to the next in line, one at a time.
    rel(&mut tb, &mut fx, "k", 2, 10);
    assert_eq!(granted(&fx), vec![4]);
    fx.clear();
    rel(&mut tb, &mut fx, "k", 1, 11);
    assert_eq!(granted(&fx), vec![5]);
    assert_eq!(holding(&tb, "k"), vec![3, 4, 5]);
    tb.check_invariants();
    // Exclusive and shared requests wait for the whole semaphore.
    fx.clear();
    assert!(acq(&mut tb, &mut fx, 7, "k", X).is_some());
    assert!(acq(&mut tb, &mut fx, 8, "k", S).is_some());
    assert!(
        acq(&mut tb, &mut fx, 9, "k", sem(3)).is_some(),
        "behind the writer"
    );
    for c in [3, 4] {
        rel(&mut tb, &mut fx, "k", c, 20);
    }
    assert!(
        granted(&fx).is_empty(),
        "a free slot, but a writer waits first"
    );
    rel(&mut tb, &mut fx, "k", 5, 21);
    assert_eq!(granted(&fx), vec![7]);
    fx.clear();
    rel(&mut tb, &mut fx, "k", 7, 22);
    assert_eq!(
        granted(&fx),
        vec![8],
        "the reader, and not the semaphore behind it"
    );
    fx.clear();
    rel(&mut tb, &mut fx, "k", 8, 23);
    assert_eq!(granted(&fx), vec![9]);
    tb.check_invariants();
}

#[test]
fn shared_requests_wait_for_an_exclusive_holder() {
    let mut tb = t();
    let mut fx = Vec::new();
    acq(&mut tb, &mut fx, 1, "k", X);
    assert!(acq(&mut tb, &mut fx, 2, "k", S).is_some());
    assert!(acq(&mut tb, &mut fx, 3, "k", sem(2)).is_some());
    try_acq(&mut tb, &mut fx, 4, "k", S);
    assert_eq!(granted(&fx), vec![1]);
    assert_eq!(replies(&fx), vec![(4, Reply::Busy)]);
    tb.check_invariants();
}

/// A snapshot of what a refused request must not have changed.
fn state(tb: &Table, key: &str) -> (Vec<Token>, Vec<Token>, u64, usize, Option<u32>) {
    (
        holding(tb, key),
        waiting(tb, key),
        tb.next_grant_id(),
        tb.key_entries(),
        tb.semaphore_slots_of(key.as_bytes()),
    )
}

#[test]
fn a_semaphore_of_another_n_is_refused_and_changes_nothing() {
    let mut tb = t();
    let mut fx = Vec::new();
    acq(&mut tb, &mut fx, 1, "k", sem(2));
    acq(&mut tb, &mut fx, 2, "k", sem(2));
    let before = state(&tb, "k");
    fx.clear();
    // Blocking or try, with room or without: refused, distinctly.
    assert!(acq(&mut tb, &mut fx, 3, "k", sem(5)).is_none());
    try_acq(&mut tb, &mut fx, 4, "k", sem(1));
    assert_eq!(
        replies(&fx),
        vec![(3, Reply::ModeMismatch), (4, Reply::ModeMismatch)]
    );
    assert_eq!(fx.len(), 2, "nothing but the refusals: {fx:?}");
    assert_eq!(state(&tb, "k"), before);
    assert_eq!(Reply::ModeMismatch.byte(), b'-');
    tb.check_invariants();

    // A queued semaphore request fixes n as well, behind a writer.
    let mut tb = t();
    fx.clear();
    acq(&mut tb, &mut fx, 1, "k", X);
    let w = acq(&mut tb, &mut fx, 2, "k", sem(3)).expect("queued");
    assert_eq!(tb.semaphore_slots_of(b"k"), Some(3));
    let before = state(&tb, "k");
    fx.clear();
    assert!(acq(&mut tb, &mut fx, 3, "k", sem(4)).is_none());
    assert_eq!(replies(&fx), vec![(3, Reply::ModeMismatch)]);
    assert_eq!(state(&tb, "k"), before);
    tb.check_invariants();
    // Once no semaphore request holds or waits, n is free again.
    tb.withdraw(w);
    tb.grant_unblocked(at(5), &mut fx);
    assert_eq!(tb.semaphore_slots_of(b"k"), None);
    fx.clear();
    assert!(acq(&mut tb, &mut fx, 4, "k", sem(4)).is_some());
    assert_eq!(tb.semaphore_slots_of(b"k"), Some(4));
    assert!(replies(&fx).is_empty());
    tb.check_invariants();

    // And after the last holder of a semaphore is gone.
    let mut tb = t();
    fx.clear();
    acq(&mut tb, &mut fx, 1, "k", sem(2));
    rel(&mut tb, &mut fx, "k", 1, 5);
    assert_eq!(tb.key_entries(), 0);
    acq(&mut tb, &mut fx, 2, "k", sem(7));
    assert_eq!(tb.semaphore_slots_of(b"k"), Some(7));
    tb.check_invariants();
}

#[test]
fn every_grant_has_its_own_token_strictly_increasing_per_key() {
    let mut tb = t();
    let mut fx = Vec::new();
    let mut last = 0;
    let mut check = |fx: &Effects| {
        for (_, g) in grants(fx) {
            assert!(g > last, "token {g} after {last}");
            last = g;
        }
    };
    acq(&mut tb, &mut fx, 1, "k", S);
    acq(&mut tb, &mut fx, 2, "k", S);
    acq(&mut tb, &mut fx, 3, "k", X);
    acq(&mut tb, &mut fx, 4, "k", sem(2));
    acq(&mut tb, &mut fx, 5, "k", sem(2));
    acq(&mut tb, &mut fx, 6, "k", S);
    check(&fx);
    for c in 1..=6 {
        fx.clear();
        rel(&mut tb, &mut fx, "k", c, 10 + c);
        check(&fx);
    }
    assert_eq!(tb.key_entries(), 0);
}

#[test]
fn one_holder_expires_or_ends_its_session_and_the_others_stay() {
    let mut tb = t();
    let mut fx = Vec::new();
    let o1 = tb.owner_open(101, 1).unwrap();
    let o2 = tb.owner_open(102, 2).unwrap();
    let lease = |owner, ttl_ms| LockOpts {
        mode: HoldMode::Lease,
        ttl_ms,
        owner,
        deadline_us: None,
    };
    let session = |owner| LockOpts {
        mode: HoldMode::Session,
        ttl_ms: 0,
        owner,
        deadline_us: None,
    };
    let go = |tb: &mut Table, fx: &mut Effects, conn, opts, a| {
        tb.lock_access(
            conn,
            "k",
            "src",
            ep(),
            LockMode::Blocking,
            opts,
            a,
            at(0),
            fx,
        )
    };
    go(&mut tb, &mut fx, 1, lease(o1, 5), S); // expires at 5 ms
    go(&mut tb, &mut fx, 2, lease(o2, 50), S);
    go(&mut tb, &mut fx, 3, session(o2), S);
    go(&mut tb, &mut fx, 4, session(o1), S);
    assert!(go(&mut tb, &mut fx, 5, LockOpts::default(), X).is_some());
    assert_eq!(holding(&tb, "k"), vec![1, 2, 3, 4]);
    tb.check_invariants();
    fx.clear();
    // Holder 1's lease passes: only it goes.
    tb.expire(at(6_000), &mut fx);
    assert_eq!(released(&fx), vec![1]);
    assert!(granted(&fx).is_empty());
    assert_eq!(holding(&tb, "k"), vec![2, 3, 4]);
    tb.check_invariants();
    fx.clear();
    // Extending one share's lease keeps it past its old deadline.
    let t2 = token(&tb, "k", 2);
    let x = tb.extend(o2, "k", t2, 100, at(7_000)).expect("a lease");
    assert_eq!(x.grant_id, t2);
    assert_eq!(
        tb.extend(o1, "k", token(&tb, "k", 4), 100, at(7_000))
            .unwrap_err(),
        Checked::NotLease
    );
    tb.expire(at(60_000), &mut fx);
    assert!(released(&fx).is_empty());
    // Session o2 ends: its session hold goes, its lease outlives it,
    // owned by nobody and without a connection.
    tb.owner_end(102, at(61_000), &mut fx);
    assert_eq!(released(&fx), vec![3]);
    assert_eq!(holding(&tb, "k"), vec![NO_CONN, 4]);
    assert_eq!(tb.holders_of(b"k")[0].0.grant_id, t2);
    tb.check_invariants();
    fx.clear();
    // Another session cannot release o1's session hold; o1 can.
    let t4 = token(&tb, "k", 4);
    assert_eq!(
        tb.release_token(o2, "k", t4, at(62_000), &mut fx),
        Checked::NotOwner
    );
    assert!(fx.is_empty());
    assert_eq!(
        tb.release_token(o1, "k", t4, at(62_000), &mut fx),
        Checked::Ok
    );
    assert_eq!(released(&fx), vec![4]);
    assert!(granted(&fx).is_empty(), "holder 2 still holds");
    fx.clear();
    // The last one: the writer at last.
    tb.expire(at(200_000), &mut fx);
    assert_eq!(released(&fx), vec![NO_CONN]);
    assert_eq!(granted(&fx), vec![5]);
    tb.check_invariants();
}

#[test]
fn a_writer_leaving_the_head_lets_the_readers_behind_it_in() {
    // Withdrawn (hung up), cancelled, or timed out: the readers behind it
    // are compatible with the readers holding the key.
    for how in 0..3 {
        let mut tb = t();
        let mut fx = Vec::new();
        let o = tb.owner_open(100, 1).unwrap();
        acq(&mut tb, &mut fx, 1, "k", S);
        let opts = LockOpts {
            owner: o,
            deadline_us: Some(50),
            ..LockOpts::default()
        };
        let w = tb
            .lock_access(
                2,
                "k",
                "w",
                ep(),
                LockMode::Blocking,
                opts,
                X,
                at(2),
                &mut fx,
            )
            .expect("queued");
        acq(&mut tb, &mut fx, 3, "k", S);
        acq(&mut tb, &mut fx, 4, "k", S);
        acq(&mut tb, &mut fx, 5, "k", X);
        fx.clear();
        match how {
            0 => {
                tb.withdraw(w);
                // Noted, and granted by the caller's next step.
                tb.check_invariants();
                assert!(granted(&fx).is_empty());
                tb.grant_unblocked(at(10), &mut fx);
            }
            1 => {
                assert!(tb.cancel(o, 2, b"k", &mut fx));
                tb.grant_unblocked(at(10), &mut fx);
                assert_eq!(replies(&fx), vec![(2, Reply::Cancelled)]);
            }
            _ => {
                tb.expire(at(60), &mut fx);
                assert_eq!(replies(&fx), vec![(2, Reply::TimedOut)]);
            }
        }
        assert_eq!(granted(&fx), vec![3, 4], "how {how}");
        assert_eq!(waiting(&tb, "k"), vec![5]);
        tb.check_invariants();
    }
}

#[test]
fn a_waiter_leaving_the_head_of_an_exclusive_key_unblocks_nothing() {
    let mut tb = t();
    let mut fx = Vec::new();
    acq(&mut tb, &mut fx, 1, "k", X);
    let w = acq(&mut tb, &mut fx, 2, "k", X).unwrap();
    acq(&mut tb, &mut fx, 3, "k", S);
    tb.withdraw(w);
    assert!(tb.unblocked.is_empty());
    tb.check_invariants();
}

#[test]
fn reset_by_key_and_unlock_release_every_holder() {
    for unlock in [false, true] {
        let mut tb = t();
        let mut fx = Vec::new();
        for c in 1..=3 {
            acq(&mut tb, &mut fx, c, "k", S);
        }
        acq(&mut tb, &mut fx, 4, "k", X);
        acq(&mut tb, &mut fx, 5, "k", S);
        fx.clear();
        if unlock {
            tb.unlock(9, "k", at(10), &mut fx);
        } else {
            tb.reset_by_key(Some(9), "k", at(10), &mut fx);
        }
        let mut r = released(&fx);
        r.sort();
        assert_eq!(r, vec![1, 2, 3]);
        let cause = if unlock {
            ReleaseCause::Unlock
        } else {
            ReleaseCause::ResetByKey
        };
        assert!(fx.iter().all(|e| match e {
            Effect::Released { cause: c, .. } => *c == cause && c.forced(),
            _ => true,
        }));
        // The writer, after every reader went: never beside one.
        assert_eq!(granted(&fx), vec![4]);
        assert_eq!(replies(&fx), vec![(9, Reply::Ok)]);
        assert_eq!(holding(&tb, "k"), vec![4]);
        assert_eq!(waiting(&tb, "k"), vec![5]);
        tb.check_invariants();
    }
}

#[test]
fn reset_if_and_an_undelivered_grant_release_one_holder() {
    let mut tb = t();
    let mut fx = Vec::new();
    acq(&mut tb, &mut fx, 1, "k", sem(2));
    acq(&mut tb, &mut fx, 2, "k", sem(2));
    acq(&mut tb, &mut fx, 3, "k", sem(2));
    acq(&mut tb, &mut fx, 4, "k", sem(2));
    let (slot2, g2) = match fx[1] {
        Effect::Granted {
            key_slot, grant_id, ..
        } => (key_slot, grant_id),
        _ => panic!(),
    };
    fx.clear();
    assert!(tb.reset_if("k", token(&tb, "k", 1), at(10), &mut fx));
    assert_eq!(released(&fx), vec![1]);
    assert_eq!(granted(&fx), vec![3]);
    fx.clear();
    assert!(tb.release_grant(slot2, g2, at(11), &mut fx));
    assert_eq!(released(&fx), vec![2]);
    assert_eq!(granted(&fx), vec![4]);
    assert!(!tb.release_grant(slot2, g2, at(12), &mut fx));
    assert!(!tb.reset_if("k", g2, at(12), &mut fx));
    assert_eq!(holding(&tb, "k"), vec![3, 4]);
    tb.check_invariants();
}

#[test]
fn reset_by_source_releases_its_shares_and_answers_its_waiters_first() {
    let mut tb = t();
    let mut fx = Vec::new();
    let go = |tb: &mut Table, fx: &mut Effects, conn, key: &str, src: &str, a| {
        tb.lock_access(
            conn,
            key,
            src,
            ep(),
            LockMode::Blocking,
            LockOpts::default(),
            a,
            at(conn),
            fx,
        )
    };
    go(&mut tb, &mut fx, 1, "a", "other", S);
    go(&mut tb, &mut fx, 2, "a", "gone", S);
    go(&mut tb, &mut fx, 3, "b", "gone", S);
    go(&mut tb, &mut fx, 4, "a", "gone", X); // queued on a
    go(&mut tb, &mut fx, 5, "a", "gone", S); // behind it
    go(&mut tb, &mut fx, 6, "a", "other", S); // behind it
    fx.clear();
    tb.reset_by_source(Some(9), "gone", at(10), &mut fx);
    let mut r = released(&fx);
    r.sort();
    assert_eq!(r, vec![2, 3]);
    let rp = replies(&fx);
    assert!(rp.contains(&(4, Reply::Withdrawn)) && rp.contains(&(5, Reply::Withdrawn)));
    // Its own reader behind its writer is withdrawn, never granted; the
    // other source's reader is.
    assert_eq!(granted(&fx), vec![6]);
    assert_eq!(holding(&tb, "a"), vec![1, 6]);
    assert_eq!(tb.holder_of(b"b"), None);
    tb.check_invariants();
}

#[test]
fn an_ended_session_lets_in_what_its_queued_writer_blocked() {
    let mut tb = t();
    let mut fx = Vec::new();
    let o = tb.owner_open(100, 1).unwrap();
    acq(&mut tb, &mut fx, 1, "k", S);
    let opts = LockOpts {
        owner: o,
        ..LockOpts::default()
    };
    tb.lock_access(
        2,
        "k",
        "w",
        ep(),
        LockMode::Blocking,
        opts,
        X,
        at(2),
        &mut fx,
    )
    .unwrap();
    acq(&mut tb, &mut fx, 3, "k", S);
    fx.clear();
    tb.owner_end(100, at(10), &mut fx);
    assert_eq!(granted(&fx), vec![3]);
    tb.check_invariants();
}

#[test]
fn queries_see_every_holder() {
    let mut tb = t();
    let mut fx = Vec::new();
    acq(&mut tb, &mut fx, 1, "k", S);
    acq(&mut tb, &mut fx, 2, "k", S);
    acq(&mut tb, &mut fx, 3, "x", X);
    let hs = tb.holders_of(b"k");
    assert_eq!(hs.len(), 2);
    assert!(hs.iter().all(|(_, a)| *a == S));
    assert_eq!(hs[0].0.source, Name::new(b"s1").unwrap());
    assert!(hs[0].0.grant_id < hs[1].0.grant_id);
    // The holder that stands for the key is its oldest.
    assert_eq!(tb.holder_of(b"k").unwrap().grant_id, hs[0].0.grant_id);
    assert_eq!(tb.grant_of("k"), Some(hs[0].0.grant_id));
    assert_eq!(tb.holder_conn(b"k"), Some(1));
    assert_eq!(tb.holders_of(b"x")[0].1, X);
    assert_eq!(tb.held_keys(), 2);
    assert_eq!(tb.holders(), 3);
    let mut seen = Vec::new();
    tb.for_each_holder(|h, a| seen.push((h.key.to_vec(), h.grant_id, a)));
    assert_eq!(seen.len(), 3);
    assert_eq!(tb.held_list().len(), 3);
    assert_eq!(tb.oldest_acquired_unix_ms(), Some(at(1).unix_ms));
    // The inline holder leaves first: the share still holds, and stands
    // for the key.
    fx.clear();
    rel(&mut tb, &mut fx, "k", 1, 10);
    assert_eq!(tb.holder_conn(b"k"), Some(2));
    assert_eq!(tb.oldest_acquired_unix_ms(), Some(at(2).unix_ms));
    let (id, n) = tb.listing_begin(0, ListForm::Keyx);
    assert_eq!(n, 2, "one entry per held key");
    let mut out = Vec::new();
    assert_eq!(tb.listing_next(id, usize::MAX, &mut out), Step::Done);
    let (id, n) = tb.listing_begin(0, ListForm::Keyh);
    assert_eq!(n, 2, "one entry per holder");
    assert_eq!(tb.listing_next(id, usize::MAX, &mut out), Step::Done);
    tb.check_invariants();
    // A new reader takes the free inline slot.
    acq(&mut tb, &mut fx, 4, "k", S);
    assert_eq!(holding(&tb, "k"), vec![2, 4]);
    assert!(tb.keys[tb.find_key(b"k").unwrap() as usize]
        .holder
        .is_some());
    tb.check_invariants();
}

#[test]
fn a_listing_keeps_a_shared_key_as_it_was() {
    let mut tb = t();
    let mut fx = Vec::new();
    acq(&mut tb, &mut fx, 1, "k", S);
    acq(&mut tb, &mut fx, 2, "k", S);
    let (id, n) = tb.listing_begin(at(0).unix_ms, ListForm::Keyx);
    assert_eq!(n, 1);
    let (every, n) = tb.listing_begin(at(0).unix_ms, ListForm::Keyh);
    assert_eq!(n, 2);
    let mut before = Vec::new();
    tb.held_ref(tb.find_key(b"k").unwrap())
        .unwrap()
        .encode_admin(ListForm::Keyx, at(0).unix_ms, &mut before);
    let mut both = Vec::new();
    tb.for_each_holder_of(b"k", |h, _| {
        h.encode_admin(ListForm::Keyh, at(0).unix_ms, &mut both)
    });
    // The newest holder goes, then the oldest: the listings still show
    // them as they were.
    rel(&mut tb, &mut fx, "k", 2, 10);
    rel(&mut tb, &mut fx, "k", 1, 11);
    let mut out = Vec::new();
    assert_eq!(tb.listing_next(id, usize::MAX, &mut out), Step::Done);
    assert_eq!(out, before);
    out.clear();
    assert_eq!(tb.listing_next(every, usize::MAX, &mut out), Step::Done);
    assert_eq!(out, both);
    tb.check_invariants();
}

#[test]
fn the_budget_counts_each_share_as_a_waiter() {
    let mut tb = Table::new(Limits {
        max_keys: 4,
        max_waiters: 2,
    });
    let mut fx = Vec::new();
    for c in 1..=4 {
        acq(&mut tb, &mut fx, c, "k", S);
    }
    // The first holder is inline; two more are shares; the fourth is over.
    assert_eq!(granted(&fx), vec![1, 2, 3]);
    assert_eq!(replies(&fx), vec![(4, Reply::Limit)]);
    assert_eq!(tb.budget().waiters(), 2);
    fx.clear();
    rel(&mut tb, &mut fx, "k", 2, 10);
    assert_eq!(tb.budget().waiters(), 1);
    tb.check_invariants();
    drop(tb);
}

#[test]
fn replay_installs_and_releases_single_holders() {
    let mut tb = t();
    let mut fx = Vec::new();
    let h = |grant_id, src: &str| HeldKey {
        key: Name::new(b"k").unwrap(),
        source: Name::new(src.as_bytes()).unwrap(),
        endpoint: ep(),
        acquired_unix_ms: 1,
        grant_id,
        mode: HoldMode::Persistent,
        expires_unix_ms: 0,
        session: 0,
        access: crate::core::Access::Exclusive,
    };
    // Shared grants add up; the same grant again replaces itself.
    assert!(tb.restore_access(h(10, "a").as_ref(), S, at(0)));
    assert!(tb.restore_access(h(11, "b").as_ref(), S, at(0)));
    assert!(tb.restore_access(h(11, "b").as_ref(), S, at(0)));
    assert_eq!(tb.holder_count_of(b"k"), 2);
    assert!(tb.next_grant_id() > 11);
    tb.check_invariants();
    // One holder's release leaves the other.
    assert!(tb.restore_release_grant("k", 10, at(0)));
    assert!(!tb.restore_release_grant("k", 10, at(0)));
    assert_eq!(tb.holder_count_of(b"k"), 1);
    tb.check_invariants();
    // An exclusive grant replaces every holder (as it always did).
    assert!(tb.restore_access(h(12, "a").as_ref(), S, at(0)));
    assert!(tb.restore_holder(&h(13, "c"), at(0)));
    assert_eq!(tb.holder_count_of(b"k"), 1);
    assert_eq!(tb.access_of_key(b"k"), Some(X));
    tb.check_invariants();
    // A semaphore at its n loses its oldest to a newer record.
    tb.restore_release("k", at(0));
    assert_eq!(tb.key_entries(), 0);
    for g in 20..23 {
        assert!(tb.restore_access(h(g, "a").as_ref(), sem(2), at(0)));
    }
    let gs: Vec<u64> = tb.holders_of(b"k").iter().map(|h| h.0.grant_id).collect();
    assert_eq!(gs, vec![21, 22]);
    assert!(!tb.restore_access(h(30, "a").as_ref(), sem(0), at(0)));
    tb.check_invariants();
    // Undo of a share's grant, then settle: the next waiter gets the slot.
    acq(&mut tb, &mut fx, 7, "k", sem(2));
    assert!(tb.undo_grant("k", 22, at(0)));
    tb.settle("k", at(1), &mut fx);
    assert_eq!(granted(&fx), vec![7]);
    tb.check_invariants();
    // The released holder's and the grant's access are what records need.
    fx.clear();
    rel(&mut tb, &mut fx, "k", 7, 5);
    let Some(Effect::Released {
        released, grant_id, ..
    }) = fx.first().copied()
    else {
        panic!("{fx:?}")
    };
    assert_eq!(tb.released_access(released, grant_id), sem(2));
}

#[test]
fn an_exclusive_key_makes_no_multi() {
    let mut tb = t();
    let mut fx = Vec::new();
    acq(&mut tb, &mut fx, 1, "k", X);
    acq(&mut tb, &mut fx, 2, "k", X);
    acq(&mut tb, &mut fx, 3, "k", S);
    assert!(tb.multis.is_empty(), "a shared waiter needs none");
    let w = acq(&mut tb, &mut fx, 4, "k", sem(2)).unwrap();
    assert_eq!(tb.multis.len(), 1, "a semaphore waiter fixes its n");
    tb.withdraw(w);
    assert!(tb.multis.is_empty());
    tb.check_invariants();
}

mod props;

/// A chunked snapshot walk visits every holder of a shared or semaphore
/// key, with its access, once; a share released before its visit is not
/// visited; one granted after the walk began is not either (its record
/// follows the snapshot).
#[test]
fn a_snapshot_walk_visits_every_share() {
    let mut tb = t();
    let mut fx = Vec::new();
    for c in 1..=3 {
        acq(&mut tb, &mut fx, c, "doc", S);
    }
    for c in 4..=5 {
        acq(&mut tb, &mut fx, c, "pool", sem(2));
    }
    acq(&mut tb, &mut fx, 6, "solo", X);
    assert_eq!(granted(&fx), vec![1, 2, 3, 4, 5, 6]);
    fx.clear();
    tb.walk_begin();
    let mut seen = Vec::new();
    assert!(!tb.walk_step(2, |h| seen.push((h.key.to_vec(), h.grant_id, h.access))));
    // Changes during the walk: one share goes, a new one comes.
    let (doc2, _) = tb.holders_of(b"doc")[1];
    rel(&mut tb, &mut fx, "doc", 2, 5);
    acq(&mut tb, &mut fx, 7, "doc", S);
    while !tb.walk_step(1, |h| seen.push((h.key.to_vec(), h.grant_id, h.access))) {}
    let keys: Vec<(&[u8], Access)> = seen.iter().map(|(k, _, a)| (&k[..], *a)).collect();
    assert_eq!(
        keys.iter().filter(|(k, a)| *k == b"doc" && *a == S).count(),
        2
    );
    assert_eq!(
        keys.iter()
            .filter(|(k, a)| *k == b"pool" && *a == sem(2))
            .count(),
        2
    );
    assert_eq!(
        keys.iter()
            .filter(|(k, a)| *k == b"solo" && *a == X)
            .count(),
        1
    );
    assert!(
        !seen.iter().any(|(_, g, _)| *g == doc2.grant_id),
        "released before its visit"
    );
    assert_eq!(
        seen.len(),
        5,
        "the share granted during the walk is not visited"
    );
    tb.check_invariants();
}

#[test]
fn proclaim_moves_a_holder_to_its_new_source_and_keeps_everything_else() {
    let mut tb = t();
    let mut fx = Vec::new();
    let o1 = tb.owner_open(101, 1).unwrap();
    let o2 = tb.owner_open(102, 2).unwrap();
    let session = |owner| LockOpts {
        mode: HoldMode::Session,
        ttl_ms: 0,
        owner,
        deadline_us: None,
    };
    let go = |tb: &mut Table, fx: &mut Effects, conn, key, opts, a| {
        tb.lock_access(
            conn,
            key,
            "old",
            ep(),
            LockMode::Blocking,
            opts,
            a,
            at(0),
            fx,
        )
    };
    // An exclusive (inline) holder and a share.
    go(&mut tb, &mut fx, 1, "x", session(o1), X);
    go(&mut tb, &mut fx, 2, "s", session(o1), S);
    go(&mut tb, &mut fx, 3, "s", session(o2), S);
    let (tx, ts) = (token(&tb, "x", 1), token(&tb, "s", 2));
    fx.clear();
    // Another session may not; a stale token changes nothing.
    assert_eq!(
        tb.proclaim(o2, "x", tx, b"v").unwrap_err(),
        Checked::NotOwner
    );
    assert_eq!(
        tb.proclaim(o1, "x", tx + 99, b"v").unwrap_err(),
        Checked::Stale
    );
    assert_eq!(tb.holder_of(b"x").unwrap().source.as_bytes(), b"old");
    let p = tb.proclaim(o1, "x", tx, b"leader-1").expect("its own hold");
    assert_eq!(p.prev.source.as_bytes(), b"old");
    assert_eq!(p.prev.grant_id, tx);
    let p2 = tb
        .proclaim(o1, "s", ts, b"reader-1")
        .expect("its own share");
    assert_eq!(p2.prev.source.as_bytes(), b"old");
    let (h, _) = tb.granted(p.key_slot, tx);
    assert_eq!(
        (h.source, h.grant_id, h.mode),
        (&b"leader-1"[..], tx, HoldMode::Session)
    );
    tb.check_invariants();
    assert!(fx.is_empty(), "a proclaim grants and releases nothing");
    // A reset of the old source leaves the proclaimed holders; one of the
    // new source takes them.
    tb.reset_by_source(None, "old", at(1), &mut fx);
    assert_eq!(released(&fx), vec![3]);
    assert_eq!(holding(&tb, "x"), vec![1]);
    assert_eq!(holding(&tb, "s"), vec![2]);
    tb.check_invariants();
    fx.clear();
    // An undo puts the old source back.
    assert!(tb.set_source("x", tx, b"old"));
    assert_eq!(tb.holder_of(b"x").unwrap().source.as_bytes(), b"old");
    assert!(!tb.set_source("x", tx + 99, b"v"), "not a holder");
    tb.reset_by_source(None, "leader-1", at(2), &mut fx);
    assert!(released(&fx).is_empty(), "x is back under its old source");
    tb.reset_by_source(None, "reader-1", at(2), &mut fx);
    assert_eq!(released(&fx), vec![2]);
    tb.check_invariants();
}
