package ringlock

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Secrets never go to a server nobody verified: without TLS, a not_leader
// hint that is not among Dial's addresses is not dialled when the Hello
// carries the auth token, nor by a Resume (it carries the session id).
// The hint points at a listener that records every byte it receives, and
// must receive none. Also: tls_required answering a Hello or a Resume.

var testToken = []byte("the-auth-token-3f9c1a")

// sink is a listener that records every byte it receives and answers
// nothing.
type sink struct {
	ln    net.Listener
	conns int32
	mu    sync.Mutex
	data  []byte
}

func startSink(t *testing.T) *sink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &sink{ln: ln}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			atomic.AddInt32(&s.conns, 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				b := make([]byte, 4096)
				for {
					n, err := c.Read(b)
					s.mu.Lock()
					s.data = append(s.data, b[:n]...)
					s.mu.Unlock()
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return s
}

func (s *sink) addr() string { return s.ln.Addr().String() }

// untouched fails the test if anything reached the sink.
func (s *sink) untouched(t *testing.T, secret []byte, err error) {
	t.Helper()
	time.Sleep(100 * time.Millisecond) // a connection in flight lands
	if n := atomic.LoadInt32(&s.conns); n != 0 {
		t.Fatalf("the hint %s was dialled %d time(s) (%v)", s.addr(), n, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if bytes.Contains(s.data, secret) {
		t.Fatalf("the secret reached the hint")
	}
}

func TestAHelloWithATokenDoesNotFollowAnUnlistedHintWithoutTLS(t *testing.T) {
	sk := startSink(t)
	hello := make(chan []byte, 4)
	a := startFake(t, refuser(StatusNotLeader, str(sk.addr()), hello))
	_, err := Dial(tctx(t), []string{a.addr()}, WithAuthToken(testToken), WithDialTimeout(500*time.Millisecond))
	sk.untouched(t, testToken, err)
	var ul *UnverifiedLeaderError
	if !errors.As(err, &ul) || !errors.Is(err, ErrUnverifiedLeader) || !errors.Is(err, ErrNotLeader) {
		t.Fatalf("got %v", err)
	}
	if ul.Leader != sk.addr() || ul.Addr != a.addr() || ul.Resume {
		t.Fatalf("got %+v", ul)
	}
	for _, part := range []string{sk.addr(), a.addr(), "WithTLS", "auth token", "list"} {
		if !strings.Contains(err.Error(), part) {
			t.Fatalf("the message lacks %q: %v", part, err)
		}
	}
	if a.connections() != 1 {
		t.Fatalf("%d connections to %s", a.connections(), a.addr())
	}
	if h := <-hello; !bytes.Contains(h, testToken) {
		t.Fatal("the listed address did not get the token (the user's choice)")
	}
}

func TestAListedHintOrAHelloWithoutATokenFollowsIt(t *testing.T) {
	leader := startFake(t, welcomer(nil))
	a := startFake(t, refuser(StatusNotLeader, str(leader.addr()), nil))
	// Listed (after a): dialled first, with the token.
	s, err := Dial(tctx(t), []string{a.addr(), leader.addr()}, WithAuthToken(testToken))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.RemoteAddr().String(); got != leader.addr() {
		t.Fatalf("connected to %s", got)
	}
	s.Close()
	// No token: nothing secret in the Hello, an unlisted hint is dialled.
	s, err = Dial(tctx(t), []string{a.addr()})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.RemoteAddr().String(); got != leader.addr() {
		t.Fatalf("connected to %s", got)
	}
	s.Close()
}

// resumableThen opens a resumable session on the first connection, grants
// its Acquires and answers its Release not_leader naming *leader (then
// closes); later connections run second (a Resume comes).
func resumableThen(leader *string, second func(sc *script, fc *fakeConn)) *script {
	first := func(sc *script, fc *fakeConn) {
		_, rid, _, ok := sc.read(fc)
		if !ok {
			return
		}
		fc.welcomeFlags(rid, 10000, flagResumable)
		for {
			op, rid, _, ok := sc.read(fc)
			if !ok {
				return
			}
			switch op {
			case opAcquire:
				fc.grant(rid, 10, noTTL)
			case opRelease:
				fc.refuse(rid, StatusNotLeader, *leader)
				return
			default:
				fc.reply(rid, StatusOK)
			}
		}
	}
	return newScript(first, second)
}

func TestAResumeDoesNotFollowAnUnlistedHintWithoutTLS(t *testing.T) {
	sk := startSink(t)
	leader := sk.addr()
	resumes := make(chan []byte, 8)
	sc := resumableThen(&leader, func(sc *script, fc *fakeConn) {
		// The listed address itself: it names the same leader.
		op, rid, body, ok := sc.read(fc)
		if !ok {
			return
		}
		select {
		case resumes <- append([]byte{op}, body...):
		default: // a broken client may walk round after round
		}
		fc.refuse(rid, StatusNotLeader, leader)
	})
	a := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{a.addr()}, WithDialTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.Acquire(tctx(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Release(tctx(t)) // answered not_leader: the connection fails
	select {
	case <-s.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the session did not end")
	}
	sid := binary.LittleEndian.AppendUint64(nil, testSID)
	sk.untouched(t, sid, s.Err())
	err = s.Err()
	var ul *UnverifiedLeaderError
	if !errors.As(err, &ul) || !ul.Resume || ul.Leader != leader || !errors.Is(err, ErrSessionEnded) || !errors.Is(err, ErrNotLeader) {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(err.Error(), "session id") || !strings.Contains(err.Error(), leader) {
		t.Fatalf("message: %v", err)
	}
	if s.Resumes() != 0 {
		t.Fatal("resumed")
	}
	select {
	case r := <-resumes:
		if r[0] != opResume || !bytes.Contains(r, sid) {
			t.Fatalf("the listed address got % x", r)
		}
	default:
		t.Fatal("the listed address was not asked")
	}
}

func TestTLSRequiredAnswersAHelloAndAResume(t *testing.T) {
	refuseTLS := func(fc *fakeConn) {
		if _, rid, _, ok := fc.read(); ok {
			fc.reply(rid, StatusTLSRequired)
		}
	}
	a := startFake(t, refuseTLS)
	b := startFake(t, welcomer(nil))
	_, err := Dial(tctx(t), []string{a.addr(), b.addr()})
	var se *StatusError
	if !errors.Is(err, ErrTLSRequired) || !errors.As(err, &se) || se.Status != StatusTLSRequired {
		t.Fatalf("got %v", err)
	}
	for _, part := range []string{a.addr(), "TLS only", "WithTLS", "LoadTLSConfig"} {
		if !strings.Contains(err.Error(), part) {
			t.Fatalf("the message lacks %q: %v", part, err)
		}
	}
	if a.connections() != 1 || b.connections() != 0 {
		t.Fatalf("connections %d %d: retried, or another address tried", a.connections(), b.connections())
	}

	var self string
	sc := resumableThen(&self, func(sc *script, fc *fakeConn) { refuseTLS(fc) })
	f := startFake(t, sc.handle)
	self = f.addr() // the hint names itself: listed
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.Acquire(tctx(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Release(tctx(t))
	select {
	case <-s.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the session did not end")
	}
	if err := s.Err(); !errors.Is(err, ErrTLSRequired) || !errors.Is(err, ErrSessionEnded) || !strings.Contains(err.Error(), "WithTLS") {
		t.Fatalf("got %v", err)
	}
}
