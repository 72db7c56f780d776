//! The session protocol: action bytes 7..=12 on the lock port.
//!
//! A connection whose first frame is a Hello (action 7) becomes a *session
//! connection*: from then on every frame in both directions has the same
//! header, requests carry a client-chosen request id, several may be
//! outstanding at once (a Ping is never stuck behind a queued Acquire), and
//! the server may push unsolicited Lost messages. Locking-Center frames
//! (actions 1..=6) are not accepted on a session connection; old clients
//! never send actions 7 and up. The byte layout is documented for users in
//! `docs/protocol.md` ("Sessions"); this module is its one implementation
//! (server, client library, load generator and tests share it).
//!
//! ```text
//! request:  [u8 op 7..=12][u32 rid LE][u16 bodyLen LE][body]
//! answer:   [u8 kind 0x80 Reply | 0x81 Lost][u32 rid LE][u16 bodyLen LE][body]
//! ```
//!
//! Decoders are incremental, allocation-free and never panic
//! (property-tested): they answer "need more", "one frame of N bytes" or
//! "bad framing". Framing errors (unknown op, body longer than
//! [`BODY_MAX`]) cannot be resynchronised: the server closes the
//! connection. A well-framed request whose body is malformed is answered
//! [`Status::Invalid`] and changes nothing.

/// Protocol version carried by Hello.
pub const VERSION: u8 = 1;
/// Every version this implementation speaks, ascending: what a Hello of
/// another version is told (`unsupported version`, `docs/protocol.md`).
pub const VERSIONS: &[u8] = &[VERSION];
/// Bytes before the body.
pub const HEADER: usize = 7;
/// Longest body of any frame (requests and answers).
pub const BODY_MAX: usize = 512;
/// Longest frame.
pub const FRAME_MAX: usize = HEADER + BODY_MAX;
/// `wait_ms` of an Acquire that waits without a server-side deadline.
pub const WAIT_FOREVER: u32 = u32::MAX;
/// `ttl_left_ms` meaning "no TTL" (persistent and session holds).
pub const NO_TTL: u32 = u32::MAX;
/// Length of a Reply body (every reply but Hello's).
pub const REPLY_BODY: usize = 13;

pub const OP_HELLO: u8 = 7;
pub const OP_ACQUIRE: u8 = 8;
pub const OP_RELEASE: u8 = 9;
pub const OP_EXTEND: u8 = 10;
pub const OP_CANCEL: u8 = 11;
pub const OP_PING: u8 = 12;
/// Resumes a replicated session on another connection (cluster mode).
pub const OP_RESUME: u8 = 13;
/// Asks for the node directory ([`super::locate`]): a connection's first
/// and only frame, answered by every node (leader or not), then closed.
/// Not a session op: it opens nothing.
pub const OP_LOCATE: u8 = 14;
/// Watches a key's holders ([`FLAG_WATCH`]): its current holders, then
/// every change, as Event frames under the Watch's rid.
pub const OP_WATCH: u8 = 15;
/// Ends a watch of the session (by the Watch's rid and key).
pub const OP_UNWATCH: u8 = 16;
/// Changes the source (an election's value) of a hold the session may act
/// on, keeping its token ([`FLAG_PROCLAIM`]).
pub const OP_PROCLAIM: u8 = 17;

pub const KIND_REPLY: u8 = 0x80;
pub const KIND_LOST: u8 = 0x81;
/// One session hold a resumed session still has (answers a Resume, before
/// its Reply).
pub const KIND_HELD: u8 = 0x82;
/// One holder of a watched key, or one change of its holders (carries the
/// Watch's rid).
pub const KIND_EVENT: u8 = 0x83;

/// Welcome `flags` bit: the session is replicated, and can be resumed on
/// another connection (and on a new leader) with a Resume.
pub const FLAG_RESUMABLE: u8 = 1;
/// Welcome `flags` bit: the server takes an Acquire's access (shared,
/// semaphore) and answers [`Status::ModeMismatch`]. A client sends a
/// non-exclusive Acquire only to a server that set it (an older one would
/// answer `invalid`: its Acquire body ends at the source).
pub const FLAG_MODES: u8 = 2;
/// Welcome `flags` bit: the server takes Watch and Unwatch ([`OP_WATCH`]).
/// A client sends them only to a server that set it (an older one closes
/// the connection on an op it does not know).
pub const FLAG_WATCH: u8 = 4;
/// Welcome `flags` bit: the server takes Proclaim ([`OP_PROCLAIM`]) and
/// reports it to watchers as [`EventKind::Proclaimed`]. A client sends it
/// only to a server that set it.
pub const FLAG_PROCLAIM: u8 = 8;

/// Bounds of a key (1..=127 bytes, as on the lock port) and of a source
/// (0..=255: an Acquire's and a Proclaim's size byte of it is unsigned).
pub use crate::core::{KEY_MAX, SOURCE_MAX};

/// How a lock is shared (the lock core's own type; an Acquire's optional
/// trailing `[u8 access][u32 slots]`).
pub use crate::core::Access;

/// The access byte of an Acquire's trailer.
pub use event::{ACCESS_EXCLUSIVE, ACCESS_SEMAPHORE, ACCESS_SHARED};

/// How a granted lock is held (the lock core's own type; its byte is the
/// Acquire frame's mode).
pub use crate::core::HoldMode;

/// The status byte of a Reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// Granted, released, extended, cancelled as asked, pong, hello.
    Ok = 0,
    /// An Acquire's `wait_ms` passed while it was queued (decided by the
    /// server: it was never granted).
    TimedOut = 1,
    /// Held by someone else (an Acquire with `wait_ms` 0).
    Busy = 2,
    /// The token is the key's current one but the hold belongs to another
    /// session (a session-mode hold is only its own session's to release).
    NotOwner = 3,
    /// The token is not the key's current one (released, expired, reset, or
    /// never issued): nothing changed.
    Stale = 4,
    /// Malformed body, out-of-range TTL or keep-alive, unknown op, or a
    /// request the connection's state does not allow.
    Invalid = 5,
    /// A capacity limit (`--max-keys`, `--max-waiters`) refused it.
    Limit = 6,
    /// The server could not make the result durable (its effects were
    /// undone) or is shutting down.
    ServerError = 7,
    /// A queued Acquire withdrawn by a Cancel (the Acquire's own answer).
    Cancelled = 8,
    /// A Cancel that found nothing queued under that request id (already
    /// answered, or never sent): the Acquire's own answer stands.
    NotQueued = 9,
    /// A Hello without the server's auth token (`--auth-token-file`), or
    /// with a wrong one: the server closes the connection after it.
    Unauthorized = 10,
    /// A Hello of a version the server does not speak; the answer names the
    /// versions it does ([`Answer::Refused`]) and the server closes.
    UnsupportedVersion = 11,
    /// This server is not the serving leader of its cluster: try another
    /// address (the answer may name the leader, [`Answer::Refused`]).
    NotLeader = 12,
    /// A Resume named a session this server does not have (never
    /// replicated, ended, or its resume window passed): its holds are gone.
    UnknownSession = 13,
    /// The server has certificates (`--certs-dir`) and takes sessions
    /// over TLS only: this Hello or Resume came in plaintext. The server
    /// closes after it; the client should dial again with TLS.
    TlsRequired = 14,
    /// A semaphore Acquire naming another slot count than the key's
    /// (fixed by its first semaphore holder or waiter while any holds or
    /// waits): nothing changed. Only a client that sent an access
    /// ([`FLAG_MODES`]) is ever answered it.
    ModeMismatch = 15,
}

impl Status {
    pub fn from_byte(b: u8) -> Option<Status> {
        Some(match b {
            0 => Status::Ok,
            1 => Status::TimedOut,
            2 => Status::Busy,
            3 => Status::NotOwner,
            4 => Status::Stale,
            5 => Status::Invalid,
            6 => Status::Limit,
            7 => Status::ServerError,
            8 => Status::Cancelled,
            9 => Status::NotQueued,
            10 => Status::Unauthorized,
            11 => Status::UnsupportedVersion,
            12 => Status::NotLeader,
            13 => Status::UnknownSession,
            14 => Status::TlsRequired,
            15 => Status::ModeMismatch,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::TimedOut => "timed_out",
            Status::Busy => "busy",
            Status::NotOwner => "not_owner",
            Status::Stale => "stale_token",
            Status::Invalid => "invalid",
            Status::Limit => "limit_reached",
            Status::ServerError => "server_error",
            Status::Cancelled => "cancelled",
            Status::NotQueued => "not_queued",
            Status::Unauthorized => "unauthorized",
            Status::UnsupportedVersion => "unsupported_version",
            Status::NotLeader => "not_leader",
            Status::UnknownSession => "unknown_session",
            Status::TlsRequired => "tls_required",
            Status::ModeMismatch => "mode_mismatch",
        }
    }

    /// True for the statuses whose Reply body is `[u8 status][u8 len][detail]`
    /// instead of the 13-byte `[u8 status][u64 token][u32 ttl_left_ms]`.
    pub fn has_detail(self) -> bool {
        matches!(self, Status::UnsupportedVersion | Status::NotLeader)
    }
}

/// Why the server took a lock away from a live session (a Lost push).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LostWhy {
    /// The lease's TTL passed without an Extend.
    Expired = 1,
    /// An operator reset (ResetByKey, ResetBySource, admin RSET/RSBS).
    Reset = 2,
}

impl LostWhy {
    pub fn from_byte(b: u8) -> Option<LostWhy> {
        match b {
            1 => Some(LostWhy::Expired),
            2 => Some(LostWhy::Reset),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            LostWhy::Expired => "expired",
            LostWhy::Reset => "reset",
        }
    }
}

/// One decoded session request, borrowing the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Req<'a> {
    /// `[u8 version][u32 keepalive_ms]` (0: the server's default), then
    /// optionally `[u8 authLen][auth]`, the server's shared secret.
    Hello {
        version: u8,
        keepalive_ms: u32,
        auth: &'a [u8],
    },
    /// `[u8 hold][u32 ttl_ms][u32 wait_ms][u8 keyLen][key][u8 srcLen][src]`
    /// (a key of 1..=[`KEY_MAX`] bytes, a source of 0..=[`SOURCE_MAX`]),
    /// then optionally `[u8 access][u32 slots]` (absent: exclusive; 0
    /// exclusive and 1 shared with slots 0, 2 a semaphore of `slots` >= 1;
    /// only to a server with [`FLAG_MODES`]).
    Acquire {
        hold: HoldMode,
        ttl_ms: u32,
        wait_ms: u32,
        key: &'a [u8],
        source: &'a [u8],
        access: Access,
    },
    /// `[u64 token][u8 keyLen][key]`
    Release { token: u64, key: &'a [u8] },
    /// `[u64 token][u32 ttl_ms][u8 keyLen][key]`
    Extend {
        token: u64,
        ttl_ms: u32,
        key: &'a [u8],
    },
    /// `[u32 target rid][u8 keyLen][key]`: the key of the Acquire to
    /// withdraw (the server routes by it).
    Cancel { target: u32, key: &'a [u8] },
    /// empty body
    Ping,
    /// `[u8 keyLen][key]`: watch the key's holders ([`FLAG_WATCH`]).
    Watch { key: &'a [u8] },
    /// `[u32 rid of the Watch][u8 keyLen][key of the Watch]`.
    Unwatch { target: u32, key: &'a [u8] },
    /// `[u64 token][u8 keyLen][key][u8 srcLen][src]` (a source of
    /// 0..=[`SOURCE_MAX`] bytes): the hold `token` of `key` is held under
    /// source `src` from now on, its token unchanged
    /// ([`FLAG_PROCLAIM`]; an empty source is the client's IP address, as
    /// in an Acquire).
    Proclaim {
        token: u64,
        key: &'a [u8],
        source: &'a [u8],
    },
    /// `[u8 version][u64 session_id]`, then optionally `[u8 authLen][auth]`:
    /// a connection's first frame, instead of a Hello, to take over a
    /// replicated session ([`FLAG_RESUMABLE`]).
    Resume {
        version: u8,
        session_id: u64,
        auth: &'a [u8],
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    Incomplete,
    /// A whole frame of `len` bytes. `req` is `Err` when the framing is
    /// sound but the body is not (answer [`Status::Invalid`], go on).
    Frame {
        op: u8,
        rid: u32,
        req: Result<Req<'a>, &'static str>,
        len: usize,
    },
    /// Unknown op or oversized body: the stream cannot be resynchronised.
    Bad(&'static str),
}

/// True for the action bytes of this protocol.
pub fn is_session_op(b: u8) -> bool {
    (OP_HELLO..=OP_RESUME).contains(&b) || (OP_WATCH..=OP_PROCLAIM).contains(&b)
}

struct Body<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Body<'a> {
    fn u8(&mut self) -> Option<u8> {
        let v = *self.b.get(self.at)?;
        self.at += 1;
        Some(v)
    }
    fn u32(&mut self) -> Option<u32> {
        let s = self.b.get(self.at..self.at + 4)?;
        self.at += 4;
        Some(u32::from_le_bytes(s.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        let s = self.b.get(self.at..self.at + 8)?;
        self.at += 8;
        Some(u64::from_le_bytes(s.try_into().ok()?))
    }
    /// A sized name of `min..=max` bytes.
    fn name(&mut self, min: usize, max: usize) -> Option<&'a [u8]> {
        let n = self.u8()? as usize;
        if n < min || n > max {
            return None;
        }
        let s = self.b.get(self.at..self.at + n)?;
        self.at += n;
        Some(s)
    }
    /// A key: 1..=[`KEY_MAX`] bytes.
    fn key(&mut self) -> Option<&'a [u8]> {
        self.name(1, KEY_MAX)
    }
    /// A source: 0..=[`SOURCE_MAX`] bytes (its size byte is unsigned).
    fn source(&mut self) -> Option<&'a [u8]> {
        self.name(0, SOURCE_MAX)
    }
    fn done(&self) -> bool {
        self.at == self.b.len()
    }
}

impl<'a> Body<'a> {
    /// An optional trailing `[u8 authLen][auth]` (Hello, Resume).
    fn auth(&mut self, short: &'static str) -> Result<&'a [u8], &'static str> {
        if self.done() {
            return Ok(&[][..]);
        }
        let n = self.u8().ok_or(short)? as usize;
        let a = self.b.get(self.at..self.at + n).ok_or("short auth token")?;
        self.at += n;
        Ok(a)
    }
}

fn body(op: u8, b: &[u8]) -> Result<Req<'_>, &'static str> {
    let mut r = Body { b, at: 0 };
    let req = match op {
        OP_HELLO => {
            let version = r.u8().ok_or("short hello")?;
            let keepalive_ms = r.u32().ok_or("short hello")?;
            let auth = r.auth("short hello")?;
            Req::Hello {
                version,
                keepalive_ms,
                auth,
            }
        }
        OP_RESUME => {
            let version = r.u8().ok_or("short resume")?;
            let session_id = r.u64().ok_or("short resume")?;
            let auth = r.auth("short resume")?;
            Req::Resume {
                version,
                session_id,
                auth,
            }
        }
        OP_ACQUIRE => {
            let hold =
                HoldMode::from_byte(r.u8().ok_or("short acquire")?).ok_or("unknown hold mode")?;
            let ttl_ms = r.u32().ok_or("short acquire")?;
            let wait_ms = r.u32().ok_or("short acquire")?;
            let key = r.key().ok_or("key size out of range 1..=127")?;
            let source = r.source().ok_or("source size out of range 0..=255")?;
            let access = if r.done() {
                Access::Exclusive
            } else {
                let a = r.u8().ok_or("short access")?;
                let slots = r.u32().ok_or("short access")?;
                match (a, slots) {
                    (ACCESS_EXCLUSIVE, 0) => Access::Exclusive,
                    (ACCESS_SHARED, 0) => Access::Shared,
                    (ACCESS_SEMAPHORE, n) if n >= 1 => Access::Semaphore(n),
                    (ACCESS_SEMAPHORE, _) => return Err("a semaphore of 0 slots"),
                    (ACCESS_EXCLUSIVE | ACCESS_SHARED, _) => {
                        return Err("slots are only for a semaphore")
                    }
                    _ => return Err("unknown access"),
                }
            };
            Req::Acquire {
                hold,
                ttl_ms,
                wait_ms,
                key,
                source,
                access,
            }
        }
        OP_RELEASE => {
            let token = r.u64().ok_or("short release")?;
            let key = r.key().ok_or("key size out of range 1..=127")?;
            Req::Release { token, key }
        }
        OP_EXTEND => {
            let token = r.u64().ok_or("short extend")?;
            let ttl_ms = r.u32().ok_or("short extend")?;
            let key = r.key().ok_or("key size out of range 1..=127")?;
            Req::Extend { token, ttl_ms, key }
        }
        OP_CANCEL => {
            let target = r.u32().ok_or("short cancel")?;
            let key = r.key().ok_or("key size out of range 1..=127")?;
            Req::Cancel { target, key }
        }
        OP_PING => Req::Ping,
        OP_WATCH => {
            let key = r.key().ok_or("key size out of range 1..=127")?;
            Req::Watch { key }
        }
        OP_UNWATCH => {
            let target = r.u32().ok_or("short unwatch")?;
            let key = r.key().ok_or("key size out of range 1..=127")?;
            Req::Unwatch { target, key }
        }
        OP_PROCLAIM => {
            let token = r.u64().ok_or("short proclaim")?;
            let key = r.key().ok_or("key size out of range 1..=127")?;
            let source = r.source().ok_or("source size out of range 0..=255")?;
            Req::Proclaim { token, key, source }
        }
        _ => return Err("unknown op"),
    };
    if !r.done() {
        return Err("trailing bytes in body");
    }
    Ok(req)
}

/// Decodes the first session request in `buf`.
pub fn decode(buf: &[u8]) -> Decoded<'_> {
    let Some(&op) = buf.first() else {
        return Decoded::Incomplete;
    };
    if !is_session_op(op) {
        return Decoded::Bad("not a session op");
    }
    if buf.len() < HEADER {
        return Decoded::Incomplete;
    }
    let rid = u32::from_le_bytes(buf[1..5].try_into().expect("4 bytes"));
    let blen = u16::from_le_bytes([buf[5], buf[6]]) as usize;
    if blen > BODY_MAX {
        return Decoded::Bad("body longer than 512 bytes");
    }
    let len = HEADER + blen;
    if buf.len() < len {
        return Decoded::Incomplete;
    }
    Decoded::Frame {
        op,
        rid,
        req: body(op, &buf[HEADER..len]),
        len,
    }
}

fn frame(out: &mut Vec<u8>, kind: u8, rid: u32, f: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.push(kind);
    out.extend_from_slice(&rid.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    f(out);
    let blen = out.len() - start - HEADER;
    debug_assert!(blen <= BODY_MAX);
    out[start + 5..start + 7].copy_from_slice(&(blen as u16).to_le_bytes());
}

fn put_name(out: &mut Vec<u8>, n: &[u8], max: usize) {
    assert!(n.len() <= max, "name too long");
    out.push(n.len() as u8);
    out.extend_from_slice(n);
}

fn put_key(out: &mut Vec<u8>, key: &[u8]) {
    put_name(out, key, KEY_MAX);
}

fn put_source(out: &mut Vec<u8>, source: &[u8]) {
    put_name(out, source, SOURCE_MAX);
}

/// Encodes a request (clients, load generator, tests). Panics on a key
/// longer than 127 bytes or a source longer than 255: callers validate
/// first.
pub fn encode(rid: u32, req: &Req<'_>, out: &mut Vec<u8>) {
    let op = match req {
        Req::Hello { .. } => OP_HELLO,
        Req::Acquire { .. } => OP_ACQUIRE,
        Req::Release { .. } => OP_RELEASE,
        Req::Extend { .. } => OP_EXTEND,
        Req::Cancel { .. } => OP_CANCEL,
        Req::Ping => OP_PING,
        Req::Resume { .. } => OP_RESUME,
        Req::Watch { .. } => OP_WATCH,
        Req::Unwatch { .. } => OP_UNWATCH,
        Req::Proclaim { .. } => OP_PROCLAIM,
    };
    frame(out, op, rid, |o| match *req {
        Req::Resume {
            version,
            session_id,
            auth,
        } => {
            o.push(version);
            o.extend_from_slice(&session_id.to_le_bytes());
            if !auth.is_empty() {
                assert!(auth.len() <= 255, "auth token longer than 255 bytes");
                o.push(auth.len() as u8);
                o.extend_from_slice(auth);
            }
        }
        Req::Hello {
            version,
            keepalive_ms,
            auth,
        } => {
            o.push(version);
            o.extend_from_slice(&keepalive_ms.to_le_bytes());
            if !auth.is_empty() {
                assert!(auth.len() <= 255, "auth token longer than 255 bytes");
                o.push(auth.len() as u8);
                o.extend_from_slice(auth);
            }
        }
        Req::Acquire {
            hold,
            ttl_ms,
            wait_ms,
            key,
            source,
            access,
        } => {
            o.push(hold as u8);
            o.extend_from_slice(&ttl_ms.to_le_bytes());
            o.extend_from_slice(&wait_ms.to_le_bytes());
            put_key(o, key);
            put_source(o, source);
            // Exclusive as before, with no trailer (an older server reads it).
            if access != Access::Exclusive {
                let (a, slots) = access.to_bytes();
                o.push(a);
                o.extend_from_slice(&slots.to_le_bytes());
            }
        }
        Req::Release { token, key } => {
            o.extend_from_slice(&token.to_le_bytes());
            put_key(o, key);
        }
        Req::Extend { token, ttl_ms, key } => {
            o.extend_from_slice(&token.to_le_bytes());
            o.extend_from_slice(&ttl_ms.to_le_bytes());
            put_key(o, key);
        }
        Req::Cancel { target, key } | Req::Unwatch { target, key } => {
            o.extend_from_slice(&target.to_le_bytes());
            put_key(o, key);
        }
        Req::Watch { key } => put_key(o, key),
        Req::Proclaim { token, key, source } => {
            o.extend_from_slice(&token.to_le_bytes());
            put_key(o, key);
            put_source(o, source);
        }
        Req::Ping => {}
    });
}

/// A Locate frame ([`OP_LOCATE`]) at the start of a receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocateFrame {
    Incomplete,
    /// A whole frame of `len` bytes; `version` is its body's first byte
    /// (`None`: an empty body).
    Frame {
        rid: u32,
        version: Option<u8>,
        body_len: usize,
        len: usize,
    },
    /// Broken framing (a body over [`BODY_MAX`]) or not a Locate.
    Bad(&'static str),
}

/// Decodes a Locate frame: `[14][u32 rid][u16 bodyLen][u8 version]`.
pub fn decode_locate(buf: &[u8]) -> LocateFrame {
    match buf.first() {
        None => return LocateFrame::Incomplete,
        Some(&OP_LOCATE) => {}
        Some(_) => return LocateFrame::Bad("not a Locate"),
    }
    if buf.len() < HEADER {
        return LocateFrame::Incomplete;
    }
    let rid = u32::from_le_bytes(buf[1..5].try_into().expect("4 bytes"));
    let blen = u16::from_le_bytes([buf[5], buf[6]]) as usize;
    if blen > BODY_MAX {
        return LocateFrame::Bad("body longer than 512 bytes");
    }
    if buf.len() < HEADER + blen {
        return LocateFrame::Incomplete;
    }
    LocateFrame::Frame {
        rid,
        version: (blen > 0).then(|| buf[HEADER]),
        body_len: blen,
        len: HEADER + blen,
    }
}

/// Encodes a Locate of this version.
pub fn encode_locate(rid: u32, out: &mut Vec<u8>) {
    frame(out, OP_LOCATE, rid, |o| o.push(super::locate::VERSION));
}

/// Encodes the answer to a Locate: a Reply `[u8 status = ok][record]`.
pub fn encode_located(rid: u32, dir: &super::locate::Directory, out: &mut Vec<u8>) {
    let mut body = vec![Status::Ok as u8];
    dir.encode(&mut body);
    out.push(KIND_REPLY);
    out.extend_from_slice(&rid.to_le_bytes());
    out.extend_from_slice(&(body.len().min(u16::MAX as usize) as u16).to_le_bytes());
    out.extend_from_slice(&body[..body.len().min(u16::MAX as usize)]);
}

/// What a Locate was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Located {
    Directory(super::locate::Directory),
    /// A session Reply with another status (`tls_required`, `invalid`,
    /// `unsupported version`, ...) and its detail, if it has one.
    Refused(Status, Vec<u8>),
}

/// The answer to a Locate at the start of `buf`: `Ok(None)` when more
/// bytes are needed; `Err` for bytes that are not a session Reply (the
/// Locking-Center `-` of a server without Locate).
pub fn decode_located(buf: &[u8]) -> Result<Option<Located>, String> {
    let Some(&kind) = buf.first() else {
        return Ok(None);
    };
    if kind != KIND_REPLY {
        return Err(format!("answered {kind:#04x}, not a session Reply"));
    }
    if buf.len() < HEADER {
        return Ok(None);
    }
    let blen = u16::from_le_bytes([buf[5], buf[6]]) as usize;
    let Some(body) = buf.get(HEADER..HEADER + blen) else {
        return Ok(None);
    };
    let Some(&st) = body.first() else {
        return Err("an empty Reply".into());
    };
    let status = Status::from_byte(st).ok_or_else(|| format!("unknown status {st}"))?;
    if status != Status::Ok {
        let detail = if status.has_detail() {
            let n = body.get(1).copied().unwrap_or(0) as usize;
            body.get(2..2 + n).unwrap_or_default().to_vec()
        } else {
            Vec::new()
        };
        return Ok(Some(Located::Refused(status, detail)));
    }
    match super::locate::Directory::decode(&body[1..])? {
        Some((d, _)) => Ok(Some(Located::Directory(d))),
        None => Err(format!("a directory cut short ({blen}-byte body)")),
    }
}

/// What the server's Hello reply says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Welcome {
    pub status: Status,
    pub version: u8,
    /// The keep-alive deadline the server applies: the session ends when
    /// nothing arrives from the client for this long.
    pub keepalive_ms: u32,
    /// Bounds of a lease's TTL (Acquire and Extend outside them: Invalid).
    pub min_ttl_ms: u32,
    pub max_ttl_ms: u32,
    /// The server's id for this session (shown in logs).
    pub session_id: u64,
    /// The server's limits: distinct keys and queued requests of the whole
    /// server (`--max-keys`, `--max-waiters`, however many shards) and its
    /// shard count; beyond them an
    /// Acquire is answered `limit reached`.
    pub max_keys: u32,
    pub max_waiters: u32,
    pub shards: u16,
    /// [`FLAG_RESUMABLE`]; 0 from a server that does not send the byte.
    pub flags: u8,
}

/// Length of the Hello reply body as first defined; later fields (`flags`)
/// follow it, and a client skips what it does not know.
pub const WELCOME_BODY: usize = 32;

/// Encodes the Hello reply:
/// `[u8 status][u8 version][u32 keepalive_ms][u32 min_ttl_ms][u32 max_ttl_ms][u64 session_id]
/// [u32 max_keys][u32 max_waiters][u16 shards]`.
pub fn encode_welcome(rid: u32, w: &Welcome, out: &mut Vec<u8>) {
    frame(out, KIND_REPLY, rid, |o| {
        o.push(w.status as u8);
        o.push(w.version);
        o.extend_from_slice(&w.keepalive_ms.to_le_bytes());
        o.extend_from_slice(&w.min_ttl_ms.to_le_bytes());
        o.extend_from_slice(&w.max_ttl_ms.to_le_bytes());
        o.extend_from_slice(&w.session_id.to_le_bytes());
        o.extend_from_slice(&w.max_keys.to_le_bytes());
        o.extend_from_slice(&w.max_waiters.to_le_bytes());
        o.extend_from_slice(&w.shards.to_le_bytes());
        o.push(w.flags);
    });
}

/// Encodes a Held frame (answers a Resume, before its Reply), one hold of
/// the resumed session: `[u64 token][u8 hold][u32 ttl_left_ms][u8
/// keyLen][key]` ([`NO_TTL`] for a hold that is not a lease).
pub fn encode_held(
    rid: u32,
    key: &[u8],
    token: u64,
    hold: HoldMode,
    ttl_left_ms: u32,
    out: &mut Vec<u8>,
) {
    frame(out, KIND_HELD, rid, |o| {
        o.extend_from_slice(&token.to_le_bytes());
        o.push(hold as u8);
        o.extend_from_slice(&ttl_left_ms.to_le_bytes());
        put_key(o, key);
    });
}

/// Encodes a Reply: `[u8 status][u64 token][u32 ttl_left_ms]` (token 0 and
/// [`NO_TTL`] where they do not apply).
pub fn encode_reply(rid: u32, status: Status, token: u64, ttl_left_ms: u32, out: &mut Vec<u8>) {
    frame(out, KIND_REPLY, rid, |o| {
        o.push(status as u8);
        o.extend_from_slice(&token.to_le_bytes());
        o.extend_from_slice(&ttl_left_ms.to_le_bytes());
    });
}

/// Encodes a refusal with detail (`[u8 status][u8 len][detail]`, for the
/// statuses of [`Status::has_detail`]): the versions spoken for
/// `unsupported version`, the leader's address for `not leader`.
pub fn encode_refusal(rid: u32, status: Status, detail: &[u8], out: &mut Vec<u8>) {
    debug_assert!(status.has_detail());
    assert!(detail.len() <= 255, "refusal detail longer than 255 bytes");
    frame(out, KIND_REPLY, rid, |o| {
        o.push(status as u8);
        o.push(detail.len() as u8);
        o.extend_from_slice(detail);
    });
}

/// Encodes a Lost push: rid 0, `[u64 token][u8 reason][u8 keyLen][key]`.
pub fn encode_lost(key: &[u8], token: u64, why: LostWhy, out: &mut Vec<u8>) {
    frame(out, KIND_LOST, 0, |o| {
        o.extend_from_slice(&token.to_le_bytes());
        o.push(why as u8);
        put_key(o, key);
    });
}

/// Encodes an Event push under the Watch's `rid` (its body: `docs/protocol.md`, "Watching a key").
pub fn encode_event(rid: u32, kind: EventKind, h: &EventHolder<'_>, out: &mut Vec<u8>) {
    frame(out, KIND_EVENT, rid, |o| event::encode_body(kind, h, o));
}

/// One decoded server message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Welcome {
        rid: u32,
        welcome: Welcome,
    },
    Reply {
        rid: u32,
        status: Status,
        token: u64,
        /// `None` for [`NO_TTL`].
        ttl_left_ms: Option<u32>,
    },
    Lost {
        key: Vec<u8>,
        token: u64,
        why: LostWhy,
    },
    /// A hold the resumed session still has (before the Resume's Welcome).
    Held {
        rid: u32,
        key: Vec<u8>,
        token: u64,
        hold: HoldMode,
        /// `None` for [`NO_TTL`] (not a lease).
        ttl_left_ms: Option<u32>,
    },
    /// A holder of a watched key, or a change of its holders (rid = the
    /// Watch's).
    Event {
        rid: u32,
        kind: EventKind,
        token: u64,
        hold: HoldMode,
        access: Access,
        key: Vec<u8>,
        source: Vec<u8>,
    },
    /// An Event of a kind this decoder does not know (a later server's):
    /// a client skips it.
    OtherEvent {
        rid: u32,
        kind: u8,
    },
    /// A Reply of a status with detail ([`Status::has_detail`]): for
    /// `unsupported version` the versions the server speaks, for `not
    /// leader` the leader's address (empty: unknown).
    Refused {
        rid: u32,
        status: Status,
        detail: Vec<u8>,
    },
}

/// Decodes the first server message in `buf` (clients). `hello_rid` names
/// the request id of the Hello, whose reply has the longer body. `Ok(None)`:
/// need more bytes; `Err`: the server broke the protocol.
pub fn decode_answer(
    buf: &[u8],
    hello_rid: Option<u32>,
) -> Result<Option<(Answer, usize)>, String> {
    if buf.len() < HEADER {
        return Ok(None);
    }
    let kind = buf[0];
    let rid = u32::from_le_bytes(buf[1..5].try_into().expect("4 bytes"));
    let blen = u16::from_le_bytes([buf[5], buf[6]]) as usize;
    if blen > BODY_MAX {
        return Err(format!("answer body of {blen} bytes"));
    }
    if buf.len() < HEADER + blen {
        return Ok(None);
    }
    let b = &buf[HEADER..HEADER + blen];
    let mut r = Body { b, at: 0 };
    let bad = || format!("malformed answer (kind {kind:#x}, {blen} body bytes)");
    let a = match kind {
        KIND_REPLY => decode_reply(rid, &mut r, hello_rid == Some(rid), bad)?,
        KIND_LOST => {
            let token = r.u64().ok_or_else(bad)?;
            let why = LostWhy::from_byte(r.u8().ok_or_else(bad)?).ok_or_else(bad)?;
            let key = r.key().ok_or_else(bad)?.to_vec();
            Answer::Lost { key, token, why }
        }
        KIND_HELD => {
            let token = r.u64().ok_or_else(bad)?;
            let hold = HoldMode::from_byte(r.u8().ok_or_else(bad)?).ok_or_else(bad)?;
            let ttl = r.u32().ok_or_else(bad)?;
            let key = r.key().ok_or_else(bad)?.to_vec();
            Answer::Held {
                rid,
                key,
                token,
                hold,
                ttl_left_ms: (ttl != NO_TTL).then_some(ttl),
            }
        }
        KIND_EVENT
            if b.first()
                .is_some_and(|&k| EventKind::from_byte(k).is_none()) =>
        {
            // A kind of a later server: skipped, as the protocol says.
            r.at = r.b.len();
            Answer::OtherEvent { rid, kind: b[0] }
        }
        KIND_EVENT => {
            let (kind, h) = event::decode_body(b).ok_or_else(bad)?;
            r.at = r.b.len();
            Answer::Event {
                rid,
                kind,
                token: h.token,
                hold: h.hold,
                access: h.access,
                key: h.key.to_vec(),
                source: h.source.to_vec(),
            }
        }
        _ => return Err(format!("unknown answer kind {kind:#x}")),
    };
    if !r.done() {
        return Err(bad());
    }
    Ok(Some((a, HEADER + blen)))
}

/// A Reply's body: a status with detail, whatever the request
/// (`[status][len][detail]`); the Hello's Welcome (`hello`); or a plain
/// Reply, which a Hello refused before the session exists also gets.
fn decode_reply(
    rid: u32,
    r: &mut Body<'_>,
    hello: bool,
    bad: impl Fn() -> String,
) -> Result<Answer, String> {
    let status = |v: u8| Status::from_byte(v).ok_or_else(|| format!("unknown status {v}"));
    let first = r.b.first().and_then(|&v| Status::from_byte(v));
    if first.is_some_and(Status::has_detail) {
        let st = status(r.u8().ok_or_else(&bad)?)?;
        let detail = r.name(0, u8::MAX.into()).ok_or_else(&bad)?.to_vec();
        return Ok(Answer::Refused {
            rid,
            status: st,
            detail,
        });
    }
    if hello && r.b.len() >= WELCOME_BODY {
        let welcome = decode_welcome(r, bad)?;
        return Ok(Answer::Welcome { rid, welcome });
    }
    let st = status(r.u8().ok_or_else(&bad)?)?;
    let token = r.u64().ok_or_else(&bad)?;
    let ttl = r.u32().ok_or_else(&bad)?;
    Ok(Answer::Reply {
        rid,
        status: st,
        token,
        ttl_left_ms: (ttl != NO_TTL).then_some(ttl),
    })
}

/// A Welcome's body (the Hello's reply); fields a later server appends are
/// skipped. `bad()`: the error for a short body.
fn decode_welcome(r: &mut Body<'_>, bad: impl Fn() -> String) -> Result<Welcome, String> {
    let w = Welcome {
        status: {
            let v = r.u8().ok_or_else(&bad)?;
            Status::from_byte(v).ok_or_else(|| format!("unknown status {v}"))?
        },
        version: r.u8().ok_or_else(&bad)?,
        keepalive_ms: r.u32().ok_or_else(&bad)?,
        min_ttl_ms: r.u32().ok_or_else(&bad)?,
        max_ttl_ms: r.u32().ok_or_else(&bad)?,
        session_id: r.u64().ok_or_else(&bad)?,
        max_keys: r.u32().ok_or_else(&bad)?,
        max_waiters: r.u32().ok_or_else(&bad)?,
        shards: {
            let s = r.b.get(r.at..r.at + 2).ok_or_else(&bad)?;
            r.at += 2;
            u16::from_le_bytes([s[0], s[1]])
        },
        flags: r.b.get(WELCOME_BODY).copied().unwrap_or(0),
    };
    r.at = r.b.len();
    Ok(w)
}

mod event;
pub use event::{EventHolder, EventKind};

#[cfg(test)]
mod tests;
