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
    follow(conn, key, "watch", count, &mut |out, seen| match seen {
        Seen::Resync => line(out, json, "resync", key, None).map(|()| false),
        Seen::Holder(h) => line(out, json, EventKind::Holder.name(), key, Some(h)).map(|()| false),
        Seen::Listed => Ok(false),
        Seen::Change(kind, h) => line(out, json, kind.name(), key, Some(h)).map(|()| true),
    })
}

/// `ringlock elect --listen NAME`: the leader now, then on every change:
/// `leader TOKEN VALUE`, or `none` once it left (`--json`: `{"leader":
/// {"token":…,"value":…,"value_hex":…}}` or `{"leader":null}`). A count
/// is of changes of leader.
pub(crate) fn listen(conn: &Conn, key: &[u8], json: bool, count: Option<u64>) -> Result<u8, Fail> {
    // The leader this process last printed, token and value (`None`: none
    // printed yet).
    let mut shown: Option<Option<(u64, Vec<u8>)>> = None;
    // A holder was listed since the last Listed.
    let mut listed_any = false;
    follow(conn, key, "elect --listen", count, &mut |out, seen| {
        let leads = |t: u64| matches!(&shown, Some(Some((s, _))) if *s == t);
        let now = match seen {
            // After a resync the holders follow; what they say is printed
            // only if it differs from the last line.
            Seen::Resync => return Ok(false),
            // Nobody was listed: nobody leads (said unless it was last).
            Seen::Listed if listed_any => {
                listed_any = false;
                return Ok(false);
            }
            Seen::Listed => None,
            Seen::Holder(h) => {
                listed_any = true;
                Some(h)
            }
            Seen::Change(EventKind::Granted, h) => Some(h),
            // The leader's new value (a proclaim).
            Seen::Change(EventKind::Proclaimed, h) if leads(h.token) => Some(h),
            Seen::Change(k, h) if k.ends_hold() && leads(h.token) => None,
            Seen::Change(..) => return Ok(false),
        };
        let now_key = now.map(|h| (h.token, h.source.clone()));
        if shown.as_ref() == Some(&now_key) {
            return Ok(false);
        }
        let change = shown.is_some();
        shown = Some(now_key);
        leader_line(out, json, now)?;
        Ok(change)
    })
}

/// What the watch loop saw.
enum Seen<'a> {
    /// The connection failed and the key is watched again: the holders
    /// follow.
    Resync,
    Holder(&'a Holder),
    /// The holders are all listed (none, maybe).
    Listed,
    Change(EventKind, &'a Holder),
}

/// Watches `key` until `count` changes were printed (the printer says
/// which lines are changes), watching again after a failed connection
/// whose session was resumed.
fn follow(
    conn: &Conn,
    key: &[u8],
    verb: &str,
    count: Option<u64>,
    print: &mut dyn FnMut(&mut io::StdoutLock<'static>, Seen<'_>) -> Result<bool, Fail>,
) -> Result<u8, Fail> {
    let shown = bytes::escape(key);
    let what = format!("{verb} {shown}");
    let session = conn.session_with(&what, None, None)?;
    let mut out = io::stdout().lock();
    let mut changes = 0u64;
    let mut first = true;
    loop {
        if count.is_some_and(|n| changes >= n) {
            return Ok(0);
        }
        let mut w = match session.watch(key) {
            Ok(w) => w,
            Err(_) if !first && session.ended().is_none() => {
                // The resume is still under way: the next try waits for it.
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
            Err(e) => return Err(lease_fail(&e, Some(&session), &what)),
        };
        if !first {
            print(&mut out, Seen::Resync)?;
        }
        first = false;
        for h in w.holders().to_vec() {
            if print(&mut out, Seen::Holder(&h))? {
                changes += 1;
            }
        }
        if print(&mut out, Seen::Listed)? {
            changes += 1;
        }
        loop {
            if count.is_some_and(|n| changes >= n) {
                return Ok(0);
            }
            match w.next(None) {
                Ok(Some(e)) => {
                    if print(&mut out, Seen::Change(e.kind, &e.holder))? {
                        changes += 1;
                    }
                }
                Ok(None) => {}
                Err(_) => {
                    if let Some((_, cause)) = session.ended() {
                        return Err(Fail(
                            EX_UNAVAILABLE,
                            format!("{what}: the session ended: {cause}"),
                        ));
                    }
                    // The connection failed and the session was resumed:
                    // watch again.
                    break;
                }
            }
        }
    }
}

/// One `elect --listen` line.
fn leader_line(out: &mut impl Write, json: bool, h: Option<&Holder>) -> Result<(), Fail> {
    let written = match (json, h) {
        (false, Some(h)) => writeln!(out, "leader {} {}", h.token, bytes::escape(&h.source)),
        (false, None) => writeln!(out, "none"),
        (true, Some(h)) => writeln!(
            out,
            "{{\"leader\":{{\"token\":{},\"value\":{},\"value_hex\":\"{}\"}}}}",
            h.token,
            bytes::printable_utf8(&h.source).map_or("null".into(), bytes::json_str),
            bytes::hex(&h.source)
        ),
        (true, None) => writeln!(out, "{{\"leader\":null}}"),
    };
    written.and_then(|()| out.flush()).map_err(|e| {
        Fail(
            EX_IOERR,
            format!("elect --listen: writing the output failed: {e}"),
        )
    })
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
