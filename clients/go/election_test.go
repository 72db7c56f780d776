package ringlock

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ringlock/ringlock/clients/go/internal/testserver"
)

// Elections (docs/protocol.md, "Elections: campaign, proclaim, resign,
// observe"): the Proclaim codec and the proclaimed Event; an Event of a
// kind this client does not know skipped; against a scripted fake server,
// the proclaim flag checked before anything is sent, a campaign's value
// as its Acquire's source, and a Proclaim in flight settled by a resume;
// and against the real ringlockd on $RINGLOCK_TEST_THREADS shards and on
// 2: candidates elected in campaign order, observers told of each leader
// and each proclaim (same token), resign and a closed leader session
// handing over, proclaim after a resign or a reset refused as leadership
// lost, bad names and values refused.

// proclaimBody is the test's decoder of a Proclaim body, as the server
// reads it (src/protocol/session.rs): [u64 token][u8 keyLen][key][u8
// srcLen][src], nothing after.
func proclaimBody(b []byte) (token uint64, key, src string, ok bool) {
	if len(b) < 10 {
		return 0, "", "", false
	}
	token = binary.LittleEndian.Uint64(b[0:8])
	n := int(b[8])
	if 9+n >= len(b) {
		return 0, "", "", false
	}
	key = string(b[9 : 9+n])
	m := int(b[9+n])
	if len(b) != 10+n+m {
		return 0, "", "", false
	}
	return token, key, string(b[10+n:]), true
}

func TestEncodeProclaimRoundTrips(t *testing.T) {
	for _, token := range []uint64{1, 1 << 40, 1<<64 - 1} {
		for _, key := range []string{"e", strings.Repeat("k", MaxKeyLen)} {
			for _, src := range []string{"", "v", "10.0.0.7:9000", strings.Repeat("s", MaxValueLen)} {
				f := encodeProclaim(0xA1B2C3D4, token, key, src)
				if f[0] != opProclaim || binary.LittleEndian.Uint32(f[1:5]) != 0xA1B2C3D4 {
					t.Fatalf("header % x", f[:7])
				}
				n := int(binary.LittleEndian.Uint16(f[5:7]))
				if n != len(f)-headerLen || n != 10+len(key)+len(src) || n > bodyMax {
					t.Fatalf("body length %d of a %d-byte frame", n, len(f))
				}
				gt, gk, gs, ok := proclaimBody(f[headerLen:])
				if !ok || gt != token || gk != key || gs != src {
					t.Fatalf("decoded %d %q %q %v, want %d %q %q", gt, gk, gs, ok, token, key, src)
				}
			}
		}
	}
}

func TestDecodeProclaimedEventAndFlag(t *testing.T) {
	h := Holder{Token: 42, Hold: HoldSession, Access: Exclusive, Source: "a:2"}
	ev, err := decodeEvent(eventBody(EventProclaimed, "elect", h))
	if err != nil || ev != (WatchEvent{Kind: EventProclaimed, Key: "elect", Holder: h}) {
		t.Fatalf("%+v %v", ev, err)
	}
	if ev.Kind.EndsHold() || ev.Kind.String() != "proclaimed" {
		t.Fatal(ev.Kind)
	}
	// flags 14: modes, watches, proclaim.
	body := unhex(t, "00 01 10270000 0a000000 005c2605 0700000000000000 64000000 64000000 0100 0e")
	if w, err := decodeWelcome(body); err != nil || w.flags&flagProclaim == 0 || w.flags&flagWatches == 0 {
		t.Fatalf("flags 14: %+v %v", w, err)
	}
	var pu error = &ProclaimUnsupportedError{Addr: "127.0.0.1:1", Key: "e"}
	if !errors.Is(pu, ErrProclaimUnsupported) || errors.Is(pu, ErrWatchUnsupported) || !strings.Contains(pu.Error(), "nothing was sent") {
		t.Fatal(pu)
	}
}

// rawEvent pushes an Event frame with any body under rid.
func (fc *fakeConn) rawEvent(rid uint32, body []byte) {
	b := make([]byte, headerLen, headerLen+len(body))
	b[0] = kindEvent
	binary.LittleEndian.PutUint32(b[1:5], rid)
	binary.LittleEndian.PutUint16(b[5:7], uint16(len(body)))
	_, _ = fc.c.Write(append(b, body...))
}

// An Event of a kind this client does not know is skipped, before the
// Watch's Reply and after it: the session and the watch go on, and the
// next Event is delivered.
func TestAnEventOfAnUnknownKindIsSkipped(t *testing.T) {
	h := Holder{Token: 5, Hold: HoldSession, Source: "a"}
	sc := newScript(func(sc *script, fc *fakeConn) {
		_, rid, _, ok := sc.read(fc)
		if !ok {
			return
		}
		fc.welcomeFlags(rid, 10000, flagWatches|flagProclaim)
		for {
			op, rid, body, ok := sc.read(fc)
			if !ok {
				return
			}
			if op != opWatch {
				fc.reply(rid, StatusOK)
				continue
			}
			key := string(body[1:])
			fc.rawEvent(rid, append([]byte{9}, bytes.Repeat([]byte{0xee}, 30)...)) // another layout
			fc.event(rid, EventHolder, key, h)
			fc.reply(rid, StatusOK)
			fc.rawEvent(rid, []byte{200})       // a kind and nothing else
			fc.rawEvent(7777, []byte{42, 1, 2}) // under a rid that is no watch
			fc.event(rid, EventProclaimed, key, Holder{Token: 5, Hold: HoldSession, Source: "a:2"})
			fc.rawEvent(rid, append([]byte{255}, eventBody(EventGranted, key, h)[1:]...))
			fc.event(rid, EventReleased, key, Holder{Token: 5, Hold: HoldSession, Source: "a:2"})
		}
	})
	f := startFake(t, sc.handle)
	s, err := Dial(tctx(t), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, err := s.Watch(tctx(t), "e")
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Holders(); !reflect.DeepEqual(got, []Holder{h}) {
		t.Fatalf("holders %+v", got)
	}
	expectEvents(t, w, "proclaimed 5", "released 5")
	if err := s.Ping(tctx(t)); err != nil || s.Err() != nil {
		t.Fatalf("the session after unknown events: %v %v", err, s.Err())
	}
}

// acquireSource is an Acquire body's source.
func acquireSource(b []byte) string {
	n := int(b[9])
	return string(b[11+n : 11+n+int(b[10+n])])
}

// electionServer opens the session with flags (-1: a 32-byte welcome),
// then grants every Acquire (tokens 100, 101, ...), answers a Proclaim ok
// with its token (unanswered when silent is set), anything else ok.
func electionServer(flags int, silent bool) func(*script, *fakeConn) {
	return func(sc *script, fc *fakeConn) {
		op, rid, _, ok := sc.read(fc)
		if !ok || op != opHello {
			return
		}
		fc.welcomeFlags(rid, 10000, flags)
		next := uint64(100)
		for {
			op, rid, body, ok := sc.read(fc)
			if !ok {
				return
			}
			switch op {
			case opAcquire:
				fc.grant(rid, next, noTTL)
				next++
			case opProclaim:
				if !silent {
					fc.grant(rid, binary.LittleEndian.Uint64(body[0:8]), noTTL)
				}
			default:
				fc.reply(rid, StatusOK)
			}
		}
	}
}

// proclaimsSent is every Proclaim body connection n sent.
func (sc *script) proclaimsSent(n int) [][]byte {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var out [][]byte
	for _, f := range sc.frames {
		if f.conn == n && f.op == opProclaim {
			out = append(out, f.body)
		}
	}
	return out
}

// A campaign's value is its Acquire's source (the session's is kept for
// every other Acquire); Proclaim is sent only to a server whose welcome
// has the proclaim flag.
func TestElectionFakeTheValueIsTheSourceAndProclaimNeedsTheFlag(t *testing.T) {
	for _, flags := range []int{flagWatches | flagModes | flagProclaim, flagWatches | flagModes, 0, -1} {
		sc := newScript(electionServer(flags, false))
		f := startFake(t, sc.handle)
		s, err := Dial(tctx(t), []string{f.addr()}, WithSource("session-src"))
		if err != nil {
			t.Fatal(err)
		}
		offers := flags > 0 && flags&flagProclaim != 0
		if s.Proclaims() != offers {
			t.Fatalf("flags %d: Proclaims() %v", flags, s.Proclaims())
		}
		e := s.Election("e")
		l, err := e.Campaign(tctx(t), "10.0.0.7:9000")
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() != 100 || l.Value() != "10.0.0.7:9000" || l.Election() != e || e.Name() != "e" || l.Lease().Mode() != HoldSession || l.Lease().Access() != Exclusive {
			t.Fatalf("leadership %d %q", l.Token(), l.Value())
		}
		other, err := s.Acquire(tctx(t), "plain")
		if err != nil {
			t.Fatal(err)
		}
		sc.mu.Lock()
		var sources []string
		for _, fr := range sc.frames {
			if fr.op == opAcquire {
				if fr.body[0] != byte(HoldSession) || binary.LittleEndian.Uint32(fr.body[5:9]) != waitForever {
					t.Errorf("acquire hold %d wait %x", fr.body[0], fr.body[5:9])
				}
				sources = append(sources, acquireSource(fr.body))
			}
		}
		sc.mu.Unlock()
		if !reflect.DeepEqual(sources, []string{"10.0.0.7:9000", "session-src"}) {
			t.Fatalf("sources %q", sources)
		}
		err = l.Proclaim(tctx(t), "10.0.0.8:9000")
		var pu *ProclaimUnsupportedError
		if offers {
			if err != nil || l.Value() != "10.0.0.8:9000" {
				t.Fatalf("proclaim: %v, value %q", err, l.Value())
			}
			want := encodeProclaim(0, 100, "e", "10.0.0.8:9000")[headerLen:]
			if got := sc.proclaimsSent(0); len(got) != 1 || !bytes.Equal(got[0], want) {
				t.Fatalf("proclaim bodies % x, want % x", got, want)
			}
		} else {
			if !errors.Is(err, ErrProclaimUnsupported) || !errors.As(err, &pu) || pu.Key != "e" || pu.Addr != f.addr() {
				t.Fatalf("flags %d: %v", flags, err)
			}
			if l.Value() != "10.0.0.7:9000" || l.Err() != nil {
				t.Fatalf("after a refused proclaim: %q %v", l.Value(), l.Err())
			}
			if err := s.Ping(tctx(t)); err != nil {
				t.Fatal(err)
			}
			if got := sc.proclaimsSent(0); len(got) != 0 {
				t.Fatalf("flags %d: a Proclaim was sent", flags)
			}
		}
		_ = other.Release(tctx(t))
		s.Close()
	}
}

// electionResumer answers a Resume with held and a welcome of flags, then
// answers a Proclaim ok with its token, anything else ok.
func electionResumer(held []heldSpec, flags int) func(*script, *fakeConn) {
	return func(sc *script, fc *fakeConn) {
		op, rid, _, ok := sc.read(fc)
		if !ok || op != opResume {
			return
		}
		for _, h := range held {
			fc.held(rid, h.key, h.token, h.mode, h.ttl)
		}
		fc.welcomeFlags(rid, 10000, flags)
		for {
			op, rid, body, ok := sc.read(fc)
			if !ok {
				return
			}
			if op == opProclaim {
				fc.grant(rid, binary.LittleEndian.Uint64(body[0:8]), noTTL)
			} else {
				fc.reply(rid, StatusOK)
			}
		}
	}
}

// A Proclaim in flight when a replicated session's connection fails: sent
// again if the resumed session still lists the hold, the leadership lost
// if it does not, refused as unsupported if the new server lacks proclaim.
func TestElectionFakeAProclaimInFlightIsSettledByAResume(t *testing.T) {
	full := flagResumable | flagWatches | flagProclaim
	cases := []struct {
		name  string
		held  []heldSpec
		flags int
		check func(t *testing.T, err error, l *Leadership, sc *script)
	}{
		{"listed: sent again", []heldSpec{{"e", 100, HoldSession, noTTL}}, full, func(t *testing.T, err error, l *Leadership, sc *script) {
			if err != nil || l.Value() != "v2" || l.Err() != nil {
				t.Fatalf("%v, value %q, %v", err, l.Value(), l.Err())
			}
			if got := sc.proclaimsSent(1); len(got) != 1 {
				t.Fatalf("%d Proclaims on the new connection", len(got))
			}
		}},
		{"not listed: lost", nil, full, func(t *testing.T, err error, l *Leadership, sc *script) {
			if !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "leadership lost") || l.Value() != "v1" {
				t.Fatalf("%v, value %q", err, l.Value())
			}
			waitClosed(t, l.Lost(), "the leadership's loss")
		}},
		{"a server without proclaim", []heldSpec{{"e", 100, HoldSession, noTTL}}, flagResumable | flagWatches, func(t *testing.T, err error, l *Leadership, sc *script) {
			if !errors.Is(err, ErrProclaimUnsupported) || l.Value() != "v1" || l.Err() != nil {
				t.Fatalf("%v, value %q, %v", err, l.Value(), l.Err())
			}
			if got := sc.proclaimsSent(1); len(got) != 0 {
				t.Fatal("a Proclaim sent to a server without it")
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sc := newScript(electionServer(full, true), electionResumer(c.held, c.flags))
			f := startFake(t, sc.handle)
			s, err := Dial(tctx(t), []string{f.addr()})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			l, err := s.Election("e").Campaign(tctx(t), "v1")
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- l.Proclaim(tctx(t), "v2") }()
			sc.waitFor(t, "the Proclaim", func() bool { return sc.count(0, opProclaim) == 1 })
			sc.kill(t, 0)
			select {
			case err = <-done:
			case <-time.After(waitBound):
				t.Fatal("the Proclaim was never settled")
			}
			if s.Resumes() != 1 {
				t.Fatalf("%d resumes", s.Resumes())
			}
			c.check(t, err, l, sc)
		})
	}
}

// Against the real ringlockd.

// nextLeader is o's next change, within waitBound; an ended observation
// fails.
func nextLeader(t *testing.T, o *Observer) *Leader {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	l, err := o.Next(ctx)
	if err != nil {
		t.Fatalf("no change of the leader: %v", err)
	}
	if !reflect.DeepEqual(l, o.Leader()) {
		t.Fatalf("Next %v, Leader() %v", l, o.Leader())
	}
	return l
}

func leaderStr(l *Leader) string {
	if l == nil {
		return "nobody"
	}
	return fmt.Sprintf("%d %s", l.Token, l.Value)
}

type campaignResult struct {
	l   *Leadership
	err error
}

func campaignBg(s *Session, name, value string) chan campaignResult {
	ch := make(chan campaignResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		l, err := s.Election(name).Campaign(ctx, value)
		ch <- campaignResult{l, err}
	}()
	return ch
}

func elected(t *testing.T, who string, ch chan campaignResult) *Leadership {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s's campaign: %v", who, r.err)
		}
		return r.l
	case <-time.After(waitBound):
		t.Fatalf("%s not elected within %v", who, waitBound)
	}
	return nil
}

func electionReal(t *testing.T, threads string) {
	t.Setenv("RINGLOCK_TEST_THREADS", threads)
	srv := modesServerStart(t)
	obs, a, c := dialReal(t, srv), dialReal(t, srv), dialReal(t, srv)
	if !a.Proclaims() || !a.Watches() {
		t.Fatal("ringlockd does not offer proclaim and watches")
	}
	if fmt.Sprint(a.Shards()) != threads {
		t.Fatalf("%d shards", a.Shards())
	}
	// Several names, so that with 2 shards both shards' keys are used.
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("elect/%s/%d", threads, i)
		b := dialReal(t, srv) // its session is closed below
		o, err := obs.Election(name).Observe(tctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if o.Leader() != nil {
			t.Fatalf("%s: a leader before any campaign: %v", name, o.Leader())
		}
		la, err := a.Election(name).Campaign(tctx(t), "a:1")
		if err != nil {
			t.Fatal(err)
		}
		first := nextLeader(t, o)
		if leaderStr(first) != fmt.Sprintf("%d a:1", la.Token()) {
			t.Fatalf("%s: observed %s, a leads with %d", name, leaderStr(first), la.Token())
		}
		if l, err := c.Election(name).Leader(tctx(t)); err != nil || !reflect.DeepEqual(l, first) {
			t.Fatalf("%s: Leader() %v %v", name, l, err)
		}
		// b, then c campaign; each confirmed queued before the next.
		bch := campaignBg(b, name, "b:1")
		if err := srv.WaitMetric("ringlock_queued_waiters", 1); err != nil {
			t.Fatal(err)
		}
		cch := campaignBg(c, name, "c:1")
		if err := srv.WaitMetric("ringlock_queued_waiters", 2); err != nil {
			t.Fatal(err)
		}
		// a proclaims: the same token, the new value, observers told;
		// nobody is elected.
		if err := la.Proclaim(tctx(t), "a:2"); err != nil {
			t.Fatal(err)
		}
		if la.Value() != "a:2" || la.Token() != first.Token {
			t.Fatalf("%s: after the proclaim %d %q", name, la.Token(), la.Value())
		}
		if got := leaderStr(nextLeader(t, o)); got != fmt.Sprintf("%d a:2", first.Token) {
			t.Fatalf("%s: after the proclaim observed %s", name, got)
		}
		held, err := srv.Keyx()
		if err != nil {
			t.Fatal(err)
		}
		if h := held[name]; h.Source != "a:2" || h.Token != first.Token {
			t.Fatalf("%s: KEYX lists %q token %d", name, h.Source, h.Token)
		}
		if err := srv.WaitMetric("ringlock_queued_waiters", 2); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-bch:
			t.Fatalf("%s: b elected by a proclaim: %v", name, r.err)
		default:
		}
		// a resigns: b leads (it campaigned first), with a larger token.
		if err := la.Resign(tctx(t)); err != nil {
			t.Fatal(err)
		}
		if l := nextLeader(t, o); l != nil {
			t.Fatalf("%s: after the resign %s, want nobody", name, leaderStr(l))
		}
		second := nextLeader(t, o)
		lb := elected(t, "b", bch)
		if second == nil || second.Value != "b:1" || second.Token != lb.Token() || second.Token <= first.Token {
			t.Fatalf("%s: second leader %s, b's token %d, a's %d", name, leaderStr(second), lb.Token(), first.Token)
		}
		// A proclaim after the resign: the leadership is gone.
		err = la.Proclaim(tctx(t), "a:3")
		if !errors.Is(err, ErrLost) || !errors.Is(err, ErrStaleToken) || !strings.Contains(err.Error(), "leadership lost") {
			t.Fatalf("%s: a proclaim after the resign: %v", name, err)
		}
		// b's session ends without a resign: c leads at once.
		b.Close()
		if l := nextLeader(t, o); l != nil {
			t.Fatalf("%s: after b's session ended %s, want nobody", name, leaderStr(l))
		}
		third := nextLeader(t, o)
		lc := elected(t, "c", cch)
		if third == nil || third.Value != "c:1" || third.Token != lc.Token() || third.Token <= second.Token {
			t.Fatalf("%s: third leader %s, c's token %d", name, leaderStr(third), lc.Token())
		}
		waitClosed(t, lb.Lost(), "b's leadership lost with its session")
		if err := lb.Proclaim(tctx(t), "b:2"); !errors.Is(err, ErrLost) || !errors.Is(err, ErrSessionEnded) {
			t.Fatalf("%s: a proclaim of the ended session: %v", name, err)
		}
		if err := lc.Resign(tctx(t)); err != nil {
			t.Fatal(err)
		}
		if l := nextLeader(t, o); l != nil {
			t.Fatalf("%s: after c resigned %s", name, leaderStr(l))
		}
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
		if l, err := o.Next(tctx(t)); l != nil || !errors.Is(err, ErrWatchClosed) || !errors.Is(o.Err(), ErrWatchClosed) {
			t.Fatalf("%s: Next after Close: %v %v", name, l, err)
		}
	}
}

func TestElectionRealServerCampaignOrderProclaimAndHandover(t *testing.T) {
	electionReal(t, testserver.Threads())
}

func TestElectionRealServerCampaignOrderProclaimAndHandoverOnTwoShards(t *testing.T) {
	electionReal(t, "2")
}

func TestElectionRealServerResetBadValuesAndTheObserversEnd(t *testing.T) {
	srv := modesServerStart(t)
	a, obs, d := dialReal(t, srv), dialReal(t, srv), dialReal(t, srv)
	const name = "elect/reset"
	e := a.Election(name)
	for _, bad := range []string{"", strings.Repeat("v", MaxValueLen+1)} {
		if _, err := e.Campaign(tctx(t), bad); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("a value of %d bytes: %v", len(bad), err)
		}
	}
	for _, badName := range []string{"", strings.Repeat("n", MaxKeyLen+1)} {
		be := a.Election(badName)
		if _, err := be.Campaign(tctx(t), "v"); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("a name of %d bytes: %v", len(badName), err)
		}
		if _, err := be.Observe(tctx(t)); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("observe a name of %d bytes: %v", len(badName), err)
		}
		if _, err := be.Leader(tctx(t)); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("the leader of a name of %d bytes: %v", len(badName), err)
		}
	}
	l, err := e.Campaign(tctx(t), strings.Repeat("v", MaxValueLen))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", strings.Repeat("v", MaxValueLen+1)} {
		if err := l.Proclaim(tctx(t), bad); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("a proclaim of %d bytes: %v", len(bad), err)
		}
	}
	o, err := obs.Election(name).Observe(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := leaderStr(o.Leader()); got != fmt.Sprintf("%d %s", l.Token(), strings.Repeat("v", MaxValueLen)) {
		t.Fatalf("observed %s", got)
	}
	// A campaign withdrawn by its context elects nobody, ever.
	wait, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err = d.Election(name).Campaign(wait, "d")
	cancel()
	var ce *CancelError
	if !errors.As(err, &ce) || !errors.Is(err, context.DeadlineExceeded) || ce.Released != 0 {
		t.Fatalf("a withdrawn campaign: %v", err)
	}
	// An operator reset ends the leadership: Lost, observers told, and a
	// proclaim says the leadership is lost.
	if err := srv.Reset(name); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, l.Lost(), "the reset leadership's loss")
	if !errors.Is(l.Err(), ErrLost) {
		t.Fatal(l.Err())
	}
	if got := nextLeader(t, o); got != nil {
		t.Fatalf("after the reset %s", leaderStr(got))
	}
	err = l.Proclaim(tctx(t), "v2")
	var le *LostError
	if !errors.Is(err, ErrLost) || !errors.As(err, &le) || le.Key != name || !strings.Contains(err.Error(), "leadership lost") {
		t.Fatalf("a proclaim after the reset: %v", err)
	}
	if got, err := e.Leader(tctx(t)); got != nil || err != nil {
		t.Fatalf("the leader after the reset: %v %v", got, err)
	}
	if err := l.Resign(tctx(t)); !errors.Is(err, ErrLost) {
		t.Fatalf("a resign after the reset: %v", err)
	}
	// The observer's session ends: the observation ends with an error,
	// not silence.
	obs.Close()
	if got, err := o.Next(tctx(t)); got != nil || !errors.Is(err, ErrWatchEnded) || !errors.Is(err, ErrSessionEnded) {
		t.Fatalf("Next after the session's end: %v %v", got, err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
}
