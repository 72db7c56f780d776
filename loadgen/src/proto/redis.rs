//! Redis lock: the single-instance recipe from the Redis documentation.
//!
//! - acquire: `SET key token NX PX ttl` (`+OK` = ours, nil = taken);
//! - release: a compare-and-delete script (`GET == token ? DEL : 0`) run with
//!   `EVALSHA`, loaded once per client with `SCRIPT LOAD`.
//!
//! Redis has no blocking acquire and no wait queue, so a blocking Lock is a
//! client-side spin: the engine retries `SET NX` after a short jittered
//! back-off and counts the retries. Order among waiters is whoever retries
//! first after the release — no FIFO.

use super::{Codec, Op, Reply};
use crate::sha1::{hex, sha1};

pub const RELEASE_SCRIPT: &str =
    "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Value>>),
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| from + p)
}

/// Parse one RESP2 value at `buf[pos..]`. `Ok(None)`: need more bytes.
/// Returns the value and the position just after it.
pub fn parse(buf: &[u8], pos: usize) -> Result<Option<(Value, usize)>, String> {
    let Some(&tag) = buf.get(pos) else {
        return Ok(None);
    };
    let Some(eol) = find_crlf(buf, pos + 1) else {
        return Ok(None);
    };
    let line = std::str::from_utf8(&buf[pos + 1..eol]).map_err(|_| "RESP line is not UTF-8")?;
    let next = eol + 2;
    let int = || {
        line.parse::<i64>()
            .map_err(|_| format!("bad RESP integer {line:?}"))
    };
    match tag {
        b'+' => Ok(Some((Value::Simple(line.to_string()), next))),
        b'-' => Ok(Some((Value::Error(line.to_string()), next))),
        b':' => Ok(Some((Value::Int(int()?), next))),
        b'$' => {
            let n = int()?;
            if n < 0 {
                return Ok(Some((Value::Bulk(None), next)));
            }
            let end = next + n as usize;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err("RESP bulk string not terminated by CRLF".into());
            }
            Ok(Some((Value::Bulk(Some(buf[next..end].to_vec())), end + 2)))
        }
        b'*' => {
            let n = int()?;
            if n < 0 {
                return Ok(Some((Value::Array(None), next)));
            }
            let mut items = Vec::with_capacity(n.min(1024) as usize);
            let mut at = next;
            for _ in 0..n {
                match parse(buf, at)? {
                    Some((v, after)) => {
                        items.push(v);
                        at = after;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Value::Array(Some(items)), at)))
        }
        other => Err(format!("bad RESP type byte 0x{other:02x}")),
    }
}

/// Append a command as a RESP array of bulk strings.
pub fn encode_command(args: &[&[u8]], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

pub struct RedisLock {
    client: usize,
    ttl_ms: String,
    counter: u64,
    token: Vec<u8>,
    script_sha: String,
    script_loaded: bool,
}

impl RedisLock {
    pub fn new(client: usize, ttl_ms: u64) -> RedisLock {
        RedisLock {
            client,
            ttl_ms: ttl_ms.to_string(),
            counter: 0,
            token: Vec::new(),
            script_sha: hex(&sha1(RELEASE_SCRIPT.as_bytes())),
            script_loaded: false,
        }
    }

    fn take(buf: &mut Vec<u8>) -> Result<Option<Value>, String> {
        match parse(buf, 0)? {
            Some((v, used)) => {
                buf.drain(..used);
                Ok(Some(v))
            }
            None => Ok(None),
        }
    }
}

impl Codec for RedisLock {
    fn start_connection(&mut self, out: &mut Vec<u8>) -> bool {
        if self.script_loaded {
            return false;
        }
        encode_command(&[b"SCRIPT", b"LOAD", RELEASE_SCRIPT.as_bytes()], out);
        true
    }

    fn handshake(&mut self, buf: &mut Vec<u8>, _out: &mut Vec<u8>) -> Result<bool, String> {
        match Self::take(buf)? {
            None => Ok(false),
            Some(Value::Bulk(Some(sha))) if sha == self.script_sha.as_bytes() => {
                self.script_loaded = true;
                Ok(true)
            }
            Some(other) => Err(format!("SCRIPT LOAD answered {other:?}")),
        }
    }

    fn encode(&mut self, op: Op, key: &[u8], out: &mut Vec<u8>) {
        match op {
            Op::Lock | Op::TryLock => {
                if op == Op::TryLock || self.token.is_empty() {
                    self.counter += 1;
                    self.token = format!("{}:{}", self.client, self.counter).into_bytes();
                }
                encode_command(
                    &[
                        b"SET",
                        key,
                        &self.token,
                        b"NX",
                        b"PX",
                        self.ttl_ms.as_bytes(),
                    ],
                    out,
                );
            }
            Op::Unlock => {
                encode_command(
                    &[
                        b"EVALSHA",
                        self.script_sha.as_bytes(),
                        b"1",
                        key,
                        &self.token,
                    ],
                    out,
                );
            }
        }
    }

    fn decode(&mut self, op: Op, buf: &mut Vec<u8>) -> Result<Option<Reply>, String> {
        let Some(v) = Self::take(buf)? else {
            return Ok(None);
        };
        let reply = match (op, v) {
            (_, Value::Error(e)) => Reply::Error(e),
            (Op::Lock | Op::TryLock, Value::Simple(s)) if s == "OK" => Reply::Granted,
            (Op::Lock, Value::Bulk(None)) => Reply::Retry,
            (Op::TryLock, Value::Bulk(None)) => Reply::Busy,
            (Op::Unlock, Value::Int(1)) => {
                self.token.clear();
                Reply::Released
            }
            (Op::Unlock, Value::Int(0)) => {
                self.token.clear();
                Reply::NotHeld
            }
            (op, other) => return Err(format!("unexpected Redis reply to {op:?}: {other:?}")),
        };
        Ok(Some(reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_values() {
        assert_eq!(
            parse(b"+OK\r\n", 0).unwrap(),
            Some((Value::Simple("OK".into()), 5))
        );
        assert_eq!(parse(b":12\r\n", 0).unwrap(), Some((Value::Int(12), 5)));
        assert_eq!(parse(b"$-1\r\n", 0).unwrap(), Some((Value::Bulk(None), 5)));
        assert_eq!(
            parse(b"$3\r\nabc\r\n", 0).unwrap(),
            Some((Value::Bulk(Some(b"abc".to_vec())), 9))
        );
        assert_eq!(parse(b"$3\r\nab", 0).unwrap(), None);
        assert_eq!(parse(b"+OK\r", 0).unwrap(), None);
        assert_eq!(
            parse(b"*2\r\n:1\r\n$1\r\nx\r\n", 0).unwrap(),
            Some((
                Value::Array(Some(vec![Value::Int(1), Value::Bulk(Some(b"x".to_vec()))])),
                15
            ))
        );
        assert_eq!(parse(b"*2\r\n:1\r\n", 0).unwrap(), None);
        assert!(parse(b"?x\r\n", 0).is_err());
        assert!(parse(b"$1\r\nabc", 0).is_err());
    }

    #[test]
    fn commands() {
        let mut out = Vec::new();
        encode_command(&[b"GET", b"k"], &mut out);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }

    #[test]
    fn lock_cycle() {
        let mut c = RedisLock::new(7, 30000);
        let mut out = Vec::new();
        assert!(c.start_connection(&mut out));
        assert!(out.starts_with(b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n"));
        let sha = c.script_sha.clone();
        let mut buf = format!("$40\r\n{sha}\r\n").into_bytes();
        assert!(c.handshake(&mut buf, &mut out).unwrap());
        assert!(buf.is_empty());
        assert!(
            !c.start_connection(&mut out),
            "script is loaded once per client"
        );

        out.clear();
        c.encode(Op::Lock, b"k1", &mut out);
        assert_eq!(
            out,
            b"*6\r\n$3\r\nSET\r\n$2\r\nk1\r\n$3\r\n7:1\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n30000\r\n"
        );
        assert_eq!(
            c.decode(Op::Lock, &mut b"$-1\r\n".to_vec()).unwrap(),
            Some(Reply::Retry)
        );
        out.clear();
        c.encode(Op::Lock, b"k1", &mut out);
        assert!(
            out.windows(3).any(|w| w == b"7:1"),
            "a retry keeps its token"
        );
        assert_eq!(
            c.decode(Op::Lock, &mut b"+OK\r\n".to_vec()).unwrap(),
            Some(Reply::Granted)
        );
        out.clear();
        c.encode(Op::Unlock, b"k1", &mut out);
        assert!(out.starts_with(b"*5\r\n$7\r\nEVALSHA\r\n$40\r\n"));
        assert_eq!(
            c.decode(Op::Unlock, &mut b":1\r\n".to_vec()).unwrap(),
            Some(Reply::Released)
        );
        out.clear();
        c.encode(Op::Lock, b"k1", &mut out);
        assert!(
            out.windows(3).any(|w| w == b"7:2"),
            "a new cycle takes a new token"
        );
        assert_eq!(
            c.decode(Op::TryLock, &mut b"$-1\r\n".to_vec()).unwrap(),
            Some(Reply::Busy)
        );
        assert_eq!(
            c.decode(Op::Unlock, &mut b":0\r\n".to_vec()).unwrap(),
            Some(Reply::NotHeld)
        );
        assert!(matches!(
            c.decode(Op::Lock, &mut b"-ERR x\r\n".to_vec()).unwrap(),
            Some(Reply::Error(_))
        ));
    }

    #[test]
    fn script_digest_is_sha1_of_the_script() {
        assert_eq!(RedisLock::new(0, 1).script_sha.len(), 40);
    }
}
