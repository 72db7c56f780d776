#!/usr/bin/env bash
# What TLS costs ringlockd's session protocol: one server binary (this
# tree's release build) started the same way with and without --certs-dir,
# the load generator speaking plaintext or TLS 1.3 to it, runs alternated
# (plaintext, TLS, plaintext, TLS, ...) in one session, server pinned to
# CPU 1 and the load generator to CPU 0, ringlockd --threads 1.
#
#   scripts/tls-bench.sh [--smoke] [--rounds N] [--profile release|debug]
#
# a. Session lock+unlock on persistent connections, closed loop:
#    `one`: 1 client (lock p50/p99), `c64`: 64 clients, 1000 keys
#    (throughput, p99). Also the server's CPU per cycle (/proc/PID/stat).
# b. A handshake storm: 16 established session clients run an open loop
#    at a fixed rate (EST_RATE, default 1600 cycles/s) while a second load
#    generator opens STORM_N (default 1000) new session connections,
#    STORM_CONC (default 100) at a time, each a Hello, one lock+unlock and
#    a close (--conn-mode per-cycle --cycles STORM_N). Reported: the
#    established clients' lock p99 before, during and after the storm
#    (their --latency-log cut at the storm's start and end), the storm's
#    duration, its handshake cost per connection on the client (connect
#    start to TLS handshake done: p50/p99/max) and on the server (the
#    increase of ringlock_tls_handshake_seconds_total over that of
#    ringlock_tls_handshakes_total{result="ok"}, from --metrics-bind).
#    The plaintext storm (the same 1000 connections without TLS) is the
#    baseline: what connection churn alone costs.
#
# One line per run, then a summary: per case the median over the rounds
# of each figure, plaintext and TLS, and their ratio (TLS / plaintext).
# The storm's load generator runs on CPU 2 when there is one (else CPU 0,
# beside the established clients' load generator: their latency during
# the storm then includes that CPU's contention; the header says so).
#
# --smoke (or TLS_BENCH_SMOKE=1): one round, every case about a second, a
# storm of 100 connections, debug build (--profile release to change);
# checks that the script works (scripts/test.sh runs it), not a
# measurement. Exits 1 if a run had errors or produced no figures. Env: ROUNDS (default 3), DURATION (default 5s), WARMUP
# (1s), EST_RATE, STORM_N, STORM_CONC, SERVER_CPU (1), LOADGEN_CPU (0),
# STORM_CPU, PORT (26319; +1 admin, +2 metrics), KEEP=1 keeps the temp
# dir (certificates, JSON, latency logs).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SMOKE=${TLS_BENCH_SMOKE:-0}
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke) SMOKE=1 ;;
        --rounds) ROUNDS="$2"; shift ;;
        --profile) PROFILE="$2"; shift ;;
        -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
if [ "$SMOKE" = 1 ]; then
    ROUNDS=${ROUNDS:-1}; DURATION=${DURATION:-1s}; WARMUP=${WARMUP:-200ms}
    STORM_N=${STORM_N:-100}; STORM_CONC=${STORM_CONC:-20}
    BEFORE=1; AFTER=1; STORM_ALLOW=2; EST_WARM=0.2; PROFILE=${PROFILE:-debug}
else
    ROUNDS=${ROUNDS:-3}; DURATION=${DURATION:-5s}; WARMUP=${WARMUP:-1s}
    STORM_N=${STORM_N:-1000}; STORM_CONC=${STORM_CONC:-100}
    BEFORE=3; AFTER=3; STORM_ALLOW=6; EST_WARM=1; PROFILE=${PROFILE:-release}
fi
case "$PROFILE" in release) CARGO_PROFILE=(--release) ;; debug) CARGO_PROFILE=() ;;
    *) echo "--profile is release or debug" >&2; exit 2 ;; esac
EST_RATE=${EST_RATE:-1600}
PORT=${PORT:-26319}
NCPU=$(nproc)
SERVER_CPU=${SERVER_CPU:-1}; LOADGEN_CPU=${LOADGEN_CPU:-0}
if [ -z "${STORM_CPU:-}" ]; then
    if [ "$NCPU" -ge 3 ]; then STORM_CPU=2; else STORM_CPU=$LOADGEN_CPU; fi
fi
if [ "$NCPU" -ge 2 ]; then
    PIN_SRV=(taskset -c "$SERVER_CPU"); PIN_LG=(taskset -c "$LOADGEN_CPU"); PIN_STORM=(taskset -c "$STORM_CPU")
    PINNING="server CPU $SERVER_CPU, load generator CPU $LOADGEN_CPU, storm load generator CPU $STORM_CPU"
    [ "$STORM_CPU" = "$LOADGEN_CPU" ] && PINNING="$PINNING (shared with the established clients: $NCPU CPUs)"
else
    PIN_SRV=(); PIN_LG=(); PIN_STORM=(); PINNING="no pinning (1 CPU)"
fi

(cd "$ROOT" && cargo build "${CARGO_PROFILE[@]}" --locked -q -p ringlock --bin ringlockd --bin ringlock &&
    cargo build "${CARGO_PROFILE[@]}" --locked -q -p ringlock-loadgen)
T=${CARGO_TARGET_DIR:-$ROOT/target}
SRV=$T/$PROFILE/ringlockd
CLI=$T/$PROFILE/ringlock
LG=$T/$PROFILE/ringlock-loadgen

WT=$(mktemp -d /tmp/ringlock-tls-bench.XXXXXX)
P=; EST=
cleanup() {
    [ -n "$EST" ] && kill "$EST" 2>/dev/null || true
    [ -n "$P" ] && kill "$P" 2>/dev/null || true
    if [ "${KEEP:-0}" = 1 ]; then echo "# kept $WT" >&2; else rm -rf "$WT"; fi
}
trap cleanup EXIT
CERTS=$WT/certs
"$CLI" cert create-ca --certs-dir "$CERTS" --ca-key "$WT/ca.key" >/dev/null 2>&1
"$CLI" cert create-node --certs-dir "$CERTS" --ca-key "$WT/ca.key" --node-id 1 127.0.0.1 localhost >/dev/null 2>&1
TARGET=ringlock-session://127.0.0.1:$PORT
RESULTS=$WT/results.tsv
: >"$RESULTS"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_server() { # plain|tls
    local certs=()
    [ "$1" = tls ] && certs=(--certs-dir "$CERTS")
    # The previous server's listener may outlive it briefly.
    for _ in $(seq 100); do port_open "$PORT" || break; sleep 0.05; done
    "${PIN_SRV[@]}" "$SRV" --threads 1 --bind "127.0.0.1:$PORT" --admin-bind "127.0.0.1:$((PORT + 1))" \
        --metrics-bind "127.0.0.1:$((PORT + 2))" "${certs[@]}" >"$WT/server.log" 2>&1 &
    P=$!
    for _ in $(seq 100); do port_open "$PORT" && return 0; sleep 0.05; done
    echo "ringlockd ($1) did not listen:" >&2; cat "$WT/server.log" >&2; exit 1
}

stop_server() { kill "$P"; wait "$P" 2>/dev/null || true; P=; }

tls_args() { [ "$1" = tls ] && echo "--tls-certs-dir $CERTS" || true; }

# The server's TLS handshake counters: "ok_count seconds_total".
handshake_metrics() {
    python3 - "$((PORT + 2))" <<'EOF'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
ok = secs = 0.0
for line in body.splitlines():
    if line.startswith('ringlock_tls_handshakes_total{result="ok"}'):
        ok = float(line.split()[-1])
    elif line.startswith("ringlock_tls_handshake_seconds_total"):
        secs = float(line.split()[-1])
print(ok, secs)
EOF
}

run_a() { # case mode round loadgen-args...
    local case=$1 mode=$2 round=$3 t0 t1
    shift 3
    start_server "$mode"
    t0=$(awk '{print $14+$15}' "/proc/$P/stat")
    # shellcheck disable=SC2046
    "${PIN_LG[@]}" "$LG" --target "$TARGET" $(tls_args "$mode") "$@" --duration "$DURATION" \
        --warmup "$WARMUP" --key-prefix "$case" --no-progress --json >"$WT/lg.out" 2>"$WT/lg.err" || true
    t1=$(awk '{print $14+$15}' "/proc/$P/stat")
    stop_server
    tail -1 "$WT/lg.out" | python3 -c "
import json, sys
try:
    d = json.loads(sys.stdin.read())
except ValueError:
    sys.exit('$case $mode: no JSON from the load generator: ' + open('$WT/lg.err').read()[-500:])
l, c, h = d['latency_us'], d['cycle_us'], d['handshake_us']
cpu = ($t1 - $t0) * 1e6 / $TICKS / max(d['cycles_all'], 1)
print('$case', '$mode', 'round=$round', 'cycles/s=%.0f' % d['ops_per_sec'],
      'lock_p50_us=%.1f' % l['p50'], 'lock_p99_us=%.1f' % l['p99'], 'cycle_p99_us=%.1f' % c['p99'],
      'errors=%d' % d['errors'], 'server_cpu_us/cycle=%.2f' % cpu,
      'conn_p50_us=%.0f' % h['p50'], 'conns=%d' % h['count'])
with open('$RESULTS', 'a') as f:
    for k, v in [('cycles/s', d['ops_per_sec']), ('lock p50 us', l['p50']), ('lock p99 us', l['p99']),
                 ('cycle p99 us', c['p99']), ('server CPU us/cycle', cpu), ('errors', d['errors'])]:
        f.write('\t'.join(['$case', k, '$mode', repr(float(v))]) + '\n')
"
    [ -s "$WT/lg.err" ] && tail -2 "$WT/lg.err" >&2 || true
}

run_storm() { # mode round
    local mode=$1 round=$2 est_dur hs0 hs1
    start_server "$mode"
    est_dur=$(python3 -c "print($BEFORE + $STORM_ALLOW + $AFTER)")
    # shellcheck disable=SC2046
    "${PIN_LG[@]}" "$LG" --target "$TARGET" $(tls_args "$mode") --connections 16 --dist private \
        --keys 16 --key-prefix est --rate "$EST_RATE" --warmup "${EST_WARM}s" --duration "${est_dur}s" \
        --latency-log "$WT/est.log" --no-progress --json >"$WT/est.out" 2>"$WT/est.err" &
    EST=$!
    sleep "$(python3 -c "print($EST_WARM + $BEFORE)")"
    hs0=$(handshake_metrics)
    # shellcheck disable=SC2046
    "${PIN_STORM[@]}" "$LG" --target "$TARGET" $(tls_args "$mode") --conn-mode per-cycle \
        --connections "$STORM_CONC" --cycles "$STORM_N" --dist private --keys "$STORM_CONC" \
        --key-prefix storm --warmup 0 --duration 60s --no-progress --json >"$WT/storm.out" 2>"$WT/storm.err" || true
    hs1=$(handshake_metrics)
    wait "$EST" || true
    EST=
    stop_server
    python3 - "$mode" "$round" "$hs0" "$hs1" "$WT" "$RESULTS" <<'EOF'
import json, sys
mode, rnd, hs0, hs1, wt, results = sys.argv[1:7]
def last_json(path):
    try:
        return json.loads(open(path).read().strip().splitlines()[-1])
    except (ValueError, IndexError):
        sys.exit(f"storm {mode}: no JSON in {path}: " + open(path.replace('.out', '.err')).read()[-500:])
est, storm = last_json(f"{wt}/est.out"), last_json(f"{wt}/storm.out")
s0, s1 = storm["run_start_mono_ns"], storm["run_end_mono_ns"]
samples = [tuple(map(int, l.split())) for l in open(f"{wt}/est.log")]
def p99(xs):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, -(-99 * len(xs) // 100) - 1))] / 1e3
win = {"before": [v for t, v in samples if t < s0],
       "during": [v for t, v in samples if s0 <= t <= s1],
       "after": [v for t, v in samples if t > s1]}
dur = (s1 - s0) / 1e9
(ok0, sec0), (ok1, sec1) = map(float, hs0.split()), map(float, hs1.split())
srv_hs = (sec1 - sec0) / (ok1 - ok0) * 1e6 if ok1 > ok0 else float("nan")
h = storm["handshake_us"]
fig = {"est p99 before us": p99(win["before"]), "est p99 during us": p99(win["during"]),
       "est p99 after us": p99(win["after"]), "storm s": dur,
       "storm conn/s": storm["connects"] / dur if dur > 0 else float("nan"),
       "client hs p50 us": h["p50"], "client hs p99 us": h["p99"], "client hs max us": h["max"],
       "server hs us/conn": srv_hs, "errors": est["errors"] + storm["errors"]}
def fmt(v, key=""):
    return f"{v:.0f}" if key == "errors" else f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
print("storm", mode, f"round={rnd}",
      " ".join(f"{k.replace(' ', '_')}={fmt(v, k)}" for k, v in fig.items()),
      f"est_samples={len(win['before'])}/{len(win['during'])}/{len(win['after'])}",
      f"storm_conns={storm['connects']} server_hs_ok={ok1 - ok0:.0f}")
if not win["after"]:
    print(f"# storm {mode}: no established sample after the storm (longer than the {wt} run allowed)")
with open(results, "a") as f:
    for k, v in fig.items():
        f.write("\t".join(["storm", k, mode, repr(float(v))]) + "\n")
EOF
    for f in est storm; do [ -s "$WT/$f.err" ] && tail -2 "$WT/$f.err" >&2 || true; done
}

TICKS=$(getconf CLK_TCK)
echo "# tls-bench $(git -C "$ROOT" rev-parse --short HEAD), $PROFILE build$( [ "$SMOKE" = 1 ] && echo ', SMOKE (not a measurement)'): ringlockd --threads 1, session protocol, $PINNING"
echo "# a: closed loop, persistent, $DURATION after $WARMUP warm-up; one = 1 client, c64 = 64 clients x 1000 keys"
echo "# b: 16 established clients at $EST_RATE cycles/s (open loop); storm = $STORM_N new connections (per-cycle), $STORM_CONC at a time"
for round in $(seq "$ROUNDS"); do
    for mode in plain tls; do
        run_a one "$mode" "$round" --connections 1 --dist private --keys 1 --rate 0
        run_a c64 "$mode" "$round" --connections 64 --dist uniform --keys 1000 --rate 0
        run_storm "$mode" "$round"
    done
done
echo "# summary: median of $ROUNDS round(s); ratio = tls / plain"
python3 - "$RESULTS" <<'EOF'
import sys, statistics
from collections import OrderedDict
rows = OrderedDict()
for line in open(sys.argv[1]):
    case, key, mode, v = line.rstrip("\n").split("\t")
    rows.setdefault((case, key), {}).setdefault(mode, []).append(float(v))
def fmt(v, key=""):
    return f"{v:.0f}" if key == "errors" else f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
print(f"{'case':<6} {'figure':<22} {'plain':>12} {'tls':>12} {'ratio':>8}")
for (case, key), by in rows.items():
    med = {m: statistics.median(v) for m, v in by.items()}
    p, t = med.get("plain", float("nan")), med.get("tls", float("nan"))
    ratio = f"{t / p:.2f}" if p and p == p and t == t else "-"
    print(f"{case:<6} {key:<22} {fmt(p, key):>12} {fmt(t, key):>12} {ratio:>8}")
bad = sorted({case for (case, key), by in rows.items() if key == "errors"
              and any(v > 0 for vs in by.values() for v in vs)})
if bad:
    sys.exit(f"tls-bench: errors in {', '.join(bad)} (see the lines above)")
EOF
