#!/usr/bin/env python3
"""Turns the `fsync-probe --compare --kv` runs that scripts/durable-bench.sh
--write-probe took (DIR/run.1.txt ... DIR/run.N.txt) into one markdown
table with the runs side by side, and names the floor (the lowest p99) of
each record size in each run.

Usage: scripts/write-probe-table.py DIR RUNS COUNT DISK_DIR"""
import datetime
import os
import platform
import subprocess
import sys

TODAY = "append+fdatasync"

DESCRIBE = {
    "append+fdatasync": "append, `pwrite` + `fdatasync` (the log today)",
    "fallocated+fdatasync": "`fallocate`d (unwritten extents), overwrite + `fdatasync`",
    "zeroed+fdatasync": "preallocated and zero-filled, overwrite + `fdatasync`",
    "zeroed+rwf_dsync": "preallocated, `pwritev2(RWF_DSYNC)`",
    "zeroed+o_dsync": "preallocated, opened `O_DSYNC`, `pwrite`",
    "zeroed+o_direct": "preallocated, `O_DIRECT\\|O_DSYNC`, `pwrite` of aligned 4 KiB blocks",
    "uring:append+fdatasync": "io_uring: append, linked `Write` → `Fsync(DATASYNC)` (what ringlockd submits today)",
    "uring:fallocated+fdatasync": "io_uring: `fallocate`d, linked `Write` → `Fsync(DATASYNC)`",
    "uring:zeroed+fdatasync": "io_uring: preallocated and zero-filled, linked `Write` → `Fsync(DATASYNC)`",
    "uring:zeroed+rwf_dsync": "io_uring: preallocated, one `Write` with `RWF_DSYNC`",
    "uring:zeroed+o_direct": "io_uring: preallocated, `O_DIRECT\\|O_DSYNC`, one `Write` of aligned 4 KiB blocks",
}


def describe(name):
    return DESCRIBE.get(name, name)


def parse(path):
    cases = {}
    for line in open(path):
        words = line.split()
        if not words or words[0] != "probe":
            continue
        kv = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        cases[(kv["strategy"], int(kv["size"]))] = kv
    return cases


def main():
    d, runs, count, disk_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    data = [parse(os.path.join(d, f"run.{r}.txt")) for r in range(1, runs + 1)]
    keys = list(data[0].keys())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    df = subprocess.run(["df", "-P", disk_dir], capture_output=True, text=True).stdout.split("\n")
    dev = df[1].split()[0] if len(df) > 1 and df[1] else "?"
    fs = subprocess.run(["findmnt", "-no", "FSTYPE", "-T", disk_dir],
                        capture_output=True, text=True).stdout.strip() or "?"
    L = []
    L.append("## Durable write strategies on this disk (`scripts/durable-bench.sh --write-probe`)\n")
    L.append(f"Run {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}, "
             f"commit {commit}{'+dirty' if dirty else ''}, kernel {platform.release()}, CPU {cpu}, "
             f"disk {dev} ({fs}), probe pinned to CPU 1. `fsync-probe --compare --count {count}`, "
             f"{runs} runs one after the other; within a run every (strategy, size) case takes "
             f"{count} samples interleaved with the others in 10 rounds, so noise hits all alike. "
             "One sample is one record made durable, at the next offset of its file. "
             "Figures are run 1 / run 2 / … in µs.\n")
    sep = " / "

    def col(s, size, field):
        vals = []
        for run in data:
            kv = run.get((s, size))
            vals.append(f"{float(kv[field]):.0f}" if kv and field in kv else "–")
        return sep.join(vals)

    def ratio(s, size):
        vals = []
        for run in data:
            kv, base = run.get((s, size)), run.get((TODAY, size))
            if kv and base and "p99_us" in kv and "p99_us" in base:
                vals.append(f"{float(kv['p99_us']) / float(base['p99_us']):.2f}")
            else:
                vals.append("–")
        return sep.join(vals)

    L.append("| strategy | what one durable write is | bytes | p50 µs | p99 µs | max µs | p99 ÷ today's |")
    L.append("|---|---|---:|---:|---:|---:|---:|")
    for (s, size) in keys:
        kv = data[0][(s, size)]
        if "unsupported" in kv:
            L.append(f"| `{s}` | {describe(s)} | {size} | unsupported: {kv['unsupported']} | | | |")
            continue
        L.append(f"| `{s}` | {describe(s)} | {size} | {col(s, size, 'p50_us')} | "
                 f"{col(s, size, 'p99_us')} | {col(s, size, 'max_us')} | {ratio(s, size)} |")
    L.append("")
    sizes = sorted({size for (_, size) in keys})
    for size in sizes:
        parts = []
        for i, run in enumerate(data, 1):
            measured = [(float(kv["p99_us"]), s) for (s, sz), kv in run.items()
                        if sz == size and "p99_us" in kv]
            if measured:
                p99, s = min(measured)
                parts.append(f"run {i}: `{s}` {p99:.0f} µs")
        L.append(f"- Lowest p99 at {size} B: " + "; ".join(parts) + ".")
    print("\n".join(L))


main()
