//! Pull or compute: a plain decision over measured speeds, called before a
//! generation whose prefix a peer holds, and again after every chunk for the rest.

use std::time::Duration;

/// What a link to one peer has been measured to carry (or is assumed to, unmeasured).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Payload bytes per second over a whole pull.
    pub bytes_per_sec: f64,
    /// One chunk's round trip on an idle link.
    pub rtt: Duration,
}

impl Link {
    /// What an unmeasured link is assumed to be: a gigabit LAN (about 110 MB/s of
    /// payload) one millisecond away. The first chunk measures the real one.
    pub const ASSUMED: Link = Link {
        bytes_per_sec: 110e6,
        rtt: Duration::from_millis(1),
    };

    /// Folds a new measurement in (each pull weighs a quarter).
    pub fn observe(self, bytes_per_sec: f64, rtt: Duration) -> Link {
        if !(bytes_per_sec.is_finite() && bytes_per_sec > 0.0) {
            return self;
        }
        Link {
            bytes_per_sec: 0.75 * self.bytes_per_sec + 0.25 * bytes_per_sec,
            rtt: self.rtt.mul_f64(0.75) + rtt.mul_f64(0.25),
        }
    }
}

/// What one decision weighs.
#[derive(Debug, Clone, Copy)]
pub struct PullCase {
    /// Tokens a peer holds that this worker would otherwise compute.
    pub tokens: usize,
    /// KV bytes per token ([`switchyard_messages::KvFormat::token_bytes`]).
    pub token_bytes: usize,
    /// Chunks the transfer takes, and how many are in flight at once.
    pub chunks: usize,
    pub window: usize,
    /// This worker's prefill rate, uncached tokens per second (0: not measured).
    pub prefill_tps: f64,
}

/// The predicted seconds to move `case`'s KV over `link`.
pub fn transfer_secs(case: &PullCase, link: Link) -> f64 {
    let rounds = case.chunks.div_ceil(case.window.max(1)) as f64;
    rounds * link.rtt.as_secs_f64() + (case.tokens * case.token_bytes) as f64 / link.bytes_per_sec
}

/// Whether pulling `case` over `link` beats computing it: by at least a fifth (a
/// pull also copies the blocks in, and a prediction can be off). Unmeasured prefill
/// speed: pull (it fails over to computing anyway).
pub fn should_pull(case: &PullCase, link: Link) -> bool {
    if case.tokens == 0 {
        return false;
    }
    if !(case.prefill_tps.is_finite() && case.prefill_tps > 0.0) {
        return true;
    }
    let compute = case.tokens as f64 / case.prefill_tps;
    transfer_secs(case, link) * 1.2 < compute
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(tokens: usize, prefill_tps: f64) -> PullCase {
        PullCase {
            tokens,
            token_bytes: 23_040, // SmolLM2-135M: 30 layers × 3 KV heads × 64 × f16 × (K, V)
            chunks: tokens.div_ceil(32),
            window: 4,
            prefill_tps,
        }
    }

    #[test]
    fn a_lan_beats_a_cpu_prefill_and_a_slow_link_does_not() {
        // 1,500 tokens = 34.6 MB: ~0.33 s on a gigabit LAN, against 1.9 s of prefill
        // at 800 tokens/s.
        let c = case(1500, 800.0);
        assert!((transfer_secs(&c, Link::ASSUMED) - 0.326).abs() < 0.01);
        assert!(should_pull(&c, Link::ASSUMED));
        // A 10 Mbit/s link (1.25 MB/s): 28 s; computing wins.
        let slow = Link {
            bytes_per_sec: 1.25e6,
            rtt: Duration::from_millis(40),
        };
        assert!(!should_pull(&c, slow));
        // A GPU prefilling 20,000 tokens/s computes 1,500 in 75 ms: faster than the LAN.
        assert!(!should_pull(&case(1500, 20_000.0), Link::ASSUMED));
    }

    #[test]
    fn nothing_to_gain_is_never_pulled_and_unmeasured_prefill_is() {
        assert!(!should_pull(&case(0, 800.0), Link::ASSUMED));
        assert!(should_pull(&case(64, 0.0), Link::ASSUMED));
        assert!(should_pull(&case(64, f64::NAN), Link::ASSUMED));
    }

    #[test]
    fn round_trips_count_per_window_of_chunks() {
        let far = Link {
            bytes_per_sec: f64::INFINITY,
            rtt: Duration::from_millis(100),
        };
        let c = PullCase {
            chunks: 9,
            window: 4,
            ..case(288, 800.0)
        };
        assert!(
            (transfer_secs(&c, far) - 0.3).abs() < 1e-9,
            "3 rounds of 4, 4, 1 chunks"
        );
    }

    #[test]
    fn measurements_move_the_estimate_a_quarter_at_a_time() {
        let l = Link::ASSUMED.observe(10e6, Duration::from_millis(5));
        assert!((l.bytes_per_sec - 85e6).abs() < 1.0);
        assert_eq!(l.rtt, Duration::from_millis(2));
        assert_eq!(Link::ASSUMED.observe(f64::NAN, Duration::ZERO), Link::ASSUMED);
    }
}
