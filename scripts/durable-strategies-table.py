#!/usr/bin/env python3
"""Formats a `scripts/durable-bench.sh --strategies` run: ringlockd's
preallocated log beside append + fdatasync (`--wal-preallocate-bytes 0`) at
each client count, the in-memory server at 1 client, and the disk's durable
writes measured by `fsync-probe --compare` in the same rounds (the floor).

Usage: scripts/durable-strategies-table.py WORKDIR ROUNDS DURATION ROW...
  ROW = strategy|round|clients|loadgen-json|grants|fdatasyncs|records
  WORKDIR/probe.R.txt = the probe's --kv output of round R"""
import datetime
import json
import os
import platform
import subprocess
import sys

LABEL = {
    "append": "append + fdatasync (`--wal-preallocate-bytes 0`, the log before)",
    "prealloc": "preallocated, overwrite + fdatasync (default)",
    "memory": "in memory (no log), reference",
}


def probe(path):
    cases = {}
    for line in open(path):
        words = line.split()
        if words and words[0] == "probe":
            kv = dict(w.split("=", 1) for w in words[1:] if "=" in w)
            if "p99_us" in kv:
                cases[(kv["strategy"], int(kv["size"]))] = kv
    return cases


def main():
    work, rounds, duration = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rows = {}
    for r in sys.argv[4:]:
        strat, rnd, n, j, g, f, rec = r.split("|")
        rows[(strat, int(n), int(rnd))] = (json.loads(j), int(g), int(f), int(rec))
    probes = {r: probe(os.path.join(work, f"probe.{r}.txt")) for r in range(1, rounds + 1)}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    fs = subprocess.run(["findmnt", "-no", "FSTYPE", "-T", work],
                        capture_output=True, text=True).stdout.strip() or "?"
    sep = " / "
    L = ["## Durable write strategies end to end (`scripts/durable-bench.sh --strategies`)\n"]
    L.append(f"Run {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}, "
             f"commit {commit}{'+dirty' if dirty else ''}, kernel {platform.release()}, CPU {cpu} (2 vCPU), "
             f"log on {fs} (the disk of /tmp); ringlockd and fsync-probe pinned to CPU 1, ringlock-loadgen "
             f"to CPU 0. Closed loop, persistent connections, each client "
             f"locks and unlocks its own key, {duration} measured after 1 s warm-up, one fresh log per run. "
             f"{rounds} rounds; in each, the write probe (1000 samples per case), the in-memory server, then "
             f"per client count both log strategies, their order alternating between rounds. "
             f"Figures are round 1 / round 2 / ….\n")
    L.append("| strategy | clients | cycles/s | lock p50 µs | lock p99 µs | lock p99.9 µs | fdatasyncs/s | grants per fdatasync | errors |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    counts = sorted({n for (_, n, _) in rows})

    def cell(strat, n, fn):
        out = []
        for r in range(1, rounds + 1):
            v = rows.get((strat, n, r))
            out.append(fn(*v) if v else "–")
        return sep.join(out)

    def span(j):
        return j["duration_s"] + j.get("warmup_s", 0) + j.get("drain_s", 0)

    for n in counts:
        for strat in ("memory", "append", "prealloc"):
            if not any((strat, n, r) in rows for r in range(1, rounds + 1)):
                continue
            durable = strat != "memory"
            cols = [
                cell(strat, n, lambda j, g, f, rec: "%.0f" % j["ops_per_sec"]),
                cell(strat, n, lambda j, g, f, rec: "%.0f" % j["latency_us"]["p50"]),
                cell(strat, n, lambda j, g, f, rec: "%.0f" % j["latency_us"]["p99"]),
                cell(strat, n, lambda j, g, f, rec: "%.0f" % j["latency_us"]["p999"]),
                cell(strat, n, lambda j, g, f, rec: "%.0f" % (f / span(j))) if durable else "–",
                cell(strat, n, lambda j, g, f, rec: "%.1f" % (g / max(f, 1))) if durable else "–",
                cell(strat, n, lambda j, g, f, rec: str(j["errors"])),
            ]
            L.append(f"| {LABEL[strat]} | {n} | " + " | ".join(cols) + " |")
    L.append("")
    L.append("The floor, from the same rounds (`fsync-probe --compare`, 64-byte records like a lone "
             "client's batch; p99 µs, round 1 / round 2 / …):\n")
    L.append("| durable write | p50 µs | p99 µs |")
    L.append("|---|---:|---:|")
    for name in ("append+fdatasync", "uring:append+fdatasync", "zeroed+fdatasync",
                 "uring:zeroed+fdatasync", "zeroed+rwf_dsync", "uring:zeroed+rwf_dsync",
                 "zeroed+o_dsync", "zeroed+o_direct", "uring:zeroed+o_direct"):
        p50 = sep.join(f"{float(probes[r][(name, 64)]['p50_us']):.0f}" if (name, 64) in probes[r] else "–"
                       for r in range(1, rounds + 1))
        p99 = sep.join(f"{float(probes[r][(name, 64)]['p99_us']):.0f}" if (name, 64) in probes[r] else "–"
                       for r in range(1, rounds + 1))
        L.append(f"| `{name}` | {p50} | {p99} |")
    L.append("")
    for r in range(1, rounds + 1):
        best = min(((float(kv["p99_us"]), s) for (s, size), kv in probes[r].items() if size == 64),
                   default=None)
        one = rows.get(("prealloc", 1, r))
        old = rows.get(("append", 1, r))
        mem = rows.get(("memory", 1, r))
        if not (best and one):
            continue
        p99 = one[0]["latency_us"]["p99"]
        bound = 1.2 * best[0]
        text = (f"- Round {r}, 1 client: preallocated lock p99 {p99:.0f} µs vs 1.2 × the best durable "
                f"write's p99 (`{best[1]}`, {best[0]:.0f} µs) = {bound:.0f} µs → "
                f"{'met' if p99 <= bound else 'NOT met'}")
        if mem:
            m = mem[0]["latency_us"]["p99"]
            text += (f"; with the in-memory round trip added to the floor (p99 {m:.0f} µs): "
                     f"{p99:.0f} vs 1.2 × {best[0] + m:.0f} = {1.2 * (best[0] + m):.0f} µs → "
                     f"{'met' if p99 <= 1.2 * (best[0] + m) else 'NOT met'}")
        if old:
            text += f"; append + fdatasync p99 {old[0]['latency_us']['p99']:.0f} µs"
        L.append(text + ".")
    print("\n".join(L))


main()
