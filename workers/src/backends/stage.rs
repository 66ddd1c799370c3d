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
use switchyard_engine::pipeline::{StageLink, StageServer, STAGE_VERSION};
use switchyard_messages::stage::{rows_to_bytes, StageBatch, StageReply, StageReport};
use switchyard_messages::{decode, encode, BackendKind, Device, ErrorCode, LoadConfig, Subjects, WireError};

/// Bytes a batch leaves free under the server's `max_payload` (its other fields).
const HEADROOM: usize = 16 * 1024;

/// A batch's bytes and where its answer goes.
type Outgoing = (Vec<u8>, Sender<Result<StageReply, String>>);

/// The first stage's way to the stages after it: batches published in order on
/// the next stage's subject, each answered on an inbox of its own.
pub struct NatsLink {
    queue: tokio::sync::mpsc::UnboundedSender<Outgoing>,
    max_bytes: usize,
}

impl NatsLink {
    /// A link to the stage of `pipeline` whose layers start at `next`, on `client`'s
    /// runtime. A batch fails once it has waited `timeout` while no batch was
    /// answered for as long (a stalled stage), not merely because many chunks of a
    /// long prompt queue ahead of it at a slower stage.
    pub fn new(client: Client, subjects: &Subjects, pipeline: &str, next: usize, timeout: Duration) -> Self {
        let subject = subjects.stage(pipeline, next);
        let max_bytes = (client.server_info().max_payload).saturating_sub(HEADROOM).max(4096);
        let (queue, mut batches) = tokio::sync::mpsc::unbounded_channel::<Outgoing>();
        let what = format!("pipeline {pipeline}'s stage from layer {next} ({subject})");
        // When the stages last answered a batch.
        let progress = Arc::new(std::sync::Mutex::new(Instant::now()));
        tokio::spawn(async move {
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
                tokio::spawn(async move {
                    let quiet = || {
                        let last = *progress.lock().unwrap_or_else(|p| p.into_inner());
                        sent.elapsed().min(last.elapsed())
                    };
                    let answer_or_stall = async {
                        loop {
                            let left = timeout.saturating_sub(quiet());
                            if left.is_zero() {
                                return None;
                            }
                            if let Ok(m) = tokio::time::timeout(left, sub.next()).await {
                                return Some(m);
                            }
                        }
                    };
                    let got = match answer_or_stall.await {
                        None => Err(format!("{what} did not answer within {timeout:?}")),
                        Some(None) => Err(format!("the answer from {what} was lost (the connection closed)")),
                        Some(Some(m)) if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) => Err(format!(
                            "a stage of the pipeline is not running (no worker answered on {what} or a stage after it)"
                        )),
                        Some(Some(m)) => {
                            *progress.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                            decode::<StageReply>(&m.payload).map_err(|e| format!("a malformed answer from {what}: {e}"))
                        }
                    };
                    let _ = answer.send(got);
                });
            }
        });
        Self { queue, max_bytes }
    }
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
    let threads = w.threads as usize;
    std::thread::Builder::new().name("stage".into()).spawn(move || {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
        let why = match pool {
            Ok(pool) => pool.install(|| compute(stage, rx, &runtime, &c, next.as_deref(), &id)),
            Err(e) => format!("starting the compute threads: {e}"),
        };
        let _ = done_tx.send(Some(why));
    })?;
    let task = tokio::spawn(async move {
        while let Some(m) = sub.next().await {
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
        if m.payload.is_empty() {
            // A new stage asking whether this range is taken.
            fail(WireError::new(ErrorCode::BadRequest, me.clone()), Vec::new());
            continue;
        }
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
