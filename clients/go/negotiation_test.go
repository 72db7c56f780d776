package ringlock

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlock/ringlock/clients/go/internal/testserver"
)

// A scripted stand-in for ringlockd, for answers the real server never
// sends (not_leader) or that need a server speaking other versions. The
// real server's unsupported_version is TestTheRealServerRefusesVersion9.
type fake struct {
	ln    net.Listener
	conns int32
	wg    sync.WaitGroup
}

type fakeConn struct{ c net.Conn }

func startFake(t *testing.T, handle func(fc *fakeConn)) *fake {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startFakeOn(t, ln, handle)
}

// startFakeOn serves ln (a TLS listener, in the TLS tests).
func startFakeOn(t *testing.T, ln net.Listener, handle func(fc *fakeConn)) *fake {
	t.Helper()
	f := &fake{ln: ln}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			atomic.AddInt32(&f.conns, 1)
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				handle(&fakeConn{c})
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	return f
}

func (f *fake) addr() string     { return f.ln.Addr().String() }
func (f *fake) connections() int { return int(atomic.LoadInt32(&f.conns)) }

// read returns the next request frame; ok is false at EOF.
func (fc *fakeConn) read() (op byte, rid uint32, body []byte, ok bool) {
	var h [headerLen]byte
	if _, err := io.ReadFull(fc.c, h[:]); err != nil {
		return 0, 0, nil, false
	}
	body = make([]byte, binary.LittleEndian.Uint16(h[5:7]))
	if _, err := io.ReadFull(fc.c, body); err != nil {
		return 0, 0, nil, false
	}
	return h[0], binary.LittleEndian.Uint32(h[1:5]), body, true
}

func (fc *fakeConn) answer(rid uint32, body []byte) {
	b := make([]byte, headerLen, headerLen+len(body))
	b[0] = kindReply
	binary.LittleEndian.PutUint32(b[1:5], rid)
	binary.LittleEndian.PutUint16(b[5:7], uint16(len(body)))
	_, _ = fc.c.Write(append(b, body...))
}

func (fc *fakeConn) welcome(rid uint32) {
	b := []byte{0, 1}
	b = putU32(b, 10000)
	b = putU32(b, 10)
	b = putU32(b, 86400000)
	b = putU64(b, 7)
	b = putU32(b, 100)
	b = putU32(b, 100)
	fc.answer(rid, append(b, 1, 0))
}

func (fc *fakeConn) reply(rid uint32, st Status) {
	b := putU64([]byte{byte(st)}, 0)
	fc.answer(rid, putU32(b, noTTL))
}

func (fc *fakeConn) refuse(rid uint32, st Status, detail string) {
	fc.answer(rid, append([]byte{byte(st), byte(len(detail))}, detail...))
}

// welcomer opens the session, then answers Pings ok (anything else
// invalid), recording every request's op and rid.
func welcomer(seen chan<- [2]uint32) func(*fakeConn) {
	return func(fc *fakeConn) {
		_, rid, _, ok := fc.read()
		if !ok {
			return
		}
		fc.welcome(rid)
		for {
			op, rid, _, ok := fc.read()
			if !ok {
				return
			}
			if seen != nil {
				seen <- [2]uint32{uint32(op), rid}
			}
			if op == opPing {
				fc.reply(rid, StatusOK)
			} else {
				fc.reply(rid, StatusInvalid)
			}
		}
	}
}

// refuser answers the Hello with a status with detail, then closes.
func refuser(st Status, detail func() string, hello chan<- []byte) func(*fakeConn) {
	return func(fc *fakeConn) {
		_, rid, body, ok := fc.read()
		if !ok {
			return
		}
		if hello != nil {
			hello <- body
		}
		fc.refuse(rid, st, detail())
	}
}

func str(s string) func() string { return func() string { return s } }

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestUnsupportedVersionNamesTheServersVersionsAndEndsTheSearch(t *testing.T) {
	hello := make(chan []byte, 1)
	a := startFake(t, refuser(StatusUnsupportedVersion, str("\x02\x03"), hello))
	b := startFake(t, welcomer(nil))
	_, err := Dial(tctx(t), []string{a.addr(), b.addr()})
	var ve *VersionError
	if !errors.As(err, &ve) || !errors.Is(err, ErrUnsupportedVersion) {
		t.Fatalf("got %v", err)
	}
	if string(ve.Versions) != "\x02\x03" || ve.Client != 1 || ve.Addr != a.addr() {
		t.Fatalf("got %+v", ve)
	}
	if msg := err.Error(); !strings.Contains(msg, "version 1") || !strings.Contains(msg, "versions 2, 3") {
		t.Fatalf("the message does not name both sides' versions: %s", msg)
	}
	if a.connections() != 1 || b.connections() != 0 {
		t.Fatalf("connections %d %d: the refusal was retried or another address tried", a.connections(), b.connections())
	}
	if h := <-hello; h[0] != 1 {
		t.Fatalf("the Hello asked for version %d", h[0])
	}
}

func TestAHelloAnsweredNotLeaderTriesTheNamedLeaderFirst(t *testing.T) {
	leader := startFake(t, welcomer(nil))
	b := startFake(t, welcomer(nil))
	a := startFake(t, refuser(StatusNotLeader, str(leader.addr()), nil))
	s, err := Dial(tctx(t), []string{a.addr(), b.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.RemoteAddr().String(); got != leader.addr() {
		t.Fatalf("connected to %s, the leader is %s", got, leader.addr())
	}
	if err := s.Ping(tctx(t)); err != nil {
		t.Fatal(err)
	}
	if a.connections() != 1 || leader.connections() != 1 || b.connections() != 0 {
		t.Fatalf("connections %d %d %d", a.connections(), leader.connections(), b.connections())
	}
}

func TestNotLeaderWithoutALeaderOrAnUnreachableOneTriesTheNextAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	for _, hint := range []string{"", dead, "not an address"} {
		a := startFake(t, refuser(StatusNotLeader, str(hint), nil))
		b := startFake(t, welcomer(nil))
		s, err := Dial(tctx(t), []string{a.addr(), b.addr()})
		if err != nil {
			t.Fatalf("hint %q: %v", hint, err)
		}
		if got := s.RemoteAddr().String(); got != b.addr() {
			t.Fatalf("hint %q: connected to %s, want %s", hint, got, b.addr())
		}
		s.Close()
	}
}

func TestServersNamingEachOtherAreEachTriedOnce(t *testing.T) {
	var bAddr atomic.Value
	bAddr.Store("")
	a := startFake(t, refuser(StatusNotLeader, func() string { return bAddr.Load().(string) }, nil))
	b := startFake(t, refuser(StatusNotLeader, str(a.addr()), nil))
	bAddr.Store(b.addr())
	_, err := Dial(tctx(t), []string{a.addr()})
	if !errors.Is(err, ErrNotLeader) {
		t.Fatalf("got %v", err)
	}
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.Addr != b.addr() || nl.Leader != a.addr() {
		t.Fatalf("got %+v (%v)", nl, err)
	}
	if a.connections() != 1 || b.connections() != 1 {
		t.Fatalf("connections %d %d", a.connections(), b.connections())
	}
}

func TestNotLeaderOnALiveSessionEndsItNamingTheLeader(t *testing.T) {
	a := startFake(t, func(fc *fakeConn) {
		_, rid, _, ok := fc.read()
		if !ok {
			return
		}
		fc.welcome(rid)
		for {
			op, rid, _, ok := fc.read()
			if !ok {
				return
			}
			if op == opAcquire {
				fc.refuse(rid, StatusNotLeader, "10.0.0.9:22119")
				return // and close, as the document says
			}
			fc.reply(rid, StatusOK)
		}
	})
	s, err := Dial(tctx(t), []string{a.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Acquire(tctx(t), "k", WithWait(time.Second))
	var nl *NotLeaderError
	if !errors.Is(err, ErrNotLeader) || !errors.Is(err, ErrSessionEnded) || !errors.As(err, &nl) || nl.Leader != "10.0.0.9:22119" {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(err.Error(), "10.0.0.9:22119") {
		t.Fatalf("the error does not name the leader: %v", err)
	}
	select {
	case <-s.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the session did not end")
	}
	if err := s.Ping(tctx(t)); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a later request: %v", err)
	}
	if a.connections() != 1 {
		t.Fatalf("%d connections: the session reconnected", a.connections())
	}
}

func TestRidZeroIsAnOrdinaryRequestID(t *testing.T) {
	seen := make(chan [2]uint32, 16)
	a := startFake(t, welcomer(seen))
	s, err := Dial(tctx(t), []string{a.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.mu.Lock()
	s.nextRid = 0xFFFFFFFF
	s.mu.Unlock()
	for i := 0; i < 2; i++ {
		if err := s.Ping(tctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	got := map[uint32]bool{}
	for len(seen) > 0 {
		got[(<-seen)[1]] = true
	}
	if !got[0xFFFFFFFF] || !got[0] {
		t.Fatalf("rids sent: %v", got)
	}
}

// The real ringlockd speaks version 1 only: a version 9 Hello is answered
// unsupported_version naming [1], and the client says so at once.
func TestTheRealServerRefusesVersion9(t *testing.T) {
	srv, err := testserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Kill9()
	_, err = Dial(tctx(t), []string{srv.Lock}, withHelloVersion(9))
	var ve *VersionError
	if !errors.As(err, &ve) || string(ve.Versions) != "\x01" || ve.Client != 9 {
		t.Fatalf("got %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "version 9") || !strings.Contains(msg, "speaks version 1") {
		t.Fatalf("message: %s", msg)
	}
	if n, err := srv.Metric("ringlock_sessions_opened_total"); err != nil || n != 0 {
		t.Fatalf("sessions opened: %v %v", n, err)
	}
	s, err := Dial(tctx(t), []string{srv.Lock})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(tctx(t)); err != nil {
		t.Fatal(err)
	}
}
