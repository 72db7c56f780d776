package ringlock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ringlock/ringlock/clients/go/internal/testserver"
)

// Lock modes (docs/protocol.md, "Lock modes: shared and semaphore holds"):
// shared and semaphore Acquires, the welcome's modes flag checked before
// anything is sent (also after a resume), mode_mismatch. The Test*Fake*
// tests run against a scripted fake server (what is on the wire, what is
// not sent); the Test*RealServer* tests against the real ringlockd: shared
// holders at once, an exclusive request waiting for them, a semaphore of 2,
// another slot count refused, and a durable --data-path server offering
// them too (every ringlockd since lock modes does: the precise error of an
// older one is the fake's).

// accessOf is an Acquire body's trailer as "access/slots", "" without one.
func accessOf(b []byte) string {
	end := 10 + int(b[9])
	end += 1 + int(b[end])
	if len(b) == end {
		return ""
	}
	if len(b) != end+5 {
		return fmt.Sprintf("bad trailer % x", b[end:])
	}
	return fmt.Sprintf("%d/%d", b[end], binary.LittleEndian.Uint32(b[end+1:]))
}

// acquiresOn is what connection n asked for: "key access/slots" per Acquire.
func (sc *script) acquiresOn(n int) []string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	out := []string{}
	for _, f := range sc.frames {
		if f.conn == n && f.op == opAcquire {
			out = append(out, strings.TrimSpace(keyOf(f.op, f.body)+" "+accessOf(f.body)))
		}
	}
	return out
}

// modesServer opens a session (a Hello) with flags (-1: a 32-byte
// welcome) or resumes one (a Resume) with resumeFlags; then an Acquire is
// granted (tokens 100, 101, ...) unless its key is in queued (no answer)
// or it asks for a semaphore of 3 (mode_mismatch); anything else is ok.
func modesServer(flags, resumeFlags int, queued ...string) func(*script, *fakeConn) {
	return func(sc *script, fc *fakeConn) {
		op, rid, _, ok := sc.read(fc)
		if !ok {
			return
		}
		if op == opResume {
			fc.welcomeFlags(rid, 10000, resumeFlags)
		} else {
			fc.welcomeFlags(rid, 10000, flags)
		}
		tok := uint64(100)
		for {
			op, rid, body, ok := sc.read(fc)
			if !ok {
				return
			}
			switch {
			case op == opAcquire && contains(queued, keyOf(op, body)):
			case op == opAcquire && accessOf(body) == "2/3":
				fc.reply(rid, StatusModeMismatch)
			case op == opAcquire:
				fc.grant(rid, tok, noTTL)
				tok++
			default:
				fc.reply(rid, StatusOK)
			}
		}
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func TestModesFakeWithoutTheFlagNothingIsSent(t *testing.T) {
	// flags 0 (a server without modes), 1 (resumable only), none (a
	// 32-byte welcome: an older server).
	for _, flags := range []int{0, flagResumable, -1} {
		sc := newScript(modesServer(flags, -1))
		f := startFake(t, sc.handle)
		s, err := Dial(tctx(t), []string{f.addr()})
		if err != nil {
			t.Fatal(err)
		}
		if s.Modes() {
			t.Fatalf("flags %d: Modes() true", flags)
		}
		for name, acquire := range map[string]func() (*Lease, error){
			"LockShared":    func() (*Lease, error) { return s.LockShared(tctx(t), "doc") },
			"TryLockShared": func() (*Lease, error) { return s.TryLockShared(tctx(t), "doc") },
			"Permit":        func() (*Lease, error) { return s.Permit(tctx(t), "doc", 2) },
			"TryPermit":     func() (*Lease, error) { return s.TryPermit(tctx(t), "doc", 2) },
			"WithAccess":    func() (*Lease, error) { return s.Acquire(tctx(t), "doc", WithAccess(Shared), WithTTL(time.Second)) },
		} {
			l, err := acquire()
			var mu *ModesUnsupportedError
			if l != nil || !errors.Is(err, ErrModesUnsupported) || !errors.As(err, &mu) || mu.Key != "doc" || mu.Addr != f.addr() ||
				!strings.Contains(err.Error(), "nothing was sent") || errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("flags %d, %s: %v, %v", flags, name, l, err)
			}
		}
		// An exclusive Acquire still works, without a trailer.
		l, err := s.Acquire(tctx(t), "doc")
		if err != nil || l.Access() != Exclusive {
			t.Fatalf("flags %d: exclusive: %v", flags, err)
		}
		if err := s.Ping(tctx(t)); err != nil {
			t.Fatal(err)
		}
		if got := sc.acquiresOn(0); !reflect.DeepEqual(got, []string{"doc"}) {
			t.Fatalf("flags %d: acquires sent %q", flags, got)
		}
		s.Close()
	}
}

func TestModesFakeTheTrailerOnTheWireAndTheLeaseTellsItsAccess(t *testing.T) {
	sc := newScript(modesServer(flagModes, -1))
	f := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Modes() {
		t.Fatal("the welcome's modes flag was not seen")
	}
	var leases []*Lease
	for _, acquire := range []func() (*Lease, error){
		func() (*Lease, error) { return s.LockShared(tctx(t), "doc") },
		func() (*Lease, error) { return s.Permit(tctx(t), "pool", 2, WithTTL(30*time.Second)) },
		func() (*Lease, error) { return s.TryLockShared(tctx(t), "doc2") },
		func() (*Lease, error) { return s.Acquire(tctx(t), "doc3") },
		func() (*Lease, error) { return s.Acquire(tctx(t), "doc4", WithAccess(Semaphore(5)), Persistent()) },
		func() (*Lease, error) { return s.TryPermit(tctx(t), "doc5", 1) },
	} {
		l, err := acquire()
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	want := []Access{Shared, Semaphore(2), Shared, Exclusive, Semaphore(5), Semaphore(1)}
	for i, l := range leases {
		if l.Access() != want[i] {
			t.Errorf("lease %d (%s): access %v, want %v", i, l.Key(), l.Access(), want[i])
		}
	}
	if leases[1].Mode() != HoldLease || leases[1].Access().Kind != AccessSemaphore || leases[1].Access().Slots != 2 {
		t.Fatalf("the permit: %v %v", leases[1].Mode(), leases[1].Access())
	}
	if got, want := sc.acquiresOn(0), []string{"doc 1/0", "pool 2/2", "doc2 1/0", "doc3", "doc4 2/5", "doc5 2/1"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("acquires sent %q, want %q", got, want)
	}
}

func TestModesFakeModeMismatchIsItsOwnErrorNamingTheKey(t *testing.T) {
	sc := newScript(modesServer(flagModes, -1))
	f := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, acquire := range []func() (*Lease, error){
		func() (*Lease, error) { return s.Permit(tctx(t), "pool", 3) },
		func() (*Lease, error) { return s.TryPermit(tctx(t), "pool", 3) },
		func() (*Lease, error) { return s.Acquire(tctx(t), "pool", WithAccess(Semaphore(3))) },
	} {
		l, err := acquire()
		var mm *ModeMismatchError
		var se *StatusError
		if l != nil || !errors.Is(err, ErrModeMismatch) || !errors.As(err, &mm) || mm.Key != "pool" || mm.Slots != 3 ||
			!errors.As(err, &se) || se.Status != StatusModeMismatch || !strings.Contains(err.Error(), `"pool"`) {
			t.Fatalf("%v, %v", l, err)
		}
	}
	if err := s.Ping(tctx(t)); err != nil || s.Err() != nil {
		t.Fatalf("the session did not go on: %v %v", err, s.Err())
	}
}

func TestModesFakeBadAccessIsAUsageErrorAndNothingIsSent(t *testing.T) {
	sc := newScript(modesServer(flagModes, -1))
	f := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, acquire := range []func() (*Lease, error){
		func() (*Lease, error) { return s.Permit(tctx(t), "pool", 0) },
		func() (*Lease, error) { return s.TryPermit(tctx(t), "pool", 0) },
		func() (*Lease, error) {
			return s.Acquire(tctx(t), "pool", WithAccess(Access{Kind: AccessShared, Slots: 2}))
		},
		func() (*Lease, error) { return s.Acquire(tctx(t), "pool", WithAccess(Access{Kind: 7})) },
	} {
		if l, err := acquire(); l != nil || !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%v, %v", l, err)
		}
	}
	if err := s.Ping(tctx(t)); err != nil {
		t.Fatal(err)
	}
	if got := sc.acquiresOn(0); len(got) != 0 {
		t.Fatalf("sent %q", got)
	}
}

// The first leader offers modes; the one the session resumes on does not:
// a shared Acquire in flight is not sent again there (it would be answered
// invalid) but ends with a *ModesUnsupportedError; an exclusive one in
// flight is sent again; later shared Acquires fail at once.
func TestModesFakeAResumeOnAServerWithoutModes(t *testing.T) {
	sc := newScript(modesServer(flagResumable|flagModes, -1, "r", "w"), modesServer(-1, flagResumable))
	f := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Modes() || !s.Resumable() {
		t.Fatal("flags not seen")
	}
	r := make(chan error, 1)
	w := make(chan error, 1)
	go func() { _, err := s.LockShared(tctx(t), "r"); r <- err }()
	go func() { _, err := s.Acquire(tctx(t), "w"); w <- err }()
	sc.waitFor(t, "two acquires", func() bool { return sc.count(0, opAcquire) == 2 })
	sc.kill(t, 0)
	for name, ch := range map[string]chan error{"shared": r, "exclusive": w} {
		select {
		case err := <-ch:
			var mu *ModesUnsupportedError
			if name == "shared" && (!errors.As(err, &mu) || mu.Key != "r" || mu.Access != Shared) {
				t.Fatalf("the shared acquire in flight: %v", err)
			}
			if name == "exclusive" && err != nil {
				t.Fatalf("the exclusive acquire in flight: %v", err)
			}
		case <-time.After(waitBound):
			t.Fatalf("the %s acquire was not answered", name)
		}
	}
	if s.Resumes() != 1 || s.Modes() {
		t.Fatalf("resumes %d, modes %v", s.Resumes(), s.Modes())
	}
	if _, err := s.LockShared(tctx(t), "r2"); !errors.Is(err, ErrModesUnsupported) {
		t.Fatalf("a shared acquire after the resume: %v", err)
	}
	if err := s.Ping(tctx(t)); err != nil {
		t.Fatal(err)
	}
	if got := sc.acquiresOn(1); !reflect.DeepEqual(got, []string{"w"}) {
		t.Fatalf("sent again after the resume: %q", got)
	}
}

// modesServerStart starts the real ringlockd (killed at the test's end).
func modesServerStart(t *testing.T, extra ...string) *testserver.Server {
	t.Helper()
	srv, err := testserver.Start(extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill9)
	return srv
}

func dialReal(t *testing.T, srv *testserver.Server) *Session {
	t.Helper()
	s, err := Dial(tctx(t), []string{srv.Lock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

type acquireResult struct {
	l   *Lease
	err error
}

func acquireBg(fn func() (*Lease, error)) chan acquireResult {
	ch := make(chan acquireResult, 1)
	go func() { l, err := fn(); ch <- acquireResult{l, err} }()
	return ch
}

func waitGranted(t *testing.T, what string, ch chan acquireResult) *Lease {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.l
	case <-time.After(waitBound):
		t.Fatalf("%s: not granted within %v", what, waitBound)
	}
	return nil
}

func TestModesRealServerSharedHoldersAtOnceAndAnExclusiveWaits(t *testing.T) {
	srv := modesServerStart(t)
	a, b, w, late := dialReal(t, srv), dialReal(t, srv), dialReal(t, srv), dialReal(t, srv)
	if !a.Modes() {
		t.Fatal("ringlockd does not offer lock modes")
	}
	const k = "modes/doc"
	ra, err := a.LockShared(tctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.TryLockShared(tctx(t), k)
	if err != nil {
		t.Fatalf("a second reader: %v", err)
	}
	if rb.Token() <= ra.Token() || ra.Access() != Shared || rb.Access() != Shared {
		t.Fatalf("tokens %d, %d; access %v %v", ra.Token(), rb.Token(), ra.Access(), rb.Access())
	}
	if _, err := w.TryLock(tctx(t), k); !errors.Is(err, ErrBusy) {
		t.Fatalf("an exclusive try while readers hold: %v", err)
	}
	wch := acquireBg(func() (*Lease, error) { return w.Acquire(tctx(t), k) })
	if err := srv.WaitMetric("ringlock_queued_waiters", 1); err != nil {
		t.Fatal(err)
	}
	// A reader after the waiting writer is not let in ahead of it.
	if _, err := late.TryLockShared(tctx(t), k); !errors.Is(err, ErrBusy) {
		t.Fatalf("a reader behind a waiting writer: %v", err)
	}
	if err := ra.Release(tctx(t)); err != nil {
		t.Fatal(err)
	}
	// One reader still holds: the writer still waits. (A grant decided by
	// the release just answered would reach w before this Ping's answer.)
	if err := w.Ping(tctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-wch:
		t.Fatalf("the writer was answered while a reader held: %v %v", r.l, r.err)
	default:
	}
	if err := rb.Release(tctx(t)); err != nil {
		t.Fatal(err)
	}
	lw := waitGranted(t, "the writer", wch)
	if lw.Token() <= rb.Token() || lw.Access() != Exclusive {
		t.Fatalf("writer token %d after %d, access %v", lw.Token(), rb.Token(), lw.Access())
	}
	if err := lw.Release(tctx(t)); err != nil {
		t.Fatal(err)
	}
	rl, err := late.TryLockShared(tctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	_ = rl.Release(tctx(t))
}

func TestModesRealServerASemaphoreOfTwoAdmitsTwoAndTheThirdWaits(t *testing.T) {
	srv := modesServerStart(t)
	a, b, c := dialReal(t, srv), dialReal(t, srv), dialReal(t, srv)
	const k = "modes/pool"
	pa, err := a.Permit(tctx(t), k, 2)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := b.TryPermit(tctx(t), k, 2, WithTTL(30*time.Second))
	if err != nil {
		t.Fatalf("the second permit: %v", err)
	}
	if pa.Access() != Semaphore(2) || pb.Access() != Semaphore(2) {
		t.Fatalf("access %v %v", pa.Access(), pb.Access())
	}
	if _, err := c.TryPermit(tctx(t), k, 2); !errors.Is(err, ErrBusy) {
		t.Fatalf("a third permit of 2: %v", err)
	}
	_, err = c.Permit(tctx(t), k, 3)
	var mm *ModeMismatchError
	if !errors.As(err, &mm) || mm.Key != k || mm.Slots != 3 {
		t.Fatalf("a permit of 3: %v", err)
	}
	cch := acquireBg(func() (*Lease, error) { return c.Permit(tctx(t), k, 2) })
	if err := srv.WaitMetric("ringlock_queued_waiters", 1); err != nil {
		t.Fatal(err)
	}
	// Fixed while a semaphore request waits too.
	if _, err := a.TryPermit(tctx(t), k, 1); !errors.Is(err, ErrModeMismatch) {
		t.Fatalf("a permit of 1 while one of 2 waits: %v", err)
	}
	if err := pa.Release(tctx(t)); err != nil {
		t.Fatal(err)
	}
	pc := waitGranted(t, "the third permit", cch)
	if !(pa.Token() < pb.Token() && pb.Token() < pc.Token()) {
		t.Fatalf("tokens %d %d %d", pa.Token(), pb.Token(), pc.Token())
	}
	if err := pb.Release(tctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := pc.Release(tctx(t)); err != nil {
		t.Fatal(err)
	}
	// Free again: the next first holder fixes another size.
	p5, err := a.TryPermit(tctx(t), k, 5)
	if err != nil {
		t.Fatal(err)
	}
	_ = p5.Release(tctx(t))
}

func TestModesRealServerADurableServerOffersModesToo(t *testing.T) {
	srv := modesServerStart(t, "--data-path", filepath.Join(t.TempDir(), "locks.wal"))
	a, b := dialReal(t, srv), dialReal(t, srv)
	if !a.Modes() {
		t.Fatal("a --data-path server does not offer modes")
	}
	ctx, cancel := context.WithTimeout(tctx(t), 5*time.Second)
	defer cancel()
	ra, err := a.LockShared(ctx, "modes/d")
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.TryLockShared(ctx, "modes/d")
	if err != nil {
		t.Fatalf("a second reader: %v", err)
	}
	if _, err := b.TryLock(ctx, "modes/d"); !errors.Is(err, ErrBusy) {
		t.Fatalf("an exclusive try while readers hold: %v", err)
	}
	pa, err := a.TryPermit(ctx, "modes/p", 1, WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryPermit(ctx, "modes/p", 1); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second permit of 1: %v", err)
	}
	for _, l := range []*Lease{ra, rb, pa} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
