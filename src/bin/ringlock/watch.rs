//! `ringlock watch KEY`: the key's holders, then one line per change, as
//! the server pushes them (a session's key watch). When the connection
//! fails under a replicated session, the session is resumed and the key
//! watched again: a `resync` line, then the holders as they are then
//! (what changed in between is not replayed, and the output says so).

use std::io::{self, Write};

use ringlock::client::{Access, EventKind, HeldAs, Holder};

use crate::bytes;
use crate::conn::Conn;
use crate::exit::{Fail, EX_IOERR, EX_UNAVAILABLE};
use crate::failure::lease_fail;

pub(crate) fn run(conn: &Conn, key: &[u8], json: bool, count: Option<u64>) -> Result<u8, Fail> {
    let shown = bytes::escape(key);
    let what = format!("watch {shown}");
    let session = conn.session_with(&what, None, None)?;
    let out = io::stdout();
    let mut out = out.lock();
    let mut changes = 0u64;
    let mut first = true;
    loop {
        if count.is_some_and(|n| changes >= n) {
            return Ok(0);
        }
        let mut w = match session.watch(key) {
            Ok(w) => w,
            Err(e) if !first && session.ended().is_none() => {
                // The resume is still under way: the next try waits for it.
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
            Err(e) => return Err(lease_fail(&e, Some(&session), &what)),
        };
        if !first {
            line(&mut out, json, "resync", key, None)?;
        }
        first = false;
        for h in w.holders() {
            line(&mut out, json, EventKind::Holder.name(), key, Some(h))?;
        }
        loop {
            if count.is_some_and(|n| changes >= n) {
                return Ok(0);
            }
            match w.next(None) {
                Ok(Some(e)) => {
                    line(&mut out, json, e.kind.name(), key, Some(&e.holder))?;
                    changes += 1;
                }
                Ok(None) => {}
                Err(e) => {
                    if let Some((_, cause)) = session.ended() {
                        return Err(Fail(
                            EX_UNAVAILABLE,
                            format!("{what}: the session ended: {cause}"),
                        ));
                    }
                    // The connection failed and the session was resumed:
                    // watch again.
                    let _ = e;
                    break;
                }
            }
        }
    }
}

/// One output line, flushed at once (a pipe's reader sees each change as
/// it happens).
fn line(
    out: &mut impl Write,
    json: bool,
    event: &str,
    key: &[u8],
    h: Option<&Holder>,
) -> Result<(), Fail> {
    let mode = |h: &Holder| match h.hold {
        HeldAs::Session => "session",
        HeldAs::Lease => "lease",
        HeldAs::Persistent => "persistent",
    };
    let written = if json {
        let text = |b: &[u8]| bytes::printable_utf8(b).map_or("null".into(), bytes::json_str);
        match h {
            None => writeln!(
                out,
                "{{\"event\":\"{event}\",\"key\":{},\"key_hex\":\"{}\"}}",
                text(key),
                bytes::hex(key)
            ),
            Some(h) => writeln!(
                out,
                "{{\"event\":\"{event}\",\"key\":{},\"key_hex\":\"{}\",\"token\":{},\"mode\":\"{}\",\"access\":\"{}\",\"slots\":{},\"source\":{},\"source_hex\":\"{}\"}}",
                text(key),
                bytes::hex(key),
                h.token,
                mode(h),
                h.access.name(),
                match h.access {
                    Access::Semaphore(n) => n.to_string(),
                    _ => "null".into(),
                },
                text(&h.source),
                bytes::hex(&h.source)
            ),
        }
    } else {
        match h {
            None => writeln!(out, "{event}"),
            Some(h) => writeln!(
                out,
                "{event} {} {} {} {}",
                h.token,
                mode(h),
                match h.access {
                    Access::Semaphore(n) => format!("semaphore/{n}"),
                    a => a.name().to_string(),
                },
                if h.source.is_empty() {
                    "-".to_string()
                } else {
                    bytes::escape(&h.source)
                }
            ),
        }
    };
    written
        .and_then(|()| out.flush())
        .map_err(|e| Fail(EX_IOERR, format!("watch: writing the output failed: {e}")))
}
