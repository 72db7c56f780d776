"""TLS for the session connection: a context from a certs dir, and a
connection that runs TLS over an ordinary socket through memory BIOs.

Why memory BIOs rather than ``ssl.SSLSocket``: the client reads its
connection on one thread (the reader, after ``select``) while any thread
writes requests. OpenSSL does not allow two threads inside one ``SSL``
object at once, and an ``SSLSocket`` may hold decrypted bytes that
``select`` cannot see. Here every call into the ``SSLObject`` is made
under a lock and never blocks (the BIOs are memory); the socket I/O is
done outside it, so the reader and a writer never wait for each other's
socket, and the reader drains every decrypted byte after each read, so
``select`` on the socket stays the truth.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import threading
import time
from typing import Optional, Union

from .errors import InvalidArgument

__all__ = ["tls_context"]

_CLIENT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")

PathLike = Union[str, "os.PathLike[str]"]


def tls_context(certs_dir: PathLike, client: Optional[str] = None) -> ssl.SSLContext:
    """An :class:`ssl.SSLContext` for ``Client(..., ssl_context=...)`` from a
    certs dir made by ``ringlock cert``: the server is verified against
    ``certs_dir/ca.crt`` and the host dialled (a DNS name, or an IP
    address against the certificate's IP names), TLS 1.3 only. With
    ``client="NAME"`` the context presents ``certs_dir/client.NAME.crt``
    (key ``client.NAME.key``, made by ``ringlock cert create-client``):
    a server with ``--client-cert-auth`` needs one, and on a server with
    ``--auth-token-file`` it stands for the token.

    Raises :class:`~ringlock.InvalidArgument` naming the file that is
    missing or unusable.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ca = os.path.join(os.fspath(certs_dir), "ca.crt")
    try:
        ctx.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as e:
        raise InvalidArgument(f"{ca}: cannot load the CA certificate ({e}); "
                              f"`ringlock cert create-ca` writes it") from e
    if client is not None:
        if not _CLIENT_NAME.fullmatch(client):
            raise InvalidArgument(f"client certificate name {client!r}: 1 to 64 of "
                                  f"A-Z a-z 0-9 . _ -")
        crt = os.path.join(os.fspath(certs_dir), f"client.{client}.crt")
        key = os.path.join(os.fspath(certs_dir), f"client.{client}.key")
        try:
            ctx.load_cert_chain(crt, key)
        except (OSError, ssl.SSLError) as e:
            raise InvalidArgument(f"{crt} / {key}: cannot load client {client}'s certificate "
                                  f"({e}); `ringlock cert create-client {client}` writes "
                                  f"them") from e
    return ctx


def verifies(ctx: Optional[ssl.SSLContext]) -> bool:
    """Whether connections made with ``ctx`` verify the server: its
    certificate against the context's CAs and the host dialled."""
    return ctx is not None and ctx.verify_mode != ssl.CERT_NONE and ctx.check_hostname


class TLSConn:
    """A TLS client connection over ``sock`` (connected), with the calls of a
    socket the session client uses. Thread-safe as the client uses it: one
    reader, writers serialised by the client's write lock."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, host: str) -> None:
        self._raw = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = ctx.wrap_bio(self._in, self._out, server_side=False, server_hostname=host)
        #: Every call into ``_obj`` (short, never blocks).
        self._mu = threading.Lock()
        #: Held while bytes taken from ``_out`` are sent: they go out in order.
        self._send_mu = threading.Lock()
        self._eof = False

    # --- the handshake ---------------------------------------------------------
    def handshake(self, timeout: float) -> None:
        """Runs the TLS handshake, bounded by ``timeout`` seconds. Raises
        :class:`ssl.SSLCertVerificationError` for a server certificate that
        does not verify, another :class:`ssl.SSLError` for a failed
        handshake, ``socket.timeout``/``OSError`` as a socket does, and
        :class:`ConnectionError` when the server closed it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self._mu:
                    self._obj.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            except ssl.SSLError:
                self._flush(block=False)  # the alert, as a courtesy
                raise
            self._flush(block=True)
            if done:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout(f"no TLS handshake within {timeout:.3f} s")
            self._raw.settimeout(left)
            data = self._raw.recv(65536)
            if not data:
                raise ConnectionResetError("the server closed the connection during the TLS "
                                           "handshake (a server without --certs-dir speaks "
                                           "plaintext only)")
            with self._mu:
                self._in.write(data)

    # --- I/O -------------------------------------------------------------------
    def sendall(self, data: bytes) -> None:
        with self._send_mu:
            with self._mu:
                self._obj.write(data)
                out = self._out.read()
            self._raw.sendall(out)

    def recv(self, n: int) -> Optional[bytes]:
        """Application bytes: what one read of the socket brought (blocking
        with the socket's timeout, as ``socket.recv``), or ``b""`` at the
        end of the connection, or ``None`` when that read completed no TLS
        record (the rest is on its way). Raises :class:`ssl.SSLError` for
        an alert from the server."""
        got = self._drain(n)
        if got:
            return got
        if self._eof:
            return b""
        data = self._raw.recv(65536)
        if not data:
            self._eof = True
            return b""
        with self._mu:
            self._in.write(data)
        got = self._drain(n)
        if got:
            return got
        return b"" if self._eof else None

    def _drain(self, n: int) -> bytes:
        """Every decrypted byte buffered (so ``select`` on the socket stays
        right); sets ``_eof`` at the server's close_notify."""
        chunks = []
        with self._mu:
            while not self._eof:
                try:
                    b = self._obj.read(max(n, 16384))
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:
                    self._eof = True
                    break
                if not b:
                    self._eof = True
                    break
                chunks.append(b)
        # Reading may have produced bytes to send (a key update's answer).
        self._flush(block=False)
        return b"".join(chunks)

    def _flush(self, block: bool) -> None:
        """Sends what the TLS object produced, in order. Not blocking: left
        for the next writer when one is sending (every write sends all)."""
        if not self._send_mu.acquire(blocking=block):
            return
        try:
            with self._mu:
                out = self._out.read()
            if out:
                self._raw.sendall(out)
        finally:
            self._send_mu.release()

    # --- the socket's other calls ---------------------------------------------
    def fileno(self) -> int:
        return self._raw.fileno()

    def settimeout(self, t: Optional[float]) -> None:
        self._raw.settimeout(t)

    def setsockopt(self, *args: int) -> None:
        self._raw.setsockopt(*args)

    def getsockname(self):  # type: ignore[no-untyped-def]
        return self._raw.getsockname()

    def getpeername(self):  # type: ignore[no-untyped-def]
        return self._raw.getpeername()

    def shutdown(self, how: int) -> None:
        # A close_notify first, if no writer is sending right now (a
        # courtesy: the server ends the session on the shutdown anyway).
        if self._send_mu.acquire(blocking=False):
            try:
                with self._mu:
                    try:
                        self._obj.unwrap()
                    except (ssl.SSLError, ValueError):
                        pass
                    out = self._out.read()
                if out:
                    self._raw.send(out, socket.MSG_DONTWAIT)
            except OSError:
                pass
            finally:
                self._send_mu.release()
        self._raw.shutdown(how)

    def close(self) -> None:
        self._raw.close()
