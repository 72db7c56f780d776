#!/usr/bin/env bash
# Runs the whole test suite: unit, property and integration tests of every
# workspace member (the integration tests start the real ringlockd binary),
# plus the deployment checks. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== rustfmt"
cargo fmt --all --check

echo "== clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test (workspace, all targets)"
cargo test --workspace --all-targets --locked --features faults

if [ -x scripts/check-deploy.sh ]; then
  echo "== deployment checks"
  scripts/check-deploy.sh
fi
echo "== all tests passed"
