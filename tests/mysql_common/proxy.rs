//! A TCP proxy between the library and `mariadbd` that injects faults,
//! per connection: stall (hold the bytes, forward nothing, keep both sockets
//! open: a hung connection that still looks open), black-hole (read and
//! drop everything), reset (RST to the client, FIN to the server), and
//! inject (run one statement on the session behind the client's back and
//! swallow its answer).
//!
//! Each proxied connection is found by its MySQL session id, read from the
//! server's greeting.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::LIVENESS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Both directions hold what they read.
    Stall,
    /// Only client→server holds (answers still arrive).
    StallUp,
    BlackHole,
}

pub struct Proxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: SocketAddr,
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
}

struct State {
    conns: Vec<Arc<Link>>,
    new_mode: Mode,
}

/// One proxied connection.
pub struct Link {
    client: TcpStream,
    server: TcpStream,
    /// Guarded by `Shared::state`'s condvar protocol: read under `mode`.
    mode: Mutex<Mode>,
    session: OnceLock<u64>,
    /// Client→server bytes read while stalled (and not forwarded yet).
    held_c2s: AtomicUsize,
    /// Server→client bytes read while stalled (and not forwarded yet).
    held_s2c: AtomicUsize,
    /// Server packets still to swallow (answers to injected statements).
    swallow: AtomicUsize,
    server_write: Mutex<()>,
    closed: AtomicBool,
}

impl Link {
    pub fn session(&self) -> Option<u64> {
        self.session.get().copied()
    }

    pub fn held_c2s(&self) -> usize {
        self.held_c2s.load(Ordering::SeqCst)
    }

    pub fn held_s2c(&self) -> usize {
        self.held_s2c.load(Ordering::SeqCst)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("proxy state lock")
    }
}

impl Proxy {
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            upstream,
            state: Mutex::new(State {
                conns: Vec::new(),
                new_mode: Mode::Pass,
            }),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(s.upstream) else {
                    continue; // the client sees its connection close
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let mode = s.lock().new_mode;
                let link = Arc::new(Link {
                    client,
                    server,
                    mode: Mutex::new(mode),
                    session: OnceLock::new(),
                    held_c2s: AtomicUsize::new(0),
                    held_s2c: AtomicUsize::new(0),
                    swallow: AtomicUsize::new(0),
                    server_write: Mutex::new(()),
                    closed: AtomicBool::new(false),
                });
                s.lock().conns.push(Arc::clone(&link));
                for c2s in [true, false] {
                    let (s, link) = (Arc::clone(&s), Arc::clone(&link));
                    std::thread::spawn(move || pump(&s, &link, c2s));
                }
            }
        });
        Proxy { addr, shared }
    }

    /// The mode of connections accepted from now on.
    pub fn set_new_mode(&self, mode: Mode) {
        self.shared.lock().new_mode = mode;
    }

    /// The proxied connection of MySQL session `id` (waits for its greeting).
    pub fn link(&self, id: u64) -> Arc<Link> {
        let end = Instant::now() + LIVENESS;
        loop {
            if let Some(l) = self
                .shared
                .lock()
                .conns
                .iter()
                .find(|l| l.session() == Some(id))
            {
                return Arc::clone(l);
            }
            assert!(
                Instant::now() < end,
                "no proxied connection for session {id}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn links(&self) -> Vec<Arc<Link>> {
        self.shared.lock().conns.clone()
    }

    pub fn set_mode(&self, link: &Link, mode: Mode) {
        let _st = self.shared.lock();
        *link.mode.lock().expect("mode lock") = mode;
        self.shared.changed.notify_all();
    }

    /// Every current connection (new ones keep `set_new_mode`'s mode).
    pub fn set_all(&self, mode: Mode) {
        for l in self.links() {
            self.set_mode(&l, mode);
        }
    }

    /// Sends the client an RST (and the server a FIN).
    pub fn reset(&self, link: &Link) {
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: passes a live linger struct and its exact size.
        unsafe {
            libc::setsockopt(
                link.client.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
        link.closed.store(true, Ordering::SeqCst);
        // The server sees a FIN (its session ends); this also wakes the
        // server-side pump.
        let _ = link.server.shutdown(Shutdown::Both);
        // SHUT_RD sends the client nothing; it only wakes the client-side
        // pump. Then the client socket's only descriptor is replaced by
        // /dev/null: that close, with linger 0, is what the client sees, an
        // RST, whoever still holds this link.
        let _ = link.client.shutdown(Shutdown::Read);
        let null = std::fs::File::open("/dev/null").expect("open /dev/null");
        // SAFETY: dup2 onto the client socket's descriptor, which stays
        // owned by `link.client` (it now refers to /dev/null until dropped).
        unsafe {
            libc::dup2(null.as_raw_fd(), link.client.as_raw_fd());
        }
        let mut st = self.shared.lock();
        st.conns.retain(|l| !std::ptr::eq(l.as_ref(), link));
        self.shared.changed.notify_all();
    }

    /// Waits until a stall holds bytes in either direction: a request (or
    /// its answer) is in flight and stuck.
    pub fn wait_held(&self, link: &Link) {
        super::wait_until("the proxy holds a request or its answer", || {
            link.held_c2s() + link.held_s2c() > 0
        });
    }

    /// Runs `sql` on the session behind the client's back (the client must
    /// be idle) and swallows its one-packet answer (use `DO ...`).
    pub fn inject(&self, link: &Link, sql: &str) {
        let mut packet = Vec::with_capacity(5 + sql.len());
        let len = 1 + sql.len();
        packet.extend_from_slice(&(len as u32).to_le_bytes()[..3]);
        packet.push(0); // sequence id: a new command
        packet.push(0x03); // COM_QUERY
        packet.extend_from_slice(sql.as_bytes());
        link.swallow.fetch_add(1, Ordering::SeqCst);
        {
            let _w = link.server_write.lock().expect("server write lock");
            (&link.server)
                .write_all(&packet)
                .expect("inject the statement");
        }
        super::wait_until("the injected statement was answered", || {
            link.swallow.load(Ordering::SeqCst) == 0
        });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees `stop`.
        let _ = TcpStream::connect(self.addr);
        let links = std::mem::take(&mut self.shared.lock().conns);
        for l in links {
            l.close();
        }
        self.shared.changed.notify_all();
    }
}

/// The server's greeting: [len:3][seq:1] 10, version\0, connection id (u32 LE).
fn greeting_session(payload: &[u8]) -> Option<u64> {
    let rest = payload.get(1..)?;
    let nul = rest.iter().position(|&b| b == 0)?;
    let id = rest.get(nul + 1..nul + 5)?;
    Some(u64::from(u32::from_le_bytes(id.try_into().ok()?)))
}

/// Splits complete packets off the front of `buf`: `Some(packet_len)`.
fn packet_len(buf: &[u8]) -> Option<usize> {
    if buf.len() < 4 {
        return None;
    }
    let len = usize::from(buf[0]) | usize::from(buf[1]) << 8 | usize::from(buf[2]) << 16;
    (buf.len() >= 4 + len).then_some(4 + len)
}

fn pump(shared: &Shared, link: &Link, c2s: bool) {
    let (mut from, mut to) = if c2s {
        (&link.client, &link.server)
    } else {
        (&link.server, &link.client)
    };
    let mut buf = vec![0u8; 16 * 1024];
    // Server→client only: bytes not yet forwarded while the greeting or a
    // swallowed answer is incomplete.
    let mut partial: Vec<u8> = Vec::new();
    let mut greeted = false;
    'outer: loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        {
            let mut st = shared.lock();
            let mut counted = false;
            loop {
                if link.closed.load(Ordering::SeqCst) {
                    return;
                }
                let mode = *link.mode.lock().expect("mode lock");
                let held = if c2s { &link.held_c2s } else { &link.held_s2c };
                match mode {
                    Mode::Pass => break,
                    Mode::StallUp if !c2s => break,
                    Mode::BlackHole => {
                        if counted {
                            held.fetch_sub(n, Ordering::SeqCst);
                        }
                        continue 'outer;
                    }
                    Mode::Stall | Mode::StallUp => {
                        if !counted {
                            held.fetch_add(n, Ordering::SeqCst);
                            counted = true;
                        }
                        st = shared.changed.wait(st).expect("proxy state lock");
                    }
                }
            }
            if counted {
                let held = if c2s { &link.held_c2s } else { &link.held_s2c };
                held.fetch_sub(n, Ordering::SeqCst);
            }
        }
        let out: Vec<u8> = if c2s {
            buf[..n].to_vec()
        } else {
            partial.extend_from_slice(&buf[..n]);
            let mut out = Vec::new();
            loop {
                if !greeted {
                    let Some(len) = packet_len(&partial) else {
                        break;
                    };
                    if let Some(id) = greeting_session(&partial[4..len]) {
                        let _ = link.session.set(id);
                    }
                    greeted = true;
                    out.extend(partial.drain(..len));
                } else if link.swallow.load(Ordering::SeqCst) > 0 {
                    let Some(len) = packet_len(&partial) else {
                        break;
                    };
                    partial.drain(..len);
                    link.swallow.fetch_sub(1, Ordering::SeqCst);
                } else {
                    out.append(&mut partial);
                    break;
                }
            }
            out
        };
        if out.is_empty() {
            continue;
        }
        let written = if c2s {
            let _w = link.server_write.lock().expect("server write lock");
            to.write_all(&out)
        } else {
            to.write_all(&out)
        };
        if written.is_err() {
            break;
        }
    }
    if !link.closed.load(Ordering::SeqCst) {
        link.close();
    }
    let mut st = shared.lock();
    st.conns.retain(|l| !std::ptr::eq(l.as_ref(), link));
}
