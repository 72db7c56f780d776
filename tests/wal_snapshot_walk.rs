//! A background snapshot is encoded a few holders per tick while the table
//! keeps changing; the compacted log (the piecewise snapshot, then every
//! record carried since the walk began) must replay to exactly the table
//! the server has. This drives the real `Table` and `Log` with seeded
//! random grants, releases, resets, lease extends and expiries between the
//! chunks, lands every chain at once on an in-memory file, and after each
//! tick replays the whole file into a fresh table and compares every key.

mod sim_common;

use std::net::SocketAddr;

use ringlock::core::list::NIL;
use ringlock::core::{Effect, Effects, HoldMode, Limits, LockMode, LockOpts, Now, Table, Token};
use ringlock::wal::log::{Chain, Landed, Log, Next};
use ringlock::wal::record::MAGIC;
use sim_common::Rng;

const KEYS: usize = 40;
const LIMITS: Limits = Limits {
    max_keys: 64,
    max_waiters: 256,
};

fn key(i: usize) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

struct World {
    rng: Rng,
    table: Table,
    log: Log,
    fx: Effects,
    now: Now,
    /// The log file: what landed appends and finished compactions left.
    file: Vec<u8>,
    /// The compaction's temp file.
    temp: Vec<u8>,
    owners: Vec<u32>,
    compactions: u64,
    /// Keys held when the walk in progress began: it visits no more.
    held_at_walk_start: u64,
    /// Records carried by compactions whose walk spanned ticks.
    carried_across_walks: u64,
    next_conn: Token,
}

impl World {
    fn new(seed: u64, chunk: usize) -> World {
        let mut table = Table::new(LIMITS);
        let owners = (0..3)
            .map(|i| table.owner_open(100 + i, 0).expect("an owner slot"))
            .collect();
        // Floor 0: a compaction starts whenever the file is twice the live
        // records, which with this churn is every few ticks.
        let log = Log::new(MAGIC.len() as u64, &table, 0).with_snapshot_chunk(chunk);
        World {
            rng: Rng::seeded(seed),
            table,
            log,
            fx: Effects::new(),
            now: Now {
                mono_us: 1_000_000,
                unix_ms: 1_800_000_000_000,
            },
            file: MAGIC.to_vec(),
            temp: Vec::new(),
            owners,
            compactions: 0,
            held_at_walk_start: 0,
            carried_across_walks: 0,
            next_conn: 1,
        }
    }

    /// The shard's part: every effect's record goes into the log.
    fn apply(&mut self) {
        for e in self.fx.drain(..) {
            match e {
                Effect::Granted {
                    key_slot, grant_id, ..
                } => {
                    self.log
                        .append_acquire(self.table.granted(key_slot, grant_id).0);
                }
                Effect::Released {
                    released, grant_id, ..
                } => {
                    self.log
                        .append_release(self.table.released(released, grant_id));
                }
                Effect::Reply { .. } | Effect::LimitReached { .. } => {}
            }
        }
        self.table.effects_applied();
    }

    fn op(&mut self) {
        let k = key(self.rng.below(KEYS as u64) as usize);
        let ep: SocketAddr = "127.0.0.1:4000".parse().expect("address");
        let now = self.now;
        match self.rng.below(10) {
            0..=3 => {
                let lease = self.rng.chance(400);
                let opts = LockOpts {
                    mode: if lease {
                        HoldMode::Lease
                    } else {
                        HoldMode::Persistent
                    },
                    ttl_ms: 2 + self.rng.below(40) as u32,
                    owner: if lease {
                        self.owners[self.rng.below(3) as usize]
                    } else {
                        NIL
                    },
                    deadline_us: None,
                };
                let src = format!("src-{}", self.rng.below(4));
                self.next_conn += 1;
                self.table.lock_with(
                    self.next_conn,
                    &k,
                    src.as_bytes(),
                    ep,
                    LockMode::Try,
                    opts,
                    now,
                    &mut self.fx,
                );
            }
            4..=6 => self.table.unlock(0, &k, now, &mut self.fx),
            7 => self.table.reset_by_key(None, &k, now, &mut self.fx),
            _ => {
                // Extend whatever lease holds the key, by its owner.
                if let Some(h) = self.table.holder_of(&k) {
                    if h.mode == HoldMode::Lease {
                        for &o in &self.owners.clone() {
                            let ttl = 2 + self.rng.below(40) as u32;
                            if let Ok(x) = self.table.extend(o, &k, h.grant_id, ttl, now) {
                                self.log
                                    .append_extend(&x.key, x.grant_id, x.expires_unix_ms);
                            }
                        }
                    }
                }
            }
        }
        self.apply();
    }

    /// One tick: a chunk of the snapshot, some requests, lease expiry, then
    /// every chain the log wants, each landing at once.
    fn tick(&mut self) {
        self.now.mono_us += 1000;
        self.now.unix_ms += 1;
        let walking = self.log.encoding();
        self.log.encode_step(&mut self.table);
        for _ in 0..self.rng.below(6) {
            self.op();
        }
        let now = self.now;
        self.table.expire(now, &mut self.fx);
        self.apply();
        loop {
            let was_encoding = self.log.encoding();
            let next = self.log.next_chain(&mut self.table, self.now.mono_us);
            if !was_encoding && self.log.encoding() {
                self.held_at_walk_start = self.table.held_keys() as u64;
            }
            match next {
                Next::Chain(chain, buf) => {
                    match chain {
                        Chain::Append { offset } => {
                            assert_eq!(offset, self.file.len() as u64, "append offset");
                            self.file.extend_from_slice(&buf);
                        }
                        Chain::Snapshot => self.temp = buf.clone(),
                        Chain::Finish { offset } => {
                            assert_eq!(offset, self.temp.len() as u64, "finish offset");
                            self.temp.extend_from_slice(&buf);
                            self.file = std::mem::take(&mut self.temp);
                        }
                        Chain::Rewrite => panic!("no chain fails here"),
                    }
                    let landed = self.log.landed(chain, Ok(()), buf, self.now.mono_us);
                    if let Landed::Compacted {
                        carried_records,
                        snapshot_records,
                        ..
                    } = landed
                    {
                        assert!(
                            snapshot_records <= self.held_at_walk_start,
                            "the walk visited {snapshot_records} keys, {} were held at its start",
                            self.held_at_walk_start
                        );
                        self.compactions += 1;
                        if walking {
                            self.carried_across_walks += carried_records;
                        }
                    }
                }
                Next::Idle => break,
                Next::FailPending => panic!("the log is not broken"),
                Next::Propose(_) => panic!("a single node's log proposes nothing"),
            }
        }
    }

    /// Everything appended has landed: the file must replay to the table.
    fn check(&self, seed: u64, tick: u64) {
        assert!(!self.log.pending() && !self.log.busy(), "all landed");
        let mut replayed = Table::new(LIMITS);
        ringlock::wal::replay(&self.file, "test.log", &mut replayed, None, self.now)
            .unwrap_or_else(|e| panic!("seed {seed} tick {tick}: replay failed: {e}"));
        for i in 0..KEYS {
            let k = key(i);
            let (live, back) = (self.table.holder_of(&k), replayed.holder_of(&k));
            assert_eq!(
                live.map(|h| (h.source, h.grant_id, h.mode, h.expires_unix_ms)),
                back.map(|h| (h.source, h.grant_id, h.mode, h.expires_unix_ms)),
                "seed {seed} tick {tick}: key-{i} differs after replaying the compacted log"
            );
        }
        assert!(replayed.next_grant_id() <= self.table.next_grant_id());
    }
}

#[test]
fn a_snapshot_encoded_across_ticks_replays_to_the_live_table() {
    let mut compactions = 0;
    let mut carried = 0;
    for seed in 1..=60u64 {
        let chunk = [1, 2, 3, 7][(seed % 4) as usize];
        let mut w = World::new(seed, chunk);
        for tick in 0..1500 {
            w.tick();
            w.check(seed, tick);
        }
        compactions += w.compactions;
        carried += w.carried_across_walks;
    }
    // The property is only tested if walks did span changes.
    assert!(compactions > 500, "only {compactions} compactions");
    assert!(carried > 500, "only {carried} records carried across walks");
}
