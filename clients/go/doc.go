// Package ringlock is a client of ringlockd's session protocol: locks that
// free themselves when their holder dies, leases with a TTL, fencing
// tokens, and a channel that closes the moment a lock is lost.
//
// A Session is one TCP connection to ringlockd's lock port (default port
// 22119), opened with Dial. It is safe for concurrent use: every request
// carries a request id, one goroutine reads and demultiplexes every answer,
// and another sends the keep-alive Pings. Acquire (and TryLock) returns a
// *Lease with the grant's fencing token (Token), a Lost channel, and
// Release, which is safe to call more than once.
//
// A replicated session of a cluster (Session.Resumable) survives the loss
// of its connection: within its keep-alive it resumes on the addresses
// given to Dial, keeping the holds the server still lists (see Session).
//
//	s, err := ringlock.Dial(ctx, []string{"10.0.0.5", "10.0.0.6:22119"},
//		ringlock.WithSource("billing-worker"))
//	if err != nil {
//		return err
//	}
//	defer s.Close()
//	lease, err := s.Acquire(ctx, "nightly/reconcile", ringlock.WithWait(10*time.Second))
//	if errors.Is(err, ringlock.ErrTimedOut) {
//		return nil // someone else is on it
//	} else if err != nil {
//		return err
//	}
//	defer lease.Release(context.Background())
//	select {
//	case <-lease.Lost():
//		return lease.Err()
//	case res := <-work(lease.Token()): // fence the writes with the token
//		return res
//	}
//
// # TLS
//
// WithTLS makes every connection speak TLS (LoadTLSConfig reads a certs
// dir made by `ringlock cert`): the server's certificate is verified
// against the config's RootCAs and the host of each address dialled, a
// not_leader hint included. A certificate that does not verify is a
// *TLSError; plaintext to a server that takes sessions over TLS only is
// ErrTLSRequired. Without verified TLS, an auth token or a session id is
// never sent to a not_leader hint that is not among Dial's addresses
// (*UnverifiedLeaderError).
//
// # Holds
//
// A session hold (the default) is freed by the server the moment the
// session ends. A lease (WithTTL) is freed when its TTL passes without an
// Extend, even while the session lives; WithAutoExtend extends it every
// third of its TTL in the background. A persistent hold (Persistent) has
// Locking-Center semantics.
//
// # Lock modes
//
// WithAccess asks for a lock as Exclusive (the default), Shared (a reader
// lock: any number of shared holders at once) or Semaphore(n) (at most n
// holders); LockShared, TryLockShared, Permit and TryPermit are the short
// forms, and Lease.Access tells how a lease holds its key. Every key has
// one FIFO queue: a waiting exclusive request is never overtaken by shared
// requests that came after it. A semaphore's n is fixed while anyone holds
// or waits on it: another n is a *ModeMismatchError. Shared and semaphore
// requests need a server that offers them (Session.Modes: every ringlockd
// since lock modes); to an older one Acquire returns a
// *ModesUnsupportedError and sends nothing.
//
// # Elections
//
// Session.Election names an election: Election.Campaign waits until this
// session leads (candidates are elected in the order they campaigned)
// and returns a *Leadership with its fencing Token, Proclaim (a new value
// observers see, the same token) and Resign; Election.Observe returns an
// *Observer whose Next gives every change of the leader. A leader whose
// session ends is replaced by the next candidate at once. Proclaim needs a
// server that offers it (Session.Proclaims); to an older one it returns a
// *ProclaimUnsupportedError and sends nothing.
//
// # Cancellation
//
// The context passed to Acquire cancels the wait exactly: the client sends
// a Cancel, the server answers the Acquire either cancelled or with its
// grant, and a grant that won the race is released before Acquire returns
// ctx.Err(). A caller whose context ended never holds the key. The
// server-side bound of WithWait is the alternative that never races: the
// answer is a grant or ErrTimedOut.
//
// # Errors
//
// A refusal by the server is a *StatusError whose Status names the
// protocol's status ("busy", "timed_out", "stale_token", ...); it matches
// the sentinel of its status with errors.Is (ErrBusy, ErrTimedOut,
// ErrStaleToken, ErrUnauthorized, ErrTLSRequired, ErrModeMismatch, ...). A lost lock is a *LostError
// (ErrLost); an ended session ErrSessionEnded; bad arguments, refused
// before anything is sent, ErrInvalidArgument.
package ringlock
