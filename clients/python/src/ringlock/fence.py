"""Fencing the protected resource with the grant's token.

A lock cannot stop a holder that was paused (SIGSTOP, a GC pause, a VM
freeze) between its check and its write: by the time it resumes, its lease
expired and a successor was granted. The resource can: tokens strictly
increase per key, so it refuses a write whose token is lower than the
highest it has accepted. See ``docs/fence.md`` of the repository.

* :class:`Fence` — in-process (one per key), thread-safe.
* :class:`FileFence` — a file shared by several processes: the highest
  token lives in ``PATH.fence``, and every check-and-write runs under an
  exclusive ``flock`` of it, so the check and the write are one step.
"""

from __future__ import annotations

import fcntl
import os
import threading
from typing import Callable, TypeVar

from .errors import RingLockError

T = TypeVar("T")


class StaleWrite(RingLockError):
    """A write with a token lower than the highest one accepted: refused, nothing written."""

    def __init__(self, seen: int, got: int) -> None:
        super().__init__(f"stale fencing token {got}: token {seen} was already accepted")
        self.seen = seen
        self.got = got


class Fence:
    """The high-water mark of one resource, in memory. An equal token is
    accepted (the same holder writing again)."""

    def __init__(self, highest: int = 0) -> None:
        self._mu = threading.Lock()
        self._highest = highest

    @property
    def highest(self) -> int:
        return self._highest

    def apply(self, token: int, write: Callable[[], T]) -> T:
        """Runs ``write()`` if ``token`` is at least the highest accepted, with
        the fence held until it returns; raises :class:`StaleWrite` otherwise."""
        with self._mu:
            if token < self._highest:
                raise StaleWrite(self._highest, token)
            self._highest = token
            return write()


class FileFence:
    """Fences the file ``path`` for writers in any process.

    ``fence.write(token, data)`` replaces the file's content atomically
    (temporary file, fsync, rename) if ``token`` is at least the highest
    accepted so far, all under ``flock(PATH.fence, LOCK_EX)``; the mark is
    made durable before the data, so after a crash an older holder is still
    refused.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fence_path = path + ".fence"

    def highest(self) -> int:
        try:
            with open(self.fence_path, "rb") as f:
                return _parse(f.read())
        except FileNotFoundError:
            return 0

    def apply(self, token: int, write: Callable[[], T]) -> T:
        """Runs ``write()`` under the fence if ``token`` is not stale."""
        fd = os.open(self.fence_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            seen = _parse(os.pread(fd, 64, 0))
            if token < seen:
                raise StaleWrite(seen, token)
            if token > seen:
                mark = str(token).encode() + b"\n"
                os.ftruncate(fd, 0)
                os.pwrite(fd, mark, 0)
                os.fsync(fd)
            return write()
        finally:
            os.close(fd)  # also drops the flock

    def write(self, token: int, data: bytes) -> None:
        """Replaces the file's content with ``data`` if ``token`` is not stale."""
        def replace() -> None:
            tmp = f"{self.path}.tmp.{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)

        self.apply(token, replace)


def _parse(b: bytes) -> int:
    s = b.strip()
    return int(s) if s else 0
