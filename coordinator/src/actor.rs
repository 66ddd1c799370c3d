//! The CoordinatorActor: owns the [`Registry`]; fed by heartbeats and expiry ticks;
//! answers routing queries. NATS plumbing lives in [`crate::service`].

use crate::queue::{FleetQueue, Full, Ticket};
use crate::registry::{Registry, RouteQuery, RoutingPolicy};
use crate::stats::CoordinatorStats;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_messages::{
    ErrorCode, FleetStatus, Heartbeat, KvEvent, KvSnapshot, ModelsReply, WireError, PROTOCOL_VERSION,
};
use tokio::sync::oneshot;

/// How a wait in the fleet queue ended.
#[derive(Debug)]
pub enum Waited {
    /// Workers with room, best first; the first counts as routed already.
    Grant(Vec<String>),
    /// Refused (the model is no longer served, the queue is full).
    Refused(WireError),
    /// The client cancelled it.
    Cancelled,
    /// This coordinator is stopping: send the request to another one.
    Handoff,
}

/// Where a waiting request's answer goes.
pub type WaitSender = oneshot::Sender<Waited>;

/// Messages the CoordinatorActor handles.
pub enum CoordinatorMsg {
    /// Heartbeats arrived (as many as were waiting, in order); answers the workers
    /// among them that are new here.
    Heartbeats(Vec<Heartbeat>, RpcReplyPort<Vec<String>>),
    /// Drop workers whose heartbeats stopped.
    Expire,
    /// Candidate workers for a request, best first. The first counts as routed at
    /// once, so requests routed before its admission answer see it as loaded (and
    /// its prefix as warm there) instead of all picking the same idle worker.
    Route(RouteQuery, RpcReplyPort<Result<Vec<String>, WireError>>),
    /// A request with these prefix blocks was admitted by this worker (one that was
    /// not the first candidate).
    Routed(String, Vec<u64>),
    /// This worker did not answer; forget it until it heartbeats again.
    Remove(String),
    /// A round trip to this worker took this long (or it was waited for this long
    /// without an answer).
    RoundTrip(String, Duration),
    /// Workers' KV events, in order; answers the workers that lost events (fetch
    /// their snapshots).
    Kv(Vec<KvEvent>, RpcReplyPort<Vec<String>>),
    /// A worker's KV snapshot.
    KvSnapshot(KvSnapshot),
    /// The fleet view.
    Status(RpcReplyPort<FleetStatus>),
    /// Models served.
    Models(RpcReplyPort<ModelsReply>),
    /// A request waits for a worker with room (`query.room` is set); the answer
    /// comes on the sender — at once when a worker has room and nothing of its model
    /// waits ahead of it.
    Enqueue(Ticket, RouteQuery, WaitSender),
    /// A granted request found every worker full: back to the front of the queue;
    /// these workers count as full until their next heartbeat.
    Requeue(Ticket, RouteQuery, WaitSender, Vec<String>),
    /// A waiting request's time ran out: removes it and answers the wait to suggest
    /// (`None`: it was granted meanwhile; its grant is on its sender).
    Withdraw(u64, RpcReplyPort<Option<Duration>>),
    /// A client cancelled the request with this id, answered on this inbox.
    Cancel(String, String),
    /// Answers every waiting request [`Waited::Handoff`]; replies how many.
    Handoff(RpcReplyPort<usize>),
    /// Panics in the handler: an injected fault (the supervision tests).
    Panic,
}

/// The actor (stateless; its state is the registry).
pub struct CoordinatorActor;

/// The actor's state.
pub struct CoordinatorState {
    registry: Registry,
    coordinator_id: String,
    stats: Arc<CoordinatorStats>,
    max_candidates: usize,
    queue: FleetQueue,
    /// The waiting requests' routing queries and answer senders, by ticket id.
    waiting: HashMap<u64, (RouteQuery, WaitSender)>,
    /// Handed off: requests arriving from now on go to another coordinator too.
    stopping: bool,
}

/// Start-up arguments.
pub struct CoordinatorArgs {
    /// This coordinator's id.
    pub coordinator_id: String,
    /// Heartbeat expiry.
    pub expiry: Duration,
    /// Where the actor counts its work.
    pub stats: Arc<CoordinatorStats>,
    /// Candidates a `Route` answers with (the workers a request may try).
    pub max_candidates: usize,
    /// How candidates are ordered.
    pub routing: RoutingPolicy,
    /// The fleet queue (its bounds).
    pub queue: FleetQueue,
}

impl Actor for CoordinatorActor {
    type Msg = CoordinatorMsg;
    type State = CoordinatorState;
    type Arguments = CoordinatorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<CoordinatorMsg>,
        args: CoordinatorArgs,
    ) -> Result<CoordinatorState, ActorProcessingErr> {
        let tick = (args.expiry / 4).max(Duration::from_millis(50));
        myself.send_interval(tick, || CoordinatorMsg::Expire);
        Ok(CoordinatorState {
            registry: Registry::with_policy(args.expiry, args.routing),
            coordinator_id: args.coordinator_id,
            stats: args.stats,
            max_candidates: args.max_candidates.max(1),
            queue: args.queue,
            waiting: HashMap::new(),
            stopping: false,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<CoordinatorMsg>,
        msg: CoordinatorMsg,
        state: &mut CoordinatorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CoordinatorMsg::Heartbeats(beats, reply) => {
                let start = Instant::now();
                let n = beats.len();
                let mut joined = Vec::new();
                for beat in beats {
                    let id = beat.status.worker_id.clone();
                    if state.registry.heartbeat(beat, start) {
                        tracing::info!(worker = %id, "worker joined");
                        joined.push(id);
                    }
                }
                state.stats.heartbeats.add_many(n as u64, start.elapsed());
                let _ = reply.send(joined);
                pump(state);
            }
            CoordinatorMsg::Expire => {
                let gone = state.registry.expire(Instant::now());
                for id in &gone {
                    tracing::warn!(worker = %id, "worker expired: heartbeats stopped");
                    heartbeats_missed().add(1, &[opentelemetry::KeyValue::new("switchyard.worker.id", id.clone())]);
                }
                if !gone.is_empty() {
                    pump(state);
                }
            }
            CoordinatorMsg::Route(query, reply) => {
                let start = Instant::now();
                let route = state.registry.route_top(&query, state.max_candidates);
                let mut warm = None;
                if let Ok(r) = &route {
                    if let Some(first) = r.workers.first() {
                        warm = Some(r.warm > 0);
                        state.registry.routed(first, &query.blocks);
                    }
                }
                let took = start.elapsed();
                state.stats.decisions.add(took);
                state.stats.decision_latency.record(took);
                if let Some(warm) = warm {
                    let reason = if warm { "kv_warm" } else { "load" };
                    routing_decisions().add(1, &[opentelemetry::KeyValue::new("switchyard.routing.reason", reason)]);
                }
                let _ = reply.send(route.map(|r| r.workers));
            }
            CoordinatorMsg::Routed(id, blocks) => state.registry.routed(&id, &blocks),
            CoordinatorMsg::RoundTrip(id, took) => {
                state.registry.round_trip(&id, took);
                pump(state);
            }
            CoordinatorMsg::Kv(events, reply) => {
                let start = Instant::now();
                let mut gaps: Vec<String> = Vec::new();
                for e in &events {
                    if state.registry.kv_event(e) && !gaps.contains(&e.worker_id) {
                        gaps.push(e.worker_id.clone());
                    }
                }
                state.stats.kv_events.add_many(events.len() as u64, start.elapsed());
                let _ = reply.send(gaps);
            }
            CoordinatorMsg::KvSnapshot(snapshot) => {
                let start = Instant::now();
                state.registry.kv_snapshot(snapshot);
                state.stats.snapshots.add(start.elapsed());
            }
            CoordinatorMsg::Remove(id) => {
                if state.registry.remove(&id) {
                    tracing::warn!(worker = %id, "worker removed: it did not answer a forward");
                }
                pump(state);
            }
            CoordinatorMsg::Enqueue(ticket, query, tx) => enqueue(state, ticket, query, tx),
            CoordinatorMsg::Requeue(ticket, query, tx, full) => {
                for w in &full {
                    state.registry.saturate(w);
                }
                state.waiting.insert(ticket.id, (query, tx));
                state.queue.push_front(ticket);
                pump(state);
            }
            CoordinatorMsg::Withdraw(id, reply) => {
                let removed = state.queue.remove(id).map(|t| {
                    state.waiting.remove(&id);
                    state.queue.retry_after(&t.model, Instant::now())
                });
                let _ = reply.send(removed);
            }
            CoordinatorMsg::Cancel(request_id, inbox) => {
                if let Some(id) = state.queue.find(&request_id, &inbox) {
                    state.queue.remove(id);
                    if let Some((_, tx)) = state.waiting.remove(&id) {
                        let _ = tx.send(Waited::Cancelled);
                    }
                }
            }
            CoordinatorMsg::Panic => panic!("injected fault: the coordinator actor panics"),
            CoordinatorMsg::Handoff(reply) => {
                state.stopping = true;
                let n = state.waiting.len();
                for (id, (_, tx)) in state.waiting.drain() {
                    state.queue.remove(id);
                    let _ = tx.send(Waited::Handoff);
                }
                let _ = reply.send(n);
            }
            CoordinatorMsg::Status(reply) => {
                let _ = reply.send(FleetStatus {
                    v: PROTOCOL_VERSION,
                    coordinator_id: state.coordinator_id.clone(),
                    workers: state.registry.views(Instant::now()),
                    queues: state.queue.views(Instant::now()),
                });
            }
            CoordinatorMsg::Models(reply) => {
                let _ = reply.send(ModelsReply {
                    v: PROTOCOL_VERSION,
                    models: state.registry.models(),
                });
            }
        }
        Ok(())
    }
}

/// A request arrives for the fleet queue: granted at once when a worker has room and
/// nothing of its model waits ahead; refused when its model is not served or the
/// queue is full; else queued.
fn enqueue(state: &mut CoordinatorState, ticket: Ticket, query: RouteQuery, tx: WaitSender) {
    if state.stopping {
        let _ = tx.send(Waited::Handoff);
        return;
    }
    let route = state.registry.route_top(&query, state.max_candidates);
    match route {
        Err(e) => {
            let _ = tx.send(Waited::Refused(e));
        }
        Ok(r) if !r.workers.is_empty() && state.queue.head(&ticket.model).is_none() => {
            grant(state, &query, r, tx, Instant::now());
        }
        Ok(_) => match state.queue.push(ticket.clone()) {
            Ok(()) => {
                state.waiting.insert(ticket.id, (query, tx));
                pump(state);
            }
            Err(full) => {
                let why = match full {
                    Full::Count(n) => format!("{n} requests wait at this coordinator (coordinator.max_queued)"),
                    Full::Bytes(b) => {
                        format!("{b} bytes of requests wait at this coordinator (coordinator.max_queued_bytes)")
                    }
                };
                let after = state.queue.retry_after(&ticket.model, Instant::now());
                let e = WireError::new(ErrorCode::Overloaded, format!("the fleet queue is full: {why}"))
                    .with_retry_after(after.as_millis() as u64);
                let _ = tx.send(Waited::Refused(e));
            }
        },
    }
}

/// Hands waiting requests to workers with room, per model in priority and tenant
/// order, until the head of each model's queue finds none.
fn pump(state: &mut CoordinatorState) {
    if state.queue.is_empty() {
        return;
    }
    let now = Instant::now();
    for model in state.queue.models() {
        while let Some(id) = state.queue.head(&model).map(|t| t.id) {
            let Some((query, _)) = state.waiting.get(&id) else {
                state.queue.remove(id);
                continue;
            };
            match state.registry.route_top(query, state.max_candidates) {
                Ok(r) if r.workers.is_empty() => break,
                routed => {
                    state.queue.pop(&model);
                    let (query, tx) = state.waiting.remove(&id).expect("a queued ticket has a sender");
                    match routed {
                        Ok(r) => grant(state, &query, r, tx, now),
                        Err(e) => {
                            let _ = tx.send(Waited::Refused(e));
                        }
                    }
                }
            }
        }
    }
}

/// Sends a request to its route's first worker (counted as routed there at once).
fn grant(
    state: &mut CoordinatorState,
    query: &RouteQuery,
    route: crate::registry::Route,
    tx: WaitSender,
    now: Instant,
) {
    let start = Instant::now();
    state.queue.granted(&query.model, now);
    if let Some(first) = route.workers.first() {
        state.registry.routed(first, &query.blocks);
        let reason = if route.warm > 0 { "kv_warm" } else { "load" };
        routing_decisions().add(1, &[opentelemetry::KeyValue::new("switchyard.routing.reason", reason)]);
    }
    let took = start.elapsed();
    state.stats.decisions.add(took);
    state.stats.decision_latency.record(took);
    let _ = tx.send(Waited::Grant(route.workers));
}

/// `switchyard.heartbeats.missed`: workers dropped because their heartbeats stopped
/// for longer than the expiry.
fn heartbeats_missed() -> &'static opentelemetry::metrics::Counter<u64> {
    static C: std::sync::OnceLock<opentelemetry::metrics::Counter<u64>> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        opentelemetry::global::meter("switchyard")
            .u64_counter("switchyard.heartbeats.missed")
            .with_unit("{worker}")
            .with_description("Workers expired after their heartbeats stopped")
            .build()
    })
}

/// `switchyard.routing.decisions`: routes chosen, by reason (`kv_warm`: the first
/// candidate holds part of the prompt warm; `load`: it was chosen by load alone).
fn routing_decisions() -> &'static opentelemetry::metrics::Counter<u64> {
    static C: std::sync::OnceLock<opentelemetry::metrics::Counter<u64>> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        opentelemetry::global::meter("switchyard")
            .u64_counter("switchyard.routing.decisions")
            .with_unit("{request}")
            .with_description("Routing decisions by reason")
            .build()
    })
}
