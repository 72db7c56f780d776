//! KEYS/KEYX on a node that cannot reach its leader answer `-` instead of
//! hanging (issue: a read request dropped while its link was down was
//! thought never to be sent again): each partition shape of the fault
//! proxy, during the cut and right after it heals. The bound is a hang
//! detector, not a latency assertion (the docs promise an answer within
//! an election timeout).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::cluster::Cluster;
use common::fault_proxy::poll_until;

const WAIT: Duration = Duration::from_secs(20);
/// Far past an election timeout: an answer later than this is a hang.
const HANG: Duration = Duration::from_secs(10);

/// The first bytes of a KEYX answer: `-`, or a count (4 bytes) and more.
fn keyx(addr: SocketAddr) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("admin port");
    s.set_read_timeout(Some(HANG)).expect("timeout");
    s.write_all(b"KEYX").expect("send");
    let mut b = vec![0u8; 64];
    let n = s
        .read(&mut b)
        .unwrap_or_else(|e| panic!("KEYX on {addr} did not answer within {HANG:?}: {e}"));
    b.truncate(n);
    assert!(!b.is_empty(), "KEYX on {addr}: closed without an answer");
    b
}

fn answered(b: &[u8]) -> bool {
    b != b"-"
}

#[test]
fn keyx_on_a_cut_off_node_answers_during_and_after_the_cut() {
    let c = Cluster::start(3, common::cluster::test_threads(), &[]);
    let admin = |i: usize| c.nodes[i].as_ref().unwrap().admin_addr;
    let l = c.leader(WAIT);
    let f = (0..3).find(|&i| i != l).unwrap();
    assert!(
        answered(&keyx(admin(f))),
        "a follower answers through its leader"
    );

    // A follower cut off both ways: `-` (no leader to ask), then answers
    // again once healed.
    c.isolate(f);
    assert_eq!(keyx(admin(f)), b"-");
    assert_eq!(keyx(admin(f)), b"-", "and again");
    c.heal();
    poll_until("the healed follower answers", WAIT, || {
        answered(&keyx(admin(f)))
    });

    // Each one-way cut between the leader and a follower.
    let l = c.leader(WAIT);
    let f = (0..3).find(|&i| i != l).unwrap();
    for (from, to) in [(l, f), (f, l)] {
        c.cut_one_way(from, to);
        // Whatever the follower says during the cut (it may still reach
        // the leader through the other direction's heartbeats), it says
        // it within the bound.
        keyx(admin(f));
        c.heal();
        poll_until("the follower answers after the cut", WAIT, || {
            answered(&keyx(admin(f)))
        });
    }

    // The leader cut off from every follower (outbound, 4 s, as found),
    // then healed: the first KEYX on it answers.
    let l = c.leader(WAIT);
    for j in (0..3).filter(|&j| j != l) {
        c.cut_one_way(l, j);
    }
    poll_until("another node serves", WAIT, || {
        (0..3).any(|i| i != l && c.serves(i))
    });
    keyx(admin(l));
    c.heal();
    poll_until("the old leader answers after the cut", WAIT, || {
        answered(&keyx(admin(l)))
    });
}
