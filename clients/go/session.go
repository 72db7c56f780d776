package ringlock

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultPort is ringlockd's lock port; an address without a port gets it.
const DefaultPort = 22119

// Longest interval between keep-alive Pings, and longest a Ping may go
// unanswered, whatever the keep-alive deadline.
const (
	pingIntervalMax = 10 * time.Second
	pingTimeoutMax  = 10 * time.Second
)

// helloRid is the request id of the Hello; requests after it count up from
// 2 and wrap through 0 like any other value (rid 0 is ordinary: a Lost
// push also carries rid 0, but it is another kind of frame).
const helloRid = 1

// Options configure Dial. The zero value is usable: the server's default
// keep-alive, no auth token, the server's default source (the client's IP).
type Options struct {
	// Source is sent with every Acquire (0..=255 bytes) and shown by
	// `ringlock keys`. Empty: the server uses the client's IP address.
	Source string
	// AuthToken is the server's --auth-token-file secret (1..=255 bytes),
	// sent in the Hello. A server without one ignores it.
	AuthToken []byte
	// Keepalive is the keep-alive deadline to ask for (whole
	// milliseconds). The server clamps it to its bounds; the Pings are
	// derived from the one it applies (Session.Keepalive). Zero: the
	// server's default (10 s unless configured).
	Keepalive time.Duration
	// DialTimeout bounds connecting to one address and the Hello's answer
	// (default 3 s). The context passed to Dial bounds the whole Dial.
	DialTimeout time.Duration
	// ReleaseTimeout bounds the Release that the client sends on its own:
	// for a grant that won the race against a cancellation (default 10 s).
	ReleaseTimeout time.Duration
	// TLSConfig, when set, makes every connection speak TLS (WithTLS
	// says how the server is verified; LoadTLSConfig reads a certs dir).
	// Nil: plaintext.
	TLSConfig *tls.Config

	// helloVersion is the version the Hello asks for: protocolVersion,
	// or another one in the tests of version negotiation.
	helloVersion uint8
}

// An Option sets one field of Options.
type Option func(*Options)

// WithSource sets Options.Source.
func WithSource(source string) Option { return func(o *Options) { o.Source = source } }

// WithAuthToken sets Options.AuthToken.
func WithAuthToken(token []byte) Option {
	return func(o *Options) { o.AuthToken = append([]byte(nil), token...) }
}

// WithKeepalive sets Options.Keepalive.
func WithKeepalive(d time.Duration) Option { return func(o *Options) { o.Keepalive = d } }

// WithDialTimeout sets Options.DialTimeout.
func WithDialTimeout(d time.Duration) Option { return func(o *Options) { o.DialTimeout = d } }

// WithReleaseTimeout sets Options.ReleaseTimeout.
func WithReleaseTimeout(d time.Duration) Option { return func(o *Options) { o.ReleaseTimeout = d } }

// withHelloVersion makes the Hello ask for session protocol version v
// (tests of version negotiation).
func withHelloVersion(v uint8) Option { return func(o *Options) { o.helloVersion = v } }

// WithOptions replaces all options with o.
func WithOptions(o Options) Option { return func(dst *Options) { *dst = o } }

// A Session is one connection to ringlockd's lock port, opened with a
// Hello. It is safe for concurrent use: any number of goroutines may wait
// on it at once (every request carries its own request id), and one
// background goroutine reads every answer and push. Another sends the
// keep-alive Pings.
//
// The session does not reconnect, except for a resume: once it ended
// (Done is closed), every request fails with ErrSessionEnded and every
// lock it held is reported lost; open a new one with Dial.
//
// Resume (cluster mode). When the server's welcome has the resumable flag
// (Resumable: a replicated session of a cluster), a failed connection
// (EOF, an error, a not_leader close, an unanswered keep-alive Ping) does
// not end the session at once: while the keep-alive, counted from the last
// frame received, has not passed, the session walks its addresses (a
// not_leader's hint first; one not among them only over verified TLS, see
// WithTLS) sending a Resume as each new connection's first
// frame. Requests made meanwhile wait and are sent after it. The holds the
// server lists (Held frames) are kept (their Lost channels stay open),
// those it does not list are lost (LostNotListed); an Acquire in flight
// whose key is listed with a token this client never received is granted
// with it, the other Acquires, an Extend, a Release whose hold is still
// listed and a caller's Ping are sent again, a Release whose hold is not
// listed has happened, a Cancel is settled with its Acquire; a listed hold
// nobody here knows is released by token. Watches are not carried over:
// each answered one ends (Watch.Err is a *WatchEndedError, Resumed) and
// is watched again by its user, a re-read; a Watch not answered yet is
// sent again. A Proclaim in flight is sent again if its hold is listed
// (the same value again is harmless), else answered as stale_token (the
// leadership is lost). Resumes counts the resumes.
// unknown_session (Err then matches ErrUnknownSession), any other refusal,
// or the keep-alive passing end the session as a failed connection always
// did. Without the flag a failed connection ends the session.
type Session struct {
	conn           net.Conn // guarded by mu: a resume replaces it
	addr           string   // guarded by mu
	addrs          []string // every address Dial was given, normalised
	opts           Options
	source         string
	w              welcome
	keepalive      time.Duration
	interval       time.Duration // I: a Ping is due this long after the last
	pingTimeout    time.Duration // T: a Ping unanswered this long is a loss
	releaseTimeout time.Duration

	wmu sync.Mutex // one frame written at a time

	mu      sync.Mutex
	nextRid uint32
	pending map[uint32]*call // from before a frame is written until its answer is read
	holds   map[holdID]*Lease
	err     error         // why the session ended; set once
	done    chan struct{} // closed when err is set

	// modes: the welcome (of the latest resume, after one) had the modes
	// flag: shared and semaphore Acquires may be sent. Guarded by mu.
	modes bool
	// watches: the welcome (of the latest resume) had the watches flag:
	// Watch may be sent. Guarded by mu.
	watches bool
	// proclaim: the welcome (of the latest resume) had the proclaim flag:
	// Proclaim may be sent. Guarded by mu.
	proclaim bool
	// watchers are the session's watches by the Watch's request id, from
	// before the Watch is written until its Unwatch is answered (or the
	// connection ends); their rids are not reused meanwhile. Guarded by mu.
	watchers map[uint32]*Watch

	// Resume (a session whose welcome had the resumable flag).
	resumable bool
	resuming  bool   // from a failed connection until the resume: frames are not written
	resumes   int    // resumes that succeeded
	gen       uint64 // the connection's generation: one more after each resume
	seq       uint64 // order in which requests were registered
	failCause error  // why a writer or the keep-alive failed the connection
	t0        time.Time
	lastRx    atomic.Int64 // when the last frame was read, as time since t0
}

type holdID struct {
	key   string
	token uint64
}

// call is an outstanding request. ch is nil for a request whose answer
// nobody waits for (a Cancel).
type call struct {
	op     byte
	key    string
	mode   HoldMode
	access Access // an Acquire's
	ttl    time.Duration
	sentAt time.Time
	ch     chan result

	frame     []byte // as written, rid included: a resume sends it again
	seq       uint64
	token     uint64 // a Release's or a Proclaim's token
	target    uint32 // a Cancel's Acquire's rid
	internal  bool   // a keep-alive Ping (a resume drops it)
	cancelled bool   // an Acquire whose Cancel was sent
	watch     *Watch // a Watch's
}

// result is an answer, or the session's end (err).
type result struct {
	r     reply
	lease *Lease // a granted Acquire, already registered in holds
	err   error
}

// Dial connects to the first address in addrs that accepts a session and
// opens it. An address is "HOST", "HOST:PORT" or "[IPV6]:PORT"; without a
// port it means port 22119. Addresses are tried in order, each once; a
// server that answers the Hello with a refusal ends the search: a
// *StatusError for unauthorized or invalid (errors.Is(err,
// ErrUnauthorized)), a *VersionError naming the versions the server
// speaks for unsupported_version, ErrTLSRequired for a server that takes
// sessions over TLS only, a *TLSError for a TLS connection refused (a
// certificate that does not verify). A server that answers not_leader
// counts as a failure to connect: the leader it names is tried next (each
// address at most once), then the remaining addresses — unless the Hello
// carries an auth token, the connection is not verified (no WithTLS) and
// the leader is not among addrs: then Dial fails with an
// *UnverifiedLeaderError once the other addresses failed.
func Dial(ctx context.Context, addrs []string, opts ...Option) (*Session, error) {
	o := Options{DialTimeout: 3 * time.Second, ReleaseTimeout: 10 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 3 * time.Second
	}
	if o.ReleaseTimeout <= 0 {
		o.ReleaseTimeout = 10 * time.Second
	}
	if o.helloVersion == 0 {
		o.helloVersion = protocolVersion
	}
	if len(o.Source) > MaxSourceLen {
		return nil, fmt.Errorf("%w: a source is at most %d bytes, got %d", ErrInvalidArgument, MaxSourceLen, len(o.Source))
	}
	if len(o.AuthToken) > MaxAuthTokenLen {
		return nil, fmt.Errorf("%w: an auth token is at most %d bytes, got %d", ErrInvalidArgument, MaxAuthTokenLen, len(o.AuthToken))
	}
	if o.Keepalive < 0 {
		return nil, fmt.Errorf("%w: a negative keep-alive", ErrInvalidArgument)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: no server address", ErrInvalidArgument)
	}
	norm := make([]string, len(addrs))
	for i, a := range addrs {
		n, err := normalizeAddr(a)
		if err != nil {
			return nil, err
		}
		norm[i] = n
	}
	var s *Session
	tried, err, stop := walk(ctx, norm, "", "", hintGuard(norm, &o, false), func(a string) error {
		var err error
		s, err = dialOne(ctx, a, norm, &o)
		return err
	})
	if stop {
		if err == nil {
			return s, nil
		}
		return nil, err
	}
	if len(tried) == 1 {
		return nil, err
	}
	return nil, fmt.Errorf("ringlock: no session could be opened (%s): %w", strings.Join(tried, "; "), err)
}

// walk tries each address once, in order; an attempt answered not_leader
// puts the leader it names first among those not tried yet (one that is
// not an address is skipped), and so does hint (named by hintFrom). A
// leader that guard refuses is not dialled: once the other addresses
// failed, the walk stops with guard's error. stop: an attempt succeeded
// (err nil), or err is a refusal no other address can change (a
// *StatusError, a *VersionError, a *TLSError, guard's), or ctx ended.
// Otherwise err is the last failure and tried says every one.
func walk(ctx context.Context, addrs []string, hint, hintFrom string, guard func(from, leader string) error, try func(addr string) error) (tried []string, err error, stop bool) {
	seen := map[string]bool{}
	todo := append([]string(nil), addrs...)
	var refused error
	prefer := func(from, h string) {
		n, herr := normalizeAddr(h)
		if herr != nil || seen[n] {
			return
		}
		if guard != nil {
			if err := guard(from, n); err != nil {
				refused = err
				return
			}
		}
		todo = append([]string{n}, todo...)
	}
	if hint != "" {
		prefer(hintFrom, hint)
	}
	var last error
	for len(todo) > 0 {
		a := todo[0]
		todo = todo[1:]
		if seen[a] {
			continue
		}
		seen[a] = true
		err := try(a)
		if err == nil {
			return tried, nil, true
		}
		var se *StatusError
		var ve *VersionError
		var te *TLSError
		if errors.As(err, &se) || errors.As(err, &ve) || errors.As(err, &te) || ctx.Err() != nil {
			return tried, err, true
		}
		tried = append(tried, err.Error())
		last = err
		var nl *NotLeaderError
		if errors.As(err, &nl) && nl.Leader != "" {
			// Preferred over every address not tried yet.
			prefer(a, nl.Leader)
		}
	}
	if refused != nil {
		// Only the configuration can change it: not retried.
		return tried, refused, true
	}
	return tried, last, false
}

// normalizeAddr adds the default port to an address without one.
func normalizeAddr(a string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("%w: address %q: %s", ErrInvalidArgument, a, why)
	}
	if a == "" {
		return bad("empty")
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		// No port: a host name, an IPv4 address, a bare or bracketed IPv6.
		h := a
		if strings.HasPrefix(a, "[") != strings.HasSuffix(a, "]") {
			return bad("unbalanced brackets")
		}
		h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
		if h == "" || strings.ContainsAny(h, "[] ") {
			return bad(err.Error())
		}
		return net.JoinHostPort(h, strconv.Itoa(DefaultPort)), nil
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return bad("the port must be 1..65535")
	}
	if host == "" {
		return bad("no host")
	}
	return a, nil
}

func dialOne(ctx context.Context, addr string, addrs []string, o *Options) (*Session, error) {
	dctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	conn, err := connect(dctx, addr, o)
	if err != nil {
		return nil, err
	}
	deadline, _ := dctx.Deadline()
	// The Hello must be answered within the dial timeout.
	if err := conn.SetDeadline(deadline); err != nil {
		conn.Close()
		return nil, err
	}
	// The context can also end the Hello early. The watcher is stopped
	// (and waited for) before the deadline is cleared, so it can never
	// expire a session that was opened.
	watch, watching := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watching)
		select {
		case <-dctx.Done():
			_ = conn.SetDeadline(time.Unix(1, 0))
		case <-watch:
		}
	}()
	stopWatch := func() { close(watch); <-watching }
	fail := func(err error) (*Session, error) {
		stopWatch()
		conn.Close()
		return nil, err
	}

	ka := uint32(0)
	if o.Keepalive > 0 {
		ms := (o.Keepalive + time.Millisecond - 1) / time.Millisecond
		if ms > 0xFFFFFFFF {
			ms = 0xFFFFFFFF
		}
		ka = uint32(ms)
	}
	if _, err := conn.Write(encodeHello(helloRid, o.helloVersion, ka, o.AuthToken)); err != nil {
		return fail(fmt.Errorf("ringlock: hello to %s: %w", addr, err))
	}
	br := bufio.NewReader(conn)
	var h [headerLen]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		if te := alertErr(addr, o.TLSConfig, err); te != nil {
			return fail(te)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fail(fmt.Errorf("%w: %s closed the connection before answering the Hello (not a ringlockd with sessions?)", ErrProtocol, addr))
		}
		return fail(fmt.Errorf("ringlock: hello to %s: %w", addr, err))
	}
	if h[0] != kindReply {
		return fail(fmt.Errorf("%w: %s answered %#02x to a Hello: a Locking-Center server, or a ringlockd without sessions", ErrProtocol, addr, h[0]))
	}
	_, rid, blen, err := decodeHeader(h[:])
	if err != nil || rid != helloRid {
		return fail(fmt.Errorf("%w: %s: bad Hello reply header % x", ErrProtocol, addr, h))
	}
	body := make([]byte, blen)
	if _, err := io.ReadFull(br, body); err != nil {
		return fail(fmt.Errorf("ringlock: hello to %s: %w", addr, err))
	}
	var w welcome
	if blen == replyBodyLen || (blen > 0 && hasDetail(body[0])) {
		// A refused Hello: the first body byte picks the layout, a
		// status with detail or the plain 13-byte Reply.
		r, err := decodeReply(body)
		if err != nil {
			return fail(fmt.Errorf("%w: %s: %v", ErrProtocol, addr, err))
		}
		switch r.status {
		case StatusUnsupportedVersion:
			return fail(&VersionError{Addr: addr, Client: o.helloVersion, Versions: r.detail})
		case StatusNotLeader:
			return fail(&NotLeaderError{Addr: addr, Leader: string(r.detail)})
		case StatusTLSRequired:
			return fail(tlsRequired(addr, "hello"))
		}
		w.status = r.status
	} else if w, err = decodeWelcome(body); err != nil {
		return fail(fmt.Errorf("%w: %s: Hello reply: %v", ErrProtocol, addr, err))
	}
	if w.status != StatusOK {
		return fail(&StatusError{Op: "hello", Status: w.status})
	}
	if w.version != protocolVersion {
		return fail(fmt.Errorf("%w: %s speaks session protocol version %d", ErrProtocol, addr, w.version))
	}
	if w.keepaliveMs == 0 {
		return fail(fmt.Errorf("%w: %s applies a keep-alive of 0 ms", ErrProtocol, addr))
	}
	stopWatch()
	if err := conn.SetDeadline(time.Time{}); err != nil {
		conn.Close()
		return nil, err
	}
	k := time.Duration(w.keepaliveMs) * time.Millisecond
	s := &Session{
		conn:           conn,
		addr:           addr,
		addrs:          addrs,
		opts:           *o,
		resumable:      w.flags&flagResumable != 0,
		modes:          w.flags&flagModes != 0,
		watches:        w.flags&flagWatches != 0,
		proclaim:       w.flags&flagProclaim != 0,
		watchers:       make(map[uint32]*Watch),
		t0:             time.Now(),
		source:         o.Source,
		w:              w,
		keepalive:      k,
		interval:       clampDur(k/3, time.Millisecond, pingIntervalMax),
		pingTimeout:    clampDur(k/3, time.Millisecond, pingTimeoutMax),
		releaseTimeout: o.ReleaseTimeout,
		nextRid:        helloRid + 1,
		pending:        make(map[uint32]*call),
		holds:          make(map[holdID]*Lease),
		done:           make(chan struct{}),
	}
	go s.readLoop(br)
	go s.keepaliveLoop()
	return s, nil
}

func clampDur(d, lo, hi time.Duration) time.Duration {
	if d < lo {
		return lo
	}
	if d > hi {
		return hi
	}
	return d
}

// Keepalive is the keep-alive deadline K the server applies: it ends the
// session when nothing arrived from this client for K. The client sends a
// Ping every K/3 (at most 10 s) and declares the session ended when one is
// not answered within K/3 (at most 10 s) of when it was due, so it always
// learns of the end before the server frees its session holds.
func (s *Session) Keepalive() time.Duration { return s.keepalive }

// TTLBounds are the shortest and longest lease TTL the server accepts.
func (s *Session) TTLBounds() (min, max time.Duration) {
	return time.Duration(s.w.minTTLMs) * time.Millisecond, time.Duration(s.w.maxTTLMs) * time.Millisecond
}

// ID is the server's id of this session (shown in its logs).
func (s *Session) ID() uint64 { return s.w.sessionID }

// Shards is the server's shard count.
func (s *Session) Shards() int { return int(s.w.shards) }

// RemoteAddr is the address the session is connected to (after a resume,
// the server it resumed on).
func (s *Session) RemoteAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn.RemoteAddr()
}

// LocalAddr is the session connection's local address.
func (s *Session) LocalAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn.LocalAddr()
}

// Resumable reports whether the server's welcome had the resumable flag:
// a replicated session (cluster mode) that survives a failed connection
// by a Resume (see Session). A single node never sets it.
func (s *Session) Resumable() bool { return s.resumable }

// Resumes is how many times the session was resumed on a new connection.
func (s *Session) Resumes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resumes
}

// Done is closed when the session has ended.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while the session lives, and why it ended afterwards (it
// matches ErrSessionEnded; when a not_leader answer ended it, also
// ErrNotLeader, and errors.As finds the *NotLeaderError naming the leader).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close ends the session now: the server frees its session holds at once.
// Every lease of the session not yet released is reported lost
// (LostSessionEnded); a lease-mode or persistent hold stays held on the
// server until its TTL, or a release by token from another session.
// Close is idempotent.
func (s *Session) Close() error {
	s.end(errors.New("closed by Session.Close"))
	return nil
}

// end ends the session once: every waiter gets the error and every hold
// is lost.
func (s *Session) end(cause error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = &endedError{cause}
	err := s.err
	pending := s.pending
	holds := s.holds
	watchers := s.watchers
	s.pending = map[uint32]*call{}
	s.holds = map[holdID]*Lease{}
	s.watchers = map[uint32]*Watch{}
	close(s.done)
	conn := s.conn
	s.mu.Unlock()
	conn.Close()
	for _, c := range pending {
		if c.ch != nil {
			c.ch <- result{err: err}
		}
	}
	for _, l := range holds {
		l.lose(&LostError{Key: l.key, Token: l.token, Reason: LostSessionEnded, Cause: cause})
	}
	for _, w := range watchers {
		w.finish(&WatchEndedError{Key: w.key, Cause: err}, false)
	}
}

// send registers c under a new request id and writes its frame. A failed
// write ends the session (a partial frame cannot be resynchronised); c
// then receives the session's end.
func (s *Session) send(c *call, encode func(rid uint32) []byte) (uint32, error) {
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return 0, err
	}
	if c.op == opAcquire && c.access.Kind != AccessExclusive && !s.modes {
		// Checked under the lock a resume changes it under.
		err := &ModesUnsupportedError{Addr: s.addr, Key: c.key, Access: c.access}
		s.mu.Unlock()
		return 0, err
	}
	if c.op == opWatch && !s.watches {
		err := &WatchUnsupportedError{Addr: s.addr, Key: c.key}
		s.mu.Unlock()
		return 0, err
	}
	if c.op == opProclaim && !s.proclaim {
		err := &ProclaimUnsupportedError{Addr: s.addr, Key: c.key}
		s.mu.Unlock()
		return 0, err
	}
	rid := s.allocRid()
	c.sentAt = time.Now()
	c.frame = encode(rid)
	s.seq++
	c.seq = s.seq
	s.pending[rid] = c
	if c.watch != nil {
		c.watch.rid = rid
		s.watchers[rid] = c.watch
	}
	conn, addr := s.conn, s.addr
	if s.resuming {
		conn = nil // the resume sends it
	}
	s.mu.Unlock()
	if conn == nil {
		return rid, nil
	}
	if err := s.write(conn, c.frame); err != nil {
		if s.failConn(conn, fmt.Errorf("writing to %s: %v", addr, err)) {
			return rid, nil // a resume settles it
		}
		return 0, s.Err()
	}
	return rid, nil
}

// allocRid returns a request id no outstanding request has (under mu).
func (s *Session) allocRid() uint32 {
	rid := s.nextRid
	for s.pending[rid] != nil || s.watchers[rid] != nil {
		rid++
	}
	s.nextRid = rid + 1
	return rid
}

// write writes one frame on conn.
func (s *Session) write(conn net.Conn, frame []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	// A write blocks only when the server stopped reading: past the ping
	// timeout that is a hung connection.
	err := conn.SetWriteDeadline(time.Now().Add(s.pingTimeout))
	if err == nil {
		_, err = conn.Write(frame)
	}
	return err
}

// failConn handles a failure of conn seen by a writer or the keep-alive:
// a resumable session closes conn (its reader then resumes; true), any
// other session ends (false).
func (s *Session) failConn(conn net.Conn, cause error) bool {
	if !s.resumable {
		s.end(cause)
		return false
	}
	s.mu.Lock()
	if s.conn == conn && !s.resuming && s.failCause == nil {
		s.failCause = cause
	}
	s.mu.Unlock()
	conn.Close()
	return true
}

// roundTrip sends a request and waits for its answer or ctx.
func (s *Session) roundTrip(ctx context.Context, c *call, encode func(rid uint32) []byte) (result, error) {
	c.ch = make(chan result, 1)
	if _, err := s.send(c, encode); err != nil {
		return result{}, err
	}
	select {
	case res := <-c.ch:
		return res, res.err
	case <-ctx.Done():
		// The answer, when it comes, is dropped into the buffered channel.
		return result{}, ctx.Err()
	}
}

// readLoop is the one reader of the connection: it matches every Reply to
// its request by rid and hands Lost pushes to their leases. When the
// connection of a resumable session fails, it resumes the session.
func (s *Session) readLoop(br *bufio.Reader) {
	for {
		cause, connFailed := s.serve(br)
		if !connFailed || !s.resumable {
			s.end(cause)
			return
		}
		nbr, err := s.resume(cause)
		if err != nil {
			s.end(err)
			return
		}
		br = nbr
	}
}

// serve reads the current connection until it fails: why, and whether it
// was the connection that failed (not the server breaking the protocol).
func (s *Session) serve(br *bufio.Reader) (cause error, connFailed bool) {
	s.mu.Lock()
	addr := s.addr
	s.mu.Unlock()
	var h [headerLen]byte
	body := make([]byte, bodyMax)
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return readErr(addr, err), true
		}
		kind, rid, blen, err := decodeHeader(h[:])
		if err != nil {
			return fmt.Errorf("%w: %v", ErrProtocol, err), false
		}
		b := body[:blen]
		if _, err := io.ReadFull(br, b); err != nil {
			return readErr(addr, err), true
		}
		s.lastRx.Store(int64(time.Since(s.t0)))
		if kind == kindHeld {
			return fmt.Errorf("%w: a Held frame on an open session", ErrProtocol), false
		}
		if kind == kindLost {
			p, err := decodeLost(b)
			if err != nil || rid != 0 {
				return fmt.Errorf("%w: bad Lost push (rid %d): %v", ErrProtocol, rid, err), false
			}
			s.pushed(p)
			continue
		}
		if kind == kindEvent {
			if err := s.event(rid, b); err != nil {
				return err, false
			}
			continue
		}
		r, err := decodeReply(b)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrProtocol, err), false
		}
		switch r.status {
		case StatusNotLeader:
			// A replicated server that cannot serve this session (it
			// closes after this): a resumable session resumes (the leader
			// named first); any other ends naming the leader, and a new
			// Dial tries it first.
			return &NotLeaderError{Addr: addr, Leader: string(r.detail)}, true
		case StatusUnsupportedVersion:
			return fmt.Errorf("%w: %s on an open session", ErrProtocol, r.status), false
		}
		s.mu.Lock()
		c := s.pending[rid]
		if c == nil {
			s.mu.Unlock()
			return fmt.Errorf("%w: a reply to request id %d, which is not outstanding", ErrProtocol, rid), false
		}
		delete(s.pending, rid)
		var l *Lease
		if c.op == opAcquire && r.status == StatusOK {
			// Registered before the next frame is read, so a Lost push
			// that follows its grant at once finds it.
			l = newLease(s, c, r.token)
			s.holds[holdID{c.key, r.token}] = l
		}
		switch {
		case c.op == opWatch && r.status == StatusOK:
			// Active before the next frame is read: the Events after
			// the Reply are changes.
			c.watch.mu.Lock()
			c.watch.active = true
			c.watch.mu.Unlock()
		case c.op == opWatch:
			delete(s.watchers, rid)
		case c.op == opUnwatch && (r.status == StatusOK || r.status == StatusNotQueued):
			// No Event of that watch follows the Unwatch's Reply.
			delete(s.watchers, c.target)
		}
		s.mu.Unlock()
		if c.ch != nil {
			c.ch <- result{r: r, lease: l}
		}
	}
}

func readErr(addr string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%s closed the connection", addr)
	}
	return fmt.Errorf("reading from %s: %v", addr, err)
}

// event routes an Event push to its watch: a holder listed before the
// Watch's Reply, or a change after it. An Event of a kind this client
// does not know (a later server's) is skipped, as the protocol says. An
// Event of no watch of this session, of another key, or out of place is a
// protocol error.
func (s *Session) event(rid uint32, b []byte) error {
	ev, err := decodeEvent(b)
	if errors.Is(err, errUnknownEvent) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: bad Event (rid %d): %v", ErrProtocol, rid, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.watchers[rid]
	if w == nil {
		return fmt.Errorf("%w: an Event for request id %d, which is no watch", ErrProtocol, rid)
	}
	if ev.Key != w.key {
		return fmt.Errorf("%w: an Event of key %q for the watch of %q", ErrProtocol, ev.Key, w.key)
	}
	w.mu.Lock()
	active := w.active
	w.mu.Unlock()
	switch {
	case !active && ev.Kind == EventHolder:
		w.holder(ev.Holder)
	case active && ev.Kind != EventHolder:
		w.push(ev)
	default:
		return fmt.Errorf("%w: a %s Event %s the Watch's Reply (key %q)", ErrProtocol, ev.Kind, map[bool]string{true: "after", false: "before"}[active], w.key)
	}
	return nil
}

// pushed handles a Lost push: the server took the lock away from this
// live session (before granting it to anyone else).
func (s *Session) pushed(p lostPush) {
	s.mu.Lock()
	l := s.holds[holdID{p.key, p.token}]
	s.mu.Unlock()
	if l != nil {
		l.lose(&LostError{Key: p.key, Token: p.token, Reason: int(p.reason)})
	}
}

// forget drops a hold that ended from the session's table.
func (s *Session) forget(l *Lease) {
	s.mu.Lock()
	if s.holds[holdID{l.key, l.token}] == l {
		delete(s.holds, holdID{l.key, l.token})
	}
	s.mu.Unlock()
}

// keepaliveLoop sends a Ping every interval I; a Ping still unanswered at
// the next one (T = I after it was due) ends the session, well before
// the server's keep-alive deadline K = 3I would.
func (s *Session) keepaliveLoop() {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	var ping chan result
	var pingGen uint64
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		s.mu.Lock()
		resuming, gen, conn := s.resuming, s.gen, s.conn
		s.mu.Unlock()
		if resuming {
			ping = nil // a resume drops it; the resume's answer proves the session
			continue
		}
		if ping != nil && pingGen == gen {
			select {
			case <-ping:
			default:
				if !s.failConn(conn, fmt.Errorf("a keep-alive Ping went unanswered for %v", s.pingTimeout)) {
					return
				}
				ping = nil
				continue
			}
		}
		c := &call{op: opPing, internal: true, ch: make(chan result, 1)}
		if _, err := s.send(c, encodePing); err != nil {
			return
		}
		ping, pingGen = c.ch, gen
	}
}

// Ping is one round trip: it proves the session alive.
func (s *Session) Ping(ctx context.Context) error {
	_, err := s.roundTrip(ctx, &call{op: opPing}, encodePing)
	return err
}

// AcquireOption sets how Acquire asks for a lock.
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	mode       HoldMode
	access     Access
	ttl        time.Duration
	autoExtend bool
	waitMs     uint32
	// source, when set (hasSource), is this Acquire's source instead of
	// the session's: an election's campaign sends its value.
	source    string
	hasSource bool
}

// WithTTL asks for a lease: the server frees the key when ttl (whole
// milliseconds, within Session.TTLBounds) passes without an Extend, even
// while the session lives. Without WithAutoExtend the caller extends it
// (Lease.Extend).
func WithTTL(ttl time.Duration) AcquireOption {
	return func(c *acquireConfig) { c.mode, c.ttl = HoldLease, ttl }
}

// WithAutoExtend makes a lease (WithTTL) extend itself every third of its
// TTL from a background goroutine until it is released or lost.
func WithAutoExtend() AcquireOption { return func(c *acquireConfig) { c.autoExtend = true } }

// Persistent asks for a persistent hold (Locking-Center semantics): held
// until released by token or reset, whatever happens to the session.
func Persistent() AcquireOption { return func(c *acquireConfig) { c.mode = HoldPersistent } }

// WithWait bounds the wait in the key's queue, decided by the server: the
// Acquire is either granted or answered timed_out (ErrTimedOut), never
// both. Zero means TryLock. Without it, Acquire waits until granted or
// until its context ends.
func WithWait(d time.Duration) AcquireOption {
	return func(c *acquireConfig) {
		ms := (d + time.Millisecond - 1) / time.Millisecond
		if ms < 0 {
			ms = 0
		}
		if ms >= waitForever {
			ms = waitForever - 1
		}
		c.waitMs = uint32(ms)
	}
}

// TryLock is Acquire without waiting: a key held by someone else is
// ErrBusy at once.
func (s *Session) TryLock(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error) {
	return s.Acquire(ctx, key, append(opts, WithWait(0))...)
}

// Acquire asks for key and waits, FIFO with every other waiter of the key,
// until it is granted, the server-side wait of WithWait passes
// (ErrTimedOut), or ctx ends. By default it asks for a session hold
// (HoldSession); WithTTL asks for a lease, Persistent for a persistent
// hold.
//
// Cancellation is exact. When ctx ends while the Acquire is queued, the
// client sends a Cancel for it. The server answers the Acquire either
// cancelled or with its grant, never both; a grant that won the race is
// released (one Release by its token, bounded by Options.ReleaseTimeout)
// before Acquire returns a *CancelError wrapping ctx.Err() (its Released
// field names the token that was released): a caller whose context ended
// never holds the key.
//
// WithAccess asks for a shared hold or a semaphore's permit (LockShared,
// Permit); the default is exclusive.
//
// Errors: *StatusError for a refusal (ErrBusy, ErrTimedOut, ErrLimit,
// ErrInvalid, ...), ctx.Err() (a context that ended before anything was
// sent) or a *CancelError wrapping it, ErrSessionEnded, ErrInvalidArgument (a key
// of 0 or more than 127 bytes, a TTL outside the server's bounds, a
// semaphore of 0 slots; nothing is sent), *ModesUnsupportedError (a shared
// or semaphore Acquire to a server that does not offer lock modes; nothing
// is sent), *ModeMismatchError (a semaphore of another size than the
// key's), or ErrLost when the grant was lost before it could be handed
// out.
func (s *Session) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error) {
	cfg := acquireConfig{mode: HoldSession, waitMs: waitForever}
	for _, o := range opts {
		o(&cfg)
	}
	if len(key) < 1 || len(key) > MaxKeyLen {
		return nil, fmt.Errorf("%w: a key is 1..%d bytes, got %d", ErrInvalidArgument, MaxKeyLen, len(key))
	}
	if err := cfg.access.check(); err != nil {
		return nil, err
	}
	var ttlMs uint32
	if cfg.mode == HoldLease {
		lo, hi := s.TTLBounds()
		if cfg.ttl < lo || cfg.ttl > hi || cfg.ttl%time.Millisecond != 0 {
			return nil, fmt.Errorf("%w: a lease TTL must be whole milliseconds within %v..%v, got %v", ErrInvalidArgument, lo, hi, cfg.ttl)
		}
		ttlMs = uint32(cfg.ttl / time.Millisecond)
	} else if cfg.autoExtend {
		return nil, fmt.Errorf("%w: WithAutoExtend needs WithTTL", ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	source := s.source
	if cfg.hasSource {
		source = cfg.source
	}
	c := &call{op: opAcquire, key: key, mode: cfg.mode, access: cfg.access, ttl: cfg.ttl, ch: make(chan result, 1)}
	rid, err := s.send(c, func(rid uint32) []byte {
		return encodeAcquire(rid, cfg.mode, ttlMs, cfg.waitMs, key, source, cfg.access)
	})
	if err != nil {
		return nil, err
	}
	select {
	case res := <-c.ch:
		return s.granted(c, res, cfg)
	case <-ctx.Done():
	}
	// The server decides between the grant and the Cancel; it answers the
	// Acquire before the Cancel, and a session that ends answers it with
	// its end, so this wait is bounded by the keep-alive.
	s.mu.Lock()
	c.cancelled = true
	s.mu.Unlock()
	cc := &call{op: opCancel, key: key, target: rid, ch: make(chan result, 1)}
	_, _ = s.send(cc, func(r uint32) []byte { return encodeCancel(r, rid, key) })
	var res result
	select {
	case res = <-c.ch:
	case <-cc.ch:
		// The reader hands answers on in the order they arrive, so the
		// Acquire's answer is already here unless the server broke its
		// promise to answer the Acquire first.
		select {
		case res = <-c.ch:
		default:
			s.end(fmt.Errorf("%w: the Cancel of %q was answered before its Acquire", ErrProtocol, key))
			res = <-c.ch
		}
	}
	cerr := &CancelError{Key: key, Err: ctx.Err()}
	if res.lease != nil {
		cerr.Released = res.lease.Token()
		rctx, cancel := context.WithTimeout(context.Background(), s.releaseTimeout)
		defer cancel()
		if err := res.lease.Release(rctx); err != nil && !errors.Is(err, ErrLost) {
			cerr.ReleaseErr = err
		}
	}
	return nil, cerr
}

// CancelError is what Acquire returns when its context ended before the
// grant: errors.Is(err, context.Canceled) or context.DeadlineExceeded
// matches it (Unwrap returns ctx.Err()).
type CancelError struct {
	Key string
	Err error // ctx.Err()
	// Released is the token of a grant that won the race against the
	// Cancel and was released before Acquire returned (0: the server
	// withdrew the Acquire, nothing was granted).
	Released uint64
	// ReleaseErr is set when that Release failed: the key may then stay
	// held until the session ends (session hold) or the TTL passes (lease).
	ReleaseErr error
}

func (e *CancelError) Error() string {
	msg := fmt.Sprintf("ringlock: acquire %q: %v", e.Key, e.Err)
	if e.Released != 0 {
		msg += fmt.Sprintf(" (the grant that won the race, token %d, was released)", e.Released)
		if e.ReleaseErr != nil {
			msg = fmt.Sprintf("ringlock: acquire %q: %v (the grant that won the race, token %d, could not be released: %v)", e.Key, e.Err, e.Released, e.ReleaseErr)
		}
	}
	return msg
}

// Unwrap returns the context's error.
func (e *CancelError) Unwrap() error { return e.Err }

// granted turns an Acquire's answer into a Lease or an error.
func (s *Session) granted(c *call, res result, cfg acquireConfig) (*Lease, error) {
	if res.err != nil {
		return nil, res.err
	}
	if res.r.status == StatusModeMismatch {
		return nil, &ModeMismatchError{Key: c.key, Slots: c.access.Slots}
	}
	if res.r.status != StatusOK {
		return nil, &StatusError{Op: "acquire", Key: c.key, Status: res.r.status}
	}
	l := res.lease
	if l.rebase {
		// The client's expiry counts from when a request was sent (the
		// server's from the grant, later): after a long wait most of it,
		// or all, is gone, so one Extend rebases it before the lease is
		// handed out. If that fails the lease is released, not handed out.
		ctx, cancel := context.WithTimeout(context.Background(), s.releaseTimeout)
		err := l.Extend(ctx)
		cancel()
		if err != nil {
			if !errors.Is(err, ErrLost) {
				rctx, cancel := context.WithTimeout(context.Background(), s.releaseTimeout)
				_ = l.Release(rctx)
				cancel()
			}
			return nil, err
		}
	}
	if err := l.Err(); err != nil {
		// Lost before the caller got it: never handed out as held.
		return nil, err
	}
	if cfg.autoExtend {
		go l.autoExtend()
	}
	return l, nil
}

// ReleaseToken releases key if token is its current token: a lease or a
// persistent hold may be released by any session that names its token
// (for example after its holder reconnected). A token that is not the
// key's current one is a *StatusError with StatusStaleToken, and nothing
// changes; a session hold of another session is StatusNotOwner.
func (s *Session) ReleaseToken(ctx context.Context, key string, token uint64) error {
	if len(key) < 1 || len(key) > MaxKeyLen {
		return fmt.Errorf("%w: a key is 1..%d bytes, got %d", ErrInvalidArgument, MaxKeyLen, len(key))
	}
	res, err := s.roundTrip(ctx, &call{op: opRelease, key: key, token: token}, func(rid uint32) []byte {
		return encodeRelease(rid, token, key)
	})
	if err != nil {
		return err
	}
	if res.r.status != StatusOK {
		return &StatusError{Op: "release", Key: key, Status: res.r.status}
	}
	// A Lease of this session with that token is released now too.
	s.mu.Lock()
	l := s.holds[holdID{key, token}]
	s.mu.Unlock()
	if l != nil {
		l.releasedElsewhere()
	}
	return nil
}

// ExtendToken sets the TTL left of the lease on key whose token is token,
// from any session (see ReleaseToken). It returns the server's TTL left.
func (s *Session) ExtendToken(ctx context.Context, key string, token uint64, ttl time.Duration) (time.Duration, error) {
	if len(key) < 1 || len(key) > MaxKeyLen {
		return 0, fmt.Errorf("%w: a key is 1..%d bytes, got %d", ErrInvalidArgument, MaxKeyLen, len(key))
	}
	lo, hi := s.TTLBounds()
	if ttl < lo || ttl > hi || ttl%time.Millisecond != 0 {
		return 0, fmt.Errorf("%w: a lease TTL must be whole milliseconds within %v..%v, got %v", ErrInvalidArgument, lo, hi, ttl)
	}
	res, err := s.roundTrip(ctx, &call{op: opExtend, key: key}, func(rid uint32) []byte {
		return encodeExtend(rid, token, uint32(ttl/time.Millisecond), key)
	})
	if err != nil {
		return 0, err
	}
	if res.r.status != StatusOK {
		return 0, &StatusError{Op: "extend", Key: key, Status: res.r.status}
	}
	return time.Duration(res.r.ttlLeftMs) * time.Millisecond, nil
}

// resume takes a resumable session over on a new connection after its
// connection failed (cause): Resume on every address, rounds until the
// keep-alive, counted from the last frame read, has passed. It returns
// the new connection's reader, or why the session ends.
func (s *Session) resume(cause error) (*bufio.Reader, error) {
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return nil, err
	}
	if s.failCause != nil {
		cause, s.failCause = s.failCause, nil
	}
	s.resuming = true
	old := s.conn
	deadline := s.t0.Add(time.Duration(s.lastRx.Load()) + s.keepalive)
	// Reserved for the Resume, so no request registered meanwhile takes it.
	rid := s.allocRid()
	s.pending[rid] = &call{op: opResume}
	s.mu.Unlock()
	old.Close()
	var hint, hintFrom string
	var nl *NotLeaderError
	if errors.As(cause, &nl) {
		hint, hintFrom = nl.Leader, nl.Addr
	}
	guard := hintGuard(s.addrs, &s.opts, true)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	go func() {
		select {
		case <-s.done: // Close during the resume
			cancel()
		case <-ctx.Done():
		}
	}()
	ended := func(err error) (*bufio.Reader, error) {
		if e := s.Err(); e != nil {
			return nil, e
		}
		return nil, err
	}
	delay := 50 * time.Millisecond
	for {
		var r resumed
		tried, err, stop := walk(ctx, s.addrs, hint, hintFrom, guard, func(addr string) error {
			var err error
			r, err = s.resumeOne(ctx, addr, rid)
			return err
		})
		if stop && err == nil {
			return s.reconcile(r), nil
		}
		if stop && ctx.Err() == nil {
			return ended(fmt.Errorf("%v; the resume was refused: %w", cause, err))
		}
		if ctx.Err() != nil {
			return ended(fmt.Errorf("%v; no resume succeeded within the keep-alive (%v): %s", cause, s.keepalive, strings.Join(tried, "; ")))
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
		}
		if delay *= 2; delay > 500*time.Millisecond {
			delay = 500 * time.Millisecond
		}
	}
}

// resumed is a Resume that succeeded.
type resumed struct {
	conn net.Conn
	br   *bufio.Reader
	addr string
	rid  uint32
	w    welcome
	held []heldFrame
	sent time.Time
}

// resumeOne sends one Resume to addr and reads its Held frames and welcome.
func (s *Session) resumeOne(ctx context.Context, addr string, rid uint32) (resumed, error) {
	dctx, cancel := context.WithTimeout(ctx, s.opts.DialTimeout)
	defer cancel()
	conn, err := connect(dctx, addr, &s.opts)
	if err != nil {
		return resumed{}, err
	}
	deadline, _ := dctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		conn.Close()
		return resumed{}, err
	}
	// As in dialOne: the context (a Close) can end the wait early; the
	// watcher is stopped before the deadline is cleared.
	watch, watching := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watching)
		select {
		case <-dctx.Done():
			_ = conn.SetDeadline(time.Unix(1, 0))
		case <-watch:
		}
	}()
	stopWatch := func() { close(watch); <-watching }
	fail := func(err error) (resumed, error) {
		stopWatch()
		conn.Close()
		return resumed{}, err
	}
	sent := time.Now()
	if _, err := conn.Write(encodeResume(rid, protocolVersion, s.w.sessionID, s.opts.AuthToken)); err != nil {
		return fail(fmt.Errorf("ringlock: resume on %s: %w", addr, err))
	}
	br := bufio.NewReader(conn)
	var held []heldFrame
	body := make([]byte, bodyMax)
	for {
		var h [headerLen]byte
		if _, err := io.ReadFull(br, h[:1]); err != nil {
			if te := alertErr(addr, s.opts.TLSConfig, err); te != nil {
				return fail(te)
			}
			return fail(fmt.Errorf("ringlock: resume on %s: %v", addr, readErr(addr, err)))
		}
		if h[0] != kindReply && h[0] != kindHeld {
			// A server without Resume answers the Locking-Center '-'.
			return fail(fmt.Errorf("%s answered %#02x to a Resume (a server without Resume): %w", addr, h[0], &StatusError{Op: "resume", Status: StatusUnknownSession}))
		}
		if _, err := io.ReadFull(br, h[1:]); err != nil {
			return fail(fmt.Errorf("ringlock: resume on %s: %v", addr, readErr(addr, err)))
		}
		kind, frid, blen, err := decodeHeader(h[:])
		protocol := func(what string, args ...interface{}) (resumed, error) {
			return fail(fmt.Errorf("%w: %s: resume: %s", ErrProtocol, addr, fmt.Sprintf(what, args...)))
		}
		if err != nil || frid != rid {
			return protocol("bad answer header % x", h)
		}
		b := body[:blen]
		if _, err := io.ReadFull(br, b); err != nil {
			return fail(fmt.Errorf("ringlock: resume on %s: %v", addr, readErr(addr, err)))
		}
		if kind == kindHeld {
			hf, err := decodeHeld(b)
			if err != nil {
				return protocol("%v", err)
			}
			held = append(held, hf)
			continue
		}
		if blen >= welcomeBodyLen && b[0] == byte(StatusOK) {
			w, err := decodeWelcome(b)
			if err != nil {
				return protocol("%v", err)
			}
			if w.sessionID != s.w.sessionID || w.keepaliveMs == 0 {
				return protocol("resumed session %#x (keep-alive %d ms), not %#x", w.sessionID, w.keepaliveMs, s.w.sessionID)
			}
			stopWatch()
			if err := conn.SetDeadline(time.Time{}); err != nil {
				conn.Close()
				return resumed{}, err
			}
			return resumed{conn: conn, br: br, addr: addr, rid: rid, w: w, held: held, sent: sent}, nil
		}
		r, err := decodeReply(b)
		if err != nil {
			return protocol("%v", err)
		}
		switch r.status {
		case StatusNotLeader:
			return fail(&NotLeaderError{Addr: addr, Leader: string(r.detail)})
		case StatusUnsupportedVersion:
			return fail(&VersionError{Addr: addr, Client: protocolVersion, Versions: r.detail})
		case StatusTLSRequired:
			return fail(tlsRequired(addr, "resume"))
		}
		return fail(&StatusError{Op: "resume", Status: r.status})
	}
}

// reconcile settles the session's holds and requests in flight by the
// Held list of a Resume that succeeded, makes its connection the
// session's, and returns its reader.
func (s *Session) reconcile(r resumed) *bufio.Reader {
	type delivery struct {
		ch  chan result
		res result
	}
	listed := map[holdID]heldFrame{}
	for _, h := range r.held {
		listed[holdID{h.key, h.token}] = h
	}
	used := map[holdID]bool{}
	var lose []*Lease
	var deliver []delivery
	var resend [][]byte
	answer := func(c *call, res result) {
		if c.ch != nil {
			deliver = append(deliver, delivery{c.ch, res})
		}
	}
	left := func(h heldFrame) time.Time { return r.sent.Add(time.Duration(h.ttlLeftMs) * time.Millisecond) }
	modes := r.w.flags&flagModes != 0
	watches := r.w.flags&flagWatches != 0
	proclaim := r.w.flags&flagProclaim != 0

	s.mu.Lock()
	// Watches are not carried over a Resume: each answered one ends (its
	// user watches again and reads the holders anew).
	var unwatched []*Watch
	for rid, w := range s.watchers {
		w.mu.Lock()
		active := w.active
		w.mu.Unlock()
		if active {
			delete(s.watchers, rid)
			unwatched = append(unwatched, w)
		}
	}
	// Holds this side believes in: kept if listed with their token, lost
	// if not. A hold being released is settled by its Release below.
	for id, l := range s.holds {
		l.mu.Lock()
		releasing := l.state != stateHeld
		l.mu.Unlock()
		if releasing {
			continue
		}
		if h, ok := listed[id]; ok {
			used[id] = true
			if h.ttlLeftMs != noTTL {
				l.capExpiry(left(h))
			}
			continue
		}
		lose = append(lose, l)
	}
	type inFlight struct {
		rid uint32
		c   *call
	}
	var calls []inFlight
	for rid, c := range s.pending {
		calls = append(calls, inFlight{rid, c})
		if c.op == opRelease {
			used[holdID{c.key, c.token}] = true // the hold it names is no grant to match
		}
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].c.seq < calls[j].c.seq })
	outcome := map[uint32]Status{} // an Acquire settled here: StatusOK granted, StatusCancelled
	for _, f := range calls {
		c := f.c
		switch c.op {
		case opResume:
			delete(s.pending, f.rid)
		case opAcquire:
			var tok uint64
			found := false
			for id := range listed {
				if id.key == c.key && !used[id] && (!found || id.token < tok) {
					tok, found = id.token, true
				}
			}
			switch {
			case found:
				// Granted; its answer was lost with the connection.
				id := holdID{c.key, tok}
				used[id] = true
				h := listed[id]
				l := newLease(s, c, tok)
				if h.ttlLeftMs != noTTL {
					l.capExpiry(left(h))
				}
				s.holds[id] = l
				delete(s.pending, f.rid)
				outcome[f.rid] = StatusOK
				answer(c, result{r: reply{status: StatusOK, token: tok, ttlLeftMs: h.ttlLeftMs}, lease: l})
			case c.cancelled:
				// Not granted, and its caller withdrew it.
				delete(s.pending, f.rid)
				outcome[f.rid] = StatusCancelled
				answer(c, result{r: reply{status: StatusCancelled, ttlLeftMs: noTTL}})
			case c.access.Kind != AccessExclusive && !modes:
				// Not granted, and this server would answer its access
				// trailer invalid: not sent again.
				delete(s.pending, f.rid)
				answer(c, result{err: &ModesUnsupportedError{Addr: r.addr, Key: c.key, Access: c.access}})
			default:
				resend = append(resend, c.frame) // queued Acquires are not kept
			}
		case opRelease:
			if _, ok := listed[holdID{c.key, c.token}]; ok {
				resend = append(resend, c.frame) // it did not happen
			} else {
				delete(s.pending, f.rid) // it happened
				answer(c, result{r: reply{status: StatusOK, ttlLeftMs: noTTL}})
			}
		case opWatch:
			if watches {
				// Not answered yet: the new connection lists the holders.
				c.watch.mu.Lock()
				c.watch.holders = nil
				c.watch.mu.Unlock()
				resend = append(resend, c.frame)
			} else {
				delete(s.pending, f.rid)
				delete(s.watchers, f.rid)
				answer(c, result{err: &WatchUnsupportedError{Addr: r.addr, Key: c.key}})
			}
		case opProclaim:
			switch _, ok := listed[holdID{c.key, c.token}]; {
			case !proclaim:
				// This server would not know the op: not sent again.
				delete(s.pending, f.rid)
				answer(c, result{err: &ProclaimUnsupportedError{Addr: r.addr, Key: c.key}})
			case ok:
				resend = append(resend, c.frame) // the same value again: harmless
			default:
				// The hold is gone: what the server would answer.
				delete(s.pending, f.rid)
				answer(c, result{r: reply{status: StatusStaleToken, ttlLeftMs: noTTL}})
			}
		case opUnwatch:
			// Its watch ended with the old connection.
			delete(s.pending, f.rid)
			answer(c, result{r: reply{status: StatusOK, ttlLeftMs: noTTL}})
		case opCancel:
		case opPing:
			if c.internal {
				delete(s.pending, f.rid) // the keep-alive's: the Resume proved the session
			} else {
				resend = append(resend, c.frame)
			}
		default: // an Extend: it counts from when it runs
			resend = append(resend, c.frame)
		}
	}
	for _, f := range calls {
		if f.c.op != opCancel {
			continue
		}
		// Settled with its Acquire: cancelled as asked if it was not
		// granted, else not_queued (the grant stands).
		delete(s.pending, f.rid)
		st := StatusNotQueued
		if outcome[f.c.target] == StatusCancelled {
			st = StatusOK
		}
		answer(f.c, result{r: reply{status: st, ttlLeftMs: noTTL}})
	}
	// Listed holds nobody here knows: let go of them.
	for id := range listed {
		if used[id] {
			continue
		}
		rid := s.allocRid()
		c := &call{op: opRelease, key: id.key, token: id.token, sentAt: r.sent}
		c.frame = encodeRelease(rid, id.token, id.key)
		s.seq++
		c.seq = s.seq
		s.pending[rid] = c
		resend = append(resend, c.frame)
	}
	// s.w stays: the same session's welcome (read without the lock by
	// TTLBounds, ID, Shards); its modes flag is this server's.
	s.modes = modes
	s.watches = watches
	s.proclaim = proclaim
	s.conn, s.addr = r.conn, r.addr
	s.resuming = false
	s.gen++
	s.resumes++
	s.failCause = nil
	s.lastRx.Store(int64(time.Since(s.t0)))
	s.mu.Unlock()

	for _, f := range resend {
		if err := s.write(r.conn, f); err != nil {
			r.conn.Close() // the reader sees it and resumes again
			break
		}
	}
	for _, d := range deliver {
		d.ch <- d.res
	}
	for _, l := range lose {
		l.lose(&LostError{Key: l.key, Token: l.token, Reason: LostNotListed})
	}
	for _, w := range unwatched {
		w.finish(&WatchEndedError{Key: w.key, Resumed: true}, false)
	}
	return r.br
}
