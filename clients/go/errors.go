package ringlock

import (
	"errors"
	"fmt"
	"strings"
)

// Status is the status byte of a server Reply (docs/protocol.md,
// "Sessions"). Its String is the status name the server documents
// ("stale_token", "busy", ...).
type Status uint8

// The statuses a ringlockd session answer can carry.
const (
	StatusOK           Status = 0  // granted, released, extended, pong
	StatusTimedOut     Status = 1  // an Acquire's wait passed while it was queued
	StatusBusy         Status = 2  // held by someone else (a try)
	StatusNotOwner     Status = 3  // the key's current token, but another session's session hold
	StatusStaleToken   Status = 4  // not the key's current token: nothing changed
	StatusInvalid      Status = 5  // malformed request, TTL out of bounds, Extend of a non-lease
	StatusLimit        Status = 6  // --max-keys or --max-waiters reached
	StatusServerError  Status = 7  // the log failed, or the server is shutting down
	StatusCancelled    Status = 8  // a queued Acquire withdrawn (by Cancel or a reset by source)
	StatusNotQueued    Status = 9  // a Cancel found nothing queued: the Acquire's answer stands
	StatusUnauthorized Status = 10 // a Hello without the server's auth token
	// StatusUnsupportedVersion: a Hello of a version the server does not
	// speak (*VersionError names those it does).
	StatusUnsupportedVersion Status = 11
	// StatusNotLeader: a server of a (future) replicated deployment that
	// cannot serve this session (*NotLeaderError names the leader).
	StatusNotLeader Status = 12
	// StatusUnknownSession: a Resume named a session the server does not
	// have (ended, never replicated, or past its resume window).
	StatusUnknownSession Status = 13
	// StatusTLSRequired: a Hello or Resume in plaintext to a server that
	// takes sessions over TLS only (it has --certs-dir): dial WithTLS.
	StatusTLSRequired Status = 14
	// StatusModeMismatch: a semaphore Acquire naming another slot count
	// than the key's (fixed while any semaphore request holds or waits on
	// it); nothing changed. Acquire returns a *ModeMismatchError.
	StatusModeMismatch Status = 15
)

var statusNames = [...]string{
	"ok", "timed_out", "busy", "not_owner", "stale_token", "invalid",
	"limit_reached", "server_error", "cancelled", "not_queued", "unauthorized",
	"unsupported_version", "not_leader", "unknown_session", "tls_required",
	"mode_mismatch",
}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Sentinel errors, one per refusing status: every *StatusError matches the
// sentinel of its status with errors.Is, so callers can write
//
//	if errors.Is(err, ringlock.ErrBusy) { ... }
var (
	ErrTimedOut     = errors.New("ringlock: timed_out")
	ErrBusy         = errors.New("ringlock: busy")
	ErrNotOwner     = errors.New("ringlock: not_owner")
	ErrStaleToken   = errors.New("ringlock: stale_token")
	ErrInvalid      = errors.New("ringlock: invalid")
	ErrLimit        = errors.New("ringlock: limit_reached")
	ErrServerError  = errors.New("ringlock: server_error")
	ErrCancelled    = errors.New("ringlock: cancelled")
	ErrNotQueued    = errors.New("ringlock: not_queued")
	ErrUnauthorized = errors.New("ringlock: unauthorized")
	// ErrUnsupportedVersion matches a *VersionError.
	ErrUnsupportedVersion = errors.New("ringlock: unsupported_version")
	// ErrNotLeader matches a *NotLeaderError.
	ErrNotLeader = errors.New("ringlock: not_leader")
	// ErrUnknownSession: a Resume was refused, the session has ended
	// (Session.Err matches it when that ended the session).
	ErrUnknownSession = errors.New("ringlock: unknown_session")
	// ErrTLSRequired: the server takes sessions over TLS only; Dial
	// WithTLS (LoadTLSConfig reads a certs dir). Dial stops there.
	ErrTLSRequired = errors.New("ringlock: tls_required")
	// ErrModeMismatch matches a *ModeMismatchError: a semaphore of another
	// slot count than the key's.
	ErrModeMismatch = errors.New("ringlock: mode_mismatch")
)

// Errors that are not a server status.
var (
	// ErrLost: the lock is no longer held (its lease expired, an operator
	// reset it, a release or extend found a newer token, or the session
	// ended). A *LostError matches it.
	ErrLost = errors.New("ringlock: lock lost")
	// ErrSessionEnded: the session's connection is gone; open a new one.
	ErrSessionEnded = errors.New("ringlock: session ended")
	// ErrInvalidArgument: refused before anything was sent (a key of 0 or
	// more than 127 bytes, a TTL outside the server's bounds, ...).
	ErrInvalidArgument = errors.New("ringlock: invalid argument")
	// ErrProtocol: the server broke the session protocol (or is not a
	// ringlockd with sessions).
	ErrProtocol = errors.New("ringlock: protocol error")
	// ErrModesUnsupported matches a *ModesUnsupportedError: a shared or
	// semaphore Acquire on a session whose server does not offer lock
	// modes; nothing was sent.
	ErrModesUnsupported = errors.New("ringlock: lock modes not offered by the server")
)

var statusSentinels = map[Status]error{
	StatusTimedOut:           ErrTimedOut,
	StatusBusy:               ErrBusy,
	StatusNotOwner:           ErrNotOwner,
	StatusStaleToken:         ErrStaleToken,
	StatusInvalid:            ErrInvalid,
	StatusLimit:              ErrLimit,
	StatusServerError:        ErrServerError,
	StatusCancelled:          ErrCancelled,
	StatusNotQueued:          ErrNotQueued,
	StatusUnauthorized:       ErrUnauthorized,
	StatusUnsupportedVersion: ErrUnsupportedVersion,
	StatusNotLeader:          ErrNotLeader,
	StatusUnknownSession:     ErrUnknownSession,
	StatusTLSRequired:        ErrTLSRequired,
	StatusModeMismatch:       ErrModeMismatch,
}

// ModeMismatchError: a semaphore Acquire of Key asked for Slots holders,
// and the key is a semaphore of another size (status mode_mismatch): its
// size is fixed by its first semaphore holder or waiter for as long as
// any holds or waits on it. Nothing changed on the server.
// errors.Is(err, ErrModeMismatch); errors.As also finds the *StatusError.
type ModeMismatchError struct {
	Key   string
	Slots uint32 // what this Acquire asked for
}

func (e *ModeMismatchError) Error() string {
	return fmt.Sprintf("ringlock: acquire %q as a semaphore of %d: mode_mismatch: the key is a semaphore of another slot count (fixed while any semaphore request holds or waits on it); nothing changed", e.Key, e.Slots)
}

// Is matches ErrModeMismatch.
func (e *ModeMismatchError) Is(target error) bool { return target == ErrModeMismatch }

// Unwrap returns the server's answer as a *StatusError.
func (e *ModeMismatchError) Unwrap() error {
	return &StatusError{Op: "acquire", Key: e.Key, Status: StatusModeMismatch}
}

// ModesUnsupportedError: a shared or semaphore Acquire of Key on a
// session whose server (Addr) does not offer lock modes: its welcome
// lacks the modes flag (a ringlockd older than lock modes, issue #33).
// Nothing was sent; an exclusive Acquire
// works. errors.Is(err, ErrModesUnsupported).
type ModesUnsupportedError struct {
	Addr   string
	Key    string
	Access Access
}

func (e *ModesUnsupportedError) Error() string {
	return fmt.Sprintf("ringlock: acquire %q (%v): the server at %s does not offer lock modes (its welcome lacks the modes flag: a ringlockd older than lock modes); nothing was sent (an exclusive Acquire works)", e.Key, e.Access, e.Addr)
}

// Is matches ErrModesUnsupported.
func (e *ModesUnsupportedError) Is(target error) bool { return target == ErrModesUnsupported }

// VersionError: the server at Addr does not speak this client's session
// protocol version (status unsupported_version). Dial returns it at once:
// no other address is tried. errors.Is(err, ErrUnsupportedVersion).
type VersionError struct {
	Addr     string
	Client   uint8   // the version this client asked for
	Versions []uint8 // the versions the server speaks, ascending
}

func (e *VersionError) Error() string {
	vs := make([]string, len(e.Versions))
	for i, v := range e.Versions {
		vs[i] = fmt.Sprint(v)
	}
	s := "s"
	if len(vs) == 1 {
		s = ""
	}
	return fmt.Sprintf("ringlock: %s refused the session: unsupported_version: this client speaks session protocol version %d, the server speaks version%s %s",
		e.Addr, e.Client, s, strings.Join(vs, ", "))
}

// Is matches ErrUnsupportedVersion.
func (e *VersionError) Is(target error) bool { return target == ErrUnsupportedVersion }

// NotLeaderError: the server at Addr answered not_leader (reserved for a
// replicated mode; today's ringlockd never sends it). Leader is the
// address it named ("host:port"), empty if none. Dial treats it like a
// failure to connect and tries Leader first, then its other addresses; a
// live session told so ends with it (Session.Err matches ErrNotLeader).
type NotLeaderError struct {
	Addr   string
	Leader string
}

func (e *NotLeaderError) Error() string {
	if e.Leader == "" {
		return fmt.Sprintf("ringlock: %s is not the leader (it named none)", e.Addr)
	}
	return fmt.Sprintf("ringlock: %s is not the leader; the leader is %s", e.Addr, e.Leader)
}

// Is matches ErrNotLeader.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// ErrUnverifiedLeader matches an *UnverifiedLeaderError.
var ErrUnverifiedLeader = errors.New("ringlock: not_leader hint not dialled: its server would not be verified")

// UnverifiedLeaderError: the server at Addr answered not_leader naming
// Leader, an address not among those given to Dial, and the connection to
// it would have carried a secret — the auth token of a Hello, or (Resume)
// the session id of a Resume — to a server nobody verified (no TLS, or a
// TLS config with InsecureSkipVerify): it was not dialled. Dial WithTLS
// (the leader's certificate is then verified against the host it names)
// or list Leader among Dial's addresses. errors.Is matches ErrNotLeader
// and ErrUnverifiedLeader.
type UnverifiedLeaderError struct {
	Addr   string
	Leader string
	Resume bool // a Resume (the session id), else a Hello (the auth token)
	TLS    bool // TLS without verification (InsecureSkipVerify), else plaintext
}

func (e *UnverifiedLeaderError) Error() string {
	what := "the Hello (and the auth token it carries)"
	if e.Resume {
		what = "the Resume (and the session id it carries)"
	}
	how := "no TLS"
	if e.TLS {
		how = "the TLS config has InsecureSkipVerify"
	}
	return fmt.Sprintf("ringlock: %s answered not_leader naming the leader %s, which is not among the addresses given to Dial: not dialled, because %s would travel to a server nobody verified (%s). Dial WithTLS (ringlock.LoadTLSConfig(certsDir, \"\"): the leader's certificate is then verified against its host), or list %s among Dial's addresses",
		e.Addr, e.Leader, what, how, e.Leader)
}

// Is matches ErrNotLeader and ErrUnverifiedLeader.
func (e *UnverifiedLeaderError) Is(target error) bool {
	return target == ErrNotLeader || target == ErrUnverifiedLeader
}

// ErrTLS matches a *TLSError.
var ErrTLS = errors.New("ringlock: TLS refused")

// TLSError: a TLS connection to Addr was refused: the server's
// certificate does not verify (another CA, issued for another host than
// the one dialled, expired), or the server refused this client's
// certificate or wanted one (--client-cert-auth). Reason says which, Err
// is the TLS error. Dial returns it at once: no other address is tried.
// errors.Is(err, ErrTLS).
type TLSError struct {
	Addr   string
	Reason string
	Err    error
}

func (e *TLSError) Error() string {
	return fmt.Sprintf("ringlock: %s: %s: %v", e.Addr, e.Reason, e.Err)
}

// Is matches ErrTLS.
func (e *TLSError) Is(target error) bool { return target == ErrTLS }

// Unwrap returns the TLS error.
func (e *TLSError) Unwrap() error { return e.Err }

// tlsRequired is the error for a session refused tls_required by addr.
func tlsRequired(addr, op string) error {
	return fmt.Errorf("ringlock: %s takes sessions over TLS only: Dial WithTLS(cfg) (ringlock.LoadTLSConfig(certsDir, \"\") reads a certs dir's ca.crt; a client NAME adds its certificate): %w", addr, &StatusError{Op: op, Status: StatusTLSRequired})
}

// endedError is Session.Err: it matches ErrSessionEnded and unwraps to
// why the session ended (so errors.Is(err, ErrNotLeader) and errors.As
// see the cause).
type endedError struct{ cause error }

func (e *endedError) Error() string { return ErrSessionEnded.Error() + ": " + e.cause.Error() }

func (e *endedError) Is(target error) bool { return target == ErrSessionEnded }

func (e *endedError) Unwrap() error { return e.cause }

// StatusError is a request the server answered with a status other than
// ok. errors.Is(err, ErrBusy) (and the other sentinels) match it by status.
type StatusError struct {
	Op     string // "hello", "acquire", "release", "extend"
	Key    string // empty for a hello
	Status Status
}

func (e *StatusError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("ringlock: %s: %s", e.Op, e.Status)
	}
	return fmt.Sprintf("ringlock: %s %q: %s", e.Op, e.Key, e.Status)
}

// Is reports whether target is the sentinel error of e's status.
func (e *StatusError) Is(target error) bool {
	s, ok := statusSentinels[e.Status]
	return ok && s == target
}

// Why a lock was lost (LostError.Reason).
const (
	// LostExpired: the server pushed that the lease's TTL passed.
	LostExpired = 1
	// LostReset: the server pushed that an operator reset the key.
	LostReset = 2
	// LostExpiredLocally: the lease's TTL passed on this side's clock
	// (counted from when the Acquire or last Extend was sent, so never
	// later than on the server).
	LostExpiredLocally = 3
	// LostStaleToken: a release or extend was answered stale_token or
	// not_owner: the key has another holder now.
	LostStaleToken = 4
	// LostSessionEnded: the session's connection closed, failed, or its
	// keep-alive went unanswered.
	LostSessionEnded = 5
	// LostNotListed: the session was resumed on a new connection (cluster
	// mode) and the server's list of its holds did not have this one: it
	// was reset, expired or released by token while the connection was
	// down.
	LostNotListed = 6
)

var lostReasons = map[int]string{
	LostExpired:        "the lease expired (pushed by the server)",
	LostReset:          "an operator reset it (pushed by the server)",
	LostExpiredLocally: "the lease's TTL passed on the client's clock",
	LostStaleToken:     "the server answered that the token is no longer the key's",
	LostSessionEnded:   "the session ended",
	LostNotListed:      "the resumed session does not list it (reset, expired or released by token while the connection was down)",
}

// LostError says why a lease's lock was lost. It matches ErrLost.
type LostError struct {
	Key    string
	Token  uint64
	Reason int    // LostExpired, LostReset, ...
	Status Status // for LostStaleToken: the answer (stale_token or not_owner)
	Cause  error  // for LostSessionEnded: why the session ended
}

func (e *LostError) Error() string {
	msg := fmt.Sprintf("ringlock: lost the lock on %q (token %d): %s", e.Key, e.Token, lostReasons[e.Reason])
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Is matches ErrLost and, for LostStaleToken, the sentinel of the status
// the server answered (ErrStaleToken or ErrNotOwner).
func (e *LostError) Is(target error) bool {
	if target == ErrLost {
		return true
	}
	s, ok := statusSentinels[e.Status]
	return e.Reason == LostStaleToken && ok && s == target
}

// Unwrap returns the cause of a session's end, if any.
func (e *LostError) Unwrap() error { return e.Cause }
