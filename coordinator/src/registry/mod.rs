//! The worker registry and routing policy — plain data, tested without a runtime.
//!
//! Workers enter on their heartbeats and leave when heartbeats stop for longer than
//! the expiry. Routing filters the live workers (serves the model, available, not
//! draining, matches the request's pins) and orders them: backend preference
//! (seed 000 `Default()`: metal > rocm > llama_cpp > cuda > cpu), then free capacity,
//! then a score: the warm prefix (KV-aware routing: how many leading prefix blocks of
//! the request the worker announced holding) less [`WAIT_BLOCKS`] per request it would
//! wait behind; then load, with saturated workers last so requests spill to the next
//! backend. With no warm prefix anywhere this is "free capacity first, then least
//! loaded". A prefix every worker holds (a common system prompt) scores the same
//! everywhere, so load decides and it does not pull every request onto one worker; a
//! popular prefix queues at its worker only while the wait is worth less than the
//! reuse, then spills and becomes warm on a second worker.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use switchyard_messages::{
    BackendKind, ErrorCode, KvEvent, KvSnapshot, ModelEntry, WireError, WorkerStatus, WorkerView,
};

/// What one request to wait behind costs, in warm prefix blocks (4 × 256 bytes, about
/// 250 tokens of prefill).
pub const WAIT_BLOCKS: i64 = 4;

/// Backends in order of preference (seed 000 `Default()`): [`BackendKind::rank`].
fn backend_rank(backend: &str) -> usize {
    BackendKind::rank(backend)
}

/// What a request asks of routing.
#[derive(Debug, Clone, Default)]
pub struct RouteQuery {
    /// Model name; empty = any.
    pub model: String,
    /// Only this backend.
    pub backend: Option<String>,
    /// Only this worker.
    pub worker: Option<String>,
    /// The request's prefix blocks (`switchyard_messages::kv`), for KV-aware routing.
    pub blocks: Vec<u64>,
}

#[derive(Debug, Clone)]
struct Entry {
    status: WorkerStatus,
    seen: Instant,
    /// Requests routed here since its last heartbeat (not yet reflected in it).
    routed_since: u32,
}

impl Entry {
    fn load(&self) -> u32 {
        self.status.in_flight + self.status.queued + self.routed_since
    }
    fn limit(&self) -> u32 {
        self.status.capacity + self.status.queue_capacity
    }
    fn serves(&self, model: &str) -> bool {
        model.is_empty() || self.status.models.iter().any(|m| m.name == model)
    }
}

/// Live workers as known from heartbeats.
#[derive(Debug)]
pub struct Registry {
    workers: HashMap<String, Entry>,
    expiry: Duration,
    /// Per worker: the prefix blocks it holds warm, from its KV events.
    kv: HashMap<String, KvIndex>,
}

/// One worker's warm blocks as of its event `seq`, and the prefix of the last request
/// routed there (warm once it has run, before the worker's event says so).
#[derive(Debug, Default)]
struct KvIndex {
    seq: u64,
    blocks: HashSet<u64>,
    pending: Vec<u64>,
}

impl Registry {
    /// A registry that forgets a worker `expiry` after its last heartbeat.
    pub fn new(expiry: Duration) -> Self {
        Self {
            workers: HashMap::new(),
            expiry,
            kv: HashMap::new(),
        }
    }

    /// Records a heartbeat received at `now`. Returns true for a new worker.
    pub fn heartbeat(&mut self, status: WorkerStatus, now: Instant) -> bool {
        match self.workers.get_mut(&status.worker_id) {
            // Heartbeats can arrive out of order across reconnects; keep the newest.
            Some(e) if e.status.started_at_ms == status.started_at_ms && e.status.seq > status.seq => false,
            Some(e) => {
                e.status = status;
                e.seen = now;
                e.routed_since = 0;
                false
            }
            None => {
                let id = status.worker_id.clone();
                self.workers.insert(
                    id,
                    Entry {
                        status,
                        seen: now,
                        routed_since: 0,
                    },
                );
                true
            }
        }
    }

    /// Drops workers not heard from within the expiry; returns their ids.
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let expiry = self.expiry;
        let dead: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, e)| now.duration_since(e.seen) > expiry)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &dead {
            self.workers.remove(id);
            self.kv.remove(id);
        }
        dead
    }

    /// Forgets a worker at once (it did not answer a forward).
    pub fn remove(&mut self, worker_id: &str) -> bool {
        self.kv.remove(worker_id);
        self.workers.remove(worker_id).is_some()
    }

    /// Applies a worker's KV event. Returns true when events were lost (a gap in
    /// `seq`): the caller should fetch a snapshot; the index keeps its old state until
    /// then. `seq` 1 starts over (the worker restarted).
    pub fn kv_event(&mut self, e: &KvEvent) -> bool {
        let idx = self.kv.entry(e.worker_id.clone()).or_default();
        if e.seq == 1 {
            *idx = KvIndex::default();
        } else if e.seq <= idx.seq {
            return false; // a duplicate or a late one
        } else if e.seq != idx.seq + 1 {
            return true;
        }
        for b in &e.removed {
            idx.blocks.remove(b);
        }
        idx.blocks.extend(&e.stored);
        idx.seq = e.seq;
        false
    }

    /// Replaces a worker's KV index with a snapshot (unless it is older).
    pub fn kv_snapshot(&mut self, s: KvSnapshot) {
        let idx = self.kv.entry(s.worker_id).or_default();
        if s.seq >= idx.seq {
            idx.seq = s.seq;
            idx.blocks = s.blocks.into_iter().collect();
        }
    }

    /// How many leading blocks of `blocks` the worker holds warm.
    pub fn overlap(&self, worker_id: &str, blocks: &[u64]) -> usize {
        self.kv.get(worker_id).map_or(0, |idx| {
            let held = switchyard_messages::kv::leading_overlap(blocks, |b| idx.blocks.contains(&b));
            let pending = blocks.iter().zip(&idx.pending).take_while(|(a, b)| a == b).count();
            held.max(pending)
        })
    }

    /// Notes that a request with prefix `blocks` was routed to `worker_id`. That
    /// prefix counts as warm there at once (the worker will hold it once it has run
    /// the request), so the next request with it follows instead of starting a second
    /// cold copy elsewhere. Only the latest routed prefix counts this way: a worker
    /// with one resident sequence keeps only the last one.
    pub fn routed(&mut self, worker_id: &str, blocks: &[u64]) {
        if let Some(e) = self.workers.get_mut(worker_id) {
            e.routed_since += 1;
        }
        if !blocks.is_empty() {
            self.kv.entry(worker_id.to_string()).or_default().pending = blocks.to_vec();
        }
    }

    /// Candidate worker ids for `q`, best first, or why there are none.
    pub fn route(&self, q: &RouteQuery) -> Result<Vec<String>, WireError> {
        if self.workers.is_empty() {
            return Err(WireError::new(
                ErrorCode::NoWorker,
                "no workers are registered with this coordinator",
            ));
        }
        if !self.workers.values().any(|e| e.serves(&q.model)) {
            let mut served: Vec<&str> = self
                .workers
                .values()
                .flat_map(|e| e.status.models.iter().map(|m| m.name.as_str()))
                .collect();
            served.sort_unstable();
            served.dedup();
            return Err(WireError::new(
                ErrorCode::UnknownModel,
                format!("no worker serves model {:?}; served: {}", q.model, served.join(", ")),
            ));
        }
        let mut candidates: Vec<&Entry> = self
            .workers
            .values()
            .filter(|e| e.serves(&q.model))
            .filter(|e| q.backend.as_deref().is_none_or(|b| e.status.backend == b))
            .filter(|e| q.worker.as_deref().is_none_or(|w| e.status.worker_id == w))
            .collect();
        if candidates.is_empty() {
            return Err(WireError::new(
                ErrorCode::NoWorker,
                format!(
                    "no live worker serves {:?} with backend {:?} and worker {:?}",
                    q.model,
                    q.backend.as_deref().unwrap_or("any"),
                    q.worker.as_deref().unwrap_or("any")
                ),
            ));
        }
        candidates.retain(|e| e.status.available && !e.status.draining);
        if candidates.is_empty() {
            return Err(WireError::new(
                ErrorCode::NoWorker,
                format!("every worker serving {:?} is unavailable or draining", q.model),
            ));
        }
        // Each key costs a prefix lookup per block: compute it once per candidate.
        candidates.sort_by_cached_key(|e| {
            let saturated = e.load() >= e.limit();
            // Warm blocks, less WAIT_BLOCKS per request it would wait behind: a
            // warm worker with a queue still wins when its head start is worth more
            // than the wait, and spills otherwise.
            let waits = (e.load() + 1).saturating_sub(e.status.capacity) as i64;
            let score = self.overlap(&e.status.worker_id, &q.blocks) as i64 - WAIT_BLOCKS * waits;
            (
                saturated,
                backend_rank(&e.status.backend),
                std::cmp::Reverse(score),
                e.load(),
                // Among equals, the worker holding least: a new prefix lands where
                // it evicts the least warm state.
                self.kv.get(&e.status.worker_id).map_or(0, |idx| idx.blocks.len()),
                e.status.worker_id.clone(),
            )
        });
        Ok(candidates.iter().map(|e| e.status.worker_id.clone()).collect())
    }

    /// Every live worker, for `status`.
    pub fn views(&self, now: Instant) -> Vec<WorkerView> {
        let mut views: Vec<WorkerView> = self
            .workers
            .values()
            .map(|e| WorkerView {
                status: e.status.clone(),
                age_ms: now.duration_since(e.seen).as_millis() as u64,
            })
            .collect();
        views.sort_by(|a, b| a.status.worker_id.cmp(&b.status.worker_id));
        views
    }

    /// Models served by live workers, for `models`.
    pub fn models(&self) -> Vec<ModelEntry> {
        let mut by_name: HashMap<&str, ModelEntry> = HashMap::new();
        for e in self.workers.values() {
            for m in &e.status.models {
                let entry = by_name.entry(&m.name).or_insert_with(|| ModelEntry {
                    name: m.name.clone(),
                    workers: Vec::new(),
                    backends: Vec::new(),
                    info: m.info.clone(),
                });
                entry.workers.push(e.status.worker_id.clone());
                if !entry.backends.contains(&e.status.backend) {
                    entry.backends.push(e.status.backend.clone());
                }
            }
        }
        let mut models: Vec<ModelEntry> = by_name.into_values().collect();
        for m in &mut models {
            m.workers.sort();
        }
        models.sort_by(|a, b| a.name.cmp(&b.name));
        models
    }

    /// Number of live workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether no worker is live.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }
}

#[cfg(test)]
mod tests;
