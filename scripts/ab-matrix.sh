#!/usr/bin/env bash
# Every scenario of scripts/bench.sh as an A/B of this tree against
# OLD_COMMIT (scripts/ab.sh: both servers alternated round by round in one
# session, server on CPU 1, load generator on CPU 0, one shard), then a
# summary: per scenario and build the range over the rounds of cycles/s,
# lock p99 and server CPU per lock+unlock cycle, and the ratio of the
# mean CPU per cycle (new / old). The durable scenario runs both servers
# durable (AB_DURABLE=1).
#
#   scripts/ab-matrix.sh OLD_COMMIT [ROUNDS] OUTDIR [SCENARIO...]
#
# AB_OLD_TARGET=DIR reuses OLD's release build in DIR (see scripts/ab.sh).
# Each scenario runs 3 s after a 1 s warm-up. Outputs: OUTDIR/SCENARIO.txt
# (ab.sh's lines) and OUTDIR/summary.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OLD=${1:?usage: scripts/ab-matrix.sh OLD_COMMIT [ROUNDS] OUTDIR [SCENARIO...]}
ROUNDS=${2:-4}
OUT=${3:?usage: scripts/ab-matrix.sh OLD_COMMIT [ROUNDS] OUTDIR [SCENARIO...]}
shift 3
mkdir -p "$OUT"
# The scenario table of scripts/bench.sh (name|description|load arguments).
TABLE=$(sed -n "/^SCENARIO_TABLE=\$(cat <<'EOF'/,/^EOF/p" "$ROOT/scripts/bench.sh" | sed '1d;$d')
[ -n "$TABLE" ] || { echo "ab-matrix: no scenario table in scripts/bench.sh" >&2; exit 1; }
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || mapfile -t SCENARIOS < <(echo "$TABLE" | cut -d'|' -f1)
{
    echo "# A/B: $(git -C "$ROOT" rev-parse --short "$OLD") vs $(git -C "$ROOT" rev-parse --short HEAD), $ROUNDS rounds, $(date -u +%FT%TZ)"
    echo "# $(uname -r), $(nproc) CPUs"
} >"$OUT/header.txt"
for sc in "${SCENARIOS[@]}"; do
    line=$(echo "$TABLE" | grep "^$sc|") || { echo "ab-matrix: unknown scenario $sc" >&2; exit 2; }
    read -r -a args <<<"$(echo "$line" | cut -d'|' -f3)"
    durable=0
    case $sc in durable-*) durable=1 ;; esac
    echo "== $sc" >&2
    AB_DURABLE=$durable "$ROOT/scripts/ab.sh" "$OLD" "$ROUNDS" "${args[@]}" --duration 3s --warmup 1s \
        | tee "$OUT/$sc.txt"
done
python3 - "$OUT" "${SCENARIOS[@]}" <<'PY' | tee "$OUT/summary.md"
import sys, statistics
out, scs = sys.argv[1], sys.argv[2:]
print("| scenario | build | cycles/s | p99 µs | server CPU µs/cycle | CPU new/old (means) |")
print("|---|---|---|---|---|---|")
for sc in scs:
    rows = {}
    order = []
    for l in open(f"{out}/{sc}.txt"):
        if l.startswith("#") or not l.strip():
            continue
        # commit, cycles/s, p99, CPU per cycle, then steal (ms) since ab.sh printed it
        c, ops, p99, cpu = l.split()[:4]
        if c not in rows:
            order.append(c)
        rows.setdefault(c, []).append((float(ops), float(p99), float(cpu)))
    rng = lambda v, f: f"{f(min(v))}–{f(max(v))}"
    means = [statistics.mean(r[2] for r in rows[c]) for c in order]
    for i, c in enumerate(order):
        r = rows[c]
        ratio = f"{means[1] / means[0]:.2f}×" if i == 1 and means[0] > 0 else ""
        print(f"| {sc} | {c} | {rng([x[0] for x in r], lambda x: f'{x/1000:.1f} k')} "
              f"| {rng([x[1] for x in r], lambda x: f'{x:.0f}')} "
              f"| {rng([x[2] for x in r], lambda x: f'{x:.1f}')} | {ratio} |")
PY
