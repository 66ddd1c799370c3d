//! The WorkerActor: one per device, owning one loaded model. It announces itself
//! (heartbeats, NATS micro service), serves `{p}.v1.worker.{wid}.*` through
//! [`crate::worker::service`], and drains on shutdown.

mod adapters;
pub mod admission;
pub mod coalesce;
pub mod context;
mod embed;
pub mod handover;
pub mod kv_transfer;
pub mod prefix_index;
pub mod reasoning;
pub mod recent;
pub mod service;
pub mod session;
pub mod telemetry;
pub mod tools;
mod unary;

use admission::Admission;
use async_nats::service::ServiceExt;
use futures::StreamExt;
use prefix_index::{KvArgs, KvCacheActor, KvMsg};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use service::ServeContext;
use session::SessionHost;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use switchyard_backend::TextModel;
use switchyard_fabric::nats::serve_endpoint;
use switchyard_fabric::CancelRegistry;
use switchyard_messages::{BackendKind, Device, ServedModel, Subjects, WorkerStatus, PROTOCOL_VERSION};
use tokio::task::JoinHandle;

/// How a worker presents itself and behaves.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Unique id (one subject token).
    pub worker_id: String,
    /// The device it computes on.
    pub device: Device,
    /// The backend serving its model.
    pub backend: BackendKind,
    /// Name requests use for the model.
    pub model_name: String,
    /// Where the model was loaded from.
    pub model_path: PathBuf,
    /// Subjects (prefix).
    pub subjects: Subjects,
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// Keep-alive period for busy streams.
    pub keepalive: Duration,
    /// Longest a token waits to share a chunk with the next ones (zero: never);
    /// see [`coalesce`].
    pub coalesce: Duration,
    /// Requests computed at once.
    pub capacity: u32,
    /// Requests that may wait.
    pub queue_depth: u32,
    /// A session with no calls for this long is closed.
    pub session_idle: Duration,
    /// What one request may ask for.
    pub limits: switchyard_messages::InputLimits,
    /// Pull prefixes from peers ([`kv_transfer`]).
    pub kv_pull: bool,
    /// Hand running streams to other workers when draining ([`handover`]).
    pub handover: bool,
    /// Its part in disaggregated prefill/decode.
    pub role: switchyard_messages::WorkerRole,
}

/// Messages the WorkerActor handles.
pub enum WorkerMsg {
    /// Publish a heartbeat now (timer tick or a coordinator's discover).
    Heartbeat,
    /// Report the current status.
    Status(RpcReplyPort<WorkerStatus>),
    /// Stop taking requests and announce it.
    Drain(RpcReplyPort<()>),
    /// The worker's sessions (the drain moves them to other workers).
    Sessions(RpcReplyPort<Arc<SessionHost>>),
    /// Fault injection for the supervision tests.
    #[doc(hidden)]
    Fault(Fault),
}

/// Faults the supervision tests inject into a running worker's actors.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub enum Fault {
    /// The KvCacheActor panics in its handler.
    PanicKvCache,
    /// This session's actor panics while handling its next call.
    PanicSessionOnNextCall(String),
    /// The WorkerActor itself panics in its handler (the root: the process must
    /// notice, see [`WorkerHandle::failed`]).
    PanicWorker,
}

struct WorkerState {
    client: async_nats::Client,
    opts: WorkerOptions,
    ctx: Arc<ServeContext>,
    info: switchyard_messages::ModelInfo,
    completed: Arc<AtomicU64>,
    seq: u64,
    started_at_ms: u64,
    host: String,
    tasks: Vec<JoinHandle<()>>,
    service: Option<async_nats::service::Service>,
    /// The linked KvCacheActor now running.
    kv: ActorRef<KvMsg>,
    sessions: Arc<SessionHost>,
}

/// Starts a KvCacheActor linked under the WorkerActor and hands it to the request
/// handlers.
async fn spawn_kv(
    myself: &ActorRef<WorkerMsg>,
    ctx: &ServeContext,
    opts: &WorkerOptions,
    restarted: bool,
) -> Result<ActorRef<KvMsg>, ActorProcessingErr> {
    let args = KvArgs {
        client: ctx.client.clone(),
        worker_id: opts.worker_id.clone(),
        // One resident sequence per slot, on the CPU engine as on a llama.cpp server.
        slots: opts.capacity as usize,
        subject: opts.subjects.kv(&opts.worker_id),
        restarted,
        held: ctx.model.kv_holdings(),
    };
    let (kv, _) = Actor::spawn_linked(None, KvCacheActor, args, myself.get_cell()).await?;
    *ctx.kv.lock().unwrap_or_else(|p| p.into_inner()) = Some(kv.clone());
    Ok(kv)
}

impl WorkerState {
    fn status(&mut self) -> WorkerStatus {
        self.seq += 1;
        let (in_flight, queued) = self.ctx.admission.load();
        WorkerStatus {
            v: PROTOCOL_VERSION,
            worker_id: self.opts.worker_id.clone(),
            device: self.opts.device.to_string(),
            backend: self.opts.backend.to_string(),
            models: vec![ServedModel {
                name: self.opts.model_name.clone(),
                path: self.opts.model_path.display().to_string(),
                info: switchyard_messages::ModelInfo {
                    // A pipeline's stages change as they answer.
                    pipeline: self.ctx.model.info().pipeline,
                    ..self.info.clone()
                },
                adapters: self.ctx.model.adapters(),
                kv_format: self.ctx.model.kv_transfer().and_then(|k| k.kv_format()),
            }],
            capacity: self.ctx.admission.capacity(),
            queue_capacity: self.ctx.admission.queue(),
            in_flight,
            queued,
            available: self.ctx.model.healthy(),
            draining: self.ctx.draining.load(Ordering::Acquire),
            host: self.host.clone(),
            pid: std::process::id(),
            started_at_ms: self.started_at_ms,
            seq: self.seq,
            completed: self.completed.load(Ordering::Relaxed),
            version: env!("CARGO_PKG_VERSION").to_string(),
            kv: {
                let recent = self.ctx.recent.lock().unwrap_or_else(|p| p.into_inner());
                switchyard_messages::KvUsage {
                    hit_ratio: recent.hit_ratio(),
                    transfer: self.ctx.transfer.stats(),
                    ..self.ctx.model.kv_usage()
                }
            },
            recent: self.ctx.recent.lock().unwrap_or_else(|p| p.into_inner()).latency(),
            nats_server: switchyard_fabric::nats::connected_server(&self.client),
            role: self.opts.role,
        }
    }

    /// What a heartbeat carries: the status and the measured speed.
    fn heartbeat(&mut self) -> switchyard_messages::Heartbeat {
        switchyard_messages::Heartbeat {
            status: self.status(),
            speed: self.ctx.recent.lock().unwrap_or_else(|p| p.into_inner()).speed(),
        }
    }
}

struct WorkerActor;

struct WorkerArgs {
    client: async_nats::Client,
    model: Arc<dyn TextModel>,
    opts: WorkerOptions,
}

impl Actor for WorkerActor {
    type Msg = WorkerMsg;
    type State = WorkerState;
    type Arguments = WorkerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<WorkerMsg>,
        args: WorkerArgs,
    ) -> Result<WorkerState, ActorProcessingErr> {
        let WorkerArgs { client, model, opts } = args;
        let completed = Arc::new(AtomicU64::new(0));
        let counter = completed.clone();
        let me = myself.clone();
        let admission = Admission::new(opts.capacity, opts.queue_depth);
        let ctx = Arc::new(ServeContext {
            client: client.clone(),
            worker_id: opts.worker_id.clone(),
            backend: opts.backend.to_string(),
            device: opts.device.to_string(),
            model_name: opts.model_name.clone(),
            model: model.clone(),
            admission,
            cancels: CancelRegistry::default(),
            draining: AtomicBool::new(false),
            keepalive: opts.keepalive,
            coalesce: opts.coalesce,
            limits: opts.limits.clone(),
            // A heartbeat at once after each request, so coordinators see the freed
            // capacity (and route the next turn of a conversation back here) without
            // waiting for the next period.
            on_complete: Box::new(move || {
                counter.fetch_add(1, Ordering::Relaxed);
                let _ = me.cast(WorkerMsg::Heartbeat);
            }),
            kv: std::sync::Mutex::new(None),
            recent: std::sync::Mutex::default(),
            subjects: opts.subjects.clone(),
            transfer: Default::default(),
            kv_pull: opts.kv_pull,
            handover: handover::Handover::new(opts.handover),
        });
        // The engine says when what it holds changes (a prompt claims a slot, its
        // a stream ends): the KvCacheActor announces it at once.
        let weak = Arc::downgrade(&ctx);
        model.watch_kv(Box::new(move |now| {
            if let Some(ctx) = weak.upgrade() {
                ctx.tell_kv(KvMsg::Holdings(now));
            }
        }));

        let metadata = HashMap::from([
            ("worker_id".to_string(), opts.worker_id.clone()),
            ("device".to_string(), opts.device.to_string()),
            ("backend".to_string(), opts.backend.to_string()),
            ("model".to_string(), opts.model_name.clone()),
        ]);
        let service = client
            .service_builder()
            .description(format!(
                "switchyard worker {} ({} on {})",
                opts.worker_id, opts.model_name, opts.device
            ))
            .metadata(metadata)
            .start("switchyard-worker", env!("CARGO_PKG_VERSION"))
            .await
            .map_err(|e| format!("registering the NATS micro service: {e}"))?;
        let mut tasks = Vec::new();
        // One endpoint per verb; streaming verbs and one-reply verbs differ only in
        // the handler.
        #[derive(Clone, Copy)]
        enum Handler {
            Stream { chat: bool },
            Unary(unary::Unary),
            SessionOpen,
            SessionAdopt,
            Adapters,
            Prefill,
        }
        let sessions = SessionHost::new(ctx.clone(), opts.subjects.clone(), opts.session_idle, myself.get_cell());
        crate::worker::telemetry::register_gauges(&ctx);
        for (verb, handler) in [
            ("generate", Handler::Stream { chat: false }),
            ("chat", Handler::Stream { chat: true }),
            ("classify", Handler::Unary(unary::Unary::Classify)),
            ("embed", Handler::Unary(unary::Unary::Embed)),
            ("batch", Handler::Unary(unary::Unary::Batch)),
            ("session_open", Handler::SessionOpen),
            ("session_adopt", Handler::SessionAdopt),
            ("adapters", Handler::Adapters),
            ("prefill", Handler::Prefill),
        ] {
            let ctx = ctx.clone();
            let me = myself.clone();
            let sessions = sessions.clone();
            let subject = opts.subjects.worker(&opts.worker_id, verb);
            let serve = move |request: async_nats::service::Request| {
                let (ctx, sessions, me) = (ctx.clone(), sessions.clone(), me.clone());
                async move {
                    match handler {
                        Handler::Stream { chat } => service::handle(ctx, request, chat).await,
                        Handler::Unary(verb) => unary::handle_unary(ctx, request, verb).await,
                        Handler::Prefill => kv_transfer::serve_prefill(ctx, request).await,
                        Handler::SessionOpen => {
                            let answer = sessions.handle_open(&request.message.payload).await;
                            let _ = request.respond(Ok(answer.into())).await;
                        }
                        Handler::SessionAdopt => {
                            let answer = sessions.handle_adopt(&request.message.payload).await;
                            let _ = request.respond(Ok(answer.into())).await;
                        }
                        Handler::Adapters => {
                            let (answer, changed) = adapters::handle(&ctx, &request.message.payload).await;
                            let _ = request.respond(Ok(answer.into())).await;
                            if changed {
                                // Coordinators learn of it now, not a period later.
                                let _ = me.cast(WorkerMsg::Heartbeat);
                            }
                        }
                    }
                }
            };
            tasks.push(serve_endpoint(&service, verb, subject, serve).await?);
        }
        let mut cancels = client.subscribe(opts.subjects.cancel_all()).await?;
        let registry = ctx.cancels.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(msg) = cancels.next().await {
                let Some(id) = msg.subject.rsplit('.').next() else {
                    continue;
                };
                let inbox = switchyard_messages::decode::<switchyard_messages::CancelRequest>(&msg.payload)
                    .map(|c| c.inbox)
                    .unwrap_or_default();
                match registry.cancel(id, &inbox) {
                    switchyard_fabric::Cancelled::Yes => tracing::debug!(request = id, "cancelled by client"),
                    switchyard_fabric::Cancelled::NotRequester => {
                        tracing::warn!(
                            request = id,
                            "a cancel that does not name the requester's inbox was ignored"
                        )
                    }
                    switchyard_fabric::Cancelled::Unknown => {}
                }
            }
        }));
        // Peers pull KV this worker holds.
        tasks.push(kv_transfer::serve(ctx.clone(), opts.subjects.kv_pull(&opts.worker_id)).await?);
        let mut snapshots = client.subscribe(opts.subjects.kv_snapshot(&opts.worker_id)).await?;
        let kv_ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(msg) = snapshots.next().await {
                if let Some(reply) = msg.reply {
                    kv_ctx.tell_kv(KvMsg::Snapshot(reply.to_string()));
                }
            }
        }));
        let mut discover = client.subscribe(opts.subjects.discover()).await?;
        let me = myself.clone();
        tasks.push(tokio::spawn(async move {
            while discover.next().await.is_some() {
                let _ = me.cast(WorkerMsg::Heartbeat);
            }
        }));
        tasks.push(tokio::spawn({
            let me = myself.clone();
            let period = opts.heartbeat;
            let model = model.clone();
            // A heartbeat every period, and one at once when the model's health
            // changes, so coordinators stop (or resume) routing here without waiting.
            async move {
                let poll = period.min(Duration::from_millis(100));
                let mut tick = tokio::time::interval(poll);
                let mut last_beat = tokio::time::Instant::now() - period;
                let mut healthy = model.healthy();
                loop {
                    tick.tick().await;
                    let now_healthy = model.healthy();
                    if now_healthy == healthy && last_beat.elapsed() + poll / 2 < period {
                        continue;
                    }
                    healthy = now_healthy;
                    last_beat = tokio::time::Instant::now();
                    if me.cast(WorkerMsg::Heartbeat).is_err() {
                        break;
                    }
                }
            }
        }));

        let kv = spawn_kv(&myself, &ctx, &opts, false).await?;
        Ok(WorkerState {
            kv,
            sessions,
            client,
            info: model.info(),
            opts,
            ctx,
            completed,
            seq: 0,
            started_at_ms: switchyard_fabric::now_ms(),
            host: switchyard_fabric::host::hostname(),
            tasks,
            service: Some(service),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<WorkerMsg>,
        msg: WorkerMsg,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WorkerMsg::Heartbeat => {
                let beat = state.heartbeat();
                let subject = state.opts.subjects.heartbeat(&state.opts.worker_id);
                if let Err(e) = switchyard_fabric::nats::publish(&state.client, subject, &beat).await {
                    tracing::warn!("heartbeat not sent: {e}");
                }
            }
            WorkerMsg::Status(reply) => {
                let _ = reply.send(state.status());
            }
            WorkerMsg::Sessions(reply) => {
                let _ = reply.send(state.sessions.clone());
            }
            WorkerMsg::Drain(reply) => {
                state.ctx.draining.store(true, Ordering::Release);
                let beat = state.heartbeat();
                let subject = state.opts.subjects.heartbeat(&state.opts.worker_id);
                let _ = switchyard_fabric::nats::publish(&state.client, subject, &beat).await;
                // Bounded: with the NATS server gone a flush would wait for it.
                let _ = tokio::time::timeout(Duration::from_secs(1), state.client.flush()).await;
                // Coordinators know it drains: its streams move on to other workers.
                state.ctx.handover.begin();
                let _ = reply.send(());
            }
            WorkerMsg::Fault(Fault::PanicKvCache) => {
                let _ = state.kv.cast(KvMsg::Panic);
            }
            WorkerMsg::Fault(Fault::PanicSessionOnNextCall(id)) => state.sessions.arm_panic(&id),
            WorkerMsg::Fault(Fault::PanicWorker) => panic!("injected fault: the worker actor panics"),
        }
        Ok(())
    }

    /// The supervision tree: a failed KvCacheActor is started again (it announces a
    /// fresh start); a failed SessionActor's session is closed and forgotten (its
    /// caller already got an error reply). Neither takes the worker down.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<WorkerMsg>,
        event: SupervisionEvent,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(cell, why) = event {
            if cell.get_id() == state.kv.get_id() {
                tracing::error!(worker = %state.opts.worker_id, "kv cache actor failed ({why}); starting a new one");
                *state.ctx.kv.lock().unwrap_or_else(|p| p.into_inner()) = None;
                state.kv = spawn_kv(&myself, &state.ctx, &state.opts, true).await?;
            } else if let Some(session) = state.sessions.actor_failed(cell.get_id()) {
                tracing::error!(worker = %state.opts.worker_id, %session, "session actor failed ({why}); session closed");
            }
        }
        Ok(())
    }

    async fn post_stop(&self, _myself: ActorRef<WorkerMsg>, state: &mut WorkerState) -> Result<(), ActorProcessingErr> {
        state.ctx.cancels.cancel_all();
        for t in state.tasks.drain(..) {
            t.abort();
        }
        // With the NATS server gone there is no one to tell: do not wait for it.
        let connected = state.client.connection_state() == async_nats::connection::State::Connected;
        let bound = Duration::from_secs(if connected { 5 } else { 0 });
        if let Some(service) = state.service.take() {
            let _ = tokio::time::timeout(bound, service.stop()).await;
        }
        // Unsubscribe everything and flush, so coordinators get "no responders" for
        // this worker at once instead of waiting for its heartbeats to expire.
        let _ = tokio::time::timeout(bound, state.client.drain()).await;
        Ok(())
    }
}

/// The public face of a running worker.
#[derive(Clone)]
pub struct WorkerHandle {
    actor: ActorRef<WorkerMsg>,
    worker_id: String,
    root: switchyard_fabric::RootWatch,
}

impl WorkerHandle {
    /// Starts a worker serving `model` over `client`.
    pub async fn start(
        client: async_nats::Client,
        model: Arc<dyn TextModel>,
        opts: WorkerOptions,
    ) -> anyhow::Result<Self> {
        let worker_id = opts.worker_id.clone();
        let (actor, join) = Actor::spawn(
            None,
            WorkerActor,
            WorkerArgs {
                client: client.clone(),
                model,
                opts,
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("starting worker {worker_id}: {e}"))?;
        let root = switchyard_fabric::RootWatch::start(join, client, format!("worker {worker_id}"));
        let _ = actor.cast(WorkerMsg::Heartbeat);
        Ok(Self { actor, worker_id, root })
    }

    /// Resolves once the worker's actor has ended without [`Self::shutdown`] (a
    /// panic in its handler): its NATS connection is drained by then, so it serves
    /// nothing. A process should exit non-zero; its service manager starts it again.
    pub async fn failed(&self) -> String {
        self.root.failed().await
    }

    /// The worker's id.
    pub fn id(&self) -> &str {
        &self.worker_id
    }

    /// Injects a fault into one of the worker's actors (the supervision tests).
    #[doc(hidden)]
    pub fn inject_fault(&self, fault: Fault) {
        let _ = self.actor.cast(WorkerMsg::Fault(fault));
    }

    /// The worker's current status (what its next heartbeat will say).
    pub async fn status(&self) -> anyhow::Result<WorkerStatus> {
        ractor::call_t!(self.actor, WorkerMsg::Status, 5_000).map_err(|e| anyhow::anyhow!("worker status: {e}"))
    }

    /// Stops taking requests, waits up to `grace` for in-flight ones, then stops.
    pub async fn shutdown(self, grace: Duration) {
        let _ = ractor::call_t!(self.actor, WorkerMsg::Drain, 5_000);
        let deadline = tokio::time::Instant::now() + grace;
        // Sessions move to other workers with their KV (1.13), within the grace.
        if let Ok(sessions) = ractor::call_t!(self.actor, WorkerMsg::Sessions, 5_000) {
            if sessions.open_sessions() > 0 {
                let moved = sessions.move_all(deadline).await;
                tracing::info!(worker = %self.worker_id, moved, "sessions moved on drain");
            }
        }
        while tokio::time::Instant::now() < deadline {
            match self.status().await {
                Ok(s) if s.in_flight + s.queued > 0 => tokio::time::sleep(Duration::from_millis(50)).await,
                _ => break,
            }
        }
        // Wait for post_stop, which drains the NATS connection.
        self.root.stopping();
        let _ = self.actor.stop_and_wait(None, Some(Duration::from_secs(10))).await;
    }
}

/// A default worker id: `{backend}-{host}-{pid}`, reduced to subject-safe characters.
pub fn default_worker_id(backend: &str) -> String {
    switchyard_fabric::host::subject_token(&format!(
        "{backend}-{}-{}",
        switchyard_fabric::host::hostname(),
        std::process::id()
    ))
}
