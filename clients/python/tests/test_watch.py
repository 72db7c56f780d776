"""Watches (``docs/protocol.md``, "Watching a key"): the Watch, Unwatch and
Event codec; ``Client.watch`` against a scripted fake server (the
*watches* flag checked before anything is sent, the holders collected
until the Reply, refusals, the watch's end when the connection fails or the
session ends) and against the real ringlockd (holders, then every change in
order, shared holders, ``close()``, one and two shards)."""

import struct
import threading
import time
import unittest
from typing import List, Optional

import ringlock
from ringlock import _codec as c
from fake_server import HDR, FakeConn, FakeServer
from harness import Server, poll
from test_resume import OP_PING, OP_RESUME, SID, WAIT, Script, in_thread

FLAG_RESUMABLE, FLAG_MODES, FLAG_WATCHES = 1, 2, 4
OP_WATCH, OP_UNWATCH = 15, 16
INVALID, LIMIT_REACHED, NOT_QUEUED = 5, 6, 9
KINDS = ["holder", "granted", "released", "expired", "reset", "session_ended", "proclaimed"]


class WatchCodecTest(unittest.TestCase):
    def test_watch_and_unwatch_layouts(self) -> None:
        self.assertEqual(c.encode_watch(5, b"job"), b"\x0f" + struct.pack("<IH", 5, 4) + b"\x03job")
        self.assertEqual(c.encode_unwatch(6, 5, b"job"),
                         b"\x10" + struct.pack("<IH", 6, 8) + struct.pack("<I", 5) + b"\x03job")
        for bad in (b"", b"k" * 128):
            with self.assertRaises(ValueError):
                c.encode_watch(1, bad)
            with self.assertRaises(ValueError):
                c.encode_unwatch(1, 2, bad)

    def test_every_event_roundtrips_skips_trailing_bytes_and_refuses_every_cut(self) -> None:
        self.assertEqual([k.label for k in c.EventKind], KINDS)
        for kind in c.EventKind:
            for access, slots in ((c.ACCESS_EXCLUSIVE, 0), (c.ACCESS_SHARED, 0),
                                  (c.ACCESS_SEMAPHORE, 7)):
                for src in (b"", b"w1"):
                    f = c.encode_event(9, kind, 0x0102030405060708, c.HoldMode.LEASE, access,
                                       slots, b"k", src)
                    want = c.Event(9, kind, 0x0102030405060708, c.HoldMode.LEASE, access,
                                   slots, b"k", src)
                    self.assertEqual(f[0], 0x83)
                    self.assertEqual(c.decode_answer(f), (want, len(f)))
                    body = f[7:]
                    self.assertEqual(body[0], int(kind))
                    # A later version's appended field is skipped.
                    longer = HDR.pack(0x83, 9, len(body) + 3) + body + b"\x2a\x2b\x2c"
                    self.assertEqual(c.decode_answer(longer), (want, len(longer)))
                    # Every cut of the body (a whole frame that short) is refused.
                    for cut in range(len(body)):
                        short = HDR.pack(0x83, 9, cut) + body[:cut]
                        with self.assertRaises(c.ProtocolError, msg=f"{kind} cut {cut}"):
                            c.decode_answer(short)
                    # A frame not all there yet needs more bytes.
                    self.assertIsNone(c.decode_answer(f[:-1]))

    def test_a_malformed_event_is_refused(self) -> None:
        body = c.encode_event(1, c.EventKind.GRANTED, 1, c.HoldMode.SESSION,
                              c.ACCESS_EXCLUSIVE, 0, b"k", b"s")[7:]

        def bad(i: int, v: int) -> bytes:
            b = bytearray(body)
            b[i] = v
            return HDR.pack(0x83, 1, len(b)) + bytes(b)

        # (An unknown event byte is no error: the Event is skipped,
        # test_election.py.)
        for frame in (bad(9, 3),            # no such hold mode
                      bad(10, 3),           # no such access
                      bad(11, 1),           # slots on an exclusive hold
                      bad(15, 0),           # an empty key
                      bad(15, 128),         # a key over 127 bytes
                      bad(17, 200)):        # a source longer than the body
            with self.assertRaises(c.ProtocolError, msg=frame.hex()):
                c.decode_answer(frame)
        sem = c.encode_event(1, c.EventKind.GRANTED, 1, c.HoldMode.SESSION,
                             c.ACCESS_SEMAPHORE, 1, b"k")
        b = bytearray(sem)
        b[7 + 11] = 0  # a semaphore of 0 slots
        with self.assertRaises(c.ProtocolError):
            c.decode_answer(bytes(b))

    def test_the_welcome_flag(self) -> None:
        w = c.Welcome(1, c.Status.OK, 1, 1000, 10, 100, 1, 1, 1, 1, 6)
        self.assertTrue(w.watches and w.modes)
        self.assertFalse(c.Welcome(1, c.Status.OK, 1, 1000, 10, 100, 1, 1, 1, 1, 3).watches)


def event(conn: FakeConn, rid: int, kind: int, token: int, key: bytes = b"doc",
          source: bytes = b"", hold: int = 1, access: int = 0, slots: int = 0) -> None:
    conn.send(c.encode_event(rid, c.EventKind(kind), token, c.HoldMode(hold), access, slots,
                             key, source))


def watch_server(flags: Optional[int], holders: int = 0, refuse: Optional[int] = None,
                 resume_flags: Optional[int] = None):  # type: ignore[no-untyped-def]
    """A handler: Hello (or Resume) answered with ``flags``; a Watch is
    answered with ``holders`` holder Events (tokens 10, 11, ...) then ok (or
    ``refuse``), then a Lost push of an unknown key and one granted Event
    (token 20); Unwatch ok; Pings ok."""

    def handle(sc: Script, conn: FakeConn) -> None:
        f = sc.read(conn)
        if f is None:
            return
        conn.welcome(f[1], flags=resume_flags if f[0] == OP_RESUME else flags, session_id=SID)
        while True:
            f = sc.read(conn)
            if f is None:
                return
            op, rid, body = f
            if op == OP_WATCH:
                key = body[1:1 + body[0]]
                for i in range(holders):
                    event(conn, rid, 0, 10 + i, key, b"src%d" % i, hold=2, access=1)
                if refuse is not None:
                    conn.reply(rid, refuse)
                    continue
                conn.reply(rid, 0)
                # A push of another kind between Events changes nothing.
                conn.send(HDR.pack(0x81, 0, 13) + struct.pack("<QBB", 3, 1, 3) + b"zzz")
                event(conn, rid, 1, 20, key, b"g", hold=1)
            else:
                conn.reply(rid, 0)

    return handle


def ops(sc: Script, conn: int) -> List[int]:
    return sc.ops(conn)


class WatchFakeTest(unittest.TestCase):
    def test_without_the_watches_flag_nothing_is_sent(self) -> None:
        # 0, modes only, resumable|modes, and a 32-byte welcome (older server).
        for flags in (0, FLAG_MODES, FLAG_RESUMABLE | FLAG_MODES, None):
            sc = Script(watch_server(flags))
            with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as cl:
                self.assertFalse(cl.watches)
                for key in ("doc", b"doc"):
                    with self.assertRaises(ringlock.WatchUnsupported) as cm:
                        cl.watch(key)
                    e = cm.exception
                    self.assertIsInstance(e, ringlock.RingLockError)
                    self.assertEqual((e.key, e.status), (key, None))
                    self.assertIn("does not offer watches", str(e))
                    self.assertIn("nothing was sent", str(e))
                cl.ping()
                self.assertNotIn(OP_WATCH, ops(sc, 0), f"flags {flags}")
                self.assertEqual(ops(sc, 0)[-1], OP_PING)

    def test_holders_until_the_reply_then_events_and_close_sends_unwatch(self) -> None:
        sc = Script(watch_server(FLAG_WATCHES | FLAG_MODES, holders=2))
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as cl:
            self.assertTrue(cl.watches)
            w = cl.watch("doc")
            self.assertEqual(w.key, "doc")
            self.assertEqual(w.holders, [
                ringlock.Holder(10, "lease", ringlock.SHARED, 0, b"src0"),
                ringlock.Holder(11, "lease", ringlock.SHARED, 0, b"src1")])
            ev = w.next(timeout=WAIT)
            self.assertEqual(ev, ringlock.WatchEvent("granted", 20, "session", ringlock.EXCLUSIVE,
                                                     0, b"g", "doc"))
            self.assertIsNone(w.next(timeout=0.05))
            cl.ping()  # other traffic goes on
            w.close()
            w.close()  # idempotent
            with self.assertRaises(ringlock.WatchEnded) as cm:
                w.next(timeout=0)
            self.assertEqual(cm.exception.reason, "closed")
            self.assertEqual(list(w), [])  # iteration stops after close()
            with sc.cv:
                frames = [(op, rid, body) for (n, op, rid, body) in sc.frames if n == 0]
            watch_rid = next(rid for (op, rid, _b) in frames if op == OP_WATCH)
            unwatches = [body for (op, _r, body) in frames if op == OP_UNWATCH]
            self.assertEqual(unwatches, [struct.pack("<I", watch_rid) + b"\x03doc"])

    def test_refusals_are_the_matching_errors(self) -> None:
        for status, err in ((INVALID, ringlock.InvalidArgument),
                            (LIMIT_REACHED, ringlock.LimitReached)):
            sc = Script(watch_server(FLAG_WATCHES, holders=0, refuse=status))
            with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as cl:
                with self.assertRaises(err):
                    cl.watch(b"doc")
                cl.ping()
        with FakeServer(Script(watch_server(FLAG_WATCHES))) as srv, \
                ringlock.Client(srv.addr, retry=0) as cl:
            for key in ("", "k" * 128):
                with self.assertRaises(ringlock.InvalidArgument):
                    cl.watch(key)

    def test_the_watch_ends_with_the_session_after_its_queued_events(self) -> None:
        sc = Script(watch_server(FLAG_WATCHES))
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as cl:
            w = cl.watch("doc")
            # Wait until the granted Event is queued, then end the session.
            deadline = time.monotonic() + WAIT
            while not w._events and time.monotonic() < deadline:
                time.sleep(0.005)
            sc.kill(0)
            self.assertEqual(w.next(timeout=WAIT).kind, "granted")  # type: ignore[union-attr]
            with self.assertRaises(ringlock.WatchEnded) as cm:
                w.next(timeout=WAIT)
            self.assertEqual(cm.exception.reason, "session_ended")
            self.assertIn("not replayed", str(cm.exception))
            with self.assertRaises(ringlock.WatchEnded):
                for _ in w:
                    pass
            w.close()  # nothing to do any more

    def test_a_resumed_session_ends_its_watches_and_a_rewatch_reads_anew(self) -> None:
        flags = FLAG_RESUMABLE | FLAG_WATCHES
        sc = Script(watch_server(flags), watch_server(flags, holders=1, resume_flags=flags))
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as cl:
            w = cl.watch("doc")
            self.assertEqual(w.next(timeout=WAIT).token, 20)  # type: ignore[union-attr]
            sc.kill(0)
            with self.assertRaises(ringlock.WatchEnded) as cm:
                w.next(timeout=WAIT)
            self.assertEqual(cm.exception.reason, "connection_lost")
            self.assertIn("carries no watch", str(cm.exception))
            # The session goes on (resumed); a new watch is a re-read.
            w2 = cl.watch("doc")
            self.assertEqual(cl.resumes, 1)
            self.assertEqual([h.token for h in w2.holders], [10])
            self.assertEqual(w2.next(timeout=WAIT).kind, "granted")  # type: ignore[union-attr]
            w2.close()
            self.assertNotIn(OP_UNWATCH, ops(sc, 0))

    def test_a_resume_on_a_server_without_watches(self) -> None:
        # The connection fails; the session resumes on a server without
        # watches: a Watch made while resuming raises WatchUnsupported.
        flags = FLAG_RESUMABLE | FLAG_WATCHES

        def slow_resume(sc: Script, conn: FakeConn) -> None:
            f = sc.read(conn)
            if f is None:
                return
            time.sleep(0.3)  # the test's watch() is queued meanwhile
            conn.welcome(f[1], flags=FLAG_RESUMABLE, session_id=SID)
            while True:
                f = sc.read(conn)
                if f is None:
                    return
                conn.reply(f[1], 0)

        sc = Script(watch_server(flags), slow_resume)
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as cl:
            sc.kill(0)
            sc.wait_for(lambda: len(sc.conns) > 1)
            t, out = in_thread(lambda: cl.watch("doc"))
            t.join(WAIT)
            self.assertFalse(t.is_alive())
            self.assertIsInstance(out[0], ringlock.WatchUnsupported, out)
            self.assertFalse(cl.watches)
            cl.ping()
            self.assertNotIn(OP_WATCH, ops(sc, 1))


class WatchServerTest(unittest.TestCase):
    """Against the real ringlockd, with one shard and with two."""

    def _holders_then_every_change_in_order(self, threads: int) -> None:
        with Server(n_threads=threads) as s:
            for key in ("watch/a", "watch/b", "watch/c", "watch/d"):
                with ringlock.Client(s.addr, source="a") as a, \
                        ringlock.Client(s.addr, source="w") as wc:
                    self.assertTrue(wc.watches)
                    la = a.lock(key)
                    w = wc.watch(key)
                    self.assertEqual(w.holders, [ringlock.Holder(la.token, "session",
                                                                 ringlock.EXCLUSIVE, 0, b"a")])
                    b = ringlock.Client(s.addr, source="b")
                    tb, outb = in_thread(lambda: b.lock(key, ttl=30))
                    s.wait_queued(1)
                    la.release()
                    tb.join(WAIT)
                    lb = outb[0]
                    assert isinstance(lb, ringlock.Lease), lb
                    ev = w.next(timeout=WAIT)
                    assert ev is not None
                    self.assertEqual((ev.kind, ev.token, ev.key), ("released", la.token, key))
                    ev = w.next(timeout=WAIT)
                    assert ev is not None
                    self.assertEqual((ev.kind, ev.token, ev.hold, ev.source),
                                     ("granted", lb.token, "lease", b"b"))
                    # Other traffic of the watcher's session goes on meanwhile.
                    wc.ping()
                    mine = wc.lock(key + "/mine")
                    s.rset(key.encode())  # a Lost push to b; the watcher sees a reset
                    b.close()
                    ev = w.next(timeout=WAIT)
                    assert ev is not None
                    self.assertEqual((ev.kind, ev.token), ("reset", lb.token))
                    # A session hold whose session ends.
                    c2 = ringlock.Client(s.addr, source="c")
                    lc = c2.lock(key)
                    c2.close()
                    evs = [w.next(timeout=WAIT) for _ in range(2)]
                    self.assertEqual([(e.kind, e.token) for e in evs if e is not None],
                                     [("granted", lc.token), ("session_ended", lc.token)])
                    mine.release()
                    self.assertIsNone(w.next(timeout=0.1))
                    w.close()

    def test_holders_then_every_change_in_order(self) -> None:
        self._holders_then_every_change_in_order(1)

    def test_holders_then_every_change_in_order_on_two_shards(self) -> None:
        self._holders_then_every_change_in_order(2)

    def test_shared_holders_close_and_lost_pushes_meanwhile(self) -> None:
        with Server(n_threads=2) as s, ringlock.Client(s.addr, source="r1") as r1, \
                ringlock.Client(s.addr, source="r2") as r2, ringlock.Client(s.addr) as wc:
            a = r1.lock_shared("watch/doc")
            b = r2.lock_shared("watch/doc")
            with wc.watch("watch/doc") as w, wc.watch(b"watch/sem") as ws:
                self.assertEqual(sorted((h.token, h.access, h.source) for h in w.holders),
                                 [(a.token, ringlock.SHARED, b"r1"),
                                  (b.token, ringlock.SHARED, b"r2")])
                self.assertEqual(ws.holders, [])
                lost = threading.Event()
                mine = wc.lock("watch/mine", ttl=30, on_lost=lambda ls, i: lost.set())
                p = r1.permit("watch/sem", 3)
                b.release()
                s.rset(b"watch/mine")  # a Lost push to the watcher's session
                self.assertTrue(lost.wait(WAIT), "the Lost push was not handled")
                self.assertTrue(mine.lost)
                ev = w.next(timeout=WAIT)
                assert ev is not None
                self.assertEqual((ev.kind, ev.token, ev.access), ("released", b.token,
                                                                  ringlock.SHARED))
                ev = ws.next(timeout=WAIT)
                assert ev is not None
                self.assertEqual((ev.kind, ev.access, ev.slots, ev.key),
                                 ("granted", ringlock.semaphore(3), 3, b"watch/sem"))
                ws.close()
                p.release()
                a.release()  # after close(): no event for ws; w still sees it
                ev = w.next(timeout=WAIT)
                assert ev is not None
                self.assertEqual((ev.kind, ev.token), ("released", a.token))
                with self.assertRaises(ringlock.WatchEnded):
                    ws.next(timeout=0.2)
            # close() (the with) ended w too; the session is still good.
            poll(lambda: s.metric("ringlock_watches") == 0, "no watch left")
            wc.ping()

    def test_a_watch_ends_with_its_session(self) -> None:
        with Server() as s:
            wc = ringlock.Client(s.addr)
            w = wc.watch("watch/end")
            wc.close()
            with self.assertRaises(ringlock.WatchEnded) as cm:
                w.next(timeout=WAIT)
            self.assertEqual(cm.exception.reason, "session_ended")
            with self.assertRaises(ringlock.Unavailable):
                wc.watch("watch/end")


if __name__ == "__main__":
    unittest.main()
