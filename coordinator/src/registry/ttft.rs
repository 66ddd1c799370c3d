//! Predicted time to first token: what `coordinator.routing = "ttft"` minimises.
//!
//! For a worker with `capacity` slots and `load` requests in them or waiting for one
//! (its heartbeat's `in_flight` + `queued`, plus the requests routed to it since), its
//! measured prefill speed and slot time (the heartbeat's `speed`), and `warm` leading
//! blocks of the request's prefix:
//!
//! ```text
//! wait    = max(0, load + 1 − capacity) × service_ms ÷ capacity
//! prefill = (prompt bytes − warm × 256) ÷ BYTES_PER_TOKEN ÷ prefill_tps
//! TTFT    = wait + prefill
//! ```
//!
//! A request that finds a free slot starts at once; one that queues waits for a slot
//! to free, and the worker's slots free one every `service_ms ÷ capacity` on average.
//! Seconds, not blocks: a warm prefix on a slow device can lose to a cold prompt on a
//! fast one, and a queue is worth what it costs on that worker.

use switchyard_messages::kv::BLOCK_BYTES;
use switchyard_messages::WorkerSpeed;

/// Prompt bytes per token: the coordinator has no tokenizer, and ~4 bytes a token is
/// typical of BPE vocabularies on English text. It scales every worker's prefill term
/// alike, so it only weighs prefill against queueing.
pub const BYTES_PER_TOKEN: f64 = 4.0;

/// The rate a pull from a peer is predicted at: a gigabit LAN's payload (the worker
/// measures its real links and decides for itself; the coordinator only ranks).
pub const PULL_BYTES_PER_SEC: f64 = 110e6;

/// Predicted ms to pull one routing block's KV (about `BLOCK_BYTES / BYTES_PER_TOKEN`
/// tokens of `token_bytes` each).
pub fn pull_ms_per_block(token_bytes: usize) -> f64 {
    (switchyard_messages::kv::BLOCK_BYTES as f64 / BYTES_PER_TOKEN) * token_bytes as f64 / PULL_BYTES_PER_SEC * 1e3
}

/// The speeds a prediction uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Speed {
    /// Prompt tokens per second of prefill.
    pub prefill_tps: f64,
    /// Milliseconds a request holds a slot.
    pub service_ms: f64,
}

impl From<WorkerSpeed> for Speed {
    fn from(s: WorkerSpeed) -> Self {
        Self {
            prefill_tps: s.prefill_tps,
            service_ms: s.service_ms,
        }
    }
}

impl Speed {
    /// The median of each figure over `speeds` (a stand-in for workers that have not
    /// measured theirs yet); `None` when there are none.
    pub fn median(speeds: impl Iterator<Item = Speed>) -> Option<Speed> {
        let (mut p, mut s): (Vec<f64>, Vec<f64>) = speeds.map(|x| (x.prefill_tps, x.service_ms)).unzip();
        if p.is_empty() {
            return None;
        }
        let mid = p.len() / 2;
        p.select_nth_unstable_by(mid, f64::total_cmp);
        s.select_nth_unstable_by(mid, f64::total_cmp);
        Some(Speed {
            prefill_tps: p[mid],
            service_ms: s[mid],
        })
    }
}

/// A worker's speed as the two rates a prediction multiplies by (computed once per
/// heartbeat, so a decision over many workers does no division).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cost {
    /// Milliseconds of prefill per uncached prompt byte.
    pub ms_per_byte: f64,
    /// Milliseconds between slots freeing up: slot time ÷ slots.
    pub slot_ms: f64,
}

impl Cost {
    /// The rates of a worker with `speed` and `capacity` slots.
    pub fn of(speed: Speed, capacity: u32) -> Self {
        Self {
            ms_per_byte: 1e3 / (BYTES_PER_TOKEN * speed.prefill_tps.max(1e-3)),
            slot_ms: speed.service_ms.max(0.0) / f64::from(capacity.max(1)),
        }
    }

    /// Predicted time to first token, milliseconds.
    pub fn predict_ms(&self, prompt_bytes: usize, warm_blocks: usize, load: u32, capacity: u32) -> f64 {
        let ahead = (load + 1).saturating_sub(capacity.max(1));
        let uncached = prompt_bytes.saturating_sub(warm_blocks * BLOCK_BYTES);
        f64::from(ahead) * self.slot_ms + uncached as f64 * self.ms_per_byte
    }
}

/// Predicted time to first token, milliseconds.
pub fn predict_ms(prompt_bytes: usize, warm_blocks: usize, load: u32, capacity: u32, speed: Speed) -> f64 {
    Cost::of(speed, capacity).predict_ms(prompt_bytes, warm_blocks, load, capacity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_slots_cost_nothing_queues_cost_slot_time() {
        let s = Speed {
            prefill_tps: 1000.0,
            service_ms: 400.0,
        };
        // 4,000 bytes = 1,000 tokens = 1 s of prefill; 10 warm blocks take 2,560 bytes off.
        assert_eq!(predict_ms(4000, 0, 0, 2, s), 1000.0);
        assert_eq!(predict_ms(4000, 10, 1, 2, s), 360.0);
        // Full (2 of 2): one slot frees every 200 ms on average.
        assert_eq!(predict_ms(4000, 10, 2, 2, s), 560.0);
        assert_eq!(predict_ms(4000, 10, 4, 2, s), 960.0);
        let m = Speed::median(
            [
                s,
                Speed {
                    prefill_tps: 10.0,
                    service_ms: 1.0,
                },
                s,
            ]
            .into_iter(),
        )
        .unwrap();
        assert_eq!(m, s);
        assert_eq!(Speed::median(std::iter::empty()), None);
    }
}
