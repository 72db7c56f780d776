//! `ringlock cluster status` and `transfer-leader`: the nodes asked (from
//! `--admin-addr` or discovered), waited on, and the verdict as exit status.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::ArgMatches;

use crate::args::Cli;
use crate::conn::read_auth_token;
use crate::exit::{usage, Fail, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE};
use crate::show::fmt_duration;
use crate::{cluster, discover, tlsopt};

/// The nodes' admin addresses for `ringlock cluster` and the admin auth
/// token: --admin-addr, or each --addr node's own (as its directory
/// says), and every other member they list (see `discover`).
#[allow(clippy::type_complexity)] // the two things every cluster command needs
pub(crate) fn cluster_nodes(
    cli: &Cli,
    matches: &ArgMatches,
) -> Result<(Vec<(String, Vec<SocketAddr>)>, Option<Vec<u8>>), Fail> {
    let from_env = |id: &str| matches.value_source(id) == Some(ValueSource::EnvVariable);
    let auth = match &cli.auth_token_file {
        Some(path) => {
            Some(read_auth_token(path).map_err(|e| usage(format!("--auth-token-file: {e}")))?)
        }
        None => None,
    };
    let given = match &cli.admin_addr {
        Some(a) => cluster::parse_addrs(
            a,
            if from_env("admin_addr") {
                "RINGLOCK_ADMIN_ADDR"
            } else {
                "--admin-addr"
            },
        )?,
        None => discover::admin_from_lock(
            &cli.addr,
            if from_env("addr") {
                "RINGLOCK_ADDR"
            } else {
                "--addr"
            },
        )?,
    };
    Ok((discover::with_members(given, auth.as_deref()), auth))
}

/// `ringlock cluster transfer-leader [NODE]`: the serving node (waited
/// for, up to `timeout`) hands over; waits (as long) until another node
/// serves every shard.
pub(crate) fn cluster_transfer(
    cli: &Cli,
    matches: &ArgMatches,
    to: u32,
    timeout: Duration,
) -> Result<u8, Fail> {
    let (nodes, auth) = cluster_nodes(cli, matches)?;
    let serving = |answers: &[cluster::NodeAnswer]| -> Option<usize> {
        answers.iter().position(|n| {
            matches!(&n.result, Ok(Some(shards)) if !shards.is_empty() && shards.iter().all(|s| s.serving))
        })
    };
    let t = std::time::Instant::now();
    let old = loop {
        let answers = cluster::query(&nodes, auth.as_deref());
        if let Some(old) = serving(&answers) {
            break old;
        }
        if t.elapsed() >= timeout {
            return Err(Fail(
                EX_UNAVAILABLE,
                format!(
                    "no node serves every shard (waited {}; see ringlock cluster status)",
                    fmt_duration(timeout)
                ),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let b = ringlock::client::Client::builder(nodes[old].1.as_slice())
        .admin_addr(nodes[old].0.as_str())
        .io_timeout(std::time::Duration::from_secs(2));
    let mut b = tlsopt::client(b);
    if let Some(t) = &auth {
        b = b.admin_auth_token(t.clone());
    }
    let client = b.build().map_err(|e| Fail(EX_USAGE, e.to_string()))?;
    if let Err(e) = client.transfer_leader(to) {
        return Err(Fail(
            EX_TEMPFAIL,
            format!(
                "{} refused the hand-over: {e} (is node {to} a peer, other than the leader?)",
                nodes[old].0
            ),
        ));
    }
    let t = std::time::Instant::now();
    let mut asked = t;
    while t.elapsed() < timeout {
        let answers = cluster::query(&nodes, auth.as_deref());
        let now_serving = serving(&answers);
        if now_serving == Some(old) && asked.elapsed() > std::time::Duration::from_millis(700) {
            // The leader serves again: it gave the hand-over up (raft-rs
            // does after an election timeout when the target is not caught
            // up yet, e.g. just promoted on a busy host). Ask again.
            let _ = client.transfer_leader(to);
            asked = std::time::Instant::now();
        }
        if let Some(new) = now_serving.filter(|&n| n != old) {
            let id = match &answers[new].result {
                Ok(Some(shards)) => shards[0].node,
                _ => 0,
            };
            let _ = writeln!(io::stdout(), "node {id} ({}) serves", nodes[new].0);
            return Ok(0);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(Fail(
        EX_TEMPFAIL,
        format!("no other node served within {}", fmt_duration(timeout)),
    ))
}

/// `ringlock cluster status`: every node (`cluster_nodes`) asked at once,
/// again while an election runs (up to `timeout`); the table (or JSON) on
/// stdout, the verdict as exit status with its reason on stderr.
pub(crate) fn cluster_status(
    cli: &Cli,
    matches: &ArgMatches,
    json: bool,
    timeout: Duration,
) -> Result<u8, Fail> {
    let (nodes, auth) = cluster_nodes(cli, matches)?;
    let t = std::time::Instant::now();
    let answers = loop {
        let answers = cluster::query(&nodes, auth.as_deref());
        if cluster::verdict(&answers).0 != EX_TEMPFAIL || t.elapsed() >= timeout {
            break answers;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = if json {
        cluster::to_json(&answers)
    } else {
        cluster::table(&answers) + &cluster::membership(&answers)
    };
    let _ = io::stdout().write_all(text.as_bytes());
    let _ = io::stdout().flush();
    match cluster::verdict(&answers) {
        (0, _) => Ok(0),
        (code, why) => Err(Fail(code, why.unwrap_or_default())),
    }
}
