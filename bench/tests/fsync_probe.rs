//! `fsync-probe` with tiny counts on a real directory: both modes print
//! what the scripts parse, every strategy is measured at every size (each
//! case reads its last record back, exit 1 on a mismatch), and bad input is
//! refused before any file is made. No timing is asserted.

use std::path::PathBuf;
use std::process::Command;

const STRATEGIES: &[&str] = &[
    "append+fdatasync",
    "fallocated+fdatasync",
    "zeroed+fdatasync",
    "zeroed+rwf_dsync",
    "zeroed+o_dsync",
    "zeroed+o_direct",
    "uring:append+fdatasync",
    "uring:fallocated+fdatasync",
    "uring:zeroed+fdatasync",
    "uring:zeroed+rwf_dsync",
    "uring:zeroed+o_direct",
];

/// A fresh directory next to the build output (the repository's disk, where
/// O_DIRECT works; tmpfs may refuse it).
fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fsync-probe-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

fn probe(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_fsync-probe"))
        .args(args)
        .output()
        .expect("run fsync-probe");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

#[test]
fn classic_mode_prints_one_line_the_scripts_parse() {
    let d = scratch("classic");
    let (rc, out, err) = probe(&[d.to_str().expect("utf-8 path"), "5"]);
    assert_eq!(rc, 0, "{err}");
    let line = out.trim();
    assert!(line.starts_with("fdatasync_4k count=5 "), "{line}");
    for key in ["mean_us", "p50_us", "p90_us", "p99_us", "max_us"] {
        let v: f64 = field(line, key)
            .unwrap_or_else(|| panic!("{key} in {line}"))
            .parse()
            .expect("a number");
        assert!(v > 0.0, "{key}={v}");
    }
    assert!(
        std::fs::read_dir(&d).expect("read dir").next().is_none(),
        "the probe removes its file"
    );
}

#[test]
fn compare_measures_every_strategy_at_every_size() {
    let d = scratch("compare");
    let (rc, out, err) = probe(&[
        "--compare",
        "--count",
        "6",
        "--rounds",
        "3",
        "--sizes",
        "64,100,4096",
        "--kv",
        d.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(rc, 0, "{err}{out}");
    for s in STRATEGIES {
        for size in ["64", "100", "4096"] {
            let line = out
                .lines()
                .find(|l| field(l, "strategy") == Some(s) && field(l, "size") == Some(size))
                .unwrap_or_else(|| panic!("no row for {s} {size}:\n{out}"));
            assert_eq!(field(line, "count"), Some("6"), "{line}");
            let p50: f64 = field(line, "p50_us").expect("p50").parse().expect("num");
            let p99: f64 = field(line, "p99_us").expect("p99").parse().expect("num");
            let max: f64 = field(line, "max_us").expect("max").parse().expect("num");
            assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{line}");
        }
    }
    assert!(
        std::fs::read_dir(&d).expect("read dir").next().is_none(),
        "the probe removes its files"
    );
}

#[test]
fn compare_table_mode_has_a_header_and_a_row_per_case() {
    let d = scratch("table");
    let (rc, out, err) = probe(&[
        "--compare",
        "--count",
        "2",
        "--rounds",
        "1",
        "--strategies",
        "zeroed+rwf_dsync,uring:zeroed+o_direct",
        "--sizes",
        "64",
        d.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(rc, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("strategy"), "{out}");
    assert!(lines[1].starts_with("zeroed+rwf_dsync "), "{out}");
    assert!(lines[2].starts_with("uring:zeroed+o_direct "), "{out}");
}

#[test]
fn bad_input_is_refused_and_makes_no_file() {
    let d = scratch("bad");
    let dir = d.to_str().expect("utf-8 path");
    for args in [
        vec!["--compare", "--count", "0", dir],
        vec!["--compare", "--sizes", "64,x", dir],
        vec!["--compare", "--strategies", "append+nothing", dir],
        vec!["--compare", "--count", "3", "--rounds", "5", dir],
        vec!["--compare", "--bogus", dir],
        vec!["--compare"],
    ] {
        let (rc, _, err) = probe(&args);
        assert_eq!(rc, 64, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
    }
    assert!(std::fs::read_dir(&d).expect("read dir").next().is_none());
}
