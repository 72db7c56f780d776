//! Deterministic simulation of session connections on the shard.
//!
//! The shard code the io_uring driver runs is driven by a seeded scheduler:
//! session clients open and close connections, acquire keys as session
//! holds or leases (try, bounded wait, no deadline), release and extend by
//! token, cancel queued acquires, ping or fall silent; their frames reach
//! the server after arbitrary delays, the server's answers reach them after
//! arbitrary delays, and time advances in jumps (often straight to the
//! shard's next deadline: a lease's TTL, a wait deadline, a keep-alive).
//!
//! The property checked after every step is the one a user relies on:
//! **no two clients believe they hold a key at the same instant**, where a
//! client's belief follows only what it was told and the rules the client
//! library applies (a lease is believed until the send time of the Acquire
//! or Extend that set it plus its TTL; a session hold until the send time
//! of the last request whose answer arrived plus the keep-alive deadline,
//! or until the connection ends, whichever is first). A believed hold must
//! also be the server's holder with the same token. At the end everything
//! quiesces: no session, waiter, hold or connection is left.
//!
//! A watcher session watches every key, its answers delayed and split like
//! the others': **every change reaches it once, in order** — a grant of a
//! token larger than any the key had, a release of a holder it was told
//! of, a proclaim of a holder it was told of, never more holders than the
//! key may have — and whenever it has read everything the server sent, its
//! picture of each key's holders (tokens and sources) is the server's.
//!
//! `SIM_SEEDS=N` (default 200) from `SIM_FIRST_SEED` (default 1), `SIM_STEPS=N`
//! (default 1500), `SIM_SEED=S`; `scripts/sim.sh` runs it for hours.

mod sim_common;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use ringlock::config::Config;
use ringlock::core::{Limits, Now, Table, Token};
use ringlock::metrics::Metrics;
use ringlock::protocol::session::{self as sp, Answer, Req};
use ringlock::shard::conn::Port;
use ringlock::shard::{Cmd, Shard};
use sim_common::{Belief, Rng, SessionView};

const KEYS: &[&[u8]] = &[b"a", b"b"];
const CLIENTS: usize = 5;
const KEEPALIVE_MS: u32 = 300;

#[derive(Default)]
struct Client {
    token: Option<Token>,
    /// Frames in flight to the server (delivered in order, maybe split).
    to_server: VecDeque<u8>,
    /// Bytes the server sent, not yet read.
    to_client: VecDeque<u8>,
    rx: Vec<u8>,
    /// The client closed, or read the server's EOF: it believes nothing.
    eof: bool,
    /// The server closed: EOF after `to_client`, not yet read.
    eof_pending: bool,
    /// What it sent and believes (the client library's rules).
    view: SessionView,
}

/// The watcher: a session watching every key.
#[derive(Default)]
struct Watcher {
    token: Option<Token>,
    to_client: VecDeque<u8>,
    rx: Vec<u8>,
    welcomed: bool,
    /// Watch rids answered `ok` (by key index).
    watching: Vec<bool>,
    /// What it was told: each key's holders' tokens and sources.
    holders: Vec<BTreeMap<u64, Vec<u8>>>,
    /// The largest token it was told of, per key.
    top: Vec<u64>,
    last_ping_us: u64,
    events: u64,
    /// Of them, proclaims.
    proclaims: u64,
}

/// The rid of the watcher's Watch of key `k`.
fn watch_rid(k: usize) -> u32 {
    100 + k as u32
}

struct World {
    rng: Rng,
    watcher: Watcher,
    seed: u64,
    shard: Shard,
    now: Now,
    clients: Vec<Client>,
    /// Connection token → client.
    owner_of: HashMap<Token, usize>,
    grants: u64,
    lost: u64,
}

impl World {
    fn new(seed: u64) -> World {
        let mut cfg = Config::new("127.0.0.1:0".parse().expect("address"));
        cfg.max_connections = 64;
        cfg.max_keys = 16;
        cfg.max_waiters = 64;
        cfg.min_keepalive_ms = KEEPALIVE_MS;
        cfg.min_ttl_ms = 5;
        let now = Now {
            mono_us: 1_000_000,
            unix_ms: 1_700_000_000_000,
        };
        let table = Table::new(Limits {
            max_keys: cfg.max_keys,
            max_waiters: cfg.max_waiters,
        });
        let shard = Shard::new(cfg, table, None, Arc::new(Metrics::new()), now);
        World {
            rng: Rng::seeded(seed),
            seed,
            shard,
            now,
            clients: (0..CLIENTS).map(|_| Client::default()).collect(),
            watcher: Watcher::default(),
            owner_of: HashMap::new(),
            grants: 0,
            lost: 0,
        }
    }

    fn fail(&self, why: String) -> ! {
        panic!(
            "seed {}: {why}\nreproduce: SIM_SEED={} cargo test --test sim_sessions",
            self.seed, self.seed
        )
    }

    fn client_step(&mut self, c: usize) {
        let now_us = self.now.mono_us;
        if self.clients[c].eof_pending {
            return;
        }
        let Some(token) = self.clients[c].token else {
            // Open a session.
            if let Some(t) = self
                .shard
                .on_accept(Port::Lock, "127.0.0.1:9".parse().expect("addr"))
            {
                self.owner_of.insert(t, c);
                let cl = &mut self.clients[c];
                *cl = Client {
                    token: Some(t),
                    ..Client::default()
                };
                let cl = &mut self.clients[c];
                let hello = Req::Hello {
                    version: sp::VERSION,
                    keepalive_ms: KEEPALIVE_MS,
                    auth: b"",
                };
                cl.view.send(&hello, None, now_us, &mut cl.to_server);
            }
            return;
        };
        if !self.clients[c].view.welcomed || self.clients[c].eof || self.clients[c].eof_pending {
            return;
        }
        let k = self.rng.below(KEYS.len() as u64) as usize;
        let cl = &mut self.clients[c];
        if !cl
            .view
            .random_request(&mut self.rng, k, KEYS, now_us, &mut cl.to_server)
        {
            // Close: the client forgets everything first.
            self.client_closed(c);
            self.shard.on_peer_closed(token, None);
        }
    }

    /// Opens the watcher's session, watches every key once it is
    /// welcomed, and pings it well within its keep-alive. Its own frames
    /// reach the server at once; the server's reach it late and split.
    fn watcher_step(&mut self) {
        let now_us = self.now.mono_us;
        let w = &mut self.watcher;
        let Some(token) = w.token else {
            let t = self
                .shard
                .on_accept(Port::Lock, "127.0.0.1:8".parse().expect("addr"))
                .expect("a slot for the watcher");
            *w = Watcher {
                token: Some(t),
                watching: vec![false; KEYS.len()],
                holders: vec![BTreeMap::new(); KEYS.len()],
                top: vec![0; KEYS.len()],
                last_ping_us: now_us,
                ..Watcher::default()
            };
            let mut b = Vec::new();
            sp::encode(
                1,
                &Req::Hello {
                    version: sp::VERSION,
                    keepalive_ms: KEEPALIVE_MS,
                    auth: b"",
                },
                &mut b,
            );
            for (k, key) in KEYS.iter().enumerate() {
                sp::encode(watch_rid(k), &Req::Watch { key }, &mut b);
            }
            self.shard.on_recv(t, &b);
            return;
        };
        if now_us >= w.last_ping_us + KEEPALIVE_MS as u64 * 1000 / 4 {
            w.last_ping_us = now_us;
            let mut b = Vec::new();
            sp::encode(2, &Req::Ping, &mut b);
            self.shard.on_recv(token, &b);
        }
    }

    /// The watcher reads some of what the server sent, and checks each
    /// change against what it was told before.
    fn deliver_to_watcher(&mut self) {
        let w = &mut self.watcher;
        if w.to_client.is_empty() {
            return;
        }
        let n = 1 + self.rng.below(w.to_client.len() as u64) as usize;
        w.rx.extend(w.to_client.drain(..n));
        loop {
            let w = &mut self.watcher;
            let hello = (!w.welcomed).then_some(1);
            let (a, n) = match sp::decode_answer(&w.rx, hello) {
                Ok(Some(v)) => v,
                Ok(None) => break,
                Err(e) => self.fail(format!("watcher: {e}")),
            };
            w.rx.drain(..n);
            if std::env::var_os("SIM_TRACE").is_some() {
                eprintln!("[{}] watcher {a:?}", self.now.mono_us);
            }
            if let Err(e) = self.watcher_answer(a) {
                self.fail(format!("watcher: {e}"));
            }
        }
    }

    fn watcher_answer(&mut self, a: Answer) -> Result<(), String> {
        let w = &mut self.watcher;
        match a {
            Answer::Welcome { .. } => w.welcomed = true,
            Answer::Reply { rid: 2, .. } => {}
            Answer::Reply { rid, status, .. } => {
                let k = (0..KEYS.len())
                    .find(|&k| watch_rid(k) == rid)
                    .ok_or(format!("a reply to rid {rid}, never sent"))?;
                if status != sp::Status::Ok || w.watching[k] {
                    return Err(format!("watch {rid} answered {status:?}"));
                }
                w.watching[k] = true;
            }
            Answer::Event {
                rid,
                kind,
                token,
                key,
                source,
                ..
            } => {
                let k = (0..KEYS.len())
                    .find(|&k| watch_rid(k) == rid && KEYS[k] == key.as_slice())
                    .ok_or(format!("an event of rid {rid} for {key:?}"))?;
                let (listing, h) = (!w.watching[k], &mut w.holders[k]);
                match kind {
                    sp::EventKind::Holder if listing => {
                        h.insert(token, source);
                    }
                    sp::EventKind::Holder => return Err("a holder event after the reply".into()),
                    _ if listing => return Err(format!("{kind:?} before the watch's reply")),
                    sp::EventKind::Granted => {
                        if token <= w.top[k] || h.insert(token, source).is_some() {
                            return Err(format!(
                                "granted {token} on {key:?}, not above {} or told twice",
                                w.top[k]
                            ));
                        }
                        if h.len() > 1 {
                            return Err(format!("{key:?} exclusive, told of holders {h:?}"));
                        }
                        w.events += 1;
                    }
                    // The holder stays (its source changed).
                    sp::EventKind::Proclaimed => {
                        let Some(was) = h.get_mut(&token) else {
                            return Err(format!(
                                "proclaimed {token} on {key:?}: not a holder it knew"
                            ));
                        };
                        *was = source;
                        w.events += 1;
                        w.proclaims += 1;
                    }
                    _ => {
                        if h.remove(&token).is_none() {
                            return Err(format!(
                                "{kind:?} {token} on {key:?}: not a holder it knew"
                            ));
                        }
                        w.events += 1;
                    }
                }
                w.top[k] = w.top[k].max(token);
            }
            other => return Err(format!("unexpected {other:?}")),
        }
        Ok(())
    }

    fn client_closed(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        cl.view.holds.clear();
        cl.view.queued.clear();
        cl.to_server.clear();
        cl.eof = true;
    }

    /// Bytes to the server, split at random.
    fn deliver_to_server(&mut self, c: usize) {
        let Some(token) = self.clients[c].token else {
            return;
        };
        let cl = &self.clients[c];
        // Bytes to a socket the server closed are dropped.
        if cl.eof || cl.eof_pending || cl.to_server.is_empty() {
            return;
        }
        let n = 1 + self.rng.below(self.clients[c].to_server.len() as u64) as usize;
        let bytes: Vec<u8> = self.clients[c].to_server.drain(..n).collect();
        self.shard.on_recv(token, &bytes);
    }

    /// Bytes to the client: it reads and believes what it is told.
    fn deliver_to_client(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        if cl.to_client.is_empty() {
            if cl.eof_pending {
                // The client reads the EOF: its session is over.
                cl.eof_pending = false;
                cl.token = None;
                cl.view.holds.clear();
                cl.view.queued.clear();
                cl.eof = true;
            }
            return;
        }
        let n = 1 + self.rng.below(cl.to_client.len() as u64) as usize;
        let bytes: Vec<u8> = cl.to_client.drain(..n).collect();
        if cl.eof {
            return; // closed by the client: nobody reads
        }
        cl.rx.extend(bytes);
        loop {
            let cl = &mut self.clients[c];
            let hello = (!cl.view.welcomed).then_some(1);
            let (a, n) = match sp::decode_answer(&cl.rx, hello) {
                Ok(Some(v)) => v,
                Ok(None) => break,
                Err(e) => self.fail(format!("client {c}: {e}")),
            };
            cl.rx.drain(..n);
            self.answer(c, a);
        }
    }

    fn answer(&mut self, c: usize, a: Answer) {
        if std::env::var_os("SIM_TRACE").is_some() {
            eprintln!("[{}] client {c} {a:?}", self.now.mono_us);
        }
        if let Answer::Welcome { welcome, .. } = &a {
            assert_eq!(welcome.keepalive_ms, KEEPALIVE_MS);
        }
        match self.clients[c].view.answer(a, KEYS) {
            Ok(n) => {
                self.grants += n.grants;
                self.lost += n.lost;
            }
            Err(e) => self.fail(format!("client {c}: {e}")),
        }
    }

    fn execute(&mut self) {
        loop {
            self.shard.end_tick();
            let mut cmds = Vec::new();
            self.shard.take_cmds(&mut cmds);
            if cmds.is_empty() {
                return;
            }
            for cmd in cmds {
                match cmd {
                    Cmd::Send(token) if self.watcher.token == Some(token) => {
                        let mut buf = Vec::new();
                        self.shard.take_output(token, &mut buf);
                        self.watcher.to_client.extend(buf);
                        self.shard.on_send_done(token, Ok(()));
                    }
                    Cmd::Close(token) if self.watcher.token == Some(token) => {
                        self.fail("the server closed the watcher's session".into())
                    }
                    Cmd::Send(token) => {
                        let mut buf = Vec::new();
                        self.shard.take_output(token, &mut buf);
                        let c = self.owner_of[&token];
                        self.clients[c].to_client.extend(buf);
                        self.shard.on_send_done(token, Ok(()));
                    }
                    Cmd::Close(token) => {
                        let Some(&c) = self.owner_of.get(&token) else {
                            // The watcher's, closed by it at the end.
                            self.shard.on_closed(token);
                            continue;
                        };
                        self.shard.on_closed(token);
                        // EOF after what was sent: the client learns it when
                        // it reads that far; until then it believes what its
                        // keep-alive rule allows.
                        let cl = &mut self.clients[c];
                        if cl.eof {
                            cl.token = None; // it closed first
                        } else {
                            cl.eof_pending = true;
                        }
                    }
                    other => self.fail(format!("unexpected command {other:?}")),
                }
            }
        }
    }

    /// A watcher that read everything the server sent (checked after the
    /// shard's output was all handed over) sees each key's holders as
    /// they are.
    fn check_watcher(&self) {
        let w = &self.watcher;
        if w.welcomed && w.to_client.is_empty() && w.rx.is_empty() {
            for (k, key) in KEYS.iter().enumerate().filter(|&(k, _)| w.watching[k]) {
                let server: BTreeMap<u64, Vec<u8>> = self
                    .shard
                    .table()
                    .holders_of(key)
                    .iter()
                    .map(|(h, _)| (h.grant_id, h.source.as_bytes().to_vec()))
                    .collect();
                if server != w.holders[k] {
                    self.fail(format!(
                        "the watcher read everything and believes {key:?} is held by {:?}; the server says {server:?}",
                        w.holders[k]
                    ));
                }
            }
        }
    }

    /// Nobody believes a key another believes, and every belief is true.
    fn check(&self) {
        self.shard.check_invariants();
        let now = self.now.mono_us;
        for (k, key) in KEYS.iter().enumerate() {
            let believers: Vec<(usize, Belief)> = self
                .clients
                .iter()
                .enumerate()
                .filter_map(|(i, cl)| {
                    let b = *cl.view.holds.get(&k)?;
                    cl.view
                        .valid(&b, now, KEEPALIVE_MS as u64 * 1000)
                        .then_some((i, b))
                })
                .collect();
            if believers.len() > 1 {
                self.fail(format!("two owners of {:?} at {now}: {believers:?}", key));
            }
            if let Some((i, b)) = believers.first() {
                let h = self.shard.table().holder_of(key);
                if h.map(|h| h.grant_id) != Some(b.token) {
                    self.fail(format!(
                        "client {i} believes it holds {key:?} with token {} at {now}, the server says {h:?}",
                        b.token
                    ));
                }
            }
        }
    }

    fn step(&mut self) {
        let jump = self.rng.below(4_000);
        self.now.mono_us += 1 + jump;
        if let Some(d) = self.shard.next_deadline_us() {
            // Straight to a lease's TTL or a wait deadline (not to a
            // partial frame's 10 s timeout: every session would expire).
            if self.rng.chance(200) && d > self.now.mono_us && d < self.now.mono_us + 100_000 {
                self.now.mono_us = d;
            }
        }
        self.now.unix_ms = 1_700_000_000_000 + self.now.mono_us / 1000;
        self.shard.begin_tick(self.now);
        self.watcher_step();
        for _ in 0..1 + self.rng.below(4) {
            let c = self.rng.below(CLIENTS as u64) as usize;
            match self.rng.below(100) {
                0..=39 => self.client_step(c),
                40..=69 => self.deliver_to_server(c),
                _ => self.deliver_to_client(c),
            }
            self.check();
        }
        if self.rng.chance(60) {
            self.deliver_to_watcher();
            self.check();
        }
        self.execute();
        self.check();
        self.check_watcher();
    }

    fn quiesce(&mut self) {
        for c in 0..CLIENTS {
            while self.clients[c].eof_pending {
                self.deliver_to_client(c);
            }
            if let Some(t) = self.clients[c].token {
                self.client_closed(c);
                self.shard.on_peer_closed(t, None);
            }
        }
        self.execute();
        while !self.watcher.to_client.is_empty() {
            self.deliver_to_watcher();
        }
        self.check();
        self.check_watcher();
        if let Some(t) = self.watcher.token.take() {
            self.shard.on_peer_closed(t, None);
        }
        self.execute();
        // Past every TTL and deadline.
        self.now.mono_us += 10_000_000;
        self.now.unix_ms += 10_000;
        self.shard.begin_tick(self.now);
        self.execute();
        self.check();
        let t = self.shard.table();
        if t.held_keys() != 0 || t.queued_waiters() != 0 || t.sessions() != 0 {
            self.fail(format!(
                "left behind: {} held, {} queued, {} sessions",
                t.held_keys(),
                t.queued_waiters(),
                t.sessions()
            ));
        }
        if self.shard.open_connections() != 0 {
            self.fail(format!(
                "{} connections left open",
                self.shard.open_connections()
            ));
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn simulated_sessions_never_give_one_key_two_believing_owners() {
    let steps = env_u64("SIM_STEPS", 1500);
    let seeds: Vec<u64> = match std::env::var("SIM_SEED") {
        Ok(s) => vec![s.parse().expect("SIM_SEED is a number")],
        Err(_) => {
            let first = env_u64("SIM_FIRST_SEED", 1);
            (first..first + env_u64("SIM_SEEDS", 200)).collect()
        }
    };
    let (mut grants, mut lost, mut watched, mut proclaimed) = (0, 0, 0, 0);
    let runs = seeds.len() as u64;
    for seed in seeds {
        let mut w = World::new(seed);
        for _ in 0..steps {
            w.step();
        }
        w.quiesce();
        grants += w.grants;
        lost += w.lost;
        watched += w.watcher.events;
        proclaimed += w.watcher.proclaims;
        if std::env::var_os("SIM_STATS").is_some() {
            eprintln!(
                "seed {seed}: grants {} lost {} metrics {}",
                w.grants,
                w.lost,
                w.shard.table().sessions()
            );
        }
    }
    // The scenarios must exercise what they claim to.
    assert!(grants >= 10 * runs, "only {grants} grants in {runs} runs");
    assert!(lost >= 2 * runs, "only {lost} Lost pushes in {runs} runs");
    assert!(
        watched >= 10 * runs,
        "only {watched} watch events in {runs} runs"
    );
    assert!(
        proclaimed >= runs,
        "only {proclaimed} proclaims watched in {runs} runs"
    );
}
