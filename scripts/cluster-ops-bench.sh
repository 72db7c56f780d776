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
#   replace          a node killed (kill -9) and replaced by a fresh one:
#                    an empty data path, a new node id (4, 5, ...) and new
#                    ports; ringlock: `ringlockd --join`, then `ringlock
#                    cluster replace OLD NEW ADDR` (learner, caught up from
#                    a snapshot, then one joint change), its nodes compacting
#                    every CLUSTER_OPS_COMPACT_ENTRIES entries; etcd:
#                    `etcdctl member remove`, `etcdctl member add`, the new
#                    member started with --initial-cluster-state existing;
#                    then waiting until three voters serve, caught up. Each
#                    round replaces a follower, then the leader; --rounds
#                    times (at most 25).
#
#   scripts/cluster-ops-bench.sh [--no-install] [--out DIR] [--systems "ringlock-cluster etcd-cluster"]
#                                [--scenarios "rolling-restart replace"] [--workers 8] [--rounds 5]
#                                [--profile release|debug]
#   env: CLUSTER_OPS_SETTLE_MS (default 1000: the workload runs this long
#        before the first operation and after each one is done, so that
#        every operation's window holds its whole effect),
#        CLUSTER_OPS_IO_TIMEOUT_MS (default 3000: a worker's request
#        unanswered this long is retried elsewhere; counted as a timeout),
#        CLUSTER_OPS_COMPACT_ENTRIES (default 1000: replace's ringlockd
#        --raft-compact-entries; the first kill waits until the leader's
#        commit index passed it by 100, so that a new node is sent a
#        snapshot),
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
# cycles; per operation (restart or replacement) the longest gap of any
# worker (see bench/src/ops.rs for how gaps are assigned to operations).
# The workers' address list is the file CTL/nodes, which the script
# rewrites when a replacement's new node starts (its address added) and
# when the replacement is done (the old one's dropped). Servers on CPU 1,
# the workload and the CLIs (ringlock, etcdctl) on CPU 0 (taskset), as in
# cluster-bench.sh.
#
# Writes DIR (default bench/results/cluster-ops): one JSON per system x
# scenario, logs/ (every member's log; per run the marks, the workload's
# stderr and the replacements' CLI output), latest.md (the tables printed on
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
KNOWN_SCENARIOS="rolling-restart replace"
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
        -h|--help) sed -n '2,57p' "$0"; exit 0 ;;
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
COMPACT_ENTRIES=${CLUSTER_OPS_COMPACT_ENTRIES:-1000}
for v in "WORKERS=$WORKERS" "ROUNDS=$ROUNDS" "CLUSTER_OPS_SETTLE_MS=$SETTLE_MS" "CLUSTER_OPS_IO_TIMEOUT_MS=$IO_TIMEOUT_MS" \
    "CLUSTER_OPS_COMPACT_ENTRIES=$COMPACT_ENTRIES"; do
    case "${v#*=}" in ''|*[!0-9]*) echo "${v%%=*} must be a number, got ${v#*=}" >&2; exit 2 ;; esac
done
[ "$WORKERS" -gt 0 ] && [ "$ROUNDS" -gt 0 ] && [ "$IO_TIMEOUT_MS" -gt 0 ] && [ "$COMPACT_ENTRIES" -gt 0 ] ||
    { echo "--workers, --rounds, CLUSTER_OPS_IO_TIMEOUT_MS and CLUSTER_OPS_COMPACT_ENTRIES must be positive" >&2; exit 2; }
# Each replacement takes a new node id, 4 up to cluster_max_id (53).
case " $SCENARIOS " in *" replace "*) [ "$ROUNDS" -le 25 ] || { echo "replace: at most 25 rounds" >&2; exit 2; } ;; esac
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
want_sc() { case " $SCENARIOS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if want etcd-cluster; then need_etcd "$INSTALL" "$(want_sc replace && echo etcdctl)" || exit 1; fi

log "building $PROFILE binaries"
if [ "$PROFILE" = release ]; then CARGO_PROFILE=--release; else CARGO_PROFILE=; fi
# shellcheck disable=SC2086
(cd "$ROOT" && cargo build $CARGO_PROFILE -q --locked -p ringlock --bin ringlockd --bin ringlock \
    -p ringlock-bench --bin cluster-ops --bin failover --bin fsync-probe)
BIN="$ROOT/target/$PROFILE"
OPS="$BIN/cluster-ops"
FAILOVER="$BIN/failover"
RINGLOCK="$BIN/ringlock"

# Ports other than cluster-bench.sh's, so the two can run on one machine;
# replacements' nodes from 26601 (ringlock, 20 a node) and 27801 (etcd).
cluster_ports 25501 25601 25401 26601 27801
cluster_env_info "$PROFILE"

# ---------------------------------------------------------------- systems
# What a scenario needs of a system; $2 is the node/member (1..3), $3 the
# run's dir.
sys_start() { case "$1" in ringlock-cluster) start_rl_cluster "$2" ;; etcd-cluster) start_etcd_cluster "$2" ;; esac; }
sys_stop() { case "$1" in ringlock-cluster) stop_rl_cluster ;; etcd-cluster) stop_etcd_cluster ;; esac; }
sys_proc() { case "$1" in ringlock-cluster) echo "rl$2" ;; etcd-cluster) echo "etcd$2" ;; esac; }
sys_kind() { case "$1" in ringlock-cluster) echo ringlock ;; etcd-cluster) echo etcd ;; esac; }
sys_log() { case "$1" in ringlock-cluster) echo "$3/n$2/log" ;; etcd-cluster) echo "$3/e$2/log" ;; esac; }
# The workload's addresses, and those `cluster-ops ready` asks: the
# members' (cluster_lists).
sys_nodes() { case "$1" in ringlock-cluster) echo "$NODES" ;; etcd-cluster) echo "$MEMBERS" ;; esac; }
sys_ready_nodes() { case "$1" in ringlock-cluster) echo "$ADMINS" ;; etcd-cluster) echo "$MEMBERS" ;; esac; }
# The members' ids, in the lists' order; setting them.
sys_ids() { case "$1" in ringlock-cluster) echo "$RL_IDS" ;; etcd-cluster) echo "$ETCD_IDS" ;; esac; }
sys_set_ids() { case "$1" in ringlock-cluster) RL_IDS=$2 ;; etcd-cluster) ETCD_IDS=$2 ;; esac; cluster_lists; }
# Node n's address in the workload's list.
sys_addr() { case "$1" in ringlock-cluster) echo "127.0.0.1:${RL_PORT[$2]}" ;; etcd-cluster) echo "127.0.0.1:${ETCD_CLIENT[$2]}" ;; esac; }
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

# The serving node (its index in the member list, 1..3) once every node is
# up and caught up, and, with a workload running, once every worker
# completed a cycle since; with min_commit, once the leader's commit index
# (etcd: raft index) reached it.
cluster_ready() { # sys [progress [min_commit]]
    local p=()
    [ "${2:-}" = progress ] && p=(--progress "$CTL/cycles" --cycles "$(( 4 * WORKERS ))")
    [ -n "${3:-}" ] && p+=(--min-commit "$3")
    $PIN_LOADGEN "$OPS" ready --system "$(sys_kind "$1")" --nodes "$(sys_ready_nodes "$1")" --wait-ms 30000 "${p[@]}"
}
# As cluster_ready, the serving node's id.
cluster_leader() { # sys [progress [min_commit]]
    local i ids
    i=$(cluster_ready "$@") || return 1
    read -ra ids <<<"$(sys_ids "$1")"
    echo "${ids[$(( i - 1 ))]}"
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

# The workers' address list (cluster-ops run --nodes-file), replaced whole.
workload_nodes() { # addresses
    echo "$1" >"$CTL/nodes.tmp" && mv -f "$CTL/nodes.tmp" "$CTL/nodes"
}
workload_start() { # sys scenario
    rm -f "$CTL/stop"
    workload_nodes "$(sys_nodes "$1")"
    $PIN_LOADGEN "$OPS" run --system "$(sys_kind "$1")" --nodes-file "$CTL/nodes" --workers "$WORKERS" --io-timeout-ms "$IO_TIMEOUT_MS" \
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

# The words of list with old replaced by new (none: dropped).
ids_replace() { # list old [new]
    local out="" i
    for i in $1; do
        if [ "$i" = "$2" ]; then i=${3:-}; [ -n "$i" ] || continue; fi
        out="$out${out:+ }$i"
    done
    echo "$out"
}
# Polls until the command succeeds, every 20 ms, for at most SECONDS.
poll() { # seconds cmd...
    local n=$(( $1 * 50 )) _
    shift
    for _ in $(seq 1 "$n"); do "$@" && return 0; sleep 0.02; done
    return 1
}

# ringlock: some node among those admin ports serves and every one that
# answers names it leader (`ringlock cluster status` exits 0).
rl_serves() { $PIN_LOADGEN "$RINGLOCK" --admin-addr "$1" cluster status >/dev/null 2>&1; }
# etcd: those members (ids) name one leader, one of them; sets
# ETCD_LEADER to its id.
etcd_serves() { # ids
    local n st me leader lead=""
    ETCD_LEADER=""
    for n in $1; do
        st=$(http "${ETCD_CLIENT[$n]}" POST /v3/maintenance/status '{}') || return 1
        me=$(echo "$st" | sed -n 's/.*"member_id":"\([0-9]*\)".*/\1/p')
        leader=$(echo "$st" | sed -n 's/.*"leader":"\([0-9]*\)".*/\1/p')
        [ -n "$me" ] && [ -n "$leader" ] && [ "$leader" != 0 ] || return 1
        [ -z "$lead" ] || [ "$lead" = "$leader" ] || return 1
        lead=$leader
        [ "$me" = "$leader" ] && ETCD_LEADER=$n
    done
    [ -n "$ETCD_LEADER" ]
}
ETCDCTL=(etcdctl --dial-timeout 2s --command-timeout 10s)
etcd_eps() { local n e=""; for n in $1; do e="$e${e:+,}http://127.0.0.1:${ETCD_CLIENT[$n]}"; done; echo "$e"; } # ids
etcd_healthy() { $PIN_LOADGEN "${ETCDCTL[@]}" --endpoints "$(etcd_eps "$1")" endpoint health >/dev/null 2>&1; } # id

# ringlock, after node o's kill: node n started with --join and an empty
# data path; once a node serves, `ringlock cluster replace o n` (n a
# learner, caught up, then a voter in o's place in one joint change).
# Marks started (n listens) and replaced (the CLI exited 0 naming the
# voters it should).
replace_rl() { # k o n dir
    local k=$1 o=$2 n=$3 d=$4 rest out want got i admins=""
    start_rl_node "$n" "$d/n$n" "$PEERS,$n=127.0.0.1:${RL_RAFT[$n]}"
    wait_port "${RL_PORT[$n]}" 30 "${PID[rl$n]}" && wait_port "${RL_RAFT[$n]}" 5 "${PID[rl$n]}" ||
        { log "  node $n did not start: $(tail -c 400 "$d/n$n/log")"; return 1; }
    mark started "$k" "$o" "$n"
    workload_nodes "$NODES,$(sys_addr ringlock-cluster "$n")"
    rest=$(ids_replace "$RL_IDS" "$o")
    for i in $rest; do admins="$admins${admins:+,}127.0.0.1:$(( RL_PORT[i] + 1 ))"; done
    poll 30 rl_serves "$admins" || { log "  no node serves 30 s after node $o's kill"; return 1; }
    out=$(timeout 300 $PIN_LOADGEN "$RINGLOCK" --admin-addr "$admins" cluster replace "$o" "$n" "127.0.0.1:${RL_RAFT[$n]}" \
        --timeout 60s 2>>"$CTL/replace.err") || { log "  ringlock cluster replace $o $n exited $?: $(tail -c 400 "$CTL/replace.err")"; return 1; }
    want=$(echo "$rest $n" | tr ' ' '\n' | sort -n | paste -sd,)
    got=$(echo "$out" | sed -n 's/^voters \[\(.*\)\]$/\1/p' | tr -d ' ')
    [ "$got" = "$want" ] || { log "  ringlock cluster replace printed ${out:-nothing}, not voters [$want]"; return 1; }
    mark replaced "$k" "$o" "$got"
}

# etcd, after member o's kill: once the others name a leader, `etcdctl
# member remove` o, `etcdctl member add` n, both sent to the leader (a
# member that has not applied the removal yet refuses the addition as
# "unhealthy cluster": it was not connected to every member, o included,
# for the last 5 s), and n started with a fresh data dir and
# --initial-cluster-state existing. Marks started (n listens) and replaced
# (n answers `etcdctl endpoint health`, and the started members are those
# wanted).
replace_etcd() { # k o n dir
    local k=$1 o=$2 n=$3 d=$4 rest eps id out ic want got refused=0 _
    rest=$(ids_replace "$ETCD_IDS" "$o")
    poll 30 etcd_serves "$rest" || { log "  no etcd leader 30 s after member $o's kill"; return 1; }
    eps=$(etcd_eps "$ETCD_LEADER")
    id=$($PIN_LOADGEN "${ETCDCTL[@]}" --endpoints "$eps" member list 2>>"$CTL/replace.err" | awk -F', ' -v m="e$o" '$3 == m {print $1}')
    [ -n "$id" ] || { log "  etcd member e$o not listed: $(tail -c 400 "$CTL/replace.err")"; return 1; }
    $PIN_LOADGEN "${ETCDCTL[@]}" --endpoints "$eps" member remove "$id" >>"$CTL/replace.err" 2>&1 ||
        { log "  etcdctl member remove $id (e$o) failed: $(tail -c 400 "$CTL/replace.err")"; return 1; }
    # Refused as "unhealthy cluster" while the leader has not been
    # connected to every member for 5 s (scenario_replace waits for that
    # before the kill, so this should not happen): asked again, counted.
    for _ in $(seq 1 100); do
        out=$($PIN_LOADGEN "${ETCDCTL[@]}" --endpoints "$eps" member add "e$n" --peer-urls="http://127.0.0.1:${ETCD_PEER[$n]}" 2>"$CTL/add.err") && break
        cat "$CTL/add.err" >>"$CTL/replace.err"
        grep -q 'unhealthy cluster' "$CTL/add.err" || { log "  etcdctl member add e$n failed: $(tail -c 400 "$CTL/add.err")"; return 1; }
        refused=$(( refused + 1 )); out=""
        sleep 0.1
    done
    [ "$refused" = 0 ] || log "  etcd refused the member add $refused time(s) as \"unhealthy cluster\""
    [ -n "$out" ] || { log "  etcdctl member add e$n: still refused after 10 s"; return 1; }
    ic=$(echo "$out" | sed -n 's/^ETCD_INITIAL_CLUSTER="\(.*\)"$/\1/p')
    [ -n "$ic" ] || { log "  etcdctl member add printed no ETCD_INITIAL_CLUSTER: $out"; return 1; }
    start_etcd_member "$n" "$d" "$ic"
    wait_port "${ETCD_CLIENT[$n]}" 30 "${PID[etcd$n]}" || { log "  etcd member e$n did not start: $(tail -c 400 "$d/e$n/log")"; return 1; }
    mark started "$k" "$o" "$n"
    workload_nodes "$MEMBERS,$(sys_addr etcd-cluster "$n")"
    poll 30 etcd_healthy "$n" || { log "  etcd member e$n not healthy within 30 s: $(tail -c 400 "$d/e$n/log")"; return 1; }
    want=$(echo "$rest $n" | tr ' ' '\n' | sort -n | paste -sd,)
    got=$($PIN_LOADGEN "${ETCDCTL[@]}" --endpoints "$eps" member list 2>>"$CTL/replace.err" |
        awk -F', ' '$2 == "started" {sub(/^e/, "", $3); print $3}' | sort -n | paste -sd,)
    [ "$got" = "$want" ] || { log "  etcd's started members are ${got:-none}, not $want"; return 1; }
    mark replaced "$k" "$o" "$got"
}

# Replacement k: kill -9 to node o, a fresh node (the next id, new ports,
# an empty data path) made a member in its place, then wait until three
# voters serve, caught up, and every worker completed a cycle. The
# workers' list gains the new node's address once it listens and loses
# o's once the replacement is done. Marks signal, exited, started,
# replaced, ready, snapshot (whether the new node installed one).
replace_node() { # sys k o role dir
    local s=$1 k=$2 o=$3 d=$5 n=$NEXT_ID pid rc=0 l snap=no
    NEXT_ID=$(( NEXT_ID + 1 ))
    cluster_new_ports "$n" || return 1
    # shellcheck disable=SC2046
    ports_free $(sys_ports "$s" "$n") || return 1
    pid=${PID[$(sys_proc "$s" "$o")]}
    log "  replacement $k: kill -9 to $s node $o ($4, pid $pid); node $n takes its place"
    mark signal "$k" "$o" "$4"
    # (bash's "Killed" notice for its job goes to /dev/null too.)
    { kill -9 "$pid"; wait_exit "$pid" 30 || rc=$?; } 2>/dev/null
    mark exited "$k" "$o" "$rc"
    PID[$(sys_proc "$s" "$o")]=""
    case "$s" in
        ringlock-cluster) replace_rl "$k" "$o" "$n" "$d" ;;
        etcd-cluster) replace_etcd "$k" "$o" "$n" "$d" ;;
    esac || return 1
    sys_set_ids "$s" "$(ids_replace "$(sys_ids "$s")" "$o" "$n")"
    workload_nodes "$(sys_nodes "$s")"
    l=$(cluster_leader "$s" progress) || { log "  the cluster is not ready after node $o's replacement"; return 1; }
    READY_AT=$EPOCHREALTIME
    mark ready "$k" "$o" "$l"
    case "$s" in
        ringlock-cluster) grep -q raft_snapshot_installed "$d/n$n/log" && snap=yes ;;
        etcd-cluster) grep -Eqi 'applying snapshot|applied (incoming )?snapshot' "$d/e$n/log" && snap=yes ;;
    esac
    mark snapshot "$k" "$o" "$snap"
    log "  node $n replaced node $o (members $(sys_ids "$s"), snapshot: $snap); node $l serves"
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

# Before the cluster starts: ringlock's nodes compact every COMPACT_ENTRIES
# entries, so that a new node is sent a snapshot.
setup_replace() { RL_ARGS=(--raft-compact-entries "$COMPACT_ENTRIES"); }
# etcd adds a member only once its leader has been connected to every
# member for 5 s (its HealthInterval; before that `member add` is refused
# as "unhealthy cluster"): waits until 5 s passed since the cluster was
# last found ready (READY_AT: at its start, after each replacement), when
# every member was connected.
etcd_steady() {
    local until_us=$(( ${READY_AT/./} + 5000000 )) _
    for _ in $(seq 1 60); do
        [ "${EPOCHREALTIME/./}" -ge "$until_us" ] && return 0
        sleep 0.1
    done
    return 1
}
# Each round replaces a follower, then the leader. Before each kill the
# cluster is ready; for ringlock, the leader's commit index passed
# COMPACT_ENTRIES by 100 (its log compacted: a new node, far behind the
# first entry kept, is sent a snapshot); for etcd, etcd_steady.
scenario_replace() { # sys dir
    local s=$1 round role l i min=""
    [ "$s" = ringlock-cluster ] && min=$(( COMPACT_ENTRIES + 100 ))
    for round in $(seq 1 "$ROUNDS"); do
        log " round $round/$ROUNDS"
        for role in follower leader; do
            if [ "$s" = etcd-cluster ]; then etcd_steady || return 1; fi
            l=$(cluster_leader "$s" progress "$min") || return 1
            i=$l
            if [ "$role" = follower ]; then
                for i in $(sys_ids "$s"); do [ "$i" != "$l" ] && break; done
            fi
            RESTART_K=$(( RESTART_K + 1 ))
            replace_node "$s" "$RESTART_K" "$i" "$role" "$2" || return 1
            sleep "$SETTLE_S"
        done
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
        RESTART_K=0; NEXT_ID=4
        cluster_members_reset; RL_ARGS=()
        if declare -F "setup_${sc//-/_}" >/dev/null; then "setup_${sc//-/_}"; fi
        log "$s, $sc"
        if ! sys_start "$s" "$d" || ! cluster_ready "$s" >/dev/null; then
            log "  the cluster did not start"; echo "cluster did not start" >"$TMP/$s-$sc.na"; FAILED=1
            sys_stop "$s"; continue
        fi
        READY_AT=$EPOCHREALTIME
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
        for n in $(seq 1 $(( NEXT_ID - 1 ))); do cp "$(sys_log "$s" "$n" "$d")" "$OUT/logs/$s-$sc-node$n.log" 2>/dev/null || true; done
        for f in marks ops.err replace.err; do cp "$CTL/$f" "$OUT/logs/$s-$sc-$f" 2>/dev/null || true; done
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
    # (An `if`, not `[ ] && echo` in a substitution: under `set -e` a
    # false test there ended the script before the tables of a real run.)
    smoke_note=""
    if [ "$SMOKE" = 1 ]; then smoke_note=" (**smoke mode**: not a measurement)"; fi
    if want_sc rolling-restart; then
        echo "- rolling restart: $ROUNDS round(s), each node in turn SIGTERM then started again on its data path, followers first, leader last; between nodes: every node up and caught up, every worker completed a cycle, then $SETTLE_MS ms$smoke_note"
    fi
    if want_sc replace; then
        echo "- replace: $ROUNDS round(s) of two replacements, a follower's then the leader's: kill -9, a fresh node (new id, new ports, empty data path) put in its place; ringlock: \`ringlockd --join\`, \`ringlock cluster replace OLD NEW ADDR\` once a node serves (learner, caught up, then one joint change), nodes started with \`--raft-compact-entries $COMPACT_ENTRIES\` and the first kill after the leader's commit index passed $(( COMPACT_ENTRIES + 100 )); etcd (its defaults): \`etcdctl member remove\` once a leader is elected, \`etcdctl member add\`, the new member started with \`--initial-cluster-state existing\`, replaced when it answers \`etcdctl endpoint health\`; the workers' list gains the new address when it listens, loses the old one when replaced; between replacements: three members up and caught up, every worker completed a cycle, then $SETTLE_MS ms$smoke_note"
    fi
    echo
    if [ "${#files[@]}" -gt 0 ]; then "$OPS" table "${files[@]}"; fi
    for s in $SYSTEMS; do for sc in $SCENARIOS; do
        [ -e "$TMP/$s-$sc.na" ] && echo && echo "$s, $sc: $(cat "$TMP/$s-$sc.na")"
    done; done
    echo
    echo "Max gap: the longest time a worker went without completing a cycle (the client-seen unavailability). Per-operation max gap: the longest gap of any worker that ended after that operation's signal (a restart's SIGTERM, a replacement's kill -9) and by the next one's; p99 is nearest-rank (with up to 100 operations, the largest). Steady state: gaps that ended before the first operation. Replacements: kill → replaced is until \`ringlock cluster replace\` exited 0 (ringlock) or the new member answered \`etcdctl endpoint health\` (etcd); kill → ready adds the wait for three members caught up and a cycle of every worker; snapshot: the new node's log says it installed one (ringlock: \`raft_snapshot_installed\`). Retries: requests sent and not answered as asked (a closed connection, \`-\`, an error status, a timeout); of which timeouts: no answer within the I/O timeout (such a gap is bounded by the client's timeout, not only by the server); walks: addresses tried that did not serve (refused, a follower's \`-\`). Raw: one JSON per system and scenario beside this file."
} >"$OUT/latest.md"
cat "$OUT/latest.md"

if [ "$SMOKE" = 1 ]; then
    # Smoke mode tests the script: every run wrote its JSON, every worker
    # completed cycles, every operation happened and came back, a ringlock
    # node exits 0 after SIGTERM, every replacement was done, and a new
    # ringlock node installed a snapshot.
    for s in $SYSTEMS; do for sc in $SCENARIOS; do
        r="$OUT/$s-$sc.json"
        [ -s "$r" ] || { echo "smoke: no result for $s, $sc" >&2; FAILED=1; continue; }
        grep -q '"timed_out":false' "$r" || { echo "smoke: $s, $sc: the workload was not stopped" >&2; FAILED=1; }
        if grep -q '"per_worker":\[[^]]*"cycles":0[,}]' "$r"; then echo "smoke: $s, $sc: a worker completed no cycle" >&2; FAILED=1; fi
        got=$(grep -o '"k":[0-9]*' "$r" | wc -l)
        [ "$got" = "${EXPECT[$s-$sc]:-x}" ] && [ "$got" -gt 0 ] || { echo "smoke: $s, $sc: $got restarts recorded, ${EXPECT[$s-$sc]:-?} made" >&2; FAILED=1; }
        if grep -q '"rejoin_ms":null' "$r"; then echo "smoke: $s, $sc: a restart did not come back" >&2; FAILED=1; fi
        if [ "$sc" = rolling-restart ] && [ "$s" = ringlock-cluster ] && grep -o '"exit_status":"[^"]*"' "$r" | grep -qv '"0"'; then
            echo "smoke: $s, $sc: a node exited non-zero after SIGTERM" >&2; FAILED=1
        fi
        if [ "$sc" = replace ]; then
            if grep -qE '"(new_node|replaced_ms)":null' "$r"; then echo "smoke: $s, $sc: a replacement was not done" >&2; FAILED=1; fi
            if [ "$s" = ringlock-cluster ] && grep -q '"snapshot":"no"' "$r"; then
                echo "smoke: $s, $sc: a new node did not install a snapshot" >&2; FAILED=1
            fi
        fi
    done; done
fi
if [ "$FAILED" != 0 ]; then echo "cluster-ops-bench: some runs failed (see above)" >&2; exit 1; fi
