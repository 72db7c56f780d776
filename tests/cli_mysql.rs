//! The `ringlock` CLI over MySQL/MariaDB (`--addr mysql://…`): two commands
//! are serialized exactly as over ringlockd, try-lock on a held name exits
//! 75 without running its command, and the lock is gone afterwards (checked
//! from another session with IS_FREE_LOCK). Against a private mariadbd.

mod mysql_common;

use mysql_common::MariaDb;
use std::process::{Command, Stdio};

fn ringlock(url: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringlock"));
    c.args(["--addr", url])
        .env_remove("RINGLOCK_ADDR")
        .stdin(Stdio::null());
    c
}

#[test]
fn cli_serializes_two_commands_over_mysql() {
    let db = MariaDb::shared();
    let dir = std::env::temp_dir().join(format!("ringlock-cli-mysql-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let log = dir.join("log");
    let children: Vec<_> = (0..3)
        .map(|i| {
            let script = format!(
                "echo start{i} >> {log}; sleep 0.05; echo end{i} >> {log}",
                log = log.display()
            );
            ringlock(&db.url())
                .args(["lock", "cli/serial", "--", "sh", "-c", &script])
                .spawn()
                .expect("spawn ringlock")
        })
        .collect();
    for mut c in children {
        assert!(c.wait().expect("wait").success());
    }
    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    for pair in lines.chunks(2) {
        let who = pair[0].strip_prefix("start").expect("a start line");
        assert_eq!(pair[1], format!("end{who}"), "interleaved:\n{text}");
    }
    assert!(db.is_free("cli/serial"), "the lock outlived the command");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_try_lock_over_mysql_exits_75_when_held_and_passes_the_exit_code() {
    let db = MariaDb::shared();
    let holder = mysql_common::Holder::take(db, "cli/held");
    let out = ringlock(&db.url())
        .args(["try-lock", "cli/held", "--", "sh", "-c", "echo ran"])
        .output()
        .expect("run ringlock");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(out.stdout.is_empty(), "the command ran: {out:?}");
    drop(holder);
    let out = ringlock(&db.url())
        .args(["lock", "cli/free", "--", "sh", "-c", "exit 3"])
        .output()
        .expect("run ringlock");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(db.is_free("cli/free"));
    // Commands that need the lock server's table are usage errors here.
    let out = ringlock(&db.url())
        .args(["keys"])
        .output()
        .expect("run ringlock");
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}
