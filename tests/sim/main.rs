//! Deterministic simulation of the shard.
//!
//! The same [`Shard`] code that the io_uring driver runs is driven here by a
//! seeded scheduler over a simulated network and disk:
//! - clients connect (one-shot or persistent), pipeline requests, send
//!   garbage, half-close or reset at any moment; their bytes reach the
//!   server split and coalesced arbitrarily;
//! - sends, closes and log I/O complete in any order the kernel may
//!   produce (per connection, bytes stay in order; a close follows the
//!   connection's last send);
//! - the log's writes are the real write planner's (`wal::plan::Writer`,
//!   the one the driver runs, with smaller pieces and growth steps): the
//!   disk model carries out its batches as linked SQEs complete (a short
//!   write ends the link, the rest is cancelled), its growth steps (slow in
//!   some worlds, so appends run into their range and must wait), and
//!   reports every completion back to it;
//! - log chains fail (EIO, ENOSPC, a failed fdatasync whose pages are then
//!   lost, as after fsyncgate), and the machine crashes: every byte not
//!   covered by a completed fdatasync is dropped, except a random prefix
//!   of the unsynced growth of a file (a torn last sector) and, in the
//!   preallocated log (zero-filled and synced ahead of its records, as the
//!   driver keeps it), any subset of the unsynced sectors an append
//!   overwrote in place (a power cut: sectors reach the disk in any
//!   order); a rename not yet made durable by the directory fsync may or
//!   may not have happened. Or the process is killed (kill -9): the page
//!   cache survives, start-up runs its steps (`wal::STARTUP`: fsync before
//!   replay) over the model, and a power cut right after the restart must
//!   bring back the same table the restarted shard serves from.
//!
//! After every step it checks, against a model built only from what
//! clients were told: never two owners of a key; FIFO among the live
//! waiters of a key; in durable mode every `+` survives a crash and no
//! acknowledged release is undone; a grant whose `+` could not be
//! delivered is given back (no ghost holder at quiescence); connection
//! slots, waiters and held replies return to zero; the disk never holds
//! more than a piece of the log unsynced; at rest, the log on the disk
//! replays to the table the shard serves. The run fails unless the planner
//! went through pieces, short writes, parked appends, growth steps and
//! kills.
//!
//! `SIM_SEEDS=N` (default 150) seeds from `SIM_FIRST_SEED` (default 1),
//! `SIM_STEPS=N` steps each (default 2500); `SIM_SEED=S` runs one seed.
//! A failure prints its seed and the command that reproduces it.
//! `scripts/sim.sh` runs it for hours.

#[path = "../sim_common/mod.rs"]
mod sim_common;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use ringlock::config::Config;
use ringlock::core::{Limits, Now, Table, Token};
use ringlock::metrics::Metrics;
use ringlock::shard::conn::Port;
use ringlock::shard::{Cmd, Shard};
use ringlock::wal::log::{Chain, Log};
use ringlock::wal::plan::{Batch, Files, Grow, Next, Step, Stream, Target, Writer};
use ringlock::wal::record::MAGIC;

const KEYS: &[&[u8]] = &[b"alpha", b"beta", b"gamma"];
const CLIENTS: usize = 6;
const RECV_CHUNK: usize = ringlock::config::LOCK_RECV_BUF;

// ------------------------------------------------------------------ rng

use sim_common::Rng;

// ---------------------------------------------------------------- model

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KState {
    /// Not held by this client, as far as it was told.
    Free,
    /// This client was told `+` and has not sent an Unlock since.
    Held,
    /// Unknown: a reset or an I/O failure may have changed it, or an
    /// Unlock's answer was lost. Never checked, never unlocked.
    Uncertain,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    Persist,
    Lock,
    TryLock,
    Unlock,
    ResetByKey,
    ResetBySource,
    Garbage,
}

#[derive(Clone, Copy, Debug)]
struct Req {
    act: Act,
    key: usize,
    /// The key's reset counter and the client's epoch when sent: a grant
    /// requested before a reset may already be revoked.
    key_resets: u64,
    epoch: u64,
    /// No reset that could revoke this grant was in flight when it was sent.
    clean: bool,
    /// An Unlock in flight when a reset of its key was sent: it may
    /// release whoever holds the key by the time it executes (Unlock has
    /// no owner check), so it counts as a reset until it completes.
    revoking: bool,
}

struct Client {
    source: Vec<u8>,
    conn: Option<usize>,
    persistent: bool,
    /// Requests sent on the current connection, unanswered, in order.
    outstanding: VecDeque<Req>,
    keys: Vec<KState>,
    /// A `-` answered a Lock of this key in durable mode: its voided record
    /// may resurface after a crash (a key held by nobody, allowed).
    may_resurface: Vec<bool>,
    /// The last word on this key was an acknowledged Unlock (no Lock or
    /// TryLock sent since): a crash must not bring the grant back.
    acked_release: Vec<bool>,
    /// Bumped when a ResetBySource of this client's source is sent and
    /// when it is answered (or its connection ends).
    epoch: u64,
    rsbs_outstanding: u32,
    /// The current connection was reset by this client.
    reset: bool,
    /// No more requests on this connection (half-closed, one-shot used,
    /// garbage sent).
    done_sending: bool,
}

// -------------------------------------------------------------- network

struct SimConn {
    token: Token,
    to_server: VecDeque<u8>,
    /// The client half-closed: EOF follows the bytes in `to_server`.
    client_eof: bool,
    eof_delivered: bool,
    /// The client reset the connection (not yet reported to the shard).
    reset_pending: bool,
    hangup_delivered: bool,
    send_inflight: Option<Vec<u8>>,
    /// Delivered to the client's socket, not yet read.
    to_client: VecDeque<u8>,
    server_closing: bool,
    closed: bool,
}

// ------------------------------------------------------------------ disk

/// The log's preallocation (`--wal-preallocate-bytes`): smaller than the
/// driver's default so that the model's whole-file sync images stay cheap;
/// growth follows the driver's rule all the same.
const PREALLOC: usize = SECTOR;
/// The unit a torn write loses: the scan's sector.
const SECTOR: usize = ringlock::wal::record::SECTOR_BYTES;
/// The planner's piece: at most this much of an append is ever unsynced.
/// One sector (the driver's is 64 KiB), so that the simulator's appends
/// of a few records are cut into pieces too, and short writes land inside
/// them.
const PIECE: usize = SECTOR;
/// A snapshot's piece, each synced before the next.
const SNAPSHOT_PIECE: usize = SECTOR;
/// Growth steps' alignment: a sector (the driver's is 4 KiB, for
/// O_DIRECT), so that steps are small and appends run into them.
const ALIGN: u64 = SECTOR as u64;
/// A write comes back short, per mille (durable worlds).
const SHORT_WRITES: u64 = 100;

#[derive(Clone, Default)]
struct SimFile {
    /// What reads return (the page cache).
    data: Vec<u8>,
    /// What the disk holds: the file as of the last completed fdatasync.
    synced: Vec<u8>,
    /// A failed fdatasync: unsynced pages may be gone, and a later
    /// fdatasync reports success without making them durable.
    lost: bool,
}

impl SimFile {
    fn write(&mut self, off: usize, bytes: &[u8]) {
        if self.data.len() < off + bytes.len() {
            self.data.resize(off + bytes.len(), 0);
        }
        self.data[off..off + bytes.len()].copy_from_slice(bytes);
    }
    fn fsync(&mut self) {
        if !self.lost {
            self.synced.clone_from(&self.data);
        }
    }
    /// The live log with `PREALLOC` zeros after its records, written and
    /// synced (what the driver does at start-up).
    fn preallocated(records: &[u8]) -> SimFile {
        let mut f = SimFile::default();
        f.write(0, records);
        // Up to the alignment boundary, as wal::preallocate rounds.
        f.data.resize(
            (records.len() + PREALLOC).next_multiple_of(ALIGN as usize),
            0,
        );
        f.fsync();
        f
    }
    /// A growth step: zeros over `[from, to)`, written past everything
    /// and synced (O_DIRECT, then fdatasync of that range's blocks).
    fn grow(&mut self, from: usize, to: usize) {
        if self.data.len() < to {
            self.data.resize(to, 0);
        }
        self.data[from..to].fill(0);
        if self.synced.len() < to {
            self.synced.resize(to, 0);
        }
        self.synced[from..to].fill(0);
    }
    /// From the first byte the disk does not hold as the page cache does
    /// to the last (growth past the synced length counts): what a power
    /// cut could tear.
    fn unsynced_span(&self) -> usize {
        let n = self.data.len().min(self.synced.len());
        let first = (0..n).find(|&i| self.data[i] != self.synced[i]);
        let last = if self.data.len() > self.synced.len() {
            Some(self.data.len() - 1)
        } else {
            (0..n).rev().find(|&i| self.data[i] != self.synced[i])
        };
        match (first.or((self.data.len() > n).then_some(n)), last) {
            (Some(f), Some(l)) => l + 1 - f,
            _ => 0,
        }
    }
    /// What survives a crash: what the disk holds; unless pages were lost,
    /// each unsynced sector overwritten in place made it or not (any
    /// subset), and of unsynced growth a random prefix made it.
    fn crash_image(&self, rng: &mut Rng) -> Vec<u8> {
        let mut img = self.synced.clone();
        if self.lost {
            return img;
        }
        let in_place = img.len().min(self.data.len());
        let mut at = 0;
        while at < in_place {
            let end = (at + SECTOR).min(in_place);
            if img[at..end] != self.data[at..end] && rng.chance(500) {
                img[at..end].copy_from_slice(&self.data[at..end]);
            }
            at = end;
        }
        if self.data.len() > img.len() {
            let from = img.len();
            let extra = rng.below((self.data.len() - from) as u64 + 1) as usize;
            img.extend_from_slice(&self.data[from..from + extra]);
        }
        img
    }
}

/// The simulated disk and the driver's side of the log: the real write
/// planner ([`Writer`]) decides every write, sync, rename and growth step,
/// and the disk model carries them out, completing each linked batch as
/// the kernel would (a failed or short step cancels the rest).
struct Disk {
    log: SimFile,
    temp: Option<SimFile>,
    /// A rename not yet made durable by the directory fsync: the old log.
    rename_pending_old: Option<SimFile>,
    /// Bumped by each rename over the log: a growth step started on an
    /// older file writes its zeros there, not into the log in use.
    log_gen: u64,
    plan: Writer,
    /// Each stream's chain: its buffer, and the batch submitted (taken by
    /// the disk when it runs it).
    streams: [Option<(Vec<u8>, Option<Batch>)>; 2],
    /// The growth step in flight, the file generation it runs on, and how
    /// many records batches must complete before it may (a long zero
    /// write that appends overtake, in some worlds).
    grow: Option<(Grow, u64, u32)>,
    /// An append waiting for the growth step.
    parked: Option<(Chain, Vec<u8>)>,
    /// Faults per mille.
    fault_rate: u64,
}

/// The planner of a log of `records` bytes preallocated at start-up, as
/// the driver builds it, with the simulator's small pieces.
fn planner(records: u64) -> Writer {
    Writer::new(
        records,
        (records + PREALLOC as u64).next_multiple_of(ALIGN),
        PREALLOC as u64,
        ALIGN,
        PIECE,
        SNAPSHOT_PIECE,
    )
}

impl Disk {
    fn new(log: SimFile, records: u64, fault_rate: u64) -> Disk {
        Disk {
            log,
            temp: None,
            rename_pending_old: None,
            log_gen: 0,
            plan: planner(records),
            streams: [None, None],
            grow: None,
            parked: None,
            fault_rate,
        }
    }

    fn busy(&self) -> bool {
        self.streams.iter().any(|s| s.is_some()) || self.grow.is_some() || self.parked.is_some()
    }

    /// Runs one step on the disk (no completion is reported): `Err` when
    /// it fails, `Ok(n)` with the bytes of a write (maybe short).
    fn run_step(
        &mut self,
        step: Step,
        buf: &[u8],
        fail: bool,
        short: bool,
        rng: &mut Rng,
    ) -> Result<usize, i32> {
        match step {
            Step::Write {
                target,
                offset,
                at,
                len,
            } => {
                let file = match target {
                    Target::Log => &mut self.log,
                    Target::Temp => self.temp.as_mut().expect("a temp file"),
                };
                let bytes = &buf[at..at + len];
                if fail {
                    // Part of it may reach the page cache.
                    let part = rng.below(len as u64 + 1) as usize;
                    file.write(offset as usize, &bytes[..part]);
                    return Err(if rng.chance(500) {
                        -libc::EIO
                    } else {
                        -libc::ENOSPC
                    });
                }
                let n = if short && len > 1 {
                    1 + rng.below(len as u64 - 1) as usize
                } else {
                    len
                };
                file.write(offset as usize, &bytes[..n]);
                Ok(n)
            }
            Step::Sync { target } => {
                let file = match target {
                    Target::Log => &mut self.log,
                    Target::Temp => self.temp.as_mut().expect("a temp file"),
                };
                if fail {
                    file.lost = true;
                    return Err(-libc::EIO);
                }
                file.fsync();
                Ok(0)
            }
            Step::Rename => {
                if fail {
                    return Err(-libc::EIO);
                }
                let new = self.temp.take().expect("a temp file to rename");
                let old = std::mem::replace(&mut self.log, new);
                self.log_gen += 1;
                if self.rename_pending_old.is_none() {
                    self.rename_pending_old = Some(old);
                }
                Ok(0)
            }
            Step::SyncDir => {
                if fail {
                    return Err(-libc::EIO);
                }
                self.rename_pending_old = None;
                Ok(0)
            }
        }
    }
}

// ------------------------------------------------------------ the world

struct World {
    rng: Rng,
    seed: u64,
    /// `config().compact_floor_bytes`, or one that lets the log grow long.
    compact_floor: u64,
    /// Holders a background snapshot encodes per tick.
    snapshot_chunk: usize,
    durable: bool,
    shard: Shard,
    now: Now,
    conns: Vec<SimConn>,
    clients: Vec<Client>,
    /// Per key: bumped when a ResetByKey is sent and when it completes.
    key_resets: Vec<u64>,
    resets_outstanding: Vec<u32>,
    disk: Disk,
    cmds: Vec<Cmd>,
    spare: Vec<u8>,
    /// Queue snapshots per key (tokens), for the FIFO check.
    queues: Vec<Vec<Token>>,
    /// (key, grant id) held after a crash with no client believing it.
    allowed_ghosts: Vec<(usize, u64)>,
    /// Holder tokens per key at the last check.
    holders: Vec<Option<Token>>,
    log_was_broken: bool,
    crashes: u64,
    /// What the planner was driven through (summed over seeds, so the run
    /// is shown to exercise it).
    seen: Seen,
    /// Winding down (quiesce): a slow growth step lands at last.
    draining: bool,
    grants: u64,
    trace: bool,
}

/// Compaction floors: most worlds compact all the time; the others keep one
/// long log, so appends overwrite preallocated zeros across many sectors
/// and a crash can tear them in place.
const COMPACT_FLOOR_SHORT: u64 = 256;
const COMPACT_FLOOR_LONG: u64 = 1 << 20;

fn config() -> Config {
    let mut cfg = Config::new("127.0.0.1:0".parse().expect("address"));
    cfg.max_connections = 64;
    cfg.max_keys = 16;
    cfg.max_waiters = 32;
    cfg.frame_timeout_ms = 5_000;
    cfg.compact_floor_bytes = COMPACT_FLOOR_SHORT;
    cfg
}

fn frame(act: Act, key: &[u8], source: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    match act {
        Act::Persist => f.push(6),
        Act::Lock | Act::TryLock => {
            f.push(if act == Act::Lock { 1 } else { 5 });
            f.push(key.len() as u8);
            f.extend_from_slice(key);
            f.push(source.len() as u8);
            f.extend_from_slice(source);
        }
        Act::Unlock | Act::ResetByKey => {
            f.push(if act == Act::Unlock { 2 } else { 3 });
            f.push(key.len() as u8);
            f.extend_from_slice(key);
        }
        Act::ResetBySource => {
            f.push(4);
            f.push(source.len() as u8);
            f.extend_from_slice(source);
        }
        Act::Garbage => f.extend_from_slice(&[0x7f, 0x01]),
    }
    f
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng::seeded(seed);
        let durable = rng.chance(600);
        let now = Now {
            mono_us: 1_000_000,
            unix_ms: 1_700_000_000_000,
        };
        let table = Table::new(Limits {
            max_keys: config().max_keys,
            max_waiters: config().max_waiters,
        });
        let fault_rate = if durable && rng.chance(700) {
            20 + rng.below(60)
        } else {
            0
        };
        let mut disk = Disk::new(SimFile::default(), MAGIC.len() as u64, fault_rate);
        // From the seed, not the generator, so every other draw of a seed
        // stays as it was.
        let compact_floor = if seed.is_multiple_of(3) {
            COMPACT_FLOOR_LONG
        } else {
            COMPACT_FLOOR_SHORT
        };
        // Background snapshots of a few holders per tick, so a walk spans
        // ticks of grants and releases; one world in four encodes them
        // whole, as a table smaller than a chunk is.
        let snapshot_chunk = [1, 1, 2, usize::MAX][(seed / 3 % 4) as usize];
        let log = durable.then(|| {
            disk.log = SimFile::preallocated(MAGIC);
            Log::new(MAGIC.len() as u64, &table, compact_floor).with_snapshot_chunk(snapshot_chunk)
        });
        let shard = Shard::new(config(), table, log, Arc::new(Metrics::new()), now);
        let clients = (0..CLIENTS)
            .map(|i| Client {
                source: format!("c{i}").into_bytes(),
                conn: None,
                persistent: false,
                outstanding: VecDeque::new(),
                keys: vec![KState::Free; KEYS.len()],
                may_resurface: vec![false; KEYS.len()],
                acked_release: vec![false; KEYS.len()],
                epoch: 0,
                rsbs_outstanding: 0,
                reset: false,
                done_sending: false,
            })
            .collect();
        World {
            rng,
            seed,
            snapshot_chunk,
            compact_floor,
            durable,
            shard,
            now,
            conns: Vec::new(),
            clients,
            key_resets: vec![0; KEYS.len()],
            resets_outstanding: vec![0; KEYS.len()],
            disk,
            cmds: Vec::new(),
            spare: Vec::new(),
            queues: vec![Vec::new(); KEYS.len()],
            allowed_ghosts: Vec::new(),
            holders: vec![None; KEYS.len()],
            log_was_broken: false,
            crashes: 0,
            seen: Seen::default(),
            draining: false,
            grants: 0,
            trace: std::env::var_os("SIM_TRACE").is_some(),
        }
    }

    fn fail(&self, why: String) -> ! {
        panic!("seed {}: {why}", self.seed);
    }

    fn t(&self, what: impl FnOnce() -> String) {
        if self.trace {
            eprintln!("[{}] {}", self.now.mono_us, what());
        }
    }

    // ----- client side ----------------------------------------------------

    fn connect(&mut self, c: usize) {
        let peer: SocketAddr = format!("127.0.0.{}:{}", c + 1, 40_000 + self.rng.below(20_000))
            .parse()
            .expect("address");
        let Some(token) = self.shard.on_accept(Port::Lock, peer) else {
            return;
        };
        let persistent = self.rng.chance(600);
        let idx = self.conns.len();
        self.conns.push(SimConn {
            token,
            to_server: VecDeque::new(),
            client_eof: false,
            eof_delivered: false,
            reset_pending: false,
            hangup_delivered: false,
            send_inflight: None,
            to_client: VecDeque::new(),
            server_closing: false,
            closed: false,
        });
        let cl = &mut self.clients[c];
        cl.conn = Some(idx);
        cl.persistent = persistent;
        cl.reset = false;
        cl.done_sending = false;
        cl.outstanding.clear();
        self.t(|| format!("client {c} connects token {token:#x} persistent={persistent}"));
        if persistent {
            self.send_req(c, Act::Persist, 0);
        }
    }

    fn send_req(&mut self, c: usize, act: Act, key: usize) {
        let conn = self.clients[c].conn.expect("connected");
        let req = Req {
            act,
            key,
            key_resets: self.key_resets[key],
            epoch: self.clients[c].epoch,
            clean: self.resets_outstanding[key] == 0 && self.clients[c].rsbs_outstanding == 0,
            revoking: false,
        };
        let bytes = frame(act, KEYS[key], &self.clients[c].source);
        if matches!(act, Act::Lock | Act::TryLock) {
            self.clients[c].acked_release[key] = false;
        }
        match act {
            Act::Unlock => {
                // From now on another client may be granted the key.
                self.clients[c].keys[key] = KState::Uncertain;
            }
            Act::ResetByKey => {
                self.key_resets[key] += 1;
                self.resets_outstanding[key] += 1;
                for cl in &mut self.clients {
                    for q in cl.outstanding.iter_mut() {
                        if q.act == Act::Unlock && q.key == key && !q.revoking {
                            q.revoking = true;
                            self.resets_outstanding[key] += 1;
                        }
                    }
                    if cl.keys[key] == KState::Held {
                        cl.keys[key] = KState::Uncertain;
                    }
                }
            }
            Act::ResetBySource => {
                let cl = &mut self.clients[c];
                cl.epoch += 1;
                cl.rsbs_outstanding += 1;
                for k in cl.keys.iter_mut() {
                    if *k == KState::Held {
                        *k = KState::Uncertain;
                    }
                }
            }
            _ => {}
        }
        self.t(|| {
            format!(
                "client {c} sends {act:?} {}",
                String::from_utf8_lossy(KEYS[key])
            )
        });
        self.conns[conn].to_server.extend(bytes);
        self.clients[c].outstanding.push_back(req);
        let cl = &mut self.clients[c];
        if act == Act::Garbage || (!cl.persistent && act != Act::Persist) {
            cl.done_sending = true;
        }
    }

    /// A client acts: connects, sends, half-closes, resets, or reads.
    fn client_step(&mut self, c: usize) {
        let Some(conn) = self.clients[c].conn else {
            self.connect(c);
            return;
        };
        self.read(c);
        if self.clients[c].conn.is_none() {
            return;
        }
        let r = self.rng.below(100);
        let cl = &self.clients[c];
        if r < 4 && !cl.reset {
            // Reset: the connection is gone at once.
            self.t(|| format!("client {c} resets"));
            self.clients[c].reset = true;
            self.conns[conn].reset_pending = true;
            return;
        }
        if r < 10 && !self.conns[conn].client_eof {
            self.t(|| format!("client {c} half-closes"));
            self.conns[conn].client_eof = true;
            self.clients[c].done_sending = true;
            return;
        }
        if cl.done_sending || cl.reset || cl.outstanding.len() >= 4 {
            return;
        }
        // Persistent clients pipeline; others send one request.
        let n = if cl.persistent {
            1 + self.rng.below(3)
        } else {
            1
        };
        for _ in 0..n {
            if self.clients[c].done_sending {
                break;
            }
            let key = self.rng.below(KEYS.len() as u64) as usize;
            let busy = self.clients[c]
                .outstanding
                .iter()
                .any(|q| q.key == key && q.act != Act::Persist);
            let state = self.clients[c].keys[key];
            let r = self.rng.below(100);
            let act = if r < 1 {
                Act::Garbage
            } else if r < 9 {
                Act::ResetByKey
            } else if r < 10 {
                Act::ResetBySource
            } else if state == KState::Held {
                Act::Unlock
            } else if r < 55 {
                Act::Lock
            } else {
                Act::TryLock
            };
            if busy && matches!(act, Act::Lock | Act::TryLock | Act::Unlock) {
                continue;
            }
            self.send_req(c, act, key);
        }
    }

    /// The client reads everything delivered to its socket.
    fn read(&mut self, c: usize) {
        let Some(conn) = self.clients[c].conn else {
            return;
        };
        while let Some(b) = self.conns[conn].to_client.pop_front() {
            self.answer(c, b);
        }
        let sc = &self.conns[conn];
        if sc.closed && sc.to_client.is_empty() {
            self.connection_ended(c);
        }
    }

    fn answer(&mut self, c: usize, b: u8) {
        let Some(req) = self.clients[c].outstanding.pop_front() else {
            self.fail(format!(
                "client {c} got {:?} with nothing outstanding",
                b as char
            ));
        };
        self.t(|| {
            format!(
                "client {c} reads {:?} for {:?} {}",
                b as char,
                req.act,
                String::from_utf8_lossy(KEYS[req.key])
            )
        });
        let k = req.key;
        match (req.act, b) {
            (Act::Persist, b'+') => {}
            (Act::Lock | Act::TryLock, b'+') => {
                self.grants += 1;
                let certain = req.clean
                    && req.key_resets == self.key_resets[k]
                    && req.epoch == self.clients[c].epoch;
                if !certain {
                    self.clients[c].keys[k] = KState::Uncertain;
                    return;
                }
                for (o, other) in self.clients.iter().enumerate() {
                    if o != c && other.keys[k] == KState::Held {
                        self.fail(format!(
                            "two owners: client {c} and client {o} both hold {}",
                            String::from_utf8_lossy(KEYS[k])
                        ));
                    }
                }
                let holder = self.shard.table().holder_of(KEYS[k]);
                if holder.map(|h| h.source.as_bytes().to_vec())
                    != Some(self.clients[c].source.clone())
                {
                    self.fail(format!(
                        "client {c} told `+` for {} but the table says {:?}",
                        String::from_utf8_lossy(KEYS[k]),
                        holder
                    ));
                }
                self.clients[c].keys[k] = KState::Held;
            }
            (Act::TryLock, b'#') => {}
            (Act::Lock | Act::TryLock, b'-') => {
                if self.durable {
                    self.clients[c].may_resurface[k] = true;
                }
            }
            (Act::Unlock, b'+') => {
                self.clients[c].keys[k] = KState::Free;
                self.clients[c].acked_release[k] = true;
                self.reset_done(c, req);
            }
            // An Unlock answered `-` was undone (I/O failure): still ours,
            // but a crash before the rewrite may yet release it.
            (Act::Unlock, b'-') => {
                self.clients[c].keys[k] = KState::Uncertain;
                self.reset_done(c, req);
            }
            (Act::ResetByKey | Act::ResetBySource, b'+' | b'-') => self.reset_done(c, req),
            (Act::Garbage, b'-') => {}
            (act, b) => self.fail(format!("client {c}: {act:?} answered {:?}", b as char)),
        }
    }

    /// A reset finished (answered, or its connection ended): grants
    /// requested from now on cannot be revoked by it.
    fn reset_done(&mut self, c: usize, req: Req) {
        match req.act {
            Act::ResetByKey => {
                self.key_resets[req.key] += 1;
                self.resets_outstanding[req.key] -= 1;
            }
            Act::ResetBySource => {
                self.clients[c].epoch += 1;
                self.clients[c].rsbs_outstanding -= 1;
            }
            Act::Unlock if req.revoking => {
                self.key_resets[req.key] += 1;
                self.resets_outstanding[req.key] -= 1;
            }
            _ => {}
        }
    }

    /// The connection is closed and everything delivered was read: what is
    /// still outstanding was never answered.
    fn connection_ended(&mut self, c: usize) {
        let reqs: Vec<Req> = self.clients[c].outstanding.drain(..).collect();
        for req in reqs {
            match req.act {
                // Withdrawn or given back: never a holder (the quiescence
                // check holds the server to it).
                Act::Lock | Act::TryLock => {}
                Act::Unlock => {
                    self.clients[c].keys[req.key] = KState::Uncertain;
                    self.reset_done(c, req);
                }
                Act::ResetByKey | Act::ResetBySource => self.reset_done(c, req),
                _ => {}
            }
        }
        let cl = &mut self.clients[c];
        cl.conn = None;
        self.t(|| format!("client {c} sees its connection closed"));
    }

    // ----- network and disk ---------------------------------------------------

    fn net_step(&mut self) {
        if self.conns.is_empty() {
            return;
        }
        let i = self.rng.below(self.conns.len() as u64) as usize;
        let sc = &mut self.conns[i];
        if sc.closed {
            return;
        }
        let token = sc.token;
        if sc.reset_pending && !sc.hangup_delivered {
            sc.hangup_delivered = true;
            sc.to_server.clear();
            if sc.server_closing {
                return;
            }
            if self.trace {
                eprintln!("[{}] RST {token:#x}", self.now.mono_us);
                for c in &self.conns {
                    if !c.closed {
                        eprintln!("    {:#x}: {}", c.token, self.shard.describe(c.token));
                    }
                }
            }
            self.shard.on_peer_closed(token, Some(libc::ECONNRESET));
            return;
        }
        if sc.server_closing || sc.hangup_delivered {
            return;
        }
        if !sc.to_server.is_empty() {
            let n = 1 + self.rng.below(sc.to_server.len().min(RECV_CHUNK) as u64) as usize;
            let chunk: Vec<u8> = sc.to_server.drain(..n).collect();
            if self.trace {
                eprintln!("[{}] deliver {token:#x} {chunk:?}", self.now.mono_us);
            }
            self.shard.on_recv(token, &chunk);
        } else if sc.client_eof && !sc.eof_delivered {
            sc.eof_delivered = true;
            sc.hangup_delivered = true;
            if self.trace {
                eprintln!("[{}] EOF {token:#x}", self.now.mono_us);
            }
            self.shard.on_peer_closed(token, None);
        }
    }

    fn send_step(&mut self) {
        let ready: Vec<usize> = (0..self.conns.len())
            .filter(|&i| self.conns[i].send_inflight.is_some())
            .collect();
        if ready.is_empty() {
            return;
        }
        let i = ready[self.rng.below(ready.len() as u64) as usize];
        let sc = &mut self.conns[i];
        let mut bytes = sc.send_inflight.take().expect("a send in flight");
        let token = sc.token;
        if sc.reset_pending {
            bytes.clear();
            self.spare = bytes;
            self.shard.on_send_done(token, Err(libc::ECONNRESET));
        } else {
            sc.to_client.extend(bytes.drain(..));
            self.spare = bytes;
            self.shard.on_send_done(token, Ok(()));
        }
    }

    fn close_step(&mut self) {
        let ready: Vec<usize> = (0..self.conns.len())
            .filter(|&i| {
                let c = &self.conns[i];
                c.server_closing && !c.closed && c.send_inflight.is_none()
            })
            .collect();
        if ready.is_empty() {
            return;
        }
        let i = ready[self.rng.below(ready.len() as u64) as usize];
        self.conns[i].closed = true;
        let token = self.conns[i].token;
        self.shard.on_closed(token);
    }

    /// A log chain from the shard: the planner decides what reaches the
    /// disk.
    fn log_cmd(&mut self, chain: Chain, buf: Vec<u8>) {
        let (grow, next) = self.disk.plan.start(chain, buf.len(), self.now.mono_us);
        if let Some(g) = grow {
            // In half the worlds the zeros take long: appends run into
            // their range and wait (parked); in a quarter they land only
            // once an append waits for them (or the world winds down).
            let overtaken = match self.seed % 4 {
                0 => u32::MAX,
                2 => self.rng.below(200) as u32,
                _ => 0,
            };
            self.disk.grow = Some((g, self.disk.log_gen, overtaken));
        }
        match next {
            Next::Parked => {
                self.seen.parked += 1;
                assert!(self.disk.parked.is_none(), "two parked appends");
                self.disk.parked = Some((chain, buf));
            }
            next => {
                let stream = Stream::of(chain);
                self.disk.streams[stream as usize] = Some((buf, None));
                self.follow(stream, next);
            }
        }
    }

    /// Does what the planner said next for `stream` (the driver's part).
    fn follow(&mut self, stream: Stream, next: Next) {
        match next {
            Next::Pending => {}
            Next::Parked => unreachable!("only a start parks"),
            Next::Submit(batch) => {
                self.disk.plan.submitted(&batch);
                let chain = self.disk.streams[stream as usize]
                    .as_mut()
                    .expect("a chain to submit");
                chain.1 = Some(batch);
            }
            Next::OpenTemp => {
                let result = if self.rng.chance(self.disk.fault_rate) {
                    Err(-libc::ENOSPC)
                } else {
                    self.disk.temp = Some(SimFile::default());
                    Ok(())
                };
                let next = self.disk.plan.temp_opened(stream, result);
                self.follow(stream, next);
            }
            Next::Landed(l) => {
                let (buf, _) = self.disk.streams[stream as usize]
                    .take()
                    .expect("a landed chain");
                match l.files {
                    // The rename already moved the file on the disk.
                    Files::Unchanged | Files::Replaced => {}
                    Files::DiscardTemp { renamed } => {
                        if !renamed {
                            self.disk.temp = None;
                        }
                        self.disk.plan.temp_discarded();
                    }
                }
                self.t(|| format!("disk: {:?} {} bytes -> {:?}", l.chain, buf.len(), l.result));
                self.shard.on_log_landed(l.chain, l.result, buf);
            }
        }
    }

    /// Completes one submitted batch or the growth step, in any order the
    /// kernel may produce.
    fn disk_step(&mut self) {
        let ready: Vec<usize> = (0..2)
            .filter(|&s| matches!(self.disk.streams[s], Some((_, Some(_)))))
            .collect();
        let grow_ready = matches!(self.disk.grow, Some((_, _, 0)))
            // Nothing else can land: the appends wait for it, or the
            // world is winding down.
            || (ready.is_empty() && (self.disk.parked.is_some() || self.disk.fault_rate == 0 && self.draining));
        if ready.is_empty() && !grow_ready {
            return;
        }
        let pick = self.rng.below(ready.len() as u64 + grow_ready as u64) as usize;
        if pick == ready.len() {
            let Some((g, gen, _)) = self.disk.grow.take() else {
                return;
            };
            let result = if self.rng.chance(self.disk.fault_rate) {
                Err(-libc::ENOSPC)
            } else {
                if gen == self.disk.log_gen {
                    self.disk
                        .log
                        .grow(g.from as usize, (g.from + g.len) as usize);
                }
                Ok(())
            };
            let (outcome, unpark) = self.disk.plan.grown(result, self.now.mono_us);
            if matches!(outcome, ringlock::wal::plan::Grown::Done { .. }) {
                self.seen.grown += 1;
            }
            self.t(|| format!("disk: growth {g:?} -> {outcome:?}"));
            if unpark {
                let (chain, buf) = self.disk.parked.take().expect("the parked append");
                self.log_cmd(chain, buf);
            }
            return;
        }
        let stream = if ready[pick] == 0 {
            Stream::Records
        } else {
            Stream::Compact
        };
        let (buf, batch) = self.disk.streams[stream as usize]
            .as_mut()
            .expect("a chain");
        let batch = batch.take().expect("a batch");
        let buf = std::mem::take(buf);
        let fault = self.rng.chance(self.disk.fault_rate);
        let failing = fault.then(|| self.rng.below(batch.len() as u64) as usize);
        let mut cancelled = false;
        let mut next = Next::Pending;
        for (i, step) in batch.steps().enumerate() {
            let res = if cancelled {
                -libc::ECANCELED
            } else {
                let short = self.rng.chance(SHORT_WRITES);
                match self
                    .disk
                    .run_step(step, &buf, failing == Some(i), short, &mut self.rng)
                {
                    Ok(n) => {
                        if let Step::Write { len, .. } = step {
                            // A short write ends the link, as the kernel does.
                            cancelled = n < len;
                            self.seen.short_writes += cancelled as u64;
                        }
                        if let Step::Write {
                            target: Target::Log,
                            ..
                        } = step
                        {
                            self.check_unsynced();
                        }
                        n as i32
                    }
                    Err(e) => {
                        cancelled = true;
                        e
                    }
                }
            };
            next = self.disk.plan.completed(stream, step.kind(), res);
        }
        self.disk.streams[stream as usize]
            .as_mut()
            .expect("the chain")
            .0 = buf;
        self.seen.resumed += matches!(next, Next::Submit(_)) as u64;
        if let (Stream::Records, Some((_, _, n))) = (stream, self.disk.grow.as_mut()) {
            *n = n.saturating_sub(1);
        }
        self.follow(stream, next);
    }

    /// The disk never holds more than a piece of the log unsynced: what a
    /// power cut can tear, which recovery's torn-write rule rests on.
    fn check_unsynced(&self) {
        if self.disk.log.lost {
            return;
        }
        let span = self.disk.log.unsynced_span();
        if span > PIECE {
            self.fail(format!(
                "{span} bytes of the log unsynced at once (a piece is {PIECE})"
            ));
        }
    }

    /// Runs the shard's commands (the driver's contract).
    fn execute(&mut self) {
        loop {
            self.shard.end_tick();
            let mut cmds = std::mem::take(&mut self.cmds);
            self.shard.take_cmds(&mut cmds);
            if cmds.is_empty() {
                self.cmds = cmds;
                return;
            }
            for cmd in cmds.drain(..) {
                match cmd {
                    Cmd::Send(token) => {
                        let i = self.conn_index(token);
                        assert!(
                            self.conns[i].send_inflight.is_none(),
                            "two sends in flight on one connection"
                        );
                        let mut buf = std::mem::take(&mut self.spare);
                        self.shard.take_output(token, &mut buf);
                        assert!(!buf.is_empty(), "an empty send");
                        self.conns[i].send_inflight = Some(buf);
                    }
                    Cmd::Close(token) => {
                        let i = self.conn_index(token);
                        assert!(!self.conns[i].server_closing, "closed twice");
                        self.conns[i].server_closing = true;
                    }
                    Cmd::Log { chain, buf } => {
                        assert!(self.durable, "a log chain in memory mode");
                        self.log_cmd(chain, buf);
                    }
                    Cmd::DiscardTemp => {
                        if !self.disk.plan.temp_renamed() {
                            self.disk.temp = None;
                        }
                        self.disk.plan.temp_discarded();
                    }
                    Cmd::Farewell(_) => {}
                    // One shard: a scatter is this shard's alone.
                    Cmd::Scatter { id, op } => self.shard.on_remote(0, id, op),
                    Cmd::Reply { id, result, .. } => self.shard.on_reply(id, result),
                    Cmd::Migrate { .. } => self.fail("a migration with one shard".into()),
                    Cmd::Sess { .. } => {
                        self.fail("session traffic to another shard with one shard".into())
                    }
                    Cmd::Peer { .. }
                    | Cmd::PeerMust { .. }
                    | Cmd::PeerReset { .. }
                    | Cmd::PeerLink { .. } => self.fail("a cluster link without --peers".into()),
                }
            }
            self.cmds = cmds;
        }
    }

    fn conn_index(&self, token: Token) -> usize {
        self.conns
            .iter()
            .rposition(|c| c.token == token && !c.closed)
            .unwrap_or_else(|| self.fail(format!("command for unknown connection {token:#x}")))
    }

    // ----- crash ----------------------------------------------------------------

    fn crash(&mut self) {
        self.crashes += 1;
        // Batches in flight got part of the way, and so did a growth step.
        for s in 0..2 {
            if let Some((buf, Some(batch))) = self.disk.streams[s].take() {
                let upto = self.rng.below(batch.len() as u64 + 1) as usize;
                for step in batch.steps().take(upto) {
                    if let Ok(n) = self.disk.run_step(step, &buf, false, false, &mut self.rng) {
                        if matches!(step, Step::Write { len, .. } if n < len) {
                            break;
                        }
                    }
                }
            }
        }
        if let Some((g, gen, _)) = self.disk.grow.take() {
            if gen == self.disk.log_gen && self.rng.chance(500) {
                self.disk
                    .log
                    .grow(g.from as usize, (g.from + g.len) as usize);
            }
        }
        // A kill -9 of the process (the page cache survives, and with it
        // every write, synced or not, and every rename) or a power cut
        // (only what the disk holds). Not a kill after a failed fdatasync:
        // the page cache may then hold pages the disk lost for good.
        let kill = !self.disk.log.lost && self.rng.chance(300);
        self.seen.kills += kill as u64;
        let file = match self.disk.rename_pending_old.take() {
            Some(old) if !kill && self.rng.chance(500) => old,
            _ => std::mem::take(&mut self.disk.log),
        };
        let mut after_kill = None;
        let image = if kill {
            // Start-up's steps before its replay, over the disk model.
            let mut f = file.clone();
            for step in ringlock::wal::STARTUP {
                match step {
                    ringlock::wal::Startup::SyncLog => f.fsync(),
                    // The rename is in the page cache's directory, which
                    // the model does not separate from the disk's.
                    ringlock::wal::Startup::SyncDir => {}
                    ringlock::wal::Startup::Replay => break,
                }
            }
            let image = f.data.clone();
            after_kill = Some(f);
            image
        } else {
            file.crash_image(&mut self.rng)
        };
        self.t(|| {
            format!(
                "CRASH ({}): {} bytes recovered of {}",
                if kill { "kill -9" } else { "power cut" },
                image.len(),
                file.data.len()
            )
        });
        let limits = Limits {
            max_keys: config().max_keys,
            max_waiters: config().max_waiters,
        };
        let mut table = Table::new(limits);
        let now = self.now;
        let (valid, _) = ringlock::wal::replay(&image, "sim.log", &mut table, None, now)
            .unwrap_or_else(|e| self.fail(format!("recovery after a crash failed: {e}")));
        if let Some(f) = after_kill {
            // A power cut right after the restart, before any new sync:
            // what the restarted shard serves from must all come back.
            let mut again = Table::new(limits);
            let disk = f.crash_image(&mut self.rng);
            let _ = ringlock::wal::replay(&disk, "sim.log", &mut again, None, now);
            for key in KEYS {
                let (a, b) = (table.holder_of(key), again.holder_of(key));
                if a.map(|h| h.grant_id) != b.map(|h| h.grant_id) {
                    self.fail(format!(
                        "after a kill -9 the restarted shard serves {} as held by {:?}, \
                         but a power cut before any new sync brings back {:?}: \
                         start-up served from records that were not durable",
                        String::from_utf8_lossy(key),
                        a,
                        b
                    ));
                }
            }
        }
        // Truncated to the records, then preallocated again (start-up).
        let log = if (valid as usize) < MAGIC.len() {
            SimFile::preallocated(MAGIC)
        } else {
            SimFile::preallocated(&image[..valid as usize])
        };
        let file_len = valid.max(MAGIC.len() as u64);
        self.disk = Disk::new(log, file_len, self.disk.fault_rate);
        // Clients read what reached their sockets; in-flight sends are lost.
        for c in 0..CLIENTS {
            if let Some(conn) = self.clients[c].conn {
                while let Some(b) = self.conns[conn].to_client.pop_front() {
                    self.answer(c, b);
                }
                let reqs: Vec<Req> = self.clients[c].outstanding.drain(..).collect();
                for req in reqs {
                    if matches!(req.act, Act::Lock | Act::TryLock | Act::Unlock) {
                        self.clients[c].keys[req.key] = KState::Uncertain;
                    }
                    self.reset_done(c, req);
                }
                self.clients[c].conn = None;
            }
        }
        self.conns.clear();
        // Every `+` survives; no acknowledged release is undone.
        for (k, key) in KEYS.iter().enumerate() {
            let holder = table.holder_of(key);
            for (c, cl) in self.clients.iter().enumerate() {
                let held_by_c = holder.is_some_and(|h| h.source.as_bytes() == cl.source.as_slice());
                match cl.keys[k] {
                    KState::Held if !held_by_c => self.fail(format!(
                        "client {c} was told `+` for {} but after the crash it is held by {:?}",
                        String::from_utf8_lossy(key),
                        holder
                    )),
                    KState::Free if held_by_c && cl.acked_release[k] && !cl.may_resurface[k] => {
                        self.fail(format!(
                            "client {c}'s acknowledged release of {} was undone by the crash",
                            String::from_utf8_lossy(key)
                        ))
                    }
                    _ => {}
                }
            }
            if let Some(h) = holder {
                let believed = self.clients.iter().any(|cl| {
                    cl.keys[k] == KState::Held && h.source.as_bytes() == cl.source.as_slice()
                });
                if !believed {
                    self.allowed_ghosts.push((k, h.grant_id));
                }
            }
        }
        let log =
            Log::new(file_len, &table, self.compact_floor).with_snapshot_chunk(self.snapshot_chunk);
        self.shard = Shard::new(config(), table, Some(log), Arc::new(Metrics::new()), now);
        self.queues = vec![Vec::new(); KEYS.len()];
        self.holders = vec![None; KEYS.len()];
    }

    // ----- invariants ---------------------------------------------------------------

    /// A connection whose waiter may leave its queue without a grant: its
    /// hang-up was delivered, or the shard is closing it (a protocol
    /// violation, a frame timeout).
    fn dead(&self, token: Token) -> bool {
        let hung_up = self
            .conns
            .iter()
            .rev()
            .find(|c| c.token == token)
            .is_none_or(|c| c.hangup_delivered || c.server_closing);
        hung_up || !self.shard.conn_open(token)
    }

    fn check(&mut self) {
        self.shard.check_invariants();
        let broken_before = std::mem::replace(
            &mut self.log_was_broken,
            self.shard.log().is_some_and(|l| l.broken()),
        );
        let mut now_q = Vec::new();
        #[allow(clippy::needless_range_loop)] // k indexes several per-key tables
        for k in 0..KEYS.len() {
            self.shard.table().waiters_of(KEYS[k], &mut now_q);
            let before = &self.queues[k];
            // Waiters that stay keep their order; newcomers join at the end.
            let kept: Vec<Token> = before
                .iter()
                .copied()
                .filter(|t| now_q.contains(t))
                .collect();
            if now_q[..kept.len()] != kept[..] {
                self.fail(format!(
                    "queue of {} reordered: {before:?} -> {now_q:?}",
                    String::from_utf8_lossy(KEYS[k])
                ));
            }
            // A new holder is the first waiter of the previous queue that is
            // still alive (those ahead of it left without a grant).
            let holder = self.shard.table().holder_conn(KEYS[k]);
            let resets_in_flight = self.clients.iter().any(|cl| {
                cl.outstanding.iter().any(|q| {
                    (q.act == Act::ResetByKey && q.key == k) || q.act == Act::ResetBySource
                })
            });
            // Token 0: a release undone after a log failure restored the
            // previous holder (it has no connection any more).
            // A log failure voids grants not yet durable (their waiters are
            // answered `-`): no order to check across one.
            let voided = broken_before || self.shard.log().is_some_and(|l| l.broken());
            if holder != self.holders[k] && holder != Some(0) && !resets_in_flight && !voided {
                if let Some(first_live) = before.iter().copied().find(|&t| !self.dead(t)) {
                    if holder != Some(first_live) {
                        self.fail(format!(
                            "{} granted out of FIFO order: queue was {before:?}, first live {first_live:#x} ({}), new holder {holder:?}",
                            String::from_utf8_lossy(KEYS[k]),
                            self.shard.describe(first_live)
                        ));
                    }
                }
            }
            // A release undone after a log failure restores the previous
            // holder (token 0). If nobody was told `+` for it (its give-back
            // was the undone release), it is a key held by nobody: allowed.
            if holder == Some(0) && holder != self.holders[k] {
                if let Some(h) = self.shard.table().holder_of(KEYS[k]) {
                    let believed = self.clients.iter().any(|cl| {
                        cl.keys[k] != KState::Free && h.source.as_bytes() == cl.source.as_slice()
                    });
                    if !believed {
                        self.allowed_ghosts.push((k, h.grant_id));
                    }
                }
            }
            if self.trace && holder != self.holders[k] {
                let h = self.shard.table().holder_of(KEYS[k]);
                eprintln!(
                    "[{}] holder of {}: {:?} -> {holder:?} {:?}",
                    self.now.mono_us,
                    String::from_utf8_lossy(KEYS[k]),
                    self.holders[k],
                    h.map(|h| (h.source, h.grant_id))
                );
            }
            self.holders[k] = holder;
            self.queues[k].clone_from(&now_q);
        }
    }

    fn step(&mut self) {
        self.now.mono_us += 1 + self.rng.below(2_000);
        self.now.unix_ms = 1_700_000_000_000 + self.now.mono_us / 1000;
        if let Some(d) = self.shard.next_deadline_us() {
            if self.rng.chance(20) && d > self.now.mono_us {
                self.now.mono_us = d;
            }
        }
        self.shard.begin_tick(self.now);
        let events = 1 + self.rng.below(4);
        for _ in 0..events {
            let r = self.rng.below(100);
            self.t(|| format!("event {r}"));
            match r {
                0..=34 => {
                    let c = self.rng.below(CLIENTS as u64) as usize;
                    self.client_step(c);
                }
                35..=64 => self.net_step(),
                65..=79 => self.send_step(),
                80..=89 => self.close_step(),
                _ => self.disk_step(),
            }
            if self.durable && self.rng.chance(1) {
                self.crash();
                return;
            }
            // Sometimes several events share one tick, as completions drained
            // together do; the checks run after every event.
            self.check();
            if self.rng.chance(500) {
                self.execute();
                self.check();
            }
        }
        self.execute();
        self.check();
    }

    /// Everyone goes home: clients half-close, everything is delivered.
    fn quiesce(&mut self) {
        for _ in 0..200_000 {
            for c in 0..CLIENTS {
                self.read(c);
                if let Some(conn) = self.clients[c].conn {
                    if !self.conns[conn].client_eof {
                        self.conns[conn].client_eof = true;
                        self.clients[c].done_sending = true;
                    }
                }
            }
            let busy = self.conns.iter().any(|c| !c.closed) || self.disk.busy();
            if !busy && self.clients.iter().all(|c| c.conn.is_none()) {
                break;
            }
            self.now.mono_us += 100;
            if let Some(d) = self.shard.next_deadline_us() {
                self.now.mono_us = self.now.mono_us.max(d);
            }
            self.shard.begin_tick(self.now);
            self.net_step();
            self.send_step();
            self.close_step();
            // The disk heals: quiescence must come.
            self.disk.fault_rate = 0;
            self.draining = true;
            self.disk_step();
            self.execute();
        }
        if self.conns.iter().any(|c| !c.closed) {
            self.fail("connections never closed".into());
        }
        self.shard.check_invariants();
        // At rest everything answered is durable: what the disk holds
        // replays to the table the shard serves (unless a failed fdatasync
        // lost pages, after which the log was rewritten, not trusted).
        if self.durable && !self.disk.log.lost && !self.disk.busy() {
            let mut table = Table::new(Limits {
                max_keys: config().max_keys,
                max_waiters: config().max_waiters,
            });
            let image = self.disk.log.synced.clone();
            if let Err(e) = ringlock::wal::replay(&image, "sim.log", &mut table, None, self.now) {
                self.fail(format!("at rest, the disk's log does not replay: {e}"));
            }
            for key in KEYS {
                let (a, b) = (self.shard.table().holder_of(key), table.holder_of(key));
                if a.map(|h| h.grant_id) != b.map(|h| h.grant_id) {
                    self.fail(format!(
                        "at rest the shard holds {} as {:?}, but its log on the disk replays {:?}",
                        String::from_utf8_lossy(key),
                        a,
                        b
                    ));
                }
            }
        }
        assert_eq!(
            self.shard.open_connections(),
            0,
            "seed {}: connection slots leaked",
            self.seed
        );
        assert_eq!(
            self.shard.table().queued_waiters(),
            0,
            "seed {}: waiters left",
            self.seed
        );
        assert_eq!(
            self.shard.held_replies(),
            0,
            "seed {}: held replies left",
            self.seed
        );
        assert!(
            self.shard.slots() <= 64,
            "seed {}: slot pool grew to {}",
            self.seed,
            self.shard.slots()
        );
        // No ghost: every held key is held by a client that was told so
        // (or that cannot know), or is a grant that survived a crash.
        for (k, key) in KEYS.iter().enumerate() {
            let Some(h) = self.shard.table().holder_of(key) else {
                continue;
            };
            let owner = self
                .clients
                .iter()
                .position(|cl| h.source.as_bytes() == cl.source.as_slice());
            let ok = match owner {
                Some(c) => {
                    self.clients[c].keys[k] != KState::Free || self.clients[c].may_resurface[k]
                }
                None => false,
            } || self.allowed_ghosts.contains(&(k, h.grant_id));
            if !ok {
                self.fail(format!(
                    "ghost holder of {}: {:?} (the client was never told `+`)",
                    String::from_utf8_lossy(key),
                    h
                ));
            }
        }
    }
}

/// Counts of what the write planner went through.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    /// Batches after a chain's first: further pieces, resumed short writes.
    resumed: u64,
    short_writes: u64,
    parked: u64,
    grown: u64,
    kills: u64,
}

impl Seen {
    fn add(&mut self, o: Seen) {
        self.resumed += o.resumed;
        self.short_writes += o.short_writes;
        self.parked += o.parked;
        self.grown += o.grown;
        self.kills += o.kills;
    }
}

fn run(seed: u64, steps: u64) -> (bool, u64, u64, Seen) {
    ringlock::log::set_level(ringlock::log::Level::Error);
    let mut w = World::new(seed);
    for _ in 0..steps {
        w.step();
    }
    w.quiesce();
    (w.durable, w.crashes, w.grants, w.seen)
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn simulated_shard_keeps_every_invariant() {
    let steps = env_u64("SIM_STEPS", 2500);
    let seeds: Vec<u64> = match std::env::var("SIM_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(s) => vec![s],
        None => {
            let first = env_u64("SIM_FIRST_SEED", 1);
            (first..first + env_u64("SIM_SEEDS", 150)).collect()
        }
    };
    let (mut durable, mut crashes, mut grants) = (0, 0, 0);
    let mut seen = Seen::default();
    for &seed in &seeds {
        let r = std::panic::catch_unwind(|| run(seed, steps));
        match r {
            Ok((d, c, g, s)) => {
                durable += d as u64;
                crashes += c;
                grants += g;
                seen.add(s);
            }
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "simulation failed at seed {seed}: {msg}\nreproduce: SIM_SEED={seed} SIM_STEPS={steps} SIM_TRACE=1 cargo test --test sim"
                );
            }
        }
    }
    eprintln!(
        "{} seeds x {steps} steps: {durable} durable, {crashes} crashes, {grants} grants seen by clients; planner: {seen:?}",
        seeds.len()
    );
    // The run exercised what it checks.
    assert!(
        grants > seeds.len() as u64,
        "too few grants to check anything"
    );
    if seeds.len() >= 20 {
        assert!(durable > 0 && crashes > 0, "no durable run or no crash");
        assert!(
            seen.resumed > 0
                && seen.short_writes > 0
                && seen.parked > 0
                && seen.grown > 0
                && seen.kills > 0,
            "the write planner was not driven through pieces, short writes, parked appends, growth and kills: {seen:?}"
        );
    }
}
