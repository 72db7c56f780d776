#!/usr/bin/env bash
# Runs the deterministic simulators over many seeds (release build): the
# one-shard simulator (tests/sim), session clients (tests/sim_sessions),
# several shards (tests/sim_shards) and the replicated cluster
# (tests/sim_cluster); SIM_TESTS picks some of them. Every seed is a
# complete replay: a failure's command reproduces it on the first try.
#   scripts/sim.sh [SEEDS] [FIRST_SEED] [STEPS]
# Default: 100000 seeds from 1, 2500 steps each (hours). A failure prints
# its seed and the command that reproduces it, and the script exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-100000}
first=${2:-1}
steps=${3:-2500}
batch=1000
s=$first
end=$((first + seeds))
while [ "$s" -lt "$end" ]; do
  n=$(( end - s < batch ? end - s : batch ))
  out=$(mktemp)
  tests=()
  for t in ${SIM_TESTS:-sim sim_sessions sim_shards sim_cluster}; do tests+=(--test "$t"); done
  if ! SIM_FIRST_SEED=$s SIM_SEEDS=$n SIM_STEPS=$steps \
    cargo test --release --locked "${tests[@]}" -- --nocapture >"$out" 2>&1; then
    grep -E "simulation failed|reproduce" "$out" >&2 || tail -n 40 "$out" >&2
    echo "sim.sh: failure in seeds $s..$((s + n - 1))" >&2
    rm -f "$out"
    exit 1
  fi
  grep -E "seeds x" "$out" || true
  rm -f "$out"
  s=$((s + n))
done
echo "sim.sh: $seeds seeds from $first passed"
