//! The admin port's key listings (`KEYS`, `KEYX`, `KEYH`), read as they
//! arrive.
//!
//! The server streams these answers (docs/protocol.md), so a client can
//! too: [`KeyStream`] reads into one fixed buffer of [`BUF_BYTES`] and
//! decodes one entry at a time ([`KeysDecoder`]), whatever the number of
//! held keys. [`Client::keys`], [`Client::keyx`] and [`Client::keyh`]
//! collect a stream.

use std::io::{self, Read};
use std::iter::FusedIterator;
use std::net::SocketAddr;

use super::stream::Stream;

use super::error::{Error, Result};
use super::lock_client::Client;
use super::retry::RetryPolicy;
use super::retry::Streak;
use super::wire::KeyInfo;
use crate::protocol::admin::{self, KeysDecoder, KeysStep};

/// The receive buffer of a [`KeyStream`]: what the server sends in one
/// chunk at most, and far more than one entry
/// ([`admin::KEYS_ENTRY_BYTES_MAX`]).
const BUF_BYTES: usize = 64 * 1024;

use crate::core::ListForm;

/// The held keys, in key order, each handed out as soon as its bytes have
/// arrived: an [`Iterator`] of `Result<KeyInfo>` over one admin
/// connection. Created by [`Client::keys_stream`],
/// [`Client::keyx_stream`] and [`Client::keyh_stream`].
///
/// Memory stays bounded whatever the number of keys: one receive buffer
/// of 64 KiB and the entry being handed out. The server sends the
/// answer as it is read, so a slow consumer only slows the sending (each
/// read waits at most the client's
/// [`io_timeout`](super::ClientBuilder::io_timeout)); a reader so slow
/// that many holders change before it reads them may be cut off by the
/// server (docs/protocol.md), which the stream reports as an error.
///
/// **Nothing is retried once the stream exists.** Opening it (connecting,
/// sending the command, reading the answer's count) is retried per the
/// client's [`RetryPolicy`](super::RetryPolicy), but a failure while the
/// entries are read is the stream's last item, an `Err`: retrying would
/// list again from the start and hand out keys the caller already has.
/// A caller that wants the whole list again calls
/// [`keys_stream`](Client::keys_stream) again (the table may have changed
/// meanwhile). After an `Err` or the last entry the stream yields `None`.
///
/// Dropping the stream before its end closes the connection; the server
/// stops the listing then.
///
/// ```no_run
/// # fn main() -> Result<(), ringlock::client::Error> {
/// let client = ringlock::client::Client::new("127.0.0.1:22119")?;
/// let mut stuck = 0;
/// for key in client.keyx_stream()? {
///     let key = key?;
///     if key.held_for(std::time::SystemTime::now()).as_secs() >= 300 {
///         stuck += 1;
///         println!("{} held by {}", key.key_lossy(), key.source_lossy());
///     }
/// }
/// println!("{stuck} keys held for 5 minutes or more");
/// # Ok(()) }
/// ```
pub struct KeyStream {
    conn: Stream,
    /// Received bytes; `buf[start..end]` is not decoded yet.
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    decoder: KeysDecoder,
    /// The answer's count of entries.
    total: u32,
    /// After the last entry or an error: nothing more to yield.
    done: bool,
}

impl KeyStream {
    /// Reads the answer's count on `conn` (after the `+` that answers AUTH
    /// when `authed`). A connection closed before it is an `Io` error of
    /// kind `UnexpectedEof`.
    fn open(
        conn: Stream,
        io_timeout: std::time::Duration,
        authed: bool,
        listing: ListForm,
    ) -> Result<KeyStream> {
        let mut conn = conn;
        conn.set_read_timeout(Some(io_timeout)).map_err(Error::io)?;
        if authed {
            let mut b = [0u8; 1];
            conn.read_exact(&mut b).map_err(Error::io)?;
            if b[0] != b'+' {
                return Err(Error::Refused);
            }
        }
        let mut s = KeyStream {
            conn,
            buf: vec![0u8; BUF_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            decoder: KeysDecoder::of(listing),
            total: 0,
            done: false,
        };
        loop {
            match s
                .decoder
                .decode_next(&s.buf[s.start..s.end])
                .map_err(Error::Protocol)?
            {
                (KeysStep::Count(n), used) => {
                    s.start += used;
                    s.total = n;
                    return Ok(s);
                }
                (KeysStep::Incomplete, _) => s.fill()?,
                (step, _) => unreachable!("a count comes first, not {step:?}"),
            }
        }
    }

    /// How many entries the answer lists (the server's count, sent first:
    /// keys, or holders for `KEYH`).
    pub fn total(&self) -> u32 {
        self.total
    }

    /// How many of them are still to come.
    pub fn remaining(&self) -> u32 {
        self.decoder.remaining().unwrap_or(0)
    }

    /// Whether the entries have token, mode and lease time left (`KEYX` or
    /// `KEYH`) rather than being `KEYS` ones.
    pub fn extended(&self) -> bool {
        self.decoder.extended()
    }

    /// Which listing it reads.
    pub fn form(&self) -> ListForm {
        self.decoder.form()
    }

    /// Reads more of the answer after what is not decoded yet.
    fn fill(&mut self) -> Result<()> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            // Cannot happen: an entry is far smaller than the buffer.
            return Err(Error::Protocol(format!(
                "a KEYS entry longer than {} bytes",
                self.buf.len()
            )));
        }
        loop {
            match self.conn.read(&mut self.buf[self.end..]) {
                Ok(0) if self.end == 1 && self.buf[0] == b'-' && self.total == 0 => {
                    // The admin port's `-`, then its close: refused, not cut.
                    return Err(Error::io(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        "the admin port refused the command (`-`): a server that does not know \
                         it (KEYH before lock modes) refuses it, a server with certificates \
                         takes admin commands over TLS with a client certificate (--certs-dir, \
                         --client) or the auth token (--auth-token-file), one without them \
                         needs the token off loopback (or on it once one is configured), and a \
                         cluster node that cannot reach its leader refuses listings until it can",
                    )));
                }
                Ok(0) => {
                    let why = match self.decoder.remaining() {
                        None if self.end == 0 => {
                            "admin connection closed without an answer".to_string()
                        }
                        None => "admin connection closed mid-answer".to_string(),
                        Some(left) => format!(
                            "admin connection closed mid-answer ({} of {} keys read)",
                            self.total - left,
                            self.total
                        ),
                    };
                    return Err(Error::io(io::Error::new(io::ErrorKind::UnexpectedEof, why)));
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(e)),
            }
        }
    }
}

impl Iterator for KeyStream {
    type Item = Result<KeyInfo>;

    fn next(&mut self) -> Option<Result<KeyInfo>> {
        if self.done {
            return None;
        }
        loop {
            let step = self.decoder.decode_next(&self.buf[self.start..self.end]);
            match step {
                Ok((KeysStep::Entry(k), used)) => {
                    self.start += used;
                    return Some(Ok(k));
                }
                Ok((KeysStep::End, _)) => {
                    self.done = true;
                    return None;
                }
                Ok((KeysStep::Incomplete, _)) => {
                    if let Err(e) = self.fill() {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
                Ok((KeysStep::Count(_), _)) => unreachable!("the count was read by open"),
                Err(msg) => {
                    self.done = true;
                    return Some(Err(Error::Protocol(msg)));
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            return (0, Some(0));
        }
        // Every remaining key, or fewer and an error.
        (0, Some(self.remaining() as usize + 1))
    }
}

impl FusedIterator for KeyStream {}

impl std::fmt::Debug for KeyStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyStream")
            .field("peer", &self.conn.peer_addr().ok())
            .field("form", &self.form())
            .field("total", &self.total)
            .field("remaining", &self.remaining())
            .field("buffered", &(self.end - self.start))
            .field("done", &self.done)
            .finish()
    }
}

impl Client {
    /// Lists the held keys as they arrive from the admin port (`KEYS`:
    /// `token`, `mode` and `lease_left_ms` are left at their defaults),
    /// in key order, in bounded memory whatever their number. Opening the
    /// stream is retried per the retry policy; reading it is not (see
    /// [`KeyStream`]).
    pub fn keys_stream(&self) -> Result<KeyStream> {
        self.open_listing(&mut Streak::new(self.cfg.retry), ListForm::Keys)
            .map(|(s, _)| s)
    }

    /// Like [`keys_stream`](Self::keys_stream), with each key's fencing
    /// token, hold mode and lease time left (`KEYX`, a ringlockd
    /// extension). A server that does not know `KEYX` (Locking-Center, an
    /// older ringlockd) closes the connection without an answer: that is an
    /// [`Error::Io`] of kind `UnexpectedEof`, not retried, and
    /// [`keys_stream`](Self::keys_stream) still works there.
    pub fn keyx_stream(&self) -> Result<KeyStream> {
        self.open_listing(&mut Streak::new(self.cfg.retry), ListForm::Keyx)
            .map(|(s, _)| s)
    }

    /// Lists every *holder* as it arrives from the admin port (`KEYH`, a
    /// ringlockd extension): like [`keyx_stream`](Self::keyx_stream), with
    /// each holder of a shared or semaphore key its own entry (sorted by
    /// key, then token) and [`KeyInfo::access`] set. `KEYS` and `KEYX`
    /// list a key once, with its oldest holder. A server that does not know
    /// `KEYH` (Locking-Center, a ringlockd before lock modes) closes the
    /// connection without an answer: an [`Error::Io`] of kind
    /// `UnexpectedEof`, not retried.
    pub fn keyh_stream(&self) -> Result<KeyStream> {
        self.open_listing(&mut Streak::new(self.cfg.retry), ListForm::Keyh)
            .map(|(s, _)| s)
    }

    /// Lists the held keys, sorted by key, from the admin port (`KEYS`:
    /// `token`, `mode` and `lease_left_ms` are left at their defaults).
    /// Collects [`keys_stream`](Self::keys_stream); since nothing reached
    /// the caller yet, a failure while reading is retried from the start,
    /// per the retry policy. A list too long to be plausible (see
    /// [`admin::KEYS_ANSWER_BYTES_MAX`]) is an [`Error::Protocol`]; use
    /// the stream for any size.
    pub fn keys(&self) -> Result<Vec<KeyInfo>> {
        self.collect_listing(ListForm::Keys)
    }

    /// Like [`keys`](Self::keys), with each key's fencing token, hold mode
    /// and lease time left (`KEYX`, a ringlockd extension). A server that
    /// does not know `KEYX` (Locking-Center, an older ringlockd) closes the
    /// connection without an answer: that is an [`Error::Io`] of kind
    /// `UnexpectedEof`, and [`keys`](Self::keys) still works there.
    pub fn keyx(&self) -> Result<Vec<KeyInfo>> {
        self.collect_listing(ListForm::Keyx)
    }

    /// Every holder, collected from [`keyh_stream`](Self::keyh_stream)
    /// like [`keys`](Self::keys) collects its stream (retried from the
    /// start while nothing reached the caller).
    pub fn keyh(&self) -> Result<Vec<KeyInfo>> {
        self.collect_listing(ListForm::Keyh)
    }

    fn collect_listing(&self, listing: ListForm) -> Result<Vec<KeyInfo>> {
        let mut streak = Streak::new(self.cfg.retry);
        loop {
            let (stream, peer) = self.open_listing(&mut streak, listing)?;
            admin::check_count(stream.total()).map_err(Error::Protocol)?;
            let mut keys = Vec::with_capacity((stream.total() as usize).min(4096));
            let mut failed = None;
            for k in stream {
                match k {
                    Ok(k) => keys.push(k),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            match failed {
                None => return Ok(keys),
                // Read-only, and nothing was handed out: safe to retry.
                Some(Error::Io(err)) => {
                    let err = io::Error::new(err.kind(), err.to_string());
                    self.backoff(&mut streak, err, peer, None, None)?;
                }
                Some(other) => return Err(other),
            }
        }
    }

    /// Connects to the admin port, sends the listing's command and reads
    /// the answer's count, retrying per `streak`; also returns the address
    /// it reached.
    pub(super) fn open_listing(
        &self,
        streak: &mut Streak,
        listing: ListForm,
    ) -> Result<(KeyStream, SocketAddr)> {
        loop {
            let (mut conn, peer) = self.connect_admin(streak)?;
            let err = match self.send_admin(&mut conn, listing.command()) {
                Ok(()) => match KeyStream::open(
                    conn,
                    self.cfg.io_timeout,
                    self.cfg.admin_auth.is_some(),
                    listing,
                ) {
                    Ok(stream) => return Ok((stream, peer)),
                    // Refused (TLS or authentication): retrying cannot help.
                    Err(Error::Io(err)) if err.kind() == io::ErrorKind::PermissionDenied => {
                        return Err(Error::Io(err))
                    }
                    // A server that closes at once does not know the command
                    // (KEYX on a Locking-Center server): retrying cannot help.
                    Err(Error::Io(err))
                        if listing != ListForm::Keys
                            && err.kind() == io::ErrorKind::UnexpectedEof =>
                    {
                        return Err(Error::Io(err))
                    }
                    Err(Error::Io(err)) => io::Error::new(err.kind(), err.to_string()),
                    Err(other) => return Err(other),
                },
                Err(err) => err,
            };
            // Listings are read-only and nothing was handed out yet.
            self.backoff(streak, err, peer, None, None)?;
        }
    }

    /// Whether the server's table shows `key` held by the connection whose
    /// local address was `endpoint`. One attempt, no retries: used to settle
    /// ambiguous outcomes.
    pub(super) fn held_by(&self, key: &[u8], endpoint: Option<SocketAddr>) -> Result<bool> {
        let endpoint = endpoint
            .ok_or_else(|| Error::Protocol("no local endpoint to compare".into()))?
            .to_string();
        let (keys, _) = self.open_listing(&mut Streak::new(RetryPolicy::none()), ListForm::Keys)?;
        for k in keys {
            let k = k?;
            if k.key == key && k.endpoint == endpoint {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
