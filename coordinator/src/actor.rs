//! The CoordinatorActor: owns the [`Registry`]; fed by heartbeats and expiry ticks;
//! answers routing queries. NATS plumbing lives in [`crate::service`].

use crate::registry::{Registry, RouteQuery};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::time::{Duration, Instant};
use switchyard_messages::{FleetStatus, KvEvent, KvSnapshot, ModelsReply, WireError, WorkerStatus, PROTOCOL_VERSION};

/// Messages the CoordinatorActor handles.
pub enum CoordinatorMsg {
    /// A worker's heartbeat arrived; answers whether the worker is new here.
    Heartbeat(WorkerStatus, RpcReplyPort<bool>),
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
    /// A worker's KV event; answers whether events were lost (fetch a snapshot).
    Kv(KvEvent, RpcReplyPort<bool>),
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
}

/// Start-up arguments.
pub struct CoordinatorArgs {
    /// This coordinator's id.
    pub coordinator_id: String,
    /// Heartbeat expiry.
    pub expiry: Duration,
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
            registry: Registry::new(args.expiry),
            coordinator_id: args.coordinator_id,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<CoordinatorMsg>,
        msg: CoordinatorMsg,
        state: &mut CoordinatorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CoordinatorMsg::Heartbeat(status, reply) => {
                let id = status.worker_id.clone();
                let joined = state.registry.heartbeat(status, Instant::now());
                if joined {
                    tracing::info!(worker = %id, "worker joined");
                }
                let _ = reply.send(joined);
            }
            CoordinatorMsg::Expire => {
                for id in state.registry.expire(Instant::now()) {
                    tracing::warn!(worker = %id, "worker expired: heartbeats stopped");
                    heartbeats_missed().add(1, &[opentelemetry::KeyValue::new("switchyard.worker.id", id)]);
                }
            }
            CoordinatorMsg::Route(query, reply) => {
                let route = state.registry.route(&query);
                if let Ok(Some(first)) = route.as_ref().map(|c| c.first()) {
                    let warm = state.registry.overlap(first, &query.blocks) > 0;
                    routing_decisions().add(
                        1,
                        &[opentelemetry::KeyValue::new(
                            "switchyard.routing.reason",
                            if warm { "kv_warm" } else { "load" },
                        )],
                    );
                    state.registry.routed(first, &query.blocks);
                }
                let _ = reply.send(route);
            }
            CoordinatorMsg::Routed(id, blocks) => state.registry.routed(&id, &blocks),
            CoordinatorMsg::Kv(event, reply) => {
                let _ = reply.send(state.registry.kv_event(&event));
            }
            CoordinatorMsg::KvSnapshot(snapshot) => state.registry.kv_snapshot(snapshot),
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
