"""Test support: the real ringlockd on ephemeral loopback ports, its admin
port (KEYX, RSET) and its metrics, and a lease-holding child process."""

from __future__ import annotations

import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Dict, IO, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_SRC = os.path.join(os.path.dirname(HERE), "src")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def ringlockd() -> str:
    return os.environ.get("RINGLOCKD") or os.path.join(REPO, "target", "debug", "ringlockd")


def threads() -> int:
    return int(os.environ.get("RINGLOCK_TEST_THREADS", "1"))


class Failed(AssertionError):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Failed(msg)


def poll(pred, what: str, timeout: float = 20.0, every: float = 0.005):  # type: ignore[no-untyped-def]
    """Polls ``pred`` until it returns something truthy; bounded, so a hang fails."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def _field(line: str, name: str) -> Optional[str]:
    for part in line.split():
        if part.startswith(name + "="):
            return part[len(name) + 1:]
    return None


@dataclass
class KeyInfo:
    key: bytes
    source: bytes
    endpoint: str
    acquired: int
    token: int
    mode: int  # 0 persistent, 1 session, 2 lease
    lease_ms_left: Optional[int]


class Server:
    """``ringlockd --bind 127.0.0.1:0 --admin-bind 127.0.0.1:0 --metrics-bind 127.0.0.1:0``."""

    def __init__(self, extra: Sequence[str] = (), n_threads: Optional[int] = None) -> None:
        self.extra = list(extra)
        self.n_threads = threads() if n_threads is None else n_threads
        self.start()

    def start(self) -> None:
        cmd = [ringlockd(), "--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0",
               "--metrics-bind", "127.0.0.1:0", "--threads", str(self.n_threads)] + self.extra
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        assert self.proc.stderr is not None
        err: IO[bytes] = self.proc.stderr

        def pump() -> None:
            for raw in err:
                self.lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
            self.lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        seen: List[str] = []
        while True:
            try:
                line = self.lines.get(timeout=20)
            except queue.Empty:
                self.kill9()
                raise Failed("ringlockd did not listen within 20 s:\n" + "\n".join(seen))
            if line is None:
                self.proc.wait()
                raise Failed(f"ringlockd exited ({self.proc.returncode}):\n" + "\n".join(seen))
            seen.append(line)
            if "event=listening" in line:
                self.addr = _field(line, "lock") or ""
                self.admin = _field(line, "admin") or ""
                self.metrics_addr = _field(line, "metrics") or ""
                return

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill9()

    # --- admin port -----------------------------------------------------------
    def _admin(self, cmd: bytes) -> socket.socket:
        host, port = self.admin.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=20)
        s.sendall(cmd)
        return s

    @staticmethod
    def _read(s: socket.socket, n: int) -> bytes:
        out = b""
        while len(out) < n:
            b = s.recv(n - len(out))
            if not b:
                raise Failed("admin port closed mid-answer")
            out += b
        return out

    def keyx(self) -> Dict[bytes, KeyInfo]:
        """The admin ``KEYX`` listing, by key."""
        s = self._admin(b"KEYX")
        try:
            (count,) = struct.unpack("<I", self._read(s, 4))
            out: Dict[bytes, KeyInfo] = {}
            for _ in range(count):
                key = self._read(s, self._read(s, 1)[0])
                src = self._read(s, self._read(s, 1)[0])
                ep = self._read(s, self._read(s, 1)[0]).decode()
                acq, tok, mode, left = struct.unpack("<qQBI", self._read(s, 21))
                out[key] = KeyInfo(key, src, ep, acq, tok, mode,
                                   None if left == 0xFFFFFFFF else left)
            return out
        finally:
            s.close()

    def rset(self, *keys: bytes) -> None:
        """Admin ``RSET``: resets the keys' holders."""
        body = struct.pack("<I", len(keys)) + b"".join(bytes([len(k)]) + k for k in keys)
        s = self._admin(b"RSET" + body)
        try:
            got = self._read(s, len(keys) + 1)
            check(got == b"+" * (len(keys) + 1), f"RSET answered {got!r}")
        finally:
            s.close()

    # --- metrics ------------------------------------------------------------------
    def metric(self, name: str) -> float:
        host, port = self.metrics_addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=20) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                data += b
        for line in data.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise Failed(f"no series {name} in the metrics")

    def wait_queued(self, n: int) -> None:
        """Waits until the server shows ``n`` queued waiters (its gauges are
        published once per loop tick)."""
        poll(lambda: self.metric("ringlock_queued_waiters") == n, f"{n} queued waiters")


class Child:
    """A Python process holding a lock with the client (``holder.py``),
    driven line by line over stdin/stdout."""

    def __init__(self, *args: str) -> None:
        # The same package as the suite's own (PYTHONPATH, or src/ when unset).
        env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH") or PKG_SRC)
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "holder.py"), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.out: "queue.Queue[Optional[str]]" = queue.Queue()
        assert self.proc.stdout is not None
        stdout = self.proc.stdout

        def pump() -> None:
            for raw in stdout:
                self.out.put(raw.decode().rstrip("\n"))
            self.out.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def expect(self, prefix: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.out.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise Failed(f"the child printed no {prefix!r} line within {timeout} s") from None
            if line is None:
                raise Failed(f"the child exited ({self.proc.wait()}) before printing {prefix!r}")
            if line.startswith(prefix):
                return line
            raise Failed(f"the child printed {line!r}, expected {prefix!r}")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
