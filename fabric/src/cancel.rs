//! Request id → cancel flag, so `{p}.v1.cancel.{request_id}` reaches the generation —
//! but only from its requester: each request is registered with the inbox its answer
//! goes to, and a cancel must name that inbox ([`switchyard_messages::CancelRequest`]).
//! Inboxes are random (NUID) and, under the documented permissions, readable only by
//! their owner, so a cancel cannot be forged by guessing a request id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use switchyard_backend::CancelFlag;

/// Shared map of running requests' cancel flags and their requesters' inboxes.
#[derive(Clone, Default)]
pub struct CancelRegistry {
    inner: Arc<Mutex<HashMap<String, (CancelFlag, String)>>>,
}

/// What a cancel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// The request was running here and is now cancelled.
    Yes,
    /// Nothing by that id runs here.
    Unknown,
    /// It runs here, but the cancel did not name its requester's inbox.
    NotRequester,
}

impl CancelRegistry {
    /// Registers a request answered on `inbox`; removed again by
    /// [`CancelRegistry::remove`].
    pub fn insert(&self, request_id: &str, inbox: &str) -> CancelFlag {
        let flag = CancelFlag::new();
        self.lock()
            .insert(request_id.to_string(), (flag.clone(), inbox.to_string()));
        flag
    }

    /// Cancels a request if it runs here and `inbox` is its requester's.
    pub fn cancel(&self, request_id: &str, inbox: &str) -> Cancelled {
        match self.lock().get(request_id) {
            Some((flag, owner)) if owner == inbox => {
                flag.cancel();
                Cancelled::Yes
            }
            Some(_) => Cancelled::NotRequester,
            None => Cancelled::Unknown,
        }
    }

    /// Forgets a finished request.
    pub fn remove(&self, request_id: &str) {
        self.lock().remove(request_id);
    }

    /// Cancels every registered request (shutdown).
    pub fn cancel_all(&self) {
        for (flag, _) in self.lock().values() {
            flag.cancel();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (CancelFlag, String)>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}
