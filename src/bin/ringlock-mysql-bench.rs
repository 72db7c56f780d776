//! ringlock-mysql-bench: what `ringlock::mysql` costs over raw `GET_LOCK`.
//!
//! Measures one uncontended acquire+release at a time, side by side in the
//! same run, rounds interleaved (ABC, BCA, CAB, ...) so that drift on a
//! shared machine hits every path alike:
//! - raw: `SELECT GET_LOCK(k, 10)` + `SELECT RELEASE_LOCK(k)` as text on one
//!   connection (the floor: two round trips);
//! - `ringlock::mysql` with a pool that does not ping on checkout;
//! - `ringlock::mysql` with the driver's default pool (a health-check ping
//!   on every checkout of a reused connection: one more round trip).
//!
//! ```text
//! ringlock-mysql-bench --url mysql://USER[:PASSWORD]@HOST[:PORT] [--ops N] [--rounds R] [--key K]
//! ```
//! The password may also come from `$RINGLOCK_MYSQL_PASSWORD(_FILE)`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Conn, Pool, PoolConstraints, PoolOpts};
use ringlock::mysql::{Locker, MysqlAddr, Options};

struct Args {
    url: String,
    ops: usize,
    rounds: usize,
    key: String,
}

fn parse_args() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut args = Args {
        url: String::new(),
        ops: 2000,
        rounds: 5,
        key: "ringlock-mysql-bench".into(),
    };
    let mut p = lexopt::Parser::from_env();
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        let value = |p: &mut lexopt::Parser| -> Result<String, String> {
            p.value()
                .map_err(|e| e.to_string())?
                .into_string()
                .map_err(|_| "arguments must be UTF-8".to_string())
        };
        match arg {
            Long("url") => args.url = value(&mut p)?,
            Long("ops") => args.ops = value(&mut p)?.parse().map_err(|e| format!("--ops: {e}"))?,
            Long("rounds") => {
                args.rounds = value(&mut p)?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?
            }
            Long("key") => args.key = value(&mut p)?,
            Long("help") | Short('h') => {
                return Err(
                    "usage: ringlock-mysql-bench --url mysql://USER[:PASSWORD]@HOST[:PORT] \
                            [--ops N] [--rounds R] [--key K]"
                        .into(),
                )
            }
            other => return Err(other.unexpected().to_string()),
        }
    }
    if args.url.is_empty() {
        return Err("--url is required".into());
    }
    if args.ops == 0 || args.rounds == 0 {
        return Err("--ops and --rounds must be positive".into());
    }
    Ok(args)
}

enum Path {
    Raw(Conn, String, String),
    Lib(Locker),
}

impl Path {
    fn one(&mut self, key: &str) -> Result<(), String> {
        match self {
            Path::Raw(conn, get, rel) => {
                let got: Option<i64> = conn.query_first(&*get).map_err(|e| e.to_string())?;
                if got != Some(1) {
                    return Err(format!("raw GET_LOCK returned {got:?}"));
                }
                let rel: Option<i64> = conn.query_first(&*rel).map_err(|e| e.to_string())?;
                if rel != Some(1) {
                    return Err(format!("raw RELEASE_LOCK returned {rel:?}"));
                }
                Ok(())
            }
            Path::Lib(locker) => {
                let lease = locker
                    .lock(key, Duration::from_secs(10))
                    .map_err(|e| e.to_string())?;
                lease.release().map_err(|e| e.to_string())
            }
        }
    }
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn run(args: &Args) -> Result<(), String> {
    let addr = MysqlAddr::parse(&args.url)
        .and_then(|a| a.with_password_from_env(|k| std::env::var_os(k)))
        .map_err(|e| e.to_string())?;
    let opts = Locker::pool_opts(&addr);
    let mut raw = Conn::new(opts.clone()).map_err(|e| format!("connect: {e}"))?;
    let version: String = raw
        .query_first("SELECT VERSION()")
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    let quoted = mysql::Value::from(args.key.as_str()).as_sql(raw.no_backslash_escape());
    let get = format!("SELECT GET_LOCK({quoted}, 10)");
    let rel = format!("SELECT RELEASE_LOCK({quoted})");
    let constraints = PoolConstraints::new(0, 4).ok_or("pool constraints")?;
    let quiet = Pool::new(
        opts.clone().pool_opts(
            PoolOpts::default()
                .with_constraints(constraints)
                .with_check_health(false),
        ),
    )
    .map_err(|e| e.to_string())?;
    let checked = Pool::new(opts.pool_opts(PoolOpts::default().with_constraints(constraints)))
        .map_err(|e| e.to_string())?;
    let mut paths = [
        (
            "raw GET_LOCK/RELEASE_LOCK, one connection",
            Path::Raw(raw, get, rel),
        ),
        (
            "ringlock::mysql lock+release, pool without checkout ping",
            Path::Lib(Locker::with_options(quiet, Options::default())),
        ),
        (
            "ringlock::mysql lock+release, driver-default pool (ping per checkout)",
            Path::Lib(Locker::with_options(checked, Options::default())),
        ),
    ];
    let mut samples: Vec<Vec<u64>> = vec![Vec::with_capacity(args.ops * args.rounds); paths.len()];
    for (_, path) in paths.iter_mut() {
        path.one(&args.key)?; // warm-up: connect, fill the pool
    }
    for round in 0..args.rounds {
        for j in 0..paths.len() {
            let i = (round + j) % paths.len();
            let path = &mut paths[i].1;
            for _ in 0..args.ops {
                let t = Instant::now();
                path.one(&args.key)?;
                samples[i].push(t.elapsed().as_nanos() as u64);
            }
        }
    }
    println!(
        "ringlock-mysql-bench: {} rounds x {} uncontended acquire+release, one at a time; server {version}",
        args.rounds, args.ops
    );
    println!("| path | mean µs | p50 µs | p99 µs | ratio to raw (mean) | ratio to raw (p50) |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut base = (0.0, 0.0);
    for (i, (name, _)) in paths.iter().enumerate() {
        let s = &mut samples[i];
        s.sort_unstable();
        let mean = s.iter().sum::<u64>() as f64 / s.len() as f64 / 1000.0;
        let p50 = pct(s, 0.50);
        let p99 = pct(s, 0.99);
        if i == 0 {
            base = (mean, p50);
        }
        println!(
            "| {name} | {mean:.1} | {p50:.1} | {p99:.1} | {:.2} | {:.2} |",
            mean / base.0,
            p50 / base.1
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    match parse_args().and_then(|a| run(&a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringlock-mysql-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
