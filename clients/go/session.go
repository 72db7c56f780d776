package ringlock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
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
	// Source is sent with every Acquire (0..=127 bytes) and shown by
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
// The session does not reconnect: once it ended (Done is closed), every
// request fails with ErrSessionEnded and every lock it held is reported
// lost; open a new one with Dial.
type Session struct {
	conn           net.Conn
	addr           string
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
	ttl    time.Duration
	sentAt time.Time
	ch     chan result
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
// speaks for unsupported_version. A server that answers not_leader counts
// as a failure to connect: the leader it names is tried next (each
// address at most once), then the remaining addresses.
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
	var tried []string
	var last error
	seen := map[string]bool{}
	for todo := norm; len(todo) > 0; {
		a := todo[0]
		todo = todo[1:]
		if seen[a] {
			continue
		}
		seen[a] = true
		s, err := dialOne(ctx, a, &o)
		if err == nil {
			return s, nil
		}
		var se *StatusError
		var ve *VersionError
		if errors.As(err, &se) || errors.As(err, &ve) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, err
		}
		tried = append(tried, err.Error())
		last = err
		var nl *NotLeaderError
		if errors.As(err, &nl) && nl.Leader != "" {
			// Preferred over every address not tried yet; one that is not
			// an address is skipped (the others are still tried).
			if h, herr := normalizeAddr(nl.Leader); herr == nil && !seen[h] {
				todo = append([]string{h}, todo...)
			}
		}
	}
	if len(tried) == 1 {
		return nil, last
	}
	return nil, fmt.Errorf("ringlock: no session could be opened (%s): %w", strings.Join(tried, "; "), last)
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

func dialOne(ctx context.Context, addr string, o *Options) (*Session, error) {
	dctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	d := net.Dialer{KeepAlive: 15 * time.Second}
	conn, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ringlock: connecting to %s: %w", addr, err)
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

// RemoteAddr is the address the session is connected to.
func (s *Session) RemoteAddr() net.Addr { return s.conn.RemoteAddr() }

// LocalAddr is the session connection's local address.
func (s *Session) LocalAddr() net.Addr { return s.conn.LocalAddr() }

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
	s.pending = map[uint32]*call{}
	s.holds = map[holdID]*Lease{}
	close(s.done)
	s.mu.Unlock()
	s.conn.Close()
	for _, c := range pending {
		if c.ch != nil {
			c.ch <- result{err: err}
		}
	}
	for _, l := range holds {
		l.lose(&LostError{Key: l.key, Token: l.token, Reason: LostSessionEnded, Cause: cause})
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
	rid := s.nextRid
	for s.pending[rid] != nil {
		rid++
	}
	s.nextRid = rid + 1
	c.sentAt = time.Now()
	s.pending[rid] = c
	s.mu.Unlock()
	frame := encode(rid)
	s.wmu.Lock()
	// A write blocks only when the server stopped reading: past the ping
	// timeout that is a hung connection.
	err := s.conn.SetWriteDeadline(time.Now().Add(s.pingTimeout))
	if err == nil {
		_, err = s.conn.Write(frame)
	}
	s.wmu.Unlock()
	if err != nil {
		s.end(fmt.Errorf("writing to %s: %v", s.addr, err))
		return 0, s.Err()
	}
	return rid, nil
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
// its request by rid and hands Lost pushes to their leases.
func (s *Session) readLoop(br *bufio.Reader) {
	var h [headerLen]byte
	body := make([]byte, bodyMax)
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			s.end(readErr(s.addr, err))
			return
		}
		kind, rid, blen, err := decodeHeader(h[:])
		if err != nil {
			s.end(fmt.Errorf("%w: %v", ErrProtocol, err))
			return
		}
		b := body[:blen]
		if _, err := io.ReadFull(br, b); err != nil {
			s.end(readErr(s.addr, err))
			return
		}
		if kind == kindLost {
			p, err := decodeLost(b)
			if err != nil || rid != 0 {
				s.end(fmt.Errorf("%w: bad Lost push (rid %d): %v", ErrProtocol, rid, err))
				return
			}
			s.pushed(p)
			continue
		}
		r, err := decodeReply(b)
		if err != nil {
			s.end(fmt.Errorf("%w: %v", ErrProtocol, err))
			return
		}
		switch r.status {
		case StatusNotLeader:
			// A replicated server that cannot serve this session (it
			// closes after this): the session ends naming the leader; a
			// new Dial tries it first.
			s.end(&NotLeaderError{Addr: s.addr, Leader: string(r.detail)})
			return
		case StatusUnsupportedVersion:
			s.end(fmt.Errorf("%w: %s on an open session", ErrProtocol, r.status))
			return
		}
		s.mu.Lock()
		c := s.pending[rid]
		if c == nil {
			s.mu.Unlock()
			s.end(fmt.Errorf("%w: a reply to request id %d, which is not outstanding", ErrProtocol, rid))
			return
		}
		delete(s.pending, rid)
		var l *Lease
		if c.op == opAcquire && r.status == StatusOK {
			// Registered before the next frame is read, so a Lost push
			// that follows its grant at once finds it.
			l = newLease(s, c, r.token)
			s.holds[holdID{c.key, r.token}] = l
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
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		if ping != nil {
			select {
			case <-ping:
			default:
				s.end(fmt.Errorf("a keep-alive Ping went unanswered for %v", s.pingTimeout))
				return
			}
		}
		c := &call{op: opPing, ch: make(chan result, 1)}
		if _, err := s.send(c, encodePing); err != nil {
			return
		}
		ping = c.ch
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
	ttl        time.Duration
	autoExtend bool
	waitMs     uint32
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
// Errors: *StatusError for a refusal (ErrBusy, ErrTimedOut, ErrLimit,
// ErrInvalid, ...), ctx.Err() (a context that ended before anything was
// sent) or a *CancelError wrapping it, ErrSessionEnded, ErrInvalidArgument (a key
// of 0 or more than 127 bytes, a TTL outside the server's bounds; nothing
// is sent), or ErrLost when the grant was lost before it could be handed
// out.
func (s *Session) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error) {
	cfg := acquireConfig{mode: HoldSession, waitMs: waitForever}
	for _, o := range opts {
		o(&cfg)
	}
	if len(key) < 1 || len(key) > MaxKeyLen {
		return nil, fmt.Errorf("%w: a key is 1..%d bytes, got %d", ErrInvalidArgument, MaxKeyLen, len(key))
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
	c := &call{op: opAcquire, key: key, mode: cfg.mode, ttl: cfg.ttl, ch: make(chan result, 1)}
	rid, err := s.send(c, func(rid uint32) []byte {
		return encodeAcquire(rid, cfg.mode, ttlMs, cfg.waitMs, key, s.source)
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
	cc := &call{op: opCancel, key: key, ch: make(chan result, 1)}
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
	res, err := s.roundTrip(ctx, &call{op: opRelease, key: key}, func(rid uint32) []byte {
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
