//! MySQL / MariaDB named locks: `GET_LOCK(name, timeout)` / `RELEASE_LOCK(name)`
//! over the classic client/server protocol (HandshakeV10, Protocol 4.1,
//! `mysql_native_password`, text-protocol COM_QUERY result sets).
//!
//! GET_LOCK blocks in the server up to its timeout (we pass a long one, so a
//! Lock is a true blocking acquire; try-lock passes 0). Locks are bound to
//! the session, so clients keep their connection. Answers: 1 = granted or
//! released, 0 = timed out / not ours, NULL = error or no such lock.

use super::{Codec, Op, Reply};
use crate::sha1::sha1;

const CLIENT_LONG_PASSWORD: u32 = 0x1;
const CLIENT_PROTOCOL_41: u32 = 0x200;
const CLIENT_TRANSACTIONS: u32 = 0x2000;
const CLIENT_SECURE_CONNECTION: u32 = 0x8000;
const CLIENT_PLUGIN_AUTH: u32 = 0x80000;

/// Seconds a blocking GET_LOCK waits before giving up.
pub const LOCK_TIMEOUT_S: u32 = 3600;

pub struct MyLock {
    user: String,
    password: String,
    authed_seq: u8,
}

/// `mysql_native_password`: SHA1(pw) XOR SHA1(scramble ++ SHA1(SHA1(pw))).
pub fn native_password(password: &[u8], scramble: &[u8]) -> Vec<u8> {
    if password.is_empty() {
        return Vec::new();
    }
    let stage1 = sha1(password);
    let stage2 = sha1(&stage1);
    let mut salted = scramble.to_vec();
    salted.extend_from_slice(&stage2);
    let mix = sha1(&salted);
    stage1.iter().zip(mix.iter()).map(|(a, b)| a ^ b).collect()
}

/// One packet: (sequence id, payload). `Ok(None)`: incomplete.
pub fn take_packet(buf: &mut Vec<u8>) -> Option<(u8, Vec<u8>)> {
    let (seq, payload, used) = peek_packet(buf, 0)?;
    let payload = payload.to_vec();
    buf.drain(..used);
    Some((seq, payload))
}

fn peek_packet(buf: &[u8], at: usize) -> Option<(u8, &[u8], usize)> {
    let head = buf.get(at..at + 4)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], 0]) as usize;
    let payload = buf.get(at + 4..at + 4 + len)?;
    Some((head[3], payload, at + 4 + len))
}

pub fn write_packet(seq: u8, payload: &[u8], out: &mut Vec<u8>) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_le_bytes()[..3]);
    out.push(seq);
    out.extend_from_slice(payload);
}

/// Length-encoded integer at `p[at..]`: (value or None for NULL 0xFB, bytes used).
pub fn lenenc(p: &[u8], at: usize) -> Option<(Option<u64>, usize)> {
    let first = *p.get(at)?;
    let le = |n: usize| -> Option<u64> {
        let b = p.get(at + 1..at + 1 + n)?;
        Some(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    };
    match first {
        0xFB => Some((None, 1)),
        0xFC => Some((Some(le(2)?), 3)),
        0xFD => Some((Some(le(3)?), 4)),
        0xFE => Some((Some(le(8)?), 9)),
        v => Some((Some(v as u64), 1)),
    }
}

fn err_text(payload: &[u8]) -> String {
    // 0xFF, u16 code, then '#' + 5-byte SQL state (protocol 4.1), then text.
    let code = payload
        .get(1..3)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .unwrap_or(0);
    let text = if payload.get(3) == Some(&b'#') {
        payload.get(9..)
    } else {
        payload.get(3..)
    };
    format!(
        "MySQL error {code}: {}",
        String::from_utf8_lossy(text.unwrap_or(b""))
    )
}

/// Parse HandshakeV10: returns (scramble, auth plugin name).
pub fn parse_greeting(p: &[u8]) -> Result<(Vec<u8>, String), String> {
    if p.first() == Some(&0xFF) {
        return Err(err_text(p));
    }
    if p.first() != Some(&10) {
        return Err(format!(
            "unsupported MySQL protocol version {:?}",
            p.first()
        ));
    }
    let short = || "short MySQL greeting".to_string();
    let nul = p[1..].iter().position(|&b| b == 0).ok_or_else(short)?;
    let mut at = 1 + nul + 1 + 4; // version string, connection id
    let mut scramble = p.get(at..at + 8).ok_or_else(short)?.to_vec();
    at += 8 + 1; // filler
    let cap_lo = u16::from_le_bytes([
        *p.get(at).ok_or_else(short)?,
        *p.get(at + 1).ok_or_else(short)?,
    ]);
    at += 2 + 1 + 2; // capabilities low, charset, status
    let cap_hi = u16::from_le_bytes([
        *p.get(at).ok_or_else(short)?,
        *p.get(at + 1).ok_or_else(short)?,
    ]);
    let caps = cap_lo as u32 | (cap_hi as u32) << 16;
    at += 2;
    let auth_len = *p.get(at).ok_or_else(short)? as usize;
    at += 1 + 10; // auth data length, reserved
    let mut plugin = "mysql_native_password".to_string();
    if caps & CLIENT_SECURE_CONNECTION != 0 {
        let n = auth_len.saturating_sub(8).max(13);
        let part2 = p.get(at..at + n).ok_or_else(short)?;
        // The last byte of part 2 is a NUL terminator, not scramble.
        scramble.extend_from_slice(&part2[..n - 1]);
        at += n;
    }
    if caps & CLIENT_PLUGIN_AUTH != 0 {
        if let Some(rest) = p.get(at..) {
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            plugin = String::from_utf8_lossy(&rest[..end]).into_owned();
        }
    }
    Ok((scramble, plugin))
}

enum RowResult {
    Incomplete,
    Ok,
    Err(String),
    Value(Option<Vec<u8>>),
}

/// Look for a whole COM_QUERY response at the front of `buf`; drain it if complete.
fn take_result(buf: &mut Vec<u8>) -> Result<RowResult, String> {
    let Some((_, first, mut at)) = peek_packet(buf, 0) else {
        return Ok(RowResult::Incomplete);
    };
    let result = match first.first() {
        Some(0x00) => RowResult::Ok,
        Some(0xFF) => RowResult::Err(err_text(first)),
        Some(_) => {
            let (cols, _) = lenenc(first, 0).ok_or("bad column count")?;
            let cols = cols.ok_or("NULL column count")?;
            for _ in 0..cols {
                let Some((_, _, next)) = peek_packet(buf, at) else {
                    return Ok(RowResult::Incomplete);
                };
                at = next;
            }
            // EOF after the column definitions.
            let Some((_, _, next)) = peek_packet(buf, at) else {
                return Ok(RowResult::Incomplete);
            };
            at = next;
            let mut value = None;
            loop {
                let Some((_, p, next)) = peek_packet(buf, at) else {
                    return Ok(RowResult::Incomplete);
                };
                at = next;
                match p.first() {
                    Some(0xFE) if p.len() < 9 => break,
                    Some(0xFF) => {
                        let e = err_text(p);
                        buf.drain(..at);
                        return Ok(RowResult::Err(e));
                    }
                    _ => {
                        if value.is_none() {
                            let (n, used) = lenenc(p, 0).ok_or("bad row")?;
                            value = Some(match n {
                                None => None,
                                Some(n) => Some(
                                    p.get(used..used + n as usize).ok_or("short row")?.to_vec(),
                                ),
                            });
                        }
                    }
                }
            }
            RowResult::Value(value.flatten())
        }
        None => return Err("empty MySQL packet".into()),
    };
    buf.drain(..at);
    Ok(result)
}

impl MyLock {
    pub fn new(user: String, password: String) -> MyLock {
        MyLock {
            user,
            password,
            authed_seq: 0,
        }
    }

    fn escape(key: &[u8]) -> String {
        key.iter()
            .map(|&b| match b {
                b'\'' => "''".to_string(),
                b'\\' => "\\\\".to_string(),
                b => (b as char).to_string(),
            })
            .collect()
    }
}

impl Codec for MyLock {
    fn start_connection(&mut self, _out: &mut Vec<u8>) -> bool {
        self.authed_seq = 0;
        true // the server speaks first
    }

    fn handshake(&mut self, buf: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<bool, String> {
        while let Some((seq, p)) = take_packet(buf) {
            if self.authed_seq == 0 {
                let (scramble, _plugin) = parse_greeting(&p)?;
                let caps = CLIENT_LONG_PASSWORD
                    | CLIENT_PROTOCOL_41
                    | CLIENT_TRANSACTIONS
                    | CLIENT_SECURE_CONNECTION
                    | CLIENT_PLUGIN_AUTH;
                let mut r = Vec::new();
                r.extend_from_slice(&caps.to_le_bytes());
                r.extend_from_slice(&(16u32 << 20).to_le_bytes());
                r.push(45); // utf8mb4_general_ci
                r.extend_from_slice(&[0; 23]);
                r.extend_from_slice(self.user.as_bytes());
                r.push(0);
                let auth = native_password(self.password.as_bytes(), &scramble);
                r.push(auth.len() as u8);
                r.extend_from_slice(&auth);
                r.extend_from_slice(b"mysql_native_password\0");
                write_packet(seq.wrapping_add(1), &r, out);
                self.authed_seq = seq.wrapping_add(1);
                continue;
            }
            match p.first() {
                Some(0x00) => return Ok(true),
                Some(0xFF) => return Err(err_text(&p)),
                Some(0xFE) => {
                    // AuthSwitchRequest: plugin name NUL, then new scramble.
                    let end = p[1..]
                        .iter()
                        .position(|&b| b == 0)
                        .map_or(p.len(), |x| x + 1);
                    let plugin = String::from_utf8_lossy(&p[1..end]).into_owned();
                    if plugin != "mysql_native_password" {
                        return Err(format!("MySQL auth plugin {plugin:?} unsupported"));
                    }
                    let mut scramble = p.get(end + 1..).unwrap_or(b"").to_vec();
                    if scramble.last() == Some(&0) {
                        scramble.pop();
                    }
                    let auth = native_password(self.password.as_bytes(), &scramble);
                    write_packet(seq.wrapping_add(1), &auth, out);
                }
                other => return Err(format!("unexpected MySQL auth packet {other:?}")),
            }
        }
        Ok(false)
    }

    fn encode(&mut self, op: Op, key: &[u8], out: &mut Vec<u8>) {
        let k = Self::escape(key);
        let sql = match op {
            Op::Lock => format!("SELECT GET_LOCK('{k}',{LOCK_TIMEOUT_S})"),
            Op::TryLock => format!("SELECT GET_LOCK('{k}',0)"),
            Op::Unlock => format!("SELECT RELEASE_LOCK('{k}')"),
        };
        let mut p = vec![0x03];
        p.extend_from_slice(sql.as_bytes());
        write_packet(0, &p, out);
    }

    fn decode(&mut self, op: Op, buf: &mut Vec<u8>) -> Result<Option<Reply>, String> {
        let reply = match take_result(buf)? {
            RowResult::Incomplete => return Ok(None),
            RowResult::Err(e) => Reply::Error(e),
            RowResult::Ok => return Err("MySQL answered OK without a result set".into()),
            RowResult::Value(v) => match (op, v.as_deref()) {
                (Op::Lock | Op::TryLock, Some(b"1")) => Reply::Granted,
                (Op::TryLock, Some(b"0")) => Reply::Busy,
                (Op::Lock, Some(b"0")) => Reply::Error("GET_LOCK timed out".into()),
                (Op::Unlock, Some(b"1")) => Reply::Released,
                (Op::Unlock, Some(b"0") | None) => Reply::NotHeld,
                (op, v) => Reply::Error(format!("unexpected value {v:?} for {op:?}")),
            },
        };
        Ok(Some(reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greeting() -> Vec<u8> {
        let mut p = vec![10];
        p.extend_from_slice(b"5.5.5-10.11.6-MariaDB\0");
        p.extend_from_slice(&7u32.to_le_bytes());
        p.extend_from_slice(b"abcdefgh\0");
        let caps: u32 = 0xF7FE | CLIENT_PLUGIN_AUTH | (CLIENT_SECURE_CONNECTION);
        p.extend_from_slice(&(caps as u16).to_le_bytes());
        p.push(8);
        p.extend_from_slice(&2u16.to_le_bytes());
        p.extend_from_slice(&((caps >> 16) as u16).to_le_bytes());
        p.push(21);
        p.extend_from_slice(&[0; 10]);
        p.extend_from_slice(b"ijklmnopqrst\0");
        p.extend_from_slice(b"mysql_native_password\0");
        p
    }

    #[test]
    fn greeting_scramble() {
        let (s, plugin) = parse_greeting(&greeting()).unwrap();
        assert_eq!(s, b"abcdefghijklmnopqrst");
        assert_eq!(plugin, "mysql_native_password");
    }

    #[test]
    fn native_password_is_20_bytes_and_empty_for_no_password() {
        assert_eq!(native_password(b"", b"x").len(), 0);
        let a = native_password(b"secret", b"abcdefghijklmnopqrst");
        assert_eq!(a.len(), 20);
        // Unscramble as the server does: SHA1(scramble ++ stored) XOR reply == SHA1(pw).
        let mut salted = b"abcdefghijklmnopqrst".to_vec();
        salted.extend_from_slice(&sha1(&sha1(b"secret")));
        let mix = sha1(&salted);
        let stage1: Vec<u8> = a.iter().zip(mix.iter()).map(|(x, y)| x ^ y).collect();
        assert_eq!(stage1, sha1(b"secret"));
    }

    #[test]
    fn handshake_flow() {
        let mut c = MyLock::new("bench".into(), "pw".into());
        let mut out = Vec::new();
        assert!(c.start_connection(&mut out));
        let mut buf = Vec::new();
        write_packet(0, &greeting(), &mut buf);
        assert!(!c.handshake(&mut buf, &mut out).unwrap());
        assert_eq!(out[3], 1, "response has sequence 1");
        assert!(out.windows(6).any(|w| w == b"bench\0"));
        out.clear();
        let mut sw = vec![0xFE];
        sw.extend_from_slice(b"mysql_native_password\0ABCDEFGHIJKLMNOPQRST\0");
        write_packet(2, &sw, &mut buf);
        assert!(!c.handshake(&mut buf, &mut out).unwrap());
        assert_eq!(out.len(), 4 + 20);
        write_packet(4, &[0, 0, 0, 2, 0, 0, 0], &mut buf);
        assert!(c.handshake(&mut buf, &mut out).unwrap());
    }

    fn result_set(value: Option<&[u8]>) -> Vec<u8> {
        let mut b = Vec::new();
        write_packet(1, &[1], &mut b);
        write_packet(2, b"\x03defcoldef", &mut b);
        write_packet(3, &[0xFE, 0, 0, 2, 0], &mut b);
        let row = match value {
            Some(v) => {
                let mut r = vec![v.len() as u8];
                r.extend_from_slice(v);
                r
            }
            None => vec![0xFB],
        };
        write_packet(4, &row, &mut b);
        write_packet(5, &[0xFE, 0, 0, 2, 0], &mut b);
        b
    }

    #[test]
    fn replies() {
        let mut c = MyLock::new("u".into(), String::new());
        let full = result_set(Some(b"1"));
        let mut part = full[..full.len() - 3].to_vec();
        assert_eq!(c.decode(Op::Lock, &mut part).unwrap(), None);
        let mut buf = full.clone();
        buf.extend(result_set(Some(b"0")));
        assert_eq!(c.decode(Op::Lock, &mut buf).unwrap(), Some(Reply::Granted));
        assert_eq!(c.decode(Op::TryLock, &mut buf).unwrap(), Some(Reply::Busy));
        assert!(buf.is_empty());
        assert_eq!(
            c.decode(Op::Unlock, &mut result_set(None)).unwrap(),
            Some(Reply::NotHeld)
        );
        let mut e = Vec::new();
        write_packet(1, b"\xff\x15\x04#HY000oops", &mut e);
        assert_eq!(
            c.decode(Op::Lock, &mut e).unwrap(),
            Some(Reply::Error("MySQL error 1045: oops".into()))
        );
    }

    #[test]
    fn query_and_escaping() {
        let mut c = MyLock::new("u".into(), String::new());
        let mut out = Vec::new();
        c.encode(Op::Lock, b"a'b", &mut out);
        assert_eq!(&out[4..], b"\x03SELECT GET_LOCK('a''b',3600)");
        assert_eq!(lenenc(&[0xFC, 0x01, 0x02], 0), Some((Some(0x0201), 3)));
    }
}
