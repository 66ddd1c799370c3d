//! A worker's recent request latencies and KV hit ratio, for heartbeats and
//! `switchyard status`.

use std::collections::VecDeque;
use switchyard_messages::{GenerateMetrics, RecentLatency, WorkerSpeed};

/// How many finished requests the medians cover.
pub const WINDOW: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Sample {
    ttft_ms: f64,
    /// `None` for a request with fewer than two tokens.
    tpot_ms: Option<f64>,
    prompt: u32,
    cached: u32,
    /// Uncached prompt tokens per second of prefill; `None` for a prefill too short to
    /// tell a rate from its fixed costs.
    prefill_tps: Option<f64>,
    /// Prefill + decode, milliseconds: how long the request held its slot.
    service_ms: f64,
    /// Speculative decoding's drafted and kept tokens.
    drafted: u32,
    accepted: u32,
}

/// Fewest computed prompt tokens a prefill rate is taken from.
const MIN_PREFILL_TOKENS: u32 = 16;

/// The last [`WINDOW`] finished generations.
#[derive(Debug, Default)]
pub struct Recent {
    samples: VecDeque<Sample>,
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

impl Recent {
    /// A generation finished with `m`.
    pub fn record(&mut self, m: &GenerateMetrics) {
        let tpot_ms = (m.generated_tokens > 1).then(|| m.decode_us as f64 / 1e3 / f64::from(m.generated_tokens - 1));
        self.samples.push_back(Sample {
            ttft_ms: (m.queue_us + m.prefill_us) as f64 / 1e3,
            tpot_ms,
            prompt: m.prompt_tokens,
            cached: m.cached_tokens,
            prefill_tps: {
                let computed = m.prompt_tokens.saturating_sub(m.cached_tokens);
                (computed >= MIN_PREFILL_TOKENS && m.prefill_us > 0)
                    .then(|| f64::from(computed) / (m.prefill_us as f64 / 1e6))
            },
            service_ms: (m.prefill_us + m.decode_us) as f64 / 1e3,
            drafted: m.draft_tokens,
            accepted: m.accepted_tokens,
        });
        while self.samples.len() > WINDOW {
            self.samples.pop_front();
        }
    }

    /// Medians of time to first token and time per output token.
    pub fn latency(&self) -> RecentLatency {
        RecentLatency {
            requests: self.samples.len() as u32,
            ttft_ms: median(self.samples.iter().map(|s| s.ttft_ms).collect()),
            tpot_ms: median(self.samples.iter().filter_map(|s| s.tpot_ms).collect()),
            draft_tokens: self.samples.iter().map(|s| u64::from(s.drafted)).sum(),
            accepted_tokens: self.samples.iter().map(|s| u64::from(s.accepted)).sum(),
        }
    }

    /// Medians of the prefill rate and the time a request holds its slot, for
    /// routing by predicted time to first token (zero when nothing was measured).
    pub fn speed(&self) -> WorkerSpeed {
        let rates: Vec<f64> = self.samples.iter().filter_map(|s| s.prefill_tps).collect();
        if rates.is_empty() {
            return WorkerSpeed::default();
        }
        WorkerSpeed {
            requests: rates.len() as u32,
            prefill_tps: median(rates),
            service_ms: median(self.samples.iter().map(|s| s.service_ms).collect()),
        }
    }

    /// Prompt tokens served from KV / prompt tokens.
    pub fn hit_ratio(&self) -> f64 {
        let prompt: u64 = self.samples.iter().map(|s| u64::from(s.prompt)).sum();
        let cached: u64 = self.samples.iter().map(|s| u64::from(s.cached)).sum();
        if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_hit_ratio_over_a_sliding_window() {
        let mut r = Recent::default();
        assert_eq!(r.latency(), RecentLatency::default());
        for i in 0..(WINDOW as u64 + 10) {
            r.record(&GenerateMetrics {
                queue_us: 1_000,
                prefill_us: 1_000 * i,
                decode_us: 10_000,
                generated_tokens: 11,
                prompt_tokens: 100,
                cached_tokens: 50,
                draft_tokens: 4,
                accepted_tokens: 3,
                ..Default::default()
            });
        }
        let l = r.latency();
        assert_eq!(l.requests, WINDOW as u32);
        assert_eq!(
            (l.draft_tokens, l.accepted_tokens),
            (4 * WINDOW as u64, 3 * WINDOW as u64)
        );
        // TTFTs are 1 + i ms for i = 10..74: the median is the 33rd of 64.
        assert_eq!(l.ttft_ms, 1.0 + 10.0 + 32.0);
        assert_eq!(l.tpot_ms, 1.0);
        assert_eq!(r.hit_ratio(), 0.5);
    }

    #[test]
    fn speed_from_prefills_long_enough_to_tell() {
        let mut r = Recent::default();
        assert!(!r.speed().measured());
        // A prefill of 2 computed tokens says nothing about the rate.
        r.record(&GenerateMetrics {
            prefill_us: 5_000,
            decode_us: 5_000,
            prompt_tokens: 10,
            cached_tokens: 8,
            ..Default::default()
        });
        assert!(!r.speed().measured());
        for (tokens, us) in [(100u32, 200_000u64), (200, 200_000), (400, 200_000)] {
            r.record(&GenerateMetrics {
                prefill_us: us,
                decode_us: 800_000,
                prompt_tokens: tokens + 20,
                cached_tokens: 20,
                ..Default::default()
            });
        }
        let s = r.speed();
        assert!(s.measured(), "{s:?}");
        assert_eq!(s.requests, 3);
        assert_eq!(s.prefill_tps, 1_000.0); // 500, 1000, 2000 tok/s
        assert_eq!(s.service_ms, 1_000.0); // 10 ms once, 1,000 ms three times
    }
}
