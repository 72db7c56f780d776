//! The scrape endpoint: a deliberately tiny HTTP/1.1 server on one std thread.
//!
//! Invariants:
//! - It shares nothing with the lock loop but `Arc<Metrics>` (atomics), so a
//!   slow, stuck or hostile scraper can cost the loop nothing.
//! - One connection at a time, one request per connection (`Connection:
//!   close`). Every connection has a hard deadline for its request head and a
//!   write timeout for the answer, so one bad scraper delays the next one by
//!   at most that long and can never wedge the thread.
//! - The request head is read into a fixed buffer; anything longer is refused
//!   (431). Nothing a client sends makes the thread allocate without bound.

use super::Metrics;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Longest accepted request head (request line plus headers).
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;
/// Time a client has to send its whole request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a single write of the answer may block.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest the thread drains a client's leftover input after an error answer.
const LINGER_TIMEOUT: Duration = Duration::from_millis(100);

const CONTENT_TYPE_METRICS: &str = "text/plain; version=0.0.4; charset=utf-8";
const CONTENT_TYPE_TEXT: &str = "text/plain; charset=utf-8";

/// Binds `addr` now (so a bad address or a port in use is the caller's error
/// to report), then serves `GET /metrics` and `GET /healthz` on one spawned
/// thread. Returns the bound address (useful with port 0).
pub fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<SocketAddr> {
    serve_with_timeout(addr, metrics, REQUEST_TIMEOUT)
}

/// [`serve`] with a custom request-head deadline (tests use a short one).
pub fn serve_with_timeout(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    request_timeout: Duration,
) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    thread::Builder::new()
        .name("ringlock-metrics".to_string())
        .spawn(move || accept_loop(listener, &metrics, request_timeout))?;
    Ok(local)
}

fn accept_loop(listener: TcpListener, metrics: &Metrics, request_timeout: Duration) {
    // Reused across scrapes: after the first scrape no allocation is needed.
    let mut body = String::with_capacity(16 * 1024);
    let mut head = vec![0u8; REQUEST_HEAD_BYTES_MAX];
    for stream in listener.incoming() {
        match stream {
            // A failing connection only affects that scraper.
            Ok(stream) => {
                let _ = handle(stream, metrics, request_timeout, &mut head, &mut body);
            }
            // EMFILE and friends: back off rather than spin on accept.
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// What the request head said, or why it cannot be answered normally.
#[derive(Debug, PartialEq, Eq)]
enum Request<'a> {
    Get(&'a str),
    OtherMethod,
    Malformed,
}

fn handle(
    mut stream: TcpStream,
    metrics: &Metrics,
    request_timeout: Duration,
    head: &mut [u8],
    body: &mut String,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let deadline = Instant::now() + request_timeout;
    let mut filled = 0;
    let head_len = loop {
        if let Some(end) = head_end(&head[..filled]) {
            break end;
        }
        if filled == head.len() {
            return respond(
                &mut stream,
                431,
                "Request Header Fields Too Large",
                CONTENT_TYPE_TEXT,
                "request head too large\n",
            );
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return respond(
                &mut stream,
                408,
                "Request Timeout",
                CONTENT_TYPE_TEXT,
                "request timeout\n",
            );
        }
        // The deadline covers the whole head: a client that trickles one byte
        // at a time cannot extend it.
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut head[filled..]) {
            Ok(0) if filled == 0 => return Ok(()), // connected and left: nothing to answer
            Ok(0) => {
                return respond(
                    &mut stream,
                    400,
                    "Bad Request",
                    CONTENT_TYPE_TEXT,
                    "incomplete request\n",
                )
            }
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return respond(
                    &mut stream,
                    408,
                    "Request Timeout",
                    CONTENT_TYPE_TEXT,
                    "request timeout\n",
                );
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    match parse(&head[..head_len]) {
        Request::Malformed => respond(
            &mut stream,
            400,
            "Bad Request",
            CONTENT_TYPE_TEXT,
            "malformed request\n",
        ),
        Request::OtherMethod => respond(
            &mut stream,
            405,
            "Method Not Allowed",
            CONTENT_TYPE_TEXT,
            "only GET is allowed\n",
        ),
        Request::Get("/metrics") => {
            body.clear();
            metrics.render(body, now_unix_ms());
            respond(&mut stream, 200, "OK", CONTENT_TYPE_METRICS, body)
        }
        Request::Get("/healthz") if metrics.is_ready() => {
            respond(&mut stream, 200, "OK", CONTENT_TYPE_TEXT, "ok\n")
        }
        Request::Get("/healthz") => respond(
            &mut stream,
            503,
            "Service Unavailable",
            CONTENT_TYPE_TEXT,
            "recovering\n",
        ),
        Request::Get(_) => respond(
            &mut stream,
            404,
            "Not Found",
            CONTENT_TYPE_TEXT,
            "not found; try /metrics or /healthz\n",
        ),
    }
}

/// Length of the head including its blank line, if it is complete.
fn head_end(buf: &[u8]) -> Option<usize> {
    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
        return Some(i + 4);
    }
    // Bare-LF line endings, as some hand-written clients send.
    buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2)
}

fn parse(head: &[u8]) -> Request<'_> {
    let Ok(text) = std::str::from_utf8(head) else {
        return Request::Malformed;
    };
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let Some(request_line) = lines.next() else {
        return Request::Malformed;
    };
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Request::Malformed;
    };
    let is_token = !method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase());
    if !is_token || !target.starts_with('/') || !matches!(version, "HTTP/1.0" | "HTTP/1.1") {
        return Request::Malformed;
    }
    // Header lines must be `name: value`; the blank line(s) at the end are allowed.
    for line in lines {
        if !line.is_empty() && !matches!(line.find(':'), Some(i) if i > 0) {
            return Request::Malformed;
        }
    }
    if method != "GET" {
        return Request::OtherMethod;
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    Request::Get(path)
}

fn respond(
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
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()?;
    // Tell the client we are done; it then closes first, so our close does
    // not reset the connection before the answer is read.
    stream.shutdown(std::net::Shutdown::Write)?;
    if code >= 400 {
        linger(stream);
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
    fn parses_request_lines() {
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Request::Get("/metrics")
        );
        assert_eq!(
            parse(b"GET /healthz?x=1 HTTP/1.0\r\n\r\n"),
            Request::Get("/healthz")
        );
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\n\n"),
            Request::Get("/metrics")
        );
        assert_eq!(
            parse(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Request::OtherMethod
        );
        assert_eq!(parse(b"GET /metrics\r\n\r\n"), Request::Malformed);
        assert_eq!(parse(b"GET  /metrics HTTP/1.1\r\n\r\n"), Request::Malformed);
        assert_eq!(parse(b"GET /metrics HTTP/2\r\n\r\n"), Request::Malformed);
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\r\nbroken header\r\n\r\n"),
            Request::Malformed
        );
        assert_eq!(
            parse(b"\x16\x03\x01 / HTTP/1.1\r\n\r\n"),
            Request::Malformed
        );
    }

    #[test]
    fn finds_the_end_of_the_head() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
    }
}
