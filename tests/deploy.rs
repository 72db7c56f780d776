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
    for (file, origin) in [
        ("deploy/kubernetes/ringlock.yaml", "kubernetes"),
        (
            "deploy/kubernetes/ringlock-cluster.yaml",
            "kubernetes-cluster",
        ),
    ] {
        kube_flags(&read(file), origin, &mut found);
    }
    for (file, origin) in [
        ("deploy/systemd/ringlock.service", "systemd"),
        (
            "deploy/systemd/ringlock-cluster@.service",
            "systemd-cluster",
        ),
    ] {
        for line in read(file).lines() {
            if line.starts_with("ExecStart=") {
                found.extend(flags_in(line).into_iter().map(|f| (origin.to_string(), f)));
            }
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

fn kube_flags(text: &str, origin: &str, found: &mut Vec<(String, String)>) {
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(arg) = t.strip_prefix("- ") {
            if arg.starts_with("--") {
                found.extend(flags_in(arg).into_iter().map(|f| (origin.to_string(), f)));
            }
        }
    }
}

#[test]
fn deploy_files_pass_the_data_path_and_bind_flags() {
    let flags = deploy_flags();
    for origin in [
        "kubernetes",
        "kubernetes-cluster",
        "systemd",
        "systemd-cluster",
        "Dockerfile",
    ] {
        for needed in ["--bind", "--admin-bind", "--metrics-bind", "--data-path"] {
            assert!(
                flags.iter().any(|(o, f)| o == origin && f == needed),
                "{origin} does not pass {needed}: {flags:?}"
            );
        }
    }
}

/// The default shard count (one per CPU of the affinity mask) follows the
/// host, which in a container or under systemd is every CPU of the machine:
/// each file fixes it (the systemd cluster unit through RINGLOCK_THREADS in
/// its environment file, below).
#[test]
fn deploy_files_fix_the_shard_count() {
    let flags = deploy_flags();
    for origin in ["kubernetes", "kubernetes-cluster", "systemd", "Dockerfile"] {
        assert!(
            flags.iter().any(|(o, f)| o == origin && f == "--threads"),
            "{origin} does not pass --threads: {flags:?}"
        );
    }
}

#[test]
fn cluster_files_pass_the_cluster_settings() {
    let flags = deploy_flags();
    for (origin, needed) in [
        ("kubernetes-cluster", "--peers"),
        ("kubernetes-cluster", "--threads"),
        // Secure by default: a cluster node starts only with certificates.
        ("kubernetes-cluster", "--certs-dir"),
        ("systemd-cluster", "--node-id"),
    ] {
        assert!(
            flags.iter().any(|(o, f)| o == origin && f == needed),
            "{origin} does not pass {needed}: {flags:?}"
        );
    }
    // The systemd cluster unit leaves these to the environment file.
    let env = read("deploy/systemd/cluster.env.example");
    for var in ["RINGLOCK_PEERS", "RINGLOCK_THREADS", "RINGLOCK_CERTS_DIR"] {
        assert!(
            env.lines().any(|l| l.starts_with(&format!("{var}="))),
            "cluster.env.example does not set {var}"
        );
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
    // Variables of the cluster env file that ringlockd reads itself (the
    // others are expanded in the unit's ExecStart).
    let unit = read("deploy/systemd/ringlock-cluster@.service");
    for line in read("deploy/systemd/cluster.env.example").lines() {
        let Some((var, _)) = line.split_once('=') else {
            continue;
        };
        if line.starts_with('#') || unit.contains(&format!("${{{var}}}")) {
            continue;
        }
        assert!(
            help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(|w| w == var),
            "cluster.env.example sets {var}, which ringlockd does not read:\n{help}"
        );
    }
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

/// `ringlockd` run on the example config file, with none of the test's own
/// `RINGLOCK_*` variables.
fn check_config(args: &[&str]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringlockd"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("RINGLOCK_") {
            c.env_remove(k);
        }
    }
    c.env_remove("BIND_ADDRESS")
        .env_remove("DATA_PATH")
        .args(args)
        .output()
        .expect("ringlockd runs")
}

#[test]
fn the_example_config_file_passes_check_config() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/ringlockd.toml");
    let out = check_config(&["--config", example.to_str().unwrap(), "--check-config"]);
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "deploy/ringlockd.toml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What it sets is what the listing says.
    for line in read("deploy/ringlockd.toml").lines() {
        if !line.starts_with('#') && line.contains(" = ") {
            assert!(
                listing.lines().any(|l| l == line),
                "{line} not in:\n{listing}"
            );
        }
    }
}

#[test]
fn the_example_config_file_shows_every_setting() {
    let example = read("deploy/ringlockd.toml");
    let out = check_config(&["--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    // Every setting has a variable; its key is the flag's name.
    let keys: Vec<String> = help
        .split("[env: RINGLOCK_")
        .skip(1)
        .filter_map(|rest| rest.split(']').next())
        .map(|var| var.to_ascii_lowercase().replace('_', "-"))
        .filter(|k| k != "config")
        .collect();
    assert!(keys.len() > 30, "{keys:?}");
    for key in keys {
        assert!(
            example.lines().any(|l| l
                .trim_start_matches(['#', ' '])
                .starts_with(&format!("{key} = "))),
            "deploy/ringlockd.toml does not show {key}"
        );
    }
}

/// The value of `flag` in a manifest's `args:` list (`- --threads` then
/// `- "1"`), and the container's `requests: cpu:`.
fn kube_threads_and_cpu(text: &str) -> (Option<String>, Option<String>) {
    let items: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let unquote = |v: &str| v.trim().trim_matches('"').to_string();
    let threads = items
        .windows(2)
        .find(|w| w[0] == "- --threads")
        .and_then(|w| w[1].strip_prefix("- "))
        .map(unquote);
    let cpu = items
        .windows(2)
        .find(|w| w[0] == "requests:" && w[1].starts_with("cpu:"))
        .map(|w| unquote(&w[1]["cpu:".len()..]));
    (threads, cpu)
}

#[test]
fn kubernetes_threads_match_the_cpus_requested() {
    for file in [
        "deploy/kubernetes/ringlock.yaml",
        "deploy/kubernetes/ringlock-cluster.yaml",
    ] {
        let (threads, cpu) = kube_threads_and_cpu(&read(file));
        assert!(
            threads.is_some() && threads == cpu,
            "{file}: --threads {threads:?} must equal the CPUs requested {cpu:?}"
        );
    }
}

/// `(kind, app.kubernetes.io/name it selects)` of each document: the
/// `matchLabels` right under `selector:` or `podSelector:`.
fn selected_names(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for doc in text.split("\n---\n") {
        let lines: Vec<&str> = doc.lines().map(str::trim).collect();
        let kind = lines
            .iter()
            .find_map(|l| l.strip_prefix("kind: "))
            .unwrap_or("?")
            .to_string();
        for w in lines.windows(3) {
            if matches!(w[0], "selector:" | "podSelector:") && w[1] == "matchLabels:" {
                if let Some(name) = w[2].strip_prefix("app.kubernetes.io/name: ") {
                    out.push((kind.clone(), name.to_string()));
                }
            }
        }
    }
    out
}

/// Both the single node's pods and the cluster's have a NetworkPolicy and
/// a PodMonitor (the cluster's were missing from podmonitor.yaml).
#[test]
fn network_policies_and_pod_monitors_cover_both_manifests() {
    let policies = selected_names(&read("deploy/kubernetes/networkpolicy.yaml"));
    let monitors = selected_names(&read("deploy/kubernetes/podmonitor.yaml"));
    for app in ["ringlock", "ringlock-cluster"] {
        assert!(
            policies
                .iter()
                .any(|(k, n)| k == "NetworkPolicy" && n == app),
            "no NetworkPolicy selects {app}: {policies:?}"
        );
        assert!(
            monitors.iter().any(|(k, n)| k == "PodMonitor" && n == app),
            "no PodMonitor selects {app}: {monitors:?}"
        );
    }
}
