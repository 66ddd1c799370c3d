//! The KvCacheActor's prefix index: what a worker holds warm, for KV-aware routing (see
//! `switchyard_messages::kv`; the engine's own KV block store is `switchyard_engine::block_store`).
//!
//! Each finished request leaves its prompt's prefix resident in one of the worker's
//! slots (the CPU engine has one resident sequence; a llama.cpp server one per slot).
//! [`KvTracker`] keeps the most recent `slots` requests' block lists and turns each
//! change into a sequence-numbered [`KvEvent`]; the [`KvCacheActor`] owns it,
//! publishes the events and answers snapshot requests.
//!
//! The actor runs linked under the WorkerActor. If it dies, the WorkerActor starts a
//! new one, which announces a fresh start (an event with `seq` 1 and nothing stored:
//! coordinators drop what they knew of this worker, `docs/protocol.md` §KV) and then
//! counts on from 2. The slots are still warm, but routing learns it again from the
//! next requests; nothing else depends on it.

use ractor::{Actor, ActorProcessingErr, ActorRef};
use std::collections::{HashMap, VecDeque};
use switchyard_messages::{KvEvent, KvSnapshot, PROTOCOL_VERSION};

/// The warm prefixes of one worker.
#[derive(Debug)]
pub struct KvTracker {
    worker_id: String,
    slots: usize,
    seq: u64,
    recent: VecDeque<Vec<u64>>,
    held: HashMap<u64, u32>,
}

impl KvTracker {
    /// A tracker for a worker with `slots` resident sequences (at least 1).
    pub fn new(worker_id: &str, slots: usize) -> Self {
        Self {
            worker_id: worker_id.to_string(),
            slots: slots.max(1),
            seq: 0,
            recent: VecDeque::new(),
            held: HashMap::new(),
        }
    }

    /// A request over `blocks` finished: they are warm now, and the least recent
    /// request beyond `slots` is not. The event, or `None` when nothing changed.
    pub fn record(&mut self, blocks: Vec<u64>) -> Option<KvEvent> {
        let mut stored = Vec::new();
        let mut removed = Vec::new();
        for b in &blocks {
            let n = self.held.entry(*b).or_insert(0);
            *n += 1;
            if *n == 1 {
                stored.push(*b);
            }
        }
        self.recent.push_back(blocks);
        while self.recent.len() > self.slots {
            for b in self.recent.pop_front().unwrap_or_default() {
                if let Some(n) = self.held.get_mut(&b) {
                    *n -= 1;
                    if *n == 0 {
                        self.held.remove(&b);
                        removed.push(b);
                    }
                }
            }
        }
        // A block both stored and removed in one step was never announced.
        stored.retain(|b| self.held.contains_key(b));
        removed.retain(|b| !stored.contains(b));
        if stored.is_empty() && removed.is_empty() {
            return None;
        }
        self.seq += 1;
        Some(KvEvent {
            v: PROTOCOL_VERSION,
            worker_id: self.worker_id.clone(),
            seq: self.seq,
            stored,
            removed,
        })
    }

    /// Everything held, as of the last event.
    pub fn snapshot(&self) -> KvSnapshot {
        KvSnapshot {
            v: PROTOCOL_VERSION,
            worker_id: self.worker_id.clone(),
            seq: self.seq,
            blocks: self.held.keys().copied().collect(),
        }
    }
}

/// What the [`KvCacheActor`] is told.
pub enum KvMsg {
    /// A request over these prefix blocks finished on this worker.
    Record(Vec<u64>),
    /// Answer a snapshot request on this reply subject.
    Snapshot(String),
    /// Fault injection for the supervision tests: panic in the handler.
    #[doc(hidden)]
    Panic,
}

/// What a KvCacheActor needs.
pub struct KvArgs {
    pub client: async_nats::Client,
    pub worker_id: String,
    /// Resident sequences the worker keeps (its slots).
    pub slots: usize,
    /// `{p}.v1.kv.{wid}`.
    pub subject: String,
    /// Started again after its predecessor died: announce a fresh start.
    pub restarted: bool,
}

/// The worker's prefix index: records finished requests, publishes the events,
/// answers snapshots.
pub struct KvCacheActor;

/// Its state.
pub struct KvState {
    tracker: KvTracker,
    client: async_nats::Client,
    subject: String,
}

impl Actor for KvCacheActor {
    type Msg = KvMsg;
    type State = KvState;
    type Arguments = KvArgs;

    async fn pre_start(&self, _myself: ActorRef<KvMsg>, args: KvArgs) -> Result<KvState, ActorProcessingErr> {
        let mut tracker = KvTracker::new(&args.worker_id, args.slots);
        if args.restarted {
            // seq 1 tells coordinators to start this worker's index over.
            tracker.seq = 1;
            let fresh = KvEvent {
                v: PROTOCOL_VERSION,
                worker_id: args.worker_id.clone(),
                seq: 1,
                stored: Vec::new(),
                removed: Vec::new(),
            };
            if let Err(e) = switchyard_fabric::nats::publish(&args.client, args.subject.clone(), &fresh).await {
                tracing::warn!("kv fresh-start event not sent: {e}");
            }
            tracing::warn!(worker = %args.worker_id, "kv cache actor restarted; prefix index starts over");
        }
        Ok(KvState {
            tracker,
            client: args.client,
            subject: args.subject,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<KvMsg>,
        msg: KvMsg,
        state: &mut KvState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            KvMsg::Record(blocks) => {
                if let Some(event) = state.tracker.record(blocks) {
                    // In order, one at a time: the sequence numbers let a coordinator
                    // notice a lost or reordered event and ask for a snapshot.
                    if let Err(e) = switchyard_fabric::nats::publish(&state.client, state.subject.clone(), &event).await
                    {
                        tracing::debug!("kv event not sent: {e}");
                    }
                }
            }
            KvMsg::Snapshot(reply) => {
                let snapshot = state.tracker.snapshot();
                let _ = state
                    .client
                    .publish(reply, switchyard_messages::encode(&snapshot).into())
                    .await;
            }
            KvMsg::Panic => panic!("fault injection: kv cache actor"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_slot_falls_out_and_shared_blocks_stay() {
        let mut t = KvTracker::new("w", 2);
        let e = t.record(vec![1, 2, 3]).unwrap();
        assert_eq!((e.seq, e.stored, e.removed), (1, vec![1, 2, 3], vec![]));
        let e = t.record(vec![1, 2, 4]).unwrap();
        assert_eq!((e.seq, e.stored, e.removed), (2, vec![4], vec![]));
        // Third request: [1, 2, 3] falls out, but 1 and 2 are still held by [1, 2, 4].
        let e = t.record(vec![1, 5]).unwrap();
        assert_eq!((e.seq, e.stored, e.removed), (3, vec![5], vec![3]));
        assert!(t.record(vec![1, 5]).map(|e| e.removed) == Some(vec![2, 4]));
        let mut snap = t.snapshot().blocks;
        snap.sort();
        assert_eq!((t.snapshot().seq, snap), (4, vec![1, 5]));
        // Nothing changes: no event, no sequence number used.
        assert!(t.record(vec![1, 5]).is_none());
        assert_eq!(t.snapshot().seq, 4);
    }
}
