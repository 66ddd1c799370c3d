//! The BatcherActor: the worker's admission front. `capacity` requests compute at
//! once, `queue` more may wait, and anything beyond is refused at once with a
//! retryable `overloaded` (with a retry hint) — never unbounded growth. Admissions
//! go through it one at a time; a finished request gives its place back by
//! decrementing the shared count directly (so the heartbeat sent right after it
//! already shows the freed slot to the coordinators' fleet queues). Heartbeats,
//! `status` and the metrics gauges read the counts without asking it.
//!
//! Behind it, the model's own scheduler decides what computes when (for the CPU
//! engine, the continuous batcher on its compute thread, which stays a thread: it
//! must not share a runtime with the network side).

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use switchyard_messages::{ErrorCode, WireError};

/// What the BatcherActor is told.
pub enum BatcherMsg {
    /// Admit one request, or refuse it.
    Admit(RpcReplyPort<Result<(), WireError>>),
}

/// The counts, as the actor last wrote them.
pub struct View {
    held: AtomicU32,
    capacity: u32,
    queue: u32,
}

/// The worker's admission front.
pub struct BatcherActor;

impl Actor for BatcherActor {
    type Msg = BatcherMsg;
    type State = Arc<View>;
    type Arguments = Arc<View>;

    async fn pre_start(&self, _myself: ActorRef<BatcherMsg>, view: Arc<View>) -> Result<Arc<View>, ActorProcessingErr> {
        Ok(view)
    }

    async fn handle(
        &self,
        _myself: ActorRef<BatcherMsg>,
        msg: BatcherMsg,
        view: &mut Arc<View>,
    ) -> Result<(), ActorProcessingErr> {
        let BatcherMsg::Admit(reply) = msg;
        let limit = view.capacity + view.queue;
        let took = view
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| (h < limit).then_some(h + 1));
        let answer = match took {
            Ok(_) => Ok(()),
            Err(_) => Err(WireError::new(
                ErrorCode::Overloaded,
                format!("worker is full: {} computing, {} queued", view.capacity, view.queue),
            )
            .with_retry_after(100)),
        };
        if let Err(unsent) = reply.send(answer) {
            // The asker gave up waiting: it holds no permit.
            if matches!(unsent, ractor::MessagingErr::SendErr(Ok(()))) {
                view.held.fetch_sub(1, Ordering::AcqRel);
            }
        }
        Ok(())
    }
}

/// A handle on the worker's BatcherActor.
#[derive(Clone)]
pub struct Admission {
    actor: ActorRef<BatcherMsg>,
    view: Arc<View>,
}

/// Held for the life of an admitted request; dropping it frees the place.
pub struct AdmissionPermit {
    view: Arc<View>,
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        let _ = self
            .view
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| h.checked_sub(1));
    }
}

impl Admission {
    /// Starts the BatcherActor, linked under `supervisor`: `capacity` concurrent
    /// requests plus `queue` waiting.
    pub async fn spawn_linked(capacity: u32, queue: u32, supervisor: ActorCell) -> Result<Self, ActorProcessingErr> {
        let view = Arc::new(View {
            held: AtomicU32::new(0),
            capacity,
            queue,
        });
        let (actor, _) = Actor::spawn_linked(None, BatcherActor, view.clone(), supervisor).await?;
        Ok(Self { actor, view })
    }

    /// Admits a request, or refuses with `overloaded` and a retry hint.
    pub async fn admit(&self) -> Result<AdmissionPermit, WireError> {
        match ractor::call_t!(self.actor, BatcherMsg::Admit, 5_000) {
            Ok(Ok(())) => Ok(AdmissionPermit {
                view: self.view.clone(),
            }),
            Ok(Err(refused)) => Err(refused),
            Err(e) => Err(WireError::new(
                ErrorCode::Unavailable,
                format!("the worker's admission is down: {e}"),
            )),
        }
    }

    /// Admitted requests: (computing, waiting).
    pub fn load(&self) -> (u32, u32) {
        let held = self.view.held.load(Ordering::Acquire);
        let computing = held.min(self.view.capacity);
        (computing, held - computing)
    }

    /// Requests computed at once.
    pub fn capacity(&self) -> u32 {
        self.view.capacity
    }

    /// Requests that may wait.
    pub fn queue(&self) -> u32 {
        self.view.queue
    }

    /// The actor's id (the WorkerActor's supervision tells it apart).
    pub fn actor_id(&self) -> ractor::ActorId {
        self.actor.get_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in supervisor for the test: it only holds the link.
    struct Parent;
    impl Actor for Parent {
        type Msg = ();
        type State = ();
        type Arguments = ();
        async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn refuses_beyond_capacity_plus_queue_and_frees_on_drop() {
        let (parent, _) = Actor::spawn(None, Parent, ()).await.unwrap();
        let a = Admission::spawn_linked(1, 1, parent.get_cell()).await.unwrap();
        let p1 = a.admit().await.unwrap();
        assert_eq!(a.load(), (1, 0));
        let p2 = a.admit().await.unwrap();
        assert_eq!(a.load(), (1, 1));
        let err = a.admit().await.err().unwrap();
        assert_eq!(err.code, ErrorCode::Overloaded);
        assert!(err.retryable && err.retry_after_ms.is_some());
        drop(p1);
        // Given back at once: the heartbeat sent next already shows the slot free.
        assert_eq!(a.load(), (1, 0));
        drop(p2);
        assert_eq!(a.load(), (0, 0));
        let p3 = a.admit().await.unwrap();
        assert_eq!(a.load(), (1, 0));
        drop(p3);
        parent.stop(None);
    }
}
