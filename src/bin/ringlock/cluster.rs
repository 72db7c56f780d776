//! `ringlock cluster status`: every node's replication state, asked of
//! each node's admin port (`CLST`), side by side (the nodes: those given
//! and every member they list, see `discover`).
//!
//! Each node is asked once, all at the same time, with short timeouts and
//! no retries: a node that does not answer is a row saying so (`down`),
//! never a failure of the whole command. The verdict ([`verdict`]) is the
//! exit status: 0 when some node serves and every answer names that same
//! leader for every shard.

use std::net::SocketAddr;
use std::time::Duration;

use ringlock::client::members::MemberStatus;
use ringlock::client::{
    Client, Error, RetryPolicy, Role, ShardStatus, ToServerAddrs, DEFAULT_PORT,
};

use crate::bytes;
use crate::exit::{Fail, EX_PROTOCOL, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE};

/// What one node said.
pub struct NodeAnswer {
    /// The address as given.
    pub shown: String,
    /// `Ok(None)`: not a cluster member; `Err`: no answer (why).
    pub result: Result<Option<Vec<ShardStatus>>, String>,
    /// Each shard's membership as the node applied it (`CMEM`; `None`
    /// when it did not answer that).
    pub members: Option<Vec<MemberStatus>>,
}

/// The admin addresses, comma-separated (`where_` names the flag or the
/// environment variable for messages). Each is resolved now: a bad one is
/// a usage error before any traffic.
pub fn parse_addrs(list: &str, where_: &str) -> Result<Vec<(String, Vec<SocketAddr>)>, Fail> {
    let mut out = Vec::new();
    for a in list.split(',').map(str::trim) {
        if a.is_empty() {
            return Err(Fail(
                EX_USAGE,
                format!(
                    "{where_}: an empty address in {list:?} (give HOST[:PORT],HOST[:PORT],...)"
                ),
            ));
        }
        let resolved = a
            .to_server_addrs(DEFAULT_PORT + 1)
            .map_err(|e| Fail(EX_USAGE, format!("{where_}: {e}")))?;
        out.push((a.to_string(), resolved));
    }
    Ok(out)
}

/// Asks every node at once.
pub fn query(nodes: &[(String, Vec<SocketAddr>)], auth: Option<&[u8]>) -> Vec<NodeAnswer> {
    std::thread::scope(|s| {
        let handles: Vec<_> = nodes
            .iter()
            .map(|(shown, addrs)| {
                s.spawn(move || {
                    let (result, members) = ask(shown, addrs, auth);
                    NodeAnswer {
                        shown: shown.clone(),
                        result,
                        members,
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a status query does not panic"))
            .collect()
    })
}

type Answer = (
    Result<Option<Vec<ShardStatus>>, String>,
    Option<Vec<MemberStatus>>,
);

fn ask(shown: &str, addrs: &[SocketAddr], auth: Option<&[u8]>) -> Answer {
    if addrs.is_empty() {
        // Named by a directory, or an --addr that did not answer Locate.
        return (
            Err("no admin address known: it did not answer at this lock address".into()),
            None,
        );
    }
    // The lock address is never used; the builder wants one. The admin
    // address as given: a TLS dial verifies its host name.
    let b = Client::builder(addrs).admin_addr(admin_named(shown, addrs));
    let mut b = crate::tlsopt::client(b)
        .retry(RetryPolicy::none())
        .connect_timeout(Duration::from_secs(1))
        .io_timeout(Duration::from_secs(2));
    if let Some(t) = auth {
        b = b.admin_auth_token(t.to_vec());
    }
    let client = match b.build() {
        Ok(c) => c,
        Err(e) => return (Err(e.to_string()), None),
    };
    let result = match client.cluster_status() {
        Ok(v) => Ok(v),
        Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err("closed without an answer (a server without CLST, or not authorized)".into())
        }
        Err(Error::Refused) => Err("refused: wrong auth token".into()),
        Err(e) => Err(e.to_string()),
    };
    let members = match &result {
        Ok(Some(_)) => client.cluster_members().ok().flatten(),
        _ => None,
    };
    (result, members)
}

/// The membership lines under the table: the voters (and learners, and a
/// change in progress) as the serving node applied them, shard by shard
/// where shards differ; every node that says it was removed.
pub fn membership(nodes: &[NodeAnswer]) -> String {
    let serving = nodes
        .iter()
        .find(|n| matches!(&n.result, Ok(Some(r)) if !r.is_empty() && r.iter().all(|s| s.serving)));
    let Some(view) = serving
        .or_else(|| nodes.iter().find(|n| n.members.is_some()))
        .and_then(|n| n.members.as_ref())
    else {
        return String::new();
    };
    let list = |v: &[u64]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        }
    };
    let line = |m: &MemberStatus| {
        let mut l = format!("voters {}  learners {}", list(&m.voters), list(&m.learners));
        if !m.outgoing.is_empty() {
            l.push_str(&format!(
                "  (joint change in progress: outgoing voters {})",
                list(&m.outgoing)
            ));
        } else if m.change_in_progress {
            l.push_str("  (change in progress)");
        }
        l
    };
    let mut out = String::new();
    let first = view.first().map(line).unwrap_or_default();
    if view.iter().all(|m| line(m) == first) {
        out.push_str(&format!("members: {first}\n"));
    } else {
        for m in view {
            out.push_str(&format!("members of shard {}: {}\n", m.shard, line(m)));
        }
    }
    for n in nodes {
        if let Some(m) = &n.members {
            if m.iter().any(|s| s.removed) {
                let id = m.first().map_or(0, |s| s.node);
                out.push_str(&format!(
                    "node {id} ({}) was removed from the cluster: stop it\n",
                    bytes::escape(n.shown.as_bytes())
                ));
            }
        }
    }
    out
}

/// The exit status and, when not 0, the line that says why:
/// - 0: some node serves every shard, and every node that answered names
///   that node as every shard's leader;
/// - 69: no node answered;
/// - 75: nodes answered, but no node serves or they do not agree on one
///   leader (an election in progress, a partition; ask again);
/// - 76: no node that answered is a cluster member.
pub fn verdict(nodes: &[NodeAnswer]) -> (u8, Option<String>) {
    let up: Vec<&NodeAnswer> = nodes.iter().filter(|n| n.result.is_ok()).collect();
    if up.is_empty() {
        return (EX_UNAVAILABLE, Some("no node answered".into()));
    }
    let recs: Vec<&ShardStatus> = up
        .iter()
        .filter_map(|n| n.result.as_ref().ok().and_then(|r| r.as_ref()))
        .flatten()
        .collect();
    if recs.is_empty() {
        return (
            EX_PROTOCOL,
            Some("no node that answered is a cluster member (started without --peers)".into()),
        );
    }
    let serving: Vec<u64> = up
        .iter()
        .filter_map(|n| match &n.result {
            Ok(Some(r)) if !r.is_empty() && r.iter().all(|s| s.serving) => Some(r[0].node),
            _ => None,
        })
        .collect();
    let Some(&leader) = serving.first() else {
        return (EX_TEMPFAIL, Some("no node serves every shard".into()));
    };
    if let Some(r) = recs.iter().find(|r| r.leader != leader) {
        return (
            EX_TEMPFAIL,
            Some(format!(
                "node {} serves, but node {} names {} as the leader of shard {}",
                leader,
                r.node,
                if r.leader == 0 {
                    "no node".to_string()
                } else {
                    format!("node {}", r.leader)
                },
                r.shard
            )),
        );
    }
    (0, None)
}

/// How far node `node` is behind in `shard`, as that shard's leader (if it
/// answered) sees it.
fn lag_of(nodes: &[NodeAnswer], node: u64, shard: u32) -> Option<u64> {
    nodes
        .iter()
        .filter_map(|n| n.result.as_ref().ok().and_then(|r| r.as_ref()))
        .flatten()
        .filter(|r| r.shard == shard && r.role == Role::Leader)
        .find_map(|l| {
            l.followers
                .iter()
                .find(|f| f.node == node)
                .map(|f| l.lag(f))
        })
}

/// The table: one row per node and shard (one row for a node that did not
/// answer or is not a cluster member). LAG is a follower's distance behind
/// the leader's log as the leader reports it (`-` on the leader, `?` when
/// the leader did not answer).
pub fn table(nodes: &[NodeAnswer]) -> String {
    let mut rows: Vec<Vec<String>> = vec![[
        "NODE", "ADDR", "SHARD", "ROLE", "TERM", "LEADER", "COMMIT", "APPLIED", "LAG", "SERVING",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()];
    let dash = || "-".to_string();
    for n in nodes {
        let addr = bytes::escape(n.shown.as_bytes());
        match &n.result {
            Err(why) => {
                let mut r = vec!["?".into(), addr, dash(), "down".into()];
                r.extend((0..6).map(|_| dash()));
                r[9] = format!("- ({why})");
                rows.push(r);
            }
            Ok(None) => {
                let mut r = vec!["-".into(), addr, dash(), "not-a-cluster-member".into()];
                r.extend((0..6).map(|_| dash()));
                rows.push(r);
            }
            Ok(Some(recs)) => {
                for s in recs {
                    let lag = if s.role == Role::Leader {
                        dash()
                    } else {
                        lag_of(nodes, s.node, s.shard).map_or("?".into(), |l| l.to_string())
                    };
                    rows.push(vec![
                        s.node.to_string(),
                        addr.clone(),
                        s.shard.to_string(),
                        s.role.name().into(),
                        s.term.to_string(),
                        if s.leader == 0 {
                            dash()
                        } else {
                            s.leader.to_string()
                        },
                        s.commit.to_string(),
                        s.applied.to_string(),
                        lag,
                        if s.serving { "yes" } else { "no" }.into(),
                    ]);
                }
            }
        }
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A JSON array, one object per node and line:
///
/// ```text
/// {"addr":"10.0.0.1:22120","up":true,"member":true,"error":null,"shards":[{"shard":0,"node":1,"role":"leader","term":3,"leader":1,"commit":42,"applied":42,"last_index":42,"serving":true,"lease_valid":true,"lag":null,"followers":[{"node":2,"matched":42,"lag":0,"active":true}]}]}
/// ```
///
/// `up` false: the node did not answer (`error` says why, `shards` is
/// empty); `member` false: it is not a cluster member. `lag` as in the
/// table (`null` on the leader or when the leader did not answer).
pub fn to_json(nodes: &[NodeAnswer]) -> String {
    let mut out = String::from("[");
    for (i, n) in nodes.iter().enumerate() {
        out.push_str(if i == 0 { "\n" } else { ",\n" });
        let (up, member, error, recs): (bool, bool, String, &[ShardStatus]) = match &n.result {
            Err(why) => (false, false, bytes::json_str(why), &[]),
            Ok(None) => (true, false, "null".into(), &[]),
            Ok(Some(r)) => (true, true, "null".into(), r),
        };
        let shards: Vec<String> = recs
            .iter()
            .map(|s| {
                let followers: Vec<String> = s
                    .followers
                    .iter()
                    .map(|f| {
                        format!(
                            "{{\"node\":{},\"matched\":{},\"lag\":{},\"active\":{}}}",
                            f.node,
                            f.matched,
                            s.lag(f),
                            f.active
                        )
                    })
                    .collect();
                let lag = if s.role == Role::Leader {
                    None
                } else {
                    lag_of(nodes, s.node, s.shard)
                };
                format!(
                    "{{\"shard\":{},\"node\":{},\"role\":\"{}\",\"term\":{},\"leader\":{},\"commit\":{},\"applied\":{},\"last_index\":{},\"serving\":{},\"lease_valid\":{},\"lag\":{},\"followers\":[{}]}}",
                    s.shard,
                    s.node,
                    s.role.name(),
                    s.term,
                    s.leader,
                    s.commit,
                    s.applied,
                    s.last_index,
                    s.serving,
                    s.lease_valid,
                    lag.map_or("null".into(), |l| l.to_string()),
                    followers.join(",")
                )
            })
            .collect();
        let membership = match &n.members {
            None => "null".to_string(),
            Some(ms) => {
                let ids = |v: &[u64]| {
                    v.iter()
                        .map(|n| n.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                };
                let recs: Vec<String> = ms
                    .iter()
                    .map(|m| {
                        let addrs: Vec<String> = m
                            .addrs
                            .iter()
                            .map(|(id, a)| format!("\"{id}\":{}", bytes::json_str(a)))
                            .collect();
                        format!(
                            "{{\"shard\":{},\"voters\":[{}],\"outgoing\":[{}],\"learners\":[{}],\"change_in_progress\":{},\"removed\":{},\"addrs\":{{{}}}}}",
                            m.shard,
                            ids(&m.voters),
                            ids(&m.outgoing),
                            ids(&m.learners),
                            m.change_in_progress,
                            m.removed,
                            addrs.join(",")
                        )
                    })
                    .collect();
                format!("[{}]", recs.join(","))
            }
        };
        out.push_str(&format!(
            "{{\"addr\":{},\"up\":{up},\"member\":{member},\"error\":{error},\"shards\":[{}],\"membership\":{membership}}}",
            bytes::json_str(&n.shown),
            shards.join(",")
        ));
    }
    out.push_str(if nodes.is_empty() { "]\n" } else { "\n]\n" });
    out
}

/// `shown` (an admin address as the user gave it) with the port it
/// resolved to, for a builder: a host name kept for TLS verification.
pub fn admin_named(shown: &str, addrs: &[SocketAddr]) -> (String, u16) {
    let port = addrs
        .first()
        .map_or(ringlock::client::DEFAULT_PORT + 1, SocketAddr::port);
    let host = match shown.parse::<SocketAddr>() {
        Ok(a) => a.ip().to_string(),
        Err(_) => match shown.rsplit_once(':') {
            Some((h, p)) if p.parse::<u16>().is_ok() => h.to_string(),
            _ => shown.to_string(),
        },
    };
    (
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlock::client::FollowerStatus;

    fn rec(node: u64, role: Role, leader: u64, serving: bool) -> ShardStatus {
        ShardStatus {
            shard: 0,
            node,
            role,
            serving,
            lease_valid: serving,
            term: 4,
            leader,
            commit: 10,
            applied: 10,
            last_index: 12,
            followers: if role == Role::Leader {
                vec![FollowerStatus {
                    node: 2,
                    matched: 9,
                    active: true,
                }]
            } else {
                Vec::new()
            },
        }
    }

    fn up(shown: &str, r: ShardStatus) -> NodeAnswer {
        NodeAnswer {
            shown: shown.into(),
            result: Ok(Some(vec![r])),
            members: None,
        }
    }

    #[test]
    fn the_verdict_needs_one_serving_leader_everyone_names() {
        let down = || NodeAnswer {
            shown: "c:3".into(),
            result: Err("refused".into()),
            members: None,
        };
        let healthy = vec![
            up("a:1", rec(1, Role::Leader, 1, true)),
            up("b:2", rec(2, Role::Follower, 1, false)),
            down(),
        ];
        assert_eq!(verdict(&healthy), (0, None));
        let t = table(&healthy);
        assert!(t.lines().nth(1).unwrap().starts_with("1     a:1"), "{t}");
        assert!(t.contains("follower"), "{t}");
        let row2 = t.lines().nth(2).unwrap();
        assert!(row2.split_whitespace().nth(8) == Some("3"), "lag 12-9: {t}");
        assert!(t.lines().nth(3).unwrap().contains("down"), "{t}");
        let j = to_json(&healthy);
        assert!(j.contains("\"lag\":3"), "{j}");
        assert!(j.contains("\"up\":false"), "{j}");

        let split = vec![
            up("a:1", rec(1, Role::Leader, 1, true)),
            up("b:2", rec(2, Role::Follower, 3, false)),
        ];
        assert_eq!(verdict(&split).0, EX_TEMPFAIL);
        let none_serves = vec![up("a:1", rec(1, Role::Candidate, 0, false))];
        assert_eq!(verdict(&none_serves).0, EX_TEMPFAIL);
        assert_eq!(verdict(&[down()]).0, EX_UNAVAILABLE);
        let single = vec![NodeAnswer {
            shown: "a:1".into(),
            result: Ok(None),
            members: None,
        }];
        assert_eq!(verdict(&single).0, EX_PROTOCOL);
        assert!(table(&single).contains("not-a-cluster-member"));
    }

    #[test]
    fn membership_lines_follow_the_serving_node_and_name_removed_nodes() {
        let m = |node: u64, voters: Vec<u64>, outgoing: Vec<u64>, removed: bool| MemberStatus {
            shard: 0,
            node,
            change_in_progress: !outgoing.is_empty(),
            removed,
            voters,
            outgoing,
            learners: vec![],
            addrs: Default::default(),
        };
        let mut a = up("a:1", rec(1, Role::Leader, 1, true));
        a.members = Some(vec![m(1, vec![1, 2, 4], vec![1, 2, 3], false)]);
        let mut b = up("b:2", rec(2, Role::Follower, 1, false));
        b.members = Some(vec![m(2, vec![1, 2, 3], vec![], false)]);
        let mut c = up("c:3", rec(3, Role::Follower, 1, false));
        c.members = Some(vec![m(3, vec![1, 2, 3], vec![], true)]);
        let text = membership(&[b, a, c]);
        assert_eq!(
            text,
            "members: voters 1 2 4  learners -  (joint change in progress: outgoing voters 1 2 3)\n\
             node 3 (c:3) was removed from the cluster: stop it\n"
        );
        let mut lone = up("a:1", rec(1, Role::Leader, 1, true));
        lone.members = Some(vec![m(1, vec![1], vec![], false)]);
        assert!(to_json(&[lone]).contains("\"membership\":[{\"shard\":0,\"voters\":[1]"));
    }

    #[test]
    fn addresses_are_checked_before_any_traffic() {
        let ok = parse_addrs("127.0.0.1:7001, 127.0.0.1", "--admin-addr")
            .ok()
            .unwrap();
        assert_eq!(ok[1].1[0].port(), DEFAULT_PORT + 1);
        let Err(Fail(code, msg)) = parse_addrs("127.0.0.1:1,,x", "--admin-addr") else {
            panic!("an empty entry is refused");
        };
        assert_eq!(code, EX_USAGE);
        assert!(msg.contains("empty"), "{msg}");
        assert!(parse_addrs("127.0.0.1:99999", "--admin-addr").is_err());
    }
}
