"""Resuming a replicated session (cluster mode) against a scripted fake
server over 127.0.0.1: the welcome's resumable flag, the Resume frame, the
Held list and how the client settles its holds and requests in flight by
it (``docs/protocol.md``, "Resuming a session"). Every wait is bounded and
awaits a signal; nothing asserts on wall-clock time."""

import socket
import struct
import threading
import unittest
from typing import Callable, Dict, List, Optional, Tuple, Union

import ringlock
from fake_server import FakeConn, FakeServer

OP_HELLO, OP_ACQUIRE, OP_RELEASE, OP_EXTEND, OP_CANCEL, OP_PING, OP_RESUME = 7, 8, 9, 10, 11, 12, 13
SID = 0x0080_0000_0000_0007  # bit 55: a replicated session
WAIT = 10.0  # bound on every wait for a signal


class Script:
    """Connection n runs ``handlers[n]``; every request frame is recorded
    as (connection, op, rid, body) and signalled."""

    def __init__(self, *handlers: Callable[["Script", FakeConn], None]) -> None:
        self.handlers = list(handlers)
        self.frames: List[Tuple[int, int, int, bytes]] = []
        self.conns: List[FakeConn] = []
        self.cv = threading.Condition()

    def __call__(self, c: FakeConn) -> None:
        with self.cv:
            n = len(self.conns)
            self.conns.append(c)
            self.cv.notify_all()
        h = self.handlers[min(n, len(self.handlers) - 1)]
        h(self, c)

    def read(self, c: FakeConn) -> Optional[Tuple[int, int, bytes]]:
        f = c.read()
        if f is not None:
            with self.cv:
                self.frames.append((self.conns.index(c), f[0], f[1], f[2]))
                self.cv.notify_all()
        return f

    def wait_for(self, pred: Callable[[], bool]) -> None:
        with self.cv:
            if not self.cv.wait_for(pred, WAIT):
                raise AssertionError("the fake server did not see what the test waits for")

    def ops(self, conn: int) -> List[int]:
        with self.cv:
            return [op for (n, op, _r, _b) in self.frames if n == conn]

    def kill(self, n: int) -> None:
        """Fails connection n (as a leader that dies)."""
        self.wait_for(lambda: len(self.conns) > n)
        try:
            self.conns[n].sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def key_of(op: int, body: bytes) -> bytes:
    if op == OP_ACQUIRE:
        n = body[9]
        return body[10:10 + n]
    if op == OP_RELEASE:
        return body[9:9 + body[8]]
    if op == OP_EXTEND:
        return body[13:13 + body[12]]
    return b""


def serve(grants: Dict[bytes, int], flags: Optional[int] = 1, keepalive_ms: int = 10_000
          ) -> Callable[[Script, FakeConn], None]:
    """Opens a session (Hello) with ``flags``, then: an Acquire of a key in
    ``grants`` is granted that token, any other stays queued (unanswered);
    Release, Extend and Ping are answered ok."""

    def handle(sc: Script, c: FakeConn) -> None:
        f = sc.read(c)
        if f is None or f[0] != OP_HELLO:
            return
        c.welcome(f[1], keepalive_ms=keepalive_ms, flags=flags, session_id=SID)
        answer(sc, c, grants)

    return handle


def answer(sc: Script, c: FakeConn, grants: Dict[bytes, int]) -> None:
    while True:
        f = sc.read(c)
        if f is None:
            return
        op, rid, body = f
        if op == OP_ACQUIRE:
            tok = grants.get(key_of(op, body))
            if tok is not None:
                c.reply(rid, 0, tok, 0xFFFFFFFF if body[0] != 2 else struct.unpack_from("<I", body, 1)[0])
        elif op == OP_EXTEND:
            c.reply(rid, 0, struct.unpack_from("<Q", body, 0)[0], struct.unpack_from("<I", body, 8)[0])
        elif op in (OP_RELEASE, OP_PING):
            c.reply(rid, 0)
        else:
            c.reply(rid, 5)


def resumer(held: List[Tuple[bytes, int, int, int]], grants: Dict[bytes, int]
            ) -> Callable[[Script, FakeConn], None]:
    """Expects a Resume of SID first; answers the Held list and the
    welcome, then serves like :func:`serve`."""

    def handle(sc: Script, c: FakeConn) -> None:
        f = sc.read(c)
        if f is None or f[0] != OP_RESUME:
            return
        for key, token, hold, ttl in held:
            c.held(f[1], key, token, hold, ttl)
        c.welcome(f[1], flags=1, session_id=SID)
        answer(sc, c, grants)

    return handle


def refuse_resume(answer_bytes: Callable[[int], bytes]) -> Callable[[Script, FakeConn], None]:
    def handle(sc: Script, c: FakeConn) -> None:
        f = sc.read(c)
        if f is not None:
            c.send(answer_bytes(f[1]))

    return handle


class Losses:
    """An on_lost callback that records and signals."""

    def __init__(self) -> None:
        self.got: List[Tuple[Union[str, bytes], ringlock.LostInfo]] = []
        self.cv = threading.Condition()

    def __call__(self, lease: ringlock.Lease, info: ringlock.LostInfo) -> None:
        with self.cv:
            self.got.append((lease.key, info))
            self.cv.notify_all()

    def wait(self, n: int) -> List[Tuple[Union[str, bytes], ringlock.LostInfo]]:
        with self.cv:
            if not self.cv.wait_for(lambda: len(self.got) >= n, WAIT):
                raise AssertionError(f"{n} loss(es) expected, got {self.got}")
            return list(self.got)


def in_thread(fn: Callable[[], object]) -> Tuple[threading.Thread, List[object]]:
    out: List[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: B902 - handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


class ResumeTest(unittest.TestCase):
    def test_kept_hold_keeps_working_and_an_unlisted_one_is_lost(self) -> None:
        sc = Script(serve({b"a": 10, b"b": 11}), resumer([(b"a", 10, 1, 0xFFFFFFFF)], {}))
        losses = Losses()
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0, on_lost=losses) as c:
            self.assertTrue(c.resumable)
            a = c.acquire("a")
            b = c.acquire("b")
            sc.kill(0)
            got = losses.wait(1)
            # The resume is done by the time the unlisted hold is reported.
            self.assertEqual(c.resumes, 1)
            self.assertEqual([k for k, _ in got], ["b"])  # the key as given: a str
            self.assertEqual(got[0][1].reason, ringlock.LostReason.NOT_LISTED)
            self.assertTrue(got[0][1].from_server)
            self.assertTrue(b.lost)
            self.assertFalse(a.lost)
            # The Resume: its own op, the session's id, version 1.
            with sc.cv:
                resume = [(op, body) for (n, op, _r, body) in sc.frames if n == 1][0]
            self.assertEqual(resume, (OP_RESUME, bytes([1]) + struct.pack("<Q", SID)))
            # The kept hold works on the new connection: a token-checked release.
            a.release()
            with sc.cv:
                rel = [body for (n, op, _r, body) in sc.frames if n == 1 and op == OP_RELEASE]
            self.assertEqual(rel, [struct.pack("<Q", 10) + b"\x01a"])
            c.ping()
            self.assertIsNone(c.ended)
            self.assertEqual(len(losses.got), 1, "the kept hold was reported lost")

    def test_in_flight_acquires_listed_are_granted_and_the_others_sent_again(self) -> None:
        sc = Script(serve({}), resumer([(b"x", 20, 2, 20_000)], {b"y": 21}))
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as c:
            tx, outx = in_thread(lambda: c.acquire("x", ttl=30))
            ty, outy = in_thread(lambda: c.acquire("y"))
            sc.wait_for(lambda: sc.ops(0).count(OP_ACQUIRE) == 2)
            sc.kill(0)
            tx.join(WAIT)
            ty.join(WAIT)
            self.assertFalse(tx.is_alive() or ty.is_alive(), "an acquire was not answered")
            x, y = outx[0], outy[0]
            assert isinstance(x, ringlock.Lease), x
            assert isinstance(y, ringlock.Lease), y
            self.assertEqual((x.token, x.mode), (20, "lease"))
            self.assertEqual(y.token, 21)
            # Its client-side expiry is the listed TTL left, not the full TTL.
            left = x.expires_in
            assert left is not None
            self.assertLessEqual(left, 20.0)
            acquired = [key_of(op, body) for (n, op, _r, body) in sc.frames
                        if n == 1 and op == OP_ACQUIRE]
            self.assertEqual(acquired, [b"y"], "x was sent again, or y was not")
            self.assertEqual(c.resumes, 1)

    def test_in_flight_releases_and_cancels_are_settled_by_the_list(self) -> None:
        # p is released while the connection is down (not listed: done);
        # q's release is in flight and q still listed (sent again); r's
        # acquire was cancelled and is not listed (cancelled, not re-sent).
        def first(sc: Script, c: FakeConn) -> None:
            f = sc.read(c)
            assert f is not None
            c.welcome(f[1], flags=1, session_id=SID)
            while True:
                f = sc.read(c)
                if f is None:
                    return
                op, rid, body = f
                if op == OP_ACQUIRE and key_of(op, body) in (b"p", b"q"):
                    c.reply(rid, 0, 30 if key_of(op, body) == b"p" else 31)
                elif op == OP_PING:
                    c.reply(rid, 0)
                # Releases and Cancels: no answer; the connection dies.

        sc = Script(first, resumer([(b"q", 31, 1, 0xFFFFFFFF)], {}))
        cancel = ringlock.CancelToken()
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as c:
            p = c.acquire("p")
            q = c.acquire("q")
            tr, outr = in_thread(lambda: c.acquire("r", cancel=cancel))
            sc.wait_for(lambda: sc.ops(0).count(OP_ACQUIRE) == 3)
            tp, outp = in_thread(p.release)
            tq, outq = in_thread(q.release)
            cancel.cancel()
            sc.wait_for(lambda: sc.ops(0).count(OP_RELEASE) == 2 and OP_CANCEL in sc.ops(0))
            sc.kill(0)
            for t in (tr, tp, tq):
                t.join(WAIT)
                self.assertFalse(t.is_alive())
            self.assertIsInstance(outr[0], ringlock.Cancelled)
            self.assertEqual(outp, [None])
            self.assertEqual(outq, [None])
            ops1 = [(op, key_of(op, body)) for (n, op, _r, body) in sc.frames
                    if n == 1 and op != OP_PING]
            self.assertEqual(ops1[1:], [(OP_RELEASE, b"q")])
            self.assertIsNone(c.ended)

    def test_unknown_session_ends_the_session(self) -> None:
        unknown = lambda rid: struct.pack("<BIHBQI", 0x80, rid, 13, 13, 0, 0xFFFFFFFF)  # noqa: E731
        for name, refusal in (("unknown_session", unknown), ("a bare '-'", lambda rid: b"-")):
            with self.subTest(name):
                sc = Script(serve({b"a": 10}), refuse_resume(refusal))
                losses = Losses()
                with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0, on_lost=losses) as c:
                    c.acquire("a")
                    sc.kill(0)
                    got = losses.wait(1)
                    self.assertEqual(got[0][1].reason, ringlock.LostReason.SESSION_ENDED)
                    ended = c.ended
                    assert ended is not None
                    self.assertIn("refused", ended[1])
                    self.assertEqual(c.resumes, 0)
                    self.assertEqual(srv.connections, 2)
                    with self.assertRaises(ringlock.Unavailable):
                        c.ping()

    def test_no_resume_without_the_flag(self) -> None:
        for flags in (None, 0):
            with self.subTest(flags=flags):
                sc = Script(serve({b"a": 10}, flags=flags), resumer([(b"a", 10, 1, 0xFFFFFFFF)], {}))
                losses = Losses()
                with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0, on_lost=losses) as c:
                    self.assertFalse(c.resumable)
                    c.acquire("a")
                    sc.kill(0)
                    got = losses.wait(1)
                    self.assertEqual(got[0][1].reason, ringlock.LostReason.SESSION_ENDED)
                    self.assertIsNotNone(c.ended)
                    self.assertEqual(srv.connections, 1, "it tried to resume")
                    self.assertEqual(c.resumes, 0)

    def test_gives_up_once_the_keepalive_passed(self) -> None:
        # Every later connection answers not_leader naming nobody: the
        # client keeps walking until its keep-alive (0.3 s) has passed.
        not_leader = lambda rid: struct.pack("<BIHBB", 0x80, rid, 2, 12, 0)  # noqa: E731
        sc = Script(serve({b"a": 10}, keepalive_ms=300), refuse_resume(not_leader))
        losses = Losses()
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0, on_lost=losses) as c:
            c.acquire("a")
            sc.kill(0)
            got = losses.wait(1)
            self.assertEqual(got[0][1].reason, ringlock.LostReason.SESSION_ENDED)
            ended = c.ended
            assert ended is not None
            self.assertIn("within the keep-alive", ended[1])
            self.assertGreaterEqual(srv.connections, 2)
            self.assertEqual(c.resumes, 0)

    def test_a_not_leader_close_resumes_on_the_leader_it_names(self) -> None:
        leader_sc = Script(resumer([(b"a", 10, 1, 0xFFFFFFFF)], {}))

        def first(sc: Script, c: FakeConn) -> None:
            f = sc.read(c)
            assert f is not None
            c.welcome(f[1], flags=1, session_id=SID)
            while True:
                f = sc.read(c)
                if f is None:
                    return
                if f[0] == OP_ACQUIRE:
                    c.reply(f[1], 0, 10)
                elif f[0] == OP_EXTEND:
                    # This node lost its leadership: name the leader, close.
                    c.refuse(f[1], 12, leader.addr.encode())
                    return
                else:
                    c.reply(f[1], 0)

        # The leader is listed (second): a plaintext Resume, which carries
        # the session id, goes to listed addresses only (test_hints.py);
        # the hint puts it first.
        with FakeServer(leader_sc) as leader, FakeServer(Script(first)) as srv, \
                ringlock.Client([srv.addr, leader.addr], retry=0) as c:
            a = c.acquire("a")
            c.extend("a", 10, 5.0)  # answered not_leader, sent again after the resume
            self.assertEqual(c.resumes, 1)
            self.assertEqual(c.server_address, ("127.0.0.1", leader.port))
            self.assertFalse(a.lost)
            self.assertEqual([op for op in leader_sc.ops(0) if op != OP_PING], [OP_RESUME, OP_EXTEND])


if __name__ == "__main__":
    unittest.main()
