//! Crash test: clients lock and unlock while the real server is killed
//! with SIGKILL at random moments, 50+ cycles over one log. After every
//! restart each key acknowledged with `+` (and not since unlocked with `+`)
//! is still held, each acknowledged unlock stays unlocked, and no key is
//! ever held by two clients at once (the clients and these checks are
//! tests/crash_common, shared with tests/wal_prealloc_crash.rs).

mod common;
mod crash_common;

use common::*;
use crash_common::*;

const CYCLES: usize = 50;
const CRASH: Crash = Crash {
    threads: 4,
    keys_per_thread: 4,
    prefix: "",
};

fn start(path: &str) -> Server {
    Server::start(&["--data-path", path, "--compact-floor-bytes", "4096"])
}

#[test]
fn acknowledged_state_survives_random_kill_9() {
    let dir = std::env::temp_dir().join(format!("ringlock-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("crash.wal");
    let path_s = path.to_str().unwrap().to_string();
    let _ = std::fs::remove_file(&path);
    let model = CRASH.model();
    let mut seed = 0x1234_5678_9ABC_DEF1u64 ^ std::process::id() as u64;
    let mut total_ops = 0;
    let mut compactions_seen = false;
    for cycle in 0..CYCLES {
        let mut server = start(&path_s);
        CRASH.check_restart(cycle, &server, &model);
        // Let some traffic through, then kill at a random moment.
        let client_seed = xorshift(&mut seed);
        let want_ops = 20 + (xorshift(&mut seed) % 200) as usize;
        total_ops += CRASH.traffic_then_kill9(&mut server, &model, client_seed, want_ops);
        while let Ok(line) = server.log.try_recv() {
            compactions_seen |= line.contains("event=compaction_done");
        }
    }
    // A final restart checks the last cycle too.
    let server = start(&path_s);
    CRASH.check_restart(CYCLES, &server, &model);
    assert!(total_ops >= CYCLES * 20, "too little traffic: {total_ops}");
    assert!(compactions_seen, "the test should cross compactions too");
    let _ = std::fs::remove_dir_all(&dir);
}
