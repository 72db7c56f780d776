package ringlock

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// Resuming a replicated session (cluster mode) against a scripted fake
// server over 127.0.0.1: the welcome's resumable flag, the Resume frame,
// the Held list, and how the session settles its holds and requests in
// flight by it (docs/protocol.md, "Resuming a session"). Every wait is
// bounded and awaits a signal; nothing asserts on wall-clock time.

const testSID = 0x0080000000000007 // bit 55: a replicated session

const waitBound = 10 * time.Second

type frameRec struct {
	conn int
	op   byte
	rid  uint32
	body []byte
}

// script runs handlers[n] for connection n (the last one for any later
// connection) and records every request frame.
type script struct {
	handlers []func(sc *script, fc *fakeConn)
	mu       sync.Mutex
	conns    []*fakeConn
	frames   []frameRec
	changed  chan struct{}
}

func newScript(h ...func(sc *script, fc *fakeConn)) *script {
	return &script{handlers: h, changed: make(chan struct{})}
}

func (sc *script) signal() { close(sc.changed); sc.changed = make(chan struct{}) }

func (sc *script) handle(fc *fakeConn) {
	sc.mu.Lock()
	n := len(sc.conns)
	sc.conns = append(sc.conns, fc)
	sc.signal()
	sc.mu.Unlock()
	if n >= len(sc.handlers) {
		n = len(sc.handlers) - 1
	}
	sc.handlers[n](sc, fc)
}

func (sc *script) read(fc *fakeConn) (byte, uint32, []byte, bool) {
	op, rid, body, ok := fc.read()
	if ok {
		sc.mu.Lock()
		n := 0
		for i, c := range sc.conns {
			if c == fc {
				n = i
			}
		}
		sc.frames = append(sc.frames, frameRec{n, op, rid, body})
		sc.signal()
		sc.mu.Unlock()
	}
	return op, rid, body, ok
}

func (sc *script) waitFor(t *testing.T, what string, pred func() bool) {
	t.Helper()
	timeout := time.After(waitBound)
	for {
		sc.mu.Lock()
		ok, ch := pred(), sc.changed
		sc.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("the fake server never saw %s", what)
		}
	}
}

// count is how many frames of op connection n sent (under sc.mu in waitFor).
func (sc *script) count(n int, op byte) int {
	k := 0
	for _, f := range sc.frames {
		if f.conn == n && f.op == op {
			k++
		}
	}
	return k
}

// sent is what connection n sent, Pings left out, as op and key.
func (sc *script) sent(n int) []string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var out []string
	for _, f := range sc.frames {
		if f.conn == n && f.op != opPing {
			out = append(out, opName(f.op)+" "+keyOf(f.op, f.body))
		}
	}
	return out
}

// kill fails connection n, as a leader that dies.
func (sc *script) kill(t *testing.T, n int) {
	t.Helper()
	sc.waitFor(t, "the connection", func() bool { return len(sc.conns) > n })
	sc.mu.Lock()
	c := sc.conns[n].c
	sc.mu.Unlock()
	c.Close()
}

func opName(op byte) string {
	return map[byte]string{opHello: "hello", opAcquire: "acquire", opRelease: "release", opExtend: "extend",
		opCancel: "cancel", opPing: "ping", opResume: "resume", opProclaim: "proclaim"}[op]
}

func keyOf(op byte, b []byte) string {
	switch op {
	case opAcquire:
		return string(b[10 : 10+int(b[9])])
	case opRelease:
		return string(b[9 : 9+int(b[8])])
	case opExtend:
		return string(b[13 : 13+int(b[12])])
	case opProclaim:
		return string(b[9 : 9+int(b[8])])
	}
	return ""
}

func (fc *fakeConn) welcomeFlags(rid uint32, keepaliveMs uint32, flags int) {
	b := []byte{0, 1}
	b = putU32(b, keepaliveMs)
	b = putU32(b, 10)
	b = putU32(b, 86400000)
	b = putU64(b, testSID)
	b = putU32(b, 100)
	b = putU32(b, 100)
	b = append(b, 1, 0)
	if flags >= 0 {
		b = append(b, byte(flags))
	}
	fc.answer(rid, b)
}

func (fc *fakeConn) grant(rid uint32, token uint64, ttl uint32) {
	fc.answer(rid, putU32(putU64([]byte{0}, token), ttl))
}

func (fc *fakeConn) held(rid uint32, key string, token uint64, mode HoldMode, ttl uint32) {
	b := putU64(nil, token)
	b = append(b, byte(mode))
	b = putU32(b, ttl)
	b = putName(b, key)
	h := make([]byte, headerLen)
	h[0] = kindHeld
	binary.LittleEndian.PutUint32(h[1:5], rid)
	binary.LittleEndian.PutUint16(h[5:7], uint16(len(b)))
	_, _ = fc.c.Write(append(h, b...))
}

type heldSpec struct {
	key   string
	token uint64
	mode  HoldMode
	ttl   uint32
}

// answerAll grants an Acquire of a key in grants (any other stays
// queued) and answers Release, Extend and Ping ok, until EOF.
func answerAll(sc *script, fc *fakeConn, grants map[string]uint64) {
	for {
		op, rid, body, ok := sc.read(fc)
		if !ok {
			return
		}
		switch op {
		case opAcquire:
			if tok, ok := grants[keyOf(op, body)]; ok {
				ttl := uint32(noTTL)
				if body[0] == byte(HoldLease) {
					ttl = binary.LittleEndian.Uint32(body[1:5])
				}
				fc.grant(rid, tok, ttl)
			}
		case opExtend:
			fc.grant(rid, binary.LittleEndian.Uint64(body[0:8]), binary.LittleEndian.Uint32(body[8:12]))
		case opRelease, opPing:
			fc.reply(rid, StatusOK)
		default:
			fc.reply(rid, StatusInvalid)
		}
	}
}

// opener opens the session with flags (-1: a 32-byte welcome), then answerAll.
func opener(grants map[string]uint64, flags int, keepaliveMs uint32) func(*script, *fakeConn) {
	return func(sc *script, fc *fakeConn) {
		op, rid, _, ok := sc.read(fc)
		if !ok || op != opHello {
			return
		}
		fc.welcomeFlags(rid, keepaliveMs, flags)
		answerAll(sc, fc, grants)
	}
}

// resumer expects a Resume, answers the Held list and the welcome, then answerAll.
func resumer(held []heldSpec, grants map[string]uint64) func(*script, *fakeConn) {
	return func(sc *script, fc *fakeConn) {
		op, rid, _, ok := sc.read(fc)
		if !ok || op != opResume {
			return
		}
		for _, h := range held {
			fc.held(rid, h.key, h.token, h.mode, h.ttl)
		}
		fc.welcomeFlags(rid, 10000, flagResumable)
		answerAll(sc, fc, grants)
	}
}

func refuseResume(answer func(fc *fakeConn, rid uint32)) func(*script, *fakeConn) {
	return func(sc *script, fc *fakeConn) {
		if _, rid, _, ok := sc.read(fc); ok {
			answer(fc, rid)
		}
	}
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitBound):
		t.Fatalf("%s did not happen", what)
	}
}

func isOpen(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

func TestResumeKeepsAListedHoldAndLosesAnUnlistedOne(t *testing.T) {
	sc := newScript(opener(map[string]uint64{"a": 10, "b": 11}, flagResumable, 10000),
		resumer([]heldSpec{{"a", 10, HoldSession, noTTL}}, nil))
	f := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Resumable() {
		t.Fatal("the welcome's flag was not seen")
	}
	a, err := s.Acquire(tctx(t), "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(tctx(t), "b")
	if err != nil {
		t.Fatal(err)
	}
	sc.kill(t, 0)
	waitClosed(t, b.Lost(), "the unlisted hold's loss")
	// The loss is reported once the resume is done.
	if s.Resumes() != 1 {
		t.Fatalf("resumes %d", s.Resumes())
	}
	var le *LostError
	if !errors.As(b.Err(), &le) || le.Reason != LostNotListed {
		t.Fatalf("b: %v", b.Err())
	}
	if !isOpen(a.Lost()) || a.Err() != nil {
		t.Fatalf("the listed hold was lost: %v", a.Err())
	}
	sc.mu.Lock()
	var resume frameRec
	for _, fr := range sc.frames {
		if fr.conn == 1 {
			resume = fr
			break
		}
	}
	sc.mu.Unlock()
	if want := append([]byte{1}, putU64(nil, testSID)...); resume.op != opResume || !bytes.Equal(resume.body, want) {
		t.Fatalf("the first frame of the new connection: op %d body % x, want a Resume % x", resume.op, resume.body, want)
	}
	if err := a.Release(tctx(t)); err != nil {
		t.Fatal(err)
	}
	sc.mu.Lock()
	var rel []byte
	for _, fr := range sc.frames {
		if fr.conn == 1 && fr.op == opRelease {
			rel = fr.body
		}
	}
	sc.mu.Unlock()
	if want := append(putU64(nil, 10), 1, 'a'); !bytes.Equal(rel, want) {
		t.Fatalf("release on the new connection % x, want % x", rel, want)
	}
	if err := s.Ping(tctx(t)); err != nil || s.Err() != nil {
		t.Fatalf("ping %v, session %v", err, s.Err())
	}
}

func TestResumeGrantsAListedInFlightAcquireAndSendsTheOthersAgain(t *testing.T) {
	sc := newScript(opener(nil, flagResumable, 10000),
		resumer([]heldSpec{{"x", 20, HoldLease, 20000}}, map[string]uint64{"y": 21}))
	f := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	type got struct {
		l   *Lease
		err error
	}
	xc, yc := make(chan got, 1), make(chan got, 1)
	go func() { l, err := s.Acquire(tctx(t), "x", WithTTL(30*time.Second)); xc <- got{l, err} }()
	go func() { l, err := s.Acquire(tctx(t), "y"); yc <- got{l, err} }()
	sc.waitFor(t, "two acquires", func() bool { return sc.count(0, opAcquire) == 2 })
	sc.kill(t, 0)
	var x, y got
	for _, p := range []struct {
		ch  chan got
		dst *got
	}{{xc, &x}, {yc, &y}} {
		select {
		case *p.dst = <-p.ch:
		case <-time.After(waitBound):
			t.Fatal("an acquire was not answered")
		}
	}
	if x.err != nil || y.err != nil {
		t.Fatalf("x %v, y %v", x.err, y.err)
	}
	if x.l.Token() != 20 || x.l.Mode() != HoldLease || y.l.Token() != 21 {
		t.Fatalf("x token %d mode %v, y token %d", x.l.Token(), x.l.Mode(), y.l.Token())
	}
	// Its expiry on this side counts from the listed TTL left, not the full TTL.
	if until := time.Until(x.l.ExpiresAt()); until > 20*time.Second {
		t.Fatalf("x expires in %v: more than the 20 s listed", until)
	}
	if got := strings.Join(sc.sent(1), ","); got != "resume ,acquire y" {
		t.Fatalf("the new connection got %q: x sent again, or y not", got)
	}
	if s.Resumes() != 1 {
		t.Fatalf("resumes %d", s.Resumes())
	}
}

func TestResumeSettlesReleasesAndCancelsInFlight(t *testing.T) {
	// p is released while the connection is down and not listed (done);
	// q's release is in flight and q still listed (sent again); r's
	// acquire was cancelled and is not listed (cancelled, nothing sent).
	first := func(sc *script, fc *fakeConn) {
		_, rid, _, ok := sc.read(fc)
		if !ok {
			return
		}
		fc.welcomeFlags(rid, 10000, flagResumable)
		for {
			op, rid, body, ok := sc.read(fc)
			if !ok {
				return
			}
			switch {
			case op == opAcquire && keyOf(op, body) == "p":
				fc.grant(rid, 30, noTTL)
			case op == opAcquire && keyOf(op, body) == "q":
				fc.grant(rid, 31, noTTL)
			case op == opPing:
				fc.reply(rid, StatusOK)
			} // Releases and Cancels: no answer, the connection dies.
		}
	}
	sc := newScript(first, resumer([]heldSpec{{"q", 31, HoldSession, noTTL}}, nil))
	f := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := s.Acquire(tctx(t), "p")
	if err != nil {
		t.Fatal(err)
	}
	q, err := s.Acquire(tctx(t), "q")
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(tctx(t))
	rc := make(chan error, 1)
	go func() { _, err := s.Acquire(rctx, "r"); rc <- err }()
	sc.waitFor(t, "the acquire of r", func() bool { return sc.count(0, opAcquire) == 3 })
	pc, qc := make(chan error, 1), make(chan error, 1)
	go func() { pc <- p.Release(tctx(t)) }()
	go func() { qc <- q.Release(tctx(t)) }()
	cancel()
	sc.waitFor(t, "two releases and a cancel", func() bool {
		return sc.count(0, opRelease) == 2 && sc.count(0, opCancel) == 1
	})
	sc.kill(t, 0)
	for name, ch := range map[string]chan error{"p": pc, "q": qc, "r": rc} {
		select {
		case err := <-ch:
			var ce *CancelError
			if name == "r" && (!errors.As(err, &ce) || ce.Released != 0) {
				t.Fatalf("r: %v", err)
			}
			if name != "r" && err != nil {
				t.Fatalf("release of %s: %v", name, err)
			}
		case <-time.After(waitBound):
			t.Fatalf("%s was not answered", name)
		}
	}
	if got := strings.Join(sc.sent(1), ","); got != "resume ,release q" {
		t.Fatalf("the new connection got %q", got)
	}
	if s.Err() != nil {
		t.Fatal(s.Err())
	}
}

func TestUnknownSessionEndsTheSession(t *testing.T) {
	for name, refusal := range map[string]func(fc *fakeConn, rid uint32){
		"unknown_session": func(fc *fakeConn, rid uint32) { fc.reply(rid, StatusUnknownSession) },
		"a bare -":        func(fc *fakeConn, rid uint32) { _, _ = fc.c.Write([]byte("-")) },
	} {
		t.Run(name, func(t *testing.T) {
			sc := newScript(opener(map[string]uint64{"a": 10}, flagResumable, 10000), refuseResume(refusal))
			f := startFake(t, sc.handle)
			s, err := Dial(tctx(t), []string{f.addr()})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			a, err := s.Acquire(tctx(t), "a")
			if err != nil {
				t.Fatal(err)
			}
			sc.kill(t, 0)
			waitClosed(t, a.Lost(), "the loss")
			var le *LostError
			if !errors.As(a.Err(), &le) || le.Reason != LostSessionEnded {
				t.Fatalf("a: %v", a.Err())
			}
			waitClosed(t, s.Done(), "the session's end")
			if !errors.Is(s.Err(), ErrSessionEnded) || !errors.Is(s.Err(), ErrUnknownSession) {
				t.Fatalf("session: %v", s.Err())
			}
			if s.Resumes() != 0 || f.connections() != 2 {
				t.Fatalf("resumes %d, connections %d", s.Resumes(), f.connections())
			}
			if err := s.Ping(tctx(t)); !errors.Is(err, ErrSessionEnded) {
				t.Fatalf("a later request: %v", err)
			}
		})
	}
}

func TestNoResumeWithoutTheFlag(t *testing.T) {
	for _, flags := range []int{-1, 0} {
		sc := newScript(opener(map[string]uint64{"a": 10}, flags, 10000),
			resumer([]heldSpec{{"a", 10, HoldSession, noTTL}}, nil))
		f := startFake(t, sc.handle)
		s, err := Dial(tctx(t), []string{f.addr()})
		if err != nil {
			t.Fatal(err)
		}
		if s.Resumable() {
			t.Fatalf("flags %d: resumable", flags)
		}
		a, err := s.Acquire(tctx(t), "a")
		if err != nil {
			t.Fatal(err)
		}
		sc.kill(t, 0)
		waitClosed(t, a.Lost(), "the loss")
		waitClosed(t, s.Done(), "the session's end")
		if f.connections() != 1 || s.Resumes() != 0 {
			t.Fatalf("flags %d: %d connections, %d resumes: it tried to resume", flags, f.connections(), s.Resumes())
		}
		s.Close()
	}
}

func TestResumeGivesUpOnceTheKeepalivePassed(t *testing.T) {
	// Every later connection answers not_leader naming nobody: the session
	// walks its address until its keep-alive (300 ms) has passed.
	sc := newScript(opener(map[string]uint64{"a": 10}, flagResumable, 300),
		refuseResume(func(fc *fakeConn, rid uint32) { fc.refuse(rid, StatusNotLeader, "") }))
	f := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, err := s.Acquire(tctx(t), "a")
	if err != nil {
		t.Fatal(err)
	}
	sc.kill(t, 0)
	waitClosed(t, s.Done(), "the session's end")
	if isOpen(a.Lost()) || !strings.Contains(s.Err().Error(), "within the keep-alive") {
		t.Fatalf("lost %v, session %v", a.Err(), s.Err())
	}
	if f.connections() < 2 || s.Resumes() != 0 {
		t.Fatalf("%d connections, %d resumes", f.connections(), s.Resumes())
	}
}

func TestANotLeaderCloseResumesOnTheLeaderItNames(t *testing.T) {
	leaderSc := newScript(resumer([]heldSpec{{"a", 10, HoldSession, noTTL}}, nil))
	leader := startFake(t, leaderSc.handle)
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
				// This node lost its leadership: name the leader, close.
				fc.refuse(rid, StatusNotLeader, leader.addr())
				return
			default:
				fc.reply(rid, StatusOK)
			}
		}
	}
	sc := newScript(first)
	f := startFake(t, sc.handle)
	// The leader is listed (second): a plaintext Resume, which carries the
	// session id, goes to listed addresses only (hints_test.go); the hint
	// puts it first.
	s, err := Dial(tctx(t), []string{f.addr(), leader.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, err := s.Acquire(tctx(t), "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(tctx(t)); err != nil { // answered not_leader, sent again on the leader
		t.Fatal(err)
	}
	if s.Resumes() != 1 || s.RemoteAddr().String() != leader.addr() {
		t.Fatalf("resumes %d, connected to %s", s.Resumes(), s.RemoteAddr())
	}
	if got := strings.Join(leaderSc.sent(0), ","); got != "resume ,release a" {
		t.Fatalf("the leader got %q", got)
	}
}
