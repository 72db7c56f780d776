#!/usr/bin/env bash
# A/B of ringlockd at two commits, each with the load generator of its own
# commit, runs alternated in one session (old, new, old, new, ...), server
# pinned to CPU 1, load generator to CPU 0. For regression checks where two
# matrices on different days (or machines) cannot be compared.
#
#   scripts/ab.sh OLD_COMMIT [ROUNDS] [LOADGEN ARGS...]
#
# Default load: one hot key, 64 persistent clients, closed loop, 3 s.
# Prints one line per run: commit, cycles/s, lock p99 (µs), the server's
# CPU per lock+unlock cycle (µs, from /proc/PID/stat over the run), and the
# CPU time the host stole from this VM over the run (ms, all CPUs, from
# /proc/stat: a run with much of it measured the host, not the server).
# AB_DURABLE=1 runs both servers durable, each run on a fresh log
# (--data-path in the temp dir). AB_SERVER_ARGS="..." passes the same
# extra arguments to both servers (e.g. "--idle-poll-us 0": with the idle
# poll off, a closed loop's CPU per cycle is the work per cycle, not the
# time spent polling while the load generator is busy).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OLD=${1:?usage: scripts/ab.sh OLD_COMMIT [ROUNDS] [LOADGEN ARGS...]}
ROUNDS=${2:-3}
shift $(( $# >= 2 ? 2 : 1 ))
LOAD=("$@")
[ ${#LOAD[@]} -gt 0 ] || LOAD=(--conn-mode persistent --connections 64 --dist hot --keys 1 --rate 0 --duration 3s --warmup 1s)
WT=$(mktemp -d /tmp/ringlock-ab.XXXXXX)
cleanup() { [ -n "${P:-}" ] && kill "$P" 2>/dev/null || true; git -C "$ROOT" worktree remove --force "$WT/old" >/dev/null 2>&1 || true; rm -rf "$WT"; }
trap cleanup EXIT
# AB_OLD_TARGET=DIR: OLD's release binaries are already built in DIR
# (DIR/release/ringlockd and ringlock-loadgen), so several loads in a row
# build it once.
if [ -n "${AB_OLD_TARGET:-}" ]; then
    mkdir -p "$WT/old"
    ln -s "$AB_OLD_TARGET" "$WT/old/target"
    BUILD=("$ROOT")
else
    git -C "$ROOT" worktree add -q --detach "$WT/old" "$OLD"
    BUILD=("$WT/old" "$ROOT")
fi
for dir in "${BUILD[@]}"; do
    (cd "$dir" && CARGO_TARGET_DIR="$dir/target" cargo build --release -q -p ringlock --bin ringlockd &&
        CARGO_TARGET_DIR="$dir/target" cargo build --release -q -p ringlock-loadgen)
done
NEW=$(git -C "$ROOT" rev-parse --short HEAD)
OLDS=$(git -C "$ROOT" rev-parse --short "$OLD")
run() { # label server loadgen extra-server-args...
    local label=$1 srv=$2 lg=$3; shift 3
    # The previous server's listener may outlive it briefly (its io_uring
    # closes it asynchronously); the old binary does not retry its bind.
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/26119) 2>/dev/null || break; sleep 0.05; done
    sleep 0.2
    RUNS=$((RUNS + 1))
    local durable=()
    [ "${AB_DURABLE:-0}" = 1 ] && durable=(--data-path "$WT/run.$RUNS.wal")
    local extra=()
    [ -n "${AB_SERVER_ARGS:-}" ] && read -r -a extra <<<"$AB_SERVER_ARGS"
    taskset -c 1 "$srv" "$@" "${durable[@]}" "${extra[@]}" --bind 127.0.0.1:26119 --admin-bind 127.0.0.1:26120 2>/dev/null &
    P=$!
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/26119) 2>/dev/null && break; sleep 0.1; done
    # The server's CPU (user + system ticks) over the whole load, warm-up
    # included, per lock+unlock cycle of the whole load (cycles_all).
    local t0 t1 s0 s1
    t0=$(awk '{print $14+$15}' "/proc/$P/stat")
    s0=$(awk '/^cpu /{print $9}' /proc/stat)
    taskset -c 0 "$lg" --target ringlock://127.0.0.1:26119 "${LOAD[@]}" --no-progress --json 2>"$WT/lg.err" | tail -1 >"$WT/lg.json"
    t1=$(awk '{print $14+$15}' "/proc/$P/stat")
    s1=$(awk '/^cpu /{print $9}' /proc/stat)
    python3 -c "
import json
d = json.load(open('$WT/lg.json'))
cpu_us = ($t1 - $t0) * 1e6 / $TICKS
print('$label', round(d['ops_per_sec']), round(d['latency_us']['p99']),
      round(cpu_us / max(d.get('cycles_all', 0), 1), 2),
      round(($s1 - $s0) * 1000 / $TICKS))"
    [ -s "$WT/lg.err" ] && tail -2 "$WT/lg.err" >&2
    kill "$P"; wait "$P" 2>/dev/null || true; P=
}
# The new ringlockd knows --threads; pin it to one shard like the old loop.
THREADS=()
"$ROOT/target/release/ringlockd" --help 2>&1 | grep -q -- '--threads' && THREADS=(--threads 1)
RUNS=0
TICKS=$(getconf CLK_TCK)
DURABLE_LABEL=""
[ "${AB_DURABLE:-0}" = 1 ] && DURABLE_LABEL=", durable"
[ -n "${AB_SERVER_ARGS:-}" ] && DURABLE_LABEL="$DURABLE_LABEL, both servers: $AB_SERVER_ARGS"
echo "# commit cycles/s p99_us server_cpu_us_per_cycle steal_ms  (load: ${LOAD[*]}$DURABLE_LABEL)"
for _ in $(seq "$ROUNDS"); do
    run "$OLDS" "$WT/old/target/release/ringlockd" "$WT/old/target/release/ringlock-loadgen"
    run "$NEW" "$ROOT/target/release/ringlockd" "$ROOT/target/release/ringlock-loadgen" "${THREADS[@]}"
done
