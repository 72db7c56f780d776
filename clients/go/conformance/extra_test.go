package conformance

import (
	"errors"
	"testing"
	"time"

	ringlock "github.com/ringlock/ringlock/clients/go"
	"github.com/ringlock/ringlock/clients/go/internal/testserver"
)

// Beyond the conformance scenarios: a lease granted after waiting longer than
// its TTL is handed out held (its expiry on this side is rebased by an
// Extend), not reported lost at once while the server still holds it.
func TestALeaseGrantedAfterALongWaitIsHeld(t *testing.T) {
	srv, err := testserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Kill9()
	k := key(t, "k")
	a, b := dial(t, srv.Lock), dial(t, srv.Lock)
	la, err := a.Acquire(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 300 * time.Millisecond
	asked := time.Now()
	ch := acquireAsync(ctx(t), b, k, ringlock.WithTTL(ttl))
	waitQueued(t, srv, 1)
	// The wait itself is the condition under test: longer than the TTL.
	time.Sleep(2*ttl - time.Since(asked))
	if err := la.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lb := got(t, "the lease after a long wait", ch)
	if err := lb.Err(); err != nil {
		t.Fatalf("handed out lost: %v", err)
	}
	if !lb.ExpiresAt().After(asked.Add(ttl)) {
		t.Fatalf("expiry %v not rebased past %v", lb.ExpiresAt(), asked.Add(ttl))
	}
	if h := holder(t, srv, k); h != lb.Token() {
		t.Fatalf("KEYX lists %d, the lease has %d", h, lb.Token())
	}
	if err := lb.Release(ctx(t)); err != nil {
		t.Fatalf("release: %v", err)
	}
	if h := holder(t, srv, k); h != 0 {
		t.Fatalf("still held after the release: %d", h)
	}
}

// Release from many goroutines at once sends one Release; every call gets
// its result, a later call too, and Lost never closes.
func TestConcurrentReleasesShareOneResult(t *testing.T) {
	srv, err := testserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Kill9()
	s := dial(t, srv.Lock)
	k := key(t, "k")
	l, err := s.Acquire(ctx(t), k, ringlock.WithTTL(30*time.Second), ringlock.WithAutoExtend())
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		go func() { errs <- l.Release(ctx(t)) }()
	}
	for i := 0; i < 8; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	if err := l.Release(ctx(t)); err != nil {
		t.Fatalf("a later release: %v", err)
	}
	if h := holder(t, srv, k); h != 0 {
		t.Fatalf("still held: %d", h)
	}
	select {
	case <-l.Lost():
		t.Fatalf("Lost() closed after a release: %v", l.Err())
	default:
	}
	// ReleaseToken of a hold this session's Lease has marks it released.
	kp := key(t, "p")
	lp, err := s.Acquire(ctx(t), kp, ringlock.Persistent())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseToken(ctx(t), kp, lp.Token()); err != nil {
		t.Fatal(err)
	}
	if err := lp.Release(ctx(t)); err != nil {
		t.Fatalf("Release after ReleaseToken: %v", err)
	}
	if h := holder(t, srv, kp); h != 0 {
		t.Fatalf("still held: %d", h)
	}
}

// An operator reset of a persistent hold taken by a live session is pushed
// as Lost (docs/protocol.md, "Lost"), like one of a session hold or a lease.
func TestAResetOfAPersistentHoldIsReportedLost(t *testing.T) {
	srv, err := testserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Kill9()
	k := key(t, "p")
	a := dial(t, srv.Lock)
	l, err := a.Acquire(ctx(t), k, ringlock.Persistent())
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Reset(k); err != nil {
		t.Fatal(err)
	}
	within(t, "Lost() of the reset persistent hold", l.Lost(), 5*time.Second)
	var le *ringlock.LostError
	if !errors.As(l.Err(), &le) || le.Reason != ringlock.LostReset || le.Token != l.Token() {
		t.Fatalf("Err() = %v", l.Err())
	}
	if err := l.Release(ctx(t)); !errors.Is(err, ringlock.ErrLost) {
		t.Fatalf("release after the reset: %v", err)
	}
}
