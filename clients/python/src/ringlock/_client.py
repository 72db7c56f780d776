"""The session client: one connection, one reader thread, any number of locks.

Threading model
---------------
* A :class:`Client` owns one TCP connection to ringlockd's lock port
  (TLS over it with ``ssl_context``: ``_tls.py``), opened with a Hello,
  and one daemon **reader thread**
  (``ringlock-reader-<session id>``). Only the reader thread reads the
  socket. It matches every Reply to its request by request id (rid),
  handles Lost pushes, sends the keep-alive Pings and the background
  Extends of leases, and expires leases on the client's clock. It never
  waits for an answer and never runs user code.
* Any thread may call any method of a :class:`Client` or a :class:`Lease`
  at the same time. A caller writes its own request frame (under a write
  lock, so frames never interleave) and waits on its own event until the
  reader thread delivers the answer (or the session ends).
* Lost-lock callbacks run on one **callback thread** per client
  (``ringlock-callbacks-<session id>``), in the order the losses were
  decided, so a callback may call ``release()`` (of its lease or another)
  or even :meth:`Client.close` without deadlocking. A slow callback delays
  only later callbacks, never the keep-alive.
* One lock (``Client._lock``) guards every piece of shared state; nothing
  blocks while holding it.

The keep-alive arithmetic (as in the Rust client, ``docs/client.md``): the
server ends the session when nothing arrived for K (the keep-alive it
answered to the Hello). The reader thread pings every I = K/3 and declares
the session lost when a Ping is not answered within T = K/3 of when it was
due (each capped at 10 s), so the holder learns of a loss before the server
can free its session holds.
"""

from __future__ import annotations

import enum
import logging
import math
import queue
import select
import socket
import ssl
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar,
                    Union)

from . import _codec as codec
from ._codec import HoldMode, Status
from ._tls import TLSConn, verifies
from .errors import (
    Cancelled,
    InvalidArgument,
    LimitReached,
    LockBusy,
    LockLost,
    LockReleased,
    LockTimeout,
    ModeMismatch,
    ModesUnsupported,
    NotLeader,
    NotOwner,
    ProclaimUnsupported,
    ProtocolError,
    ReleaseFailed,
    RingLockError,
    ServerError,
    StaleToken,
    TLSError,
    TLSRequired,
    Unauthorized,
    Unavailable,
    UnsupportedVersion,
    UnverifiedLeader,
    WatchEnded,
    WatchUnsupported,
)

if TYPE_CHECKING:  # pragma: no cover
    from ._election import Election

__all__ = [
    "Access",
    "Client",
    "EXCLUSIVE",
    "SHARED",
    "semaphore",
    "Lease",
    "LostInfo",
    "LostReason",
    "CancelToken",
    "RetryEvent",
    "DEFAULT_PORT",
    "Holder",
    "Watch",
    "WatchEvent",
]

log = logging.getLogger("ringlock")

DEFAULT_PORT = 22119
PING_INTERVAL_MAX = 10.0
PING_TIMEOUT_MAX = 10.0
#: Request id of the Hello and of every keep-alive Ping (one at a time).
#: Every other request gets another rid (0 included: rid 0 is ordinary).
_PING_RID = 1

_T = TypeVar("_T")
Address = Union[str, Tuple[str, int]]
Key = Union[str, bytes]
LostCallback = Callable[["Lease", "LostInfo"], None]
RetryCallback = Callable[["RetryEvent"], Optional[bool]]


class LostReason(str, enum.Enum):
    """Why a lock was lost."""

    #: The lease's TTL passed without an extend (pushed by the server, or
    #: seen first on this client's clock, which never runs behind the server's).
    EXPIRED = "expired"
    #: An operator reset it (ResetByKey, ResetBySource, admin RSET/RSBS, an
    #: unlock on the Locking-Center port). Pushed by the server.
    RESET = "reset"
    #: An extend or release was answered ``stale_token``/``not_owner``.
    NOT_HELD = "not_held"
    #: The session ended: the connection closed or failed, or
    #: :meth:`Client.close` was called.
    SESSION_ENDED = "session_ended"
    #: A keep-alive Ping went unanswered: the connection hangs.
    KEEPALIVE_TIMEOUT = "keepalive_timeout"
    #: The session was resumed on a new connection (cluster mode) and the
    #: server's list of its holds did not have this one: it was reset,
    #: expired, or released by token while the connection was down.
    NOT_LISTED = "not_listed"


@dataclass(frozen=True)
class LostInfo:
    """How a lock was lost: the verdict that decided it, the same object
    for every ``on_lost`` callback and :attr:`Lease.lost_info`."""

    #: The key as it was given to :meth:`Client.acquire`: a ``str`` key as
    #: that ``str``, bytes as bytes (:attr:`key_bytes`: the bytes sent).
    key: Key
    token: int
    reason: LostReason
    #: What decided the loss, in words (on this client's clock, a Lost push,
    #: an answer, the session's end).
    detail: str
    #: True when the server said so (a Lost push, a stale-token answer, a
    #: resumed session's Held list): the key is certainly no longer held
    #: with this token. False when this client decided it (its clock, the
    #: session's end); a later Lost push confirming it changes neither this
    #: nor :attr:`Lease.lost_info`.
    from_server: bool

    @property
    def key_bytes(self) -> bytes:
        """The key's bytes (a ``str`` key UTF-8 encoded, as sent)."""
        return self.key.encode("utf-8") if isinstance(self.key, str) else self.key

    def __str__(self) -> str:
        return (f"lost the lock on {self.key!r} "
                f"(token {self.token}): {self.reason.value}: {self.detail}")


@dataclass(frozen=True)
class Access:
    """How a lock is shared (``docs/protocol.md``, "Lock modes"): one FIFO
    queue per key whatever the access, and a fencing token per grant.

    * :data:`EXCLUSIVE` (the default): one holder at a time.
    * :data:`SHARED`: any number of shared holders at once (a reader lock);
      an exclusive request waits for them all, and a shared request that
      comes after a waiting exclusive one waits behind it.
    * :func:`semaphore` ``(n)``: at most ``n`` holders (``n`` >= 1). The
      key's ``n`` is fixed by its first semaphore holder or waiter for as
      long as any holds or waits: another ``n`` raises
      :class:`~ringlock.ModeMismatch`.

    Shared and semaphore requests need a server that offers lock modes
    (:attr:`Client.modes`); otherwise they raise
    :class:`~ringlock.ModesUnsupported` before anything is sent.
    ``str(access)`` is ``"exclusive"``, ``"shared"`` or ``"semaphore(n)"``.
    """

    #: ``"exclusive"``, ``"shared"`` or ``"semaphore"``.
    kind: str = "exclusive"
    #: A semaphore's slot count ``n``; 0 for the other kinds.
    slots: int = 0

    def __post_init__(self) -> None:
        if self.kind in ("exclusive", "shared"):
            if self.slots != 0:
                raise InvalidArgument(f"{self.kind} access has no slots (only a semaphore "
                                      f"has), got slots={self.slots!r}")
        elif self.kind == "semaphore":
            n = self.slots
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 0xFFFFFFFF:
                raise InvalidArgument(f"a semaphore has 1 to {0xFFFFFFFF} slots, got {n!r}")
        else:
            raise InvalidArgument(f"access {self.kind!r}: not exclusive, shared or semaphore")

    @property
    def exclusive(self) -> bool:
        return self.kind == "exclusive"

    @property
    def _byte(self) -> int:
        return {"exclusive": codec.ACCESS_EXCLUSIVE, "shared": codec.ACCESS_SHARED,
                "semaphore": codec.ACCESS_SEMAPHORE}[self.kind]

    def __str__(self) -> str:
        return f"semaphore({self.slots})" if self.kind == "semaphore" else self.kind


#: One holder at a time (the default access).
EXCLUSIVE = Access("exclusive")
#: Any number of shared holders at once: a reader lock.
SHARED = Access("shared")


def semaphore(slots: int) -> "Access":
    """A semaphore of ``slots`` (>= 1) holders: at most that many at once.
    ``semaphore(0)`` raises :class:`~ringlock.InvalidArgument`."""
    return Access("semaphore", slots)


def _access_arg(access: "Union[Access, str]") -> Access:
    if isinstance(access, Access):
        return access
    if access == "exclusive":
        return EXCLUSIVE
    if access == "shared":
        return SHARED
    raise InvalidArgument(f"access must be ringlock.EXCLUSIVE, ringlock.SHARED, "
                          f"ringlock.semaphore(n), 'exclusive' or 'shared'; got {access!r}")


@dataclass(frozen=True)
class RetryEvent:
    """A failed attempt to open a session that the client is about to
    retry: what ``Client(on_retry=...)`` is told, before each further
    attempt (not for the last failure: that one is the
    :class:`~ringlock.Unavailable` raised)."""

    #: The address of the failed attempt, ``"host:port"``.
    address: str
    #: Why it failed, in words (``[Errno 111] Connection refused``, ``not
    #: the leader (the leader is ...)``, ``no hello reply within 3.0 s``).
    error: str
    #: The connection was refused: nothing listens at ``address``.
    refused: bool
    #: Failed attempts so far (1 at the first).
    attempts: int
    #: Seconds before the next attempt (0: the next address at once).
    delay: float
    #: Seconds since the client began opening the session.
    elapsed: float
    #: The retry budget (``Client(retry=...)``), seconds.
    budget: float


class CancelToken:
    """Withdraws a waiting :meth:`Client.acquire` from another thread.

    ``cancel()`` sends a Cancel for every acquire waiting with this token;
    the server then answers the acquire either ``cancelled`` or with the
    grant that beat the Cancel, never both. A grant that won the race is
    released at once: the acquire raises :class:`~ringlock.Cancelled`
    either way, so a caller who cancelled never holds the key. One token
    may serve several acquires; it cannot be reset.
    """

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._cancelled = False
        self._subs: Dict[int, Callable[[], None]] = {}
        self._next = 0

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._mu:
            if self._cancelled:
                return
            self._cancelled = True
            subs = list(self._subs.values())
            self._subs.clear()
        for fn in subs:
            fn()

    def _subscribe(self, fn: Callable[[], None]) -> Callable[[], None]:
        with self._mu:
            if not self._cancelled:
                n = self._next
                self._next += 1
                self._subs[n] = fn

                def unsubscribe() -> None:
                    with self._mu:
                        self._subs.pop(n, None)

                return unsubscribe
        fn()
        return lambda: None


def _parse_address(addr: Address) -> Tuple[str, int]:
    if isinstance(addr, tuple):
        host, port = addr
    else:
        s = addr.strip()
        if not s:
            raise InvalidArgument("an empty address")
        if s.startswith("["):
            end = s.find("]")
            if end < 0:
                raise InvalidArgument(f"address {addr!r}: unclosed '['")
            host, rest = s[1:end], s[end + 1:]
            if rest and not rest.startswith(":"):
                raise InvalidArgument(f"address {addr!r}: junk after ']'")
            port_s = rest[1:] if rest else ""
        elif s.count(":") == 1:
            host, port_s = s.split(":")
        elif ":" in s:  # a bare IPv6 address
            host, port_s = s, ""
        else:
            host, port_s = s, ""
        if port_s == "":
            port = DEFAULT_PORT
        else:
            try:
                port = int(port_s, 10)
            except ValueError:
                raise InvalidArgument(f"address {addr!r}: port {port_s!r} is not a number") from None
    if not host:
        raise InvalidArgument(f"address {addr!r}: no host")
    if not 1 <= port <= 65535:
        raise InvalidArgument(f"address {addr!r}: port {port} outside 1..=65535")
    return host, port


def _key_bytes(key: Key) -> bytes:
    return _key_arg(key)[0]


def _key_arg(key: Key) -> Tuple[bytes, Key]:
    """The key's bytes (a ``str`` as UTF-8) and the key as the API hands it
    back: a ``str`` as given, anything else as ``bytes``."""
    if isinstance(key, str):
        b = key.encode("utf-8")
        given: Key = key
    else:
        b = given = bytes(key)
    if not 1 <= len(b) <= codec.KEY_MAX:
        raise InvalidArgument(f"a key is 1 to {codec.KEY_MAX} bytes, got {len(b)}")
    return b, given


class _Pending:
    """One outstanding request."""

    __slots__ = ("kind", "sent_at", "event", "reply", "lease", "key", "ukey", "mode", "ttl_ms",
                 "on_lost", "keep_alive", "cancel_sent", "target", "frame", "access", "error",
                 "watch", "proclaim")

    def __init__(self, kind: str, sent_at: float) -> None:
        # "acquire" | "call" (a caller waits) | "extend" (background) | "ignore"
        self.kind = kind
        self.sent_at = sent_at
        self.event = threading.Event()
        self.reply: Optional[codec.Reply] = None
        self.lease: Optional[Lease] = None
        self.key = b""
        #: The key as given (str or bytes): what the Lease hands back.
        self.ukey: Key = b""
        self.mode = HoldMode.SESSION
        self.ttl_ms = 0
        self.on_lost: Optional[LostCallback] = None
        self.keep_alive = False
        self.cancel_sent = False
        self.target: Optional[Lease] = None
        #: The request as written (its rid included): a resume sends it again.
        self.frame = b""
        #: An Acquire's access (``None`` for every other request).
        self.access: Optional[Access] = None
        #: The error an Acquire ends with instead of an answer (a resume on a
        #: server without modes: :class:`~ringlock.ModesUnsupported`).
        self.error: Optional[RingLockError] = None
        #: A Watch request's watch (its holders are collected until the Reply).
        self.watch: Optional[Watch] = None
        #: A Proclaim's election name as given (``None`` for every other
        #: request): sent only to a server with the proclaim flag.
        self.proclaim: Optional[Key] = None


class Lease:
    """One granted lock: its key, fencing token and hold mode.

    Returned by :meth:`Client.acquire` (and ``lock``/``try_lock``). Usable
    as a context manager: ``with client.lock("k", ttl=30) as lease:``
    releases on exit. Thread-safe.

    Checking it in a critical section: :attr:`lost` (a bool) and
    :meth:`check` (raises :class:`~ringlock.LockLost`) look at the
    client-side deadlines themselves, so they are right even when the
    process was paused and the reader thread has not run yet. Pass
    :attr:`token` with every write to the protected resource and let it
    refuse older tokens (``ringlock.fence``): that is the only protection
    against a pause between the check and the write.
    """

    def __init__(self, client: "Client", key: bytes, token: int, mode: HoldMode,
                 ttl_ms: int, sent_at: float, on_lost: Optional[LostCallback],
                 keep_alive: bool, given: Optional[Key] = None,
                 access: Optional[Access] = None) -> None:
        self._client = client
        self._access = EXCLUSIVE if access is None else access
        self._key = key
        #: The key as the caller gave it (a str stays a str).
        self._ukey: Key = key if given is None else given
        self._token = token
        self._mode = mode
        self._ttl_ms = ttl_ms
        self._on_lost = on_lost
        self._keep_alive = keep_alive and mode == HoldMode.LEASE
        # All below guarded by client._lock.
        self._state = "held"  # held | releasing | released | lost
        self._lost_info: Optional[LostInfo] = None
        #: The server said the key is gone (a Lost push, a stale answer),
        #: possibly after this client had decided the loss itself: a
        #: release then sends nothing.
        self._lost_confirmed = False
        self._lost_event = threading.Event()
        # Client-side expiry (monotonic): when the Acquire or the last
        # answered Extend was *sent* + TTL, so never later than the server's.
        self._expires_at: Optional[float] = (sent_at + ttl_ms / 1000.0
                                             if mode == HoldMode.LEASE else None)
        self._next_extend: Optional[float] = (sent_at + ttl_ms / 3000.0
                                              if self._keep_alive else None)
        self._extend_in_flight = False
        self._release_started = False
        self._release_done = threading.Event()
        self._release_error: Optional[BaseException] = None

    # --- what it is -------------------------------------------------------
    @property
    def key(self) -> Key:
        """The key as it was given to :meth:`Client.acquire`: a ``str`` key
        comes back as that ``str``, a bytes-like one as ``bytes``."""
        return self._ukey

    @property
    def key_bytes(self) -> bytes:
        """The key's bytes, as sent (a ``str`` key UTF-8 encoded)."""
        return self._key

    @property
    def token(self) -> int:
        """The grant's fencing token (strictly larger for every later grant of the key)."""
        return self._token

    @property
    def mode(self) -> str:
        """``"session"``, ``"lease"`` or ``"persistent"``."""
        return self._mode.name.lower()

    @property
    def access(self) -> Access:
        """How it is shared: :data:`~ringlock.EXCLUSIVE`,
        :data:`~ringlock.SHARED` or a :func:`~ringlock.semaphore` of n
        (``lease.access.kind``, ``lease.access.slots``)."""
        return self._access

    @property
    def ttl(self) -> Optional[float]:
        """A lease's TTL in seconds (as sent), ``None`` for other holds."""
        return self._ttl_ms / 1000.0 if self._mode == HoldMode.LEASE else None

    @property
    def expires_in(self) -> Optional[float]:
        """Seconds until a lease expires on this client's clock (never later
        than on the server's); ``None`` for session and persistent holds."""
        with self._client._lock:
            x = self._expires_at
        return None if x is None else max(0.0, x - time.monotonic())

    # --- has it been lost? -------------------------------------------------
    @property
    def lost(self) -> bool:
        """True once the lock is lost (or cannot be known to be held)."""
        self._client._evaluate(self)
        return self._state == "lost"

    @property
    def lost_info(self) -> Optional[LostInfo]:
        """How it was lost, once it was."""
        self._client._evaluate(self)
        return self._lost_info

    def check(self) -> None:
        """Raises :class:`~ringlock.LockLost` if the lock is lost,
        :class:`~ringlock.LockReleased` if it was released; returns otherwise."""
        self._client._evaluate(self)
        info = self._lost_info
        if self._state == "lost" and info is not None:
            raise LockLost(str(info), info=info)
        if self._state in ("releasing", "released"):
            raise LockReleased(f"the lock on {self._ukey!r} was released")

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the lock is lost (True) or ``timeout`` passes (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.lost:
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            # Wake at least every 50 ms to re-evaluate the client-side
            # deadlines, which no thread signals.
            self._lost_event.wait(0.05 if left is None else min(left, 0.05))

    # --- actions -------------------------------------------------------------
    def extend(self, ttl: Optional[float] = None) -> None:
        """A lease: Extend, setting its TTL left to ``ttl`` seconds (default:
        its own TTL) counted from now. A session or persistent hold: a Ping
        round trip that proves the session alive. Raises
        :class:`~ringlock.LockLost` (or its :class:`~ringlock.StaleToken`
        subclass) if it is no longer held."""
        self._client._extend_lease(self, ttl)

    def release(self) -> None:
        """Releases the lock with one token-checked Release. Safe to call
        any number of times, from any thread: the first call does the work,
        every other call waits for it and gets its outcome. Raises
        :class:`~ringlock.LockLost` if the lock had been lost before it was
        released (the critical section was not protected to its end), and
        :class:`~ringlock.ReleaseFailed` if the release could not be
        confirmed."""
        c = self._client
        with c._lock:
            first = not self._release_started
            self._release_started = True
            if first and self._state == "held":
                self._state = "releasing"
        if not first:
            self._release_done.wait()
        else:
            try:
                c._release_lease(self)
            except BaseException as e:  # cached for every later call
                self._release_error = e
            finally:
                with c._lock:
                    if self._state == "releasing":
                        self._state = "released"
                self._release_done.set()
        if self._release_error is not None:
            raise self._release_error

    def release_quietly(self) -> None:
        """:meth:`release`, ignoring every :class:`~ringlock.RingLockError`."""
        try:
            self.release()
        except RingLockError:
            pass

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.release()
        except RingLockError:
            # Do not mask the exception that ended the block.
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        return (f"Lease(key={self._ukey!r}, token={self._token}, mode={self.mode}, "
                f"access={self._access}, state={self._state})")


def _access_of(access: int, slots: int) -> Access:
    if access == codec.ACCESS_SHARED:
        return SHARED
    if access == codec.ACCESS_SEMAPHORE:
        return semaphore(slots)
    return EXCLUSIVE


@dataclass(frozen=True)
class Holder:
    """One holder of a watched key (:attr:`Watch.holders`)."""

    #: The holder's fencing token.
    token: int
    #: ``"persistent"``, ``"session"`` or ``"lease"`` (as :attr:`Lease.mode`).
    hold: str
    #: :data:`~ringlock.EXCLUSIVE`, :data:`~ringlock.SHARED` or a
    #: :func:`~ringlock.semaphore` (as :attr:`Lease.access`).
    access: Access
    #: A semaphore's slot count; 0 for the other accesses.
    slots: int
    #: The holder's source as the server has it (bytes: a session's
    #: ``source=``, a Locking-Center client's source, or empty).
    source: bytes


@dataclass(frozen=True)
class WatchEvent:
    """One change of a watched key's holders (:meth:`Watch.next`)."""

    #: ``"granted"``, ``"released"``, ``"expired"``, ``"reset"``,
    #: ``"session_ended"`` or ``"proclaimed"`` (the holder, same token, under
    #: the new ``source``: an election's new value) (``"holder"`` only in
    #: :attr:`Watch.holders`). An Event of a kind this client does not
    #: know (a later server's) is skipped.
    kind: str
    token: int
    #: ``"persistent"``, ``"session"`` or ``"lease"``.
    hold: str
    access: Access
    slots: int
    source: bytes
    #: The key as it was given to :meth:`Client.watch` (a ``str`` stays a ``str``).
    key: Key


class Watch:
    """A watch of one key's holders (:meth:`Client.watch`).

    :attr:`holders` are the key's holders when the watch began; then
    :meth:`next` (or ``for ev in watch:``) hands out every change, in the
    order the server decided them, each once. Events are queued per watch
    by the reader thread, so a slow consumer delays nobody (its queue
    grows). ``with client.watch(k) as w:`` closes it on exit. Thread-safe.

    A watch lasts as long as its session's connection: when the session
    ends, or a replicated session is resumed on a new connection (which
    carries no watch), :meth:`next` hands out the events that arrived
    before, then raises :class:`~ringlock.WatchEnded`. Watching again is a
    **re-read**: the new watch lists the holders as they are then, and
    the changes between the two watches are not replayed.
    """

    def __init__(self, client: "Client", key: bytes, given: Key) -> None:
        self._client = client
        self._key = key
        self._ukey = given
        self._rid = 0
        self._holders: List[Holder] = []
        # Guarded by client._lock (the condition's lock).
        self._events: "deque[WatchEvent]" = deque()
        self._cv = threading.Condition(client._lock)
        #: "starting" (Watch sent) | "open" | "closing" (Unwatch sent) | "ended"
        self._state = "starting"
        self._end: Optional[WatchEnded] = None

    @property
    def key(self) -> Key:
        """The key as it was given (a ``str`` stays a ``str``)."""
        return self._ukey

    @property
    def key_bytes(self) -> bytes:
        """The key's bytes, as sent."""
        return self._key

    @property
    def holders(self) -> List[Holder]:
        """The key's holders when the watch began (empty: it was free),
        in the order the server listed them."""
        return list(self._holders)

    @property
    def ended(self) -> Optional[WatchEnded]:
        """Why the watch is over (``None`` while it is open)."""
        with self._client._lock:
            return self._end

    def _event(self, ev: codec.Event) -> WatchEvent:
        return WatchEvent(ev.kind.label, ev.token, ev.hold.name.lower(),
                          _access_of(ev.access, ev.slots), ev.slots, ev.source, self._ukey)

    def _finish(self, reason: str, detail: str) -> None:
        """Ends the watch (caller holds ``_lock``); the first end stands."""
        if self._end is None:
            self._end = WatchEnded(f"the watch of {self._ukey!r} ended ({reason}): {detail}; "
                                   f"watch the key again to read its holders anew (changes "
                                   f"in between are not replayed)", self._ukey, reason)
        self._state = "ended"
        self._cv.notify_all()

    def next(self, timeout: Optional[float] = None) -> Optional[WatchEvent]:
        """The next change, waiting up to ``timeout`` seconds (``None``:
        until one comes); ``None`` when none came in time. Once the watch
        is over and the events queued before its end were handed out,
        raises :class:`~ringlock.WatchEnded` (``.reason`` says why)."""
        if timeout is not None and (not isinstance(timeout, (int, float))
                                    or math.isnan(timeout) or timeout < 0):
            raise InvalidArgument(f"timeout must be None or seconds >= 0, got {timeout!r}")
        # A pause may have ended the session before the reader noticed.
        self._client._check_keepalive()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while True:
                if self._events:
                    return self._events.popleft()
                if self._end is not None:
                    raise self._end
                if deadline is None:
                    self._cv.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    self._cv.wait(left)

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> WatchEvent:
        """Waits for each change; stops after :meth:`close`, raises
        :class:`~ringlock.WatchEnded` when the watch ended otherwise."""
        try:
            ev = self.next()
        except WatchEnded as e:
            if e.reason == "closed":
                raise StopIteration from None
            raise
        assert ev is not None
        return ev

    def close(self) -> None:
        """Ends the watch: sends Unwatch and waits for its answer (no event
        of this watch follows it); events not handed out yet are dropped.
        Idempotent; sends nothing once the watch or the session ended."""
        self._client._unwatch(self)

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Watch(key={self._ukey!r}, holders={len(self._holders)}, "
                f"state={self._state})")


@dataclass(frozen=True)
class _Welcome:
    keepalive: float
    min_ttl_ms: int
    max_ttl_ms: int
    session_id: int
    max_keys: int
    max_waiters: int
    shards: int
    flags: int = 0


class _Gone(Exception):
    """A Resume was refused for good (``unknown_session``, a server without
    Resume, ``unauthorized``...): the session has ended."""


class Client:
    """A ringlockd session.

    ``Client("10.0.0.5:22119")``, or a list of addresses tried in order
    until one opens a session (a host without a port means port 22119).
    Options:

    * ``auth_token`` — the server's ``--auth-token-file`` secret (str or bytes).
    * ``ssl_context`` — an :class:`ssl.SSLContext` (e.g.
      :func:`ringlock.tls_context` of a certs dir): every connection (the
      Hello, each Resume, a ``not_leader`` hint) speaks TLS, and the
      server's certificate is checked against the host dialled (the IP
      address for an IP literal). ``None``: plaintext. Without a context
      that verifies the server, a ``not_leader`` hint that is not among
      ``addrs`` is not dialled when the Hello would carry ``auth_token``,
      nor by a Resume (it carries the session id):
      :class:`~ringlock.UnverifiedLeader`.
    * ``source`` — the name shown by ``ringlock keys``, 0..255 bytes (default: the server
      uses your IP).
    * ``keepalive`` — seconds to ask for (the server clamps it); default: the server's (10 s).
    * ``connect_timeout`` (3 s) — per address, connecting and the Hello.
    * ``retry`` (10 s) — how long to keep retrying when no address can be
      reached; 0 tries each address once. An ``unauthorized`` or
      ``unsupported_version`` answer is never retried. A server that answers
      ``not_leader`` counts as unreachable: the leader it names is tried
      next, then the other addresses. The first failed attempt that is
      followed by another logs one warning on the ``ringlock`` logger
      (what failed, where, for how long the client keeps retrying); the
      later ones are logged at debug level.
    * ``on_retry(event)`` — called on the calling thread with a
      :class:`RetryEvent` after each failed attempt to open the session
      that another attempt follows (not after the last one: that is the
      :class:`~ringlock.Unavailable` raised). Returning ``False`` gives up
      at once (e.g. ``lambda e: not e.refused``: fail fast when nothing
      listens); an exception it raises propagates. Not called for a
      resume (cluster mode), which runs on the reader thread.
    * ``release_timeout`` (10 s) — bound on a release or an extend.
    * ``on_lost(lease, info)`` — called for every lock of this session that
      is lost, before the lease's own callback.

    Close it (``close()`` or ``with Client(...) as c:``) to end the session:
    the server then frees its session holds at once. After it ended every
    request raises :class:`~ringlock.Unavailable`.

    **Resume (cluster mode).** When the server's welcome has the
    *resumable* flag (:attr:`resumable`: a replicated session of a
    cluster), a failed connection (EOF, an error, a ``not_leader`` close, an
    unanswered keep-alive) does not end the session at once: while the
    keep-alive, counted from the last frame received, has not passed, the
    reader thread walks the addresses (a ``not_leader`` hint first; one not
    among ``addrs`` only with a verifying ``ssl_context``) sending
    a Resume. The holds the server lists are kept (no ``on_lost``), those
    it does not list are lost (reason ``not_listed``), requests in flight
    are settled by that list or sent again (``docs/protocol.md``, "Resuming
    a session"), and :attr:`resumes` counts it. ``unknown_session`` or the
    window passing ends the session as a failed connection always did.
    Without the flag a failed connection ends the session.
    """

    def __init__(self, addrs: Union[Address, Sequence[Address]] = "127.0.0.1", *,
                 auth_token: Union[str, bytes, None] = None, source: Union[str, bytes] = b"",
                 keepalive: Optional[float] = None, connect_timeout: float = 3.0,
                 retry: float = 10.0, release_timeout: float = 10.0,
                 on_lost: Optional[LostCallback] = None,
                 ssl_context: Optional[ssl.SSLContext] = None,
                 on_retry: Optional[RetryCallback] = None) -> None:
        if isinstance(addrs, (str, tuple)):
            addr_list: List[Address] = [addrs]  # type: ignore[list-item]
        else:
            addr_list = list(addrs)
        if not addr_list:
            raise InvalidArgument("no address given")
        self._addrs = [_parse_address(a) for a in addr_list]
        self._auth = auth_token.encode() if isinstance(auth_token, str) else (auth_token or b"")
        if len(self._auth) > codec.AUTH_MAX:
            raise InvalidArgument(f"an auth token is at most {codec.AUTH_MAX} bytes")
        self._source = source.encode() if isinstance(source, str) else bytes(source)
        if len(self._source) > codec.SOURCE_MAX:
            raise InvalidArgument(f"a source is at most {codec.SOURCE_MAX} bytes")
        if keepalive is not None and keepalive < 0:
            raise InvalidArgument("keepalive must be >= 0")
        keepalive_ms = 0 if keepalive is None else min(int(keepalive * 1000), 0xFFFFFFFF)
        if connect_timeout <= 0 or release_timeout <= 0 or retry < 0:
            raise InvalidArgument("timeouts must be positive (retry >= 0)")
        if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
            raise InvalidArgument(f"ssl_context must be an ssl.SSLContext (ringlock.tls_context"
                                  f"(certs_dir) makes one), got {type(ssl_context).__name__}")
        self._ssl = ssl_context
        #: The server of every connection is verified (CA and host name):
        #: a secret may go to an address the user did not list.
        self._verified = verifies(ssl_context)
        self._release_timeout = release_timeout
        self._on_lost = on_lost
        self._on_retry = on_retry

        self._lock = threading.Lock()
        self._wlock = threading.Lock()
        self._pending: Dict[int, _Pending] = {}
        self._holds: Dict[Tuple[bytes, int], Lease] = {}
        #: Open watches by their Watch's rid (none of these rids is reused
        #: while the server may still send Events under it).
        self._watches: Dict[int, Watch] = {}
        self._dead: Optional[Tuple[LostReason, str]] = None
        self._next_rid = _PING_RID + 1
        #: The leader a ``not_leader`` answer named, once the session ended on one.
        self._leader: Optional[str] = None
        self._not_leader = False
        self._callbacks: "queue.Queue[Optional[Tuple[LostCallback, Lease, LostInfo]]]" = queue.Queue()
        self._connect_timeout = connect_timeout
        #: True from a failed connection of a resumable session until the
        #: Resume succeeded (or the session ended): requests are queued in
        #: ``_pending`` (with their frames), not written.
        self._resuming = False
        self._resumes = 0

        sock, welcome, addr, hello_sent = self._open(keepalive_ms, connect_timeout, retry)
        #: When the last frame from the server was received (the resume window).
        self._last_rx = time.monotonic()
        self._sock = sock
        self._server = addr
        self._w = welcome
        k = welcome.keepalive
        self._interval = max(0.001, min(k / 3, PING_INTERVAL_MAX))
        self._ping_timeout = max(0.001, min(k / 3, PING_TIMEOUT_MAX))
        # Sent time of the latest request the server answered: the server
        # cannot end the session before this + K.
        self._confirmed_at = hello_sent
        # A write blocks only when the server stopped reading; past the ping
        # timeout that is a hung connection.
        sock.settimeout(self._ping_timeout)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        sid = welcome.session_id
        self._cb_thread = threading.Thread(target=self._run_callbacks, daemon=True,
                                           name=f"ringlock-callbacks-{sid}")
        self._reader = threading.Thread(target=self._run_reader, daemon=True,
                                        name=f"ringlock-reader-{sid}")
        self._cb_thread.start()
        self._reader.start()

    # --- opening ------------------------------------------------------------
    def _open(self, keepalive_ms: int, timeout: float, retry: float
              ) -> Tuple["_Conn", _Welcome, Tuple[str, int], float]:
        start = time.monotonic()
        give_up = start + retry
        warned = False

        def failed(addr: Tuple[str, int], e: _Retry, attempts: int, delay: float) -> bool:
            nonlocal warned
            name = f"{addr[0]}:{addr[1]}"
            now = time.monotonic()
            left = max(0.0, give_up - now)
            if not warned:
                warned = True
                # Said once, at once: a user with no logging configured sees
                # it on stderr (Python's last-resort handler prints warnings).
                if left > 0:
                    then = f"retrying for up to {left:.1f} s (retry={retry:g} s)"
                else:
                    then = "trying the next address (retry=0: each address once)"
                log.warning("ringlock: cannot open a session on %s: %s; %s", name, e, then)
            else:
                log.debug("ringlock: attempt %d to open a session failed on %s: %s; next "
                          "attempt in %.3f s (%.1f s of retry left)", attempts, name, e, delay,
                          left)
            if self._on_retry is None:
                return True
            ev = RetryEvent(name, str(e), e.refused, attempts, delay, now - start, retry)
            return self._on_retry(ev) is not False

        return self._walk(lambda addr, t: self._hello(addr, keepalive_ms, t), timeout,
                          give_up, None, time.sleep, 2.0, "opened", failed=failed)

    def _configured(self, addr: Tuple[str, int]) -> bool:
        """``addr`` is one of the addresses this client was given."""
        return (addr[0].lower(), addr[1]) in {(h.lower(), p) for h, p in self._addrs}

    def _unverified_hint(self, leader: str, addr: Tuple[str, int], by: str, what: str
                         ) -> Optional[UnverifiedLeader]:
        """The error for a ``not_leader`` hint that must not be dialled: a
        connection that carries a secret (``what``), to an address nobody
        listed, whose server is not verified. ``None``: it may be dialled."""
        if self._verified or self._configured(addr):
            return None
        return UnverifiedLeader(
            f"{by} answered not_leader naming the leader {leader}, which is not among this "
            f"client's addresses: not dialled, because {what} would travel to a server nobody "
            f"verified ({'no TLS' if self._ssl is None else 'its ssl_context does not verify'}"
            f"). Give the client ssl_context= (ringlock.tls_context(certs_dir): "
            f"the leader's certificate is then checked against {addr[0]!r}), or list {leader} "
            f"among its addresses", leader)

    def _walk(self, attempt: Callable[[Tuple[str, int], float], "_T"], timeout: float,
              give_up: float, hint: Optional[Tuple[str, int]],
              sleep: Callable[[float], None], max_delay: float, what: str,
              refused: Optional[UnverifiedLeader] = None,
              failed: Optional[Callable[[Tuple[str, int], "_Retry", int, float], bool]] = None
              ) -> "_T":
        """Tries ``attempt(addr, timeout)`` on every address, rounds until
        ``give_up``; an attempt raising :class:`_Retry` moves on (to the
        leader it names first), anything else ends the walk. A leader named
        that may not be dialled (:meth:`_unverified_hint`; ``refused``: the
        starting hint was such) is skipped, and the walk ends with that
        error after the round. ``failed(addr, error, attempts, delay)`` is
        told of each failed attempt that another attempt follows (``delay``
        seconds later); ``False`` ends the walk with :class:`Unavailable`."""
        delay = 0.05
        attempts = 0
        # What an attempt sends besides the request: a Resume always the
        # session id; a Hello the auth token, if there is one.
        secret = ("the Resume (and the session id it carries)" if what == "resumed" else
                  "the Hello (and the auth token it carries)" if self._auth else None)
        while True:
            last: Optional[str] = None
            # One round: every address once. A `not_leader` answer puts the
            # leader it names first among those not yet tried this round
            # (each address at most once a round, so two servers naming each
            # other cannot loop); the next round starts with the last hint.
            todo = ([hint] if hint is not None else []) + list(self._addrs)
            tried: List[Tuple[str, int]] = []
            while todo:
                addr = todo.pop(0)
                if addr in tried:
                    continue
                tried.append(addr)
                attempts += 1
                left = give_up - time.monotonic()
                t = timeout if what == "opened" else max(0.001, min(timeout, left))
                try:
                    return attempt(addr, t)
                except _Retry as e:
                    err = e
                last = f"{addr[0]}:{addr[1]}: {err}"
                if err.leader is not None:
                    named: Optional[Tuple[str, int]] = None
                    try:
                        named = _parse_address(err.leader)
                    except InvalidArgument:
                        log.warning("ringlock: %s:%s named a leader that is not an address: "
                                    "%r", addr[0], addr[1], err.leader)
                    if named is not None and secret is not None:
                        no = self._unverified_hint(err.leader, named, f"{addr[0]}:{addr[1]}",
                                                   secret)
                        if no is not None:
                            log.warning("ringlock: %s", no)
                            refused = no
                            named = None
                    if named is not None:
                        hint = named
                        if hint not in tried:
                            todo.insert(0, hint)
                if failed is not None:
                    # Is another attempt coming, and when?
                    if any(a not in tried for a in todo):
                        after: Optional[float] = 0.0
                    else:
                        left = give_up - time.monotonic()
                        after = min(delay, left) if refused is None and left > 0 else None
                    if after is not None and failed(addr, err, attempts, after) is False:
                        raise Unavailable(f"no session could be {what} after {attempts} attempt"
                                          f"{'' if attempts == 1 else 's'}; last: {last} "
                                          f"(on_retry gave up)")
            if refused is not None:
                # Not retried: only the user's configuration can change it.
                raise refused
            left = give_up - time.monotonic()
            if left <= 0:
                n = attempts
                raise Unavailable(f"no session could be {what} after {n} attempt"
                                  f"{'' if n == 1 else 's'}; last: {last}")
            sleep(min(delay, left))
            delay = min(delay * 2, max_delay)

    def _dial(self, addr: Tuple[str, int], timeout: float) -> "_Conn":
        """A connection to ``addr``: TCP, then with ``ssl_context`` a TLS
        handshake that verifies the server against the host dialled. Raises
        :class:`_Retry` for what another try may change, :class:`TLSError`
        for a certificate that does not verify."""
        name = f"{addr[0]}:{addr[1]}"
        deadline = time.monotonic() + timeout
        try:
            sock = _connect(addr, timeout)
        except OSError as e:
            raise _Retry(str(e), refused=isinstance(e, ConnectionRefusedError)) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is None:
                return sock
            conn = TLSConn(sock, self._ssl, addr[0])
            conn.handshake(max(0.001, deadline - time.monotonic()))
            return conn
        except ssl.SSLCertVerificationError as e:
            sock.close()
            raise TLSError(
                f"{name}: the server's certificate does not verify ({e.verify_message}): it "
                f"must be issued by a CA of ssl_context (a certs dir's ca.crt), name the host "
                f"dialled ({addr[0]!r}) as a DNS name or IP address, and be within its dates",
                name) from None
        except ssl.SSLError as e:
            sock.close()
            raise _Retry(f"the TLS handshake failed ({e.reason or e}): a server without "
                         f"--certs-dir speaks plaintext only") from None
        except OSError as e:
            sock.close()
            raise _Retry(f"the TLS handshake failed: {e}") from None
        except BaseException:
            sock.close()
            raise

    def _hello(self, addr: Tuple[str, int], keepalive_ms: int, timeout: float
               ) -> Tuple["_Conn", _Welcome, Tuple[str, int], float]:
        deadline = time.monotonic() + timeout
        sock = self._dial(addr, timeout)
        ok = False
        try:
            sent = time.monotonic()
            try:
                sock.sendall(codec.encode_hello(_PING_RID, keepalive_ms, self._auth,
                                                self._HELLO_VERSION))
            except OSError as e:
                raise _Retry(f"sending the hello failed: {e}") from None
            buf = bytearray()
            while True:
                if buf and buf[0] != codec.KIND_REPLY:
                    raise ProtocolError(
                        f"{addr[0]}:{addr[1]} does not speak the session protocol (it answered "
                        f"{buf[0]:#04x} to a Hello): a Locking-Center server or an old ringlockd")
                try:
                    got = codec.decode_answer(buf, _PING_RID)
                except codec.ProtocolError as e:
                    raise ProtocolError(f"{addr[0]}:{addr[1]} broke the protocol: {e}") from None
                if got is not None:
                    ans = got[0]
                    if isinstance(ans, codec.Refused):
                        name = f"{addr[0]}:{addr[1]}"
                        if ans.status == Status.UNSUPPORTED_VERSION:
                            spoken = ", ".join(str(v) for v in ans.versions) or "none"
                            raise UnsupportedVersion(
                                f"{name} refused the session: unsupported version: this client "
                                f"speaks session protocol version {self._HELLO_VERSION}, the "
                                f"server speaks version{'s' if len(ans.versions) != 1 else ''} "
                                f"{spoken}", ans.versions)
                        # not_leader: like a failure to connect; try the leader.
                        raise _Retry("not the leader" + (f" (the leader is {ans.leader})"
                                                         if ans.leader else
                                                         " (it named no leader)"),
                                     ans.leader)
                    if isinstance(ans, codec.Welcome) or isinstance(ans, codec.Reply):
                        st = ans.status
                        if st == Status.UNAUTHORIZED:
                            raise Unauthorized(
                                f"{addr[0]}:{addr[1]} refused the session: unauthorized (the "
                                f"server has --auth-token-file: pass its secret as auth_token"
                                + (", or a client certificate in ssl_context" if self._ssl
                                   else "") + ")",
                                "unauthorized")
                        if st == Status.TLS_REQUIRED:
                            raise _tls_required(addr)
                        if st != Status.OK or not isinstance(ans, codec.Welcome):
                            raise ProtocolError(
                                f"{addr[0]}:{addr[1]} refused the session: {st.label}", st.label)
                        if ans.version != codec.VERSION:
                            raise ProtocolError(f"{addr[0]}:{addr[1]} speaks protocol version "
                                                f"{ans.version}, this client {codec.VERSION}")
                        if ans.keepalive_ms == 0:
                            raise ProtocolError(f"{addr[0]}:{addr[1]} answered a keep-alive of 0")
                        ok = True
                        w = _Welcome(ans.keepalive_ms / 1000.0, ans.min_ttl_ms, ans.max_ttl_ms,
                                     ans.session_id, ans.max_keys, ans.max_waiters, ans.shards,
                                     ans.flags)
                        return sock, w, addr, sent
                    raise ProtocolError(f"{addr[0]}:{addr[1]} pushed before the hello reply")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Retry(f"no hello reply within {timeout} s")
                sock.settimeout(left)
                try:
                    chunk = sock.recv(4096)
                except socket.timeout:
                    raise _Retry(f"no hello reply within {timeout} s") from None
                except ssl.SSLError as e:
                    raise _tls_refusal(addr, e) from None
                except OSError as e:
                    raise _Retry(str(e)) from None
                if chunk is None:
                    continue  # a TLS record not complete yet
                if not chunk:
                    raise _Retry("the server closed the connection before the hello reply "
                                 "(a server without sessions does that)")
                buf += chunk
        finally:
            if not ok:
                sock.close()

    # --- what the server applied ---------------------------------------------
    #: The session protocol version the Hello asks for (tests override it).
    _HELLO_VERSION = codec.VERSION

    @property
    def session_id(self) -> int:
        return self._w.session_id

    @property
    def keepalive(self) -> float:
        """The keep-alive deadline K (seconds) the server applies."""
        return self._w.keepalive

    @property
    def detection_window(self) -> float:
        """The longest a hung connection goes unnoticed (ping interval + ping timeout < K)."""
        return self._interval + self._ping_timeout

    @property
    def ttl_bounds(self) -> Tuple[float, float]:
        """The lease TTL bounds (seconds) the server published."""
        return self._w.min_ttl_ms / 1000.0, self._w.max_ttl_ms / 1000.0

    @property
    def shards(self) -> int:
        return self._w.shards

    @property
    def server_address(self) -> Tuple[str, int]:
        """The address the session is connected to (opened with, or resumed on)."""
        return self._server

    @property
    def resumable(self) -> bool:
        """The welcome had the *resumable* flag: a replicated session (cluster
        mode) that survives a failed connection by a Resume (see the class)."""
        return bool(self._w.flags & codec.FLAG_RESUMABLE)

    @property
    def modes(self) -> bool:
        """The welcome had the *modes* flag: the server takes shared and
        semaphore acquires (:class:`Access`). Read again after a resume.
        Every ringlockd since lock modes (issue #33) sets it, durable and
        clustered ones included; an older one does not."""
        with self._lock:
            return bool(self._w.flags & codec.FLAG_MODES)

    @property
    def watches(self) -> bool:
        """The server offers watches (its welcome's *watches* flag): without
        it :meth:`watch` raises :class:`~ringlock.WatchUnsupported`."""
        with self._lock:
            return bool(self._w.flags & codec.FLAG_WATCHES)

    @property
    def offers_proclaim(self) -> bool:
        """The server takes Proclaim (its welcome's *proclaim* flag; read
        again after a resume): without it :meth:`Leadership.proclaim
        <ringlock.Leadership.proclaim>` raises
        :class:`~ringlock.ProclaimUnsupported`."""
        with self._lock:
            return bool(self._w.flags & codec.FLAG_PROCLAIM)

    @property
    def resumes(self) -> int:
        """How many times the session was resumed on a new connection."""
        with self._lock:
            return self._resumes

    @property
    def local_address(self) -> Optional[Tuple[str, int]]:
        """This end of the connection (``ringlock keys``' ENDPOINT)."""
        try:
            a = self._sock.getsockname()
            return a[0], a[1]
        except OSError:
            return None

    @property
    def ended(self) -> Optional[Tuple[LostReason, str]]:
        """Why the session ended, once it did (``None`` while it is open)."""
        self._check_keepalive()
        with self._lock:
            return self._dead

    # --- locking ---------------------------------------------------------------
    def acquire(self, key: Key, *, timeout: Optional[float] = None, ttl: Optional[float] = None,
                persistent: bool = False, cancel: Optional[CancelToken] = None,
                on_lost: Optional[LostCallback] = None, keep_alive: bool = True,
                access: Union[Access, str] = EXCLUSIVE) -> Lease:
        """Acquires ``key`` (str as UTF-8, or bytes; 1..127 bytes). The
        lease, its ``LostInfo`` and errors hand the key back in the type it
        was given (``lease.key_bytes``: the bytes).

        * ``timeout`` — ``None`` waits until granted (FIFO); ``0`` only if free
          now (:class:`~ringlock.LockBusy` otherwise); else seconds, after which
          :class:`~ringlock.LockTimeout`. The server decides the timeout, so a
          grant never races the client's timer.
        * ``ttl`` — seconds: a **lease**, freed by the server when ``ttl``
          passes without an extend. With ``keep_alive`` (default) the reader
          thread extends it every ``ttl/3``; with ``keep_alive=False`` call
          :meth:`Lease.extend` yourself. Without ``ttl``: a **session hold**,
          freed the moment this session ends, or with ``persistent=True`` a
          Locking-Center hold (freed only by a release or a reset).
        * ``cancel`` — a :class:`CancelToken` that withdraws the wait exactly.
        * ``on_lost(lease, info)`` — runs on the callback thread when the lock is lost.
        * ``access`` — :data:`~ringlock.EXCLUSIVE` (default),
          :data:`~ringlock.SHARED` (``"shared"``) or
          :func:`~ringlock.semaphore` ``(n)`` (see :class:`Access`; any hold
          mode). A shared or semaphore acquire raises
          :class:`~ringlock.ModesUnsupported`, sending nothing, when the
          server does not offer modes (:attr:`modes`), and a semaphore of
          another ``n`` than the key's raises :class:`~ringlock.ModeMismatch`.
        """
        return self._acquire(key, timeout=timeout, ttl=ttl, persistent=persistent,
                             cancel=cancel, on_lost=on_lost, keep_alive=keep_alive,
                             access=access, source=self._source)

    def _acquire(self, key: Key, *, timeout: Optional[float], ttl: Optional[float],
                 persistent: bool, cancel: Optional[CancelToken],
                 on_lost: Optional[LostCallback], keep_alive: bool,
                 access: Union[Access, str], source: bytes) -> Lease:
        """:meth:`acquire` with the Acquire's source (the session's
        ``source=``, or an election's value for that request only)."""
        kb, given = _key_arg(key)
        acc = _access_arg(access)
        if ttl is not None and persistent:
            raise InvalidArgument("a hold is a lease (ttl) or persistent, not both")
        if ttl is not None:
            if not isinstance(ttl, (int, float)) or math.isnan(ttl):
                raise InvalidArgument(f"ttl must be a number of seconds, got {ttl!r}")
            ttl_ms = int(ttl * 1000) if ttl < 4.3e6 else 0xFFFFFFFF
            lo, hi = self._w.min_ttl_ms, self._w.max_ttl_ms
            if ttl_ms <= 0 or not lo <= ttl_ms <= hi:
                raise InvalidArgument(f"a lease TTL must be within {lo / 1000}..{hi / 1000} s "
                                      f"(this server's bounds), got {ttl}")
            mode = HoldMode.LEASE
        else:
            ttl_ms = 0
            mode = HoldMode.PERSISTENT if persistent else HoldMode.SESSION
        if timeout is None:
            wait_ms = codec.WAIT_FOREVER
        elif not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
            raise InvalidArgument(f"timeout must be None or seconds >= 0, got {timeout!r}")
        elif timeout == 0:
            wait_ms = 0
        else:
            wait_ms = int(min(max(1, math.ceil(timeout * 1000)), codec.WAIT_FOREVER - 1))
        if cancel is not None and cancel.cancelled:
            raise Cancelled("cancelled before it was sent", "cancelled")

        p = _Pending("acquire", 0.0)
        p.key, p.ukey, p.mode, p.ttl_ms = kb, given, mode, ttl_ms
        p.on_lost, p.keep_alive, p.access = on_lost, keep_alive, acc
        rid = self._send(p, lambda r: codec.encode_acquire(r, mode, ttl_ms, wait_ms, kb,
                                                           source, acc._byte, acc.slots))
        unsubscribe: Callable[[], None] = lambda: None
        if cancel is not None and wait_ms != 0:  # a try never queues: nothing to cancel
            unsubscribe = cancel._subscribe(lambda: self._send_cancel(rid, p))
        try:
            try:
                p.event.wait()
            except BaseException:
                # Interrupted (KeyboardInterrupt, ...): withdraw exactly, then
                # let go of a grant that beat the Cancel, then re-raise.
                self._send_cancel(rid, p)
                if p.event.wait(self._release_timeout) and p.lease is not None:
                    try:
                        p.lease.release()
                    except RingLockError:
                        pass
                raise
        finally:
            unsubscribe()
            with self._lock:
                self._pending.pop(rid, None)
        reply, lease = p.reply, p.lease
        if p.error is not None:
            raise p.error
        if reply is None:
            with self._lock:
                dead = self._dead
            why = f"{dead[0].value}: {dead[1]}" if dead else "no answer"
            raise self._ended(f"the session ended before the acquire was answered ({why}); "
                              f"{_after_the_session(mode)}")
        st = reply.status
        if st == Status.OK:
            assert lease is not None
            if p.cancel_sent:
                # The grant beat the Cancel: a cancelled caller never holds the key.
                try:
                    lease.release()
                except LockLost:
                    pass
                raise Cancelled("cancelled (a grant that raced the cancel was released)",
                                "cancelled")
            info = lease.lost_info
            if info is not None:
                lease.release_quietly()
                raise LockLost(f"the grant was lost before it could be handed out: {info}",
                               info=info)
            if mode == HoldMode.LEASE and lease._expires_at is None:
                # Granted after a wait that used up most of sent + TTL: one
                # Extend gives this side an expiry it can count from.
                try:
                    lease.extend()
                except BaseException:
                    lease.release_quietly()
                    raise
            return lease
        if st == Status.TIMED_OUT:
            raise LockTimeout(f"{given!r} was not granted within {timeout} s", st.label)
        if st == Status.BUSY:
            raise LockBusy(f"{given!r} is held", st.label)
        if st == Status.CANCELLED:
            raise Cancelled(f"the acquire of {given!r} was cancelled", st.label)
        if st == Status.LIMIT_REACHED:
            raise LimitReached("the server's --max-keys or --max-waiters refused it", st.label)
        if st == Status.MODE_MISMATCH:
            raise ModeMismatch(f"the acquire of {given!r} as a semaphore of {acc.slots} was "
                               f"answered mode_mismatch: the key is a semaphore of another "
                               f"slot count (fixed while any semaphore request holds or waits "
                               f"on it); nothing changed", given, acc.slots)
        if st == Status.INVALID:
            raise InvalidArgument(f"the server answered invalid to the acquire of {given!r}",
                                  st.label)
        if st == Status.SERVER_ERROR:
            raise ServerError("the server answered server_error (nothing was granted)", st.label)
        raise ProtocolError(f"the server answered {st.label} to an acquire", st.label)

    def lock(self, key: Key, *, timeout: Optional[float] = None, ttl: Optional[float] = None,
             persistent: bool = False, cancel: Optional[CancelToken] = None,
             on_lost: Optional[LostCallback] = None, keep_alive: bool = True,
             access: Union[Access, str] = EXCLUSIVE) -> Lease:
        """:meth:`acquire` under the name a ``with`` statement reads well with:
        ``with client.lock("k", ttl=30) as lease: ...``."""
        return self.acquire(key, timeout=timeout, ttl=ttl, persistent=persistent,
                            cancel=cancel, on_lost=on_lost, keep_alive=keep_alive,
                            access=access)

    def try_lock(self, key: Key, *, ttl: Optional[float] = None, persistent: bool = False,
                 on_lost: Optional[LostCallback] = None, keep_alive: bool = True,
                 access: Union[Access, str] = EXCLUSIVE) -> Optional[Lease]:
        """The lock only if it is free right now; ``None`` when it is held."""
        try:
            return self.acquire(key, timeout=0, ttl=ttl, persistent=persistent,
                                on_lost=on_lost, keep_alive=keep_alive, access=access)
        except LockBusy:
            return None

    def lock_shared(self, key: Key, *, timeout: Optional[float] = None,
                    ttl: Optional[float] = None, persistent: bool = False,
                    cancel: Optional[CancelToken] = None,
                    on_lost: Optional[LostCallback] = None, keep_alive: bool = True) -> Lease:
        """A shared hold (a reader lock): :meth:`acquire` with
        ``access=ringlock.SHARED``. Granted together with the other shared
        holders, never while an exclusive request holds or waits before it."""
        return self.acquire(key, timeout=timeout, ttl=ttl, persistent=persistent,
                            cancel=cancel, on_lost=on_lost, keep_alive=keep_alive,
                            access=SHARED)

    def try_lock_shared(self, key: Key, *, ttl: Optional[float] = None,
                        persistent: bool = False, on_lost: Optional[LostCallback] = None,
                        keep_alive: bool = True) -> Optional[Lease]:
        """A shared hold only if one is granted right now; ``None`` when the
        key is held exclusively or an exclusive request waits on it."""
        return self.try_lock(key, ttl=ttl, persistent=persistent, on_lost=on_lost,
                             keep_alive=keep_alive, access=SHARED)

    def permit(self, key: Key, slots: int, *, timeout: Optional[float] = None,
               ttl: Optional[float] = None, persistent: bool = False,
               cancel: Optional[CancelToken] = None, on_lost: Optional[LostCallback] = None,
               keep_alive: bool = True) -> Lease:
        """One permit of the semaphore ``key`` of ``slots`` holders (>= 1):
        :meth:`acquire` with ``access=ringlock.semaphore(slots)``. Raises
        :class:`~ringlock.ModeMismatch` when the key is a semaphore of
        another size."""
        return self.acquire(key, timeout=timeout, ttl=ttl, persistent=persistent,
                            cancel=cancel, on_lost=on_lost, keep_alive=keep_alive,
                            access=semaphore(slots))

    def try_permit(self, key: Key, slots: int, *, ttl: Optional[float] = None,
                   persistent: bool = False, on_lost: Optional[LostCallback] = None,
                   keep_alive: bool = True) -> Optional[Lease]:
        """A permit only if one is free right now; ``None`` when all
        ``slots`` are held (or a request of another access waits first)."""
        return self.try_lock(key, ttl=ttl, persistent=persistent, on_lost=on_lost,
                             keep_alive=keep_alive, access=semaphore(slots))

    # --- watching ----------------------------------------------------------------
    def watch(self, key: Key) -> Watch:
        """Watches ``key`` (str as UTF-8, or bytes; 1..127 bytes): returns a
        :class:`Watch` whose :attr:`~Watch.holders` are the key's holders
        now, and whose :meth:`~Watch.next` hands out every later grant and
        release of it, in order. A watch holds nothing and delays nobody.

        Raises :class:`~ringlock.WatchUnsupported`, sending nothing, when
        the server does not offer watches (:attr:`watches`);
        :class:`~ringlock.LimitReached` when the server has
        ``--max-waiters`` watches on the key's shard;
        :class:`~ringlock.InvalidArgument` for a bad key;
        :class:`~ringlock.WatchEnded` when the connection failed or the
        session ended before the watch began (watch again: a new client
        after the session ended).

        A watch lasts as long as the session's connection. When it ends
        (:class:`~ringlock.WatchEnded` from :meth:`~Watch.next`), watching
        again is a re-read: the new watch lists the holders as they are
        then; the changes in between are not replayed.
        """
        kb, given = _key_arg(key)
        w = Watch(self, kb, given)
        p = _Pending("watch", 0.0)
        p.watch = w
        rid = self._send(p, lambda r: codec.encode_watch(r, kb))
        try:
            p.event.wait()
        except BaseException:
            # Interrupted: the watch is abandoned; an Unwatch ends it on the
            # server if it began (its rid stays reserved, its events dropped).
            with self._lock:
                p.kind = "ignore"
                w._state = "closing"
                sock = self._current_sock() if self._dead is None else None
                q = _Pending("ignore", time.monotonic())
                r = self._alloc_rid()
                q.frame = codec.encode_unwatch(r, rid, kb)
                if sock is not None:
                    self._pending[r] = q
            try:
                self._write(sock, q.frame)
            except Unavailable:
                pass
            raise
        finally:
            with self._lock:
                if self._pending.get(rid) is p:
                    del self._pending[rid]
        if p.error is not None:
            raise p.error
        rep = p.reply
        if rep is None:
            with self._lock:
                end = w._end
                dead = self._dead
            if end is not None:
                raise end
            why = f"{dead[0].value}: {dead[1]}" if dead else "no answer"
            raise self._ended(f"the session ended before the watch of {given!r} began ({why})")
        self._status(rep, f"watch of {given!r}")
        return w

    def _unwatch(self, w: Watch) -> None:
        """:meth:`Watch.close`: Unwatch, then the watch is over."""
        with self._lock:
            if w._state != "open":
                return
            w._state = "closing"
            w._events.clear()
        try:
            self._call(lambda r: codec.encode_unwatch(r, w._rid, w._key))
        except Unavailable:
            pass  # the session ended: so did the watch (_die)
        # ok, or not_queued (the server has no such watch): either way over.
        with self._lock:
            w._finish("closed", "Watch.close() ended it")
            if self._watches.get(w._rid) is w:
                del self._watches[w._rid]

    # --- elections ------------------------------------------------------------------
    def election(self, name: Key) -> "Election":
        """The election named ``name`` (str as UTF-8, or bytes; 1..127 bytes:
        a key of the server's, used for nothing else) on this session's
        server: :meth:`Election.campaign <ringlock.Election.campaign>` to
        lead, :meth:`~ringlock.Election.leader` and
        :meth:`~ringlock.Election.observe` to follow who leads
        (``docs/protocol.md``, "Elections"). Raises
        :class:`~ringlock.InvalidArgument` for a bad name."""
        from ._election import Election

        kb, given = _key_arg(name)
        return Election(self, kb, given)

    def _proclaim(self, lease: Lease, value: bytes) -> None:
        """:meth:`Leadership.proclaim <ringlock.Leadership.proclaim>`: one
        Proclaim of ``lease``'s token with ``value``, waited for up to the
        release timeout."""
        name = lease._ukey

        def lost(why: str, info: Optional[LostInfo]) -> LockLost:
            return LockLost(f"leadership lost in election {name!r} (token {lease._token}): "
                            f"{why}", info=info)

        p = _Pending("call", 0.0)
        p.proclaim = name
        try:
            rid = self._send(p, lambda r: codec.encode_proclaim(r, lease._token, lease._key,
                                                                value))
        except Unavailable as e:
            raise lost(f"the session ended before the proclaim: {e}", lease.lost_info) from None
        got = p.event.wait(self._release_timeout)
        with self._lock:
            if not got:
                q = self._pending.get(rid)
                if q is not None:
                    q.kind = "ignore"
            else:
                self._pending.pop(rid, None)
            dead = self._dead
        if p.error is not None:
            raise p.error
        rep = p.reply
        if rep is None:
            if not got:
                raise ReleaseFailed(f"the proclaim in election {name!r} was not answered within "
                                    f"{self._release_timeout} s; the value may or may not have "
                                    f"changed")
            why = f"{dead[0].value}: {dead[1]}" if dead else "no answer"
            raise lost(f"the session ended before the proclaim was answered ({why})",
                       lease.lost_info)
        st = rep.status
        if st == Status.OK:
            return
        if st in (Status.STALE_TOKEN, Status.NOT_OWNER):
            info = LostInfo(lease._ukey, lease._token, LostReason.NOT_HELD,
                            f"the proclaim was answered {st.label}", True)
            with self._lock:
                claimed = self._claim_loss(lease, info)
            if claimed:
                self._notify(lease, info)
            cls = StaleToken if st == Status.STALE_TOKEN else NotOwner
            raise cls(f"leadership lost in election {name!r}: the proclaim of token "
                      f"{lease._token} was answered {st.label} (it no longer leads); nothing "
                      f"changed", st.label, lease.lost_info or info)
        if st == Status.LIMIT_REACHED:
            raise LimitReached(f"the proclaim in election {name!r} was answered limit_reached "
                               f"(the server's names, --max-keys + --max-waiters, are full); "
                               f"nothing changed", st.label)
        self._status(rep, f"proclaim in election {name!r}")

    # --- by token (holds this client has no Lease for) ------------------------
    def release(self, key: Key, token: int) -> None:
        """Releases ``key`` naming ``token`` (a lease or persistent hold may be
        released by any session that names its token). Raises
        :class:`~ringlock.StaleToken` / :class:`~ringlock.NotOwner`; nothing
        changes then."""
        kb = _key_bytes(key)
        self._status(self._call(lambda r: codec.encode_release(r, token, kb)), "release")

    def extend(self, key: Key, token: int, ttl: float) -> Optional[float]:
        """Sets the TTL left of the lease ``key``/``token`` to ``ttl`` seconds.
        Returns the TTL left the server answered (seconds)."""
        kb = _key_bytes(key)
        ttl_ms = int(ttl * 1000)
        rep = self._status(self._call(lambda r: codec.encode_extend(r, token, ttl_ms, kb)),
                           "extend")
        return None if rep.ttl_left_ms is None else rep.ttl_left_ms / 1000.0

    def ping(self) -> float:
        """One Ping round trip; returns its time in seconds."""
        t0 = time.monotonic()
        self._status(self._call(codec.encode_ping), "ping")
        return time.monotonic() - t0

    def close(self) -> None:
        """Ends the session now: the server frees its session holds at once.
        Every lock of it that is not being released is lost (callbacks run,
        reason ``session_ended``). Idempotent."""
        self._die(LostReason.SESSION_ENDED, "Client.close() ended the session")
        if threading.current_thread() is not self._reader:
            self._reader.join(self._release_timeout)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Client(server={self._server[0]}:{self._server[1]}, "
                f"session_id={self._w.session_id}, ended={self._dead is not None})")

    # --- internals: requests ---------------------------------------------------
    def _alloc_rid(self) -> int:
        while True:
            rid = self._next_rid
            self._next_rid = (rid + 1) & 0xFFFFFFFF
            if rid != _PING_RID and rid not in self._pending and rid not in self._watches:
                return rid

    def _ended(self, message: str) -> Unavailable:
        """The error for a request the ended session cannot serve: a
        :class:`~ringlock.NotLeader` naming the leader when a ``not_leader``
        answer ended it."""
        if self._not_leader:
            return NotLeader(message, self._leader)
        return Unavailable(message)

    def _write(self, sock: "Optional[_Conn]", frame: bytes) -> None:
        """Writes ``frame`` on ``sock``, the connection that was current when
        its request was registered (``None`` while resuming: the resume
        sends it). A failed write of a resumable session fails the
        connection (the reader resumes, the request stays pending); of any
        other session it ends the session."""
        if sock is None:
            return
        try:
            with self._wlock:
                sock.sendall(frame)
        except OSError as e:
            if self.resumable:
                self._fail_connection(sock)
                return
            self._die(LostReason.SESSION_ENDED, f"sending a request failed: {e}")
            raise Unavailable(f"the session has ended: sending failed: {e}") from None

    @staticmethod
    def _fail_connection(sock: "_Conn") -> None:
        """Shuts ``sock`` down: the reader sees the failure and resumes."""
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _current_sock(self) -> "Optional[_Conn]":
        """The connection to write on (caller holds ``_lock``)."""
        return None if self._resuming else self._sock

    def _send(self, p: _Pending, encode: Callable[[int], bytes]) -> int:
        with self._lock:
            if self._dead is not None:
                raise self._ended(f"the session has ended ({self._dead[0].value}: "
                                  f"{self._dead[1]})")
            if p.access is not None and not p.access.exclusive \
                    and not self._w.flags & codec.FLAG_MODES:
                # Checked under the lock a resume swaps the welcome under.
                raise self._modes_unsupported(p)
            if p.watch is not None and not self._w.flags & codec.FLAG_WATCHES:
                raise self._watch_unsupported(p.watch)
            if p.proclaim is not None and not self._w.flags & codec.FLAG_PROCLAIM:
                raise self._proclaim_unsupported(p.proclaim)
            rid = self._alloc_rid()
            p.frame = encode(rid)
            p.sent_at = time.monotonic()
            self._pending[rid] = p
            if p.watch is not None:
                p.watch._rid = rid
                self._watches[rid] = p.watch
            sock = self._current_sock()
        try:
            self._write(sock, p.frame)
        except Unavailable:
            with self._lock:
                self._pending.pop(rid, None)
                self._watches.pop(rid, None)
            raise
        return rid

    def _watch_unsupported(self, w: Watch, addr: Optional[Tuple[str, int]] = None
                           ) -> WatchUnsupported:
        """The error of a watch on a session whose server (``addr``, default
        the current one) does not offer watches (caller holds ``_lock``)."""
        host, port = self._server if addr is None else addr
        return WatchUnsupported(
            f"cannot watch {w._ukey!r}: the server at {host}:{port} does not offer watches "
            f"(its welcome lacks the watches flag: a ringlockd older than watches); nothing "
            f"was sent", w._ukey)

    def _proclaim_unsupported(self, name: Key, addr: Optional[Tuple[str, int]] = None
                              ) -> ProclaimUnsupported:
        """The error of a proclaim on a session whose server (``addr``,
        default the current one) does not offer it (caller holds ``_lock``)."""
        host, port = self._server if addr is None else addr
        return ProclaimUnsupported(
            f"cannot proclaim in election {name!r}: the server at {host}:{port} does not offer "
            f"proclaim (its welcome lacks the proclaim flag: a ringlockd older than proclaim); "
            f"nothing was sent", name)

    def _modes_unsupported(self, p: _Pending, addr: Optional[Tuple[str, int]] = None
                           ) -> ModesUnsupported:
        """The error of a shared or semaphore acquire on a session whose
        server (``addr``, default the current one) does not offer modes
        (caller holds ``_lock``)."""
        host, port = self._server if addr is None else addr
        where = f"{host}:{port}"
        return ModesUnsupported(
            f"cannot acquire {p.ukey!r} as {p.access}: the server at {where} does not offer "
            f"lock modes (its welcome lacks the modes flag: a ringlockd older than lock "
            f"modes); nothing was sent (an exclusive acquire works)",
            p.ukey, p.access)

    def _send_cancel(self, target: int, p: _Pending) -> None:
        with self._lock:
            if p.event.is_set() or p.cancel_sent or self._dead is not None:
                return
            p.cancel_sent = True
            rid = self._alloc_rid()
            q = _Pending("ignore", time.monotonic())
            q.frame = codec.encode_cancel(rid, target, p.key)
            self._pending[rid] = q
            sock = self._current_sock()
        try:
            self._write(sock, q.frame)
        except Unavailable:
            pass  # the session's end answers the acquire

    def _call(self, encode: Callable[[int], bytes], timeout: Optional[float] = None
              ) -> codec.Reply:
        p = _Pending("call", 0.0)
        rid = self._send(p, encode)
        got = p.event.wait(self._release_timeout if timeout is None else timeout)
        with self._lock:
            if not got:
                q = self._pending.get(rid)
                if q is not None:
                    q.kind = "ignore"
            else:
                self._pending.pop(rid, None)
            dead = self._dead
        if p.reply is None:
            if not got:
                raise ReleaseFailed(f"no answer within {self._release_timeout} s")
            why = f"{dead[0].value}: {dead[1]}" if dead else "no answer"
            raise self._ended(f"the session ended before the answer ({why})")
        return p.reply

    @staticmethod
    def _status(rep: codec.Reply, what: str) -> codec.Reply:
        st = rep.status
        if st == Status.OK:
            return rep
        msg = f"the server answered {st.label} to the {what}"
        if st == Status.STALE_TOKEN:
            raise StaleToken(msg + ": the token is not the key's current one; nothing changed",
                             st.label)
        if st == Status.NOT_OWNER:
            raise NotOwner(msg + ": a session hold of another session; nothing changed",
                           st.label)
        if st == Status.INVALID:
            raise InvalidArgument(msg, st.label)
        if st == Status.LIMIT_REACHED:
            raise LimitReached(msg, st.label)
        if st == Status.SERVER_ERROR:
            raise ServerError(msg, st.label)
        raise ProtocolError(msg, st.label)

    # --- internals: lease state ------------------------------------------------
    def _claim_loss(self, lease: Lease, info: LostInfo) -> bool:
        """The one verdict (caller holds ``_lock``): lost, unless a release
        began first. The first verdict stands: ``lost_info`` is never
        replaced, so it is the info every callback of this loss gets."""
        if lease._state != "held":
            return False
        lease._state = "lost"
        lease._lost_confirmed = info.from_server
        lease._lost_info = info
        lease._lost_event.set()
        return True

    def _notify(self, lease: Lease, info: LostInfo) -> None:
        if self._on_lost is not None:
            self._callbacks.put((self._on_lost, lease, info))
        if lease._on_lost is not None:
            self._callbacks.put((lease._on_lost, lease, info))

    def _check_keepalive(self) -> None:
        """Declares the session lost if no request sent within the detection
        window was answered: right after a pause (SIGSTOP, a VM freeze), before
        the reader thread has run again."""
        with self._lock:
            if self._dead is not None or self._resuming:
                return  # a resume decides (within the keep-alive)
            overdue = time.monotonic() > self._confirmed_at + self._interval + self._ping_timeout
        if overdue:
            self._die(LostReason.KEEPALIVE_TIMEOUT,
                      f"nothing the server answered was sent within the last "
                      f"{self._interval + self._ping_timeout:.3f} s (keep-alive "
                      f"{self._w.keepalive} s): the session may have ended on the server")

    def _evaluate(self, lease: Lease) -> None:
        """Brings ``lease``'s state up to date with the client-side deadlines."""
        self._check_keepalive()
        now = time.monotonic()
        notify = None
        with self._lock:
            if lease._state == "held" and lease._expires_at is not None \
                    and now >= lease._expires_at:
                info = LostInfo(lease._ukey, lease._token, LostReason.EXPIRED,
                                "its TTL passed on this client's clock without an extend",
                                False)
                if self._claim_loss(lease, info):
                    notify = info
        if notify is not None:
            self._notify(lease, notify)

    def _extend_lease(self, lease: Lease, ttl: Optional[float]) -> None:
        lease.check()
        if lease._mode != HoldMode.LEASE:
            if ttl is not None:
                raise InvalidArgument("only a lease has a TTL to extend")
            self.ping()
            lease.check()
            return
        ttl_ms = lease._ttl_ms if ttl is None else int(ttl * 1000)
        lo, hi = self._w.min_ttl_ms, self._w.max_ttl_ms
        if not lo <= ttl_ms <= hi:
            raise InvalidArgument(f"a lease TTL must be within {lo / 1000}..{hi / 1000} s")
        p = _Pending("call", 0.0)
        try:
            rid = self._send(p, lambda r: codec.encode_extend(r, lease._token, ttl_ms,
                                                              lease._key))
        except Unavailable:
            lease.check()
            raise
        got = p.event.wait(self._release_timeout)
        with self._lock:
            self._pending.pop(rid, None)
        rep = p.reply
        if rep is None:
            lease.check()
            raise ReleaseFailed("the extend was not answered" if not got else
                                "the session ended before the extend was answered")
        if rep.status == Status.OK:
            with self._lock:
                if lease._state == "held":
                    lease._expires_at = p.sent_at + ttl_ms / 1000.0
                    if lease._keep_alive:
                        lease._next_extend = p.sent_at + ttl_ms / 3000.0
                    lease._ttl_ms = ttl_ms
            self._wake()
            lease.check()
            return
        if rep.status in (Status.STALE_TOKEN, Status.NOT_OWNER):
            info = LostInfo(lease._ukey, lease._token, LostReason.NOT_HELD,
                            f"the extend was answered {rep.status.label}", True)
            with self._lock:
                claimed = self._claim_loss(lease, info)
            if claimed:
                self._notify(lease, info)
            cls = StaleToken if rep.status == Status.STALE_TOKEN else NotOwner
            raise cls(str(info), rep.status.label, info)
        self._status(rep, "extend")

    def _release_lease(self, lease: Lease) -> None:
        with self._lock:
            self._holds.pop((lease._key, lease._token), None)
            info = lease._lost_info
            confirmed = lease._lost_confirmed
            dead = self._dead
        if info is not None and (info.from_server or confirmed or dead is not None):
            raise LockLost(f"released after it was lost: {info}", info=info)
        if dead is not None:
            if lease._mode == HoldMode.SESSION:
                return  # the server frees a session hold with its session
            raise ReleaseFailed(f"the session ended before the release could be sent "
                                f"({dead[0].value}: {dead[1]}); {_after_the_session(lease._mode)}")
        try:
            rep = self._call(lambda r: codec.encode_release(r, lease._token, lease._key))
        except Unavailable as e:
            if info is not None:
                raise LockLost(f"released after it was lost: {info}", info=info) from None
            if lease._mode == HoldMode.SESSION:
                return
            raise ReleaseFailed(f"{e}; {_after_the_session(lease._mode)}") from None
        if info is not None:
            raise LockLost(f"released after it was lost: {info}", info=info)
        if rep.status == Status.OK:
            return
        if rep.status in (Status.STALE_TOKEN, Status.NOT_OWNER):
            info = LostInfo(lease._ukey, lease._token, LostReason.NOT_HELD,
                            f"the release was answered {rep.status.label}", True)
            with self._lock:
                lease._lost_info = info
                lease._state = "lost"
                lease._lost_event.set()
            cls = StaleToken if rep.status == Status.STALE_TOKEN else NotOwner
            raise cls(str(info), rep.status.label, info)
        raise ReleaseFailed(f"the server answered {rep.status.label} to the release",
                            rep.status.label)

    # --- internals: the reader thread ----------------------------------------
    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # full (a wake-up is pending anyway) or closed

    def _run_reader(self) -> None:
        try:
            while True:
                reason, detail, conn_failed = self._serve()
                if not (conn_failed and self.resumable):
                    break
                end = self._resume(detail)
                if end is None:
                    continue  # resumed: serve the new connection
                reason, detail = end
                break
        except BaseException as e:  # never let the session hang on a bug
            reason, detail = LostReason.SESSION_ENDED, f"internal error in the reader: {e!r}"
            log.exception("ringlock reader thread failed")
        self._die(reason, detail)

    def _serve(self) -> Tuple[LostReason, str, bool]:
        """Serves the current connection until it ends: why, and whether it
        was the connection that failed (a resumable session then resumes)."""
        buf = bytearray()
        next_ping = time.monotonic() + self._interval
        ping_due: Optional[float] = None  # due time of the outstanding Ping
        ping_sent = 0.0
        while True:
            with self._lock:
                if self._dead is not None:
                    return self._dead[0], self._dead[1], False
                wake_at = ping_due + self._ping_timeout if ping_due is not None else next_ping
                for lease in self._holds.values():
                    if lease._state != "held":
                        continue
                    if lease._expires_at is not None:
                        wake_at = min(wake_at, lease._expires_at)
                    if lease._next_extend is not None and not lease._extend_in_flight:
                        wake_at = min(wake_at, lease._next_extend)
            try:
                r, _, _ = select.select([self._sock, self._wake_r], [], [],
                                        max(0.0, wake_at - time.monotonic()))
            except (OSError, ValueError) as e:
                return LostReason.SESSION_ENDED, f"select failed: {e}", False
            if self._wake_r in r:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except OSError:
                    pass
            if self._sock in r:
                try:
                    data = self._sock.recv(65536)
                except socket.timeout:
                    data = None
                except OSError as e:
                    return LostReason.SESSION_ENDED, f"the connection failed: {e}", True
                if data == b"":
                    return LostReason.SESSION_ENDED, "the server closed the connection", True
                if data:
                    buf += data
                    at = 0
                    while True:
                        try:
                            got = codec.decode_answer(memoryview(buf)[at:])
                        except codec.ProtocolError as e:
                            return (LostReason.SESSION_ENDED,
                                    f"the server broke the protocol: {e}", False)
                        if got is None:
                            break
                        ans, used = got
                        at += used
                        self._last_rx = time.monotonic()
                        if isinstance(ans, codec.Reply) and ans.rid == _PING_RID:
                            if ping_due is not None:
                                ping_due = None
                                with self._lock:
                                    self._confirmed_at = max(self._confirmed_at, ping_sent)
                                if ans.status != Status.OK:
                                    return (LostReason.KEEPALIVE_TIMEOUT,
                                            f"the server answered a ping {ans.status.label}",
                                            False)
                            continue
                        end = self._dispatch(ans)
                        if end is not None:
                            return end
                    del buf[:at]
            now = time.monotonic()
            # The keep-alive. Its deadline counts from when the Ping was due,
            # so a late wake-up shortens the wait, never stretches it.
            if ping_due is not None and now >= ping_due + self._ping_timeout:
                return (LostReason.KEEPALIVE_TIMEOUT,
                        f"no answer to a ping within {self._ping_timeout:.3f} s (keep-alive "
                        f"{self._w.keepalive} s): the connection hangs", True)
            if ping_due is None and now >= next_ping:
                ping_due = next_ping
                next_ping = max(next_ping + self._interval, now)
                ping_sent = time.monotonic()
                try:
                    with self._wlock:
                        self._sock.sendall(codec.encode_ping(_PING_RID))
                except OSError as e:
                    return LostReason.SESSION_ENDED, f"sending a ping failed: {e}", True
            self._timers(time.monotonic())

    def _timers(self, now: float) -> None:
        """Client-side lease expiry, then background extends."""
        lost: List[Tuple[Lease, LostInfo]] = []
        extends: List[Tuple[int, bytes, _Pending]] = []
        with self._lock:
            for lease in self._holds.values():
                if lease._state != "held":
                    continue
                if lease._expires_at is not None and now >= lease._expires_at:
                    info = LostInfo(lease._ukey, lease._token, LostReason.EXPIRED,
                                    "its TTL passed on this client's clock without an extend",
                                    False)
                    if self._claim_loss(lease, info):
                        lost.append((lease, info))
                    continue
                if lease._next_extend is not None and not lease._extend_in_flight \
                        and now >= lease._next_extend:
                    lease._extend_in_flight = True
                    p = _Pending("extend", now)
                    p.target = lease
                    rid = self._alloc_rid()
                    self._pending[rid] = p
                    p.frame = codec.encode_extend(rid, lease._token, lease._ttl_ms, lease._key)
                    extends.append(p)
            sock = self._current_sock()
        for lease, info in lost:
            self._notify(lease, info)
        for p in extends:
            p.sent_at = time.monotonic()
            try:
                self._write(sock, p.frame)
            except Unavailable:
                return

    def _dispatch(self, ans: codec.Answer) -> Optional[Tuple[LostReason, str, bool]]:
        if isinstance(ans, codec.Welcome):
            return (LostReason.SESSION_ENDED, "the server broke the protocol: a second hello reply",
                    False)
        if isinstance(ans, codec.Held):
            return (LostReason.SESSION_ENDED, "the server broke the protocol: a held frame on an "
                    "open session", False)
        if isinstance(ans, codec.Lost):
            self._on_push(ans)
            return None
        if isinstance(ans, codec.Event):
            self._on_event(ans)
            return None
        if isinstance(ans, codec.OtherEvent):
            return None  # a kind of a later server: skipped (docs/protocol.md)
        if isinstance(ans, codec.Refused):
            if ans.status == Status.NOT_LEADER:
                # A replicated server that lost its leadership: this session
                # cannot go on here (the server closes). Its locks are lost;
                # a new Client tries the leader named.
                with self._lock:
                    self._not_leader = True
                    self._leader = ans.leader
                where = f"{self._server[0]}:{self._server[1]}"
                return (LostReason.SESSION_ENDED,
                        f"{where} answered not_leader: "
                        + (f"the leader is {ans.leader}" if ans.leader else "it named no leader"),
                        True)
            return (LostReason.SESSION_ENDED,
                    f"the server broke the protocol: {ans.status.label} on an open session", False)
        notify: Optional[Tuple[Lease, LostInfo]] = None
        with self._lock:
            p = self._pending.get(ans.rid)
            if p is None:
                return None  # an answer nobody waits for any more
            self._confirmed_at = max(self._confirmed_at, p.sent_at)
            if p.kind == "ignore":
                del self._pending[ans.rid]
                return None
            if p.kind == "extend":
                del self._pending[ans.rid]
                lease = p.target
                assert lease is not None
                lease._extend_in_flight = False
                if ans.status == Status.OK:
                    if lease._state == "held":
                        lease._expires_at = p.sent_at + lease._ttl_ms / 1000.0
                        lease._next_extend = p.sent_at + lease._ttl_ms / 3000.0
                elif ans.status in (Status.STALE_TOKEN, Status.NOT_OWNER):
                    info = LostInfo(lease._ukey, lease._token, LostReason.NOT_HELD,
                                    f"a background extend was answered {ans.status.label}", True)
                    if self._claim_loss(lease, info):
                        notify = (lease, info)
                else:
                    # Retry soon; the client-side expiry still bounds it.
                    lease._next_extend = time.monotonic() + lease._ttl_ms / 10000.0
            else:
                if p.kind == "acquire" and ans.status == Status.OK:
                    self._grant(p, ans.token)
                w = p.watch
                if w is not None:
                    if ans.status == Status.OK and w._state == "starting":
                        w._state = "open"
                    elif ans.status != Status.OK:
                        w._state = "ended"
                        if self._watches.get(ans.rid) is w:
                            del self._watches[ans.rid]
                p.reply = ans
                p.event.set()
        if notify is not None:
            self._notify(*notify)
        return None

    def _grant(self, p: _Pending, token: int, left: Optional[Tuple[float, int]] = None) -> None:
        """Registers the Lease of a granted acquire (caller holds ``_lock``).
        ``left``: (a time before the server measured it, its TTL left in ms),
        for a grant a resume's Held list reported."""
        lease = Lease(self, p.key, token, p.mode, p.ttl_ms, p.sent_at, p.on_lost, p.keep_alive,
                      p.ukey, p.access)
        if p.mode == HoldMode.LEASE and left is not None:
            lease._expires_at = left[0] + left[1] / 1000.0
            if lease._keep_alive:
                lease._next_extend = left[0] + min(left[1], p.ttl_ms / 3.0) / 1000.0
        if p.mode == HoldMode.LEASE and lease._expires_at is not None \
                and lease._expires_at - time.monotonic() < p.ttl_ms / 2000.0:
            # Granted after a long wait: the caller extends before
            # handing it out; until then no client-side expiry.
            lease._expires_at = None
            lease._next_extend = None
        # Registered before any later push is read, so a Lost
        # right behind the grant is never missed.
        self._holds[(p.key, token)] = lease
        p.lease = lease

    def _on_push(self, push: codec.Lost) -> None:
        reason = LostReason.EXPIRED if push.why == codec.LostWhy.EXPIRED else LostReason.RESET
        with self._lock:
            lease = self._holds.get((push.key, push.token))
            if lease is None:
                return
            info = LostInfo(lease._ukey, push.token, reason,
                            f"the server pushed Lost ({push.why.name.lower()})", True)
            claimed = self._claim_loss(lease, info)
            if not claimed and lease._state == "lost":
                # Seen on this side first (its clock); now the server
                # confirms it: a release then sends nothing. The verdict
                # (lost_info, what the callbacks got) stays as decided.
                lease._lost_confirmed = True
        if claimed:
            self._notify(lease, info)

    def _on_event(self, ev: codec.Event) -> None:
        """An Event push: a holder listed before the Watch's Reply, or a
        change, queued on its watch in the order it came."""
        with self._lock:
            w = self._watches.get(ev.rid)
            if w is None or w._state not in ("starting", "open"):
                return  # a watch being closed (or abandoned): dropped
            if w._state == "starting" and ev.kind == codec.EventKind.HOLDER:
                w._holders.append(Holder(ev.token, ev.hold.name.lower(),
                                         _access_of(ev.access, ev.slots), ev.slots, ev.source))
                return
            w._events.append(w._event(ev))
            w._cv.notify_all()

    def _end_watches(self, reason: str, detail: str) -> List[_Pending]:
        """Ends every watch (caller holds ``_lock``); a Watch or Unwatch in
        flight is settled (the connection that carried it is gone). Returns
        the requests to wake."""
        for w in self._watches.values():
            w._finish(reason, detail)
        self._watches.clear()
        wake = []
        for rid, p in self._pending.items():
            if p.event.is_set() or not p.frame:
                continue
            if p.frame[0] == codec.OP_WATCH and p.watch is not None:
                p.error = p.watch._end
                wake.append(p)
            elif p.frame[0] == codec.OP_UNWATCH:
                p.reply = codec.Reply(rid, Status.OK, 0, None)
                wake.append(p)
        return wake

    def _die(self, reason: LostReason, detail: str) -> None:
        """The session's end (any thread, idempotent): every held lock is
        lost, every waiter woken, the connection shut down."""
        with self._lock:
            if self._dead is not None:
                return
            self._dead = (reason, detail)
            self._end_watches(reason.value, f"the session ended: {detail}")
            holds = list(self._holds.values())
            self._holds.clear()
            pending = list(self._pending.values())
            lost = []
            for lease in holds:
                info = LostInfo(lease._ukey, lease._token, reason, detail, False)
                if self._claim_loss(lease, info):
                    lost.append((lease, info))
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for p in pending:
            p.event.set()
        for lease, info in lost:
            self._notify(lease, info)
        self._callbacks.put(None)
        self._wake()

    # --- internals: resuming a replicated session -----------------------------
    def _resume(self, why: str) -> Optional[Tuple[LostReason, str]]:
        """The connection of a resumable session failed (reader thread):
        Resume on the addresses while the keep-alive, counted from the last
        frame received, has not passed. ``None`` once resumed, else why the
        session ends."""
        with self._lock:
            if self._dead is not None:
                return self._dead
            self._resuming = True
            # Watches end with the connection: a resumed session has none.
            wake = self._end_watches(
                "connection_lost", f"the session's connection failed ({why}); a resumed "
                f"session carries no watch")
            old = self._sock
            hint: Optional[Tuple[str, int]] = None
            if self._not_leader and self._leader:
                try:
                    hint = _parse_address(self._leader)
                except InvalidArgument:
                    hint = None
        for p in wake:
            p.event.set()
        try:
            old.close()
        except OSError:
            pass
        k = self._w.keepalive
        deadline = self._last_rx + k
        sid = self._w.session_id
        log.warning("ringlock: session %#x: %s; resuming for up to %.3f s", sid, why,
                    max(0.0, deadline - time.monotonic()))

        def sleep(t: float) -> None:
            # A close() wakes it.
            try:
                select.select([self._wake_r], [], [], t)
                while self._wake_r.recv(4096):
                    pass
            except (OSError, ValueError):
                pass

        def attempt(addr: Tuple[str, int], t: float
                    ) -> Tuple["_Conn", codec.Welcome, List[codec.Held], Tuple[str, int],
                               float]:
            if self._dead is not None:
                raise _Gone("the session was closed")
            if time.monotonic() >= deadline:
                raise _Retry("the keep-alive passed")
            return self._resume_one(addr, t)

        refused = None
        if hint is not None and self._leader:
            refused = self._unverified_hint(self._leader, hint,
                                            f"{self._server[0]}:{self._server[1]}",
                                            "the Resume (and the session id it carries)")
            if refused is not None:
                log.warning("ringlock: %s", refused)
                hint = None
        def failed(addr: Tuple[str, int], e: _Retry, attempts: int, delay: float) -> bool:
            # The warning above said it once; each attempt at debug level.
            log.debug("ringlock: session %#x: resume attempt %d failed on %s:%s: %s; next "
                      "attempt in %.3f s", sid, attempts, addr[0], addr[1], e, delay)
            return True

        try:
            sock, w, helds, addr, sent = self._walk(attempt, self._connect_timeout, deadline,
                                                    hint, sleep, 0.5, "resumed", refused,
                                                    failed)
        except (_Gone, Unavailable) as e:
            with self._lock:
                if self._dead is not None:
                    return self._dead
            if isinstance(e, _Gone):
                detail = f"{why}; the resume was refused: {e}"
            elif isinstance(e, (UnverifiedLeader, TLSError, TLSRequired)):
                detail = f"{why}; {e}"
            else:
                detail = f"{why}; no resume succeeded within the keep-alive ({k} s): {e}"
            log.warning("ringlock: session %#x ended: %s", sid, detail)
            return LostReason.SESSION_ENDED, detail
        with self._lock:
            if self._dead is not None:
                sock.close()
                return self._dead
        kept, lost, resent = self._reconcile(sock, w, helds, addr, sent)
        log.info("ringlock: session %#x resumed on %s:%s (%d hold(s) kept, %d lost, %d "
                 "request(s) sent again)", sid, addr[0], addr[1], kept, lost, resent)
        return None

    def _resume_one(self, addr: Tuple[str, int], timeout: float
                    ) -> Tuple["_Conn", codec.Welcome, List[codec.Held], Tuple[str, int],
                               float]:
        """One Resume: the new connection, its welcome and the Held list."""
        name = f"{addr[0]}:{addr[1]}"
        deadline = time.monotonic() + timeout
        sock = self._dial(addr, timeout)
        ok = False
        try:
            sent = time.monotonic()
            try:
                sock.sendall(codec.encode_resume(_PING_RID, self._w.session_id, self._auth))
            except OSError as e:
                raise _Retry(f"sending the resume failed: {e}") from None
            buf = bytearray()
            helds: List[codec.Held] = []
            while True:
                while buf:
                    if buf[0] not in (codec.KIND_REPLY, codec.KIND_HELD):
                        raise _Gone(f"{name} answered {buf[0]:#04x} to a Resume (a server "
                                    f"without Resume): unknown_session")
                    try:
                        got = codec.decode_answer(buf, _PING_RID)
                    except codec.ProtocolError as e:
                        raise _Gone(f"{name} broke the protocol: {e}") from None
                    if got is None:
                        break
                    ans, used = got
                    del buf[:used]
                    if isinstance(ans, codec.Lost) or ans.rid != _PING_RID:
                        raise _Gone(f"{name} broke the protocol: {ans!r} before the resume's "
                                    f"answer")
                    if isinstance(ans, codec.Held):
                        helds.append(ans)
                    elif isinstance(ans, codec.Refused) and ans.status == Status.NOT_LEADER:
                        raise _Retry("not the leader" + (f" (the leader is {ans.leader})"
                                                         if ans.leader else
                                                         " (it named no leader)"), ans.leader)
                    elif isinstance(ans, codec.Welcome) and ans.status == Status.OK:
                        if ans.session_id != self._w.session_id:
                            raise _Gone(f"{name} resumed session {ans.session_id:#x}, not "
                                        f"{self._w.session_id:#x}")
                        if ans.keepalive_ms == 0:
                            raise _Gone(f"{name} answered a keep-alive of 0")
                        ok = True
                        return sock, ans, helds, addr, sent
                    elif ans.status == Status.UNKNOWN_SESSION:
                        raise _Gone(f"{name} answered unknown_session (the session ended "
                                    f"on the server)")
                    elif ans.status == Status.TLS_REQUIRED:
                        raise _tls_required(addr)
                    else:
                        raise _Gone(f"{name} refused the resume: {ans.status.label}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Retry(f"no answer to the resume within {timeout:.3f} s")
                sock.settimeout(left)
                try:
                    chunk = sock.recv(4096)
                except socket.timeout:
                    raise _Retry(f"no answer to the resume within {timeout:.3f} s") from None
                except ssl.SSLError as e:
                    raise _tls_refusal(addr, e) from None
                except OSError as e:
                    raise _Retry(str(e)) from None
                if chunk is None:
                    continue  # a TLS record not complete yet
                if not chunk:
                    raise _Retry("the server closed the connection before answering the resume")
                buf += chunk
        finally:
            if not ok:
                sock.close()

    def _reconcile(self, sock: "_Conn", w: codec.Welcome, helds: List[codec.Held],
                   addr: Tuple[str, int], sent: float) -> Tuple[int, int, int]:
        """Settles the session's state by the Held list of a successful
        Resume, then makes ``sock`` the session's connection. Returns (holds
        kept, holds lost, requests sent again)."""
        listed: Dict[Tuple[bytes, int], codec.Held] = {(h.key, h.token): h for h in helds}
        modes = bool(w.flags & codec.FLAG_MODES)
        watches = bool(w.flags & codec.FLAG_WATCHES)
        proclaim = bool(w.flags & codec.FLAG_PROCLAIM)
        used: set = set()
        lost: List[Tuple[Lease, LostInfo]] = []
        resend: List[_Pending] = []
        done: List[_Pending] = []
        kept = 0
        with self._lock:
            # Holds this side believes in: kept if listed with their token,
            # else lost (reset, expired, released by token meanwhile).
            for kt, lease in list(self._holds.items()):
                h = listed.get(kt)
                if h is not None:
                    used.add(kt)
                    kept += 1
                    if h.ttl_left_ms is not None and lease._expires_at is not None:
                        lease._expires_at = min(lease._expires_at, sent + h.ttl_left_ms / 1000.0)
                    continue
                del self._holds[kt]
                info = LostInfo(lease._ukey, lease._token, LostReason.NOT_LISTED,
                                "the resumed session does not list it (reset, expired or "
                                "released by token while the connection was down)", True)
                if self._claim_loss(lease, info):
                    lost.append((lease, info))
            # A Release (or Proclaim) in flight names its hold: that hold is
            # no grant to match.
            for p in self._pending.values():
                if p.frame and p.frame[0] in (codec.OP_RELEASE, codec.OP_PROCLAIM) \
                        and not p.event.is_set():
                    used.add(self._named_hold(p.frame))
            # Requests in flight, in the order they were registered.
            for rid, p in list(self._pending.items()):
                if p.event.is_set() or not p.frame:
                    continue  # answered; its caller has not taken it yet
                op = p.frame[0]
                if op == codec.OP_ACQUIRE:
                    tok = next((t for (k, t) in listed if k == p.key and (k, t) not in used),
                               None)
                    if tok is not None:
                        # Granted, its answer lost with the connection.
                        used.add((p.key, tok))
                        left = listed[(p.key, tok)].ttl_left_ms
                        self._grant(p, tok, None if left is None else (sent, left))
                        p.reply = codec.Reply(rid, Status.OK, tok, left)
                        done.append(p)
                    elif p.cancel_sent:
                        # Not granted, and its caller withdrew it: cancelled.
                        p.reply = codec.Reply(rid, Status.CANCELLED, 0, None)
                        done.append(p)
                    elif p.access is not None and not p.access.exclusive and not modes:
                        # Not granted, and this server would answer its
                        # access trailer invalid: not sent again.
                        p.error = self._modes_unsupported(p, addr)
                        done.append(p)
                    else:
                        resend.append(p)  # queued Acquires are not kept
                elif op == codec.OP_RELEASE:
                    if self._named_hold(p.frame) in listed:
                        resend.append(p)  # it did not happen
                    elif p.kind == "ignore":
                        del self._pending[rid]
                    else:
                        p.reply = codec.Reply(rid, Status.OK, 0, None)  # it happened
                        done.append(p)
                elif op == codec.OP_WATCH and not watches:
                    # Registered while resuming, on a server without watches.
                    if p.watch is not None:
                        self._watches.pop(rid, None)
                        p.watch._state = "ended"
                        p.error = self._watch_unsupported(p.watch, addr)
                        done.append(p)
                    else:
                        del self._pending[rid]
                elif op == codec.OP_PROCLAIM and not proclaim:
                    # On a server without Proclaim (it would close the
                    # connection on the op): not sent again.
                    if p.proclaim is not None and p.kind != "ignore":
                        p.error = self._proclaim_unsupported(p.proclaim, addr)
                        done.append(p)
                    else:
                        del self._pending[rid]
                elif op == codec.OP_CANCEL or (op == codec.OP_PING and p.kind == "ignore"):
                    # A Cancel's Acquire was settled above; a Ping nobody waits for.
                    del self._pending[rid]
                else:
                    # Extend (it counts from when it runs), Proclaim (it sets
                    # the value again), a caller's Ping.
                    resend.append(p)
            # Listed holds nobody here knows (a grant whose acquire is gone): let go.
            for kt, h in listed.items():
                if kt in used:
                    continue
                r = self._alloc_rid()
                q = _Pending("ignore", sent)
                q.frame = codec.encode_release(r, h.token, h.key)
                self._pending[r] = q
                resend.append(q)
            self._sock = sock
            self._server = addr
            self._w = _Welcome(w.keepalive_ms / 1000.0, w.min_ttl_ms, w.max_ttl_ms, w.session_id,
                               w.max_keys, w.max_waiters, w.shards, w.flags)
            self._interval = max(0.001, min(self._w.keepalive / 3, PING_INTERVAL_MAX))
            self._ping_timeout = max(0.001, min(self._w.keepalive / 3, PING_TIMEOUT_MAX))
            self._confirmed_at = sent
            self._last_rx = time.monotonic()
            self._not_leader = False
            self._leader = None
            self._resuming = False
            self._resumes += 1
            sock.settimeout(self._ping_timeout)
        for p in resend:
            p.sent_at = time.monotonic()
            try:
                with self._wlock:
                    sock.sendall(p.frame)
            except OSError:
                self._fail_connection(sock)  # the reader resumes again
                break
        for p in done:
            p.event.set()
        for lease, info in lost:
            self._notify(lease, info)
        return kept, len(lost), len(resend)

    @staticmethod
    def _named_hold(frame: bytes) -> Tuple[bytes, int]:
        """The (key, token) a Release (or Proclaim) frame names: both begin
        ``[u64 token][u8 keyLen][key]``."""
        token, klen = struct.unpack_from("<QB", frame, codec.HEADER)
        return bytes(frame[codec.HEADER + 9:codec.HEADER + 9 + klen]), token

    def _run_callbacks(self) -> None:
        while True:
            item = self._callbacks.get()
            if item is None:
                # The session ended: run what is queued, then stop.
                while True:
                    try:
                        item = self._callbacks.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        self._call_back(*item)
                try:
                    self._sock.close()
                except OSError:
                    pass
                return
            self._call_back(*item)

    @staticmethod
    def _call_back(fn: LostCallback, lease: Lease, info: LostInfo) -> None:
        try:
            fn(lease, info)
        except Exception:
            log.exception("a ringlock on_lost callback raised")


#: A session's connection: a socket, or a TLS connection over one.
_Conn = Union[socket.socket, TLSConn]


def _tls_required(addr: Tuple[str, int]) -> TLSRequired:
    return TLSRequired(
        f"{addr[0]}:{addr[1]} refused the session: tls_required: the server takes sessions "
        f"over TLS only: give the client ssl_context=ringlock.tls_context(certs_dir) (a certs "
        f"dir with the CA's ca.crt; client=NAME adds a client certificate)", "tls_required")


def _tls_refusal(addr: Tuple[str, int], e: ssl.SSLError) -> Exception:
    """An alert from the server after the handshake: about this client's
    certificate (not retried, :class:`TLSError`), or anything else
    (:class:`_Retry`). With TLS 1.3 the server judges the client's
    certificate after the client finished its handshake, so its verdict
    arrives with the first read."""
    name = f"{addr[0]}:{addr[1]}"
    reason = str(e.reason or e)
    if "CERTIFICATE_REQUIRED" in reason.upper():
        return TLSError(f"{name} refused the TLS connection: it requires a client certificate "
                        f"(--client-cert-auth): give ssl_context=ringlock.tls_context(certs_dir, "
                        f"client=NAME) (client.NAME.crt, made by `ringlock cert create-client`)",
                        name)
    if any(w in reason.upper() for w in ("CERTIFICATE", "UNKNOWN_CA", "ACCESS_DENIED")):
        return TLSError(f"{name} refused this client's certificate ({reason}): it must be issued "
                        f"by the server's CA and within its dates", name)
    return _Retry(f"TLS: {reason}")


def _connect(addr: Tuple[str, int], timeout: float) -> socket.socket:
    """Connects to ``addr``, refusing a connection that reached itself.

    With nothing listening on a local port of the ephemeral range, a
    connect may be given that port as its own and complete to itself (TCP's
    simultaneous open); every request would then come back as its own
    answer. Such a connection is closed and reported as refused, which the
    callers retry like any other (Go's dialer does the same).
    """
    sock = socket.create_connection(addr, timeout=timeout)
    try:
        if sock.getsockname() == sock.getpeername():
            raise ConnectionRefusedError(
                f"nothing listens on {addr[0]}:{addr[1]} (the connection reached itself)")
    except BaseException:
        sock.close()
        raise
    return sock


class _Retry(Exception):
    """Connecting or the Hello failed before any session existed: another try
    is safe. ``leader``: the address a ``not_leader`` answer named."""

    def __init__(self, message: str, leader: Optional[str] = None, refused: bool = False
                 ) -> None:
        super().__init__(message)
        self.leader = leader
        #: Nothing listened: the connection was refused.
        self.refused = refused


def _after_the_session(mode: HoldMode) -> str:
    if mode == HoldMode.SESSION:
        return "the server frees a session hold when it ends the session"
    if mode == HoldMode.LEASE:
        return "the lease stays held until its TTL passes"
    return "a persistent hold stays held until it is released by token or reset"

