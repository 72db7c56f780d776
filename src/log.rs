//! One-line, key=value event logs on stderr, filtered by level.
//!
//! Only notable events are logged (start, recovery, compaction, I/O errors,
//! limits, operator resets); nothing is logged per request on the hot path.

use std::sync::atomic::{AtomicU8, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "error" => Level::Error,
            "warn" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);

pub fn set_level(l: Level) {
    LEVEL.store(l as u8, Ordering::Relaxed);
}

pub fn enabled(l: Level) -> bool {
    l as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one log line: `ts=… level=… event=… <fields>`.
pub fn write(l: Level, event: &str, fields: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "ts={}.{:03} level={} event={} {}",
        ts.as_secs(),
        ts.subsec_millis(),
        l.name(),
        event,
        fields
    );
}

/// `log!(Level::Info, "listening", "lock={} admin={}", a, b)`
#[macro_export]
macro_rules! log {
    ($lvl:expr, $event:expr) => {
        if $crate::log::enabled($lvl) {
            $crate::log::write($lvl, $event, format_args!(""));
        }
    };
    ($lvl:expr, $event:expr, $($arg:tt)+) => {
        if $crate::log::enabled($lvl) {
            $crate::log::write($lvl, $event, format_args!($($arg)+));
        }
    };
}
