#!/usr/bin/env bash
# Cluster benchmark: a 3-node replicated ringlockd cluster beside a 3-member
# etcd cluster (driven two ways), a 3-member ZooKeeper ensemble and a single
# durable ringlockd, same machine, same run, same load; then the ringlock
# cluster's failover time.
#
#   scripts/cluster-bench.sh [--no-install] [--out DIR] [--clients "1 16 64"] [--duration 5s] [--warmup 1s]
#                            [--profile release|debug] [--systems "ringlock-cluster ringlock-cluster-insecure
#                             etcd-cluster etcd-cluster-native zookeeper-cluster ringlockd-durable"]
#   env: FAILOVER_TRIALS (default 20; also the number of SIGTERM hand-over
#        trials after them), FAILOVER_SETTLE_MS (default 1000),
#        ZK_WARMUP (zookeeper-cluster's warm-up, default 20s; smoke 2s),
#        ZK_HEAP (each ZooKeeper member's JVM heap, default 512m),
#        ZK_SESSION_MS (the ZooKeeper clients' session timeout, default 4000),
#        ETCD_PEER_TLS (default 1),
#        CLUSTER_BENCH_SMOKE=1 (1 s per scenario, 3 failover trials, debug
#        build, output to a temp dir unless --out; checks every row worked)
#
# Installs what the chosen systems need with apt-get unless --no-install
# (then a missing one fails the run, it is never skipped): etcd-server;
# for etcd-cluster-native golang-go and golang-etcd-server-dev (etcd 3.4's
# client sources under /usr/share/gocode, with grpc, protobuf, zap ... as
# its dependencies: the client is built offline in GOPATH mode); for
# zookeeper-cluster zookeeper (with libzookeeper-java and default-jre) and
# python3-kazoo.
#
# Peer links: ringlock-cluster runs with certificates (mutual TLS on every
# Raft link, made with ringlock cert), ringlock-cluster-insecure the same
# cluster with --insecure (plaintext links), side by side; etcd's members
# link with peer TLS (--peer-client-cert-auth) unless ETCD_PEER_TLS=0;
# ZooKeeper's quorum links are plaintext (its quorum TLS is not set up
# here). Clients talk plaintext to all of them.
#
# Load: lock+unlock, closed loop, persistent connections, each client its own
# key, at each --clients count, every client against the member that leads,
# so no write is forwarded (a follower would pass it on to the leader, one
# more hop on the one CPU the members share):
# - ringlock clusters and ringlockd-durable: ringlock-loadgen --dist private;
#   the leader is the node whose directory (Locate) says it serves;
# - etcd-cluster: ringlock-loadgen --target etcd://, etcd's v3 lock API
#   (/v3/lock/lock, /v3/lock/unlock) through the gRPC-JSON gateway over
#   HTTP/1.1, one lease per client;
# - etcd-cluster-native: bench/peers/etcd-native (Go, etcd 3.4's clientv3 +
#   concurrency): the clients share one clientv3 client (one gRPC
#   connection, as an application shares it), each with its own
#   concurrency.Session (lease); a cycle = Mutex.Lock + Mutex.Unlock,
#   what the lock API runs inside the server, over native gRPC; the leader
#   member's URL is its only endpoint. Same command line and JSON as
#   ringlock-loadgen's;
# - zookeeper-cluster: bench/peers/zookeeper/kazoo-loadgen.py, kazoo's Lock
#   recipe, one process per client (Python's GIL would serialise threads),
#   each with its own KazooClient (session) connected to the leader only
#   (found with the four-letter word srvr: "Mode: leader"): writes sent to a
#   follower are forwarded to the leader; connected to the leader, a client
#   measures the ensemble the way the other rows measure theirs. A cycle is
#   acquire (get_children + create ephemeral-sequential + get_children) +
#   release (delete): two writes, two local reads. Session timeout
#   ZK_SESSION_MS (default 4000, ZooKeeper's minimum at tickTime 2000):
#   Debian's ZooKeeper 3.8.0 has ZOOKEEPER-4537 (fixed upstream in 3.8.1), a
#   race in the leader's CommitProcessor that leaves a write uncommitted
#   until the next request reaches that member; with one client that next
#   request is its ping, sent every third of the session timeout, so a short
#   session bounds such a stall (~1.3 s instead of ~10 s with a 30 s
#   session). A row whose leader saw a write wait >= 1 s says so (mntr's
#   zk_max_local_write_committed_time_ms). JVM warm-up: the members
#   are JVMs started fresh for every row, so the load runs ZK_WARMUP (default
#   20 s, 2 s in smoke mode) unmeasured before the measured --duration (the
#   JIT compiles the hot paths; the report states the warm-up per row).
# Every member logs to its own data path / dir in a temp dir and fsyncs
# before answering (ringlock --data-path; etcd's WAL; ZooKeeper's
# forceSync=yes, the default, written out in its zoo.cfg). etcd runs with
# the settings in scripts/lib/peers.sh (etcd's tuning guidance; all defaults
# but given explicitly, plus ionice -c2 -n0), ZooKeeper with those in
# scripts/lib/cluster.sh (start_zk_member). Servers (all members of a
# cluster) are pinned to CPU 1, the load generators and the failover client
# to CPU 0 (taskset), as scripts/bench.sh does: the three members of a
# cluster share one CPU, so a cluster's numbers here are a lower bound of
# what three hosts give. The client's own CPU use is reported per row
# (client CPU %): a row whose client used most of CPU 0 measured the client.
#
# Failover (ringlock cluster only): FAILOVER_TRIALS times, `failover trial`
# (bench/src/bin/failover.rs) kills the leader with SIGKILL and measures
# (a) kill -> first grant by the new leader (TryLock of fresh keys against
# every node in a loop) and (b) kill -> grant of a client that was queued
# (blocking Lock) on the old leader behind a holder: the waiter reconnects
# and queues again, the holder reconnects and releases, the waiter's '+' at
# the new leader ends the measure; (c) kill -> a session opened on the old
# leader (holding a session hold) resumed on the new one, its hold listed.
# The killed node is restarted on its data
# path and the next trial waits until the cluster serves with all three up.
#
# Writes DIR (default bench/results/cluster): one JSON per system x scenario
# (the load generator's --json line), failover.json (+ the trial lines and
# the failover cluster's node logs), logs/ (each cluster run's logs),
# latest.md (the tables printed on stdout). A row whose leader changed
# during its run says so in its note (it measured a failover). The table
# gives the lock latency (grant - start of the cycle) and the cycle's (lock
# + unlock, what one client's loop waits for) side by side.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# etcd's members link with peer TLS here (scripts/lib/cluster.sh).
ETCD_PEER_TLS=${ETCD_PEER_TLS:-1}
# shellcheck source=scripts/lib/cluster.sh
. "$ROOT/scripts/lib/cluster.sh"
# shellcheck source=scripts/lib/peers.sh
. "$ROOT/scripts/lib/peers.sh"
LOG_TAG=cluster-bench
SMOKE=${CLUSTER_BENCH_SMOKE:-0}
INSTALL=1
SYSTEMS="ringlock-cluster ringlock-cluster-insecure etcd-cluster etcd-cluster-native zookeeper-cluster ringlockd-durable"
CLIENTS="1 16 64"
OUT=""
PROFILE=""
DURATION=""
WARMUP=""
while [ $# -gt 0 ]; do
    case "$1" in
        --no-install) INSTALL=0 ;;
        --out) OUT="$2"; shift ;;
        --systems) SYSTEMS="$2"; shift ;;
        --clients) CLIENTS="$2"; shift ;;
        --duration) DURATION="$2"; shift ;;
        --warmup) WARMUP="$2"; shift ;;
        --profile) PROFILE="$2"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
for s in $SYSTEMS; do
    case "$s" in ringlock-cluster|ringlock-cluster-insecure|etcd-cluster|etcd-cluster-native|zookeeper-cluster|ringlockd-durable) ;;
        *) echo "unknown system $s (ringlock-cluster, ringlock-cluster-insecure, etcd-cluster, etcd-cluster-native, zookeeper-cluster, ringlockd-durable)" >&2; exit 2 ;; esac
done
for c in $CLIENTS; do
    case "$c" in ''|*[!0-9]*|0) echo "--clients takes positive integers, got $c" >&2; exit 2 ;; esac
done
if [ "$SMOKE" = 1 ]; then
    DURATION=${DURATION:-1s}; WARMUP=${WARMUP:-0s}; TRIALS=${FAILOVER_TRIALS:-3}; PROFILE=${PROFILE:-debug}
    ZK_WARMUP=${ZK_WARMUP:-2s}
else
    DURATION=${DURATION:-5s}; WARMUP=${WARMUP:-1s}; TRIALS=${FAILOVER_TRIALS:-20}; PROFILE=${PROFILE:-release}
    ZK_WARMUP=${ZK_WARMUP:-20s}
fi
SETTLE_MS=${FAILOVER_SETTLE_MS:-1000}
case "$TRIALS" in ''|*[!0-9]*) echo "FAILOVER_TRIALS must be a number, got $TRIALS" >&2; exit 2 ;; esac
case "$SETTLE_MS" in ''|*[!0-9]*) echo "FAILOVER_SETTLE_MS must be a number, got $SETTLE_MS" >&2; exit 2 ;; esac
case "$PROFILE" in release|debug) ;; *) echo "--profile is release or debug" >&2; exit 2 ;; esac

cluster_pinning "load generator and failover client"

TMP=$(mktemp -d /tmp/ringlock-cluster-bench.XXXXXX)
chmod 755 "$TMP"
if [ -z "$OUT" ]; then
    if [ "$SMOKE" = 1 ]; then OUT="$TMP/results"; else OUT="$ROOT/bench/results/cluster"; fi
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.jsonl "$OUT"/*.log "$OUT"/latest.md
rm -rf "$OUT/logs"
trap cluster_cleanup EXIT

# ---------------------------------------------------------------- install
want() { case " $SYSTEMS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if want etcd-cluster || want etcd-cluster-native; then need_etcd "$INSTALL" || exit 1; fi
if want etcd-cluster-native; then need_peer "$INSTALL" etcd-native || exit 1; fi
if want zookeeper-cluster; then need_peer "$INSTALL" zookeeper || exit 1; fi

# ---------------------------------------------------------------- build
log "building $PROFILE binaries"
if [ "$PROFILE" = release ]; then CARGO_PROFILE=--release; else CARGO_PROFILE=; fi
# shellcheck disable=SC2086
(cd "$ROOT" && cargo build $CARGO_PROFILE -q --locked -p ringlock --bin ringlockd --bin ringlock \
    -p ringlock-loadgen --bin ringlock-loadgen -p ringlock-bench --bin failover --bin fsync-probe)
BIN="$ROOT/target/$PROFILE"
LOADGEN="$BIN/ringlock-loadgen"
FAILOVER="$BIN/failover"
if want etcd-cluster-native; then
    log "building etcd-native-loadgen (Debian's Go, GOPATH mode, offline)"
    build_etcd_native || exit 1
fi
if want ringlock-cluster && ! "$BIN/ringlockd" --help 2>&1 | grep -q -- '--peers'; then
    echo "this ringlockd has no --peers (replication): the ringlock-cluster row cannot run" >&2
    exit 1
fi

# ---------------------------------------------------------------- servers
# Lock ports (admin +1, metrics +2), Raft link ports (node n's shard g on
# its base + g: gaps of 10 leave room for --threads up to 10), etcd client
# and peer ports.
cluster_ports 24501 24601 24401
zk_ports 24701
RLD_PORT=24531

start_rld() { # dir
    mkdir -p "$1"
    ports_free "$RLD_PORT" || return 1
    $PIN_SERVER "$BIN/ringlockd" --bind "127.0.0.1:$RLD_PORT" --admin-bind "127.0.0.1:$((RLD_PORT + 1))" \
        --data-path "$1/ringlock.wal" 2>"$1/log" &
    PID[rld]=$!
    wait_port "$RLD_PORT" 30 "${PID[rld]}" || { log "ringlockd did not start: $(tail -c 400 "$1/log")"; return 1; }
}

# ---------------------------------------------------------------- environment
cluster_env_info "$PROFILE"

# ---------------------------------------------------------------- load
declare -A TITLE
TITLE=([ringlock-cluster]="ringlock, 3-node cluster (leader), mTLS peer links"
       [ringlock-cluster-insecure]="ringlock, 3-node cluster (leader), --insecure"
       [etcd-cluster]="etcd, 3-member cluster (leader member), peer TLS; v3 lock API via the gRPC-JSON gateway"
       [etcd-cluster-native]="etcd, 3-member cluster (leader member), peer TLS; native gRPC client (clientv3 concurrency.Mutex)"
       [zookeeper-cluster]="ZooKeeper, 3-member ensemble (leader member); kazoo Lock recipe"
       [ringlockd-durable]="ringlockd, single node, --data-path")
FAILED=0
# Noise accounting, as in scripts/bench.sh: /proc/stat ticks over the run
# minus what the servers and the load generator used = CPU that other work
# on this shared machine took during the run (% of all CPUs); steal = time
# the hypervisor gave to someone else.
CLK_TCK=$(getconf CLK_TCK)
cpu_snap() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
proc_ticks() { # pid... : utime+stime (+ reaped children) of them all
    local p t=0
    for p in "$@"; do t=$(( t + $(awk '{print $14+$15+$16+$17}' "/proc/$p/stat" 2>/dev/null || echo 0) )); done
    echo "$t"
}
noise() { # "busy steal total" before, after, server ticks, loadgen cpu seconds
    echo "$1 $2 $3 $4" | awk -v hz="$CLK_TCK" '{ dt = $6 - $3; if (dt <= 0) dt = 1;
        foreign = ($4 - $1) - $7 - $8 * hz; if (foreign < 0) foreign = 0;
        printf "%.0f %.0f\n", 100 * foreign / dt, 100 * ($5 - $2) / dt }'
}
# The client of each system: ringlock-loadgen, or a peer's own client with
# the same command line and JSON line (scripts/lib/peers.sh); and its
# warm-up.
client_cmd() { # system
    case "$1" in
        etcd-cluster-native) echo "$ETCD_NATIVE" ;;
        zookeeper-cluster) echo "$KAZOO_PYTHON $KAZOO_LOADGEN" ;;
        *) echo "$LOADGEN" ;;
    esac
}
warmup_of() { if [ "$1" = zookeeper-cluster ]; then echo "$ZK_WARMUP"; else echo "$WARMUP"; fi; }
# The session timeout of the ZooKeeper clients (see the header).
ZK_SESSION_MS=${ZK_SESSION_MS:-4000}
case "$ZK_SESSION_MS" in ''|*[!0-9]*) echo "ZK_SESSION_MS must be a number, got $ZK_SESSION_MS" >&2; exit 2 ;; esac
client_args() { if [ "$1" = zookeeper-cluster ]; then echo "--lock-ttl-ms $ZK_SESSION_MS"; fi; }
run_load() { # system clients target server-pid...
    local s=$1 c=$2 target=$3 r="$OUT/$1-$2.json" err="$TMP/$1-$2.err" c0 c1 p0 p1 lg
    shift 3
    log "$s, $c clients: $target ($(client_cmd "$s" | awk '{print $NF}' | xargs basename), warm-up $(warmup_of "$s"))"
    c0=$(cpu_snap); p0=$(proc_ticks "$@")
    # shellcheck disable=SC2046 # the client command (a path, or an interpreter and a path) and its own flags
    if $PIN_LOADGEN $(client_cmd "$s") $(client_args "$s") --target "$target" --connections "$c" --dist private --keys "$c" \
        --conn-mode persistent --rate 0 --duration "$DURATION" --warmup "$(warmup_of "$s")" \
        --key-prefix "cb$c" --label "$s/$c" --json --no-progress >"$TMP/$s-$c.out" 2>"$err"; then
        tail -1 "$TMP/$s-$c.out" >"$r"
        c1=$(cpu_snap); p1=$(proc_ticks "$@")
        lg=$(sed -n 's/.*"loadgen_cpu_s":{"user":\([0-9.]*\),"sys":\([0-9.]*\)}.*/\1 \2/p' "$r" | awk '{print $1 + $2}')
        noise "$c0" "$c1" "$((p1 - p0))" "${lg:-0}" >"$TMP/$s-$c.noise"
    else
        log "  load generator failed: $(tail -c 300 "$err" | tr '\n' ' ')"
        echo "load generator failed: $(tail -c 300 "$err" | tr '\n' ' ')" >"$TMP/$s-$c.na"
        FAILED=1
    fi
}

for c in $CLIENTS; do
    for s in $SYSTEMS; do
        d="$TMP/run/$s-$c"
        case "$s" in
        ringlock-cluster|ringlock-cluster-insecure)
            if [ "$s" = ringlock-cluster ]; then RL_PEER_TLS=1; else RL_PEER_TLS=0; fi
            if start_rl_cluster "$d" && l=$(rl_leader); then
                declare -A LINES=()
                for n in 1 2 3; do LINES[$n]=$(wc -l <"$d/n$n/log"); done
                run_load "$s" "$c" "ringlock://127.0.0.1:${RL_PORT[$l]}" "${PID[rl1]}" "${PID[rl2]}" "${PID[rl3]}"
                echo "node $l" >"$TMP/$s-$c.served-by"
                # A leader that lost its lease or stepped down during the
                # run closes its clients' connections while the load
                # generator keeps asking it: the row then measured a
                # failover, not a steady state. Say so beside the numbers.
                ev=0
                for n in 1 2 3; do
                    k=$(tail -n +"$(( LINES[$n] + 1 ))" "$d/n$n/log" | grep -c 'event=raft_\(not_serving\|stepped_down\|leader\) ' || true)
                    ev=$(( ev + k ))
                done
                [ "$ev" = 0 ] || echo "leader changed during the run ($ev lease-lapse/step-down/election events in the nodes' logs)" >"$TMP/$s-$c.note"
                mkdir -p "$OUT/logs"
                for n in 1 2 3; do cp "$d/n$n/log" "$OUT/logs/$s-$c-node$n.log"; done
            else
                echo "cluster did not start or elect a leader" >"$TMP/$s-$c.na"; FAILED=1
            fi
            stop_rl_cluster ;;
        etcd-cluster|etcd-cluster-native)
            if start_etcd_cluster "$d" && l=$(etcd_leader); then
                t0=$(etcd_term "$l")
                declare -A LINES=()
                for n in 1 2 3; do LINES[$n]=$(wc -l <"$d/e$n/log"); done
                run_load "$s" "$c" "etcd://127.0.0.1:${ETCD_CLIENT[$l]}" "${PID[etcd1]}" "${PID[etcd2]}" "${PID[etcd3]}"
                echo "member $l" >"$TMP/$s-$c.served-by"
                t1=$(etcd_term "$l")
                if [ -z "$t0" ] || [ -z "$t1" ]; then echo "raft term not readable: leader changes not checked" >"$TMP/$s-$c.note"
                elif [ "$t0" != "$t1" ]; then echo "leader changed during the run (raft term $t0 -> $t1)" >"$TMP/$s-$c.note"; fi
                # A snapshot is a latency spike on the member that takes it.
                k=0
                for n in 1 2 3; do
                    k=$(( k + $(tail -n +"$(( LINES[$n] + 1 ))" "$d/e$n/log" | grep -c 'triggering snapshot\|start to snapshot' || true) ))
                done
                [ "$k" = 0 ] || echo "$k raft snapshot(s) during the run" >>"$TMP/$s-$c.note"
                mkdir -p "$OUT/logs"
                for n in 1 2 3; do cp "$d/e$n/log" "$OUT/logs/$s-$c-member$n.log"; done
            else
                echo "cluster did not start or elect a leader" >"$TMP/$s-$c.na"; FAILED=1
            fi
            stop_etcd_cluster ;;
        zookeeper-cluster)
            if start_zk_cluster "$d" && l=$(zk_leader); then
                e0=$(zk_epoch "$l")
                run_load "$s" "$c" "zk://127.0.0.1:${ZK_CLIENT[$l]}" "${PID[zk1]}" "${PID[zk2]}" "${PID[zk3]}"
                echo "member $l" >"$TMP/$s-$c.served-by"
                e1=$(zk_epoch "$l")
                # "EPOCH leader" before and after: another epoch or mode is an election.
                if [ -z "$e0" ] || [ -z "$e1" ]; then echo "epoch not readable (srvr): leader changes not checked" >"$TMP/$s-$c.note"
                elif [ "$e0" != "$e1" ]; then echo "leader changed during the run (epoch, mode: $e0 -> $e1)" >"$TMP/$s-$c.note"; fi
                # ZOOKEEPER-4537's stall (see the header): the leader's
                # slowest write, from receipt to its local commit, over the
                # warm-up and the run.
                w=$(zk_cmd "${ZK_CLIENT[$l]}" mntr | sed -n 's/^zk_max_local_write_committed_time_ms[[:space:]]*//p')
                if [ -n "$w" ] && [ "$w" -ge 1000 ]; then
                    echo "a write waited $w ms for its commit on the leader (warm-up included): ZOOKEEPER-4537's stall" >>"$TMP/$s-$c.note"
                fi
                mkdir -p "$OUT/logs"
                for n in 1 2 3; do cp "$d/z$n/log" "$OUT/logs/$s-$c-member$n.log"; done
            else
                echo "ensemble did not start or elect a leader" >"$TMP/$s-$c.na"; FAILED=1
            fi
            stop_zk_cluster ;;
        ringlockd-durable)
            if start_rld "$d"; then run_load "$s" "$c" "ringlock://127.0.0.1:$RLD_PORT" "${PID[rld]}"
            else echo "server did not start" >"$TMP/$s-$c.na"; FAILED=1; fi
            stop_proc rld ;;
        esac
    done
done

# ---------------------------------------------------------------- failover
# The failover trials run the secure default (mutual TLS peer links).
RL_PEER_TLS=1
if want ringlock-cluster && [ "$TRIALS" -gt 0 ]; then
    d="$TMP/run/failover"
    trials="$OUT/failover-trials.jsonl"
    handovers="$OUT/handover-trials.jsonl"
    : >"$trials"
    : >"$handovers"
    if start_rl_cluster "$d"; then
        for t in $(seq 1 "$((2 * TRIALS))"); do
            if ! l=$(rl_leader); then log "trial $t: the cluster does not serve"; FAILED=1; break; fi
            pid=${PID[rl$l]}
            # The first TRIALS trials kill -9 the leader; the next TRIALS
            # stop it with SIGTERM (it hands its leadership over first).
            if [ "$t" -le "$TRIALS" ]; then sig="kill"; tfile="$trials"; else sig="term"; tfile="$handovers"; fi
            log "failover trial $t/$((2 * TRIALS)): signal $sig to node $l (pid $pid)"
            if ! $PIN_LOADGEN "$FAILOVER" trial --signal "$sig" --trial "$t" --nodes "$NODES" --leader "$l" --pid "$pid" \
                --metrics "127.0.0.1:$((RL_PORT[l] + 2))" --key "fo-trial-$t" --logs "$d/n1/log,$d/n2/log,$d/n3/log" --timeout-ms 30000 --pause-us "${FAILOVER_PAUSE_US:-1000}" \
                >>"$tfile" 2>"$TMP/trial-$t.err"; then
                log "  trial $t failed: $(tail -1 "$tfile" 2>/dev/null) $(tail -c 300 "$TMP/trial-$t.err" | tr '\n' ' ')"
                FAILED=1
            fi
            log "  $(tail -1 "$tfile")"
            # The trial saw it die; reap it and bring it back on its log.
            kill -9 "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
            PID[rl$l]=""
            start_rl_node "$l" "$d/n$l"
            wait_port "${RL_PORT[$l]}" 30 "${PID[rl$l]}" || { log "node $l did not restart: $(tail -c 400 "$d/n$l/log")"; FAILED=1; break; }
            rl_leader >/dev/null || { log "the cluster does not serve after node $l restarted"; FAILED=1; break; }
            # A restarted node withholds its vote for an election timeout
            # (the leader lease); a kill inside that window would measure
            # the restart, not the failover.
            sleep "$(awk -v m="$SETTLE_MS" 'BEGIN{print m / 1000}')"
        done
        "$FAILOVER" report "$trials" >"$OUT/failover.json" || FAILED=1
        "$FAILOVER" report "$handovers" >"$OUT/handover.json" || FAILED=1
        # The nodes' own account (elections, serving, restarts), for reading
        # a slow trial afterwards.
        for n in 1 2 3; do cp "$d/n$n/log" "$OUT/failover-node$n.log"; done
    else
        log "failover: the cluster did not start"; FAILED=1
    fi
    stop_rl_cluster
fi

# ---------------------------------------------------------------- report
field() { # json path: a number from the load generator's one-line JSON
    case "$2" in
        ops) sed -n 's/.*"ops_per_sec":\([0-9.]*\).*/\1/p' "$1" ;;
        errors) sed -n 's/.*"errors":\([0-9]*\).*/\1/p' "$1" ;;
        cycles) sed -n 's/.*"cycles":\([0-9]*\).*/\1/p' "$1" ;;
        first_error) sed -n 's/.*"first_error":"\([^"]*\)".*/first error: \1/p' "$1" ;;
        p50|p99|p999) sed -n "s/.*\"latency_us\":{[^}]*\"$2\":\([0-9.]*\).*/\1/p" "$1" ;;
        cycle_p50|cycle_p99|cycle_p999) sed -n "s/.*\"cycle_us\":{[^}]*\"${2#cycle_}\":\([0-9.]*\).*/\1/p" "$1" ;;
        client_cpu) # the client's CPU over its whole run (warm-up included), % of one CPU
            sed -n 's/.*"run_start_mono_ns":\([0-9]*\),"run_end_mono_ns":\([0-9]*\),"loadgen_cpu_s":{"user":\([0-9.]*\),"sys":\([0-9.]*\)}.*/\1 \2 \3 \4/p' "$1" |
                awk '{ d = ($2 - $1) / 1e9; if (d > 0) printf "%.0f\n", 100 * ($3 + $4) / d }' ;;
    esac
}
row_note() { # run json: what happened besides the numbers
    { cat "$TMP/$1.note" 2>/dev/null; field "$2" first_error; } | paste -sd ';' | sed 's/;/; /g'
}
fo() { # measure stat, from failover.json
    sed -n "s/.*\"$1\":{[^}]*\"$2\":\([0-9.]*\).*/\1/p" "$OUT/failover.json" 2>/dev/null
}
ho() { # measure stat, from handover.json
    sed -n "s/.*\"$1\":{[^}]*\"$2\":\([0-9.]*\).*/\1/p" "$OUT/handover.json" 2>/dev/null
}
{
    echo "## Cluster benchmark"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $HEAD_SHORT"
    echo "- machine: $NCPU vCPU ($(nproc --all) online), $CPU_MODEL, kernel $KERNEL"
    echo "- pinning: $PINNING. **All three members of a cluster share one CPU**, so a cluster's numbers here are a lower bound of what three hosts give."
    echo "- disk: $(df -P "$TMP" | awk 'NR==2{print $1}') ($(findmnt -no FSTYPE -T "$TMP" 2>/dev/null || echo '?')), fdatasync: $FSYNC"
    echo "- ringlockd: $RL_VERSION; etcd: $ETCD_VERSION$(want etcd-cluster-native && echo ", native client: $(etcd_native_version)")$(want zookeeper-cluster && echo "; $(zk_version), client: $(kazoo_version)")"
    echo "- load: lock+unlock, closed loop, persistent connections, each client its own key; $DURATION measured after $WARMUP warm-up$(want zookeeper-cluster && echo " ($ZK_WARMUP for zookeeper-cluster: its members are JVMs, started fresh for every row)")$([ "$SMOKE" = 1 ] && echo " (**smoke mode**: not a measurement)")"
    echo "- clients: ringlock-loadgen (ringlock rows; etcd-cluster: etcd's v3 lock API through the gRPC-JSON gateway, HTTP/1.1); etcd-cluster-native: bench/peers/etcd-native (Go, clientv3 concurrency.Mutex: one shared gRPC connection, a session per client); zookeeper-cluster: bench/peers/zookeeper/kazoo-loadgen.py (kazoo's Lock, one process and session per client). Each against the leader."
    echo "- every system durable: ringlock nodes and the single node with --data-path (fdatasync before an answer), etcd members fsync their raft log, ZooKeeper members their transaction log (forceSync=yes)"
    echo
    echo "*lock* = grant − start of the cycle; *cycle* = lock + unlock (one client's loop: a cycle ends when the unlock is answered). Both percentiles over every cycle measured."
    echo
    echo "| system | clients | served by | cycles/s | lock p50 µs | lock p99 µs | lock p99.9 µs | cycle p50 µs | cycle p99 µs | cycle p99.9 µs | errors | client CPU % | foreign CPU % | steal % | note |"
    echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    for s in $SYSTEMS; do
        for c in $CLIENTS; do
            r="$OUT/$s-$c.json"
            if [ -s "$r" ]; then
                read -r foreign steal <"$TMP/$s-$c.noise" || { foreign='?'; steal='?'; }
                printf '| %s | %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s |\n' "${TITLE[$s]}" "$c" \
                    "$(cat "$TMP/$s-$c.served-by" 2>/dev/null || echo -)" \
                    "$(field "$r" ops)" "$(field "$r" p50)" "$(field "$r" p99)" "$(field "$r" p999)" \
                    "$(field "$r" cycle_p50)" "$(field "$r" cycle_p99)" "$(field "$r" cycle_p999)" "$(field "$r" errors)" \
                    "$(field "$r" client_cpu)" "$foreign" "$steal" "$(row_note "$s-$c" "$r")"
            else
                echo "| ${TITLE[$s]} | $c | - | n/a | | | | | | | | | | | $(cat "$TMP/$s-$c.na" 2>/dev/null || echo 'not run') |"
            fi
        done
    done
    echo
    echo "Client CPU: the load generator's CPU time (its processes, children included) over its whole run, warm-up included, in % of one CPU (it runs on one): near 100 %, the row measured the client as much as the system. Foreign CPU: the share of both CPUs' time during the run used by neither the servers nor the load generator (other work on this shared machine); a row with much of it is noise, not the system."
    if [ -s "$OUT/failover.json" ]; then
        echo
        echo "### Failover (ringlock cluster, kill -9 of the leader; $(sed -n 's/.*"trials":\([0-9]*\).*/\1/p' "$OUT/failover.json") trials)"
        echo
        echo "| measure | trials | p50 ms | p99 ms | max ms |"
        echo "|---|---:|---:|---:|---:|"
        echo "| (a) kill → first grant by the new leader | $(fo a count) | $(fo a p50_ms) | $(fo a p99_ms) | $(fo a max_ms) |"
        echo "| of which: kill → the new leader elected (its log's event=raft_leader) | $(fo elected count) | $(fo elected p50_ms) | $(fo elected p99_ms) | $(fo elected max_ms) |"
        echo "| of which: kill → the new leader serving (event=raft_serving) | $(fo serving count) | $(fo serving p50_ms) | $(fo serving p99_ms) | $(fo serving max_ms) |"
        echo "| (a), trials where no link between the two survivors broke during the election | $(fo a_no_stale_link count) | $(fo a_no_stale_link p50_ms) | | $(fo a_no_stale_link max_ms) |"
        echo "| (a), trials where a survivor's link to the other survivor (restarted after an earlier trial) was found broken during the election | $(fo a_stale_link count) | $(fo a_stale_link p50_ms) | | $(fo a_stale_link max_ms) |"
        echo "| (b) kill → grant of a waiter queued on the old leader (re-queued at the new one, holder released there) | $(fo b count) | $(fo b p50_ms) | $(fo b p99_ms) | $(fo b max_ms) |"
        echo "| (c) kill → a session of the old leader resumed on the new one (its session hold listed) | $(fo c count) | $(fo c p50_ms) | $(fo c p99_ms) | $(fo c max_ms) |"
        echo
        echo "p99 is nearest-rank (with up to 100 trials it is the largest). Clients retry every node with a $( [ -n "${FAILOVER_PAUSE_US:-}" ] && echo "$FAILOVER_PAUSE_US µs" || echo "1 ms") pause, connect timeout 100 ms, read timeout 1 s; the clock starts just before kill(2). Keys lost by a failover: $(sed -n 's/.*"keys_lost":\([0-9]*\).*/\1/p' "$OUT/failover.json"); sessions whose hold was not listed by the Resume: $(sed -n 's/.*"sessions_lost":\([0-9]*\).*/\1/p' "$OUT/failover.json"). Term increase per election (new leader's term − old leader's, from their logs; pre-vote is on, so a refused pre-vote round does not show here): $(sed -n 's/.*"term_increase":{\([^}]*\)}.*/\1/p' "$OUT/failover.json" | sed 's/"\([0-9]*\)":\([0-9]*\)/+\1 in \2 trials/g; s/,/, /g'). Raw trials: failover-trials.jsonl."
    fi
    if [ -s "$OUT/handover.json" ]; then
        echo
        echo "### Hand-over (ringlock cluster, SIGTERM of the leader: it hands its leadership over, then exits; $(sed -n 's/.*"trials":\([0-9]*\).*/\1/p' "$OUT/handover.json") trials)"
        echo
        echo "| measure | trials | p50 ms | p99 ms | max ms |"
        echo "|---|---:|---:|---:|---:|"
        echo "| (a) SIGTERM → first grant by the new leader | $(ho a count) | $(ho a p50_ms) | $(ho a p99_ms) | $(ho a max_ms) |"
        echo "| (b) SIGTERM → grant of a waiter queued on the old leader (answered '-' by it, re-queued at the new one) | $(ho b count) | $(ho b p50_ms) | $(ho b p99_ms) | $(ho b max_ms) |"
        echo "| (c) SIGTERM → a session of the old leader resumed on the new one | $(ho c count) | $(ho c p50_ms) | $(ho c p99_ms) | $(ho c max_ms) |"
        echo
        echo "Same clients and clock as above, the signal SIGTERM instead of SIGKILL: the clients start once the old leader's process is gone, so (a) includes its hand-over and exit. Keys lost: $(sed -n 's/.*"keys_lost":\([0-9]*\).*/\1/p' "$OUT/handover.json"); sessions not kept: $(sed -n 's/.*"sessions_lost":\([0-9]*\).*/\1/p' "$OUT/handover.json"). Raw trials: handover-trials.jsonl."
    fi
} >"$OUT/latest.md"
cat "$OUT/latest.md"

for f in "$TMP"/*.note; do
    if [ -e "$f" ]; then log "WARNING: $(basename "$f" .note): $(cat "$f")"; fi
done
if [ "$SMOKE" = 1 ]; then
    # Smoke mode tests the script: every row must have produced cycles
    # without errors, and every failover trial both measures.
    for s in $SYSTEMS; do
        for c in $CLIENTS; do
            r="$OUT/$s-$c.json"
            [ -s "$r" ] || { echo "smoke: no result for $s at $c clients" >&2; FAILED=1; continue; }
            [ "$(field "$r" cycles)" -gt 0 ] || { echo "smoke: $s at $c clients completed no cycle" >&2; FAILED=1; }
            # Errors are the script's fault unless the row says its leader
            # changed (a lease lapse under load on a loaded machine: the
            # server's behaviour, reported in the row, not a broken script).
            if [ "$(field "$r" errors)" != 0 ]; then
                if grep -q 'leader changed' "$TMP/$s-$c.note" 2>/dev/null; then
                    echo "smoke: $s at $c clients had errors after a leader change (reported in its row)" >&2
                else
                    echo "smoke: $s at $c clients had errors" >&2; FAILED=1
                fi
            fi
        done
    done
    if want ringlock-cluster && [ "$TRIALS" -gt 0 ]; then
        if [ "$(fo a count)" != "$TRIALS" ] || [ "$(fo b count)" != "$TRIALS" ]; then
            echo "smoke: not every failover trial measured both (a) and (b)" >&2; FAILED=1
        fi
        if [ "$(ho a count)" != "$TRIALS" ] || [ "$(ho b count)" != "$TRIALS" ]; then
            echo "smoke: not every hand-over trial measured both (a) and (b)" >&2; FAILED=1
        fi
    fi
fi
if [ "$FAILED" != 0 ]; then echo "cluster-bench: some runs failed (see above)" >&2; exit 1; fi
