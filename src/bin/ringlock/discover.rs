//! How `ringlock cluster` finds every node of a cluster from the
//! addresses it was given (docs/cluster.md, "How the CLI finds the
//! cluster"):
//!
//! - `--admin-addr` names admin ports; without it, each `--addr` lock
//!   address is asked for its node's directory (Locate), whose first
//!   entry is that node's own admin address. A server without Locate
//!   leaves the old rule, the lock port + 1.
//! - Then each admin address is asked for its directory (`CADR`): every
//!   other member it lists is added, at the admin address that member's
//!   own lock port tells (its directory lists its lock address, learned
//!   from the peer links).
//!
//! Each question is asked once, of every node at the same time, with
//! short timeouts: a node that does not answer is a `down` row of
//! `cluster status`, never a failure of the whole command.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use ringlock::client::locate::Directory;
use ringlock::client::{Client, RetryPolicy, ToServerAddrs, DEFAULT_PORT};

use crate::exit::{Fail, EX_USAGE};

/// A node as the cluster commands know it: the admin address as shown
/// (given, or as a directory said it), and what it resolved to (empty:
/// the node's admin address is unknown).
pub type Node = (String, Vec<SocketAddr>);

const CONNECT: Duration = Duration::from_secs(1);
const ANSWER: Duration = Duration::from_secs(2);

/// A quick client of one lock address (`lock`) or one admin address
/// (`admin`, with the builder's lock address a placeholder).
fn client(lock: &str, admin: Option<&Node>, auth: Option<&[u8]>) -> Option<Client> {
    let b = match admin {
        Some((shown, addrs)) => {
            Client::builder(addrs.as_slice()).admin_addr(crate::cluster::admin_named(shown, addrs))
        }
        None => Client::builder(lock),
    };
    let mut b = crate::tlsopt::client(b)
        .retry(RetryPolicy::none())
        .connect_timeout(CONNECT)
        .io_timeout(ANSWER);
    if let Some(t) = auth {
        b = b.admin_auth_token(t.to_vec());
    }
    b.build().ok()
}

/// An address a directory gave, as the CLI shows and dials it: a wildcard
/// host is the one the node was reached at.
fn usable(text: &str, reached: Option<SocketAddr>) -> Option<Node> {
    if text.is_empty() {
        return None;
    }
    let shown = match (text.parse::<SocketAddr>(), reached) {
        (Ok(a), Some(r)) if a.ip().is_unspecified() => {
            SocketAddr::new(r.ip(), a.port()).to_string()
        }
        _ => text.to_string(),
    };
    let addrs = shown.as_str().to_server_addrs(DEFAULT_PORT + 1).ok()?;
    Some((shown, addrs))
}

/// Each lock address's directory (Locate), asked at once. `None`: no
/// directory (not reached, or a server without Locate).
fn locate_all(items: &[String]) -> Vec<Option<Directory>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .iter()
            .map(|item| s.spawn(move || client(item, None, None)?.locate().ok().flatten()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(None))
            .collect()
    })
}

/// The admin nodes behind the lock addresses `list` (`--addr`, comma-
/// separated; `flag` names it in messages): each node's own admin address
/// from its directory. An address that does not answer is a node whose
/// admin address is unknown; when no address answers with a directory
/// (servers without Locate, or none reached), every lock port + 1.
pub fn admin_from_lock(list: &str, flag: &str) -> Result<Vec<Node>, Fail> {
    let items: Vec<String> = list.split(',').map(|a| a.trim().to_string()).collect();
    let mut resolved = Vec::new();
    for item in &items {
        let lock = item
            .as_str()
            .to_server_addrs(DEFAULT_PORT)
            .map_err(|e| Fail(EX_USAGE, format!("{flag}: {e}")))?;
        resolved.push(lock);
    }
    let answers = locate_all(&items);
    let any = answers.iter().any(Option::is_some);
    let mut nodes = Vec::new();
    for ((item, lock), dir) in items.iter().zip(&resolved).zip(answers) {
        let found = dir
            .as_ref()
            .and_then(|d| d.me())
            .and_then(|me| usable(&me.admin, lock.first().copied()));
        match found {
            Some(node) => nodes.push(node),
            // Shown by its lock address: its admin address is unknown.
            None if any => nodes.push((item.clone(), Vec::new())),
            None => {
                let admin: Vec<SocketAddr> = lock
                    .iter()
                    .map(|l| SocketAddr::new(l.ip(), l.port().wrapping_add(1)))
                    .collect();
                nodes.push((admin[0].to_string(), admin));
            }
        }
    }
    Ok(nodes)
}

/// `nodes` and every other member their directories (`CADR`) list, at
/// the admin address that member's lock port tells (Locate). A member
/// whose admin address nobody can tell is added with none, shown by its
/// lock address (`nodeN` when that is unknown too): a `down` row, unless
/// a given node that did not answer may be it.
pub fn with_members(nodes: Vec<Node>, auth: Option<&[u8]>) -> Vec<Node> {
    let dirs: Vec<Option<Directory>> = std::thread::scope(|s| {
        let handles: Vec<_> = nodes
            .iter()
            .map(|n| {
                s.spawn(move || {
                    if n.1.is_empty() {
                        return None;
                    }
                    client("", Some(n), auth)?.cluster_directory().ok()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(None))
            .collect()
    });
    let mut known: BTreeSet<u64> = dirs.iter().flatten().map(|d| d.node).collect();
    let mut shown: BTreeSet<String> = nodes.iter().map(|n| n.0.clone()).collect();
    // Each member not answered for yet: (id, its admin or lock address, reached at).
    let mut missing = Vec::new();
    for (n, d) in nodes.iter().zip(&dirs) {
        let Some(d) = d else { continue };
        for m in d.nodes.iter().filter(|m| m.node != 0) {
            if known.insert(m.node) {
                missing.push((m.clone(), n.1.first().copied()));
            }
        }
    }
    let found: Vec<Option<Node>> = std::thread::scope(|s| {
        let handles: Vec<_> = missing
            .iter()
            .map(|(m, reached)| {
                s.spawn(move || {
                    if let Some(n) = usable(&m.admin, *reached) {
                        return Some(n);
                    }
                    // Its own lock port tells its admin address.
                    let lock = usable(&m.lock, *reached)?;
                    let d = client(&lock.0, None, None)?.locate().ok()??;
                    let me = d.me().filter(|me| me.node == m.node)?;
                    usable(&me.admin, lock.1.first().copied())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(None))
            .collect()
    });
    // Given nodes that did not answer (one may be an unknown member).
    let silent: Vec<String> = nodes
        .iter()
        .zip(&dirs)
        .filter(|(_, d)| d.is_none())
        .map(|(n, _)| n.0.clone())
        .collect();
    let mut out = nodes;
    let mut unknown = Vec::new();
    for ((m, _), node) in missing.iter().zip(found) {
        match node {
            Some(n) if shown.insert(n.0.clone()) => out.push(n),
            Some(_) => {}
            // Shown by its lock address (if known): a `down` row.
            None => unknown.push((
                if m.lock.is_empty() {
                    format!("node{}", m.node)
                } else {
                    m.lock.clone()
                },
                Vec::new(),
            )),
        }
    }
    // Not twice (a given lock address), and a given node that did not
    // answer may be one of these.
    let fresh: Vec<Node> = unknown
        .into_iter()
        .filter(|n: &Node| !silent.contains(&n.0) && shown.insert(n.0.clone()))
        .collect();
    let unmatched = silent
        .iter()
        .filter(|s| !missing.iter().any(|(m, _)| &m.lock == *s))
        .count();
    out.extend(fresh.into_iter().skip(unmatched));
    out
}
