#!/usr/bin/env bash
# Held-key memory and recovery benchmark: RSS per held key at 10 k / 100 k /
# 1 M keys (in memory and durable, with --max-keys N and 10 × N), recovery
# of the durable logs after kill -9 (replay, listening, first answer, KEYS
# complete), and Redis memory for the same keys beside it. Builds the
# release binaries, then runs `scale-bench` (bench/src/scale.rs) with the
# server pinned to CPU 1. Writes bench/results/scale/latest.md.
#
# Usage: scripts/scale-bench.sh [scale-bench options, e.g. --sizes 10000,100000]
# Needs redis-server for the peer row (apt-get install redis-server), or
# pass --redis-server none.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked -p ringlock --bin ringlockd -p ringlock-bench --bin scale-bench >&2
target=${CARGO_TARGET_DIR:-target}
mkdir -p bench/results/scale
cpus=()
if [ "$(nproc)" -ge 2 ]; then cpus=(--server-cpus 1); fi
"$target/release/scale-bench" --ringlockd "$target/release/ringlockd" "${cpus[@]}" \
  --out bench/results/scale/latest.md "$@"
