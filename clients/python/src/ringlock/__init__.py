"""ringlock: a Python client for ringlockd's session protocol.

Locks that free themselves when their holder dies, leases with a TTL,
fencing tokens on every grant, and a callback when a lock is lost::

    import ringlock

    with ringlock.Client("127.0.0.1:22119") as client:
        with client.lock("nightly/reconcile", ttl=30) as lease:
            write_somewhere(data, fencing_token=lease.token)
            lease.check()          # raises ringlock.LockLost if it was lost

See README.md for the full guide and the threading model.
"""

from ._client import DEFAULT_PORT, CancelToken, Client, Lease, LostInfo, LostReason, RetryEvent
from ._codec import Status
from ._tls import tls_context
from .errors import (
    Cancelled,
    InvalidArgument,
    LimitReached,
    LockBusy,
    LockLost,
    LockReleased,
    LockTimeout,
    NotLeader,
    NotOwner,
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
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_PORT",
    "CancelToken",
    "Cancelled",
    "Client",
    "InvalidArgument",
    "Lease",
    "LimitReached",
    "LockBusy",
    "LockLost",
    "LockReleased",
    "LockTimeout",
    "LostInfo",
    "LostReason",
    "NotLeader",
    "NotOwner",
    "ProtocolError",
    "ReleaseFailed",
    "RetryEvent",
    "RingLockError",
    "ServerError",
    "StaleToken",
    "Status",
    "TLSError",
    "TLSRequired",
    "Unauthorized",
    "Unavailable",
    "UnsupportedVersion",
    "UnverifiedLeader",
    "tls_context",
]
