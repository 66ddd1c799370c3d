//! Pipeline stages over NATS (docs/deploy.md, "A model across machines";
//! protocol §11h): the first stage's [`NatsLink`] — how the engine's
//! [`PipelineForward`](switchyard_engine::pipeline::PipelineForward) reaches the
//! stages after it — and a later stage's service ([`serve_stage`]), which runs its
//! layers and passes the rows on (or, the last, answers the first stage).
//!
//! Batches go stage to stage on direct subjects (`{p}.v1.stage.{pipeline}.{layer}`),
//! never through a coordinator; each keeps the first stage's reply subject, so the
//! last stage answers it directly. Order matters (a step may rely on a prefix a
//! slot took in the batch before), so each side publishes in the order it computes.

use super::worker_backend::{capacity, Loaded};
use crate::local;
use anyhow::Context;
use async_nats::Client;
use bytes::Bytes;
use futures::StreamExt;
use std::ops::Range;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_backend::TextModel;
use switchyard_config::WorkerConfig;
use switchyard_engine::model::llama::LlamaModel;
use switchyard_engine::pipeline::{StageLink, StageServer, StageView, STAGE_VERSION};
use switchyard_messages::stage::{rows_to_bytes, StageBatch, StageReply, StageReport};
use switchyard_messages::{decode, encode, BackendKind, Device, ErrorCode, LoadConfig, Subjects, WireError};

/// Bytes a batch leaves free under the server's `max_payload` (its other fields).
const HEADROOM: usize = 16 * 1024;

/// A batch's bytes and where its answer goes.
type Outgoing = (Vec<u8>, Sender<Result<StageReply, String>>);

/// How often the first stage probes the stages after it.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long a probe waits: stages answer probes off their compute thread, so only
/// a stopped or cut-off stage is this slow.
const PROBE_WAIT: Duration = Duration::from_secs(2);

/// When a probe that found a stage missing started, and what it found.
type Missing = Option<(Instant, String)>;

/// The first stage's way to the stages after it: batches published in order on
/// the next stage's subject, each answered on an inbox of its own; and, once
/// [`StageLink::watch`] starts it, a probe of every stage each second.
pub struct NatsLink {
    queue: tokio::sync::mpsc::UnboundedSender<Outgoing>,
    max_bytes: usize,
    client: Client,
    subjects: Subjects,
    pipeline: String,
    next: usize,
    runtime: tokio::runtime::Handle,
    missing: Arc<tokio::sync::watch::Sender<Missing>>,
}

impl NatsLink {
    /// A link to the stage of `pipeline` whose layers start at `next`, on `client`'s
    /// runtime. A batch fails once it has waited `timeout` while no batch was
    /// answered for as long (a stalled stage), not merely because many chunks of a
    /// long prompt queue ahead of it at a slower stage; and at once when a probe
    /// started after it was sent finds a stage gone.
    pub fn new(client: Client, subjects: &Subjects, pipeline: &str, next: usize, timeout: Duration) -> Self {
        let subject = subjects.stage(pipeline, next);
        let max_bytes = (client.server_info().max_payload).saturating_sub(HEADROOM).max(4096);
        let (queue, mut batches) = tokio::sync::mpsc::unbounded_channel::<Outgoing>();
        let what = format!("pipeline {pipeline}'s stage from layer {next} ({subject})");
        let (missing, gone) = tokio::sync::watch::channel::<Missing>(None);
        // When the stages last answered a batch.
        let progress = Arc::new(std::sync::Mutex::new(Instant::now()));
        let c = client.clone();
        tokio::spawn(async move {
            let client = c;
            while let Some((payload, answer)) = batches.recv().await {
                let inbox = client.new_inbox();
                let mut sub = match client.subscribe(inbox.clone()).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = answer.send(Err(format!("subscribing for {what}'s answer: {e}")));
                        continue;
                    }
                };
                if let Err(e) = client.publish_with_reply(subject.clone(), inbox, payload.into()).await {
                    let _ = answer.send(Err(format!("sending to {what}: {e}")));
                    continue;
                }
                let (what, progress, sent) = (what.clone(), progress.clone(), Instant::now());
                let mut gone = gone.clone();
                tokio::spawn(async move {
                    let quiet = || {
                        let last = *progress.lock().unwrap_or_else(|p| p.into_inner());
                        sent.elapsed().min(last.elapsed())
                    };
                    let mut watching = true;
                    let answer_or_not = async {
                        loop {
                            let left = timeout.saturating_sub(quiet());
                            if left.is_zero() {
                                return Err(format!("{what} did not answer within {timeout:?}"));
                            }
                            tokio::select! {
                                m = sub.next() => return Ok(m),
                                () = tokio::time::sleep(left) => {}
                                changed = gone.changed(), if watching => match changed {
                                    Err(_) => watching = false,
                                    Ok(()) => {
                                        if let Some((at, why)) = gone.borrow_and_update().clone() {
                                            if at > sent {
                                                return Err(format!("a stage of the pipeline is not running: {why}"));
                                            }
                                        }
                                    }
                                },
                            }
                        }
                    };
                    let got = match answer_or_not.await {
                        Err(why) => Err(why),
                        Ok(None) => Err(format!("the answer from {what} was lost (the connection closed)")),
                        Ok(Some(m)) if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) => Err(format!(
                            "a stage of the pipeline is not running (no worker answered on {what} or a stage after it)"
                        )),
                        Ok(Some(m)) => {
                            *progress.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                            decode::<StageReply>(&m.payload).map_err(|e| format!("a malformed answer from {what}: {e}"))
                        }
                    };
                    let _ = answer.send(got);
                });
            }
        });
        Self {
            queue,
            max_bytes,
            client,
            subjects: subjects.clone(),
            pipeline: pipeline.to_string(),
            next,
            runtime: tokio::runtime::Handle::current(),
            missing: Arc::new(missing),
        }
    }
}

/// Why a probe of the stages failed.
enum Fault {
    /// No stage subscribes to a range's subject (its worker died or never started):
    /// batches waiting on it will never be answered.
    Missing(String),
    /// A stage did not answer in time (stopped, or cut off): batches may still be.
    Silent(String),
}

/// Probes the stages of `pipeline` from layer `next` to the model's `layers`, in
/// order (each stage's answer names where the next starts): their reports.
async fn probe(
    client: &Client,
    subjects: &Subjects,
    pipeline: &str,
    mut next: usize,
    layers: usize,
) -> Result<Vec<StageReport>, Fault> {
    let mut seen = Vec::new();
    while next < layers {
        let subject = subjects.stage(pipeline, next);
        let asked = tokio::time::timeout(PROBE_WAIT, client.request(subject.clone(), Bytes::new())).await;
        let m = match asked {
            Ok(Ok(m)) => m,
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                return Err(Fault::Missing(format!(
                    "no stage serves layers from {next} ({subject})"
                )))
            }
            Ok(Err(e)) => {
                return Err(Fault::Silent(format!(
                    "the stage serving layers from {next} ({subject}) did not answer a probe: {e}"
                )))
            }
            Err(_) => {
                return Err(Fault::Silent(format!(
                    "the stage serving layers from {next} ({subject}) did not answer a probe within {PROBE_WAIT:?}"
                )))
            }
        };
        let report = decode::<StageReply>(&m.payload)
            .ok()
            .and_then(|r| r.stages.into_iter().next())
            .filter(|r| r.first_layer as usize == next && r.last_layer as usize >= next);
        let Some(r) = report else {
            return Err(Fault::Silent(format!(
                "the stage serving layers from {next} ({subject}) answered a probe without its layers (an older build?)"
            )));
        };
        next = r.last_layer as usize + 1;
        seen.push(r);
    }
    Ok(seen)
}

impl StageLink for NatsLink {
    fn send(&self, batch: StageBatch) -> Receiver<Result<StageReply, String>> {
        let (tx, rx) = std::sync::mpsc::channel();
        if let Err(e) = self.queue.send((encode(&batch), tx)) {
            let _ = e.0 .1.send(Err("the worker is stopping".into()));
        }
        rx
    }

    fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Probes the stages each second: one gone fails the batches waiting on it
    /// at once (rather than at the stall timeout), and a missing or silent one
    /// marks the pipeline broken until every stage answers again.
    fn watch(&self, layers: usize, view: StageView) {
        let (client, subjects, pipeline) = (self.client.clone(), self.subjects.clone(), self.pipeline.clone());
        let (next, missing) = (self.next, self.missing.clone());
        self.runtime.spawn(async move {
            let mut tick = tokio::time::interval(PROBE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !missing.is_closed() {
                tick.tick().await;
                let started = Instant::now();
                let found = probe(&client, &subjects, &pipeline, next, layers).await;
                let mut seen = view.lock().unwrap_or_else(|p| p.into_inner());
                match found {
                    Ok(stages) => {
                        if seen.broken.take().is_some() {
                            tracing::info!("pipeline {pipeline}: every stage answers again");
                        }
                        let key = |s: &[StageReport]| -> Vec<(String, u32, u32)> {
                            s.iter()
                                .map(|r| (r.worker_id.clone(), r.first_layer, r.last_layer))
                                .collect()
                        };
                        // A stage new or back: named before its first batch.
                        if key(&seen.stages) != key(&stages) {
                            seen.stages = stages;
                        }
                    }
                    Err(Fault::Missing(why)) => {
                        if seen.broken.as_ref() != Some(&why) {
                            tracing::warn!("pipeline {pipeline}: {why}");
                            seen.broken = Some(why.clone());
                        }
                        // Batches sent before this probe began wait on it in vain.
                        missing.send_replace(Some((started, why)));
                    }
                    Err(Fault::Silent(why)) => {
                        if seen.broken.as_ref() != Some(&why) {
                            tracing::warn!("pipeline {pipeline}: {why}");
                            seen.broken = Some(why);
                        }
                    }
                }
            }
        });
    }
}

/// Loads the first stage of `w.pipeline` (`w.layers` from 0) with its link to the
/// next stage on `client`.
pub async fn load_first_stage(w: &WorkerConfig, client: Client, subjects: &Subjects) -> anyhow::Result<Loaded> {
    let layers = w
        .stage_layers()
        .map_err(anyhow::Error::msg)?
        .context("not a pipeline stage")?;
    anyhow::ensure!(layers.start == 0, "the first stage holds layer 0, not {:?}", w.layers);
    let path = local::model_path(w)?;
    anyhow::ensure!(
        path.is_file(),
        "pipeline stages load GGUF files; {} is not one",
        path.display()
    );
    let name = local::model_name(w, &path);
    let link = NatsLink::new(
        client,
        subjects,
        &w.pipeline,
        layers.end,
        Duration::from_millis(w.stage_timeout_ms.max(1)),
    );
    eprintln!(
        "loading layers {} of {} as the first stage of pipeline {} …",
        w.layers,
        path.display(),
        w.pipeline
    );
    let started = Instant::now();
    let load = load_config(w);
    let (p, pipeline, end) = (path.clone(), w.pipeline.clone(), layers.end);
    let model = tokio::task::spawn_blocking(move || {
        switchyard_engine::EngineModel::load_first_stage(&p, &load, end, Box::new(link), &pipeline)
    })
    .await
    .context("model loading task")??;
    let info = model.info();
    eprintln!(
        "loaded {name}: layers 0-{} of {} (the rest on later stages), hidden {}, in {:.2} s",
        end - 1,
        info.num_layers,
        info.hidden_size,
        started.elapsed().as_secs_f64()
    );
    let model: Arc<dyn TextModel> = Arc::new(model);
    Ok(Loaded {
        capacity: capacity(w, model.parallel_slots()),
        model,
        path,
        name,
        backend: BackendKind::Cpu,
        device: Device::Cpu,
        supervisor: None,
    })
}

fn load_config(w: &WorkerConfig) -> LoadConfig {
    LoadConfig {
        backend: "cpu".into(),
        context_len: w.context_len,
        threads: w.threads,
        parallel_slots: w.parallel_slots,
        kv_cache_mb: 0,
        prefill_chunk: w.prefill_chunk,
        speculative: w.speculative.clone(),
        draft_model: w.draft_model.clone(),
        draft_max: w.draft_max,
        ..LoadConfig::default()
    }
}

/// A later stage, serving until [`StageHandle::stop`] or until its compute thread
/// ends.
pub struct StageHandle {
    /// The stage's id, layers and subject, for logs.
    pub worker_id: String,
    pub layers: Range<usize>,
    pub subject: String,
    task: tokio::task::JoinHandle<()>,
    done: tokio::sync::watch::Receiver<Option<String>>,
}

impl StageHandle {
    /// Waits until the stage fails; the reason.
    pub async fn failed(&mut self) -> String {
        loop {
            if let Some(why) = self.done.borrow().clone() {
                return why;
            }
            if self.done.changed().await.is_err() {
                return "the stage's compute thread ended".into();
            }
        }
    }

    /// Stops serving (batches in flight get no answer: the first stage's
    /// requests end retryable at its timeout or at once when no one listens).
    pub fn stop(self) {
        self.task.abort();
    }
}

/// Loads `w.layers` (not from 0) of the model as a later stage of `w.pipeline` and
/// serves it on `client`.
pub async fn serve_stage(
    w: &WorkerConfig,
    client: Client,
    subjects: &Subjects,
    worker_id: &str,
) -> anyhow::Result<StageHandle> {
    let layers = w
        .stage_layers()
        .map_err(anyhow::Error::msg)?
        .context("not a pipeline stage")?;
    anyhow::ensure!(
        layers.start > 0,
        "layer 0 is the first stage's: it serves requests as a worker"
    );
    let subject = subjects.stage(&w.pipeline, layers.start);
    // One stage per range: a second would split the sequences' KV between them.
    if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(2), client.request(subject.clone(), Bytes::new())).await
    {
        let who = decode::<StageReply>(&m.payload)
            .ok()
            .and_then(|r| r.error)
            .map_or_else(String::new, |e| e.message);
        anyhow::bail!(
            "layers {} of pipeline {} are already served ({who})",
            w.layers,
            w.pipeline
        );
    }
    let path = local::model_path(w)?;
    // Pages are allocated as positions are written, so a stage takes whatever
    // context and slots its first stage runs with (which bounds them itself).
    let (ctx, slots) = (1 << 20, 4096);
    eprintln!(
        "loading layers {} of {} as a stage of pipeline {} …",
        w.layers,
        path.display(),
        w.pipeline
    );
    let started = Instant::now();
    let (p, span, pipeline) = (path.clone(), layers.clone(), w.pipeline.clone());
    let stage = tokio::task::spawn_blocking(move || -> anyhow::Result<StageServer> {
        switchyard_engine::kernels::isa::init().map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut file = std::fs::File::open(&p).with_context(|| p.display().to_string())?;
        let content = candle_core::quantized::gguf_file::Content::read(&mut file)
            .map_err(|e| anyhow::anyhow!("{}: not a readable GGUF file: {e}", p.display()))?;
        let total = switchyard_engine::model::params::LlamaParams::from_gguf(&content)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .n_layer;
        let model = LlamaModel::load_stage(&content, &mut file, ctx, span, false).map_err(anyhow::Error::msg)?;
        StageServer::new(model, &pipeline, total, slots).map_err(anyhow::Error::msg)
    })
    .await
    .context("model loading task")??;
    eprintln!(
        "loaded layers {} ({}the last) in {:.2} s",
        w.layers,
        if stage.last() { "" } else { "not " },
        started.elapsed().as_secs_f64()
    );
    let next = (!stage.last()).then(|| subjects.stage(&w.pipeline, layers.end));
    let mut sub = client.subscribe(subject.clone()).await?;
    let (jobs, rx) = std::sync::mpsc::sync_channel::<async_nats::Message>(64);
    let (done_tx, done) = tokio::sync::watch::channel(None);
    let runtime = tokio::runtime::Handle::current();
    let (id, c) = (worker_id.to_string(), client.clone());
    let c2 = client.clone();
    let threads = w.threads as usize;
    std::thread::Builder::new().name("stage".into()).spawn(move || {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
        let why = match pool {
            Ok(pool) => pool.install(|| compute(stage, rx, &runtime, &c, next.as_deref(), &id)),
            Err(e) => format!("starting the compute threads: {e}"),
        };
        let _ = done_tx.send(Some(why));
    })?;
    let (me, span) = (worker_id.to_string(), layers.clone());
    let task = tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            if m.payload.is_empty() {
                // A probe (the first stage's, or a new stage asking whether this
                // range is taken): answered here, not behind the batches queued
                // for compute, with this stage's report.
                if let Some(reply) = m.reply {
                    let report = StageReport {
                        worker_id: me.clone(),
                        first_layer: span.start as u32,
                        last_layer: span.end as u32 - 1,
                        compute_us: 0,
                        rss_bytes: switchyard_fabric::host::process_memory(None).1,
                    };
                    let who = format!("stage {me} (layers {}-{})", span.start, span.end - 1);
                    let answer = StageReply {
                        v: STAGE_VERSION,
                        rows: Vec::new(),
                        stages: vec![report],
                        error: Some(WireError::new(ErrorCode::BadRequest, who)),
                    };
                    let _ = c2.publish(reply, encode(&answer).into()).await;
                }
                continue;
            }
            if jobs.send(m).is_err() {
                break;
            }
        }
    });
    Ok(StageHandle {
        worker_id: worker_id.to_string(),
        layers,
        subject,
        task,
        done,
    })
}

/// The compute loop: each batch through the stage's layers, then on to the next
/// stage or back to the first. Returns why it stopped.
fn compute(
    mut stage: StageServer,
    jobs: std::sync::mpsc::Receiver<async_nats::Message>,
    runtime: &tokio::runtime::Handle,
    client: &Client,
    next: Option<&str>,
    worker_id: &str,
) -> String {
    let span = stage.span();
    let me = format!("stage {worker_id} (layers {}-{})", span.start, span.end - 1);
    while let Ok(m) = jobs.recv() {
        let Some(reply) = m.reply.clone() else { continue };
        let answer = |r: StageReply| {
            let _ = runtime.block_on(client.publish(reply.clone(), encode(&r).into()));
        };
        let fail = |e: WireError, passed: Vec<StageReport>| {
            answer(StageReply {
                v: STAGE_VERSION,
                rows: Vec::new(),
                stages: passed,
                error: Some(e),
            })
        };
        let mut batch = match decode::<StageBatch>(&m.payload) {
            Ok(b) => b,
            Err(e) => {
                fail(WireError::new(ErrorCode::BadRequest, format!("{me}: {e}")), Vec::new());
                continue;
            }
        };
        let started = Instant::now();
        let rows = match stage.run(&batch) {
            Ok(rows) => rows,
            Err(mut e) => {
                e.message = format!("{me}: {}", e.message);
                fail(e, std::mem::take(&mut batch.passed));
                continue;
            }
        };
        batch.passed.push(StageReport {
            worker_id: worker_id.to_string(),
            first_layer: span.start as u32,
            last_layer: span.end as u32 - 1,
            compute_us: started.elapsed().as_micros() as u64,
            rss_bytes: switchyard_fabric::host::process_memory(None).1,
        });
        match next {
            Some(next) => {
                batch.rows = rows_to_bytes(&rows);
                let sent =
                    runtime.block_on(client.publish_with_reply(next.to_string(), reply.clone(), encode(&batch).into()));
                if let Err(e) = sent {
                    fail(
                        WireError::new(ErrorCode::Unavailable, format!("{me}: passing rows on to {next}: {e}")),
                        batch.passed,
                    );
                }
            }
            None => answer(StageReply {
                v: STAGE_VERSION,
                rows: rows_to_bytes(&rows),
                stages: batch.passed,
                error: None,
            }),
        }
    }
    format!("{me}: its subscription ended")
}
