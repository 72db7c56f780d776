//! The `ringlock` CLI against the real `ringlockd` binary.

mod common;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::Server;
use ringlock::client::Client;

fn cli(lock: SocketAddr, admin: SocketAddr) -> Command {
    common::ringlock_cmd(lock, admin)
}

fn ringlock(s: &Server) -> Command {
    cli(s.lock_addr, s.admin_addr)
}

fn run(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().expect("run ringlock")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("ringlock exits, it is not killed")
}

fn stderr_line(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "one-line message, got {err:?}");
    assert!(err.starts_with("ringlock: "), "{err:?}");
    err
}

fn held_keys(s: &Server) -> Vec<String> {
    common::keys(s.admin_addr)
        .into_iter()
        .map(|k| String::from_utf8_lossy(&k.key).into_owned())
        .collect()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringlock-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn lib_client(s: &Server, source: &str) -> Client {
    Client::builder(s.lock_addr)
        .admin_addr(s.admin_addr)
        .source(source)
        .build()
        .unwrap()
}

fn sigterm(pid: u32) {
    // SAFETY: plain kill(2) on a child process we started and have not reaped.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
}

/// Waits for the child to exit. The bound only turns a hang into a failure
/// (it is not a performance assertion), so it is generous.
fn wait_exit(mut child: std::process::Child) -> std::process::ExitStatus {
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait().expect("wait for ringlock"));
    });
    rx.recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("ringlock (pid {pid}) never exited"))
}

fn queued_waiters(s: &Server) -> f64 {
    common::metric(s.metrics(), "ringlock_queued_waiters")
}

fn wait_queued(s: &Server, n: u64) {
    common::wait_metric(s.metrics(), "ringlock_queued_waiters", n as f64);
}

fn ringlock_args(s: &Server, args: &[&str]) -> Output {
    let mut c = ringlock(s);
    c.args(args);
    run(c)
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("ringlock prints UTF-8")
}

/// A listener that must never see a connection: usage errors send nothing.
struct NoTraffic(TcpListener);

impl NoTraffic {
    fn new() -> NoTraffic {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        NoTraffic(l)
    }
    fn addr(&self) -> SocketAddr {
        self.0.local_addr().unwrap()
    }
}

impl Drop for NoTraffic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert_eq!(
                self.0.accept().unwrap_err().kind(),
                std::io::ErrorKind::WouldBlock,
                "no connection was made"
            );
        }
    }
}

#[test]
fn concurrent_locks_never_interleave() {
    let s = Server::start(&[]);
    let dir = scratch("interleave");
    let log = dir.join("log");
    let children: Vec<_> = (0..4)
        .map(|i| {
            let script = format!(
                "echo start{i} >> {log}; sleep 0.05; echo end{i} >> {log}",
                log = log.display()
            );
            let mut c = ringlock(&s);
            c.args(["lock", "shared", "--", "sh", "-c", &script]);
            c.stdin(Stdio::null()).spawn().unwrap()
        })
        .collect();
    for child in children {
        assert!(wait_exit(child).success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 8, "{text}");
    for pair in lines.chunks(2) {
        let who = pair[0].strip_prefix("start").expect("a start line");
        assert_eq!(pair[1], format!("end{who}"), "interleaved:\n{text}");
    }
    assert!(held_keys(&s).is_empty());
}

#[test]
fn exit_status_passes_through_and_the_key_is_released() {
    let s = Server::start(&[]);
    for (cmd, want) in [
        (&["true"][..], 0),
        (&["sh", "-c", "exit 3"], 3),
        (&["sh", "-c", "kill -KILL $$"], 128 + 9),
        (&["/nonexistent/command"], 127),
    ] {
        let mut c = ringlock(&s);
        c.args(["lock", "k", "--"]).args(cmd);
        let o = run(c);
        assert_eq!(
            code(&o),
            want,
            "{cmd:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(held_keys(&s).is_empty(), "{cmd:?} left the key held");
    }
}

#[test]
fn sigterm_is_forwarded_and_the_key_released_after_the_child() {
    let s = Server::start(&[]);
    let mut c = ringlock(&s);
    c.args([
        "lock",
        "term",
        "--",
        "sh",
        "-c",
        "echo ready; exec sleep 30",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    assert_eq!(held_keys(&s), ["term"]);
    sigterm(child.id());
    let status = wait_exit(child);
    assert_eq!(status.code(), Some(128 + 15), "the child died of SIGTERM");
    assert!(held_keys(&s).is_empty());
}

#[test]
fn sigterm_while_waiting_withdraws_the_request() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let holder = lib_client(&s, "holder").lock("w").unwrap();
    let mut c = ringlock(&s);
    c.args(["lock", "w", "--", "true"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    // Queued means the handlers are installed (they are set before the
    // request is sent): the signal must withdraw it, not kill the CLI.
    wait_queued(&s, 1);
    sigterm(child.id());
    let out = child.wait_with_output().expect("wait for ringlock");
    assert_eq!(out.status.code(), Some(128 + 15), "{out:?}");
    assert!(stderr_line(&out).contains("request withdrawn"));
    assert_eq!(queued_waiters(&s), 0.0, "the waiter was withdrawn");
    drop(holder);
    assert!(
        held_keys(&s).is_empty(),
        "no ghost holder after the withdrawal"
    );
}

#[test]
fn try_lock_on_a_held_key_does_not_run_the_command() {
    let s = Server::start(&[]);
    let dir = scratch("trylock");
    let marker = dir.join("ran");
    let holder = lib_client(&s, "holder").lock("t").unwrap();
    let mut c = ringlock(&s);
    c.args(["try-lock", "t", "--", "touch"]).arg(&marker);
    let o = run(c);
    assert_eq!(code(&o), 75);
    // It says who holds the key (asked through KEYS).
    let line = stderr_line(&o);
    let endpoint = holder.endpoint().unwrap().to_string();
    assert!(
        line.contains("t is held by source holder") && line.contains(&endpoint),
        "{line}"
    );
    assert!(!marker.exists(), "command must not run");
    drop(holder);

    let mut c = ringlock(&s);
    c.args(["try-lock", "t", "--", "touch"]).arg(&marker);
    assert_eq!(code(&run(c)), 0);
    assert!(marker.exists());
    assert!(held_keys(&s).is_empty());
}

#[test]
fn lock_timeout_gives_up_with_tempfail() {
    let s = Server::start(&[]);
    let holder = lib_client(&s, "holder").lock("slow").unwrap();
    let mut c = ringlock(&s);
    c.args(["lock", "slow", "--timeout", "100ms", "--", "true"]);
    let o = run(c);
    assert_eq!(code(&o), 75);
    let line = stderr_line(&o);
    assert!(line.contains("timed out after 100ms"), "{line}");
    assert!(line.contains("held by source holder"), "{line}");
    assert_eq!(held_keys(&s), ["slow"]);
    drop(holder);
    assert!(held_keys(&s).is_empty());
}

#[test]
fn keys_lists_held_keys() {
    let s = Server::start(&[]);
    let g = lib_client(&s, "svc-a").lock("deploy/prod").unwrap();
    let o = run({
        let mut c = ringlock(&s);
        c.arg("keys");
        c
    });
    assert_eq!(code(&o), 0);
    let out = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with("KEY") && lines[0].contains("HELD"),
        "{out}"
    );
    let cols: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(cols[0], "deploy/prod");
    assert_eq!(cols[1], "svc-a");
    assert_eq!(cols[2], g.endpoint().unwrap().to_string());
    assert!(cols[3].ends_with('s'), "held for: {}", cols[3]);

    let o = run({
        let mut c = ringlock(&s);
        c.args(["keys", "-d"]);
        c
    });
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("ACQUIRED"), "{out}");
    assert!(out.lines().nth(1).unwrap().ends_with('Z'), "{out}");
}

#[test]
fn unlock_and_resets() {
    let s = Server::start(&[]);
    let other = lib_client(&s, "x");
    let guards: Vec<_> = ["k1", "k2", "k3", "k4"]
        .iter()
        .map(|k| other.lock(k).unwrap())
        .collect();
    let ok = |args: &[&str]| {
        let mut c = ringlock(&s);
        c.args(args);
        let o = run(c);
        assert_eq!(
            code(&o),
            0,
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    ok(&["unlock", "k1"]);
    assert_eq!(held_keys(&s), ["k2", "k3", "k4"]);
    ok(&["reset", "k2", "k3"]);
    assert_eq!(held_keys(&s), ["k4"]);
    ok(&["reset", "--source", "x"]);
    assert!(held_keys(&s).is_empty());
    drop(guards);
}

#[test]
fn usage_errors_send_nothing_and_exit_64() {
    let quiet = NoTraffic::new();
    let addr = quiet.addr();
    let long = "k".repeat(128);
    // A reset's source may be up to 255 bytes (a session's).
    let long_source = "s".repeat(256);
    for args in [
        &["lock", "", "--", "true"][..],
        &["lock", &long, "--", "true"],
        &["try-lock", "", "--", "true"],
        &["unlock", &long],
        &["reset", "ok", ""],
        &["reset", "--source", &long_source],
        // A session's source is up to 255 bytes, a persistent lock's 127.
        &["--source", &long_source, "lock", "k", "--", "true"],
        &["--source", &long, "lock", "--persistent", "k", "--", "true"],
        &[
            "--source",
            &long,
            "try-lock",
            "--persistent",
            "k",
            "--",
            "true",
        ],
        &["reset", "k", "--source", "s"],
        &["lock", "k"],
        // A missing key is a usage error, not "lock `echo`, run `hi`".
        &["lock", "--", "echo", "hi"],
        &["try-lock", "--", "echo", "hi"],
        &["lock", "k", "echo", "hi"],
        &["lock", "k", "--timeout", "soon", "--", "true"],
        &["--key-format", "hex", "unlock", "abc"],
        &["--key-format", "escaped", "unlock", "a\\q"],
        &["keys", "--older-than", "later"],
        &["frob"],
        &[],
    ] {
        let mut c = cli(addr, addr);
        c.args(args);
        let o = run(c);
        assert_eq!(
            code(&o),
            64,
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        stderr_line(&o);
    }
}

#[test]
fn help_version_completions_and_man_page() {
    let quiet = NoTraffic::new();
    let addr = quiet.addr();
    for args in [
        &["--help"][..],
        &["-h"],
        &["lock", "--help"],
        &["keys", "-h"],
    ] {
        let mut c = cli(addr, addr);
        c.args(args);
        let o = run(c);
        assert_eq!(code(&o), 0, "{args:?}");
        assert!(
            stdout(&o).contains("Usage: ringlock"),
            "{args:?}: {}",
            stdout(&o)
        );
    }
    let mut c = cli(addr, addr);
    c.arg("--help");
    let help = stdout(&run(c));
    assert!(
        help.contains("75   lock not obtained"),
        "exit codes in --help: {help}"
    );

    let mut c = cli(addr, addr);
    c.arg("--version");
    let o = run(c);
    assert_eq!(code(&o), 0);
    assert_eq!(
        stdout(&o),
        format!("ringlock {}\n", env!("CARGO_PKG_VERSION"))
    );

    let o = run({
        let mut c = Command::new(env!("CARGO_BIN_EXE_ringlockd"));
        c.arg("--version");
        c
    });
    assert_eq!(code(&o), 0);
    assert_eq!(
        stdout(&o),
        format!("ringlockd {}\n", env!("CARGO_PKG_VERSION"))
    );

    for (shell, marker) in [
        ("bash", "_ringlock()"),
        ("zsh", "#compdef ringlock"),
        ("fish", "complete -c ringlock"),
    ] {
        let mut c = cli(addr, addr);
        c.args(["completions", shell]);
        let o = run(c);
        assert_eq!(code(&o), 0, "{shell}");
        let text = stdout(&o);
        assert!(text.contains(marker), "{shell}: {text}");
        assert!(
            text.contains("try-lock") && text.contains("older-than"),
            "{shell}"
        );
    }
    let mut c = cli(addr, addr);
    c.arg("man");
    let o = run(c);
    assert_eq!(code(&o), 0);
    let page = stdout(&o);
    assert!(page.contains(".TH ringlock 1"), "{page}");
    assert!(
        page.contains("try\\-lock") && page.contains("RINGLOCK_ADDR"),
        "{page}"
    );
}

/// `man --dir` and `completions --dir` create a missing folder (a fresh
/// home has no ~/.local/share/man/man1), and every page the man pages
/// refer to (`ringlock-lock(1)`, ...) is written.
#[test]
fn man_and_completions_install_into_a_missing_folder() {
    let quiet = NoTraffic::new();
    let addr = quiet.addr();
    let home = scratch("install");
    let man1 = home.join(".local/share/man/man1");
    let mut c = cli(addr, addr);
    c.arg("man").arg("--dir").arg(&man1);
    let o = run(c);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let listed: Vec<PathBuf> = stdout(&o).lines().map(PathBuf::from).collect();
    let mut names: Vec<String> = std::fs::read_dir(&man1)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut listed_names: Vec<String> = listed
        .iter()
        .map(|p| {
            assert_eq!(p.parent(), Some(man1.as_path()), "{p:?}");
            p.file_name().unwrap().to_string_lossy().into_owned()
        })
        .collect();
    listed_names.sort();
    assert_eq!(
        listed_names, names,
        "stdout lists exactly the pages written"
    );
    for page in [
        "ringlock.1",
        "ringlock-lock.1",
        "ringlock-try-lock.1",
        "ringlock-keys.1",
        "ringlock-cluster.1",
        "ringlock-cluster-status.1",
        "ringlock-cluster-transfer-leader.1",
        "ringlock-cert-create-node.1",
        "ringlock-man.1",
    ] {
        assert!(names.iter().any(|n| n == page), "{page} in {names:?}");
    }
    // Every `NAME(1)` a page refers to is a page that was written, and the
    // top page is the one `ringlock man` prints.
    for name in &names {
        let text = std::fs::read_to_string(man1.join(name)).unwrap();
        assert!(text.starts_with(".ie \\n(.g .ds Aq"), "{name}: roff");
        for word in text.split(|c: char| c.is_whitespace()) {
            if let Some(page) = word
                .strip_suffix("(1)")
                .filter(|p| p.starts_with("ringlock"))
            {
                let file = format!("{}.1", page.replace("\\-", "-"));
                assert!(
                    names.contains(&file),
                    "{name} refers to {word}, not written"
                );
            }
        }
    }
    let mut c = cli(addr, addr);
    c.arg("man");
    let printed = run(c);
    assert_eq!(
        printed.stdout,
        std::fs::read(man1.join("ringlock.1")).unwrap(),
        "`ringlock man` prints ringlock.1"
    );
    // Writing again overwrites (a reinstall after an upgrade).
    let mut c = cli(addr, addr);
    c.arg("man").arg("--dir").arg(&man1);
    assert_eq!(code(&run(c)), 0);

    for (shell, dir, file, marker) in [
        (
            "bash",
            ".local/share/bash-completion/completions",
            "ringlock",
            "_ringlock()",
        ),
        ("zsh", ".zfunc", "_ringlock", "#compdef ringlock"),
        (
            "fish",
            ".config/fish/completions",
            "ringlock.fish",
            "complete -c ringlock",
        ),
    ] {
        let dir = home.join(dir);
        let mut c = cli(addr, addr);
        c.args(["completions", shell, "--dir"]).arg(&dir);
        let o = run(c);
        assert_eq!(
            code(&o),
            0,
            "{shell}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let path = dir.join(file);
        assert_eq!(stdout(&o), format!("{}\n", path.display()), "{shell}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(marker), "{shell}: {text}");
    }
    // A folder that cannot be created: one line, exit 73, nothing written.
    let blocker = home.join("a-file");
    std::fs::write(&blocker, "").unwrap();
    for args in [&["man", "--dir"][..], &["completions", "bash", "--dir"]] {
        let mut c = cli(addr, addr);
        c.args(args).arg(blocker.join("man1"));
        let o = run(c);
        assert_eq!(code(&o), 73, "{args:?}");
        assert!(stderr_line(&o).contains("a-file"), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    let _ = std::fs::remove_dir_all(&home);
}

/// `ringlock --help` and `ringlock cluster --help` name every cluster
/// subcommand in the cluster command's summary, not only `status`.
#[test]
fn cluster_help_names_every_cluster_subcommand() {
    let quiet = NoTraffic::new();
    let addr = quiet.addr();
    let subcommands = ["status", "transfer-leader", "add", "remove", "replace"];
    let mut c = cli(addr, addr);
    c.args(["cluster", "--help"]);
    let o = run(c);
    assert_eq!(code(&o), 0);
    let help = stdout(&o);
    let summary = help.split("\n\n").next().unwrap();
    for sub in subcommands {
        assert!(summary.contains(sub), "{sub} not in {summary:?}");
    }
    let mut c = cli(addr, addr);
    c.arg("--help");
    let help = stdout(&run(c));
    let entry = help
        .split("\n  cluster ")
        .nth(1)
        .and_then(|rest| rest.split("\n  cert ").next())
        .unwrap_or_else(|| panic!("no cluster entry in {help}"));
    for sub in subcommands {
        assert!(entry.contains(sub), "{sub} not in {entry:?}");
    }
}

#[test]
fn bad_addresses_are_usage_errors_that_name_the_address() {
    for (args, env, named) in [
        (
            &["--addr", "127.0.0.1:99999", "keys"][..],
            None,
            "--addr: invalid address \"127.0.0.1:99999\": invalid port",
        ),
        (
            &["--addr", "nonsense.invalid", "keys"],
            None,
            "--addr: invalid address \"nonsense.invalid\": cannot resolve host",
        ),
        (
            &["--addr", "127.0.0.1:x", "unlock", "k"],
            None,
            "invalid port \"x\"",
        ),
        (
            &["--admin-addr", "[::1", "keys"],
            None,
            "--admin-addr: invalid address \"[::1\"",
        ),
        (
            &["keys"],
            Some("127.0.0.1:0"),
            "RINGLOCK_ADDR: invalid address \"127.0.0.1:0\": port 0",
        ),
    ] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ringlock"));
        c.env_remove("RINGLOCK_ADDR")
            .env_remove("RINGLOCK_ADMIN_ADDR")
            .args(["--retry", "0"])
            .args(args);
        if let Some(v) = env {
            c.env("RINGLOCK_ADDR", v);
        }
        let o = run(c);
        assert_eq!(code(&o), 64, "{args:?}");
        let line = stderr_line(&o);
        assert!(line.contains(named), "{args:?}: {line}");
    }
}

/// A server on the default ports of a loopback address of its own
/// (127.x.y.z), so that `--addr HOST` without a port is tested for real.
fn server_on_default_ports() -> (Server, String) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .subsec_nanos();
    let mut n = std::process::id() ^ nanos;
    for _ in 0..20 {
        let ip = format!(
            "127.{}.{}.{}",
            1 + n % 250,
            1 + (n >> 8) % 250,
            1 + (n >> 16) % 250
        );
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlockd"));
        cmd.args(["--bind", &format!("{ip}:22119")])
            .args(["--admin-bind", &format!("{ip}:22120")]);
        if let Ok(s) = Server::spawn(cmd, &[]) {
            return (s, ip);
        }
        n = n.wrapping_mul(2_654_435_761).wrapping_add(1);
    }
    panic!("no free 127.x.y.z:22119 found");
}

#[test]
fn a_host_without_port_means_the_default_ports() {
    let (s, ip) = server_on_default_ports();
    assert_eq!(s.lock_addr.to_string(), format!("{ip}:22119"));
    assert_eq!(s.admin_addr.to_string(), format!("{ip}:22120"));
    let base = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ringlock"));
        c.env_remove("RINGLOCK_ADMIN_ADDR")
            .env_remove("RINGLOCK_SOURCE")
            .env("RINGLOCK_ADDR", &ip)
            .args(["--retry", "1s"]);
        c
    };
    let mut c = base();
    c.args(["lock", "dflt", "--", "sh", "-c", "exit 7"]);
    assert_eq!(code(&run(c)), 7, "lock through {ip} (port 22119 added)");
    let g = lib_client(&s, "me").lock("dflt").unwrap();
    let mut c = base();
    c.arg("keys");
    let o = run(c);
    assert_eq!(code(&o), 0, "keys through {ip}:22120 (lock port + 1)");
    assert!(stdout(&o).contains("dflt"), "{}", stdout(&o));
    drop(g);
    drop(s);
    // A killed server's io_uring listeners are torn down asynchronously:
    // wait until the port refuses connections.
    let addr: std::net::SocketAddr = format!("{ip}:22119").parse().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_ok() {
        assert!(std::time::Instant::now() < deadline, "{addr} still accepts");
        std::thread::sleep(Duration::from_millis(5));
    }

    // Nothing listens there now: the message names the port that was added.
    let mut c = base();
    c.args(["--retry", "0", "unlock", "dflt"]);
    let o = run(c);
    assert_eq!(code(&o), 69);
    let line = stderr_line(&o);
    assert!(
        line.contains(&format!("server {ip}:22119 unavailable after 1 attempt:")),
        "{line}"
    );
}

#[test]
fn unreachable_server_exits_69() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for args in [
        &["lock", "k", "--", "true"][..],
        &["keys"],
        &["unlock", "k"],
    ] {
        let mut c = cli(closed, closed);
        c.args(["--retry", "0"]).args(args);
        let o = run(c);
        assert_eq!(code(&o), 69, "{args:?}");
        let line = stderr_line(&o);
        assert!(
            line.contains(&format!("server {closed} unavailable after 1 attempt: ")),
            "{args:?}: {line}"
        );
    }
}

/// A command line without --retry (`cli` gives one).
fn cli_default_retry(lock: SocketAddr) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    c.env_remove("RINGLOCK_ADDR")
        .env_remove("RINGLOCK_ADMIN_ADDR")
        .env_remove("RINGLOCK_SOURCE")
        .args(["--addr", &lock.to_string()]);
    c
}

#[test]
fn a_port_where_nothing_listens_fails_at_once_unless_retry_is_asked() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // Session lock, persistent lock (the classic client), admin port.
    for args in [
        &["lock", "k", "--", "true"][..],
        &["lock", "--persistent", "k", "--", "true"],
        &["keys"],
    ] {
        let started = std::time::Instant::now();
        let mut c = cli_default_retry(closed);
        c.args(args);
        let o = run(c);
        let took = started.elapsed();
        assert_eq!(code(&o), 69, "{args:?}");
        let line = stderr_line(&o);
        assert!(
            line.contains("unavailable after 1 attempt: Connection refused")
                && line.contains("nothing listens there")
                && line.contains("--retry D"),
            "{args:?}: {line}"
        );
        // It used to take 8.7 s (11 attempts) to say anything at all.
        assert!(took < Duration::from_secs(2), "{args:?}: {took:?}");
    }
}

#[test]
fn a_retry_says_so_at_once_where_why_and_for_how_long() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for args in [
        &["lock", "k", "--", "true"][..],
        &["lock", "--persistent", "k", "--", "true"],
    ] {
        let started = std::time::Instant::now();
        let mut c = cli_default_retry(closed);
        let mut child = c
            .args(["--retry", "3s"])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ringlock");
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut first = String::new();
        err.read_line(&mut first).expect("a line");
        let first_after = started.elapsed();
        assert_eq!(
            first.trim_end(),
            format!(
                "ringlock: cannot reach {closed}: Connection refused (os error 111); \
                 retrying for up to 3s (--retry)"
            ),
            "{args:?}"
        );
        assert!(
            first_after < Duration::from_secs(1),
            "{args:?}: {first_after:?}"
        );
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(69), "{args:?}");
        assert!(
            rest.contains("unavailable after") && !rest.contains("nothing listens"),
            "{args:?}: {rest}"
        );
        assert_eq!(rest.lines().count(), 1, "one line per streak: {rest}");
        assert!(started.elapsed() >= Duration::from_secs(1), "it retried");
    }
}

#[test]
fn timeout_zero_means_do_not_wait() {
    let s = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    // A free key: taken at once, the command runs.
    let o = ringlock_args(
        &s,
        &["lock", "free/key", "--timeout", "0", "--", "echo", "hi"],
    );
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(stdout(&o), "hi\n");
    assert!(held_keys(&s).is_empty());
    // A held key: exit 75 at once, without ever queueing behind the holder.
    let holder = lib_client(&s, "holder").lock("busy").unwrap();
    let o = ringlock_args(&s, &["lock", "busy", "--timeout", "0", "--", "echo", "hi"]);
    assert_eq!(code(&o), 75);
    assert_eq!(stdout(&o), "", "the command did not run");
    assert!(stderr_line(&o).contains("busy is held by source holder"));
    assert_eq!(queued_waiters(&s), 0.0, "never queued");
    drop(holder);
}

#[test]
fn missing_key_before_the_command_is_refused_and_locks_nothing() {
    let s = Server::start(&[]);
    let o = ringlock_args(&s, &["lock", "--", "echo", "hi"]);
    assert_eq!(code(&o), 64);
    assert!(stderr_line(&o).contains("<KEY>"));
    assert_eq!(stdout(&o), "");
    assert!(held_keys(&s).is_empty(), "`echo` was not locked");
}

#[test]
fn unlock_and_reset_of_free_keys_say_so() {
    let s = Server::start(&[]);
    let g = lib_client(&s, "x").lock("held").unwrap();
    let o = ringlock_args(&s, &["unlock", "free"]);
    assert_eq!(code(&o), 0);
    assert!(
        stderr_line(&o).contains("note: free was not held; nothing was released"),
        "{o:?}"
    );
    let o = ringlock_args(&s, &["reset", "held", "free"]);
    assert_eq!(code(&o), 0);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    // The holder is shown, then reset by its token (compare-and-reset).
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with("ringlock: note: resetting held: held by x at 127.0.0.1:")
            && lines[0].contains("persistent hold, token "),
        "{err}"
    );
    assert_eq!(
        lines[1],
        "ringlock: note: free was not held; nothing was reset"
    );
    assert!(held_keys(&s).is_empty());
    // --force resets whoever holds it, without listing.
    let _g3 = lib_client(&s, "y").lock("forced").unwrap();
    let o = ringlock_args(&s, &["reset", "--force", "forced"]);
    assert_eq!(code(&o), 0);
    assert_eq!(o.stderr, b"");
    assert!(held_keys(&s).is_empty());
    let o = ringlock_args(&s, &["reset", "--source", "nobody"]);
    assert_eq!(code(&o), 0);
    assert!(stderr_line(&o).contains("no key was held by source nobody"));
    // A held key is released quietly.
    let _g2 = lib_client(&s, "x").lock("again").unwrap();
    let o = ringlock_args(&s, &["unlock", "again"]);
    assert_eq!(code(&o), 0);
    assert_eq!(o.stderr, b"");
    drop(g);
}

/// Splits the JSON array of `keys --json` into its objects' fields (enough
/// for these flat objects; values here contain no `,` or `}`).
fn json_rows(text: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    assert!(
        text.starts_with('[') && text.trim_end().ends_with(']'),
        "{text}"
    );
    text.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            l.trim_end_matches(',')
                .trim_start_matches('{')
                .trim_end_matches('}')
                .split(",\"")
                .map(|kv| {
                    let (k, v) = kv.split_once("\":").expect("key:value");
                    (
                        k.trim_matches('"').to_string(),
                        v.trim_matches('"').to_string(),
                    )
                })
                .collect()
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn keys_json_and_older_than() {
    let s = Server::start(&[]);
    let c = lib_client(&s, "svc-a");
    let g1 = c.lock("deploy/prod").unwrap();
    let g2 = c.lock(b"bin\xff\x00ary").unwrap();
    let o = ringlock_args(&s, &["keys", "--json"]);
    assert_eq!(code(&o), 0);
    let rows = json_rows(&stdout(&o));
    assert_eq!(rows.len(), 2, "{}", stdout(&o));
    let by_hex = |h: &str| {
        rows.iter()
            .find(|r| r["key_hex"] == h)
            .expect("row by key_hex")
    };
    let prod = by_hex(&hex(b"deploy/prod"));
    assert_eq!(prod["key"], "deploy/prod");
    assert_eq!(prod["source"], "svc-a");
    assert_eq!(prod["source_hex"], hex(b"svc-a"));
    assert_eq!(prod["endpoint"], g1.endpoint().unwrap().to_string());
    let acquired: i64 = prod["acquired_unix_s"].parse().unwrap();
    let listed = common::keys(s.admin_addr);
    assert!(listed.iter().any(|k| k.acquired_unix_secs == acquired));
    let bin = by_hex(&hex(b"bin\xff\x00ary"));
    assert_eq!(bin["key"], "null", "not UTF-8: only the hex field");

    // Nothing is a minute old yet; everything is at least 0 s old.
    let o = ringlock_args(&s, &["keys", "--older-than", "1m"]);
    assert_eq!(code(&o), 0);
    assert_eq!(stdout(&o).lines().count(), 1, "header only: {}", stdout(&o));
    let o = ringlock_args(&s, &["keys", "--json", "--older-than", "1m"]);
    assert_eq!(stdout(&o), "[]\n");
    let o = ringlock_args(&s, &["keys", "--older-than", "0s"]);
    assert_eq!(stdout(&o).lines().count(), 3, "{}", stdout(&o));
    drop((g1, g2));
}

/// Keys restored from the log keep their acquisition time, so
/// `--older-than` can be checked without waiting: a key granted, the server
/// killed and restarted later still shows its first grant's age.
#[test]
fn older_than_lists_only_old_keys() {
    let dir = common::TempDir::new("cli-older");
    let wal = dir.path("locks.wal");
    let wal_arg = wal.to_str().expect("utf-8 temp path").to_string();
    let mut s = Server::start(&["--data-path", &wal_arg]);
    let g = lib_client(&s, "old").lock("old/key").unwrap();
    let acquired = common::keys(s.admin_addr)[0].acquired_unix_secs;
    std::mem::forget(g); // the holder "crashes": its key stays held
    s.kill9();
    drop(s);
    // Wait (bounded) until the clock is 3 s past the grant: no fixed sleep,
    // a condition on the clock the server uses.
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let mut polls = 0;
    while now() < acquired + 3 {
        polls += 1;
        assert!(polls < 10_000, "clock does not advance");
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = Server::start(&["--data-path", &wal_arg]);
    let _fresh = lib_client(&s, "new").lock("new/key").unwrap();
    let o = ringlock_args(&s, &["keys", "--older-than", "3s"]);
    assert_eq!(code(&o), 0);
    let out = stdout(&o);
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 1, "{out}");
    assert!(rows[0].starts_with("old/key "), "{out}");
}

#[test]
fn non_utf8_keys_can_be_given_raw_escaped_or_hex() {
    let s = Server::start(&[]);
    let key: &[u8] = b"k\xff\x01 x";
    // Raw bytes straight from argv.
    let mut c = ringlock(&s);
    c.args(["lock", "--timeout", "5s"])
        .arg(OsStr::from_bytes(key))
        .args(["--", "true"]);
    assert_eq!(code(&run(c)), 0);
    let g = lib_client(&s, "x").lock(key).unwrap();
    // The table shows the escaped form, which --key-format escaped reads back.
    let o = ringlock_args(&s, &["keys"]);
    let out = stdout(&o);
    let cell = out
        .lines()
        .nth(1)
        .expect("one row")
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert_eq!(cell, "k\\xff\\x01\\x20x", "{out}");
    std::mem::forget(g);
    let o = ringlock_args(&s, &["--key-format", "escaped", "unlock", &cell]);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stderr, b"", "it was held: no note");
    assert!(held_keys(&s).is_empty());
    // Hex, as `keys --json` prints it.
    let _g = lib_client(&s, "x").lock(key).unwrap();
    let o = ringlock_args(&s, &["--key-format", "hex", "reset", &hex(key)]);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(held_keys(&s).is_empty());
}

/// A hostile key cannot drive the terminal or forge a row: the table has no
/// control byte and exactly one row, and `--json` still has the exact bytes.
#[test]
fn hostile_keys_are_escaped_in_the_table() {
    let s = Server::start(&[]);
    let key: &[u8] = b"ok/\x1b[31mRED\x1b[0m\nFAKE-KEY  fake-src  10.9.9.9:1  0s";
    let source: &[u8] = b"src\r\x1b]0;title\x07\n";
    let c = Client::builder(s.lock_addr)
        .admin_addr(s.admin_addr)
        .source(source)
        .build()
        .unwrap();
    let _g = c.lock(key).unwrap();
    for args in [&["keys"][..], &["keys", "-d"]] {
        let o = ringlock_args(&s, args);
        assert_eq!(code(&o), 0);
        let bad: Vec<u8> = o
            .stdout
            .iter()
            .copied()
            .filter(|&b| (b < 0x20 && b != b'\n') || b == 0x7f)
            .collect();
        assert!(
            bad.is_empty(),
            "control bytes {bad:?} in {:?}",
            String::from_utf8_lossy(&o.stdout)
        );
        let out = stdout(&o);
        assert_eq!(out.lines().count(), 2, "header and exactly one row:\n{out}");
        let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row.len(), args.len() + 7, "one cell per column: {row:?}");
        assert!(!out.contains("\nFAKE-KEY"), "{out}");
    }
    let o = ringlock_args(&s, &["keys", "--json"]);
    let out = stdout(&o);
    assert!(!out.bytes().any(|b| b < 0x20 && b != b'\n'), "{out:?}");
    let rows = json_rows(&out);
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["key"], "null", "control characters: hex only");
    assert_eq!(rows[0]["key_hex"], hex(key));
    assert_eq!(rows[0]["source_hex"], hex(source));
    // try-lock on it: the message is one escaped line too.
    let mut c = ringlock(&s);
    c.arg("try-lock")
        .arg(OsStr::from_bytes(key))
        .args(["--", "true"]);
    let o = run(c);
    assert_eq!(code(&o), 75);
    let line = stderr_line(&o);
    assert!(!line.trim_end().bytes().any(|b| b < 0x20), "{line:?}");
}

/// A listing cut short is not passed off as whole: the JSON printed so far
/// stays, unclosed, and `keys` exits 74 saying how many keys it printed.
/// (`ringlock keys` prints as it reads: its output is blocked on the pipe
/// while the admin connection is cut behind it.)
#[test]
fn a_keys_listing_cut_short_leaves_the_json_open_and_exits_74() {
    use common::fault_proxy::FaultProxy;
    use std::io::Read;
    const N: usize = 20_000;
    let s = Server::start(&[]);
    // 100-byte keys, TryLocks pipelined 4 deep (512 bytes a connection).
    let mut c = s.connect();
    let key = |i: usize| format!("{i:09}-{}", "x".repeat(90));
    for first in (0..N).step_by(4) {
        let last = (first + 4).min(N);
        let mut buf = Vec::new();
        for i in first..last {
            buf.extend_from_slice(&common::frame(5, key(i).as_bytes(), Some(b"many")));
        }
        c.send(&buf);
        for _ in first..last {
            assert_eq!(c.read_byte(), b'+');
        }
    }
    let proxy = FaultProxy::start(s.admin_addr);
    let mut child = cli(s.lock_addr, proxy.addr())
        .args(["keys", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ringlock");
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut first = String::new();
    out.read_line(&mut first).expect("the first line");
    assert_eq!(first, "[\n", "printing began");
    // It prints far more than a pipe holds: it is blocked, mid-listing.
    proxy.reset_all();
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("the rest");
    let status = child.wait().expect("wait");
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut err)
        .expect("stderr");
    assert_eq!(status.code(), Some(74), "{err}");
    let objects = rest.lines().filter(|l| l.starts_with('{')).count();
    assert!(objects > 0 && objects < N, "{objects} of {N} printed");
    assert!(rest.ends_with("},\n") || rest.ends_with('}'), "left open");
    assert!(!rest.contains(']'), "never closed");
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(
        err.starts_with(&format!(
            "ringlock: keys (admin port): the listing stopped after {objects} keys: "
        )),
        "{err:?}"
    );
    assert!(err.contains("closed mid-answer"), "{err:?}");
    assert_eq!(proxy.connections_accepted(), 1, "not retried");
}
