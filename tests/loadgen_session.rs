//! The load generator's session codec (`ringlock-loadgen --target
//! ringlock-session://…`) against the real server binary: the plumbing the
//! `ringlockd-session` benchmark row depends on. Every cycle must be an
//! Acquire granted with a token and a Release that the server accepts
//! (a wrong token would come back "stale" and count as `not_held`), with
//! the same figures as the Locking-Center persistent mode beside it.

mod common;

use ringlock_loadgen::{config, engine};

fn run(args: &[&str]) -> engine::Stats {
    let cfg = config::parse_args(args.iter().map(std::ffi::OsString::from)).expect("valid args");
    engine::run(&cfg).expect("the run completes")
}

fn assert_clean(what: &str, s: &engine::Stats, connections: u64) {
    assert_eq!(
        s.errors.total(),
        0,
        "{what}: errors (first: {:?})",
        s.first_error
    );
    assert!(s.cycles > 0, "{what}: no cycle completed");
    assert_eq!(
        s.grants, s.cycles,
        "{what}: one grant per lock+unlock cycle"
    );
    assert_eq!(s.connects, connections, "{what}: one connection per client");
}

#[test]
fn session_cycles_against_the_real_server() {
    let server = common::Server::start(&[]);
    let addr = server.lock_addr.to_string();
    for (scheme, dist, keys) in [
        ("ringlock-session", "uniform", "50"),
        ("ringlock-session", "hot", "1"),
        ("ringlock", "hot", "1"),
    ] {
        let target = format!("{scheme}://{addr}");
        let s = run(&[
            "--target",
            &target,
            "--connections",
            "4",
            "--dist",
            dist,
            "--keys",
            keys,
            "--rate",
            "0",
            "--duration",
            "400ms",
            "--warmup",
            "100ms",
            "--key-prefix",
            scheme,
            "--no-progress",
        ]);
        assert_clean(&format!("{scheme} {dist}"), &s, 4);
    }
    // Try-lock on one hot key: every attempt is a grant or a busy answer.
    let target = format!("ringlock-session://{addr}");
    let s = run(&[
        "--target",
        &target,
        "--connections",
        "4",
        "--dist",
        "hot",
        "--keys",
        "1",
        "--mix",
        "try-lock",
        "--duration",
        "300ms",
        "--warmup",
        "0ms",
        "--no-progress",
    ]);
    assert_eq!(s.errors.total(), 0, "try-lock: {:?}", s.first_error);
    assert_eq!(s.grants + s.busy, s.cycles);
    // Every session hold was released by its token: nothing is left held.
    let held = common::keys(server.admin_addr);
    assert!(held.is_empty(), "left held: {held:?}");
}
