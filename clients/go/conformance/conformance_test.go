// Package conformance runs the client conformance scenarios shared by the
// Rust, Python and Go clients against the real ringlockd (started here on
// 127.0.0.1 with free ports; binary $RINGLOCKD, default target/debug/ringlockd
// of the repository; --threads $RINGLOCK_TEST_THREADS, default 1). Each
// scenario that passes prints `conformance go <name> ok`. Run it with
// clients/go/conformance.sh.
package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ringlock "github.com/ringlock/ringlock/clients/go"
	"github.com/ringlock/ringlock/clients/go/internal/testserver"
)

const queued = "ringlock_queued_waiters"

// childEnv makes the test binary a lock-holder child (keepalive_loss).
const childEnv = "RINGLOCK_GO_CONFORMANCE_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(holderChild())
	}
	os.Exit(m.Run())
}

type scenario struct {
	name string
	run  func(t *testing.T, srv *testserver.Server)
}

// The scenarios, in the order every client (Rust, Python, Go) runs them.
var scenarios = []scenario{
	{"grant", grant},
	{"fifo", fifo},
	{"try", try},
	{"timeout", timeout},
	{"cancel_race", cancelRace},
	{"lease_expiry_lost", leaseExpiryLost},
	{"session_end_on_close", sessionEndOnClose},
	{"keepalive_loss", keepaliveLoss},
	{"stale_token_release", staleTokenRelease},
	{"auth_refused", authRefused},
	{"server_restart_durable", serverRestartDurable},
	{"shards", shards},
	{"modes_fifo", modesFifo},
	{"modes_semaphore", modesSemaphore},
	{"watch_order", watchOrder},
	{"watch_rewatch", watchRewatch},
	{"election_order", electionOrder},
	{"election_handover", electionHandover},
}

func TestConformance(t *testing.T) {
	srv, err := testserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Kill9()
	for _, sc := range scenarios {
		sc := sc
		ran := false
		// t.Run also answers true for a scenario that -test.run filtered
		// out: only one that ran is reported ok.
		if t.Run(sc.name, func(t *testing.T) { ran = true; sc.run(t, srv) }) && ran {
			fmt.Printf("conformance go %s ok\n", sc.name)
		}
	}
}

// ctx bounds every scenario: a hang fails it instead of stalling the suite.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func dial(t *testing.T, addr string, opts ...ringlock.Option) *ringlock.Session {
	t.Helper()
	s, err := ringlock.Dial(ctx(t), []string{addr}, opts...)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// key is unique per scenario and run, so scenarios never contend.
func key(t *testing.T, suffix string) string {
	return fmt.Sprintf("conf-go/%s/%d/%s", t.Name(), os.Getpid(), suffix)
}

func waitQueued(t *testing.T, srv *testserver.Server, n float64) {
	t.Helper()
	if err := srv.WaitMetric(queued, n); err != nil {
		t.Fatal(err)
	}
}

// holder returns the token KEYX lists for key (0: not held).
func holder(t *testing.T, srv *testserver.Server, key string) uint64 {
	t.Helper()
	held, err := srv.Keyx()
	if err != nil {
		t.Fatalf("KEYX: %v", err)
	}
	return held[key].Token
}

func within(t *testing.T, what string, ch <-chan struct{}, d time.Duration) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
	}
}

type acquired struct {
	lease *ringlock.Lease
	err   error
}

func acquireAsync(c context.Context, s *ringlock.Session, k string, opts ...ringlock.AcquireOption) chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := s.Acquire(c, k, opts...)
		ch <- acquired{l, err}
	}()
	return ch
}

func got(t *testing.T, what string, ch chan acquired) *ringlock.Lease {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("%s: %v", what, a.err)
		}
		return a.lease
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: not granted within 30 s", what)
	}
	return nil
}

func grant(t *testing.T, srv *testserver.Server) {
	k := key(t, "k")
	a, b := dial(t, srv.Lock), dial(t, srv.Lock)
	la, err := a.Acquire(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	if la.Token() == 0 {
		t.Fatal("token 0 for a grant")
	}
	if h := holder(t, srv, k); h != la.Token() {
		t.Fatalf("KEYX lists token %d, the lease has %d", h, la.Token())
	}
	if err := la.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lb, err := b.Acquire(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	if lb.Token() <= la.Token() {
		t.Fatalf("second grant's token %d not larger than the first's %d", lb.Token(), la.Token())
	}
	if err := lb.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

func fifo(t *testing.T, srv *testserver.Server) {
	k := key(t, "k")
	a := dial(t, srv.Lock)
	la, err := a.Acquire(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	var tokens []uint64
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i, name := range []string{"B", "C", "D"} {
		s := dial(t, srv.Lock)
		wg.Add(1)
		go func(name string) {
			defer wg.Done()
			l, err := s.Acquire(ctx(t), k)
			if err != nil {
				errs <- fmt.Errorf("%s: %v", name, err)
				return
			}
			mu.Lock()
			order = append(order, name)
			tokens = append(tokens, l.Token())
			mu.Unlock()
			if err := l.Release(ctx(t)); err != nil {
				errs <- fmt.Errorf("%s release: %v", name, err)
			}
		}(name)
		// Each waiter is queued on the server before the next one asks.
		waitQueued(t, srv, float64(i+1))
	}
	if err := la.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	within(t, "B, C and D granted", done, 30*time.Second)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if strings.Join(order, "") != "BCD" {
		t.Fatalf("granted in order %v, want B C D", order)
	}
	prev := la.Token()
	for i, tok := range tokens {
		if tok <= prev {
			t.Fatalf("token %d of %s not larger than %d", tok, order[i], prev)
		}
		prev = tok
	}
}

func try(t *testing.T, srv *testserver.Server) {
	k := key(t, "k")
	a, b := dial(t, srv.Lock), dial(t, srv.Lock)
	la, err := a.Acquire(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	l, err := b.TryLock(ctx(t), k)
	var se *ringlock.StatusError
	if !errors.Is(err, ringlock.ErrBusy) || !errors.As(err, &se) || se.Status.String() != "busy" || l != nil {
		t.Fatalf("try-lock of a held key: %v, %v; want busy", l, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("busy took %v", d)
	}
	if v, _ := srv.Metric(queued); v != 0 {
		t.Fatalf("the try-lock queued (%v waiters)", v)
	}
	if err := la.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lb, err := b.TryLock(ctx(t), k)
	if err != nil {
		t.Fatalf("try-lock of a free key: %v", err)
	}
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d after %d", lb.Token(), la.Token())
	}
	if err := lb.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

func timeout(t *testing.T, srv *testserver.Server) {
	k := key(t, "k")
	a, b := dial(t, srv.Lock), dial(t, srv.Lock)
	la, err := a.Acquire(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	l, err := b.Acquire(ctx(t), k, ringlock.WithWait(200*time.Millisecond))
	if !errors.Is(err, ringlock.ErrTimedOut) || l != nil {
		t.Fatalf("acquire of a held key with a 200 ms wait: %v, %v; want timed_out", l, err)
	}
	if h := holder(t, srv, k); h != la.Token() {
		t.Fatalf("after the timeout KEYX lists token %d, the holder has %d", h, la.Token())
	}
	if err := la.Extend(ctx(t)); err != nil {
		t.Fatalf("the holder's session: %v", err)
	}
	if v, _ := srv.Metric(queued); v != 0 {
		t.Fatalf("the timed-out acquire is still queued (%v)", v)
	}
	if err := la.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	// Not leaked to the timed-out client: the key is free.
	if h := holder(t, srv, k); h != 0 {
		t.Fatalf("after the holder's release the key is held (token %d)", h)
	}
	c := dial(t, srv.Lock)
	lc, err := c.TryLock(ctx(t), k)
	if err != nil {
		t.Fatalf("a third session: %v", err)
	}
	_ = lc.Release(ctx(t))
}

func cancelRace(t *testing.T, srv *testserver.Server) {
	a, b, c := dial(t, srv.Lock), dial(t, srv.Lock), dial(t, srv.Lock)
	const rounds = 100
	var won, released, cancelled int
	for i := 0; i < rounds; i++ {
		k := key(t, strconv.Itoa(i))
		la, err := a.Acquire(ctx(t), k)
		if err != nil {
			t.Fatal(err)
		}
		bctx, cancel := context.WithCancel(ctx(t))
		ch := acquireAsync(bctx, b, k)
		waitQueued(t, srv, 1)
		// Release and cancel at about the same moment: which one goes
		// first, and by how much (0 to 90 µs, spun, not slept), varies
		// by round, so both outcomes of the race are exercised.
		start := make(chan struct{})
		relErr := make(chan error, 1)
		lag := time.Duration(i%10) * 10 * time.Microsecond
		relLag, cancelLag := lag, time.Duration(0)
		if i%2 == 1 {
			relLag, cancelLag = 0, lag
		}
		go func() { <-start; spin(relLag); relErr <- la.Release(ctx(t)) }()
		go func() { <-start; spin(cancelLag); cancel() }()
		close(start)
		if err := <-relErr; err != nil {
			t.Fatalf("round %d: release: %v", i, err)
		}
		var r acquired
		select {
		case r = <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: the cancelled acquire did not return", i)
		}
		switch {
		case r.err == nil:
			won++
			if h := holder(t, srv, k); h != r.lease.Token() {
				t.Fatalf("round %d: the grant returned has token %d, KEYX lists %d", i, r.lease.Token(), h)
			}
			if err := r.lease.Release(ctx(t)); err != nil {
				t.Fatalf("round %d: release of the won grant: %v", i, err)
			}
		case errors.Is(r.err, context.Canceled):
			var ce *ringlock.CancelError
			if !errors.As(r.err, &ce) || ce.ReleaseErr != nil {
				t.Fatalf("round %d: %v", i, r.err)
			}
			if ce.Released != 0 {
				released++
			} else {
				cancelled++
			}
		default:
			t.Fatalf("round %d: %v", i, r.err)
		}
		// Never held by nobody-knows-whom: a third session gets it at once.
		lc, err := c.TryLock(ctx(t), k)
		if err != nil {
			t.Fatalf("round %d: a third session's try-lock: %v (KEYX token %d)", i, err, holder(t, srv, k))
		}
		if err := lc.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d rounds: %d returned the grant, %d granted after the cancel and released, %d withdrawn", rounds, won, released, cancelled)
}

// spin busy-waits d (a sleep this short is far less precise).
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

func leaseExpiryLost(t *testing.T, srv *testserver.Server) {
	k := key(t, "k")
	a, b := dial(t, srv.Lock), dial(t, srv.Lock)
	la, err := a.Acquire(ctx(t), k, ringlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if la.Mode() != ringlock.HoldLease || la.ExpiresAt().IsZero() {
		t.Fatalf("mode %v, expires %v", la.Mode(), la.ExpiresAt())
	}
	ch := acquireAsync(ctx(t), b, k)
	waitQueued(t, srv, 1)
	within(t, "the holder's Lost()", la.Lost(), 10*time.Second)
	var le *ringlock.LostError
	if err := la.Err(); !errors.As(err, &le) || !errors.Is(err, ringlock.ErrLost) ||
		(le.Reason != ringlock.LostExpired && le.Reason != ringlock.LostExpiredLocally) {
		t.Fatalf("the holder's Err(): %v", err)
	}
	lb := got(t, "the waiter", ch)
	if lb.Token() <= la.Token() {
		t.Fatalf("the next holder's token %d not larger than the expired %d", lb.Token(), la.Token())
	}
	if err := la.Release(ctx(t)); !errors.Is(err, ringlock.ErrLost) {
		t.Fatalf("release of the expired lease: %v, want ErrLost", err)
	}
	if h := holder(t, srv, k); h != lb.Token() {
		t.Fatalf("the expired holder's release changed the key: KEYX token %d, want %d", h, lb.Token())
	}
	if err := lb.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}

	// The server's own push: an operator reset of a live holder.
	k2 := key(t, "reset")
	lr, err := a.Acquire(ctx(t), k2)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Reset(k2); err != nil {
		t.Fatal(err)
	}
	within(t, "Lost() after a reset", lr.Lost(), 10*time.Second)
	if err := lr.Err(); !errors.As(err, &le) || le.Reason != ringlock.LostReset {
		t.Fatalf("after a reset: %v, want a LostReset", err)
	}
}

func sessionEndOnClose(t *testing.T, srv *testserver.Server) {
	k1, k2 := key(t, "1"), key(t, "2")
	a, b := dial(t, srv.Lock), dial(t, srv.Lock)
	l1, err := a.Acquire(ctx(t), k1)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := a.Acquire(ctx(t), k2)
	if err != nil {
		t.Fatal(err)
	}
	ch := acquireAsync(ctx(t), b, k1)
	waitQueued(t, srv, 1)
	a.Close()
	lb := got(t, "the waiter after the holder's session closed", ch)
	if lb.Token() <= l1.Token() {
		t.Fatalf("token %d after %d", lb.Token(), l1.Token())
	}
	for _, l := range []*ringlock.Lease{l1, l2} {
		within(t, "Lost() of a closed session's lease", l.Lost(), 5*time.Second)
		var le *ringlock.LostError
		if err := l.Err(); !errors.As(err, &le) || le.Reason != ringlock.LostSessionEnded {
			t.Fatalf("%s: %v, want LostSessionEnded", l.Key(), err)
		}
	}
	if h := holder(t, srv, k2); h != 0 {
		t.Fatalf("%s still held (token %d) after its session closed", k2, h)
	}
	if _, err := a.Acquire(ctx(t), k2); !errors.Is(err, ringlock.ErrSessionEnded) {
		t.Fatalf("acquire on a closed session: %v", err)
	}
	if err := lb.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

// holderChild is the keepalive_loss holder: it takes a session hold with a
// short keep-alive, says "held TOKEN", and reports "lost REASON" when its
// Lost() closes.
func holderChild() int {
	addr, k := os.Getenv("RINGLOCK_ADDR"), os.Getenv("RINGLOCK_KEY")
	c, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	s, err := ringlock.Dial(c, []string{addr}, ringlock.WithKeepalive(time.Second))
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	l, err := s.Acquire(c, k)
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	fmt.Println("held", l.Token())
	select {
	case <-l.Lost():
		var le *ringlock.LostError
		if errors.As(l.Err(), &le) {
			fmt.Println("lost", le.Reason, strings.ReplaceAll(le.Error(), "\n", " "))
			return 0
		}
		fmt.Println("error lost without a LostError:", l.Err())
		return 2
	case <-c.Done():
		fmt.Println("error never lost")
		return 1
	}
}

func keepaliveLoss(t *testing.T, srv *testserver.Server) {
	k := key(t, "k")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1", "RINGLOCK_ADDR="+srv.Lock, "RINGLOCK_KEY="+k)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	line := func(what string) string {
		select {
		case l := <-lines:
			return l
		case <-time.After(30 * time.Second):
			t.Fatalf("the child did not say %s", what)
		}
		return ""
	}
	held := line("held")
	var childToken uint64
	if _, err := fmt.Sscanf(held, "held %d", &childToken); err != nil {
		t.Fatalf("child: %q", held)
	}
	b := dial(t, srv.Lock)
	ch := acquireAsync(ctx(t), b, k)
	waitQueued(t, srv, 1)
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The server ends the stopped child's session after its 1 s keep-alive.
	lb := got(t, "the waiter while the holder is stopped", ch)
	if lb.Token() <= childToken {
		t.Fatalf("token %d after the child's %d", lb.Token(), childToken)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	lost := line("lost")
	if !strings.HasPrefix(lost, "lost ") {
		t.Fatalf("the resumed holder: %q", lost)
	}
	t.Logf("the resumed holder: %s", lost)
	if err := lb.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

func staleTokenRelease(t *testing.T, srv *testserver.Server) {
	k := key(t, "k")
	a, b, c := dial(t, srv.Lock), dial(t, srv.Lock), dial(t, srv.Lock)
	lo, _ := a.TTLBounds()
	ttl := 300 * time.Millisecond
	if ttl < lo {
		ttl = lo
	}
	la, err := a.Acquire(ctx(t), k, ringlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	ch := acquireAsync(ctx(t), b, k, ringlock.WithTTL(30*time.Second))
	lb := got(t, "the next holder after the lease expired", ch)
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d after %d", lb.Token(), la.Token())
	}
	// Any session may release or extend a lease by its token; an older one
	// is refused and changes nothing.
	for _, s := range []*ringlock.Session{a, c} {
		err := s.ReleaseToken(ctx(t), k, la.Token())
		var se *ringlock.StatusError
		if !errors.Is(err, ringlock.ErrStaleToken) || !errors.As(err, &se) || se.Status != ringlock.StatusStaleToken {
			t.Fatalf("release with the older token: %v, want stale_token", err)
		}
		if _, err := s.ExtendToken(ctx(t), k, la.Token(), time.Second); !errors.Is(err, ringlock.ErrStaleToken) {
			t.Fatalf("extend with the older token: %v, want stale_token", err)
		}
		if h := holder(t, srv, k); h != lb.Token() {
			t.Fatalf("after the stale release KEYX lists %d, want the current holder's %d", h, lb.Token())
		}
	}
	if err := la.Release(ctx(t)); !errors.Is(err, ringlock.ErrLost) {
		t.Fatalf("the expired lease's Release: %v", err)
	}
	if h := holder(t, srv, k); h != lb.Token() {
		t.Fatalf("after the expired lease's release KEYX lists %d, want %d", h, lb.Token())
	}
	if err := lb.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	// A session hold answers not_owner to another session naming its token.
	ks := key(t, "session")
	ls, err := b.Acquire(ctx(t), ks)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ReleaseToken(ctx(t), ks, ls.Token()); !errors.Is(err, ringlock.ErrNotOwner) {
		t.Fatalf("another session's release of a session hold: %v, want not_owner", err)
	}
	if h := holder(t, srv, ks); h != ls.Token() {
		t.Fatalf("not_owner changed the key: %d", h)
	}
	if err := ls.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

func authRefused(t *testing.T, _ *testserver.Server) {
	dir := t.TempDir()
	f := filepath.Join(dir, "secret")
	if err := os.WriteFile(f, []byte("s3cret-go\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := testserver.Start("--auth-token-file", f)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Kill9()
	for _, opts := range [][]ringlock.Option{nil, {ringlock.WithAuthToken([]byte("wrong"))}} {
		s, err := ringlock.Dial(ctx(t), []string{srv.Lock}, opts...)
		var se *ringlock.StatusError
		if !errors.Is(err, ringlock.ErrUnauthorized) || !errors.As(err, &se) || se.Status.String() != "unauthorized" || s != nil {
			t.Fatalf("hello without the right token: %v, want unauthorized", err)
		}
	}
	s := dial(t, srv.Lock, ringlock.WithAuthToken([]byte("s3cret-go")))
	l, err := s.Acquire(ctx(t), key(t, "k"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

func serverRestartDurable(t *testing.T, _ *testserver.Server) {
	dir := t.TempDir()
	srv, err := testserver.Start("--data-path", filepath.Join(dir, "wal"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Kill9() }()
	keys := []string{key(t, "a"), key(t, "b"), key(t, "c")}
	kp := key(t, "persistent")
	var before uint64
	s := dial(t, srv.Lock)
	for round := 0; round < 3; round++ {
		for _, k := range keys {
			l, err := s.Acquire(ctx(t), k)
			if err != nil {
				t.Fatal(err)
			}
			if l.Token() > before {
				before = l.Token()
			}
			if err := l.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
		}
	}
	lp, err := s.Acquire(ctx(t), kp, ringlock.Persistent())
	if err != nil {
		t.Fatal(err)
	}
	if lp.Token() > before {
		before = lp.Token()
	}
	srv2, err := srv.Restart()
	if err != nil {
		t.Fatal(err)
	}
	srv = srv2
	within(t, "the old session's end after kill -9", s.Done(), 30*time.Second)
	within(t, "Lost() of the persistent hold's session", lp.Lost(), 5*time.Second)
	// The persistent hold survived, with its token.
	if h := holder(t, srv, kp); h != lp.Token() {
		t.Fatalf("after the restart the persistent hold lists token %d, want %d", h, lp.Token())
	}
	s2 := dial(t, srv.Lock)
	for _, k := range keys {
		l, err := s2.Acquire(ctx(t), k)
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= before {
			t.Fatalf("%s: token %d after the restart, not above %d from before it", k, l.Token(), before)
		}
		if err := l.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s2.TryLock(ctx(t), kp); !errors.Is(err, ringlock.ErrBusy) {
		t.Fatalf("the persistent hold after the restart: try-lock %v, want busy", err)
	}
	if err := s2.ReleaseToken(ctx(t), kp, lp.Token()); err != nil {
		t.Fatalf("release of the persistent hold by its token: %v", err)
	}
	l, err := s2.TryLock(ctx(t), kp)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= before {
		t.Fatalf("token %d not above %d", l.Token(), before)
	}
	_ = l.Release(ctx(t))
}

func shards(t *testing.T, srv *testserver.Server) {
	threads, _ := strconv.Atoi(testserver.Threads())
	const nkeys, workers, rounds = 8, 4, 10
	sessions := make([]*ringlock.Session, workers)
	for i := range sessions {
		sessions[i] = dial(t, srv.Lock)
	}
	if got := sessions[0].Shards(); got != threads {
		t.Fatalf("the server has %d shards, RINGLOCK_TEST_THREADS says %d", got, threads)
	}
	var mu sync.Mutex
	seq := make(map[string][]uint64)
	var wg sync.WaitGroup
	errs := make(chan error, nkeys*workers)
	for ki := 0; ki < nkeys; ki++ {
		k := key(t, strconv.Itoa(ki))
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(s *ringlock.Session) {
				defer wg.Done()
				for r := 0; r < rounds; r++ {
					l, err := s.Acquire(ctx(t), k)
					if err != nil {
						errs <- err
						return
					}
					// Grants of a key are one at a time, so this records
					// them in grant order.
					mu.Lock()
					seq[k] = append(seq[k], l.Token())
					mu.Unlock()
					if err := l.Release(ctx(t)); err != nil {
						errs <- err
						return
					}
				}
			}(sessions[w])
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	within(t, "every worker", done, 60*time.Second)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k, toks := range seq {
		if len(toks) != workers*rounds {
			t.Fatalf("%s: %d grants, want %d", k, len(toks), workers*rounds)
		}
		for i := 1; i < len(toks); i++ {
			if toks[i] <= toks[i-1] {
				t.Fatalf("%s: token %d after %d", k, toks[i], toks[i-1])
			}
		}
	}
}
