package ringlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

const (
	stateHeld = iota
	stateReleasing
	stateReleased
	stateLost
)

// A Lease is one granted lock: a session hold, a lease with a TTL, or a
// persistent hold, with its fencing token. Its methods are safe for
// concurrent use.
//
// Each Lease gets exactly one verdict: either it is released (Release
// began first: Lost never closes) or it is lost (Lost closes, Err says
// why, and a later Release returns that *LostError).
type Lease struct {
	s      *Session
	key    string
	token  uint64
	mode   HoldMode
	access Access
	ttl    time.Duration

	lost    chan struct{} // closed when the lock is lost while held
	stop    chan struct{} // closed when the lease stops being held (ends auto-extend)
	relDone chan struct{} // closed when the release has its result

	mu        sync.Mutex
	state     int
	lostErr   *LostError
	relErr    error
	relSent   bool
	expiresAt time.Time   // a lease's expiry on this side's clock
	timer     *time.Timer // fires at expiresAt; nil until a rebase's Extend
	rebase    bool        // set by the reader before the grant is handed on
}

// newLease is called by the reader, under the session's lock, when the
// grant is read.
func newLease(s *Session, c *call, token uint64) *Lease {
	l := &Lease{
		s: s, key: c.key, token: token, mode: c.mode, access: c.access, ttl: c.ttl,
		lost: make(chan struct{}), stop: make(chan struct{}), relDone: make(chan struct{}),
	}
	if c.mode == HoldLease {
		if time.Since(c.sentAt) > c.ttl/2 {
			// The grant came after a wait that used up more than half of
			// sentAt + TTL (perhaps all of it), while the server counts
			// the TTL from the grant: this side's expiry waits for the
			// Extend that Acquire sends before handing the lease out.
			l.rebase = true
			return l
		}
		// Counted from when the Acquire was sent: the server counts from
		// the grant, which is later, so this side expires first.
		l.expiresAt = c.sentAt.Add(c.ttl)
		l.timer = time.AfterFunc(time.Until(l.expiresAt), l.expired)
	}
	return l
}

// Key is the locked key.
func (l *Lease) Key() string { return l.key }

// Token is the grant's fencing token: it strictly increases for the key,
// across releases, resets, restarts and kill -9 of the server. Send it
// with every write to the protected resource and let the resource refuse
// a token lower than the highest it has seen.
func (l *Lease) Token() uint64 { return l.token }

// Mode is how the lock is held.
func (l *Lease) Mode() HoldMode { return l.mode }

// Access is how the lock is shared: Exclusive, Shared or Semaphore(n).
func (l *Lease) Access() Access { return l.access }

// TTL is a lease's TTL (zero for session and persistent holds).
func (l *Lease) TTL() time.Duration { return l.ttl }

// ExpiresAt is a lease's expiry on this side's clock: when the Acquire or
// the last successful Extend was sent, plus the TTL; never later than the
// server's. Zero for session and persistent holds.
func (l *Lease) ExpiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiresAt
}

// Lost is closed when the lock is lost while held: the server pushed that
// the lease expired or was reset, the lease's TTL passed on this side's
// clock, a Release or Extend found a newer token, or the session ended
// (for a session hold the server then frees the key; a lease and a
// persistent hold outlive the session on the server, but this client can
// no longer keep them). It never closes after Release began.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Err is nil while the lock is held (or was released), and the
// *LostError saying why once Lost is closed.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr == nil {
		return nil
	}
	return l.lostErr
}

// lose records the loss if the lease is still held.
func (l *Lease) lose(e *LostError) { l.loseIf(e, nil) }

// loseIf records the loss if the lease is still held and cond (checked
// under the lease's lock) holds.
func (l *Lease) loseIf(e *LostError, cond func() bool) {
	l.mu.Lock()
	if l.state != stateHeld || (cond != nil && !cond()) {
		l.mu.Unlock()
		return
	}
	l.state = stateLost
	l.lostErr = e
	if l.timer != nil {
		l.timer.Stop()
	}
	close(l.stop)
	close(l.lost)
	l.mu.Unlock()
	l.s.forget(l)
}

// expired runs at expiresAt; an Extend may have moved it meanwhile.
func (l *Lease) expired() {
	e := &LostError{Key: l.key, Token: l.token, Reason: LostExpiredLocally}
	l.loseIf(e, func() bool {
		if d := time.Until(l.expiresAt); d > 0 {
			l.timer.Reset(d)
			return false
		}
		return true
	})
}

// Extend renews a lease for its TTL, counted from when the Extend is sent.
// For a session or persistent hold it is a Ping round trip that proves
// the session alive. A lock lost before, or found lost by the answer
// (stale_token, not_owner), returns its *LostError (errors.Is(err,
// ErrLost)).
func (l *Lease) Extend(ctx context.Context) error {
	l.mu.Lock()
	state, lostErr := l.state, l.lostErr
	l.mu.Unlock()
	switch state {
	case stateLost:
		return lostErr
	case stateReleasing, stateReleased:
		return fmt.Errorf("%w: the lock on %q was released", ErrInvalidArgument, l.key)
	}
	if l.mode != HoldLease {
		if err := l.s.Ping(ctx); err != nil {
			return err
		}
		return l.Err()
	}
	c := &call{op: opExtend, key: l.key}
	res, err := l.s.roundTrip(ctx, c, func(rid uint32) []byte {
		return encodeExtend(rid, l.token, uint32(l.ttl/time.Millisecond), l.key)
	})
	if err != nil {
		return err
	}
	switch res.r.status {
	case StatusOK:
		l.mu.Lock()
		if next := c.sentAt.Add(l.ttl); l.state == stateHeld && next.After(l.expiresAt) {
			l.expiresAt = next
			if l.timer == nil {
				l.timer = time.AfterFunc(time.Until(next), l.expired)
			} else {
				l.timer.Reset(time.Until(next))
			}
		}
		l.mu.Unlock()
		return l.Err()
	case StatusStaleToken, StatusNotOwner:
		l.lose(&LostError{Key: l.key, Token: l.token, Reason: LostStaleToken, Status: res.r.status})
		if err := l.Err(); err != nil {
			return err
		}
		return &StatusError{Op: "extend", Key: l.key, Status: res.r.status}
	default:
		return &StatusError{Op: "extend", Key: l.key, Status: res.r.status}
	}
}

// autoExtend extends the lease every third of its TTL until it is
// released or lost.
func (l *Lease) autoExtend() {
	every := l.ttl / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		err := l.Extend(ctx)
		cancel()
		if errors.Is(err, ErrLost) || errors.Is(err, ErrSessionEnded) {
			return
		}
	}
}

// Release releases the lock: one Release naming the lease's token,
// however many goroutines call it, however often. Every call returns the
// result of that one Release; a call whose ctx ends first returns an
// error wrapping ctx.Err() while the Release goes on (a later call gets
// its result).
//
// A lock lost before Release began returns its *LostError and sends
// nothing (except after an expiry on this side's clock, which runs ahead
// of the server's: then a token-checked Release is sent, harmless if the
// server expired it too). A Release answered stale_token or not_owner
// returns a *LostError that also matches ErrStaleToken / ErrNotOwner.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	switch l.state {
	case stateHeld:
		l.state = stateReleasing
		if l.timer != nil {
			l.timer.Stop()
		}
		close(l.stop)
		l.mu.Unlock()
		l.sendRelease()
	case stateLost:
		e := l.lostErr
		resend := e.Reason == LostExpiredLocally && !l.relSent
		l.relSent = true
		l.mu.Unlock()
		if resend {
			_, _ = l.s.send(&call{op: opRelease, key: l.key, token: l.token}, func(rid uint32) []byte {
				return encodeRelease(rid, l.token, l.key)
			})
		}
		return e
	default:
		l.mu.Unlock()
	}
	select {
	case <-l.relDone:
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.relErr
	case <-ctx.Done():
		return fmt.Errorf("ringlock: release of %q (token %d) not answered yet: %w", l.key, l.token, ctx.Err())
	}
}

func (l *Lease) sendRelease() {
	c := &call{op: opRelease, key: l.key, token: l.token, ch: make(chan result, 1)}
	if _, err := l.s.send(c, func(rid uint32) []byte {
		return encodeRelease(rid, l.token, l.key)
	}); err != nil {
		l.released(result{err: err})
		return
	}
	go func() { l.released(<-c.ch) }()
}

func (l *Lease) released(res result) {
	var err error
	switch {
	case res.err != nil:
		what := "the server frees a session hold when the session ends"
		if l.mode == HoldLease {
			what = "the lease stays held on the server until its TTL passes"
		} else if l.mode == HoldPersistent {
			what = "the persistent hold stays held until released by token or reset"
		}
		err = fmt.Errorf("ringlock: release of %q (token %d) got no answer (%s): %w", l.key, l.token, what, res.err)
	case res.r.status == StatusOK:
	case res.r.status == StatusStaleToken || res.r.status == StatusNotOwner:
		err = &LostError{Key: l.key, Token: l.token, Reason: LostStaleToken, Status: res.r.status}
	default:
		err = &StatusError{Op: "release", Key: l.key, Status: res.r.status}
	}
	l.mu.Lock()
	l.state = stateReleased
	l.relErr = err
	l.mu.Unlock()
	close(l.relDone)
	l.s.forget(l)
}

// releasedElsewhere records a release by ReleaseToken: the lease is
// released (not lost), and its own Release returns nil.
func (l *Lease) releasedElsewhere() {
	l.mu.Lock()
	if l.state != stateHeld {
		l.mu.Unlock()
		return
	}
	l.state = stateReleasing
	if l.timer != nil {
		l.timer.Stop()
	}
	close(l.stop)
	l.mu.Unlock()
	l.released(result{})
}

// capExpiry moves a held lease's expiry on this side's clock earlier to t
// (a resume's Held list said that much TTL is left).
func (l *Lease) capExpiry(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != stateHeld || l.timer == nil || !t.Before(l.expiresAt) {
		return
	}
	l.expiresAt = t
	l.timer.Reset(time.Until(t))
}
