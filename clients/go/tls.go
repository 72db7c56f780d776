package ringlock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// WithTLS makes every connection of the session speak TLS with a clone of
// cfg: the Hello, each Resume, a not_leader hint. The server's
// certificate is verified against cfg.RootCAs and the host dialled (an IP
// address against the certificate's IP names): ServerName is set to that
// host for each connection, whatever cfg says. LoadTLSConfig makes cfg
// from a certs dir. Without TLS (or with InsecureSkipVerify) a not_leader
// hint that is not among Dial's addresses is not dialled when the Hello
// would carry the auth token, nor by a Resume (it carries the session
// id): *UnverifiedLeaderError.
func WithTLS(cfg *tls.Config) Option { return func(o *Options) { o.TLSConfig = cfg } }

var clientNameRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// LoadTLSConfig reads a certs dir made by `ringlock cert`: the server is
// verified against certsDir/ca.crt, TLS 1.3 only. A non-empty clientName
// adds the client certificate certsDir/client.NAME.crt with its key
// client.NAME.key (`ringlock cert create-client NAME`): a server with
// --client-cert-auth needs one, and on a server with --auth-token-file it
// stands for the token.
func LoadTLSConfig(certsDir, clientName string) (*tls.Config, error) {
	ca := filepath.Join(certsDir, "ca.crt")
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("%w: %v (`ringlock cert create-ca` writes it)", ErrInvalidArgument, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrInvalidArgument, ca)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	if clientName != "" {
		if !validClientName(clientName) {
			return nil, fmt.Errorf("%w: client certificate name %q: 1 to 64 of A-Z a-z 0-9 . _ -", ErrInvalidArgument, clientName)
		}
		crt := filepath.Join(certsDir, "client."+clientName+".crt")
		key := filepath.Join(certsDir, "client."+clientName+".key")
		pair, err := tls.LoadX509KeyPair(crt, key)
		if err != nil {
			return nil, fmt.Errorf("%w: client %s's certificate: %v (`ringlock cert create-client %s` writes %s and %s)", ErrInvalidArgument, clientName, err, clientName, crt, key)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

func validClientName(n string) bool { return clientNameRe.MatchString(n) }

// verifies reports whether connections made with cfg verify the server.
func verifies(cfg *tls.Config) bool { return cfg != nil && !cfg.InsecureSkipVerify }

// connect opens a connection to addr within ctx: TCP, then with
// o.TLSConfig a TLS handshake verifying the server against the host of
// addr.
func connect(ctx context.Context, addr string, o *Options) (net.Conn, error) {
	d := net.Dialer{KeepAlive: 15 * time.Second}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ringlock: connecting to %s: %w", addr, err)
	}
	if o.TLSConfig == nil {
		return raw, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		raw.Close()
		return nil, fmt.Errorf("%w: address %q: %v", ErrInvalidArgument, addr, err)
	}
	cfg := o.TLSConfig.Clone()
	cfg.ServerName = host
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, handshakeErr(addr, host, err)
	}
	return &tlsConn{Conn: tc, raw: raw}, nil
}

// tlsConn closes its TCP connection at once, without the close_notify a
// tls.Conn would try to send for up to 5 s to a server that may hang.
type tlsConn struct {
	*tls.Conn
	raw net.Conn
}

func (c *tlsConn) Close() error { return c.raw.Close() }

// handshakeErr says why a TLS handshake with addr failed: a *TLSError for
// a server certificate that does not verify (not retried), else an error
// another try may cure.
func handshakeErr(addr, host string, err error) error {
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ci x509.CertificateInvalidError
	if errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci) {
		return &TLSError{Addr: addr, Err: err, Reason: fmt.Sprintf(
			"the server's certificate does not verify: it must be issued by a CA of the TLS config's RootCAs (a certs dir's ca.crt), name the host dialled (%q) as a DNS name or IP address, and be within its dates", host)}
	}
	return fmt.Errorf("ringlock: TLS handshake with %s failed (a server without --certs-dir speaks plaintext only): %w", addr, err)
}

// alertErr turns a TLS alert read after the handshake into a *TLSError
// when it is about this client's certificate: with TLS 1.3 the server
// judges it after the client finished its handshake, so its verdict
// arrives with the first read. nil for anything else.
func alertErr(addr string, cfg *tls.Config, err error) error {
	var oe *net.OpError
	if cfg == nil || !errors.As(err, &oe) || oe.Op != "remote error" {
		return nil
	}
	alert := oe.Err.Error()
	switch {
	case strings.Contains(alert, "certificate required") && (len(cfg.Certificates) > 0 || cfg.GetClientCertificate != nil):
		// Go sends a client certificate only if it is issued by a CA the
		// server's request names.
		return &TLSError{Addr: addr, Err: err, Reason: "the server requires a client certificate of its CA (--client-cert-auth): this client's was not sent, it is not issued by a CA the server accepts"}
	case strings.Contains(alert, "certificate required"):
		return &TLSError{Addr: addr, Err: err, Reason: "the server requires a client certificate (--client-cert-auth): give LoadTLSConfig(certsDir, NAME) (client.NAME.crt, made by `ringlock cert create-client`)"}
	case strings.Contains(alert, "certificate"), strings.Contains(alert, "access denied"):
		return &TLSError{Addr: addr, Err: err, Reason: "the server refused this client's certificate: it must be issued by the server's CA and be within its dates"}
	}
	return nil
}

// listed reports whether addr (normalised) is one of addrs.
func listed(addrs []string, addr string) bool {
	for _, a := range addrs {
		if strings.EqualFold(a, addr) {
			return true
		}
	}
	return false
}

// hintGuard is the check a walk makes before it dials a not_leader hint:
// nil when the hint may be dialled, else the *UnverifiedLeaderError. A
// connection that carries a secret (resume: a Resume and its session id;
// else a Hello with an auth token) goes to an address not among addrs
// only when its server is verified.
func hintGuard(addrs []string, o *Options, resume bool) func(from, leader string) error {
	return func(from, leader string) error {
		if verifies(o.TLSConfig) || (!resume && len(o.AuthToken) == 0) || listed(addrs, leader) {
			return nil
		}
		return &UnverifiedLeaderError{Addr: from, Leader: leader, Resume: resume, TLS: o.TLSConfig != nil}
	}
}
