package ringlock

import (
	"context"
	"fmt"
)

// AccessKind is how a lock is shared: the access byte of an Acquire's
// optional [u8 access][u32 slots] trailer (docs/protocol.md, "Lock modes").
type AccessKind uint8

const (
	// AccessExclusive: one holder at a time (the default).
	AccessExclusive AccessKind = 0
	// AccessShared: any number of shared holders at once (a reader lock).
	AccessShared AccessKind = 1
	// AccessSemaphore: at most Access.Slots holders at once.
	AccessSemaphore AccessKind = 2
)

func (k AccessKind) String() string {
	switch k {
	case AccessExclusive:
		return "exclusive"
	case AccessShared:
		return "shared"
	case AccessSemaphore:
		return "semaphore"
	}
	return fmt.Sprintf("access(%d)", uint8(k))
}

// Access is how a lock is shared; every key has one FIFO queue whatever
// the access, and every grant its own fencing token.
//
//   - Exclusive (the zero value, the default): one holder at a time.
//   - Shared: any number of shared holders at once (a reader lock). An
//     exclusive request waits for them all, and a shared request that comes
//     after a waiting exclusive one waits behind it.
//   - Semaphore(n): at most n holders (n >= 1). The key's n is fixed by its
//     first semaphore holder or waiter for as long as any holds or waits:
//     another n is a *ModeMismatchError.
//
// Shared and semaphore requests need a server that offers lock modes
// (Session.Modes); otherwise Acquire returns a *ModesUnsupportedError
// without sending anything.
type Access struct {
	Kind  AccessKind
	Slots uint32 // a semaphore's n; 0 for the other kinds
}

var (
	// Exclusive is one holder at a time (the default access).
	Exclusive = Access{Kind: AccessExclusive}
	// Shared is any number of shared holders at once: a reader lock.
	Shared = Access{Kind: AccessShared}
)

// Semaphore is at most slots holders at once. Semaphore(0) is refused by
// Acquire with ErrInvalidArgument.
func Semaphore(slots uint32) Access { return Access{Kind: AccessSemaphore, Slots: slots} }

// String is "exclusive", "shared" or "semaphore(n)".
func (a Access) String() string {
	if a.Kind == AccessSemaphore {
		return fmt.Sprintf("semaphore(%d)", a.Slots)
	}
	return a.Kind.String()
}

// check reports a usage error: an unknown kind, slots on an exclusive or
// shared access, a semaphore of 0 slots.
func (a Access) check() error {
	switch a.Kind {
	case AccessExclusive, AccessShared:
		if a.Slots != 0 {
			return fmt.Errorf("%w: %v access has no slots (only a semaphore has), got %d", ErrInvalidArgument, a.Kind, a.Slots)
		}
	case AccessSemaphore:
		if a.Slots == 0 {
			return fmt.Errorf("%w: a semaphore has at least 1 slot, got 0", ErrInvalidArgument)
		}
	default:
		return fmt.Errorf("%w: unknown access kind %d", ErrInvalidArgument, uint8(a.Kind))
	}
	return nil
}

// WithAccess asks for the lock as Exclusive (the default), Shared or
// Semaphore(n), with any hold mode (WithTTL, Persistent).
func WithAccess(a Access) AcquireOption { return func(c *acquireConfig) { c.access = a } }

// LockShared is Acquire of a shared hold (a reader lock): WithAccess(Shared).
func (s *Session) LockShared(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error) {
	return s.Acquire(ctx, key, append(opts, WithAccess(Shared))...)
}

// TryLockShared is LockShared without waiting: ErrBusy when the key is held
// exclusively or an exclusive request waits on it.
func (s *Session) TryLockShared(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error) {
	return s.Acquire(ctx, key, append(opts, WithAccess(Shared), WithWait(0))...)
}

// Permit is Acquire of one permit of the semaphore key of slots holders
// (slots >= 1): WithAccess(Semaphore(slots)). A key that is a semaphore of
// another size is a *ModeMismatchError.
func (s *Session) Permit(ctx context.Context, key string, slots uint32, opts ...AcquireOption) (*Lease, error) {
	return s.Acquire(ctx, key, append(opts, WithAccess(Semaphore(slots)))...)
}

// TryPermit is Permit without waiting: ErrBusy when all slots are held (or
// a request of another access waits first).
func (s *Session) TryPermit(ctx context.Context, key string, slots uint32, opts ...AcquireOption) (*Lease, error) {
	return s.Acquire(ctx, key, append(opts, WithAccess(Semaphore(slots)), WithWait(0))...)
}

// Modes reports whether the server takes shared and semaphore Acquires:
// the modes flag of its welcome (of the latest resume's, after one). Every
// ringlockd since lock modes (issue #33) sets it, durable and clustered
// ones included; an older one does not.
func (s *Session) Modes() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.modes
}
