#!/usr/bin/env bash
# Durable-mode benchmark: lock+unlock latency of ringlockd with a
# write-ahead log at 1, 8, 64 and 256 concurrent clients, fdatasyncs per
# second beside grants per second (the group-commit factor), and the
# fdatasync latency of the same disk measured in the same run. The in-memory
# ringlockd at 1 client is measured in the same run as the reference for the
# 1-client goal: p99 <= 1.5 x (fdatasync p99 + in-memory p99).
#
# Usage: scripts/durable-bench.sh [--duration 5s] [--out bench/results/durable.md]
#        scripts/durable-bench.sh --write-probe [--probe-runs 3] [--probe-count 1000]
#            [--out bench/results/durable-write.md]
# Server pinned to CPU 1, load generator to CPU 0 (2-vCPU machine).
#
# --write-probe measures only the disk: every durable write strategy a log
# could use (append + fdatasync as today, preallocated and overwritten in
# place, RWF_DSYNC, O_DSYNC, O_DIRECT, each also through io_uring) at 64 B
# and 4 KiB records, interleaved in one run of `fsync-probe --compare`,
# repeated --probe-runs times; prints one table with the runs side by side.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=5s
out=
clients="1 8 64 256"
write_probe=0
probe_runs=3
probe_count=1000
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --clients) clients="$2"; shift 2 ;;
    --write-probe) write_probe=1; shift ;;
    --probe-runs) probe_runs="$2"; shift 2 ;;
    --probe-count) probe_count="$2"; shift 2 ;;
    -h|--help) sed -n 2,20p "$0"; exit 0 ;;
    *) echo "durable-bench: unknown argument $1" >&2; exit 64 ;;
  esac
done

if [ "$write_probe" = 1 ]; then
  out=${out:-bench/results/durable-write.md}
  cargo build --release --locked -p ringlock-bench --bin fsync-probe >&2
  work=$(mktemp -d "${TMPDIR:-/tmp}/ringlock-write-probe.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  for r in $(seq "$probe_runs"); do
    echo "write probe run $r of $probe_runs" >&2
    taskset -c 1 target/release/fsync-probe --compare --kv --count "$probe_count" "$work" \
      >"$work/run.$r.txt"
  done
  mkdir -p "$(dirname "$out")"
  python3 scripts/write-probe-table.py "$work" "$probe_runs" "$probe_count" "$work" >"$out"
  cat "$out"
  if [ "$out" = bench/results/durable-write.md ]; then
    # RESULTS.md keeps its own title for the section.
    tail -n +2 "$out" >"$work/body.md"
    python3 scripts/results-splice.py durable-write "$work/body.md" RESULTS.md >&2
  fi
  exit 0
fi
out=${out:-bench/results/durable.md}

cargo build --release --locked -p ringlock -p ringlock-loadgen -p ringlock-bench >&2
bin=target/release
work=$(mktemp -d "${TMPDIR:-/tmp}/ringlock-durable.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

runs=0
start_server() { # $1 = extra args; sets srv_pid, addr, metrics (ephemeral ports)
  runs=$((runs + 1))
  local log="$work/server.$runs.log"
  taskset -c 1 "$bin/ringlockd" --bind 127.0.0.1:0 --admin-bind 127.0.0.1:0 \
    --metrics-bind 127.0.0.1:0 --max-connections 2000 $1 2>"$log" &
  srv_pid=$!
  pids+=("$srv_pid")
  for _ in $(seq 200); do grep -q event=listening "$log" 2>/dev/null && break; sleep 0.05; done
  grep -q event=listening "$log" || { cat "$log" >&2; exit 1; }
  addr=$(grep -o ' lock=[^ ]*' "$log" | head -1 | cut -d= -f2)
  metrics="http://$(grep -o ' metrics=[^ ]*' "$log" | head -1 | cut -d= -f2)/metrics"
}
stop_server() { kill "$srv_pid"; wait "$srv_pid" 2>/dev/null || true; }
scrape() { # prints "grants fsyncs records"
  python3 - "$metrics" <<'EOF'
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
v = {}
for line in text.splitlines():
    if line.startswith('#') or ' ' not in line: continue
    name, val = line.rsplit(' ', 1)
    v[name] = float(val)
print(int(v.get('ringlock_grants_total', 0)), int(v.get('ringlock_wal_fdatasync_seconds_count', 0)),
      int(v.get('ringlock_wal_batch_records_sum', 0)))
EOF
}
loadgen() { # $1 = connections; prints the JSON line
  taskset -c 0 "$bin/ringlock-loadgen" --target "ringlock://$addr" --connections "$1" \
    --duration "$duration" --warmup 1s --conn-mode persistent --dist private --keys "$1" \
    --no-progress --json | tail -1
}

probe=$("$bin/fsync-probe" "$work" 500)
echo "fsync probe: $probe" >&2

start_server ""
mem_json=$(loadgen 1)
stop_server

rows=()
for n in $clients; do
  rm -f "$work/locks.wal"
  start_server "--data-path $work/locks.wal"
  read -r g0 f0 r0 < <(scrape)
  json=$(loadgen "$n")
  read -r g1 f1 r1 < <(scrape)
  stop_server
  rows+=("$n|$json|$((g1 - g0))|$((f1 - f0))|$((r1 - r0))")
  echo "clients=$n grants=$((g1 - g0)) fdatasyncs=$((f1 - f0))" >&2
done

# Compaction under load: 10 000 keys held (a 0.5 MB snapshot), 64 clients
# cycling on their own keys; once with compaction effectively off, once with
# a 256 KiB floor so the log is rewritten every ~0.5 MB of appends.
preload() { # holds 10 000 keys through 16 connections
  python3 - "$addr" <<'PY'
import socket, sys, threading
host, port = sys.argv[1].rsplit(':', 1)
def run(t):
    s = socket.create_connection((host, int(port)))
    for i in range(625):
        k = f'held-{t}-{i}'.encode()
        s.sendall(bytes([1, len(k)]) + k + bytes([4]) + b'load')
        assert s.recv(1) == b'+'
ts = [threading.Thread(target=run, args=(t,)) for t in range(16)]
[t.start() for t in ts]; [t.join() for t in ts]
PY
}
compaction_rows=()
for floor in 1000000000000 262144; do
  rm -f "$work/locks.wal"
  start_server "--data-path $work/locks.wal --compact-floor-bytes $floor"
  preload
  c0=$(python3 -c "import urllib.request,sys; t=urllib.request.urlopen('$metrics').read().decode(); print(int(float([l.split()[-1] for l in t.splitlines() if l.startswith('ringlock_wal_compactions_total')][0])))")
  json=$(loadgen 64)
  c1=$(python3 -c "import urllib.request,sys; t=urllib.request.urlopen('$metrics').read().decode(); print(int(float([l.split()[-1] for l in t.splitlines() if l.startswith('ringlock_wal_compactions_total')][0])))")
  stop_server
  compaction_rows+=("$floor|$json|$((c1 - c0))")
  echo "compaction floor=$floor compactions=$((c1 - c0))" >&2
done

mkdir -p "$(dirname "$out")"
python3 - "$out" "$duration" "$probe" "$mem_json" "${compaction_rows[0]}" "${compaction_rows[1]}" "${rows[@]}" <<'EOF'
import json, subprocess, sys, platform, datetime
out, duration, probe, mem_json, comp_off, comp_on = sys.argv[1:7]
rows = sys.argv[7:]
p = dict(kv.split('=') for kv in probe.split() if '=' in kv)
mem = json.loads(mem_json)
commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()
dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], capture_output=True, text=True).stdout.strip()
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
secs = float(duration.rstrip('s')) if duration.endswith('s') and not duration.endswith('ms') else None
L = []
L.append('## Durable mode: group commit (`scripts/durable-bench.sh`)\n')
L.append(f'Run {datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")}, commit {commit}{"+dirty" if dirty else ""}, '
         f'kernel {platform.release()}, CPU {cpu} (2 vCPU), ringlockd pinned to CPU 1 and ringlock-loadgen to CPU 0. '
         f'Closed loop, persistent connections, each client locks and unlocks its own key (no contention), '
         f'{duration} measured after 1 s warm-up; log on the same ext4 disk as /tmp.\n')
L.append(f'fdatasync of this disk in the same run (`fsync-probe`, 4 KiB append + fdatasync, 500 samples): '
         f'p50 {float(p["p50_us"]):.0f} µs, p99 {float(p["p99_us"]):.0f} µs, max {float(p["max_us"]):.0f} µs.\n')
ml = mem['latency_us']
L.append(f'In-memory ringlockd, 1 client, same run: lock p50 {ml["p50"]:.1f} µs, p99 {ml["p99"]:.1f} µs.\n')
L.append('| clients | cycles/s | lock p50 µs | lock p99 µs | lock p99.9 µs | unlock p99 µs | grants/s | fdatasyncs/s | grants per fdatasync | records per fdatasync | errors |')
L.append('|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
goal = []
for r in rows:
    n, j, g, f, rec = r.split('|')
    j = json.loads(j); g, f, rec = int(g), int(f), int(rec)
    lat, un = j['latency_us'], j['unlock_us']
    span = j['duration_s'] + j.get('warmup_s', 0) + j.get('drain_s', 0)
    L.append(f'| {n} | {j["ops_per_sec"]:.0f} | {lat["p50"]:.0f} | {lat["p99"]:.0f} | {lat["p999"]:.0f} | {un["p99"]:.0f} | '
             f'{g/span:.0f} | {f/span:.0f} | {g/max(f,1):.1f} | {rec/max(f,1):.1f} | {j["errors"]} |')
    if n == '1':
        bound = 1.5 * (float(p['p99_us']) + ml['p99'])
        goal.append(f'1 client: durable p99 {lat["p99"]:.0f} µs vs 1.5 × (fdatasync p99 {float(p["p99_us"]):.0f} + in-memory p99 {ml["p99"]:.0f}) = {bound:.0f} µs → {"met" if lat["p99"] <= bound else "NOT met"}.')
    if n == '64':
        goal.append(f'64 clients: {g/max(f,1):.1f} grants per fdatasync (goal ≥ 8) → {"met" if g/max(f,1) >= 8 else "NOT met"}.')
L.append('')
L.append('Grants and fdatasyncs are deltas of the server\'s own counters (`ringlock_grants_total`, `ringlock_wal_fdatasync_seconds_count`) over warm-up + measured time; a cycle is one grant and one release, i.e. two log records.\n')
L += ['- ' + g for g in goal]
L.append('')
L.append('### p99 during compaction\n')
L.append('10 000 keys held (≈0.5 MB of live records), then 64 clients cycle lock+unlock on their own keys. '
         'The same run once with compaction off (`--compact-floor-bytes 1000000000000`) and once with a 256 KiB floor, '
         'so the log is rewritten (temp file, fdatasync, rename, directory fsync, all through the ring) every ≈0.5 MB of appends.\n')
L.append('| compaction | compactions in the run | cycles/s | lock p50 µs | lock p99 µs | lock p99.9 µs | max µs |')
L.append('|---|---:|---:|---:|---:|---:|---:|')
for label, r in (('off', comp_off), ('every ≈0.5 MB', comp_on)):
    floor, j, n = r.split('|')
    j = json.loads(j); lat = j['latency_us']
    L.append(f'| {label} | {n} | {j["ops_per_sec"]:.0f} | {lat["p50"]:.0f} | {lat["p99"]:.0f} | {lat["p999"]:.0f} | {lat["max"]:.0f} |')
open(out, 'w').write('\n'.join(L) + '\n')
print('\n'.join(L))
EOF
if [ "$out" = bench/results/durable.md ]; then
  # RESULTS.md shows this run's section (its own title stays in RESULTS.md).
  tail -n +2 "$out" > "$work/durable-body.md"
  python3 scripts/results-splice.py durable "$work/durable-body.md" RESULTS.md
fi
