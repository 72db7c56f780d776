//! Key watches ([`Session::watch`]): the holders a key has, then every
//! change of them, pushed by the server (session ops Watch and Unwatch,
//! `docs/protocol.md` "Watching a key").
//!
//! The I/O thread puts each Event of a watch into that watch's channel,
//! in the order read; the caller reads them with [`Watch::next`]. A
//! watch lives on one connection: when it fails (a resume follows, for a
//! replicated session) or the session ends, the watch ends with the
//! reason, and the caller watches again to read the holders anew
//! (changes in between are not replayed: a re-watch is a re-read).

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::io::{Handle, Op, Shared, Waited, What};
use super::watched::{Holder, WatchEvent, WatchItem};
use crate::lease::{cause_msg, Error, Result};
use crate::protocol::session::{self as wire, EventKind, Req, Status};

/// A watch of one key's holders, from [`Session::watch`](super::Session::watch). Dropping it
/// without [`close`](Self::close) leaves the server's watch in place
/// until the session ends (its Events are dropped here).
pub struct Watch {
    h: Arc<Handle>,
    rid: u32,
    key: Vec<u8>,
    holders: Vec<Holder>,
    /// What the channel held beyond the holders when the watch began.
    early: std::collections::VecDeque<WatchItem>,
    rx: mpsc::Receiver<WatchItem>,
    ended: Option<String>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("holders", &self.holders)
            .field("ended", &self.ended)
            .finish()
    }
}

/// [`Session::watch`](super::Session::watch), once the key is checked.
pub(super) fn open(h: &Arc<Handle>, key: &[u8]) -> Result<Watch> {
    let key_text = String::from_utf8_lossy(key).into_owned();
    let sh: &Shared = &h.shared;
    let (tx, rx) = mpsc::channel();
    {
        let st = sh.lock();
        if !st.watch {
            return Err(Error::Unsupported(format!(
                "a watch of {key_text:?}: this server does not offer key watches (its \
                 welcome lacks the watches flag: a ringlockd older than watches); nothing \
                 was sent"
            )));
        }
        if st.resuming {
            return Err(failed(
                &key_text,
                "the session is being resumed; watch again",
            ));
        }
    }
    // The channel is registered before the frame leaves: its first
    // Event may come back before `send_registered` returns.
    let rid = sh
        .send_registered(
            What::Call,
            Op::Watch,
            |st, rid| {
                st.watches.insert(rid, tx);
            },
            |rid, out| wire::encode(rid, &Req::Watch { key }, out),
        )
        .map_err(|end| failed(&key_text, format!("the session ended: {}", end.1)))?;
    let (answer, _) = match sh.wait(rid, None) {
        Waited::Answer(a, what) => (a, what),
        Waited::Dead(end) => {
            sh.lock().watches.remove(&rid);
            return Err(failed(&key_text, format!("the session ended: {}", end.1)));
        }
        Waited::NoAnswer => unreachable!("no bound"),
    };
    if answer.status != Status::Ok {
        sh.lock().watches.remove(&rid);
        return Err(failed(
            &key_text,
            format!("the server answered the watch {}", answer.status.name()),
        ));
    }
    // Every holder Event came before the Reply: all in the channel. The
    // I/O thread may have put changes after them already (read after the
    // Reply, before this thread woke): kept, in order, for `next`.
    let mut holders = Vec::new();
    let mut early = std::collections::VecDeque::new();
    loop {
        match rx.try_recv() {
            Ok(WatchItem::Event(e)) if e.kind == EventKind::Holder => {
                if !early.is_empty() {
                    return Err(failed(
                        &key_text,
                        "the server sent a holder event after a change (protocol violation)",
                    ));
                }
                holders.push(e.holder)
            }
            // The watch ended already (the connection failed while it was
            // being set up: its `ok` was the resume's, not the server's):
            // nothing was listed, say so.
            Ok(WatchItem::Ended(why)) => return Err(failed(&key_text, why)),
            Ok(item) => early.push_back(item),
            Err(_) => break,
        }
    }
    Ok(Watch {
        h: Arc::clone(h),
        rid,
        key: key.to_vec(),
        holders,
        early,
        rx,
        ended: None,
    })
}

fn failed(key: &str, why: impl Into<String>) -> Error {
    Error::Failed {
        key: key.to_string(),
        cause: cause_msg(why.into()),
    }
}

impl Watch {
    /// The key watched.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The key's holders when the watch began (oldest grant first; empty
    /// for a free key).
    pub fn holders(&self) -> &[Holder] {
        &self.holders
    }

    /// The next change, waiting up to `timeout` (`None`: until one comes).
    /// `Ok(None)`: none within `timeout`. `Err`: the watch ended (the
    /// connection failed, the session ended, or [`close`](Self::close)):
    /// watch again to read the holders anew.
    pub fn next(&mut self, timeout: Option<Duration>) -> Result<Option<WatchEvent>> {
        if let Some(why) = &self.ended {
            return Err(failed(&String::from_utf8_lossy(&self.key), why.clone()));
        }
        let item = match timeout {
            _ if !self.early.is_empty() => self.early.pop_front(),
            None => self.rx.recv().ok(),
            Some(t) => match self.rx.recv_timeout(t) {
                Ok(i) => Some(i),
                Err(mpsc::RecvTimeoutError::Timeout) => return Ok(None),
                Err(mpsc::RecvTimeoutError::Disconnected) => None,
            },
        };
        let why = match item {
            Some(WatchItem::Event(e)) => return Ok(Some(e)),
            Some(WatchItem::Ended(why)) => why,
            None => "the watch ended".to_string(),
        };
        self.ended = Some(why.clone());
        Err(failed(&String::from_utf8_lossy(&self.key), why))
    }

    /// Ends the watch (Unwatch): no change is reported after it.
    pub fn close(mut self) -> Result<()> {
        let sh: &Shared = &self.h.shared;
        if sh.lock().watches.remove(&self.rid).is_none() {
            // Ended already: nothing to tell the server.
            return Ok(());
        }
        self.ended = Some("closed".into());
        let key: &[u8] = &self.key;
        let target = self.rid;
        let rid = match sh.send(What::Call, Op::Cancel, |r, out| {
            wire::encode(r, &Req::Unwatch { target, key }, out)
        }) {
            Ok(rid) => rid,
            Err(_) => return Ok(()), // the session ended: so did the watch
        };
        let until = Instant::now() + sh.release_timeout;
        match sh.wait(rid, Some(until)) {
            Waited::Answer(..) | Waited::Dead(_) => Ok(()),
            Waited::NoAnswer => Err(failed(
                &String::from_utf8_lossy(&self.key),
                "no answer to the Unwatch within the release timeout",
            )),
        }
    }
}

impl Iterator for Watch {
    type Item = Result<WatchEvent>;

    /// Each change as it comes; after the watch ended, one `Err` saying
    /// why, then `None`.
    fn next(&mut self) -> Option<Self::Item> {
        if self.ended.is_some() {
            return None;
        }
        Some(Watch::next(self, None).map(|e| e.expect("no bound")))
    }
}

impl Shared {
    /// The connection a watch lives on failed, or the session ended: every
    /// watch ends, and says why.
    pub(super) fn end_watches(&self, why: &str) {
        let mut st = self.lock();
        for (_, w) in st.watches.drain() {
            let _ = w.send(WatchItem::Ended(why.to_string()));
        }
    }

    /// An Event the I/O thread read: to its watch, if it is still open
    /// (one closed or ended meanwhile drops it).
    pub(super) fn watch_event(&self, rid: u32, e: WatchEvent) {
        let st = self.lock();
        if let Some(w) = st.watches.get(&rid) {
            let _ = w.send(WatchItem::Event(e));
        }
    }
}
