//! `lease-expiry`: what one expiry tick of the lock table costs while many
//! leases are held, as a function of how many expire in it.
//!
//! Claim under test: expiring leases costs O(expired), not O(held), per
//! tick. The lock table (`ringlock::core::Table`, the pure core the server
//! runs) is driven directly: no sockets, no clock but the one this program
//! hands it. For every held count H and expiring count k, the table holds H
//! leases, k of them due at the tick and the other H − k spread over the
//! hour after it (a scan over all holds would have to look at each of
//! them); one `expire(now)` is timed; the k expired keys are taken again
//! with a new deadline so the next round starts from H held leases again.
//! The figure is the median (and p90) over the rounds of the time of that
//! one call, and the same per expired lease.
//!
//! ```text
//! lease-expiry [--held 1000,10000,100000] [--expiring 0,1,10,100,1000,10000]
//!              [--rounds 200] [--json]
//! ```
//!
//! Every tick must release exactly the k leases due in it, each with a
//! Lost-or-released effect; anything else is an error (exit 1), so a run
//! also checks the table. Prints a markdown table, then the ratio that
//! answers the question: for each k, the tick's median time with the most
//! leases held divided by the time with the fewest. O(expired) keeps that
//! ratio near 1 however many more leases are held; O(held) makes it grow
//! with the held count.

use std::fmt::Write as _;
use std::time::Instant;

use std::net::SocketAddr;

use ringlock::core::{
    Effect, Effects, HoldMode, Limits, LockMode, LockOpts, Name, Now, Source, Table,
};

/// One measured combination.
struct Cell {
    held: usize,
    expiring: usize,
    /// Sorted durations of the timed `expire` calls, nanoseconds.
    ns: Vec<u64>,
}

impl Cell {
    fn pct(&self, p: f64) -> u64 {
        self.ns[((self.ns.len() - 1) as f64 * p).round() as usize]
    }
}

struct Args {
    held: Vec<usize>,
    expiring: Vec<usize>,
    rounds: usize,
    json: bool,
}

fn parse_list(s: &str, what: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|v| {
            v.trim()
                .replace('_', "")
                .parse()
                .map_err(|_| format!("bad {what} {v:?} (a comma-separated list of counts)"))
        })
        .collect()
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        held: vec![1_000, 10_000, 100_000],
        expiring: vec![0, 1, 10, 100, 1_000, 10_000],
        rounds: 200,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--held" => a.held = parse_list(&value()?, "--held")?,
            "--expiring" => a.expiring = parse_list(&value()?, "--expiring")?,
            "--rounds" => {
                a.rounds = value()?
                    .parse()
                    .ok()
                    .filter(|&r| r > 0)
                    .ok_or("--rounds needs a positive count")?
            }
            "--json" => a.json = true,
            "-h" | "--help" => {
                return Err(
                    "usage: lease-expiry [--held LIST] [--expiring LIST] [--rounds N] [--json]"
                        .into(),
                )
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.held.contains(&0) {
        return Err("--held counts must be at least 1".into());
    }
    Ok(a)
}

fn key(i: usize) -> Name {
    Name::new(format!("lease/{i}").as_bytes()).expect("short key")
}

const TTL_MS: u32 = 1_000;
const HOUR_MS: u32 = 3_600_000;

/// Takes `key` as a lease of `ttl_ms`, as a session Acquire with hold mode
/// lease does; the key must be free.
fn lock_lease(
    table: &mut Table,
    key: &Name,
    ttl_ms: u32,
    now: Now,
    fx: &mut Effects,
) -> Result<(), String> {
    let source = Source::new(b"bench").expect("short source");
    let endpoint = SocketAddr::from(([127, 0, 0, 1], 1));
    let before = fx.len();
    let opts = LockOpts {
        mode: HoldMode::Lease,
        ttl_ms,
        ..LockOpts::default()
    };
    table.lock_with(1, key, &source, endpoint, LockMode::Try, opts, now, fx);
    match fx.get(before) {
        Some(Effect::Granted { .. }) => Ok(()),
        other => Err(format!("lease on a free key not granted: {other:?}")),
    }
}

/// Measures one (held, expiring) cell.
fn measure(held: usize, expiring: usize, rounds: usize) -> Result<Cell, String> {
    let mut table = Table::new(Limits {
        max_keys: held,
        max_waiters: 16,
    });
    let mut fx: Effects = Vec::with_capacity(expiring * 4 + 16);
    let mut now = Now {
        mono_us: 1_000_000,
        unix_ms: 1_700_000_000_000,
    };
    // The H − k long leases: deadlines spread over the hour after the
    // first tick, so none of them is due during the measurement but a
    // scan would meet every one.
    for i in expiring..held {
        let ttl_ms = HOUR_MS + (i as u64 * HOUR_MS as u64 / held as u64) as u32;
        lock_lease(&mut table, &key(i), ttl_ms, now, &mut fx)?;
        fx.clear();
        table.effects_applied();
    }
    let mut ns = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        for i in 0..expiring {
            lock_lease(&mut table, &key(i), TTL_MS, now, &mut fx)?;
        }
        fx.clear();
        table.effects_applied();
        if table.held_keys() != held {
            return Err(format!(
                "{} held before the tick, expected {held}",
                table.held_keys()
            ));
        }
        let tick = Now {
            mono_us: now.mono_us + u64::from(TTL_MS) * 1_000,
            unix_ms: now.unix_ms + u64::from(TTL_MS),
        };
        let t = Instant::now();
        table.expire(tick, &mut fx);
        ns.push(t.elapsed().as_nanos() as u64);
        let released = fx
            .iter()
            .filter(|e| matches!(e, Effect::Released { .. }))
            .count();
        if released != expiring || table.held_keys() != held - expiring {
            return Err(format!(
                "held {held}, {expiring} due: the tick released {released} and left {} held",
                table.held_keys()
            ));
        }
        fx.clear();
        table.effects_applied();
        now = tick;
    }
    ns.sort_unstable();
    Ok(Cell { held, expiring, ns })
}

/// The reference an O(held) design pays: one pass over every hold looking
/// at its deadline (what a tick that scans for expired leases does before
/// it releases anything), on a table of `held` leases none of which is due.
fn measure_scan(held: usize, rounds: usize) -> Result<Cell, String> {
    let mut table = Table::new(Limits {
        max_keys: held,
        max_waiters: 16,
    });
    let mut fx: Effects = Vec::new();
    let now = Now {
        mono_us: 1_000_000,
        unix_ms: 1_700_000_000_000,
    };
    for i in 0..held {
        let ttl_ms = HOUR_MS + (i as u64 * HOUR_MS as u64 / held as u64) as u32;
        lock_lease(&mut table, &key(i), ttl_ms, now, &mut fx)?;
        fx.clear();
        table.effects_applied();
    }
    let tick_unix_ms = now.unix_ms + u64::from(TTL_MS);
    let mut ns = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let mut due = 0usize;
        let mut seen = 0usize;
        table.for_each_held(|h| {
            seen += 1;
            if h.expires_unix_ms != 0 && h.expires_unix_ms <= tick_unix_ms {
                due += 1;
            }
        });
        ns.push(t.elapsed().as_nanos() as u64);
        if std::hint::black_box(seen) != held || due != 0 {
            return Err(format!(
                "scan saw {seen} holds ({due} due), expected {held} (0 due)"
            ));
        }
    }
    ns.sort_unstable();
    Ok(Cell {
        held,
        expiring: 0,
        ns,
    })
}

fn us(ns: u64) -> String {
    let v = ns as f64 / 1e3;
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("lease-expiry: {e}");
        std::process::exit(2)
    });
    let mut cells = Vec::new();
    for &h in &args.held {
        for &k in args.expiring.iter().filter(|&&k| k <= h) {
            match measure(h, k, args.rounds) {
                Ok(c) => cells.push(c),
                Err(e) => {
                    eprintln!("lease-expiry: {e}");
                    std::process::exit(1)
                }
            }
        }
    }
    let mut scans = Vec::new();
    for &h in &args.held {
        match measure_scan(h, args.rounds) {
            Ok(c) => scans.push(c),
            Err(e) => {
                eprintln!("lease-expiry: {e}");
                std::process::exit(1)
            }
        }
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Lease expiry: one `Table::expire(now)` tick, median (p90) µs over {} rounds\n",
        args.rounds
    );
    let _ = write!(o, "| expiring k \\ held H |");
    for h in &args.held {
        let _ = write!(o, " {h} |");
    }
    let _ = write!(o, " ns per expired lease (largest H) |\n|---:|");
    for _ in &args.held {
        o.push_str("---:|");
    }
    o.push_str("---:|\n");
    let largest = *args.held.iter().max().expect("at least one held count");
    for &k in &args.expiring {
        let _ = write!(o, "| {k} |");
        for &h in &args.held {
            match cells.iter().find(|c| c.held == h && c.expiring == k) {
                Some(c) => {
                    let _ = write!(o, " {} ({}) |", us(c.pct(0.5)), us(c.pct(0.9)));
                }
                None => o.push_str(" – |"),
            }
        }
        match cells.iter().find(|c| c.held == largest && c.expiring == k) {
            Some(c) if k > 0 => {
                let _ = writeln!(o, " {:.0} |", c.pct(0.5) as f64 / k as f64);
            }
            _ => o.push_str(" – |\n"),
        }
    }
    o.push_str("| scan of all H holds (the O(held) reference) |");
    for c in &scans {
        let _ = write!(o, " {} ({}) |", us(c.pct(0.5)), us(c.pct(0.9)));
    }
    o.push_str(" – |\n");
    let smallest = *args.held.iter().min().expect("at least one held count");
    if largest > smallest {
        let _ = writeln!(
            o,
            "\nSame k, {largest} held vs {smallest} held ({}× the leases): median tick time ratio",
            largest / smallest
        );
        for &k in args.expiring.iter().filter(|&&k| k <= smallest) {
            let find = |h| cells.iter().find(|c| c.held == h && c.expiring == k);
            if let (Some(a), Some(b)) = (find(largest), find(smallest)) {
                let _ = writeln!(
                    o,
                    "- k = {k}: {:.2}× ({} vs {} µs)",
                    a.pct(0.5) as f64 / b.pct(0.5).max(1) as f64,
                    us(a.pct(0.5)),
                    us(b.pct(0.5))
                );
            }
        }
    }
    print!("{o}");
    if args.json {
        let mut j = String::from("{\"cells\":[");
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                j.push(',');
            }
            let _ = write!(
                j,
                "{{\"held\":{},\"expiring\":{},\"rounds\":{},\"p50_ns\":{},\"p90_ns\":{},\"max_ns\":{}}}",
                c.held,
                c.expiring,
                c.ns.len(),
                c.pct(0.5),
                c.pct(0.9),
                c.pct(1.0)
            );
        }
        j.push_str("],\"scan\":[");
        for (i, c) in scans.iter().enumerate() {
            if i > 0 {
                j.push(',');
            }
            let _ = write!(
                j,
                "{{\"held\":{},\"rounds\":{},\"p50_ns\":{},\"p90_ns\":{}}}",
                c.held,
                c.ns.len(),
                c.pct(0.5),
                c.pct(0.9)
            );
        }
        j.push_str("]}");
        println!("{j}");
    }
}
