//! Picking a lock backend by address: [`connect`].
//!
//! It sits above the lock API ([`crate::lease`]) and both of its backends
//! ([`crate::client::Session`], `ringlock::mysql::Locker`), which only
//! know the API, not each other.
//!
//! ```no_run
//! use ringlock::lease::Locker;
//!
//! # fn main() -> Result<(), ringlock::lease::Error> {
//! // mysql://app@db or 10.0.0.5
//! let locker: Box<dyn Locker> = ringlock::backend::connect("127.0.0.1")?;
//! if let Some(lease) = locker.try_lock("nightly/reconcile")? {
//!     lease.release()?;
//! }
//! # Ok(()) }
//! ```

use crate::lease::{Error, Locker, Result};

/// A [`Locker`] for an address, so that moving a program between backends
/// is a change of address, not of code: `mysql://USER[:PASSWORD]@HOST[:PORT]`
/// is the MySQL/MariaDB backend (cargo feature `mysql`; the password may
/// also come from the environment, see `ringlock::mysql`), anything else a
/// `ringlockd` session (`HOST`, `HOST:PORT`, `[IPV6]:PORT`) with default
/// options. For options (source, keep-alive, auth token, pool sizes) build
/// the backend itself: [`crate::client::Session::builder`],
/// `ringlock::mysql::Locker`.
pub fn connect(addr: &str) -> Result<Box<dyn Locker>> {
    if crate::mysql::is_mysql_addr(addr) {
        #[cfg(feature = "mysql")]
        {
            let l = crate::mysql::Locker::from_url(addr)
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            return Ok(Box::new(l));
        }
        #[cfg(not(feature = "mysql"))]
        return Err(Error::InvalidArgument(format!(
            "{addr}: this build has no MySQL backend (cargo feature `mysql`)"
        )));
    }
    Ok(Box::new(crate::client::Session::builder(addr).connect()?))
}
