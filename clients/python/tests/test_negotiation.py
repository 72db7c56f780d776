"""The client against a scripted fake server: version negotiation
(``unsupported_version``), ``not_leader`` on the Hello and on a live
session (the real ringlockd never sends it yet), and rid 0. The real
server's ``unsupported_version`` is tested by the conformance scenario
``unsupported_version``."""

import struct
import threading
import unittest
from typing import List, Tuple

import ringlock
from fake_server import FakeConn, FakeServer, dead_address

OP_PING, OP_ACQUIRE = 12, 8


def welcomer(seen: List[Tuple[int, int]]):  # type: ignore[no-untyped-def]
    """Welcomes the Hello, then answers Pings ok, recording (op, rid)."""

    def handle(c: FakeConn) -> None:
        f = c.read()
        if f is None:
            return
        c.welcome(f[1])
        while True:
            f = c.read()
            if f is None:
                return
            seen.append((f[0], f[1]))
            c.reply(f[1], 0 if f[0] == OP_PING else 5)

    return handle


def refuser(status: int, detail: bytes, hellos: List[bytes]):  # type: ignore[no-untyped-def]
    """Answers the Hello with a status with detail, then closes."""

    def handle(c: FakeConn) -> None:
        f = c.read()
        if f is None:
            return
        hellos.append(f[2])
        c.refuse(f[1], status, detail)

    return handle


def port(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


class VersionTest(unittest.TestCase):
    def test_unsupported_version_names_the_servers_versions_and_is_not_retried(self) -> None:
        hellos: List[bytes] = []
        with FakeServer(refuser(11, bytes([2, 3]), hellos)) as a, \
                FakeServer(welcomer([])) as b:
            with self.assertRaises(ringlock.UnsupportedVersion) as cm:
                ringlock.Client([a.addr, b.addr], retry=10)
            e = cm.exception
            self.assertEqual(e.versions, (2, 3))
            self.assertEqual(e.status, "unsupported_version")
            self.assertIn("version 1", str(e))
            self.assertIn("versions 2, 3", str(e))
            self.assertIsInstance(e, ringlock.Unavailable)
            # Not retried, and no other address tried.
            self.assertEqual((a.connections, b.connections), (1, 0))
            self.assertEqual(hellos[0][0], 1, "the Hello asked for version 1")


class NotLeaderTest(unittest.TestCase):
    def test_a_hello_answered_not_leader_tries_the_named_leader_first(self) -> None:
        with FakeServer(welcomer([])) as leader, FakeServer(welcomer([])) as b:
            with FakeServer(refuser(12, leader.addr.encode(), [])) as a:
                with ringlock.Client([a.addr, b.addr], retry=0) as c:
                    self.assertEqual(c.server_address, ("127.0.0.1", leader.port))
                    c.ping()
                self.assertEqual((a.connections, leader.connections, b.connections), (1, 1, 0))

    def test_not_leader_without_a_leader_tries_the_next_address(self) -> None:
        with FakeServer(refuser(12, b"", [])) as a, FakeServer(welcomer([])) as b:
            with ringlock.Client([a.addr, b.addr], retry=0) as c:
                self.assertEqual(c.server_address, ("127.0.0.1", b.port))

    def test_an_unreachable_leader_falls_back_to_the_other_addresses(self) -> None:
        with FakeServer(refuser(12, dead_address().encode(), [])) as a, \
                FakeServer(welcomer([])) as b:
            with ringlock.Client([a.addr, b.addr], retry=0) as c:
                self.assertEqual(c.server_address, ("127.0.0.1", b.port))
            self.assertEqual(a.connections, 1)

    def test_servers_naming_each_other_are_each_tried_once_a_round(self) -> None:
        # a names b, b names a: one round tries each once, then gives up
        # (retry=0) with an error that names the leader it was told of.
        hint_b: List[bytes] = [b""]

        def a_handler(c: FakeConn) -> None:
            refuser(12, hint_b[0], [])(c)

        with FakeServer(a_handler) as a:
            with FakeServer(refuser(12, a.addr.encode(), [])) as b:
                hint_b[0] = b.addr.encode()
                with self.assertRaises(ringlock.Unavailable) as cm:
                    ringlock.Client([a.addr], retry=0)
                self.assertEqual((a.connections, b.connections), (1, 1))
                self.assertIn("not the leader", str(cm.exception))
                self.assertIn(a.addr, str(cm.exception))

    def test_not_leader_on_a_live_session_ends_it_naming_the_leader(self) -> None:
        told = threading.Event()

        def handle(c: FakeConn) -> None:
            f = c.read()
            if f is None:
                return
            c.welcome(f[1])
            while True:
                f = c.read()
                if f is None:
                    return
                if f[0] == OP_ACQUIRE:
                    c.refuse(f[1], 12, b"10.0.0.9:22119")
                    told.set()
                    return  # and close, as the document says
                c.reply(f[1], 0)

        with FakeServer(handle) as a:
            c = ringlock.Client(a.addr, retry=0)
            try:
                with self.assertRaises(ringlock.NotLeader) as cm:
                    c.acquire("k", timeout=1)
                self.assertEqual(cm.exception.leader, "10.0.0.9:22119")
                self.assertIn("10.0.0.9:22119", str(cm.exception))
                ended = c.ended
                assert ended is not None
                self.assertIn("not_leader", ended[1])
                self.assertIn("10.0.0.9:22119", ended[1])
                # The session does not reconnect: every later request is told too.
                with self.assertRaises(ringlock.NotLeader):
                    c.ping()
                self.assertEqual(a.connections, 1)
            finally:
                c.close()


class RidTest(unittest.TestCase):
    def test_rid_zero_is_an_ordinary_request_id(self) -> None:
        seen: List[Tuple[int, int]] = []
        with FakeServer(welcomer(seen)) as a, ringlock.Client(a.addr, retry=0) as c:
            c._next_rid = 0xFFFFFFFF
            c.ping()
            c.ping()
            self.assertIn((OP_PING, 0xFFFFFFFF), seen)
            self.assertIn((OP_PING, 0), seen)


if __name__ == "__main__":
    unittest.main()
