#!/usr/bin/env python3
"""kazoo-loadgen: ZooKeeper's lock recipe (kazoo's Lock), driven the way
ringlock-loadgen drives everything else, for the zookeeper-cluster rows of
scripts/cluster-bench.sh.

Each client is its own process (Python's GIL would serialise threads, and
its 5 ms switch interval would show up as latency) with its own
KazooClient (one ZooKeeper session, one TCP connection) and one kazoo
Lock on its own key (--dist private: client i uses key i, so no two
clients meet on a lock). A cycle is Lock.acquire() then Lock.release(),
closed loop (or open loop with --rate). kazoo 2.8's Lock, per cycle:
acquire = get_children (looks for a node left by an earlier try) +
create (ephemeral, sequential) + get_children (is ours the lowest?);
release = delete. The create and the delete are ZooKeeper writes (a
proposal the leader commits once a quorum has logged it, fsynced); the
get_children are reads the connected member answers from memory.

The command line is the subset of ringlock-loadgen's that this needs (same
names, units and defaults) and --json prints the same JSON line, field for
field, so the scripts read both alike. The lock paths (/PREFIX:KEY, the
recipe's parent znodes) are created once before the clock starts; so is
every client's session (its connect time is handshake_us).

Needs python3-kazoo (Debian). See docs/bench.md.
"""

import math
import multiprocessing as mp
import resource
import sys
import time

try:
    from kazoo.client import KazooClient
    from kazoo.exceptions import ConnectionLoss, LockTimeout, SessionExpiredError
except ImportError:
    sys.stderr.write("error: python3 module kazoo is missing (Debian package python3-kazoo)\n")
    sys.exit(2)

ERROR_PAUSE_NS = 1_000_000  # as ringlock-loadgen: a dead server is no busy loop

USAGE = """usage: kazoo-loadgen.py --target zk://HOST:PORT[,HOST:PORT...] [options]
  --connections N   clients: one process, one KazooClient (session), one Lock each (default 1)
  --rate R          total cycles/s over all clients, each gets R/N; 0 = closed loop (default 0)
  --duration D      measured time (default 10s; units ns/us/ms/s/m)
  --warmup D        unmeasured lead-in (default 1s)
  --drain D         wait for in-flight cycles after the end (default 5s)
  --keys N          key space size (default 1000; private: client i uses key i mod N)
  --dist private    the only distribution here (and the default): every client its own key
  --hold D          time inside the critical section (default 0)
  --conn-mode persistent   the only mode (a ZooKeeper session is a long-lived connection)
  --lock-ttl-ms MS  session timeout (default 30000; the server clamps it to its
                    min/maxSessionTimeout)
  --key-prefix P    key prefix (default lg): the lock of key K is the znode /P:K
  --seed N          accepted for compatibility (private keys draw nothing)
  --label TEXT      free text echoed in the report
  --json            last stdout line: one JSON object, ringlock-loadgen's fields
  --hgrm FILE       write the lock-latency percentile distribution as .hgrm
  --no-progress     accepted (this client prints no progress)
"""


def parse_duration_ns(s):
    s = s.strip()
    i = 0
    while i < len(s) and (s[i].isdigit() or s[i] == "."):
        i += 1
    try:
        v = float(s[:i])
    except ValueError:
        raise SystemExit(f"error: bad duration {s!r}")
    scale = {"": 1e9, "s": 1e9, "ms": 1e6, "us": 1e3, "µs": 1e3, "ns": 1.0, "m": 60e9, "min": 60e9}.get(s[i:])
    if scale is None or v < 0 or math.isinf(v):
        raise SystemExit(f"error: bad duration {s!r} (use ns, us, ms, s, m)")
    return int(round(v * scale))


def parse_args(argv):
    cfg = {
        "target": None, "connections": 1, "rate": 0.0, "duration": 10_000_000_000,
        "warmup": 1_000_000_000, "drain": 5_000_000_000, "keys": 1000, "dist": "private",
        "hold": 0, "conn_mode": "persistent", "lock_ttl_ms": 30000, "key_prefix": "lg",
        "seed": 1, "label": "", "json": False, "hgrm": None,
    }
    it = iter(argv)
    for a in it:
        if a in ("-h", "--help"):
            sys.stdout.write(USAGE)
            sys.exit(0)
        if a in ("--json",):
            cfg["json"] = True
            continue
        if a in ("--no-progress",):
            continue
        name = a[2:].replace("-", "_") if a.startswith("--") else None
        if name not in cfg:
            sys.stderr.write(f"error: unknown option {a}\n{USAGE}")
            sys.exit(2)
        try:
            v = next(it)
        except StopIteration:
            sys.stderr.write(f"error: {a} needs a value\n")
            sys.exit(2)
        if name in ("duration", "warmup", "drain", "hold"):
            cfg[name] = parse_duration_ns(v)
        elif name in ("connections", "keys", "lock_ttl_ms", "seed"):
            cfg[name] = int(v)
        elif name == "rate":
            cfg[name] = float(v)
        else:
            cfg[name] = v
    t = cfg["target"] or ""
    if not t.startswith("zk://") or len(t) == len("zk://"):
        sys.stderr.write("error: --target zk://HOST:PORT[,HOST:PORT...] is required\n")
        sys.exit(2)
    if cfg["connections"] < 1 or cfg["keys"] < 1:
        sys.stderr.write("error: --connections and --keys must be at least 1\n")
        sys.exit(2)
    if cfg["dist"] != "private":
        sys.stderr.write("error: --dist: only private here (every client its own key)\n")
        sys.exit(2)
    if cfg["conn_mode"] != "persistent":
        sys.stderr.write("error: --conn-mode: only persistent\n")
        sys.exit(2)
    if cfg["rate"] < 0:
        sys.stderr.write("error: --rate must be >= 0\n")
        sys.exit(2)
    cfg["hosts"] = t[len("zk://"):]
    return cfg


def lock_path(cfg, key):
    return f"/{cfg['key_prefix']}:{key}"


def sleep_until(at_ns):
    d = at_ns - time.monotonic_ns()
    if d > 0:
        time.sleep(d / 1e9)


def error_kind(exc, now, deadline):
    if isinstance(exc, LockTimeout) and now >= deadline - 1_000_000:
        return "incomplete"
    if isinstance(exc, (ConnectionLoss, SessionExpiredError)):
        return "io"
    return "server"


def client_main(cid, cfg, conn):
    """One client: its own process, session and lock. Talks to the parent
    over conn: ready (+ connect time) -> schedule -> results."""
    r = {"lock": [], "lock_uncorrected": [], "unlock": [], "cycle": [], "cycles": 0,
         "cycles_all": 0, "grants": 0, "errors": {"server": 0, "io": 0, "incomplete": 0},
         "first_error": None, "first_error_ns": 0, "last_done": 0}
    try:
        t0 = time.monotonic_ns()
        zk = KazooClient(hosts=cfg["hosts"], timeout=max(cfg["lock_ttl_ms"], 1000) / 1000.0)
        zk.start(timeout=30)
        lock = zk.Lock(lock_path(cfg, cid % cfg["keys"]), identifier=f"c{cid}")
        conn.send(("ready", time.monotonic_ns() - t0))
    except Exception as e:  # noqa: BLE001 - reported to the parent as is
        conn.send(("failed", f"client {cid}: connect to {cfg['hosts']}: {e!r}"))
        return
    start, warm_end, end, deadline = conn.recv()
    period = 0
    if cfg["rate"] > 0:
        period = max(1, round(1e9 / (cfg["rate"] / cfg["connections"])))
    nxt = start + (period * cid // cfg["connections"] if period else 0)
    hold = cfg["hold"]

    def note(msg):
        if r["first_error"] is None:
            r["first_error"], r["first_error_ns"] = msg, time.monotonic_ns()

    while nxt < end:
        sleep_until(nxt)
        intended = nxt
        measured = intended >= warm_end
        failed = False
        first_send = time.monotonic_ns()
        try:
            got = lock.acquire(timeout=max(0.0, (deadline - first_send) / 1e9))
            now = time.monotonic_ns()
            if not got:
                raise LockTimeout("acquire returned False")
        except Exception as e:  # noqa: BLE001 - every failure is counted
            now = time.monotonic_ns()
            failed = True
            kind = error_kind(e, now, deadline)
            if measured:
                r["errors"][kind] += 1
                if kind == "incomplete":
                    r["lock"].append(now - intended)
                    r["lock_uncorrected"].append(now - first_send)
            note(f"Lock: {e!r}")
        if not failed:
            if measured:
                r["grants"] += 1
                r["lock"].append(now - intended)
                r["lock_uncorrected"].append(now - first_send)
            unlock_due = now + hold
            if hold > 0:
                sleep_until(unlock_due)
            try:
                lock.release()
                now = time.monotonic_ns()
                r["cycles_all"] += 1
                if measured:
                    r["cycles"] += 1
                    r["unlock"].append(now - unlock_due)
                    r["cycle"].append(now - intended)
            except Exception as e:  # noqa: BLE001
                now = time.monotonic_ns()
                failed = True
                if measured:
                    r["errors"][error_kind(e, now, deadline)] += 1
                note(f"Unlock: {e!r}")
        r["last_done"] = now
        if now >= deadline:
            break
        nxt = intended + period if period else now
        if failed:
            nxt = max(nxt, now + ERROR_PAUSE_NS)
    conn.send(("done", r))
    try:
        zk.stop()
        zk.close()
    except Exception:  # noqa: BLE001 - the run is over
        pass


def pct(v, p):
    n = len(v)
    if n == 0:
        return 0.0
    if p >= 100:
        return v[-1] / 1e3
    rank = max(1, math.ceil(p / 100 * n))
    return v[rank - 1] / 1e3


PERCENTILES = [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9), ("p9999", 99.99), ("max", 100.0)]
CURVE = [0, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99, 99.995, 99.999, 100]


def json_hist(name, v):
    parts = [f'"{name}":{{"count":{len(v)}']
    for label, p in PERCENTILES:
        parts.append(f',"{label}":{pct(v, p):.3f}')
    mean = (sum(v) / len(v) / 1e3) if v else 0.0
    parts.append(f',"mean":{mean:.3f}}}')
    return "".join(parts)


def json_str(s):
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def fmt_num(x):
    """A number as Rust's `{}` prints an f64 (1000.0 -> 1000, 0.5 -> 0.5)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def hgrm(v):
    lines = ["       Value     Percentile TotalCount 1/(1-Percentile)", ""]
    n = len(v)
    if n:
        q = 0.0
        while True:
            rank = max(1, math.ceil(q * n))
            inv = "inf" if q >= 1 else f"{1 / (1 - q):.2f}"
            lines.append(f"{v[rank - 1] / 1e3:12.3f} {q:14.12f} {rank:10d} {inv:>14}")
            if q >= 1 or rank >= n:
                if q < 1:
                    lines.append(f"{v[-1] / 1e3:12.3f} {1.0:14.12f} {n:10d} {'inf':>14}")
                break
            half = 2 ** (math.floor(math.log2(1 / (1 - q))) + 1)
            q = min(1.0, q + 1 / (half * 5))
        mean = sum(v) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in v) / n)
        lines.append(f"#[Mean    = {mean / 1e3:12.3f}, StdDeviation   = {sd / 1e3:12.3f}]")
        lines.append(f"#[Max     = {v[-1] / 1e3:12.3f}, Total count    = {n:12d}]")
    return "\n".join(lines) + "\n"


def main():
    cfg = parse_args(sys.argv[1:])
    n = cfg["connections"]
    # The lock paths (the recipe's parent znodes) exist before the clock starts.
    setup = KazooClient(hosts=cfg["hosts"], timeout=30.0)
    try:
        setup.start(timeout=30)
        for k in sorted({c % cfg["keys"] for c in range(n)}):
            setup.ensure_path(lock_path(cfg, k))
    except Exception as e:  # noqa: BLE001
        sys.stderr.write(f"error: setting up the lock paths on {cfg['hosts']}: {e!r}\n")
        sys.exit(1)
    finally:
        setup.stop()
        setup.close()

    ctx = mp.get_context("fork")
    procs, conns = [], []
    for cid in range(n):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=client_main, args=(cid, cfg, child), daemon=True)
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
    handshake = []
    for c in conns:
        try:
            msg = c.recv()
        except EOFError:
            msg = ("failed", "a client process died before it was connected")
        if msg[0] != "ready":
            sys.stderr.write(f"error: {msg[1]}\n")
            for p in procs:
                p.kill()
            sys.exit(1)
        handshake.append(msg[1])
    # Every client starts together; the first cycles are due 50 ms from now.
    start = time.monotonic_ns() + 50_000_000
    warm_end = start + cfg["warmup"]
    end = warm_end + cfg["duration"]
    deadline = end + cfg["drain"]
    for c in conns:
        c.send((start, warm_end, end, deadline))
    results = []
    for cid, c in enumerate(conns):
        try:
            msg = c.recv()
        except EOFError:
            sys.stderr.write(f"error: client process {cid} died during the run\n")
            sys.exit(1)
        results.append(msg[1])
    for p in procs:
        p.join(timeout=10)
    ended = time.monotonic_ns()
    ru_self = resource.getrusage(resource.RUSAGE_SELF)
    ru_kids = resource.getrusage(resource.RUSAGE_CHILDREN)

    lock, unc, unlock, cycle = [], [], [], []
    cycles = cycles_all = grants = 0
    errs = {"server": 0, "io": 0, "incomplete": 0}
    first_err, first_err_ns, last_done = None, 0, 0
    grants_per_client = []
    for r in results:
        lock += r["lock"]
        unc += r["lock_uncorrected"]
        unlock += r["unlock"]
        cycle += r["cycle"]
        cycles += r["cycles"]
        cycles_all += r["cycles_all"]
        grants += r["grants"]
        grants_per_client.append(r["grants"])
        for k in errs:
            errs[k] += r["errors"][k]
        if r["first_error"] is not None and (first_err is None or r["first_error_ns"] < first_err_ns):
            first_err, first_err_ns = r["first_error"], r["first_error_ns"]
        last_done = max(last_done, r["last_done"])
    for v in (lock, unc, unlock, cycle, handshake):
        v.sort()
    drain = max(0, last_done - end)
    ops = cycles / ((cfg["duration"] + drain) / 1e9) if cfg["duration"] + drain > 0 else 0.0
    total_err = sum(errs.values())
    gsum = sum(grants_per_client)
    gsq = sum(g * g for g in grants_per_client)
    jain = gsum * gsum / (len(grants_per_client) * gsq) if gsq > 0 else 0.0
    if cfg["hgrm"]:
        with open(cfg["hgrm"], "w") as f:
            f.write(hgrm(lock))

    mode = f"open-loop rate={fmt_num(cfg['rate'])}/s" if cfg["rate"] > 0 else "closed-loop"
    print(f"target zk://{cfg['hosts']} (kazoo Lock, one process per client)  {mode}  connections={n} "
          f"persistent mix=lock-unlock keys={cfg['keys']} dist=private hold={cfg['hold'] / 1e3:g}us")
    print(f"cycles {cycles} in {cfg['duration'] / 1e9:.2f}s = {ops:.1f}/s   grants {grants}  connects {n}")
    print(f"{'latency (us)':<24}{'count':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'p99.9':>10}{'p99.99':>10}{'max':>10}")
    for name, v in (("lock", lock), ("unlock", unlock), ("cycle", cycle), ("connect + session", handshake)):
        print(f"{name:<24}{len(v):>10}" + "".join(f"{pct(v, p):>10.1f}" for _, p in PERCENTILES))
    print(f"errors {total_err} (server {errs['server']}, io {errs['io']}, incomplete {errs['incomplete']})")
    if first_err:
        print(f"first error: {first_err}")
    if cfg["json"]:
        j = ["{"]
        j.append(f'"target":{json_str("zk://" + cfg["hosts"])},"label":{json_str(cfg["label"])},'
                 f'"connections":{n},"threads":{n},"rate_target":{fmt_num(cfg["rate"])},'
                 f'"mode":"{"open" if cfg["rate"] > 0 else "closed"}","conn_mode":"persistent",'
                 f'"mix":"lock-unlock","keys":{cfg["keys"]},"dist":"private","hold_us":{cfg["hold"] / 1e3:.3f},'
                 f'"duration_s":{cfg["duration"] / 1e9:.3f},"warmup_s":{cfg["warmup"] / 1e9:.3f},')
        j.append('"tls":false,"tls_client":null,"cycles_cap":null,')
        j.append(f'"ops_per_sec":{ops:.1f},"cycles":{cycles},"cycles_all":{cycles_all},"grants":{grants},'
                 f'"busy":0,"retries":0,"connects":{n},"errors":{total_err},'
                 f'"error_detail":{{"server":{errs["server"]},"connect":0,"tls":0,"io":{errs["io"]},'
                 f'"protocol":0,"not_held":0,"incomplete":{errs["incomplete"]}}},'
                 f'"first_error":{json_str(first_err) if first_err else "null"},'
                 f'"fairness":{{"min":{min(grants_per_client)},"max":{max(grants_per_client)},"jain":{jain:.4f}}},'
                 f'"drain_s":{drain / 1e9:.3f},"run_start_mono_ns":{start},"run_end_mono_ns":{ended},'
                 f'"loadgen_cpu_s":{{"user":{ru_self.ru_utime + ru_kids.ru_utime:.3f},'
                 f'"sys":{ru_self.ru_stime + ru_kids.ru_stime:.3f}}},')
        j.append(",".join([json_hist("latency_us", lock), json_hist("latency_uncorrected_us", unc),
                           json_hist("unlock_us", unlock), json_hist("cycle_us", cycle),
                           json_hist("queue_wait_us", []), json_hist("handoff_us", []),
                           json_hist("handshake_us", handshake)]))
        j.append(',"curve_us":[' + ",".join(f"[{fmt_num(p)},{pct(lock, p):.3f}]" for p in CURVE) + "]")
        impl = f"kazoo Lock (python {sys.version.split()[0]}), one process per client"
        j.append(f',"client_impl":{json_str(impl)},"processes":{n}}}')
        print("".join(j))
    if cycles_all == 0 and grants == 0 and total_err > 0:
        sys.stderr.write(f"error: every request failed: {total_err} errors; first error: {first_err}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
