//! The compute thread: owns the model weights and one KV cache per slot, and runs
//! jobs from a channel (generations continuously batched by [`super::batcher`]).
//! Nothing here runs on an async task.

use super::block_store::{KvStore, BLOCK_TOKENS};
use super::model::forward::{Forward, SeqStep};
use super::text::template::ChatTemplate;
use super::text::tokenizer::GgufTokenizer;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use switchyard_backend::{BackendError, CancelFlag, Prompt, ResidentUpdate};
use switchyard_messages::{AttentionSnapshot, ClassifyResult, GenerateConfig, GenerateMetrics};

/// The future of a per-input job: what the compute thread answered, or, for each of
/// the `n` inputs, `unavailable` when the job was not `sent` or the thread dropped it.
pub(crate) fn per_input<T: Send + 'static>(
    sent: bool,
    answer: tokio::sync::oneshot::Receiver<Vec<Result<T, BackendError>>>,
    n: usize,
) -> futures::future::BoxFuture<'static, Vec<Result<T, BackendError>>> {
    Box::pin(async move {
        let stopped = || (0..n).map(|_| Err(BackendError::Unavailable("the compute thread has stopped".into())));
        if !sent {
            return stopped().collect();
        }
        answer.await.unwrap_or_else(|_| stopped().collect())
    })
}

/// Work for the compute thread.
pub enum Job {
    /// A streamed generation (boxed: it is most of the enum's size).
    Generate(Box<GenerateJob>),
    /// Prefill, then read the post-RoPE keys from the cache.
    Inspect {
        prompt: Prompt,
        architecture: String,
        reply: tokio::sync::oneshot::Sender<Result<AttentionSnapshot, BackendError>>,
    },
    /// Prefill-only passes; the answer comes back on `reply`.
    Classify {
        prompts: Vec<Prompt>,
        return_logits: bool,
        reply: tokio::sync::oneshot::Sender<Vec<Result<ClassifyResult, BackendError>>>,
    },
    /// Embeddings (hidden-state passes); the answer comes back on `reply`.
    Embed {
        inputs: Vec<Prompt>,
        reply: tokio::sync::oneshot::Sender<Vec<Result<switchyard_messages::Embedding, BackendError>>>,
    },
    /// A session's call on its pinned slot (answered at once, between steps).
    Session(SessionOp),
    /// KV read out for a peer or taken in from one (answered at once, between steps).
    Kv(KvOp),
}

/// What a session asks of the engine. Its decode is a [`GenerateJob`] with
/// `session_slot` set.
pub enum SessionOp {
    /// Pin a slot for a new session: `None` when only one unpinned slot is left (it
    /// stays for ordinary requests).
    Open {
        reply: tokio::sync::oneshot::Sender<Option<usize>>,
    },
    /// Make the slot's resident tokens equal `target`.
    Set {
        slot: usize,
        target: Vec<u32>,
        invalidate: bool,
        reply: tokio::sync::oneshot::Sender<Result<ResidentUpdate, BackendError>>,
    },
    /// The slot's resident tokens.
    Resident {
        slot: usize,
        reply: tokio::sync::oneshot::Sender<Vec<u32>>,
    },
    /// Unpin the slot; what it holds stays reusable by later requests.
    Close { slot: usize },
}

/// What a KV job asks of the compute thread (answered at once, between steps;
/// `kv_transfer.rs` answers it).
pub enum KvOp {
    /// Leading tokens of `tokens` held in a slot or the store.
    Held {
        tokens: Vec<u32>,
        adapter: Option<Arc<super::model::lora::LoraAdapter>>,
        reply: tokio::sync::oneshot::Sender<usize>,
    },
    /// Blocks `first..first + count` of the prefix, as far as they are held.
    Export {
        tokens: Vec<u32>,
        adapter: Option<Arc<super::model::lora::LoraAdapter>>,
        first: usize,
        count: usize,
        reply: tokio::sync::oneshot::Sender<switchyard_backend::KvBlocks>,
    },
    /// Blocks a peer computed, into the store.
    Import {
        tokens: Vec<u32>,
        adapter: Option<Arc<super::model::lora::LoraAdapter>>,
        blocks: switchyard_backend::KvBlocks,
        reply: tokio::sync::oneshot::Sender<Result<usize, BackendError>>,
    },
    /// The rows of the prefix's tail (past its last whole block), when a slot holds
    /// all of `tokens`.
    ExportTail {
        tokens: Vec<u32>,
        adapter: Option<Arc<super::model::lora::LoraAdapter>>,
        reply: tokio::sync::oneshot::Sender<Option<Vec<u8>>>,
    },
    /// A tail a peer computed, into the store.
    ImportTail {
        tokens: Vec<u32>,
        adapter: Option<Arc<super::model::lora::LoraAdapter>>,
        data: Vec<u8>,
        reply: tokio::sync::oneshot::Sender<Result<bool, BackendError>>,
    },
}

/// One generation request for the compute thread.
pub struct GenerateJob {
    /// The LoRA adapter it runs with (none: the base model).
    pub adapter: Option<Arc<super::model::lora::LoraAdapter>>,
    pub prompt: Prompt,
    pub config: GenerateConfig,
    pub cancel: CancelFlag,
    pub deadline_ms: Option<u64>,
    pub enqueued: Instant,
    pub events: switchyard_backend::EventSender,
    /// A session's decode: generate from this pinned slot's resident tokens instead
    /// of `prompt`.
    pub session_slot: Option<usize>,
}

/// Counters of the batcher's decode steps.
#[derive(Debug, Default)]
pub struct BatchStats {
    /// Decode steps run.
    pub steps: std::sync::atomic::AtomicU64,
    /// Sequences advanced, summed over steps (`rows / steps` = mean batch).
    pub rows: std::sync::atomic::AtomicU64,
    /// The largest batch one step ran.
    pub peak: std::sync::atomic::AtomicU64,
}

/// What one KV slot holds.
#[derive(Debug, Default)]
pub struct Slot {
    /// The tokens whose keys and values sit at positions `0..len`. A job whose
    /// tokens start the same way reuses them and computes only the divergent tail.
    pub resident: Vec<u32>,
    /// In use by a running job.
    pub busy: bool,
    /// Held by a session: never claimed by other jobs (but its prefix may be copied).
    pub pinned: bool,
    /// When it was last released (a logical clock), for least-recently-used reuse.
    pub last_used: u64,
    /// Where the tokens of the prompt that last claimed it end in its routing key
    /// (`None`: a session's, or a prompt with no key).
    pub map: Option<super::holdings::KeyMap>,
    /// The LoRA adapter its keys and values were computed with.
    pub adapter: Option<Arc<super::model::lora::LoraAdapter>>,
}

/// Everything the compute thread owns.
pub struct ComputeState {
    pub model: Box<dyn Forward>,
    pub tokenizer: Arc<GgufTokenizer>,
    /// Constraints compiled against this model's vocabulary.
    pub grammars: Arc<super::constraint::Grammars>,
    pub template: Arc<ChatTemplate>,
    pub context_len: usize,
    pub last_metrics: Arc<Mutex<GenerateMetrics>>,
    /// One per sequence the model holds.
    pub slots: Vec<Slot>,
    /// Shared with the model's owner, for observation.
    pub stats: Arc<BatchStats>,
    /// Blocks saved from slots before they are overwritten (the KvCacheActor's store).
    pub store: KvStore,
    /// The model identity that seeds the store's block hashes.
    pub kv_seed: u64,
    /// What the slots and the store hold, refreshed by the batcher for heartbeats.
    pub usage: Arc<Mutex<switchyard_messages::KvUsage>>,
    /// What the slots hold in routing terms, refreshed as generations start and end,
    /// and who is told when it changes (the worker's KV events; [`super::holdings`]).
    pub holdings: Arc<super::holdings::Shared>,
    /// Chains saved to the block store, newest last ([`super::holdings::remember`]).
    pub stored: std::collections::VecDeque<super::holdings::StoredChain>,
    /// Prompt tokens per decode step for a request prefilled while others generate;
    /// 0 = chosen from measured speeds ([`LoadConfig::prefill_chunk`]).
    ///
    /// [`LoadConfig::prefill_chunk`]: switchyard_messages::LoadConfig::prefill_chunk
    pub prefill_chunk: usize,
    /// How generations draft tokens for speculative decoding.
    pub speculative: super::speculate::Mode,
    /// The most tokens one step drafts per generation.
    pub draft_max: usize,
    /// The draft model, with speculative mode `Draft`.
    pub draft: Option<super::speculate::DraftModel>,
    /// How embeddings pool the token rows.
    pub pooling: super::pooling::Pooling,
    clock: u64,
}

pub use super::block_store::common_prefix;

pub use switchyard_fabric::panic_message;

/// Runs `f`, turning a panic into a compute error.
pub fn guarded<T>(f: impl FnOnce() -> Result<T, BackendError>) -> Result<T, BackendError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(BackendError::Compute(format!("engine panicked: {}", panic_message(p)))))
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Renders and tokenizes a prompt as a generation of it computes it (also off the
/// compute thread: a KV pull needs the tokens before the job is sent).
pub fn tokenize_prompt(
    tokenizer: &GgufTokenizer,
    template: &ChatTemplate,
    prompt: &Prompt,
) -> Result<Vec<u32>, BackendError> {
    let text = match prompt {
        Prompt::Text(t) => t.clone(),
        Prompt::Chat {
            messages,
            tools,
            kwargs,
        } => template
            .render_with(messages, tools, kwargs, true)
            .map_err(|e| BackendError::Invalid(format!("chat template: {e}")))?,
        Prompt::Tokens(ids) => {
            let vocab = tokenizer.vocab_size() as u32;
            if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
                return Err(BackendError::Invalid(format!(
                    "token id {bad} is outside the vocabulary of {vocab}"
                )));
            }
            return Ok(ids.clone());
        }
        Prompt::Continue { prompt, generated } => {
            let mut ids = tokenize_prompt(tokenizer, template, prompt)?;
            ids.extend(tokenize_prompt(
                tokenizer,
                template,
                &Prompt::Tokens(generated.clone()),
            )?);
            return Ok(ids);
        }
    };
    if text.is_empty() {
        return Err(BackendError::EmptyPrompt);
    }
    tokenizer.encode(&text).map_err(BackendError::Invalid)
}

impl ComputeState {
    /// Renders and tokenizes a prompt.
    pub fn tokenize(&self, prompt: &Prompt) -> Result<Vec<u32>, BackendError> {
        self.tokenize_mapped(prompt, false).map(|(ids, _)| ids)
    }

    /// [`ComputeState::tokenize`], and with `map` the tokens' ends in the prompt's
    /// routing key ([`super::holdings::KeyMap`]).
    pub fn tokenize_mapped(
        &self,
        prompt: &Prompt,
        map: bool,
    ) -> Result<(Vec<u32>, Option<super::holdings::KeyMap>), BackendError> {
        let text = match prompt {
            Prompt::Text(t) => t.clone(),
            Prompt::Chat {
                messages,
                tools,
                kwargs,
            } => self
                .template
                .render_with(messages, tools, kwargs, true)
                .map_err(|e| BackendError::Invalid(format!("chat template: {e}")))?,
            _ => return tokenize_prompt(&self.tokenizer, &self.template, prompt).map(|ids| (ids, None)),
        };
        let ids = tokenize_prompt(&self.tokenizer, &self.template, &Prompt::Text(text.clone()))?;
        let map = if map {
            super::holdings::KeyMap::new(&self.tokenizer, prompt, &text, &ids)
        } else {
            None
        };
        Ok((ids, map))
    }

    /// An engine around `model`, one slot per sequence it holds.
    pub fn new(
        model: Box<dyn Forward>,
        tokenizer: Arc<GgufTokenizer>,
        template: Arc<ChatTemplate>,
        context_len: usize,
        last_metrics: Arc<Mutex<GenerateMetrics>>,
    ) -> Self {
        let slots = (0..model.sequences()).map(|_| Slot::default()).collect();
        Self {
            model,
            grammars: Arc::new(super::constraint::Grammars::new(tokenizer.clone())),
            tokenizer,
            template,
            context_len,
            last_metrics,
            slots,
            stats: Arc::default(),
            store: KvStore::new(0),
            kv_seed: 0,
            usage: Arc::default(),
            holdings: Arc::default(),
            stored: Default::default(),
            prefill_chunk: 0,
            speculative: super::speculate::Mode::Off,
            draft_max: 0,
            draft: None,
            pooling: super::pooling::Pooling::Mean,
            clock: 0,
        }
    }

    /// Refreshes [`ComputeState::holdings`]; `finishing`: a slot whose generation is
    /// ending, with its history.
    pub fn publish_holdings(&self, finishing: Option<(usize, &[u32])>) {
        let mut all: Vec<switchyard_messages::KvHolding> = (0..self.slots.len())
            .filter_map(|i| {
                let s = &self.slots[i];
                let history = finishing.filter(|f| f.0 == i).map(|f| f.1);
                let floor = |n| self.min_reuse(i, n);
                let prefilling = s.busy && history.is_none();
                let map = s.map.as_ref()?;
                super::holdings::holding(map, &s.resident, prefilling, history, &self.tokenizer, floor)
                    .map(|h| h.with_adapter(s.adapter.as_ref().map(|a| a.name.as_str())))
            })
            .collect();
        let stored = self.stored.iter();
        all.extend(stored.filter_map(|c| c.holding(self.store.leading(&c.hashes), BLOCK_TOKENS)));
        self.holdings.set(all);
    }

    /// The fewest leading tokens a step of `slot` can resume after (fewer: it starts
    /// over), within `0..=held`; `held + 1` when none.
    fn min_reuse(&self, slot: usize, held: usize) -> usize {
        if !self.model.reuses_prefix() {
            return held + 1;
        }
        // `resumable(w)` is `w` from some point on (rings) or everywhere.
        let (mut lo, mut hi) = (1usize, held + 1);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.model.resumable(slot, mid) == mid {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        if lo == 1 {
            0
        } else {
            lo
        }
    }

    /// Refreshes [`ComputeState::usage`].
    pub fn publish_usage(&self) {
        let resident: usize = self.slots.iter().map(|s| s.resident.len()).sum();
        let bytes = self
            .model
            .kv_held_bytes()
            .unwrap_or_else(|| self.slots.iter().map(|s| self.model.kv_bytes(s.resident.len())).sum());
        let store = self.store.stats();
        let mut u = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        *u = switchyard_messages::KvUsage {
            slots: self.slots.len() as u32,
            busy: self.slots.iter().filter(|s| s.busy).count() as u32,
            sessions: self.slots.iter().filter(|s| s.pinned).count() as u32,
            resident_tokens: resident as u64,
            resident_bytes: bytes as u64,
            store_blocks: store.blocks as u64,
            store_bytes: store.bytes as u64,
            store_budget_bytes: self.store.budget() as u64,
            hit_ratio: u.hit_ratio,
            transfer: u.transfer,
        };
    }

    /// Slots neither running a job nor held by a session.
    pub fn free_slots(&self) -> usize {
        self.slots.iter().filter(|s| !s.busy && !s.pinned).count()
    }

    /// Gives a slot back; what it holds stays resident for later jobs.
    pub fn release(&mut self, slot: usize) {
        self.clock += 1;
        if let Some(s) = self.slots.get_mut(slot) {
            s.busy = false;
            s.last_used = self.clock;
        }
    }

    /// One forward pass over `steps`, keeping each slot's `resident` true: positions
    /// below a step's `pos` are untouched even if the pass fails or panics.
    ///
    /// With sliding-window rings and a block store, a step longer than one pass is
    /// run here as passes (as the model would split it), so the blocks each pass
    /// pushes out of the rings are saved before it overwrites them.
    pub fn forward(&mut self, steps: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        let max = self.model.max_pass();
        if self.store.enabled() && self.model.ring().is_some() && steps.iter().any(|s| s.tokens.len() > max) {
            let mut rest = steps.to_vec();
            loop {
                // The positions that want logits stay in the last pass.
                let lead: Vec<SeqStep<'_>> = rest
                    .iter_mut()
                    .filter(|s| s.tokens.len() > max && s.tokens.len() > s.outputs)
                    .map(|s| {
                        let n = max.min(s.tokens.len() - s.outputs);
                        let lead = SeqStep::new(s.seq, &s.tokens[..n], s.pos);
                        s.tokens = &s.tokens[n..];
                        s.pos += n;
                        lead
                    })
                    .collect();
                if lead.is_empty() {
                    return self.pass(&rest);
                }
                self.pass(&lead)?;
            }
        }
        self.pass(steps)
    }

    /// One pass of [`Self::forward`].
    fn pass(&mut self, steps: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        self.pass_with(steps, |m, s| m.forward_batch(s))
    }

    /// One pass of `run` over `steps`, the slots' `resident` kept true around it.
    fn pass_with(
        &mut self,
        steps: &[SeqStep<'_>],
        run: impl FnOnce(&mut Box<dyn Forward>, &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>, BackendError>,
    ) -> Result<Vec<Vec<f32>>, BackendError> {
        for s in steps {
            self.save_tail(s.seq, s.pos);
            self.save_leaving(s.seq, s.pos, s.tokens.len());
            self.slots[s.seq].resident.truncate(s.pos);
        }
        let model = &mut self.model;
        let rows = guarded(|| run(model, steps))?;
        for s in steps {
            self.slots[s.seq].resident.extend_from_slice(s.tokens);
        }
        Ok(rows)
    }

    /// [`Self::forward`] returning the final hidden states ([`Forward::hidden_batch`])
    /// instead of logits; every step must fit one pass.
    pub fn hidden(&mut self, steps: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        self.pass_with(steps, |m, s| m.hidden_batch(s))
    }

    /// Refuses a `logit_bias` naming a token outside the vocabulary.
    pub fn check_logit_bias(&self, config: &GenerateConfig) -> Result<(), BackendError> {
        let vocab = self.tokenizer.vocab_size();
        match config.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
            Some((id, _)) => Err(BackendError::Invalid(format!(
                "logit_bias: token id {id} is outside the vocabulary of {vocab}"
            ))),
            None => Ok(()),
        }
    }

    /// The most tokens a job over `tokens` generates: `config.max_tokens`, or with
    /// `fit_max_tokens` no more than the context leaves after the prompt; refused when
    /// that does not fit (with `fit_max_tokens`: when the prompt fills the context).
    pub fn max_tokens(&self, tokens: &[u32], config: &GenerateConfig) -> Result<usize, BackendError> {
        let mut n = config.max_tokens as usize;
        if config.fit_max_tokens {
            n = n.min(self.context_len.saturating_sub(tokens.len())).max(1);
        }
        self.check_fits(tokens, n)?;
        Ok(n)
    }

    /// Checks that a prompt of `tokens` plus `max_tokens` fits the context.
    pub fn check_fits(&self, tokens: &[u32], max_tokens: usize) -> Result<(), BackendError> {
        if tokens.is_empty() {
            return Err(BackendError::EmptyPrompt);
        }
        if tokens.len() + max_tokens > self.context_len {
            return Err(BackendError::ContextOverflow {
                prompt_tokens: tokens.len(),
                max_tokens,
                context_len: self.context_len,
            });
        }
        Ok(())
    }
}

pub fn rate(n: u64, us: u64) -> f64 {
    if us == 0 {
        0.0
    } else {
        n as f64 * 1e6 / us as f64
    }
}
