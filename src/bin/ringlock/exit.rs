//! How a command ends: its exit codes (listed in [`crate::args::EXIT_STATUS`]
//! and docs/client.md), the one-line [`Fail`] every failure ends with, and
//! the notes a successful command may add on stderr.

use std::io::{self, Write};

pub(crate) const EX_USAGE: u8 = 64;
pub(crate) const EX_UNAVAILABLE: u8 = 69;
pub(crate) const EX_SOFTWARE: u8 = 70;
pub(crate) const EX_IOERR: u8 = 74;
pub(crate) const EX_TEMPFAIL: u8 = 75;
pub(crate) const EX_CONFIG: u8 = 78;
pub(crate) const EX_PROTOCOL: u8 = 76;
/// The session or lease lock was lost while CMD ran (CMD was stopped).
pub(crate) const EX_LOST: u8 = 79;
pub(crate) const EX_CANNOT_EXEC: u8 = 126;
pub(crate) const EX_NOT_FOUND: u8 = 127;

/// A failure that ends the process: exit code and its one-line message.
pub(crate) struct Fail(pub u8, pub String);

pub(crate) fn usage(msg: impl std::fmt::Display) -> Fail {
    Fail(EX_USAGE, format!("{msg} (see ringlock --help)"))
}

/// A note on a successful command (stderr, exit status unchanged).
pub(crate) fn note(msg: &str) {
    let _ = writeln!(io::stderr(), "ringlock: note: {msg}");
}
