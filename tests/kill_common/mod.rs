//! The A/B round of "kill -9 of `ringlock lock` never lets a second holder
//! in while the first command runs", shared by tests/cli_kill.rs (ringlockd)
//! and tests/cli_mysql.rs (MySQL).
//!
//! One round: A (`ringlock lock KEY -- sh -c …`) starts a shell that starts
//! a child (`sleep`, the shell's own command: a grandchild of ringlock) and
//! records both pids; once they are recorded, A's ringlock gets SIGKILL. B
//! then locks the same key; B's command records its start and, at that
//! moment, whether either of A's processes still runs (a zombie or a
//! missing pid is dead). The round fails if one still ran, or if A's
//! command got as far as its end marker after B started.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A's command: a child that would run for minutes, both pids recorded,
/// then an end marker that only a surviving shell writes.
const A_SCRIPT: &str = r#"sleep 300 & echo "A $$ $!" >> "$LOG"; wait; echo "A end" >> "$LOG""#;

/// B's command: the start marker, then one line per process of A that is
/// still running (state neither Z nor X, in /proc/PID/stat's third field;
/// the comm of `sh` and `sleep` has no spaces).
const B_SCRIPT: &str = r#"echo "B start" >> "$LOG"
for p in $A_PIDS; do
  s=$(awk '{print $3}' /proc/$p/stat 2>/dev/null)
  case "$s" in ""|Z|X) ;; *) echo "A alive $p $s" >> "$LOG" ;; esac
done
echo "B end" >> "$LOG""#;

/// A process's state letter from /proc, `None` once it is gone.
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// The process runs (not gone, not a zombie, not being killed).
pub fn running(pid: i32) -> bool {
    state(pid).is_some_and(|s| s != 'Z' && s != 'X') && !dying(pid)
}

/// A process that is being killed: SIGKILL pending, or already in exit
/// (PF_EXITING in /proc's flags). Its user code never runs again, but its
/// descriptors close during its exit, before it becomes a zombie: so the
/// server may free its lock an instant before /proc shows it dead.
fn dying(pid: i32) -> bool {
    const PF_EXITING: u64 = 0x4;
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    let exiting = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|st| {
            let rest = st.rsplit_once(") ")?.1.to_string();
            rest.split_whitespace().nth(6)?.parse::<u64>().ok()
        })
        .is_some_and(|flags| flags & PF_EXITING != 0);
    let killed = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
        .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
        .any(|m| m & SIGKILL_BIT != 0);
    exiting || killed
}

/// Waits for `child` (bounded only to turn a hang into a failure).
pub fn wait_bounded(mut child: Child, what: &str) -> std::process::ExitStatus {
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait().expect("wait"));
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} (pid {pid}) never exited"))
}

/// `rounds` A/B rounds on `key`; `ringlock()` is a `ringlock --addr …`
/// command, `a_flags` extra `lock` flags for A.
pub fn kill9_rounds(
    ringlock: impl Fn() -> Command,
    key: &str,
    a_flags: &[&str],
    rounds: usize,
    dir: &Path,
) {
    for round in 0..rounds {
        let log = dir.join(format!("round-{round}"));
        let mut a = ringlock();
        a.arg("lock")
            .args(a_flags)
            .args([key, "--", "sh", "-c", A_SCRIPT])
            .env("LOG", &log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let a = a.spawn().expect("spawn A");
        // Wait (bounded) until A's command runs and has named its processes.
        let started = Instant::now();
        let pids: Vec<i32> = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.starts_with("A ")) {
                break line
                    .split_whitespace()
                    .skip(1)
                    .map(|p| p.parse().expect("a pid"))
                    .collect();
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "round {round}: A's command never started"
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        assert_eq!(pids.len(), 2, "round {round}: {pids:?}");
        // SAFETY: plain kill(2) of our own unreaped child.
        assert_eq!(unsafe { libc::kill(a.id() as i32, libc::SIGKILL) }, 0);
        wait_bounded(a, "A's ringlock");

        let mut b = ringlock();
        b.args(["lock", "--timeout", "30s", key, "--", "sh", "-c", B_SCRIPT])
            .env("LOG", &log)
            .env(
                "A_PIDS",
                pids.iter()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(" "),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let b = b.spawn().expect("spawn B");
        let status = wait_bounded(b, "B's ringlock");
        let text = std::fs::read_to_string(&log).expect("the round's log");
        // Whatever the verdict, nothing of A's may outlive the round.
        for &p in &pids {
            if running(p) {
                // SAFETY: signals a pid this round recorded and saw running
                // just now (a reused pid would be hit only in a failing run).
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
        assert!(
            status.success(),
            "round {round}: B exited {status:?}\n{text}"
        );
        let lines: Vec<&str> = text.lines().collect();
        let b_start = lines
            .iter()
            .position(|l| *l == "B start")
            .unwrap_or_else(|| panic!("round {round}: B never started\n{text}"));
        assert!(
            !lines.iter().any(|l| l.starts_with("A alive")),
            "round {round}: B's command started while A's still ran:\n{text}"
        );
        assert!(
            !lines[b_start..].contains(&"A end"),
            "round {round}: A's command went on after B started:\n{text}"
        );
        assert_eq!(lines.last(), Some(&"B end"), "round {round}:\n{text}");
    }
}
