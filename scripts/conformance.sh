#!/usr/bin/env bash
# The client conformance suite: every client of the repository runs the
# same scenarios (grant, fifo, try, timeout, cancel_race, lease_expiry_lost,
# session_end_on_close, keepalive_loss, stale_token_release, auth_refused,
# server_restart_durable, shards, and the lock-mode scenarios modes_fifo,
# modes_semaphore, the watch scenarios watch_order, watch_rewatch, and the
# election scenarios election_order, election_handover;
# docs/conformance.md) against the real
# ringlockd, on 1 and 2 shards. The Rust client's run is tests/conformance.rs
# (cargo test); this script runs the others: clients/<lang>/conformance.sh.
# Exits non-zero if any client fails any scenario, or prints no line for one.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# Both binaries: the clients' TLS tests make certificates with `ringlock cert`.
cargo build --locked -q --bins
export RINGLOCKD="$ROOT/target/debug/ringlockd"
SCENARIOS="grant fifo try timeout cancel_race lease_expiry_lost session_end_on_close keepalive_loss stale_token_release auth_refused server_restart_durable shards modes_fifo modes_semaphore watch_order watch_rewatch election_order election_handover"
runners=(clients/*/conformance.sh)
[ -e "${runners[0]}" ] || { echo "conformance: no client runner under clients/" >&2; exit 1; }
passed=0
failed=0
for runner in "${runners[@]}"; do
    lang=$(basename "$(dirname "$runner")")
    for n in 1 2; do
        echo "== conformance: $lang client, $n shard(s)"
        out=$(mktemp)
        if RINGLOCK_TEST_THREADS=$n timeout 600 "$runner" 2>&1 | tee "$out"; then
            for s in $SCENARIOS; do
                if grep -q "^conformance $lang $s ok\$" "$out"; then
                    passed=$((passed + 1))
                else
                    echo "conformance: $lang printed no 'ok' line for $s ($n shards)" >&2
                    failed=$((failed + 1))
                fi
            done
        else
            echo "conformance: $lang failed on $n shard(s)" >&2
            failed=$((failed + 1))
        fi
        rm -f "$out"
    done
done
echo "conformance: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
