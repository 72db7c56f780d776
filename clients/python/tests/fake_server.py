"""A scripted stand-in for ringlockd, for the answers the real server never
sends (``not_leader``) or that need a server speaking other versions.

It listens on 127.0.0.1, counts connections, and hands each one to a
handler that reads request frames with :meth:`FakeConn.read` and writes
answers with the ``reply``/``welcome``/``refuse`` helpers. With ``tls``
(a server-side :class:`ssl.SSLContext`) each connection is a TLS server
connection first (a handshake that fails ends it).
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from typing import Callable, List, Optional, Tuple

HDR = struct.Struct("<BIH")


class FakeConn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def read(self) -> Optional[Tuple[int, int, bytes]]:
        """The next request frame ``(op, rid, body)``; ``None`` at EOF."""
        while True:
            if len(self.buf) >= 7:
                op, rid, blen = HDR.unpack_from(self.buf, 0)
                if len(self.buf) >= 7 + blen:
                    body = self.buf[7:7 + blen]
                    self.buf = self.buf[7 + blen:]
                    return op, rid, body
            try:
                chunk = self.sock.recv(4096)
            except OSError:
                return None
            if not chunk:
                return None
            self.buf += chunk

    def send(self, b: bytes) -> None:
        self.sock.sendall(b)

    def welcome(self, rid: int, keepalive_ms: int = 10_000, flags: Optional[int] = None,
                session_id: int = 7) -> None:
        """The Hello's (or a Resume's) ok; ``flags``: the 33rd byte (none: a
        32-byte welcome, as from an older server)."""
        body = struct.pack("<BBIIIQIIH", 0, 1, keepalive_ms, 10, 86_400_000, session_id, 100,
                           100, 1)
        if flags is not None:
            body += bytes([flags])
        self.send(HDR.pack(0x80, rid, len(body)) + body)

    def held(self, rid: int, key: bytes, token: int, hold: int = 1,
             ttl_left_ms: int = 0xFFFFFFFF) -> None:
        """A Held frame: one hold of a resumed session."""
        body = struct.pack("<QBIB", token, hold, ttl_left_ms, len(key)) + key
        self.send(HDR.pack(0x82, rid, len(body)) + body)

    def reply(self, rid: int, status: int, token: int = 0, ttl: int = 0xFFFFFFFF) -> None:
        self.send(HDR.pack(0x80, rid, 13) + struct.pack("<BQI", status, token, ttl))

    def refuse(self, rid: int, status: int, detail: bytes) -> None:
        """A status with detail: ``[u8 status][u8 len][detail]``."""
        body = bytes([status, len(detail)]) + detail
        self.send(HDR.pack(0x80, rid, len(body)) + body)

    def serve_pings(self) -> None:
        """Answers Pings ``ok`` until EOF (other requests: ``invalid``)."""
        while True:
            f = self.read()
            if f is None:
                return
            self.reply(f[1], 0 if f[0] == 12 else 5)


Handler = Callable[[FakeConn], None]


class FakeServer:
    """Runs ``handler`` for every connection, on a thread of its own."""

    def __init__(self, handler: Handler, tls: Optional[ssl.SSLContext] = None) -> None:
        self.handler = handler
        self.tls = tls
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.port = self.lsock.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self.connections = 0
        self.hellos: List[bytes] = []
        self._mu = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            with self._mu:
                if self._closed:
                    s.close()
                    return
                self.connections += 1
            threading.Thread(target=self._run, args=(s,), daemon=True).start()

    def _run(self, s: socket.socket) -> None:
        try:
            if self.tls is not None:
                s.settimeout(20)
                s = self.tls.wrap_socket(s, server_side=True)
            self.handler(FakeConn(s))
        except OSError:
            pass
        finally:
            s.close()

    def close(self) -> None:
        with self._mu:
            self._closed = True
        self.lsock.close()

    def __enter__(self) -> "FakeServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dead_address() -> str:
    """A loopback address nothing listens on (bound, then closed)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"
