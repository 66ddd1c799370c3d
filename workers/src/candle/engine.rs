//! The compute thread: owns the model weights and its KV cache, and runs one
//! generation at a time from a channel of jobs. Nothing here runs on an async task.

use super::sampler::Sampler;
use super::stops::{StopCheck, StopFilter};
use super::template::ChatTemplate;
use super::tokenizer::{GgufTokenizer, StreamDecoder};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use switchyard_messages::{
    AttentionSnapshot, BackendError, CancelFlag, ClassifyResult, FinishReason, GenerateConfig, GenerateEvent,
    GenerateMetrics, Prompt, Token,
};
use tokio::sync::mpsc::UnboundedSender;

/// Where a job's events go.
pub type EventTx = UnboundedSender<Result<GenerateEvent, BackendError>>;

/// Work for the compute thread.
pub enum Job {
    /// A streamed generation.
    Generate(GenerateJob),
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
}

/// One generation request for the compute thread.
pub struct GenerateJob {
    pub prompt: Prompt,
    pub config: GenerateConfig,
    pub cancel: CancelFlag,
    pub deadline_ms: Option<u64>,
    pub enqueued: Instant,
    pub events: EventTx,
}

/// Post-RoPE keys read from a KV cache.
pub struct CachedKeys {
    /// `[layer][kv_head]` → `positions * head_dim` floats.
    pub keys: Vec<Vec<Vec<f32>>>,
    /// KV heads per layer.
    pub heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// A model's forward pass: logits of the last of `tokens`, placed at cache
/// positions `pos..`.
pub trait Forward: Send {
    /// Runs the tokens and returns the last position's logits.
    fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>, BackendError>;
    /// Which implementation this is (for logs and benchmarks).
    fn kind(&self) -> &'static str;
    /// Post-RoPE keys of positions `0..len` with (kv heads, head size), when the
    /// implementation can read its cache.
    fn cached_keys(&self, _len: usize) -> Option<CachedKeys> {
        None
    }
    /// Whether `forward(tokens, pos)` with `pos` below what the cache holds keeps
    /// positions `0..pos` and overwrites the rest, so a resident prefix can be reused.
    fn reuses_prefix(&self) -> bool {
        false
    }
}

/// candle-transformers' quantized Llama (the fallback for weight types our own
/// engine does not support yet).
pub struct CandleForward {
    pub weights: ModelWeights,
    pub device: Device,
}

impl Forward for CandleForward {
    fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>, BackendError> {
        let input = Tensor::new(tokens, &self.device)
            .and_then(|t| t.unsqueeze(0))
            .map_err(compute_err)?;
        let logits = self.weights.forward(&input, pos).map_err(compute_err)?;
        logits
            .squeeze(0)
            .and_then(|l| l.to_dtype(candle_core::DType::F32))
            .and_then(|l| l.to_vec1::<f32>())
            .map_err(compute_err)
    }

    fn kind(&self) -> &'static str {
        "candle"
    }
}

impl Forward for crate::cpu::llama::LlamaModel {
    fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>, BackendError> {
        if pos + tokens.len() > self.context_len() {
            return Err(BackendError::Compute(format!(
                "position {} beyond the KV cache of {}",
                pos + tokens.len(),
                self.context_len()
            )));
        }
        Ok(crate::cpu::llama::LlamaModel::forward(self, tokens, pos))
    }

    fn kind(&self) -> &'static str {
        "switchyard"
    }

    fn reuses_prefix(&self) -> bool {
        true
    }

    fn cached_keys(&self, len: usize) -> Option<CachedKeys> {
        Some(CachedKeys {
            keys: crate::cpu::llama::LlamaModel::cached_keys(self, len),
            heads: self.params.n_head_kv,
            head_dim: self.params.head_dim,
        })
    }
}

/// Everything the compute thread owns.
pub struct Engine {
    pub model: Box<dyn Forward>,
    pub tokenizer: Arc<GgufTokenizer>,
    pub template: Arc<ChatTemplate>,
    pub context_len: usize,
    pub last_metrics: Arc<Mutex<GenerateMetrics>>,
    /// The tokens whose keys and values sit at cache positions `0..len`: what the
    /// last job left behind. A job whose tokens start the same way reuses them and
    /// computes only the divergent tail.
    pub resident: Vec<u32>,
}

/// Length of the common prefix of `a` and `b`.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Starts the compute thread with `threads` compute threads (0 = all cores); it
/// lives until every job sender is dropped.
pub fn spawn(engine: Engine, threads: usize) -> std::io::Result<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel::<Job>();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("sy-compute-{i}"))
        .build()
        .map_err(std::io::Error::other)?;
    std::thread::Builder::new().name("sy-engine".into()).spawn(move || {
        let mut engine = engine;
        pool.install(move || {
            while let Ok(job) = rx.recv() {
                let job = match job {
                    Job::Generate(g) => g,
                    Job::Inspect {
                        prompt,
                        architecture,
                        reply,
                    } => {
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            engine.inspect(&prompt, architecture)
                        }))
                        .unwrap_or_else(|_| Err(BackendError::Compute("engine panicked".into())));
                        let _ = reply.send(result);
                        continue;
                    }
                    Job::Classify {
                        prompts,
                        return_logits,
                        reply,
                    } => {
                        let results = prompts
                            .iter()
                            .map(|p| {
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    engine.classify_one(p, return_logits)
                                }))
                                .unwrap_or_else(|_| Err(BackendError::Compute("engine panicked".into())))
                            })
                            .collect();
                        let _ = reply.send(results);
                        continue;
                    }
                };
                let events = job.events.clone();
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.run(job)));
                let result = match outcome {
                    Ok(r) => r,
                    Err(panic) => {
                        let what = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into());
                        Err(BackendError::Compute(format!("engine panicked: {what}")))
                    }
                };
                if let Err(e) = result {
                    let _ = events.send(Err(e));
                }
            }
        });
    })?;
    Ok(tx)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn compute_err(e: candle_core::Error) -> BackendError {
    BackendError::Compute(e.to_string())
}

impl Engine {
    /// Renders and tokenizes a prompt.
    pub fn tokenize(&self, prompt: &Prompt) -> Result<Vec<u32>, BackendError> {
        let text = match prompt {
            Prompt::Text(t) => t.clone(),
            Prompt::Chat(messages) => self
                .template
                .render(messages, true)
                .map_err(|e| BackendError::Invalid(format!("chat template: {e}")))?,
            Prompt::Tokens(ids) => {
                let vocab = self.tokenizer.vocab_size() as u32;
                if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
                    return Err(BackendError::Invalid(format!(
                        "token id {bad} is outside the vocabulary of {vocab}"
                    )));
                }
                return Ok(ids.clone());
            }
        };
        if text.is_empty() {
            return Err(BackendError::EmptyPrompt);
        }
        self.tokenizer.encode(&text).map_err(BackendError::Invalid)
    }

    /// Runs the forward pass over `tokens` starting at cache position `pos`,
    /// returning the last position's logits, and keeps [`Engine::resident`] true:
    /// positions below `pos` are untouched even if the pass fails or panics.
    fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>, BackendError> {
        self.resident.truncate(pos);
        let logits = self.model.forward(tokens, pos)?;
        self.resident.extend_from_slice(tokens);
        Ok(logits)
    }

    /// Prefills `tokens` (non-empty), reusing the longest resident prefix; at least
    /// the last token is computed, for its logits. Returns the logits and how many
    /// tokens were reused.
    fn prefill(&mut self, tokens: &[u32]) -> Result<(Vec<f32>, usize), BackendError> {
        let reused = if self.model.reuses_prefix() {
            common_prefix(&self.resident, tokens).min(tokens.len() - 1)
        } else {
            0
        };
        let logits = self.forward(&tokens[reused..], reused)?;
        Ok((logits, reused))
    }

    /// Prefills `prompt` and returns the post-RoPE keys of every layer.
    fn inspect(&mut self, prompt: &Prompt, architecture: String) -> Result<AttentionSnapshot, BackendError> {
        let tokens = self.tokenize(prompt)?;
        if tokens.is_empty() || tokens.len() > self.context_len {
            return Err(BackendError::ContextOverflow {
                prompt_tokens: tokens.len(),
                max_tokens: 0,
                context_len: self.context_len,
            });
        }
        self.prefill(&tokens)?;
        let CachedKeys { keys, heads, head_dim } = self.model.cached_keys(tokens.len()).ok_or_else(|| {
            BackendError::Unavailable(format!("the {} engine cannot read its KV cache", self.model.kind()))
        })?;
        Ok(AttentionSnapshot {
            num_layers: keys.len() as u32,
            num_heads: heads as u32,
            seq_len: tokens.len() as u32,
            head_dim: head_dim as u32,
            keys,
            architecture,
        })
    }

    /// One prefill-only pass: the argmax token and, if asked, the logits.
    fn classify_one(&mut self, prompt: &Prompt, return_logits: bool) -> Result<ClassifyResult, BackendError> {
        let tokens = self.tokenize(prompt)?;
        if tokens.is_empty() {
            return Err(BackendError::EmptyPrompt);
        }
        if tokens.len() > self.context_len {
            return Err(BackendError::ContextOverflow {
                prompt_tokens: tokens.len(),
                max_tokens: 0,
                context_len: self.context_len,
            });
        }
        let (logits, _) = self.prefill(&tokens)?;
        let id = super::sampler::argmax(&logits);
        let text = String::from_utf8_lossy(self.tokenizer.token_bytes(id)).into_owned();
        Ok(ClassifyResult {
            token: Token { id, text },
            logits: if return_logits { logits } else { Vec::new() },
        })
    }

    fn run(&mut self, job: GenerateJob) -> Result<(), BackendError> {
        let started = Instant::now();
        let queue_us = started.duration_since(job.enqueued).as_micros() as u64;
        let send = |ev: GenerateEvent| job.events.send(Ok(ev)).is_ok();
        let cfg = &job.config;
        let mut metrics = GenerateMetrics {
            queue_us,
            ..Default::default()
        };
        let last_metrics = self.last_metrics.clone();
        let finish = |reason: FinishReason, mut m: GenerateMetrics, tail: Vec<Token>| {
            for t in tail {
                send(GenerateEvent::Token(t));
            }
            m.total_us = started.elapsed().as_micros() as u64 + m.queue_us;
            let (peak, active) = process_memory();
            m.peak_memory_bytes = peak;
            m.active_memory_bytes = active;
            *last_metrics.lock().unwrap_or_else(|p| p.into_inner()) = m.clone();
            send(GenerateEvent::Done {
                finish_reason: reason,
                metrics: m,
            });
        };
        if job.cancel.is_cancelled() || job.events.is_closed() {
            finish(FinishReason::Cancelled, metrics, Vec::new());
            return Ok(());
        }
        let prompt = self.tokenize(&job.prompt)?;
        if prompt.is_empty() {
            return Err(BackendError::EmptyPrompt);
        }
        let max_tokens = cfg.max_tokens as usize;
        if prompt.len() + max_tokens > self.context_len {
            return Err(BackendError::ContextOverflow {
                prompt_tokens: prompt.len(),
                max_tokens,
                context_len: self.context_len,
            });
        }
        metrics.prompt_tokens = prompt.len() as u32;

        let t0 = Instant::now();
        let (mut logits, reused) = self.prefill(&prompt)?;
        metrics.cached_tokens = reused as u32;
        metrics.prefill_us = t0.elapsed().as_micros() as u64;
        let decode_start = Instant::now();

        let mut sampler = Sampler::new(cfg);
        let mut history = prompt.clone();
        let mut decoder = StreamDecoder::default();
        let mut stops = StopFilter::new(&cfg.stop);
        let eog = self.tokenizer.eog_ids().to_vec();
        let mut generated = 0usize;
        let set_decode = |m: &mut GenerateMetrics, generated: usize| {
            m.generated_tokens = generated as u32;
            m.decode_us = decode_start.elapsed().as_micros() as u64;
            m.prefill_tokens_per_sec = rate((m.prompt_tokens - m.cached_tokens) as u64, m.prefill_us);
            // The first token comes from the prefill's logits; decode rate counts the rest.
            m.decode_tokens_per_sec = rate(generated.saturating_sub(1) as u64, m.decode_us);
        };
        let reason = loop {
            let next = sampler.sample(&mut logits, &history);
            if eog.contains(&next) || cfg.stop_tokens.contains(&next) {
                break FinishReason::Stop;
            }
            history.push(next);
            generated += 1;
            let text = decoder.push(self.tokenizer.token_bytes(next));
            match stops.push(Token { id: next, text }) {
                StopCheck::Continue(tokens) => {
                    for t in tokens {
                        if !send(GenerateEvent::Token(t)) {
                            job.cancel.cancel();
                        }
                    }
                }
                StopCheck::Stopped(tokens) => {
                    set_decode(&mut metrics, generated);
                    finish(FinishReason::Stop, metrics, tokens);
                    return Ok(());
                }
            }
            if generated >= max_tokens {
                break FinishReason::Length;
            }
            if job.cancel.is_cancelled() {
                break FinishReason::Cancelled;
            }
            if job.deadline_ms.is_some_and(|d| now_ms() >= d) {
                return Err(BackendError::DeadlineExceeded);
            }
            logits = self.forward(&[next], history.len() - 1)?;
        };
        set_decode(&mut metrics, generated);
        let mut tail = stops.flush();
        let rest = decoder.finish();
        if !rest.is_empty() {
            // An unfinished UTF-8 sequence at the very end: attach its replacement
            // character to the last held token (if everything was already sent, the
            // fragment is dropped rather than sent under a duplicate token id).
            if let Some(t) = tail.last_mut() {
                t.text.push_str(&rest);
            }
        }
        finish(reason, metrics, tail);
        Ok(())
    }
}

fn rate(n: u64, us: u64) -> f64 {
    if us == 0 {
        0.0
    } else {
        n as f64 * 1e6 / us as f64
    }
}

/// (peak, current) resident set size of this process in bytes, from /proc.
pub fn process_memory() -> (u64, u64) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (0, 0);
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}
