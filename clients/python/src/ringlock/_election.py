"""Leader election on a session (:meth:`Client.election`): campaign (an
exclusive session hold of the election's name whose source is the
candidate's value), proclaim (a new value, the same leadership and token),
resign (the release), and observe (a watch of the name, read as "who leads
now"). ``docs/protocol.md``, "Elections: campaign, proclaim, resign,
observe"; the Rust client's ``src/client/session/election.rs`` is the
reference.

Candidates are elected in the order they campaigned (the key's FIFO
queue); a leader whose session ends (its process killed, its connection
lost past the keep-alive) is replaced by the next candidate at once, and
every observer is told, with the new leader's fencing token.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

from . import _codec as codec
from .errors import InvalidArgument, RingLockError, WatchEnded

if TYPE_CHECKING:  # pragma: no cover
    from ._client import CancelToken, Client, Key, Lease, LostCallback, Watch, WatchEvent

__all__ = ["Election", "Leader", "Leadership", "Observer", "VALUE_MAX"]

#: The longest value: a holder's source on the session protocol, 1..255
#: bytes (an empty source would be the client's IP address).
VALUE_MAX = codec.SOURCE_MAX

#: The events that end a hold (of the leader's token: nobody leads).
_ENDS_HOLD = frozenset(k.label for k in codec.EventKind if k.ends_hold)


def _value_arg(value: Union[str, bytes]) -> bytes:
    """The value's bytes (a ``str`` as UTF-8): 1..255 of them."""
    if isinstance(value, str):
        b = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        b = bytes(value)
    else:
        raise InvalidArgument(f"an election value is str or bytes, got {type(value).__name__}")
    if not 1 <= len(b) <= VALUE_MAX:
        raise InvalidArgument(f"an election value is 1 to {VALUE_MAX} bytes, got {len(b)}")
    return b


@dataclass(frozen=True)
class Leader:
    """Who leads an election."""

    #: The leader's fencing token: strictly larger for every new leader (a
    #: proclaim keeps it).
    token: int
    #: The value it campaigned with, or its latest proclaim.
    value: bytes


class Election:
    """An election: a name on one session's server. Made by
    :meth:`Client.election`; cheap, holds nothing itself. Thread-safe."""

    def __init__(self, client: "Client", name: bytes, given: "Key") -> None:
        self._client = client
        self._name = name
        self._given = given

    @property
    def name(self) -> "Key":
        """The name as it was given (a ``str`` stays a ``str``)."""
        return self._given

    @property
    def name_bytes(self) -> bytes:
        """The name's bytes, as sent."""
        return self._name

    def campaign(self, value: Union[str, bytes], timeout: Optional[float] = None, *,
                 cancel: "Optional[CancelToken]" = None,
                 on_lost: "Optional[LostCallback]" = None) -> "Leadership":
        """Campaigns with ``value`` (str as UTF-8, or bytes; 1..255 bytes:
        what observers see, e.g. an address) and waits to lead: an
        exclusive session hold of the name whose source is ``value`` (for
        this request only; the session's ``source=`` is not changed).
        Candidates are elected in the order they campaigned.

        * ``timeout`` — ``None`` waits until elected (or the session ends);
          ``0`` leads only if nobody does now (:class:`~ringlock.LockBusy`
          otherwise); else seconds, after which
          :class:`~ringlock.LockTimeout` (the campaign is withdrawn: the
          server decided, it never leads).
        * ``cancel`` — a :class:`~ringlock.CancelToken` that withdraws the
          campaign exactly (:class:`~ringlock.Cancelled`).
        * ``on_lost(lease, info)`` — runs on the callback thread when the
          leadership is lost (its session ended, an operator reset).

        Raises :class:`~ringlock.InvalidArgument`, sending nothing, for a
        value outside 1..255 bytes.
        """
        v = _value_arg(value)
        lease = self._client._acquire(self._given, timeout=timeout, ttl=None, persistent=False,
                                      cancel=cancel, on_lost=on_lost, keep_alive=False,
                                      access="exclusive", source=v)
        return Leadership(self, lease, v)

    def leader(self) -> Optional[Leader]:
        """The leader now (``None``: nobody leads), read once (a watch of
        the name, closed at once)."""
        w = self._client.watch(self._given)
        try:
            return _leader_of(w)
        finally:
            w.close()

    def observe(self) -> "Observer":
        """Observes the election: :attr:`Observer.leader` is the leader
        now, and :meth:`Observer.changed` (or iterating the observer) gives
        every change after it, in order: a new leader, a proclaim, and
        ``None`` between a leader's end and the next one's election. Like a
        :class:`~ringlock.Watch` (which it is), it lives on the session's
        connection: when the connection fails or the session ends, it ends
        with :class:`~ringlock.WatchEnded`; observe again to read the
        leader anew. Raises :class:`~ringlock.WatchUnsupported` on a server
        without watches."""
        return Observer(self, self._client.watch(self._given))

    def __repr__(self) -> str:
        return f"Election(name={self._given!r})"


def _leader_of(w: "Watch") -> Optional[Leader]:
    hs = w.holders
    return Leader(hs[0].token, hs[0].source) if hs else None


class Leadership:
    """This process leads: made by :meth:`Election.campaign`. Leadership
    lasts until :meth:`resign` (``with election.campaign(v) as lead:``
    resigns on exit) or the end of the session (then :attr:`lease` is
    lost and its ``on_lost`` runs). Thread-safe."""

    def __init__(self, election: Election, lease: "Lease", value: bytes) -> None:
        self._election = election
        self._lease = lease
        self._value = value

    @property
    def election(self) -> Election:
        return self._election

    @property
    def token(self) -> int:
        """The leadership's fencing token (a proclaim keeps it)."""
        return self._lease.token

    @property
    def value(self) -> bytes:
        """The value observers see: the campaign's, or the latest proclaimed."""
        return self._value

    @property
    def lease(self) -> "Lease":
        """The hold behind the leadership: :attr:`~ringlock.Lease.lost`,
        :meth:`~ringlock.Lease.check`, :meth:`~ringlock.Lease.wait_lost`."""
        return self._lease

    def proclaim(self, value: Union[str, bytes]) -> None:
        """Changes the leader's value to ``value`` (1..255 bytes), keeping
        the leadership and its token; every observer is told. Waits for the
        server's answer up to the client's ``release_timeout``.

        Raises :class:`~ringlock.InvalidArgument` (a bad value) and
        :class:`~ringlock.ProclaimUnsupported` (a server without proclaim),
        sending nothing; :class:`~ringlock.LockLost` when the leadership is
        gone ("leadership lost": answered ``stale_token`` or ``not_owner``,
        raised as :class:`~ringlock.StaleToken` / :class:`~ringlock.NotOwner`
        — after a resign, a reset, the session's end — or the session
        ended); :class:`~ringlock.ReleaseFailed` when no answer came (the
        value may or may not have changed)."""
        v = _value_arg(value)
        self._election._client._proclaim(self._lease, v)
        self._value = v

    def resign(self) -> None:
        """Gives up the leadership (the Release of its token): the next
        candidate is elected, observers are told. As
        :meth:`~ringlock.Lease.release`: safe to call again; raises
        :class:`~ringlock.LockLost` if the leadership had been lost."""
        self._lease.release()

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.resign()
        except RingLockError:
            # Do not mask the exception that ended the block.
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        return (f"Leadership(name={self._election.name!r}, token={self.token}, "
                f"value={self._value!r})")


class Observer:
    """The leader of an election now and at every change: made by
    :meth:`Election.observe`. ``for leader in observer:`` yields the leader
    (a :class:`Leader`, or ``None``: nobody leads) after each change; it
    stops after :meth:`close` and raises :class:`~ringlock.WatchEnded` when
    the observation ended otherwise. ``with election.observe() as o:``
    closes it on exit.

    What counts (as the Rust client's ``Observer``): a ``granted`` event is
    a new leader; a ``proclaimed`` event of the leader's token its new
    value; an event that ends a hold (released, expired, reset, session
    ended) of the leader's token means nobody leads until the next grant;
    every other event is not about the leader and is passed over."""

    def __init__(self, election: Election, watch: "Watch") -> None:
        self._election = election
        self._watch = watch
        self._leader = _leader_of(watch)

    @property
    def election(self) -> Election:
        return self._election

    @property
    def leader(self) -> Optional[Leader]:
        """The leader as last observed (``None``: nobody leads)."""
        return self._leader

    def _apply(self, ev: "WatchEvent") -> bool:
        """Applies one event; True when the leader changed."""
        cur = self._leader
        if ev.kind == "granted":
            now: Optional[Leader] = Leader(ev.token, ev.source)
        elif ev.kind == "proclaimed" and cur is not None and cur.token == ev.token:
            now = Leader(ev.token, ev.source)
        elif ev.kind in _ENDS_HOLD and cur is not None and cur.token == ev.token:
            now = None
        else:
            return False  # a holder this observer does not count as the leader
        if now == cur:
            return False
        self._leader = now
        return True

    def changed(self, timeout: Optional[float] = None) -> bool:
        """Waits up to ``timeout`` seconds (``None``: until one comes) for
        the leader to change: True when it did (:attr:`leader` is the new
        one), False when not within ``timeout``. Raises
        :class:`~ringlock.WatchEnded` once the observation is over (observe
        again)."""
        if timeout is not None and (not isinstance(timeout, (int, float))
                                    or math.isnan(timeout) or timeout < 0):
            raise InvalidArgument(f"timeout must be None or seconds >= 0, got {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ev = self._watch.next(left)
            if ev is None:
                return False
            if self._apply(ev):
                return True

    def __iter__(self) -> "Observer":
        return self

    def __next__(self) -> Optional[Leader]:
        try:
            self.changed()
        except WatchEnded as e:
            if e.reason == "closed":
                raise StopIteration from None
            raise
        return self._leader

    def close(self) -> None:
        """Ends the observation (its watch). Idempotent."""
        self._watch.close()

    def __enter__(self) -> "Observer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Observer(name={self._election.name!r}, leader={self._leader!r})"
