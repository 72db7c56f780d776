#!/usr/bin/env bash
# Cluster operations benchmark: what clients see while a 3-node ringlock
# cluster and a 3-member etcd cluster (the peer, same machine, same run,
# same workload) are operated on. Scenarios:
#   rolling-restart  every node in turn stopped with SIGTERM and started
#                    again on its own data path: followers first, the
#                    leader last (if leadership moved so that no restart hit
#                    the leader, the leader is restarted once more), waiting
#                    between nodes until every node is up and caught up and
#                    every worker completed a cycle; --rounds times.
#
#   scripts/cluster-ops-bench.sh [--no-install] [--out DIR] [--systems "ringlock-cluster etcd-cluster"]
#                                [--scenarios "rolling-restart"] [--workers 8] [--rounds 5]
#                                [--profile release|debug]
#   env: CLUSTER_OPS_SETTLE_MS (default 1000: the workload runs this long
#        before the first restart and after each node is back, so that
#        every restart's window holds its whole effect),
#        CLUSTER_OPS_IO_TIMEOUT_MS (default 3000: a worker's request
#        unanswered this long is retried elsewhere; counted as a timeout),
#        CLUSTER_OPS_SMOKE=1 (1 round, settle 0, debug build, output to a
#        temp dir unless --out; checks every run worked)
#
# Workload (`cluster-ops run`, bench/src/bin/cluster_ops.rs): W workers,
# each doing lock+unlock cycles on its own key, closed loop; ringlock with
# Locking-Center frames on a persistent connection, walking the node list
# to the node that serves; etcd with its v3 lock API through the gRPC-JSON
# gateway (as cluster-bench.sh drives it), worker w starting at member
# w mod 3. On any failure a worker drops its connection, moves to the next
# address and retries, counting it. Per worker it records the longest gap
# between two completed cycles (the unavailability it saw), its retries and
# cycles; per restart the longest gap of any worker (see bench/src/ops.rs
# for how gaps are assigned to restarts). Servers on CPU 1, the workload on
# CPU 0 (taskset), as in cluster-bench.sh.
#
# Writes DIR (default bench/results/cluster-ops): one JSON per system x
# scenario, logs/ (every member's log), latest.md (the tables printed on
# stdout).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/cluster.sh
. "$ROOT/scripts/lib/cluster.sh"
LOG_TAG=cluster-ops-bench
# Nodes stay jobs of this script: `wait` gives a stopped node's exit status.
RL_DISOWN=0
SMOKE=${CLUSTER_OPS_SMOKE:-0}
INSTALL=1
KNOWN_SYSTEMS="ringlock-cluster etcd-cluster"
# A scenario NAME is the function scenario_NAME (dashes as underscores)
# below; add one there and here.
KNOWN_SCENARIOS="rolling-restart"
SYSTEMS=$KNOWN_SYSTEMS
SCENARIOS=$KNOWN_SCENARIOS
WORKERS=8
OUT=""
PROFILE=""
ROUNDS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --no-install) INSTALL=0 ;;
        --out) OUT="$2"; shift ;;
        --systems) SYSTEMS="$2"; shift ;;
        --scenarios) SCENARIOS="$2"; shift ;;
        --workers) WORKERS="$2"; shift ;;
        --rounds) ROUNDS="$2"; shift ;;
        --profile) PROFILE="$2"; shift ;;
        -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
for s in $SYSTEMS; do
    case " $KNOWN_SYSTEMS " in *" $s "*) ;; *) echo "unknown system $s ($KNOWN_SYSTEMS)" >&2; exit 2 ;; esac
done
for s in $SCENARIOS; do
    case " $KNOWN_SCENARIOS " in *" $s "*) ;; *) echo "unknown scenario $s ($KNOWN_SCENARIOS)" >&2; exit 2 ;; esac
done
if [ "$SMOKE" = 1 ]; then
    ROUNDS=${ROUNDS:-1}; PROFILE=${PROFILE:-debug}; SETTLE_MS=${CLUSTER_OPS_SETTLE_MS:-0}
else
    ROUNDS=${ROUNDS:-5}; PROFILE=${PROFILE:-release}; SETTLE_MS=${CLUSTER_OPS_SETTLE_MS:-1000}
fi
IO_TIMEOUT_MS=${CLUSTER_OPS_IO_TIMEOUT_MS:-3000}
for v in "WORKERS=$WORKERS" "ROUNDS=$ROUNDS" "CLUSTER_OPS_SETTLE_MS=$SETTLE_MS" "CLUSTER_OPS_IO_TIMEOUT_MS=$IO_TIMEOUT_MS"; do
    case "${v#*=}" in ''|*[!0-9]*) echo "${v%%=*} must be a number, got ${v#*=}" >&2; exit 2 ;; esac
done
[ "$WORKERS" -gt 0 ] && [ "$ROUNDS" -gt 0 ] && [ "$IO_TIMEOUT_MS" -gt 0 ] || { echo "--workers, --rounds and CLUSTER_OPS_IO_TIMEOUT_MS must be positive" >&2; exit 2; }
case "$PROFILE" in release|debug) ;; *) echo "--profile is release or debug" >&2; exit 2 ;; esac
SETTLE_S=$(awk -v m="$SETTLE_MS" 'BEGIN{print m / 1000}')

cluster_pinning "the workload (cluster-ops)"

TMP=$(mktemp -d /tmp/ringlock-cluster-ops.XXXXXX)
chmod 755 "$TMP"
if [ -z "$OUT" ]; then
    if [ "$SMOKE" = 1 ]; then OUT="$TMP/results"; else OUT="$ROOT/bench/results/cluster-ops"; fi
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/latest.md
rm -rf "$OUT/logs"
trap cluster_cleanup EXIT

want() { case " $SYSTEMS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if want etcd-cluster; then need_etcd "$INSTALL" || exit 1; fi

log "building $PROFILE binaries"
if [ "$PROFILE" = release ]; then CARGO_PROFILE=--release; else CARGO_PROFILE=; fi
# shellcheck disable=SC2086
(cd "$ROOT" && cargo build $CARGO_PROFILE -q --locked -p ringlock --bin ringlockd \
    -p ringlock-bench --bin cluster-ops --bin failover --bin fsync-probe)
BIN="$ROOT/target/$PROFILE"
OPS="$BIN/cluster-ops"
FAILOVER="$BIN/failover"

# Ports other than cluster-bench.sh's, so the two can run on one machine.
cluster_ports 25501 25601 25401
cluster_env_info "$PROFILE"

# ---------------------------------------------------------------- systems
# What a scenario needs of a system; $2 is the node/member (1..3), $3 the
# run's dir.
sys_start() { case "$1" in ringlock-cluster) start_rl_cluster "$2" ;; etcd-cluster) start_etcd_cluster "$2" ;; esac; }
sys_stop() { case "$1" in ringlock-cluster) stop_rl_cluster ;; etcd-cluster) stop_etcd_cluster ;; esac; }
sys_proc() { case "$1" in ringlock-cluster) echo "rl$2" ;; etcd-cluster) echo "etcd$2" ;; esac; }
sys_kind() { case "$1" in ringlock-cluster) echo ringlock ;; etcd-cluster) echo etcd ;; esac; }
sys_log() { case "$1" in ringlock-cluster) echo "$3/n$2/log" ;; etcd-cluster) echo "$3/e$2/log" ;; esac; }
# The workload's addresses, and those `cluster-ops ready` asks.
sys_nodes() { case "$1" in ringlock-cluster) echo "$NODES" ;; etcd-cluster) echo "$MEMBERS" ;; esac; }
sys_ready_nodes() { case "$1" in ringlock-cluster) echo "$ADMINS" ;; etcd-cluster) echo "$MEMBERS" ;; esac; }
sys_ports() {
    case "$1" in
        ringlock-cluster) echo "${RL_PORT[$2]} $(( RL_PORT[$2] + 1 )) $(( RL_PORT[$2] + 2 )) ${RL_RAFT[$2]}" ;;
        etcd-cluster) echo "${ETCD_CLIENT[$2]} ${ETCD_PEER[$2]}" ;;
    esac
}
# Starts node n again on its data path; returns once it listens.
sys_node_start() { # sys n dir
    local port
    case "$1" in
        ringlock-cluster) start_rl_node "$2" "$3/n$2"; port=${RL_PORT[$2]} ;;
        etcd-cluster) start_etcd_member "$2" "$3"; port=${ETCD_CLIENT[$2]} ;;
    esac
    wait_port "$port" 30 "${PID[$(sys_proc "$1" "$2")]}"
}

# ---------------------------------------------------------------- scenario helpers
# Each run has a control dir CTL shared with `cluster-ops run`: it writes
# CTL/cycles, this script appends CTL/marks and creates CTL/stop.
mark() { echo "$EPOCHREALTIME $*" >>"$CTL/marks"; } # event k node info

# The serving node (1..3) once every node is up and caught up, and, with
# a workload running, once every worker completed a cycle since.
cluster_ready() { # sys [progress]
    local p=()
    [ "${2:-}" = progress ] && p=(--progress "$CTL/cycles" --cycles "$(( 4 * WORKERS ))")
    $PIN_LOADGEN "$OPS" ready --system "$(sys_kind "$1")" --nodes "$(sys_ready_nodes "$1")" --wait-ms 30000 "${p[@]}"
}

# Polls until the process is gone; returns its exit status (124: still
# running after SECONDS).
wait_exit() { # pid seconds
    local _
    for _ in $(seq 1 $(( $2 * 100 ))); do
        if ! kill -0 "$1" 2>/dev/null; then wait "$1" 2>/dev/null; return $?; fi
        sleep 0.01
    done
    return 124
}

workload_start() { # sys scenario
    rm -f "$CTL/stop"
    $PIN_LOADGEN "$OPS" run --system "$(sys_kind "$1")" --nodes "$(sys_nodes "$1")" --workers "$WORKERS" --io-timeout-ms "$IO_TIMEOUT_MS" \
        --scenario "$2" --dir "$CTL" --out "$OUT/$1-$2.json" --key-prefix "co-$2" 2>"$CTL/ops.err" &
    PID[ops]=$!
}
workload_stop() {
    local rc=0
    touch "$CTL/stop"
    wait_exit "${PID[ops]}" 30 || rc=$?
    PID[ops]=""
    [ "$rc" = 0 ] || log "  the workload exited $rc: $(tail -c 300 "$CTL/ops.err" | tr '\n' ' ')"
    return "$rc"
}

# Restart k: SIGTERM to node n, wait for its exit, start it on the same
# data path, wait until the cluster is ready with the workload running.
restart_node() { # sys k n role dir
    local s=$1 k=$2 n=$3 pid rc=0 l
    pid=${PID[$(sys_proc "$s" "$n")]}
    log "  restart $k: SIGTERM to $s node $n ($4, pid $pid)"
    mark signal "$k" "$n" "$4"
    kill -TERM "$pid"
    wait_exit "$pid" 30 || rc=$?
    if [ "$rc" = 124 ]; then log "  node $n still runs 30 s after SIGTERM"; kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    mark exited "$k" "$n" "$rc"
    PID[$(sys_proc "$s" "$n")]=""
    # shellcheck disable=SC2046
    ports_free $(sys_ports "$s" "$n") || return 1
    sys_node_start "$s" "$n" "$5" || { log "  node $n did not restart: $(tail -c 400 "$(sys_log "$s" "$n" "$5")")"; return 1; }
    mark started "$k" "$n" -
    l=$(cluster_ready "$s" progress) || { log "  the cluster is not ready after node $n's restart"; return 1; }
    mark ready "$k" "$n" "$l"
    log "  node $n back (exit status $rc); node $l serves"
    if [ "$rc" != 0 ] && [ "$s" = ringlock-cluster ]; then log "  WARNING: ringlock node $n exited $rc after SIGTERM"; fi
}

# ---------------------------------------------------------------- scenarios
# scenario_NAME sys dir: operates on the running cluster while the
# workload runs; restarts are numbered from 1 through RESTART_K.
scenario_rolling_restart() { # sys dir
    local s=$1 round n l i role restarted count handed
    for round in $(seq 1 "$ROUNDS"); do
        log " round $round/$ROUNDS"
        restarted=" "; count=0; handed=0
        while [ "$count" -lt 3 ]; do
            l=$(cluster_ready "$s" progress) || return 1
            i=$l
            for n in 1 2 3; do
                if [ "$n" != "$l" ] && [[ $restarted != *" $n "* ]]; then i=$n; break; fi
            done
            if [ "$i" = "$l" ]; then role=leader; handed=1; else role=follower; fi
            RESTART_K=$(( RESTART_K + 1 ))
            restart_node "$s" "$RESTART_K" "$i" "$role" "$2" || return 1
            restarted="$restarted$i "; count=$(( count + 1 ))
            sleep "$SETTLE_S"
        done
        if [ "$handed" = 0 ]; then
            l=$(cluster_ready "$s" progress) || return 1
            RESTART_K=$(( RESTART_K + 1 ))
            restart_node "$s" "$RESTART_K" "$l" leader "$2" || return 1
            sleep "$SETTLE_S"
        fi
    done
}

# ---------------------------------------------------------------- runs
FAILED=0
declare -A EXPECT
for sc in $SCENARIOS; do
    for s in $SYSTEMS; do
        d="$TMP/run/$s-$sc"
        CTL="$d/ctl"
        mkdir -p "$CTL"
        RESTART_K=0
        log "$s, $sc"
        if ! sys_start "$s" "$d" || ! cluster_ready "$s" >/dev/null; then
            log "  the cluster did not start"; echo "cluster did not start" >"$TMP/$s-$sc.na"; FAILED=1
            sys_stop "$s"; continue
        fi
        workload_start "$s" "$sc"
        ok=1
        if cluster_ready "$s" progress >/dev/null; then
            sleep "$SETTLE_S"
            "scenario_${sc//-/_}" "$s" "$d" || { log "  $sc did not complete"; ok=0; }
        else
            log "  the workload did not start"; ok=0
        fi
        workload_stop || ok=0
        EXPECT[$s-$sc]=$RESTART_K
        [ "$ok" = 1 ] || { echo "$sc did not complete (see the log above)" >"$TMP/$s-$sc.na"; FAILED=1; }
        sys_stop "$s"
        mkdir -p "$OUT/logs"
        for n in 1 2 3; do cp "$(sys_log "$s" "$n" "$d")" "$OUT/logs/$s-$sc-node$n.log" 2>/dev/null || true; done
    done
done

# ---------------------------------------------------------------- report
files=()
for s in $SYSTEMS; do for sc in $SCENARIOS; do [ -s "$OUT/$s-$sc.json" ] && files+=("$OUT/$s-$sc.json"); done; done
{
    echo "## Cluster operations benchmark"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $HEAD_SHORT"
    echo "- machine: $NCPU vCPU ($(nproc --all) online), $CPU_MODEL, kernel $KERNEL"
    echo "- pinning: $PINNING. **All three members of a cluster share one CPU.**"
    echo "- disk: $(df -P "$TMP" | awk 'NR==2{print $1}') ($(findmnt -no FSTYPE -T "$TMP" 2>/dev/null || echo '?')), fdatasync: $FSYNC"
    echo "- ringlockd: $RL_VERSION; etcd: $ETCD_VERSION; every member durable (ringlock --data-path, etcd's fsynced raft log)"
    echo "- workload: $WORKERS workers, lock+unlock cycles, closed loop, each its own key; ringlock: Locking-Center frames, persistent connection, node list walked to the node that serves; etcd: v3 lock API through the gRPC-JSON gateway, keep-alive, worker w starts at member w mod 3; on any failure a worker moves to the next address (connect timeout 100 ms, I/O timeout $IO_TIMEOUT_MS ms, 1 ms pause after an address that did not serve)"
    echo "- rolling restart: $ROUNDS round(s), each node in turn SIGTERM then started again on its data path, followers first, leader last; between nodes: every node up and caught up, every worker completed a cycle, then $SETTLE_MS ms$([ "$SMOKE" = 1 ] && echo " (**smoke mode**: not a measurement)")"
    echo
    if [ "${#files[@]}" -gt 0 ]; then "$OPS" table "${files[@]}"; fi
    for s in $SYSTEMS; do for sc in $SCENARIOS; do
        [ -e "$TMP/$s-$sc.na" ] && echo && echo "$s, $sc: $(cat "$TMP/$s-$sc.na")"
    done; done
    echo
    echo "Max gap: the longest time a worker went without completing a cycle (the client-seen unavailability). Per-restart max gap: the longest gap of any worker that ended after that restart's SIGTERM and by the next one's; p99 is nearest-rank (with up to 100 restarts, the largest). Steady state: gaps that ended before the first restart. Retries: requests sent and not answered as asked (a closed connection, \`-\`, an error status, a timeout); of which timeouts: no answer within the I/O timeout (such a gap is bounded by the client's timeout, not only by the server); walks: addresses tried that did not serve (refused, a follower's \`-\`). Raw: one JSON per system and scenario beside this file."
} >"$OUT/latest.md"
cat "$OUT/latest.md"

if [ "$SMOKE" = 1 ]; then
    # Smoke mode tests the script: every run wrote its JSON, every worker
    # completed cycles, every restart happened and came back, and a
    # ringlock node exits 0 after SIGTERM.
    for s in $SYSTEMS; do for sc in $SCENARIOS; do
        r="$OUT/$s-$sc.json"
        [ -s "$r" ] || { echo "smoke: no result for $s, $sc" >&2; FAILED=1; continue; }
        grep -q '"timed_out":false' "$r" || { echo "smoke: $s, $sc: the workload was not stopped" >&2; FAILED=1; }
        if grep -q '"per_worker":\[[^]]*"cycles":0[,}]' "$r"; then echo "smoke: $s, $sc: a worker completed no cycle" >&2; FAILED=1; fi
        got=$(grep -o '"k":[0-9]*' "$r" | wc -l)
        [ "$got" = "${EXPECT[$s-$sc]:-x}" ] && [ "$got" -gt 0 ] || { echo "smoke: $s, $sc: $got restarts recorded, ${EXPECT[$s-$sc]:-?} made" >&2; FAILED=1; }
        if grep -q '"rejoin_ms":null' "$r"; then echo "smoke: $s, $sc: a restart did not come back" >&2; FAILED=1; fi
        if [ "$s" = ringlock-cluster ] && grep -o '"exit_status":"[^"]*"' "$r" | grep -qv '"0"'; then
            echo "smoke: $s, $sc: a node exited non-zero after SIGTERM" >&2; FAILED=1
        fi
    done; done
fi
if [ "$FAILED" != 0 ]; then echo "cluster-ops-bench: some runs failed (see above)" >&2; exit 1; fi
