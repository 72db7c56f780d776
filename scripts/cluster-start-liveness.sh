#!/usr/bin/env bash
# Start-up liveness of a fresh 3-node ringlock cluster (issue #34, item 5):
# how long from starting three nodes on empty data paths until the cluster
# serves, over many starts, and every start that takes longer than a bound.
#
#   scripts/cluster-start-liveness.sh [--runs N] [--threads "1 2"] [--pinning "pinned unpinned"]
#                                     [--bound-ms 5000] [--give-up-ms 30000] [--out DIR]
#                                     [--profile release|debug] [--no-build] [--client-plaintext]
#                                     [--insecure] [--keep-logs] [--stall D,S,R,C]
#
# Each start: three ringlockd on loopback (scripts/lib/cluster.sh's
# start_rl_node: fresh data paths, certificates made once per run of this
# script with `ringlock cert`, mutual TLS on the Raft links and TLS on the
# lock ports, as a cluster with certificates runs by default), started one
# after the other at t0. From t0 a client that knows all three addresses
# asks for a lock on a fresh key, again and again (a new `ringlock
# --addr A,B,C --certs-dir CA --retry 0 try-lock KEY -- true` each time,
# 10 ms apart: a session Hello, a `not leader` followed, a grant, the
# release) until one is granted: that moment minus t0 is the start's time.
# A start that has not served within --bound-ms (default 5000) is a miss;
# probing goes on until --give-up-ms (default 30000) to see how late it
# was. Then the nodes are killed (SIGKILL: their data is thrown away).
#
# --stall D,S,R,C: D ms after t0, every node is stopped (SIGSTOP, all
# three together) for S ms and runs again (SIGCONT) for R ms, C times: the
# stall of a CPU that other work starves, on demand (e.g. 150,1000,0,1:
# one 1 s stall before the first election; 150,60,20,40: 3.2 s of loops
# that run a quarter of the time).
#
# Configurations (every one gets --runs starts, default 100, interleaved
# run by run so that all of them meet the same load on a shared machine):
# --threads 1 and 2 (shards per node: each shard is a Raft group of its
# own; the CI suites run 2), times pinned (the three servers on CPU 1, the
# client on CPU 0, as the other scripts do) and unpinned (no taskset;
# ringlockd still pins its shards to the CPUs of its mask when --threads
# is above 1).
#
# What the node logs say of each start is in runs.csv beside the client's
# time: when the first node served every shard (its raft_serving lines),
# the highest term elected, how many elections and step-downs, whether
# shard 1 first elected another node than shard 0 (the hand-over that
# follows), how many peer links went down, how many warnings.
#
# Writes DIR (default bench/results/start-liveness): runs.csv, latest.md
# (the distributions: min, p50, p90, p99, max per configuration, printed
# on stdout too), slow/CONFIG-RUN/ (the node logs and the last probe's
# error of every start over the bound), slowest/CONFIG/ (those of the
# slowest start of each configuration, over the bound or not), with
# --keep-logs logs/CONFIG-RUN/ (those of every start).
# Exit status: 0 when every start served within the bound, 1 when some
# did not, 2 for a usage error or a build or set-up failure.
set -euo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/cluster.sh
. "$ROOT/scripts/lib/cluster.sh"
LOG_TAG=start-liveness
RUNS=100
THREADS="1 2"
PINNINGS="pinned unpinned"
BOUND_MS=5000
GIVE_UP_MS=30000
OUT=""
PROFILE=release
BUILD=1
RL_CLIENT_TLS=1
KEEP_LOGS=0
STALL=""
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) RUNS="$2"; shift ;;
        --threads) THREADS="$2"; shift ;;
        --pinning) PINNINGS="$2"; shift ;;
        --bound-ms) BOUND_MS="$2"; shift ;;
        --give-up-ms) GIVE_UP_MS="$2"; shift ;;
        --out) OUT="$2"; shift ;;
        --profile) PROFILE="$2"; shift ;;
        --no-build) BUILD=0 ;;
        --client-plaintext) RL_CLIENT_TLS=0 ;;
        --insecure) RL_PEER_TLS=0; RL_CLIENT_TLS=0 ;;
        --keep-logs) KEEP_LOGS=1 ;;
        --stall) STALL="$2"; shift ;;
        -h|--help) sed -n '2,51p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
for v in "$RUNS" "$BOUND_MS" "$GIVE_UP_MS"; do
    case "$v" in ''|*[!0-9]*|0) echo "--runs, --bound-ms and --give-up-ms take positive integers, got $v" >&2; exit 2 ;; esac
done
[ "$GIVE_UP_MS" -ge "$BOUND_MS" ] || { echo "--give-up-ms must be at least --bound-ms" >&2; exit 2; }
for t in $THREADS; do
    case "$t" in [1-9]) ;; *) echo "--threads takes counts from 1 to 9, got $t" >&2; exit 2 ;; esac
done
for p in $PINNINGS; do
    case "$p" in pinned|unpinned) ;; *) echo "--pinning takes pinned and/or unpinned, got $p" >&2; exit 2 ;; esac
done
case "$PROFILE" in release|debug) ;; *) echo "--profile is release or debug" >&2; exit 2 ;; esac
case "$STALL" in ''|[0-9]*,[0-9]*,[0-9]*,[0-9]*) ;; *) echo "--stall takes D,S,R,C (ms, ms, ms, count), got $STALL" >&2; exit 2 ;; esac

TMP=$(mktemp -d /tmp/ringlock-start-liveness.XXXXXX)
chmod 755 "$TMP"
trap cluster_cleanup EXIT
OUT=${OUT:-$ROOT/bench/results/start-liveness}
mkdir -p "$OUT"
rm -rf "$OUT/slow" "$OUT/slowest" "$OUT/logs" "$OUT/runs.csv" "$OUT/latest.md"

if [ "$BUILD" = 1 ]; then
    log "building $PROFILE binaries"
    if [ "$PROFILE" = release ]; then CARGO_PROFILE=--release; else CARGO_PROFILE=; fi
    # shellcheck disable=SC2086
    (cd "$ROOT" && cargo build $CARGO_PROFILE -q --locked -p ringlock --bin ringlockd --bin ringlock) || exit 2
fi
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE"
[ -x "$BIN/ringlockd" ] && [ -x "$BIN/ringlock" ] || { echo "no ringlockd/ringlock in $BIN" >&2; exit 2; }

# Ports of their own (lock 28501.., Raft 28601..): the other cluster
# scripts use 24xxx-27xxx, so this one can run beside them.
cluster_ports 28501 28601 28401
cluster_pinning "the probing client"
PIN_PINNED_SERVER=$PIN_SERVER; PIN_PINNED_CLIENT=$PIN_LOADGEN
# The certificates, once (rl_security makes them on first use).
rl_security 1 >/dev/null && rl_security 2 >/dev/null && rl_security 3 >/dev/null ||
    { echo "cannot make certificates with $BIN/ringlock cert" >&2; exit 2; }
CLIENT_TLS=()
[ "$RL_CLIENT_TLS" = 1 ] && CLIENT_TLS=(--certs-dir "$TMP/certs/ca")

now_us() { local t=$EPOCHREALTIME; NOW_US=$(( 10#${t/./} )); }
# The machine's total "full" IO stall (µs, /proc/pressure/io: time in
# which every runnable task waited on IO), or nothing without PSI.
io_full_us() { sed -n 's/^full .*total=\([0-9]*\)$/\1/p' /proc/pressure/io 2>/dev/null || true; }

# What the node logs say of a start (t0 in ms since the epoch): the ms
# from t0 until the last node listened (its logs opened and synced, its
# listeners bound), until one node served every shard, the highest term a leader
# was elected in, elections, step-downs, split (shard 1's first leader
# was not shard 0's), peer links down, warnings.
log_facts() { # t0_ms threads log...
    local t0=$1 groups=$2
    shift 2
    gawk -v t0="$t0" -v groups="$groups" '
        function ms(ts) { # 2026-12-06T14:23:51.178Z, UTC
            return mktime(substr(ts, 1, 4) " " substr(ts, 6, 2) " " substr(ts, 9, 2) " " \
                substr(ts, 12, 2) " " substr(ts, 15, 2) " " substr(ts, 18, 2), 1) * 1000 + substr(ts, 21, 3) - t0
        }
        function field(k,   m) { return match($0, " " k "=([^ ]+)", m) ? m[1] : "" }
        {
            ts = field("ts"); if (ts == "") ts = substr($1, 4)
            ev = field("event"); g = field("group"); node = field("node")
        }
        / level=warn / { warns++ }
        ev == "raft_leader" {
            elections++; if (field("term") + 0 > maxterm) maxterm = field("term") + 0
            t = ms(ts); if (!(g in first_at) || t < first_at[g]) { first_at[g] = t; first_leader[g] = node }
        }
        ev == "raft_stepped_down" { stepdowns++ }
        ev == "peer_link_down" { downs++ }
        ev == "raft_serving" && !((node, g) in served) { served[node, g] = ms(ts) }
        ev == "listening" { t = ms(ts); if (t > listening) listening = t; listeners++ }
        END {
            best = -1
            for (k in served) {
                split(k, p, SUBSEP); n = p[1]
                if (n in seen) continue
                seen[n] = 1; all = 1; worst = 0
                for (gg = 0; gg < groups; gg++) {
                    if (!((n, gg) in served)) { all = 0; break }
                    if (served[n, gg] > worst) worst = served[n, gg]
                }
                if (all && (best < 0 || worst < best)) best = worst
            }
            split_ = (groups > 1 && ("1" in first_leader) && first_leader["1"] != first_leader["0"]) ? 1 : 0
            printf "%s,%s,%d,%d,%d,%d,%d,%d\n", (listeners < 3 ? "-" : listening), (best < 0 ? "-" : best), \
                maxterm, elections, stepdowns, split_, downs, warns
        }' "$@"
}

# A start's node logs and its last probe's error (not the data paths:
# their logs are preallocated, a MiB each).
keep_logs() { # run_dir dest
    local n
    for n in 1 2 3; do
        mkdir -p "$2/n$n" && cp "$1/n$n/log" "$2/n$n/log" 2>/dev/null || true
    done
    cp "$1/probe.err" "$2/" 2>/dev/null || true
}

kill_nodes() {
    local n pid _
    for n in 1 2 3; do
        pid=${PID[rl$n]:-}
        [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
    done
    for n in 1 2 3; do
        pid=${PID[rl$n]:-}
        [ -n "$pid" ] || continue
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
        PID[rl$n]=""
    done
}

# One start of configuration $1 (threads $2, pinning $3), run $4: a line
# of runs.csv.
one_start() {
    local cfg=$1 threads=$2 pin=$3 i=$4 d="$TMP/run/$1-$4" n g t0 t0_ms probes=0 ok=0 el=0 why="" facts load io0 io1 io_ms
    if [ "$pin" = pinned ]; then PIN_SERVER=$PIN_PINNED_SERVER; PIN_CLIENT=$PIN_PINNED_CLIENT
    else PIN_SERVER=""; PIN_CLIENT=""; fi
    RL_ARGS=(--threads "$threads")
    local raft=()
    for n in 1 2 3; do for g in $(seq 0 $(( threads - 1 ))); do raft+=($(( RL_RAFT[n] + g ))); done; done
    ports_free "${RL_PORT[@]:1}" "${raft[@]}" || return 1
    load=$(cut -d' ' -f1 /proc/loadavg)
    io0=$(io_full_us)
    mkdir -p "$d"
    now_us; t0=$NOW_US
    for n in 1 2 3; do start_rl_node "$n" "$d/n$n"; done
    local staller=""
    if [ -n "$STALL" ]; then
        (
            IFS=, read -r dl st rn cy <<<"$STALL"
            ms() { awk -v x="$1" 'BEGIN { printf "%.3f", x / 1000 }'; }
            sleep "$(ms "$dl")"
            for _ in $(seq 1 "$cy"); do
                kill -STOP "${PID[rl1]}" "${PID[rl2]}" "${PID[rl3]}" 2>/dev/null
                sleep "$(ms "$st")"
                kill -CONT "${PID[rl1]}" "${PID[rl2]}" "${PID[rl3]}" 2>/dev/null
                sleep "$(ms "$rn")"
            done
        ) &
        staller=$!
    fi
    while :; do
        probes=$(( probes + 1 ))
        # shellcheck disable=SC2086 # $PIN_CLIENT: a command and its arguments, or nothing
        if $PIN_CLIENT timeout 4 "$BIN/ringlock" --addr "$NODES" "${CLIENT_TLS[@]}" --retry 0 \
            try-lock "start-$cfg-$i" -- true >/dev/null 2>"$d/probe.err"; then
            now_us; el=$(( (NOW_US - t0) / 1000 )); ok=1; break
        fi
        now_us; el=$(( (NOW_US - t0) / 1000 ))
        for n in 1 2 3; do
            kill -0 "${PID[rl$n]}" 2>/dev/null || why="node $n exited"
        done
        [ -z "$why" ] || break
        [ "$el" -lt "$GIVE_UP_MS" ] || { why="no grant within $GIVE_UP_MS ms"; break; }
        sleep 0.01
    done
    io1=$(io_full_us)
    if [ -n "$staller" ]; then
        kill "$staller" 2>/dev/null; wait "$staller" 2>/dev/null
        kill -CONT "${PID[rl1]}" "${PID[rl2]}" "${PID[rl3]}" 2>/dev/null
    fi
    kill_nodes
    io_ms=-
    if [ -n "$io0" ] && [ -n "$io1" ]; then io_ms=$(( (io1 - io0) / 1000 )); fi
    t0_ms=$(( t0 / 1000 ))
    facts=$(log_facts "$t0_ms" "$threads" "$d/n1/log" "$d/n2/log" "$d/n3/log")
    echo "$cfg,$threads,$pin,$i,$ok,$el,$probes,$facts,$io_ms,$load" >>"$OUT/runs.csv"
    if [ "$ok" != 1 ] || [ "$el" -gt "$BOUND_MS" ]; then
        log "$cfg run $i: ${why:-served} after $el ms ($probes probes; nodes listening after ${facts%%,*} ms; the machine's full IO stall meanwhile $io_ms ms): logs in $OUT/slow/$cfg-$i"
        if [ -n "$why" ]; then echo "$why" >>"$d/probe.err"; fi
        keep_logs "$d" "$OUT/slow/$cfg-$i"
        # The tails here too, for a run whose --out is thrown away (CI).
        for n in 1 2 3; do
            echo "--- $cfg run $i, node $n's log (its last 15 lines):" >&2
            tail -n 15 "$d/n$n/log" >&2 || true
        done
        echo "--- the last probe: $(tail -c 300 "$d/probe.err" | tr '\n' ' ')" >&2
    fi
    if [ "$el" -gt "${SLOWEST[$cfg]:--1}" ]; then
        SLOWEST[$cfg]=$el
        rm -rf "${OUT:?}/slowest/$cfg" && keep_logs "$d" "$OUT/slowest/$cfg"
        echo "run $i: $el ms" >"$OUT/slowest/$cfg/which"
    fi
    if [ "$KEEP_LOGS" = 1 ]; then keep_logs "$d" "$OUT/logs/$cfg-$i"; fi
    rm -rf "$d"
}

echo "config,threads,pinning,run,ok,client_ms,probes,listen_ms,server_ms,max_term,elections,stepdowns,split,link_downs,warns,io_stall_ms,load1" >"$OUT/runs.csv"
declare -A SLOWEST
CONFIGS=()
for t in $THREADS; do for p in $PINNINGS; do CONFIGS+=("t$t-$p"); done; done
log "${#CONFIGS[@]} configurations (${CONFIGS[*]}), $RUNS starts each, bound $BOUND_MS ms; load $(cut -d' ' -f1-3 /proc/loadavg)"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for i in $(seq 1 "$RUNS"); do
    for c in "${CONFIGS[@]}"; do
        t=${c#t}; t=${t%%-*}; p=${c#*-}
        one_start "$c" "$t" "$p" "$i" || { log "set-up failed at $c run $i"; exit 2; }
    done
    if [ $(( i % 10 )) = 0 ]; then log "$i of $RUNS runs done"; fi
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- report
HEAD_SHORT=$(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet HEAD -- src || echo "+dirty")
{
    echo "# Start-up liveness: fresh 3-node cluster, time to the first lock"
    echo
    echo "- ringlock $HEAD_SHORT ($PROFILE build), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(uname -sr)"
    echo "- $RUNS starts per configuration, interleaved; bound $BOUND_MS ms; load average $LOAD0 at the start, $LOAD1 at the end"
    echo "- peer links: $([ "$RL_PEER_TLS" = 1 ] && echo "mutual TLS" || echo "--insecure"); lock ports: $([ "$RL_CLIENT_TLS" = 1 ] && echo "TLS (the client verifies)" || echo "plaintext")"
    if [ -n "$STALL" ]; then echo "- --stall $STALL: every node SIGSTOPped together (delay, stopped, running ms, cycles)"; fi
    echo "- time: t0 (the first ringlockd started) to a granted try-lock of a fresh key by a client given all three lock addresses; pinned = servers on CPU 1, client on CPU 0"
    echo "- listening: t0 to the last node listening (its logs created and synced, its ports bound); server: t0 to the first node serving every shard (its raft_serving log lines); ms resolution"
    echo
    echo "| configuration | starts | over bound | min ms | p50 | p90 | p99 | max | listening p50 | listening max | server p50 | server max | term>1 | split | step-downs |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for c in "${CONFIGS[@]}"; do
        gawk -F, -v c="$c" -v bound="$BOUND_MS" '
            function pct(a, n, q,   k) { k = int(q * n + 0.999999); if (k < 1) k = 1; return a[k] }
            $1 == c {
                n++; cl[n] = $6; if ($5 != 1 || $6 > bound) over++
                if ($8 != "-") { nl++; ls[nl] = $8 }
                if ($9 != "-") { ns++; sv[ns] = $9 }
                if ($10 > 1) term++; split_ += $13; sd += $12
            }
            END {
                if (n == 0) { printf "| %s | 0 | | | | | | | | | | | | | |\n", c; exit }
                asort(cl); if (ns) asort(sv); if (nl) asort(ls)
                printf "| %s | %d | %d | %d | %d | %d | %d | %d | %s | %s | %s | %s | %d | %d | %d |\n", c, n, over, cl[1], pct(cl, n, 0.5), pct(cl, n, 0.9), pct(cl, n, 0.99), cl[n],
                    nl ? pct(ls, nl, 0.5) : "-", nl ? ls[nl] : "-", ns ? pct(sv, ns, 0.5) : "-", ns ? sv[ns] : "-", term, split_, sd
            }' "$OUT/runs.csv"
    done
    echo
    echo "term>1: starts whose cluster needed more than one election (a split vote, or a hand-over's campaign); split: --threads 2 starts whose shard 1 first elected another node than shard 0 (it then hands its leadership over); step-downs: leaders that lost leadership."
} >"$OUT/latest.md"
cat "$OUT/latest.md"
MISSES=$(gawk -F, -v b="$BOUND_MS" 'NR > 1 && ($5 != 1 || $6 > b)' "$OUT/runs.csv" | wc -l)
if [ "$MISSES" -gt 0 ]; then
    log "$MISSES start(s) over $BOUND_MS ms: logs in $OUT/slow"
    exit 1
fi
log "every start served within $BOUND_MS ms"
