//! A Locking-Center client given one follower of a 3-node cluster is
//! served: the follower forwards each request to the leader over the
//! peer link and relays the answer (`shard::forward`). Real processes,
//! real sockets: one-shot and persistent connections, FIFO across
//! forwarded and direct waiters, the hang-up of a forwarded waiter, the
//! leader killed under a forwarded waiter, and a request sent during the
//! election that follows.

mod common;

use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::{frame, keys, metric, once, wait_metric, Conn};

const WAIT: Duration = Duration::from_secs(20);

/// A node that is not `l`.
fn follower(l: usize) -> usize {
    (l + 1) % 3
}

/// Every action on fresh one-shot connections to a follower, as an
/// unmodified Locking-Center client sends them: the answers are the
/// leader's, and the leader's table shows the client as the holder (its
/// source, or its IP for an empty one).
#[test]
fn one_shot_requests_to_a_follower_are_served_by_the_leader() {
    let c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let f = follower(l);
    let fa = c.lock_addrs[f];
    let leader_admin = c.nodes[l].as_ref().unwrap().admin_addr;

    assert_eq!(once(fa, &frame(1, b"a", Some(b"alice"))), b'+', "Lock");
    assert_eq!(
        once(fa, &frame(5, b"a", Some(b"bob"))),
        b'#',
        "TryLock held"
    );
    assert_eq!(once(fa, &frame(5, b"b", Some(b""))), b'+', "empty source");
    let held = keys(leader_admin);
    let a = held
        .iter()
        .find(|k| k.key == b"a")
        .expect("a held at the leader");
    assert_eq!(a.source, b"alice");
    let b = held
        .iter()
        .find(|k| k.key == b"b")
        .expect("b held at the leader");
    assert_eq!(b.source, b"127.0.0.1", "an empty source is the client's IP");
    assert!(
        b.endpoint.starts_with("127.0.0.1:"),
        "the endpoint is the client's, not a node's: {}",
        b.endpoint
    );
    assert_eq!(once(fa, &frame(2, b"a", None)), b'+', "Unlock");
    assert_eq!(once(fa, &frame(3, b"b", None)), b'+', "ResetByKey");
    assert_eq!(once(fa, &frame(1, b"c", Some(b"carol"))), b'+');
    assert_eq!(
        once(fa, &[4, 5, b'c', b'a', b'r', b'o', b'l']),
        b'+',
        "ResetBySource"
    );
    assert!(
        keys(leader_admin).is_empty(),
        "everything released at the leader"
    );
    // Bad input is the follower's to refuse: `-`, and nothing changes.
    assert_eq!(once(fa, &[1, 0]), b'-');
    assert!(keys(leader_admin).is_empty());
    let m = c.nodes[f].as_ref().unwrap().metrics();
    assert!(
        metric(m, "ringlock_lc_forwarded_total{outcome=\"answered\"}") >= 7.0,
        "the follower counts what it forwarded"
    );
    let lm = c.nodes[l].as_ref().unwrap().metrics();
    assert!(metric(lm, "ringlock_lc_forwards_served_total") >= 7.0);
}

/// A persistent connection to a follower: pipelined requests answered in
/// order; waiters queued through a follower and on the leader directly
/// are granted in arrival order.
#[test]
fn forwarded_and_direct_waiters_share_one_fifo_queue() {
    let c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let f = follower(l);
    let lm = c.nodes[l].as_ref().unwrap().metrics();

    let mut p = c.conn(f);
    let mut burst = Vec::new();
    burst.extend(frame(5, b"p1", Some(b"pipe")));
    burst.extend(frame(5, b"p1", Some(b"pipe")));
    burst.extend(frame(2, b"p1", None));
    p.send(&burst);
    assert_eq!(
        [p.read_byte(), p.read_byte(), p.read_byte()],
        [b'+', b'#', b'+'],
        "pipelined through a follower, answered in order"
    );

    let mut holder = c.conn(l);
    assert_eq!(holder.lock(b"q", b"h"), b'+');
    let mut w1 = c.conn(f);
    w1.send(&frame(1, b"q", Some(b"w1")));
    wait_metric(lm, "ringlock_queued_waiters", 1.0);
    let mut w2 = c.conn(l);
    w2.send(&frame(1, b"q", Some(b"w2")));
    wait_metric(lm, "ringlock_queued_waiters", 2.0);
    let mut w3 = c.conn(f);
    w3.send(&frame(1, b"q", Some(b"w3")));
    wait_metric(lm, "ringlock_queued_waiters", 3.0);
    assert!(w1.silent_for(100) && w2.silent_for(10) && w3.silent_for(10));

    assert_eq!(holder.unlock(b"q"), b'+');
    assert_eq!(w1.read_byte(), b'+', "the first waiter (forwarded) first");
    assert!(w2.silent_for(100), "the second waits for the first");
    assert_eq!(w1.unlock(b"q"), b'+');
    assert_eq!(w2.read_byte(), b'+', "then the direct one");
    assert!(w3.silent_for(100));
    assert_eq!(w2.unlock(b"q"), b'+');
    assert_eq!(w3.read_byte(), b'+', "then the last, forwarded again");
    assert_eq!(w3.unlock(b"q"), b'+');
}

/// A forwarded Lock whose client hangs up while it waits is withdrawn at
/// the leader: the key goes to the next waiter, never to the ghost.
#[test]
fn a_forwarded_waiter_that_hangs_up_is_withdrawn_at_the_leader() {
    let c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let f = follower(l);
    let lm = c.nodes[l].as_ref().unwrap().metrics();

    let mut holder = c.conn(l);
    assert_eq!(holder.lock(b"k", b"h"), b'+');
    // One-shot and persistent waiters through the follower, then hang-ups.
    let mut gone1 = Conn::connect(c.lock_addrs[f]);
    gone1.send(&frame(1, b"k", Some(b"ghost1")));
    wait_metric(lm, "ringlock_queued_waiters", 1.0);
    let mut gone2 = c.conn(f);
    gone2.send(&frame(1, b"k", Some(b"ghost2")));
    wait_metric(lm, "ringlock_queued_waiters", 2.0);
    drop(gone1);
    gone2.half_close();
    wait_metric(lm, "ringlock_queued_waiters", 0.0);
    assert_eq!(
        gone2.read_byte_or_eof(),
        Some(b'-'),
        "a persistent connection's withdrawn Lock is answered - (its place kept)"
    );
    assert_eq!(holder.unlock(b"k"), b'+');
    let mut next = c.conn(l);
    assert_eq!(next.try_lock(b"k", b"next"), b'+', "nobody got the key");
    let held = keys(c.nodes[l].as_ref().unwrap().admin_addr);
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].source, b"next");
}

/// The leader killed with a forwarded Lock queued on it: the follower's
/// client is not left hanging (its connection closes: the outcome is
/// unknown to it, as for a direct client of the dead leader); a request
/// sent to the follower during the election waits for the new leader and
/// is served by it.
#[test]
fn a_leader_killed_under_a_forwarded_waiter_closes_it_and_the_next_request_waits_out_the_election()
{
    let mut c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let f = follower(l);
    let lm = c.nodes[l].as_ref().unwrap().metrics();

    let mut holder = c.conn(l);
    assert_eq!(holder.lock(b"k", b"h"), b'+');
    let mut w = c.conn(f);
    w.send(&frame(1, b"k", Some(b"w")));
    wait_metric(lm, "ringlock_queued_waiters", 1.0);
    c.kill9(l);
    let t = Instant::now();
    let got = w.read_byte_or_eof();
    assert_eq!(got, None, "closed unanswered (outcome unknown), never +");
    assert!(t.elapsed() < WAIT, "answered within {WAIT:?}");

    // Right away, during the election: the follower parks it until a
    // leader serves, then it is served there ("h" still holds k).
    let mut r = c.conn(f);
    assert_eq!(r.try_lock(b"k", b"r"), b'#', "served by the new leader");
    assert_eq!(r.try_lock(b"fresh", b"r"), b'+');
    let l2 = c.leader(WAIT);
    assert_ne!(l2, l);
    let held = keys(c.nodes[l2].as_ref().unwrap().admin_addr);
    let k = held.iter().find(|k| k.key == b"k").expect("k kept");
    assert_eq!(
        k.source, b"h",
        "the killed leader's holder kept it; w never got it"
    );
    assert!(held.iter().any(|k| k.key == b"fresh" && k.source == b"r"));
}

/// Requests a follower holds for the leader, summed over its shards.
fn parked(c: &Cluster, i: usize) -> f64 {
    let m = c.nodes[i].as_ref().unwrap().metrics();
    (0..c.threads)
        .map(|g| metric(m, &format!("ringlock_lc_forwards_parked{{shard=\"{g}\"}}")))
        .sum()
}

/// A request that meets the follower's link to the leader down (failed,
/// and every redial refused at once, while the leader's link to it stays
/// up) never left the follower: it waits for the link instead of being
/// closed unanswered, is answered `-` (nothing was done) if the link stays
/// down past its bound, and is served once the link is back.
#[test]
fn a_request_that_meets_the_link_to_the_leader_down_waits_for_it() {
    let c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let l = c.leader(WAIT);
    let f = follower(l);
    let to_leader = &c.proxies[&(f, l)];
    for p in to_leader {
        p.refuse(true);
        p.reset_all();
    }
    common::fault_proxy::poll_until(
        "the follower dialed the leader again and was refused",
        WAIT,
        || to_leader.iter().all(|p| p.connections_refused() > 0),
    );

    // Down past the bound: nothing was done, and the client is told so.
    let mut r = c.conn(f);
    r.send(&frame(5, b"k", Some(b"r")));
    common::fault_proxy::poll_until("the request parked", WAIT, || parked(&c, f) == 1.0);
    assert_eq!(
        r.read_byte_or_eof(),
        Some(b'-'),
        "answered - (never sent), not closed unanswered"
    );
    assert_eq!(parked(&c, f), 0.0);

    // Back within the bound: the waiting request goes to the leader.
    let mut w = c.conn(f);
    w.send(&frame(5, b"k", Some(b"w")));
    common::fault_proxy::poll_until("the request parked", WAIT, || parked(&c, f) == 1.0);
    for p in to_leader {
        p.refuse(false);
    }
    assert_eq!(w.read_byte(), b'+', "served once the link is back");
    let held = keys(c.nodes[l].as_ref().unwrap().admin_addr);
    assert!(
        held.iter().any(|k| k.key == b"k" && k.source == b"w"),
        "held at the leader"
    );
}
