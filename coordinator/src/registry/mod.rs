//! The worker registry and routing policy — plain data, tested without a runtime.
//!
//! Workers enter on their heartbeats and leave when heartbeats stop for longer than
//! the expiry. Routing filters the live workers (serves the model, available, not
//! draining, matches the request's pins) and orders them, saturated workers last so
//! requests spill, by one of two policies ([`RoutingPolicy`]):
//!
//! - `ttft` (default): the least predicted time to first token ([`ttft`]): the wait for
//!   a slot plus the uncached part of the prompt at the worker's measured prefill speed,
//!   from the `speed` its heartbeats report, plus the network: the worker's round trip
//!   from this coordinator (a moving average over admission exchanges and probes; an
//!   exchange that timed out counts its whole wait). Then backend preference, load. Workers
//!   without a measurement are predicted at the median speed of the candidates that
//!   have one; when none has, the decision falls back to `blocks`. (1.11) A worker
//!   that can pull a prefix a busy peer of its KV format holds is predicted with that
//!   prefix, at its transfer's cost ([`ttft::pull_ms_per_block`]).
//! - `blocks`: backend preference (seed 000 `Default()`: metal > rocm > llama_cpp >
//!   cuda > cpu), then a score: the warm prefix (KV-aware routing: how many leading
//!   prefix blocks of the request the worker announced holding) less [`WAIT_BLOCKS`]
//!   per request it would wait behind; then load. With no warm prefix anywhere this is
//!   "free capacity first, then least loaded". A prefix every worker holds (a common
//!   system prompt) scores the same everywhere, so load decides and it does not pull
//!   every request onto one worker; a popular prefix queues at its worker only while
//!   the wait is worth less than the reuse, then spills and becomes warm on a second
//!   worker.
//!
//! A worker that comes back after its heartbeats stopped (or after it failed to answer
//! a forward) is on probation — after every answering worker, before saturated ones —
//! until it answers a probe (the KV snapshot fetched when it joins) or a forward:
//! heartbeats can flow again before requests to it can (a link healing from TCP
//! backoff). A worker seen for the first time is not: it has no bad record.
//!
//! Ties go to the worker holding fewer blocks (a new prefix evicts the least there),
//! then to the smaller id.
//!
//! Cost per decision with N workers: one pass over a contiguous slab of workers, one
//! walk down the request's blocks for every worker's warm prefix at once
//! ([`prefix::PrefixIndex::depths`]), and a bounded insertion for the few candidates a
//! request will try; no allocation per worker. Heartbeats and KV events touch only
//! their worker (and, for KV events, the blocks they name).

mod brief;
mod listing;
pub mod prefix;
pub mod ttft;

use brief::Brief;
pub use brief::WAIT_BLOCKS;
use prefix::PrefixIndex;
use std::collections::HashMap;
use std::time::{Duration, Instant};
pub use switchyard_config::RoutingPolicy;
use switchyard_messages::{BackendKind, ErrorCode, Heartbeat, KvEvent, KvSnapshot, WireError, WorkerStatus};
use ttft::Speed;

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
    /// Bytes of the request's routing key (its prompt as sent), for predicted TTFT.
    pub prompt_bytes: usize,
    /// Only workers with room: fewer requests than their capacity plus this many
    /// (and than their own limit). `None` = every routable worker, saturated last.
    pub room: Option<u32>,
    /// (1.7) Only workers whose model embeds (`info.embedding_dim` > 0); when not
    /// set, (1.8) only workers whose model generates (not `info.embedding_only`).
    pub embed: bool,
    /// (1.10) Only workers that have loaded this LoRA adapter of `model`.
    pub adapter: Option<String>,
}

/// A routing decision: the candidates, best first, and how many leading blocks of
/// the request the first one holds warm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Worker ids, best first.
    pub workers: Vec<String>,
    /// Warm leading blocks of the first.
    pub warm: usize,
}

#[derive(Debug, Clone)]
struct Entry {
    status: WorkerStatus,
    seen: Instant,
}

/// A worker id's place in the registry: its heartbeat (once one came) and, under
/// the same index in `briefs` and the [`PrefixIndex`], what routing reads of it and
/// its warm blocks.
#[derive(Debug, Default)]
struct Slot {
    id: String,
    worker: Option<Entry>,
}

/// Live workers as known from heartbeats.
///
/// Workers live in a slab of slots, so a routing decision scans contiguous vectors
/// and the prefix index names workers by a small integer.
#[derive(Debug)]
pub struct Registry {
    slots: Vec<Slot>,
    briefs: Vec<Brief>,
    ids: HashMap<String, u32>,
    free: Vec<u32>,
    live: usize,
    /// Model names, interned: the first 64 are bits of [`Brief::models`].
    model_ids: HashMap<String, u32>,
    /// KV format keys, interned from 1 ([`Brief::kv_group`]).
    kv_groups: HashMap<String, u16>,
    expiry: Duration,
    policy: RoutingPolicy,
    prefix: PrefixIndex,
    /// Workers dropped (heartbeats stopped, or a forward found nobody), and when: one
    /// that comes back within [`GONE_MEMORY`] starts on probation.
    gone: HashMap<String, Instant>,
}

/// How long a dropped worker is remembered for its probation.
const GONE_MEMORY: Duration = Duration::from_secs(600);

impl Registry {
    /// A registry that forgets a worker `expiry` after its last heartbeat, routing by
    /// the default policy.
    pub fn new(expiry: Duration) -> Self {
        Self::with_policy(expiry, RoutingPolicy::default())
    }

    /// A registry routing by `policy`.
    pub fn with_policy(expiry: Duration, policy: RoutingPolicy) -> Self {
        Self {
            slots: Vec::new(),
            briefs: Vec::new(),
            ids: HashMap::new(),
            free: Vec::new(),
            live: 0,
            model_ids: HashMap::new(),
            kv_groups: HashMap::new(),
            expiry,
            policy,
            prefix: PrefixIndex::default(),
            gone: HashMap::new(),
        }
    }

    /// The slot of `id`, made if new.
    fn slot_of(&mut self, id: &str) -> u32 {
        if let Some(&s) = self.ids.get(id) {
            return s;
        }
        let s = self.free.pop().unwrap_or_else(|| {
            self.slots.push(Slot::default());
            self.briefs.push(Brief::default());
            (self.slots.len() - 1) as u32
        });
        self.slots[s as usize].id = id.to_string();
        self.ids.insert(id.to_string(), s);
        s
    }

    /// Forgets the worker in `slot` and its blocks; the slot is reused.
    fn release(&mut self, slot: u32) {
        let s = std::mem::take(&mut self.slots[slot as usize]);
        if s.worker.is_some() {
            self.live -= 1;
        }
        self.briefs[slot as usize] = Brief::default();
        self.ids.remove(&s.id);
        self.prefix.clear(slot);
        self.free.push(slot);
    }

    /// Records a heartbeat (a [`WorkerStatus`], with or without its `speed`) received
    /// at `now`. Returns true for a new worker.
    pub fn heartbeat(&mut self, beat: impl Into<Heartbeat>, now: Instant) -> bool {
        let Heartbeat { status, speed } = beat.into();
        let slot = self.slot_of(&status.worker_id);
        let new = match &self.slots[slot as usize].worker {
            // Heartbeats can arrive out of order across reconnects; keep the newest.
            Some(e) if e.status.started_at_ms == status.started_at_ms && e.status.seq > status.seq => return false,
            Some(_) => false,
            None => true,
        };
        let mut models = 0u64;
        let mut more_models = false;
        for m in &status.models {
            let id = match self.model_ids.get(&m.name) {
                Some(&id) => id,
                None => {
                    let id = self.model_ids.len() as u32;
                    self.model_ids.insert(m.name.clone(), id);
                    id
                }
            };
            if id < 64 {
                models |= 1 << id;
            } else {
                more_models = true;
            }
        }
        let format = status.models.first().and_then(|m| m.kv_format.as_ref());
        let next = self.kv_groups.len() as u16 + 1;
        let kv_group = format.map_or(0, |f| *self.kv_groups.entry(f.key()).or_insert(next));
        let pull_ms_per_block = format.map_or(0.0, |f| ttft::pull_ms_per_block(f.token_bytes()) as f32);
        let b = &mut self.briefs[slot as usize];
        *b = Brief {
            kv_group,
            pull_ms_per_block,
            live: true,
            routable: status.available && !status.draining,
            models,
            more_models,
            encoders: status.models.iter().any(|m| m.info.embedding_only),
            prefill_only: status.role == switchyard_messages::WorkerRole::Prefill,
            rank: BackendKind::rank(&status.backend).min(127) as u8,
            capacity: status.capacity,
            limit: status.capacity + status.queue_capacity,
            // Requests routed here since count until the heartbeat that reflects them.
            load: status.in_flight + status.queued,
            id_prefix: brief::id_prefix(&status.worker_id),
            ..*b
        };
        b.set_speed(speed.measured().then(|| speed.into()));
        if new {
            // Back after it was dropped: until it answers a probe (its KV snapshot) or
            // a forward, after every answering worker.
            b.probation = self.gone.remove(&status.worker_id).is_some();
            b.rtt_ms = 0.0;
        }
        self.slots[slot as usize].worker = Some(Entry { status, seen: now });
        self.live += usize::from(new);
        new
    }

    /// Drops workers not heard from within the expiry; returns their ids.
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let expiry = self.expiry;
        let dead: Vec<u32> = (0..self.slots.len() as u32)
            .filter(|&s| {
                let w = &self.slots[s as usize].worker;
                w.as_ref().is_some_and(|e| now.duration_since(e.seen) > expiry)
            })
            .collect();
        self.gone.retain(|_, at| now.duration_since(*at) < GONE_MEMORY);
        dead.into_iter()
            .map(|s| {
                let id = self.slots[s as usize].id.clone();
                self.release(s);
                self.gone.insert(id.clone(), now);
                id
            })
            .collect()
    }

    /// Forgets a worker at once (it did not answer a forward).
    pub fn remove(&mut self, worker_id: &str) -> bool {
        let Some(&slot) = self.ids.get(worker_id) else {
            return false;
        };
        let was_live = self.slots[slot as usize].worker.is_some();
        self.release(slot);
        if was_live {
            self.gone.insert(worker_id.to_string(), Instant::now());
        }
        was_live
    }

    /// Applies a worker's KV event. Returns true when events were lost (a gap in
    /// `seq`): the caller should fetch a snapshot; the index keeps its old state until
    /// then. `seq` 1 starts over (the worker restarted).
    pub fn kv_event(&mut self, e: &KvEvent) -> bool {
        let slot = self.slot_of(&e.worker_id);
        let gap = self.prefix.event(slot, e);
        self.briefs[slot as usize].held = self.prefix.held(slot) as u32;
        gap
    }

    /// Replaces a worker's KV index with a snapshot (unless it is older).
    pub fn kv_snapshot(&mut self, s: KvSnapshot) {
        let slot = self.slot_of(&s.worker_id);
        self.prefix.snapshot(slot, &s);
        self.briefs[slot as usize].held = self.prefix.held(slot) as u32;
    }

    /// How many leading blocks of `blocks` the worker holds warm.
    pub fn overlap(&self, worker_id: &str, blocks: &[u64]) -> usize {
        self.ids.get(worker_id).map_or(0, |&s| self.prefix.overlap(s, blocks))
    }

    /// Notes that a request with prefix `blocks` was routed to `worker_id`. That
    /// prefix counts as warm there at once (the worker will hold it once it has run
    /// the request), so the next request with it follows instead of starting a second
    /// cold copy elsewhere. Only the latest routed prefix counts this way: a worker
    /// with one resident sequence keeps only the last one.
    pub fn routed(&mut self, worker_id: &str, blocks: &[u64]) {
        let Some(&slot) = self.ids.get(worker_id) else { return };
        let b = &mut self.briefs[slot as usize];
        if b.live {
            b.load += 1;
        }
        if !blocks.is_empty() {
            b.set_pending(blocks);
            self.prefix.routed(slot, blocks);
        }
    }

    /// Notes a round trip to a worker (an admission exchange or a probe), or, for one
    /// that did not answer in time, the time waited as a penalty.
    pub fn round_trip(&mut self, worker_id: &str, took: Duration) {
        if let Some(&slot) = self.ids.get(worker_id) {
            let b = &mut self.briefs[slot as usize];
            if b.live {
                b.note_rtt(took.as_secs_f64() * 1e3);
            }
        }
    }

    /// Counts a worker as full until its next heartbeat (it refused a request for
    /// want of room).
    pub fn saturate(&mut self, worker_id: &str) {
        if let Some(&slot) = self.ids.get(worker_id) {
            let b = &mut self.briefs[slot as usize];
            b.load = b.load.max(b.limit);
        }
    }

    /// Candidate worker ids for `q`, best first, or why there are none.
    pub fn route(&self, q: &RouteQuery) -> Result<Vec<String>, WireError> {
        self.route_top(q, usize::MAX).map(|r| r.workers)
    }

    /// The best `limit` candidates for `q`, or why there are none.
    pub fn route_top(&self, q: &RouteQuery, limit: usize) -> Result<Route, WireError> {
        if self.live == 0 {
            return Err(WireError::new(
                ErrorCode::NoWorker,
                "no workers are registered with this coordinator",
            ));
        }
        let model = match q.model.as_str() {
            "" => None,
            name => Some(*self.model_ids.get(name).ok_or_else(|| self.unknown_model(name))?),
        };
        let (mut serving, mut matching, mut measured, mut routable) = (false, 0, 0, 0);
        // Workers skipped for being `prefill` workers (1.12).
        let mut prefill_only = 0;
        // Some worker serving the model holds the adapter asked for.
        let mut adapted = false;
        // Workers skipped only because their model embeds and nothing else.
        let mut encoders = 0;
        let mut candidates: Vec<u32> = Vec::with_capacity(self.live);
        for (i, b) in self.briefs.iter().enumerate() {
            if !b.live {
                continue;
            }
            let slot = &self.slots[i];
            let status = || &slot.worker.as_ref().expect("a live slot has a heartbeat").status;
            let serves = b
                .serves(model)
                .unwrap_or_else(|| status().models.iter().any(|m| m.name == q.model));
            if !serves {
                continue;
            }
            serving = true;
            if let Some(a) = q.adapter.as_deref() {
                let has = |m: &switchyard_messages::ServedModel| {
                    (q.model.is_empty() || m.name == q.model) && m.has_adapter(Some(a))
                };
                if !status().models.iter().any(has) {
                    continue;
                }
                adapted = true;
            }
            let can = |m: &switchyard_messages::ServedModel| match q.embed {
                true => m.info.embedding_dim > 0,
                false => !m.info.embedding_only,
            };
            let able = || {
                status()
                    .models
                    .iter()
                    .any(|m| (q.model.is_empty() || m.name == q.model) && can(m))
            };
            if q.backend.as_deref().is_some_and(|want| status().backend != want)
                || q.worker.as_deref().is_some_and(|want| slot.id != want)
            {
                continue;
            }
            if (q.embed || b.encoders) && !able() {
                encoders += usize::from(!q.embed);
                continue;
            }
            if b.prefill_only && q.worker.is_none() {
                prefill_only += 1;
                continue;
            }
            matching += 1;
            routable += usize::from(b.routable);
            if b.routable
                && q.room
                    .is_none_or(|ahead| b.load < b.limit.min(b.capacity.saturating_add(ahead)))
            {
                candidates.push(i as u32);
                measured += usize::from(b.speed().is_some());
            }
        }
        if !serving {
            return Err(self.unknown_model(&q.model));
        }
        if let Some(a) = q.adapter.as_deref().filter(|_| !adapted) {
            return Err(self.unknown_adapter(&q.model, a));
        }
        if matching == 0 && encoders > 0 && !q.model.is_empty() {
            // Not a passing shortage: the model cannot do this.
            return Err(WireError::new(
                ErrorCode::BadRequest,
                format!(
                    "{:?} is an embedding model: it serves embed requests only, not generation or classification",
                    q.model
                ),
            ));
        }
        if matching == 0 && prefill_only > 0 {
            return Err(WireError::new(
                ErrorCode::NoWorker,
                format!(
                    "only prefill workers serve {:?} (worker.role = \"prefill\"): they compute prompts for decode \
                     workers; start a worker with role decode or both, or pin the request to one",
                    q.model
                ),
            ));
        }
        if matching == 0 {
            return Err(WireError::new(
                ErrorCode::NoWorker,
                format!(
                    "no live worker serves {:?}{} with backend {:?} and worker {:?}{}",
                    q.model,
                    q.adapter
                        .as_deref()
                        .map(|a| format!(" with LoRA adapter {a:?}"))
                        .unwrap_or_default(),
                    q.backend.as_deref().unwrap_or("any"),
                    q.worker.as_deref().unwrap_or("any"),
                    if q.embed {
                        " that can embed"
                    } else {
                        " that can generate"
                    }
                ),
            ));
        }
        if candidates.is_empty() && routable > 0 {
            return Ok(Route {
                workers: Vec::new(),
                warm: 0,
            });
        }
        if candidates.is_empty() {
            return Err(WireError::new(
                ErrorCode::NoWorker,
                format!("every worker serving {:?} is unavailable or draining", q.model),
            ));
        }
        // Predicted TTFT needs a speed: a worker's own, else the candidates' median;
        // with none measured, the block score decides.
        let prior = match self.policy {
            RoutingPolicy::Ttft if measured == candidates.len() => Some(None),
            RoutingPolicy::Ttft if measured > 0 => Some(Speed::median(
                candidates.iter().filter_map(|&s| self.briefs[s as usize].speed()),
            )),
            _ => None,
        };
        let mut depth = vec![0u32; if q.blocks.is_empty() { 0 } else { self.briefs.len() }];
        self.prefix.depths(&q.blocks, &mut depth);
        // The last prefix routed to a worker counts as warm there too; its bits bound
        // how much of it this request shares before it is read.
        let leading = brief::leading_bits(&q.blocks);
        let pending_bound = |b: &Brief| b.pending_bound(&leading);
        let held = |s: u32| depth.get(s as usize).map_or(0, |&d| d as usize);
        let warm = |s: u32| {
            let h = held(s);
            if self.briefs[s as usize].pending_may_exceed(h, &leading) {
                h.max(self.prefix.pending_overlap(s, &q.blocks))
            } else {
                h
            }
        };
        let id = |s: u32| self.slots[s as usize].id.as_str();
        let by_id = |a: u32, b: u32| {
            let (pa, pb) = (self.briefs[a as usize].id_prefix, self.briefs[b as usize].id_prefix);
            pa < pb || (pa == pb && id(a) < id(b))
        };
        let before = |a: &(u128, u32), b: &(u128, u32)| a.0 < b.0 || (a.0 == b.0 && by_id(a.1, b.1));
        // What each KV group's best busy holder holds (and the second best, for the
        // best itself): a worker of the group may pull it, and predicted TTFT counts
        // that. Only busy holders (a request would wait there): an idle holder serves
        // its own prefix best, and speeds measured a little apart must not send its
        // requests to be pulled elsewhere.
        let mut groups: HashMap<u16, (usize, u32, usize)> = HashMap::new();
        if prior.is_some() {
            for (s, b) in self.briefs.iter().enumerate() {
                let (h, s) = (held(s as u32), s as u32);
                if b.live && b.kv_group > 0 && h > 0 && b.load >= b.capacity {
                    let g = groups.entry(b.kv_group).or_insert((0, u32::MAX, 0));
                    if h > g.0 {
                        *g = (h, s, g.0);
                    } else if h > g.2 {
                        g.2 = h;
                    }
                }
            }
        }
        let pullable = |s: u32| {
            let b = &self.briefs[s as usize];
            groups
                .get(&b.kv_group)
                .map_or(0, |&(best, at, second)| if at == s { second } else { best })
        };
        let key = |s: u32, warm: usize| (self.briefs[s as usize].key(prior, warm, pullable(s), q.prompt_bytes), s);
        let best: Vec<(u128, u32)> = if limit >= candidates.len() {
            let mut all: Vec<(u128, u32)> = candidates.iter().map(|&s| key(s, warm(s))).collect();
            all.sort_unstable_by(|a, b| match (before(a, b), before(b, a)) {
                (true, _) => std::cmp::Ordering::Less,
                (_, true) => std::cmp::Ordering::Greater,
                _ => std::cmp::Ordering::Equal,
            });
            all
        } else {
            // The few a request will try: a bounded insertion, not a sort of them all.
            let mut best: Vec<(u128, u32)> = Vec::with_capacity(limit + 1);
            let enters = |k: &(u128, u32), best: &Vec<(u128, u32)>| {
                best.len() < limit || best.last().is_some_and(|worst| before(k, worst))
            };
            for &s in &candidates {
                let (h, b) = (held(s), &self.briefs[s as usize]);
                // More warm blocks only lower a key: read the routed prefix only when
                // its most could bring this worker among the best.
                let w = if b.pending_may_exceed(h, &leading) && enters(&key(s, pending_bound(b)), &best) {
                    warm(s)
                } else {
                    h
                };
                let k = key(s, w);
                if enters(&k, &best) {
                    let at = best.partition_point(|b| before(b, &k));
                    best.insert(at, k);
                    best.truncate(limit);
                }
            }
            best
        };
        Ok(Route {
            warm: best.first().map_or(0, |&(_, s)| warm(s)),
            workers: best.into_iter().map(|(_, s)| id(s).to_string()).collect(),
        })
    }

    /// Number of live workers.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no worker is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }
}

#[cfg(test)]
mod tests;
