//! What a routing decision reads of each worker, kept dense: one small `Copy` record
//! per registry slot, refreshed on its heartbeats, routes and KV changes, so a
//! decision over 1,000 workers scans ~64 KB in one pass instead of chasing each
//! worker's status, model names and block set through the heap.

use super::ttft::{self, Cost, Speed};

/// What one request to wait behind costs under the block score, in warm prefix blocks
/// (4 × 256 bytes, about 250 tokens of prefill).
pub const WAIT_BLOCKS: i64 = 4;

/// One worker, as routing sees it (48 bytes).
#[derive(Debug, Clone, Copy, Default)]
pub struct Brief {
    /// A heartbeat came (the slot is a live worker, not only a KV index).
    pub live: bool,
    /// Available and not draining.
    pub routable: bool,
    /// It serves a model interned past 64: check its status.
    pub more_models: bool,
    /// (1.8) It serves an embedding-only model: a generation must check which.
    pub encoders: bool,
    /// (1.12) A `prefill` worker: it computes prompts for decode workers and takes
    /// only requests pinned to it.
    pub prefill_only: bool,
    /// Backend preference ([`switchyard_messages::BackendKind::rank`]).
    pub rank: u8,
    /// Slots.
    pub capacity: u32,
    /// Bit `i`: it serves interned model `i` (the first 64 model names).
    pub models: u64,
    /// Slots + queue.
    pub limit: u32,
    /// In flight + queued (its heartbeat) + routed here since.
    pub load: u32,
    /// Blocks it holds warm.
    pub held: u32,
    /// Its measured prefill cost, ms per uncached prompt byte (0: not measured).
    pub ms_per_byte: f32,
    /// Its measured slot time ÷ its slots, ms.
    pub slot_ms: f32,
    /// The first 8 bytes of its id, big-endian: ties are broken by id, and this
    /// settles most of them without reading the id.
    pub id_prefix: u64,
    /// The blocks of the last prefix routed here, one bit each ([`block_bit`]); 0 when
    /// none was. A request shares at most as many leading blocks with that prefix as
    /// it has leading blocks whose bits are all here: an upper bound read without
    /// touching the prefix itself.
    pub pending_bits: u64,
    /// Blocks in that prefix.
    pub pending_len: u16,
    /// Its measured round trip from this coordinator, ms (a moving average of
    /// admission exchanges and probes; 0 = not measured yet).
    pub rtt_ms: f32,
    /// Joined (or came back after its heartbeats stopped) and not yet answered a probe
    /// or a forward: routed to only after every answering worker.
    pub probation: bool,
    /// (1.11) Its KV format, interned (0: it exchanges no KV): workers of one group
    /// can pull each other's prefixes.
    pub kv_group: u16,
    /// Predicted ms to pull one routing block's KV from a peer (its KV bytes over an
    /// assumed LAN, [`ttft::PULL_BYTES_PER_SEC`]).
    pub pull_ms_per_block: f32,
}

/// A block's bit in a 64-bit signature.
pub fn block_bit(block: u64) -> u64 {
    1 << ((block ^ (block >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58)
}

/// For each `i`, the bits of `blocks[..=i]`.
pub fn leading_bits(blocks: &[u64]) -> Vec<u64> {
    let mut acc = 0;
    blocks
        .iter()
        .map(|&b| {
            acc |= block_bit(b);
            acc
        })
        .collect()
}

/// The first 8 bytes of `id`, zero-padded, as a big-endian number: ordered like `id`
/// wherever they differ.
pub fn id_prefix(id: &str) -> u64 {
    let mut b = [0u8; 8];
    let n = id.len().min(8);
    b[..n].copy_from_slice(&id.as_bytes()[..n]);
    u64::from_be_bytes(b)
}

/// Round trips up to this count as next door in predicted TTFT, ms.
const NEAR_MS: f64 = 5.0;

/// A candidate's sort key packed into one integer, smaller first (ties: smaller id).
/// `blocks`: saturated (1 bit) | on probation (1) | backend rank (7) | −score, biased
/// (32) | round trip in 50 ms steps (16) | load (32) | blocks held (38). `ttft`: saturated (1) | on probation (1) |
/// predicted µs, round trip included (47) | backend rank (7) | load (32) | blocks held
/// (40).
fn pack(fields: &[(u64, u32)]) -> u128 {
    fields.iter().fold(0u128, |acc, &(v, bits)| {
        let max = (1u128 << bits) - 1;
        (acc << bits) | u128::from(v).min(max)
    })
}

/// An i64 as an order-preserving u32 (clamped).
fn biased(v: i64) -> u64 {
    (v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) - i64::from(i32::MIN)) as u64
}

impl Brief {
    /// Notes a measured speed (or none).
    pub fn set_speed(&mut self, speed: Option<Speed>) {
        let cost = speed.map(|s| Cost::of(s, self.capacity)).unwrap_or_default();
        (self.ms_per_byte, self.slot_ms) = (cost.ms_per_byte as f32, cost.slot_ms as f32);
    }

    /// Notes a measured round trip: a moving average (a fifth of each new sample), the
    /// first one taken as is; it ends the probation.
    pub fn note_rtt(&mut self, sample_ms: f64) {
        let sample = sample_ms.clamp(0.0, 60_000.0) as f32;
        self.rtt_ms = if self.rtt_ms > 0.0 {
            0.8 * self.rtt_ms + 0.2 * sample
        } else {
            sample.max(0.001)
        };
        self.probation = false;
    }

    /// Its measured speed, if any.
    pub fn speed(&self) -> Option<Speed> {
        (self.ms_per_byte > 0.0).then(|| Speed {
            prefill_tps: 1e3 / (ttft::BYTES_PER_TOKEN * f64::from(self.ms_per_byte)),
            service_ms: f64::from(self.slot_ms) * f64::from(self.capacity.max(1)),
        })
    }

    /// Notes the prefix routed here.
    pub fn set_pending(&mut self, blocks: &[u64]) {
        self.pending_bits = blocks.iter().fold(0, |acc, &b| acc | block_bit(b));
        self.pending_len = blocks.len().min(usize::from(u16::MAX)) as u16;
    }

    /// At most how many leading blocks of a request (whose [`leading_bits`] are
    /// `leading`) the prefix routed here shares with it.
    pub fn pending_bound(&self, leading: &[u64]) -> usize {
        if self.pending_bits == 0 {
            return 0;
        }
        let n = leading.partition_point(|&m| m & !self.pending_bits == 0);
        n.min(usize::from(self.pending_len))
    }

    /// Whether the prefix routed here may share more than `held` leading blocks with
    /// the request: one test, where [`Brief::pending_bound`] searches.
    pub fn pending_may_exceed(&self, held: usize, leading: &[u64]) -> bool {
        held < usize::from(self.pending_len) && leading.get(held).is_some_and(|m| m & !self.pending_bits == 0)
    }

    /// Whether requests for interned model `id` (`None`: any model) may come here;
    /// `None` when only the worker's status can tell.
    pub fn serves(&self, model: Option<u32>) -> Option<bool> {
        match model {
            None => Some(true),
            Some(id) if id < 64 => Some(self.models & (1 << id) != 0),
            Some(_) if self.more_models => None,
            Some(_) => Some(false),
        }
    }

    /// The sort key: by predicted TTFT when `prior` is `Some` (the speed to assume for a
    /// worker without its own measurement, or `None` when every candidate has one),
    /// else by block score. `warm`: leading blocks of the request it holds;
    /// `pullable`: leading blocks a peer of its KV group holds, which it may pull
    /// instead of computing (predicted TTFT counts the transfer).
    #[inline]
    pub fn key(&self, prior: Option<Option<Speed>>, warm: usize, pullable: usize, prompt_bytes: usize) -> u128 {
        let saturated = u64::from(self.load >= self.limit);
        let probation = u64::from(self.probation);
        let (rank, load, held) = (u64::from(self.rank), u64::from(self.load), u64::from(self.held));
        match prior {
            Some(prior) => {
                let cost = if self.ms_per_byte > 0.0 {
                    Cost {
                        ms_per_byte: f64::from(self.ms_per_byte),
                        slot_ms: f64::from(self.slot_ms),
                    }
                } else {
                    // Not measured: predicted at `prior` (every candidate unmeasured
                    // never gets here: that decision uses the block score).
                    Cost::of(
                        prior.unwrap_or(Speed {
                            prefill_tps: 1.0,
                            service_ms: 0.0,
                        }),
                        self.capacity,
                    )
                };
                // The network: the forward's way there and the first token's way back,
                // beyond what any worker next door costs (so the jitter of local round
                // trips never outweighs load).
                let net_ms = (f64::from(self.rtt_ms) - NEAR_MS).max(0.0);
                let mut ms = cost.predict_ms(prompt_bytes, warm, self.load, self.capacity);
                if pullable > warm && self.pull_ms_per_block > 0.0 {
                    let moved = (pullable - warm) as f64 * f64::from(self.pull_ms_per_block);
                    ms = ms.min(cost.predict_ms(prompt_bytes, pullable, self.load, self.capacity) + moved);
                }
                let ms = ms + net_ms;
                let us = (ms * 1e3).clamp(0.0, 1e15) as u64;
                pack(&[
                    (saturated, 1),
                    (probation, 1),
                    (us, 47),
                    (rank, 7),
                    (load, 32),
                    (held, 40),
                ])
            }
            None => {
                // Warm blocks, less WAIT_BLOCKS per request it would wait behind: a
                // warm worker with a queue still wins when its head start is worth
                // more than the wait, and spills otherwise.
                let waits = i64::from((self.load + 1).saturating_sub(self.capacity));
                let score = warm as i64 - WAIT_BLOCKS * waits;
                // Then the nearer worker, in steps of 50 ms of round trip (workers on
                // one LAN are all step 0: load decides between them).
                let rtt = (f64::from(self.rtt_ms) / 50.0).floor() as u64;
                let rest = pack(&[(rank, 7), (biased(-score), 32), (rtt, 16), (load, 32), (held, 38)]);
                u128::from(saturated) << 127 | u128::from(probation) << 126 | rest
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_like_their_fields() {
        let idle = Brief {
            live: true,
            routable: true,
            capacity: 2,
            limit: 4,
            rank: 4,
            ..Default::default()
        };
        let busy = Brief { load: 2, ..idle };
        let full = Brief { load: 4, ..idle };
        let metal = Brief { rank: 0, ..idle };
        // Blocks: backend first; then warm blocks less the wait; full workers last.
        assert!(metal.key(None, 0, 0, 0) < idle.key(None, 9, 0, 0));
        assert!(idle.key(None, 3, 0, 0) < idle.key(None, 2, 0, 0));
        assert!(
            busy.key(None, 9, 0, 0) < idle.key(None, 4, 0, 0),
            "5 warm blocks beat a wait of 4"
        );
        assert!(full.key(None, 100, 0, 0) > metal.key(None, 0, 0, 0));
        // TTFT: seconds decide, before the backend.
        let fast = Speed {
            prefill_tps: 4000.0,
            service_ms: 100.0,
        };
        let slow = Speed {
            prefill_tps: 500.0,
            service_ms: 800.0,
        };
        let mut f = idle;
        f.set_speed(Some(fast));
        let mut s = metal;
        s.set_speed(Some(slow));
        assert!(f.key(Some(None), 0, 0, 8000) < s.key(Some(None), 0, 0, 8000));
        assert!(
            s.key(Some(None), 30, 0, 8000) < f.key(Some(None), 0, 0, 8000),
            "warm on slow beats cold on fast"
        );
        let unmeasured = idle;
        let back = s.speed().unwrap();
        assert!((back.prefill_tps - 500.0).abs() < 0.01 && (back.service_ms - 800.0).abs() < 0.01);
        assert_eq!(
            unmeasured.key(Some(Some(fast)), 0, 0, 8000),
            f.key(Some(None), 0, 0, 8000)
        );
        let mut p = idle;
        p.set_pending(&[1, 2, 3, 4]);
        let q = leading_bits(&[1, 2, 3, 9, 4]);
        assert!(
            (3..=4).contains(&p.pending_bound(&q)),
            "the first 3 are shared: at least 3"
        );
        assert_eq!(
            p.pending_bound(&leading_bits(&[1, 2, 3, 4, 5])),
            4,
            "never past its length"
        );
        assert_eq!(idle.pending_bound(&q), 0);
        assert!(p.pending_may_exceed(2, &q) && !p.pending_may_exceed(4, &q) && !idle.pending_may_exceed(0, &q));
        assert!(id_prefix("a") < id_prefix("b") && id_prefix("sim-0009") < id_prefix("sim-0010"));
        assert_eq!(id_prefix("worker-a-1"), id_prefix("worker-a-2"), "then the ids decide");
    }

    #[test]
    fn a_pullable_prefix_counts_at_its_transfer_cost() {
        let cold = Brief {
            live: true,
            routable: true,
            capacity: 2,
            limit: 4,
            ms_per_byte: 1.0,
            kv_group: 1,
            pull_ms_per_block: 20.0,
            ..Brief::default()
        };
        // 8,000 bytes: 8 s to compute cold; 30 blocks (7,680 bytes) pulled in 600 ms,
        // then 320 bytes computed.
        let pulled = cold.key(Some(None), 0, 30, 8000);
        assert!(pulled < cold.key(Some(None), 0, 0, 8000));
        assert_eq!(
            pulled,
            cold.key(Some(None), 0, 0, 920),
            "the same as 920 bytes computed"
        );
        // A link slower than computing is not counted.
        let slow = Brief {
            pull_ms_per_block: 1000.0,
            ..cold
        };
        assert_eq!(slow.key(Some(None), 0, 30, 8000), slow.key(Some(None), 0, 0, 8000));
        // The block score ignores it.
        assert_eq!(cold.key(None, 0, 30, 8000), cold.key(None, 0, 0, 8000));
    }
}
