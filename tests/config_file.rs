//! One configuration story for `ringlockd`: flags, `RINGLOCK_*` variables
//! and a `--config` TOML file, in that order of precedence over the
//! defaults; durations with their unit everywhere; the deprecated
//! spellings still read, with a warning. The real binary, real files:
//! `--check-config` prints the effective settings (a config file itself),
//! and a server started from a file serves on loopback.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{Server, TempDir};

/// `ringlockd` with no setting from the test's own environment: every
/// `RINGLOCK_` variable but the suite's `RINGLOCK_TEST_*`, and the
/// deprecated `BIND_ADDRESS` and `DATA_PATH`, removed.
fn ringlockd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringlockd"));
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("RINGLOCK_") && !k.starts_with("RINGLOCK_TEST_") {
            c.env_remove(&*k);
        }
    }
    c.env_remove("BIND_ADDRESS").env_remove("DATA_PATH");
    c
}

fn write(dir: &TempDir, name: &str, text: &str) -> String {
    let p = dir.path(name);
    std::fs::write(&p, text).expect("write the config file");
    p.to_str().expect("utf-8 temp path").to_string()
}

fn run(c: &mut Command) -> Output {
    c.output().expect("run ringlockd")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The value of `key = value` in `--check-config`'s listing.
fn setting(listing: &str, key: &str) -> String {
    let prefix = format!("{key} = ");
    listing
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {key} in:\n{listing}"))
        .to_string()
}

/// `ringlockd ARGS --check-config`, which must pass: its listing.
fn effective(c: &mut Command) -> String {
    let o = run(c.arg("--check-config"));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    stdout(&o)
}

/// `ringlockd ARGS`, which must be refused as a usage error with exactly
/// one line: that line.
fn refused(c: &mut Command) -> String {
    let o = run(c.arg("--check-config"));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err.trim_end().to_string()
}

#[test]
fn flags_beat_variables_which_beat_the_file_which_beats_the_defaults() {
    let dir = TempDir::new("cfg-precedence");
    let path = write(
        &dir,
        "ringlockd.toml",
        "# every layer gives some of these\n\
         max-keys = 500\n\
         idle-timeout = \"2m\"\n\
         keepalive = \"3s\"\n\
         max-waiters = 7\n\
         lc-admin-actions = \"loopback\"\n\
         join = false\n",
    );
    let listing = effective(
        ringlockd()
            .args(["--config", &path, "--max-keys", "700"])
            .env("RINGLOCK_MAX_KEYS", "600")
            .env("RINGLOCK_IDLE_TIMEOUT", "5m")
            .env("RINGLOCK_LC_ADMIN_ACTIONS", ""),
    );
    assert_eq!(setting(&listing, "max-keys"), "700", "the flag");
    assert_eq!(setting(&listing, "idle-timeout"), "\"5m\"", "the variable");
    assert_eq!(setting(&listing, "keepalive"), "\"3s\"", "the file");
    assert_eq!(setting(&listing, "max-waiters"), "7", "the file");
    assert_eq!(
        setting(&listing, "lc-admin-actions"),
        "\"loopback\"",
        "an empty variable is unset: the file"
    );
    assert_eq!(setting(&listing, "max-connections"), "10000", "the default");

    // RINGLOCK_CONFIG names the file; a deprecated millisecond flag is a
    // flag, above the file too.
    let listing = effective(
        ringlockd()
            .env("RINGLOCK_CONFIG", &path)
            .args(["--keepalive-ms", "2500"]),
    );
    assert_eq!(setting(&listing, "max-keys"), "500");
    assert_eq!(setting(&listing, "keepalive"), "\"2500ms\"");
}

#[test]
fn the_effective_settings_are_a_config_file_that_reads_back_the_same() {
    let dir = TempDir::new("cfg-roundtrip");
    let token = write(&dir, "token", "s3cret\n");
    let first = effective(ringlockd().args([
        "--bind",
        "127.0.0.1:4000",
        "--metrics-bind",
        "127.0.0.1:4002",
        "--data-path",
        dir.path("a \"quoted\" log.wal").to_str().unwrap(),
        "--auth-token-file",
        &token,
        "--keepalive",
        "1.5s",
        "--idle-poll",
        "100us",
        "--max-ttl",
        "1h",
        "--threads",
        "3",
        "--log-level",
        "warn",
    ]));
    assert_eq!(setting(&first, "keepalive"), "\"1500ms\"");
    assert_eq!(setting(&first, "max-ttl"), "\"1h\"");
    assert!(!first.contains("s3cret"), "the token itself is not printed");
    let path = write(&dir, "effective.toml", &first);
    let again = effective(ringlockd().args(["--config", &path]));
    assert_eq!(again, first);
}

#[test]
fn an_unknown_key_is_refused_with_its_line_and_nothing_starts() {
    let dir = TempDir::new("cfg-unknown");
    let wal = dir.path("locks.wal");
    let path = write(
        &dir,
        "ringlockd.toml",
        &format!(
            "# a comment\ndata-path = {:?}\n\nkeepalvie = \"10s\"\n",
            wal.to_str().unwrap()
        ),
    );
    assert_eq!(
        refused(ringlockd().args(["--config", &path])),
        format!(
            "ringlockd: {path}:4: unknown key \"keepalvie\" (did you mean keepalive?) (see --help)"
        )
    );
    // Without --check-config too: refused before anything is opened.
    let o = run(ringlockd().args(["--config", &path, "--bind", "127.0.0.1:0"]));
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(!wal.exists(), "a refused start made the log");

    for (text, want) in [
        (
            "max_keys = 5\n",
            "unknown key \"max_keys\": keys are spelled as the flags, max-keys",
        ),
        (
            "keepalive-ms = 5\n",
            "keepalive-ms is not a config key: write keepalive = \"10s\" (a duration with its unit)",
        ),
        (
            "force-new-cluster = true\n",
            "force-new-cluster is not a config key: one-time disaster recovery: \
             give --force-new-cluster on the command line, once",
        ),
        (
            "[server]\nbind = \":1\"\n",
            "[server] or server.KEY: the file has no sections, write each key at the top",
        ),
    ] {
        let path = write(&dir, "bad.toml", &format!("log-level = \"info\"\n{text}"));
        assert_eq!(
            refused(ringlockd().args(["--config", &path])),
            format!("ringlockd: {path}:2: {want} (see --help)"),
            "{text}"
        );
    }
}

#[test]
fn wrong_types_and_bad_durations_are_refused_precisely() {
    let dir = TempDir::new("cfg-types");
    let no_unit = "\"10\" has no unit: write 10s or 10ms (units: us, ms, s, m, h)";
    for (line, want) in [
        (
            "keepalive = 10",
            "keepalive: expected a string with a unit, such as \"10s\", not an integer".to_string(),
        ),
        ("keepalive = \"10\"", format!("keepalive: {no_unit}")),
        (
            "idle-timeout = \"5 s\"",
            "idle-timeout: bad duration \"5 s\" (examples: 250ms, 10s, 1.5m, 2h)".into(),
        ),
        (
            "frame-timeout = \"0.5ms\"",
            "frame-timeout: 0.5ms is not a whole number of milliseconds".into(),
        ),
        (
            "liveness-timeout = \"999ms\"",
            "liveness-timeout: at least 1s, not 999ms".into(),
        ),
        (
            "max-keys = \"5\"",
            "max-keys: expected an integer, not a string".into(),
        ),
        ("max-keys = 0", "max-keys: must be at least 1".into()),
        (
            "max-keys = 1.5",
            "max-keys: expected an integer, not a float".into(),
        ),
        (
            "join = 1",
            "join: expected true or false, not an integer".into(),
        ),
        (
            "bind = 22119",
            "bind: expected a string, not an integer".into(),
        ),
        (
            "peers = [\"1=a:1\"]",
            "peers: expected a string, not an array".into(),
        ),
        (
            "lc-admin-actions = \"all\"",
            "lc-admin-actions: expected any, loopback or off, got \"all\"".into(),
        ),
    ] {
        let path = write(&dir, "t.toml", &format!("# line 1\n{line}\n"));
        assert_eq!(
            refused(ringlockd().args(["--config", &path])),
            format!("ringlockd: {path}:2: {want} (see --help)"),
            "{line}"
        );
    }
    // Not TOML at all: the parser's message, on one line, with the line.
    let path = write(&dir, "t.toml", "bind = \":1\"\nkeepalive = 10s\n");
    let err = refused(ringlockd().args(["--config", &path]));
    assert!(err.starts_with(&format!("ringlockd: {path}:2: ")), "{err}");

    // The same parser for flags and variables, named as given.
    assert_eq!(
        refused(ringlockd().args(["--keepalive", "10"])),
        format!("ringlockd: --keepalive: {no_unit} (see --help)")
    );
    assert_eq!(
        refused(ringlockd().env("RINGLOCK_KEEPALIVE", "10")),
        format!("ringlockd: RINGLOCK_KEEPALIVE: {no_unit} (see --help)")
    );
    assert_eq!(
        refused(ringlockd().args(["--min-keepalive", "1s", "--max-keepalive", "500ms"])),
        "ringlockd: --min-keepalive 1s is above --max-keepalive 500ms (see --help)"
    );
    assert_eq!(
        refused(ringlockd().env("RINGLOCK_JOIN", "maybe")),
        "ringlockd: RINGLOCK_JOIN: expected true or false (or 1/0, yes/no, on/off), got \"maybe\" (see --help)"
    );
    // 0 needs no unit, and is "never" / "no retry" where the flag says so.
    let listing = effective(ringlockd().args(["--idle-timeout", "0", "--bind-retry", "0"]));
    assert_eq!(setting(&listing, "idle-timeout"), "\"0s\"");
    assert_eq!(setting(&listing, "bind-retry"), "\"0s\"");
}

#[test]
fn deprecated_spellings_still_work_and_warn() {
    let dir = TempDir::new("cfg-deprecated");
    let wal = dir.path("old.wal");
    let o = run(ringlockd()
        .args(["--keepalive-ms", "2500", "--idle-poll-us", "100"])
        .args(["--max-ttl-ms", "86400000", "--check-config"])
        .env("BIND_ADDRESS", ":4321")
        .env("DATA_PATH", &wal));
    let (out, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(setting(&out, "keepalive"), "\"2500ms\"");
    assert_eq!(setting(&out, "idle-poll"), "\"100us\"");
    assert_eq!(setting(&out, "max-ttl"), "\"24h\"");
    assert_eq!(setting(&out, "bind"), "\"0.0.0.0:4321\"");
    assert_eq!(
        setting(&out, "data-path"),
        format!("{:?}", wal.to_str().unwrap())
    );
    for want in [
        "level=warn event=deprecated_flag flag=--keepalive-ms replacement=\"--keepalive 2500ms\"",
        "level=warn event=deprecated_flag flag=--idle-poll-us replacement=\"--idle-poll 100us\"",
        "level=warn event=deprecated_flag flag=--max-ttl-ms replacement=\"--max-ttl 24h\"",
        "level=warn event=deprecated_env var=BIND_ADDRESS replacement=RINGLOCK_BIND used=true",
        "level=warn event=deprecated_env var=DATA_PATH replacement=RINGLOCK_DATA_PATH used=true",
    ] {
        assert_eq!(
            err.lines().filter(|l| l.contains(want)).count(),
            1,
            "one {want:?} in:\n{err}"
        );
    }
    assert!(!wal.exists(), "--check-config opened the log");

    // The new variable wins over the old one, which is still warned about.
    let o = run(ringlockd()
        .arg("--check-config")
        .env("BIND_ADDRESS", ":4321")
        .env("RINGLOCK_BIND", "127.0.0.1:4444"));
    assert_eq!(setting(&stdout(&o), "bind"), "\"127.0.0.1:4444\"");
    assert!(
        stderr(&o)
            .contains("event=deprecated_env var=BIND_ADDRESS replacement=RINGLOCK_BIND used=false"),
        "{}",
        stderr(&o)
    );
    // No warning without a deprecated spelling.
    let o = run(ringlockd().args(["--keepalive", "2500ms", "--check-config"]));
    assert!(!stderr(&o).contains("deprecated"), "{}", stderr(&o));
    // Both spellings of one setting on the command line: which one?
    assert_eq!(
        refused(ringlockd().args(["--keepalive-ms", "2500", "--keepalive", "3s"])),
        "ringlockd: --keepalive-ms and --keepalive both given: keep --keepalive \
         (--keepalive-ms is deprecated) (see --help)"
    );
    // The old flags keep their old checks and messages.
    assert_eq!(
        refused(ringlockd().args(["--liveness-timeout-ms", "999"])),
        "ringlockd: --liveness-timeout-ms: must be at least 1000 (see --help)"
    );
}

/// A started server: the file's settings apply (max-keys 1: a second key
/// is refused), and the log is the file's data-path.
#[test]
fn a_server_started_from_a_config_file_serves() {
    let dir = TempDir::new("cfg-serve");
    let wal = dir.path("locks.wal");
    let path = write(
        &dir,
        "ringlockd.toml",
        &format!(
            "bind = \"127.0.0.1:0\"\n\
             admin-bind = \"127.0.0.1:0\"\n\
             data-path = {}\n\
             max-keys = 1\n\
             keepalive = \"2s\"\n\
             idle-poll = \"0\"\n",
            toml_string(&wal)
        ),
    );
    let mut cmd = ringlockd();
    cmd.args(["--config", &path]);
    let srv = Server::spawn(cmd, &[]).expect("ringlockd starts from its config file");
    let mut c = srv.connect();
    assert_eq!(c.lock(b"first", b"cfg"), b'+');
    assert_eq!(
        c.lock(b"second", b"cfg"),
        b'-',
        "max-keys = 1 from the file"
    );
    assert!(wal.exists(), "the file's data-path is the log");
    drop(c);
    drop(srv);

    // The same file with flags over it (a new log: the first one holds
    // "first" again after its restart).
    let other = dir.path("other.wal");
    let mut cmd = ringlockd();
    cmd.args(["--config", &path, "--max-keys", "2", "--data-path"])
        .arg(&other);
    let srv = Server::spawn(cmd, &[]).expect("ringlockd starts");
    let mut c = srv.connect();
    assert_eq!(c.lock(b"third", b"cfg"), b'+');
    assert_eq!(
        c.lock(b"fourth", b"cfg"),
        b'+',
        "--max-keys 2 over the file"
    );
    assert!(other.exists(), "--data-path over the file's");
}

fn toml_string(p: &Path) -> String {
    format!("{:?}", p.to_str().expect("utf-8 temp path"))
}
