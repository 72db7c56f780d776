//! The deploy files pass ringlockd command-line flags; every one of them must
//! be a flag the built binary knows, or a deployment fails at start-up.
//! (YAML structure, alert rules, schemas, the Dockerfile, the systemd unit
//! and the seccomp profile are checked by `scripts/check-deploy.sh`.)

use std::path::Path;
use std::process::Command;

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `--flag` tokens of one line (stops at `=`, quotes, commas).
fn flags_in(line: &str) -> Vec<String> {
    line.split(|c: char| c.is_whitespace() || matches!(c, '"' | ',' | '[' | ']' | '='))
        .filter(|t| t.starts_with("--") && t.len() > 2)
        .map(str::to_string)
        .collect()
}

fn deploy_flags() -> Vec<(String, String)> {
    let mut found = Vec::new();
    for line in read("deploy/kubernetes/ringlock.yaml").lines() {
        let t = line.trim_start();
        if let Some(arg) = t.strip_prefix("- ") {
            if arg.starts_with("--") {
                found.extend(
                    flags_in(arg)
                        .into_iter()
                        .map(|f| ("kubernetes".to_string(), f)),
                );
            }
        }
    }
    for line in read("deploy/systemd/ringlock.service").lines() {
        if line.starts_with("ExecStart=") {
            found.extend(
                flags_in(line)
                    .into_iter()
                    .map(|f| ("systemd".to_string(), f)),
            );
        }
    }
    for line in read("deploy/docker/Dockerfile").lines() {
        if line.starts_with("CMD ") || line.starts_with("ENTRYPOINT ") {
            found.extend(
                flags_in(line)
                    .into_iter()
                    .map(|f| ("Dockerfile".to_string(), f)),
            );
        }
    }
    found
}

#[test]
fn deploy_files_pass_the_data_path_and_bind_flags() {
    let flags = deploy_flags();
    for origin in ["kubernetes", "systemd", "Dockerfile"] {
        for needed in ["--bind", "--admin-bind", "--metrics-bind", "--data-path"] {
            assert!(
                flags.iter().any(|(o, f)| o == origin && f == needed),
                "{origin} does not pass {needed}: {flags:?}"
            );
        }
    }
}

#[test]
fn every_flag_in_the_deploy_files_is_known_to_ringlockd() {
    let out = Command::new(env!("CARGO_BIN_EXE_ringlockd"))
        .arg("--help")
        .output()
        .expect("ringlockd runs");
    let help = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && help.contains("--bind"),
        "ringlockd --help must list its flags:\n{help}"
    );
    let unknown: Vec<_> = deploy_flags()
        .into_iter()
        .filter(|(_, f)| {
            !help
                .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
                .any(|w| w == f)
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "flags not in `ringlockd --help`: {unknown:?}\n{help}"
    );
}
