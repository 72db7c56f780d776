//! The Prometheus text format's lines: a series' HELP and TYPE, and a
//! gauge or counter of one value.

use std::fmt::Write as _;

pub(super) fn header(w: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(w, "# HELP ringlock_{name} {help}");
    let _ = writeln!(w, "# TYPE ringlock_{name} {kind}");
}

pub(super) fn gauge(w: &mut String, name: &str, help: &str, value: u64) {
    header(w, name, help, "gauge");
    let _ = writeln!(w, "ringlock_{name} {value}");
}

pub(super) fn counter(w: &mut String, name: &str, help: &str, value: u64) {
    header(w, name, help, "counter");
    let _ = writeln!(w, "ringlock_{name} {value}");
}
