"""Secrets never go to a server nobody verified: without TLS, a
``not_leader`` hint that is not among the client's addresses is not
dialled when the Hello carries the auth token, nor by a Resume (it carries
the session id); and ``tls_required`` (status 14) answering a Hello or a
Resume. Against scripted fake servers over 127.0.0.1; the hint points at a
listener that records every byte it receives, and must receive none."""

import struct
import threading
import time
import unittest
from typing import List

import ringlock
from fake_server import FakeConn, FakeServer

OP_HELLO, OP_ACQUIRE, OP_EXTEND, OP_PING, OP_RESUME = 7, 8, 10, 12, 13
NOT_LEADER, TLS_REQUIRED = 12, 14
TOKEN = b"the-auth-token-3f9c1a"
SID = 0x0080_0000_0000_0007


class Sink:
    """A listener that records every byte it receives and answers nothing."""

    def __init__(self) -> None:
        self.data = bytearray()
        self._mu = threading.Lock()
        self.srv = FakeServer(self._handle)
        self.addr = self.srv.addr

    def _handle(self, c: FakeConn) -> None:
        while True:
            b = c.sock.recv(4096)
            if not b:
                return
            with self._mu:
                self.data += b

    def received(self) -> bytes:
        with self._mu:
            return bytes(self.data)

    def __enter__(self) -> "Sink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.srv.close()


def refuse_hello(status: int, detail: bytes, hellos: List[bytes]):  # type: ignore[no-untyped-def]
    """Answers the Hello with a status with detail, then closes."""

    def handle(c: FakeConn) -> None:
        f = c.read()
        if f is None:
            return
        hellos.append(f[2])
        c.refuse(f[1], status, detail)

    return handle


def welcome_then_ping(c: FakeConn) -> None:
    f = c.read()
    if f is None:
        return
    c.welcome(f[1])
    c.serve_pings()


def resumable(second: "callable"):  # type: ignore[valid-type, no-untyped-def]
    """Connection 1: a resumable session whose Acquire is granted and whose
    Extend is answered not_leader naming ``leader`` (then closed); later
    connections run ``second`` (a Resume comes)."""
    state = {"n": 0, "leader": b""}
    mu = threading.Lock()

    def handle(c: FakeConn) -> None:
        with mu:
            state["n"] += 1
            n = state["n"]
        if n > 1:
            second(c)
            return
        f = c.read()
        if f is None:
            return
        c.welcome(f[1], flags=1, session_id=SID)
        while True:
            f = c.read()
            if f is None:
                return
            if f[0] == OP_ACQUIRE:
                c.reply(f[1], 0, 10)
            elif f[0] == OP_EXTEND:
                c.refuse(f[1], NOT_LEADER, state["leader"])
                return
            else:
                c.reply(f[1], 0)

    return handle, state


class UnverifiedHintTest(unittest.TestCase):
    def test_a_hello_with_a_token_does_not_follow_an_unlisted_hint_without_tls(self) -> None:
        hellos: List[bytes] = []
        with Sink() as sink, FakeServer(refuse_hello(NOT_LEADER, sink.addr.encode(),
                                                     hellos)) as a:
            t0 = time.monotonic()
            try:
                ringlock.Client(a.addr, auth_token=TOKEN, retry=2, connect_timeout=0.5).close()
                e: Exception = AssertionError("a session was opened")
            except ringlock.RingLockError as got:
                e = got
            time.sleep(0.1)
            self.assertEqual(sink.srv.connections, 0, f"the hint was dialled ({e})")
            self.assertNotIn(TOKEN, sink.received())
            self.assertIsInstance(e, ringlock.UnverifiedLeader)
            assert isinstance(e, ringlock.UnverifiedLeader)
            self.assertIsInstance(e, ringlock.NotLeader)
            self.assertEqual((e.leader, e.status), (sink.addr, "not_leader"))
            msg = str(e)
            for part in (sink.addr, a.addr, "ssl_context", "auth token", "list"):
                self.assertIn(part, msg)
            # Not retried for `retry` seconds: only the configuration can change it.
            self.assertLess(time.monotonic() - t0, 1.5)
            self.assertEqual(a.connections, 1)
            self.assertIn(TOKEN, hellos[0], "the listed address had the token (the user's choice)")

    def test_a_listed_hint_or_a_hello_without_a_token_follows_it(self) -> None:
        with FakeServer(welcome_then_ping) as leader:
            with FakeServer(refuse_hello(NOT_LEADER, leader.addr.encode(), [])) as a:
                # Listed (after a): dialled first, with the token.
                with ringlock.Client([a.addr, leader.addr], auth_token=TOKEN, retry=0) as c:
                    self.assertEqual(c.server_address, ("127.0.0.1", leader.port))
                # No token: nothing secret in the Hello, an unlisted hint is dialled.
                with ringlock.Client(a.addr, retry=0) as c:
                    self.assertEqual(c.server_address, ("127.0.0.1", leader.port))
                    c.ping()
            self.assertEqual(leader.connections, 2)

    def test_a_resume_does_not_follow_an_unlisted_hint_without_tls(self) -> None:
        resumes: List[bytes] = []

        def second(c: FakeConn) -> None:
            # a itself (listed) is tried next: it names the same leader.
            f = c.read()
            if f is None:
                return
            resumes.append(bytes([f[0]]) + f[2])
            c.refuse(f[1], NOT_LEADER, state["leader"])

        handle, state = resumable(second)
        with Sink() as sink, FakeServer(handle) as a:
            state["leader"] = sink.addr.encode()
            c = ringlock.Client(a.addr, retry=0, connect_timeout=0.5)
            try:
                self.assertTrue(c.resumable)
                lease = c.acquire("k")
                try:
                    c.extend("k", 10, 5.0)  # answered not_leader: the connection fails
                    e: Exception = AssertionError("the extend succeeded")
                except ringlock.RingLockError as got:
                    e = got
                self.assertTrue(lease.wait_lost(10))
                time.sleep(0.1)
                self.assertEqual(sink.srv.connections, 0, "the hint was dialled with a Resume")
                self.assertNotIn(struct.pack("<Q", SID), sink.received())
                ended = c.ended
                assert ended is not None
                self.assertEqual(ended[0], ringlock.LostReason.SESSION_ENDED)
                for part in (sink.addr, "session id", "ssl_context"):
                    self.assertIn(part, ended[1])
                self.assertIsInstance(e, ringlock.NotLeader)
                assert isinstance(e, ringlock.NotLeader)
                self.assertEqual(e.leader, sink.addr)
                self.assertEqual(c.resumes, 0)
            finally:
                c.close()
            # The listed address was asked (and carried the session id: listed).
            self.assertTrue(resumes and resumes[0][0] == OP_RESUME)
            self.assertIn(struct.pack("<Q", SID), resumes[0])


class TLSRequiredTest(unittest.TestCase):
    def test_a_hello_answered_tls_required_says_to_give_an_ssl_context(self) -> None:
        def handle(c: FakeConn) -> None:
            f = c.read()
            if f is not None:
                c.reply(f[1], TLS_REQUIRED)

        with FakeServer(handle) as a:
            t0 = time.monotonic()
            with self.assertRaises(ringlock.TLSRequired) as cm:
                ringlock.Client(a.addr, retry=10)
            e = cm.exception
            self.assertIsInstance(e, ringlock.Unavailable)
            self.assertEqual(e.status, "tls_required")
            self.assertIn("TLS only", str(e))
            self.assertIn("ssl_context=ringlock.tls_context", str(e))
            self.assertLess(time.monotonic() - t0, 5.0, "tls_required was retried")
            self.assertEqual(a.connections, 1)

    def test_a_resume_answered_tls_required_ends_the_session_saying_so(self) -> None:
        def second(c: FakeConn) -> None:
            f = c.read()
            if f is not None:
                c.reply(f[1], TLS_REQUIRED)

        handle, state = resumable(second)
        with FakeServer(handle) as a:
            state["leader"] = a.addr.encode()  # itself: listed
            with ringlock.Client(a.addr, retry=0) as c:
                lease = c.acquire("k")
                with self.assertRaises(ringlock.Unavailable):
                    c.extend("k", 10, 5.0)
                self.assertTrue(lease.wait_lost(10))
                ended = c.ended
                assert ended is not None
                self.assertIn("tls_required", ended[1])
                self.assertIn("ssl_context", ended[1])


if __name__ == "__main__":
    unittest.main()
