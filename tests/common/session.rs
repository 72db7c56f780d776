//! Session helpers shared by the suites that drive `ringlock::client::Session`
//! against the real server (tests/session_client.rs, tests/conformance.rs).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use super::Server;
use ringlock::client::{Client, KeyInfo, RetryPolicy, Session};
use ringlock::protocol::session::{self as wire, Decoded, Status, Welcome};

pub fn session(addr: SocketAddr) -> Session {
    Session::builder(addr)
        .retry(RetryPolicy::none())
        .connect()
        .expect("session opens")
}

pub fn keyx(s: &Server) -> Vec<KeyInfo> {
    Client::builder(s.lock_addr)
        .admin_addr(s.admin_addr)
        .build()
        .expect("client")
        .keyx()
        .expect("KEYX")
}

pub fn holder_of(s: &Server, key: &str) -> Option<KeyInfo> {
    keyx(s).into_iter().find(|k| k.key == key.as_bytes())
}

/// Waits (bounded) until `cond` holds; the bound only turns a hang into a
/// failure.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..5_000 {
        if cond() {
            return;
        }
        thread::sleep(Duration::from_millis(2));
    }
    panic!("never: {what}");
}

pub type Gate = Arc<(Mutex<bool>, Condvar)>;

/// A TCP proxy between a session and the server that can stall either
/// direction (the connection stays open, nothing gets through until it is
/// resumed) and counts the session requests it forwards to the server, by
/// op.
pub struct Proxy {
    pub addr: SocketAddr,
    pub up: Gate,
    pub down: Gate,
    ops: Arc<Mutex<Vec<u8>>>,
}

impl Proxy {
    pub fn new(upstream: SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = l.local_addr().expect("proxy addr");
        let up: Gate = Default::default();
        let down: Gate = Default::default();
        let ops = Arc::new(Mutex::new(Vec::new()));
        let (u, d, o) = (up.clone(), down.clone(), ops.clone());
        thread::spawn(move || {
            for client in l.incoming() {
                let Ok(client) = client else { return };
                let server = TcpStream::connect(upstream).expect("proxy connects upstream");
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (u, d, o) = (u.clone(), d.clone(), o.clone());
                thread::spawn(move || pump(client, server, u, Some(o)));
                thread::spawn(move || pump(s2, c2, d, None));
            }
        });
        Proxy {
            addr,
            up,
            down,
            ops,
        }
    }

    pub fn set(gate: &Gate, stalled: bool) {
        *gate.0.lock().unwrap() = stalled;
        gate.1.notify_all();
    }

    pub fn stall(&self) {
        Proxy::set(&self.up, true);
        Proxy::set(&self.down, true);
    }

    pub fn count(&self, op: u8) -> usize {
        self.ops
            .lock()
            .unwrap()
            .iter()
            .filter(|&&o| o == op)
            .count()
    }
}

/// Copies `from` to `to`; while the gate is closed, holds what it read.
/// Records the op of every session frame it forwards when `ops` is given
/// (client to server).
fn pump(mut from: TcpStream, mut to: TcpStream, gate: Gate, ops: Option<Arc<Mutex<Vec<u8>>>>) {
    let mut chunk = [0u8; 4096];
    let mut seen = Vec::new();
    loop {
        let n = match from.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        {
            let (m, cv) = &*gate;
            let mut stalled = m.lock().unwrap();
            while *stalled {
                stalled = cv.wait(stalled).unwrap();
            }
        }
        if let Some(ops) = &ops {
            seen.extend_from_slice(&chunk[..n]);
            while let Decoded::Frame { op, len, .. } = wire::decode(&seen) {
                ops.lock().unwrap().push(op);
                seen.drain(..len);
            }
        }
        if to.write_all(&chunk[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// The welcome of a scripted server (session 7, one shard) with `flags`.
pub fn scripted(flags: u8) -> Welcome {
    Welcome {
        status: Status::Ok,
        version: wire::VERSION,
        keepalive_ms: 10_000,
        min_ttl_ms: 100,
        max_ttl_ms: 60_000,
        session_id: 7,
        max_keys: 1000,
        max_waiters: 1000,
        shards: 1,
        flags,
    }
}

/// A scripted session server on 127.0.0.1 for one connection, for what no
/// real `ringlockd` shows any more (every one offers lock modes): it
/// answers the Hello with a welcome of `flags` (without
/// [`wire::FLAG_MODES`]: a ringlockd older than lock modes) and every
/// later request `ok` (an Acquire with a grant, so a client that sent one
/// would hold the key). The handle returns the op of every request after
/// the Hello, once the client closed (or after a minute of silence).
pub fn scripted_welcome(flags: u8) -> (SocketAddr, thread::JoinHandle<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let (mut buf, mut ops, mut token) = (Vec::new(), Vec::new(), 0u64);
        let mut chunk = [0u8; 4096];
        loop {
            while let Decoded::Frame { op, rid, len, .. } = wire::decode(&buf) {
                buf.drain(..len);
                let mut out = Vec::new();
                if op == wire::OP_HELLO {
                    wire::encode_welcome(rid, &scripted(flags), &mut out);
                } else {
                    ops.push(op);
                    token += 1;
                    wire::encode_reply(rid, Status::Ok, token, wire::NO_TTL, &mut out);
                }
                let _ = s.write_all(&out);
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return ops,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    });
    (addr, h)
}
