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
