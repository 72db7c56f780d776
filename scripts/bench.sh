#!/usr/bin/env bash
# Side-by-side lock-service benchmark: ringlockd against a floor server,
# Redis, PostgreSQL, MariaDB and etcd, same machine, same run, same load.
#
#   scripts/bench.sh [--quick] [--no-install] [--systems "floor ringlockd redis ..."]
#                    [--scenarios "uncontended-1 ..."] [--out DIR]
#
# Installs missing peers with apt-get (Debian), starts every server on
# loopback with its data in a temp dir, pins servers to CPU 1 and the load
# generator to CPU 0 (taskset), runs the scenario matrix scenario by
# scenario (all systems back to back, so machine drift hits them alike),
# stops everything and writes bench/results/{latest.md,*.svg,raw/}.
# See docs/bench.md.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
QUICK=0
INSTALL=1
SYSTEMS="floor ringlockd ringlockd-durable redis redis-aof postgres mariadb etcd"
SCENARIOS=""
OUT="$ROOT/bench/results"
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --no-install) INSTALL=0 ;;
        --systems) SYSTEMS="$2"; shift ;;
        --scenarios) SCENARIOS="$2"; shift ;;
        --out) OUT="$2"; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

if [ "$QUICK" = 1 ]; then DURATION=3s; WARMUP=1s; else DURATION=10s; WARMUP=2s; fi

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
EOF
)
[ -n "$SCENARIOS" ] || SCENARIOS=$(echo "$SCENARIO_TABLE" | cut -d'|' -f1 | tr '\n' ' ')

NCPU=$(nproc)
if [ "$NCPU" -ge 2 ]; then
    SERVER_CPU=1; LOADGEN_CPU=0
    PIN_SERVER="taskset -c $SERVER_CPU"; PIN_LOADGEN="taskset -c $LOADGEN_CPU"
    PINNING="servers on CPU $SERVER_CPU, load generator on CPU $LOADGEN_CPU (taskset)"
else
    PIN_SERVER=""; PIN_LOADGEN=""; PINNING="none (1 CPU)"
fi

TMP=$(mktemp -d /tmp/ringlock-bench.XXXXXX)
chmod 755 "$TMP"
RAW="$OUT/raw"
rm -rf "$RAW"
mkdir -p "$RAW"
PIDS=()
log() { echo "[bench $(date +%T)] $*" >&2; }

cleanup() {
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null || true
    done
    if [ -n "${PG_DATA:-}" ] && [ -d "$PG_DATA" ]; then
        runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast stop >/dev/null 2>&1 || true
    fi
    sleep 0.5
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true
    done
    rm -rf "$TMP"
}
trap cleanup EXIT

# ---------------------------------------------------------------- install
want() { case " $SYSTEMS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if [ "$INSTALL" = 1 ]; then
    pkgs=""
    { want redis || want redis-aof; } && ! command -v redis-server >/dev/null && pkgs="$pkgs redis-server"
    want postgres && ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && pkgs="$pkgs postgresql"
    want mariadb && ! command -v mariadbd >/dev/null && ! command -v mysqld >/dev/null && pkgs="$pkgs mariadb-server"
    want etcd && ! command -v etcd >/dev/null && pkgs="$pkgs etcd-server"
    if [ -n "$pkgs" ]; then
        log "installing:$pkgs"
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

# ---------------------------------------------------------------- servers
wait_port() { # host port seconds
    local i
    for i in $(seq 1 $(( $3 * 10 ))); do
        (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

declare -A TARGET NOTE VERSION
start_system() {
    local s=$1 d="$TMP/$1"
    mkdir -p "$d"
    case "$s" in
    floor)
        $PIN_SERVER "$BIN/floor-server" --bind 127.0.0.1:22129 2>"$d/log" &
        PIDS+=($!)
        wait_port 127.0.0.1 22129 10 || return 1
        TARGET[$s]="ringlock://127.0.0.1:22129"
        VERSION[$s]="floor-server @ $(cd "$ROOT" && git rev-parse --short HEAD)"
        NOTE[$s]="answers + to every frame; no lock state (the machine's limit)" ;;
    ringlockd)
        $PIN_SERVER "$BIN/ringlockd" --bind 127.0.0.1:22119 --admin-bind 127.0.0.1:22120 2>"$d/log" &
        PIDS+=($!)
        wait_port 127.0.0.1 22119 10 || return 1
        TARGET[$s]="ringlock://127.0.0.1:22119"
        VERSION[$s]="$("$BIN/ringlockd" --version 2>&1 | head -1) @ $(cd "$ROOT" && git rev-parse --short HEAD)"
        NOTE[$s]="in memory (not durable)" ;;
    ringlockd-durable)
        $PIN_SERVER "$BIN/ringlockd" --bind 127.0.0.1:22139 --admin-bind 127.0.0.1:22140 \
            --data-path "$d/ringlock.wal" 2>"$d/log" &
        local pid=$!
        PIDS+=($pid)
        if ! wait_port 127.0.0.1 22139 10; then
            NOTE[$s]="did not start with --data-path: $(tail -c 300 "$d/log" | tr '\n' ' ')"
            return 1
        fi
        TARGET[$s]="ringlock://127.0.0.1:22139"
        VERSION[$s]="$("$BIN/ringlockd" --version 2>&1 | head -1) @ $(cd "$ROOT" && git rev-parse --short HEAD)"
        NOTE[$s]="--data-path: WAL, fdatasync before every grant/release answer (group commit)" ;;
    redis|redis-aof)
        local port=6390 extra=(--save "" --appendonly no)
        NOTE[$s]="no persistence (not durable)"
        if [ "$s" = redis-aof ]; then
            port=6391; extra=(--save "" --appendonly yes --appendfsync always)
            NOTE[$s]="appendonly yes, appendfsync always (durable)"
        fi
        $PIN_SERVER redis-server --bind 127.0.0.1 --port $port --dir "$d" --daemonize no \
            --protected-mode no "${extra[@]}" >"$d/log" 2>&1 &
        PIDS+=($!)
        wait_port 127.0.0.1 $port 10 || return 1
        TARGET[$s]="redis://127.0.0.1:$port"
        VERSION[$s]="$(redis-server --version | awk '{print $1, $2, $3}')" ;;
    postgres)
        PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
        PG_DATA="$d/data"
        chown postgres "$d"
        runuser -u postgres -- "$PG_BIN/initdb" -D "$PG_DATA" --auth=trust -U postgres >"$d/initdb.log" 2>&1 || return 1
        # Pin the postmaster; backends it forks inherit the CPU mask.
        $PIN_SERVER runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$d/log" -w start \
            -o "-c listen_addresses=127.0.0.1 -p 5440 -k $d -c max_connections=200 -c shared_buffers=128MB" >/dev/null || return 1
        wait_port 127.0.0.1 5440 20 || return 1
        TARGET[$s]="postgres://postgres@127.0.0.1:5440/postgres"
        VERSION[$s]="$("$PG_BIN/postgres" --version)"
        NOTE[$s]="advisory locks live in shared memory, bound to the session (not durable)" ;;
    mariadb)
        local mysqld
        mysqld=$(command -v mariadbd || command -v mysqld)
        mariadb-install-db --no-defaults --datadir="$d/data" --user=root --auth-root-authentication-method=normal \
            >"$d/install.log" 2>&1 || return 1
        $PIN_SERVER "$mysqld" --no-defaults --datadir="$d/data" --user=root --bind-address=127.0.0.1 \
            --port=3310 --socket="$d/mysqld.sock" --skip-grant-tables --max-connections=500 \
            --skip-log-bin --log-error="$d/log" &
        PIDS+=($!)
        wait_port 127.0.0.1 3310 30 || return 1
        TARGET[$s]="mysql://bench@127.0.0.1:3310"
        VERSION[$s]="$("$mysqld" --version | sed 's/^.*Ver //')"
        NOTE[$s]="GET_LOCK in memory, bound to the session (not durable); --skip-grant-tables" ;;
    etcd)
        $PIN_SERVER etcd --name bench --data-dir "$d/data" \
            --listen-client-urls http://127.0.0.1:2390 --advertise-client-urls http://127.0.0.1:2390 \
            --listen-peer-urls http://127.0.0.1:2391 --initial-advertise-peer-urls http://127.0.0.1:2391 \
            --initial-cluster bench=http://127.0.0.1:2391 >"$d/log" 2>&1 &
        PIDS+=($!)
        wait_port 127.0.0.1 2390 20 || return 1
        sleep 1 # leader election of the single member
        TARGET[$s]="etcd://127.0.0.1:2390"
        VERSION[$s]="etcd $(etcd --version 2>/dev/null | awk '/etcd Version/{print $3}')"
        NOTE[$s]="raft log fsynced on every write (durable); HTTP/JSON gateway" ;;
    *) echo "unknown system $s" >&2; return 1 ;;
    esac
}

# Which system runs which scenario; prints a reason when it does not.
not_applicable() { # system scenario
    case "$2:$1" in
        uncontended-*:postgres|uncontended-*:mariadb)
            echo "session-bound locks: released when the connection closes, so a connection per request cannot hold a lock" ;;
        durable-*:floor|durable-*:ringlockd-durable|durable-*:redis-aof|durable-*:etcd) ;;
        durable-*:*) echo "not durable: a durable-mode comparison would be meaningless" ;;
        *:ringlockd-durable) echo "durable variant runs in the durable scenario only" ;;
        *:redis-aof) echo "durable variant runs in the durable scenario only" ;;
    esac
}

STARTED=""
for s in $SYSTEMS; do
    log "starting $s"
    if start_system "$s"; then
        STARTED="$STARTED $s"
    else
        log "$s failed to start"
        echo "${NOTE[$s]:-failed to start; see the log in the temp dir}" >"$RAW/$s.failed"
    fi
done

# ---------------------------------------------------------------- environment
GIT_COMMIT=$(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet HEAD -- src loadgen bench || echo "+dirty")
{
    echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit=$GIT_COMMIT"
    echo "kernel=$(uname -sr)"
    echo "cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') x $NCPU vCPU"
    echo "pinning=$PINNING"
    echo "ringlockd_binary=$RINGLOCKD_BUILD"
    echo "mode=$([ "$QUICK" = 1 ] && echo quick || echo full) duration=$DURATION warmup=$WARMUP"
    echo "disk=$(df -P "$TMP" | awk 'NR==2{print $1}') ($(findmnt -no FSTYPE -T "$TMP" 2>/dev/null || echo '?'))"
    echo "fsync=$("$BIN/fsync-probe" "$TMP" 300)"
    for s in $SYSTEMS; do
        echo "system.$s.version=${VERSION[$s]:-not started}"
        echo "system.$s.note=${NOTE[$s]:-}"
    done
} >"$RAW/env.txt"
echo "$SCENARIO_TABLE" >"$RAW/scenarios.txt"

# ---------------------------------------------------------------- runs
for sc in $SCENARIOS; do
    line=$(echo "$SCENARIO_TABLE" | grep "^$sc|") || { echo "unknown scenario $sc" >&2; exit 2; }
    args=$(echo "$line" | cut -d'|' -f3)
    mkdir -p "$RAW/$sc"
    for s in $SYSTEMS; do
        reason=$(not_applicable "$s" "$sc")
        if [ -n "$reason" ]; then echo "$reason" >"$RAW/$sc/$s.na"; continue; fi
        if [ -f "$RAW/$s.failed" ]; then cp "$RAW/$s.failed" "$RAW/$sc/$s.na"; continue; fi
        log "$sc: $s"
        cut -d' ' -f1 /proc/loadavg >"$RAW/$sc/$s.load"
        # shellcheck disable=SC2086
        if $PIN_LOADGEN "$LOADGEN" --target "${TARGET[$s]}" $args --duration "$DURATION" --warmup "$WARMUP" \
            --key-prefix "$sc" --label "$sc/$s" --json --no-progress --hgrm "$RAW/$sc/$s.hgrm" \
            >"$RAW/$sc/$s.out" 2>"$RAW/$sc/$s.err"; then
            tail -1 "$RAW/$sc/$s.out" >"$RAW/$sc/$s.json"
            echo "$PIN_LOADGEN $LOADGEN --target ${TARGET[$s]} $args --duration $DURATION --warmup $WARMUP --key-prefix $sc --json" >"$RAW/$sc/$s.cmd"
        else
            echo "load generator failed: $(tail -c 300 "$RAW/$sc/$s.err" | tr '\n' ' ')" >"$RAW/$sc/$s.na"
        fi
        sleep 0.5
    done
done

log "stopping servers"
"$BIN/bench-report" "$RAW" "$OUT"
log "wrote $OUT/latest.md"
