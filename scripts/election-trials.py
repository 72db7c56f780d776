#!/usr/bin/env python3
"""Leader hand-over trials for scripts/election-bench.sh (run by it).

Per trial, on a fresh election name:
  1. an observer (`elect --listen`) starts, then candidate A campaigns;
     A is elected (its first output line) and the observer names A;
  2. candidate B campaigns and is seen queued on the server (ringlock: the
     ringlock_queued_waiters gauge of some node is 1; etcd: two keys under
     the election's prefix);
  3. after KILL_DELAY (uniform in [0, --kill-spread-ms)), kill(2) SIGKILL
     of A's client process (the campaigning `ringlock elect` / `etcdctl`,
     not its process group);
  4. the times from just before kill(2) to B's first output line (B's CMD
     started, or etcdctl elect printed that it won) and to the observer's
     first line that names B.
Every time is CLOCK_MONOTONIC (time.monotonic_ns) in this process, taken
when it reads a line from a pipe (select); the clients inherit this
process's CPU affinity. A trial that does not finish within --timeout-s
of the kill (or a set-up step within the same bound) is an error row.

Kinds:
  ringlock    ringlock elect NAME VALUE -- sh -c 'echo elected; exec sleep 1000',
              observer ringlock elect --listen --json NAME (leader.value)
  etcd-elect  etcdctl elect NAME VALUE (prints the leader key, then VALUE,
              when elected; runs no command), observer etcdctl elect
              --listen NAME (key and value lines of each leader)
  etcd-lock   etcdctl lock --ttl T NAME -- sh -c 'echo "elected $ETCD_LOCK_KEY";
              exec sleep 1000' (the one etcdctl command with a TTL flag),
              observer etcdctl elect --listen NAME (its key lines)

Writes one CSV row per trial (header first):
  system,trial,kill_delay_ms,elected_ms,told_ms,a_gone_ms,granted_ttl_s,error
a_gone_ms: kill to end-of-file on A's stdout, i.e. A's client and every
process that shares its stdout (its CMD) are gone; empty if that did not
happen before the trial ended (etcdctl lock leaves its CMD running).
granted_ttl_s (etcd): the TTL etcd granted A's session lease.
"""

import argparse
import base64
import csv
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
import urllib.request


def now():
    return time.monotonic_ns()


class TrialError(Exception):
    pass


# Every client started and not yet stopped (a signal kills their groups).
LIVE = set()


def on_signal(signum, _frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for p in list(LIVE):
        p.signal_group(signal.SIGKILL)
    os._exit(128 + signum)


class Proc:
    """A client process whose stdout is read line by line, each line
    timestamped when read."""

    def __init__(self, name, argv, errpath):
        self.name = name
        with open(errpath, "ab") as err:
            self.p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,  # its own process group, for the clean-up
            )
        LIVE.add(self)
        self.fd = self.p.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.buf = b""
        self.lines = []  # (monotonic ns, text)
        self.eof = None  # monotonic ns of end of file

    def fileno(self):
        return self.fd

    def pump(self):
        t = now()
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                self.eof = t
                return
            self.buf += chunk
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                self.lines.append((t, line.decode("utf-8", "replace")))

    def signal_group(self, sig):
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self):
        """SIGTERM to its process group (a graceful resign), SIGKILL after
        5 s; reaps it and closes the pipe."""
        if self.p.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left in its group (etcdctl lock's orphaned CMD).
        self.signal_group(signal.SIGKILL)
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.p.stdout.close()
        LIVE.discard(self)


def wait_for(procs, what, deadline, done):
    """Reads the processes' output until done() is true; TrialError past
    deadline (monotonic ns)."""
    while not done():
        left = deadline - now()
        if left <= 0:
            raise TrialError(f"timed out waiting for {what}")
        open_ = [p for p in procs if p.eof is None]
        if not open_:
            time.sleep(min(left / 1e9, 0.01))
            continue
        ready, _, _ = select.select(open_, [], [], min(left / 1e9, 0.02))
        for p in ready:
            p.pump()


def read_for(procs, until, stop=lambda: False):
    """Reads the processes' output until the monotonic time until (or
    stop() is true)."""
    while not stop():
        left = until - now()
        if left <= 0:
            return
        ready, _, _ = select.select([p for p in procs if p.eof is None], [], [], min(left / 1e9, 0.02))
        for p in ready:
            p.pump()


def poll_until(what, deadline, probe, procs=()):
    """probe() every 10 ms until true (reading the processes' output
    meanwhile); TrialError past deadline."""
    while True:
        if probe():
            return
        if now() >= deadline:
            raise TrialError(f"timed out waiting for {what}")
        ready, _, _ = select.select([p for p in procs if p.eof is None], [], [], 0.01)
        for p in ready:
            p.pump()


def first_line(p, pred=lambda t, line: True):
    for t, line in p.lines:
        if pred(t, line):
            return t, line
    return None


def http_post_json(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=2) as r:
        return json.loads(r.read())


def b64(s):
    return base64.b64encode(s.encode()).decode()


class Ringlock:
    def __init__(self, a):
        self.base = [a.ringlock, "--addr", a.addr]
        self.metrics = a.metrics.split(",")

    def candidate(self, name, value):
        return self.base + ["elect", name, value, "--", "sh", "-c", "echo elected; exec sleep 1000"]

    def observer(self, name):
        return self.base + ["elect", "--listen", "--json", name]

    def ident(self, value, line):
        return value

    @staticmethod
    def observer_ready(obs):
        return bool(obs.lines)

    @staticmethod
    def obs_ident(line):
        try:
            leader = json.loads(line)["leader"]
        except (ValueError, KeyError, TypeError):
            return None
        return leader.get("value") if leader else None

    def queued(self, name):
        most = 0
        for m in self.metrics:
            try:
                with urllib.request.urlopen(f"http://{m}/metrics", timeout=2) as r:
                    for line in r.read().decode().splitlines():
                        if line.startswith("ringlock_queued_waiters "):
                            most = max(most, float(line.split()[1]))
            except OSError:
                pass  # a node that does not answer: the others say
        return most

    def granted_ttl(self, name):
        return ""


class Etcd:
    def __init__(self, a, lock_ttl=None):
        self.base = [a.etcdctl, "--endpoints", a.endpoint]
        self.http = f"http://{a.endpoint}"
        self.lock_ttl = lock_ttl

    def candidate(self, name, value):
        if self.lock_ttl is None:
            return self.base + ["elect", name, value]
        return self.base + [
            "lock", "--ttl", str(self.lock_ttl), name, "--",
            "sh", "-c", 'echo "elected $ETCD_LOCK_KEY"; exec sleep 1000',
        ]

    def observer(self, name):
        return self.base + ["elect", "--listen", name]

    def ident(self, value, line):
        # elect: the observer's value line; lock: the holder's key (the
        # observer prints it, the value is empty).
        if self.lock_ttl is None:
            return value
        return line.split(" ", 1)[1] if line.startswith("elected ") else None

    @staticmethod
    def obs_ident(line):
        return line

    @staticmethod
    def observer_ready(obs):
        return True  # it prints nothing until somebody leads

    def keys(self, name):
        pfx = name + "/"
        end = name + "0"  # "/" + 1
        r = http_post_json(f"{self.http}/v3/kv/range", {"key": b64(pfx), "range_end": b64(end)})
        return r.get("kvs", [])

    def queued(self, name):
        try:
            return len(self.keys(name)) - 1
        except OSError:
            return 0

    def granted_ttl(self, name):
        try:
            kvs = sorted(self.keys(name), key=lambda kv: int(kv["create_revision"]))
            lease = int(kvs[0]["lease"])
            r = http_post_json(f"{self.http}/v3/lease/timetolive", {"ID": lease})
            return r.get("grantedTTL", "")
        except (OSError, KeyError, IndexError, ValueError):
            return ""


def trial(a, sysm, n, rnd):
    name = f"{a.name_prefix}-{n}"
    err = os.path.join(a.logs, f"{a.system}-t{n}")
    procs = []
    row = {"system": a.system, "trial": n, "kill_delay_ms": "", "elected_ms": "", "told_ms": "",
           "a_gone_ms": "", "granted_ttl_s": "", "error": ""}
    stage = "set-up"
    try:
        setup = now() + int(a.timeout_s * 1e9)
        obs = Proc("observer", sysm.observer(name), err + "-observer.err")
        procs.append(obs)
        # ringlock's observer prints the leader (none) once it watches: A
        # campaigns after that. (A watch opened while the key changes can
        # fail: "the server sent a granted event before the watch's answer".)
        wait_for(procs, "the observer's first line", setup, lambda: sysm.observer_ready(obs))
        ca = Proc("A", sysm.candidate(name, "A"), err + "-A.err")
        procs.append(ca)
        wait_for(procs, "A elected", setup, lambda: ca.lines)
        a_id = sysm.ident("A", ca.lines[0][1])
        if a_id is None:
            raise TrialError(f"A's first line is not an election: {ca.lines[0][1]!r}")
        wait_for(procs, "the observer to name A", setup,
                 lambda: first_line(obs, lambda t, l: sysm.obs_ident(l) == a_id))
        row["granted_ttl_s"] = sysm.granted_ttl(name)
        # Nobody else waits (ringlock's gauge counts every key's waiters).
        poll_until("no queued campaign before B", setup, lambda: sysm.queued(name) == 0, procs)
        cb = Proc("B", sysm.candidate(name, "B"), err + "-B.err")
        procs.append(cb)
        poll_until("B queued", setup, lambda: sysm.queued(name) >= 1, procs)
        delay = rnd.uniform(0, a.kill_spread_ms) if a.kill_spread_ms > 0 else 0.0
        row["kill_delay_ms"] = f"{delay:.1f}"
        read_for(procs, now() + int(delay * 1e6))
        if cb.lines:
            raise TrialError("B was elected while A led")

        stage = "hand-over"
        t0 = now()
        os.kill(ca.p.pid, signal.SIGKILL)
        for pid in a.kill_also:
            os.kill(pid, signal.SIGKILL)
        deadline = t0 + int(a.timeout_s * 1e9)
        b_id = None

        def told():
            return first_line(obs, lambda t, l: t >= t0 and sysm.obs_ident(l) == b_id)

        def done():
            nonlocal b_id
            if cb.lines and b_id is None:
                b_id = sysm.ident("B", cb.lines[0][1])
                if b_id is None:
                    raise TrialError(f"B's first line is not an election: {cb.lines[0][1]!r}")
            return b_id is not None and told() is not None

        wait_for(procs, "B elected and the observer naming B", deadline, done)
        row["elected_ms"] = f"{(cb.lines[0][0] - t0) / 1e6:.3f}"
        row["told_ms"] = f"{(told()[0] - t0) / 1e6:.3f}"
        # A's stdout closes once A and its CMD are gone (ringlock's CMD dies
        # with it; etcdctl lock leaves its CMD running): a short grace only.
        read_for([ca], min(deadline, now() + int(a.gone_wait_s * 1e9)), lambda: ca.eof is not None)
        if ca.eof is not None:
            row["a_gone_ms"] = f"{(ca.eof - t0) / 1e6:.3f}"
    except (TrialError, OSError) as e:
        row["error"] = f"{stage}: {e}"
    finally:
        for p in reversed(procs):
            p.stop()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", required=True, choices=["ringlock", "etcd-elect", "etcd-lock"])
    ap.add_argument("--system", required=True, help="the system's name in the rows")
    ap.add_argument("--trials", type=int, required=True)
    ap.add_argument("--first-trial", type=int, default=1, help="the first trial's number")
    ap.add_argument("--append", action="store_true", help="add rows to --csv (a header if it is new)")
    ap.add_argument("--kill-also", type=int, action="append", default=[], metavar="PID",
                    help="also SIGKILL PID right after A (e.g. the server A is connected to)")
    ap.add_argument("--csv", required=True)
    ap.add_argument("--logs", required=True, help="directory for the clients' stderr")
    ap.add_argument("--name-prefix", default="election")
    ap.add_argument("--timeout-s", type=float, required=True, help="bound of each trial (set-up; kill to both times)")
    ap.add_argument("--kill-spread-ms", type=float, default=0.0)
    ap.add_argument("--gone-wait-s", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--ringlock")
    ap.add_argument("--addr")
    ap.add_argument("--metrics", help="metrics addresses (host:port,...) of every node")
    ap.add_argument("--etcdctl", default="etcdctl")
    ap.add_argument("--endpoint")
    ap.add_argument("--lock-ttl", type=int, default=2)
    a = ap.parse_args()
    if a.kind == "ringlock":
        sysm = Ringlock(a)
    elif a.kind == "etcd-elect":
        sysm = Etcd(a)
    else:
        sysm = Etcd(a, a.lock_ttl)
    rnd = random.Random(a.seed)
    os.makedirs(a.logs, exist_ok=True)
    fields = ["system", "trial", "kill_delay_ms", "elected_ms", "told_ms", "a_gone_ms", "granted_ttl_s", "error"]
    failed = 0
    new = not (a.append and os.path.exists(a.csv))
    with open(a.csv, "a" if a.append else "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new:
            w.writeheader()
        for n in range(a.first_trial, a.first_trial + a.trials):
            row = trial(a, sysm, n, rnd)
            w.writerow(row)
            f.flush()
            if row["error"]:
                failed += 1
                print(f"  trial {n}: ERROR {row['error']}", file=sys.stderr)
            else:
                print(f"  trial {n}: elected {row['elected_ms']} ms, observer told {row['told_ms']} ms"
                      f" (killed {row['kill_delay_ms']} ms after B queued)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sys.exit(main())
