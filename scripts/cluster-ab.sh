#!/usr/bin/env bash
# A/B of the replicated cluster across two commits: scripts/cluster-bench.sh
# as each tree has it (each builds its own release binaries), run
# alternately OLD, NEW, OLD, NEW ... ROUNDS times on this machine, so that
# drift between runs falls on both sides alike.
#
#   scripts/cluster-ab.sh OLD_REV [ROUNDS] [-- cluster-bench.sh options]
#
#   OLD_REV   the commit to compare against (built in a git worktree under
#             /tmp, kept between runs of this script: AB_OLD_TREE=DIR names
#             another); NEW is this checkout, as it is.
#   ROUNDS    default 2.
#   options   passed to both trees' cluster-bench.sh (default: --no-install
#             --systems "ringlock-cluster ringlock-cluster-insecure"); the
#             failover trials run as cluster-bench.sh runs them
#             (FAILOVER_TRIALS).
#
# Writes bench/results/cluster-ab/<old>-<new>/ (or AB_OUT): each run's
# cluster-bench output under old-rN/ and new-rN/, and summary.md: for each
# system and client count, cycles/s and p99 of every run, old beside new,
# the ranges, and a verdict that says "indistinguishable" when the ranges
# overlap; then the failover medians. AB_SUMMARY_ONLY=1 writes summary.md
# again from the runs already in the output directory. Nothing here is pinned beyond what
# cluster-bench.sh pins (servers on CPU 1, clients on CPU 0).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2; }
OLD_REV=$1; shift
ROUNDS=2
if [ $# -ge 1 ] && [ "$1" != -- ]; then ROUNDS=$1; shift; fi
case "$ROUNDS" in ''|*[!0-9]*|0) echo "ROUNDS must be a positive number, got $ROUNDS" >&2; exit 2 ;; esac
[ "${1:-}" = -- ] && shift
if [ $# -eq 0 ]; then
    set -- --no-install --systems "ringlock-cluster ringlock-cluster-insecure"
fi

OLD=$(git -C "$ROOT" rev-parse --short "$OLD_REV")
NEW=$(git -C "$ROOT" rev-parse --short HEAD)
if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ]; then NEW="$NEW+dirty"; fi
OLD_TREE=${AB_OLD_TREE:-/tmp/ringlock-ab-$OLD}
if [ ! -d "$OLD_TREE" ]; then
    git -C "$ROOT" worktree add -q --detach "$OLD_TREE" "$OLD"
fi
[ -x "$OLD_TREE/scripts/cluster-bench.sh" ] || { echo "$OLD_TREE has no scripts/cluster-bench.sh" >&2; exit 1; }
OUT=${AB_OUT:-$ROOT/bench/results/cluster-ab/$OLD-$NEW}
mkdir -p "$OUT"

for r in $(seq 1 "$ROUNDS"); do
    [ "${AB_SUMMARY_ONLY:-0}" = 1 ] && break
    for side in old new; do
        tree=$ROOT; [ $side = old ] && tree=$OLD_TREE
        echo "== round $r, $side ($tree)" >&2
        rm -rf "$OUT/$side-r$r"
        "$tree/scripts/cluster-bench.sh" --out "$OUT/$side-r$r" "$@" > "$OUT/$side-r$r.txt"
    done
done

python3 - "$OUT" "$ROUNDS" "$OLD" "$NEW" > "$OUT/summary.md" <<'EOF'
import json, os, sys, glob, platform
out, rounds, old, new = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(side, r):
    rows = {}
    for f in glob.glob(f"{out}/{side}-r{r}/*.json"):
        name = os.path.basename(f)[:-5]
        if name == "failover":
            continue
        try:
            j = json.load(open(f))
        except ValueError:
            continue
        if "ops_per_sec" in j:
            rows[name] = (j["ops_per_sec"], j["latency_us"]["p99"], j["errors"])
    fo = None
    p = f"{out}/{side}-r{r}/failover.json"
    if os.path.exists(p):
        fo = json.load(open(p))
    return rows, fo
runs = {s: [load(s, r) for r in range(1, rounds + 1)] for s in ("old", "new")}
names = sorted(set().union(*[set(x[0]) for s in runs for x in runs[s]]),
               key=lambda n: (n.rsplit("-", 1)[0], int(n.rsplit("-", 1)[1])))
print(f"## Cluster A/B: {old} (old) vs {new} (new), {rounds} rounds, alternating\n")
print(f"- machine: {os.cpu_count()} CPUs, {platform.platform()}; each run's own header is in its latest.md")
print("- each cell: the runs in order; verdict from the ranges (overlap: indistinguishable)\n")
def verdict(o, n, higher_better):
    if not o or not n:
        return "missing"
    if max(o) >= min(n) and max(n) >= min(o):
        return "indistinguishable"
    better = min(n) > max(o) if higher_better else max(n) < min(o)
    return "new better" if better else "new worse"
print("| row | old cycles/s | new cycles/s | cycles/s | old p99 µs | new p99 µs | p99 | errors old/new |")
print("|---|---|---|---|---|---|---|---|")
for n in names:
    o = [x[0][n] for x in runs["old"] if n in x[0]]
    w = [x[0][n] for x in runs["new"] if n in x[0]]
    fmt = lambda v, i: ", ".join(f"{t[i]:.0f}" for t in v)
    print(f"| {n} | {fmt(o,0)} | {fmt(w,0)} | {verdict([t[0] for t in o],[t[0] for t in w],True)} "
          f"| {fmt(o,1)} | {fmt(w,1)} | {verdict([t[1] for t in o],[t[1] for t in w],False)} "
          f"| {sum(t[2] for t in o)}/{sum(t[2] for t in w)} |")
if not any(x[1] for s in runs for x in runs[s]):
    sys.exit(0)
print("\n| failover (kill -9 of the leader) | old p50 ms | new p50 ms | verdict (p50s) |")
print("|---|---|---|---|")
for k, label in (("a", "(a) kill → first grant by the new leader"), ("b", "(b) kill → grant of a re-queued waiter")):
    o = [x[1][k]["p50_ms"] for x in runs["old"] if x[1] and k in x[1]]
    w = [x[1][k]["p50_ms"] for x in runs["new"] if x[1] and k in x[1]]
    print(f"| {label} | {', '.join(f'{v:.0f}' for v in o)} | {', '.join(f'{v:.0f}' for v in w)} | {verdict(o, w, False)} |")
EOF
cat "$OUT/summary.md"
