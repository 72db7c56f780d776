//! The `lease-expiry` benchmark's plumbing with tiny counts: it drives the
//! real lock table, checks itself that every tick released exactly the
//! leases due in it (exit 1 otherwise), and prints one cell per (held,
//! expiring) pair. No timing is asserted: the figures are for people.

use std::process::Command;

use ringlock_bench::json::{self, Value};

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lease-expiry"))
        .args(args)
        .output()
        .expect("run lease-expiry")
}

#[test]
fn every_cell_is_measured_and_checked() {
    let o = run(&[
        "--held",
        "50,500",
        "--expiring",
        "0,1,50,100",
        "--rounds",
        "3",
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "exit {:?}: {}{stdout}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        stdout.contains("| expiring k \\ held H | 50 | 500 |"),
        "{stdout}"
    );
    assert!(stdout.contains("scan of all H holds"), "{stdout}");
    let v = json::parse(stdout.lines().last().expect("a JSON line")).expect("valid JSON");
    let Some(Value::Arr(cells)) = v.get("cells") else {
        panic!("no cells in {stdout}");
    };
    // k = 100 exceeds H = 50: 3 cells for H = 50, 4 for H = 500.
    assert_eq!(cells.len(), 7, "{stdout}");
    for c in cells {
        assert_eq!(c.num("rounds"), Some(3.0), "{stdout}");
        assert!(c
            .num("p50_ns")
            .is_some_and(|p| p <= c.num("max_ns").unwrap_or(0.0)));
    }
    let Some(Value::Arr(scan)) = v.get("scan") else {
        panic!("no scan in {stdout}");
    };
    assert_eq!(scan.len(), 2, "{stdout}");
}

#[test]
fn bad_arguments_are_refused() {
    for args in [
        &["--held", "0"][..],
        &["--rounds", "0"],
        &["--held", "x"],
        &["--frob"],
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).starts_with("lease-expiry: "),
            "{args:?}"
        );
    }
}
