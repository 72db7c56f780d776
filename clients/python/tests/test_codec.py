"""Unit tests of the pure session-protocol codec (no server needed)."""

import struct
import unittest

from ringlock import _codec as c


class EncodeTest(unittest.TestCase):
    def test_the_documented_try_acquire_example_is_byte_exact(self) -> None:
        # docs/protocol.md: Acquire of key `k`, rid 1, no wait, empty source.
        want = bytes.fromhex("08 01000000 0c00 01 00000000 00000000 01 6b 00".replace(" ", ""))
        got = c.encode_acquire(1, c.HoldMode.SESSION, 0, 0, b"k", b"")
        self.assertEqual(got, want)

    def test_hello_without_and_with_auth(self) -> None:
        self.assertEqual(c.encode_hello(1, 3000),
                         bytes([7, 1, 0, 0, 0, 5, 0, 1]) + struct.pack("<I", 3000))
        f = c.encode_hello(1, 0, b"s3cret")
        self.assertEqual(f[5:7], struct.pack("<H", 1 + 4 + 1 + 6))
        self.assertEqual(f[-7:], b"\x06s3cret")

    def test_release_extend_cancel_ping_layouts(self) -> None:
        self.assertEqual(c.encode_release(9, 1 << 50, b"dep"),
                         b"\x09" + struct.pack("<IH", 9, 12) + struct.pack("<Q", 1 << 50)
                         + b"\x03dep")
        self.assertEqual(c.encode_extend(3, 7, 1500, b"k"),
                         b"\x0a" + struct.pack("<IH", 3, 14) + struct.pack("<QI", 7, 1500)
                         + b"\x01k")
        self.assertEqual(c.encode_cancel(4, 41, b"k"),
                         b"\x0b" + struct.pack("<IHI", 4, 6, 41) + b"\x01k")
        self.assertEqual(c.encode_ping(5), b"\x0c" + struct.pack("<IH", 5, 0))

    def test_bad_arguments_are_refused_before_encoding(self) -> None:
        with self.assertRaises(ValueError):
            c.encode_acquire(2, c.HoldMode.SESSION, 0, 0, b"", b"")
        with self.assertRaises(ValueError):
            c.encode_acquire(2, c.HoldMode.SESSION, 0, 0, b"x" * 128, b"")
        with self.assertRaises(ValueError):
            c.encode_acquire(2, c.HoldMode.SESSION, 0, 0, b"k", b"s" * 256)
        # A source is up to 255 bytes (its size byte unsigned), a key 127.
        f = c.encode_acquire(2, c.HoldMode.SESSION, 0, 0, b"k" * 127, b"s" * 255)
        self.assertEqual(f[-256:], b"\xff" + b"s" * 255)
        self.assertEqual(len(f), 7 + 9 + 128 + 256)
        with self.assertRaises(ValueError):
            c.encode_release(2, -1, b"k")
        with self.assertRaises(ValueError):
            c.encode_extend(2, 1, 1 << 32, b"k")
        with self.assertRaises(ValueError):
            c.encode_hello(1, 0, b"a" * 256)
        with self.assertRaises(ValueError):
            c.encode_ping(1 << 32)


def reply(rid: int, status: int, token: int, ttl: int) -> bytes:
    return struct.pack("<BIHBQI", 0x80, rid, 13, status, token, ttl)


def welcome(rid: int, extra: bytes = b"") -> bytes:
    body = struct.pack("<BBIIIQIIH", 0, 1, 3000, 10, 86_400_000, 42, 100, 200, 2) + extra
    return struct.pack("<BIH", 0x80, rid, len(body)) + body


class DecodeTest(unittest.TestCase):
    def test_reply_and_no_ttl(self) -> None:
        got = c.decode_answer(reply(5, 0, 123, 0xFFFFFFFF))
        self.assertEqual(got, (c.Reply(5, c.Status.OK, 123, None), 20))
        got = c.decode_answer(reply(6, 4, 0, 2500))
        assert got is not None
        self.assertEqual(got[0], c.Reply(6, c.Status.STALE_TOKEN, 0, 2500))
        self.assertEqual(c.Status.STALE_TOKEN.label, "stale_token")

    def test_every_prefix_is_incomplete(self) -> None:
        frame = reply(5, 0, 123, 7) + b"\x81"
        for n in range(20):
            self.assertIsNone(c.decode_answer(frame[:n]), n)
        got = c.decode_answer(frame)
        assert got is not None
        self.assertEqual(got[1], 20, "only the first frame is consumed")

    def test_welcome_only_for_the_hello_rid_and_extra_fields_skipped(self) -> None:
        w = welcome(1, b"future")
        got = c.decode_answer(w, hello_rid=1)
        assert got is not None
        ans, used = got
        self.assertIsInstance(ans, c.Welcome)
        assert isinstance(ans, c.Welcome)
        self.assertEqual((ans.keepalive_ms, ans.min_ttl_ms, ans.max_ttl_ms, ans.session_id,
                          ans.max_keys, ans.max_waiters, ans.shards),
                         (3000, 10, 86_400_000, 42, 100, 200, 2))
        self.assertEqual(used, len(w))
        with self.assertRaises(c.ProtocolError):
            c.decode_answer(w)  # not the hello's rid: a 32-byte reply is malformed

    def test_refused_hello_is_a_plain_reply(self) -> None:
        got = c.decode_answer(reply(1, 10, 0, 0xFFFFFFFF), hello_rid=1)
        assert got is not None
        self.assertEqual(got[0], c.Reply(1, c.Status.UNAUTHORIZED, 0, None))

    def test_statuses_with_detail_whatever_the_request(self) -> None:
        # docs/protocol.md: the 10-byte frame from a server speaking version 1 only.
        frame = bytes.fromhex("80 44332211 0300 0b 01 01".replace(" ", ""))
        got = c.decode_answer(frame, hello_rid=0x11223344)
        self.assertEqual(got, (c.Refused(0x11223344, c.Status.UNSUPPORTED_VERSION, b"\x01"), 10))
        assert got is not None
        self.assertEqual(got[0].versions, (1,))  # type: ignore[union-attr]
        lead = b"10.0.0.9:22119"
        frame = struct.pack("<BIHBB", 0x80, 9, 2 + len(lead), 12, len(lead)) + lead
        got = c.decode_answer(frame)  # not a Hello's rid: the same layout
        assert got is not None
        ans = got[0]
        assert isinstance(ans, c.Refused)
        self.assertEqual((ans.rid, ans.status, ans.leader), (9, c.Status.NOT_LEADER, lead.decode()))
        self.assertEqual(got[1], len(frame))
        empty = c.decode_answer(struct.pack("<BIHBB", 0x80, 9, 2, 12, 0))
        assert empty is not None
        self.assertIsNone(empty[0].leader)  # type: ignore[union-attr]
        self.assertEqual(c.Status.NOT_LEADER.label, "not_leader")
        self.assertEqual(c.Status.UNSUPPORTED_VERSION.label, "unsupported_version")
        self.assertTrue(c.Status.NOT_LEADER.has_detail)
        self.assertFalse(c.Status.UNAUTHORIZED.has_detail)
        for n in range(len(frame)):
            self.assertIsNone(c.decode_answer(frame[:n]), n)

    def test_hello_of_another_version(self) -> None:
        self.assertEqual(c.encode_hello(3, 0, version=9)[7], 9)

    def test_lost_push(self) -> None:
        body = struct.pack("<QBB", 77, 2, 3) + b"abc"
        frame = struct.pack("<BIH", 0x81, 0, len(body)) + body
        self.assertEqual(c.decode_answer(frame), (c.Lost(b"abc", 77, c.LostWhy.RESET), len(frame)))

    def test_resume_held_and_the_welcome_flags(self) -> None:
        self.assertEqual(c.encode_resume(1, 0x0080000000000007),
                         bytes([13, 1, 0, 0, 0, 9, 0, 1]) + struct.pack("<Q", 0x0080000000000007))
        self.assertEqual(c.encode_resume(1, 7, b"s")[-2:], b"\x01s")
        body = struct.pack("<QBIB", 42, 2, 1500, 3) + b"abc"
        frame = struct.pack("<BIH", 0x82, 1, len(body)) + body
        self.assertEqual(c.decode_answer(frame),
                         (c.Held(1, b"abc", 42, c.HoldMode.LEASE, 1500), len(frame)))
        body = struct.pack("<QBIB", 43, 1, 0xFFFFFFFF, 1) + b"k"
        held = c.decode_answer(struct.pack("<BIH", 0x82, 1, len(body)) + body)
        assert held is not None
        self.assertIsNone(held[0].ttl_left_ms)
        w32 = welcome(1)
        w = c.decode_answer(w32, 1)
        assert w is not None
        self.assertEqual((w[0].flags, w[0].resumable), (0, False))
        w33 = struct.pack("<BIH", 0x80, 1, 33) + w32[7:] + b"\x01"
        w = c.decode_answer(w33, 1)
        assert w is not None
        self.assertEqual((w[0].flags, w[0].resumable, w[1]), (1, True, len(w33)))
        r = c.decode_answer(reply(1, 13, 0, 0xFFFFFFFF))
        assert r is not None
        self.assertEqual(r[0].status, c.Status.UNKNOWN_SESSION)
        # tls_required answers a Hello (its rid) in the 13-byte layout.
        r = c.decode_answer(reply(1, 14, 0, 0xFFFFFFFF), 1)
        assert r is not None
        self.assertEqual((r[0].status, r[0].status.label), (c.Status.TLS_REQUIRED, "tls_required"))

    def test_garbage_is_a_protocol_error(self) -> None:
        bad = [
            struct.pack("<BIH", 0x99, 0, 0),                        # unknown kind
            struct.pack("<BIH", 0x80, 0, 513) + b"\0" * 513,         # oversized body
            struct.pack("<BIH", 0x80, 3, 12) + b"\0" * 12,           # short reply
            reply(3, 16, 0, 0),                                      # unknown status
            struct.pack("<BIH", 0x82, 1, 15) + struct.pack("<QBIB", 1, 3, 0, 1) + b"k",  # hold 3
            struct.pack("<BIH", 0x82, 1, 15) + struct.pack("<QBIB", 1, 1, 0, 2) + b"k",  # key len
            reply(3, 11, 0, 0),              # status 11 in the 13-byte layout
            struct.pack("<BIH", 0x80, 3, 1) + b"\x0c",                # no detail length
            struct.pack("<BIH", 0x80, 3, 4) + b"\x0b\x01\x01\x02",    # detail longer than said
            struct.pack("<BIH", 0x80, 3, 3) + b"\x0c\x05ab",          # detail shorter than said
            struct.pack("<BIH", 0x80, 3, 0),                         # an empty reply body
            struct.pack("<BIH", 0x81, 0, 11) + struct.pack("<QBB", 1, 9, 1) + b"k",  # reason 9
            struct.pack("<BIH", 0x81, 0, 11) + struct.pack("<QBB", 1, 1, 2) + b"k",  # key len
            struct.pack("<BIH", 0x81, 0, 10) + struct.pack("<QBB", 1, 1, 0),          # empty key
        ]
        for b in bad:
            with self.assertRaises(c.ProtocolError, msg=b.hex()):
                c.decode_answer(b)

    def test_round_trip_of_a_stream_fed_byte_by_byte(self) -> None:
        stream = welcome(1) + reply(2, 0, 5, 100) + reply(3, 1, 0, 0xFFFFFFFF)
        buf = bytearray()
        out = []
        for b in stream:
            buf.append(b)
            got = c.decode_answer(buf, hello_rid=1 if not out else None)
            if got is not None:
                out.append(got[0])
                del buf[:got[1]]
        self.assertEqual(len(out), 3)
        self.assertEqual(out[1], c.Reply(2, c.Status.OK, 5, 100))
        self.assertEqual(out[2], c.Reply(3, c.Status.TIMED_OUT, 0, None))
        self.assertFalse(buf)


class ModesTest(unittest.TestCase):
    """Lock modes (``docs/protocol.md``, "Lock modes"): the Acquire's
    ``[u8 access][u32 slots]`` trailer, the welcome's modes flag, status 15."""

    def test_the_trailer_only_for_shared_and_semaphore(self) -> None:
        base = c.encode_acquire(1, c.HoldMode.SESSION, 0, 0, b"k", b"")
        # Exclusive: no trailer, byte for byte the frame of an older client.
        self.assertEqual(c.encode_acquire(1, c.HoldMode.SESSION, 0, 0, b"k", b"",
                                          c.ACCESS_EXCLUSIVE, 0), base)
        shared = c.encode_acquire(1, c.HoldMode.SESSION, 0, 0, b"k", b"", c.ACCESS_SHARED)
        self.assertEqual(shared, bytes.fromhex(
            "08 01000000 1100 01 00000000 00000000 01 6b 00 01 00000000".replace(" ", "")))
        sem = c.encode_acquire(7, c.HoldMode.LEASE, 30_000, c.WAIT_FOREVER, b"pool", b"w1",
                               c.ACCESS_SEMAPHORE, 3)
        self.assertEqual(sem[5:7], struct.pack("<H", 1 + 4 + 4 + 5 + 3 + 5))
        self.assertEqual(sem[-5:], b"\x02" + struct.pack("<I", 3))
        # The body before it is the exclusive request's body.
        self.assertEqual(sem[7:-5], c.encode_acquire(7, c.HoldMode.LEASE, 30_000,
                                                     c.WAIT_FOREVER, b"pool", b"w1")[7:])

    def test_bad_access_is_refused_before_encoding(self) -> None:
        for access, slots in [(c.ACCESS_SEMAPHORE, 0), (c.ACCESS_SHARED, 2),
                              (c.ACCESS_EXCLUSIVE, 1), (3, 0), (c.ACCESS_SEMAPHORE, 1 << 32)]:
            with self.assertRaises(ValueError, msg=(access, slots)):
                c.encode_acquire(1, c.HoldMode.SESSION, 0, 0, b"k", b"", access, slots)

    def test_the_modes_flag(self) -> None:
        w32 = welcome(1)
        for flags, resumable, modes in [(0, False, False), (1, True, False), (2, False, True),
                                        (3, True, True)]:
            w = c.decode_answer(struct.pack("<BIH", 0x80, 1, 33) + w32[7:] + bytes([flags]), 1)
            assert w is not None
            ans = w[0]
            assert isinstance(ans, c.Welcome)
            self.assertEqual((ans.flags, ans.resumable, ans.modes), (flags, resumable, modes))
        w = c.decode_answer(w32, 1)  # an older server's 32-byte welcome: no modes
        assert w is not None and isinstance(w[0], c.Welcome)
        self.assertFalse(w[0].modes)
        self.assertEqual(c.FLAG_MODES, 2)

    def test_status_15_mode_mismatch(self) -> None:
        got = c.decode_answer(reply(4, 15, 0, 0xFFFFFFFF))
        self.assertEqual(got, (c.Reply(4, c.Status.MODE_MISMATCH, 0, None), 20))
        self.assertEqual(c.Status.MODE_MISMATCH.label, "mode_mismatch")
        self.assertFalse(c.Status.MODE_MISMATCH.has_detail)
        # Every status the protocol documents, 0..=15, and its name.
        names = ["ok", "timed_out", "busy", "not_owner", "stale_token", "invalid",
                 "limit_reached", "server_error", "cancelled", "not_queued", "unauthorized",
                 "unsupported_version", "not_leader", "unknown_session", "tls_required",
                 "mode_mismatch"]
        self.assertEqual([st.label for st in c.Status], names)
        self.assertEqual([int(st) for st in c.Status], list(range(16)))


class AddressTest(unittest.TestCase):
    def test_addresses(self) -> None:
        from ringlock._client import _parse_address
        from ringlock import InvalidArgument
        self.assertEqual(_parse_address("h"), ("h", 22119))
        self.assertEqual(_parse_address("h:1"), ("h", 1))
        self.assertEqual(_parse_address("[::1]:5"), ("::1", 5))
        self.assertEqual(_parse_address("[::1]"), ("::1", 22119))
        self.assertEqual(_parse_address("::1"), ("::1", 22119))
        self.assertEqual(_parse_address(("h", 7)), ("h", 7))
        for bad in ["", "h:0", "h:99999", "h:x", "[::1", ":5"]:
            with self.assertRaises(InvalidArgument, msg=bad):
                _parse_address(bad)


if __name__ == "__main__":
    unittest.main()
