//! # switchyard-coordinator — the CoordinatorActor
//!
//! ## Layout
//! - [`registry`]: live workers from heartbeats, and the routing policy (plain data):
//!   `registry/prefix.rs` (who holds which prefix block), `registry/ttft.rs` (predicted
//!   time to first token), `registry/brief.rs` (what a decision reads of each worker).
//! - [`actor`]: the CoordinatorActor owning the registry.
//! - [`holdings`]: what each worker's engine says its KV cache holds, to predict a
//!   forwarded request's `cached_tokens`.
//! - [`stats`]: counters and a decision-latency histogram of the actor's work.
//! - [`service`]: forwarding a client request to a worker with the client's inbox as
//!   the stream target; tokens never pass through the coordinator.
//! - [`CoordinatorHandle`]: starts all of it on a NATS connection.
//!
//! A request on `{p}.v1.generate` (queue group: one of several coordinators takes it)
//! is decoded and validated, routed by the registry, and forwarded as a NATS request
//! to `{p}.v1.worker.{wid}.generate` with header `Sy-Stream-To: <client inbox>`; the
//! worker's [`switchyard_messages::Admission`] answer decides whether to try the next
//! candidate. This crate never imports `switchyard-workers`: it knows workers only by
//! their heartbeats.

pub mod actor;
pub mod disagg;
pub mod holdings;
pub mod queue;
pub mod registry;
mod relay;
pub mod service;
pub mod session_open;
pub mod stats;
pub mod waiting;

use actor::{CoordinatorActor, CoordinatorArgs, CoordinatorMsg};
use async_nats::service::ServiceExt;
use futures::StreamExt;
use ractor::{Actor, ActorRef};
use std::time::Duration;
use switchyard_fabric::nats::serve_endpoint;
use switchyard_messages::subjects::COORDINATOR_QUEUE;
use switchyard_messages::{encode, FleetStatus, ModelsReply, Subjects};
use tokio::task::JoinHandle;

/// Heartbeats or KV events handed to the actor in one call, at most.
const BATCH: usize = 256;

/// How a coordinator behaves.
#[derive(Debug, Clone)]
pub struct CoordinatorOptions {
    /// Unique id.
    pub coordinator_id: String,
    /// Subjects (prefix).
    pub subjects: Subjects,
    /// Heartbeat expiry.
    pub worker_expiry: Duration,
    /// Wait for a worker's admission answer.
    pub admission_timeout: Duration,
    /// Workers tried per request.
    pub max_attempts: u32,
    /// KV-aware routing on.
    pub kv_routing: bool,
    /// How candidate workers are ordered.
    pub routing: registry::RoutingPolicy,
    /// What one request may ask for.
    pub limits: switchyard_messages::InputLimits,
    /// The longest a request waits for a worker with room unless it says otherwise.
    pub queue_timeout: Duration,
    /// Requests that may wait here at once.
    pub max_queued: u32,
    /// Payload bytes that may wait here at once.
    pub max_queued_bytes: u64,
    /// Requests sent to a worker beyond its capacity.
    pub dispatch_ahead: u32,
    /// Keep-alive period to a streaming client while its request waits (below the
    /// clients' stall timeout).
    pub keepalive: Duration,
    /// Disaggregated prefill applies to prompts of at least this many tokens.
    pub disagg_min_tokens: u32,
}

impl CoordinatorOptions {
    /// The options `config` gives, with this process's coordinator id.
    pub fn from_config(config: &switchyard_config::Config) -> Self {
        let c = &config.coordinator;
        Self {
            coordinator_id: default_coordinator_id(),
            subjects: Subjects::new(&config.nats.prefix),
            worker_expiry: Duration::from_millis(c.worker_expiry_ms),
            admission_timeout: Duration::from_millis(c.admission_timeout_ms),
            max_attempts: c.max_attempts,
            kv_routing: c.kv_routing,
            routing: c.routing,
            limits: config.limits.clone(),
            queue_timeout: Duration::from_millis(c.queue_timeout_ms),
            max_queued: c.max_queued,
            max_queued_bytes: c.max_queued_bytes,
            dispatch_ahead: c.dispatch_ahead,
            keepalive: Duration::from_millis(config.worker.keepalive_ms),
            disagg_min_tokens: c.disagg_min_tokens,
        }
    }
}

/// The longest a starting coordinator waits for a first heartbeat.
const DISCOVERY_FIRST: Duration = Duration::from_secs(1);
/// Once workers answer: the quiet that ends the window, and its cap (a large fleet's
/// heartbeats never go quiet).
const DISCOVERY_QUIET: Duration = Duration::from_millis(150);
const DISCOVERY_CAP: Duration = Duration::from_secs(2);

/// Waits while workers answer a discover: for the first heartbeat (up to
/// [`DISCOVERY_FIRST`]: a fleet with no workers yet starts that much later), then
/// until they go quiet. Returns the heartbeat batches heard.
async fn discovery_window(hearing: &mut tokio::sync::watch::Receiver<u64>) -> u64 {
    let cap = tokio::time::Instant::now() + DISCOVERY_CAP;
    let mut wait = DISCOVERY_FIRST;
    loop {
        let until = cap.min(tokio::time::Instant::now() + wait);
        match tokio::time::timeout_at(until, hearing.changed()).await {
            Ok(Ok(())) => wait = DISCOVERY_QUIET,
            _ => return *hearing.borrow(),
        }
    }
}

/// A running coordinator.
pub struct CoordinatorHandle {
    client: async_nats::Client,
    actor: ActorRef<CoordinatorMsg>,
    stats: std::sync::Arc<stats::CoordinatorStats>,
    tasks: Vec<JoinHandle<()>>,
    service: Option<async_nats::service::Service>,
    handed_off: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    root: switchyard_fabric::RootWatch,
}

impl CoordinatorHandle {
    /// Starts a coordinator on `client`.
    pub async fn start(client: async_nats::Client, opts: CoordinatorOptions) -> anyhow::Result<Self> {
        let stats = std::sync::Arc::new(stats::CoordinatorStats::default());
        let fleet_queue = queue::FleetQueue::new(opts.max_queued as usize, opts.max_queued_bytes);
        waiting::register_depth_gauge(opts.coordinator_id.clone(), &fleet_queue.depths());
        let (actor, join) = Actor::spawn(
            None,
            CoordinatorActor,
            CoordinatorArgs {
                coordinator_id: opts.coordinator_id.clone(),
                expiry: opts.worker_expiry,
                stats: stats.clone(),
                max_candidates: opts.max_attempts as usize,
                routing: opts.routing,
                queue: fleet_queue,
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("starting the coordinator actor: {e}"))?;
        let root =
            switchyard_fabric::RootWatch::start(join, client.clone(), format!("coordinator {}", opts.coordinator_id));
        let mut tasks = Vec::new();
        let book = holdings::HoldingsBook::new(opts.worker_expiry);

        // Heartbeats, as many as are waiting per actor call (one round trip per batch,
        // not per heartbeat, and still backpressure: the next batch waits for this
        // one). A worker seen for the first time (or again after expiring) gets its
        // KV snapshot fetched, so a coordinator that starts after its workers routes
        // to warm prefixes at once.
        let mut heartbeats = client
            .subscribe(opts.subjects.heartbeat_all())
            .await?
            .ready_chunks(BATCH);
        let snapshots = Snapshots {
            actor: actor.clone(),
            book: book.clone(),
            client: client.clone(),
            subjects: opts.subjects.clone(),
        };
        let (a, fetch) = (actor.clone(), snapshots.clone());
        let (heard, mut hearing) = tokio::sync::watch::channel(0u64);
        tasks.push(tokio::spawn(async move {
            while let Some(batch) = heartbeats.next().await {
                let beats: Vec<switchyard_messages::Heartbeat> = batch
                    .iter()
                    .filter_map(|msg| {
                        switchyard_messages::decode(&msg.payload)
                            .map_err(|e| tracing::warn!(subject = %msg.subject, "bad heartbeat: {e}"))
                            .ok()
                    })
                    .collect();
                if beats.is_empty() {
                    continue;
                }
                fetch.book.formats(&beats);
                if let Ok(joined) = ractor::call_t!(a, CoordinatorMsg::Heartbeats, 5_000, beats) {
                    for worker in joined {
                        fetch.fetch(worker);
                    }
                }
                heard.send_modify(|n| *n += 1);
            }
        }));

        // KV events: applied in order; a gap (a lost event, or a coordinator that
        // started after the worker) fetches the worker's snapshot.
        let mut kv_events = client.subscribe(opts.subjects.kv_all()).await?.ready_chunks(BATCH);
        let (a, fetch) = (actor.clone(), snapshots);
        tasks.push(tokio::spawn(async move {
            while let Some(batch) = kv_events.next().await {
                let events: Vec<switchyard_messages::KvEvent> = batch
                    .iter()
                    .filter_map(|msg| {
                        switchyard_messages::decode(&msg.payload)
                            .map_err(|e| tracing::warn!(subject = %msg.subject, "bad kv event: {e}"))
                            .ok()
                    })
                    .collect();
                if events.is_empty() {
                    continue;
                }
                for e in &events {
                    fetch.book.event(e);
                }
                let Ok(gaps) = ractor::call_t!(a, CoordinatorMsg::Kv, 5_000, events) else {
                    continue;
                };
                for worker in gaps {
                    tracing::debug!(%worker, "kv events lost; fetching a snapshot");
                    fetch.fetch(worker);
                }
            }
        }));

        // Cancels: a request still waiting here leaves the queue at once.
        let mut cancels = client.subscribe(opts.subjects.cancel_all()).await?;
        let a = actor.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(msg) = cancels.next().await {
                let Some(request_id) = msg.subject.as_str().rsplit('.').next() else {
                    continue;
                };
                if let Ok(c) = switchyard_messages::decode::<switchyard_messages::CancelRequest>(&msg.payload) {
                    let _ = a.cast(CoordinatorMsg::Cancel(request_id.to_string(), c.inbox));
                }
            }
        }));

        // Ask every worker to heartbeat now instead of waiting a period, and hear the
        // answers before joining the queue group: a coordinator that joined at once
        // would answer its share of requests `no_worker` while the fleet it is about
        // to know of is still announcing itself (the other coordinators serve them
        // meanwhile; a lone one is not reachable for that second).
        hearing.mark_unchanged();
        let _ = client.publish(opts.subjects.discover(), bytes::Bytes::new()).await;
        let _ = tokio::time::timeout(Duration::from_secs(1), client.flush()).await;
        let heard = discovery_window(&mut hearing).await;
        tracing::debug!(coordinator = %opts.coordinator_id, heartbeat_batches = heard, "discovery window over");

        let service = client
            .service_builder()
            .description(format!("switchyard coordinator {}", opts.coordinator_id))
            .queue_group(COORDINATOR_QUEUE)
            .start("switchyard-coordinator", env!("CARGO_PKG_VERSION"))
            .await
            .map_err(|e| anyhow::anyhow!("registering the NATS micro service: {e}"))?;
        let ctx = service::ForwardContext {
            client: client.clone(),
            actor: actor.clone(),
            subjects: opts.subjects.clone(),
            admission_timeout: opts.admission_timeout,
            max_attempts: opts.max_attempts,
            kv_routing: opts.kv_routing,
            disagg_min_tokens: opts.disagg_min_tokens as usize,
            holdings: book.clone(),
            limits: std::sync::Arc::new(opts.limits.clone()),
            waiter: waiting::Waiter {
                client: client.clone(),
                actor: actor.clone(),
                options: waiting::QueueOptions {
                    timeout: opts.queue_timeout,
                    ahead: opts.dispatch_ahead,
                    keepalive: opts.keepalive,
                },
                handed_off: Default::default(),
            },
            tickets: Default::default(),
        };
        let handed_off = ctx.waiter.handed_off.clone();
        use service::Verb;
        for (subject, verb) in [
            (opts.subjects.generate(), Verb::Generate),
            (opts.subjects.chat(), Verb::Chat),
            (opts.subjects.classify(), Verb::Classify),
            (opts.subjects.embed(), Verb::Embed),
            (opts.subjects.batch(), Verb::Batch),
        ] {
            let ctx = ctx.clone();
            tasks.push(
                serve_endpoint(&service, verb.name(), subject, move |request| {
                    service::forward(ctx.clone(), request.message, verb)
                })
                .await
                .map_err(anyhow::Error::msg)?,
            );
        }
        // Streams relayed by draining workers (1.12): a subject only workers may
        // publish on, so a client can never name the inbox a stream goes to.
        for (subject, verb) in [
            (opts.subjects.relay("generate"), Verb::Generate),
            (opts.subjects.relay("chat"), Verb::Chat),
        ] {
            let ctx = ctx.clone();
            let name = format!("relay_{}", verb.name());
            tasks.push(
                serve_endpoint(&service, &name, subject, move |request| {
                    service::relayed(ctx.clone(), request.message, verb)
                })
                .await
                .map_err(anyhow::Error::msg)?,
            );
        }
        let session_ctx = ctx.clone();
        tasks.push(
            serve_endpoint(&service, "session_open", opts.subjects.session_open(), move |request| {
                session_open::open_session(session_ctx.clone(), request)
            })
            .await
            .map_err(anyhow::Error::msg)?,
        );
        // Sessions moved by draining workers (1.13): workers alone may publish here.
        let session_ctx = ctx.clone();
        tasks.push(
            serve_endpoint(
                &service,
                "relay_session",
                opts.subjects.relay("session"),
                move |request| session_open::adopt_session(session_ctx.clone(), request),
            )
            .await
            .map_err(anyhow::Error::msg)?,
        );
        for (name, subject) in [("status", opts.subjects.status()), ("models", opts.subjects.models())] {
            let a = actor.clone();
            tasks.push(
                serve_endpoint(&service, name, subject, move |request| {
                    let a = a.clone();
                    async move {
                        let body = if name == "status" {
                            ractor::call_t!(a, CoordinatorMsg::Status, 5_000).map(|s: FleetStatus| encode(&s))
                        } else {
                            ractor::call_t!(a, CoordinatorMsg::Models, 5_000).map(|m: ModelsReply| encode(&m))
                        };
                        let body = body.unwrap_or_else(|e| {
                            encode(&switchyard_messages::ErrorReply {
                                v: switchyard_messages::PROTOCOL_VERSION,
                                error: switchyard_messages::WireError::new(
                                    switchyard_messages::ErrorCode::Internal,
                                    e.to_string(),
                                ),
                            })
                        });
                        let _ = request.respond(Ok(body.into())).await;
                    }
                })
                .await
                .map_err(anyhow::Error::msg)?,
            );
        }
        Ok(Self {
            client,
            actor,
            stats,
            tasks,
            service: Some(service),
            handed_off,
            root,
        })
    }

    /// Resolves once the coordinator's actor has ended without [`Self::shutdown`] (a
    /// panic in its handler): its NATS connection is drained by then, so the other
    /// coordinators take its share of the traffic. A process should exit non-zero;
    /// its service manager starts it again (the registry rebuilds from heartbeats).
    pub async fn failed(&self) -> String {
        self.root.failed().await
    }

    /// Makes the actor panic in its handler (the supervision tests).
    #[doc(hidden)]
    pub fn inject_panic(&self) {
        let _ = self.actor.cast(CoordinatorMsg::Panic);
    }

    /// The current fleet view.
    pub async fn status(&self) -> anyhow::Result<FleetStatus> {
        ractor::call_t!(self.actor, CoordinatorMsg::Status, 5_000)
            .map_err(|e| anyhow::anyhow!("coordinator status: {e}"))
    }

    /// The actor's counters: decisions (and their latency), heartbeats, KV events.
    pub fn stats(&self) -> std::sync::Arc<stats::CoordinatorStats> {
        self.stats.clone()
    }

    /// Stops serving. When this returns, the NATS server has dropped this
    /// coordinator's subscriptions, so requests go to other coordinators (or get
    /// "no responders") rather than into the void.
    /// Requests waiting here are handed to another coordinator (published again to
    /// the queue group once this one has left it), so none is lost.
    ///
    /// Bounded: every wait on the NATS server is cut off after a few seconds, and
    /// with the server gone (a service manager often stops services exactly then)
    /// none is waited on at all — there is no one to hand requests to or to tell.
    pub async fn shutdown(mut self) {
        let connected = self.client.connection_state() == async_nats::connection::State::Connected;
        // One deadline for every wait on the server (a process gives the whole stop
        // 10 s): nothing at all with the server gone.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(if connected { 7 } else { 0 });
        let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
        if let Some(s) = self.service.take() {
            let _ = tokio::time::timeout(left(), s.stop()).await;
        }
        let _ = tokio::time::timeout(left(), self.client.flush()).await;
        // With the server gone there is no one to hand waiting requests to.
        let handoff = match connected {
            true => ractor::call_t!(self.actor, CoordinatorMsg::Handoff, left().as_millis() as u64).ok(),
            false => None,
        };
        if let Some(n) = handoff {
            let until = tokio::time::Instant::now() + Duration::from_secs(2).min(left());
            while self.handed_off.load(std::sync::atomic::Ordering::Acquire) < n && tokio::time::Instant::now() < until
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if n > 0 {
                tracing::info!(requests = n, "waiting requests handed to the other coordinators");
            }
        }
        for t in self.tasks.drain(..) {
            t.abort();
        }
        // Drain unsubscribes everything and flushes before closing.
        let drain_for = match connected {
            true => left().max(Duration::from_secs(1)),
            false => Duration::ZERO,
        };
        let _ = tokio::time::timeout(drain_for, self.client.drain()).await;
        self.root.stopping();
        self.actor.stop(None);
    }
}

/// Where a worker's KV snapshot goes: the actor's block index and the holdings book.
#[derive(Clone)]
struct Snapshots {
    actor: ActorRef<CoordinatorMsg>,
    book: holdings::HoldingsBook,
    client: async_nats::Client,
    subjects: Subjects,
}

impl Snapshots {
    /// Asks `worker` for its KV snapshot (in the background) and applies it. It is
    /// also the probe of a worker that joined: its round trip ends the worker's
    /// probation.
    fn fetch(&self, worker: String) {
        let Self {
            actor,
            book,
            client,
            subjects,
        } = self.clone();
        tokio::spawn(async move {
            let sent = std::time::Instant::now();
            let subject = subjects.kv_snapshot(&worker);
            let reply = tokio::time::timeout(Duration::from_secs(5), client.request(subject, Vec::new().into())).await;
            if matches!(reply, Ok(Ok(_))) {
                let _ = actor.cast(CoordinatorMsg::RoundTrip(worker.clone(), sent.elapsed()));
            }
            match reply.map(|r| r.map(|m| switchyard_messages::decode::<switchyard_messages::KvSnapshot>(&m.payload))) {
                Ok(Ok(Ok(snapshot))) => {
                    book.snapshot(&snapshot);
                    let _ = actor.cast(CoordinatorMsg::KvSnapshot(snapshot));
                }
                _ => tracing::debug!(%worker, "no kv snapshot"),
            }
        });
    }
}

/// A default coordinator id: `coord-{host}-{pid}`.
pub fn default_coordinator_id() -> String {
    switchyard_fabric::host::subject_token(&format!(
        "coord-{}-{}",
        switchyard_fabric::host::hostname(),
        std::process::id()
    ))
}
