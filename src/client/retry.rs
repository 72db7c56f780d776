//! Retry policy: capped exponential backoff with jitter, bounded by a
//! deadline. Pure: the schedule is a function of the attempt number and a
//! random draw, so it is unit-tested without sleeping.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

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
