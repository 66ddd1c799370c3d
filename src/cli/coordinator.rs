//! The coordinator flags `up` and `coordinator` share.

use clap::Args;
use switchyard::Config;

/// Coordinator settings shared by `up` and `coordinator`.
#[derive(Args, Debug, Clone)]
pub struct CoordinatorFlags {
    /// Drop a worker whose last heartbeat is older than this (milliseconds).
    #[arg(long)]
    pub worker_expiry_ms: Option<u64>,
    /// How long to wait for a worker to admit a request before trying another (ms).
    #[arg(long)]
    pub admission_timeout_ms: Option<u64>,
    /// Route by backend and load only, ignoring which worker holds a request's prefix warm.
    #[arg(long)]
    pub no_kv_routing: bool,
    /// The longest a request waits for a worker with room before it is refused with
    /// `overloaded` (HTTP 429 with Retry-After), ms: coordinator.queue_timeout_ms
    /// (requests without their own queue_ms or deadline) and, for `up`, the
    /// gateway's gateway.queue_timeout_ms. Default 60000.
    #[arg(long)]
    pub queue_timeout_ms: Option<u64>,
    /// Requests that may wait at this coordinator at once; more are refused at once
    /// with `overloaded` (coordinator.max_queued, default 4096).
    #[arg(long)]
    pub max_queued: Option<u32>,
    /// Requests sent to a worker beyond its capacity, into its own queue, so a freed
    /// slot starts the next at once; the rest wait at the coordinator in priority and
    /// tenant order (coordinator.dispatch_ahead, default 1).
    #[arg(long)]
    pub dispatch_ahead: Option<u32>,
}

impl CoordinatorFlags {
    /// Applies the flags that were given.
    pub fn apply(&self, c: &mut Config) {
        if let Some(v) = self.worker_expiry_ms {
            c.coordinator.worker_expiry_ms = v;
        }
        if let Some(v) = self.admission_timeout_ms {
            c.coordinator.admission_timeout_ms = v;
        }
        if self.no_kv_routing {
            c.coordinator.kv_routing = false;
        }
        if let Some(v) = self.queue_timeout_ms {
            c.coordinator.queue_timeout_ms = v;
            c.gateway.queue_timeout_ms = v;
        }
        if let Some(v) = self.max_queued {
            c.coordinator.max_queued = v;
        }
        if let Some(v) = self.dispatch_ahead {
            c.coordinator.dispatch_ahead = v;
        }
    }
}
