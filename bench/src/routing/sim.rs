//! The simulated fleet of `bench routing`: one task set on one NATS connection plays
//! every worker. It publishes their heartbeats (every period, staggered, and one after
//! each request, as real workers do), their KV events (blocks stored and evicted after
//! each request) and answers `kv.{wid}.snapshot`, `discover`, and the generate
//! requests coordinators forward to `worker.{wid}.generate`: the admission answer to
//! the coordinator, then the stream to the client's inbox.
//!
//! Two kinds of simulated worker, named as such in the benchmark's output:
//! - [`Timing::NoModel`], a *simulated worker (no model)*: it answers at once with a
//!   one-token stream, so what is measured is the coordinator's and the fabric's cost;
//! - [`Timing::Modelled`]: time to first token follows a model — wait for one of
//!   `capacity` slots, then uncached prompt tokens ÷ prefill speed — then output
//!   tokens × time per token; it reports the speeds it measured on itself in its
//!   heartbeats, so predicted-TTFT routing has something to predict from.

use futures::StreamExt;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_messages::kv::{self, BLOCK_BYTES};
use switchyard_messages::subjects::HEADER_STREAM_TO;
use switchyard_messages::{
    decode, encode, Admission, ErrorCode, FinishReason, GenerateMetrics, GenerateRequest, Heartbeat, KvEvent,
    KvSnapshot, KvUsage, RecentLatency, ServedModel, StreamChunk, Subjects, Token, WireError, WorkerSpeed,
    WorkerStatus, PROTOCOL_VERSION,
};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Prompt bytes per token the simulation assumes (English text, BPE).
pub const BYTES_PER_TOKEN: usize = 4;

/// How a simulated worker times a request.
#[derive(Debug, Clone, Copy)]
pub enum Timing {
    /// A simulated worker (no model): admits, then at once a one-token stream.
    NoModel,
    /// TTFT = queue for a slot + uncached prompt tokens ÷ `prefill_tps`; then
    /// `output_tokens` − 1 more at `tpot` each.
    Modelled {
        /// Prompt tokens per second of prefill.
        prefill_tps: f64,
        /// Time per output token after the first.
        tpot: Duration,
        /// Tokens generated per request.
        output_tokens: u32,
    },
}

/// One simulated worker.
#[derive(Debug, Clone)]
pub struct SimSpec {
    /// Worker id.
    pub id: String,
    /// Backend it announces.
    pub backend: String,
    /// Requests computed at once (slots).
    pub capacity: u32,
    /// Requests that may wait for a slot.
    pub queue_capacity: u32,
    /// How it times requests.
    pub timing: Timing,
    /// Blocks it holds warm at the start.
    pub initial: Vec<u64>,
    /// Blocks it keeps at most (least recently used go first).
    pub budget: usize,
    /// The speed it reports before it has measured its own (a simulated worker with
    /// no model never does): `None` reports none.
    pub nominal: Option<WorkerSpeed>,
}

/// What the simulator published and served.
#[derive(Debug, Default)]
pub struct Counters {
    /// Heartbeats published.
    pub heartbeats: AtomicU64,
    /// KV events published.
    pub kv_events: AtomicU64,
    /// Snapshots answered.
    pub snapshots: AtomicU64,
    /// Requests admitted.
    pub admitted: AtomicU64,
    /// Requests refused (full).
    pub refused: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    heartbeat_seq: u64,
    kv_seq: u64,
    tick: u64,
    /// Block → the tick it was last used; `order` holds (block, tick) oldest first,
    /// with stale entries skipped (a lazily pruned LRU).
    held: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
    in_flight: u32,
    queued: u32,
    completed: u64,
    /// (ttft ms, prefill tokens/s, slot time ms) of recent requests.
    recent: VecDeque<(f64, f64, f64)>,
}

struct SimWorker {
    spec: SimSpec,
    state: Mutex<State>,
    slots: Arc<Semaphore>,
}

impl SimWorker {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Inner {
    nats: async_nats::Client,
    subjects: Subjects,
    model: String,
    workers: HashMap<String, Arc<SimWorker>>,
    order: Vec<Arc<SimWorker>>,
    started_at_ms: u64,
    counters: Counters,
}

/// The running simulator.
pub struct Fleet {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

impl Inner {
    fn heartbeat(&self, w: &SimWorker) -> Vec<u8> {
        let mut s = w.state();
        s.heartbeat_seq += 1;
        let recent = RecentLatency {
            requests: s.recent.len() as u32,
            ttft_ms: median(s.recent.iter().map(|r| r.0).collect()),
            tpot_ms: match w.spec.timing {
                Timing::Modelled { tpot, .. } if !s.recent.is_empty() => tpot.as_secs_f64() * 1e3,
                _ => 0.0,
            },
            ..RecentLatency::default()
        };
        let status = WorkerStatus {
            v: PROTOCOL_VERSION,
            worker_id: w.spec.id.clone(),
            device: format!("simulated-{}", w.spec.backend),
            backend: w.spec.backend.clone(),
            models: vec![ServedModel {
                name: self.model.clone(),
                path: "simulated".into(),
                info: Default::default(),
                adapters: Vec::new(),
                kv_format: None,
            }],
            capacity: w.spec.capacity,
            queue_capacity: w.spec.queue_capacity,
            in_flight: s.in_flight,
            queued: s.queued,
            available: true,
            draining: false,
            host: "simulator".into(),
            pid: std::process::id(),
            started_at_ms: self.started_at_ms,
            seq: s.heartbeat_seq,
            completed: s.completed,
            version: env!("CARGO_PKG_VERSION").into(),
            kv: KvUsage {
                slots: w.spec.capacity,
                busy: s.in_flight,
                ..Default::default()
            },
            recent,
            nats_server: String::new(),
            role: Default::default(),
        };
        let speed = if s.recent.is_empty() {
            w.spec.nominal.unwrap_or_default()
        } else {
            WorkerSpeed {
                requests: s.recent.len() as u32,
                prefill_tps: median(s.recent.iter().map(|r| r.1).collect()),
                service_ms: median(s.recent.iter().map(|r| r.2).collect()),
            }
        };
        drop(s);
        encode(&Heartbeat { status, speed })
    }

    async fn publish_heartbeat(&self, w: &SimWorker) {
        let body = self.heartbeat(w);
        let _ = self
            .nats
            .publish(self.subjects.heartbeat(&w.spec.id), body.into())
            .await;
        self.counters.heartbeats.fetch_add(1, Ordering::Relaxed);
    }

    /// The request's blocks are warm now; the least recently used go over budget.
    async fn store(&self, w: &SimWorker, blocks: &[u64]) {
        let event = {
            let mut s = w.state();
            s.tick += 1;
            let tick = s.tick;
            let mut stored = Vec::new();
            for &b in blocks {
                if s.held.insert(b, tick).is_none() {
                    stored.push(b);
                }
                s.order.push_back((b, tick));
            }
            let mut removed = Vec::new();
            while s.held.len() > w.spec.budget {
                let Some((b, t)) = s.order.pop_front() else { break };
                if s.held.get(&b) == Some(&t) {
                    s.held.remove(&b);
                    removed.push(b);
                }
            }
            if s.order.len() > 4 * w.spec.budget.max(64) {
                let State { held, order, .. } = &mut *s;
                order.retain(|(b, t)| held.get(b) == Some(t));
            }
            stored.retain(|b| s.held.contains_key(b));
            (!stored.is_empty() || !removed.is_empty()).then(|| {
                s.kv_seq += 1;
                KvEvent {
                    v: PROTOCOL_VERSION,
                    worker_id: w.spec.id.clone(),
                    seq: s.kv_seq,
                    stored,
                    removed,
                    ..Default::default()
                }
            })
        };
        if let Some(e) = event {
            let _ = self.nats.publish(self.subjects.kv(&w.spec.id), encode(&e).into()).await;
            self.counters.kv_events.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn chunk(&self, inbox: &str, chunk: StreamChunk) {
        let _ = self.nats.publish(inbox.to_string(), encode(&chunk).into()).await;
    }

    /// One forwarded generate request, from admission to the last chunk.
    async fn serve(self: Arc<Self>, w: Arc<SimWorker>, msg: async_nats::Message) {
        let (Some(reply), Ok(req)) = (msg.reply.clone(), decode::<GenerateRequest>(&msg.payload)) else {
            return;
        };
        let Some(inbox) = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(HEADER_STREAM_TO))
            .map(|v| v.to_string())
        else {
            return;
        };
        let admitted = {
            let mut s = w.state();
            let ok = s.in_flight + s.queued < w.spec.capacity + w.spec.queue_capacity;
            if ok {
                s.queued += 1;
            }
            ok
        };
        let answer = Admission {
            v: PROTOCOL_VERSION,
            worker_id: w.spec.id.clone(),
            accepted: admitted,
            error: (!admitted).then(|| WireError::new(ErrorCode::Overloaded, "full").with_retry_after(100)),
        };
        let _ = self.nats.publish(reply, encode(&answer).into()).await;
        if !admitted {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.counters.admitted.fetch_add(1, Ordering::Relaxed);
        let key = kv::routing_key(req.prompt.as_deref(), req.messages.as_deref());
        let blocks = kv::prefix_blocks(&key);
        let id = req.head.request_id.as_str();
        let chunk = |seq: u64, tokens: Vec<Token>, done: bool, metrics: Option<GenerateMetrics>| StreamChunk {
            v: PROTOCOL_VERSION,
            request_id: id.to_string(),
            seq,
            tokens,
            done,
            finish_reason: done.then_some(FinishReason::Length),
            metrics,
            error: None,
            worker_id: (seq == 0 || done).then(|| w.spec.id.clone()),
            tool_calls: Vec::new(),
        };
        let token = || Token {
            id: 1,
            text: "x".into(),
            logprob: None,
            reasoning: false,
        };
        let prompt_tokens = (key.len() / BYTES_PER_TOKEN) as u32;
        match w.spec.timing {
            Timing::NoModel => {
                self.chunk(&inbox, chunk(0, vec![token()], false, None)).await;
                {
                    let mut s = w.state();
                    s.queued -= 1;
                    s.completed += 1;
                }
                let metrics = GenerateMetrics {
                    prompt_tokens,
                    generated_tokens: 1,
                    ..Default::default()
                };
                self.chunk(&inbox, chunk(1, Vec::new(), true, Some(metrics))).await;
            }
            Timing::Modelled {
                prefill_tps,
                tpot,
                output_tokens,
            } => {
                let admitted_at = Instant::now();
                self.chunk(&inbox, chunk(0, Vec::new(), false, None)).await;
                let Ok(permit) = w.slots.clone().acquire_owned().await else {
                    return;
                };
                let start = Instant::now();
                let warm = {
                    let mut s = w.state();
                    s.queued -= 1;
                    s.in_flight += 1;
                    kv::leading_overlap(&blocks, |b| s.held.contains_key(&b))
                };
                let uncached = key
                    .len()
                    .saturating_sub(warm * BLOCK_BYTES)
                    .div_ceil(BYTES_PER_TOKEN)
                    .max(1);
                tokio::time::sleep(Duration::from_secs_f64(uncached as f64 / prefill_tps)).await;
                let prefill = start.elapsed();
                self.chunk(&inbox, chunk(1, vec![token()], false, None)).await;
                let ttft = admitted_at.elapsed();
                tokio::time::sleep(tpot * output_tokens.saturating_sub(1)).await;
                let metrics = GenerateMetrics {
                    prompt_tokens,
                    cached_tokens: prompt_tokens.saturating_sub(uncached as u32),
                    generated_tokens: output_tokens,
                    prefill_us: prefill.as_micros() as u64,
                    queue_us: (start - admitted_at).as_micros() as u64,
                    ..Default::default()
                };
                {
                    let mut s = w.state();
                    s.in_flight -= 1;
                    s.completed += 1;
                    let sample = (
                        ttft.as_secs_f64() * 1e3,
                        uncached as f64 / prefill.as_secs_f64(),
                        start.elapsed().as_secs_f64() * 1e3,
                    );
                    s.recent.push_back(sample);
                    if s.recent.len() > 64 {
                        s.recent.pop_front();
                    }
                }
                drop(permit);
                self.chunk(&inbox, chunk(2, Vec::new(), true, Some(metrics))).await;
            }
        }
        self.store(&w, &blocks).await;
        // Workers heartbeat after each request, so freed capacity is seen at once.
        self.publish_heartbeat(&w).await;
    }
}

impl Fleet {
    /// Starts the simulated workers on `nats` (prefix `prefix`), serving `model`,
    /// each heartbeating every `period`.
    pub async fn start(
        nats: async_nats::Client,
        prefix: &str,
        model: &str,
        specs: Vec<SimSpec>,
        period: Duration,
    ) -> anyhow::Result<Self> {
        let subjects = Subjects::new(prefix);
        let order: Vec<Arc<SimWorker>> = specs
            .into_iter()
            .map(|spec| {
                let mut state = State::default();
                for &b in &spec.initial {
                    state.held.insert(b, 0);
                    state.order.push_back((b, 0));
                }
                // The initial blocks count as the worker's first event.
                state.kv_seq = u64::from(!spec.initial.is_empty());
                Arc::new(SimWorker {
                    slots: Arc::new(Semaphore::new(spec.capacity as usize)),
                    spec,
                    state: Mutex::new(state),
                })
            })
            .collect();
        let inner = Arc::new(Inner {
            nats: nats.clone(),
            model: model.to_string(),
            workers: order.iter().map(|w| (w.spec.id.clone(), w.clone())).collect(),
            order,
            started_at_ms: switchyard_fabric::now_ms(),
            counters: Counters::default(),
            subjects: subjects.clone(),
        });
        let mut tasks = Vec::new();
        let root = format!("{prefix}.v1.worker.");
        let mut requests = nats.subscribe(format!("{root}*.generate")).await?;
        let i = inner.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(msg) = requests.next().await {
                let wid = msg
                    .subject
                    .strip_prefix(root.as_str())
                    .and_then(|s| s.strip_suffix(".generate"));
                let Some(w) = wid.and_then(|wid| i.workers.get(wid)).cloned() else {
                    continue;
                };
                match w.spec.timing {
                    Timing::NoModel => i.clone().serve(w, msg).await,
                    Timing::Modelled { .. } => {
                        tokio::spawn(i.clone().serve(w, msg));
                    }
                }
            }
        }));
        let snapshot_root = format!("{prefix}.v1.kv.");
        let mut snapshots = nats.subscribe(format!("{snapshot_root}*.snapshot")).await?;
        let i = inner.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(msg) = snapshots.next().await {
                let wid = msg
                    .subject
                    .strip_prefix(snapshot_root.as_str())
                    .and_then(|s| s.strip_suffix(".snapshot"));
                let (Some(w), Some(reply)) = (wid.and_then(|wid| i.workers.get(wid)), msg.reply) else {
                    continue;
                };
                let snapshot = {
                    let s = w.state();
                    KvSnapshot {
                        v: PROTOCOL_VERSION,
                        worker_id: w.spec.id.clone(),
                        seq: s.kv_seq,
                        blocks: s.held.keys().copied().collect(),
                        ..Default::default()
                    }
                };
                let _ = i.nats.publish(reply, encode(&snapshot).into()).await;
                i.counters.snapshots.fetch_add(1, Ordering::Relaxed);
            }
        }));
        let mut discover = nats.subscribe(subjects.discover()).await?;
        let i = inner.clone();
        tasks.push(tokio::spawn(async move {
            while discover.next().await.is_some() {
                for w in &i.order {
                    i.publish_heartbeat(w).await;
                }
            }
        }));
        // Periodic heartbeats, spread evenly over the period in 10 ms slices.
        let i = inner.clone();
        tasks.push(tokio::spawn(async move {
            let slices = (period.as_millis() / 10).max(1) as usize;
            let per_slice = i.order.len().div_ceil(slices);
            let mut tick = tokio::time::interval(period / slices as u32);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut next = 0;
            loop {
                tick.tick().await;
                for _ in 0..per_slice {
                    if let Some(w) = i.order.get(next) {
                        i.publish_heartbeat(w).await;
                    }
                    next = (next + 1) % i.order.len().max(1);
                }
            }
        }));
        for w in &inner.order {
            inner.publish_heartbeat(w).await;
        }
        Ok(Self { inner, tasks })
    }

    /// Publishes `rounds` heartbeats of every worker as fast as the connection takes
    /// them; returns how many.
    pub async fn blast_heartbeats(&self, rounds: usize) -> u64 {
        let mut n = 0;
        for _ in 0..rounds {
            for w in &self.inner.order {
                self.inner.publish_heartbeat(w).await;
                n += 1;
            }
        }
        let _ = self.inner.nats.flush().await;
        n
    }

    /// What it published and served.
    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Blocks held in all, and distinct blocks.
    pub fn held(&self) -> (usize, usize) {
        let mut distinct = HashSet::new();
        let mut total = 0;
        for w in &self.inner.order {
            let s = w.state();
            total += s.held.len();
            distinct.extend(s.held.keys().copied());
        }
        (total, distinct.len())
    }

    /// Stops every task.
    pub fn stop(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}
