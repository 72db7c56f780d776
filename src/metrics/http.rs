//! The HTTP endpoint: `/metrics`, `/livez`, `/readyz`, `/healthz`
//! (`/readyz` of a cluster node: 200 only while it serves every shard).
//!
//! Invariants:
//! - It shares nothing with the lock loop but `Arc<Metrics>` (atomics), so a
//!   slow, stuck or hostile client can cost the loop nothing.
//! - Connections are served concurrently, each on its own short-lived thread,
//!   at most [`Options::connections_max`] at once. The acceptor thread never
//!   waits for a client: beyond the bound it answers `503` at once and closes,
//!   so idle or slow connections delay nobody's probe while the bound holds,
//!   and cost a fixed amount of memory when it does not.
//! - Every connection has hard deadlines: its whole request head within
//!   [`Options::request_timeout`] (a client trickling bytes cannot extend
//!   it), its whole answer within [`WRITE_TIMEOUT`], then a lingering close of
//!   at most 100 ms. So a handler thread lives a few seconds at most and every
//!   slot frees itself.
//! - The request head is read into a fixed buffer and parsed by `httparse`;
//!   anything longer is refused (431). One request per connection
//!   (`Connection: close`). Nothing a client sends makes the endpoint
//!   allocate without bound.

use super::registry::{monotonic_ms, Liveness, Metrics};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Longest accepted request head (request line plus headers).
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;
/// Most header lines a request may have (beyond: 431).
const HEADERS_MAX: usize = 64;
/// Time a client has to send its whole request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Time the whole answer may take to write (all writes together).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; beyond, `503` and close. Probes and a few
/// scrapers need a handful; the rest is room for idle or slow clients.
pub const CONNECTIONS_MAX: usize = 32;
/// Longest the handler drains a client's leftover input after an error answer.
const LINGER_TIMEOUT: Duration = Duration::from_millis(100);
/// A handler needs little stack: the head buffer and the body are on the heap.
const HANDLER_STACK_BYTES: usize = 128 * 1024;

const CONTENT_TYPE_METRICS: &str = "text/plain; version=0.0.4; charset=utf-8";
const CONTENT_TYPE_TEXT: &str = "text/plain; charset=utf-8";

/// Limits and bounds of the endpoint.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Deadline for the whole request head (default [`REQUEST_TIMEOUT`]).
    pub request_timeout: Duration,
    /// A loop whose heartbeat is older than this fails liveness (default
    /// 10 s, `--liveness-timeout`).
    pub liveness_timeout: Duration,
    /// Connections served at once (default [`CONNECTIONS_MAX`]).
    pub connections_max: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            request_timeout: REQUEST_TIMEOUT,
            liveness_timeout: Duration::from_millis(crate::config::LIVENESS_TIMEOUT_MS_DEFAULT),
            connections_max: CONNECTIONS_MAX,
        }
    }
}

/// Binds `addr` now (so a bad address or a port in use is the caller's error
/// to report), then serves on spawned threads with the default [`Options`].
/// Returns the bound address (useful with port 0).
pub fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<SocketAddr> {
    serve_with(addr, metrics, Options::default())
}

/// [`serve`] with explicit limits (the server passes its liveness timeout;
/// tests use short deadlines and small bounds).
pub fn serve_with(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    options: Options,
) -> io::Result<SocketAddr> {
    assert!(
        options.connections_max >= 1,
        "at least one connection is served"
    );
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    thread::Builder::new()
        .name("ringlock-http".to_string())
        .spawn(move || accept_loop(listener, metrics, options))?;
    Ok(local)
}

/// Frees a connection slot when its handler ends, however it ends.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn accept_loop(listener: TcpListener, metrics: Arc<Metrics>, options: Options) {
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            // EMFILE and friends: back off rather than spin on accept.
            Err(_) => {
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        // Only this thread takes slots, so the check and the increment
        // cannot race past the bound; handlers only give slots back.
        if active.load(Ordering::Acquire) >= options.connections_max {
            refuse(stream);
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(Arc::clone(&active));
        let metrics = Arc::clone(&metrics);
        // If the spawn fails, the closure (with the stream and the slot) is
        // dropped: the connection closes and the slot is given back.
        let _ = thread::Builder::new()
            .name("ringlock-http-conn".to_string())
            .stack_size(HANDLER_STACK_BYTES)
            .spawn(move || {
                let _slot = slot;
                // A failing connection only affects that client.
                let _ = handle(stream, &metrics, &options);
            });
    }
}

/// Over the bound: `503` without waiting for anything, then close. Whatever
/// the client already sent is read first, so the close does not turn into a
/// reset that could destroy the answer (best effort: nothing here may block).
fn refuse(mut stream: TcpStream) {
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
    let body = "too many connections to the metrics endpoint\n";
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: {CONTENT_TYPE_TEXT}\r\nContent-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write(answer.as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

/// The endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Metrics,
    Livez,
    /// `/readyz`, and `/healthz` with the same meaning.
    Readyz,
    NotFound,
}

/// What the request head said, or why it cannot be answered normally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parsed {
    /// Not a whole head yet.
    Partial,
    Get(Route),
    OtherMethod,
    TooManyHeaders,
    Malformed,
}

fn parse(head: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Partial) => Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => Parsed::TooManyHeaders,
        Err(_) => Parsed::Malformed,
        Ok(httparse::Status::Complete(_)) => {
            let (Some(method), Some(target)) = (req.method, req.path) else {
                return Parsed::Malformed;
            };
            // Origin form only: `GET http://host/metrics` or `*` is not ours.
            if !target.starts_with('/') {
                return Parsed::Malformed;
            }
            if method != "GET" {
                return Parsed::OtherMethod;
            }
            let path = target.split_once('?').map_or(target, |(p, _)| p);
            Parsed::Get(match path {
                "/metrics" => Route::Metrics,
                "/livez" => Route::Livez,
                "/readyz" | "/healthz" => Route::Readyz,
                _ => Route::NotFound,
            })
        }
    }
}

/// Reads one request head from `stream` (within the request timeout) and
/// answers it.
fn handle(mut stream: TcpStream, metrics: &Metrics, options: &Options) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let deadline = Instant::now() + options.request_timeout;
    let mut head = vec![0u8; REQUEST_HEAD_BYTES_MAX];
    let mut filled = 0;
    let parsed = loop {
        if filled > 0 {
            match parse(&head[..filled]) {
                Parsed::Partial => {}
                done => break done,
            }
        }
        if filled == head.len() {
            break Parsed::TooManyHeaders;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return respond(&mut stream, 408, "Request Timeout", "request timeout\n");
        }
        // The deadline covers the whole head: a client that trickles one byte
        // at a time cannot extend it.
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut head[filled..]) {
            Ok(0) if filled == 0 => return Ok(()), // connected and left: nothing to answer
            Ok(0) => return respond(&mut stream, 400, "Bad Request", "incomplete request\n"),
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return respond(&mut stream, 408, "Request Timeout", "request timeout\n");
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    drop(head);
    answer(&mut stream, parsed, metrics, options)
}

/// Answers the request whose whole head is `parsed`.
fn answer(
    stream: &mut TcpStream,
    parsed: Parsed,
    metrics: &Metrics,
    options: &Options,
) -> io::Result<()> {
    match parsed {
        Parsed::Partial => unreachable!("the read loop only ends on a whole head"),
        Parsed::Malformed => respond(stream, 400, "Bad Request", "malformed request\n"),
        Parsed::TooManyHeaders => respond(
            stream,
            431,
            "Request Header Fields Too Large",
            "request head too large\n",
        ),
        Parsed::OtherMethod => respond(stream, 405, "Method Not Allowed", "only GET is allowed\n"),
        Parsed::Get(Route::Metrics) => {
            let mut body = String::with_capacity(16 * 1024);
            metrics.render(&mut body, now_unix_ms());
            write_answer(stream, 200, "OK", CONTENT_TYPE_METRICS, &body)
        }
        Parsed::Get(Route::Livez) => {
            let (code, body) = match liveness(metrics, options) {
                Liveness::Live => (200, "ok\n".to_string()),
                Liveness::Starting => (
                    200,
                    "starting: recovery is not done; loops are judged once it is\n".to_string(),
                ),
                Liveness::Stalled { loop_index, age_ms } => {
                    (503, stall_reason(loop_index, age_ms, options))
                }
            };
            answer_text(stream, code, &body)
        }
        Parsed::Get(Route::Readyz) => {
            let (code, body) = match liveness(metrics, options) {
                // A cluster node is ready only while it serves: a load
                // balancer then routes clients to the leader alone.
                Liveness::Live => match metrics.not_serving() {
                    None => (200, "ok\n".to_string()),
                    Some(why) => (503, why),
                },
                Liveness::Starting => (503, "recovering\n".to_string()),
                Liveness::Stalled { loop_index, age_ms } => {
                    (503, stall_reason(loop_index, age_ms, options))
                }
            };
            answer_text(stream, code, &body)
        }
        Parsed::Get(Route::NotFound) => respond(
            stream,
            404,
            "Not Found",
            "not found; try /metrics, /livez, /readyz or /healthz\n",
        ),
    }
}

fn liveness(metrics: &Metrics, options: &Options) -> Liveness {
    let bound_ms = u64::try_from(options.liveness_timeout.as_millis()).unwrap_or(u64::MAX);
    metrics.liveness(monotonic_ms(), bound_ms)
}

fn stall_reason(loop_index: usize, age_ms: u64, options: &Options) -> String {
    format!(
        "stalled: event loop {loop_index} made no progress for {age_ms} ms (bound {} ms)\n",
        options.liveness_timeout.as_millis()
    )
}

fn answer_text(stream: &mut TcpStream, code: u16, body: &str) -> io::Result<()> {
    let reason = if code == 200 {
        "OK"
    } else {
        "Service Unavailable"
    };
    write_answer(stream, code, reason, CONTENT_TYPE_TEXT, body)
}

/// An error answer: plain text, then a lingering close.
fn respond(stream: &mut TcpStream, code: u16, reason: &str, body: &str) -> io::Result<()> {
    write_answer(stream, code, reason, CONTENT_TYPE_TEXT, body)
}

fn write_answer(
    stream: &mut TcpStream,
    code: u16,
    reason: &str,
    content_type: &str,
    body: &str,
) -> io::Result<()> {
    let allow = if code == 405 { "Allow: GET\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    let deadline = Instant::now() + WRITE_TIMEOUT;
    write_all_by(stream, head.as_bytes(), deadline)?;
    write_all_by(stream, body.as_bytes(), deadline)?;
    // Tell the client we are done; it then closes first, so our close does
    // not reset the connection before the answer is read.
    stream.shutdown(std::net::Shutdown::Write)?;
    if code >= 400 {
        linger(stream);
    }
    Ok(())
}

/// `write_all` with one deadline for all of it: a client that reads a byte
/// now and then cannot keep the handler (and its slot) forever.
fn write_all_by(stream: &mut TcpStream, mut buf: &[u8], deadline: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// After an error answer the client may still be sending (a huge head, a
/// body). Closing with unread input makes the kernel send RST, which can
/// destroy our answer before the client reads it, so read and discard for a
/// short, bounded while first ("lingering close").
fn linger(stream: &mut TcpStream) {
    const LINGER_BYTES_MAX: usize = 256 * 1024;
    let deadline = Instant::now() + LINGER_TIMEOUT;
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < LINGER_BYTES_MAX {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => drained += n,
        }
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_request_heads_with_httparse() {
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Parsed::Get(Route::Metrics)
        );
        assert_eq!(
            parse(b"GET /healthz?x=1 HTTP/1.0\r\n\r\n"),
            Parsed::Get(Route::Readyz)
        );
        assert_eq!(
            parse(b"GET /readyz HTTP/1.1\r\n\r\n"),
            Parsed::Get(Route::Readyz)
        );
        assert_eq!(
            parse(b"GET /livez HTTP/1.1\r\n\r\n"),
            Parsed::Get(Route::Livez)
        );
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\n\n"),
            Parsed::Get(Route::Metrics)
        );
        assert_eq!(
            parse(b"GET /nope HTTP/1.1\r\n\r\n"),
            Parsed::Get(Route::NotFound)
        );
        assert_eq!(
            parse(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Parsed::OtherMethod
        );
        assert_eq!(parse(b"GET /metrics HTTP/1.1\r\nHo"), Parsed::Partial);
        assert_eq!(parse(b"GET /metr"), Parsed::Partial);
        assert_eq!(parse(b"GET /metrics\r\n\r\n"), Parsed::Malformed);
        assert_eq!(parse(b"GET  /metrics HTTP/1.1\r\n\r\n"), Parsed::Malformed);
        assert_eq!(parse(b"GET /metrics HTTP/2\r\n\r\n"), Parsed::Malformed);
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\r\nbroken header\r\n\r\n"),
            Parsed::Malformed
        );
        assert_eq!(
            parse(b"GET http://x/metrics HTTP/1.1\r\n\r\n"),
            Parsed::Malformed
        );
        assert_eq!(parse(b"\x16\x03\x01 / HTTP/1.1\r\n\r\n"), Parsed::Malformed);
        let many = format!(
            "GET /metrics HTTP/1.1\r\n{}\r\n",
            "X: y\r\n".repeat(HEADERS_MAX + 1)
        );
        assert_eq!(parse(many.as_bytes()), Parsed::TooManyHeaders);
    }
}
