//! The restart policy every supervised child shares (a `rocm`/`cuda` worker's llama-server,
//! a `metal` worker's MLX bridge): the first restart waits [`FIRST`], each crash
//! after a short run doubles the wait up to [`MAX`], and a child that stayed up
//! [`STABLE_AFTER`] starts again from [`FIRST`].

use std::time::Duration;

/// First restart delay.
pub const FIRST: Duration = Duration::from_millis(500);
/// The longest delay between restarts.
pub const MAX: Duration = Duration::from_secs(30);
/// A child that ran this long resets the delay.
pub const STABLE_AFTER: Duration = Duration::from_secs(60);

/// Restart delays for one child.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: FIRST }
    }
}

impl Backoff {
    /// The child exited after running `ran`: how long to wait before the next start.
    pub fn after_exit(&mut self, ran: Duration) -> Duration {
        if ran > STABLE_AFTER {
            self.next = FIRST;
        }
        let wait = self.next;
        self.next = (self.next * 2).min(MAX);
        wait
    }

    /// A start failed (the child never ran): how long to wait before trying again.
    pub fn after_failed_start(&mut self) -> Duration {
        self.after_exit(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets_after_a_stable_run() {
        let mut b = Backoff::default();
        let short = Duration::from_secs(1);
        let waits: Vec<_> = (0..8).map(|_| b.after_exit(short).as_millis()).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        assert_eq!(b.after_exit(STABLE_AFTER + short), FIRST);
        assert_eq!(b.after_failed_start(), FIRST * 2);
    }
}
