"""The session protocol's frames: pure encoding and decoding, no I/O.

Layout (``docs/protocol.md``, "Sessions"; integers little-endian)::

    request  [u8 op][u32 rid][u16 bodyLen][body]      op 7..=17, bodyLen <= 512
    answer   [u8 kind][u32 rid][u16 bodyLen][body]    kind 0x80 Reply, 0x81 Lost, 0x82 Held,
                                                      0x83 Event

Everything here is deterministic and side-effect free, so it is unit-tested
on its own (``tests/test_codec.py``).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Optional, Tuple, Union

VERSION = 1
HEADER = 7
BODY_MAX = 512
WAIT_FOREVER = 0xFFFFFFFF
NO_TTL = 0xFFFFFFFF
REPLY_BODY = 13
WELCOME_BODY = 32
#: The longest key (bytes), as on the Locking-Center lock port.
KEY_MAX = 127
#: The longest source (bytes): an Acquire's and a Proclaim's size byte of
#: it is unsigned (the lock port's is signed: 127 there). A ringlockd older
#: than 255-byte sources answers a longer one than 127 ``invalid``.
SOURCE_MAX = 255
AUTH_MAX = 255

OP_HELLO = 7
OP_ACQUIRE = 8
OP_RELEASE = 9
OP_EXTEND = 10
OP_CANCEL = 11
OP_PING = 12
#: Resumes a replicated session on a new connection (instead of a Hello).
OP_RESUME = 13
#: Watches a key's holders (``[u8 keyLen][key]``); only with :data:`FLAG_WATCHES`.
OP_WATCH = 15
#: Ends a watch (``[u32 rid of the Watch][u8 keyLen][key]``).
OP_UNWATCH = 16
#: Changes a hold's source, keeping it and its token (an election's new
#: value: ``[u64 token][u8 keyLen][key][u8 srcLen][src]``); only with
#: :data:`FLAG_PROCLAIM`.
OP_PROCLAIM = 17

KIND_REPLY = 0x80
KIND_LOST = 0x81
#: One hold of a resumed session (answers a Resume, before its welcome).
KIND_HELD = 0x82
#: One holder or one change of a watched key (its rid is the Watch's).
KIND_EVENT = 0x83

#: Welcome ``flags`` bit 0: the session is replicated and can be resumed.
FLAG_RESUMABLE = 1
#: Welcome ``flags`` bit 1: the server takes an Acquire's access trailer
#: (shared and semaphore holds) and may answer ``mode_mismatch``. A client
#: sends the trailer only to a server that set it.
FLAG_MODES = 2
#: Welcome ``flags`` bit 2: the server takes Watch and Unwatch (and pushes
#: Events). A client sends them only to a server that set it.
FLAG_WATCHES = 4
#: Welcome ``flags`` bit 3: the server takes Proclaim (and sends
#: ``proclaimed`` Events). A client sends it only to a server that set it.
FLAG_PROCLAIM = 8

#: An Acquire's access byte (its optional ``[u8 access][u32 slots]`` trailer).
ACCESS_EXCLUSIVE = 0
ACCESS_SHARED = 1
ACCESS_SEMAPHORE = 2

_HDR = struct.Struct("<BIH")


class Status(enum.IntEnum):
    """The status byte of a Reply. ``.label`` is the protocol's name."""

    OK = 0
    TIMED_OUT = 1
    BUSY = 2
    NOT_OWNER = 3
    STALE_TOKEN = 4
    INVALID = 5
    LIMIT_REACHED = 6
    SERVER_ERROR = 7
    CANCELLED = 8
    NOT_QUEUED = 9
    UNAUTHORIZED = 10
    UNSUPPORTED_VERSION = 11
    NOT_LEADER = 12
    UNKNOWN_SESSION = 13
    #: A Hello or Resume in plaintext to a server that takes sessions over
    #: TLS only (it has ``--certs-dir``); the connection is closed after it.
    TLS_REQUIRED = 14
    #: A semaphore Acquire naming another slot count than the key's (fixed
    #: while any semaphore request holds or waits on it): nothing changed.
    #: Only an Acquire that carried an access is answered it.
    MODE_MISMATCH = 15

    @property
    def label(self) -> str:
        """The status name used in errors and docs: ``"stale_token"`` etc."""
        return self.name.lower()

    @property
    def has_detail(self) -> bool:
        """Its Reply body is ``[u8 status][u8 len][detail]``, whatever the
        request, instead of the 13-byte layout."""
        return self in (Status.UNSUPPORTED_VERSION, Status.NOT_LEADER)


class HoldMode(enum.IntEnum):
    """How a granted key is held (Acquire's ``hold`` byte)."""

    PERSISTENT = 0
    SESSION = 1
    LEASE = 2


class LostWhy(enum.IntEnum):
    """The reason byte of a Lost push."""

    EXPIRED = 1
    RESET = 2


class EventKind(enum.IntEnum):
    """The event byte of an Event push. ``.label`` is the protocol's name."""

    #: Held the key when the watch began (before the Watch's Reply).
    HOLDER = 0
    GRANTED = 1
    RELEASED = 2
    EXPIRED = 3
    RESET = 4
    SESSION_ENDED = 5
    #: Still holds the key, same token, under the new source the Event
    #: carries (a Proclaim).
    PROCLAIMED = 6

    @property
    def label(self) -> str:
        """``"holder"``, ``"granted"``, ``"released"``, ``"expired"``,
        ``"reset"``, ``"session_ended"`` or ``"proclaimed"``."""
        return self.name.lower()

    @property
    def ends_hold(self) -> bool:
        """The holder let go or was let go (released, expired, reset,
        session ended)."""
        return self in (EventKind.RELEASED, EventKind.EXPIRED, EventKind.RESET,
                        EventKind.SESSION_ENDED)


#: The event bytes this decoder knows; an Event of another is an :class:`OtherEvent`.
_EVENT_KINDS = frozenset(int(k) for k in EventKind)


class ProtocolError(Exception):
    """The server sent bytes that are not the session protocol."""


@dataclass(frozen=True)
class Welcome:
    """The Hello reply: what the server applies to this session."""

    rid: int
    status: Status
    version: int
    keepalive_ms: int
    min_ttl_ms: int
    max_ttl_ms: int
    session_id: int
    max_keys: int
    max_waiters: int
    shards: int
    #: The byte after the 32-byte body (0 from a server that does not send
    #: it); bit 0 (:data:`FLAG_RESUMABLE`): the session can be resumed; bit 1
    #: (:data:`FLAG_MODES`): the server takes shared and semaphore holds.
    flags: int = 0

    @property
    def resumable(self) -> bool:
        return bool(self.flags & FLAG_RESUMABLE)

    @property
    def modes(self) -> bool:
        """Bit 1 (:data:`FLAG_MODES`): the server takes shared and semaphore holds."""
        return bool(self.flags & FLAG_MODES)

    @property
    def watches(self) -> bool:
        """Bit 2 (:data:`FLAG_WATCHES`): the server takes Watch and Unwatch."""
        return bool(self.flags & FLAG_WATCHES)

    @property
    def proclaim(self) -> bool:
        """Bit 3 (:data:`FLAG_PROCLAIM`): the server takes Proclaim."""
        return bool(self.flags & FLAG_PROCLAIM)


@dataclass(frozen=True)
class Held:
    """One hold a resumed session still has (answers a Resume, before its
    welcome; ``rid`` is the Resume's)."""

    rid: int
    key: bytes
    token: int
    hold: HoldMode
    #: ``None`` for a hold that is not a lease.
    ttl_left_ms: Optional[int]


@dataclass(frozen=True)
class Reply:
    """A Reply to anything but a Hello (also a refused Hello)."""

    rid: int
    status: Status
    token: int
    #: ``None`` where the server sent ``0xFFFFFFFF`` (no TTL).
    ttl_left_ms: Optional[int]


@dataclass(frozen=True)
class Refused:
    """A Reply of a status with detail (``unsupported_version``,
    ``not_leader``): the server closes the connection after it."""

    rid: int
    status: Status
    detail: bytes

    @property
    def versions(self) -> Tuple[int, ...]:
        """``unsupported_version``: the versions the server speaks, ascending."""
        return tuple(self.detail)

    @property
    def leader(self) -> Optional[str]:
        """``not_leader``: the leader's ``host:port``, ``None`` when the
        server named none (or sent something that is not ASCII)."""
        if not self.detail:
            return None
        try:
            return self.detail.decode("ascii")
        except UnicodeDecodeError:
            return None


@dataclass(frozen=True)
class Lost:
    """An unsolicited push: the server took ``key`` (at ``token``) away."""

    key: bytes
    token: int
    why: LostWhy


@dataclass(frozen=True)
class Event:
    """An Event push of a watch (``rid`` is the Watch's): one holder of the
    key, or one change of its holders."""

    rid: int
    kind: EventKind
    token: int
    hold: HoldMode
    #: :data:`ACCESS_EXCLUSIVE`, :data:`ACCESS_SHARED` or :data:`ACCESS_SEMAPHORE`.
    access: int
    #: A semaphore's slot count; 0 for the other accesses.
    slots: int
    key: bytes
    source: bytes


@dataclass(frozen=True)
class OtherEvent:
    """An Event push of a kind this decoder does not know (a later
    server's): its body is not read, and a client skips it
    (``docs/protocol.md``, "Elections")."""

    rid: int
    #: The unknown event byte.
    kind: int


Answer = Union[Welcome, Reply, Refused, Lost, Held, Event, OtherEvent]


def _frame(op: int, rid: int, body: bytes) -> bytes:
    if len(body) > BODY_MAX:
        raise ValueError(f"body of {len(body)} bytes exceeds {BODY_MAX}")
    if not 0 <= rid <= 0xFFFFFFFF:
        raise ValueError(f"request id {rid} out of range")
    return _HDR.pack(op, rid, len(body)) + body


def _name(n: bytes, lo: int, hi: int, what: str) -> bytes:
    if not lo <= len(n) <= hi:
        raise ValueError(f"a {what} is {lo} to {hi} bytes, got {len(n)}")
    return bytes([len(n)]) + n


def _u32(v: int, what: str) -> bytes:
    if not 0 <= v <= 0xFFFFFFFF:
        raise ValueError(f"{what} {v} out of range 0..=2^32-1")
    return struct.pack("<I", v)


def _u64(v: int, what: str) -> bytes:
    if not 0 <= v <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError(f"{what} {v} out of range 0..=2^64-1")
    return struct.pack("<Q", v)


def encode_hello(rid: int, keepalive_ms: int, auth: bytes = b"", version: int = VERSION) -> bytes:
    """Hello: ``[u8 version][u32 keepalive_ms]`` then, with a secret, ``[u8 len][auth]``."""
    body = bytes([version]) + _u32(keepalive_ms, "keepalive_ms")
    if auth:
        body += _name(auth, 1, AUTH_MAX, "auth token")
    return _frame(OP_HELLO, rid, body)


def encode_resume(rid: int, session_id: int, auth: bytes = b"", version: int = VERSION) -> bytes:
    """Resume: ``[u8 version][u64 session_id]`` then, with a secret, ``[u8 len][auth]``."""
    body = bytes([version]) + _u64(session_id, "session_id")
    if auth:
        body += _name(auth, 1, AUTH_MAX, "auth token")
    return _frame(OP_RESUME, rid, body)


def encode_acquire(
    rid: int, hold: HoldMode, ttl_ms: int, wait_ms: int, key: bytes, source: bytes = b"",
    access: int = ACCESS_EXCLUSIVE, slots: int = 0,
) -> bytes:
    """Acquire: ``[u8 hold][u32 ttl_ms][u32 wait_ms][u8 keyLen][key][u8 srcLen][src]``,
    then ``[u8 access][u32 slots]`` for a shared (slots 0) or semaphore
    (slots >= 1) request only: an exclusive one ends at the source, as an
    older server expects."""
    body = (
        bytes([int(hold)])
        + _u32(ttl_ms, "ttl_ms")
        + _u32(wait_ms, "wait_ms")
        + _name(key, 1, KEY_MAX, "key")
        + _name(source, 0, SOURCE_MAX, "source")
    )
    if access == ACCESS_EXCLUSIVE or access == ACCESS_SHARED:
        if slots != 0:
            raise ValueError(f"slots {slots} on an exclusive or shared acquire (only a "
                             f"semaphore has slots)")
    elif access == ACCESS_SEMAPHORE:
        if slots < 1:
            raise ValueError(f"a semaphore has at least 1 slot, got {slots}")
    else:
        raise ValueError(f"unknown access {access}")
    if access != ACCESS_EXCLUSIVE:
        body += bytes([access]) + _u32(slots, "slots")
    return _frame(OP_ACQUIRE, rid, body)


def encode_release(rid: int, token: int, key: bytes) -> bytes:
    """Release: ``[u64 token][u8 keyLen][key]``."""
    return _frame(OP_RELEASE, rid, _u64(token, "token") + _name(key, 1, KEY_MAX, "key"))


def encode_extend(rid: int, token: int, ttl_ms: int, key: bytes) -> bytes:
    """Extend: ``[u64 token][u32 ttl_ms][u8 keyLen][key]``."""
    body = _u64(token, "token") + _u32(ttl_ms, "ttl_ms") + _name(key, 1, KEY_MAX, "key")
    return _frame(OP_EXTEND, rid, body)


def encode_cancel(rid: int, target_rid: int, key: bytes) -> bytes:
    """Cancel: ``[u32 rid of the Acquire][u8 keyLen][key of the Acquire]``."""
    body = _u32(target_rid, "target rid") + _name(key, 1, KEY_MAX, "key")
    return _frame(OP_CANCEL, rid, body)


def encode_ping(rid: int) -> bytes:
    """Ping: an empty body."""
    return _frame(OP_PING, rid, b"")


def encode_watch(rid: int, key: bytes) -> bytes:
    """Watch: ``[u8 keyLen][key]``."""
    return _frame(OP_WATCH, rid, _name(key, 1, KEY_MAX, "key"))


def encode_unwatch(rid: int, target_rid: int, key: bytes) -> bytes:
    """Unwatch: ``[u32 rid of the Watch][u8 keyLen][key of the Watch]``."""
    body = _u32(target_rid, "target rid") + _name(key, 1, KEY_MAX, "key")
    return _frame(OP_UNWATCH, rid, body)


def encode_proclaim(rid: int, token: int, key: bytes, source: bytes) -> bytes:
    """Proclaim: ``[u64 token][u8 keyLen][key][u8 srcLen][src]``."""
    body = _u64(token, "token") + _name(key, 1, KEY_MAX, "key") + _name(source, 0, SOURCE_MAX,
                                                                         "source")
    return _frame(OP_PROCLAIM, rid, body)


def encode_event(rid: int, kind: EventKind, token: int, hold: HoldMode, access: int,
                 slots: int, key: bytes, source: bytes = b"") -> bytes:
    """An Event push (what the server sends; for tests and fake servers):
    ``[u8 event][u64 token][u8 hold][u8 access][u32 slots][u8 keyLen][key]
    [u8 srcLen][src]``."""
    body = (bytes([int(kind)]) + _u64(token, "token") + bytes([int(hold), access])
            + _u32(slots, "slots") + _name(key, 1, KEY_MAX, "key")
            + _name(source, 0, SOURCE_MAX, "source"))
    if len(body) > BODY_MAX:
        raise ValueError(f"body of {len(body)} bytes exceeds {BODY_MAX}")
    return _HDR.pack(KIND_EVENT, rid, len(body)) + body


def decode_event_body(rid: int, body: bytes) -> Event:
    """An Event body; bytes after the fields it knows (a later version's)
    are skipped. Raises :class:`ProtocolError` for a malformed one."""
    if len(body) < 16:
        raise ProtocolError(f"an event of {len(body)} body bytes is too short")
    kb, token, hold, access, slots = struct.unpack_from("<BQBBI", body, 0)
    try:
        kind = EventKind(kb)
    except ValueError:
        raise ProtocolError(f"unknown event kind {kb}") from None
    try:
        mode = HoldMode(hold)
    except ValueError:
        raise ProtocolError(f"an event with unknown hold mode {hold}") from None
    if access in (ACCESS_EXCLUSIVE, ACCESS_SHARED):
        if slots != 0:
            raise ProtocolError(f"an event with {slots} slots on access {access}")
    elif access == ACCESS_SEMAPHORE:
        if slots < 1:
            raise ProtocolError("an event of a semaphore of 0 slots")
    else:
        raise ProtocolError(f"an event with unknown access {access}")
    at = 15
    names = []
    for what, lo, hi in (("key", 1, KEY_MAX), ("source", 0, SOURCE_MAX)):
        if at >= len(body):
            raise ProtocolError(f"an event cut before its {what}")
        n = body[at]
        if not lo <= n <= hi or at + 1 + n > len(body):
            raise ProtocolError(f"an event with a {what} of {n} bytes in {len(body)} body bytes")
        names.append(body[at + 1:at + 1 + n])
        at += 1 + n
    # A later server may append fields: they are skipped.
    return Event(rid, kind, token, mode, access, slots, names[0], names[1])


def _status(b: int) -> Status:
    try:
        return Status(b)
    except ValueError:
        raise ProtocolError(f"unknown status byte {b}") from None


def decode_answer(buf: Union[bytes, bytearray, memoryview], hello_rid: Optional[int] = None
                  ) -> Optional[Tuple[Answer, int]]:
    """Decodes the first server message in ``buf``.

    Returns ``None`` when more bytes are needed, else ``(answer, used)``.
    A Reply's first body byte (its status) picks its layout: a status with
    detail (11, 12) is a :class:`Refused` whatever the request; else the
    Hello's reply (``hello_rid``) has the longer welcome body, and every
    other Reply (a Hello refused ``unauthorized`` or ``invalid`` too) is the
    13-byte layout. Raises :class:`ProtocolError` for bytes that cannot be
    a server message.
    """
    if len(buf) < HEADER:
        return None
    kind, rid, blen = _HDR.unpack_from(buf, 0)
    if blen > BODY_MAX:
        raise ProtocolError(f"answer body of {blen} bytes exceeds {BODY_MAX}")
    if len(buf) < HEADER + blen:
        return None
    body = bytes(buf[HEADER:HEADER + blen])
    used = HEADER + blen
    if kind == KIND_REPLY:
        if blen >= 1 and body[0] in (Status.UNSUPPORTED_VERSION, Status.NOT_LEADER):
            if blen < 2 or blen != 2 + body[1]:
                raise ProtocolError(f"a status {body[0]} reply of {blen} body bytes "
                                    f"(its layout is [status][len][detail])")
            return Refused(rid, Status(body[0]), body[2:]), used
        if hello_rid is not None and rid == hello_rid and blen >= WELCOME_BODY:
            st, ver, ka, mn, mx, sid, mk, mw, sh = struct.unpack_from("<BBIIIQIIH", body, 0)
            flags = body[WELCOME_BODY] if blen > WELCOME_BODY else 0
            # A later server may append fields: they are skipped.
            return Welcome(rid, _status(st), ver, ka, mn, mx, sid, mk, mw, sh, flags), used
        if blen != REPLY_BODY:
            raise ProtocolError(f"a reply body is {REPLY_BODY} bytes, got {blen}")
        st, token, ttl = struct.unpack_from("<BQI", body, 0)
        return Reply(rid, _status(st), token, None if ttl == NO_TTL else ttl), used
    if kind == KIND_LOST:
        if blen < 11:
            raise ProtocolError(f"a lost push of {blen} body bytes is too short")
        token, why, klen = struct.unpack_from("<QBB", body, 0)
        if klen < 1 or klen > KEY_MAX or 10 + klen != blen:
            raise ProtocolError(f"a lost push with a key of {klen} bytes in {blen} body bytes")
        try:
            reason = LostWhy(why)
        except ValueError:
            raise ProtocolError(f"unknown lost reason {why}") from None
        return Lost(body[10:], token, reason), used
    if kind == KIND_HELD:
        if blen < 15:
            raise ProtocolError(f"a held frame of {blen} body bytes is too short")
        token, hold, ttl, klen = struct.unpack_from("<QBIB", body, 0)
        if klen < 1 or klen > KEY_MAX or 14 + klen != blen:
            raise ProtocolError(f"a held frame with a key of {klen} bytes in {blen} body bytes")
        try:
            mode = HoldMode(hold)
        except ValueError:
            raise ProtocolError(f"a held frame with unknown hold mode {hold}") from None
        return Held(rid, body[14:], token, mode, None if ttl == NO_TTL else ttl), used
    if kind == KIND_EVENT:
        if blen >= 1 and body[0] not in _EVENT_KINDS:
            # A kind of a later server: skipped, as the protocol says.
            return OtherEvent(rid, body[0]), used
        return decode_event_body(rid, body), used
    raise ProtocolError(f"unknown answer kind {kind:#04x}")
