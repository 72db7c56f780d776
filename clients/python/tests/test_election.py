"""Elections (``docs/protocol.md``, "Elections: campaign, proclaim, resign,
observe"): the Proclaim codec and the skipped Event of an unknown kind;
``Client.election`` against a scripted fake server (the *proclaim* flag
checked before anything is sent, the campaign's value as that Acquire's
source only, each answer to a Proclaim, an unknown Event kind skipped by
the reader) and against the real ringlockd on one shard and on two
(campaign order, a proclaim seen by an observer with the same token,
resign and a leader's session end handing over, a proclaim after a reset
or a resign refused as leadership lost, bad values refused)."""

import struct
import threading
import unittest
from typing import List, Optional

import ringlock
from ringlock import _codec as c
from fake_server import HDR, FakeConn, FakeServer
from harness import Child, Server, poll
from test_resume import OP_ACQUIRE, OP_PING, SID, WAIT, Script, in_thread

FLAG_MODES, FLAG_WATCHES, FLAG_PROCLAIM = 2, 4, 8
OP_WATCH, OP_PROCLAIM = 15, 17
OK, NOT_OWNER, STALE, INVALID, LIMIT = 0, 3, 4, 5, 6


class ProclaimCodecTest(unittest.TestCase):
    def test_proclaim_layout_and_round_trip(self) -> None:
        token = 0x0102030405060708
        f = c.encode_proclaim(5, token, b"lead", b"a:1")
        self.assertEqual(f, b"\x11" + struct.pack("<IH", 5, 8 + 1 + 4 + 1 + 3)
                         + struct.pack("<Q", token) + b"\x04lead\x03a:1")
        # Read back as a server reads it: [u64 token][u8 keyLen][key][u8 srcLen][src].
        op, rid, blen = HDR.unpack_from(f, 0)
        body = f[7:]
        self.assertEqual((op, rid, blen, len(body)), (c.OP_PROCLAIM, 5, len(body), blen))
        (tok,) = struct.unpack_from("<Q", body, 0)
        key = body[9:9 + body[8]]
        at = 9 + body[8]
        src = body[at + 1:at + 1 + body[at]]
        self.assertEqual((tok, key, src, at + 1 + body[at]), (token, b"lead", b"a:1", blen))
        # An empty source is the protocol's (the client's IP); 255 bytes the
        # most (its size byte is unsigned); a key stays 1..127.
        self.assertEqual(c.encode_proclaim(1, 1, b"k", b"")[-2:], b"k\x00")
        self.assertEqual(len(c.encode_proclaim(1, 1, b"k", b"v" * 255)), 7 + 8 + 2 + 1 + 255)
        self.assertEqual(c.encode_proclaim(1, 1, b"k", b"v" * 255)[-256], 255)
        for key, src in ((b"", b"v"), (b"k" * 128, b"v"), (b"k", b"v" * 256)):
            with self.assertRaises(ValueError):
                c.encode_proclaim(1, 1, key, src)
        with self.assertRaises(ValueError):
            c.encode_proclaim(1, -1, b"k", b"v")

    def test_the_proclaim_flag_and_the_proclaimed_event(self) -> None:
        self.assertEqual((c.FLAG_PROCLAIM, c.OP_PROCLAIM, int(c.EventKind.PROCLAIMED)),
                         (8, 17, 6))
        w = c.Welcome(1, c.Status.OK, 1, 1000, 10, 100, 1, 1, 1, 1, 14)
        self.assertTrue(w.proclaim and w.watches and w.modes)
        self.assertFalse(c.Welcome(1, c.Status.OK, 1, 1000, 10, 100, 1, 1, 1, 1, 7).proclaim)
        f = c.encode_event(3, c.EventKind.PROCLAIMED, 9, c.HoldMode.SESSION,
                           c.ACCESS_EXCLUSIVE, 0, b"lead", b"a:2")
        self.assertEqual(c.decode_answer(f), (c.Event(3, c.EventKind.PROCLAIMED, 9,
                                                      c.HoldMode.SESSION, c.ACCESS_EXCLUSIVE,
                                                      0, b"lead", b"a:2"), len(f)))
        # A 255-byte source (a value) comes whole; a key over 127 is malformed.
        long = bytes(range(255))
        f = c.encode_event(3, c.EventKind.PROCLAIMED, 9, c.HoldMode.SESSION,
                           c.ACCESS_EXCLUSIVE, 0, b"lead", long)
        self.assertEqual(c.decode_answer(f)[0].source, long)
        body = bytearray(f[7:])
        body[15] = 128  # the key's size byte
        body[16:16 + 4] = b"k" * 128
        with self.assertRaises(c.ProtocolError):
            c.decode_answer(HDR.pack(0x83, 3, len(body)) + bytes(body))
        self.assertEqual(c.EventKind.PROCLAIMED.label, "proclaimed")
        self.assertFalse(c.EventKind.PROCLAIMED.ends_hold)
        self.assertEqual([k.label for k in c.EventKind if k.ends_hold],
                         ["released", "expired", "reset", "session_ended"])

    def test_an_event_of_an_unknown_kind_is_skipped_not_an_error(self) -> None:
        known = c.encode_event(4, c.EventKind.GRANTED, 9, c.HoldMode.SESSION,
                               c.ACCESS_EXCLUSIVE, 0, b"k", b"s")
        nxt = struct.pack("<BIHBQI", 0x80, 8, 13, 0, 0, 0xFFFFFFFF)
        for kind in (7, 42, 255):
            # The body of a later server's kind may be laid out any way at
            # all (here: the known layout, a cut one, one byte, a long one).
            for rest in (known[8:], known[8:12], b"", bytes(range(200))):
                body = bytes([kind]) + rest
                f = HDR.pack(0x83, 4, len(body)) + body
                self.assertEqual(c.decode_answer(f), (c.OtherEvent(4, kind), len(f)))
                # It takes its frame only: the next message decodes after it.
                buf = f + nxt
                ans, used = c.decode_answer(buf)  # type: ignore[misc]
                self.assertEqual(used, len(f))
                self.assertEqual(c.decode_answer(buf[used:]),
                                 (c.Reply(8, c.Status.OK, 0, None), len(nxt)))
                # Not all there yet: more bytes are needed, as for any frame.
                self.assertIsNone(c.decode_answer(f[:-1]) if rest else None)
        # An Event with no body at all has no kind: still malformed.
        with self.assertRaises(c.ProtocolError):
            c.decode_answer(HDR.pack(0x83, 4, 0))


# --- against a scripted fake server -----------------------------------------------


def elect_server(flags: Optional[int], proclaim_status: int = OK):  # type: ignore[no-untyped-def]
    """A handler: the Hello answered with ``flags``; every Acquire granted
    (tokens 100, 101, ...); a Proclaim answered ``proclaim_status`` (its
    token with ``ok``); a Watch answered ok, then an Event of an unknown
    kind (7) and a granted Event of token 20; anything else ok."""

    def handle(sc: Script, conn: FakeConn) -> None:
        f = sc.read(conn)
        if f is None:
            return
        conn.welcome(f[1], flags=flags, session_id=SID)
        token = 100
        while True:
            f = sc.read(conn)
            if f is None:
                return
            op, rid, body = f
            if op == OP_ACQUIRE:
                conn.reply(rid, OK, token)
                token += 1
            elif op == OP_PROCLAIM:
                tok = struct.unpack_from("<Q", body, 0)[0]
                conn.reply(rid, proclaim_status, tok if proclaim_status == OK else 0)
            elif op == OP_WATCH:
                key = body[1:1 + body[0]]
                conn.reply(rid, OK)
                other = bytes([7]) + b"a later server's event body"
                conn.send(HDR.pack(0x83, rid, len(other)) + other)
                conn.send(c.encode_event(rid, c.EventKind.GRANTED, 20, c.HoldMode.SESSION,
                                         c.ACCESS_EXCLUSIVE, 0, key, b"v20"))
            else:
                conn.reply(rid, OK)

    return handle


def frames(sc: Script, op: int) -> List[bytes]:
    with sc.cv:
        return [body for (n, o, _r, body) in sc.frames if n == 0 and o == op]


def acquire_source(body: bytes) -> bytes:
    at = 10 + body[9]
    return body[at + 1:at + 1 + body[at]]


class ElectionFakeTest(unittest.TestCase):
    def test_without_the_proclaim_flag_nothing_is_sent(self) -> None:
        # 0, modes|watches, and a 32-byte welcome (an older server).
        for flags in (0, FLAG_MODES | FLAG_WATCHES, None):
            sc = Script(elect_server(flags))
            with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as cl:
                self.assertFalse(cl.offers_proclaim)
                lead = cl.election("lead").campaign("a:1")
                self.assertEqual((lead.token, lead.value), (100, b"a:1"))
                with self.assertRaises(ringlock.ProclaimUnsupported) as cm:
                    lead.proclaim("a:2")
                e = cm.exception
                self.assertIsInstance(e, ringlock.RingLockError)
                self.assertEqual(e.key, "lead")
                self.assertIn("does not offer proclaim", str(e))
                self.assertIn("nothing was sent", str(e))
                self.assertEqual(lead.value, b"a:1")
                cl.ping()
                self.assertEqual(frames(sc, OP_PROCLAIM), [], f"flags {flags}")
                self.assertFalse(lead.lease.lost)

    def test_the_value_is_that_acquires_source_only_and_proclaim_is_sent(self) -> None:
        sc = Script(elect_server(FLAG_MODES | FLAG_WATCHES | FLAG_PROCLAIM))
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0, source="sess") as cl:
            self.assertTrue(cl.offers_proclaim)
            e = cl.election(b"lead")
            self.assertEqual((e.name, e.name_bytes), (b"lead", b"lead"))
            lead = e.campaign(b"10.0.0.5:80")
            plain = cl.lock("other")
            acq = frames(sc, OP_ACQUIRE)
            self.assertEqual([acquire_source(b) for b in acq], [b"10.0.0.5:80", b"sess"])
            # A session hold (1), exclusive (no trailer), waiting without end.
            self.assertEqual(acq[0][0], c.HoldMode.SESSION)
            self.assertEqual(struct.unpack_from("<II", acq[0], 1), (0, c.WAIT_FOREVER))
            self.assertEqual(len(acq[0]), 1 + 4 + 4 + 1 + 4 + 1 + 11)
            lead.proclaim("10.0.0.5:81")
            self.assertEqual(lead.value, b"10.0.0.5:81")
            self.assertEqual(lead.token, 100)
            self.assertEqual(frames(sc, OP_PROCLAIM),
                             [struct.pack("<Q", 100) + b"\x04lead\x0b10.0.0.5:81"])
            # A session source is not touched by it.
            cl.lock("third")
            self.assertEqual(acquire_source(frames(sc, OP_ACQUIRE)[-1]), b"sess")
            plain.release()

    def test_each_refusal_of_a_proclaim(self) -> None:
        for status, err, lost in ((STALE, ringlock.StaleToken, True),
                                  (NOT_OWNER, ringlock.NotOwner, True),
                                  (LIMIT, ringlock.LimitReached, False),
                                  (INVALID, ringlock.InvalidArgument, False)):
            sc = Script(elect_server(FLAG_PROCLAIM, proclaim_status=status))
            seen: List[ringlock.LostInfo] = []
            told = threading.Event()

            def on_lost(_l: ringlock.Lease, info: ringlock.LostInfo) -> None:
                seen.append(info)
                told.set()

            with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as cl:
                lead = cl.election("lead").campaign("a:1", on_lost=on_lost)
                with self.assertRaises(err) as cm:
                    lead.proclaim("a:2")
                self.assertEqual(lead.value, b"a:1", status)
                self.assertEqual(lead.lease.lost, lost, status)
                if lost:
                    self.assertIsInstance(cm.exception, ringlock.LockLost)
                    self.assertIn("leadership lost", str(cm.exception))
                    info = cm.exception.info  # type: ignore[attr-defined]
                    self.assertEqual((info.reason, info.token, info.from_server),
                                     (ringlock.LostReason.NOT_HELD, 100, True))
                    self.assertTrue(told.wait(WAIT), "on_lost did not run")
                    self.assertEqual(seen[0], info)
                cl.ping()

    def test_bad_values_are_refused_before_anything_is_sent(self) -> None:
        sc = Script(elect_server(FLAG_PROCLAIM))
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as cl:
            e = cl.election("lead")
            for bad in ("", b"", "v" * 256, b"v" * 256, "é" * 128, None, 5):
                with self.assertRaises(ringlock.InvalidArgument, msg=repr(bad)):
                    e.campaign(bad)  # type: ignore[arg-type]
            self.assertEqual(frames(sc, OP_ACQUIRE), [])
            lead = e.campaign("é" * 127 + "v")  # 255 bytes, the most
            sent = frames(sc, OP_ACQUIRE)
            self.assertEqual([acquire_source(f) for f in sent], [("é" * 127 + "v").encode()])
            for bad in ("", "v" * 256, None):
                with self.assertRaises(ringlock.InvalidArgument):
                    lead.proclaim(bad)  # type: ignore[arg-type]
            self.assertEqual(frames(sc, OP_PROCLAIM), [])
            for name in ("", "n" * 128):
                with self.assertRaises(ringlock.InvalidArgument):
                    cl.election(name)

    def test_the_reader_skips_an_event_of_an_unknown_kind(self) -> None:
        sc = Script(elect_server(FLAG_WATCHES | FLAG_PROCLAIM))
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as cl:
            with cl.election("lead").observe() as o:
                self.assertIsNone(o.leader)
                self.assertTrue(o.changed(timeout=WAIT))
                self.assertEqual(o.leader, ringlock.Leader(20, b"v20"))
            with cl.watch("lead") as w:
                ev = w.next(timeout=WAIT)
                assert ev is not None
                self.assertEqual((ev.kind, ev.token), ("granted", 20))
                self.assertIsNone(w.next(timeout=0.05))
            cl.ping()
            self.assertIsNone(cl.ended)


# --- against the real ringlockd ---------------------------------------------------


class Campaign:
    """``election.campaign(value)`` on a thread of its own."""

    def __init__(self, election: ringlock.Election, value: str, **kw: object) -> None:
        self.thread, self.out = in_thread(lambda: election.campaign(value, **kw))  # type: ignore[arg-type]

    def result(self) -> ringlock.Leadership:
        self.thread.join(WAIT)
        if self.thread.is_alive():
            raise AssertionError("the campaign did not end within the bound")
        r = self.out[0]
        if isinstance(r, BaseException):
            raise r
        assert isinstance(r, ringlock.Leadership), r
        return r

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()


def change(o: ringlock.Observer) -> Optional[ringlock.Leader]:
    """The next change an observer sees: the leader after it."""
    if not o.changed(timeout=WAIT):
        raise AssertionError(f"no change within {WAIT} s")
    return o.leader


class ElectionServerTest(unittest.TestCase):
    """Against the real ringlockd, with one shard and with two."""

    def _campaign_order_proclaim_resign(self, threads: int) -> None:
        with Server(n_threads=threads) as s, ringlock.Client(s.addr, source="A") as a, \
                ringlock.Client(s.addr, source="B") as b, \
                ringlock.Client(s.addr, source="C") as cc, ringlock.Client(s.addr) as obs:
            self.assertTrue(a.offers_proclaim)
            for name in ("e/alpha", "e/beta", "e/gamma"):
                o = obs.election(name).observe()
                self.assertIsNone(o.leader, "nobody leads yet")
                self.assertIsNone(obs.election(name).leader())
                la = a.election(name).campaign("a:1")
                first = change(o)
                self.assertEqual(first, ringlock.Leader(la.token, b"a:1"))
                self.assertEqual(obs.election(name).leader(), first)
                # The server lists the value as the holder's source; the
                # session's own source is the client's.
                self.assertEqual(s.keyx()[name.encode()].source, b"a:1")
                # b, then c campaign; each waits (in that order).
                cb = Campaign(b.election(name), "b:1")
                s.wait_queued(1)
                ccc = Campaign(cc.election(name), "c:1")
                s.wait_queued(2)
                # a proclaims: the same token, a new value, observers told.
                la.proclaim("a:2")
                self.assertEqual(la.value, b"a:2")
                self.assertEqual(change(o), ringlock.Leader(first.token, b"a:2"))  # type: ignore[union-attr]
                self.assertEqual(s.keyx()[name.encode()].source, b"a:2")
                self.assertEqual(s.keyx()[name.encode()].token, first.token)  # type: ignore[union-attr]
                a.ping()
                self.assertFalse(cb.done or ccc.done, "a proclaim elected somebody")
                # a resigns: b leads (campaigned first), with a larger token.
                la.resign()
                self.assertIsNone(change(o), "a's leadership ended")
                second = change(o)
                assert second is not None and first is not None
                lb = cb.result()
                self.assertEqual(second, ringlock.Leader(lb.token, b"b:1"))
                self.assertGreater(second.token, first.token)
                self.assertFalse(ccc.done, "c was elected with b")
                # a proclaim after the resign: leadership lost, nothing changed.
                with self.assertRaises(ringlock.StaleToken) as cm:
                    la.proclaim("a:3")
                self.assertIn("leadership lost", str(cm.exception))
                self.assertEqual(obs.election(name).leader(), second)
                # b resigns (with, on exit): c leads.
                with lb:
                    pass
                self.assertIsNone(change(o))
                third = change(o)
                lc = ccc.result()
                assert third is not None
                self.assertEqual(third, ringlock.Leader(lc.token, b"c:1"))
                self.assertGreater(third.token, second.token)
                lc.resign()
                self.assertIsNone(change(o))
                o.close()
                self.assertEqual(list(o), [], "iteration stops after close()")
                self.assertNotIn(name.encode(), s.keyx())
                # A plain lock of the session keeps the session's source.
                with a.lock(name + "/plain"):
                    self.assertEqual(s.keyx()[(name + "/plain").encode()].source, b"A")

    def test_campaign_order_proclaim_and_resign(self) -> None:
        self._campaign_order_proclaim_resign(1)

    def test_campaign_order_proclaim_and_resign_on_two_shards(self) -> None:
        self._campaign_order_proclaim_resign(2)

    def _a_leaders_session_end_hands_over(self, threads: int) -> None:
        with Server(n_threads=threads) as s, ringlock.Client(s.addr) as b, \
                ringlock.Client(s.addr) as obs:
            # Closed without resigning.
            a = ringlock.Client(s.addr)
            la = a.election("h/closed").campaign("a")
            o = obs.election("h/closed").observe()
            self.assertEqual(o.leader, ringlock.Leader(la.token, b"a"))
            cb = Campaign(b.election("h/closed"), "b")
            s.wait_queued(1)
            a.close()
            lb = cb.result()
            self.assertGreater(lb.token, la.token)
            self.assertIsNone(change(o))
            self.assertEqual(change(o), ringlock.Leader(lb.token, b"b"))
            with self.assertRaises(ringlock.LockLost) as cm:
                la.proclaim("a again")
            self.assertIn("leadership lost", str(cm.exception))
            self.assertTrue(la.lease.lost)
            # Iteration yields the leader after each change.
            changes: List[Optional[ringlock.Leader]] = []
            t, _out = in_thread(lambda: [changes.append(x) for x in o])
            lb.proclaim("b2")
            lb.resign()
            poll(lambda: len(changes) == 2, "the iterator's two changes")
            o.close()
            t.join(WAIT)
            self.assertFalse(t.is_alive())
            self.assertEqual(changes[:2], [ringlock.Leader(lb.token, b"b2"), None])
            # A leader process killed (kill -9): the next candidate at once.
            child = Child(s.addr, "h/killed", "--campaign", "child:1")
            try:
                t1 = int(child.expect("granted").split()[1])
                o2 = obs.election("h/killed").observe()
                self.assertEqual(o2.leader, ringlock.Leader(t1, b"child:1"))
                cb = Campaign(b.election("h/killed"), "b:1")
                s.wait_queued(1)
                child.kill9()
                lb = cb.result()
                self.assertGreater(lb.token, t1)
                seen = [change(o2), change(o2)]
                self.assertEqual(seen, [None, ringlock.Leader(lb.token, b"b:1")])
                lb.resign()
                o2.close()
            finally:
                child.kill9()

    def test_a_leaders_session_end_hands_over(self) -> None:
        self._a_leaders_session_end_hands_over(1)

    def test_a_leaders_session_end_hands_over_on_two_shards(self) -> None:
        self._a_leaders_session_end_hands_over(2)

    def test_a_proclaim_after_a_reset_is_leadership_lost(self) -> None:
        for threads in (1, 2):
            with Server(n_threads=threads) as s, ringlock.Client(s.addr) as a, \
                    ringlock.Client(s.addr) as obs:
                told = threading.Event()
                la = a.election("r/lead").campaign("a", on_lost=lambda _l, _i: told.set())
                o = obs.election("r/lead").observe()
                s.rset(b"r/lead")
                self.assertTrue(told.wait(WAIT), "no Lost push for the reset")
                self.assertIsNone(change(o), "the reset ends the leadership")
                with self.assertRaises(ringlock.LockLost) as cm:
                    la.proclaim("a2")
                self.assertIsInstance(cm.exception, ringlock.StaleToken)
                self.assertIn("leadership lost", str(cm.exception))
                info = cm.exception.info
                assert info is not None
                self.assertEqual(info.reason, ringlock.LostReason.RESET)  # the first verdict
                self.assertIsNone(obs.election("r/lead").leader())
                # A proclaim of another session's leader: not_owner.
                lo = obs.election("r/lead").campaign("obs")
                forged = ringlock.Leadership(a.election("r/lead"),
                                             ringlock.Lease(a, b"r/lead", lo.token,
                                                            c.HoldMode.SESSION, 0, 0.0, None,
                                                            False), b"x")
                with self.assertRaises(ringlock.NotOwner) as cn:
                    forged.proclaim("stolen")
                self.assertIn("leadership lost", str(cn.exception))
                self.assertEqual(obs.election("r/lead").leader(), ringlock.Leader(lo.token,
                                                                                b"obs"))
                lo.resign()
                o.close()

    def test_a_plain_watch_sees_the_proclaimed_event(self) -> None:
        with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as w:
            with w.watch("p/lead") as watch:
                with a.election("p/lead").campaign("v1") as lead:
                    lead.proclaim("v2")
                    lead.proclaim(b"v2")  # the same value again: still an Event
                evs = [watch.next(timeout=WAIT) for _ in range(4)]
                self.assertEqual([(e.kind, e.token, e.source) for e in evs if e is not None],
                                 [("granted", lead.token, b"v1"),
                                  ("proclaimed", lead.token, b"v2"),
                                  ("proclaimed", lead.token, b"v2"),
                                  ("released", lead.token, b"v2")])
            # An observer passes over a proclaim that changes nothing.
            with a.election("p/lead").campaign("v1") as lead, \
                    w.election("p/lead").observe() as o:
                lead.proclaim("v1")
                self.assertFalse(o.changed(timeout=0.3))
                lead.proclaim("v3")
                self.assertEqual(change(o), ringlock.Leader(lead.token, b"v3"))
            # A campaign with a timeout on a held election: LockTimeout / LockBusy.
            with a.election("p/t").campaign("a"):
                with self.assertRaises(ringlock.LockBusy):
                    w.election("p/t").campaign("w", timeout=0)
                with self.assertRaises(ringlock.LockTimeout):
                    w.election("p/t").campaign("w", timeout=0.1)
            self.assertNotIn(b"p/t", s.keyx())

    def test_255_byte_values_are_campaigned_proclaimed_and_observed_whole(self) -> None:
        v1, v2 = bytes(range(1, 256)), "é" * 127 + "!"
        self.assertEqual((len(v1), len(v2.encode())), (255, 255))
        for threads in (1, 2):
            with Server(n_threads=threads) as s, ringlock.Client(s.addr) as a, \
                    ringlock.Client(s.addr) as w:
                with w.election("long/lead").observe() as o, \
                        a.election("long/lead").campaign(v1) as lead:
                    self.assertEqual(change(o), ringlock.Leader(lead.token, v1))
                    self.assertEqual(s.keyx()[b"long/lead"].source, v1)
                    lead.proclaim(v2)
                    self.assertEqual(change(o), ringlock.Leader(lead.token, v2.encode()))
                    self.assertEqual(s.keyx()[b"long/lead"].source, v2.encode())
                    with self.assertRaises(ringlock.InvalidArgument):
                        lead.proclaim(v2 + "x")
                    self.assertEqual(w.election("long/lead").leader(),
                                     ringlock.Leader(lead.token, v2.encode()))


if __name__ == "__main__":
    unittest.main()
