#!/usr/bin/env bash
# Leader-election hand-over: `ringlock elect` against one in-memory
# ringlockd and against a 3-node ringlock cluster, beside `etcdctl elect`
# (and `etcdctl lock --ttl`) against one etcd, in one run.
#
#   scripts/election-bench.sh [--no-install] [--out DIR] [--trials 20]
#                             [--profile release|debug] [--lock-ttl 1]
#                             [--systems "ringlock ringlock-cluster etcd etcd-lock"]
#                             (also: ringlock-cluster-host)
#   env: ELECTION_BENCH_SMOKE=1 (2 trials per system, debug build, kill at
#        once once B is queued, output to a temp dir unless --out; fails
#        unless every trial gave both times)
#
# A trial (scripts/election-trials.py drives it), on a fresh election name:
# an observer (`elect --listen`) starts; candidate A campaigns and is
# elected (its CMD prints a line), the observer names it; candidate B
# campaigns and is seen queued on the server; then kill -9 of A's client
# process (the campaigning `ringlock elect` / `etcdctl`, the one holding
# the session), and the times from just before kill(2) to
#   elected:       B's first output line (its CMD started; etcdctl elect
#                  runs no CMD: the line it prints when it wins), and
#   observer-told: the observer's first line that names B.
# Times are CLOCK_MONOTONIC, taken by the driver as it reads each line from
# the clients' pipes. A trial that does not end within its bound (30 s for
# ringlock, the session TTL + 30 s for etcd; set-up steps within the same)
# is an error row, and the run exits non-zero.
#
# Systems:
#   ringlock          one ringlockd, in memory; `ringlock elect NAME VALUE
#                     -- sh -c 'echo elected; exec sleep 1000'`, observer
#                     `ringlock elect --listen --json NAME`. A's CMD dies
#                     with A (the CLI's warden): a_gone_ms in the CSV.
#   ringlock-cluster  the same against a 3-node cluster (--addr all three;
#                     peer mutual TLS, a WAL fsynced per write on each
#                     node): kill -9 of the leader's *process*, not a node.
#   ringlock-cluster-host  (not run unless named) A's host dies: kill -9 of
#                     A's process and, at the same instant, of the node that
#                     leads the cluster (where A's session is served). No FIN
#                     reaches the new leader: A's session ends when it has
#                     heard nothing from A for the session keep-alive
#                     (ringlockd's default, 10 s; A pings every third of it),
#                     after the Raft election; B's and the observer's
#                     sessions are resumed there. The killed node restarts
#                     on its data path between trials. (Killing the leader
#                     node alone hands nothing over: A's session is resumed
#                     on the new leader and A keeps leading.)
#   etcd              one etcd (Debian's etcd-server), `etcdctl elect NAME
#                     VALUE`, observer `etcdctl elect --listen NAME`. etcdctl
#                     3.4's elect has no TTL flag: its session lease has
#                     concurrency.NewSession's default TTL, 60 s; a killed
#                     etcdctl is noticed when that lease expires.
#   etcd-lock         `etcdctl lock --ttl LOCK_TTL NAME -- sh -c 'echo ...;
#                     exec sleep 1000'`, the one etcdctl command with a TTL
#                     flag (and a CMD), same observer (the lock's keys are
#                     an election's under NAME/). --lock-ttl default 1, the
#                     lowest etcdctl takes (0 or less: 60 s); etcd raises a
#                     lease's TTL to its minimum, 1.5 x --election-timeout
#                     rounded up to whole seconds (2 s at the defaults used
#                     here): the report gives the TTL etcd granted. etcdctl
#                     lock does not stop its CMD when killed: A's CMD runs on
#                     beside B's until the trial's clean-up kills it.
# Kill timing: B is queued, then a random delay, uniform in [0, TTL/3) for
# etcd (etcdctl's client renews the lease every TTL/3: the kill lands at a
# random point of that period, so etcd's hand-over spans ~2/3 TTL to TTL,
# plus up to 0.5 s, etcd's expiry check period), in [0, 200 ms) for
# ringlock (whose hand-over is the connection's close: no period), in
# [0, keep-alive/3) for ringlock-cluster-host (A's ping period); none in
# smoke mode. The delay is in the CSV.
#
# Servers (ringlockd, the cluster's nodes, etcd) are pinned to CPU 1, the
# driver and every client to CPU 0 (taskset), as the other benchmarks do.
# Each system's servers run alone: started before its trials, stopped after.
#
# Writes DIR (default bench/results/election): SYSTEM.csv per system (one
# row per trial: system, trial, kill_delay_ms, elected_ms, told_ms,
# a_gone_ms, granted_ttl_s, error), logs-SYSTEM/ (the clients' stderr) when
# a trial failed, and latest.md (the table printed on stdout). p99 is
# nearest-rank: with up to 100 trials it is the largest.
#
# A full run takes about 25 minutes, nearly all of it etcd's 60 s TTL
# (ringlock-cluster-host adds about 15 s a trial).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/cluster.sh
. "$ROOT/scripts/lib/cluster.sh"
LOG_TAG=election-bench
SMOKE=${ELECTION_BENCH_SMOKE:-0}
INSTALL=1
OUT=""
TRIALS=""
PROFILE=""
LOCK_TTL=1
SYSTEMS="ringlock ringlock-cluster etcd etcd-lock"
while [ $# -gt 0 ]; do
    case "$1" in
        --no-install) INSTALL=0 ;;
        --out) OUT="$2"; shift ;;
        --trials) TRIALS="$2"; shift ;;
        --profile) PROFILE="$2"; shift ;;
        --lock-ttl) LOCK_TTL="$2"; shift ;;
        --systems) SYSTEMS="$2"; shift ;;
        -h|--help) sed -n '2,81p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
if [ "$SMOKE" = 1 ]; then
    TRIALS=${TRIALS:-2}; PROFILE=${PROFILE:-debug}
else
    TRIALS=${TRIALS:-20}; PROFILE=${PROFILE:-release}
fi
for c in "$TRIALS" "$LOCK_TTL"; do
    case "$c" in ''|*[!0-9]*|0) echo "--trials and --lock-ttl take positive integers, got $c" >&2; exit 2 ;; esac
done
case "$PROFILE" in release|debug) ;; *) echo "--profile is release or debug" >&2; exit 2 ;; esac
[ -n "${SYSTEMS// /}" ] || { echo "--systems: name at least one" >&2; exit 2; }
for s in $SYSTEMS; do
    case "$s" in ringlock|ringlock-cluster|ringlock-cluster-host|etcd|etcd-lock) ;; *) echo "unknown system $s" >&2; exit 2 ;; esac
done
want() { case " $SYSTEMS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

cluster_pinning "the trial driver and every client (candidates, observers)"
TMP=$(mktemp -d /tmp/ringlock-election-bench.XXXXXX)
if [ -z "$OUT" ]; then
    if [ "$SMOKE" = 1 ]; then OUT="$TMP/results"; else OUT="$ROOT/bench/results/election"; fi
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.csv "$OUT"/latest.md
rm -rf "$OUT"/logs-*
trap cluster_cleanup EXIT

if want etcd || want etcd-lock; then need_etcd "$INSTALL" etcdctl || exit 1; fi

log "building $PROFILE binaries"
if [ "$PROFILE" = release ]; then CARGO_PROFILE=--release; else CARGO_PROFILE=; fi
# shellcheck disable=SC2086
(cd "$ROOT" && cargo build $CARGO_PROFILE -q --locked -p ringlock --bin ringlockd --bin ringlock \
    -p ringlock-bench --bin failover --bin fsync-probe)
case "${CARGO_TARGET_DIR:-}" in
    "") BIN="$ROOT/target/$PROFILE" ;;
    /*) BIN="$CARGO_TARGET_DIR/$PROFILE" ;;
    *) BIN="$ROOT/$CARGO_TARGET_DIR/$PROFILE" ;;
esac
FAILOVER="$BIN/failover"
cluster_env_info "$PROFILE"
if { want ringlock-cluster || want ringlock-cluster-host; } && ! "$BIN/ringlockd" --help 2>&1 | grep -q -- '--peers'; then
    echo "this ringlockd has no --peers (replication): the cluster rows cannot run" >&2; exit 1
fi
ETCDCTL_VERSION=$(command -v etcdctl >/dev/null && etcdctl version 2>/dev/null | awk '/etcdctl version/{print $3}' || echo "not installed")

# Ports: the single ringlockd (admin +1, metrics +2); the cluster's lock
# ports (29101, 29111, 29121; admin +1, metrics +2) and Raft bases (its
# etcd ports are not used); the single etcd's client and peer ports.
RL_SINGLE=29001
cluster_ports 29101 29201 29301
ETCD_PORT=29051
# ringlockd's default session keep-alive deadline (--keepalive), which the
# candidates do not change.
RL_KEEPALIVE_MS=10000

FAILED=0
# The driver, on CPU 0 with every client it starts; in the background so
# that the clean-up can stop it (it stops its clients).
trials() { # system kind spread_ms timeout_s count first [driver args...]
    local sys=$1 kind=$2 spread=$3 timeout=$4 count=$5 first=$6 rc=0 append=()
    shift 6
    [ "$first" -gt 1 ] && append=(--append)
    if [ "$count" = 1 ]; then log "$sys: trial $first"; else log "$sys: trials $first to $(( first + count - 1 ))"; fi
    $PIN_LOADGEN python3 "$ROOT/scripts/election-trials.py" --kind "$kind" --system "$sys" \
        --trials "$count" --first-trial "$first" "${append[@]}" --csv "$OUT/$sys.csv" --logs "$TMP/logs/$sys" \
        --name-prefix "$sys" --timeout-s "$timeout" --kill-spread-ms "$spread" "$@" &
    PID[driver]=$!
    wait "${PID[driver]}" || rc=$?
    PID[driver]=""
    if [ "$rc" != 0 ]; then
        FAILED=1
        mkdir -p "$OUT/logs-$sys"
        cp -r "$TMP/logs/$sys/." "$OUT/logs-$sys/" 2>/dev/null || true
        log "$sys: some trial failed (the clients' stderr: $OUT/logs-$sys)"
    fi
}
spread() { # bound_ms: the kill's random delay bound (none in smoke mode)
    if [ "$SMOKE" = 1 ]; then echo 0; else echo "$1"; fi
}

if want ringlock; then
    ports_free "$RL_SINGLE" "$((RL_SINGLE + 1))" "$((RL_SINGLE + 2))"
    $PIN_SERVER "$BIN/ringlockd" --bind "127.0.0.1:$RL_SINGLE" --admin-bind "127.0.0.1:$((RL_SINGLE + 1))" \
        --metrics-bind "127.0.0.1:$((RL_SINGLE + 2))" 2>"$TMP/ringlockd.log" &
    PID[server]=$!
    wait_port "$RL_SINGLE" 20 "${PID[server]}" || { log "ringlockd did not start: $(tail -c 300 "$TMP/ringlockd.log")"; exit 1; }
    trials ringlock ringlock "$(spread 200)" 30 "$TRIALS" 1 --ringlock "$BIN/ringlock" \
        --addr "127.0.0.1:$RL_SINGLE" --metrics "127.0.0.1:$((RL_SINGLE + 2))"
    stop_proc server
fi

if want ringlock-cluster; then
    start_rl_cluster "$TMP/rlc" || exit 1
    CLUSTER_LEADER=$(rl_leader) || { log "the cluster has no leader"; exit 1; }
    METRICS=""
    for n in 1 2 3; do METRICS="$METRICS${METRICS:+,}127.0.0.1:$(( RL_PORT[n] + 2 ))"; done
    trials ringlock-cluster ringlock "$(spread 200)" 30 "$TRIALS" 1 --ringlock "$BIN/ringlock" --addr "$NODES" --metrics "$METRICS"
    # The same node led throughout (the trials measured no server failover).
    LEADER_AFTER=$(rl_leader) || LEADER_AFTER="none"
    stop_rl_cluster
fi

# The leader's host dies: kill -9 of A's process and, at the same instant,
# of the node that leads the cluster (A's session is served there). B's
# client resumes its session on the new leader; A's session ends when the
# new leader has heard nothing from it for its keep-alive deadline. The
# killed node is restarted on its data path after each trial, and the next
# one waits until all three answer.
if want ringlock-cluster-host; then
    start_rl_cluster "$TMP/rlh" || exit 1
    METRICS=""
    for n in 1 2 3; do METRICS="$METRICS${METRICS:+,}127.0.0.1:$(( RL_PORT[n] + 2 ))"; done
    HOST_LEADERS=""
    for t in $(seq 1 "$TRIALS"); do
        l=$(rl_leader) || { log "the cluster has no leader"; FAILED=1; break; }
        HOST_LEADERS="$HOST_LEADERS${HOST_LEADERS:+ }$l"
        trials ringlock-cluster-host ringlock "$(spread $(( RL_KEEPALIVE_MS / 3 )))" $(( RL_KEEPALIVE_MS / 1000 + 30 )) 1 "$t" \
            --ringlock "$BIN/ringlock" --addr "$NODES" --metrics "$METRICS" --kill-also "${PID[rl$l]}"
        # It was killed (or the trial failed before the kill): gone either way.
        stop_proc "rl$l"
        start_rl_node "$l" "$TMP/rlh/n$l"
        wait_port "${RL_PORT[$l]}" 30 "${PID[rl$l]}" || { log "node $l did not restart: $(tail -c 400 "$TMP/rlh/n$l/log")"; FAILED=1; break; }
    done
    stop_rl_cluster
fi

etcd_start() {
    ports_free "$ETCD_PORT" "$((ETCD_PORT + 1))" || return 1
    mkdir -p "$TMP/etcd"
    # The heartbeat and election timeout are etcd's defaults, written out:
    # they set its minimum lease TTL (1.5 x the election timeout).
    $PIN_SERVER etcd --name e1 --data-dir "$TMP/etcd/data" --heartbeat-interval 100 --election-timeout 1000 \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
        --initial-cluster "e1=http://127.0.0.1:$((ETCD_PORT + 1))" >>"$TMP/etcd/log" 2>&1 &
    PID[etcd]=$!
    wait_port "$ETCD_PORT" 30 "${PID[etcd]}" || { log "etcd did not start: $(tail -c 400 "$TMP/etcd/log")"; return 1; }
    # Serving (a leader elected, the gateway up): a lease grant works.
    local _
    for _ in $(seq 1 100); do
        http "$ETCD_PORT" POST /v3/maintenance/status '{}' | grep -q '"leader"' && return 0
        sleep 0.1
    done
    log "etcd does not serve: $(tail -c 400 "$TMP/etcd/log")"; return 1
}
# The TTL etcd grants a lease asked for with TTL s (then revoked).
etcd_granted_ttl() { # ttl
    local r id ttl
    r=$(http "$ETCD_PORT" POST /v3/lease/grant "{\"TTL\":$1}")
    id=$(echo "$r" | sed -n 's/.*"ID":"\([0-9]*\)".*/\1/p')
    ttl=$(echo "$r" | sed -n 's/.*"TTL":"\([0-9]*\)".*/\1/p')
    [ -n "$id" ] && http "$ETCD_PORT" POST /v3/lease/revoke "{\"ID\":$id}" >/dev/null
    echo "${ttl:-?}"
}

ELECT_TTL=60 # concurrency.NewSession's default: etcdctl elect sets none
LOCK_GRANTED="?"
if want etcd || want etcd-lock; then
    etcd_start || exit 1
    LOCK_GRANTED=$(etcd_granted_ttl "$LOCK_TTL")
    if want etcd; then
        trials etcd etcd-elect "$(spread $(( ELECT_TTL * 1000 / 3 )))" $(( ELECT_TTL + 30 )) "$TRIALS" 1 \
            --etcdctl etcdctl --endpoint "127.0.0.1:$ETCD_PORT"
    fi
    if want etcd-lock; then
        ttl=$LOCK_TTL
        case "$LOCK_GRANTED" in ''|*[!0-9]*) ;; *) [ "$LOCK_GRANTED" -gt "$ttl" ] && ttl=$LOCK_GRANTED ;; esac
        trials etcd-lock etcd-lock "$(spread $(( ttl * 1000 / 3 )))" $(( ttl + 30 )) "$TRIALS" 1 \
            --etcdctl etcdctl --endpoint "127.0.0.1:$ETCD_PORT" --lock-ttl "$LOCK_TTL"
    fi
    stop_proc etcd
fi

# ---------------------------------------------------------------- report
python3 - "$OUT" "$SYSTEMS" "$LOCK_TTL" "$RL_KEEPALIVE_MS" >"$OUT/latest.md" <<'EOF'
import csv, math, os, sys
out, systems, lock_ttl, keepalive_ms = sys.argv[1], sys.argv[2].split(), sys.argv[3], int(sys.argv[4])
def load(s):
    p = os.path.join(out, f"{s}.csv")
    return list(csv.DictReader(open(p))) if os.path.exists(p) else []
def q(xs, f):  # nearest rank
    xs = sorted(xs)
    return xs[max(0, math.ceil(f * len(xs)) - 1)] if xs else None
def ms(x):
    if x is None:
        return "n/a"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"
def ratio(a, b):
    return f"{a / b:.2g}" if a is not None and b else "n/a"
names = {
    "ringlock": "ringlock, 1 node (in memory)",
    "ringlock-cluster": "ringlock, 3-node cluster",
    "ringlock-cluster-host": "ringlock, 3-node cluster, A's host dies (A + the leader node)",
    "etcd": "etcd, `etcdctl elect`",
    "etcd-lock": f"etcd, `etcdctl lock --ttl {lock_ttl}`",
}
stats = {}
for s in systems:
    rows = load(s)
    ok = [r for r in rows if not r["error"] and r["elected_ms"] and r["told_ms"]]
    el = [float(r["elected_ms"]) for r in ok]
    to = [float(r["told_ms"]) for r in ok]
    ttls = sorted({r["granted_ttl_s"] for r in rows if r["granted_ttl_s"]})
    stats[s] = dict(n=len(rows), ok=len(ok), el=[q(el, .5), q(el, .99), max(el) if el else None],
                    to=[q(to, .5), q(to, .99), max(to) if to else None], ttl="/".join(ttls))
ref = stats.get("etcd") or stats.get("etcd-lock")
ref_name = "etcd elect" if "etcd" in stats else "etcd-lock"
print(f"| system | A's campaign ends on | trials ok | elected p50 / p99 / max ms | observer told p50 / p99 / max ms"
      f" | p99 ringlock/{ref_name}: elected, told |")
print("|---|---|---|---|---|---|")
for s in systems:
    st = stats[s]
    if st["ttl"]:
        ttl = f"its lease's expiry: TTL {st['ttl']} s (granted)"
    elif s == "ringlock-cluster-host":
        ttl = f"no word for {keepalive_ms / 1000:g} s (keep-alive)"
    else:
        ttl = "its connection's close"
    rat = (f"{ratio(st['el'][1], ref['el'][1])}, {ratio(st['to'][1], ref['to'][1])}"
           if ref and s.startswith("ringlock") else "")
    print(f"| {names[s]} | {ttl} | {st['ok']}/{st['n']} | {' / '.join(ms(x) for x in st['el'])}"
          f" | {' / '.join(ms(x) for x in st['to'])} | {rat} |")
if "etcd" in stats and "etcd-lock" in stats:
    print()
    for s in systems:
        if s.startswith("ringlock"):
            st, lk = stats[s], stats["etcd-lock"]
            print(f"- p99 {s}/etcd-lock: elected {ratio(st['el'][1], lk['el'][1])}, told {ratio(st['to'][1], lk['to'][1])}")
EOF
{
    echo
    echo "- a trial: observer starts, A campaigns and is elected, B campaigns and is queued, then kill -9 of A's client process (ringlock elect / etcdctl); elected = kill -> B's first output line (ringlock, etcdctl lock: B's CMD printed; etcdctl elect: it printed its win), observer told = kill -> the observer's first line naming B; CLOCK_MONOTONIC, read by the driver from the clients' pipes"
    echo "- kill delay after B was queued: uniform in [0, 200 ms) for ringlock, [0, TTL/3) for etcd (etcdctl renews its lease every TTL/3)$(want ringlock-cluster-host && echo ", [0, keep-alive/3) for ringlock-cluster-host (A pings every third of it)")$( [ "$SMOKE" = 1 ] && echo "; smoke mode: none" )"
    echo "- ringlockd: $RL_VERSION; ringlock: 1 node in memory; ringlock-cluster: 3 nodes, peer mutual TLS, WAL per node, every client given all three (sessions go to the leader)$( [ -n "${CLUSTER_LEADER:-}" ] && echo "; leader node $CLUSTER_LEADER before the trials, $LEADER_AFTER after" )"
    if want ringlock-cluster-host; then
        echo "- ringlock-cluster-host: kill -9 of A's process and of the leader node at once (A's session served there); B's session resumed on the new leader; A's session ends after ${RL_KEEPALIVE_MS} ms without word (ringlockd's default keep-alive); leader node killed per trial: ${HOST_LEADERS:-none}, restarted after each"
    fi
    echo "- etcd $ETCD_VERSION (etcdctl $ETCDCTL_VERSION), one member, --heartbeat-interval 100 --election-timeout 1000 (defaults); etcd: \`etcdctl elect\` has no TTL flag (etcdctl 3.4: only --listen), its session's TTL is concurrency.NewSession's default, $ELECT_TTL s; etcd-lock: \`etcdctl lock --ttl $LOCK_TTL\` (etcdctl's lowest: 0 or less means 60 s), etcd granted $LOCK_GRANTED s (its minimum lease TTL is 1.5 x the election timeout, rounded up); etcdctl lock leaves A's CMD running after its kill -9"
    echo "- machine: $(nproc) CPUs ($CPU_MODEL), $KERNEL, load average at the end $(cut -d' ' -f1-3 /proc/loadavg); pinning: $PINNING; disk: $FSYNC"
    echo "- $TRIALS trials per system; p99 nearest-rank (the largest with up to 100 trials); raw: SYSTEM.csv"
} >>"$OUT/latest.md"
cat "$OUT/latest.md"

if [ "$SMOKE" = 1 ]; then
    for s in $SYSTEMS; do
        python3 - "$OUT/$s.csv" "$TRIALS" "$s" <<'EOF' || { log "smoke: $s did not give both times in every trial"; FAILED=1; }
import csv, sys
path, n, s = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = list(csv.DictReader(open(path)))
bad = [r for r in rows if r["error"] or not r["elected_ms"] or not r["told_ms"]]
# ringlock's CMD dies with its killed CLI: A's stdout closed.
if s.startswith("ringlock"):
    bad += [r for r in rows if not r["a_gone_ms"]]
for r in bad:
    print(f"smoke: {s} trial {r['trial']}: {r}", file=sys.stderr)
sys.exit(0 if len(rows) == n and not bad else 1)
EOF
    done
fi
exit "$FAILED"
