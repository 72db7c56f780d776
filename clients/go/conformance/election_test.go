package conformance

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	ringlock "github.com/ringlock/ringlock/clients/go"
	"github.com/ringlock/ringlock/clients/go/internal/testserver"
)

// The election scenarios of docs/conformance.md: election_order,
// election_handover.

// leaderLine is "TOKEN VALUE" of a leader, "nobody" for none.
func leaderLine(l *ringlock.Leader) string {
	if l == nil {
		return "nobody"
	}
	return fmt.Sprintf("%d %s", l.Token, l.Value)
}

// nextLeader is the observer's next leader that is somebody, within 30 s;
// every change it saw on the way ("nobody" between leaders) is appended to
// seen.
func nextLeader(t *testing.T, o *ringlock.Observer, seen *[]string) *ringlock.Leader {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		l, err := o.Next(c)
		if err != nil {
			t.Fatalf("the observer saw no new leader: %v (so far %q)", err, *seen)
		}
		*seen = append(*seen, leaderLine(l))
		if l != nil {
			return l
		}
	}
}

type campaigned struct {
	l   *ringlock.Leadership
	err error
}

func campaignAsync(c context.Context, s *ringlock.Session, name, value string) chan campaigned {
	ch := make(chan campaigned, 1)
	go func() {
		l, err := s.Election(name).Campaign(c, value)
		ch <- campaigned{l, err}
	}()
	return ch
}

func elected(t *testing.T, who string, ch chan campaigned) *ringlock.Leadership {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s's campaign: %v", who, r.err)
		}
		return r.l
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not elected within 30 s", who)
	}
	return nil
}

// leadershipLost fails unless err says the leadership is lost.
func leadershipLost(t *testing.T, what string, err error) {
	t.Helper()
	var le *ringlock.LostError
	if !errors.Is(err, ringlock.ErrLost) || !errors.As(err, &le) {
		t.Fatalf("%s: %v, want the leadership lost", what, err)
	}
}

// electionOrder: candidates lead in the order they campaigned; a proclaim
// keeps the token and elects nobody; the observer sees every leader and
// value in order.
func electionOrder(t *testing.T, srv *testserver.Server) {
	name := key(t, "e")
	a, b, c, obs := dial(t, srv.Lock), dial(t, srv.Lock), dial(t, srv.Lock), dial(t, srv.Lock)
	if !a.Proclaims() {
		t.Fatal("ringlockd does not offer proclaim")
	}
	o, err := obs.Election(name).Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if o.Leader() != nil {
		t.Fatalf("a leader before any campaign: %s", leaderLine(o.Leader()))
	}
	var seen []string
	la, err := a.Election(name).Campaign(ctx(t), "A")
	if err != nil {
		t.Fatal(err)
	}
	bch := campaignAsync(ctx(t), b, name, "B")
	waitQueued(t, srv, 1)
	cch := campaignAsync(ctx(t), c, name, "C")
	waitQueued(t, srv, 2)
	if got := leaderLine(nextLeader(t, o, &seen)); got != fmt.Sprintf("%d A", la.Token()) {
		t.Fatalf("the observer saw %s, A leads with token %d", got, la.Token())
	}
	// A proclaims: its token with the new value; nobody else is elected.
	if err := la.Proclaim(ctx(t), "A2"); err != nil {
		t.Fatal(err)
	}
	if got := leaderLine(nextLeader(t, o, &seen)); got != fmt.Sprintf("%d A2", la.Token()) {
		t.Fatalf("after A's proclaim the observer saw %s", got)
	}
	waitQueued(t, srv, 2)
	select {
	case r := <-bch:
		t.Fatalf("B elected by A's proclaim (%v)", r.err)
	case r := <-cch:
		t.Fatalf("C elected by A's proclaim (%v)", r.err)
	default:
	}
	// A resigns: B leads; B resigns: C leads.
	if err := la.Resign(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lb := elected(t, "B", bch)
	if lb.Token() <= la.Token() || lb.Value() != "B" {
		t.Fatalf("B leads with token %d (A's was %d), value %q", lb.Token(), la.Token(), lb.Value())
	}
	nextLeader(t, o, &seen)
	if err := lb.Resign(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lc := elected(t, "C", cch)
	if lc.Token() <= lb.Token() {
		t.Fatalf("C leads with token %d, B's was %d", lc.Token(), lb.Token())
	}
	nextLeader(t, o, &seen)
	var leaders []string
	for _, s := range seen {
		if s != "nobody" {
			leaders = append(leaders, s)
		}
	}
	want := []string{fmt.Sprintf("%d A", la.Token()), fmt.Sprintf("%d A2", la.Token()),
		fmt.Sprintf("%d B", lb.Token()), fmt.Sprintf("%d C", lc.Token())}
	if !reflect.DeepEqual(leaders, want) {
		t.Fatalf("the observer saw %q, want %q (nobody between leaders allowed)", seen, want)
	}
	// A proclaim after A's resignation: the leadership is lost.
	leadershipLost(t, "A's proclaim after its resignation", la.Proclaim(ctx(t), "A3"))
	if err := lc.Resign(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
}

// electionHandover: a leader whose session ends without resigning is
// replaced at once by the next candidate, and the observer is told.
func electionHandover(t *testing.T, srv *testserver.Server) {
	name := key(t, "e")
	a, b, obs := dial(t, srv.Lock), dial(t, srv.Lock), dial(t, srv.Lock)
	o, err := obs.Election(name).Observe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	la, err := a.Election(name).Campaign(ctx(t), "A")
	if err != nil {
		t.Fatal(err)
	}
	if got := leaderLine(nextLeader(t, o, &seen)); got != fmt.Sprintf("%d A", la.Token()) {
		t.Fatalf("the observer saw %s, A leads with token %d", got, la.Token())
	}
	bch := campaignAsync(ctx(t), b, name, "B")
	waitQueued(t, srv, 1)
	// A's session ends without a resign (as when its process is killed:
	// the server sees the connection close).
	a.Close()
	lb := elected(t, "B", bch)
	if lb.Token() <= la.Token() {
		t.Fatalf("B leads with token %d, A's was %d", lb.Token(), la.Token())
	}
	if got := leaderLine(nextLeader(t, o, &seen)); got != fmt.Sprintf("%d B", lb.Token()) {
		t.Fatalf("after A's session ended the observer saw %s (all: %q)", got, seen)
	}
	leadershipLost(t, "a proclaim with A's old leadership", la.Proclaim(ctx(t), "A2"))
	if err := lb.Resign(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
}
