//! `ringlock cluster add | remove | replace`: membership changes, each
//! driven step by step from here against whichever node serves.
//!
//! - add: the node joins as a learner (it must run already, started with
//!   `--join`), catches up (from a snapshot when it is far behind), and is
//!   promoted to voter only once it holds everything committed.
//! - remove: a leader that is to go hands its leadership over first.
//! - replace: the new node is added as a learner and caught up, then one
//!   joint change makes it a voter and removes the old one together.
//!
//! Every step is asked again from the start when the command is run again
//! (a step already done is accepted as done), so an interrupted command
//! is finished by running it once more.

use std::io::Write;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use ringlock::client::members::{Change, MemberStatus};
use ringlock::client::{Client, RetryPolicy, ShardStatus};

use crate::exit::{Fail, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE};

type Nodes = [(String, Vec<SocketAddr>)];

/// What to change.
pub enum Op {
    Add { node: u64, addr: String },
    Remove { node: u64 },
    Replace { old: u64, new: u64, addr: String },
}

struct Ctx<'a> {
    nodes: &'a Nodes,
    auth: Option<&'a [u8]>,
    timeout: Duration,
}

impl Ctx<'_> {
    fn client(&self, node: &(String, Vec<SocketAddr>)) -> Result<Client, Fail> {
        let (shown, addrs) = node;
        let b =
            Client::builder(addrs.as_slice()).admin_addr(crate::cluster::admin_named(shown, addrs));
        let mut b = crate::tlsopt::client(b)
            .retry(RetryPolicy::none())
            .connect_timeout(Duration::from_secs(1))
            .io_timeout(Duration::from_secs(3));
        if let Some(t) = self.auth {
            b = b.admin_auth_token(t.to_vec());
        }
        b.build().map_err(|e| Fail(EX_USAGE, e.to_string()))
    }

    /// The node that serves every shard now: its index, its client, and
    /// its shards' replication records.
    fn leader_now(&self) -> Result<(usize, Client, Vec<ShardStatus>), Fail> {
        let answers = crate::cluster::query(self.nodes, self.auth);
        for (i, a) in answers.into_iter().enumerate() {
            if let Ok(Some(shards)) = a.result {
                if !shards.is_empty() && shards.iter().all(|s| s.serving) {
                    return Ok((i, self.client(&self.nodes[i])?, shards));
                }
            }
        }
        Err(Fail(
            EX_UNAVAILABLE,
            "no node of the cluster serves every shard (see ringlock cluster status)".into(),
        ))
    }

    /// [`leader_now`](Self::leader_now), waiting out an election (up to
    /// the step's timeout; said every few seconds).
    fn leader(&self) -> Result<(usize, Client, Vec<ShardStatus>), Fail> {
        let start = Instant::now();
        let mut said = Instant::now();
        loop {
            match self.leader_now() {
                Ok(found) => return Ok(found),
                Err(Fail(code, why)) if start.elapsed() >= self.timeout => {
                    return Err(Fail(
                        code,
                        format!("{why}; waited {:?} (--timeout)", self.timeout),
                    ))
                }
                Err(Fail(_, why)) => {
                    if said.elapsed() >= Duration::from_secs(3) {
                        said = Instant::now();
                        say(&format!("waiting: {why}"));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (polling the serving node) until `done` says so for its
    /// records, printing what `progress` says every few seconds.
    fn wait(
        &self,
        what: &str,
        done: impl Fn(&[ShardStatus], &[MemberStatus]) -> Result<bool, String>,
    ) -> Result<(), Fail> {
        let start = Instant::now();
        let mut said = Instant::now();
        let mut last = String::new();
        loop {
            match self.leader_now().and_then(|(_, c, shards)| {
                let m = c
                    .cluster_members()
                    .map_err(|e| Fail(EX_UNAVAILABLE, format!("CMEM: {e}")))?
                    .unwrap_or_default();
                Ok((shards, m))
            }) {
                Ok((shards, m)) => match done(&shards, &m) {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(why) => last = why,
                },
                Err(Fail(_, why)) => last = why,
            }
            if start.elapsed() >= self.timeout {
                return Err(Fail(
                    EX_TEMPFAIL,
                    format!(
                        "{what}: not done within {:?}{}",
                        self.timeout,
                        if last.is_empty() {
                            String::new()
                        } else {
                            format!(" ({last})")
                        }
                    ),
                ));
            }
            if said.elapsed() >= Duration::from_secs(3) && !last.is_empty() {
                said = Instant::now();
                say(&format!("waiting: {what}: {last}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Asks the serving node to make `change`, once.
    fn change_once(&self, change: &Change) -> Result<(), Fail> {
        let (i, c, _) = self.leader_now()?;
        match c.change_members(change) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(Fail(
                EX_TEMPFAIL,
                format!("{} refused {}: {why}", self.nodes[i].0, describe(change)),
            )),
            Err(e) => Err(Fail(
                EX_UNAVAILABLE,
                format!("{}: {}: {e}", self.nodes[i].0, describe(change)),
            )),
        }
    }

    /// Makes `change` until every shard's membership satisfies `want`
    /// with no change in progress: asked again while a shard refuses for
    /// a passing reason (another change in progress, a learner still
    /// catching up, an election) or lost it (its leader changed before it
    /// committed); a shard that made it already answers `+`. A refusal for
    /// any other reason ends the command.
    fn make(
        &self,
        change: &Change,
        what: &str,
        want: &dyn Fn(&MemberStatus) -> bool,
    ) -> Result<(), Fail> {
        let passing = |why: &str| {
            [
                "in progress",
                "has not caught up",
                "does not serve",
                "serves every shard",
                "being rewritten",
            ]
            .iter()
            .any(|p| why.contains(p))
        };
        let start = Instant::now();
        let mut said = Instant::now();
        let mut last = String::new();
        let mut asked_at: Option<Instant> = None;
        loop {
            match self.leader_now().and_then(|(_, c, _)| members(&c)) {
                Ok(m) if !m.is_empty() && m.iter().all(|s| !s.change_in_progress && want(s)) => {
                    return Ok(())
                }
                Ok(m) => {
                    let busy = m.iter().any(|s| s.change_in_progress);
                    // Asked, and nothing in progress a while later: lost.
                    let lost = asked_at.is_some_and(|t| t.elapsed() > Duration::from_secs(1));
                    if asked_at.is_none() || (!busy && lost) {
                        match self.change_once(change) {
                            Ok(()) => asked_at = Some(Instant::now()),
                            Err(Fail(_, why)) if passing(&why) => last = why,
                            Err(f) => return Err(f),
                        }
                    } else if let Some(s) = m.iter().find(|s| s.change_in_progress || !want(s)) {
                        last = format!("shard {} has voters {:?}", s.shard, s.voters);
                    }
                }
                Err(Fail(_, why)) => last = why,
            }
            if start.elapsed() >= self.timeout {
                return Err(Fail(
                    EX_TEMPFAIL,
                    format!("{what}: not done within {:?} ({last})", self.timeout),
                ));
            }
            if said.elapsed() >= Duration::from_secs(3) && !last.is_empty() {
                said = Instant::now();
                say(&format!("waiting: {what}: {last}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A leader that is to leave hands its leadership over first.
    fn not_led_by(&self, node: u64) -> Result<(), Fail> {
        let (i, c, shards) = self.leader()?;
        if shards.first().map(|s| s.node) != Some(node) {
            return Ok(());
        }
        say(&format!(
            "node {node} leads: handing its leadership over first"
        ));
        c.transfer_leader(0).map_err(|e| {
            Fail(
                EX_TEMPFAIL,
                format!("{} refused to hand over: {e}", self.nodes[i].0),
            )
        })?;
        self.wait("another node serves", |shards, _| {
            Ok(shards.first().is_some_and(|s| s.node != node))
        })
    }

    /// Adds `node` as a learner and waits until it caught up in every
    /// shard.
    fn add_learner(&self, node: u64, addr: &str) -> Result<(), Fail> {
        reachable(addr)?;
        let (_, c, _) = self.leader()?;
        let m = members(&c)?;
        if m.iter().all(|s| s.voters.contains(&node)) {
            return Ok(());
        }
        self.make(
            &Change::AddLearner {
                node,
                addr: addr.to_string(),
            },
            &format!("node {node} becomes a learner"),
            &|s| s.learners.contains(&node) || s.voters.contains(&node),
        )?;
        say(&format!("node {node} added as a learner; catching up"));
        self.wait(&format!("node {node} catches up"), |shards, _| {
            for s in shards {
                match s.followers.iter().find(|f| f.node == node) {
                    // As the leader counts it (a few entries in flight).
                    Some(f) if f.matched + 100 >= s.commit && f.active => {}
                    Some(f) => {
                        return Err(format!(
                            "shard {} has entries up to {} of {}{}",
                            s.shard,
                            f.matched,
                            s.commit,
                            if f.active { "" } else { ", not heard from" }
                        ))
                    }
                    None => return Err(format!("shard {} does not list it yet", s.shard)),
                }
            }
            Ok(true)
        })
    }
}

fn members(c: &Client) -> Result<Vec<MemberStatus>, Fail> {
    c.cluster_members()
        .map_err(|e| Fail(EX_UNAVAILABLE, format!("CMEM: {e}")))?
        .ok_or_else(|| Fail(EX_USAGE, "the server is not a cluster member".into()))
}

fn describe(c: &Change) -> String {
    match c {
        Change::AddLearner { node, addr } => format!("adding node {node} at {addr}"),
        Change::Promote { node } => format!("promoting node {node}"),
        Change::Remove { node } => format!("removing node {node}"),
        Change::Replace { old, new } => format!("replacing node {old} by node {new}"),
    }
}

fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "ringlock: {msg}");
}

/// The new node's Raft address answers from this host (a cheap check
/// before anything changes; the leader must reach it too).
fn reachable(addr: &str) -> Result<(), Fail> {
    let a = addr
        .to_socket_addrs()
        .map_err(|e| {
            Fail(
                EX_USAGE,
                format!("{addr:?}: {e} (give HOST:PORT of its --peers entry)"),
            )
        })?
        .next()
        .ok_or_else(|| Fail(EX_USAGE, format!("{addr:?} has no address")))?;
    TcpStream::connect_timeout(&a, Duration::from_secs(2)).map_err(|e| {
        Fail(
            EX_UNAVAILABLE,
            format!(
                "{addr} ({a}) is not reachable from this host: {e}; start the new node first \
                 (ringlockd --join --node-id N --peers ... with an empty --data-path)"
            ),
        )
    })?;
    Ok(())
}

/// Runs `op`; prints the resulting voters.
pub fn run(nodes: &Nodes, auth: Option<&[u8]>, timeout: Duration, op: Op) -> Result<u8, Fail> {
    let ctx = Ctx {
        nodes,
        auth,
        timeout,
    };
    match op {
        Op::Add { node, addr } => {
            ctx.add_learner(node, &addr)?;
            ctx.make(
                &Change::Promote { node },
                &format!("node {node} becomes a voter"),
                &|s| s.voters.contains(&node),
            )?;
        }
        Op::Remove { node } => {
            let (_, c, _) = ctx.leader()?;
            let m = members(&c)?;
            let member = |s: &MemberStatus| s.voters.contains(&node) || s.learners.contains(&node);
            if !m.iter().any(member) {
                return Err(Fail(
                    EX_TEMPFAIL,
                    format!(
                        "node {node} is not a member (voters {:?})",
                        m.first().map(|s| s.voters.clone()).unwrap_or_default()
                    ),
                ));
            }
            // The last voter: the leader refuses; never hand over first.
            if m.iter().any(|s| s.voters != [node]) {
                ctx.not_led_by(node)?;
            }
            ctx.make(
                &Change::Remove { node },
                &format!("node {node} leaves"),
                &|s| !member(s),
            )?;
            say(&format!(
                "node {node} is no longer a member: stop it, and empty its --data-path before it \
                 is ever added again"
            ));
        }
        Op::Replace { old, new, addr } => {
            ctx.add_learner(new, &addr)?;
            ctx.not_led_by(old)?;
            ctx.make(
                &Change::Replace { old, new },
                &format!("node {new} replaces node {old}"),
                &|s| s.voters.contains(&new) && !s.voters.contains(&old) && s.outgoing.is_empty(),
            )?;
            say(&format!("node {old} is no longer a member: stop it"));
        }
    }
    let (_, c, _) = ctx.leader()?;
    let m = members(&c)?;
    let voters = m.first().map(|s| s.voters.clone()).unwrap_or_default();
    let _ = writeln!(std::io::stdout(), "voters {voters:?}");
    Ok(0)
}
