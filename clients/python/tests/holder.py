"""A child process that holds one lock with the client, for the tests that
SIGSTOP or kill -9 a holder. Usage: holder.py ADDR KEY [--ttl S] [--keepalive S]
[--campaign VALUE] (with ``--campaign``: leads the election KEY with VALUE
instead of locking it)

Prints ``granted TOKEN`` once it holds KEY, then answers stdin lines:
``check`` -> ``held`` or ``lost REASON`` (from ``lease.check()``, right away,
without waiting for the reader thread), ``callback`` -> ``callback REASON``
once the on_lost callback ran (waits up to 20 s), ``exit``.
"""

import argparse
import sys
import threading

import ringlock


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("addr")
    ap.add_argument("key")
    ap.add_argument("--ttl", type=float)
    ap.add_argument("--keepalive", type=float)
    ap.add_argument("--campaign")
    a = ap.parse_args()
    called = threading.Event()
    reasons = []

    def on_lost(lease: ringlock.Lease, info: ringlock.LostInfo) -> None:
        reasons.append(info.reason.value)
        called.set()

    client = ringlock.Client(a.addr, keepalive=a.keepalive, retry=0)
    if a.campaign is not None:
        lease = client.election(a.key).campaign(a.campaign, on_lost=on_lost).lease
    else:
        lease = client.lock(a.key, ttl=a.ttl, on_lost=on_lost)
    print(f"granted {lease.token}", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "check":
            try:
                lease.check()
                print("held", flush=True)
            except ringlock.LockLost as e:
                assert e.info is not None
                print(f"lost {e.info.reason.value}", flush=True)
        elif cmd == "callback":
            if called.wait(20):
                print(f"callback {reasons[0]}", flush=True)
            else:
                print("no-callback", flush=True)
        elif cmd == "exit":
            break
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
