#!/usr/bin/env bash
# A/B of ringlockd's --idle-poll-us settings: one binary (this tree's
# release build), the settings alternated round by round in one session,
# server pinned to CPU 1 and the load generator to CPU 0, --threads 1.
#
#   scripts/idle-poll-ab.sh [ROUNDS] [VALUES] [LOADGEN ARGS...]
#
# ROUNDS default 3; VALUES default "0 50" (µs, space-separated, quoted).
# Default load: one hot key, 64 persistent clients, open loop at 2000
# cycles/s, 4 s after 1 s warm-up. Prints one line per run: the setting,
# cycles/s, errors, grants per client (min, max, Jain index), lock latency
# p50/p90/p99/p99.9/max (µs), and the server's CPU ticks (1/100 s) over the
# run.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${1:-3}
VALUES=${2:-0 50}
shift $(( $# >= 2 ? 2 : $# ))
LOAD=("$@")
[ ${#LOAD[@]} -gt 0 ] || LOAD=(--conn-mode persistent --connections 64 --dist hot --keys 1 --rate 2000 --duration 4s --warmup 1s)
(cd "$ROOT" && cargo build --release --locked -q -p ringlock --bin ringlockd && cargo build --release --locked -q -p ringlock-loadgen)
T=${CARGO_TARGET_DIR:-$ROOT/target}
SRV=$T/release/ringlockd
LG=$T/release/ringlock-loadgen
PORT=26219
P=
trap '[ -n "$P" ] && kill "$P" 2>/dev/null || true' EXIT
run() { # setting
    local p=$1 t0 t1
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null || break; sleep 0.05; done
    taskset -c 1 "$SRV" --threads 1 --idle-poll-us "$p" --bind 127.0.0.1:$PORT \
        --admin-bind 127.0.0.1:$((PORT + 1)) >/dev/null 2>&1 &
    P=$!
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
    t0=$(awk '{print $14+$15}' "/proc/$P/stat")
    taskset -c 0 "$LG" --target ringlock://127.0.0.1:$PORT "${LOAD[@]}" --no-progress --json 2>/dev/null | tail -1 |
        python3 -c "
import json, sys
d = json.loads(sys.stdin.read()); l = d['latency_us']; f = d['fairness']
print('idle-poll-us=$p', 'cycles/s', round(d['ops_per_sec']), 'errors', d['errors'],
      'grants/client', f['min'], f['max'], 'jain', f['jain'],
      'p50', round(l['p50']), 'p90', round(l['p90']), 'p99', round(l['p99']),
      'p99.9', round(l['p999']), 'max', round(l['max']), end=' ')"
    t1=$(awk '{print $14+$15}' "/proc/$P/stat")
    echo "server_cpu_ticks $((t1 - t0))"
    kill "$P"; wait "$P" 2>/dev/null || true; P=
}
echo "# load: ${LOAD[*]}"
for _ in $(seq "$ROUNDS"); do
    for v in $VALUES; do run "$v"; done
done
