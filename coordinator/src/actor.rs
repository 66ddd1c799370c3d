//! The CoordinatorActor: owns the [`Registry`]; fed by heartbeats and expiry ticks;
//! answers routing queries. NATS plumbing lives in [`crate::service`].

use crate::registry::{Registry, RouteQuery};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::time::{Duration, Instant};
use switchyard_messages::{FleetStatus, ModelsReply, WireError, WorkerStatus, PROTOCOL_VERSION};

/// Messages the CoordinatorActor handles.
pub enum CoordinatorMsg {
    /// A worker's heartbeat arrived.
    Heartbeat(WorkerStatus),
    /// Drop workers whose heartbeats stopped.
    Expire,
    /// Candidate workers for a request, best first.
    Route(RouteQuery, RpcReplyPort<Result<Vec<String>, WireError>>),
    /// A request was admitted by this worker.
    Routed(String),
    /// This worker did not answer; forget it until it heartbeats again.
    Remove(String),
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
            CoordinatorMsg::Heartbeat(status) => {
                let id = status.worker_id.clone();
                if state.registry.heartbeat(status, Instant::now()) {
                    tracing::info!(worker = %id, "worker joined");
                }
            }
            CoordinatorMsg::Expire => {
                for id in state.registry.expire(Instant::now()) {
                    tracing::warn!(worker = %id, "worker expired: heartbeats stopped");
                }
            }
            CoordinatorMsg::Route(query, reply) => {
                let _ = reply.send(state.registry.route(&query));
            }
            CoordinatorMsg::Routed(id) => state.registry.routed(&id),
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
