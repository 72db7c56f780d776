package conformance

import (
	"errors"
	"strings"
	"testing"

	ringlock "github.com/ringlock/ringlock/clients/go"
	"github.com/ringlock/ringlock/clients/go/internal/testserver"
)

// The lock-mode scenarios of docs/conformance.md: modes_fifo,
// modes_semaphore.

// notAnswered fails if ch already holds an answer: s's Ping is answered
// after any grant decided before it was sent.
func notAnswered(t *testing.T, what string, s *ringlock.Session, ch chan acquired) {
	t.Helper()
	if err := s.Ping(ctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-ch:
		t.Fatalf("%s was answered: %v, %v", what, a.lease, a.err)
	default:
	}
}

// modesFifo: readers share; a writer queued behind them is granted before
// a reader that came after it (one FIFO queue per key).
func modesFifo(t *testing.T, srv *testserver.Server) {
	k := key(t, "k")
	r1, r2, w, r3 := dial(t, srv.Lock), dial(t, srv.Lock), dial(t, srv.Lock), dial(t, srv.Lock)
	if !r1.Modes() {
		t.Fatal("ringlockd does not offer lock modes")
	}
	l1, err := r1.LockShared(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := r2.TryLockShared(ctx(t), k)
	if err != nil {
		t.Fatalf("a second reader while only a reader held: %v", err)
	}
	if l2.Token() <= l1.Token() || l1.Access() != ringlock.Shared || l2.Access() != ringlock.Shared {
		t.Fatalf("tokens %d, %d; access %v, %v", l1.Token(), l2.Token(), l1.Access(), l2.Access())
	}
	if _, err := w.TryLock(ctx(t), k); !errors.Is(err, ringlock.ErrBusy) {
		t.Fatalf("an exclusive try while readers held: %v", err)
	}
	wch := acquireAsync(ctx(t), w, k)
	waitQueued(t, srv, 1)
	if _, err := r3.TryLockShared(ctx(t), k); !errors.Is(err, ringlock.ErrBusy) {
		t.Fatalf("a reader overtook the waiting writer: %v", err)
	}
	rch := acquireAsync(ctx(t), r3, k, ringlock.WithAccess(ringlock.Shared))
	waitQueued(t, srv, 2)
	if err := l1.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	notAnswered(t, "the writer, while a reader still held,", w, wch)
	if err := l2.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lw := got(t, "the writer", wch)
	if lw.Token() <= l2.Token() || lw.Access() != ringlock.Exclusive {
		t.Fatalf("writer token %d (after %d), access %v", lw.Token(), l2.Token(), lw.Access())
	}
	notAnswered(t, "the later reader, while the writer held,", r3, rch)
	if err := lw.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	l3 := got(t, "the later reader", rch)
	if l3.Token() <= lw.Token() {
		t.Fatalf("the later reader's token %d not larger than the writer's %d", l3.Token(), lw.Token())
	}
	if err := l3.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if h := holder(t, srv, k); h != 0 {
		t.Fatalf("still held (token %d)", h)
	}
}

// modesSemaphore: a semaphore of 2 admits two, a third waits until one
// releases; another size is refused with mode_mismatch.
func modesSemaphore(t *testing.T, srv *testserver.Server) {
	k := key(t, "k")
	a, b, c := dial(t, srv.Lock), dial(t, srv.Lock), dial(t, srv.Lock)
	pa, err := a.Permit(ctx(t), k, 2)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := b.TryPermit(ctx(t), k, 2)
	if err != nil {
		t.Fatalf("the second permit of 2: %v", err)
	}
	if pa.Access() != ringlock.Semaphore(2) || pb.Token() <= pa.Token() {
		t.Fatalf("access %v, tokens %d, %d", pa.Access(), pa.Token(), pb.Token())
	}
	if _, err := c.TryPermit(ctx(t), k, 2); !errors.Is(err, ringlock.ErrBusy) {
		t.Fatalf("a third permit of 2: %v", err)
	}
	_, err = c.Permit(ctx(t), k, 3)
	var mm *ringlock.ModeMismatchError
	if !errors.Is(err, ringlock.ErrModeMismatch) || !errors.As(err, &mm) || mm.Key != k || mm.Slots != 3 || !strings.Contains(err.Error(), k) {
		t.Fatalf("a permit of 3 on a semaphore of 2: %v", err)
	}
	cch := acquireAsync(ctx(t), c, k, ringlock.WithAccess(ringlock.Semaphore(2)))
	waitQueued(t, srv, 1)
	if err := pa.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	pc := got(t, "the third permit", cch)
	if pc.Token() <= pb.Token() {
		t.Fatalf("the third permit's token %d not larger than %d", pc.Token(), pb.Token())
	}
	for _, l := range []*ringlock.Lease{pb, pc} {
		if err := l.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	// Free again: the next first holder fixes another size.
	p5, err := a.TryPermit(ctx(t), k, 5)
	if err != nil {
		t.Fatalf("a permit of 5 on the free key: %v", err)
	}
	if err := p5.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}
