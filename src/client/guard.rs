//! The lock guard: owns a granted key until it is released, exactly once.
//!
//! Invariant: `released` is `None` while the key is held on the caller's
//! behalf and `Some(result)` forever after the one Unlock attempt; the
//! connection is consumed by that attempt, so no code path can send a second
//! Unlock for the same grant.

use std::fmt;
use std::net::SocketAddr;

use super::stream::Stream;

use super::{Client, Result};

/// A held lock. Dropping it releases the key (errors are then ignored; call
/// [`release`](Guard::release) to see them).
///
/// The guard keeps the connection the lock was granted on and sends Unlock
/// on it. If that connection broke meanwhile, release reconnects (see the
/// module docs for how an ambiguous outcome is settled).
#[must_use = "dropping the guard releases the lock at once"]
pub struct Guard {
    client: Client,
    key: Vec<u8>,
    conn: Option<Stream>,
    endpoint: Option<SocketAddr>,
    released: Option<Result<()>>,
}

impl Guard {
    pub(crate) fn new(
        client: Client,
        key: &[u8],
        conn: Option<Stream>,
        endpoint: Option<SocketAddr>,
    ) -> Guard {
        Guard {
            client,
            key: key.to_vec(),
            conn,
            endpoint,
            released: None,
        }
    }

    /// The locked key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The local address of the connection the lock was granted on: the
    /// `endpoint` the admin port's `KEYS` lists for this holder.
    pub fn endpoint(&self) -> Option<SocketAddr> {
        self.endpoint
    }

    /// True until [`release`](Self::release) has run.
    pub fn is_released(&self) -> bool {
        self.released.is_some()
    }

    /// Asks the admin port whether the server still lists this key as held
    /// by this guard's connection. `false` means the lock was lost (a reset,
    /// or a server restart without a log) and the critical section is no
    /// longer protected.
    pub fn is_held(&self) -> Result<bool> {
        if self.released.is_some() {
            return Ok(false);
        }
        self.client.held_by(&self.key, self.endpoint)
    }

    /// Releases the key. Only the first call sends Unlock; every later call
    /// returns the first call's result without network traffic.
    pub fn release(&mut self) -> Result<()> {
        if let Some(result) = &self.released {
            return result.clone();
        }
        let result = self
            .client
            .release_key(&self.key, self.conn.take(), self.endpoint);
        self.released = Some(result.clone());
        result
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; `release()` exposes them.
        let _ = self.release();
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("endpoint", &self.endpoint)
            .field("released", &self.released)
            .finish()
    }
}
