//! Opening a session: the builder's addresses tried in turn, retried;
//! connecting to one address and the Hello's answer (`docs/protocol.md`,
//! "Opening a session: the Hello"), with the refusals worded for the
//! caller.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::io::PING_RID;
use super::resume;
use crate::client::retry::{OnRetry, RetryPolicy, Streak};
use crate::client::stream::{Dial, Stream};
use crate::lease::{cause_msg, Error};
use crate::protocol::session::{self as wire, Answer, Req, Status, Welcome};

pub(super) enum Hello {
    /// Connecting failed, or the connection failed before the answer: no
    /// session exists, so another attempt is safe.
    Retry(std::io::Error),
    /// `not leader`: another address, first the leader's if it said.
    NotLeader(std::io::Error, Option<SocketAddr>),
    /// The server answered, and the answer is no.
    Final(Error),
}

/// Opens a session at one of `addrs` ([`hello`] to each), as
/// [`SessionBuilder::connect`](super::SessionBuilder::connect) does: each
/// address once a round, a `not leader` hint first (over TLS, verified
/// against the hint's host, or when listed: the Hello carries the auth
/// token); a round that found none is retried as `retry` and `on_retry`
/// allow.
pub(super) fn open(
    dial: &mut Dial,
    addrs: &[SocketAddr],
    keepalive_ms: u32,
    auth: &[u8],
    connect_timeout: Duration,
    retry: RetryPolicy,
    on_retry: Option<&OnRetry>,
) -> Result<(Stream, Welcome), Error> {
    let mut streak = Streak::new(retry);
    loop {
        let mut last = None;
        let mut queue: VecDeque<SocketAddr> = addrs.iter().copied().collect();
        let mut tried = HashSet::new();
        while let Some(addr) = queue.pop_front() {
            if !tried.insert(addr) {
                continue;
            }
            match hello(dial, &addr, keepalive_ms, auth, connect_timeout) {
                Ok(opened) => return Ok(opened),
                Err(Hello::Retry(e)) => last = Some((addr, e)),
                Err(Hello::NotLeader(e, hint)) => {
                    last = Some((addr, e));
                    if let Some(h) = hint.filter(|h| !tried.contains(h)) {
                        if dial.is_tls() || addrs.contains(&h) {
                            dial.name(h, &resume::hint_host(&h.to_string()));
                            queue.retain(|a| *a != h);
                            queue.push_front(h);
                        }
                    }
                }
                Err(Hello::Final(e)) => return Err(e),
            }
        }
        let (addr, e) = last.expect("a resolved address list is never empty");
        match streak.failed_and_asked(Instant::now(), None, addr, &e, on_retry) {
            Some(delay) => std::thread::sleep(delay),
            None => {
                let n = streak.attempts;
                let plural = if n == 1 { "" } else { "s" };
                return Err(Error::Unavailable(cause_msg(format!(
                    "server {addr} unavailable after {n} attempt{plural}: {e}"
                ))));
            }
        }
    }
}

/// Connects to `addr` and opens a session on it.
pub(super) fn hello(
    dial: &Dial,
    addr: &SocketAddr,
    keepalive_ms: u32,
    auth: &[u8],
    timeout: Duration,
) -> std::result::Result<(Stream, Welcome), Hello> {
    use std::io::Read;
    let deadline = Instant::now() + timeout;
    let sock = send_hello(dial, addr, keepalive_ms, auth, timeout)?;
    let mut buf = Vec::with_capacity(64);
    let mut chunk = [0u8; 256];
    loop {
        if let Some(welcome) = welcome_in(addr, &buf)? {
            return Ok((sock, welcome));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Hello::Retry(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no hello reply within {timeout:?}"),
            )));
        }
        sock.set_read_timeout(Some(left)).map_err(Hello::Retry)?;
        match (&sock).read(&mut chunk) {
            Ok(0) => {
                return Err(Hello::Retry(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection before the hello reply (a server \
                     without sessions does that: use ringlock::client::Client there, \
                     `ringlock --persistent` in the CLI)",
                )))
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(tls_final(dial, e)),
        }
    }
}

/// Connects to `addr` and writes the Hello, each within `timeout`.
fn send_hello(
    dial: &Dial,
    addr: &SocketAddr,
    keepalive_ms: u32,
    auth: &[u8],
    timeout: Duration,
) -> std::result::Result<Stream, Hello> {
    use std::io::Write;
    let sock = dial
        .connect(addr, timeout)
        .map_err(|e| tls_final(dial, e))?;
    // Requests are tiny and latency-bound.
    let _ = sock.set_nodelay(true);
    let mut frame = Vec::with_capacity(wire::HEADER + 6 + auth.len());
    wire::encode(
        PING_RID,
        &Req::Hello {
            version: wire::VERSION,
            keepalive_ms,
            auth,
        },
        &mut frame,
    );
    sock.set_write_timeout(Some(timeout))
        .map_err(Hello::Retry)?;
    (&sock).write_all(&frame).map_err(Hello::Retry)?;
    Ok(sock)
}

/// The Hello's answer in `buf` (what `addr` sent so far): `Ok(None)` until
/// it is whole; a Welcome that opens the session; or what is final: the
/// session refused, or bytes that are not the session protocol.
fn welcome_in(addr: &SocketAddr, buf: &[u8]) -> std::result::Result<Option<Welcome>, Hello> {
    if let Some(&first) = buf.first() {
        if first != wire::KIND_REPLY {
            return Err(Hello::Final(Error::Unavailable(cause_msg(format!(
                "{addr} does not speak the session protocol (it answered {first:#04x} to a \
                 Hello): a Locking-Center server, or a ringlockd without sessions (use \
                 ringlock::client::Client there; `ringlock --persistent` in the CLI)"
            )))));
        }
    }
    match wire::decode_answer(buf, Some(PING_RID)) {
        Ok(Some((Answer::Welcome { welcome, .. }, _))) => {
            let refuse = |why: String| {
                Err(Hello::Final(Error::Unavailable(cause_msg(format!(
                    "{addr} refused the session: {why}"
                )))))
            };
            if welcome.status != Status::Ok {
                return refuse(refusal_text(welcome.status));
            }
            if welcome.version != wire::VERSION {
                return refuse(format!("protocol version {}", welcome.version));
            }
            if welcome.keepalive_ms == 0 {
                return refuse("a keep-alive deadline of 0 ms".into());
            }
            Ok(Some(welcome))
        }
        Ok(Some((Answer::Refused { status, detail, .. }, _))) => {
            Err(refused(addr, status, &detail))
        }
        Ok(Some((Answer::Reply { status, .. }, _))) if status != Status::Ok => {
            Err(Hello::Final(Error::Unavailable(cause_msg(format!(
                "{addr} refused the session: {}",
                refusal_text(status)
            )))))
        }
        Ok(Some(_)) | Err(_) => Err(Hello::Final(Error::Unavailable(cause_msg(format!(
            "{addr} broke the session protocol: no hello reply ({} bytes: {:02x?})",
            buf.len(),
            &buf[..buf.len().min(32)]
        ))))),
        Ok(None) => Ok(None),
    }
}

/// A failed connect: a TLS verification failure is final (another try
/// meets the same certificate), anything else is retried.
fn tls_final(dial: &Dial, e: std::io::Error) -> Hello {
    if dial.is_tls() && e.kind() == std::io::ErrorKind::InvalidData {
        Hello::Final(Error::Unavailable(cause_msg(e.to_string())))
    } else {
        Hello::Retry(e)
    }
}

/// What a refused Hello's status means, for the error message.
fn refusal_text(status: Status) -> String {
    match status {
        Status::Unauthorized => "unauthorized (the server has --auth-token-file: give its secret \
                                 to SessionBuilder::auth_token)"
            .into(),
        Status::Invalid => "invalid (the server could not read this client's Hello)".into(),
        Status::TlsRequired => "tls_required (the server takes sessions over TLS only: give \
                                SessionBuilder::tls, `--certs-dir` in the CLI)"
            .into(),
        s => s.name().into(),
    }
}

/// A Hello answered with a status that carries detail: `unsupported
/// version` (final: no address of this server will speak ours) or the
/// reserved `not leader` (try the next address).
fn refused(addr: &SocketAddr, status: Status, detail: &[u8]) -> Hello {
    match status {
        Status::UnsupportedVersion => {
            let spoken: Vec<String> = detail.iter().map(u8::to_string).collect();
            Hello::Final(Error::Unavailable(cause_msg(format!(
                "{addr} refused the session: unsupported version (this client speaks session \
                 protocol version {}, the server speaks version{} {})",
                wire::VERSION,
                if spoken.len() == 1 { "" } else { "s" },
                if spoken.is_empty() {
                    "none".to_string()
                } else {
                    spoken.join(", ")
                }
            ))))
        }
        Status::NotLeader => Hello::NotLeader(
            std::io::Error::other(format!(
                "not the leader{}",
                if detail.is_empty() {
                    String::new()
                } else {
                    format!(" (the leader is {})", String::from_utf8_lossy(detail))
                }
            )),
            std::str::from_utf8(detail)
                .ok()
                .and_then(|t| t.parse::<SocketAddr>().ok()),
        ),
        s => Hello::Final(Error::Unavailable(cause_msg(format!(
            "{addr} refused the session: {}",
            s.name()
        )))),
    }
}
