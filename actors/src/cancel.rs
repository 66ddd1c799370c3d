//! Request id → cancel flag, so `{p}.v1.cancel.{request_id}` reaches the generation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use switchyard_messages::CancelFlag;

/// Shared map of running requests' cancel flags.
#[derive(Clone, Default)]
pub struct CancelRegistry {
    inner: Arc<Mutex<HashMap<String, CancelFlag>>>,
}

impl CancelRegistry {
    /// Registers a request; the flag is removed again by [`CancelRegistry::remove`].
    pub fn insert(&self, request_id: &str) -> CancelFlag {
        let flag = CancelFlag::new();
        self.lock().insert(request_id.to_string(), flag.clone());
        flag
    }

    /// Cancels a request if it runs here; returns whether it did.
    pub fn cancel(&self, request_id: &str) -> bool {
        match self.lock().get(request_id) {
            Some(flag) => {
                flag.cancel();
                true
            }
            None => false,
        }
    }

    /// Forgets a finished request.
    pub fn remove(&self, request_id: &str) {
        self.lock().remove(request_id);
    }

    /// Cancels every registered request (shutdown).
    pub fn cancel_all(&self) {
        for flag in self.lock().values() {
            flag.cancel();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancelFlag>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}
