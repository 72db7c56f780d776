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

/// `--writers`: readers (shared) and writers (exclusive) on one hot key in
/// one load generator, each Acquire's send, grant and Release times kept.
/// The server's queue is strict FIFO across accesses, so no reader that
/// asked after a writer is granted before it (`fifo.overtakes` 0), and
/// every measured writer Acquire was granted and analysed. One shard: its
/// Acquires reach the key in the order they were written (the load
/// generator is one thread), so the default 50 µs guard is ample even on
/// a loaded machine.
#[test]
fn mixed_readers_and_writers_no_reader_overtakes_a_writer() {
    let server = common::Server::start(&["--threads", "1"]);
    let target = format!("ringlock-session://{}", server.lock_addr);
    let s = run(&[
        "--target",
        &target,
        "--connections",
        "10",
        "--writers",
        "2",
        "--access",
        "shared",
        "--dist",
        "hot",
        "--keys",
        "1",
        "--hold",
        "100us",
        "--duration",
        "600ms",
        "--warmup",
        "100ms",
        "--key-prefix",
        "mixed",
        "--no-progress",
    ]);
    assert_clean("mixed", &s, 10);
    let f = s.fifo.as_ref().expect("--writers reports the FIFO figures");
    assert!(f.writer_acquires > 0, "no writer acquire measured");
    assert_eq!(
        f.analysed, f.writer_acquires,
        "every measured writer acquire was granted and analysed"
    );
    assert_eq!(s.lock_writers.len(), f.writer_acquires);
    assert_eq!(s.lock_readers.len() + s.lock_writers.len(), s.grants);
    assert!(
        s.lock_readers.len() > s.lock_writers.len(),
        "8 readers, 2 writers"
    );
    assert_eq!(f.excess.len(), f.analysed);
    assert_eq!(
        (f.overtakes, f.writers_overtaken),
        (0, 0),
        "readers that asked after a writer were granted before it \
         (excess p99 {} µs)",
        f.excess.value_at_percentile(99.0) / 1000
    );
    let held = common::keys(server.admin_addr);
    assert!(held.is_empty(), "left held: {held:?}");
}
