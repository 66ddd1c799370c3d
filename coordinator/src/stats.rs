//! What the coordinator's actor spends its time on: routing decisions (with a latency
//! histogram), heartbeats, KV events and snapshots, each counted with the time its
//! handler took. Plain atomics, always on (two clock reads per message); read through
//! [`crate::CoordinatorHandle::stats`] — `switchyard bench routing` reports them.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Values below this many nanoseconds get a bucket each.
const LINEAR: u64 = 64;
/// Sub-buckets per power of two above [`LINEAR`]: about 3% resolution.
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = LINEAR as usize + (64 - 6) * SUB as usize;

/// Messages of one kind handled by the actor, and the time their handlers took.
#[derive(Debug, Default)]
pub struct Tally {
    count: AtomicU64,
    nanos: AtomicU64,
}

impl Tally {
    /// One more, which took `d`.
    pub fn add(&self, d: Duration) {
        self.add_many(1, d);
    }

    /// `n` more, which took `d` together.
    pub fn add_many(&self, n: u64, d: Duration) {
        self.count.fetch_add(n, Ordering::Relaxed);
        self.nanos.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    fn read(&self) -> TallySnapshot {
        TallySnapshot {
            count: self.count.load(Ordering::Relaxed),
            nanos: self.nanos.load(Ordering::Relaxed),
        }
    }
}

/// A log-linear latency histogram in nanoseconds (exact below 64 ns, then 32
/// buckets per power of two).
#[derive(Debug)]
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

fn bucket(ns: u64) -> usize {
    if ns < LINEAR {
        return ns as usize;
    }
    let e = 63 - ns.leading_zeros(); // ≥ 6
    let sub = (ns >> (e - SUB_BITS)) & (SUB - 1);
    LINEAR as usize + (e as usize - 6) * SUB as usize + sub as usize
}

/// The smallest value of bucket `i`, and the bucket's width.
fn bounds(i: usize) -> (u64, u64) {
    if i < LINEAR as usize {
        return (i as u64, 1);
    }
    let e = (i - LINEAR as usize) as u32 / SUB as u32 + 6;
    let sub = (i - LINEAR as usize) as u64 % SUB;
    let shift = e - SUB_BITS;
    ((SUB + sub) << shift, 1 << shift)
}

impl Histogram {
    /// Records `d`.
    pub fn record(&self, d: Duration) {
        self.buckets[bucket(d.as_nanos() as u64)].fetch_add(1, Ordering::Relaxed);
    }

    fn read(&self) -> Vec<(u64, u64)> {
        self.buckets
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let n = b.load(Ordering::Relaxed);
                (n > 0).then(|| (bounds(i).0, n))
            })
            .collect()
    }
}

/// The coordinator's counters.
#[derive(Debug, Default)]
pub struct CoordinatorStats {
    /// `Route` messages: filtering, ordering and noting the choice.
    pub decisions: Tally,
    /// How long each decision took.
    pub decision_latency: Histogram,
    /// Heartbeats applied.
    pub heartbeats: Tally,
    /// KV events applied.
    pub kv_events: Tally,
    /// KV snapshots applied.
    pub snapshots: Tally,
}

impl CoordinatorStats {
    /// A copy of the counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            decisions: self.decisions.read(),
            decision_latency: self.decision_latency.read(),
            heartbeats: self.heartbeats.read(),
            kv_events: self.kv_events.read(),
            snapshots: self.snapshots.read(),
        }
    }
}

/// A [`Tally`] as read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TallySnapshot {
    /// Messages handled.
    pub count: u64,
    /// Nanoseconds their handlers took in all.
    pub nanos: u64,
}

impl TallySnapshot {
    /// Mean time per message.
    pub fn mean(&self) -> Duration {
        Duration::from_nanos(self.nanos.checked_div(self.count).unwrap_or(0))
    }

    /// What happened between `earlier` and this.
    pub fn since(&self, earlier: &TallySnapshot) -> TallySnapshot {
        TallySnapshot {
            count: self.count - earlier.count,
            nanos: self.nanos - earlier.nanos,
        }
    }
}

/// [`CoordinatorStats`] as read: plain data that travels (MessagePack, JSON).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// Routing decisions.
    pub decisions: TallySnapshot,
    /// Their latency: (bucket's lowest nanoseconds, count) for each non-empty bucket.
    pub decision_latency: Vec<(u64, u64)>,
    /// Heartbeats.
    pub heartbeats: TallySnapshot,
    /// KV events.
    pub kv_events: TallySnapshot,
    /// KV snapshots.
    pub snapshots: TallySnapshot,
}

impl StatsSnapshot {
    /// The decision latency below which a fraction `q` of decisions fell (bucket
    /// midpoints, about 3% resolution).
    pub fn decision_quantile(&self, q: f64) -> Duration {
        let total: u64 = self.decision_latency.iter().map(|(_, n)| n).sum();
        let rank = ((total as f64 * q).ceil() as u64).clamp(1, total.max(1));
        let mut seen = 0;
        for &(low, n) in &self.decision_latency {
            seen += n;
            if seen >= rank {
                let (_, width) = bounds(bucket(low));
                return Duration::from_nanos(low + width / 2);
            }
        }
        Duration::ZERO
    }

    /// The decisions made between `earlier` and this.
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        let before: std::collections::HashMap<u64, u64> = earlier.decision_latency.iter().copied().collect();
        StatsSnapshot {
            decisions: self.decisions.since(&earlier.decisions),
            decision_latency: self
                .decision_latency
                .iter()
                .map(|&(low, n)| (low, n - before.get(&low).copied().unwrap_or(0)))
                .filter(|&(_, n)| n > 0)
                .collect(),
            heartbeats: self.heartbeats.since(&earlier.heartbeats),
            kv_events: self.kv_events.since(&earlier.kv_events),
            snapshots: self.snapshots.since(&earlier.snapshots),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut last = 0;
        for ns in (0..10_000u64).chain([1 << 20, (1 << 40) + 12345, u64::MAX]) {
            let i = bucket(ns);
            assert!(i < BUCKETS && i >= last, "{ns}");
            let (low, width) = bounds(i);
            assert!(low <= ns && ns - low < width, "{ns}: [{low}, +{width})");
            last = i;
        }
    }

    #[test]
    fn quantiles_and_differences() {
        let s = CoordinatorStats::default();
        for us in 1..=100 {
            s.decisions.add(Duration::from_micros(us));
            s.decision_latency.record(Duration::from_micros(us));
        }
        let a = s.snapshot();
        assert_eq!(a.decisions.count, 100);
        let p50 = a.decision_quantile(0.5).as_nanos() as f64;
        assert!((p50 - 50_000.0).abs() < 50_000.0 * 0.04, "{p50}");
        let p99 = a.decision_quantile(0.99).as_nanos() as f64;
        assert!((p99 - 99_000.0).abs() < 99_000.0 * 0.04, "{p99}");
        s.decision_latency.record(Duration::from_millis(5));
        s.decisions.add(Duration::from_millis(5));
        let d = s.snapshot().since(&a);
        assert_eq!(d.decisions.count, 1);
        assert_eq!(d.decision_latency.iter().map(|(_, n)| n).sum::<u64>(), 1);
        assert!(d.decision_quantile(0.5) > Duration::from_micros(4_800));
    }
}
