//! Runs the load generator (in-process) against the real floor-server binary
//! for about a second in each connection mode and checks the figures add up.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use ringlock_loadgen::{config, engine, report};

struct Floor(Child);

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_floor() -> (Floor, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_floor-server"))
        .args(["--bind", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("floor-server starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut line = String::new();
    BufReader::new(stderr)
        .read_line(&mut line)
        .expect("floor-server prints its address");
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("lock="))
        .unwrap_or_else(|| panic!("no lock= in {line:?}"))
        .to_string();
    (Floor(child), addr)
}

fn run(args: &[&str]) -> (config::Config, engine::Stats) {
    let cfg = config::parse_args(args.iter().map(std::ffi::OsString::from)).expect("valid args");
    let stats = engine::run(&cfg).expect("run completes");
    (cfg, stats)
}

#[test]
fn loadgen_against_floor() {
    let (_floor, addr) = start_floor();
    let target = format!("ringlock://{addr}");

    // Open loop, persistent connections: the achieved rate must match the target.
    let (cfg, st) = run(&[
        "--target",
        &target,
        "--connections",
        "4",
        "--rate",
        "2000",
        "--duration",
        "0.5s",
        "--warmup",
        "0.1s",
        "--keys",
        "100",
        "--no-progress",
    ]);
    assert_eq!(st.errors.total(), 0, "{:?} {:?}", st.errors, st.first_error);
    let ops = report::ops_per_sec(&st);
    // Loose lower bound: CI runs this beside other CPU-heavy tests on 2 cores.
    assert!(
        (1000.0..2300.0).contains(&ops),
        "open loop achieved {ops}/s for a 2000/s target"
    );
    assert_eq!(st.lock.len(), st.grants);
    assert_eq!(st.connects, 4);
    let json = report::to_json(&cfg, &st);
    for field in [
        "\"ops_per_sec\":",
        "\"errors\":0",
        "\"p50\":",
        "\"p9999\":",
        "\"max\":",
    ] {
        assert!(json.contains(field), "{field} missing in {json}");
    }

    // Closed loop, a connection per request, try-lock on one hot key.
    let (_, st) = run(&[
        "--target",
        &target,
        "--connections",
        "2",
        "--duration",
        "0.3s",
        "--warmup",
        "0.1s",
        "--conn-mode",
        "per-request",
        "--mix",
        "try-lock",
        "--dist",
        "hot",
        "--no-progress",
    ]);
    assert_eq!(st.errors.total(), 0, "{:?} {:?}", st.errors, st.first_error);
    assert!(st.cycles > 10, "only {} cycles", st.cycles);
    // The floor grants everything, so each cycle took two connections.
    assert!(
        st.connects >= 2 * st.cycles,
        "{} connects for {} cycles",
        st.connects,
        st.cycles
    );
}

#[test]
fn refused_connections_are_errors_not_hangs() {
    // Bind and drop to get a port that (almost certainly) nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let target = format!("ringlock://127.0.0.1:{port}");
    let (_, st) = run(&[
        "--target",
        &target,
        "--duration",
        "0.2s",
        "--warmup",
        "0s",
        "--no-progress",
    ]);
    assert_eq!(st.cycles, 0);
    assert!(st.errors.connect > 0);
}
