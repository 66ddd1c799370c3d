//! What a routing decision reads of each worker, kept dense: one small `Copy` record
//! per registry slot, refreshed on its heartbeats, routes and KV changes, so a
//! decision over 1,000 workers scans ~64 KB in one pass instead of chasing each
//! worker's status, model names and block set through the heap.

use super::ttft::{self, Speed};

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
    /// Its measured prefill speed, tokens/s (0: not measured).
    pub prefill_tps: f32,
    /// Its measured slot time, ms.
    pub service_ms: f32,
    /// The first 8 bytes of its id, big-endian: ties are broken by id, and this
    /// settles most of them without reading the id.
    pub id_prefix: u64,
    /// The first block of the last prefix routed here (with `pending`).
    pub pending_first: u64,
    /// A prefix was routed here.
    pub pending: bool,
}

/// The first 8 bytes of `id`, zero-padded, as a big-endian number: ordered like `id`
/// wherever they differ.
pub fn id_prefix(id: &str) -> u64 {
    let mut b = [0u8; 8];
    let n = id.len().min(8);
    b[..n].copy_from_slice(&id.as_bytes()[..n]);
    u64::from_be_bytes(b)
}

/// A candidate's sort key packed into one integer, smaller first (ties: smaller id).
/// `blocks`: saturated (1 bit) | backend rank (7) | −score, biased (32) | load (32) |
/// blocks held (56). `ttft`: saturated (1) | predicted µs (48) | backend rank (7) |
/// load (32) | blocks held (40).
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
    /// Its measured speed, if any.
    pub fn speed(&self) -> Option<Speed> {
        (self.prefill_tps > 0.0).then(|| Speed {
            prefill_tps: f64::from(self.prefill_tps),
            service_ms: f64::from(self.service_ms),
        })
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
    /// else by block score. `warm`: leading blocks of the request it holds.
    pub fn key(&self, prior: Option<Option<Speed>>, warm: usize, prompt_bytes: usize) -> u128 {
        let saturated = u64::from(self.load >= self.limit);
        let (rank, load, held) = (u64::from(self.rank), u64::from(self.load), u64::from(self.held));
        match prior {
            Some(prior) => {
                let speed = self.speed().or(prior).unwrap_or(Speed {
                    prefill_tps: 1.0,
                    service_ms: 0.0,
                });
                let ms = ttft::predict_ms(prompt_bytes, warm, self.load, self.capacity, speed);
                let us = (ms * 1e3).clamp(0.0, 1e15) as u64;
                pack(&[(saturated, 1), (us, 48), (rank, 7), (load, 32), (held, 40)])
            }
            None => {
                // Warm blocks, less WAIT_BLOCKS per request it would wait behind: a
                // warm worker with a queue still wins when its head start is worth
                // more than the wait, and spills otherwise.
                let waits = i64::from((self.load + 1).saturating_sub(self.capacity));
                let score = warm as i64 - WAIT_BLOCKS * waits;
                let rest = pack(&[(rank, 7), (biased(-score), 32), (load, 32), (held, 56)]);
                u128::from(saturated) << 127 | rest
            }
        }
    }
}

/// The `limit` smallest of `items` by `before`, in order: a bounded insertion when
/// `limit` is small next to `items` (the few candidates a request will try), a sort
/// otherwise.
pub fn smallest<T: Copy>(
    items: impl ExactSizeIterator<Item = T>,
    limit: usize,
    before: impl Fn(&T, &T) -> bool,
) -> Vec<T> {
    let n = items.len();
    let mut best: Vec<T> = Vec::with_capacity(limit.min(n) + 1);
    if limit >= n {
        best.extend(items);
        best.sort_unstable_by(|a, b| {
            if before(a, b) {
                std::cmp::Ordering::Less
            } else if before(b, a) {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        });
        return best;
    }
    for x in items {
        if best.len() < limit || best.last().is_some_and(|worst| before(&x, worst)) {
            let at = best.partition_point(|b| before(b, &x));
            best.insert(at, x);
            best.truncate(limit);
        }
    }
    best
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
        assert!(metal.key(None, 0, 0) < idle.key(None, 9, 0));
        assert!(idle.key(None, 3, 0) < idle.key(None, 2, 0));
        assert!(
            busy.key(None, 9, 0) < idle.key(None, 4, 0),
            "5 warm blocks beat a wait of 4"
        );
        assert!(full.key(None, 100, 0) > metal.key(None, 0, 0));
        // TTFT: seconds decide, before the backend.
        let fast = Speed {
            prefill_tps: 4000.0,
            service_ms: 100.0,
        };
        let slow = Speed {
            prefill_tps: 500.0,
            service_ms: 800.0,
        };
        let f = Brief {
            prefill_tps: 4000.0,
            service_ms: 100.0,
            ..idle
        };
        let s = Brief {
            prefill_tps: 500.0,
            service_ms: 800.0,
            ..metal
        };
        assert!(f.key(Some(None), 0, 8000) < s.key(Some(None), 0, 8000));
        assert!(
            s.key(Some(None), 30, 8000) < f.key(Some(None), 0, 8000),
            "warm on slow beats cold on fast"
        );
        let unmeasured = idle;
        assert_eq!(slow, s.speed().unwrap());
        assert_eq!(unmeasured.key(Some(Some(fast)), 0, 8000), f.key(Some(None), 0, 8000));
        assert!(id_prefix("a") < id_prefix("b") && id_prefix("sim-0009") < id_prefix("sim-0010"));
        assert_eq!(id_prefix("worker-a-1"), id_prefix("worker-a-2"), "then the ids decide");
        assert_eq!(smallest([5, 1, 4, 2, 3].into_iter(), 2, |a, b| a < b), vec![1, 2]);
        assert_eq!(smallest([5, 1, 4].into_iter(), 9, |a, b| a < b), vec![1, 4, 5]);
    }
}
