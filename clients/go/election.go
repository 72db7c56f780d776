package ringlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Leader election (docs/protocol.md, "Elections: campaign, proclaim,
// resign, observe"), built on a key's FIFO queue and a watch of it:
//
//   - Campaign: an exclusive session-hold Acquire of the election's name
//     whose source is the candidate's value. Candidates are elected in the
//     order they campaigned; the leader's fencing token is its grant's.
//   - Resign: the Release of that token. A leader whose session ends (its
//     process killed, its connection lost past the keep-alive) is released
//     as any session hold is, and the next candidate elected at once.
//   - Proclaim: a new value for the leader, same leadership and token
//     (op 17, servers whose welcome has the proclaim flag).
//   - Observe: a Watch of the name, read as "who leads now".

// MaxValueLen is the longest election value in bytes (a value is 1..=255
// bytes: the holder's source; an empty one would be the client's IP).
const MaxValueLen = MaxSourceLen

var (
	// ErrProclaimUnsupported matches a *ProclaimUnsupportedError: a
	// Proclaim on a session whose server does not offer it; nothing was
	// sent.
	ErrProclaimUnsupported = errors.New("ringlock: proclaim not offered by the server")
)

// ProclaimUnsupportedError: a Proclaim in the election Key on a session
// whose server (Addr) does not offer it: its welcome lacks the proclaim
// flag (a ringlockd older than proclaim). Nothing was sent; the leadership
// is untouched. errors.Is(err, ErrProclaimUnsupported).
type ProclaimUnsupportedError struct {
	Addr string
	Key  string
}

func (e *ProclaimUnsupportedError) Error() string {
	return fmt.Sprintf("ringlock: proclaim in election %q: the server at %s does not offer proclaim (its welcome lacks the proclaim flag: a ringlockd older than proclaim); nothing was sent", e.Key, e.Addr)
}

// Is matches ErrProclaimUnsupported.
func (e *ProclaimUnsupportedError) Is(target error) bool { return target == ErrProclaimUnsupported }

// Proclaims reports whether the server takes Proclaim: the proclaim flag
// of its welcome (of the latest resume's, after one).
func (s *Session) Proclaims() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proclaim
}

// Election is the election named Name on one session's server: made by
// Session.Election. The name is a key of the server's (1..=127 bytes): use
// it for nothing else.
type Election struct {
	s    *Session
	name string
}

// Leader is who leads an election.
type Leader struct {
	// Token is the leader's fencing token: strictly larger for every new
	// leader (a proclaim keeps it).
	Token uint64
	// Value is what the leader campaigned with, or its latest proclaim.
	Value string
}

// Election is the election named name on this session's server. Nothing
// is sent; a name of 0 or more than 127 bytes is ErrInvalidArgument from
// each of the Election's methods.
func (s *Session) Election(name string) *Election {
	return &Election{s: s, name: name}
}

// Name is the election's name.
func (e *Election) Name() string { return e.name }

func checkValue(value string) error {
	if len(value) < 1 || len(value) > MaxValueLen {
		return fmt.Errorf("%w: an election value is 1..%d bytes, got %d", ErrInvalidArgument, MaxValueLen, len(value))
	}
	return nil
}

// Campaign campaigns with value (1..=255 bytes: an address, an id; it is
// this Acquire's source, not the session's) and waits until this session
// leads. Candidates are elected in the order they campaigned. The
// leadership is a session hold: it ends with Resign, with a reset, or when
// the session ends (Leadership.Lost closes then).
//
// ctx bounds the wait exactly as for Acquire: when it ends first the
// campaign is withdrawn, and a leadership granted in the race is resigned
// before Campaign returns a *CancelError. Errors as Acquire's, and
// ErrInvalidArgument (a bad name or value; nothing is sent).
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	if err := checkValue(value); err != nil {
		return nil, err
	}
	l, err := e.s.Acquire(ctx, e.name, func(c *acquireConfig) { c.source, c.hasSource = value, true })
	if err != nil {
		return nil, err
	}
	return &Leadership{e: e, lease: l, value: value}, nil
}

// Leader is the leader now (nil, nil: nobody leads), read once (a watch of
// the name, closed at once). Errors as Session.Watch's.
func (e *Election) Leader(ctx context.Context) (*Leader, error) {
	w, err := e.s.Watch(ctx, e.name)
	if err != nil {
		return nil, err
	}
	l := leaderOf(w)
	_ = w.Close()
	return l, nil
}

// Observe observes the election: Observer.Leader is the leader now, and
// Observer.Next gives every change after it, in order. Like a Watch it
// lives on the session's connection: when the session ends (or resumes on
// a new connection) Next returns the watch's end; observe again to read
// the leader anew. Close it when done. Errors as Session.Watch's
// (*WatchUnsupportedError for a server without watches).
func (e *Election) Observe(ctx context.Context) (*Observer, error) {
	w, err := e.s.Watch(ctx, e.name)
	if err != nil {
		return nil, err
	}
	return &Observer{w: w, leader: leaderOf(w)}, nil
}

func leaderOf(w *Watch) *Leader {
	hs := w.Holders()
	if len(hs) == 0 {
		return nil
	}
	return &Leader{Token: hs[0].Token, Value: hs[0].Source}
}

// Leadership is this session leading an election: made by Campaign. It
// lasts until Resign, a reset of the name, or the end of the session
// (Lost closes then; a Proclaim then says the leadership is lost).
type Leadership struct {
	e     *Election
	lease *Lease

	pmu   sync.Mutex // one Proclaim at a time, so Value is the last one applied
	mu    sync.Mutex
	value string
}

// Election is the election led.
func (l *Leadership) Election() *Election { return l.e }

// Token is the leadership's fencing token: send it with every write the
// leader makes, and let the resource refuse a token lower than the highest
// it has seen.
func (l *Leadership) Token() uint64 { return l.lease.Token() }

// Value is the value observers see: the campaign's, or the latest
// Proclaim's.
func (l *Leadership) Value() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.value
}

// Lease is the session hold behind the leadership.
func (l *Leadership) Lease() *Lease { return l.lease }

// Lost is closed when the leadership is lost while held (a reset, the
// session's end, a Proclaim answered stale_token); never after Resign
// began. Err then says why.
func (l *Leadership) Lost() <-chan struct{} { return l.lease.Lost() }

// Err is nil while the leadership is held (or was resigned), then the
// *LostError saying why it was lost.
func (l *Leadership) Err() error { return l.lease.Err() }

// Proclaim changes the leader's value to value (1..=255 bytes), keeping
// the leadership and its token; every observer is told (a proclaimed
// Event). Proclaims of one Leadership run one at a time.
//
// Errors: ErrInvalidArgument (a bad value) and *ProclaimUnsupportedError
// (the server does not offer proclaim), nothing sent; the leadership is
// gone (resigned, reset, or its session ended): an error saying
// "leadership lost" that wraps a *LostError (errors.Is(err, ErrLost), and
// ErrStaleToken or ErrNotOwner for the server's answer), and Lost is
// closed if it was not; ctx ended before the answer: the value may or may
// not have changed; any other refusal, a *StatusError (ErrLimit: the
// server's names are full).
func (l *Leadership) Proclaim(ctx context.Context, value string) error {
	if err := checkValue(value); err != nil {
		return err
	}
	l.pmu.Lock()
	defer l.pmu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	key, token := l.e.name, l.lease.Token()
	res, err := l.e.s.roundTrip(ctx, &call{op: opProclaim, key: key, token: token}, func(rid uint32) []byte {
		return encodeProclaim(rid, token, key, value)
	})
	switch {
	case err == nil:
	case errors.Is(err, ErrProclaimUnsupported):
		return err
	case errors.Is(err, ErrSessionEnded):
		return l.lostWith(&LostError{Key: key, Token: token, Reason: LostSessionEnded, Cause: err})
	default:
		return fmt.Errorf("ringlock: proclaim in election %q (token %d) not answered; the value may or may not have changed: %w", key, token, err)
	}
	switch res.r.status {
	case StatusOK:
		l.mu.Lock()
		l.value = value
		l.mu.Unlock()
		return nil
	case StatusStaleToken, StatusNotOwner:
		return l.lostWith(&LostError{Key: key, Token: token, Reason: LostStaleToken, Status: res.r.status})
	default:
		return &StatusError{Op: "proclaim", Key: key, Status: res.r.status}
	}
}

// lostWith records the loss on the lease (if it was still held) and
// returns the leadership-lost error wrapping e.
func (l *Leadership) lostWith(e *LostError) error {
	l.lease.lose(e)
	return fmt.Errorf("ringlock: proclaim in election %q: leadership lost: %w", l.e.name, e)
}

// Resign gives the leadership up (the Release of its token): the next
// candidate is elected, observers are told. As Lease.Release: one Release
// however often it is called; a leadership lost before returns its
// *LostError.
func (l *Leadership) Resign(ctx context.Context) error { return l.lease.Release(ctx) }

// Observer follows an election's leader: made by Election.Observe.
type Observer struct {
	w    *Watch
	next sync.Mutex // one Next at a time

	mu     sync.Mutex
	leader *Leader
}

// Leader is the leader as last observed (nil: nobody leads): the one when
// Observe returned, then the one the latest Next returned.
func (o *Observer) Leader() *Leader {
	o.mu.Lock()
	defer o.mu.Unlock()
	return copyLeader(o.leader)
}

func copyLeader(l *Leader) *Leader {
	if l == nil {
		return nil
	}
	c := *l
	return &c
}

// Next waits for the leader to change and returns the new one (nil:
// nobody leads, between a leader's end and the next one's election). The
// changes, in order: a new leader (granted), the leader's new value (its
// proclaim, the same token), nobody (the leader's hold ended: released,
// expired, reset or its session ended). Other holders' events are not
// changes.
//
// Errors: ctx.Err() (the observation goes on); the observation ended: the
// watch's Err, a *WatchEndedError (ErrWatchEnded: the session ended or
// resumed; observe again) or ErrWatchClosed after Close.
func (o *Observer) Next(ctx context.Context) (*Leader, error) {
	o.next.Lock()
	defer o.next.Unlock()
	for {
		select {
		case ev, ok := <-o.w.Events():
			if !ok {
				return nil, o.w.Err()
			}
			if l, changed := o.apply(ev); changed {
				return l, nil
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// apply reads one event as the protocol's Observe does: whether the
// leader changed, and the new one.
func (o *Observer) apply(ev WatchEvent) (*Leader, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	cur := o.leader
	isLeader := cur != nil && cur.Token == ev.Token
	var now *Leader
	switch {
	case ev.Kind == EventGranted:
		now = &Leader{Token: ev.Token, Value: ev.Source}
	case ev.Kind == EventProclaimed && isLeader:
		now = &Leader{Token: ev.Token, Value: ev.Source}
	case ev.Kind.EndsHold() && isLeader:
		now = nil
	default:
		return nil, false // a holder this observer does not count as the leader
	}
	if (now == nil && cur == nil) || (now != nil && cur != nil && *now == *cur) {
		return nil, false
	}
	o.leader = now
	return copyLeader(now), true
}

// Err is nil while the observation lives, then why it ended (the watch's
// Err: ErrWatchClosed after Close, a *WatchEndedError).
func (o *Observer) Err() error { return o.w.Err() }

// Close ends the observation (Unwatch, as Watch.Close). Idempotent.
func (o *Observer) Close() error { return o.w.Close() }
