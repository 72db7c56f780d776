#!/usr/bin/env bash
# The one-client lock+unlock cycle of a 3-node ringlock cluster taken
# apart, beside the physical limit measured in the same run.
#
#   scripts/cycle-breakdown.sh [--out DIR] [--duration 10s] [--rounds 3] [--profile release|debug]
#                              [--node-arg ARG]...  (more ringlockd arguments for every
#                              node, e.g. --node-arg --idle-poll --node-arg 0us)
#   env: CYCLE_BREAKDOWN_SMOKE=1 (1 s, 1 round, debug build, temp output;
#        checks that every figure was measured)
#
# Per round, in one run, on this machine's one disk and loopback:
#   1. the floor: ringlock-loadgen's lock+unlock against bench's
#      floor-server (answers `+` at once: one loopback round trip and a
#      trivial server per operation), 1 client;
#   2. the disk: fsync-probe's fdatasync of a 4 KiB append on the run's
#      temp dir (the nodes' disk), 300 samples;
#   3. the cluster: 1 client, lock+unlock against the leader of a fresh
#      3-node cluster (mutual TLS peer links, every node durable), with
#      every node's /metrics read before and after: the leader's Raft
#      commit latency (a batch's proposal -> committed on a quorum and
#      applied), each node's fdatasync count and time, and the nodes' CPU
#      time (utime+stime from /proc) over the run.
# Every server on CPU 1, the load generator on CPU 0 (taskset), as the
# other benchmarks pin them: the three nodes share one CPU here.
#
# What the table says, per commit (a lock or an unlock is one commit):
#   client op     the load generator's mean operation latency
#   commit        the leader's mean proposal -> applied (its own append +
#                 fdatasync, in parallel with the send to the followers,
#                 their append + fdatasync and their acknowledgement)
#   outside       client op - commit: the client's round trip, receiving,
#                 deciding, proposing and answering on the leader
#   fdatasync     mean per node role (leader, followers), and syncs per commit
#   floor op      the floor server's mean operation: one loopback round trip
#   limit         1e6 / (2 x (fdatasync p50 + floor op)) cycles/s: each commit
#                 needs at least one fdatasync and one round trip
#   CPU / cycle   the three nodes' CPU time per lock+unlock cycle
# Writes DIR (default bench/results/cycle): round-R.json (every figure) and
# latest.md (the table).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/cluster.sh
. "$ROOT/scripts/lib/cluster.sh"
LOG_TAG=cycle-breakdown
SMOKE=${CYCLE_BREAKDOWN_SMOKE:-0}
ROUNDS=3
OUT=""
PROFILE=""
DURATION=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift ;;
        --rounds) ROUNDS="$2"; shift ;;
        --duration) DURATION="$2"; shift ;;
        --profile) PROFILE="$2"; shift ;;
        --node-arg) RL_ARGS+=("$2"); shift ;;
        -h|--help) sed -n '2,39p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
case "$ROUNDS" in ''|*[!0-9]*|0) echo "--rounds takes a positive integer" >&2; exit 2 ;; esac
if [ "$SMOKE" = 1 ]; then
    DURATION=${DURATION:-1s}; PROFILE=${PROFILE:-debug}; ROUNDS=1
else
    DURATION=${DURATION:-10s}; PROFILE=${PROFILE:-release}
fi
case "$PROFILE" in release|debug) ;; *) echo "--profile is release or debug" >&2; exit 2 ;; esac

cluster_pinning "load generator"
TMP=$(mktemp -d /tmp/ringlock-cycle.XXXXXX)
chmod 755 "$TMP"
if [ -z "$OUT" ]; then
    if [ "$SMOKE" = 1 ]; then OUT="$TMP/results"; else OUT="$ROOT/bench/results/cycle"; fi
fi
mkdir -p "$OUT"
rm -f "$OUT"/round-*.json "$OUT"/latest.md
trap cluster_cleanup EXIT

log "building $PROFILE binaries"
if [ "$PROFILE" = release ]; then CARGO_PROFILE=--release; else CARGO_PROFILE=; fi
# shellcheck disable=SC2086
(cd "$ROOT" && cargo build $CARGO_PROFILE -q --locked -p ringlock --bin ringlockd --bin ringlock \
    -p ringlock-loadgen --bin ringlock-loadgen \
    -p ringlock-bench --bin failover --bin fsync-probe --bin floor-server)
BIN="$ROOT/target/$PROFILE"
LOADGEN="$BIN/ringlock-loadgen"
FAILOVER="$BIN/failover"
cluster_ports 27101 27201 27301
FLOOR_PORT=27191
cluster_env_info "$PROFILE"

load() { # target label out
    $PIN_LOADGEN "$LOADGEN" --target "$1" --connections 1 --dist private --keys 1 \
        --conn-mode persistent --rate 0 --duration "$DURATION" --warmup 1s \
        --key-prefix "cyc$2" --label "$2" --json --no-progress 2>"$3.err" | tail -1 >"$3"
}
scrape() { # out : every node's /metrics, and the nodes' CPU ticks
    local n
    for n in 1 2 3; do
        http "$(( RL_PORT[n] + 2 ))" GET /metrics >"$1.node$n" || true
    done
    proc_ticks_of "${PID[rl1]}" "${PID[rl2]}" "${PID[rl3]}" >"$1.ticks"
}
proc_ticks_of() {
    local p t=0
    for p in "$@"; do t=$(( t + $(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null || echo 0) )); done
    echo "$t"
}

FAILED=0
for r in $(seq 1 "$ROUNDS"); do
    d="$TMP/r$r"; mkdir -p "$d"
    log "round $r: floor"
    $PIN_SERVER "$BIN/floor-server" --bind "127.0.0.1:$FLOOR_PORT" 2>"$d/floor.log" &
    PID[floor]=$!
    wait_port "$FLOOR_PORT" 10 "${PID[floor]}" || { log "floor-server did not start"; exit 1; }
    load "ringlock://127.0.0.1:$FLOOR_PORT" floor "$d/floor.json" || FAILED=1
    stop_proc floor
    log "round $r: fdatasync probe"
    "$BIN/fsync-probe" "$d" 300 >"$d/fsync.txt" 2>&1 || FAILED=1
    log "round $r: cluster"
    cluster_members_reset
    start_rl_cluster "$d/cluster" || { log "the cluster did not start"; exit 1; }
    L=$(rl_leader) || { log "no node serves"; exit 1; }
    scrape "$d/before"
    load "ringlock://127.0.0.1:${RL_PORT[$L]}" cluster "$d/cluster.json" || FAILED=1
    scrape "$d/after"
    L2=$(rl_leader) || true
    stop_rl_cluster
    python3 - "$d" "$L" "${L2:-0}" "$(getconf CLK_TCK)" >"$OUT/round-$r.json" <<'EOF' || FAILED=1
import json, re, sys
d, leader, leader_after, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def series(path):
    out = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out
def delta(name, n):
    return series(f"{d}/after.node{n}").get(name, 0.0) - series(f"{d}/before.node{n}").get(name, 0.0)
floor = json.load(open(f"{d}/floor.json"))
cl = json.load(open(f"{d}/cluster.json"))
fs = dict(kv.split("=") for kv in open(f"{d}/fsync.txt").read().split()[1:])
cycles = cl["cycles_all"]
commits = delta("ringlock_raft_commit_latency_seconds_count", leader)
commit_s = delta("ringlock_raft_commit_latency_seconds_sum", leader)
roles = {"leader": [leader], "followers": [n for n in (1, 2, 3) if n != leader]}
fsync = {}
for role, nodes in roles.items():
    c = sum(delta("ringlock_wal_fdatasync_seconds_count", n) for n in nodes)
    s = sum(delta("ringlock_wal_fdatasync_seconds_sum", n) for n in nodes)
    fsync[role] = {"count": c, "mean_us": 1e6 * s / c if c else None,
                   "per_commit": c / commits / len(nodes) if commits else None}
ticks = int(open(f"{d}/after.ticks").read()) - int(open(f"{d}/before.ticks").read())
op_mean = (cl["latency_us"]["mean"] + cl["unlock_us"]["mean"]) / 2
commit_mean = 1e6 * commit_s / commits if commits else None
floor_op = (floor["latency_us"]["mean"] + floor["unlock_us"]["mean"]) / 2
fsync_p50 = float(fs["p50_us"])
print(json.dumps({
    "leader": leader, "leader_after": leader_after,
    "cycles_per_s": cl["ops_per_sec"], "cycles": cycles, "errors": cl["errors"],
    "client_op_mean_us": op_mean, "client_lock_p50_us": cl["latency_us"]["p50"],
    "client_lock_p99_us": cl["latency_us"]["p99"], "client_cycle_p99_us": cl["cycle_us"]["p99"],
    "commits": commits, "commits_per_cycle": commits / cycles if cycles else None,
    "commit_mean_us": commit_mean,
    "outside_commit_us": op_mean - commit_mean if commit_mean else None,
    "fdatasync": fsync,
    "floor_op_mean_us": floor_op, "floor_cycles_per_s": floor["ops_per_sec"],
    "fsync_probe_p50_us": fsync_p50, "fsync_probe_mean_us": float(fs["mean_us"]),
    "limit_cycles_per_s": 1e6 / (2 * (fsync_p50 + floor_op)),
    "cpu_us_per_cycle": 1e6 * ticks / hz / cycles if cycles else None,
}))
EOF
done

python3 - "$OUT" "$ROUNDS" >"$OUT/latest.md" <<'EOF'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = [json.load(open(f"{out}/round-{r}.json")) for r in range(1, rounds + 1)]
f = lambda v, p=0: "n/a" if v is None else f"{v:.{p}f}"
print("| round | cycles/s | limit cycles/s | of limit | client op µs | commit µs | outside µs | leader fdatasync µs (per commit) | follower fdatasync µs (per commit) | floor op µs | fdatasync p50 µs | CPU µs / cycle |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for i, r in enumerate(rows, 1):
    fl, ff = r["fdatasync"]["leader"], r["fdatasync"]["followers"]
    print(f"| {i} | {f(r['cycles_per_s'])} | {f(r['limit_cycles_per_s'])} | {f(r['cycles_per_s'] / r['limit_cycles_per_s'], 2)} | "
          f"{f(r['client_op_mean_us'])} | {f(r['commit_mean_us'])} | {f(r['outside_commit_us'])} | "
          f"{f(fl['mean_us'])} ({f(fl['per_commit'], 2)}) | {f(ff['mean_us'])} ({f(ff['per_commit'], 2)}) | "
          f"{f(r['floor_op_mean_us'])} | {f(r['fsync_probe_p50_us'])} | {f(r['cpu_us_per_cycle'])} |")
EOF
{
    echo
    echo "- ringlockd: $RL_VERSION; 3 nodes, mutual TLS peer links, --data-path ${RL_ARGS[*]}; 1 client, lock+unlock, $DURATION per round"
    echo "- pinning: $PINNING; CPU: $CPU_MODEL; kernel: $KERNEL"
} >>"$OUT/latest.md"
cat "$OUT/latest.md"
if [ "$SMOKE" = 1 ]; then
    python3 - "$OUT/round-1.json" <<'EOF' || { log "smoke: a figure is missing"; FAILED=1; }
import json, sys
r = json.load(open(sys.argv[1]))
assert r["cycles"] > 0 and r["errors"] == 0, r
assert r["commits"] > 0 and r["commit_mean_us"] and r["fdatasync"]["followers"]["count"] > 0, r
assert r["floor_op_mean_us"] > 0 and r["cpu_us_per_cycle"], r
EOF
fi
exit "$FAILED"
