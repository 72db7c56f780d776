//! Runs `examples/fence.rs` against the real server binary: a holder
//! stopped (SIGSTOP) past its lease writes after its successor, and the
//! fence refuses the stale write. Without the fence the same story
//! corrupts the store, which shows the test sees the failure it guards
//! against.
//!
//! `harness = false`: the example starts holder A as a child process by
//! re-running its own executable, which here is this test binary, so
//! `main` dispatches that call to the example's holder.

#[allow(dead_code)] // the example's own `main` and argument parsing
#[path = "../examples/fence.rs"]
mod example;

mod common;

use example::{Options, HOLDER_ARG};

/// Lease TTL of holder A: its extend thread renews it every third of
/// this, so only a stall of the whole machine longer than that could end
/// it before the test stops A on purpose.
const TTL_MS: u32 = 1_000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(HOLDER_ARG) {
        std::process::exit(example::holder_main(&args[1..]));
    }
    let server = common::Server::start(&[]);
    let addr = server.lock_addr.to_string();

    let mut log = Vec::new();
    let fenced = example::run(
        &Options {
            addr: addr.clone(),
            ttl_ms: TTL_MS,
            fence: true,
        },
        &mut |l| log.push(l),
    )
    .unwrap_or_else(|e| panic!("the fenced run failed: {e}\n{}", log.join("\n")));
    let story = log.join("\n");
    assert!(
        fenced.token_b > fenced.token_a,
        "the successor's token must be larger\n{story}"
    );
    let stale = fenced
        .stale_write
        .expect_err(&format!("the stale write was accepted\n{story}"));
    assert_eq!(
        (stale.seen, stale.got),
        (fenced.token_b, fenced.token_a),
        "refused because the successor's token was seen\n{story}"
    );
    assert_eq!(
        fenced.store,
        vec![
            format!("A: write with token {}", fenced.token_a),
            format!("B: write with token {}", fenced.token_b),
        ],
        "B's write is the last one\n{story}"
    );
    assert!(story.contains("SIGSTOP"), "{story}");
    println!("fenced run:\n{story}");

    // The same story without the fence: A's stale write lands last.
    let mut log = Vec::new();
    let unfenced = example::run(
        &Options {
            addr,
            ttl_ms: TTL_MS,
            fence: false,
        },
        &mut |l| log.push(l),
    )
    .unwrap_or_else(|e| panic!("the unfenced run failed: {e}\n{}", log.join("\n")));
    assert!(unfenced.stale_write.is_ok());
    assert_eq!(
        unfenced.store.last(),
        Some(&format!(
            "A: write with token {}, after the pause",
            unfenced.token_a
        )),
        "without a fence the paused holder overwrites its successor\n{}",
        log.join("\n")
    );
    println!("test fence_example ... ok (2 runs)");
}
