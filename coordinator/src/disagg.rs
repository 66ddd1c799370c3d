//! Disaggregated prefill/decode (protocol 1.12): which `prefill` worker, if any,
//! computes a forward's prompt for the worker that will stream it (`Sy-Kv-Prefill`).
//!
//! A `decode` worker has every long prompt prefilled elsewhere when a `prefill`
//! worker of its KV format has room (its operator said so). A `both` worker does
//! only where that is predicted faster: the prefill worker's measured speed plus the
//! KV's transfer at [`PULL_BYTES_PER_SEC`] against its own measured speed — so a
//! fast-prefill GPU box feeds a slow-prefill decoder, and two alike CPUs never
//! split a request. Short prompts stay whole: a prefill elsewhere costs two round
//! trips and a pull before the first token.

use crate::registry::ttft::PULL_BYTES_PER_SEC;
use switchyard_messages::WorkerRole;

/// What the choice reads of one worker (from its heartbeats).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seat {
    pub role: WorkerRole,
    /// Available and not draining.
    pub open: bool,
    /// In flight + queued, and slots.
    pub load: u32,
    pub capacity: u32,
    /// Measured prompt tokens per second (0: not measured).
    pub prefill_tps: f64,
    /// KV bytes per token of its format.
    pub token_bytes: usize,
}

/// A prefill elsewhere must be predicted at least this much faster than computing
/// the prompt where it streams (a `both` worker).
const GAIN: f64 = 1.25;

/// The prefill worker for a prompt of `tokens` not yet held by `target`, among
/// `peers` (same KV format, heard from lately, `target` excluded), or none.
pub fn choose<'a>(
    target: &Seat,
    tokens: usize,
    min_tokens: usize,
    peers: impl Iterator<Item = (&'a str, Seat)>,
) -> Option<&'a str> {
    if tokens < min_tokens.max(1) || target.role == WorkerRole::Prefill {
        return None;
    }
    let best = peers
        .filter(|(_, s)| s.role == WorkerRole::Prefill && s.open && s.load < s.capacity)
        .max_by(|(ia, a), (ib, b)| {
            a.prefill_tps
                .total_cmp(&b.prefill_tps)
                .then(b.load.cmp(&a.load))
                .then(ib.cmp(ia))
        })?;
    if target.role == WorkerRole::Decode {
        return Some(best.0);
    }
    let (here, there) = (target.prefill_tps, best.1.prefill_tps);
    if !(here > 0.0 && there > 0.0) {
        return None;
    }
    let local = tokens as f64 / here;
    let remote = tokens as f64 / there + (tokens * best.1.token_bytes) as f64 / PULL_BYTES_PER_SEC;
    (remote * GAIN < local).then_some(best.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seat(role: WorkerRole, prefill_tps: f64, load: u32) -> Seat {
        Seat {
            role,
            open: true,
            load,
            capacity: 2,
            prefill_tps,
            token_bytes: 23_040,
        }
    }

    #[test]
    fn a_decode_worker_has_long_prompts_prefilled_by_the_fastest_with_room() {
        let target = seat(WorkerRole::Decode, 0.0, 0);
        let peers = [
            ("p1", seat(WorkerRole::Prefill, 500.0, 0)),
            ("p2", seat(WorkerRole::Prefill, 900.0, 2)),
            ("p3", seat(WorkerRole::Prefill, 700.0, 1)),
            ("b", seat(WorkerRole::Both, 5_000.0, 0)),
        ];
        assert_eq!(
            choose(&target, 2_000, 512, peers.iter().copied()),
            Some("p3"),
            "p2 is full, b no prefill worker"
        );
        assert_eq!(
            choose(&target, 100, 512, peers.iter().copied()),
            None,
            "short prompts stay whole"
        );
        let closed = [(
            "p1",
            Seat {
                open: false,
                ..peers[0].1
            },
        )];
        assert_eq!(choose(&target, 2_000, 512, closed.iter().copied()), None);
        // Unmeasured prefill workers still serve a decode worker.
        let fresh = [("p1", seat(WorkerRole::Prefill, 0.0, 0))];
        assert_eq!(choose(&target, 2_000, 512, fresh.iter().copied()), Some("p1"));
    }

    #[test]
    fn a_both_worker_splits_only_when_the_prefill_worker_is_much_faster() {
        let peer = |tps| [("p", seat(WorkerRole::Prefill, tps, 0))];
        let cpu = seat(WorkerRole::Both, 150.0, 0);
        // 2,000 tokens: 13.3 s here; a 5,000 tok/s box takes 0.4 s + 46 MB at 110 MB/s.
        assert_eq!(choose(&cpu, 2_000, 512, peer(5_000.0).into_iter()), Some("p"));
        // An alike worker never: the transfer only adds.
        assert_eq!(choose(&cpu, 2_000, 512, peer(150.0).into_iter()), None);
        // Unmeasured on either side: no prediction, no split.
        assert_eq!(
            choose(&seat(WorkerRole::Both, 0.0, 0), 2_000, 512, peer(5_000.0).into_iter()),
            None
        );
        assert_eq!(choose(&cpu, 2_000, 512, peer(0.0).into_iter()), None);
        // A prefill worker is never a target.
        assert_eq!(
            choose(
                &seat(WorkerRole::Prefill, 1.0, 0),
                2_000,
                512,
                peer(5_000.0).into_iter()
            ),
            None
        );
    }
}
