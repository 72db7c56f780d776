//! Deterministic simulation of several shards.
//!
//! N shards (2 to 4, by seed) run the same `Shard` code as the io_uring
//! driver; the simulator plays the drivers and the mesh between them:
//! - clients (Locking-Center one-shot and persistent, and session clients)
//!   connect to a random shard; their bytes reach it after arbitrary delays
//!   and splits, and its answers reach them likewise;
//! - a connection whose request names another shard's key is handed over
//!   (`Migrate` → `detach` → adopt on the owner → `resume`), and bytes and
//!   hang-ups may arrive while it is on its way;
//! - cross-shard messages (hand-overs, scatter/gather parts and replies,
//!   session requests, answers and ends) are delivered one at a time from a
//!   random pair of shards: FIFO per ordered pair (as the real queues are),
//!   reordered across pairs;
//! - time advances in jumps, often straight to a shard's next deadline.
//!
//! Session clients acquire exclusively, shared, or as semaphores (issue
//! #33; mostly of the key's `n`, now and then of another, which is
//! refused); Locking-Center clients hold exclusively, as their protocol
//! does, in the same queues.
//!
//! Checked after every step: each shard's own invariants; on each key's
//! owner, the table against the previous check (`sim_common/modes.rs`:
//! an exclusive holder alone, at most `n` holders of a semaphore, a
//! holder's access and `n` unchanged, every new token above the key's
//! largest, the queue in arrival order, and no grant while a request
//! queued earlier still waits, other than to requests ahead of it);
//! **the clients that believe they hold a key at one instant can all be
//! right** — one access among them, an exclusive one alone, a semaphore
//! of `n` at most `n` (a Locking-Center client believes from its `+`
//! until it sends Unlock; a session client by the rules of the client
//! library: a lease until its Acquire/Extend send time + TTL, a session
//! hold until the last answered send + keep-alive, or EOF); every believed
//! hold is one of the owner's holders (same source, and same token and
//! access for sessions); a grant answered before an Acquire was sent has
//! a smaller token than the Acquire's; `mode_mismatch` answers only a
//! semaphore Acquire.
//!
//! A watcher session on one shard watches every key (the others' through
//! the mesh): every change reaches it once, in order, never more holders
//! than the key's access allows, and whenever it has read everything and
//! nothing is in flight between shards, its picture of each key's holders
//! (tokens, sources, accesses) is the owner's (`sim_common/watcher.rs`).
//!
//! At the end, everyone
//! leaves: no connection, waiter, session or hold remains on any shard
//! except a documented ghost (a client that fully closed while its Lock
//! was queued, whose grant raced the close).
//!
//! `SIM_SEEDS=N` (default 150) from `SIM_FIRST_SEED` (default 1), `SIM_STEPS=N`
//! (default 1500), `SIM_SEED=S`; `scripts/sim.sh` runs it for hours.

#[path = "sim_shards/checks.rs"]
mod checks;
mod sim_common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use ringlock::config::Config;
use ringlock::core::{Access, HoldMode, Limits, Now, Table, Token};
use ringlock::metrics::Metrics;
use ringlock::protocol::session::{self as sp, Answer, Req};
use ringlock::shard::conn::Port;
use ringlock::shard::session::SessMsg;
use ringlock::shard::{Cmd, ConnCounts, Detached, RemoteOp, RemoteResult, Shard};
use sim_common::{Belief, Causal, KeySeen, Modes, Rng, SessionView, Watcher};

const KEYS: &[&[u8]] = &[b"alpha", b"beta", b"gamma", b"delta"];
const CLIENTS: usize = 7;
const KEEPALIVE_MS: u32 = 300;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    OneShot,
    Persistent,
    Session,
}

/// Where a client's connection is: on a shard, or handed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    None,
    On {
        shard: usize,
        token: Token,
    },
    /// Detached, in the mesh on its way to `to`.
    Moving {
        to: usize,
    },
}

struct Client {
    kind: Kind,
    source: Vec<u8>,
    at: At,
    /// `Some(to)` after a Migrate command, until the simulated driver
    /// detaches it (its receive comes back).
    migrate_to: Option<usize>,
    to_server: VecDeque<u8>,
    to_client: VecDeque<u8>,
    rx: Vec<u8>,
    eof: bool,
    eof_pending: bool,
    /// Locking-Center: requests sent on this connection, unanswered.
    lc_outstanding: VecDeque<(u8, usize)>,
    /// A one-shot connection that sent its one request.
    served: bool,
    /// What it sent and believes: a session client's view (the client
    /// library's rules), whose holds also carry a Locking-Center client's
    /// beliefs (persistent, until it sends Unlock).
    view: SessionView,
}

impl Client {
    fn new(kind: Kind, i: usize) -> Client {
        Client {
            kind,
            source: format!("c{i}").into_bytes(),
            at: At::None,
            migrate_to: None,
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
            rx: Vec::new(),
            eof: false,
            eof_pending: false,
            lc_outstanding: VecDeque::new(),
            served: false,
            view: SessionView::default(),
        }
    }
}

enum Msg {
    Adopt { client: usize, d: Detached },
    Request { from: usize, id: u64, op: RemoteOp },
    Reply { id: u64, result: RemoteResult },
    Sess(Box<SessMsg>),
}

struct World {
    rng: Rng,
    seed: u64,
    n: usize,
    shards: Vec<Shard>,
    now: Now,
    clients: Vec<Client>,
    /// (shard, connection token) → client.
    conn_client: HashMap<(usize, Token), usize>,
    /// Per ordered pair of shards, FIFO.
    mesh: HashMap<(usize, usize), VecDeque<Msg>>,
    /// What the last check saw of each key on its owner.
    seen: Vec<KeySeen>,
    causal: Causal,
    modes: Modes,
    /// The watcher, and the shard its connection is on.
    watcher: Watcher,
    watcher_shard: usize,
    /// The watcher hung up (the end of the run).
    watcher_closed: bool,
    /// Keys a client may have left held by nobody (it closed while its
    /// Lock was outstanding).
    ghost_ok: HashSet<usize>,
    grants: u64,
    moves: u64,
    messages: u64,
}

fn frame(act: u8, key: &[u8], source: Option<&[u8]>) -> Vec<u8> {
    let mut b = vec![act, key.len() as u8];
    b.extend_from_slice(key);
    if let Some(s) = source {
        b.push(s.len() as u8);
        b.extend_from_slice(s);
    }
    b
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng::seeded(seed);
        let n = 2 + rng.below(3) as usize;
        let mut cfg = Config::new("127.0.0.1:0".parse().expect("address"));
        cfg.max_connections = 64;
        cfg.max_keys = 16;
        cfg.max_waiters = 64;
        cfg.min_keepalive_ms = KEEPALIVE_MS;
        cfg.min_ttl_ms = 5;
        cfg.threads = n;
        let now = Now {
            mono_us: 1_000_000,
            unix_ms: 1_700_000_000_000,
        };
        let counts: Arc<ConnCounts> = Arc::new(Default::default());
        let metrics = Arc::new(Metrics::new_loops(n));
        let shards = (0..n)
            .map(|i| {
                let table = Table::new(Limits {
                    max_keys: cfg.max_keys,
                    max_waiters: cfg.max_waiters,
                });
                let mut s = Shard::new(cfg.clone(), table, None, metrics.clone(), now);
                s.place(i, n, counts.clone());
                s
            })
            .collect();
        let clients = (0..CLIENTS)
            .map(|i| {
                // Two one-shot, two persistent, three session clients.
                let kind = match i % 3 {
                    0 if i < 6 => Kind::OneShot,
                    1 => Kind::Persistent,
                    _ => Kind::Session,
                };
                Client::new(kind, i)
            })
            .collect();
        let watcher_shard = rng.below(n as u64) as usize;
        World {
            rng,
            seed,
            n,
            shards,
            now,
            clients,
            conn_client: HashMap::new(),
            mesh: HashMap::new(),
            seen: vec![KeySeen::default(); KEYS.len()],
            causal: Causal::default(),
            modes: Modes::default(),
            watcher: Watcher::default(),
            watcher_shard,
            watcher_closed: false,
            ghost_ok: HashSet::new(),
            grants: 0,
            moves: 0,
            messages: 0,
        }
    }

    fn fail(&self, why: String) -> ! {
        panic!(
            "seed {} ({} shards): {why}\nreproduce: SIM_SEED={} cargo test --test sim_shards",
            self.seed, self.n, self.seed
        )
    }

    fn peer(c: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 10_000 + c as u16))
    }

    // ----- clients ----------------------------------------------------------

    fn connect(&mut self, c: usize) {
        let s = self.rng.below(self.n as u64) as usize;
        let Some(t) = self.shards[s].on_accept(Port::Lock, Self::peer(c)) else {
            return;
        };
        self.conn_client.insert((s, t), c);
        let kind = self.clients[c].kind;
        let mut cl = Client::new(kind, c);
        cl.at = At::On { shard: s, token: t };
        cl.view.modes = true;
        // A Locking-Center hold outlives connections: still believed.
        if kind != Kind::Session {
            cl.view.holds = std::mem::take(&mut self.clients[c].view.holds);
        }
        self.clients[c] = cl;
        match kind {
            Kind::Persistent => {
                self.clients[c].to_server.push_back(6);
                self.clients[c].lc_outstanding.push_back((6, 0));
            }
            Kind::Session => {
                // A new session numbers its requests from 1 again.
                self.causal.forget(c);
                self.send_sess(
                    c,
                    &Req::Hello {
                        version: sp::VERSION,
                        keepalive_ms: KEEPALIVE_MS,
                        auth: b"",
                    },
                );
            }
            Kind::OneShot => {}
        }
    }

    fn send_sess(&mut self, c: usize, req: &Req<'_>) {
        let now = self.now.mono_us;
        let cl = &mut self.clients[c];
        cl.view.send(req, None, now, &mut cl.to_server);
    }

    /// The client stops believing anything and hangs up.
    fn hang_up(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        // A `+` already on its way is discarded: the documented ghost.
        for &(a, k) in &cl.lc_outstanding {
            if a == 1 || a == 5 {
                self.ghost_ok.insert(k);
            }
        }
        if cl.kind != Kind::Session {
            assert!(
                cl.view.holds.is_empty(),
                "an LC client hangs up only when it holds nothing"
            );
        }
        cl.view.holds.clear();
        cl.view.queued.clear();
        cl.lc_outstanding.clear();
        cl.to_server.clear();
        cl.eof = true;
        if let At::On { shard, token } = cl.at {
            if !cl.eof_pending {
                self.shards[shard].on_peer_closed(token, None);
            }
        }
        // A connection on its way reports its hang-up on arrival: the
        // simulated driver of the new shard sees the EOF then.
    }

    fn client_step(&mut self, c: usize) {
        let cl = &self.clients[c];
        if cl.eof_pending || cl.migrate_to.is_some() {
            return;
        }
        if cl.at == At::None {
            if self.rng.chance(300) {
                self.connect(c);
            }
            return;
        }
        if cl.eof {
            return; // hung up: a new connection after the server's close
        }
        let k = self.rng.below(KEYS.len() as u64) as usize;
        match self.clients[c].kind {
            Kind::OneShot | Kind::Persistent => self.lc_step(c, k, false),
            Kind::Session => {
                if !self.clients[c].view.welcomed {
                    return;
                }
                let now = self.now.mono_us;
                let cl = &mut self.clients[c];
                let rid = cl.view.next_rid;
                if !cl
                    .view
                    .random_request(&mut self.rng, k, KEYS, now, &mut cl.to_server)
                {
                    self.hang_up(c);
                    return;
                }
                let rid = (cl.view.next_rid != rid).then_some(cl.view.next_rid);
                if let Some(s) = rid.and_then(|r| cl.view.sent.get(&r)) {
                    if s.hold.is_some() && !s.extend {
                        self.causal.sent(c, cl.view.next_rid, s.key);
                    }
                }
            }
        }
    }

    /// A Locking-Center client's next move; `unlock_only` while quiescing.
    fn lc_step(&mut self, c: usize, k: usize, unlock_only: bool) {
        let cl = &self.clients[c];
        let oneshot = cl.kind == Kind::OneShot;
        // One request on a one-shot connection; on a persistent one, after
        // the Persist answer, at most two pipelined.
        let busy = (oneshot && cl.served)
            || (!oneshot && cl.lc_outstanding.iter().any(|&(a, _)| a == 6))
            || cl.lc_outstanding.len() >= 2;
        if busy {
            return;
        }
        let held: Vec<usize> = {
            let mut h: Vec<usize> = cl.view.holds.keys().copied().collect();
            h.sort();
            h
        };
        let r = self.rng.below(100);
        // No hold-and-wait (a blocking Lock only with nothing held or
        // outstanding) and no Unlock queued behind a blocking Lock on the
        // same connection: the clients themselves never deadlock.
        let waiting = cl.lc_outstanding.iter().any(|&(a, _)| a == 1);
        let may_wait = held.is_empty() && cl.lc_outstanding.is_empty();
        if waiting {
            return;
        }
        let act = if (unlock_only || r < 40) && !held.is_empty() {
            let k = held[self.rng.below(held.len() as u64) as usize];
            // The critical section ends when the Unlock is sent.
            self.clients[c].view.holds.remove(&k);
            Some((2u8, k))
        } else if !unlock_only && r < 90 {
            let act = if may_wait && self.rng.chance(500) {
                1
            } else {
                5
            };
            let cl = &self.clients[c];
            if cl.view.holds.contains_key(&k) || cl.lc_outstanding.iter().any(|&(_, kk)| kk == k) {
                None
            } else {
                Some((act, k))
            }
        } else {
            if held.is_empty() && self.clients[c].lc_outstanding.is_empty() && !unlock_only {
                self.hang_up(c);
            }
            None
        };
        if let Some((act, k)) = act {
            let cl = &mut self.clients[c];
            let src = cl.source.clone();
            let f = if act == 2 {
                frame(2, KEYS[k], None)
            } else {
                frame(act, KEYS[k], Some(&src))
            };
            cl.to_server.extend(f);
            cl.lc_outstanding.push_back((act, k));
            cl.served = true;
        }
    }

    fn deliver_to_server(&mut self, c: usize) {
        let cl = &self.clients[c];
        let At::On { shard, token } = cl.at else {
            return;
        };
        if cl.eof || cl.eof_pending || cl.to_server.is_empty() {
            return;
        }
        let n = 1 + self.rng.below(cl.to_server.len() as u64) as usize;
        let bytes: Vec<u8> = self.clients[c].to_server.drain(..n).collect();
        self.shards[shard].on_recv(token, &bytes);
    }

    fn deliver_to_client(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        if cl.to_client.is_empty() {
            if cl.eof_pending && cl.migrate_to.is_none() {
                cl.eof_pending = false;
                cl.at = At::None;
                for &(a, k) in &cl.lc_outstanding {
                    if a == 1 || a == 5 {
                        self.ghost_ok.insert(k);
                    }
                }
                cl.lc_outstanding.clear();
                cl.holds_clear_on_eof();
            }
            return;
        }
        let n = 1 + self.rng.below(cl.to_client.len() as u64) as usize;
        let bytes: Vec<u8> = cl.to_client.drain(..n).collect();
        if cl.eof {
            return;
        }
        cl.rx.extend(bytes);
        match cl.kind {
            Kind::Session => loop {
                let cl = &mut self.clients[c];
                let hello = (!cl.view.welcomed).then_some(1);
                let (a, n) = match sp::decode_answer(&cl.rx, hello) {
                    Ok(Some(v)) => v,
                    Ok(None) => break,
                    Err(e) => self.fail(format!("client {c}: {e}")),
                };
                cl.rx.drain(..n);
                self.sess_answer(c, a);
            },
            _ => {
                let bytes: Vec<u8> = std::mem::take(&mut self.clients[c].rx);
                for b in bytes {
                    self.lc_answer(c, b);
                }
            }
        }
    }

    fn lc_answer(&mut self, c: usize, b: u8) {
        let Some((act, k)) = self.clients[c].lc_outstanding.pop_front() else {
            // A `-` after the one request of a one-shot connection, or a
            // refused hand-over: nothing was asked.
            if b != b'-' {
                self.fail(format!("client {c}: unsolicited {:?}", b as char));
            }
            return;
        };
        match (act, b) {
            (1 | 5, b'+') => {
                self.grants += 1;
                self.clients[c].view.holds.insert(
                    k,
                    Belief {
                        token: 0,
                        mode: HoldMode::Persistent,
                        until_us: u64::MAX,
                        access: Access::Exclusive,
                    },
                );
            }
            (1 | 5 | 2 | 6, b'+' | b'#' | b'-') => {}
            _ => self.fail(format!(
                "client {c}: answer {:?} to action {act}",
                b as char
            )),
        }
    }

    fn sess_answer(&mut self, c: usize, a: Answer) {
        if let Answer::Reply {
            rid,
            status: sp::Status::Ok,
            token,
            ..
        } = a
        {
            let view = &self.clients[c].view;
            let acquire = view
                .sent
                .get(&rid)
                .filter(|s| s.hold.is_some() && !s.extend);
            if let Some(k) = acquire.filter(|_| token != 0).map(|s| s.key) {
                if let Err(e) = self.causal.granted(c, rid, k, token) {
                    self.fail(e);
                }
            }
        }
        match self.clients[c].view.answer(a, KEYS) {
            Ok(n) => {
                self.grants += n.grants;
                self.modes.add(&n);
            }
            Err(e) => self.fail(format!("client {c}: {e}")),
        }
    }

    // ----- drivers and mesh -----------------------------------------------------

    fn execute(&mut self) {
        for _ in 0..10_000 {
            let mut any = false;
            for s in 0..self.n {
                self.shards[s].end_tick();
                let mut cmds = Vec::new();
                self.shards[s].take_cmds(&mut cmds);
                any |= !cmds.is_empty();
                for cmd in cmds {
                    self.command(s, cmd);
                }
            }
            if !any {
                return;
            }
        }
        self.fail("the shards never settled".into());
    }

    fn command(&mut self, s: usize, cmd: Cmd) {
        let watcher = s == self.watcher_shard && self.watcher.token.is_some();
        match cmd {
            Cmd::Send(token) if watcher && self.watcher.token == Some(token) => {
                let mut buf = Vec::new();
                self.shards[s].take_output(token, &mut buf);
                self.watcher.to_client.extend(buf);
                self.shards[s].on_send_done(token, Ok(()));
            }
            Cmd::Close(token) if watcher && self.watcher.token == Some(token) => {
                if !self.watcher_closed {
                    self.fail("the server closed the watcher's session".into())
                }
                // The watcher hung up at the end.
                self.shards[s].on_closed(token);
            }
            Cmd::Send(token) => {
                let mut buf = Vec::new();
                self.shards[s].take_output(token, &mut buf);
                let c = self.conn_client[&(s, token)];
                self.clients[c].to_client.extend(buf);
                self.shards[s].on_send_done(token, Ok(()));
            }
            Cmd::Close(token) => {
                let c = self.conn_client[&(s, token)];
                self.shards[s].on_closed(token);
                let cl = &mut self.clients[c];
                cl.migrate_to = None;
                if cl.eof {
                    cl.at = At::None;
                } else {
                    cl.eof_pending = true;
                }
            }
            Cmd::Migrate { token, to } => {
                self.moves += 1;
                let c = self.conn_client[&(s, token)];
                self.clients[c].migrate_to = Some(to);
            }
            Cmd::Scatter { id, op } => {
                for t in (0..self.n).filter(|&t| t != s) {
                    self.send(
                        s,
                        t,
                        Msg::Request {
                            from: s,
                            id,
                            op: op.clone(),
                        },
                    );
                }
                self.shards[s].on_remote(s, id, op);
            }
            Cmd::Reply { to, id, result } => {
                if to == s {
                    self.shards[s].on_reply(id, result);
                } else {
                    self.send(s, to, Msg::Reply { id, result });
                }
            }
            Cmd::Sess { to, msg } => self.send(s, to, Msg::Sess(msg)),
            other => self.fail(format!("unexpected command {other:?}")),
        }
    }

    fn send(&mut self, from: usize, to: usize, m: Msg) {
        self.mesh.entry((from, to)).or_default().push_back(m);
    }

    /// The simulated driver of a Migrating connection gets its receive back.
    fn detach_step(&mut self, c: usize) {
        let cl = &self.clients[c];
        let (Some(to), At::On { shard, token }) = (cl.migrate_to, cl.at) else {
            return;
        };
        self.clients[c].migrate_to = None;
        if let Some(d) = self.shards[shard].detach(token) {
            self.clients[c].at = At::Moving { to };
            self.send(shard, to, Msg::Adopt { client: c, d });
        }
        // None: it died meanwhile; its Close command closes it.
    }

    fn mesh_step(&mut self) {
        let pairs: Vec<(usize, usize)> = self
            .mesh
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(p, _)| *p)
            .collect();
        if pairs.is_empty() {
            return;
        }
        let mut pairs = pairs;
        pairs.sort();
        let (from, to) = pairs[self.rng.below(pairs.len() as u64) as usize];
        let m = self
            .mesh
            .get_mut(&(from, to))
            .and_then(VecDeque::pop_front)
            .expect("non-empty");
        self.messages += 1;
        let _ = from;
        match m {
            Msg::Adopt { client, mut d } => {
                // A hang-up while it travelled arrives with it.
                if self.clients[client].eof {
                    d.read_closed = true;
                }
                match self.shards[to].on_adopt(&d) {
                    Some(t) => {
                        self.conn_client.insert((to, t), client);
                        self.clients[client].at = At::On {
                            shard: to,
                            token: t,
                        };
                        self.shards[to].resume(t);
                    }
                    None => {
                        let cl = &mut self.clients[client];
                        cl.to_client.push_back(b'-');
                        cl.eof_pending = true;
                        cl.at = At::None;
                    }
                }
            }
            Msg::Request { from, id, op } => self.shards[to].on_remote(from, id, op),
            Msg::Reply { id, result } => self.shards[to].on_reply(id, result),
            Msg::Sess(msg) => self.shards[to].on_sess(msg),
        }
    }

    fn step(&mut self) {
        self.now.mono_us += 1 + self.rng.below(4_000);
        let next = self
            .shards
            .iter()
            .filter_map(|s| s.next_deadline_us())
            .min();
        if let Some(d) = next {
            if self.rng.chance(200) && d > self.now.mono_us && d < self.now.mono_us + 100_000 {
                self.now.mono_us = d;
            }
        }
        self.now.unix_ms = 1_700_000_000_000 + self.now.mono_us / 1000;
        for s in &mut self.shards {
            s.begin_tick(self.now);
        }
        self.watcher_step();
        for _ in 0..1 + self.rng.below(5) {
            let c = self.rng.below(CLIENTS as u64) as usize;
            match self.rng.below(100) {
                0..=29 => self.client_step(c),
                30..=54 => self.deliver_to_server(c),
                55..=74 => self.deliver_to_client(c),
                75..=84 => self.detach_step(c),
                85..=89 => self.deliver_to_watcher(false),
                _ => self.mesh_step(),
            }
            self.check();
        }
        self.execute();
        self.check();
        self.check_watcher();
    }

    /// Delivers everything in flight, a little time passing each round.
    fn drain(&mut self, unlock: bool) {
        for _ in 0..100_000 {
            self.now.mono_us += 1000;
            self.now.unix_ms = 1_700_000_000_000 + self.now.mono_us / 1000;
            for s in &mut self.shards {
                s.begin_tick(self.now);
            }
            for c in 0..CLIENTS {
                let cl = &self.clients[c];
                if unlock && cl.kind != Kind::Session && !cl.view.holds.is_empty() {
                    if cl.at == At::None {
                        self.connect(c);
                    } else if !cl.eof_pending && cl.migrate_to.is_none() {
                        self.lc_step(c, 0, true);
                    }
                }
                self.detach_step(c);
                self.deliver_to_server(c);
                self.deliver_to_client(c);
            }
            self.mesh_step();
            self.watcher_step();
            self.execute();
            self.check();
            self.deliver_to_watcher(true);
            self.check_watcher();
            let in_flight = self.mesh.values().any(|q| !q.is_empty())
                || self.clients.iter().any(|c| {
                    !c.to_client.is_empty()
                        || (!c.to_server.is_empty() && !c.eof)
                        || c.eof_pending
                        || c.migrate_to.is_some()
                        || matches!(c.at, At::Moving { .. })
                        || (!c.lc_outstanding.is_empty() && !c.eof)
                });
            let holding = unlock
                && self
                    .clients
                    .iter()
                    .any(|c| c.kind != Kind::Session && !c.view.holds.is_empty());
            if !in_flight && !holding {
                return;
            }
        }
        let clients: Vec<String> = self
            .clients
            .iter()
            .map(|c| {
                format!(
                    "{:?} at={:?} eof={} eof_pending={} migrate={:?} to_server={} to_client={} outstanding={:?} holds={:?}",
                    c.kind,
                    c.at,
                    c.eof,
                    c.eof_pending,
                    c.migrate_to,
                    c.to_server.len(),
                    c.to_client.len(),
                    c.lc_outstanding,
                    c.view.holds.keys().collect::<Vec<_>>()
                )
            })
            .collect();
        let mesh: usize = self.mesh.values().map(|q| q.len()).sum();
        self.fail(format!(
            "the world never quiesced: mesh {mesh}, clients {clients:#?}"
        ));
    }

    fn quiesce(&mut self) {
        // Locking-Center clients give back what they hold (on new
        // connections if theirs closed), then everyone hangs up.
        self.drain(true);
        for c in 0..CLIENTS {
            let cl = &self.clients[c];
            if matches!(cl.at, At::On { .. }) && !cl.eof && !cl.eof_pending {
                if cl.kind == Kind::Session {
                    self.clients[c].view.holds.clear();
                }
                self.hang_up(c);
            }
        }
        self.drain(false);
        self.deliver_to_watcher(true);
        self.check_watcher();
        if let Some(t) = self.watcher.token {
            self.watcher_closed = true;
            self.shards[self.watcher_shard].on_peer_closed(t, None);
            self.execute();
        }
        // Past every TTL and keep-alive.
        self.now.mono_us += 10_000_000;
        self.now.unix_ms += 10_000;
        for s in &mut self.shards {
            s.begin_tick(self.now);
        }
        self.execute();
        self.check();
        for (i, s) in self.shards.iter().enumerate() {
            let t = s.table();
            if t.queued_waiters() != 0 || t.sessions() != 0 || s.open_connections() != 0 {
                self.fail(format!(
                    "shard {i} left behind: {} queued, {} sessions, {} connections",
                    t.queued_waiters(),
                    t.sessions(),
                    s.open_connections()
                ));
            }
            for (k, key) in KEYS.iter().enumerate() {
                if let Some(h) = t.holder_of(key) {
                    if !self.ghost_ok.contains(&k) {
                        self.fail(format!("{key:?} left held by nobody: {h:?}"));
                    }
                }
            }
        }
    }
}

impl Client {
    fn holds_clear_on_eof(&mut self) {
        // A session's holds end with its connection; a Locking-Center
        // hold does not (the client unlocks it on a new connection).
        if self.kind == Kind::Session {
            self.view.holds.clear();
        }
        self.view.queued.clear();
        self.eof = true;
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn simulated_shards_keep_every_invariant() {
    let steps = env_u64("SIM_STEPS", 1500);
    let seeds: Vec<u64> = match std::env::var("SIM_SEED") {
        Ok(s) => vec![s.parse().expect("SIM_SEED is a number")],
        Err(_) => {
            let first = env_u64("SIM_FIRST_SEED", 1);
            (first..first + env_u64("SIM_SEEDS", 150)).collect()
        }
    };
    let runs = seeds.len() as u64;
    let (mut grants, mut moves, mut messages) = (0, 0, 0);
    let (mut modes, mut watched, mut proclaimed, mut compared) = (Modes::default(), 0, 0, 0);
    for seed in seeds {
        let mut w = World::new(seed);
        for _ in 0..steps {
            w.step();
        }
        w.quiesce();
        grants += w.grants;
        moves += w.moves;
        messages += w.messages;
        for seen in &w.seen {
            w.modes.add_seen(seen);
        }
        w.modes.causal = w.causal.checked;
        modes.merge(&w.modes);
        watched += w.watcher.events;
        proclaimed += w.watcher.proclaims;
        compared += w.watcher.compared;
        if std::env::var_os("SIM_STATS").is_some() {
            eprintln!(
                "seed {seed}: {} shards, grants {} moves {} messages {}",
                w.n, w.grants, w.moves, w.messages
            );
        }
    }
    assert!(grants >= 10 * runs, "only {grants} grants in {runs} runs");
    assert!(moves >= 10 * runs, "only {moves} hand-overs in {runs} runs");
    assert!(
        messages >= 20 * runs,
        "only {messages} mesh messages in {runs} runs"
    );
    eprintln!(
        "sim_shards: {runs} seeds, {grants} grants, {modes:?}, watcher: {watched} events \
         ({proclaimed} proclaims), {compared} pictures compared"
    );
    // A seed alone (SIM_SEED) need not exercise everything.
    if std::env::var("SIM_SEED").is_ok() {
        return;
    }
    // Every mode is exercised, and the watcher sees changes and compares.
    assert!(modes.shared >= runs && modes.semaphore >= runs, "{modes:?}");
    assert!(
        modes.multi >= runs && modes.fifo_grants >= runs,
        "{modes:?}"
    );
    assert!(modes.mismatches * 10 >= runs, "{modes:?}");
    assert!(
        watched >= 10 * runs,
        "only {watched} watch events in {runs} runs"
    );
    assert!(
        proclaimed * 5 >= runs,
        "only {proclaimed} proclaims watched"
    );
    assert!(
        compared >= 10 * runs,
        "only {compared} watcher pictures compared"
    );
}
