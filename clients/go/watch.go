package ringlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Watching a key (docs/protocol.md, "Watching a key"): a session is told
// who holds a key now, then every change of its holders, in the order the
// server decided them, pushed as Event frames under the Watch's request id.

// EventKind is what an Event says of a watched key's holder: the Event
// body's first byte.
type EventKind uint8

const (
	// EventHolder: held the key when the watch began (Watch.Holders; never
	// on Watch.Events).
	EventHolder EventKind = 0
	// EventGranted: was granted the key.
	EventGranted EventKind = 1
	// EventReleased: let go: a Locking-Center Unlock, a session's Release,
	// or a grant whose answer could not be delivered.
	EventReleased EventKind = 2
	// EventExpired: a lease that ran out.
	EventExpired EventKind = 3
	// EventReset: was reset (ResetByKey, ResetBySource, the admin
	// RSET/RSBS/RSTK).
	EventReset EventKind = 4
	// EventSessionEnded: its session ended (connection closed, keep-alive
	// missed).
	EventSessionEnded EventKind = 5
	// EventProclaimed: still holds the key, same token, under the new
	// Source the event carries (a Proclaim: an election leader's new
	// value). Sent only by a server that offers proclaim
	// (Session.Proclaims).
	EventProclaimed EventKind = 6
)

var eventNames = [...]string{"holder", "granted", "released", "expired", "reset", "session_ended", "proclaimed"}

// String is the event's protocol name: "holder", "granted", "released",
// "expired", "reset", "session_ended" or "proclaimed".
func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// EndsHold reports whether the holder is gone after this event (released,
// expired, reset, session_ended).
func (k EventKind) EndsHold() bool { return k >= EventReleased && k <= EventSessionEnded }

// Holder is one holder of a watched key.
type Holder struct {
	Token  uint64   // its fencing token
	Hold   HoldMode // persistent, session or lease
	Access Access   // exclusive, shared or Semaphore(n): Access.Slots is n
	Source string   // the holder's source (a Locking-Center client's, or a session's)
}

// WatchEvent is one change of a watched key's holders: Kind happened to
// the holder (Token, Hold, Access, Source, promoted from Holder) of Key.
type WatchEvent struct {
	Kind EventKind
	Key  string
	Holder
}

// Watch is a watch of one key on a session (Session.Watch). Holders is who
// held the key when the watch began; Events then delivers every change, in
// order, none left out, until the watch ends: Close, or the end of the
// session's connection (the session ends, or resumes on a new connection:
// the server does not carry watches over a Resume). The Events channel is
// then closed, and Err says why.
//
// A watch that ended is not restarted by the client: call Session.Watch
// again (on the resumed session, or a new one) and read Holders anew. That
// is a re-read, not a continuation: changes between the two watches are
// not replayed (a key may have been granted and released meanwhile).
//
// Events are queued per watch without bound, so a slow reader never holds
// up the session's other traffic (Pings, Acquires, other watches); a watch
// nobody reads grows its queue until Close.
type Watch struct {
	s       *Session
	key     string
	rid     uint32 // the Watch's request id; set by send
	holders []Holder
	events  chan WatchEvent
	stop    chan struct{} // closed by Close: undelivered events are dropped
	done    chan struct{} // closed by the pump just before it closes events

	mu        sync.Mutex
	active    bool // the Watch's Reply ok was read: Events go to the queue
	queue     []WatchEvent
	wake      chan struct{} // signalled when queue or ended change
	ended     bool          // no event is queued any more
	err       error         // why it ended (set with ended)
	closeOnce sync.Once
	closeErr  error
}

var (
	// ErrWatchUnsupported matches a *WatchUnsupportedError: a Watch on a
	// session whose server does not offer watches; nothing was sent.
	ErrWatchUnsupported = errors.New("ringlock: watches not offered by the server")
	// ErrWatchClosed is Watch.Err after Watch.Close.
	ErrWatchClosed = errors.New("ringlock: watch closed")
	// ErrWatchEnded matches a *WatchEndedError: the watch ended with its
	// session's connection; watch again and read the holders anew.
	ErrWatchEnded = errors.New("ringlock: watch ended")
)

// WatchUnsupportedError: a Watch of Key on a session whose server (Addr)
// does not offer watches: its welcome lacks the watches flag (a ringlockd
// older than watches). Nothing was sent. errors.Is(err,
// ErrWatchUnsupported).
type WatchUnsupportedError struct {
	Addr string
	Key  string
}

func (e *WatchUnsupportedError) Error() string {
	return fmt.Sprintf("ringlock: watch %q: the server at %s does not offer watches (its welcome lacks the watches flag: a ringlockd older than watches); nothing was sent", e.Key, e.Addr)
}

// Is matches ErrWatchUnsupported.
func (e *WatchUnsupportedError) Is(target error) bool { return target == ErrWatchUnsupported }

// WatchEndedError: the watch of Key ended with its session's connection
// (Cause: the session's end, which matches ErrSessionEnded, or a resume on
// a new connection, Resumed). The client does not watch again by itself:
// call Session.Watch and read Holders anew; changes in between are not
// replayed. errors.Is(err, ErrWatchEnded).
type WatchEndedError struct {
	Key     string
	Resumed bool // the session lives on, resumed on a new connection
	Cause   error
}

func (e *WatchEndedError) Error() string {
	if e.Resumed {
		return fmt.Sprintf("ringlock: watch %q ended: the session was resumed on a new connection and watches are not carried over a resume: watch again and read the holders anew (changes in between are not replayed)", e.Key)
	}
	return fmt.Sprintf("ringlock: watch %q ended with its session: %v", e.Key, e.Cause)
}

// Is matches ErrWatchEnded.
func (e *WatchEndedError) Is(target error) bool { return target == ErrWatchEnded }

// Unwrap returns the cause (the session's end matches ErrSessionEnded).
func (e *WatchEndedError) Unwrap() error { return e.Cause }

// Watches reports whether the server takes Watch: the watches flag of its
// welcome (of the latest resume's, after one).
func (s *Session) Watches() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.watches
}

// Watch watches key: it returns once the server has listed the key's
// holders (Watch.Holders, empty for a free key); every later change comes
// on Watch.Events, in the order the server decided it. A watch takes no
// slot and delays nobody. Close it when done.
//
// Errors: ErrInvalidArgument (a key of 0 or more than 127 bytes; nothing
// is sent), *WatchUnsupportedError (a server without watches; nothing is
// sent), *StatusError for a refusal (ErrLimit: the server has
// --max-waiters watches on that shard; ErrInvalid), ErrSessionEnded,
// ctx.Err() (a watch answered after that is closed at once).
func (s *Session) Watch(ctx context.Context, key string) (*Watch, error) {
	if len(key) < 1 || len(key) > MaxKeyLen {
		return nil, fmt.Errorf("%w: a key is 1..%d bytes, got %d", ErrInvalidArgument, MaxKeyLen, len(key))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w := &Watch{
		s:      s,
		key:    key,
		events: make(chan WatchEvent),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		wake:   make(chan struct{}, 1),
	}
	c := &call{op: opWatch, key: key, watch: w, ch: make(chan result, 1)}
	if _, err := s.send(c, func(rid uint32) []byte { return encodeWatch(rid, key) }); err != nil {
		return nil, err
	}
	go w.pump()
	select {
	case res := <-c.ch:
		if err := watchAnswer(key, res); err != nil {
			w.finish(err, true)
			return nil, err
		}
		return w, nil
	case <-ctx.Done():
	}
	// Answered later: a watch granted then is closed; a refusal ends it.
	go func() {
		if err := watchAnswer(key, <-c.ch); err != nil {
			w.finish(err, true)
			return
		}
		_ = w.Close()
	}()
	return nil, ctx.Err()
}

func watchAnswer(key string, res result) error {
	if res.err != nil {
		return res.err
	}
	if res.r.status != StatusOK {
		return &StatusError{Op: "watch", Key: key, Status: res.r.status}
	}
	return nil
}

// Key is the watched key.
func (w *Watch) Key() string { return w.key }

// Holders is who held the key when the watch began (one entry per holder:
// several for shared or semaphore holders, none for a free key), in the
// order the server listed them.
func (w *Watch) Holders() []Holder {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Holder(nil), w.holders...)
}

// Events delivers every change of the key's holders after Holders, in
// order (granted, released, expired, reset, session_ended, proclaimed); an
// Event of a kind this client does not know (a later server's) is
// skipped. It is closed when the watch ends; Err then says why. After
// Close, events not yet received are dropped.
func (w *Watch) Events() <-chan WatchEvent { return w.events }

// Err is nil while the watch lives (and until Events is closed, for a
// watch that ended: events already queued are still delivered), then why
// it ended: ErrWatchClosed after Close, a *WatchEndedError (ErrWatchEnded)
// when the session's connection ended it.
func (w *Watch) Err() error {
	select {
	case <-w.done:
	default:
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close ends the watch: it sends Unwatch and waits (at most
// Options.ReleaseTimeout) for its Reply, after which the server sends no
// Event of this watch; then the Events channel is closed (events not yet
// received are dropped) and Err is ErrWatchClosed. A watch that already
// ended sends nothing. Idempotent; the error is that of the first call.
func (w *Watch) Close() error {
	w.closeOnce.Do(func() {
		w.mu.Lock()
		ended := w.ended
		w.mu.Unlock()
		if ended {
			w.finish(ErrWatchClosed, true) // drops what the reader did not take
			return
		}
		s := w.s
		ctx, cancel := context.WithTimeout(context.Background(), s.releaseTimeout)
		defer cancel()
		res, err := s.roundTrip(ctx, &call{op: opUnwatch, key: w.key, target: w.rid}, func(rid uint32) []byte {
			return encodeUnwatch(rid, w.rid, w.key)
		})
		switch {
		case err != nil && errors.Is(err, ErrSessionEnded):
			// The watch ended with the session (already finished).
		case err != nil:
			w.closeErr = fmt.Errorf("ringlock: unwatch %q: %w", w.key, err)
		case res.r.status != StatusOK && res.r.status != StatusNotQueued:
			w.closeErr = &StatusError{Op: "unwatch", Key: w.key, Status: res.r.status}
		}
		w.finish(ErrWatchClosed, true)
	})
	<-w.done
	return w.closeErr
}

// holder records one holder listed before the Watch's Reply (reader).
func (w *Watch) holder(h Holder) {
	w.mu.Lock()
	w.holders = append(w.holders, h)
	w.mu.Unlock()
}

// push queues one event (reader); dropped once the watch ended.
func (w *Watch) push(ev WatchEvent) {
	w.mu.Lock()
	if !w.ended {
		w.queue = append(w.queue, ev)
	}
	w.mu.Unlock()
	w.signal()
}

func (w *Watch) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// finish ends the watch once with err (nil: keep the first one); drop
// discards the events not delivered yet and stops the pump at once.
func (w *Watch) finish(err error, drop bool) {
	w.mu.Lock()
	if !w.ended {
		w.ended = true
		w.err = err
	}
	if drop {
		w.queue = nil
		select {
		case <-w.stop:
		default:
			close(w.stop)
		}
	}
	w.mu.Unlock()
	w.signal()
}

// pump hands queued events to the Events channel, one at a time, so the
// session's reader never waits for the watch's reader. It closes Events
// once the watch ended and its queue is empty (or dropped).
func (w *Watch) pump() {
	defer close(w.events)
	defer close(w.done) // first: Err answers once a receive sees the close
	for {
		w.mu.Lock()
		if len(w.queue) == 0 {
			ended := w.ended
			w.mu.Unlock()
			if ended {
				return
			}
			select {
			case <-w.wake:
			case <-w.stop:
				return
			}
			continue
		}
		ev := w.queue[0]
		w.queue[0] = WatchEvent{}
		w.queue = w.queue[1:]
		w.mu.Unlock()
		select {
		case w.events <- ev:
		case <-w.stop:
			return
		}
	}
}
