//! What every request handler of a worker shares: the NATS client, the model, the
//! admission queue, cancels, KV announcements and recent latencies.

use super::prefix_index::KvMsg;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use switchyard_backend::TextModel;
use switchyard_fabric::CancelRegistry;
use switchyard_messages::{ErrorCode, WireError};

/// What every request handler shares.
pub struct ServeContext {
    pub client: async_nats::Client,
    pub worker_id: String,
    /// Backend and device, for spans and metrics.
    pub backend: String,
    pub device: String,
    pub model_name: String,
    pub model: Arc<dyn TextModel>,
    /// Admission: capacity + queue, then `overloaded`.
    pub admission: super::admission::Admission,
    pub cancels: CancelRegistry,
    pub draining: AtomicBool,
    pub keepalive: Duration,
    /// How long a token may wait to share a chunk (`worker.coalesce_ms`).
    pub coalesce: Duration,
    /// What one request may ask for.
    pub limits: switchyard_messages::InputLimits,
    /// Called when a request finishes (counts completions, sends a heartbeat).
    pub on_complete: Box<dyn Fn() + Send + Sync>,
    /// The KvCacheActor (replaced by the WorkerActor when it restarts one).
    pub kv: std::sync::Mutex<Option<ractor::ActorRef<KvMsg>>>,
    /// Latencies and KV hits of recent generations.
    pub recent: std::sync::Mutex<crate::worker::recent::Recent>,
    /// Subjects (prefix), for peers' KV pull subjects.
    pub subjects: switchyard_messages::Subjects,
    /// KV moved to and from peers, and the links measured.
    pub transfer: super::kv_transfer::TransferState,
    /// Whether it pulls prefixes from peers (`worker.kv_pull`).
    pub kv_pull: bool,
    /// Its streams handed to other workers when it drains (`worker.handover`).
    pub handover: super::handover::Handover,
}

impl ServeContext {
    /// A generation finished: tell the KvCacheActor what the engine holds now where
    /// it says so, else the request's prefix blocks (it announces what is warm).
    pub(super) fn record_kv(&self, req: &switchyard_messages::GenerateRequest) {
        let msg = match self.model.kv_holdings() {
            Some(now) => KvMsg::Holdings(now),
            None => KvMsg::Record(switchyard_messages::kv::adapter_blocks(
                req.head.adapter.as_deref(),
                &switchyard_messages::kv::routing_key(req.prompt.as_deref(), req.messages.as_deref()),
            )),
        };
        self.tell_kv(msg);
    }

    /// Sends the KvCacheActor a message; dropped (with a debug line) while it is being
    /// restarted.
    pub fn tell_kv(&self, msg: KvMsg) {
        let kv = self.kv.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match kv {
            Some(kv) if kv.cast(msg).is_ok() => {}
            _ => tracing::debug!(worker = %self.worker_id, "kv cache actor not running; message dropped"),
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

    /// Refuses a request naming a LoRA adapter this worker has not loaded, as
    /// `unknown_model` naming it and those it has.
    pub fn check_adapter(&self, adapter: Option<&str>) -> Result<(), WireError> {
        let Some(want) = adapter else { return Ok(()) };
        let loaded = self.model.adapters();
        if loaded.iter().any(|a| a.name == want) {
            return Ok(());
        }
        let names: Vec<&str> = loaded.iter().map(|a| a.name.as_str()).collect();
        Err(WireError::new(
            ErrorCode::UnknownModel,
            format!(
                "worker {} has not loaded the LoRA adapter {want:?} of {:?}; loaded: {}",
                self.worker_id,
                self.model_name,
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ),
        ))
    }
}
