#!/usr/bin/env bash
# Lock modes on one hot key beside exclusive locks, one in-memory ringlockd,
# in one run:
#   private        CLIENTS sessions, each its own key, exclusive (the ceiling)
#   shared-hot     CLIENTS sessions, one key, shared (readers)
#   exclusive-hot  CLIENTS sessions, one key, exclusive (they serialise)
#   mixed          90 % of CLIENTS readers (shared) and 10 % writers
#                  (exclusive) on one key, one load generator (--writers),
#                  hold MIXED_HOLD: readers' and writers' lock waits, and per
#                  writer acquire the wait not explained by the holders ahead
#                  of it (excess) and the later readers granted first
#                  (overtakes), docs/loadgen.md "Mixed runs"
# ROUNDS rounds, the scenarios' order rotated each round (drift falls on all).
#
#   scripts/modes-bench.sh [--out DIR] [--clients 64] [--rounds 3]
#                          [--duration 5s] [--warmup 1s] [--profile release|debug]
#                          [--mixed-hold 100us]
#   env: MODES_BENCH_SMOKE=1 (1 s per run, 1 round, 8 clients, debug build,
#        output to a temp dir unless --out; checks every run worked)
#
# Load: ringlock-loadgen, session protocol (ringlock-session://), Acquire
# (session hold, wait forever) + Release closed loop, persistent
# connections; --access shared / exclusive, hold 0 (mixed: --access shared
# --writers N, --hold MIXED_HOLD). The server is pinned to CPU 1 (one
# shard), the load generator to CPU 0 (taskset).
#
# Writes DIR (default bench/results/modes): one JSON per run (the load
# generator's --json line) named SCENARIO-rROUND.json, and latest.md (the
# tables printed on stdout).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/cluster.sh
. "$ROOT/scripts/lib/cluster.sh"
LOG_TAG=modes-bench
SMOKE=${MODES_BENCH_SMOKE:-0}
CLIENTS=""
ROUNDS=3
OUT=""
PROFILE=""
DURATION=""
WARMUP=""
MIXED_HOLD=100us
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift ;;
        --clients) CLIENTS="$2"; shift ;;
        --rounds) ROUNDS="$2"; shift ;;
        --duration) DURATION="$2"; shift ;;
        --warmup) WARMUP="$2"; shift ;;
        --profile) PROFILE="$2"; shift ;;
        --mixed-hold) MIXED_HOLD="$2"; shift ;;
        -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
if [ "$SMOKE" = 1 ]; then
    DURATION=${DURATION:-1s}; WARMUP=${WARMUP:-0s}; PROFILE=${PROFILE:-debug}; ROUNDS=1; CLIENTS=${CLIENTS:-8}
else
    DURATION=${DURATION:-5s}; WARMUP=${WARMUP:-1s}; PROFILE=${PROFILE:-release}; CLIENTS=${CLIENTS:-64}
fi
for c in $CLIENTS $ROUNDS; do
    case "$c" in ''|*[!0-9]*|0) echo "--clients and --rounds take positive integers, got $c" >&2; exit 2 ;; esac
done
[ "$CLIENTS" -ge 2 ] || { echo "--clients: at least 2 (the mixed run needs a writer and readers)" >&2; exit 2; }
case "$PROFILE" in release|debug) ;; *) echo "--profile is release or debug" >&2; exit 2 ;; esac
WRITERS=$(( CLIENTS / 10 )); [ "$WRITERS" -ge 1 ] || WRITERS=1
READERS=$(( CLIENTS - WRITERS ))

cluster_pinning "the load generators"
if [ -n "$PIN_SERVER" ]; then PINNING="ringlockd on CPU 1, the load generators on CPU 0 (taskset)"; fi
TMP=$(mktemp -d /tmp/ringlock-modes-bench.XXXXXX)
if [ -z "$OUT" ]; then
    if [ "$SMOKE" = 1 ]; then OUT="$TMP/results"; else OUT="$ROOT/bench/results/modes"; fi
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/latest.md "$OUT"/steal.txt
trap cluster_cleanup EXIT

log "building $PROFILE binaries"
if [ "$PROFILE" = release ]; then CARGO_PROFILE=--release; else CARGO_PROFILE=; fi
# shellcheck disable=SC2086
(cd "$ROOT" && cargo build $CARGO_PROFILE -q --locked -p ringlock --bin ringlockd \
    -p ringlock-loadgen --bin ringlock-loadgen -p ringlock-bench --bin fsync-probe)
BIN="$ROOT/target/$PROFILE"
LOADGEN="$BIN/ringlock-loadgen"
cluster_env_info "$PROFILE"

PORT=26401
ports_free "$PORT" "$((PORT + 1))"
$PIN_SERVER "$BIN/ringlockd" --bind "127.0.0.1:$PORT" --admin-bind "127.0.0.1:$((PORT + 1))" \
    --max-waiters 100000 2>"$TMP/server.log" &
PID[server]=$!
wait_port "$PORT" 20 "${PID[server]}" || { log "ringlockd did not start: $(tail -c 300 "$TMP/server.log")"; exit 1; }

FAILED=0
lg() { # name clients dist access prefix [more loadgen options]
    local name=$1 clients=$2 dist=$3 access=$4 prefix=$5
    shift 5
    $PIN_LOADGEN "$LOADGEN" --target "ringlock-session://127.0.0.1:$PORT" --connections "$clients" \
        --dist "$dist" --keys "$clients" --access "$access" --conn-mode persistent --rate 0 \
        --duration "$DURATION" --warmup "$WARMUP" --key-prefix "$prefix" --label "$name" \
        --json --no-progress "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
}
keep() { # name round: the JSON line, or a failure noted
    if [ -s "$TMP/$1.out" ]; then tail -1 "$TMP/$1.out" >"$OUT/$1-r$2.json"; fi
}
steal() { awk '/^cpu /{print $9}' /proc/stat; }
TICKS=$(getconf CLK_TCK)
run() { # scenario round
    local s=$1 r=$2 s0
    s0=$(steal)
    log "$s, $CLIENTS clients, round $r"
    case "$s" in
        private) lg private "$CLIENTS" private exclusive "p$r" || FAILED=1; keep private "$r" ;;
        shared-hot) lg shared-hot "$CLIENTS" hot shared "s$r" || FAILED=1; keep shared-hot "$r" ;;
        exclusive-hot) lg exclusive-hot "$CLIENTS" hot exclusive "x$r" || FAILED=1; keep exclusive-hot "$r" ;;
        mixed)
            # One key (--dist hot), one process: clients 0..WRITERS-1 are
            # the writers, the others readers.
            lg mixed "$CLIENTS" hot shared "m$r" --writers "$WRITERS" --hold "$MIXED_HOLD" \
                || FAILED=1
            keep mixed "$r" ;;
    esac
    echo "$s $r $(( ($(steal) - s0) * 1000 / TICKS ))" >>"$OUT/steal.txt"
    if [ "$FAILED" != 0 ]; then log "  a load generator failed: $(cat "$TMP"/*.err | tail -c 400 | tr '\n' ' ')"; fi
}
SCENARIOS=(private shared-hot exclusive-hot mixed)
for r in $(seq 1 "$ROUNDS"); do
    for i in 0 1 2 3; do
        run "${SCENARIOS[$(( (i + r - 1) % 4 ))]}" "$r"
    done
done

python3 - "$OUT" "$ROUNDS" "$MIXED_HOLD" >"$OUT/latest.md" <<'EOF'
import json, os, sys
out, rounds, mixed_hold = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(name, r):
    p = os.path.join(out, f"{name}-r{r}.json")
    return json.load(open(p)) if os.path.exists(p) else None
def cell(d):
    return f"{d['ops_per_sec']:.0f} | {d['latency_us']['p50']:.0f} / {d['latency_us']['p99']:.0f}"
print("| round | private cycles/s | private lock p50 / p99 µs | shared-hot cycles/s | shared-hot lock p50 / p99 µs | shared-hot / private | exclusive-hot cycles/s | exclusive-hot lock p50 / p99 µs | errors (p/s/x) |")
print("|---|---|---|---|---|---|---|---|---|")
for r in range(1, rounds + 1):
    p, s, x = load("private", r), load("shared-hot", r), load("exclusive-hot", r)
    if not (p and s and x):
        print(f"| {r} | n/a | | | | | | | |")
        continue
    ratio = s["ops_per_sec"] / p["ops_per_sec"] if p["ops_per_sec"] else 0
    print(f"| {r} | {cell(p)} | {cell(s)} | {ratio:.2f} | {cell(x)} | {p['errors']}/{s['errors']}/{x['errors']} |")
print()
print(f"Mixed, hold {mixed_hold}: lock wait p50 / p99 / max µs of each side; writers' excess = a writer's wait not explained by the holders ahead of it (about a round trip when FIFO); overtakes = reader grants asked after a writer (+ guard) yet granted before it, and the writer acquires with any")
print()
print("| round | cycles/s | readers lock p50 / p99 / max µs | writers lock p50 / p99 / max µs | writers' excess p50 / p99 / max µs | overtakes (writer acquires overtaken / analysed) | errors |")
print("|---|---|---|---|---|---|---|")
def ppm(h):
    return f"{h['p50']:.0f} / {h['p99']:.0f} / {h['max']:.0f}"
for r in range(1, rounds + 1):
    m = load("mixed", r)
    if not (m and m.get("fifo")):
        print(f"| {r} | n/a | | | | | |")
        continue
    f = m["fifo"]
    print(f"| {r} | {m['ops_per_sec']:.0f} | {ppm(m['readers_latency_us'])} | {ppm(m['writers_latency_us'])} | "
          f"{ppm(f['excess_us'])} | {f['overtakes']} ({f['writers_overtaken']} / {f['analysed']}) | {m['errors']} |")
EOF
{
    echo
    echo "- ringlockd: $RL_VERSION; one node, in memory; session protocol, session holds, hold 0 (mixed: $MIXED_HOLD)"
    echo "- $CLIENTS clients per scenario (mixed: $READERS readers + $WRITERS writer(s) on one key, one load generator, --writers $WRITERS, FIFO guard 50 µs); $DURATION per run after $WARMUP warm-up; $ROUNDS round(s), order rotated"
    echo "- pinning: $PINNING; CPU: $CPU_MODEL; kernel: $KERNEL"
    echo "- CPU time the host stole from this VM during each run (ms, all CPUs; much of it means the run measured the host): $(awk '{printf "%s%s r%s %s", (NR > 1 ? ", " : ""), $1, $2, $3}' "$OUT/steal.txt")"
} >>"$OUT/latest.md"
cat "$OUT/latest.md"
if [ "$SMOKE" = 1 ]; then
    for f in "$OUT"/*.json; do
        python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["cycles"] > 0 and d["errors"] == 0 else 1)' "$f" \
            || { log "smoke: $f has no cycles or has errors"; FAILED=1; }
    done
    # The mixed run: every writer acquire measured was granted and analysed.
    for f in "$OUT"/mixed-r*.json; do
        python3 -c 'import json,sys; f=json.load(open(sys.argv[1]))["fifo"]; sys.exit(0 if f and f["writer_acquires"] > 0 and f["analysed"] == f["writer_acquires"] else 1)' "$f" \
            || { log "smoke: $f has no FIFO figures or unanalysed writer acquires"; FAILED=1; }
    done
    [ "$(ls "$OUT"/*.json 2>/dev/null | wc -l)" = 4 ] || { log "smoke: expected 4 runs"; FAILED=1; }
fi
exit "$FAILED"
