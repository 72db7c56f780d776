#!/usr/bin/env bash
# What a Locking-Center request forwarded by a follower costs beside one
# sent to the leader directly: one 3-node ringlock cluster (mutual TLS peer
# links, every node durable), the same load against its leader and against
# one follower, alternating, ROUNDS times per client count, in one run.
#
#   scripts/forward-bench.sh [--out DIR] [--clients "1 16"] [--rounds 3]
#                            [--duration 5s] [--warmup 1s] [--profile release|debug]
#   env: FORWARD_BENCH_SMOKE=1 (1 s per run, 1 round, 1 client, debug build,
#        output to a temp dir unless --out; checks every run worked)
#
# Load: ringlock-loadgen, Locking-Center protocol (ringlock://), lock+unlock
# closed loop on persistent connections, each client its own key (--dist
# private). The leader is the node whose directory says it serves (failover
# probe); "forwarded" runs against another node, which passes each request
# to the leader over its peer link and relays the answer. Every node is
# pinned to CPU 1, the load generator to CPU 0 (taskset), as
# scripts/cluster-bench.sh does: the three nodes share one CPU, so the extra
# hop's cost here includes the follower's CPU time taken from the leader.
#
# Writes DIR (default bench/results/forward): one JSON per run (the load
# generator's --json line) named direct|forwarded-CLIENTS-rROUND.json, and
# latest.md (the table printed on stdout): per client count and round,
# cycles/s, lock p50/p99 and cycle p99 of both, and forwarded / direct.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/cluster.sh
. "$ROOT/scripts/lib/cluster.sh"
LOG_TAG=forward-bench
SMOKE=${FORWARD_BENCH_SMOKE:-0}
CLIENTS="1 16"
ROUNDS=3
OUT=""
PROFILE=""
DURATION=""
WARMUP=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift ;;
        --clients) CLIENTS="$2"; shift ;;
        --rounds) ROUNDS="$2"; shift ;;
        --duration) DURATION="$2"; shift ;;
        --warmup) WARMUP="$2"; shift ;;
        --profile) PROFILE="$2"; shift ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
for c in $CLIENTS $ROUNDS; do
    case "$c" in ''|*[!0-9]*|0) echo "--clients and --rounds take positive integers, got $c" >&2; exit 2 ;; esac
done
if [ "$SMOKE" = 1 ]; then
    DURATION=${DURATION:-1s}; WARMUP=${WARMUP:-0s}; PROFILE=${PROFILE:-debug}; ROUNDS=1; CLIENTS="1"
else
    DURATION=${DURATION:-5s}; WARMUP=${WARMUP:-1s}; PROFILE=${PROFILE:-release}
fi
case "$PROFILE" in release|debug) ;; *) echo "--profile is release or debug" >&2; exit 2 ;; esac

cluster_pinning "load generator"
TMP=$(mktemp -d /tmp/ringlock-forward-bench.XXXXXX)
chmod 755 "$TMP"
if [ -z "$OUT" ]; then
    if [ "$SMOKE" = 1 ]; then OUT="$TMP/results"; else OUT="$ROOT/bench/results/forward"; fi
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/latest.md
trap cluster_cleanup EXIT

log "building $PROFILE binaries"
if [ "$PROFILE" = release ]; then CARGO_PROFILE=--release; else CARGO_PROFILE=; fi
# shellcheck disable=SC2086
(cd "$ROOT" && cargo build $CARGO_PROFILE -q --locked -p ringlock --bin ringlockd --bin ringlock \
    -p ringlock-loadgen --bin ringlock-loadgen -p ringlock-bench --bin failover --bin fsync-probe)
BIN="$ROOT/target/$PROFILE"
LOADGEN="$BIN/ringlock-loadgen"
FAILOVER="$BIN/failover"

cluster_ports 26101 26201 26301
cluster_env_info "$PROFILE"
start_rl_cluster "$TMP/run" || { log "the cluster did not start"; exit 1; }
L=$(rl_leader) || { log "no node serves"; exit 1; }
F=$(( L % 3 + 1 ))
log "leader: node $L, forwarding follower: node $F"

FAILED=0
run() { # kind clients round node
    local kind=$1 c=$2 r=$3 n=$4 out="$OUT/$1-$2-r$3.json"
    log "$kind, $c clients, round $r: node $n"
    if $PIN_LOADGEN "$LOADGEN" --target "ringlock://127.0.0.1:${RL_PORT[$n]}" --connections "$c" \
        --dist private --keys "$c" --conn-mode persistent --rate 0 --duration "$DURATION" \
        --warmup "$WARMUP" --key-prefix "fw$kind$c$r" --label "$kind/$c" --json --no-progress \
        >"$TMP/$kind-$c-$r.out" 2>"$TMP/$kind-$c-$r.err"; then
        tail -1 "$TMP/$kind-$c-$r.out" >"$out"
    else
        log "  load generator failed: $(tail -c 300 "$TMP/$kind-$c-$r.err" | tr '\n' ' ')"
        FAILED=1
    fi
}
for c in $CLIENTS; do
    for r in $(seq 1 "$ROUNDS"); do
        # Alternate which goes first: drift between runs falls on both.
        if [ $(( r % 2 )) = 1 ]; then
            run direct "$c" "$r" "$L"; run forwarded "$c" "$r" "$F"
        else
            run forwarded "$c" "$r" "$F"; run direct "$c" "$r" "$L"
        fi
    done
done
# The leader must not have changed: the runs measured a steady state.
L2=$(rl_leader) || true
if [ "$L2" != "$L" ]; then log "the leader changed during the run (node $L, then node ${L2:-none})"; FAILED=1; fi

python3 - "$OUT" "$CLIENTS" "$ROUNDS" >"$OUT/latest.md" <<'EOF'
import json, os, sys
out, clients, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def load(kind, c, r):
    p = os.path.join(out, f"{kind}-{c}-r{r}.json")
    return json.load(open(p)) if os.path.exists(p) else None
print("| clients | round | direct cycles/s | forwarded cycles/s | ratio | direct lock p50 / p99 µs | forwarded lock p50 / p99 µs | direct cycle p99 µs | forwarded cycle p99 µs | errors (d/f) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for c in clients:
    for r in range(1, rounds + 1):
        d, f = load("direct", c, r), load("forwarded", c, r)
        if not d or not f:
            print(f"| {c} | {r} | n/a | n/a | | | | | | |")
            continue
        ratio = f["cycles"] / d["cycles"] if d["cycles"] else 0
        print(f"| {c} | {r} | {d['ops_per_sec']:.0f} | {f['ops_per_sec']:.0f} | {ratio:.2f} | "
              f"{d['latency_us']['p50']:.0f} / {d['latency_us']['p99']:.0f} | "
              f"{f['latency_us']['p50']:.0f} / {f['latency_us']['p99']:.0f} | "
              f"{d['cycle_us']['p99']:.0f} | {f['cycle_us']['p99']:.0f} | {d['errors']}/{f['errors']} |")
EOF
{
    echo
    echo "- ringlockd: $RL_VERSION; 3 nodes, mutual TLS peer links, --data-path (fdatasync before an answer)"
    echo "- leader node $L; forwarded through node $F; $DURATION per run after $WARMUP warm-up"
    echo "- pinning: $PINNING; CPU: $CPU_MODEL; kernel: $KERNEL"
    echo "- fdatasync probe: $FSYNC"
} >>"$OUT/latest.md"
cat "$OUT/latest.md"
if [ "$SMOKE" = 1 ]; then
    for f in "$OUT"/*.json; do
        python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["cycles"] > 0 and d["errors"] == 0 else 1)' "$f" \
            || { log "smoke: $f has no cycles or has errors"; FAILED=1; }
    done
    [ "$(ls "$OUT"/*.json 2>/dev/null | wc -l)" = 2 ] || { log "smoke: expected 2 runs"; FAILED=1; }
fi
exit "$FAILED"
