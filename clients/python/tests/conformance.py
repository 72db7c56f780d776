"""The conformance scenarios, against the real ringlockd.

The package is imported from PYTHONPATH: conformance.sh installs it with
pip into a temporary directory first, so the suite tests what pip installs.

Run by ``clients/python/conformance.sh`` (``python3 conformance.py [NAME...]``).
Prints ``conformance python NAME ok`` per scenario and exits non-zero if
any failed. Env: ``RINGLOCKD`` (the binary), ``RINGLOCK_TEST_THREADS``
(``--threads``, default 1).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional

import ringlock  # noqa: E402
from harness import Child, Failed, Server, check, poll, threads  # noqa: E402

SCENARIOS: Dict[str, Callable[[], None]] = {}
#: Every scenario must finish within this (a hang dumps every thread's stack and fails).
SCENARIO_LIMIT_S = 120


def scenario(fn: Callable[[], None]) -> Callable[[], None]:
    SCENARIOS[fn.__name__] = fn
    return fn


class Waiter:
    """``client.acquire(key, **kw)`` on a thread of its own."""

    def __init__(self, client: ringlock.Client, key: str, **kw: object) -> None:
        self.lease: Optional[ringlock.Lease] = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.lease = client.acquire(key, **kw)  # type: ignore[arg-type]
            except BaseException as e:
                self.error = e
            self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout: float = 20.0) -> ringlock.Lease:
        check(self.done.wait(timeout), f"the acquire did not return within {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.lease is not None
        return self.lease


@scenario
def grant() -> None:
    with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b:
        la = a.lock("grant/k")
        check(la.token > 0, f"token {la.token} must be > 0")
        check(s.keyx()[b"grant/k"].token == la.token, "KEYX shows another token")
        la.release()
        la.release()  # safe twice
        check(b"grant/k" not in s.keyx(), "released key still listed")
        lb = b.lock("grant/k", timeout=5)
        check(lb.token > la.token, f"second token {lb.token} not > first {la.token}")
        lb.release()


@scenario
def fifo() -> None:
    with Server() as s:
        clients = [ringlock.Client(s.addr) for _ in range(4)]
        try:
            a = clients[0].lock("fifo/k")
            order: List[str] = []
            tokens: List[int] = []
            waiters = []
            for i, name in enumerate("BCD", start=1):
                c = clients[i]

                def run(c: ringlock.Client = c, name: str = name) -> None:
                    lease = c.lock("fifo/k", timeout=30)
                    # Appended while holding the key: this list is the grant order.
                    order.append(name)
                    tokens.append(lease.token)
                    lease.release()

                t = threading.Thread(target=run, daemon=True)
                t.start()
                waiters.append(t)
                s.wait_queued(i)  # queued in exactly this order
            a.release()
            for t in waiters:
                t.join(30)
                check(not t.is_alive(), "a waiter was never granted")
            check(order == ["B", "C", "D"], f"granted in order {order}, not B, C, D")
            check(all(x < y for x, y in zip([a.token] + tokens, tokens)),
                  f"tokens not increasing: {[a.token] + tokens}")
        finally:
            for c in clients:
                c.close()


@scenario
def try_() -> None:
    with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b:
        la = a.lock("try/k")
        t0 = time.monotonic()
        check(b.try_lock("try/k") is None, "try_lock of a held key granted")
        try:
            b.acquire("try/k", timeout=0)
            raise Failed("acquire(timeout=0) of a held key granted")
        except ringlock.LockBusy as e:
            check(e.status == "busy", f"status {e.status!r}, not busy")
        check(time.monotonic() - t0 < 5, "a try waited")
        lb = b.try_lock("try/free")
        check(lb is not None and lb.token > 0, "try_lock of a free key not granted")
        assert lb is not None
        lb.release()
        la.release()


@scenario
def timeout() -> None:
    with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b:
        la = a.lock("timeout/k")
        try:
            b.acquire("timeout/k", timeout=0.2)
            raise Failed("acquire with a timeout on a held key granted")
        except ringlock.LockTimeout as e:
            check(type(e) is ringlock.LockTimeout and e.status == "timed_out",
                  f"{type(e).__name__} status {e.status!r}, not LockTimeout timed_out")
        la.check()
        check(s.keyx()[b"timeout/k"].token == la.token, "the holder no longer holds")
        la.release()
        check(b"timeout/k" not in s.keyx(),
              "after the holder released, the key is held (leaked to the timed-out client?)")
        with ringlock.Client(s.addr) as c:
            lc = c.try_lock("timeout/k")
            check(lc is not None, "a third session cannot take the key")
            assert lc is not None
            lc.release()


@scenario
def cancel_race() -> None:
    rounds = 150
    with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b, \
            ringlock.Client(s.addr) as c:
        outcomes = {"granted": 0, "cancelled": 0, "raced_grant_released": 0}
        for r in range(rounds):
            key = "cancel/k"
            la = a.lock(key, timeout=10)
            tok = ringlock.CancelToken()
            w = Waiter(b, key, cancel=tok)
            if r % 3 == 0:
                s.wait_queued(1)  # some rounds surely queued before the race
            go = threading.Barrier(2)

            def release_a() -> None:
                go.wait()
                la.release()

            t = threading.Thread(target=release_a, daemon=True)
            t.start()
            go.wait()
            if r % 2:
                time.sleep(0.0002 * (r % 7))  # spread the race over a few hundred µs
            tok.cancel()
            t.join(20)
            try:
                lb = w.result()
                outcomes["granted"] += 1
                check(s.keyx()[key.encode()].token == lb.token, "granted lease not the holder")
                lb.release()
            except ringlock.Cancelled as e:
                check(e.status == "cancelled", f"status {e.status!r}")
                outcomes["raced_grant_released" if "raced" in str(e) else "cancelled"] += 1
            lc = c.try_lock(key)
            check(lc is not None, f"round {r}: the key is held by nobody-knows-whom "
                                  f"({s.keyx().get(key.encode())})")
            assert lc is not None
            lc.release()
        check(outcomes["cancelled"] > 0, f"no round was cancelled: {outcomes}")
        print(f"cancel_race: {rounds} rounds: {outcomes}", file=sys.stderr)


@scenario
def lease_expiry_lost() -> None:
    with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b:
        told = threading.Event()
        seen: List[ringlock.LostInfo] = []

        def on_lost(lease: ringlock.Lease, info: ringlock.LostInfo) -> None:
            seen.append(info)
            told.set()

        la = a.lock("lease/k", ttl=1.0, keep_alive=False, on_lost=on_lost)
        check(la.mode == "lease" and s.keyx()[b"lease/k"].mode == 2, "not held as a lease")
        check(told.wait(10), "the holder was not told its lease expired")
        check(la.lost and seen[0].reason == ringlock.LostReason.EXPIRED,
              f"lost={la.lost} reason={seen[0].reason}")
        try:
            la.check()
            raise Failed("check() of an expired lease did not raise")
        except ringlock.LockLost:
            pass
        lb = b.lock("lease/k", timeout=10)
        check(lb.token > la.token, f"next token {lb.token} not > {la.token}")
        lb.release()
        # A lease kept alive by the background extend outlives many TTLs.
        lk = a.lock("lease/kept", ttl=0.3)
        time.sleep(1.5)  # five TTLs: what is asserted is that it is still held after them
        lk.check()
        check(s.keyx()[b"lease/kept"].token == lk.token, "the kept-alive lease expired")
        lk.release()
        # The server's push: an operator reset of a live session's hold.
        told.clear()
        lr = a.lock("lease/reset", on_lost=on_lost)
        s.rset(b"lease/reset")
        check(told.wait(10), "no Lost push for an operator reset")
        check(seen[-1].reason == ringlock.LostReason.RESET and seen[-1].from_server,
              f"reset reported as {seen[-1]}")
        check(lr.lost, "lost flag not set after the reset push")


@scenario
def session_end_on_close() -> None:
    with Server() as s, ringlock.Client(s.addr) as b, ringlock.Client(s.addr) as c:
        a = ringlock.Client(s.addr)
        a.lock("end/k1")
        a.lock("end/k2")
        w = Waiter(b, "end/k1", timeout=30)
        s.wait_queued(1)
        a.close()
        lb = w.result()
        check(s.keyx()[b"end/k1"].token == lb.token, "waiter not the holder")
        lc = c.try_lock("end/k2")
        check(lc is not None, "the closed session's other hold was not freed")
        assert lc is not None
        lc.release()
        lb.release()
        # A holder process that dies (kill -9).
        child = Child(s.addr, "end/k3")
        try:
            child.expect("granted")
            w = Waiter(b, "end/k3", timeout=30)
            s.wait_queued(1)
            child.kill9()
            w.result().release()
        finally:
            child.kill9()


@scenario
def keepalive_loss() -> None:
    with Server() as s, ringlock.Client(s.addr) as b:
        child = Child(s.addr, "ka/k", "--keepalive", "0.6")
        try:
            t1 = int(child.expect("granted").split()[1])
            w = Waiter(b, "ka/k", timeout=60)
            s.wait_queued(1)
            child.signal(signal.SIGSTOP)
            lb = w.result(60)  # the server ends the stopped holder's session
            check(lb.token > t1, f"token {lb.token} not > {t1}")
            child.signal(signal.SIGCONT)
            child.send("check")
            line = child.expect("")
            check(line.startswith("lost "), f"the resumed holder believes: {line!r}")
            child.send("callback")
            line = child.expect("callback", 20)
            check(line.split()[1] in ("keepalive_timeout", "session_ended"), line)
            child.send("exit")
            lb.release()
        finally:
            child.signal(signal.SIGCONT)
            child.kill9()


@scenario
def stale_token_release() -> None:
    with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b, \
            ringlock.Client(s.addr) as c:
        old = a.lock("stale/k", ttl=30)
        old.release()
        cur = b.lock("stale/k", ttl=30)
        for what, call in [("release", lambda: c.release("stale/k", old.token)),
                           ("extend", lambda: c.extend("stale/k", old.token, 5))]:
            try:
                call()
                raise Failed(f"{what} with a stale token succeeded")
            except ringlock.StaleToken as e:
                check(e.status == "stale_token", f"{what}: status {e.status!r}")
        check(s.keyx()[b"stale/k"].token == cur.token, "the current holder was released")
        cur.check()
        cur.release()
        # A session hold's current token, named by another session: not_owner.
        sh = b.lock("stale/s")
        try:
            c.release("stale/s", sh.token)
            raise Failed("another session released a session hold")
        except ringlock.NotOwner as e:
            check(e.status == "not_owner", f"status {e.status!r}")
        check(s.keyx()[b"stale/s"].token == sh.token, "the session hold was released")
        sh.release()


@scenario
def auth_refused() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "secret")
        with open(path, "w") as f:
            f.write("right-secret\n")
        with Server(["--auth-token-file", path]) as s:
            for token in (None, "wrong-secret"):
                try:
                    ringlock.Client(s.addr, auth_token=token, retry=0).close()
                    raise Failed(f"a Hello with token {token!r} was accepted")
                except ringlock.Unauthorized as e:
                    check(e.status == "unauthorized", f"status {e.status!r}")
                    check("unauthorized" in str(e), f"message does not name it: {e}")
            with ringlock.Client(s.addr, auth_token="right-secret") as c:
                c.lock("auth/k").release()


@scenario
def persistent_reset_lost() -> None:
    # docs/protocol.md ("Lost"): an operator reset of a hold of any mode,
    # persistent included, taken by a live session is pushed as Lost.
    with Server() as s, ringlock.Client(s.addr) as c:
        seen: List[ringlock.LostInfo] = []
        told = threading.Event()

        def on_lost(_lease: ringlock.Lease, info: ringlock.LostInfo) -> None:
            seen.append(info)
            told.set()

        lp = c.lock("preset/k", persistent=True, on_lost=on_lost)
        s.rset(b"preset/k")
        check(told.wait(20), "no on_lost within 20 s of the reset")
        info = seen[0]
        check(info.reason == ringlock.LostReason.RESET and info.from_server
              and info.token == lp.token, f"lost as {info}")
        check(lp.lost, "the lease does not say it was lost")
        try:
            lp.release()
            raise Failed("the release of a reset hold succeeded")
        except ringlock.LockLost:
            pass


class _Version9Client(ringlock.Client):
    """A client whose Hello asks for session protocol version 9."""

    _HELLO_VERSION = 9


@scenario
def unsupported_version() -> None:
    # The real server speaks version 1 only: a version 9 Hello is answered
    # `unsupported version` naming [1] (status with detail), then closed;
    # the client says so precisely and does not retry (retry=10 would retry
    # a failure to connect for 10 s; the server counts one refusal).
    with Server() as s:
        t0 = time.monotonic()
        try:
            _Version9Client(s.addr, retry=10).close()
            raise Failed("a version 9 Hello opened a session")
        except ringlock.UnsupportedVersion as e:
            check(e.versions == (1,), f"versions {e.versions!r}")
            check(e.status == "unsupported_version", f"status {e.status!r}")
            check("version 9" in str(e) and "speaks version 1" in str(e),
                  f"message does not name both versions: {e}")
        check(time.monotonic() - t0 < 5, "the refusal was retried")
        check(s.metric("ringlock_sessions_opened_total") == 0, "a session was opened")
        # The server goes on serving version 1.
        with ringlock.Client(s.addr) as c:
            c.lock("version/k").release()


@scenario
def server_restart_durable() -> None:
    with tempfile.TemporaryDirectory() as d:
        s = Server(["--data-path", os.path.join(d, "ringlock.wal")])
        try:
            before: List[int] = []
            a = ringlock.Client(s.addr)
            for i in range(5):
                before.append(a.lock(f"dur/s{i}").token)
            lease = a.lock("dur/lease", ttl=120)
            persist = a.lock("dur/persist", persistent=True)
            before += [lease.token, persist.token]
            s.kill9()
            poll(lambda: a.ended is not None, "the client to see the server die")
            check(persist.lost and lease.lost, "holds of a dead session not reported lost")
            s.start()
            with ringlock.Client(s.addr) as b:
                keys = s.keyx()
                check(keys.get(b"dur/persist") is not None
                      and keys[b"dur/persist"].token == persist.token
                      and keys[b"dur/persist"].mode == 0, f"persistent hold lost: {keys}")
                check(keys.get(b"dur/lease") is not None
                      and keys[b"dur/lease"].token == lease.token, "lease lost in the restart")
                check(b.try_lock("dur/persist") is None, "persistent hold not held after restart")
                after = [b.lock(f"dur/s{i}", timeout=10).token for i in range(5)]
                # The lease is still ours to keep by its token, from a new session.
                b.extend("dur/lease", lease.token, 30)
                b.release("dur/lease", lease.token)
                b.release("dur/persist", persist.token)
                lp = b.try_lock("dur/persist")
                check(lp is not None, "persistent hold not free after its release")
                assert lp is not None
                after.append(lp.token)
                check(min(after) > max(before),
                      f"a token after the restart ({min(after)}) is not larger than every "
                      f"token before ({max(before)})")
        finally:
            s.kill9()


@scenario
def shards() -> None:
    n = threads()
    with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b:
        check(a.shards == n, f"server has {a.shards} shards, expected {n}")
        keys = [f"shard/{i}" for i in range(8)]
        seen: Dict[str, List[int]] = {k: [] for k in keys}
        errors: List[BaseException] = []

        def worker(c: ringlock.Client, mine: List[str]) -> None:
            try:
                for _ in range(25):
                    for k in mine:
                        with c.lock(k, timeout=20) as lease:
                            seen[k].append(lease.token)  # under the lock: grant order
            except BaseException as e:
                errors.append(e)

        ts = []
        for i in range(4):
            # Two workers per key, on different sessions: the keys contend.
            mine = keys[(i % 2) * 4:(i % 2) * 4 + 4]
            ts.append(threading.Thread(target=worker, args=(a if i < 2 else b, mine)))
        for t in ts:
            t.start()
        for t in ts:
            t.join(90)
        check(not any(t.is_alive() for t in ts), "a worker hung")
        if errors:
            raise errors[0]
        for k, toks in seen.items():
            check(len(toks) == 50, f"{k}: {len(toks)} grants, expected 50")
            check(all(x < y for x, y in zip(toks, toks[1:])), f"{k}: tokens not increasing")
        check(not s.keyx(), "keys left held")


@scenario
def modes_fifo() -> None:
    # docs/conformance.md: readers share; a writer queued behind them is
    # granted before a reader that came after it (one FIFO queue per key).
    with Server() as s, ringlock.Client(s.addr) as r1, ringlock.Client(s.addr) as r2, \
            ringlock.Client(s.addr) as w, ringlock.Client(s.addr) as r3:
        check(r1.modes, "ringlockd does not offer lock modes")
        key = "modes/fifo"
        l1 = r1.lock_shared(key, timeout=5)
        l2 = r2.try_lock_shared(key)
        check(l2 is not None, "a second reader was refused while only a reader held")
        assert l2 is not None
        check(l2.token > l1.token, f"tokens {l1.token}, {l2.token} not increasing")
        check(l1.access == ringlock.SHARED and l2.access == ringlock.SHARED,
              f"access {l1.access}, {l2.access}")
        check(w.try_lock(key) is None, "an exclusive try was granted while readers held")
        ww = Waiter(w, key, timeout=30)
        s.wait_queued(1)
        check(r3.try_lock_shared(key) is None, "a reader overtook the waiting writer")
        wr = Waiter(r3, key, timeout=30, access=ringlock.SHARED)
        s.wait_queued(2)
        l1.release()
        w.ping()  # a grant decided by that release would be on w's connection first
        check(not ww.done.is_set(), "the writer was granted while a reader still held")
        l2.release()
        lw = ww.result()
        check(lw.access == ringlock.EXCLUSIVE and lw.token > l2.token,
              f"writer token {lw.token} (after {l2.token}), access {lw.access}")
        r3.ping()
        check(not wr.done.is_set(), "the later reader was granted while the writer held")
        lw.release()
        l3 = wr.result()
        check(l3.token > lw.token, f"the later reader's token {l3.token} not > {lw.token}")
        l3.release()
        check(key.encode() not in s.keyx(), "the key is still held")


@scenario
def modes_semaphore() -> None:
    # docs/conformance.md: a semaphore of 2 admits two, a third waits until
    # one releases; another size is refused with mode_mismatch.
    with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b, \
            ringlock.Client(s.addr) as c:
        key = "modes/sem"
        pa = a.permit(key, 2, timeout=5)
        pb = b.try_permit(key, 2)
        check(pb is not None, "the second permit of 2 was refused")
        assert pb is not None
        check(pa.access == ringlock.semaphore(2) and pb.token > pa.token,
              f"access {pa.access}, tokens {pa.token}, {pb.token}")
        check(c.try_permit(key, 2) is None, "a third permit of 2 was granted")
        try:
            c.permit(key, 3, timeout=5)
            raise Failed("a permit of 3 on a semaphore of 2 was granted")
        except ringlock.ModeMismatch as e:
            check(e.status == "mode_mismatch" and e.key == key and e.slots == 3,
                  f"status {e.status!r} key {e.key!r} slots {e.slots}")
            check(key in str(e), f"the message does not name the key: {e}")
        wc = Waiter(c, key, timeout=30, access=ringlock.semaphore(2))
        s.wait_queued(1)
        pa.release()
        pc = wc.result()
        check(pc.token > pb.token, f"the third permit's token {pc.token} not > {pb.token}")
        pb.release()
        pc.release()
        # Free again: the next first holder fixes another size.
        p5 = a.try_permit(key, 5)
        check(p5 is not None, "a permit of 5 on the free key was refused")
        assert p5 is not None
        p5.release()



def _event(watch: ringlock.Watch, what: str) -> ringlock.WatchEvent:
    """The watch's next change, which must come within 20 s."""
    ev = watch.next(timeout=20)
    check(ev is not None, f"no event within 20 s (expected {what})")
    assert ev is not None
    return ev


@scenario
def watch_order() -> None:
    # docs/conformance.md: a watcher lists the holder, then is told every
    # change in the order the server decided it (released before granted),
    # a session's end included; once closed, a new watch sees the next grant.
    with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b, \
            ringlock.Client(s.addr) as w:
        check(w.watches, "ringlockd does not offer watches")
        key = "watch/order"
        la = a.lock(key, timeout=5)
        watch = w.watch(key)
        listed = [h.token for h in watch.holders]
        check(listed == [la.token], f"the watch lists {listed}, not the holder [{la.token}]")
        wb = Waiter(b, key, timeout=30)
        s.wait_queued(1)
        la.release()
        lb = wb.result()
        ev = _event(watch, f"released {la.token}")
        check((ev.kind, ev.token) == ("released", la.token),
              f"first event {ev.kind} {ev.token}, not released {la.token}")
        ev = _event(watch, f"granted {lb.token}")
        check((ev.kind, ev.token) == ("granted", lb.token),
              f"second event {ev.kind} {ev.token}, not granted {lb.token}")
        b.close()  # its session's end frees lb
        ev = _event(watch, f"session_ended {lb.token}")
        check((ev.kind, ev.token) == ("session_ended", lb.token),
              f"third event {ev.kind} {ev.token}, not session_ended {lb.token}")
        watch.close()
        # Closed: a change now is reported to a second watch, not to it.
        again = w.watch(key)
        check(again.holders == [], f"the freed key lists {again.holders}")
        lc = a.lock(key, timeout=5)
        ev = _event(again, f"granted {lc.token}")
        check((ev.kind, ev.token) == ("granted", lc.token),
              f"the second watch's event {ev.kind} {ev.token}, not granted {lc.token}")
        try:
            old = watch.next(timeout=0)
            raise Failed(f"the closed watch read {old!r}")
        except ringlock.WatchEnded as e:
            check(e.reason == "closed", f"the closed watch ended with reason {e.reason!r}")
        lc.release()
        again.close()


@scenario
def watch_rewatch() -> None:
    # docs/conformance.md: a watch ends with its session (an error, not
    # silence); watching again is a re-read, the meantime is not replayed.
    with Server() as s, ringlock.Client(s.addr) as a:
        key = "watch/rewatch"
        w = ringlock.Client(s.addr)
        watch = w.watch(key)
        check(watch.holders == [], f"a free key lists {watch.holders}")
        w.close()
        try:
            ev = watch.next(timeout=20)
            raise Failed("the watch of an ended session read "
                         + ("nothing for 20 s (silence)" if ev is None else repr(ev)))
        except ringlock.WatchEnded as e:
            check(e.reason == "session_ended" and str(e),
                  f"the watch ended with reason {e.reason!r}: {e}")
        # Changed while nobody watched: not replayed, but listed.
        la = a.lock(key, timeout=5)
        with ringlock.Client(s.addr) as w2:
            again = w2.watch(key)
            listed = [h.token for h in again.holders]
            check(listed == [la.token], f"the new watch lists {listed}, not [{la.token}]")
            la.release()
            # Had the grant been replayed, it would come before this release.
            ev = _event(again, f"released {la.token}")
            check((ev.kind, ev.token) == ("released", la.token),
                  f"the new watch's first event {ev.kind} {ev.token}, not released {la.token}")
            again.close()

class Candidate:
    """``election.campaign(value)`` on a thread of its own."""

    def __init__(self, election: ringlock.Election, value: str) -> None:
        self.leadership: Optional[ringlock.Leadership] = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.leadership = election.campaign(value)
            except BaseException as e:
                self.error = e
            self.done.set()

        threading.Thread(target=run, daemon=True).start()

    def result(self, timeout: float = 20.0) -> ringlock.Leadership:
        check(self.done.wait(timeout), f"the campaign did not end within {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.leadership is not None
        return self.leadership


def _leaders_until(o: ringlock.Observer, want: ringlock.Leader, seen: List[ringlock.Leader]
                   ) -> None:
    """Reads the observer's changes until ``want`` leads (within 20 s),
    appending each leader seen ("nobody leads" in between is allowed and
    not appended)."""
    deadline = time.monotonic() + 20
    while o.leader != want:
        left = deadline - time.monotonic()
        check(left > 0 and o.changed(timeout=left),
              f"the observer did not see {want} within 20 s (it saw {seen})")
        if o.leader is not None:
            seen.append(o.leader)


def _leadership_lost(lead: ringlock.Leadership, what: str) -> None:
    try:
        lead.proclaim("too late")
        raise Failed(f"a proclaim {what} succeeded")
    except ringlock.LockLost as e:
        check("leadership lost" in str(e), f"the refusal does not say leadership lost: {e}")


@scenario
def election_order() -> None:
    # docs/conformance.md: candidates lead in campaign order; a proclaim
    # keeps the token and elects nobody; each resign hands over.
    with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b, \
            ringlock.Client(s.addr) as c, ringlock.Client(s.addr) as w:
        check(w.offers_proclaim, "ringlockd does not offer proclaim")
        name = "election/order"
        o = w.election(name).observe()
        check(o.leader is None, f"the observer sees {o.leader} leading a new election")
        seen: List[ringlock.Leader] = []
        la = a.election(name).campaign("A:1", timeout=5)
        cb = Candidate(b.election(name), "B:1")
        s.wait_queued(1)
        cc = Candidate(c.election(name), "C:1")
        s.wait_queued(2)
        _leaders_until(o, ringlock.Leader(la.token, b"A:1"), seen)
        la.proclaim("A:2")
        check(la.value == b"A:2" and la.token == seen[0].token, f"{la!r} after the proclaim")
        _leaders_until(o, ringlock.Leader(la.token, b"A:2"), seen)
        b.ping()
        c.ping()
        check(not cb.done.is_set() and not cc.done.is_set(), "a proclaim elected somebody")
        s.wait_queued(2)  # both still wait
        la.resign()
        lb = cb.result()
        check(lb.token > la.token, f"B's token {lb.token} not > A's {la.token}")
        _leaders_until(o, ringlock.Leader(lb.token, b"B:1"), seen)
        c.ping()
        check(not cc.done.is_set(), "C was elected with B")
        _leadership_lost(la, "by A after its resignation")
        lb.resign()
        lc = cc.result()
        check(lc.token > lb.token, f"C's token {lc.token} not > B's {lb.token}")
        _leaders_until(o, ringlock.Leader(lc.token, b"C:1"), seen)
        want = [ringlock.Leader(la.token, b"A:1"), ringlock.Leader(la.token, b"A:2"),
                ringlock.Leader(lb.token, b"B:1"), ringlock.Leader(lc.token, b"C:1")]
        check(seen == want, f"the observer saw {seen}, not {want}")
        lc.resign()
        o.close()


@scenario
def election_handover() -> None:
    # docs/conformance.md: a leader's session that ends without resigning
    # hands the election to the next candidate at once.
    with Server() as s, ringlock.Client(s.addr) as b, ringlock.Client(s.addr) as w:
        name = "election/handover"
        a = ringlock.Client(s.addr)
        la = a.election(name).campaign("A", timeout=5)
        o = w.election(name).observe()
        check(o.leader == ringlock.Leader(la.token, b"A"), f"the observer sees {o.leader}")
        cb = Candidate(b.election(name), "B")
        s.wait_queued(1)
        a.close()  # its session ends; A never resigned
        lb = cb.result()
        check(lb.token > la.token, f"B's token {lb.token} not > A's {la.token}")
        seen: List[ringlock.Leader] = []
        _leaders_until(o, ringlock.Leader(lb.token, b"B"), seen)
        check(seen == [ringlock.Leader(lb.token, b"B")], f"the observer saw {seen}")
        _leadership_lost(la, "with A's old leadership after its session ended")
        lb.resign()
        o.close()


@scenario
def fence_sigstop() -> None:
    """examples/fence.py: a SIGSTOPped Python lease holder's stale write is
    refused by the file it writes; without the fence it lands."""
    here = os.path.dirname(os.path.abspath(__file__))
    example = os.path.join(os.path.dirname(here), "examples", "fence.py")
    env = dict(os.environ)  # PYTHONPATH (set by conformance.sh) finds the package
    with Server() as s:
        for fenced in (True, False):
            with tempfile.TemporaryDirectory() as d:
                cmd = [sys.executable, example, "--addr", s.addr, "--dir", d]
                if not fenced:
                    cmd.append("--no-fence")
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
                want = 0 if fenced else 1
                check(p.returncode == want,
                      f"fence.py {'--no-fence ' if not fenced else ''}exited {p.returncode}, "
                      f"expected {want}:\n{p.stdout}{p.stderr}")
                with open(os.path.join(d, "store")) as f:
                    final = f.read()
                if fenced:
                    check(final.startswith("B "), f"B's write did not stand: {final!r}")
                else:
                    check(final.startswith("A "), f"without the fence A's write should land: {final!r}")


def main(argv: List[str]) -> int:
    names = argv or list(SCENARIOS)
    failed = []
    for name in names:
        fn = SCENARIOS.get(name) or SCENARIOS.get(name + "_")
        if fn is None:
            print(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
            return 2
        shown = fn.__name__.rstrip("_")
        faulthandler.dump_traceback_later(SCENARIO_LIMIT_S, exit=True)
        try:
            fn()
            print(f"conformance python {shown} ok", flush=True)
        except BaseException:
            failed.append(shown)
            print(f"conformance python {shown} FAILED", flush=True)
            traceback.print_exc()
        finally:
            faulthandler.cancel_dump_traceback_later()
    if failed:
        print(f"conformance python: {len(failed)} failed: {' '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
