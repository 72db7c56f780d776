//! Protocol codecs. Each one turns lock operations into request bytes and
//! reply bytes into [`Reply`]s; none of them does I/O or reads a clock, so
//! each is unit-tested against byte strings captured from the real servers'
//! documented formats.
//!
//! A codec instance belongs to one client and survives reconnects (a client
//! in per-request mode keeps its Redis token or its etcd lease across
//! connections); [`Codec::start_connection`] resets per-connection state.

use crate::config::{Kind, Target};

pub mod etcd;
pub mod mysql;
pub mod pg;
pub mod redis;
pub mod ringlock;
pub mod session;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Blocking acquire (or, for Redis, one SET NX attempt of a spin loop).
    Lock,
    /// Acquire only if free now.
    TryLock,
    Unlock,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The lock is ours.
    Granted,
    /// TryLock: someone else holds it.
    Busy,
    /// Redis Lock attempt lost the race: back off and try again.
    Retry,
    /// Unlock done.
    Released,
    /// Unlock answered that we did not hold the key (expired, stolen, reset).
    NotHeld,
    /// The server answered with an error; the connection stays usable.
    Error(String),
}

pub trait Codec {
    /// A new TCP connection is up. Writes whatever the client says first and
    /// returns whether a handshake must finish before the first request.
    fn start_connection(&mut self, out: &mut Vec<u8>) -> bool;
    /// Feed handshake bytes (consumed from `buf`). `Ok(true)`: ready.
    fn handshake(&mut self, buf: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<bool, String>;
    fn encode(&mut self, op: Op, key: &[u8], out: &mut Vec<u8>);
    /// Decode the reply to `op`, consuming its bytes. `Ok(None)`: incomplete.
    /// `Err`: the stream is broken and the connection must be closed.
    fn decode(&mut self, op: Op, buf: &mut Vec<u8>) -> Result<Option<Reply>, String>;
}

pub fn new_codec(
    target: &Target,
    client: usize,
    lock_ttl_ms: u64,
    persistent: bool,
    access: crate::config::Access,
) -> Box<dyn Codec> {
    match &target.kind {
        Kind::Ringlock => Box::new(ringlock::Lc::new(
            format!("lg{client}").into_bytes(),
            persistent,
        )),
        Kind::Session => Box::new(session::SessionLock::new(
            format!("lg{client}").into_bytes(),
            u32::try_from(lock_ttl_ms).unwrap_or(u32::MAX),
            access,
        )),
        Kind::Redis => Box::new(redis::RedisLock::new(client, lock_ttl_ms)),
        Kind::Postgres { user, db, password } => {
            Box::new(pg::PgLock::new(user.clone(), db.clone(), password.clone()))
        }
        Kind::Mysql { user, password } => {
            Box::new(mysql::MyLock::new(user.clone(), password.clone()))
        }
        Kind::Etcd => Box::new(etcd::EtcdLock::new(
            format!("{}:{}", target.host, target.port),
            (lock_ttl_ms / 1000).max(5),
        )),
    }
}

/// FNV-1a, 64 bit: maps a key name to the integer PostgreSQL advisory locks take.
pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
