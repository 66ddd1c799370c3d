//! A worker's bounded admission: `capacity` requests compute, `queue` more may wait,
//! and anything beyond is refused at once with `overloaded`.

use std::sync::Arc;
use switchyard_messages::{ErrorCode, WireError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bounded admission for one worker.
#[derive(Clone)]
pub struct Admission {
    permits: Arc<Semaphore>,
    capacity: u32,
    queue: u32,
}

/// Held for the life of an admitted request; dropping it frees the slot.
pub struct AdmissionPermit {
    _permit: OwnedSemaphorePermit,
}

impl Admission {
    /// `capacity` concurrent requests plus `queue` waiting.
    pub fn new(capacity: u32, queue: u32) -> Self {
        Self {
            permits: Arc::new(Semaphore::new((capacity + queue) as usize)),
            capacity,
            queue,
        }
    }

    /// Admits a request, or refuses with `overloaded` and a retry hint.
    pub fn try_admit(&self) -> Result<AdmissionPermit, WireError> {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => Ok(AdmissionPermit { _permit: permit }),
            Err(_) => Err(WireError::new(
                ErrorCode::Overloaded,
                format!("worker is full: {} computing, {} queued", self.capacity, self.queue),
            )
            .with_retry_after(100)),
        }
    }

    /// Admitted requests: (computing, waiting).
    pub fn load(&self) -> (u32, u32) {
        let held = self.capacity + self.queue - self.permits.available_permits() as u32;
        let computing = held.min(self.capacity);
        (computing, held - computing)
    }

    /// Requests computed at once.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Requests that may wait.
    pub fn queue(&self) -> u32 {
        self.queue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_beyond_capacity_plus_queue_and_frees_on_drop() {
        let a = Admission::new(1, 1);
        let p1 = a.try_admit().unwrap();
        assert_eq!(a.load(), (1, 0));
        let p2 = a.try_admit().unwrap();
        assert_eq!(a.load(), (1, 1));
        let err = a.try_admit().err().unwrap();
        assert_eq!(err.code, ErrorCode::Overloaded);
        assert!(err.retryable && err.retry_after_ms.is_some());
        drop(p1);
        assert_eq!(a.load(), (1, 0));
        drop(p2);
        assert_eq!(a.load(), (0, 0));
        assert!(a.try_admit().is_ok());
    }
}
