"""What a lost lock reports, against a scripted fake server over 127.0.0.1:

* ``lease.lost_info`` is the very :class:`ringlock.LostInfo` the
  ``on_lost`` callbacks got, whichever side decided the loss first: a
  lease that expired on this client's clock and was then confirmed by the
  server's Lost push is still described as a client-side expiry
  (``from_server=False``), and a loss the server pushed first as a push.
* Keys come back in the type they were given: a ``str`` key as that
  ``str`` (``lease.key``, ``LostInfo.key``, the errors' ``info``), bytes
  as bytes; ``key_bytes`` is always the UTF-8 bytes on the wire.

Every wait is bounded and awaits a signal."""

import struct
import threading
import unittest
from typing import List, Optional, Tuple

import ringlock
from fake_server import FakeConn, FakeServer

OP_HELLO, OP_ACQUIRE, OP_RELEASE, OP_EXTEND, OP_PING = 7, 8, 9, 10, 12
LOST_EXPIRED, LOST_RESET = 1, 2
WAIT = 10.0


class Server:
    """Welcomes the Hello (not resumable), grants every Acquire (tokens 100,
    101, ...), answers everything else ok; records the ops and lets the
    test push Lost frames on the session's connection."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.ops: List[int] = []
        self.grants: List[Tuple[bytes, int]] = []
        self.conn: Optional[FakeConn] = None
        self.srv = FakeServer(self.handle)

    def handle(self, c: FakeConn) -> None:
        f = c.read()
        if f is None or f[0] != OP_HELLO:
            return
        c.welcome(f[1])
        with self.cv:
            self.conn = c
        while True:
            f = c.read()
            if f is None:
                return
            op, rid, body = f
            with self.cv:
                self.ops.append(op)
                if op == OP_ACQUIRE:
                    key = body[10:10 + body[9]]
                    token = 100 + len(self.grants)
                    self.grants.append((key, token))
                    ttl = struct.unpack_from("<I", body, 1)[0] if body[0] == 2 else 0xFFFFFFFF
                    c.reply(rid, 0, token, ttl)
                else:
                    c.reply(rid, 0)
                self.cv.notify_all()

    def push_lost(self, key: bytes, token: int, why: int) -> None:
        body = struct.pack("<QBB", token, why, len(key)) + key
        with self.cv:
            assert self.conn is not None
            self.conn.send(struct.pack("<BIH", 0x81, 0, len(body)) + body)

    def ops_seen(self) -> List[int]:
        with self.cv:
            return list(self.ops)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.srv.close()


class Losses:
    """An on_lost callback that records (lease, info) and signals."""

    def __init__(self) -> None:
        self.got: List[Tuple[ringlock.Lease, ringlock.LostInfo]] = []
        self.cv = threading.Condition()

    def __call__(self, lease: ringlock.Lease, info: ringlock.LostInfo) -> None:
        with self.cv:
            self.got.append((lease, info))
            self.cv.notify_all()

    def wait(self, n: int) -> List[Tuple[ringlock.Lease, ringlock.LostInfo]]:
        with self.cv:
            if not self.cv.wait_for(lambda: len(self.got) >= n, WAIT):
                raise AssertionError(f"{n} loss(es) expected, got {self.got}")
            return list(self.got)


class LostInfoAgreesTest(unittest.TestCase):
    def test_a_client_side_expiry_confirmed_by_a_push_stays_client_side(self) -> None:
        losses = Losses()
        with Server() as s, ringlock.Client(s.srv.addr, retry=0) as c:
            lease = c.acquire("exp/k", ttl=0.2, keep_alive=False, on_lost=losses)
            (_, info), = losses.wait(1)  # the TTL passed on this client's clock
            self.assertEqual(info.reason, ringlock.LostReason.EXPIRED)
            self.assertFalse(info.from_server)
            # Then the server's own expiry pushes Lost; the Ping's answer,
            # written after the push, proves the reader has handled it.
            s.push_lost(b"exp/k", lease.token, LOST_EXPIRED)
            c.ping()
            got = lease.lost_info
            self.assertIs(got, info, f"lost_info {got} is not what the callback got: {info}")
            self.assertFalse(got.from_server)
            self.assertNotIn("server", got.detail)
            self.assertIn("this client's clock", str(got))
            self.assertEqual(len(losses.got), 1, "the push ran the callback again")
            # The confirmation still counts: the release raises at once and
            # sends nothing (the server said the key is gone).
            with self.assertRaises(ringlock.LockLost) as cm:
                lease.release()
            self.assertIs(cm.exception.info, info)
            c.ping()
            self.assertNotIn(OP_RELEASE, s.ops_seen())

    def test_a_push_first_is_described_as_a_push(self) -> None:
        losses = Losses()
        with Server() as s, ringlock.Client(s.srv.addr, retry=0) as c:
            lease = c.acquire("push/k", ttl=60, on_lost=losses)
            s.push_lost(b"push/k", lease.token, LOST_EXPIRED)
            (_, info), = losses.wait(1)
            self.assertTrue(info.from_server)
            self.assertIn("the server pushed Lost (expired)", info.detail)
            self.assertIs(lease.lost_info, info)
            with self.assertRaises(ringlock.LockLost) as cm:
                lease.check()
            self.assertIs(cm.exception.info, info)


class KeyTypeTest(unittest.TestCase):
    def test_a_str_key_comes_back_as_that_str_and_bytes_as_bytes(self) -> None:
        losses = Losses()
        text = "счёт/é-🔒"
        with Server() as s:
            c = ringlock.Client(s.srv.addr, retry=0, on_lost=losses)
            try:
                a = c.acquire(text)
                b = c.acquire(b"raw/\xff")
                ba = c.acquire(bytearray(b"ba"))
                self.assertIs(type(a.key), str)
                self.assertEqual(a.key, text)
                self.assertEqual(a.key_bytes, text.encode("utf-8"))
                self.assertIs(type(b.key), bytes)
                self.assertEqual(b.key, b"raw/\xff")
                self.assertEqual(b.key_bytes, b"raw/\xff")
                self.assertIs(type(ba.key), bytes)
                self.assertEqual(ba.key, b"ba")
                self.assertIn(repr(text), repr(a))
                # What the server saw: the UTF-8 bytes.
                with s.cv:
                    self.assertEqual([k for k, _ in s.grants],
                                     [text.encode("utf-8"), b"raw/\xff", b"ba"])
                # A push for the str key: the callback and the errors name it as str.
                s.push_lost(text.encode("utf-8"), a.token, LOST_RESET)
                (lease, info), = losses.wait(1)
                self.assertIs(lease, a)
                self.assertIs(type(info.key), str)
                self.assertEqual(info.key, text)
                self.assertEqual(info.key_bytes, text.encode("utf-8"))
                self.assertIn(repr(text), str(info))
                with self.assertRaises(ringlock.LockLost) as cm:
                    a.check()
                assert cm.exception.info is not None
                self.assertEqual(cm.exception.info.key, text)
            finally:
                c.close()
            # The session's end: the bytes keys' losses name them as bytes.
            got = losses.wait(3)
            ended = {type(i.key): i.key for (_, i) in got[1:]}
            self.assertEqual(sorted(i.key for (_, i) in got[1:]), [b"ba", b"raw/\xff"])
            self.assertEqual(list(ended), [bytes])
            self.assertIn(repr(b"raw/\xff"), str(got[1][1]) + str(got[2][1]))


if __name__ == "__main__":
    unittest.main()
