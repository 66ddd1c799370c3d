//! The CoordinatorActor: owns the [`Registry`]; fed by heartbeats and expiry ticks;
//! answers routing queries. NATS plumbing lives in [`crate::service`].

use crate::registry::{Registry, RouteQuery, RoutingPolicy};
use crate::stats::CoordinatorStats;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_messages::{FleetStatus, Heartbeat, KvEvent, KvSnapshot, ModelsReply, WireError, PROTOCOL_VERSION};

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
    /// Workers' KV events, in order; answers the workers that lost events (fetch
    /// their snapshots).
    Kv(Vec<KvEvent>, RpcReplyPort<Vec<String>>),
    /// A worker's KV snapshot.
    KvSnapshot(KvSnapshot),
    /// The fleet view.
    Status(RpcReplyPort<FleetStatus>),
    /// Models served.
    Models(RpcReplyPort<ModelsReply>),
}

/// The actor (stateless; its state is the registry).
pub struct CoordinatorActor;

/// The actor's state.
pub struct CoordinatorState {
    registry: Registry,
    coordinator_id: String,
    stats: Arc<CoordinatorStats>,
    max_candidates: usize,
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
            }
            CoordinatorMsg::Expire => {
                for id in state.registry.expire(Instant::now()) {
                    tracing::warn!(worker = %id, "worker expired: heartbeats stopped");
                    heartbeats_missed().add(1, &[opentelemetry::KeyValue::new("switchyard.worker.id", id)]);
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
            }
            CoordinatorMsg::Status(reply) => {
                let _ = reply.send(FleetStatus {
                    v: PROTOCOL_VERSION,
                    coordinator_id: state.coordinator_id.clone(),
                    workers: state.registry.views(Instant::now()),
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
