package conformance

import (
	"errors"
	"fmt"
	"testing"
	"time"

	ringlock "github.com/ringlock/ringlock/clients/go"
	"github.com/ringlock/ringlock/clients/go/internal/testserver"
)

// The watch scenarios of docs/conformance.md: watch_order, watch_rewatch.

// event is w's next event, within 30 s; a watch that ended fails.
func event(t *testing.T, w *ringlock.Watch) ringlock.WatchEvent {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if !ok {
			t.Fatalf("the watch of %s ended: %v", w.Key(), w.Err())
		}
		return ev
	case <-time.After(30 * time.Second):
		t.Fatalf("no event on %s within 30 s", w.Key())
	}
	return ringlock.WatchEvent{}
}

// expectEvent fails unless w's next event is kind for token.
func expectEvent(t *testing.T, w *ringlock.Watch, kind ringlock.EventKind, token uint64) {
	t.Helper()
	ev := event(t, w)
	if ev.Kind != kind || ev.Token != token {
		t.Fatalf("event %s %d, want %s %d", ev.Kind, ev.Token, kind, token)
	}
}

// tokens lists the holders' tokens.
func tokens(hs []ringlock.Holder) []uint64 {
	out := []uint64{}
	for _, h := range hs {
		out = append(out, h.Token)
	}
	return out
}

// watchOrder: a watcher is told a holder's release, then the next grant,
// in that order, then a session's end; a closed watch hears nothing more
// and a new watch of the key reports the next grant.
func watchOrder(t *testing.T, srv *testserver.Server) {
	k := key(t, "k")
	a, b, ws := dial(t, srv.Lock), dial(t, srv.Lock), dial(t, srv.Lock)
	if !ws.Watches() {
		t.Fatal("ringlockd does not offer watches")
	}
	la, err := a.Acquire(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ws.Watch(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	if got := tokens(w.Holders()); fmt.Sprint(got) != fmt.Sprint([]uint64{la.Token()}) {
		t.Fatalf("the watch lists holders %v, want [%d]", got, la.Token())
	}
	bch := acquireAsync(ctx(t), b, k)
	waitQueued(t, srv, 1)
	if err := la.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lb := got(t, "b after a's release", bch)
	expectEvent(t, w, ringlock.EventReleased, la.Token())
	expectEvent(t, w, ringlock.EventGranted, lb.Token())
	// b's session ends with the key held: its end frees it.
	b.Close()
	expectEvent(t, w, ringlock.EventSessionEnded, lb.Token())
	if err := w.Close(); err != nil {
		t.Fatalf("unwatch: %v", err)
	}
	// Closed: a change now is reported to nobody but a second watch.
	again, err := ws.Watch(ctx(t), k)
	if err != nil {
		t.Fatalf("a second watch: %v", err)
	}
	if got := again.Holders(); len(got) != 0 {
		t.Fatalf("the second watch of the free key lists %v", tokens(got))
	}
	lc, err := a.Acquire(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	expectEvent(t, again, ringlock.EventGranted, lc.Token())
	for ev := range w.Events() {
		t.Fatalf("the closed watch delivered %s %d", ev.Kind, ev.Token)
	}
	if !errors.Is(w.Err(), ringlock.ErrWatchClosed) {
		t.Fatalf("the closed watch's Err: %v", w.Err())
	}
	if err := lc.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
}

// watchRewatch: a watch ends with its session (an error, not silence); a
// lock taken meanwhile is not replayed, but a new session's watch lists it.
func watchRewatch(t *testing.T, srv *testserver.Server) {
	k := key(t, "k")
	a, ws := dial(t, srv.Lock), dial(t, srv.Lock)
	w, err := ws.Watch(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Holders(); len(got) != 0 {
		t.Fatalf("a free key lists holders %v", tokens(got))
	}
	ws.Close()
	select {
	case ev, ok := <-w.Events():
		if ok {
			t.Fatalf("an event after the session's end: %s %d", ev.Kind, ev.Token)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the watch of a closed session is silent, not ended, after 30 s")
	}
	err = w.Err()
	var we *ringlock.WatchEndedError
	if err == nil || err.Error() == "" || !errors.Is(err, ringlock.ErrWatchEnded) || !errors.As(err, &we) || we.Key != k {
		t.Fatalf("the ended watch's Err: %v, want a WatchEndedError", err)
	}
	// Changed while nobody watched: not replayed, but listed.
	la, err := a.Acquire(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	ws2 := dial(t, srv.Lock)
	again, err := ws2.Watch(ctx(t), k)
	if err != nil {
		t.Fatalf("watched again: %v", err)
	}
	if got := tokens(again.Holders()); fmt.Sprint(got) != fmt.Sprint([]uint64{la.Token()}) {
		t.Fatalf("the new watch lists holders %v, want the holder as it is now [%d]", got, la.Token())
	}
	if err := la.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
}
