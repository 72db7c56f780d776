"""A connection that reaches itself is refused.

With nothing listening on a local port of the ephemeral range, a connect
may be given that same port as its own and complete to itself (TCP's
simultaneous open); the client would read its own requests back as
answers. Here a socket bound to a port and connected to that port makes
such a connection on purpose, and ``_connect`` must refuse it."""

import socket
import unittest
from unittest import mock

from ringlock import _client


def self_connected() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.connect(s.getsockname())
    return s


class SelfConnect(unittest.TestCase):
    def test_a_connection_to_itself_is_refused(self) -> None:
        s = self_connected()
        self.assertEqual(s.getsockname(), s.getpeername())
        with mock.patch.object(_client.socket, "create_connection", return_value=s):
            with self.assertRaises(ConnectionRefusedError) as cm:
                _client._connect(("127.0.0.1", s.getsockname()[1]), 1.0)
        self.assertIn("reached itself", str(cm.exception))
        self.assertEqual(s.fileno(), -1, "the socket is closed")

    def test_an_ordinary_connection_passes(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as l:
            l.bind(("127.0.0.1", 0))
            l.listen(1)
            c = _client._connect(l.getsockname(), 1.0)
            try:
                self.assertEqual(c.getpeername(), l.getsockname())
            finally:
                c.close()


if __name__ == "__main__":
    unittest.main()
