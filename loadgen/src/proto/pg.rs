//! PostgreSQL advisory locks over the simple-query protocol (protocol 3.0).
//!
//! `pg_advisory_lock(bigint)` blocks inside the server until granted;
//! `pg_try_advisory_lock` answers `t`/`f`; `pg_advisory_unlock` answers `f`
//! (plus a WARNING notice) when the session did not hold the lock. Locks
//! belong to the session, so clients keep their connection (pinned session).
//! Key names map to a bigint with FNV-1a. Authentication: trust or cleartext
//! password (the benchmark's cluster uses trust on loopback).

use super::{fnv1a64, Codec, Op, Reply};

pub struct PgLock {
    user: String,
    db: String,
    password: String,
}

/// One backend message: type byte and body (after the length word).
#[derive(Debug, PartialEq, Eq)]
pub struct Msg {
    pub tag: u8,
    pub body: Vec<u8>,
}

/// Take one whole message off the front of `buf`.
pub fn take_msg(buf: &mut Vec<u8>) -> Result<Option<Msg>, String> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if len < 4 {
        return Err(format!("bad PostgreSQL message length {len}"));
    }
    let total = 1 + len as usize;
    if buf.len() < total {
        return Ok(None);
    }
    let msg = Msg {
        tag: buf[0],
        body: buf[5..total].to_vec(),
    };
    buf.drain(..total);
    Ok(Some(msg))
}

/// The `M` (message) field of an ErrorResponse.
pub fn error_message(body: &[u8]) -> String {
    let mut at = 0;
    while at < body.len() && body[at] != 0 {
        let field = body[at];
        let end = body[at + 1..]
            .iter()
            .position(|&b| b == 0)
            .map_or(body.len(), |p| at + 1 + p);
        if field == b'M' {
            return String::from_utf8_lossy(&body[at + 1..end]).into_owned();
        }
        at = end + 1;
    }
    "unknown error".into()
}

/// First column of a DataRow, `None` for NULL.
pub fn first_column(body: &[u8]) -> Result<Option<Vec<u8>>, String> {
    if body.len() < 6 {
        return Err("short DataRow".into());
    }
    let len = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
    if len < 0 {
        return Ok(None);
    }
    body.get(6..6 + len as usize)
        .map(|v| Some(v.to_vec()))
        .ok_or_else(|| "short DataRow".into())
}

pub fn startup_message(user: &str, db: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&196608i32.to_be_bytes());
    for (k, v) in [
        ("user", user),
        ("database", db),
        ("application_name", "ringlock-loadgen"),
    ] {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut out = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

pub fn query_message(sql: &str, out: &mut Vec<u8>) {
    out.push(b'Q');
    out.extend_from_slice(&((sql.len() + 5) as i32).to_be_bytes());
    out.extend_from_slice(sql.as_bytes());
    out.push(0);
}

impl PgLock {
    pub fn new(user: String, db: String, password: String) -> PgLock {
        PgLock { user, db, password }
    }

    pub fn lock_id(key: &[u8]) -> i64 {
        fnv1a64(key) as i64
    }
}

impl Codec for PgLock {
    fn start_connection(&mut self, out: &mut Vec<u8>) -> bool {
        out.extend_from_slice(&startup_message(&self.user, &self.db));
        true
    }

    fn handshake(&mut self, buf: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<bool, String> {
        while let Some(m) = take_msg(buf)? {
            match m.tag {
                b'R' => {
                    let code = m
                        .body
                        .get(..4)
                        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                    match code {
                        Some(0) => {}
                        Some(3) => {
                            out.push(b'p');
                            out.extend_from_slice(
                                &((self.password.len() + 5) as i32).to_be_bytes(),
                            );
                            out.extend_from_slice(self.password.as_bytes());
                            out.push(0);
                        }
                        other => {
                            return Err(format!(
                            "PostgreSQL auth method {other:?} unsupported (use trust or password)"
                        ))
                        }
                    }
                }
                b'E' => return Err(format!("PostgreSQL: {}", error_message(&m.body))),
                b'Z' => return Ok(true),
                _ => {} // ParameterStatus, BackendKeyData, NoticeResponse
            }
        }
        Ok(false)
    }

    fn encode(&mut self, op: Op, key: &[u8], out: &mut Vec<u8>) {
        let f = match op {
            Op::Lock => "pg_advisory_lock",
            Op::TryLock => "pg_try_advisory_lock",
            Op::Unlock => "pg_advisory_unlock",
        };
        query_message(&format!("SELECT {f}({})", Self::lock_id(key)), out);
    }

    fn decode(&mut self, op: Op, buf: &mut Vec<u8>) -> Result<Option<Reply>, String> {
        // Only decode once ReadyForQuery is buffered, so a reply is consumed whole.
        let mut at = 0;
        let mut complete = false;
        while buf.len() >= at + 5 {
            let len = i32::from_be_bytes([buf[at + 1], buf[at + 2], buf[at + 3], buf[at + 4]]);
            if len < 4 {
                return Err(format!("bad PostgreSQL message length {len}"));
            }
            let end = at + 1 + len as usize;
            if buf.len() < end {
                break;
            }
            if buf[at] == b'Z' {
                complete = true;
                break;
            }
            at = end;
        }
        if !complete {
            return Ok(None);
        }
        let mut value = None;
        let mut error = None;
        loop {
            let m = take_msg(buf)?.expect("ReadyForQuery was found complete above");
            match m.tag {
                b'D' => value = first_column(&m.body)?,
                b'E' => error = Some(error_message(&m.body)),
                b'Z' => break,
                _ => {} // RowDescription, CommandComplete, NoticeResponse
            }
        }
        if let Some(e) = error {
            return Ok(Some(Reply::Error(e)));
        }
        let reply = match (op, value.as_deref()) {
            (Op::Lock, _) => Reply::Granted,
            (Op::TryLock, Some(b"t")) => Reply::Granted,
            (Op::TryLock, Some(b"f")) => Reply::Busy,
            (Op::Unlock, Some(b"t")) => Reply::Released,
            (Op::Unlock, Some(b"f")) => Reply::NotHeld,
            (op, v) => return Err(format!("unexpected PostgreSQL value {v:?} for {op:?}")),
        };
        Ok(Some(reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    fn data_row(val: &[u8]) -> Vec<u8> {
        let mut b = 1i16.to_be_bytes().to_vec();
        b.extend_from_slice(&(val.len() as i32).to_be_bytes());
        b.extend_from_slice(val);
        msg(b'D', &b)
    }

    #[test]
    fn startup_and_query_bytes() {
        let s = startup_message("u", "d");
        assert_eq!(&s[4..8], &196608i32.to_be_bytes());
        assert_eq!(
            i32::from_be_bytes([s[0], s[1], s[2], s[3]]) as usize,
            s.len()
        );
        assert!(s.ends_with(b"loadgen\0\0"));
        let mut q = Vec::new();
        query_message("SELECT 1", &mut q);
        assert_eq!(q, b"Q\0\0\0\x0dSELECT 1\0");
    }

    #[test]
    fn handshake_trust() {
        let mut c = PgLock::new("u".into(), "d".into(), String::new());
        let mut out = Vec::new();
        assert!(c.start_connection(&mut out));
        let mut buf = msg(b'R', &0i32.to_be_bytes());
        buf.extend(msg(b'S', b"server_version\x0015\x00"));
        assert!(!c.handshake(&mut buf, &mut out).unwrap());
        buf.extend(msg(b'K', &[0; 8]));
        buf.extend(msg(b'Z', b"I"));
        assert!(c.handshake(&mut buf, &mut out).unwrap());
        let mut bad = msg(b'R', &5i32.to_be_bytes());
        bad.extend_from_slice(&[1, 2, 3, 4]);
        assert!(
            c.handshake(&mut bad, &mut out).is_err(),
            "md5 is not supported"
        );
    }

    #[test]
    fn replies() {
        let mut c = PgLock::new("u".into(), "d".into(), String::new());
        let mut buf = msg(b'T', b"whatever");
        buf.extend(data_row(b""));
        buf.extend(msg(b'C', b"SELECT 1\0"));
        assert_eq!(
            c.decode(Op::Lock, &mut buf).unwrap(),
            None,
            "wait for ReadyForQuery"
        );
        buf.extend(msg(b'Z', b"I"));
        buf.extend(data_row(b"f"));
        assert_eq!(c.decode(Op::Lock, &mut buf).unwrap(), Some(Reply::Granted));
        buf.extend(msg(b'Z', b"I"));
        assert_eq!(c.decode(Op::TryLock, &mut buf).unwrap(), Some(Reply::Busy));
        assert!(buf.is_empty());
        let mut buf = msg(b'N', b"SWARNING\0Mnot held\0\0");
        buf.extend(data_row(b"f"));
        buf.extend(msg(b'Z', b"I"));
        assert_eq!(
            c.decode(Op::Unlock, &mut buf).unwrap(),
            Some(Reply::NotHeld)
        );
        let mut buf = msg(b'E', b"SERROR\0Mdeadlock detected\0\0");
        buf.extend(msg(b'Z', b"I"));
        assert_eq!(
            c.decode(Op::Lock, &mut buf).unwrap(),
            Some(Reply::Error("deadlock detected".into()))
        );
    }

    #[test]
    fn query_text() {
        let mut c = PgLock::new("u".into(), "d".into(), String::new());
        let mut out = Vec::new();
        c.encode(Op::TryLock, b"k", &mut out);
        let sql = String::from_utf8_lossy(&out[5..out.len() - 1]).into_owned();
        assert_eq!(
            sql,
            format!("SELECT pg_try_advisory_lock({})", fnv1a64(b"k") as i64)
        );
    }
}
