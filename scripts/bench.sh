#!/usr/bin/env bash
# Side-by-side lock-service benchmark: ringlockd (also with --threads 1 and
# 2, and over its session protocol) against a floor server, the original
# Locking-Center, Redis, PostgreSQL, MariaDB and etcd (two ways: its v3 lock
# API through the gRPC-JSON gateway, and its own Go client over native
# gRPC), same machine, same run, same load.
#
#   scripts/bench.sh [--quick] [--repeat N] [--no-install] [--out DIR]
#                    [--systems "floor ringlockd redis ..."] [--scenarios "uncontended-1 ..."]
#                    [--server-cpus LIST] [--loadgen-cpus LIST] [--loadgen-threads N]
#
# Installs missing peers with apt-get (Debian), builds the original
# Locking-Center from LOCKING_CENTER_SRC (a clone; skipped with a note when
# unset), starts every server on loopback with its data in a temp dir, pins
# servers to CPU 1 and the load generator to CPU 0 (taskset; --server-cpus,
# --loadgen-cpus change that), runs the scenario matrix scenario by scenario
# (all systems back to back, so machine drift hits them alike), stops
# everything and writes bench/results/{latest.md,*.svg,raw/}.
# etcd: `etcd` is driven by ringlock-loadgen --target etcd:// (the v3 lock
# API through the gRPC-JSON gateway, HTTP/1.1); `etcd-native` by
# bench/peers/etcd-native (etcd 3.4's clientv3 concurrency.Mutex over native
# gRPC, built offline from Debian's golang-etcd-server-dev in GOPATH mode;
# same command line and JSON line as ringlock-loadgen). Both servers run with
# the settings in scripts/lib/peers.sh (etcd's tuning guidance, fsync on).
# For a quick check of just those: --quick --systems "floor etcd etcd-native"
# --scenarios "persistent-64 durable-16".
# --repeat N runs the whole matrix N times (rounds) and reports, per system
# and scenario, the round with the median p99 plus the p99 range.
# See docs/bench.md.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
QUICK=0
INSTALL=1
REPEAT=""
SYSTEMS="floor ringlockd ringlockd-nopoll ringlockd-session ringlockd-t1 ringlockd-t2 ringlockd-durable locking-center redis redis-aof postgres mariadb etcd etcd-native"
SCENARIOS=""
OUT="$ROOT/bench/results"
SERVER_CPUS=""
LOADGEN_CPUS=""
LOADGEN_THREADS=1
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --no-install) INSTALL=0 ;;
        --systems) SYSTEMS="$2"; shift ;;
        --scenarios) SCENARIOS="$2"; shift ;;
        --out) OUT="$2"; shift ;;
        --repeat) REPEAT="$2"; shift ;;
        --server-cpus) SERVER_CPUS="$2"; shift ;;
        --loadgen-cpus) LOADGEN_CPUS="$2"; shift ;;
        --loadgen-threads) LOADGEN_THREADS="$2"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

# Full: two rounds of 5 s per run (the shared 2-vCPU machine has bursts of
# foreign load; the report keeps the better-p99 round and shows both).
if [ "$QUICK" = 1 ]; then DURATION=3s; WARMUP=1s; REPEAT=${REPEAT:-1}
else DURATION=5s; WARMUP=1s; REPEAT=${REPEAT:-2}; fi

# Scenario matrix: id | title | loadgen arguments (target added per system).
# Rates are fixed per scenario and identical for every system (open loop);
# a system that cannot keep up shows it as achieved < target and as latency.
# Keys are 'private' (client i uses key i) where the scenario says
# uncontended, so no two clients ever meet on a key.
SCENARIO_TABLE=$(cat <<'EOF'
uncontended-1|Uncontended lock+unlock, connection per request, 1 client, 1000 cycles/s|--conn-mode per-request --connections 1 --dist private --keys 1 --rate 1000
uncontended-16|Uncontended lock+unlock, connection per request, 16 clients, 4000 cycles/s|--conn-mode per-request --connections 16 --dist private --keys 16 --rate 4000
persistent-64|Persistent connections, 64 clients, 1000 keys uniform, 10000 cycles/s|--conn-mode persistent --connections 64 --dist uniform --keys 1000 --rate 10000
persistent-64-max|Persistent connections, 64 clients, 1000 keys uniform, closed loop (max throughput)|--conn-mode persistent --connections 64 --dist uniform --keys 1000 --rate 0
hot-key-64|One hot key, 64 clients, persistent, 2000 cycles/s|--conn-mode persistent --connections 64 --dist hot --keys 1 --rate 2000
hot-key-64-max|One hot key, 64 clients, persistent, closed loop (hand-off throughput, fairness)|--conn-mode persistent --connections 64 --dist hot --keys 1 --rate 0
durable-16|Durable mode, 16 clients, 1000 keys, persistent, 2000 cycles/s|--conn-mode persistent --connections 16 --dist uniform --keys 1000 --rate 2000
churn-8-max|Connection churn: a new connection per request, 8 clients, private keys, closed loop|--conn-mode per-request --connections 8 --dist private --keys 8 --rate 0
churn-64-max|Connection churn: a new connection per request, 64 clients, private keys, closed loop|--conn-mode per-request --connections 64 --dist private --keys 64 --rate 0
EOF
)
[ -n "$SCENARIOS" ] || SCENARIOS=$(echo "$SCENARIO_TABLE" | cut -d'|' -f1 | tr '\n' ' ')

case "$LOADGEN_THREADS" in ''|*[!0-9]*|0) echo "--loadgen-threads must be a positive integer" >&2; exit 2 ;; esac
NCPU=$(nproc)
if [ "$NCPU" -ge 2 ] || [ -n "$SERVER_CPUS$LOADGEN_CPUS" ]; then
    SERVER_CPUS=${SERVER_CPUS:-1}; LOADGEN_CPUS=${LOADGEN_CPUS:-0}
    PIN_SERVER="taskset -c $SERVER_CPUS"; PIN_LOADGEN="taskset -c $LOADGEN_CPUS"
    PINNING="servers on CPU $SERVER_CPUS, load generator on CPU $LOADGEN_CPUS (taskset)"
else
    PIN_SERVER=""; PIN_LOADGEN=""; PINNING="none (1 CPU)"
fi
if [ "$LOADGEN_THREADS" -gt 1 ]; then
    PINNING="$PINNING; load generator with --threads $LOADGEN_THREADS${LOADGEN_CPUS:+ --pin-cpus $LOADGEN_CPUS}"
fi
CLK_TCK=$(getconf CLK_TCK)

TMP=$(mktemp -d /tmp/ringlock-bench.XXXXXX)
chmod 755 "$TMP"
RAW="$OUT/raw"
rm -rf "$RAW"
mkdir -p "$RAW"
declare -A PID
log() { echo "[bench $(date +%T)] $*" >&2; }
# shellcheck source=scripts/lib/peers.sh
. "$ROOT/scripts/lib/peers.sh"

cleanup() {
    # Only servers this script started and has not stopped yet: a stopped
    # server's PID may already belong to someone else's process.
    local s
    for s in "${!PID[@]}"; do
        [ -n "${PID[$s]}" ] && stop_system "$s"
    done
    rm -rf "$TMP"
}
trap cleanup EXIT

# ---------------------------------------------------------------- install
want() { case " $SYSTEMS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if [ "$INSTALL" = 1 ]; then
    pkgs=""
    # The original Locking-Center is built from source with Debian's Go and
    # its one dependency packaged (GOPATH mode: no module download).
    if want locking-center && [ -n "${LOCKING_CENTER_SRC:-}" ]; then
        command -v go >/dev/null || pkgs="$pkgs golang-go"
        [ -d /usr/share/gocode/src/github.com/google/uuid ] || pkgs="$pkgs golang-github-google-uuid-dev"
    fi
    { want redis || want redis-aof; } && ! command -v redis-server >/dev/null && pkgs="$pkgs redis-server"
    want postgres && ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && pkgs="$pkgs postgresql"
    want mariadb && ! command -v mariadbd >/dev/null && ! command -v mysqld >/dev/null && pkgs="$pkgs mariadb-server"
    want etcd && ! command -v etcd >/dev/null && pkgs="$pkgs etcd-server"
    # etcd-native: etcd-server, golang-go, golang-etcd-server-dev (its
    # client sources, grpc ... under /usr/share/gocode).
    want etcd-native && pkgs="$pkgs $(peer_packages etcd-native | tr '\n' ' ')"
    pkgs=$(echo "$pkgs" | tr ' ' '\n' | sort -u | tr '\n' ' ' | sed 's/^ *//; s/ *$//')
    if [ -n "$pkgs" ]; then
        log "installing: $pkgs"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
    fi
fi

# ---------------------------------------------------------------- build
log "building release binaries"
(cd "$ROOT" && cargo build --release -q -p ringlock-loadgen -p ringlock-bench)
BIN="$ROOT/target/release"
RINGLOCKD_BUILD="built from this tree"
if ! (cd "$ROOT" && cargo build --release -q -p ringlock); then
    # A shared working tree can be mid-edit; an earlier binary is still
    # worth measuring, and the report says which one it was.
    [ -x "$BIN/ringlockd" ] || { echo "ringlockd does not build and no earlier binary exists" >&2; exit 1; }
    RINGLOCKD_BUILD="tree did not compile; measured the earlier binary built $(date -u -r "$BIN/ringlockd" +%Y-%m-%dT%H:%M:%SZ)"
    log "WARNING: ringlock did not build; using $RINGLOCKD_BUILD"
fi
LOADGEN="$BIN/ringlock-loadgen"
# etcd-native's client: a missing package or a failed build stops the run
# (it is never skipped).
if want etcd-native; then
    need_peer "$INSTALL" etcd-native || exit 1
    log "building etcd-native-loadgen (Debian's Go, GOPATH mode, offline)"
    build_etcd_native || exit 1
fi

# ---------------------------------------------------------------- servers
# Each (round, scenario, system) run gets a freshly started server with an
# empty data dir, and only that one server runs: no state (queued waiters,
# leases, WAL) and no background work of another system leaks into a run.
PORT_FLOOR=24129; PORT_RL=24119; PORT_RLS=24169; PORT_RLD=24139; PORT_RLT1=24149; PORT_RLT2=24159; PORT_LC=24179; PORT_RLNP=24189
PORT_REDIS=24379; PORT_REDIS_AOF=24380; PORT_PG=24432; PORT_MY=24306; PORT_ETCD=24390; PORT_ETCDN=24392

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { # port seconds pid
    local i
    for i in $(seq 1 $(( $2 * 10 ))); do
        port_open "$1" && return 0
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

declare -A TARGET NOTE VERSION PORT WHY
PORT=([floor]=$PORT_FLOOR [ringlockd]=$PORT_RL [ringlockd-session]=$PORT_RLS [ringlockd-durable]=$PORT_RLD [ringlockd-t1]=$PORT_RLT1 [ringlockd-nopoll]=$PORT_RLNP
      [ringlockd-t2]=$PORT_RLT2 [locking-center]=$PORT_LC [redis]=$PORT_REDIS
      [redis-aof]=$PORT_REDIS_AOF [postgres]=$PORT_PG [mariadb]=$PORT_MY [etcd]=$PORT_ETCD [etcd-native]=$PORT_ETCDN)
HEAD_SHORT=$(cd "$ROOT" && git rev-parse --short HEAD)
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
MYSQLD=$(command -v mariadbd || command -v mysqld || true)

# The original Locking-Center, built from the source LOCKING_CENTER_SRC
# points at: a checkout (or a bare git dir) of its public repository. Its
# source never enters this repository; it is copied into the temp dir and
# built there with Debian's Go in GOPATH mode (no module proxy, no network):
# its one dependency, github.com/google/uuid, comes from
# golang-github-google-uuid-dev under /usr/share/gocode.
LC_BIN=""
build_locking_center() {
    local src=${LOCKING_CENTER_SRC:-} gp="$TMP/lc/gopath" dst rev
    if [ -z "$src" ]; then
        WHY[locking-center]="source not provided: clone github.com/freakmaxi/locking-center and set LOCKING_CENTER_SRC to the clone (docs/bench.md)"
        return 1
    fi
    command -v go >/dev/null || { WHY[locking-center]="go not installed (Debian package golang-go)"; return 1; }
    [ -d /usr/share/gocode/src/github.com/google/uuid ] || {
        WHY[locking-center]="github.com/google/uuid not installed (Debian package golang-github-google-uuid-dev)"; return 1; }
    dst="$gp/src/github.com/freakmaxi/locking-center"
    mkdir -p "$dst"
    if [ -f "$src/mutex/main.go" ]; then
        cp -a "$src/." "$dst/"
        rev=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo "unknown commit")
    elif git --git-dir="$src" rev-parse --verify -q HEAD >/dev/null 2>&1; then
        git --git-dir="$src" archive HEAD | tar -x -C "$dst"
        rev=$(git --git-dir="$src" rev-parse --short HEAD)
    else
        WHY[locking-center]="LOCKING_CENTER_SRC=$src is neither a Locking-Center checkout (no mutex/main.go) nor a git dir"
        return 1
    fi
    if ! (cd "$dst/mutex" && GO111MODULE=off GOPATH="$gp:/usr/share/gocode" GOCACHE="$TMP/lc/cache" \
            GOPROXY=off GOFLAGS= go build -o "$TMP/lc/lcd" .) >"$TMP/lc/build.log" 2>&1; then
        WHY[locking-center]="build failed: $(tail -c 300 "$TMP/lc/build.log" | tr '\n' ' ')"
        return 1
    fi
    LC_BIN="$TMP/lc/lcd"
    VERSION[locking-center]="Locking-Center @ $rev ($(go version | awk '{print $3}'))"
}

# ringlockd with N shards: gated on the binary knowing --threads.
has_threads() { "$BIN/ringlockd" --help 2>&1 | grep -q -- '--threads'; }
# The session row: gated on the binary having the session protocol's
# keep-alive bounds (a binary without sessions answers a Hello with '-').
has_sessions() { "$BIN/ringlockd" --help 2>&1 | grep -q -- '--max-keepalive-ms'; }

# One-time preparation: versions, notes, and data-dir templates that are
# copied per run (initdb / mariadb-install-db take seconds each). A system
# that cannot run leaves its reason in WHY.
prepare_system() {
    local s=$1
    case "$s" in
    floor) TARGET[$s]="ringlock://127.0.0.1:$PORT_FLOOR"
        VERSION[$s]="floor-server @ $HEAD_SHORT"
        NOTE[$s]="answers + to every frame; no lock state (the machine's limit); --close-first: closes a one-shot connection after its answer, as ringlockd and Locking-Center do" ;;
    ringlockd) TARGET[$s]="ringlock://127.0.0.1:$PORT_RL"
        VERSION[$s]="$("$BIN/ringlockd" --version 2>&1 | head -1) @ $HEAD_SHORT"
        NOTE[$s]="in memory (not durable)" ;;
    ringlockd-session)
        has_sessions || { WHY[$s]="ringlockd is not built with the session protocol yet"; return 1; }
        TARGET[$s]="ringlock-session://127.0.0.1:$PORT_RLS"
        VERSION[$s]="$("$BIN/ringlockd" --version 2>&1 | head -1) @ $HEAD_SHORT"
        NOTE[$s]="the ringlockd server of the ringlockd row (same flags, in memory), driven over the session protocol: Hello, then Acquire (hold = session) + Release by token" ;;
    ringlockd-nopoll)
        "$BIN/ringlockd" --help 2>&1 | grep -q -- '--idle-poll-us' || { WHY[$s]="ringlockd is not built with --idle-poll-us yet"; return 1; }
        TARGET[$s]="ringlock://127.0.0.1:$PORT_RLNP"
        VERSION[$s]="$("$BIN/ringlockd" --version 2>&1 | head -1) @ $HEAD_SHORT"
        NOTE[$s]="in memory, --idle-poll-us 0: an idle loop sleeps at once (the ringlockd row polls 50 µs first)" ;;
    ringlockd-t1|ringlockd-t2)
        has_threads || { WHY[$s]="ringlockd is not built with --threads yet"; return 1; }
        TARGET[$s]="ringlock://127.0.0.1:${PORT[$s]}"
        VERSION[$s]="$("$BIN/ringlockd" --version 2>&1 | head -1) @ $HEAD_SHORT"
        NOTE[$s]="in memory, --threads ${s#ringlockd-t} (shards on the server CPUs: ${SERVER_CPUS:-all})" ;;
    locking-center) build_locking_center || return 1
        TARGET[$s]="ringlock://127.0.0.1:$PORT_LC"
        NOTE[$s]="the original Go server (in memory); one request per connection, closes after the answer; GOMAXPROCS = CPUs in its mask" ;;
    ringlockd-durable) TARGET[$s]="ringlock://127.0.0.1:$PORT_RLD"
        VERSION[$s]="$("$BIN/ringlockd" --version 2>&1 | head -1) @ $HEAD_SHORT"
        NOTE[$s]="--data-path: WAL, fdatasync before a grant/release is answered (group commit)" ;;
    redis|redis-aof) command -v redis-server >/dev/null || return 1
        TARGET[$s]="redis://127.0.0.1:${PORT[$s]}"
        VERSION[$s]="$(redis-server --version | awk '{print $1, $2, $3}')"
        if [ "$s" = redis ]; then NOTE[$s]="no persistence (not durable)"
        else NOTE[$s]="appendonly yes, appendfsync always (durable)"; fi ;;
    postgres) [ -n "$PG_BIN" ] || return 1
        mkdir -p "$TMP/tpl"; chown postgres "$TMP/tpl"
        runuser -u postgres -- "$PG_BIN/initdb" -D "$TMP/tpl/pg" --auth=trust -U postgres >"$TMP/tpl/initdb.log" 2>&1 || return 1
        TARGET[$s]="postgres://postgres@127.0.0.1:$PORT_PG/postgres"
        VERSION[$s]="$("$PG_BIN/postgres" --version)"
        NOTE[$s]="advisory locks in shared memory, bound to the session (not durable)" ;;
    mariadb) [ -n "$MYSQLD" ] || return 1
        mkdir -p "$TMP/tpl"
        mariadb-install-db --no-defaults --datadir="$TMP/tpl/my" --user=root \
            --auth-root-authentication-method=normal >"$TMP/tpl/my-install.log" 2>&1 || return 1
        TARGET[$s]="mysql://bench@127.0.0.1:$PORT_MY"
        VERSION[$s]="$("$MYSQLD" --version | sed 's/^.*Ver //')"
        NOTE[$s]="GET_LOCK in memory, bound to the session (not durable); --skip-grant-tables" ;;
    etcd) command -v etcd >/dev/null || return 1
        TARGET[$s]="etcd://127.0.0.1:$PORT_ETCD"
        VERSION[$s]="etcd $(etcd --version 2>/dev/null | awk '/etcd Version/{print $3}')"
        NOTE[$s]="raft log fsynced on every write (durable); v3 lock API via the gRPC-JSON gateway (HTTP/1.1, ringlock-loadgen); settings: scripts/lib/peers.sh" ;;
    etcd-native)
        TARGET[$s]="etcd://127.0.0.1:$PORT_ETCDN"
        VERSION[$s]="etcd $(etcd --version 2>/dev/null | awk '/etcd Version/{print $3}'); client: $(etcd_native_version)"
        NOTE[$s]="the etcd row's server and flags (durable), driven by etcd's own Go client over native gRPC: clientv3 concurrency.Mutex Lock + Unlock, one gRPC connection shared by the clients, one session (lease) per client (bench/peers/etcd-native)" ;;
    *) return 1 ;;
    esac
}

start_system() { # system dir
    local s=$1 d=$2 port=${PORT[$1]}
    rm -rf "$d"; mkdir -p "$d"; chmod 755 "$d"
    if port_open "$port"; then
        echo "port $port is already in use by another process" >"$d/why"; return 1
    fi
    case "$s" in
    floor) $PIN_SERVER "$BIN/floor-server" --bind "127.0.0.1:$port" --close-first 2>"$d/log" & ;;
    ringlockd|ringlockd-session) $PIN_SERVER "$BIN/ringlockd" --bind "127.0.0.1:$port" --admin-bind "127.0.0.1:$((port + 1))" 2>"$d/log" & ;;
    ringlockd-durable) $PIN_SERVER "$BIN/ringlockd" --bind "127.0.0.1:$port" --admin-bind "127.0.0.1:$((port + 1))" \
            --data-path "$d/ringlock.wal" 2>"$d/log" & ;;
    ringlockd-nopoll) $PIN_SERVER "$BIN/ringlockd" --bind "127.0.0.1:$port" --admin-bind "127.0.0.1:$((port + 1))" \
            --idle-poll-us 0 2>"$d/log" & ;;
    ringlockd-t1|ringlockd-t2) $PIN_SERVER "$BIN/ringlockd" --bind "127.0.0.1:$port" --admin-bind "127.0.0.1:$((port + 1))" \
            --threads "${s#ringlockd-t}" 2>"$d/log" & ;;
    locking-center) BIND_ADDRESS="127.0.0.1:$port" $PIN_SERVER "$LC_BIN" >"$d/log" 2>&1 & ;;
    redis) $PIN_SERVER redis-server --bind 127.0.0.1 --port "$port" --dir "$d" --daemonize no \
            --protected-mode no --save "" --appendonly no >"$d/log" 2>&1 & ;;
    redis-aof) $PIN_SERVER redis-server --bind 127.0.0.1 --port "$port" --dir "$d" --daemonize no \
            --protected-mode no --save "" --appendonly yes --appendfsync always >"$d/log" 2>&1 & ;;
    postgres)
        cp -a "$TMP/tpl/pg" "$d/data"; chown -R postgres "$d"
        # The postmaster runs in the foreground under taskset; backends inherit its CPU mask.
        $PIN_SERVER setpriv --reuid=postgres --regid=postgres --init-groups "$PG_BIN/postgres" -D "$d/data" -c listen_addresses=127.0.0.1 \
            -p "$port" -k "$d" -c max_connections=200 >"$d/log" 2>&1 & ;;
    mariadb)
        cp -a "$TMP/tpl/my" "$d/data"
        $PIN_SERVER "$MYSQLD" --no-defaults --datadir="$d/data" --user=root --bind-address=127.0.0.1 \
            --port="$port" --socket="$d/mysqld.sock" --skip-grant-tables --max-connections=500 \
            --skip-log-bin --log-error="$d/log" & ;;
    etcd|etcd-native)
        # shellcheck disable=SC2086 # $ETCD_IONICE: a command and its flags
        $PIN_SERVER $ETCD_IONICE etcd --name bench --data-dir "$d/data" "${ETCD_TUNING[@]}" \
            --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
            --listen-peer-urls "http://127.0.0.1:$((port + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
            --initial-cluster "bench=http://127.0.0.1:$((port + 1))" >"$d/log" 2>&1 & ;;
    esac
    PID[$s]=$!
    if ! wait_port "$port" 30 "${PID[$s]}"; then
        echo "did not start: $(tail -c 400 "$d/log" 2>/dev/null | tr '\n' ' ')" >"$d/why"
        stop_system "$s"
        return 1
    fi
    if [ "$s" = etcd ] || [ "$s" = etcd-native ]; then sleep 1; fi # single-member leader election
    return 0
}

stop_system() {
    local s=$1 pid=${PID[$1]:-} i
    [ -n "$pid" ] || return 0
    if [ "$s" = postgres ]; then
        kill -INT "$pid" 2>/dev/null || true # fast shutdown
    else
        kill "$pid" 2>/dev/null || true
    fi
    for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    wait "$pid" 2>/dev/null || true
    PID[$s]=""
}

# Noise accounting: /proc/stat ticks (USER_HZ) over the run, minus what the
# server process (threads and reaped children, e.g. PostgreSQL backends)
# and the load generator used = CPU that other work took from this machine
# during the run; steal = time the hypervisor gave to someone else.
# Busy = user+nice+system+irq+softirq+steal; iowait counts as idle (tasks
# parked in io_uring_enter show up as iowait on recent kernels).
cpu_snap() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
proc_ticks() { awk '{print $14+$15+$16+$17}' "/proc/$1/stat" 2>/dev/null || echo 0; }
noise() { # "busy steal total" before, after, server ticks, loadgen cpu seconds
    echo "$1 $2 $3 $4" | awk '{ dt = $6 - $3; if (dt <= 0) dt = 1;
        foreign = ($4 - $1) - $7 - $8 * 100; if (foreign < 0) foreign = 0;
        printf "foreign=%.0f steal=%.0f", 100 * foreign / dt, 100 * ($5 - $2) / dt }'
}

# Which system runs which scenario; prints a reason when it does not.
not_applicable() { # system scenario
    case "$2:$1" in
        uncontended-*:ringlockd-session|churn-*:ringlockd-session)
            echo "session holds end with their connection: a connection per request cannot hold one" ;;
        churn-*:floor|churn-*:ringlockd|churn-*:ringlockd-nopoll|churn-*:ringlockd-t1|churn-*:ringlockd-t2|churn-*:locking-center) ;;
        churn-*:*) echo "connection-churn scenario: compares the Locking-Center-protocol servers (ringlockd, the floor, the original)" ;;
        uncontended-*:etcd-native)
            echo "connection per request: a gRPC client keeps its connection (the etcd row, through the gateway, runs this one)" ;;
        uncontended-*:postgres|uncontended-*:mariadb)
            echo "session-bound locks: released when the connection closes, so a connection per request cannot hold a lock" ;;
        durable-*:floor|durable-*:ringlockd-durable|durable-*:redis-aof|durable-*:etcd|durable-*:etcd-native) ;;
        durable-*:*) echo "not durable: a durable-mode comparison would be meaningless" ;;
        persistent-*:locking-center|hot-key-*:locking-center)
            echo "persistent connections: the original serves one request per connection (no Persist)" ;;
        *:ringlockd-durable) echo "durable variant runs in the durable scenario only" ;;
        *:redis-aof) echo "durable variant runs in the durable scenario only" ;;
    esac
}

READY=""
for s in $SYSTEMS; do
    if prepare_system "$s"; then READY="$READY $s"
    else
        why=${WHY[$s]:-not available on this machine (not installed, or its data dir could not be initialised)}
        log "$s is not available: $why"
        echo "$why" >"$RAW/$s.failed"
    fi
done

# ---------------------------------------------------------------- environment
GIT_COMMIT=$HEAD_SHORT$(cd "$ROOT" && git diff --quiet HEAD -- src loadgen bench || echo "+dirty")
{
    echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit=$GIT_COMMIT"
    echo "kernel=$(uname -sr)"
    echo "cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') x $NCPU vCPU"
    echo "pinning=$PINNING"
    echo "clk_tck=$CLK_TCK"
    echo "ringlockd_binary=$RINGLOCKD_BUILD"
    echo "mode=$([ "$QUICK" = 1 ] && echo quick || echo full) duration=$DURATION warmup=$WARMUP rounds=$REPEAT"
    echo "disk=$(df -P "$TMP" | awk 'NR==2{print $1}') ($(findmnt -no FSTYPE -T "$TMP" 2>/dev/null || echo '?'))"
    echo "fsync=$("$BIN/fsync-probe" "$TMP" 300)"
    for s in $SYSTEMS; do
        echo "system.$s.version=${VERSION[$s]:-not available}"
        echo "system.$s.note=${NOTE[$s]:-${WHY[$s]:-}}"
    done
} >"$RAW/env.txt"
echo "$SCENARIO_TABLE" >"$RAW/scenarios.txt"

# ---------------------------------------------------------------- runs
for round in $(seq 1 "$REPEAT"); do
for sc in $SCENARIOS; do
    line=$(echo "$SCENARIO_TABLE" | grep "^$sc|") || { echo "unknown scenario $sc" >&2; exit 2; }
    args=$(echo "$line" | cut -d'|' -f3)
    if [ "$LOADGEN_THREADS" -gt 1 ]; then
        # No more threads than clients (uncontended-1 has one).
        conns=$(echo "$args" | sed -n 's/.*--connections \([0-9]*\).*/\1/p')
        lt=$(( LOADGEN_THREADS < conns ? LOADGEN_THREADS : conns ))
        args="$args --threads $lt${LOADGEN_CPUS:+ --pin-cpus $LOADGEN_CPUS}"
    fi
    mkdir -p "$RAW/$sc"
    base_args=$args
    for s in $SYSTEMS; do
        # The client: ringlock-loadgen, or etcd's own (same options, same
        # JSON; one goroutine per client, so no --threads / --pin-cpus).
        client=$LOADGEN; args=$base_args
        if [ "$s" = etcd-native ]; then client=$ETCD_NATIVE; args=$(echo "$args" | sed 's/ --threads [0-9]*//; s/ --pin-cpus [^ ]*//'); fi
        reason=$(not_applicable "$s" "$sc")
        if [ -n "$reason" ]; then echo "$reason" >"$RAW/$sc/$s.na"; continue; fi
        if [ -f "$RAW/$s.failed" ]; then cp "$RAW/$s.failed" "$RAW/$sc/$s.na"; continue; fi
        d="$TMP/run/$s"
        if ! start_system "$s" "$d"; then
            log "$sc: $s did not start: $(cat "$d/why" 2>/dev/null)"
            echo "server did not start: $(cat "$d/why" 2>/dev/null)" >"$RAW/$sc/$s.na"
            continue
        fi
        r="$RAW/$sc/$s.r$round"
        sleep 0.3
        log "round $round/$REPEAT $sc: $s"
        c0=$(cpu_snap); p0=$(proc_ticks "${PID[$s]}")
        # shellcheck disable=SC2086
        if $PIN_LOADGEN "$client" --target "${TARGET[$s]}" $args --duration "$DURATION" --warmup "$WARMUP" \
            --key-prefix "$sc" --label "$sc/$s" --json --no-progress --hgrm "$r.hgrm" \
            >"$r.out" 2>"$r.err"; then
            tail -1 "$r.out" >"$r.json"
            sleep 0.2 # let a forking server reap its workers, so their CPU is counted
            c1=$(cpu_snap); p1=$(proc_ticks "${PID[$s]}")
            lg_cpu=$(sed -n 's/.*"loadgen_cpu_s":{"user":\([0-9.]*\),"sys":\([0-9.]*\)}.*/\1 \2/p' "$r.json" | awk '{print $1 + $2}')
            noise "$c0" "$c1" "$((p1 - p0))" "${lg_cpu:-0}" >"$r.noise"
            # The server's CPU per cycle: utime+stime (+ reaped children) of
            # its process over the whole load generator run, divided by every
            # cycle completed in it (warm-up and drain included).
            cycles_all=$(sed -n 's/.*"cycles_all":\([0-9]*\).*/\1/p' "$r.json")
            echo "$((p1 - p0)) $CLK_TCK ${cycles_all:-0}" | awk '{ cpu = $1 / $2;
                printf "server_cpu_s=%.3f cycles_all=%d", cpu, $3;
                if ($3 > 0) printf " us_per_op=%.2f", 1e6 * cpu / $3; printf "\n" }' >"$r.cpu"
            log "  -> $(cat "$r.noise") (% of the machine during the run); $(cat "$r.cpu")"
            echo "$PIN_LOADGEN $(basename "$client") --target ${TARGET[$s]} $args --duration $DURATION --warmup $WARMUP --key-prefix $sc --json" >"$RAW/$sc/$s.cmd"
            rm -f "$RAW/$sc/$s.na"
        else
            echo "load generator failed: $(tail -c 300 "$r.err" | tr '\n' ' ')" >"$RAW/$sc/$s.na"
        fi
        stop_system "$s"
    done
done
done

log "writing the report"
OUT_FROM_ROOT=$(realpath --relative-to="$ROOT" "$OUT")
"$BIN/bench-report" "$RAW" "$OUT" "$OUT_FROM_ROOT"
log "wrote $OUT/latest.md"
# The default output is the one RESULTS.md shows: keep it current.
if [ "$OUT_FROM_ROOT" = "bench/results" ]; then
    python3 "$ROOT/scripts/results-splice.py" bench "$OUT/results-section.md" "$ROOT/RESULTS.md"
fi
