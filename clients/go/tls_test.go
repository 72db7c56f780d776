package ringlock

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringlock/ringlock/clients/go/internal/testserver"
)

// TLS against the real ringlockd (--certs-dir), with certificates made by
// the real `ringlock cert` (testserver.CLI): sessions over TLS with and
// without a client certificate, --client-cert-auth, a client certificate
// standing for the auth token, and what must fail: another CA, a
// certificate for another host, an expired certificate (made here, signed
// by the real CA key, and served by a fake server since ringlockd refuses
// to start with it), plaintext to a TLS-only server (tls_required). A
// not_leader hint is dialled with TLS and verified against its own host.

// pki is a certs dir made by `ringlock cert`: the CA, node 1 for hosts,
// client alice.
type pki struct {
	dir, caKey string
}

func runCLI(t *testing.T, args ...string) {
	t.Helper()
	cli, err := testserver.CLI()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("ringlock %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func newPKI(t *testing.T, hosts ...string) pki {
	t.Helper()
	root := t.TempDir()
	p := pki{dir: filepath.Join(root, "certs"), caKey: filepath.Join(root, "ca.key")}
	runCLI(t, "cert", "create-ca", "--certs-dir", p.dir, "--ca-key", p.caKey)
	runCLI(t, append([]string{"cert", "create-node", "--certs-dir", p.dir, "--ca-key", p.caKey, "--node-id", "1"}, hosts...)...)
	runCLI(t, "cert", "create-client", "--certs-dir", p.dir, "--ca-key", p.caKey, "alice")
	return p
}

// nodeFor is another certs dir of the same CA whose node certificate
// names only hosts.
func (p pki) nodeFor(t *testing.T, hosts ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(p.dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	runCLI(t, append([]string{"cert", "create-node", "--certs-dir", dir, "--ca-key", p.caKey, "--node-id", "1"}, hosts...)...)
	return dir
}

func (p pki) config(t *testing.T, client string) *tls.Config {
	t.Helper()
	cfg, err := LoadTLSConfig(p.dir, client)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// expiredNode is a node certificate for localhost and 127.0.0.1 signed by
// p's CA key, valid January 2020 only.
func (p pki) expiredNode(t *testing.T) tls.Certificate {
	t.Helper()
	read := func(name string) []byte {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			t.Fatalf("%s: no PEM block", name)
		}
		return blk.Bytes
	}
	caCert, err := x509.ParseCertificate(read(filepath.Join(p.dir, "ca.crt")))
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := x509.ParsePKCS8PrivateKey(read(p.caKey))
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	uri, _ := url.Parse("ringlock://node/1")
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2020),
		Subject:      pkix.Name{CommonName: "ringlock node 1"},
		NotBefore:    time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:     time.Date(2020, 2, 1, 0, 0, 0, 0, time.UTC),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		URIs:         []*url.URL{uri},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (p pki) nodeCert(t *testing.T) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(filepath.Join(p.dir, "node.crt"), filepath.Join(p.dir, "node.key"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startFakeTLS is a fake server speaking TLS with cert.
func startFakeTLS(t *testing.T, cert tls.Certificate, handle func(fc *fakeConn)) *fake {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startFakeOn(t, tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}), handle)
}

func startTLSServer(t *testing.T, certsDir string, extra ...string) *testserver.Server {
	t.Helper()
	srv, err := testserver.Start(append([]string{"--certs-dir", certsDir}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill9)
	return srv
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

func metric(t *testing.T, srv *testserver.Server, name string) float64 {
	t.Helper()
	v, err := srv.Metric(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// lockUnlock takes a key, sees a second session find it busy, releases it
// and takes it again with a larger token.
func lockUnlock(t *testing.T, addr string, opts ...Option) {
	t.Helper()
	s, err := Dial(tctx(t), []string{addr}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.Acquire(tctx(t), "tls/k", WithWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	other, err := Dial(tctx(t), []string{addr}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryLock(tctx(t), "tls/k"); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second session's TryLock: %v", err)
	}
	other.Close()
	if err := l.Release(tctx(t)); err != nil {
		t.Fatal(err)
	}
	again, err := s.Acquire(tctx(t), "tls/k", WithWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if again.Token() <= l.Token() {
		t.Fatalf("tokens %d then %d", l.Token(), again.Token())
	}
	if err := again.Release(tctx(t)); err != nil {
		t.Fatal(err)
	}
}

func tokenFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(f, append(testToken, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestTLSSessionsWithoutAClientCertificate(t *testing.T) {
	p := newPKI(t, "localhost", "127.0.0.1")
	srv := startTLSServer(t, p.dir)
	cfg := p.config(t, "")
	lockUnlock(t, srv.Lock, WithTLS(cfg))
	// The name dialled is what is checked: localhost is in the certificate too.
	lockUnlock(t, "localhost:"+portOf(srv.Lock), WithTLS(cfg))
	if n := metric(t, srv, `ringlock_tls_handshakes_total{result="ok"}`); n < 4 {
		t.Fatalf("%v TLS handshakes", n)
	}
	if cfg.ServerName != "" {
		t.Fatal("Dial changed the caller's config")
	}
}

func TestTLSManyGoroutinesShareOneSession(t *testing.T) {
	p := newPKI(t, "127.0.0.1")
	srv := startTLSServer(t, p.dir)
	s, err := Dial(tctx(t), []string{srv.Lock}, WithTLS(p.config(t, "")), WithKeepalive(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lease, err := s.Acquire(tctx(t), "tls/lease", WithTTL(600*time.Millisecond), WithAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for n := 0; n < 30; n++ {
				l, err := s.Acquire(tctx(t), "tls/"+string(rune('a'+i%3)), WithWait(10*time.Second))
				if err == nil {
					err = l.Release(tctx(t))
				}
				if err == nil {
					err = s.Ping(tctx(t))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(i)
	}
	wg.Wait()
	time.Sleep(1500 * time.Millisecond) // Pings every K/3, Extends every TTL/3
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	select {
	case <-lease.Lost():
		t.Fatalf("the lease was lost: %v", lease.Err())
	default:
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestTLSClientCertificateStandsForTheToken(t *testing.T) {
	p := newPKI(t, "127.0.0.1")
	srv := startTLSServer(t, p.dir, "--auth-token-file", tokenFile(t))
	lockUnlock(t, srv.Lock, WithTLS(p.config(t, "alice"))) // no token
	lockUnlock(t, srv.Lock, WithTLS(p.config(t, "")), WithAuthToken(testToken))
	if _, err := Dial(tctx(t), []string{srv.Lock}, WithTLS(p.config(t, ""))); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("no certificate, no token: %v", err)
	}
}

func TestTLSClientCertAuthNeedsAClientCertificateOfTheCA(t *testing.T) {
	p := newPKI(t, "127.0.0.1")
	srv := startTLSServer(t, p.dir, "--client-cert-auth")
	lockUnlock(t, srv.Lock, WithTLS(p.config(t, "alice")))
	b := startFake(t, welcomer(nil))
	_, err := Dial(tctx(t), []string{srv.Lock, b.addr()}, WithTLS(p.config(t, "")))
	var te *TLSError
	if !errors.As(err, &te) || !errors.Is(err, ErrTLS) || te.Addr != srv.Lock || !strings.Contains(err.Error(), "requires a client certificate") || !strings.Contains(err.Error(), "LoadTLSConfig(certsDir, NAME)") {
		t.Fatalf("got %v", err)
	}
	if b.connections() != 0 {
		t.Fatal("another address was tried after a TLS refusal")
	}
	// A client certificate of another CA: refused by the server.
	other := newPKI(t, "127.0.0.1")
	cfg := p.config(t, "")
	cfg.Certificates = other.config(t, "alice").Certificates
	_, err = Dial(tctx(t), []string{srv.Lock}, WithTLS(cfg))
	// (Go does not even send it: the server's request names its CA.)
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "not issued by a CA the server accepts") {
		t.Fatalf("another CA's client certificate: %v", err)
	}
	if n := metric(t, srv, "ringlock_sessions_opened_total"); n != 2 {
		t.Fatalf("%v sessions opened", n)
	}
}

func TestTLSPlaintextToATLSOnlyServerIsToldTLSRequired(t *testing.T) {
	p := newPKI(t, "127.0.0.1")
	srv := startTLSServer(t, p.dir)
	_, err := Dial(tctx(t), []string{srv.Lock})
	if !errors.Is(err, ErrTLSRequired) || !strings.Contains(err.Error(), srv.Lock) || !strings.Contains(err.Error(), "WithTLS") {
		t.Fatalf("got %v", err)
	}
	if n := metric(t, srv, `ringlock_plaintext_refused_total{protocol="session"}`); n != 1 {
		t.Fatalf("%v plaintext sessions refused", n)
	}
}

func TestTLSAServerOfAnotherCADoesNotVerify(t *testing.T) {
	p := newPKI(t, "127.0.0.1")
	other := newPKI(t, "127.0.0.1")
	srv := startTLSServer(t, p.dir)
	_, err := Dial(tctx(t), []string{srv.Lock}, WithTLS(other.config(t, "")), WithAuthToken(testToken))
	var te *TLSError
	var ua x509.UnknownAuthorityError
	if !errors.As(err, &te) || !errors.As(err, &ua) || !strings.Contains(err.Error(), "does not verify") {
		t.Fatalf("got %v", err)
	}
	if n := metric(t, srv, "ringlock_sessions_opened_total"); n != 0 {
		t.Fatalf("%v sessions opened", n)
	}
}

func TestTLSACertificateForAnotherHostDoesNotVerify(t *testing.T) {
	p := newPKI(t, "127.0.0.1")
	lh := p.nodeFor(t, "localhost")
	srv := startTLSServer(t, lh)
	cfg := p.config(t, "")
	_, err := Dial(tctx(t), []string{srv.Lock}, WithTLS(cfg)) // 127.0.0.1
	var he x509.HostnameError
	if !errors.As(err, &he) || !errors.Is(err, ErrTLS) || !strings.Contains(err.Error(), `"127.0.0.1"`) {
		t.Fatalf("got %v", err)
	}
	lockUnlock(t, "localhost:"+portOf(srv.Lock), WithTLS(cfg))
}

func TestTLSAnExpiredCertificateDoesNotVerify(t *testing.T) {
	p := newPKI(t, "127.0.0.1")
	hellos := make(chan []byte, 1)
	f := startFakeTLS(t, p.expiredNode(t), func(fc *fakeConn) {
		if _, rid, body, ok := fc.read(); ok {
			hellos <- body
			fc.welcome(rid)
		}
	})
	_, err := Dial(tctx(t), []string{f.addr()}, WithTLS(p.config(t, "")), WithAuthToken(testToken))
	var ci x509.CertificateInvalidError
	if !errors.As(err, &ci) || ci.Reason != x509.Expired || !errors.Is(err, ErrTLS) {
		t.Fatalf("got %v", err)
	}
	select {
	case <-hellos:
		t.Fatal("a Hello went to a server that did not verify")
	default:
	}
}

func TestTLSAHintIsDialledWithTLSAndVerifiedAgainstItsHost(t *testing.T) {
	p := newPKI(t, "localhost", "127.0.0.1")
	notLeader := func(leader string) *fake {
		return startFakeTLS(t, p.nodeCert(t), refuser(StatusNotLeader, str(leader), nil))
	}
	cfg := p.config(t, "")
	// Not among the addresses, and the Hello carries the token: over TLS
	// it goes, since the leader's certificate is verified.
	srv := startTLSServer(t, p.dir, "--auth-token-file", tokenFile(t))
	a := notLeader(srv.Lock)
	s, err := Dial(tctx(t), []string{a.addr()}, WithTLS(cfg), WithAuthToken(testToken))
	if err != nil {
		t.Fatal(err)
	}
	if s.RemoteAddr().String() != srv.Lock {
		t.Fatalf("connected to %s", s.RemoteAddr())
	}
	if err := s.Ping(tctx(t)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// The leader's certificate names localhost only; the hint says
	// 127.0.0.1: refused before any Hello.
	lh := startTLSServer(t, p.nodeFor(t, "localhost"), "--auth-token-file", tokenFile(t))
	b := notLeader(lh.Lock)
	_, err = Dial(tctx(t), []string{b.addr()}, WithTLS(cfg), WithAuthToken(testToken))
	var te *TLSError
	var he x509.HostnameError
	if !errors.As(err, &te) || te.Addr != lh.Lock || !errors.As(err, &he) {
		t.Fatalf("got %v", err)
	}
	if n := metric(t, lh, "ringlock_sessions_opened_total"); n != 0 {
		t.Fatalf("%v sessions opened", n)
	}
	if n := metric(t, lh, `ringlock_tls_handshakes_total{result="ok"}`); n != 0 {
		t.Fatalf("%v handshakes completed", n)
	}
}

func TestLoadTLSConfigNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadTLSConfig(dir, ""); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "ca.crt") {
		t.Fatalf("got %v", err)
	}
	p := newPKI(t, "127.0.0.1")
	if _, err := LoadTLSConfig(p.dir, "../alice"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a name with a slash: %v", err)
	}
	if _, err := LoadTLSConfig(p.dir, "bob"); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "client.bob.crt") {
		t.Fatalf("got %v", err)
	}
	cfg := p.config(t, "alice")
	if cfg.MinVersion != tls.VersionTLS13 || len(cfg.Certificates) != 1 || cfg.RootCAs == nil {
		t.Fatalf("got %+v", cfg)
	}
}

func TestTLSAResumableSessionResumesOverTLS(t *testing.T) {
	// A Resume after a failover goes over TLS too, verified like the Hello;
	// so it may carry the auth token.
	p := newPKI(t, "localhost", "127.0.0.1")
	sc := newScript(opener(map[string]uint64{"a": 10}, flagResumable, 10000),
		resumer([]heldSpec{{"a", 10, HoldSession, noTTL}}, nil))
	f := startFakeTLS(t, p.nodeCert(t), sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()}, WithTLS(p.config(t, "")), WithAuthToken(testToken))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, err := s.Acquire(tctx(t), "a")
	if err != nil {
		t.Fatal(err)
	}
	sc.kill(t, 0)
	if err := s.Ping(tctx(t)); err != nil { // waits for the resume
		t.Fatal(err)
	}
	if s.Resumes() != 1 || !isOpen(a.Lost()) {
		t.Fatalf("resumes %d, lost %v", s.Resumes(), a.Err())
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, fr := range sc.frames {
		if fr.conn == 1 {
			if fr.op != opResume || !strings.Contains(string(fr.body), string(testToken)) {
				t.Fatalf("the new connection's first frame: op %d body % x", fr.op, fr.body)
			}
			return
		}
	}
	t.Fatal("no frame on the new connection")
}
