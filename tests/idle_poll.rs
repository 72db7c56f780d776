//! `--idle-poll-us`: an idle event loop polls its ring for a while before it
//! sleeps. Requests are served the same with it on or off, an idle server
//! still goes to sleep (it does not poll for ever), shards that would
//! share a CPU do not poll, and the flag is validated.

mod common;

use common::{once, Server};

/// CPU time (user + system) the process has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // Fields after the command name (which may hold spaces) start at ')'.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line (1-based),
    // so 11 and 12 after the name.
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

fn ticks_per_second() -> u64 {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .expect("run getconf CLK_TCK");
    let t: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("getconf CLK_TCK prints a number");
    assert!(t > 0, "getconf CLK_TCK");
    t
}

#[test]
fn requests_are_served_alike_with_idle_polling_on_and_off() {
    for poll in ["0", "50", "10000"] {
        let srv = Server::start(&["--idle-poll-us", poll]);
        let mut a = srv.connect();
        let mut b = srv.connect();
        for i in 0..200 {
            let key = format!("k{}", i % 7);
            assert_eq!(a.lock(key.as_bytes(), b"a"), b'+', "poll {poll}");
            // Held by a: b's TryLock is refused; after the unlock it is not.
            assert_eq!(b.try_lock(key.as_bytes(), b"b"), b'#', "poll {poll}");
            assert_eq!(a.unlock(key.as_bytes()), b'+', "poll {poll}");
        }
        // One-shot connections too (the server closes after the answer).
        for i in 0..50 {
            let f = common::frame(5, format!("one-{i}").as_bytes(), Some(b"c"));
            assert_eq!(once(srv.lock_addr, &f), b'+', "poll {poll}");
        }
    }
}

#[test]
fn an_idle_server_stops_polling_and_sleeps() {
    // The longest poll the flag allows, after traffic: if the loop kept
    // polling, the server would use a whole CPU while nobody talks to it.
    let srv = Server::start(&["--idle-poll-us", "10000"]);
    let mut c = srv.connect();
    for i in 0..100 {
        assert_eq!(c.lock(format!("k{i}").as_bytes(), b"s"), b'+');
    }
    drop(c);
    let pid = srv.pid();
    let before = cpu_ticks(pid);
    // An interval to measure over, not a synchronisation: nothing is
    // awaited. Two seconds are four heartbeats, each followed by at most
    // one 10 ms poll (40 ms) per shard.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    let tps = ticks_per_second();
    assert!(
        used * 4 < tps * 2,
        "an idle server used {used} ticks ({tps}/s) of CPU in 2 s: it keeps polling"
    );
}

#[test]
fn shards_sharing_a_cpu_do_not_poll() {
    // Three shards on the CPUs this test may use, one of them at most:
    // pinned to CPU 0, they share it.
    let mut cmd = std::process::Command::new("taskset");
    cmd.args(["-c", "0", env!("CARGO_BIN_EXE_ringlockd")]);
    let srv = Server::spawn(cmd, &["--threads", "3", "--idle-poll-us", "100"])
        .expect("start ringlockd under taskset");
    let line = srv.wait_log("event=idle_poll_off");
    assert!(line.contains("shards=3"), "{line}");
    assert_eq!(
        once(srv.lock_addr, &common::frame(5, b"k", Some(b"s"))),
        b'+'
    );
}

#[test]
fn the_idle_poll_flag_is_validated() {
    for bad in ["10001", "-1", "50us", ""] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringlockd"))
            .args(["--bind", "127.0.0.1:0", "--idle-poll-us", bad])
            .output()
            .expect("run ringlockd");
        assert_eq!(out.status.code(), Some(64), "{bad:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--idle-poll-us"), "{bad:?}: {stderr}");
    }
}
