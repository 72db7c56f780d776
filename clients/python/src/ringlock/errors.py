"""Exceptions. Every one is a :class:`RingLockError`; ``.status`` is the
server's status name (``"timed_out"``, ``"stale_token"``, ...) when the error
comes from a server answer, and ``None`` when it does not."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, TYPE_CHECKING

from ._codec import ProtocolError as _CodecProtocolError

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Access, Key, LostInfo


class RingLockError(Exception):
    """Base of every error of this package."""

    #: The server's status name, or ``None``.
    status: Optional[str] = None

    def __init__(self, message: str, status: Optional[str] = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgument(RingLockError, ValueError):
    """Refused before anything was sent (a key of 0 or >127 bytes, a TTL
    outside the server's bounds, ...), or answered ``invalid`` by the server."""

    status = None


class Unavailable(RingLockError, ConnectionError):
    """No session could be opened (every address failed), or the session
    has ended: open a new :class:`~ringlock.Client`."""


class Unauthorized(Unavailable):
    """The server has ``--auth-token-file`` and the Hello's token was missing
    or wrong (status ``unauthorized``). Not retried."""

    status = "unauthorized"


class UnsupportedVersion(Unavailable):
    """The server does not speak this client's session protocol version
    (status ``unsupported_version``); ``.versions`` are the ones it speaks.
    Not retried, and no other address is tried: a newer client (or an
    older server) is needed."""

    status = "unsupported_version"

    def __init__(self, message: str, versions: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.versions: Tuple[int, ...] = tuple(versions)


class NotLeader(Unavailable):
    """A cluster node that is not (or no longer) the leader answered
    ``not_leader``: it cannot serve this session. ``.leader`` is the
    ``host:port`` it named (``None``: it named none). Opening a session
    tries the named leader first, then the other addresses (when every
    attempt failed it raises :class:`Unavailable`, not this). A live session that is told this
    ends with this error, except that a replicated (resumable) session
    first resumes on the leader named and raises it only when no resume
    succeeded (open a new :class:`~ringlock.Client`)."""

    status = "not_leader"

    def __init__(self, message: str, leader: Optional[str] = None) -> None:
        super().__init__(message)
        self.leader = leader


class UnverifiedLeader(NotLeader):
    """A server answered ``not_leader`` naming a leader (``.leader``) that is
    not among the addresses this client was given, and the connection
    would have carried a secret (the auth token of a Hello, the session id
    of a Resume) to a server nobody verified: without TLS the client does
    not dial it. Give the client an ``ssl_context`` (the leader's
    certificate is then verified against the host it names) or list that
    address among its addresses."""


class TLSRequired(Unavailable):
    """The server takes sessions over TLS only (status ``tls_required``: it
    has ``--certs-dir``): give the client ``ssl_context=`` (e.g.
    :func:`ringlock.tls_context` of a certs dir with the CA's ``ca.crt``).
    Not retried."""

    status = "tls_required"


class TLSError(Unavailable):
    """A TLS connection was refused: the server's certificate does not
    verify (another CA, issued for another host than the one dialled,
    expired), or the server refused this client's certificate or wanted
    one (``--client-cert-auth``). Not retried: the message says which.
    ``.address`` is the ``host:port`` dialled."""

    def __init__(self, message: str, address: str = "") -> None:
        super().__init__(message)
        self.address = address


class ProtocolError(RingLockError):
    """The peer does not speak the session protocol (or broke it)."""


class LockTimeout(RingLockError, TimeoutError):
    """An acquire's wait ended without a grant (status ``timed_out``). The
    server decided: the key was not granted to this caller."""

    status = "timed_out"


class LockBusy(LockTimeout):
    """A try-lock (``timeout=0``) found the key held (status ``busy``)."""

    status = "busy"


class Cancelled(RingLockError):
    """The acquire was withdrawn through its :class:`~ringlock.CancelToken`
    (status ``cancelled``). A cancelled caller never holds the key."""

    status = "cancelled"


class ModeMismatch(RingLockError):
    """A semaphore acquire named another slot count than the key's (status
    ``mode_mismatch``): a key's semaphore size is fixed by its first holder
    or waiter for as long as any semaphore request holds or waits on it.
    Nothing changed on the server; ``.key`` is the key (in the type it was
    given) and ``.slots`` the count this acquire asked for."""

    status = "mode_mismatch"

    def __init__(self, message: str, key: "Key" = b"", slots: int = 0) -> None:
        super().__init__(message)
        self.key = key
        self.slots = slots


class ModesUnsupported(RingLockError):
    """A shared or semaphore acquire on a session whose server does not
    offer lock modes (its welcome lacks the *modes* flag: a ringlockd older
    than lock modes, issue #33). Raised before anything was sent; an exclusive acquire still works.
    ``.key`` is the key, ``.access`` the access asked for."""

    def __init__(self, message: str, key: "Key" = b"", access: "Optional[Access]" = None
                 ) -> None:
        super().__init__(message)
        self.key = key
        self.access = access


class WatchUnsupported(RingLockError):
    """A watch on a session whose server does not offer watches (its
    welcome lacks the *watches* flag: a ringlockd older than watches).
    Raised before anything was sent. ``.key`` is the key."""

    def __init__(self, message: str, key: "Key" = b"") -> None:
        super().__init__(message)
        self.key = key


class ProclaimUnsupported(RingLockError):
    """A proclaim (:meth:`~ringlock.Leadership.proclaim`) on a session whose
    server does not offer it (its welcome lacks the *proclaim* flag: a
    ringlockd older than proclaim). Raised before anything was sent; the
    leadership is unchanged. ``.key`` is the election's name."""

    def __init__(self, message: str, key: "Key" = b"") -> None:
        super().__init__(message)
        self.key = key


class WatchEnded(RingLockError):
    """The watch is over: :meth:`~ringlock.Watch.next` raises it once the
    events that arrived before the end were handed out. ``.reason``:
    ``"closed"`` (:meth:`~ringlock.Watch.close`), ``"connection_lost"``
    (the session's connection failed: a replicated session then resumes on
    a new connection, which carries no watch), or why the session ended
    (``"session_ended"``, ``"keepalive_timeout"``).
    Watch the key again (a new :meth:`~ringlock.Client.watch`, on this
    client if it is still open) and read its holders anew: changes between
    the two watches are not replayed. ``.key`` is the key."""

    def __init__(self, message: str, key: "Key" = b"", reason: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.reason = reason


class LimitReached(RingLockError):
    """The server's ``--max-keys`` or ``--max-waiters`` refused the acquire
    (or, for a watch, ``--max-waiters`` watches on the key's shard already)."""

    status = "limit_reached"


class ServerError(RingLockError):
    """The server could not make the result durable, or is shutting down."""

    status = "server_error"


class LockLost(RingLockError):
    """The lock is not (or no longer) held by this lease: it expired, was
    reset, its session ended, or the server refused its token.
    ``.info`` says how and when, where known."""

    def __init__(self, message: str, status: Optional[str] = None,
                 info: "Optional[LostInfo]" = None) -> None:
        super().__init__(message, status)
        self.info = info


class StaleToken(LockLost):
    """The token named is not the key's current one (status
    ``stale_token``): nothing changed on the server."""

    status = "stale_token"


class NotOwner(LockLost):
    """The token is current but belongs to another session's session hold
    (status ``not_owner``): nothing changed on the server."""

    status = "not_owner"


class LockReleased(RingLockError):
    """The lease was already released by this client: it cannot be extended."""


def _protocol(e: _CodecProtocolError) -> ProtocolError:
    return ProtocolError(f"the server broke the session protocol: {e}")


class ReleaseFailed(RingLockError):
    """A release could not be confirmed (no answer within the release
    timeout, the session ended first, or the server answered an error).
    The message says what stays held: a session hold is freed when its
    session ends, a lease at its TTL, a persistent hold only by a release
    naming its token or a reset."""
