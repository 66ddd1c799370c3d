//! What every request handler of a worker shares: the NATS client, the model, the
//! admission queue, cancels, KV announcements and recent latencies.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use switchyard_actors::CancelRegistry;
use switchyard_messages::{ErrorCode, TextModel, WireError};

/// What every request handler shares.
pub struct ServeContext {
    pub client: async_nats::Client,
    pub worker_id: String,
    /// Backend and device, for spans and metrics.
    pub backend: String,
    pub device: String,
    pub model_name: String,
    pub model: Arc<dyn TextModel>,
    pub admission: switchyard_actors::Admission,
    pub cancels: CancelRegistry,
    pub draining: AtomicBool,
    pub keepalive: Duration,
    /// Called when a request finishes (counts completions, sends a heartbeat).
    pub on_complete: Box<dyn Fn() + Send + Sync>,
    /// The prefixes this worker holds warm, announced on `kv_subject`.
    pub kv: std::sync::Mutex<crate::worker::kv::KvTracker>,
    /// `{p}.v1.kv.{wid}`.
    pub kv_subject: String,
    /// Latencies and KV hits of recent generations.
    pub recent: std::sync::Mutex<crate::worker::recent::Recent>,
}

impl ServeContext {
    /// A request over `blocks` finished: announce what is warm now.
    pub(super) async fn record_kv(&self, blocks: Vec<u64>) {
        let event = self.kv.lock().unwrap_or_else(|p| p.into_inner()).record(blocks);
        if let Some(event) = event {
            // Published under the lock's order; the sequence number lets a coordinator
            // notice a lost or reordered event and ask for a snapshot.
            if let Err(e) = switchyard_actors::nats::publish(&self.client, self.kv_subject.clone(), &event).await {
                tracing::debug!("kv event not sent: {e}");
            }
        }
    }

    /// Refuses new work, as retryable `unavailable`, while the worker drains or its
    /// model is unhealthy (e.g. its llama.cpp server is down or restarting), so a
    /// coordinator tries the next worker.
    pub fn check_open(&self) -> Result<(), WireError> {
        if self.draining.load(Ordering::Acquire) {
            return Err(WireError::new(
                ErrorCode::Unavailable,
                format!("worker {} is draining", self.worker_id),
            ));
        }
        if !self.model.healthy() {
            return Err(WireError::new(
                ErrorCode::Unavailable,
                format!("worker {}: its backend is down or restarting", self.worker_id),
            ));
        }
        Ok(())
    }
}
