//! Admission: the worker's bounded front. `capacity` requests compute at once,
//! `queue` more may wait, and anything beyond is refused at once with a retryable
//! `overloaded` (with a retry hint) — never unbounded growth.
//!
//! It is a counter, not an actor: admitting is one compare-and-swap, a finished
//! request gives its place back when its [`AdmissionPermit`] drops (so the heartbeat
//! sent right after it already shows the freed slot to the coordinators' fleet
//! queues), and heartbeats, `status` and the metrics gauges read the same counts.
//! Nothing here can fail or stall, so there is nothing to supervise.
//!
//! Behind it, the model's own scheduler decides what computes when (for the CPU
//! engine, the continuous batcher on its compute thread, which stays a thread: it
//! must not share a runtime with the network side). Coordinators hold the fleet's
//! longer queue and send a worker only what it can admit.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use switchyard_messages::{ErrorCode, WireError};

/// The counts behind [`Admission`] and its permits.
struct Counts {
    held: AtomicU32,
    capacity: u32,
    queue: u32,
}

/// The worker's admission front.
#[derive(Clone)]
pub struct Admission {
    counts: Arc<Counts>,
}

/// Held for the life of an admitted request; dropping it frees the place.
pub struct AdmissionPermit {
    counts: Arc<Counts>,
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        let _ = self
            .counts
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| h.checked_sub(1));
    }
}

impl Admission {
    /// `capacity` concurrent requests plus `queue` waiting.
    pub fn new(capacity: u32, queue: u32) -> Self {
        let counts = Arc::new(Counts {
            held: AtomicU32::new(0),
            capacity,
            queue,
        });
        Self { counts }
    }

    /// Admits a request, or refuses with `overloaded` and a retry hint.
    pub fn admit(&self) -> Result<AdmissionPermit, WireError> {
        let c = &self.counts;
        let limit = c.capacity + c.queue;
        match c
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| (h < limit).then_some(h + 1))
        {
            Ok(_) => Ok(AdmissionPermit { counts: c.clone() }),
            Err(_) => Err(WireError::new(
                ErrorCode::Overloaded,
                format!("worker is full: {} computing, {} queued", c.capacity, c.queue),
            )
            .with_retry_after(100)),
        }
    }

    /// Admitted requests: (computing, waiting).
    pub fn load(&self) -> (u32, u32) {
        let held = self.counts.held.load(Ordering::Acquire);
        let computing = held.min(self.counts.capacity);
        (computing, held - computing)
    }

    /// Requests computed at once.
    pub fn capacity(&self) -> u32 {
        self.counts.capacity
    }

    /// Requests that may wait.
    pub fn queue(&self) -> u32 {
        self.counts.queue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_beyond_capacity_plus_queue_and_frees_on_drop() {
        let a = Admission::new(1, 1);
        let p1 = a.admit().unwrap();
        assert_eq!(a.load(), (1, 0));
        let p2 = a.admit().unwrap();
        assert_eq!(a.load(), (1, 1));
        let err = a.admit().err().unwrap();
        assert_eq!(err.code, ErrorCode::Overloaded);
        assert!(err.retryable && err.retry_after_ms.is_some());
        drop(p1);
        // Given back at once: the heartbeat sent next already shows the slot free.
        assert_eq!(a.load(), (1, 0));
        drop(p2);
        assert_eq!(a.load(), (0, 0));
        let p3 = a.admit().unwrap();
        assert_eq!(a.load(), (1, 0));
        drop(p3);
    }

    #[test]
    fn concurrent_admissions_never_exceed_the_limit() {
        let a = Admission::new(3, 2);
        let held: Vec<_> = std::thread::scope(|s| {
            let tries: Vec<_> = (0..16).map(|_| s.spawn(|| a.admit().ok())).collect();
            tries.into_iter().filter_map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(held.len(), 5);
        assert_eq!(a.load(), (3, 2));
        drop(held);
        assert_eq!(a.load(), (0, 0));
    }
}
