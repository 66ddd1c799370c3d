//! One model as a pipeline of stages (docs/deploy.md, "A model across machines"):
//! the first stage's [`PipelineForward`] — the forward pass the engine drives, so
//! batching, sampling, constraints and speculation run unchanged — and a later
//! stage's [`StageServer`]. How batches travel between them is a [`StageLink`]'s
//! business (NATS in the worker; a thread in tests).
//!
//! **Overlap.** A batch of several sequences is cut into micro-batches: the first
//! stage sends one on as soon as its layers are done and starts the next, so while
//! a later stage computes micro-batch k the first computes k + 1.

use crate::model::forward::{Forward, SeqStep};
use crate::model::llama::{KvCache, LlamaModel, Step};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use switchyard_backend::BackendError;
use switchyard_messages::stage::{
    rows_from_bytes, rows_to_bytes, StageBatch, StageOp, StageReply, StageReport, StageStep,
};
use switchyard_messages::{ErrorCode, WireError};

mod local;
pub use local::LocalLink;

/// The version of [`StageBatch`] and [`StageReply`] this build speaks.
pub const STAGE_VERSION: u32 = 1;

/// Rows of a long step's chunks: large enough to keep the matrix kernels at full
/// speed, small enough that the stages overlap on a prompt.
const CHUNK_ROWS: usize = 128;

/// The fewest rows worth a micro-batch of their own.
const MICRO_ROWS: usize = 32;

/// A batch sent on: its answer, and how many rows of logits it brings.
type Pending = (Receiver<Result<StageReply, String>>, usize);

/// The later stages of a pipeline as their last answer named them.
pub type StageView = Arc<Mutex<Seen>>;

/// What the first stage knows of the stages after it.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Their reports, as the last answer named them.
    pub stages: Vec<StageReport>,
    /// Why the pipeline cannot serve now (a stage missing or silent), while it
    /// cannot: the model then says it is unhealthy, so the fleet routes elsewhere.
    pub broken: Option<String>,
}

/// How batches reach the stages past the first, and their answers come back.
pub trait StageLink: Send {
    /// Sends `batch` on; its answer (or why there is none) arrives on the receiver.
    fn send(&self, batch: StageBatch) -> Receiver<Result<StageReply, String>>;
    /// The most bytes one batch may carry (the transport's message limit).
    fn max_bytes(&self) -> usize;
    /// Starts watching the stages of a `layers`-layer model, recording in `view`
    /// when one goes missing or silent (and when all answer again). A link with no
    /// way to tell keeps this default.
    fn watch(&self, layers: usize, view: StageView) {
        let _ = (layers, view);
    }
}

/// The first stage: its own layers (with the embeddings, output norm and
/// projection) on [`crate::model::forward::CpuForward`]'s caches, the rest through
/// a [`StageLink`].
pub struct PipelineForward {
    model: LlamaModel,
    caches: Vec<KvCache>,
    share: bool,
    link: Box<dyn StageLink>,
    pipeline: String,
    /// The whole model's layer count.
    layers: usize,
    /// This run of the pipeline; a new one after a failure (the stages forget).
    epoch: u64,
    /// What happened to the slots since the last batch went out.
    ops: Vec<StageOp>,
    /// Slots whose KV the later stages may have lost (after a failure): they start
    /// over (`resumable` is 0) until a step from position 0.
    stale: Vec<bool>,
    /// Micro-batches a batch of several sequences is cut into.
    micro: usize,
    /// The later stages as the last answer named them.
    stages: StageView,
}

impl PipelineForward {
    /// `model` (a first stage: [`LlamaModel::ends`], layers from 0) with `slots`
    /// KV sequences, the rest of the `layers`-layer model behind `link`.
    pub fn new(
        model: LlamaModel,
        slots: usize,
        link: Box<dyn StageLink>,
        pipeline: &str,
        layers: usize,
    ) -> Result<Self, String> {
        let span = model.span();
        if !model.ends() || span.start != 0 || span.end >= layers {
            return Err(format!(
                "a first stage holds layers from 0 and the embeddings, and leaves some of the {layers} to later stages"
            ));
        }
        let slots = slots.max(1);
        let stages = StageView::default();
        link.watch(layers, stages.clone());
        Ok(Self {
            caches: (0..slots).map(|_| model.new_cache()).collect(),
            model,
            share: true,
            link,
            pipeline: pipeline.to_string(),
            layers,
            epoch: new_epoch(),
            ops: Vec::new(),
            stale: vec![false; slots],
            // `SWITCHYARD_PIPELINE_MICRO` (experiments): how many micro-batches.
            micro: std::env::var("SWITCHYARD_PIPELINE_MICRO")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(2),
            stages,
        })
    }

    /// Cuts batches of several sequences into `n` micro-batches (at least 1).
    pub fn with_micro_batches(mut self, n: usize) -> Self {
        self.micro = n.max(1);
        self
    }

    /// The later stages as their last answer named them (shared: read it while
    /// the engine runs).
    pub fn stages(&self) -> StageView {
        self.stages.clone()
    }

    /// Rows one batch may carry.
    fn max_rows(&self) -> usize {
        (self.link.max_bytes() / (self.model.params.n_embd * 4).max(1)).max(1)
    }

    /// Groups of step indices, each sent as one micro-batch: up to `micro` groups
    /// of about equal count, none under [`MICRO_ROWS`] rows (a micro-batch reads
    /// the stage's weights again: small ones cost more than they overlap), each
    /// within the transport's row budget.
    fn groups(&self, steps: &[SeqStep<'_>]) -> Vec<Vec<usize>> {
        let rows: usize = steps.iter().map(|s| s.tokens.len()).sum();
        let min_rows = std::env::var("SWITCHYARD_PIPELINE_MICRO_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(MICRO_ROWS)
            .max(1);
        let n = self.micro.min(rows / min_rows).clamp(1, steps.len().max(1));
        let per = steps.len().div_ceil(n);
        let max_rows = self.max_rows();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut rows = 0;
        for (i, s) in steps.iter().enumerate() {
            let full = groups
                .last()
                .is_none_or(|g| g.len() >= per || rows + s.tokens.len() > max_rows);
            if full {
                groups.push(Vec::new());
                rows = 0;
            }
            groups.last_mut().expect("pushed").push(i);
            rows += s.tokens.len();
        }
        groups
    }

    /// After a failure: the stages may hold anything, so they start again from
    /// nothing (a new epoch) and so does every slot.
    fn lose_stages(&mut self, why: String) -> BackendError {
        self.epoch = new_epoch();
        self.ops.clear();
        self.stale.iter_mut().for_each(|s| *s = true);
        BackendError::Lost(format!("pipeline {}: {why}", self.pipeline))
    }

    fn run(&mut self, steps: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        let ctx = self.model.context_len();
        let mut seen = vec![false; self.caches.len()];
        for s in steps {
            if s.pos + s.tokens.len() > ctx {
                return Err(BackendError::Compute(format!(
                    "position {} beyond the KV cache of {ctx}",
                    s.pos + s.tokens.len()
                )));
            }
            if s.seq >= seen.len() || std::mem::replace(&mut seen[s.seq], true) {
                return Err(BackendError::Compute(format!(
                    "sequence {} missing or named twice",
                    s.seq
                )));
            }
            if self.stale[s.seq] && s.pos > 0 {
                return Err(BackendError::Compute(format!(
                    "sequence {} resumes at {} after the pipeline's stages lost its KV",
                    s.seq, s.pos
                )));
            }
        }
        // A long step (a prompt) runs its leading tokens first, in chunks of their
        // own without logits (the same rows, so the same values), each sent on as
        // soon as this stage is done with it: the next stage computes chunk k while
        // this one computes chunk k + 1.
        let max = self.max_rows().min(CHUNK_ROWS);
        let mut leads = Vec::new();
        let mut rest: Vec<SeqStep<'_>> = steps.to_vec();
        loop {
            let lead: Vec<SeqStep<'_>> = rest
                .iter_mut()
                .filter(|s| s.tokens.len() > max && s.tokens.len() > s.outputs)
                .map(|s| {
                    let n = max.min(s.tokens.len() - s.outputs);
                    let lead = SeqStep {
                        outputs: 0,
                        ..SeqStep::new(s.seq, &s.tokens[..n], s.pos)
                    };
                    s.tokens = &s.tokens[n..];
                    s.pos += n;
                    lead
                })
                .collect();
            if lead.is_empty() {
                break;
            }
            leads.extend(self.send(&lead));
        }
        let last = self.send(&rest);
        // Their answers (no rows) come first: the stages answer in order.
        self.collect(leads)?;
        let out = self.collect(last)?;
        for s in steps {
            self.stale[s.seq] = false;
        }
        Ok(out)
    }

    /// One pass over `steps` (checked, each within a batch's rows) through this
    /// stage's layers, in micro-batches, each sent on when done; what to wait for.
    fn send(&mut self, steps: &[SeqStep<'_>]) -> Vec<Pending> {
        let d = self.model.params.n_embd;
        let mut pending = Vec::new();
        for group in self.groups(steps) {
            let mut caches: Vec<Option<&mut KvCache>> = self.caches.iter_mut().map(Some).collect();
            let mut batch: Vec<Step<'_>> = group
                .iter()
                .map(|&i| {
                    let s = &steps[i];
                    Step {
                        cache: caches[s.seq].take().expect("checked distinct"),
                        tokens: s.tokens,
                        pos: s.pos,
                        outputs: s.outputs,
                        lora: None,
                    }
                })
                .collect();
            let rows = self.model.stage_pass(&mut batch, None, true);
            let outputs: usize = batch.iter().map(|s| s.outputs).sum();
            let msg = StageBatch {
                v: STAGE_VERSION,
                pipeline: self.pipeline.clone(),
                epoch: self.epoch,
                layers: self.layers as u32,
                n_embd: d as u32,
                ops: std::mem::take(&mut self.ops),
                steps: group
                    .iter()
                    .map(|&i| StageStep {
                        seq: steps[i].seq as u32,
                        pos: steps[i].pos as u32,
                        tokens: steps[i].tokens.to_vec(),
                        outputs: steps[i].outputs as u32,
                    })
                    .collect(),
                passed: Vec::new(),
                rows: rows_to_bytes(&rows),
            };
            pending.push((self.link.send(msg), outputs));
        }
        pending
    }

    /// Waits for the answers to what [`Self::send`] sent, in order: the logits of
    /// the positions that wanted them.
    fn collect(&mut self, pending: Vec<Pending>) -> Result<Vec<Vec<f32>>, BackendError> {
        let d = self.model.params.n_embd;
        let mut out = Vec::new();
        for (rx, outputs) in pending {
            let reply = match rx.recv() {
                Ok(Ok(r)) => r,
                Ok(Err(why)) => return Err(self.lose_stages(why)),
                Err(_) => return Err(self.lose_stages("the link to the next stage closed".into())),
            };
            if let Some(e) = reply.error {
                return Err(self.lose_stages(e.message));
            }
            let rows = rows_from_bytes(&reply.rows).filter(|r| r.len() == outputs * d);
            let Some(rows) = rows else {
                return Err(self.lose_stages(format!(
                    "the last stage answered {} bytes for {outputs} rows of {d}",
                    reply.rows.len()
                )));
            };
            if outputs > 0 {
                out.extend(self.model.stage_logits(&rows));
            }
            self.stages.lock().unwrap_or_else(|p| p.into_inner()).stages = reply.stages;
        }
        Ok(out)
    }
}

impl Forward for PipelineForward {
    fn sequences(&self) -> usize {
        self.caches.len()
    }

    fn forward_batch(&mut self, steps: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        self.run(steps)
    }

    fn kind(&self) -> &'static str {
        "switchyard-pipeline"
    }

    fn reuses_prefix(&self) -> bool {
        true
    }

    fn resumable(&self, seq: usize, want: usize) -> usize {
        match self.stale.get(seq) {
            Some(false) => want,
            _ => 0,
        }
    }

    fn share_prefixes(&mut self, share: bool) {
        self.share = share;
    }

    /// Shares the pages here and has every later stage do the same before the
    /// next batch.
    fn copy_prefix(&mut self, from: usize, to: usize, len: usize) -> bool {
        if from == to || from >= self.caches.len() || to >= self.caches.len() || self.stale[from] {
            return false;
        }
        let (src, dst) = if from < to {
            let (a, b) = self.caches.split_at_mut(to);
            (&a[from], &mut b[0])
        } else {
            let (a, b) = self.caches.split_at_mut(from);
            (&b[0], &mut a[to])
        };
        dst.copy_prefix(src, len, self.share);
        self.stale[to] = false;
        self.ops.push(StageOp::CopyPrefix {
            from: from as u32,
            to: to as u32,
            len: len as u32,
        });
        true
    }

    /// This stage's layers only: each stage holds the KV of its own.
    fn kv_bytes_per_token(&self) -> usize {
        self.caches[0].bytes_per_token(&self.model.params)
    }

    fn kv_held_bytes(&self) -> Option<usize> {
        Some(KvCache::distinct_page_bytes(&self.caches))
    }
}

/// A stage past the first: its layers, and the KV of those layers for the first
/// stage's sequences.
pub struct StageServer {
    model: LlamaModel,
    caches: Vec<KvCache>,
    pipeline: String,
    /// The whole model's layer count.
    layers: usize,
    epoch: u64,
    /// The most sequences it keeps KV for.
    max_seqs: usize,
}

impl StageServer {
    /// `model` (a later stage: not [`LlamaModel::ends`]) of the `layers`-layer
    /// model, for pipeline `pipeline`, keeping KV for at most `max_seqs` sequences.
    pub fn new(model: LlamaModel, pipeline: &str, layers: usize, max_seqs: usize) -> Result<Self, String> {
        let span = model.span();
        if model.ends() || span.start == 0 || span.end > layers {
            return Err(format!(
                "a later stage holds layers after the first stage's, within the model's {layers}"
            ));
        }
        Ok(Self {
            model,
            caches: Vec::new(),
            pipeline: pipeline.to_string(),
            layers,
            epoch: 0,
            max_seqs: max_seqs.max(1),
        })
    }

    /// The global layers it holds.
    pub fn span(&self) -> std::ops::Range<usize> {
        self.model.span()
    }

    /// Whether it holds the model's last layer (answers the first stage instead of
    /// passing rows on).
    pub fn last(&self) -> bool {
        self.model.span().end == self.layers
    }

    fn cache(&mut self, seq: usize) -> Result<(), WireError> {
        if seq >= self.max_seqs {
            return Err(bad(format!(
                "sequence {seq} beyond the stage's {} sequences",
                self.max_seqs
            )));
        }
        while self.caches.len() <= seq {
            self.caches.push(self.model.new_cache());
        }
        Ok(())
    }

    /// Runs `batch` through its layers: every row's hidden state for the next
    /// stage, or (the last stage) those of the positions that want logits.
    pub fn run(&mut self, batch: &StageBatch) -> Result<Vec<f32>, WireError> {
        let d = self.model.params.n_embd;
        if batch.v != STAGE_VERSION {
            return Err(WireError::new(
                ErrorCode::UnsupportedVersion,
                format!("stage batch version {} (this stage speaks {STAGE_VERSION})", batch.v),
            ));
        }
        if batch.pipeline != self.pipeline || batch.layers as usize != self.layers || batch.n_embd as usize != d {
            return Err(bad(format!(
                "a batch of pipeline {:?} ({} layers of {}) reached a stage of {:?} ({} layers of {d})",
                batch.pipeline, batch.layers, batch.n_embd, self.pipeline, self.layers
            )));
        }
        if batch.epoch != self.epoch {
            self.caches.clear();
            self.epoch = batch.epoch;
        }
        for op in &batch.ops {
            let StageOp::CopyPrefix { from, to, len } = *op;
            let (from, to) = (from as usize, to as usize);
            self.cache(from.max(to))?;
            if from != to {
                let src = std::mem::replace(&mut self.caches[from], self.model.new_cache());
                self.caches[to].copy_prefix(&src, len as usize, true);
                self.caches[from] = src;
            }
        }
        let ctx = self.model.context_len();
        let mut seen = std::collections::HashSet::new();
        let mut rows = 0;
        for s in &batch.steps {
            let seq = s.seq as usize;
            self.cache(seq)?;
            if !seen.insert(seq) || s.tokens.is_empty() || s.outputs as usize > s.tokens.len() {
                return Err(bad(format!("a malformed step of sequence {seq}")));
            }
            let held = self.caches[seq].held();
            if s.pos as usize > held || s.pos as usize + s.tokens.len() > ctx {
                return Err(WireError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "stage {}-{} holds {held} positions of sequence {seq}, not the {} a step at {} needs",
                        self.span().start,
                        self.span().end - 1,
                        s.pos,
                        s.pos
                    ),
                ));
            }
            rows += s.tokens.len();
        }
        let input = rows_from_bytes(&batch.rows)
            .filter(|r| r.len() == rows * d)
            .ok_or_else(|| bad(format!("{} bytes of rows for {rows} rows of {d}", batch.rows.len())))?;
        let mut caches: Vec<Option<&mut KvCache>> = self.caches.iter_mut().map(Some).collect();
        let mut steps: Vec<Step<'_>> = batch
            .steps
            .iter()
            .map(|s| Step {
                cache: caches[s.seq as usize].take().expect("checked distinct"),
                tokens: &s.tokens,
                pos: s.pos as usize,
                outputs: s.outputs as usize,
                lora: None,
            })
            .collect();
        let last = self.model.span().end == self.layers;
        Ok(self.model.stage_pass(&mut steps, Some(input), !last))
    }
}

/// A malformed batch.
fn bad(message: String) -> WireError {
    WireError::new(ErrorCode::BadRequest, message)
}

/// A fresh epoch: distinct across the first stage's restarts and failures.
fn new_epoch() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (t ^ u64::from(std::process::id()).rotate_left(40)) | 1
}
