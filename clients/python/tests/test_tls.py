"""TLS against the real ringlockd (``--certs-dir``), with certificates made
by the real ``ringlock cert`` (``$RINGLOCK_CLI``, default: the ``ringlock``
beside ringlockd): sessions over TLS with and without a client
certificate, ``--client-cert-auth``, a client certificate standing for the
auth token, and what must fail: another CA, a certificate for another
host, an expired certificate (signed with the real CA key by the
``openssl`` command, served by a fake server since ringlockd refuses to
start with it), plaintext to a TLS-only server (``tls_required``). A
``not_leader`` hint is dialled with TLS and verified against its own host."""

import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
import unittest
from typing import List, Optional, Sequence

import ringlock
import test_resume as resume
from fake_server import FakeConn, FakeServer
from harness import Server, poll, ringlockd

TOKEN = b"the-auth-token-7d21"
NOT_LEADER = 12


def cli() -> str:
    return os.environ.get("RINGLOCK_CLI") or os.path.join(os.path.dirname(ringlockd()),
                                                          "ringlock")


def run(*args: str) -> None:
    p = subprocess.run(list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {p.returncode}: {p.stdout.decode()}")


def port_of(addr: str) -> str:
    return addr.rsplit(":", 1)[1]


def expired_node_cert(work: str, ca_crt: str, ca_key: str, certs: str) -> None:
    """``certs/node.crt`` and ``node.key``: node 1 for localhost and
    127.0.0.1, signed by the CA, valid January 2020 only."""
    if shutil.which("openssl") is None:
        raise AssertionError("the expired-certificate test needs the openssl command")
    db = os.path.join(work, "db")
    os.makedirs(db)
    open(os.path.join(db, "index.txt"), "w").close()
    with open(os.path.join(db, "serial"), "w") as f:
        f.write("01\n")
    cnf = os.path.join(work, "ca.cnf")
    with open(cnf, "w") as f:
        f.write(f"""[ ca ]
default_ca = c
[ c ]
database = {db}/index.txt
new_certs_dir = {db}
serial = {db}/serial
default_md = sha256
policy = p
[ p ]
commonName = supplied
[ ext ]
subjectAltName = DNS:localhost,IP:127.0.0.1,URI:ringlock://node/1
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
basicConstraints = critical,CA:false
""")
    key, csr = os.path.join(certs, "node.key"), os.path.join(work, "node.csr")
    run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-out", key)
    run("openssl", "req", "-new", "-key", key, "-subj", "/CN=ringlock node 1", "-out", csr)
    run("openssl", "ca", "-batch", "-config", cnf, "-cert", ca_crt, "-keyfile", ca_key,
        "-in", csr, "-out", os.path.join(certs, "node.crt"), "-startdate", "20200101000000Z",
        "-enddate", "20200201000000Z", "-extensions", "ext", "-notext")


class TLSTest(unittest.TestCase):
    tmp: str

    @classmethod
    def setUpClass(cls) -> None:
        for b in (ringlockd(), cli()):
            if not os.access(b, os.X_OK):
                raise AssertionError(f"{b} missing: `cargo build --bins` at the repository "
                                     f"root, or set RINGLOCKD / RINGLOCK_CLI")
        cls.tmp = tempfile.mkdtemp(prefix="ringlock-tls-")
        t = cls.tmp
        r = cli()
        # The CA, node 1 for localhost and 127.0.0.1, client alice.
        cls.ca_key, cls.certs = f"{t}/ca.key", f"{t}/certs"
        run(r, "cert", "create-ca", "--certs-dir", cls.certs, "--ca-key", cls.ca_key)
        run(r, "cert", "create-node", "--certs-dir", cls.certs, "--ca-key", cls.ca_key,
            "--node-id", "1", "localhost", "127.0.0.1")
        run(r, "cert", "create-client", "--certs-dir", cls.certs, "--ca-key", cls.ca_key,
            "alice")
        # Another CA, with its own node and client.
        cls.other = f"{t}/other"
        run(r, "cert", "create-ca", "--certs-dir", cls.other, "--ca-key", f"{t}/other.key")
        run(r, "cert", "create-client", "--certs-dir", cls.other, "--ca-key", f"{t}/other.key",
            "mallory")
        # The first CA's node certificate for localhost only.
        cls.lh = f"{t}/lh"
        os.makedirs(cls.lh)
        shutil.copy(f"{cls.certs}/ca.crt", cls.lh)
        run(r, "cert", "create-node", "--certs-dir", cls.lh, "--ca-key", cls.ca_key,
            "--node-id", "1", "localhost")
        # The first CA's node certificate, expired.
        cls.expired = f"{t}/expired"
        os.makedirs(cls.expired)
        expired_node_cert(f"{t}/exp-work", f"{cls.certs}/ca.crt", cls.ca_key, cls.expired)
        cls.token_file = f"{t}/token"
        with open(cls.token_file, "wb") as f:
            f.write(TOKEN + b"\n")

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def server(self, certs: str, *extra: str) -> Server:
        s = Server(["--certs-dir", certs, *extra])
        self.addCleanup(s.kill9)
        return s

    def ctx(self, client: Optional[str] = None) -> ssl.SSLContext:
        return ringlock.tls_context(self.certs, client=client)

    def lock_unlock(self, addrs: Sequence[str], **kw: object) -> int:
        with ringlock.Client(list(addrs), retry=0, **kw) as c:  # type: ignore[arg-type]
            with c.lock("tls/k", timeout=5) as lease:
                with ringlock.Client(list(addrs), retry=0, **kw) as other:  # type: ignore[arg-type]
                    self.assertIsNone(other.try_lock("tls/k"), "the lock is not held")
                c.ping()
                token = lease.token
            with c.lock("tls/k", timeout=5) as again:
                self.assertGreater(again.token, token)
            return token

    # --- what works ----------------------------------------------------------------------
    def test_sessions_over_tls_without_a_client_certificate(self) -> None:
        srv = self.server(self.certs)
        self.lock_unlock([srv.addr], ssl_context=self.ctx())
        # The name dialled is what is checked: localhost is in the certificate too.
        self.lock_unlock([f"localhost:{port_of(srv.addr)}"], ssl_context=self.ctx())
        self.assertGreaterEqual(srv.metric('ringlock_tls_handshakes_total{result="ok"}'), 4)
        self.assertEqual(srv.metric('ringlock_tls_handshakes_total{result="failed"}'), 0)

    def test_many_threads_share_one_tls_session(self) -> None:
        # Writers on many threads, the reader thread, keep-alive Pings and
        # background Extends all through one TLS connection.
        srv = self.server(self.certs)
        errors: List[BaseException] = []
        with ringlock.Client(srv.addr, retry=0, keepalive=1.0, ssl_context=self.ctx()) as c:
            lease = c.acquire("tls/lease", ttl=0.6)

            def work(i: int) -> None:
                try:
                    for n in range(30):
                        with c.lock(f"tls/{i % 3}", timeout=10) as held:
                            self.assertGreater(held.token, 0)
                        c.ping()
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)

            ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            time.sleep(1.5)  # Pings every K/3, Extends every ttl/3
            self.assertEqual(errors, [])
            lease.check()  # kept alive by the background Extends
            self.assertIsNone(c.ended)
            lease.release()

    def test_a_client_certificate_stands_for_the_token(self) -> None:
        srv = self.server(self.certs, "--auth-token-file", self.token_file)
        self.lock_unlock([srv.addr], ssl_context=self.ctx("alice"))  # no auth_token
        self.lock_unlock([srv.addr], ssl_context=self.ctx(), auth_token=TOKEN)
        with self.assertRaises(ringlock.Unauthorized) as cm:
            ringlock.Client(srv.addr, retry=0, ssl_context=self.ctx())
        self.assertIn("client certificate", str(cm.exception))

    def test_client_cert_auth_needs_a_client_certificate_of_the_ca(self) -> None:
        srv = self.server(self.certs, "--client-cert-auth")
        self.lock_unlock([srv.addr], ssl_context=self.ctx("alice"))
        t0 = time.monotonic()
        with self.assertRaises(ringlock.TLSError) as cm:
            ringlock.Client(srv.addr, retry=10, ssl_context=self.ctx())
        self.assertLess(time.monotonic() - t0, 5, "refused, yet retried")
        self.assertIn("requires a client certificate", str(cm.exception))
        self.assertIn("client=NAME", str(cm.exception))
        self.assertEqual(cm.exception.address, srv.addr)
        # A client certificate of another CA: refused by the server.
        ctx = self.ctx()
        ctx.load_cert_chain(f"{self.other}/client.mallory.crt", f"{self.other}/client.mallory.key")
        with self.assertRaises(ringlock.TLSError) as cm:
            ringlock.Client(srv.addr, retry=10, ssl_context=ctx)
        self.assertIn("refused this client's certificate", str(cm.exception))
        self.assertEqual(srv.metric("ringlock_sessions_opened_total"), 2)

    # --- what fails ----------------------------------------------------------------------
    def test_plaintext_to_a_tls_only_server_is_told_tls_required(self) -> None:
        srv = self.server(self.certs)
        t0 = time.monotonic()
        with self.assertRaises(ringlock.TLSRequired) as cm:
            ringlock.Client(srv.addr, retry=10)
        self.assertLess(time.monotonic() - t0, 5, "tls_required was retried")
        e = cm.exception
        self.assertEqual(e.status, "tls_required")
        self.assertIn(srv.addr, str(e))
        self.assertIn("ssl_context=ringlock.tls_context(certs_dir)", str(e))
        self.assertEqual(srv.metric('ringlock_plaintext_refused_total{protocol="session"}'), 1)

    def test_a_server_of_another_ca_does_not_verify(self) -> None:
        srv = self.server(self.certs)
        t0 = time.monotonic()
        with self.assertRaises(ringlock.TLSError) as cm:
            ringlock.Client(srv.addr, retry=10, auth_token=TOKEN,
                            ssl_context=ringlock.tls_context(self.other))
        self.assertLess(time.monotonic() - t0, 5, "a verification failure was retried")
        self.assertIn("does not verify", str(cm.exception))
        self.assertIn("unable to get local issuer certificate", str(cm.exception))
        self.assertEqual(srv.metric("ringlock_sessions_opened_total"), 0)

    def test_a_certificate_for_another_host_does_not_verify(self) -> None:
        srv = self.server(self.lh)  # localhost only
        ctx = ringlock.tls_context(self.lh)
        with self.assertRaises(ringlock.TLSError) as cm:
            ringlock.Client(srv.addr, retry=0, ssl_context=ctx)  # 127.0.0.1
        self.assertIn("does not verify", str(cm.exception))
        self.assertIn("127.0.0.1", str(cm.exception))
        self.assertEqual(srv.metric("ringlock_sessions_opened_total"), 0)
        self.lock_unlock([f"localhost:{port_of(srv.addr)}"], ssl_context=ctx)

    def test_an_expired_certificate_does_not_verify(self) -> None:
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(f"{self.expired}/node.crt", f"{self.expired}/node.key")
        hellos: List[bytes] = []

        def handle(c: FakeConn) -> None:
            f = c.read()
            if f is not None:
                hellos.append(f[2])
                c.welcome(f[1])
                c.serve_pings()

        with FakeServer(handle, tls=server_ctx) as srv:
            with self.assertRaises(ringlock.TLSError) as cm:
                ringlock.Client(srv.addr, retry=0, auth_token=TOKEN, ssl_context=self.ctx())
            self.assertIn("certificate has expired", str(cm.exception))
            self.assertEqual(hellos, [], "a Hello went to a server that did not verify")

    # --- a resume, a not_leader hint ------------------------------------------------------------
    def node_ctx(self) -> ssl.SSLContext:
        """Node 1's certificate, for a fake TLS server."""
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(f"{self.certs}/node.crt", f"{self.certs}/node.key")
        return server_ctx

    def test_a_resumable_session_resumes_over_tls(self) -> None:
        # A Resume after a failover goes over TLS too, verified like the
        # Hello; so it may carry the auth token.
        sc = resume.Script(resume.serve({b"a": 10}),
                           resume.resumer([(b"a", 10, 1, 0xFFFFFFFF)], {}))
        with FakeServer(sc, tls=self.node_ctx()) as srv, \
                ringlock.Client(srv.addr, retry=0, auth_token=TOKEN, ssl_context=self.ctx()) as c:
            a = c.acquire("a")
            sc.kill(0)
            poll(lambda: c.resumes == 1, "the resume")
            c.ping()
            self.assertFalse(a.lost)
            with sc.cv:
                first = next(f for f in sc.frames if f[0] == 1)
            self.assertEqual(first[1], resume.OP_RESUME)
            self.assertIn(TOKEN, first[3])

    def not_leader_naming(self, leader: str) -> FakeServer:
        """A fake TLS server (node 1's certificate) answering not_leader."""
        server_ctx = self.node_ctx()

        def handle(c: FakeConn) -> None:
            f = c.read()
            if f is not None:
                c.refuse(f[1], NOT_LEADER, leader.encode())

        fake = FakeServer(handle, tls=server_ctx)
        self.addCleanup(fake.close)
        return fake

    def test_a_hint_is_dialled_with_tls_and_verified_against_its_host(self) -> None:
        # Not among the addresses, and the Hello carries the token: over
        # TLS it goes, since the leader's certificate is verified.
        srv = self.server(self.certs, "--auth-token-file", self.token_file)
        a = self.not_leader_naming(srv.addr)
        with ringlock.Client(a.addr, retry=0, auth_token=TOKEN, ssl_context=self.ctx()) as c:
            self.assertEqual(c.server_address, ("127.0.0.1", int(port_of(srv.addr))))
            c.acquire("hint/k").release()
        # The leader's certificate names localhost only; the hint says
        # 127.0.0.1: refused before any Hello.
        lh = self.server(self.lh, "--auth-token-file", self.token_file)
        b = self.not_leader_naming(lh.addr)
        with self.assertRaises(ringlock.TLSError) as cm:
            ringlock.Client(b.addr, retry=0, auth_token=TOKEN, ssl_context=self.ctx())
        self.assertEqual(cm.exception.address, lh.addr)
        self.assertIn(lh.addr, str(cm.exception))
        self.assertEqual(lh.metric("ringlock_sessions_opened_total"), 0)
        self.assertEqual(lh.metric('ringlock_tls_handshakes_total{result="ok"}'), 0)


if __name__ == "__main__":
    unittest.main()
