"""Lock modes (``docs/protocol.md``, "Lock modes: shared and semaphore
holds"): shared and semaphore acquires, the welcome's *modes* flag checked
before anything is sent (also after a resume), ``mode_mismatch``.

``ModesFakeTest`` runs the client against a scripted fake server (what is
on the wire, what is *not* sent); ``ModesServerTest`` against the real
ringlockd (``RINGLOCKD``): shared holders at once, an exclusive request
waiting for them, a semaphore of 2, another slot count refused, and a
durable ``--data-path`` server offering them too (every ringlockd since
lock modes does: the precise error of an older one is the fake's)."""

import os
import struct
import tempfile
import threading
import unittest
from typing import List, Optional, Tuple

import ringlock
from fake_server import FakeConn
from fake_server import FakeServer
from harness import Server
from test_resume import (OP_ACQUIRE, OP_PING, OP_RESUME, SID, WAIT, Script, in_thread, key_of)

FLAG_RESUMABLE, FLAG_MODES = 1, 2
MODE_MISMATCH = 15


def trailer(body: bytes) -> Optional[Tuple[int, int]]:
    """An Acquire body's ``(access, slots)``, ``None`` without a trailer."""
    end = 10 + body[9]
    end += 1 + body[end]
    if len(body) == end:
        return None
    assert len(body) == end + 5, body.hex()
    return body[end], struct.unpack_from("<I", body, end + 1)[0]


def modes_server(flags: Optional[int], resume_flags: Optional[int] = None,
                 queued: Tuple[bytes, ...] = ()):  # type: ignore[no-untyped-def]
    """A handler: a Hello (or, with ``resume_flags``, a Resume) answered
    with those welcome flags; then an Acquire is granted (token 100, 101,
    ...) unless its key is in ``queued`` (no answer), or it asks for a
    semaphore of 3 slots (``mode_mismatch``); Pings are answered ok."""
    tokens = iter(range(100, 1000))

    def handle(sc: Script, c: FakeConn) -> None:
        f = sc.read(c)
        if f is None:
            return
        if f[0] == OP_RESUME:
            c.welcome(f[1], flags=resume_flags, session_id=SID)
        else:
            c.welcome(f[1], flags=flags, session_id=SID)
        while True:
            f = sc.read(c)
            if f is None:
                return
            op, rid, body = f
            if op == OP_ACQUIRE:
                if key_of(op, body) in queued:
                    continue
                if trailer(body) == (2, 3):
                    c.reply(rid, MODE_MISMATCH)
                else:
                    c.reply(rid, 0, next(tokens))
            elif op == OP_PING:
                c.reply(rid, 0)
            else:
                c.reply(rid, 0)

    return handle


def acquires(sc: Script, conn: int) -> List[Tuple[bytes, Optional[Tuple[int, int]]]]:
    with sc.cv:
        return [(key_of(op, body), trailer(body)) for (n, op, _r, body) in sc.frames
                if n == conn and op == OP_ACQUIRE]


class ModesFakeTest(unittest.TestCase):
    def test_without_the_modes_flag_nothing_is_sent(self) -> None:
        # flags 0 (a server without modes), 1 (resumable only), None (a
        # 32-byte welcome: an older server).
        for flags in (0, FLAG_RESUMABLE, None):
            sc = Script(modes_server(flags))
            with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as c:
                self.assertFalse(c.modes)
                for call in (lambda: c.lock_shared("doc"), lambda: c.try_lock_shared("doc"),
                             lambda: c.permit("pool", 2), lambda: c.try_permit("pool", 2),
                             lambda: c.acquire("doc", access="shared", ttl=5)):
                    with self.assertRaises(ringlock.ModesUnsupported) as cm:
                        call()
                    e = cm.exception
                    self.assertIn(e.key, ("doc", "pool"))
                    self.assertIsNotNone(e.access)
                    self.assertIsNone(e.status)
                    self.assertIn("does not offer lock modes", str(e))
                    self.assertIn("nothing was sent", str(e))
                # An exclusive acquire still works, without a trailer.
                lease = c.lock("doc")
                self.assertEqual(lease.access, ringlock.EXCLUSIVE)
                c.ping()
                self.assertEqual(acquires(sc, 0), [(b"doc", None)], f"flags {flags}")

    def test_the_trailer_on_the_wire_and_the_lease_tells_its_access(self) -> None:
        sc = Script(modes_server(FLAG_MODES))
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as c:
            self.assertTrue(c.modes)
            r = c.lock_shared("doc")
            p = c.permit("pool", 2, ttl=30)
            t = c.try_lock_shared("doc2")
            x = c.lock("doc3")
            a = c.acquire("doc4", access=ringlock.semaphore(5), persistent=True)
            assert t is not None
            self.assertEqual([ls.access for ls in (r, p, t, x, a)],
                             [ringlock.SHARED, ringlock.semaphore(2), ringlock.SHARED,
                              ringlock.EXCLUSIVE, ringlock.semaphore(5)])
            self.assertEqual((p.access.kind, p.access.slots, str(p.access)),
                             ("semaphore", 2, "semaphore(2)"))
            self.assertEqual((r.access.kind, str(r.access)), ("shared", "shared"))
            self.assertEqual(p.mode, "lease")
            self.assertIn("access=semaphore(2)", repr(p))
            self.assertEqual(acquires(sc, 0), [(b"doc", (1, 0)), (b"pool", (2, 2)),
                                               (b"doc2", (1, 0)), (b"doc3", None),
                                               (b"doc4", (2, 5))])

    def test_mode_mismatch_is_its_own_error_naming_the_key(self) -> None:
        sc = Script(modes_server(FLAG_MODES))
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as c:
            for call in (lambda: c.permit("pool", 3), lambda: c.try_permit("pool", 3)):
                with self.assertRaises(ringlock.ModeMismatch) as cm:
                    call()
                e = cm.exception
                self.assertEqual((e.key, e.slots, e.status), ("pool", 3, "mode_mismatch"))
                self.assertIn("'pool'", str(e))
                self.assertIn("mode_mismatch", str(e))
            with self.assertRaises(ringlock.ModeMismatch) as cm2:
                c.acquire(b"pool", access=ringlock.semaphore(3))
            self.assertEqual(cm2.exception.key, b"pool")  # in the type it was given
            self.assertIsNone(c.ended, "a mode_mismatch ended the session")
            c.ping()

    def test_bad_access_is_a_usage_error_and_nothing_is_sent(self) -> None:
        with self.assertRaises(ringlock.InvalidArgument):
            ringlock.semaphore(0)
        with self.assertRaises(ValueError):  # InvalidArgument is a ValueError
            ringlock.semaphore(-1)
        with self.assertRaises(ringlock.InvalidArgument):
            ringlock.Access("shared", 2)
        with self.assertRaises(ringlock.InvalidArgument):
            ringlock.Access("reader")
        sc = Script(modes_server(FLAG_MODES))
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as c:
            for call in (lambda: c.permit("pool", 0), lambda: c.try_permit("pool", 0),
                         lambda: c.acquire("pool", access="semaphore"),
                         lambda: c.acquire("pool", access=2)):  # type: ignore[arg-type]
                with self.assertRaises(ringlock.InvalidArgument):
                    call()
            c.ping()
            self.assertEqual(acquires(sc, 0), [])

    def test_a_resume_on_a_server_without_modes(self) -> None:
        # The first leader offers modes; the one the session resumes on does
        # not: a shared Acquire in flight is not sent again there (it would
        # be answered invalid) but raises ModesUnsupported; an exclusive one
        # in flight is sent again; later shared acquires raise at once.
        sc = Script(modes_server(FLAG_RESUMABLE | FLAG_MODES, queued=(b"r", b"w")),
                    modes_server(None, resume_flags=FLAG_RESUMABLE))
        with FakeServer(sc) as srv, ringlock.Client(srv.addr, retry=0) as c:
            self.assertTrue(c.modes and c.resumable)
            tr, outr = in_thread(lambda: c.lock_shared("r"))
            tw, outw = in_thread(lambda: c.lock("w"))
            sc.wait_for(lambda: sc.ops(0).count(OP_ACQUIRE) == 2)
            sc.kill(0)
            for t in (tr, tw):
                t.join(WAIT)
                self.assertFalse(t.is_alive(), "an acquire was not answered")
            self.assertIsInstance(outr[0], ringlock.ModesUnsupported, outr)
            self.assertIn(f"{srv.addr}", str(outr[0]))
            self.assertIsInstance(outw[0], ringlock.Lease, outw)
            self.assertEqual(c.resumes, 1)
            self.assertFalse(c.modes)
            with self.assertRaises(ringlock.ModesUnsupported):
                c.lock_shared("r2")
            c.ping()
            self.assertEqual(acquires(sc, 1), [(b"w", None)])


def _wait_done(t: threading.Thread) -> None:
    t.join(WAIT)
    if t.is_alive():
        raise AssertionError("an acquire was not answered")


class ModesServerTest(unittest.TestCase):
    """Against the real ringlockd (in memory: it offers modes)."""

    def test_shared_holders_at_once_and_an_exclusive_waits_for_them(self) -> None:
        with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b, \
                ringlock.Client(s.addr) as w, ringlock.Client(s.addr) as late:
            self.assertTrue(a.modes)
            ra = a.lock_shared("modes/doc")
            rb = b.try_lock_shared("modes/doc")
            assert rb is not None, "a second reader was refused"
            self.assertGreater(rb.token, ra.token)
            self.assertEqual((ra.access, rb.access), (ringlock.SHARED, ringlock.SHARED))
            self.assertIsNone(w.try_lock("modes/doc"), "an exclusive try while readers hold")
            tw, outw = in_thread(lambda: w.lock("modes/doc"))
            s.wait_queued(1)
            # A reader after the waiting writer is not let in ahead of it.
            self.assertIsNone(late.try_lock_shared("modes/doc"))
            ra.release()
            # One reader still holds: the writer still waits. (Its grant
            # would be decided by the release just answered and be on w's
            # connection before the answer to this ping.)
            w.ping()
            self.assertTrue(tw.is_alive(), f"the writer was granted while a reader held: {outw}")
            rb.release()
            _wait_done(tw)
            lw = outw[0]
            assert isinstance(lw, ringlock.Lease), lw
            self.assertGreater(lw.token, rb.token)
            self.assertEqual(lw.access, ringlock.EXCLUSIVE)
            lw.release()
            rl = late.try_lock_shared("modes/doc")
            assert rl is not None
            rl.release()

    def test_a_semaphore_of_two_admits_two_and_the_third_waits(self) -> None:
        with Server() as s, ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b, \
                ringlock.Client(s.addr) as c:
            pa = a.permit("modes/pool", 2)
            pb = b.try_permit("modes/pool", 2, ttl=30)
            assert pb is not None, "the second permit was refused"
            self.assertEqual((pa.access, pb.access), (ringlock.semaphore(2),) * 2)
            self.assertIsNone(c.try_permit("modes/pool", 2), "a third permit of 2")
            with self.assertRaises(ringlock.ModeMismatch) as cm:
                c.permit("modes/pool", 3)
            self.assertEqual((cm.exception.key, cm.exception.slots), ("modes/pool", 3))
            self.assertIn("'modes/pool'", str(cm.exception))
            tc, outc = in_thread(lambda: c.permit("modes/pool", 2))
            s.wait_queued(1)
            # Fixed while a semaphore request waits too, and by it.
            with self.assertRaises(ringlock.ModeMismatch):
                a.try_permit("modes/pool", 1)
            pa.release()
            _wait_done(tc)
            pc = outc[0]
            assert isinstance(pc, ringlock.Lease), pc
            self.assertTrue(pa.token < pb.token < pc.token)
            pb.release()
            pc.release()
            # Free again: the next first holder fixes another size.
            p5 = a.try_permit("modes/pool", 5)
            assert p5 is not None
            p5.release()

    def test_a_durable_server_offers_modes_too(self) -> None:
        with tempfile.TemporaryDirectory() as d, \
                Server(["--data-path", os.path.join(d, "locks.wal")]) as s, \
                ringlock.Client(s.addr) as a, ringlock.Client(s.addr) as b:
            self.assertTrue(a.modes)
            ra = a.lock_shared("modes/d", timeout=5)
            rb = b.try_lock_shared("modes/d")
            assert rb is not None, "a second reader was refused by a durable server"
            self.assertIsNone(b.try_lock("modes/d"))
            pa = a.try_permit("modes/p", 1, ttl=30)
            assert pa is not None
            self.assertIsNone(b.try_permit("modes/p", 1))
            for lease in (ra, rb, pa):
                lease.release()


if __name__ == "__main__":
    unittest.main()
