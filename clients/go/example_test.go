package ringlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	ringlock "github.com/ringlock/ringlock/clients/go"
)

// A session hold: freed by the server the moment this session ends, so a
// holder that dies never keeps the lock.
func ExampleSession_Acquire() {
	ctx := context.Background()
	s, err := ringlock.Dial(ctx, []string{"127.0.0.1"}, ringlock.WithSource("billing-worker"))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	lease, err := s.Acquire(ctx, "nightly/reconcile", ringlock.WithWait(10*time.Second))
	if errors.Is(err, ringlock.ErrTimedOut) {
		return // someone else is on it; decided by the server
	} else if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	fmt.Println("fence every write with token", lease.Token())
}

// A lease that extends itself while the work runs; the work stops when
// the lock is lost.
func ExampleWithAutoExtend() {
	ctx := context.Background()
	s, err := ringlock.Dial(ctx, []string{"127.0.0.1:22119"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	lease, err := s.Acquire(ctx, "etl/nightly", ringlock.WithTTL(30*time.Second), ringlock.WithAutoExtend())
	if err != nil {
		log.Fatal(err)
	}
	work, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-lease.Lost() // never closes after Release began
		cancel()
	}()
	runETL(work, lease.Token())
	if err := lease.Release(ctx); err != nil {
		log.Printf("release: %v", err) // a *LostError if the lock was lost first
	}
}

// Only if free right now.
func ExampleSession_TryLock() {
	ctx := context.Background()
	s, err := ringlock.Dial(ctx, []string{"127.0.0.1"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	lease, err := s.TryLock(ctx, "cache/rebuild")
	switch {
	case errors.Is(err, ringlock.ErrBusy):
		fmt.Println("already running elsewhere")
	case err != nil:
		log.Fatal(err)
	default:
		defer lease.Release(ctx)
		fmt.Println("rebuilding")
	}
}

// Cancellation through the context is exact: a caller whose context ended
// never holds the key, even when the grant and the cancel crossed.
func ExampleCancelError() {
	ctx := context.Background()
	s, err := ringlock.Dial(ctx, []string{"127.0.0.1"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	wait, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = s.Acquire(wait, "deploy/prod")
	var ce *ringlock.CancelError
	if errors.As(err, &ce) && errors.Is(err, context.DeadlineExceeded) {
		fmt.Println("gave up; released a grant that came too late:", ce.Released != 0)
	}
}

// A reader lock: any number of shared holders at once; a writer waits for
// them, and readers that come after a waiting writer wait behind it.
func ExampleSession_LockShared() {
	ctx := context.Background()
	s, err := ringlock.Dial(ctx, []string{"127.0.0.1"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	r, err := s.LockShared(ctx, "catalog", ringlock.WithWait(5*time.Second))
	if errors.Is(err, ringlock.ErrModesUnsupported) {
		log.Fatal("a ringlockd older than lock modes: no shared holds")
	} else if err != nil {
		log.Fatal(err)
	}
	defer r.Release(ctx)
	fmt.Println("reading with token", r.Token(), r.Access()) // ... shared
}

// A semaphore: at most 4 holders of "render-pool" at once.
func ExampleSession_Permit() {
	ctx := context.Background()
	s, err := ringlock.Dial(ctx, []string{"127.0.0.1"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	p, err := s.Permit(ctx, "render-pool", 4)
	var mm *ringlock.ModeMismatchError
	if errors.As(err, &mm) {
		log.Fatalf("%s is a semaphore of another size than %d", mm.Key, mm.Slots)
	} else if err != nil {
		log.Fatal(err)
	}
	defer p.Release(ctx)
	fmt.Println("rendering with token", p.Token())
}

// Leader election: candidates lead in the order they campaigned; the
// leader's value (here its address) is seen by every observer, and a
// leader whose process dies is replaced at once.
func ExampleElection() {
	ctx := context.Background()
	s, err := ringlock.Dial(ctx, []string{"127.0.0.1"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	e := s.Election("billing/primary")

	// Who leads, now and at every change (another process, typically).
	o, err := e.Observe(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer o.Close()
	go func() {
		for {
			l, err := o.Next(ctx)
			if err != nil {
				return // the observation ended (errors.Is(err, ringlock.ErrWatchEnded)): observe again
			}
			if l == nil {
				fmt.Println("nobody leads")
			} else {
				fmt.Println("leader", l.Value, "token", l.Token)
			}
		}
	}()

	lead, err := e.Campaign(ctx, "10.0.0.7:9000") // waits until elected
	if err != nil {
		log.Fatal(err)
	}
	// Moved: same leadership, same token; observers are told.
	if err := lead.Proclaim(ctx, "10.0.0.8:9000"); errors.Is(err, ringlock.ErrLost) {
		log.Fatal("no longer the leader")
	}
	select {
	case <-lead.Lost(): // reset, or the session ended
		log.Print(lead.Err())
	case <-serve(ctx, lead.Token()): // fence every write with the token
		_ = lead.Resign(ctx) // the next candidate is elected
	}
}

func runETL(ctx context.Context, token uint64) {}

func serve(ctx context.Context, token uint64) <-chan struct{} { return make(chan struct{}) }
