//! etcd v3 locks through the gRPC-JSON gateway over plain HTTP/1.1
//! (keep-alive), so no async runtime and no gRPC stack are needed.
//!
//! - once per client: `POST /v3/lease/grant {"TTL":ttl}` → lease ID;
//! - Lock: `POST /v3/lock/lock {"name":b64(key),"lease":ID}` blocks in the
//!   server until this lease owns the lock; it answers the owner key;
//! - Unlock: `POST /v3/lock/unlock {"key":<owner key>}`.
//!
//! etcd queues waiters by creation revision (FIFO) and every grant goes
//! through raft, so every Lock and Unlock is a durable (fsynced) write.
//! The lock API has no try-lock; the config rejects `--mix try-lock`.

use super::{Codec, Op, Reply};

pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        s.push(T[(n >> 18) as usize & 63] as char);
        s.push(T[(n >> 12) as usize & 63] as char);
        s.push(if c.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        s.push(if c.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    s
}

/// A whole HTTP/1.1 response at the front of `buf`: (status, body); drained.
pub fn take_response(buf: &mut Vec<u8>) -> Result<Option<(u16, Vec<u8>)>, String> {
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| "HTTP head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad HTTP status line {status_line:?}"))?;
    let mut content_length = None;
    let mut chunked = false;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                content_length = Some(v.parse::<usize>().map_err(|_| "bad Content-Length")?);
            } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    let body_start = head_end + 4;
    if chunked {
        let mut at = body_start;
        let mut body = Vec::new();
        loop {
            let Some(eol) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
                return Ok(None);
            };
            let size_text =
                std::str::from_utf8(&buf[at..at + eol]).map_err(|_| "bad chunk size")?;
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| format!("bad chunk size {size_text:?}"))?;
            at += eol + 2;
            if buf.len() < at + size + 2 {
                return Ok(None);
            }
            body.extend_from_slice(&buf[at..at + size]);
            at += size + 2;
            if size == 0 {
                buf.drain(..at);
                return Ok(Some((status, body)));
            }
        }
    }
    let len = content_length.ok_or("HTTP response without Content-Length or chunking")?;
    if buf.len() < body_start + len {
        return Ok(None);
    }
    let body = buf[body_start..body_start + len].to_vec();
    buf.drain(..body_start + len);
    Ok(Some((status, body)))
}

/// The string value of `"field":"..."` in a flat JSON text (no escapes in values we read).
pub fn json_string_field(body: &[u8], field: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let pat = format!("\"{field}\"");
    let mut from = 0;
    while let Some(p) = text[from..].find(&pat) {
        let rest = text[from + p + pat.len()..].trim_start();
        if let Some(rest) = rest.strip_prefix(':') {
            let rest = rest.trim_start();
            if let Some(rest) = rest.strip_prefix('"') {
                return rest.find('"').map(|e| rest[..e].to_string());
            }
            // Numbers are also accepted (int64 fields may come unquoted).
            let end = rest
                .find(|c: char| !c.is_ascii_digit() && c != '-')
                .unwrap_or(rest.len());
            if end > 0 {
                return Some(rest[..end].to_string());
            }
        }
        from += p + pat.len();
    }
    None
}

pub struct EtcdLock {
    host: String,
    ttl_s: u64,
    lease: Option<String>,
    owner_key: Option<String>,
}

impl EtcdLock {
    pub fn new(host: String, ttl_s: u64) -> EtcdLock {
        EtcdLock {
            host,
            ttl_s,
            lease: None,
            owner_key: None,
        }
    }

    fn post(&self, path: &str, body: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(
            format!(
                "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                self.host,
                body.len()
            )
            .as_bytes(),
        );
    }
}

impl Codec for EtcdLock {
    fn start_connection(&mut self, out: &mut Vec<u8>) -> bool {
        if self.lease.is_some() {
            return false;
        }
        self.post(
            "/v3/lease/grant",
            &format!("{{\"TTL\":{}}}", self.ttl_s),
            out,
        );
        true
    }

    fn handshake(&mut self, buf: &mut Vec<u8>, _out: &mut Vec<u8>) -> Result<bool, String> {
        let Some((status, body)) = take_response(buf)? else {
            return Ok(false);
        };
        if status != 200 {
            return Err(format!(
                "etcd lease grant: HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            ));
        }
        let id = json_string_field(&body, "ID").ok_or("etcd lease grant: no ID in answer")?;
        self.lease = Some(id);
        Ok(true)
    }

    fn encode(&mut self, op: Op, key: &[u8], out: &mut Vec<u8>) {
        match op {
            Op::Lock | Op::TryLock => {
                let lease = self.lease.clone().unwrap_or_default();
                self.post(
                    "/v3/lock/lock",
                    &format!("{{\"name\":\"{}\",\"lease\":\"{lease}\"}}", base64(key)),
                    out,
                );
            }
            Op::Unlock => {
                let owner = self.owner_key.take().unwrap_or_default();
                self.post("/v3/lock/unlock", &format!("{{\"key\":\"{owner}\"}}"), out);
            }
        }
    }

    fn decode(&mut self, op: Op, buf: &mut Vec<u8>) -> Result<Option<Reply>, String> {
        let Some((status, body)) = take_response(buf)? else {
            return Ok(None);
        };
        if status != 200 {
            return Ok(Some(Reply::Error(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            ))));
        }
        Ok(Some(match op {
            Op::Lock | Op::TryLock => match json_string_field(&body, "key") {
                Some(k) => {
                    self.owner_key = Some(k);
                    Reply::Granted
                }
                None => Reply::Error(format!(
                    "lock answer without key: {}",
                    String::from_utf8_lossy(&body)
                )),
            },
            Op::Unlock => Reply::Released,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_vectors() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn http_responses() {
        let mut b =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}X"
                .to_vec();
        assert_eq!(take_response(&mut b).unwrap(), Some((200, b"{}".to_vec())));
        assert_eq!(b, b"X");
        let mut b =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n1\r\nd\r\n0\r\n\r\n"
                .to_vec();
        assert_eq!(
            take_response(&mut b).unwrap(),
            Some((200, b"abcd".to_vec()))
        );
        assert!(b.is_empty());
        let mut b = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab".to_vec();
        assert_eq!(take_response(&mut b).unwrap(), None);
    }

    #[test]
    fn lock_cycle() {
        let mut c = EtcdLock::new("h:1".into(), 30);
        let mut out = Vec::new();
        assert!(c.start_connection(&mut out));
        assert!(out.starts_with(b"POST /v3/lease/grant HTTP/1.1\r\n"));
        let body = r#"{"header":{"cluster_id":"1","revision":"5"},"ID":"7587868","TTL":"30"}"#;
        let mut b = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes();
        assert!(c.handshake(&mut b, &mut out).unwrap());
        assert!(!c.start_connection(&mut out), "one lease per client");
        out.clear();
        c.encode(Op::Lock, b"foo", &mut out);
        assert!(out.ends_with(br#"{"name":"Zm9v","lease":"7587868"}"#));
        let body = r#"{"header":{"revision":"6"},"key":"Zm9vLzczOGI="}"#;
        let mut b = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes();
        assert_eq!(c.decode(Op::Lock, &mut b).unwrap(), Some(Reply::Granted));
        out.clear();
        c.encode(Op::Unlock, b"foo", &mut out);
        assert!(out.ends_with(br#"{"key":"Zm9vLzczOGI="}"#));
        assert_eq!(
            json_string_field(br#"{"a": 12}"#, "a").as_deref(),
            Some("12")
        );
    }
}
