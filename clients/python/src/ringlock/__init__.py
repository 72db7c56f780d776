"""ringlock: a Python client for ringlockd's session protocol.

Locks that free themselves when their holder dies, leases with a TTL,
fencing tokens on every grant, and a callback when a lock is lost::

    import ringlock

    with ringlock.Client("127.0.0.1:22119") as client:
        with client.lock("nightly/reconcile", ttl=30) as lease:
            write_somewhere(data, fencing_token=lease.token)
            lease.check()          # raises ringlock.LockLost if it was lost
        with client.lock_shared("catalog") as reader:       # readers together
            read_catalog(fencing_token=reader.token)
        with client.permit("render-pool", 4) as slot:       # at most 4 at once
            render(fencing_token=slot.token)
        with client.watch("catalog") as watch:              # who holds it, then changes
            print(watch.holders)
            event = watch.next(timeout=5)                   # a WatchEvent, or None
        election = client.election("scheduler")             # leader election
        with election.campaign("10.0.0.5:8080") as lead:    # waits to lead (FIFO)
            lead.proclaim("10.0.0.5:9090")                  # a new value, same token

See README.md for the full guide and the threading model.
"""

from ._client import (
    DEFAULT_PORT,
    EXCLUSIVE,
    SHARED,
    Access,
    CancelToken,
    Client,
    Holder,
    Lease,
    LostInfo,
    LostReason,
    RetryEvent,
    Watch,
    WatchEvent,
    semaphore,
)
from ._codec import Status
from ._election import Election, Leader, Leadership, Observer
from ._tls import tls_context
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

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_PORT",
    "EXCLUSIVE",
    "SHARED",
    "Access",
    "CancelToken",
    "Cancelled",
    "Client",
    "Election",
    "Holder",
    "InvalidArgument",
    "Leader",
    "Leadership",
    "Lease",
    "LimitReached",
    "LockBusy",
    "LockLost",
    "LockReleased",
    "LockTimeout",
    "LostInfo",
    "LostReason",
    "ModeMismatch",
    "ModesUnsupported",
    "NotLeader",
    "NotOwner",
    "Observer",
    "ProclaimUnsupported",
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
    "Watch",
    "WatchEnded",
    "WatchEvent",
    "WatchUnsupported",
    "semaphore",
    "tls_context",
]
