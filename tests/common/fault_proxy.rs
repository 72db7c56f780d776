//! A TCP fault proxy for cluster tests: put one in front of each node's
//! peer port and the test decides, per direction, whether the link passes,
//! delays, drops or blackholes bytes, and can cut, refuse or heal links.
//!
//! ```ignore
//! let p = FaultProxy::start(node_b_peer_addr);
//! // node A dials p.addr() instead of node B.
//! p.partition();                        // nothing flows either way
//! p.heal();                             // links reset, peers reconnect
//! p.set_mode(Dir::Back, Mode::Blackhole); // one-way: B's replies vanish
//! p.set_mode_both(Mode::Delay(Duration::from_millis(30)));
//! p.reset_all();                        // every current link fails
//! ```
//!
//! Directions: [`Dir::Forward`] is client → upstream (the side that dialed
//! the proxy towards the node it proxies), [`Dir::Back`] upstream → client.
//!
//! Threads: one listener thread polls a nonblocking listener; each accepted
//! connection gets one upstream connection and one pump thread per
//! direction. Pumps read with short timeouts and every link is shut down
//! (`shutdown(2)` on both sockets) when it is cut, so dropping the proxy
//! joins every thread it started and releases its port.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How often idle threads look at the stop flag and at mode changes. Only
/// bounds how long a stopped proxy takes to wind down; data is never
/// paced by it (a pump blocked in `read` wakes as soon as bytes arrive).
const POLL: Duration = Duration::from_millis(10);

/// How long connecting to the upstream may take before the client's
/// connection is closed (a node that is down refuses at once on loopback;
/// this only bounds a stuck connect).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Most bytes a blackholed direction reads and holds per connection; past
/// it the pump stops reading, so the sender's socket buffers fill and its
/// writes block, as they would when a real partition stops the ACKs.
const HOLD_CAP: usize = 256 * 1024;

/// A direction through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client → upstream (towards the proxied node).
    Forward,
    /// Upstream → client.
    Back,
    /// Both directions (for modes: set both; for counters: the sum).
    Both,
}

impl Dir {
    fn indices(self) -> &'static [usize] {
        match self {
            Dir::Forward => &[0],
            Dir::Back => &[1],
            Dir::Both => &[0, 1],
        }
    }
}

/// What a direction does with the bytes it reads. A mode applies to the
/// bytes read while it is set (a chunk read under `Delay` keeps its due
/// time if the mode changes to `Pass`), except that nothing is delivered
/// while the direction is `Blackhole`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Bytes are written on as soon as they are read.
    Pass,
    /// Each chunk is delivered no earlier than its read time plus this;
    /// order is kept (a chunk never overtakes an earlier one).
    Delay(Duration),
    /// Bytes read are discarded; the connection stays open and end-of-stream
    /// still passes. On a byte stream this corrupts the framing of whatever
    /// protocol runs over it: the receiver must treat the stream as broken.
    /// Meant for whole-connection loss (set `Drop`, then [`FaultProxy::reset_all`])
    /// or for checking that a receiver detects garbage/truncation, not as a
    /// model of lost packets (TCP would retransmit those).
    Drop,
    /// Bytes are read and held, nothing is delivered, the connection stays
    /// open (a partition: the sender sees no error, the receiver silence).
    /// Switching a direction from `Blackhole` to any other mode DISCARDS
    /// what was held and resets every connection open at that moment:
    /// a real partition loses the data in flight, and delivering it late
    /// after the heal would let a test pass on traffic that no real network
    /// would deliver. Both ends see their connection fail and reconnect.
    Blackhole,
}

#[derive(Default)]
struct Counters {
    forwarded: [AtomicU64; 2],
    dropped: [AtomicU64; 2],
    blackholed: [AtomicU64; 2],
    accepted: AtomicU64,
    refused: AtomicU64,
    upstream_failures: AtomicU64,
}

/// One proxied connection: the client's socket and, once connected, the
/// upstream's. Cutting it shuts both down, which wakes any pump blocked in
/// `read` or `write` on them.
struct Link {
    client: TcpStream,
    server: Option<TcpStream>,
    cut: AtomicBool,
    /// Pumps still running; the last one out removes the link.
    pumps: AtomicUsize,
}

impl Link {
    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(s) = &self.server {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}

struct State {
    upstream: SocketAddr,
    modes: [Mode; 2],
    refuse: bool,
    links: Vec<Arc<Link>>,
}

struct Shared {
    state: Mutex<State>,
    counters: Counters,
    stop: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panicking pump must not take the whole test down with a
        // poisoned lock; the state stays consistent (plain assignments).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spawn(self: &Arc<Self>, f: impl FnOnce() + Send + 'static) {
        let h = thread::spawn(f);
        let mut t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|h| !h.is_finished());
        t.push(h);
    }

    fn remove(&self, link: &Arc<Link>) {
        self.state().links.retain(|l| !Arc::ptr_eq(l, link));
    }
}

/// A TCP proxy with switchable faults, listening on 127.0.0.1:0. Dropping
/// it closes its listener and every connection, and joins its threads.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    listener: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy towards `upstream`, both directions `Pass`.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind fault proxy");
        FaultProxy::start_on(l, upstream)
    }

    /// [`FaultProxy::start`] on a listener the caller bound (a port it
    /// chose: a cluster node dials its peer's shard g at port + g).
    pub fn start_on(l: TcpListener, upstream: SocketAddr) -> FaultProxy {
        let addr = l.local_addr().expect("fault proxy address");
        l.set_nonblocking(true).expect("nonblocking listener");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                upstream,
                modes: [Mode::Pass; 2],
                refuse: false,
                links: Vec::new(),
            }),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
        });
        let sh = shared.clone();
        let listener = thread::spawn(move || accept_loop(l, sh));
        FaultProxy {
            addr,
            shared,
            listener: Some(listener),
        }
    }

    /// The address to dial instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// New connections go to `upstream`; open ones stay where they are.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        self.shared.state().upstream = upstream;
    }

    pub fn upstream(&self) -> SocketAddr {
        self.shared.state().upstream
    }

    /// Sets the mode of one direction (or both). Leaving `Blackhole` resets
    /// every open connection and discards what it held (see [`Mode::Blackhole`]).
    pub fn set_mode(&self, dir: Dir, mode: Mode) {
        let mut st = self.shared.state();
        let leaves_blackhole = dir
            .indices()
            .iter()
            .any(|&i| st.modes[i] == Mode::Blackhole && mode != Mode::Blackhole);
        if leaves_blackhole {
            // Cut before the mode changes, under the same lock: a pump that
            // sees the new mode (it reads it under this lock) finds its
            // link already cut and its sockets shut down, so no held or
            // queued byte gets out after the heal.
            for l in &st.links {
                l.cut();
            }
        }
        for &i in dir.indices() {
            st.modes[i] = mode;
        }
    }

    pub fn set_mode_both(&self, mode: Mode) {
        self.set_mode(Dir::Both, mode);
    }

    /// The current modes, (forward, back).
    pub fn modes(&self) -> (Mode, Mode) {
        let st = self.shared.state();
        (st.modes[0], st.modes[1])
    }

    /// Blackholes both directions: nothing flows, connections stay open.
    /// Connections accepted while both directions are blackholed are held
    /// without dialing the upstream (a real partition lets no SYN through);
    /// their bytes stay in the kernel and are not counted as blackholed.
    pub fn partition(&self) {
        self.set_mode_both(Mode::Blackhole);
    }

    /// Both directions `Pass`; connections that were blackholed are reset
    /// so both ends reconnect cleanly.
    pub fn heal(&self) {
        self.set_mode_both(Mode::Pass);
    }

    /// Closes every current connection (both sockets shut down): a link
    /// failure. Modes are unchanged; new connections are proxied as usual.
    pub fn reset_all(&self) {
        for l in &self.shared.state().links {
            l.cut();
        }
    }

    /// While true, new connections are accepted and closed at once (the
    /// client sees its connect succeed and then end-of-stream or a reset).
    /// Open connections are not touched.
    pub fn refuse(&self, on: bool) {
        self.shared.state().refuse = on;
    }

    /// Bytes delivered in `dir` (written to the far side).
    pub fn bytes_forwarded(&self, dir: Dir) -> u64 {
        self.sum(&self.shared.counters.forwarded, dir)
    }

    /// Bytes discarded under `Mode::Drop` in `dir`.
    pub fn bytes_dropped(&self, dir: Dir) -> u64 {
        self.sum(&self.shared.counters.dropped, dir)
    }

    /// Bytes read while `dir` was blackholed (never delivered).
    pub fn bytes_blackholed(&self, dir: Dir) -> u64 {
        self.sum(&self.shared.counters.blackholed, dir)
    }

    /// Connections accepted and proxied (refused ones not counted).
    pub fn connections_accepted(&self) -> u64 {
        self.shared.counters.accepted.load(Ordering::SeqCst)
    }

    /// Connections closed at once because of [`FaultProxy::refuse`].
    pub fn connections_refused(&self) -> u64 {
        self.shared.counters.refused.load(Ordering::SeqCst)
    }

    /// Accepted connections whose upstream connect failed (closed at once).
    pub fn upstream_failures(&self) -> u64 {
        self.shared
            .counters
            .upstream_failures
            .load(Ordering::SeqCst)
    }

    /// Connections currently open through the proxy.
    pub fn open_connections(&self) -> usize {
        self.shared.state().links.len()
    }

    fn sum(&self, c: &[AtomicU64; 2], dir: Dir) -> u64 {
        dir.indices()
            .iter()
            .map(|&i| c[i].load(Ordering::SeqCst))
            .sum()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // The listener thread owns the listening socket: joined, the port
        // is free.
        if let Some(h) = self.listener.take() {
            let _ = h.join();
        }
        self.reset_all();
        // Pump threads start others (the back pump), so drain until empty.
        loop {
            let hs: Vec<_> = std::mem::take(
                &mut *self
                    .shared
                    .threads
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            if hs.is_empty() {
                break;
            }
            for h in hs {
                let _ = h.join();
            }
            // A connection set up while the loop above ran is cut here.
            self.reset_all();
        }
    }
}

/// Waits (bounded) until `cond` holds; panics with `what` after `bound`.
/// For tests: wait on the proxy's counters instead of sleeping.
pub fn poll_until(what: &str, bound: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + bound;
    while !cond() {
        if Instant::now() > end {
            panic!("not within {bound:?}: {what}");
        }
        thread::sleep(Duration::from_millis(2));
    }
}

fn accept_loop(l: TcpListener, sh: Arc<Shared>) {
    while !sh.stop.load(Ordering::SeqCst) {
        let client = match l.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                thread::sleep(POLL);
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // ECONNABORTED and the like: that client is gone, keep serving.
            Err(_) => {
                thread::sleep(POLL);
                continue;
            }
        };
        let (refuse, upstream, held) = {
            let st = sh.state();
            (
                st.refuse,
                st.upstream,
                st.modes == [Mode::Blackhole, Mode::Blackhole],
            )
        };
        if refuse {
            sh.counters.refused.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        // Accepted sockets do not inherit O_NONBLOCK on Linux; say so
        // anyway, the pumps rely on blocking reads with timeouts.
        let _ = client.set_nonblocking(false);
        let _ = client.set_nodelay(true);
        if held {
            hold(client, &sh);
            continue;
        }
        let sh2 = sh.clone();
        sh.spawn(move || connect_and_pump(client, upstream, sh2));
    }
}

/// A connection made during a full partition: kept open, upstream never
/// dialed, cut by the heal (leaving Blackhole) like every other link.
fn hold(client: TcpStream, sh: &Arc<Shared>) {
    let link = Arc::new(Link {
        client,
        server: None,
        cut: AtomicBool::new(false),
        pumps: AtomicUsize::new(0),
    });
    sh.counters.accepted.fetch_add(1, Ordering::SeqCst);
    let mut st = sh.state();
    if st.modes == [Mode::Blackhole, Mode::Blackhole] {
        st.links.push(link.clone());
        drop(st);
        // Nothing reads this link, so no pump would notice its cut and
        // remove it: a small watcher does.
        let sh2 = sh.clone();
        sh.spawn(move || {
            while !link.is_cut() && !sh2.stop.load(Ordering::SeqCst) {
                thread::sleep(POLL);
            }
            link.cut();
            sh2.remove(&link);
        });
    } else {
        // Healed between the accept and here: the heal cut the links open
        // then, so this one is cut too.
        drop(st);
        link.cut();
    }
}

fn connect_and_pump(client: TcpStream, upstream: SocketAddr, sh: Arc<Shared>) {
    let server = match TcpStream::connect_timeout(&upstream, CONNECT_TIMEOUT) {
        Ok(s) => s,
        Err(_) => {
            // The node is down: the client sees its connection end, as it
            // would see a refused connect without the proxy.
            sh.counters.upstream_failures.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let clones = (|| {
        Some((
            client.try_clone().ok()?,
            server.try_clone().ok()?,
            client.try_clone().ok()?,
            server.try_clone().ok()?,
        ))
    })();
    let Some((c_fwd, s_fwd, c_back, s_back)) = clones else {
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
        return;
    };
    let link = Arc::new(Link {
        client,
        server: Some(server),
        cut: AtomicBool::new(false),
        pumps: AtomicUsize::new(2),
    });
    {
        let mut st = sh.state();
        if sh.stop.load(Ordering::SeqCst) {
            drop(st);
            link.cut();
            return;
        }
        st.links.push(link.clone());
    }
    sh.counters.accepted.fetch_add(1, Ordering::SeqCst);
    let (sh2, link2) = (sh.clone(), link.clone());
    sh.spawn(move || pump(s_back, c_back, 1, link2, sh2));
    pump(c_fwd, s_fwd, 0, link, sh);
}

/// Copies `from` to `to` for direction `d` (0 forward, 1 back) under the
/// direction's current mode, until end-of-stream, an error or a cut.
fn pump(mut from: TcpStream, mut to: TcpStream, d: usize, link: Arc<Link>, sh: Arc<Shared>) {
    let mut buf = vec![0u8; 16 * 1024];
    // Chunks read under Pass or Delay, with the time each may be delivered.
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    // Bytes read under Blackhole: never delivered (leaving Blackhole cuts
    // the link); kept only to model a full path and to cap reading.
    let mut held = 0usize;
    let mut eof = false;
    let c = &sh.counters;
    'run: loop {
        if link.is_cut() || sh.stop.load(Ordering::SeqCst) {
            break;
        }
        let mode = sh.state().modes[d];
        if link.is_cut() {
            break;
        }
        if mode != Mode::Blackhole {
            let now = Instant::now();
            while queue.front().is_some_and(|(due, _)| *due <= now) {
                let (_, chunk) = queue.pop_front().expect("front checked");
                if to.write_all(&chunk).is_err() {
                    break 'run;
                }
                c.forwarded[d].fetch_add(chunk.len() as u64, Ordering::SeqCst);
            }
            if eof && queue.is_empty() {
                // Pass the half-close on; the other direction carries on.
                let _ = to.shutdown(Shutdown::Write);
                finish(&link, &sh, false);
                return;
            }
        }
        let wait = match queue.front() {
            Some((due, _)) if mode != Mode::Blackhole => due
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), POLL),
            _ => POLL,
        };
        if eof || (mode == Mode::Blackhole && held >= HOLD_CAP) {
            // Nothing to read (end-of-stream seen, or the hold is full and
            // the sender should feel the back-pressure).
            thread::sleep(wait);
            continue;
        }
        let _ = from.set_read_timeout(Some(wait));
        let n = match from.read(&mut buf) {
            Ok(0) => {
                eof = true;
                continue;
            }
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(_) => break,
        };
        let now = Instant::now();
        // The mode that applies is the one set when the bytes were read.
        match sh.state().modes[d] {
            Mode::Pass => queue.push_back((now, buf[..n].to_vec())),
            Mode::Delay(by) => queue.push_back((now + by, buf[..n].to_vec())),
            Mode::Drop => {
                c.dropped[d].fetch_add(n as u64, Ordering::SeqCst);
            }
            Mode::Blackhole => {
                held += n;
                c.blackholed[d].fetch_add(n as u64, Ordering::SeqCst);
            }
        }
    }
    finish(&link, &sh, true);
}

/// A pump is done: on an error or cut the whole link goes down; the last
/// pump out removes the link from the proxy's list.
fn finish(link: &Arc<Link>, sh: &Shared, failed: bool) {
    if failed {
        link.cut();
    }
    if link.pumps.fetch_sub(1, Ordering::SeqCst) == 1 {
        link.cut();
        sh.remove(link);
    }
}
