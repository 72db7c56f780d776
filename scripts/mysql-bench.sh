#!/usr/bin/env bash
# What the MySQL backend costs: ringlock::mysql's acquire+release next to raw
# GET_LOCK/RELEASE_LOCK on one connection, in the same run, against a private
# mariadbd (its own data directory, socket and port; removed at exit).
# Server pinned to CPU 0, the bench to CPU 1 (when the machine has two).
#
#   scripts/mysql-bench.sh            # 5 rounds x 2000 acquire+release per path
#   OPS=500 ROUNDS=3 scripts/mysql-bench.sh
#
# Needs mariadb-server (apt-get install mariadb-server). Prints a markdown
# table (mean/p50/p99 per path and the ratio to raw) and the run's context.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

OPS=${OPS:-2000}
ROUNDS=${ROUNDS:-5}
PORT=${PORT:-24316} # below the ephemeral range, next to bench.sh's 243xx

find_tool() {
    local n
    for n in "$@"; do
        command -v "$n" 2>/dev/null && return 0
        for d in /usr/sbin /usr/local/sbin; do
            [ -x "$d/$n" ] && { echo "$d/$n"; return 0; }
        done
    done
    return 1
}
MYSQLD=$(find_tool mariadbd mysqld) || { echo "mysql-bench: mariadbd not found (apt-get install mariadb-server)" >&2; exit 1; }
INSTALL=$(find_tool mariadb-install-db mysql_install_db) || { echo "mysql-bench: mariadb-install-db not found" >&2; exit 1; }
CLIENT=$(find_tool mariadb mysql) || { echo "mysql-bench: the mariadb client is missing" >&2; exit 1; }

if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    echo "mysql-bench: port $PORT is in use (set PORT=...)" >&2
    exit 1
fi

if [ "$(nproc)" -ge 2 ]; then
    PIN_SERVER="taskset -c 0"; PIN_BENCH="taskset -c 1"; PINNING="mariadbd on CPU 0, bench on CPU 1"
else
    PIN_SERVER=""; PIN_BENCH=""; PINNING="none (one CPU)"
fi

cargo build --release --locked --features mysql --bin ringlock-mysql-bench >&2

TMP=$(mktemp -d /tmp/ringlock-mysql-bench.XXXXXX)
PID=""
cleanup() {
    if [ -n "$PID" ]; then
        kill "$PID" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

USER_OPT=()
[ "$(id -u)" = 0 ] && USER_OPT=(--user=root)
"$INSTALL" --no-defaults --datadir="$TMP/data" --auth-root-authentication-method=normal \
    --skip-test-db "${USER_OPT[@]}" >"$TMP/install.log" 2>&1 \
    || { cat "$TMP/install.log" >&2; exit 1; }
$PIN_SERVER "$MYSQLD" --no-defaults --datadir="$TMP/data" --socket="$TMP/sock" --port="$PORT" \
    --bind-address=127.0.0.1 --skip-log-bin --skip-name-resolve --log-error="$TMP/err.log" \
    --pid-file="$TMP/pid" "${USER_OPT[@]}" &
PID=$!
for _ in $(seq 1 300); do
    "$CLIENT" --no-defaults -S "$TMP/sock" -uroot -e 'SELECT 1' >/dev/null 2>&1 && break
    kill -0 "$PID" 2>/dev/null || { cat "$TMP/err.log" >&2; exit 1; }
    sleep 0.1
done
"$CLIENT" --no-defaults -S "$TMP/sock" -uroot -e "CREATE USER 'bench'@'%' IDENTIFIED BY 'bench'"

echo "commit $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+dirty'), kernel $(uname -r), $(nproc) CPUs, pinning: $PINNING"
echo "server: $("$MYSQLD" --version | sed 's/^.*Ver //'), in memory, TCP over loopback; one client, one key, no contention"
$PIN_BENCH "$ROOT/target/release/ringlock-mysql-bench" \
    --url "mysql://bench:bench@127.0.0.1:$PORT" --ops "$OPS" --rounds "$ROUNDS"
