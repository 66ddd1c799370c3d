//! The KvCacheActor's prefix index: what a worker holds warm, for KV-aware routing (see
//! `switchyard_messages::kv`; the engine's own KV block store is `switchyard_engine::block_store`).
//!
//! Where the backend says what its KV cache holds (the CPU and native CUDA engines:
//! `TextModel::kv_holdings`, refreshed before each generation's stream ends), the
//! index is that: [`KvTracker::holdings`] announces the holdings that came and went
//! and derives the blocks held from them — a block counts while a request sharing
//! exactly its bytes would reuse something (a sliding-window ring that lost an early
//! resume point drops the blocks before it; an overwritten slot drops its own).
//! Otherwise (llama.cpp servers, MLX) each finished request is assumed to leave its
//! prompt resident in one of the worker's slots: [`KvTracker::record`] keeps the
//! most recent `slots` requests' block lists. Either way each change becomes a
//! sequence-numbered [`KvEvent`]; the [`KvCacheActor`] owns the tracker, publishes
//! the events and answers snapshot requests.
//!
//! The actor runs linked under the WorkerActor. If it dies, the WorkerActor starts a
//! new one, which announces a fresh start (an event with `seq` 1: coordinators drop
//! what they knew of this worker, `docs/protocol.md` §KV) and then counts on from 2.
//! With holdings that event already says what the engine holds (a worker's first
//! actor announces them the same way, so a coordinator predicts even its first
//! request); without, the slots are still warm but routing learns it again from the
//! next requests. Nothing else depends on it.

use ractor::{Actor, ActorProcessingErr, ActorRef};
use std::collections::{HashMap, HashSet, VecDeque};
use switchyard_messages::kv::{adapter_blocks, BLOCK_BYTES};
use switchyard_messages::{KvEvent, KvHolding, KvSnapshot, PROTOCOL_VERSION};

/// The warm prefixes of one worker.
#[derive(Debug)]
pub struct KvTracker {
    worker_id: String,
    slots: usize,
    seq: u64,
    recent: VecDeque<Vec<u64>>,
    held: HashMap<u64, u32>,
    /// Announced from the backend's holdings (not guessed from recent requests).
    precise: bool,
    holdings: HashMap<u64, KvHolding>,
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
            precise: false,
            holdings: HashMap::new(),
        }
    }

    /// The backend holds `now`: announces the holdings that came and went and the
    /// blocks they make warm. The event, or `None` when nothing changed.
    pub fn holdings(&mut self, now: Vec<KvHolding>) -> Option<KvEvent> {
        let first = !self.precise;
        self.precise = true;
        let ids: HashSet<u64> = now.iter().map(|h| h.id).collect();
        let released: Vec<u64> = self.holdings.keys().filter(|id| !ids.contains(id)).copied().collect();
        let added: Vec<KvHolding> = now.into_iter().filter(|h| !self.holdings.contains_key(&h.id)).collect();
        for id in &released {
            self.holdings.remove(id);
        }
        for h in &added {
            self.holdings.insert(h.id, h.clone());
        }
        let blocks: HashSet<u64> = self.holdings.values().flat_map(warm_blocks).collect();
        let stored: Vec<u64> = blocks.iter().filter(|b| !self.held.contains_key(b)).copied().collect();
        let removed: Vec<u64> = self.held.keys().filter(|b| !blocks.contains(b)).copied().collect();
        self.held = blocks.into_iter().map(|b| (b, 1)).collect();
        self.recent.clear();
        if !first && added.is_empty() && released.is_empty() && stored.is_empty() && removed.is_empty() {
            return None;
        }
        Some(KvEvent {
            precise: true,
            holdings: added,
            released,
            ..self.next_event(stored, removed)
        })
    }

    /// The next event in sequence, with these blocks.
    fn next_event(&mut self, stored: Vec<u64>, removed: Vec<u64>) -> KvEvent {
        self.seq += 1;
        KvEvent {
            v: PROTOCOL_VERSION,
            worker_id: self.worker_id.clone(),
            seq: self.seq,
            stored,
            removed,
            ..Default::default()
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
        Some(self.next_event(stored, removed))
    }

    /// Everything held, as of the last event.
    pub fn snapshot(&self) -> KvSnapshot {
        KvSnapshot {
            v: PROTOCOL_VERSION,
            worker_id: self.worker_id.clone(),
            seq: self.seq,
            blocks: self.held.keys().copied().collect(),
            precise: self.precise,
            holdings: self.holdings.values().cloned().collect(),
        }
    }
}

/// The routing blocks of `h`'s key its held tokens reach into, when a request
/// sharing all it holds would reuse them (a ring's holding is warm only for requests
/// sharing enough: the precise prediction says so, the block index cannot).
fn warm_blocks(h: &KvHolding) -> Vec<u64> {
    let key = h.key.as_bytes();
    let Some(&last) = h.bounds.last() else {
        return Vec::new();
    };
    if h.reuse(key) == 0 {
        return Vec::new();
    }
    let mut blocks = adapter_blocks(h.adapter.as_deref(), key);
    blocks.truncate((last as usize).min(key.len()).div_ceil(BLOCK_BYTES));
    blocks
}

/// What the [`KvCacheActor`] is told.
pub enum KvMsg {
    /// A request over these prefix blocks finished on this worker.
    Record(Vec<u64>),
    /// A request finished on this worker, whose backend holds these now.
    Holdings(Vec<KvHolding>),
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
    /// What the backend holds now, where it says (announced at once, as a fresh
    /// start: `seq` 1).
    pub held: Option<Vec<KvHolding>>,
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
        // seq 1 tells coordinators to start this worker's index over.
        let first = match args.held {
            Some(now) => tracker.holdings(now),
            None if args.restarted => Some(tracker.next_event(Vec::new(), Vec::new())),
            None => None,
        };
        if let Some(first) = first {
            if let Err(e) = switchyard_fabric::nats::publish(&args.client, args.subject.clone(), &first).await {
                tracing::warn!("kv fresh-start event not sent: {e}");
            }
        }
        if args.restarted {
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
            KvMsg::Record(_) | KvMsg::Holdings(_) => {
                let event = match msg {
                    KvMsg::Record(blocks) => state.tracker.record(blocks),
                    KvMsg::Holdings(now) => state.tracker.holdings(now),
                    _ => None,
                };
                if let Some(event) = event {
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

    fn holding(id: u64, key: &str, tokens: usize, min_reuse: u32) -> KvHolding {
        // One token per 4 bytes.
        KvHolding {
            id,
            key: key.into(),
            bounds: (1..=tokens).map(|i| (i * 4 + 4).min(key.len() + 1) as u32).collect(),
            min_reuse,
            granule: 1,
            min_share: 0,
            adapter: None,
        }
    }

    #[test]
    fn holdings_announce_what_the_engine_holds() {
        let mut t = KvTracker::new("w", 1);
        let doc = "d".repeat(BLOCK_BYTES * 3);
        let blocks = adapter_blocks(None, doc.as_bytes());
        // A slot holding the first 100 tokens (400 bytes: blocks 0 and 1).
        let e = t.holdings(vec![holding(1, &doc, 100, 0)]).unwrap();
        assert!(e.precise && e.released.is_empty() && e.holdings.len() == 1);
        let mut stored = e.stored.clone();
        stored.sort();
        let mut want = blocks[..2].to_vec();
        want.sort();
        assert_eq!(stored, want);
        // Unchanged: no event.
        assert!(t.holdings(vec![holding(1, &doc, 100, 0)]).is_none());
        // The slot now holds all of it.
        let e = t.holdings(vec![holding(2, &doc, 192, 0)]).unwrap();
        assert_eq!(
            (e.released.clone(), e.stored.clone(), e.removed.len()),
            (vec![1], vec![blocks[2]], 0)
        );
        // A ring that lost what any resume needs: nothing is warm.
        let e = t.holdings(vec![holding(3, &doc, 192, 500)]).unwrap();
        assert_eq!(e.removed.len(), 3);
        let snap = t.snapshot();
        assert!(snap.precise && snap.blocks.is_empty() && snap.holdings.len() == 1);
        assert_eq!(snap.seq, e.seq);
    }
}
