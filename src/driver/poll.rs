//! How long an idle loop polls its ring before it sleeps: an adaptive
//! window, as KVM's halt polling adapts its own.
//!
//! Polling pays when the next event comes soon (a connection-per-request
//! client's accept, receive and close follow each other within
//! microseconds), and only burns CPU when it comes late (a client at a low
//! fixed rate). So the window follows what the last sleep would have
//! needed: a sleep that ended within the largest window (`--idle-poll-us`)
//! means a longer poll would have caught its event, and the window grows
//! (doubling from [`GROW_START_US`]); a sleep longer than that means the
//! poll was wasted, and it shrinks (halving, to 0 below the start). A poll
//! that caught its event keeps the window as it is. Pure: the driver tells
//! it what happened and asks for the window.

/// First non-zero window, µs (KVM's `halt_poll_ns_grow_start` is 10 µs).
pub const GROW_START_US: u64 = 10;

#[derive(Clone, Copy, Debug)]
pub struct PollWindow {
    max_us: u64,
    cur_us: u64,
}

impl PollWindow {
    /// A window of at most `max_us` (0: never poll), starting at the most.
    pub fn new(max_us: u64) -> PollWindow {
        PollWindow {
            max_us,
            cur_us: max_us,
        }
    }

    /// How long to poll before the next sleep.
    pub fn window_us(&self) -> u64 {
        self.cur_us
    }

    /// The loop slept for `slept_us` after its poll came back empty (or it
    /// did not poll); the time until the event that woke it, or until the
    /// sleep's timeout.
    pub fn slept(&mut self, slept_us: u64) {
        if self.max_us == 0 {
            return;
        }
        if slept_us <= self.max_us {
            // A poll this long would have caught it.
            self.cur_us = (self.cur_us * 2).clamp(GROW_START_US.min(self.max_us), self.max_us);
        } else {
            self.cur_us /= 2;
            if self.cur_us < GROW_START_US.min(self.max_us) {
                self.cur_us = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_events_shrink_the_window_to_nothing_and_early_ones_grow_it_back() {
        let mut w = PollWindow::new(50);
        assert_eq!(w.window_us(), 50);
        // A client at a low fixed rate: every sleep lasts a millisecond.
        let shrinking: Vec<u64> = (0..4)
            .map(|_| {
                w.slept(1_000);
                w.window_us()
            })
            .collect();
        assert_eq!(shrinking, [25, 12, 0, 0]);
        // Events that come within the largest window grow it again.
        let growing: Vec<u64> = (0..4)
            .map(|_| {
                w.slept(30);
                w.window_us()
            })
            .collect();
        assert_eq!(growing, [10, 20, 40, 50]);
    }

    #[test]
    fn off_stays_off_and_a_small_maximum_is_respected() {
        let mut off = PollWindow::new(0);
        off.slept(1);
        assert_eq!(off.window_us(), 0);
        let mut small = PollWindow::new(4);
        small.slept(10_000);
        assert_eq!(small.window_us(), 0);
        small.slept(2);
        assert_eq!(small.window_us(), 4);
    }
}
