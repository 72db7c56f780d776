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
#
# AB_CLUSTER=1: the same A/B with a 3-node cluster of each commit instead of
# one server. Every run starts a fresh cluster of that commit's ringlockd
# (old, new, old, new, ... as above, old first in every round), each
# member with its own --data-path in the temp dir, the cluster's secure
# setup as scripts/cluster-bench.sh's ringlock-cluster row runs it (mutual
# TLS on the Raft links, certificates made per run by that commit's own
# `ringlock cert`; the client ports plaintext, --client-plaintext, as the
# load generator speaks), waits until a leader serves with all three up
# (the new tree's `failover probe`: Locate), then runs that commit's load
# generator against the leader; then stops the cluster (SIGTERM, wait) and
# removes its data. All three members are pinned to CPU 1, the load
# generator to CPU 0: the members share one CPU, so the numbers are those
# of a cluster on one core (a lower bound of what three hosts give), and
# the per-cycle CPU includes the followers' work. Default load: private
# keys, 16 persistent clients, closed loop (scripts/cluster-bench.sh's
# ringlock rows at 16 clients), 3 s after a 1 s warm-up; LOADGEN ARGS
# replace it as above. Per run: commit, cycles/s, lock p99 (µs), the
# servers' CPU per committed lock+unlock cycle (µs: utime+stime of all
# three members, from /proc/PID/stat, summed, over the load generator's
# whole run, warm-up included, divided by the cycles of the whole run,
# cycles_all: the same window for old and new), steal (ms, as above), the
# leader's node id, and a note when a member's log shows a lease lapse,
# step-down or election during the load (that run measured a failover, not
# the steady state) or the cluster did not start. AB_SERVER_ARGS applies
# to every member; AB_DURABLE has no effect (the members always log).
# Needs an old commit whose ringlockd knows --peers, --certs-dir and
# --client-plaintext. Ports: lock 26201 + 10 (n - 1) (admin +1, metrics +2),
# Raft 26301 + 10 (n - 1).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OLD=${1:?usage: scripts/ab.sh OLD_COMMIT [ROUNDS] [LOADGEN ARGS...]}
ROUNDS=${2:-3}
shift $(( $# >= 2 ? 2 : 1 ))
LOAD=("$@")
if [ "${AB_CLUSTER:-0}" = 1 ]; then
    [ ${#LOAD[@]} -gt 0 ] || LOAD=(--conn-mode persistent --connections 16 --dist private --keys 16 --rate 0 --duration 3s --warmup 1s)
else
    [ ${#LOAD[@]} -gt 0 ] || LOAD=(--conn-mode persistent --connections 64 --dist hot --keys 1 --rate 0 --duration 3s --warmup 1s)
fi
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
# The cluster mode also needs each commit's ringlock (its `ringlock cert`)
# and the new tree's failover tool (its probe finds the leader).
BINS=(--bin ringlockd)
[ "${AB_CLUSTER:-0}" = 1 ] && BINS=(--bin ringlockd --bin ringlock)
for dir in "${BUILD[@]}"; do
    (cd "$dir" && CARGO_TARGET_DIR="$dir/target" cargo build --release -q -p ringlock "${BINS[@]}" &&
        CARGO_TARGET_DIR="$dir/target" cargo build --release -q -p ringlock-loadgen)
done
if [ "${AB_CLUSTER:-0}" = 1 ]; then
    (cd "$ROOT" && CARGO_TARGET_DIR="$ROOT/target" cargo build --release -q -p ringlock-bench --bin failover)
fi
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
if [ "${AB_CLUSTER:-0}" = 1 ]; then
    # shellcheck source=scripts/lib/cluster.sh
    . "$ROOT/scripts/lib/cluster.sh"
    LOG_TAG=ab
    PIN_SERVER="taskset -c 1"; PIN_LOADGEN="taskset -c 0"
    FAILOVER="$ROOT/target/release/failover"
    cluster_ports 26201 26301 26401
    [ -n "${AB_SERVER_ARGS:-}" ] && read -r -a RL_ARGS <<<"$AB_SERVER_ARGS"
    trap 'stop_rl_cluster; cleanup' EXIT
    # Each commit's binaries as scripts/lib/cluster.sh finds them ($BIN/ringlockd,
    # $BIN/ringlock); without ringlock (an AB_OLD_TARGET built without it)
    # the new tree's makes the certificates.
    bindir() { # dir-to-make release-dir
        local d=$1 r=$2 help
        mkdir -p "$d"
        help=$("$r/ringlockd" --help 2>&1 || true)
        local flag
        for flag in --peers --certs-dir --client-plaintext; do
            grep -q -- "$flag" <<<"$help" || { echo "ab: $r/ringlockd knows no $flag: no secure cluster of it to run here" >&2; return 1; }
        done
        ln -s "$r/ringlockd" "$d/ringlockd"
        if [ -x "$r/ringlock" ]; then ln -s "$r/ringlock" "$d/ringlock"
        else echo "ab: no $r/ringlock: the new tree's ringlock makes the certificates" >&2; ln -s "$ROOT/target/release/ringlock" "$d/ringlock"; fi
    }
    bindir "$WT/bin-old" "$WT/old/target/release"
    bindir "$WT/bin-new" "$ROOT/target/release"
    cluster_ticks() { # utime+stime of the three members, summed
        local n t=0 x
        for n in 1 2 3; do
            x=$(awk '{print $14+$15}' "/proc/${PID[rl$n]}/stat" 2>/dev/null) || return 1
            t=$((t + x))
        done
        echo "$t"
    }
    run_cluster() { # label bindir loadgen
        local label=$1 lg=$3 l n t0 t1 s0 s1 ev note="" k
        BIN=$2
        RUNS=$((RUNS + 1))
        # lib/cluster.sh keeps the certificates in $TMP/certs: fresh per run.
        TMP="$WT/cluster.$RUNS"
        mkdir -p "$TMP"
        cluster_members_reset
        # start_rl_cluster waits for the lock and Raft ports of the previous
        # cluster to close; its admin and metrics ports too.
        if ! ports_free $((RL_PORT[1] + 1)) $((RL_PORT[1] + 2)) $((RL_PORT[2] + 1)) $((RL_PORT[2] + 2)) \
            $((RL_PORT[3] + 1)) $((RL_PORT[3] + 2)) || ! start_rl_cluster "$TMP" || ! l=$(rl_leader 2>"$TMP/probe.err"); then
            echo "$label - - - - - cluster did not start or elect a leader"
            for n in 1 2 3; do [ -f "$TMP/n$n/log" ] && log "node $n: $(tail -c 300 "$TMP/n$n/log" | tr '\n' ' ')"; done
            [ -s "$TMP/probe.err" ] && log "probe: $(tail -c 300 "$TMP/probe.err")"
            stop_rl_cluster; rm -rf "$TMP"
            return 0
        fi
        declare -A LINES=()
        for n in 1 2 3; do LINES[$n]=$(wc -l <"$TMP/n$n/log"); done
        t0=$(cluster_ticks)
        s0=$(awk '/^cpu /{print $9}' /proc/stat)
        if ! $PIN_LOADGEN "$lg" --target "ringlock://127.0.0.1:${RL_PORT[$l]}" "${LOAD[@]}" --no-progress --json 2>"$WT/lg.err" | tail -1 >"$WT/lg.json"; then
            note="load generator failed: $(tail -c 200 "$WT/lg.err" | tr '\n' ' ')"
        fi
        t1=$(cluster_ticks) || note="${note:+$note; }a member exited during the run"
        s1=$(awk '/^cpu /{print $9}' /proc/stat)
        ev=0
        for n in 1 2 3; do
            k=$(tail -n +"$((LINES[$n] + 1))" "$TMP/n$n/log" | grep -c 'event=raft_\(not_serving\|stepped_down\|leader\) ' || true)
            ev=$((ev + k))
        done
        [ "$ev" = 0 ] || note="${note:+$note; }leader changed during the run ($ev lease-lapse/step-down/election events in the nodes' logs)"
        if [ -n "$t1" ] && grep -q ops_per_sec "$WT/lg.json"; then
            python3 -c "
import json, sys
d = json.load(open('$WT/lg.json'))
cpu_us = ($t1 - $t0) * 1e6 / $TICKS
print('$label', round(d['ops_per_sec']), round(d['latency_us']['p99']),
      round(cpu_us / max(d.get('cycles_all', 0), 1), 2),
      round(($s1 - $s0) * 1000 / $TICKS), 'node$l', *filter(None, sys.argv[1:]))" "$note"
        else
            echo "$label - - - $(((s1 - s0) * 1000 / TICKS)) node$l${note:+ $note}"
        fi
        [ -s "$WT/lg.err" ] && tail -2 "$WT/lg.err" >&2
        stop_rl_cluster
        rm -rf "$TMP"
    }
    RUNS=0
    TICKS=$(getconf CLK_TCK)
    SERVER_LABEL=""
    [ -n "${AB_SERVER_ARGS:-}" ] && SERVER_LABEL=", every member: $AB_SERVER_ARGS"
    echo "# commit cycles/s p99_us servers_cpu_us_per_cycle steal_ms leader note  (3-node cluster, mTLS Raft links, members on CPU 1; CPU: all three members over the whole load, warm-up included, per cycle of it; load: ${LOAD[*]}$SERVER_LABEL)"
    for _ in $(seq "$ROUNDS"); do
        run_cluster "$OLDS" "$WT/bin-old" "$WT/old/target/release/ringlock-loadgen"
        run_cluster "$NEW" "$WT/bin-new" "$ROOT/target/release/ringlock-loadgen"
    done
    exit 0
fi
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
