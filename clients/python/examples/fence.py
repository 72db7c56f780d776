#!/usr/bin/env python3
"""A paused lease holder's stale write, refused by a fenced file.

    python3 examples/fence.py --addr 127.0.0.1:22119 [--ttl 1.0] [--dir DIR] [--no-fence]

The protected resource is the file DIR/store, written through
``ringlock.fence.FileFence`` (the highest token seen is kept in
DIR/store.fence; every check-and-write runs under an flock of it). The story:

1. Holder A, a child process, takes a lease (TTL ``--ttl``, kept alive by
   the client's background extend) and writes with its token: accepted.
2. A checks that its lease is still held (``lease.check()``) and is about
   to write again. Right then it is stopped with SIGSTOP, which also stops
   its keep-alive thread.
3. Holder B (this process) asks for the key; the server grants it the
   moment A's lease expires, with a larger token. B writes: accepted.
4. A is continued (SIGCONT) and does the write it had checked for, with its
   old token. The fence refuses it: B's write stands.

With ``--no-fence`` the file is written directly and A's stale write lands
over B's. Exit status: 0 the stale write was refused, 1 it was applied,
2 anything else failed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile

import ringlock
from ringlock.fence import FileFence, StaleWrite


def store_write(path: str, fenced: bool, token: int, text: str) -> None:
    if fenced:
        FileFence(path).write(token, text.encode())
    else:
        with open(path, "w") as f:
            f.write(text)


def holder(a: argparse.Namespace) -> int:
    """Holder A (the child)."""
    with ringlock.Client(a.addr, retry=0) as client:
        lease = client.lock(a.key, ttl=a.ttl)
        store_write(a.store, a.fence, lease.token, f"A 1 token={lease.token}\n")
        print(f"wrote {lease.token}", flush=True)
        lease.check()  # still held: about to write again...
        print("checked", flush=True)
        sys.stdin.readline()  # ...and here it is paused (SIGSTOP)
        try:
            store_write(a.store, a.fence, lease.token, f"A 2 token={lease.token}\n")
            print("applied", flush=True)
        except StaleWrite as e:
            print(f"refused {e}", flush=True)
        lease.release_quietly()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", default=os.environ.get("RINGLOCK_ADDR", "127.0.0.1:22119"))
    ap.add_argument("--ttl", type=float, default=1.0, help="lease TTL in seconds")
    ap.add_argument("--dir", help="where the store lives (default: a new temp dir)")
    ap.add_argument("--no-fence", dest="fence", action="store_false")
    ap.add_argument("--holder", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--key", default=f"fence-example/{os.getpid()}", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.holder:
        return holder(a)

    d = a.dir or tempfile.mkdtemp(prefix="ringlock-fence-")
    store = os.path.join(d, "store")
    cmd = [sys.executable, os.path.abspath(__file__), "--holder", "--addr", a.addr,
           "--ttl", str(a.ttl), "--key", a.key, "--store", store]
    if not a.fence:
        cmd.append("--no-fence")
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        token_a = int(child.stdout.readline().split()[1])
        print(f"A holds {a.key} with token {token_a} and wrote")
        if child.stdout.readline().strip() != "checked":
            raise RuntimeError("holder A did not check its lease")
        child.send_signal(signal.SIGSTOP)
        print(f"A checked its lease and was stopped (SIGSTOP) before its second write")
        with ringlock.Client(a.addr, retry=0) as client:
            lease_b = client.lock(a.key, ttl=max(a.ttl, 5.0), timeout=60)
            print(f"B was granted {a.key} when A's lease expired: token {lease_b.token} > {token_a}")
            store_write(store, a.fence, lease_b.token, f"B 1 token={lease_b.token}\n")
            print("B wrote")
            child.send_signal(signal.SIGCONT)
            child.stdin.write("go\n")
            child.stdin.flush()
            verdict = child.stdout.readline().strip()
            print(f"A resumed and wrote with token {token_a}: {verdict}")
            lease_b.release()
        child.wait(30)
        with open(store) as f:
            print(f"the store holds: {f.read().strip()}")
        if verdict.startswith("refused"):
            print("the paused holder's stale write was refused: the store is consistent")
            return 0
        if verdict == "applied":
            print("the paused holder's stale write was APPLIED over its successor's (no fence)")
            return 1
        raise RuntimeError(f"holder A said {verdict!r}")
    except Exception as e:  # the example's own failure, not the story's outcome
        print(f"fence: {e}", file=sys.stderr)
        return 2
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait()


if __name__ == "__main__":
    sys.exit(main())
