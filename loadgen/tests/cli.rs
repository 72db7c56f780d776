//! The `ringlock-loadgen` binary's own flags (the load itself is tested in
//! the bench crate against the real servers).

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ringlock-loadgen"))
        .args(args)
        .output()
        .expect("run ringlock-loadgen")
}

#[test]
fn version_and_help_exit_zero_on_stdout() {
    for flag in ["--version", "-V"] {
        let o = run(&[flag]);
        assert_eq!(o.status.code(), Some(0), "{flag}");
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            format!("ringlock-loadgen {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
    let o = run(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains("--version"));
    let o = run(&["--frob"]);
    assert_eq!(o.status.code(), Some(2));
}

/// A loopback port where nothing listens.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_run_where_every_request_failed_exits_1_and_says_why() {
    let port = closed_port();
    for scheme in ["redis", "ringlock", "ringlock-session"] {
        let target = format!("{scheme}://127.0.0.1:{port}");
        let o = run(&[
            "--target",
            &target,
            "--duration",
            "300ms",
            "--warmup",
            "0",
            "--drain",
            "100ms",
            "--no-progress",
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{target}: {o:?}");
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("error: every request failed: ")
                && last.contains("connect ")
                && last.contains("Connection refused"),
            "{target}: {err}"
        );
        // The report is still printed, with the errors in it.
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("errors "), "{target}: {out}");
    }
}

#[test]
fn a_target_with_an_unknown_scheme_is_refused() {
    // http:// used to mean etcd's gateway on port 2379, silently.
    for (target, says) in [
        ("http://127.0.0.1:2379", "etcd://HOST:PORT"),
        ("https://127.0.0.1", "etcd://HOST:PORT"),
        ("memcached://127.0.0.1:11211", "known: ringlock"),
    ] {
        let o = run(&["--target", target, "--duration", "100ms"]);
        assert_eq!(o.status.code(), Some(2), "{target}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("unknown scheme") && err.contains(says),
            "{target}: {err}"
        );
        assert!(o.stdout.is_empty(), "{target}: nothing ran");
    }
}
