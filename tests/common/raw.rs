//! A session client of raw frames (`ringlock::protocol::session`'s codec
//! over a plain TCP socket): for suites that check the wire itself, frame
//! by frame, with nothing of the client library between.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ringlock::protocol::session::{self as sp, Access, Answer, HoldMode, Req, Status};

pub struct RawSession {
    pub s: TcpStream,
    buf: Vec<u8>,
    next: u32,
    /// The welcome's flags.
    pub flags: u8,
}

impl RawSession {
    /// Opens a session (Hello, server-default keep-alive).
    pub fn open(addr: SocketAddr) -> RawSession {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut x = RawSession {
            s,
            buf: Vec::new(),
            next: 2,
            flags: 0,
        };
        let rid = x.send(&Req::Hello {
            version: sp::VERSION,
            keepalive_ms: 0,
            auth: b"",
        });
        match x.read_hello(rid) {
            Answer::Welcome { welcome, .. } => {
                assert_eq!(welcome.status, Status::Ok);
                x.flags = welcome.flags;
            }
            other => panic!("hello answered {other:?}"),
        }
        x
    }

    /// Sends a request under the next rid; returns the rid.
    pub fn send(&mut self, req: &Req<'_>) -> u32 {
        let rid = self.next;
        self.next += 1;
        let mut b = Vec::new();
        sp::encode(rid, req, &mut b);
        self.s.write_all(&b).expect("send");
        rid
    }

    fn read_hello(&mut self, rid: u32) -> Answer {
        self.read_with(Some(rid))
    }

    /// The next answer or push (bounded by the read timeout).
    pub fn read(&mut self) -> Answer {
        self.read_with(None)
    }

    fn read_with(&mut self, hello: Option<u32>) -> Answer {
        loop {
            if let Some((a, n)) = sp::decode_answer(&self.buf, hello).expect("well-formed answer") {
                self.buf.drain(..n);
                return a;
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => panic!("connection closed"),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// The next answer, which must be the Reply to `rid`: `(status, token)`.
    pub fn reply(&mut self, rid: u32) -> (Status, u64) {
        match self.read() {
            Answer::Reply {
                rid: r,
                status,
                token,
                ..
            } => {
                assert_eq!(r, rid, "answers in the order they were decided");
                (status, token)
            }
            other => panic!("expected the reply to {rid}, got {other:?}"),
        }
    }

    pub fn acquire_send(
        &mut self,
        key: &str,
        hold: HoldMode,
        ttl_ms: u32,
        access: Access,
        wait_ms: u32,
    ) -> u32 {
        self.send(&Req::Acquire {
            hold,
            ttl_ms,
            wait_ms,
            key: key.as_bytes(),
            source: b"raw",
            access,
        })
    }

    /// A session hold of `key`, waiting up to `wait_ms`.
    pub fn acquire(&mut self, key: &str, access: Access, wait_ms: u32) -> (Status, u64) {
        let rid = self.acquire_send(key, HoldMode::Session, 0, access, wait_ms);
        self.reply(rid)
    }

    pub fn release(&mut self, key: &str, token: u64) -> Status {
        let rid = self.send(&Req::Release {
            token,
            key: key.as_bytes(),
        });
        self.reply(rid).0
    }
}
