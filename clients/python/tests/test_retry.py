"""What the client says while it retries opening a session: one warning
on the ``ringlock`` logger at the first failed attempt (what failed,
where, for how long it keeps retrying), the later attempts at debug
level, the ``on_retry`` callback before each further attempt (``False``
gives up at once), and the final ``Unavailable`` as before. Against a
closed loopback port (nothing listens: refused at once) and a fake
server answering ``not_leader``."""

import logging
import time
import unittest
from typing import List

import ringlock
from fake_server import FakeConn, FakeServer, dead_address


class Records(logging.Handler):
    """Collects the ``ringlock`` logger's records (any level)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> "Records":
        log = logging.getLogger("ringlock")
        self._level = log.level
        log.setLevel(logging.DEBUG)
        log.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        log = logging.getLogger("ringlock")
        log.removeHandler(self)
        log.setLevel(self._level)

    def at(self, level: int) -> List[logging.LogRecord]:
        return [r for r in self.records if r.levelno == level]


def not_leader(c: FakeConn) -> None:
    f = c.read()
    if f is not None:
        c.refuse(f[1], 12, b"")  # not_leader, naming no leader


class RetryWarningTest(unittest.TestCase):
    def test_one_warning_at_the_first_failure_then_debug_then_the_error(self) -> None:
        addr = dead_address()
        t0 = time.time()
        with self.assertLogs("ringlock", logging.DEBUG) as cm:
            with self.assertRaises(ringlock.Unavailable) as err:
                ringlock.Client(addr, retry=1.0)
        warnings = [r for r in cm.records if r.levelno == logging.WARNING]
        self.assertEqual(len(warnings), 1, [r.getMessage() for r in cm.records])
        w = warnings[0]
        msg = w.getMessage()
        # What failed, where, for how long: within the first second.
        self.assertIn(addr, msg)
        self.assertIn("refused", msg.lower())
        self.assertRegex(msg, r"retrying for up to [01]\.\d s \(retry=1 s\)")
        self.assertLess(w.created - t0, 1.0, "the warning came late")
        # It came at the first attempt: before any debug line of a later one.
        self.assertIs(cm.records[0], w)
        later = [r for r in cm.records if r.levelno == logging.DEBUG]
        self.assertGreaterEqual(len(later), 2, "no debug line per later attempt")
        self.assertTrue(all(addr in r.getMessage() for r in later))
        # The final error, unchanged.
        e = err.exception
        self.assertNotIsInstance(e, ringlock.NotLeader)
        self.assertRegex(str(e), r"no session could be opened after \d+ attempts; last: ")
        self.assertIn(addr, str(e))

    def test_not_leader_is_said_too(self) -> None:
        with FakeServer(not_leader) as srv:
            with self.assertLogs("ringlock", logging.WARNING) as cm:
                with self.assertRaises(ringlock.Unavailable):
                    ringlock.Client(srv.addr, retry=0.3)
        self.assertEqual(len(cm.records), 1, [r.getMessage() for r in cm.records])
        self.assertIn(srv.addr, cm.records[0].getMessage())
        self.assertIn("not the leader", cm.records[0].getMessage())

    def test_a_single_attempt_says_nothing(self) -> None:
        with Records() as rec:
            with self.assertRaises(ringlock.Unavailable) as err:
                ringlock.Client(dead_address(), retry=0)
        self.assertEqual(rec.at(logging.WARNING), [])
        self.assertIn("after 1 attempt;", str(err.exception))

    def test_the_next_address_of_a_single_round_is_announced(self) -> None:
        a, b = dead_address(), dead_address()
        with self.assertLogs("ringlock", logging.WARNING) as cm:
            with self.assertRaises(ringlock.Unavailable) as err:
                ringlock.Client([a, b], retry=0)
        self.assertEqual(len(cm.records), 1)
        self.assertIn(a, cm.records[0].getMessage())
        self.assertIn("after 2 attempts", str(err.exception))


class OnRetryTest(unittest.TestCase):
    def test_it_is_told_each_retry(self) -> None:
        addr = dead_address()
        events: List[ringlock.RetryEvent] = []
        with self.assertLogs("ringlock", logging.WARNING), \
                self.assertRaises(ringlock.Unavailable) as err:
            ringlock.Client(addr, retry=0.5, on_retry=events.append)
        self.assertGreaterEqual(len(events), 2)
        self.assertEqual([e.attempts for e in events], list(range(1, len(events) + 1)))
        for e in events:
            self.assertEqual(e.address, addr)
            self.assertTrue(e.refused)
            self.assertIn("refused", e.error.lower())
            self.assertEqual(e.budget, 0.5)
            self.assertGreater(e.delay, 0)
            self.assertGreaterEqual(e.elapsed, 0)
        self.assertTrue(all(x.elapsed <= y.elapsed for x, y in zip(events, events[1:])))
        # Not told of the last failure: that one is the error.
        self.assertIn(f"after {len(events) + 1} attempts", str(err.exception))

    def test_false_gives_up_at_once(self) -> None:
        addr = dead_address()
        events: List[ringlock.RetryEvent] = []

        def refuse_refused(e: ringlock.RetryEvent) -> bool:
            events.append(e)
            return not e.refused

        t0 = time.monotonic()
        with self.assertLogs("ringlock", logging.WARNING):
            with self.assertRaises(ringlock.Unavailable) as err:
                ringlock.Client(addr, retry=30, on_retry=refuse_refused)
        self.assertLess(time.monotonic() - t0, 5.0)
        self.assertEqual(len(events), 1)
        self.assertIn("after 1 attempt;", str(err.exception))
        self.assertIn("on_retry", str(err.exception))

    def test_an_exception_from_it_propagates(self) -> None:
        class Stop(Exception):
            pass

        def stop(e: ringlock.RetryEvent) -> None:
            raise Stop(e.address)

        with self.assertLogs("ringlock", logging.WARNING), self.assertRaises(Stop):
            ringlock.Client(dead_address(), retry=30, on_retry=stop)


if __name__ == "__main__":
    unittest.main()
