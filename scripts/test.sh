#!/usr/bin/env bash
# Runs the whole test suite: unit, property and integration tests of every
# workspace member (the integration tests start the real ringlockd binary),
# doc tests, the docs build, the client-only build, plus the deployment
# checks. Exits non-zero on any failure; a missing tool is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== test tools (installed if missing)"
scripts/install-test-tools.sh

echo "== rustfmt"
cargo fmt --all --check

echo "== clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== client-only build (default-features = false: no io_uring, no server, no CLI)"
cargo build --locked --no-default-features --lib

echo "== cargo test (workspace, all targets)"
cargo test --workspace --all-targets --locked --features faults

echo "== doc tests"
cargo test --workspace --doc --locked

echo "== cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

echo "== deployment checks"
scripts/check-deploy.sh
echo "== all tests passed"
