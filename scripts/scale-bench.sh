#!/usr/bin/env bash
# Held-key memory and recovery benchmark: RSS per held key at 10 k / 100 k /
# 1 M keys (in memory and durable, with --max-keys N and 10 × N), recovery
# of the durable logs after kill -9 (replay, listening, first answer, KEYS
# complete), and Redis memory for the same keys beside it. Builds the
# release binaries, then runs `scale-bench` (bench/src/scale.rs) with the
# server pinned to CPU 1. Writes bench/results/scale/latest.md.
#
# With --compaction-load SECS it measures a background compaction of a
# large table under load instead (load generator pinned to CPU 0), and
# writes bench/results/scale/compaction.md. Add `--ringlockd LABEL=PATH`
# to run another build beside this tree's in the same rounds.
#
# Usage: scripts/scale-bench.sh [scale-bench options, e.g. --sizes 10000,100000]
#        scripts/scale-bench.sh --compaction-load 25 --sizes 1000000 [--rounds 2]
# Needs redis-server for the peer row (apt-get install redis-server), or
# pass --redis-server none.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked -p ringlock --bin ringlockd -p ringlock-bench --bin scale-bench \
  -p ringlock-loadgen >&2
target=${CARGO_TARGET_DIR:-target}
mkdir -p bench/results/scale
out=bench/results/scale/latest.md
cpus=()
case " $* " in
  *" --compaction-load "*)
    out=bench/results/scale/compaction.md
    if [ "$(nproc)" -ge 2 ]; then cpus=(--loadgen-cpus 0); fi ;;
esac
if [ "$(nproc)" -ge 2 ]; then cpus+=(--server-cpus 1); fi
"$target/release/scale-bench" --ringlockd "this=$target/release/ringlockd" "${cpus[@]}" \
  --loadgen "$target/release/ringlock-loadgen" --out "$out" "$@"
