#!/usr/bin/env bash
# Runs the whole test suite: unit, property and integration tests of every
# workspace member (the integration tests start the real ringlockd binary),
# the MySQL backend's tests against a private MariaDB, plus the deployment
# checks. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== rustfmt"
cargo fmt --all --check

echo "== clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test (workspace, all targets)"
cargo test --workspace --all-targets --locked

# The MySQL backend is behind the cargo feature `mysql` (off by default, so
# the server build does not pull in a MySQL driver). Its tests start a
# private mariadbd (package mariadb-server) and fail without one.
echo "== clippy, feature mysql (warnings are errors)"
cargo clippy -p ringlock --all-targets --locked --features mysql -- -D warnings
echo "== cargo test, feature mysql (against a private MariaDB)"
cargo test -p ringlock --locked --features mysql --lib --test mysql_contract --test mysql_faults

if [ -x scripts/check-deploy.sh ]; then
  echo "== deployment checks"
  scripts/check-deploy.sh
fi
echo "== all tests passed"
