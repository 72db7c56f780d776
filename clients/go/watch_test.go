package ringlock

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ringlock/ringlock/clients/go/internal/testserver"
)

// Watching a key (docs/protocol.md, "Watching a key"): the Watch, Unwatch
// and Event codecs; the welcome's watches flag checked before anything is
// sent, and Events routed and ordered, against a scripted fake server; and
// against the real ringlockd (on $RINGLOCK_TEST_THREADS shards, and on 2):
// the holders listed, then every change another session makes, in order;
// shared holders; Close; a watch that ends with its session.

// eventBody is the test's encoder of an Event body (the server's is
// src/protocol/session/event.rs).
func eventBody(kind EventKind, key string, h Holder) []byte {
	b := []byte{byte(kind)}
	b = putU64(b, h.Token)
	b = append(b, byte(h.Hold), byte(h.Access.Kind))
	b = putU32(b, h.Access.Slots)
	b = putName(b, key)
	return putName(b, h.Source)
}

func TestEncodeWatchAndUnwatch(t *testing.T) {
	if got, want := encodeWatch(3, "job"), unhex(t, "0f 03000000 0400 03 6a6f62"); !bytes.Equal(got, want) {
		t.Fatalf("watch % x, want % x", got, want)
	}
	if got, want := encodeUnwatch(4, 3, "job"), unhex(t, "10 04000000 0800 03000000 03 6a6f62"); !bytes.Equal(got, want) {
		t.Fatalf("unwatch % x, want % x", got, want)
	}
	long := strings.Repeat("k", MaxKeyLen)
	if b := encodeWatch(1, long); int(binary.LittleEndian.Uint16(b[5:7])) != 1+MaxKeyLen || len(b) != headerLen+1+MaxKeyLen {
		t.Fatalf("a 127-byte key: % x", b[:7])
	}
}

func TestDecodeEventRoundtripsTruncationsAndTrailingBytes(t *testing.T) {
	// The documented layout, byte by byte: granted, token 0x0102..08,
	// lease, semaphore of 7, key "k", source "w1".
	doc := unhex(t, "01 0807060504030201 02 02 07000000 01 6b 02 7731")
	ev, err := decodeEvent(doc)
	want := WatchEvent{Kind: EventGranted, Key: "k", Holder: Holder{Token: 0x0102030405060708, Hold: HoldLease, Access: Semaphore(7), Source: "w1"}}
	if err != nil || ev != want {
		t.Fatalf("got %+v %v", ev, err)
	}
	for k := EventHolder; k <= EventProclaimed; k++ {
		for _, a := range []Access{Exclusive, Shared, Semaphore(1), Semaphore(1<<32 - 1)} {
			for _, hold := range []HoldMode{HoldPersistent, HoldSession, HoldLease} {
				for _, names := range [][2]string{{"k", ""}, {strings.Repeat("K", MaxKeyLen), strings.Repeat("s", MaxSourceLen)}} {
					h := Holder{Token: 1<<64 - 1, Hold: hold, Access: a, Source: names[1]}
					b := eventBody(k, names[0], h)
					ev, err := decodeEvent(b)
					if err != nil || ev != (WatchEvent{Kind: k, Key: names[0], Holder: h}) {
						t.Fatalf("%v %v %v: got %+v %v", k, a, hold, ev, err)
					}
					// A later version's appended fields are skipped.
					for _, extra := range [][]byte{{42}, bytes.Repeat([]byte{0xff}, 40)} {
						if ev2, err := decodeEvent(append(append([]byte{}, b...), extra...)); err != nil || ev2 != ev {
							t.Fatalf("%v with %d trailing bytes: %+v %v", k, len(extra), ev2, err)
						}
					}
					// Every cut is refused.
					for cut := 0; cut < len(b); cut++ {
						if ev, err := decodeEvent(b[:cut]); err == nil {
							t.Fatalf("%v %v cut at %d of %d decoded: %+v", k, a, cut, len(b), ev)
						}
					}
				}
			}
		}
	}
	good := eventBody(EventReleased, "k", Holder{Token: 1, Hold: HoldSession, Source: "s"})
	for name, mend := range map[string]func(b []byte){
		"hold 3":                       func(b []byte) { b[9] = 3 },
		"access 3":                     func(b []byte) { b[10] = 3 },
		"slots on an exclusive":        func(b []byte) { b[11] = 1 },
		"slots on a shared":            func(b []byte) { b[10], b[11] = 1, 1 },
		"a semaphore of 0":             func(b []byte) { b[10] = 2 },
		"an empty key":                 func(b []byte) { b[15] = 0 },
		"a key of 128":                 func(b []byte) { b[15] = 128 },
		"a key past the end":           func(b []byte) { b[15] = 5 },
		"a source of 128 past the end": func(b []byte) { b[17] = 128 },
		"a source past the end":        func(b []byte) { b[17] = 2 },
	} {
		b := append([]byte{}, good...)
		mend(b)
		if ev, err := decodeEvent(b); err == nil || errors.Is(err, errUnknownEvent) {
			t.Errorf("%s decoded (or skipped as an unknown kind): %+v %v", name, ev, err)
		}
	}
	// A kind this client does not know (a later server's) is told apart:
	// the caller skips it, whatever its body (election_test.go).
	for _, kind := range []byte{7, 200, 255} {
		for _, b := range [][]byte{append([]byte{kind}, good[1:]...), {kind}, append([]byte{kind}, 1, 2, 3)} {
			if ev, err := decodeEvent(b); !errors.Is(err, errUnknownEvent) {
				t.Errorf("kind %d, %d bytes: %+v %v", kind, len(b), ev, err)
			}
		}
	}
	if _, _, _, err := decodeHeader(unhex(t, "83 05000000 1200")); err != nil {
		t.Fatalf("an Event header: %v", err)
	}
	if _, _, _, err := decodeHeader(unhex(t, "84 05000000 1200")); err == nil {
		t.Fatal("kind 0x84 decoded")
	}
}

func TestEventKindNamesAndWatchErrors(t *testing.T) {
	names := []string{"holder", "granted", "released", "expired", "reset", "session_ended", "proclaimed"}
	for i, n := range names {
		if got := EventKind(i).String(); got != n {
			t.Errorf("EventKind(%d) = %q, want %q", i, got, n)
		}
		if EventKind(i).EndsHold() != (i >= 2 && i <= 5) {
			t.Errorf("EventKind(%d).EndsHold", i)
		}
	}
	if EventKind(7).String() != "event(7)" || EventKind(7).EndsHold() {
		t.Error(EventKind(7).String())
	}
	var wu error = &WatchUnsupportedError{Addr: "127.0.0.1:1", Key: "k"}
	if !errors.Is(wu, ErrWatchUnsupported) || !strings.Contains(wu.Error(), "nothing was sent") {
		t.Fatal(wu)
	}
	var we error = &WatchEndedError{Key: "k", Cause: &endedError{errors.New("x")}}
	if !errors.Is(we, ErrWatchEnded) || !errors.Is(we, ErrSessionEnded) || errors.Is(we, ErrWatchClosed) {
		t.Fatal(we)
	}
	we = &WatchEndedError{Key: "k", Resumed: true}
	if !errors.Is(we, ErrWatchEnded) || errors.Is(we, ErrSessionEnded) || !strings.Contains(we.Error(), "watch again") {
		t.Fatal(we)
	}
	body := unhex(t, "00 01 10270000 0a000000 005c2605 0700000000000000 64000000 64000000 0100 06")
	if w, err := decodeWelcome(body); err != nil || w.flags&flagWatches == 0 || w.flags&flagModes == 0 {
		t.Fatalf("flags 6: %+v %v", w, err)
	}
}

// fakeEvent pushes an Event under rid.
func (fc *fakeConn) event(rid uint32, kind EventKind, key string, h Holder) {
	body := eventBody(kind, key, h)
	b := make([]byte, headerLen, headerLen+len(body))
	b[0] = kindEvent
	binary.LittleEndian.PutUint32(b[1:5], rid)
	binary.LittleEndian.PutUint16(b[5:7], uint16(len(body)))
	_, _ = fc.c.Write(append(b, body...))
}

// watchServer opens a session with flags (-1: a 32-byte welcome); a Watch
// of "busy" is answered limit_reached; any other Watch lists two holders
// (tokens 7 and 8, shared) then ok, then pushes n granted Events (tokens
// 100...) at once, before anything else is read; an Unwatch is answered
// ok; anything else ok.
func watchServer(flags int, n int) func(*script, *fakeConn) {
	return func(sc *script, fc *fakeConn) {
		_, rid, _, ok := sc.read(fc)
		if !ok {
			return
		}
		fc.welcomeFlags(rid, 10000, flags)
		for {
			op, rid, body, ok := sc.read(fc)
			if !ok {
				return
			}
			switch {
			case op == opWatch && string(body[1:]) == "busy":
				fc.reply(rid, StatusLimit)
			case op == opWatch:
				key := string(body[1:])
				fc.event(rid, EventHolder, key, Holder{Token: 7, Hold: HoldSession, Access: Shared, Source: "a"})
				fc.event(rid, EventHolder, key, Holder{Token: 8, Hold: HoldLease, Access: Shared, Source: "b"})
				fc.reply(rid, StatusOK)
				for i := 0; i < n; i++ {
					fc.event(rid, EventGranted, key, Holder{Token: uint64(100 + i), Hold: HoldSession, Source: "c"})
				}
			default:
				fc.reply(rid, StatusOK)
			}
		}
	}
}

func TestWatchFakeWithoutTheFlagNothingIsSent(t *testing.T) {
	// flags 0, modes and resumable only, none (a 32-byte welcome).
	for _, flags := range []int{0, flagModes | flagResumable, -1} {
		sc := newScript(watchServer(flags, 0))
		f := startFake(t, sc.handle)
		s, err := Dial(tctx(t), []string{f.addr()})
		if err != nil {
			t.Fatal(err)
		}
		if s.Watches() {
			t.Fatalf("flags %d: Watches() true", flags)
		}
		w, err := s.Watch(tctx(t), "doc")
		var wu *WatchUnsupportedError
		if w != nil || !errors.Is(err, ErrWatchUnsupported) || !errors.As(err, &wu) || wu.Key != "doc" || wu.Addr != f.addr() {
			t.Fatalf("flags %d: %v, %v", flags, w, err)
		}
		// The session goes on; nothing but the Ping was sent.
		if err := s.Ping(tctx(t)); err != nil {
			t.Fatal(err)
		}
		sc.mu.Lock()
		for _, fr := range sc.frames {
			if fr.op == opWatch || fr.op == opUnwatch {
				t.Errorf("flags %d: op %d sent", flags, fr.op)
			}
		}
		sc.mu.Unlock()
		s.Close()
	}
}

func TestWatchFakeHoldersEventsAndAReaderThatDoesNotRead(t *testing.T) {
	const n = 2000 // far more than any channel buffer: queued, not blocking
	sc := newScript(watchServer(flagWatches, n))
	f := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Watches() {
		t.Fatal("Watches() false")
	}
	if _, err := s.Watch(tctx(t), ""); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("an empty key: %v", err)
	}
	if _, err := s.Watch(tctx(t), "busy"); !errors.Is(err, ErrLimit) {
		t.Fatalf("limit_reached: %v", err)
	}
	w, err := s.Watch(tctx(t), "doc")
	if err != nil {
		t.Fatal(err)
	}
	want := []Holder{{7, HoldSession, Shared, "a"}, {8, HoldLease, Shared, "b"}}
	if got := w.Holders(); !reflect.DeepEqual(got, want) || w.Key() != "doc" {
		t.Fatalf("holders %+v", got)
	}
	// Nobody reads the events yet: the session's other traffic goes on.
	for i := 0; i < 5; i++ {
		if err := s.Ping(tctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	if w.Err() != nil {
		t.Fatal(w.Err())
	}
	for i := 0; i < n; i++ {
		select {
		case ev := <-w.Events():
			if ev.Kind != EventGranted || ev.Token != uint64(100+i) || ev.Key != "doc" || ev.Source != "c" {
				t.Fatalf("event %d: %+v", i, ev)
			}
		case <-time.After(waitBound):
			t.Fatalf("event %d never came", i)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-w.Events(); ok {
		t.Fatal("an event after Close")
	}
	if !errors.Is(w.Err(), ErrWatchClosed) {
		t.Fatalf("Err after Close: %v", w.Err())
	}
	// Unwatch named the Watch's rid and key.
	sc.mu.Lock()
	var watchRid uint32
	var unwatch []byte
	for _, fr := range sc.frames {
		if fr.op == opWatch && string(fr.body[1:]) == "doc" {
			watchRid = fr.rid
		}
		if fr.op == opUnwatch {
			unwatch = fr.body
		}
	}
	sc.mu.Unlock()
	if want := append(putU32(nil, watchRid), 3, 'd', 'o', 'c'); !bytes.Equal(unwatch, want) {
		t.Fatalf("unwatch body % x, want % x", unwatch, want)
	}
	if err := w.Close(); err != nil {
		t.Fatal("a second Close:", err)
	}
}

func TestWatchFakeASessionEndEndsTheWatchAfterItsEvents(t *testing.T) {
	sc := newScript(watchServer(flagWatches, 3))
	f := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(tctx(t), "doc")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(tctx(t)); err != nil { // the 3 events were read before its answer
		t.Fatal(err)
	}
	sc.kill(t, 0)
	waitClosed(t, s.Done(), "the session's end")
	var got []uint64
	for ev := range w.Events() {
		got = append(got, ev.Token)
	}
	if !reflect.DeepEqual(got, []uint64{100, 101, 102}) {
		t.Fatalf("events before the end: %v", got)
	}
	var we *WatchEndedError
	if !errors.Is(w.Err(), ErrWatchEnded) || !errors.Is(w.Err(), ErrSessionEnded) || !errors.As(w.Err(), &we) || we.Key != "doc" || we.Resumed {
		t.Fatalf("Err: %v", w.Err())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// A resumable session resumed on a new connection: the watch ends (not
// carried over a Resume), the session goes on, and a new Watch re-reads.
func TestWatchFakeAResumeEndsTheWatch(t *testing.T) {
	first := func(sc *script, fc *fakeConn) {
		watchServer(flagWatches|flagResumable, 1)(sc, fc)
	}
	second := func(sc *script, fc *fakeConn) {
		op, rid, _, ok := sc.read(fc)
		if !ok || op != opResume {
			return
		}
		fc.welcomeFlags(rid, 10000, flagWatches|flagResumable)
		for {
			op, rid, body, ok := sc.read(fc)
			if !ok {
				return
			}
			if op == opWatch {
				fc.event(rid, EventHolder, string(body[1:]), Holder{Token: 9, Hold: HoldPersistent, Source: "z"})
			}
			fc.reply(rid, StatusOK)
		}
	}
	sc := newScript(first, second)
	f := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, err := s.Watch(tctx(t), "doc")
	if err != nil {
		t.Fatal(err)
	}
	// Read before the kill: a reset connection may drop what is unread.
	if ev := nextEvent(t, w); ev.Token != 100 || ev.Kind != EventGranted {
		t.Fatalf("the event before the failure: %+v", ev)
	}
	sc.kill(t, 0)
	if ev, ok := <-w.Events(); ok {
		t.Fatalf("an event after the resume: %+v", ev)
	}
	var we *WatchEndedError
	if !errors.As(w.Err(), &we) || !we.Resumed || errors.Is(w.Err(), ErrSessionEnded) || !strings.Contains(w.Err().Error(), "not replayed") {
		t.Fatalf("Err: %v", w.Err())
	}
	if s.Err() != nil || s.Resumes() != 1 {
		t.Fatalf("session: %v, %d resumes", s.Err(), s.Resumes())
	}
	// Close of a watch that ended sends nothing.
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w2, err := s.Watch(tctx(t), "doc")
	if err != nil {
		t.Fatal(err)
	}
	if h := w2.Holders(); len(h) != 1 || h[0].Token != 9 {
		t.Fatalf("re-read holders %+v", h)
	}
	if got := sc.sentOps(1); !reflect.DeepEqual(got, []byte{opResume, opWatch}) {
		t.Fatalf("on the new connection: %v", got)
	}
}

// sentOps is what connection n sent, Pings left out.
func (sc *script) sentOps(n int) []byte {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var out []byte
	for _, f := range sc.frames {
		if f.conn == n && f.op != opPing {
			out = append(out, f.op)
		}
	}
	return out
}

// Against the real ringlockd.

// nextEvent is the next event of w, within waitBound.
func nextEvent(t *testing.T, w *Watch) WatchEvent {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if !ok {
			t.Fatalf("watch of %q ended: %v", w.Key(), w.Err())
		}
		return ev
	case <-time.After(waitBound):
		t.Fatalf("no event on %q within %v", w.Key(), waitBound)
	}
	return WatchEvent{}
}

// evs is "kind token" for the events, to compare as one line.
func expectEvents(t *testing.T, w *Watch, want ...string) {
	t.Helper()
	var got []string
	for range want {
		ev := nextEvent(t, w)
		got = append(got, fmt.Sprintf("%s %d", ev.Kind, ev.Token))
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// noEvent checks that nothing is queued: a Ping round trip on the watcher's
// session comes after any Event the server sent before answering it.
func noEvent(t *testing.T, s *Session, w *Watch) {
	t.Helper()
	if err := s.Ping(tctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case ev, ok := <-w.Events():
		t.Fatalf("unexpected event %+v (%v)", ev, ok)
	case <-time.After(20 * time.Millisecond):
	}
}

func watchReal(t *testing.T, threads string) {
	t.Setenv("RINGLOCK_TEST_THREADS", threads)
	srv := modesServerStart(t)
	dial := func(src string) *Session {
		s, err := Dial(tctx(t), []string{srv.Lock}, WithSource(src))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	ws, a, b := dial("watcher"), dial("a"), dial("b")
	if !ws.Watches() {
		t.Fatal("ringlockd does not offer watches")
	}
	if fmt.Sprint(ws.Shards()) != threads {
		t.Fatalf("%d shards", ws.Shards())
	}
	// Several keys, so that with 2 shards both shards' keys are watched.
	for i := 0; i < 4; i++ {
		k := fmt.Sprintf("watch/%s/%d", threads, i)
		la, err := a.Acquire(tctx(t), k, WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		w, err := ws.Watch(tctx(t), k)
		if err != nil {
			t.Fatal(err)
		}
		if got := w.Holders(); len(got) != 1 || got[0] != (Holder{la.Token(), HoldLease, Exclusive, "a"}) {
			t.Fatalf("%s: holders %+v (token %d)", k, got, la.Token())
		}
		// b queues: nothing changes for the watcher.
		bch := acquireBg(func() (*Lease, error) { return b.Acquire(tctx(t), k) })
		if err := srv.WaitMetric("ringlock_queued_waiters", 1); err != nil {
			t.Fatal(err)
		}
		noEvent(t, ws, w)
		// a releases: released, then b's grant, in that order.
		if err := la.Release(tctx(t)); err != nil {
			t.Fatal(err)
		}
		lb := waitGranted(t, "b", bch)
		ev := nextEvent(t, w)
		if ev.Kind != EventReleased || ev.Token != la.Token() || ev.Hold != HoldLease || ev.Source != "a" || ev.Key != k {
			t.Fatalf("%s: %+v", k, ev)
		}
		ev = nextEvent(t, w)
		if ev.Kind != EventGranted || ev.Token != lb.Token() || ev.Hold != HoldSession || ev.Access != Exclusive || ev.Source != "b" {
			t.Fatalf("%s: %+v", k, ev)
		}
		// An operator reset of b's hold.
		if err := srv.Reset(k); err != nil {
			t.Fatal(err)
		}
		expectEvents(t, w, fmt.Sprintf("reset %d", lb.Token()))
		// b takes it again, then its session ends: session_ended.
		if i == 3 {
			lb2, err := b.TryLock(tctx(t), k)
			if err != nil {
				t.Fatal(err)
			}
			b.Close()
			expectEvents(t, w, fmt.Sprintf("granted %d", lb2.Token()), fmt.Sprintf("session_ended %d", lb2.Token()))
		}
		// A lease that runs out: expired.
		le, err := a.TryLock(tctx(t), k, WithTTL(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		expectEvents(t, w, fmt.Sprintf("granted %d", le.Token()), fmt.Sprintf("expired %d", le.Token()))
		// Close: Unwatch answered, nothing more, the channel closed.
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		lx, err := a.TryLock(tctx(t), k)
		if err != nil {
			t.Fatal(err)
		}
		for ev := range w.Events() {
			t.Fatalf("%s: an event after Close: %+v", k, ev)
		}
		if !errors.Is(w.Err(), ErrWatchClosed) {
			t.Fatalf("Err after Close: %v", w.Err())
		}
		_ = lx.Release(tctx(t))
	}
}

func TestWatchRealServerHoldersThenEveryChangeInOrder(t *testing.T) {
	watchReal(t, testserver.Threads())
}

func TestWatchRealServerHoldersThenEveryChangeInOrderOnTwoShards(t *testing.T) {
	watchReal(t, "2")
}

func TestWatchRealServerSharedHoldersAndAWatchEndsWithItsSession(t *testing.T) {
	srv := modesServerStart(t)
	ws, r1, r2 := dialReal(t, srv), dialReal(t, srv), dialReal(t, srv)
	const k = "watch/doc"
	l1, err := r1.LockShared(tctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := r2.LockShared(tctx(t), k, Persistent())
	if err != nil {
		t.Fatal(err)
	}
	w, err := ws.Watch(tctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	// The same key watched twice: each watch its own events.
	w2, err := ws.Watch(tctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	for _, ww := range []*Watch{w, w2} {
		got := ww.Holders()
		if len(got) != 2 {
			t.Fatalf("holders %+v", got)
		}
		tokens := map[uint64]Holder{got[0].Token: got[0], got[1].Token: got[1]}
		if h := tokens[l1.Token()]; h.Access != Shared || h.Hold != HoldSession {
			t.Fatalf("holders %+v", got)
		}
		if h := tokens[l2.Token()]; h.Access != Shared || h.Hold != HoldPersistent {
			t.Fatalf("holders %+v", got)
		}
	}
	if err := l1.Release(tctx(t)); err != nil {
		t.Fatal(err)
	}
	p, err := r1.TryPermit(tctx(t), "watch/pool", 3)
	if err != nil {
		t.Fatal(err)
	}
	wp, err := ws.Watch(tctx(t), "watch/pool")
	if err != nil {
		t.Fatal(err)
	}
	if h := wp.Holders(); len(h) != 1 || h[0].Access != Semaphore(3) || h[0].Token != p.Token() {
		t.Fatalf("pool holders %+v", h)
	}
	expectEvents(t, w, fmt.Sprintf("released %d", l1.Token()))
	expectEvents(t, w2, fmt.Sprintf("released %d", l1.Token()))
	// One Close leaves the other watch of the key alive.
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(tctx(t)); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, w, fmt.Sprintf("released %d", l2.Token()))
	// The watcher's session ends: every watch ends, the channel closes.
	ws.Close()
	for _, ww := range []*Watch{w, wp} {
		for ev := range ww.Events() {
			t.Fatalf("an event after the session's end: %+v", ev)
		}
		if !errors.Is(ww.Err(), ErrWatchEnded) || !errors.Is(ww.Err(), ErrSessionEnded) {
			t.Fatalf("Err: %v", ww.Err())
		}
		if err := ww.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ws.Watch(tctx(t), k); !errors.Is(err, ErrSessionEnded) {
		t.Fatalf("a Watch on an ended session: %v", err)
	}
}
