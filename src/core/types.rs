//! The lock core's contract types: what callers pass to the table
//! ([`Now`], [`LockOpts`], [`Limits`], [`Token`]) and what they get back
//! ([`Effect`]s, [`Reply`], [`HeldKey`], ...). The table's own
//! state stays private to `table.rs`.

use std::net::SocketAddr;

use super::list::NIL;
use super::name::{Name, Source};
/// How a granted lock is held, chosen per Acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum HoldMode {
    /// Locking-Center semantics: held until released or reset, whatever
    /// happens to the connection.
    #[default]
    Persistent = 0,
    /// Released the moment the session ends (its connection closes or its
    /// keep-alive deadline passes).
    Session = 1,
    /// Released when its TTL passes without an Extend (survives the
    /// session, and a restart in durable mode).
    Lease = 2,
}

impl HoldMode {
    pub fn from_byte(b: u8) -> Option<HoldMode> {
        Some(match b {
            0 => HoldMode::Persistent,
            1 => HoldMode::Session,
            2 => HoldMode::Lease,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            HoldMode::Persistent => "persistent",
            HoldMode::Session => "session",
            HoldMode::Lease => "lease",
        }
    }
}

/// How a request shares its key with other holders (issue #33): chosen per
/// request, beside [`HoldMode`] (what ends the hold) and [`LockMode`]
/// (whether it waits).
///
/// Compatibility is per request: `Exclusive` conflicts with everything;
/// `Shared` is compatible with `Shared` only; `Semaphore(n)` with
/// `Semaphore(n)` only, while fewer than `n` hold the key. A key's
/// requests wait in one FIFO queue whatever their access, and a request is
/// granted only when it is compatible with every holder *and* no earlier
/// request on the key still waits (a waiting writer is never overtaken by
/// later readers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Access {
    /// One holder at a time (the only access before issue #33, and the
    /// Locking-Center protocol's).
    #[default]
    Exclusive,
    /// Any number of holders, all shared (readers).
    Shared,
    /// At most `n` holders, all semaphore requests of the same `n` (`n >= 1`).
    /// A key's `n` is fixed by its first semaphore request for as long as a
    /// semaphore request holds or waits on the key; a request naming
    /// another `n` is refused with [`Reply::ModeMismatch`].
    Semaphore(u32),
}

impl Access {
    pub fn name(self) -> &'static str {
        match self {
            Access::Exclusive => "exclusive",
            Access::Shared => "shared",
            Access::Semaphore(_) => "semaphore",
        }
    }

    /// A semaphore's slot count; 0 for the other accesses.
    pub fn slots(self) -> u32 {
        match self {
            Access::Semaphore(n) => n,
            _ => 0,
        }
    }

    /// False for a semaphore of no slot (which nothing could ever hold).
    pub fn is_valid(self) -> bool {
        self != Access::Semaphore(0)
    }

    /// As the wire writes it (an Acquire's trailer, an Event, a `KEYH`
    /// entry): `(access byte, slots)`, slots 0 unless a semaphore.
    pub fn to_bytes(self) -> (u8, u32) {
        match self {
            Access::Exclusive => (ACCESS_EXCLUSIVE, 0),
            Access::Shared => (ACCESS_SHARED, 0),
            Access::Semaphore(n) => (ACCESS_SEMAPHORE, n),
        }
    }

    /// The access written as `(access byte, slots)`; `None` for an unknown
    /// byte, slots beside a non-semaphore, or a semaphore of 0 slots.
    pub fn from_bytes(access: u8, slots: u32) -> Option<Access> {
        match (access, slots) {
            (ACCESS_EXCLUSIVE, 0) => Some(Access::Exclusive),
            (ACCESS_SHARED, 0) => Some(Access::Shared),
            (ACCESS_SEMAPHORE, n) if n >= 1 => Some(Access::Semaphore(n)),
            _ => None,
        }
    }
}

/// The access byte of [`Access::to_bytes`].
pub const ACCESS_EXCLUSIVE: u8 = 0;
pub const ACCESS_SHARED: u8 = 1;
pub const ACCESS_SEMAPHORE: u8 = 2;

/// Which admin listing an entry is written for. Each form is the one
/// before it with fields added at the end of every entry (docs/protocol.md,
/// "Admin port").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListForm {
    /// `KEYS` (Locking-Center's): one entry per held key, its oldest
    /// holder.
    Keys,
    /// `KEYX`: `KEYS` plus token, hold mode and lease time left.
    Keyx,
    /// `KEYH`: one entry per *holder* (a shared key's readers, a
    /// semaphore's holders each), `KEYX` plus `[u8 access][u32 slots]`.
    Keyh,
}

impl ListForm {
    /// Bytes of an entry after its acquire time.
    pub const fn tail_len(self) -> usize {
        match self {
            ListForm::Keys => 0,
            ListForm::Keyx => 13,
            ListForm::Keyh => 18,
        }
    }

    /// Whether every holder of a key is an entry (else its oldest only).
    pub const fn every_holder(self) -> bool {
        matches!(self, ListForm::Keyh)
    }

    /// The admin command that asks for it.
    pub const fn command(self) -> &'static [u8; 4] {
        match self {
            ListForm::Keys => b"KEYS",
            ListForm::Keyx => b"KEYX",
            ListForm::Keyh => b"KEYH",
        }
    }
}

/// Capacity of the table.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_keys: usize,
    pub max_waiters: usize,
}

/// Opaque connection token chosen by the caller (the event loop).
pub type Token = u64;
/// Token used for holders restored from the log: no connection.
pub const NO_CONN: Token = 0;

/// Time as seen by the caller.
#[derive(Clone, Copy, Debug, Default)]
pub struct Now {
    /// Monotonic microseconds (for waits and hold durations).
    pub mono_us: u64,
    /// Wall clock, Unix milliseconds (shown to operators).
    pub unix_ms: u64,
}

/// The one-byte answers of the Locking-Center protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+`
    Ok,
    /// `#` — TryLock found the key held.
    Busy,
    /// `-`: a capacity limit refused the request.
    Limit,
    /// `-`: a queued request withdrawn by a ResetBySource of its source.
    Withdrawn,
    /// A queued request whose server-side wait deadline passed (sessions
    /// only; a Locking-Center Lock has no deadline).
    TimedOut,
    /// A queued request withdrawn by its session's Cancel.
    Cancelled,
    /// A semaphore request whose slot count is not the key's (fixed by
    /// the semaphore request that held or queued first, while one still
    /// holds or waits): refused, nothing changed (see [`Access`]).
    ModeMismatch,
}

impl Reply {
    /// The Locking-Center answer byte.
    pub fn byte(self) -> u8 {
        match self {
            Reply::Ok => b'+',
            Reply::Busy => b'#',
            Reply::Limit
            | Reply::Withdrawn
            | Reply::TimedOut
            | Reply::Cancelled
            | Reply::ModeMismatch => b'-',
        }
    }
}

/// Why a holder lost a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseCause {
    Unlock,
    ResetByKey,
    ResetBySource,
    /// The grant's `+` could not be delivered.
    Undelivered,
    /// A lease's TTL passed without an extend.
    Expired,
    /// The holder's own session released it by naming its token.
    Released,
    /// The holding session ended (connection closed, keep-alive missed).
    SessionEnded,
}

impl ReleaseCause {
    /// True when the holder did not ask for it: a live session holder is
    /// told (a Lost push) before the key goes to the next waiter.
    pub fn forced(self) -> bool {
        matches!(
            self,
            ReleaseCause::Unlock
                | ReleaseCause::ResetByKey
                | ReleaseCause::ResetBySource
                | ReleaseCause::Expired
        )
    }
}

/// Which capacity limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Keys,
    Waiters,
    Sources,
    Sessions,
}

impl Limit {
    pub fn name(self) -> &'static str {
        match self {
            Limit::Keys => "max_keys",
            Limit::Waiters => "max_waiters",
            Limit::Sources => "max_sources",
            Limit::Sessions => "max_sessions",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Effect {
    /// A request was refused because a capacity limit was reached (the
    /// `-` follows as a Reply).
    LimitReached { limit: Limit },
    /// Send `reply` to `conn`; its request is finished.
    Reply { conn: Token, reply: Reply },
    /// `conn` now holds key slot `key_slot` under `grant_id`; send it `+`.
    /// `waited_us` is set when the grant came from the queue (a hand-off).
    /// The grant's key, source and deadlines:
    /// [`Table::granted`](super::Table::granted).
    Granted {
        conn: Token,
        key_slot: u32,
        grant_id: u64,
        waited_us: Option<u64>,
    },
    /// The holder `grant_id` (of connection `holder_conn`) was released.
    /// The holder as it was, key and source by reference (for its record,
    /// a Lost push, and undoing the release):
    /// [`Table::released`](super::Table::released)`(released, grant_id)`,
    /// valid until [`Table::effects_applied`](super::Table::effects_applied).
    Released {
        holder_conn: Token,
        released: u32,
        grant_id: u64,
        held_us: u64,
        cause: ReleaseCause,
    },
}

// Effects are moved around in every request's path: small, no names.
const _: () = assert!(
    std::mem::size_of::<Effect>() <= 64,
    "an Effect carries no name"
);

/// Ordered effects of one or more operations. Reused across ticks.
pub type Effects = Vec<Effect>;

/// How an Acquire holds and waits (Locking-Center: [`LockOpts::default`]).
#[derive(Clone, Copy, Debug)]
pub struct LockOpts {
    pub mode: HoldMode,
    /// A lease's TTL (ignored for other modes).
    pub ttl_ms: u32,
    /// The requesting session ([`Table::owner_open`](super::Table::owner_open)), `NIL` for none.
    pub owner: u32,
    /// Server-side wait deadline (monotonic µs) of a blocking request.
    pub deadline_us: Option<u64>,
}

impl Default for LockOpts {
    fn default() -> Self {
        LockOpts {
            mode: HoldMode::Persistent,
            ttl_ms: 0,
            owner: NIL,
            deadline_us: None,
        }
    }
}

/// What an owner-checked operation found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    Ok,
    /// The token is not the key's current one.
    Stale,
    /// The token is current but the session hold is another session's.
    NotOwner,
    /// Extend of a hold that is not a lease.
    NotLease,
    /// A Proclaim whose new source would pass the table's limit on names.
    Limit,
}

/// An extend that took effect: what the log records and an undo needs.
#[derive(Clone, Copy, Debug)]
pub struct Extended {
    pub key: Name,
    pub grant_id: u64,
    pub expires_unix_ms: u64,
    pub expires_mono_us: u64,
    pub prev_unix_ms: u64,
    pub prev_mono_us: u64,
}

/// A proclaim that took effect ([`Table::proclaim`](super::Table::proclaim)):
/// the holder now stands in key slot `key_slot` under its new source (the
/// log writes its record anew); `prev` is it as it was, for an undo.
#[derive(Clone, Copy, Debug)]
pub struct Proclaimed {
    pub key_slot: u32,
    pub prev: HeldKey,
}

/// One held key as listed by the admin `KEYS` command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldKey {
    pub key: Name,
    /// Up to [`SOURCE_MAX`](super::SOURCE_MAX) bytes (a session's source).
    pub source: Source,
    pub endpoint: SocketAddr,
    pub acquired_unix_ms: u64,
    /// Also the fencing token.
    pub grant_id: u64,
    pub mode: HoldMode,
    /// A lease's deadline (Unix ms), 0 for other modes.
    pub expires_unix_ms: u64,
    /// The replicated session holding it ([`REPLICATED_SESSION`] set), 0
    /// for none: a Locking-Center hold, a hold of a session that is not
    /// replicated, or one that outlived its session.
    pub session: u64,
    /// How the key is held (every holder of a key holds it the same way).
    pub access: Access,
}

/// Session id bit: a replicated session (cluster mode), whose opening, end
/// and holds are log records, so that a new leader knows it and its client
/// can resume it. Its holds' records name it; no other session's do.
pub const REPLICATED_SESSION: u64 = 1 << 55;

impl HeldKey {
    /// The same holder by reference.
    pub fn as_ref(&self) -> HeldRef<'_> {
        HeldRef {
            key: self.key.as_bytes(),
            source: self.source.as_bytes(),
            endpoint: self.endpoint,
            acquired_unix_ms: self.acquired_unix_ms,
            grant_id: self.grant_id,
            mode: self.mode,
            expires_unix_ms: self.expires_unix_ms,
            session: self.session,
            access: self.access,
        }
    }
}

/// A request queued on a key, as
/// [`Table::queue_of`](crate::core::Table::queue_of) lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queued {
    /// Whose it is: its session's id, else its connection (as
    /// [`Table::holder_ids_of`](crate::core::Table::holder_ids_of) names
    /// a holder).
    pub who: u64,
    /// Unique per waiter, increasing in the order requests were queued.
    pub seq: u64,
    /// Its access (a semaphore's `n` is its key's).
    pub access: Access,
}

/// A held key by reference: names borrowed from wherever they are stored
/// (a log image during recovery, the table itself), so visiting a million
/// holders copies no name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldRef<'a> {
    pub key: &'a [u8],
    pub source: &'a [u8],
    pub endpoint: SocketAddr,
    pub acquired_unix_ms: u64,
    pub grant_id: u64,
    pub mode: HoldMode,
    pub expires_unix_ms: u64,
    /// As [`HeldKey::session`].
    pub session: u64,
    /// As [`HeldKey::access`].
    pub access: Access,
}

impl HeldRef<'_> {
    /// Appends this holder as one entry of an admin `KEYS` answer
    /// (`[u8 keyLen][key][u8 srcLen][src][u8 epLen][endpoint][i64 unix s]`),
    /// then for `KEYX` and `KEYH` `[u64 token][u8 mode][u32 lease ms left at
    /// now_unix_ms, u32::MAX = none]`, then for `KEYH` `[u8 access][u32
    /// slots]`. Writes into `out` only: no allocation beyond `out`'s growth.
    pub fn encode_admin(&self, form: ListForm, now_unix_ms: u64, out: &mut Vec<u8>) {
        use std::io::Write;
        out.push(self.key.len() as u8);
        out.extend_from_slice(self.key);
        out.push(self.source.len() as u8);
        out.extend_from_slice(self.source);
        let at = out.len();
        out.push(0);
        write!(out, "{}", self.endpoint).expect("writing to a Vec");
        // An "ip:port" is at most 47 bytes ("[v6%scope]:port" fits 255).
        out[at] = (out.len() - at - 1) as u8;
        out.extend_from_slice(&((self.acquired_unix_ms / 1000) as i64).to_le_bytes());
        if form == ListForm::Keys {
            return;
        }
        out.extend_from_slice(&self.grant_id.to_le_bytes());
        out.push(self.mode as u8);
        let left = if self.mode == HoldMode::Lease {
            self.expires_unix_ms
                .saturating_sub(now_unix_ms)
                .min(u32::MAX as u64 - 1) as u32
        } else {
            u32::MAX
        };
        out.extend_from_slice(&left.to_le_bytes());
        if form == ListForm::Keyh {
            let (a, slots) = self.access.to_bytes();
            out.push(a);
            out.extend_from_slice(&slots.to_le_bytes());
        }
    }

    /// An owned copy; `None` when the key is longer than
    /// [`KEY_MAX`](super::KEY_MAX) or the source than
    /// [`SOURCE_MAX`](super::SOURCE_MAX).
    pub fn to_owned(&self) -> Option<HeldKey> {
        Some(HeldKey {
            key: Name::new(self.key)?,
            source: Source::new(self.source)?,
            endpoint: self.endpoint,
            acquired_unix_ms: self.acquired_unix_ms,
            grant_id: self.grant_id,
            mode: self.mode,
            expires_unix_ms: self.expires_unix_ms,
            session: self.session,
            access: self.access,
        })
    }
}

/// What a blocking or try lock request turned into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    Blocking,
    Try,
}
