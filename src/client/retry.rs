//! Retry policy: capped exponential backoff with jitter, bounded by a
//! deadline. Pure: the schedule is a function of the attempt number and a
//! random draw, so it is unit-tested without sleeping.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A failed attempt to reach the server that the policy would retry: what
/// a retry handler ([`ClientBuilder::on_retry`](super::ClientBuilder::on_retry),
/// [`SessionBuilder::on_retry`](super::SessionBuilder::on_retry)) is told.
#[derive(Debug)]
#[non_exhaustive]
pub struct RetryEvent<'a> {
    /// The address of the failed attempt (the last one tried, when the
    /// client has several).
    pub addr: SocketAddr,
    /// Why it failed (`ConnectionRefused`: nothing listens there).
    pub error: &'a io::Error,
    /// Failed attempts in this streak so far (1 at the first).
    pub attempts: u32,
    /// The wait before the next attempt.
    pub delay: Duration,
    /// Time since the streak's first failure.
    pub elapsed: Duration,
    /// The policy's budget for the streak ([`RetryPolicy::max_elapsed`]).
    pub budget: Duration,
    /// This call reached the server before (a connection broke and is
    /// being replaced), as opposed to never having reached it.
    pub reconnecting: bool,
}

/// A retry handler: called before each wait for another attempt; `false`
/// gives up at once (the call fails with `Unavailable` and this attempt's
/// error).
#[derive(Clone)]
pub(crate) struct OnRetry(pub(crate) Arc<dyn Fn(&RetryEvent<'_>) -> bool + Send + Sync>);

impl fmt::Debug for OnRetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnRetry(..)")
    }
}

/// How the client retries when it cannot reach the server.
///
/// Only failures that provably had no effect on the server are retried:
/// connecting, writing a request frame that never completed, and a lock
/// connection that closed before any answer. The delay before retry `n`
/// (counting from 0) is drawn uniformly from `[cap/2, cap]` with
/// `cap = min(max_backoff, initial_backoff * 2^n)` ("equal jitter": the
/// delay keeps growing while clients that failed together spread out).
/// A streak of failures gives up, with [`Error::Unavailable`](super::Error),
/// once `max_elapsed` has passed since its first failure. There is no
/// infinite retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Cap of the first delay.
    pub initial_backoff: Duration,
    /// Largest cap any delay may have.
    pub max_backoff: Duration,
    /// How long one streak of failures may last before giving up. Zero means
    /// a single attempt.
    pub max_elapsed: Duration,
}

impl Default for RetryPolicy {
    /// 50 ms first delay, doubling up to 2 s, giving up after 10 s.
    fn default() -> Self {
        RetryPolicy {
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            max_elapsed: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// A policy that makes exactly one attempt.
    pub fn none() -> Self {
        RetryPolicy {
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
            max_elapsed: Duration::ZERO,
        }
    }

    /// The delay before retry number `retry` (0-based), given a uniform
    /// random `draw`.
    pub(crate) fn delay(&self, retry: u32, draw: u64) -> Duration {
        let doubling = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
        let cap = self
            .initial_backoff
            .saturating_mul(doubling)
            .min(self.max_backoff);
        let half_ns = (cap.as_nanos() / 2) as u64;
        let spread_ns = (cap.as_nanos() as u64).saturating_sub(half_ns);
        let jitter_ns = if spread_ns == 0 {
            0
        } else {
            draw % (spread_ns + 1)
        };
        Duration::from_nanos(half_ns + jitter_ns)
    }
}

/// One streak of failures under a policy.
pub(crate) struct Streak {
    policy: RetryPolicy,
    started: Option<Instant>,
    pub(crate) attempts: u32,
    /// A connection of this call succeeded before ([`RetryEvent::reconnecting`]).
    pub(crate) connected: bool,
    rng: u64,
}

impl Streak {
    pub(crate) fn new(policy: RetryPolicy) -> Self {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(0x9e37_79b9_7f4a_7c15);
        Streak {
            policy,
            started: None,
            attempts: 0,
            connected: false,
            rng: h.finish() | 1,
        }
    }

    /// Forget earlier failures (the connection proved itself healthy).
    pub(crate) fn reset(&mut self) {
        self.started = None;
        self.attempts = 0;
    }

    /// Records a failed attempt at `now`. Returns how long to wait before
    /// the next one, or `None` when the streak must give up: its budget is
    /// spent, or waiting would cross `hard_deadline` (the caller's own).
    pub(crate) fn failed(
        &mut self,
        now: Instant,
        hard_deadline: Option<Instant>,
    ) -> Option<Duration> {
        let started = *self.started.get_or_insert(now);
        self.attempts += 1;
        let draw = self.next_draw();
        let delay = self.policy.delay(self.attempts - 1, draw);
        let wake = now + delay;
        if self.policy.max_elapsed.is_zero()
            || wake.saturating_duration_since(started) > self.policy.max_elapsed
        {
            return None;
        }
        if hard_deadline.is_some_and(|d| wake >= d) {
            return None;
        }
        Some(delay)
    }

    /// [`failed`](Self::failed), then the handler (if any) is asked:
    /// `None` when the streak gives up either way.
    pub(crate) fn failed_and_asked(
        &mut self,
        now: Instant,
        hard_deadline: Option<Instant>,
        addr: SocketAddr,
        error: &io::Error,
        handler: Option<&OnRetry>,
    ) -> Option<Duration> {
        let delay = self.failed(now, hard_deadline)?;
        let Some(OnRetry(h)) = handler else {
            return Some(delay);
        };
        let event = RetryEvent {
            addr,
            error,
            attempts: self.attempts,
            delay,
            elapsed: self
                .started
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s)),
            budget: self.policy.max_elapsed,
            reconnecting: self.connected,
        };
        h(&event).then_some(delay)
    }

    fn next_draw(&mut self) -> u64 {
        // xorshift64*: plenty for jitter, and std-only.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn delay_doubles_caps_and_jitters_within_half() {
        let p = RetryPolicy {
            initial_backoff: ms(100),
            max_backoff: ms(1000),
            max_elapsed: ms(60_000),
        };
        let caps = [100, 200, 400, 800, 1000, 1000, 1000];
        for (retry, cap) in caps.iter().enumerate() {
            let cap = ms(*cap);
            assert_eq!(p.delay(retry as u32, 0), cap / 2);
            assert_eq!(p.delay(retry as u32, cap.as_nanos() as u64 / 2), cap);
            for draw in [1u64, 7, 1 << 40, 12345678901] {
                let d = p.delay(retry as u32, draw);
                assert!(d >= cap / 2 && d <= cap, "retry {retry}: {d:?}");
            }
        }
        // Huge retry counts do not overflow.
        assert!(p.delay(u32::MAX, 3) <= ms(1000));
        assert_eq!(RetryPolicy::none().delay(5, 99), Duration::ZERO);
    }

    #[test]
    fn the_handler_is_told_each_retry_and_may_give_up() {
        use std::sync::Mutex;
        let p = RetryPolicy {
            initial_backoff: ms(10),
            max_backoff: ms(40),
            max_elapsed: ms(200),
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let handler = OnRetry(Arc::new(move |ev: &RetryEvent<'_>| {
            log.lock()
                .unwrap()
                .push((ev.attempts, ev.elapsed, ev.budget, ev.reconnecting));
            ev.attempts < 2
        }));
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let err = io::Error::from(io::ErrorKind::ConnectionRefused);
        let t0 = Instant::now();
        let mut s = Streak::new(p);
        let d = s.failed_and_asked(t0, None, addr, &err, Some(&handler));
        assert!(d.is_some_and(|d| d <= ms(10)));
        s.connected = true;
        assert_eq!(
            s.failed_and_asked(t0 + ms(10), None, addr, &err, Some(&handler)),
            None,
            "the handler gave up"
        );
        assert_eq!(
            *seen.lock().unwrap(),
            [(1, ms(0), ms(200), false), (2, ms(10), ms(200), true)]
        );
        // Without a handler, or when the policy gives up first, it is not asked.
        let mut s = Streak::new(RetryPolicy::none());
        assert_eq!(
            s.failed_and_asked(t0, None, addr, &err, Some(&handler)),
            None
        );
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[test]
    fn streak_gives_up_at_budget_and_deadline() {
        let p = RetryPolicy {
            initial_backoff: ms(10),
            max_backoff: ms(40),
            max_elapsed: ms(200),
        };
        let t0 = Instant::now();
        let mut s = Streak::new(p);
        let mut now = t0;
        let mut retries = 0;
        while let Some(d) = s.failed(now, None) {
            assert!(d <= ms(40));
            now += d;
            retries += 1;
            assert!(retries < 100, "must give up");
        }
        assert!(now - t0 <= ms(200));
        assert!(retries >= 5, "200 ms budget with <=40 ms delays: {retries}");

        let mut s = Streak::new(p);
        assert_eq!(s.failed(t0, Some(t0 + ms(1))), None);
        assert_eq!(s.attempts, 1);

        let mut s = Streak::new(RetryPolicy::none());
        assert_eq!(s.failed(t0, None), None, "none() makes one attempt");

        let mut s = Streak::new(p);
        s.failed(t0, None).unwrap();
        s.reset();
        assert_eq!(s.attempts, 0);
        assert!(
            s.failed(t0 + ms(10_000), None).is_some(),
            "reset starts a new budget"
        );
    }
}
