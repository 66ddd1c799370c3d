//! The request's side of the fleet queue ([`crate::queue`]): waiting for a grant
//! with keep-alives to a streaming client, withdrawing when the request's time runs
//! out, and handing the request to another coordinator when this one stops.

use crate::actor::{CoordinatorMsg, Waited};
use ractor::ActorRef;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use switchyard_messages::subjects::HEADER_FIRST_SEQ;
use switchyard_messages::{encode, ErrorCode, Priority, StreamChunk, WireError};
use tokio::sync::oneshot;

/// How long requests may wait and what is sent meanwhile.
#[derive(Debug, Clone, Copy)]
pub struct QueueOptions {
    /// The longest wait for a request that names no `queue_ms` or deadline.
    pub timeout: Duration,
    /// Requests sent to a worker beyond its capacity (into its own queue).
    pub ahead: u32,
    /// A keep-alive chunk to a streaming client this often while it waits.
    pub keepalive: Duration,
}

/// What waiting needs of the coordinator.
#[derive(Clone)]
pub struct Waiter {
    pub client: async_nats::Client,
    pub actor: ActorRef<CoordinatorMsg>,
    pub options: QueueOptions,
    /// Waiting requests handed to other coordinators (at shutdown).
    pub handed_off: std::sync::Arc<AtomicUsize>,
}

/// One request's wait: where its keep-alives go and the next chunk's `seq`.
pub struct Wait<'a> {
    pub id: u64,
    pub until: Instant,
    /// Streaming requests get keep-alives here (their inbox and request id).
    pub stream: Option<(&'a str, &'a str)>,
    pub seq: u64,
}

impl Wait<'_> {
    /// Waits for the actor's answer on `rx`, sending keep-alives; at `until`
    /// withdraws the request and refuses it with `overloaded` (unless a grant came
    /// meanwhile).
    pub async fn answer(&mut self, ctx: &Waiter, mut rx: oneshot::Receiver<Waited>) -> Waited {
        let stopped = || {
            Waited::Refused(WireError::new(
                ErrorCode::Unavailable,
                "the coordinator stopped while the request waited; send it again",
            ))
        };
        let mut beat = tokio::time::Instant::now() + ctx.options.keepalive;
        let until = tokio::time::Instant::from_std(self.until);
        loop {
            tokio::select! {
                w = &mut rx => return w.unwrap_or_else(|_| stopped()),
                _ = tokio::time::sleep_until(until) => {
                    return match ractor::call_t!(ctx.actor, CoordinatorMsg::Withdraw, 5_000, self.id) {
                        Ok(Some(after)) => Waited::Refused(
                            WireError::new(
                                ErrorCode::Overloaded,
                                "no worker had room for the request within its queue time (queue_ms, deadline_ms or \
                                 coordinator.queue_timeout_ms)",
                            )
                            .with_retry_after(after.as_millis() as u64),
                        ),
                        // Granted meanwhile: the grant is on its way.
                        Ok(None) => rx.await.unwrap_or_else(|_| stopped()),
                        Err(_) => stopped(),
                    };
                }
                _ = tokio::time::sleep_until(beat), if self.stream.is_some() => {
                    let (inbox, request_id) = self.stream.expect("checked");
                    let chunk = encode(&StreamChunk::keepalive(request_id, self.seq));
                    self.seq += 1;
                    let _ = ctx.client.publish(inbox.to_string(), chunk.into()).await;
                    beat += ctx.options.keepalive;
                }
            }
        }
    }
}

/// Sends a waiting request back to the coordinators' queue group (this coordinator
/// has stopped listening), its chunks numbered on from `seq`.
pub async fn hand_off(ctx: &Waiter, msg: &async_nats::Message, inbox: &str, seq: u64) {
    let mut headers = msg.headers.clone().unwrap_or_default();
    headers.insert(HEADER_FIRST_SEQ, seq.to_string().as_str());
    let sent = ctx
        .client
        .publish_with_reply_and_headers(msg.subject.clone(), inbox.to_string(), headers, msg.payload.clone())
        .await;
    if let Err(e) = sent {
        tracing::warn!("handing a waiting request to another coordinator: {e}");
    }
    ctx.handed_off.fetch_add(1, Ordering::AcqRel);
}

/// `switchyard.queue.wait`: time requests waited in the fleet queue, by model,
/// priority, tenant and how the wait ended (`dispatched`, `timeout`, `refused`,
/// `cancelled`, `handoff`).
pub fn record(model: &str, priority: Priority, tenant: &str, outcome: &'static str, waited: Duration) {
    use opentelemetry::KeyValue;
    static H: std::sync::OnceLock<opentelemetry::metrics::Histogram<f64>> = std::sync::OnceLock::new();
    let h = H.get_or_init(|| {
        opentelemetry::global::meter("switchyard")
            .f64_histogram("switchyard.queue.wait")
            .with_unit("s")
            .with_description("Time requests waited at a coordinator for a worker with room")
            .with_boundaries(vec![
                0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
            ])
            .build()
    });
    h.record(
        waited.as_secs_f64(),
        &[
            KeyValue::new("gen_ai.request.model", model.to_string()),
            KeyValue::new("switchyard.priority", priority.as_str()),
            KeyValue::new("switchyard.tenant", tenant.to_string()),
            KeyValue::new("switchyard.queue.outcome", outcome),
        ],
    );
}

/// `switchyard.queue.depth`: requests waiting at this coordinator, by model,
/// priority and tenant (an observable gauge over the queue's shared counts).
pub fn register_depth_gauge(coordinator_id: String, depths: &crate::queue::Depths) {
    use opentelemetry::KeyValue;
    let depths = std::sync::Arc::downgrade(depths);
    opentelemetry::global::meter("switchyard")
        .u64_observable_gauge("switchyard.queue.depth")
        .with_unit("{request}")
        .with_description("Requests waiting at a coordinator for a worker with room")
        .with_callback(move |o| {
            let Some(depths) = depths.upgrade() else { return };
            let d = depths.lock().unwrap_or_else(|e| e.into_inner());
            for ((model, priority, tenant), n) in d.iter() {
                o.observe(
                    *n,
                    &[
                        KeyValue::new("gen_ai.request.model", model.clone()),
                        KeyValue::new("switchyard.priority", priority.as_str()),
                        KeyValue::new("switchyard.tenant", tenant.clone()),
                        KeyValue::new("switchyard.coordinator.id", coordinator_id.clone()),
                    ],
                );
            }
        })
        .build();
}
