//! ringlockd's session protocol (`docs/protocol.md`, "Sessions"): a Hello
//! opens the session, then Acquire (hold = session) and Release naming the
//! token the grant returned. The frames are encoded and decoded by the
//! server's own codec, `ringlock::protocol::session`, so the load
//! generator cannot drift from the wire format.
//!
//! One request is outstanding at a time (the engine runs one cycle per
//! client), so a reply must carry the request id of the last request sent.
//! A Lost push (an operator reset of our hold) is skipped: the Release that
//! follows it is answered "stale token", which the engine counts as
//! `not_held`.

use ringlock::protocol::session::{
    decode_answer, encode, Answer, HoldMode, Req, Status, VERSION, WAIT_FOREVER,
};

use super::{Codec, Op, Reply};
use crate::config::Access;

pub struct SessionLock {
    source: Vec<u8>,
    /// Asked for in the Hello; the server clamps it to its bounds. Every
    /// request renews the deadline, so a client idle (or holding) longer
    /// than this loses its session and reconnects for the next request.
    keepalive_ms: u32,
    /// The next request id; never 0 (Lost pushes carry 0).
    next_rid: u32,
    /// The request id whose reply is due.
    expect_rid: u32,
    /// The token of the grant this client holds, 0 when none. Kept across
    /// reconnects: the Release of a hold whose session ended is answered
    /// "stale token", which is what happened to it.
    token: u64,
    /// How each Acquire asks for its key (`--access`).
    access: Access,
}

impl SessionLock {
    pub fn new(source: Vec<u8>, keepalive_ms: u32, access: Access) -> SessionLock {
        assert!(source.len() <= 127, "session sources are at most 127 bytes");
        SessionLock {
            source,
            keepalive_ms,
            access,
            next_rid: 1,
            expect_rid: 0,
            token: 0,
        }
    }

    fn rid(&mut self) -> u32 {
        let rid = self.next_rid;
        self.next_rid = self.next_rid.checked_add(1).unwrap_or(1);
        self.expect_rid = rid;
        rid
    }
}

impl Codec for SessionLock {
    fn start_connection(&mut self, out: &mut Vec<u8>) -> bool {
        self.next_rid = 1;
        let rid = self.rid();
        encode(
            rid,
            &Req::Hello {
                version: VERSION,
                keepalive_ms: self.keepalive_ms,
                // ringlockd without --auth-token-file takes none.
                auth: b"",
            },
            out,
        );
        true
    }

    fn handshake(&mut self, buf: &mut Vec<u8>, _out: &mut Vec<u8>) -> Result<bool, String> {
        let Some((answer, n)) = decode_answer(buf, Some(self.expect_rid))? else {
            return Ok(false);
        };
        buf.drain(..n);
        match answer {
            Answer::Welcome { welcome, .. } if welcome.status == Status::Ok => {
                if welcome.version != VERSION {
                    return Err(format!(
                        "Hello answered protocol version {} (this load generator speaks {VERSION})",
                        welcome.version
                    ));
                }
                Ok(true)
            }
            Answer::Welcome { welcome, .. } => {
                Err(format!("Hello refused: {}", welcome.status.name()))
            }
            Answer::Reply {
                status: Status::TlsRequired,
                ..
            } => Err(
                "Hello refused: tls_required (the server takes sessions over TLS only: \
                 --tls-certs-dir)"
                    .into(),
            ),
            Answer::Reply { status, .. } => Err(format!(
                "Hello answered {} without a welcome: the server does not speak sessions",
                status.name()
            )),
            Answer::Lost { .. } => Err("Lost pushed before the Hello was answered".into()),
            Answer::Held { .. } => Err("a Held frame answered the Hello".into()),
            Answer::Event { .. } | Answer::OtherEvent { .. } => {
                Err("an Event frame answered the Hello".into())
            }
            Answer::Refused { status, detail, .. } => Err(format!(
                "Hello refused: {} (detail {detail:?}; this load generator speaks version {VERSION})",
                status.name()
            )),
        }
    }

    fn encode(&mut self, op: Op, key: &[u8], out: &mut Vec<u8>) {
        let rid = self.rid();
        let req = match op {
            Op::Lock | Op::TryLock => Req::Acquire {
                hold: HoldMode::Session,
                ttl_ms: 0,
                wait_ms: if op == Op::Lock { WAIT_FOREVER } else { 0 },
                key,
                source: &self.source,
                access: self.access,
            },
            Op::Unlock => Req::Release {
                token: self.token,
                key,
            },
        };
        encode(rid, &req, out);
    }

    fn decode(&mut self, op: Op, buf: &mut Vec<u8>) -> Result<Option<Reply>, String> {
        loop {
            let Some((answer, n)) = decode_answer(buf, None)? else {
                return Ok(None);
            };
            buf.drain(..n);
            let (rid, status, token) = match answer {
                Answer::Lost { .. } => continue,
                Answer::Reply {
                    rid, status, token, ..
                } => (rid, status, token),
                Answer::Welcome { .. } => return Err("a second Hello reply".into()),
                Answer::Held { .. } => return Err("a Held frame outside a Resume".into()),
                Answer::Event { .. } | Answer::OtherEvent { .. } => {
                    return Err("an Event frame, and no watch".into())
                }
                Answer::Refused { status, .. } => {
                    return Err(format!("the server refused the session: {}", status.name()))
                }
            };
            if rid != self.expect_rid {
                return Err(format!(
                    "reply to request {rid} while request {} was outstanding",
                    self.expect_rid
                ));
            }
            let reply = match (op, status) {
                (Op::Lock | Op::TryLock, Status::Ok) => {
                    self.token = token;
                    Reply::Granted
                }
                (Op::TryLock, Status::Busy) => Reply::Busy,
                (Op::Unlock, Status::Ok) => {
                    self.token = 0;
                    Reply::Released
                }
                (Op::Unlock, Status::Stale | Status::NotOwner) => {
                    self.token = 0;
                    Reply::NotHeld
                }
                (_, st) => Reply::Error(format!("server answered {}", st.name())),
            };
            return Ok(Some(reply));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlock::protocol::session::{
        encode_lost, encode_reply, encode_welcome, LostWhy, Welcome,
    };

    fn welcome(rid: u32, status: Status) -> Vec<u8> {
        let mut b = Vec::new();
        encode_welcome(
            rid,
            &Welcome {
                status,
                version: VERSION,
                keepalive_ms: 10_000,
                min_ttl_ms: 10,
                max_ttl_ms: 60_000,
                session_id: 3,
                max_keys: 1000,
                max_waiters: 1000,
                shards: 1,
                flags: 0,
            },
            &mut b,
        );
        b
    }

    #[test]
    fn frames_match_the_documented_layout() {
        let mut c = SessionLock::new(b"lg0".to_vec(), 30_000, Access::Exclusive);
        let mut out = Vec::new();
        assert!(
            c.start_connection(&mut out),
            "a Hello must be answered first"
        );
        // [op 7][rid 1][bodyLen 5][version 1][keepalive_ms 30000]
        assert_eq!(out, [7, 1, 0, 0, 0, 5, 0, 1, 0x30, 0x75, 0, 0]);
        let mut buf = welcome(1, Status::Ok);
        assert_eq!(c.handshake(&mut buf, &mut out), Ok(true));
        assert!(buf.is_empty());

        out.clear();
        c.encode(Op::TryLock, b"k", &mut out);
        // [op 8][rid 2][bodyLen 15][hold 1][ttl 0][wait 0][1 "k"][3 "lg0"]
        assert_eq!(
            out,
            [8, 2, 0, 0, 0, 15, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, b'k', 3, b'l', b'g', b'0']
        );
        out.clear();
        c.encode(Op::Lock, b"k", &mut out);
        assert_eq!(
            &out[12..16],
            &WAIT_FOREVER.to_le_bytes(),
            "Lock waits forever"
        );
    }

    #[test]
    fn release_names_the_granted_token() {
        let mut c = SessionLock::new(b"s".to_vec(), 0, Access::Exclusive);
        let mut out = Vec::new();
        c.start_connection(&mut out);
        c.handshake(&mut welcome(1, Status::Ok), &mut out)
            .expect("welcome");
        out.clear();
        c.encode(Op::Lock, b"key", &mut out);
        let mut buf = Vec::new();
        encode_reply(2, Status::Ok, 0x0102_0304_0506_0708, u32::MAX, &mut buf);
        assert_eq!(c.decode(Op::Lock, &mut buf), Ok(Some(Reply::Granted)));
        out.clear();
        c.encode(Op::Unlock, b"key", &mut out);
        // [op 9][rid 3][bodyLen 12][token LE][3 "key"]
        let mut want = vec![9, 3, 0, 0, 0, 12, 0];
        want.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        want.extend_from_slice(b"\x03key");
        assert_eq!(out, want);
        // A Lost push in front of the reply is skipped; "stale" is not_held.
        let mut buf = Vec::new();
        encode_lost(b"key", 0x0102_0304_0506_0708, LostWhy::Reset, &mut buf);
        encode_reply(3, Status::Stale, 0, u32::MAX, &mut buf);
        assert_eq!(c.decode(Op::Unlock, &mut buf), Ok(Some(Reply::NotHeld)));
        assert!(buf.is_empty());
    }

    #[test]
    fn partial_replies_wait_and_wrong_ones_fail() {
        let mut c = SessionLock::new(Vec::new(), 0, Access::Exclusive);
        let mut out = Vec::new();
        c.start_connection(&mut out);
        let w = welcome(1, Status::Ok);
        let mut buf = w[..10].to_vec();
        assert_eq!(c.handshake(&mut buf, &mut out), Ok(false));
        buf.extend_from_slice(&w[10..]);
        assert_eq!(c.handshake(&mut buf, &mut out), Ok(true));

        c.encode(Op::TryLock, b"k", &mut out);
        let mut r = Vec::new();
        encode_reply(2, Status::Busy, 0, u32::MAX, &mut r);
        let mut buf = r[..r.len() - 1].to_vec();
        assert_eq!(c.decode(Op::TryLock, &mut buf), Ok(None));
        buf.push(*r.last().expect("reply bytes"));
        assert_eq!(c.decode(Op::TryLock, &mut buf), Ok(Some(Reply::Busy)));

        c.encode(Op::Lock, b"k", &mut out);
        let mut buf = Vec::new();
        encode_reply(3, Status::Limit, 0, u32::MAX, &mut buf);
        assert!(matches!(
            c.decode(Op::Lock, &mut buf),
            Ok(Some(Reply::Error(e))) if e.contains("limit_reached")
        ));

        c.encode(Op::Lock, b"k", &mut out);
        let mut buf = Vec::new();
        encode_reply(99, Status::Ok, 1, u32::MAX, &mut buf);
        assert!(
            c.decode(Op::Lock, &mut buf).is_err(),
            "a reply to another request id"
        );
        assert!(
            c.decode(Op::Lock, &mut vec![0x42; 7]).is_err(),
            "unknown kind"
        );
    }

    #[test]
    fn a_refused_or_foreign_hello_is_an_error() {
        let mut c = SessionLock::new(Vec::new(), 0, Access::Exclusive);
        let mut out = Vec::new();
        c.start_connection(&mut out);
        let e = c
            .handshake(&mut welcome(1, Status::Invalid), &mut out)
            .expect_err("refused");
        assert!(e.contains("invalid"), "{e}");
        c.start_connection(&mut out);
        let mut buf = Vec::new();
        encode_reply(1, Status::Invalid, 0, u32::MAX, &mut buf);
        let e = c.handshake(&mut buf, &mut out).expect_err("short reply");
        assert!(e.contains("does not speak sessions"), "{e}");
        // A Locking-Center server answers the Hello's action byte with '-'.
        c.start_connection(&mut out);
        assert!(c.handshake(&mut b"-------".to_vec(), &mut out).is_err());
    }
}
