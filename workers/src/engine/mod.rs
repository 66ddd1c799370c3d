//! switchyard's CPU engine: GGUF (and Hugging Face safetensors) models computed by
//! our own kernels, served from one compute thread per loaded model with continuous
//! batching, KV slots and a KV block store. (candle is only the GGUF file reader.)
//!
//! ## Layout
//! - [`kernels`]: the arithmetic — block formats, SIMD dot products per CPU variant,
//!   weight matrices, ggml's math.
//! - [`model`]: the decoder (Llama, Qwen 2/3, Gemma 3), its KV cache and RoPE,
//!   attention, Hugging Face directories, and the [`model::forward::Forward`] trait
//!   the serving side drives.
//! - [`encoder`]: embedding models (BERT-style encoders), which only embed.
//! - [`text`]: tokenizers (GGUF vocabularies as BPE or SentencePiece, streaming
//!   decode) and chat templates.
//! - The serving side: [`compute`] (the compute thread's state: slots, jobs,
//!   sessions), [`batcher`] (continuous batching on that thread), [`kvstore`] (KV
//!   blocks kept after slots are overwritten), [`sampler`], [`constraint`] (JSON
//!   schema / regex / grammar masks per sequence), [`stops`], [`session`].
//!
//! [`EngineModel::load`] reads the GGUF once, builds the tokenizer and the template,
//! and starts the compute thread; [`EngineModel::generate`] sends it a job and
//! returns its events as a stream. The registry's `cpu` backend
//! ([`crate::backends::cpu`]) is this engine.

pub mod batcher;
pub mod candle;
pub mod chunking;
pub mod compute;
pub mod constraint;
pub mod encoder;
pub mod kernels;
pub mod kvstore;
pub mod model;
mod passes;
pub mod pooling;
pub mod sampler;
pub mod session;
pub mod speculate;
pub mod stops;
pub mod text;

use candle_core::quantized::gguf_file;
use model::forward;
use model::llama::LlamaModel;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;
use switchyard_messages::{
    BackendError, BatchFuture, CancelFlag, ClassifyFuture, GenerateConfig, GenerateMetrics, GenerateStream, LoadConfig,
    ModelInfo, Prompt, TextModel,
};
use text::{template, tokenizer};

/// Context positions a model gets when `LoadConfig.context_len` is 0.
pub const DEFAULT_CONTEXT: usize = 8192;

/// KV slots (sequences decoded together) when `LoadConfig.parallel_slots` is 0.
/// Each slot's cache is reserved for the whole context but committed only as
/// positions are written.
pub const DEFAULT_SLOTS: usize = 4;

/// Architectures this backend runs.
pub const SUPPORTED_ARCHITECTURES: &[&str] = model::llama::ARCHITECTURES;

/// Which forward pass computes a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compute {
    /// switchyard's own CPU kernels ([`model::forward::CpuForward`]).
    Own,
    /// candle on a device ([`candle::CandleForward`]); `gpu_layers` as llama.cpp's
    /// `-ngl` (-1 = all).
    Candle {
        placement: candle::Placement,
        gpu_layers: i32,
    },
}

/// What loading learned about a model beside its weights: its own context ceiling,
/// its weights' size in bytes, and the pooling its files name (if any).
struct Facts {
    model_ctx: u32,
    weights: u64,
    pooling: Option<pooling::Pooling>,
}

/// A model loaded in switchyard's CPU engine.
pub struct EngineModel {
    jobs: Mutex<mpsc::Sender<compute::Job>>,
    info: ModelInfo,
    architecture: String,
    tokenizer: Arc<tokenizer::GgufTokenizer>,
    template: Arc<template::ChatTemplate>,
    last_metrics: Arc<Mutex<GenerateMetrics>>,
    slots: usize,
    stats: Arc<compute::BatchStats>,
    memory: switchyard_messages::ModelMemory,
    usage: Arc<Mutex<switchyard_messages::KvUsage>>,
}

/// Hands the allocator's free pages back to the system (glibc keeps freed small
/// allocations resident). Called where loading has just freed a lot: after the
/// vocabulary arrays go (Gemma 3: ~40 MB of metadata and tokenizer scratch) and
/// after the weights are read (their temporaries), so the resident set the first
/// requests grow from is the model's, and the peak is ~4 MB lower each time.
fn give_back_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory the allocator holds as free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// GGUF metadata the tokenizer is built from and nothing else reads.
const VOCAB_ARRAYS: [&str; 4] = [
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
];

impl EngineModel {
    /// Loads the GGUF file at `path`, or the Hugging Face model directory at `path`
    /// (config.json + tokenizer.json + *.safetensors), and starts its compute thread.
    pub fn load(path: &Path, config: &LoadConfig) -> Result<Self, BackendError> {
        Self::load_on(path, config, Compute::Own)
    }

    /// [`Self::load`] with the forward pass `compute` chooses (the candle one loads
    /// GGUF files only).
    pub fn load_on(path: &Path, config: &LoadConfig, compute: Compute) -> Result<Self, BackendError> {
        crate::engine::kernels::isa::init().map_err(|e| BackendError::Load {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let load_err = |reason: String| BackendError::Load {
            path: path.display().to_string(),
            reason,
        };
        if path.is_dir() {
            if compute != Compute::Own {
                return Err(load_err(
                    "the candle engine loads GGUF files, not Hugging Face directories".into(),
                ));
            }
            return Self::load_hf(path, config);
        }
        let mut file = std::fs::File::open(path).map_err(|e| load_err(e.to_string()))?;
        let mut content = gguf_file::Content::read(&mut std::io::BufReader::with_capacity(1 << 20, &file))
            .map_err(|e| load_err(format!("not a readable GGUF file: {e}")))?;
        let architecture = content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .ok_or_else(|| load_err("GGUF metadata has no general.architecture".into()))?;
        if !SUPPORTED_ARCHITECTURES.contains(&architecture.as_str()) {
            return Err(load_err(format!(
                "architecture {architecture:?} is not supported by the cpu backend (supported: {})",
                SUPPORTED_ARCHITECTURES.join(", ")
            )));
        }
        let tokenizer = Arc::new(tokenizer::GgufTokenizer::from_gguf(&content).map_err(|e| load_err(e.to_string()))?);
        // The vocabulary's arrays are the tokenizer's now. Dropped before the weights
        // load, so they do not add to the process's peak (Gemma 3's 262k-token
        // vocabulary: ~25 MB of small allocations, given back to the system).
        for key in VOCAB_ARRAYS {
            content.metadata.remove(key);
        }
        give_back_free_memory();
        let md_u32 = |k: &str| content.metadata.get(k).and_then(|v| v.to_u32().ok());
        let model_ctx = md_u32(&format!("{architecture}.context_length")).unwrap_or(DEFAULT_CONTEXT as u32) as usize;
        // The KV cache is allocated up front, so an unconfigured load takes a bounded
        // default.
        let context_len = context_for(model_ctx, config);
        let (quant_bits, quant_group) = kernels::tensor::dominant_quant(&content);
        let mut info = ModelInfo {
            architecture: architecture.clone(),
            vocab_size: tokenizer.vocab_size() as u32,
            num_layers: md_u32(&format!("{architecture}.block_count")).unwrap_or(0),
            hidden_size: md_u32(&format!("{architecture}.embedding_length")).unwrap_or(0),
            quant_bits,
            quant_group,
            context_len: context_len as u32,
            kernels: crate::engine::kernels::isa::active().name().into(),
            ..ModelInfo::default()
        };
        let template_src = content
            .metadata
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_else(|| template::CHATML.to_string());
        let token_text = |key: &str| {
            md_u32(key)
                .map(|id| String::from_utf8_lossy(tokenizer.token_bytes(id)).into_owned())
                .unwrap_or_default()
        };
        let template = template::ChatTemplate::new(
            &template_src,
            &token_text("tokenizer.ggml.bos_token_id"),
            &token_text("tokenizer.ggml.eos_token_id"),
        )
        .map_err(|e| load_err(format!("chat template does not compile: {e}")))?;
        let slots = slots_for(config);
        let weights = file.metadata().map(|m| m.len()).unwrap_or(0);
        let pooling = md_u32(&format!("{architecture}.pooling_type")).and_then(pooling::Pooling::from_gguf);
        // Both passes return hidden states (`Forward::hidden_batch`).
        info.embedding_dim = info.hidden_size;
        let model = match compute {
            Compute::Own => Self::forward_impl(content, &mut file, context_len, slots),
            Compute::Candle { placement, gpu_layers } => {
                candle::CandleForward::load(&content, &mut file, context_len, slots, placement, gpu_layers).map(|m| {
                    info.kernels = match m.gpu_name() {
                        Some(gpu) => format!("{} ({gpu})", placement.label()),
                        None => placement.label(),
                    };
                    Box::new(m) as Box<dyn forward::Forward>
                })
            }
        }
        .map_err(load_err)?;
        give_back_free_memory();
        let facts = Facts {
            model_ctx: model_ctx as u32,
            weights,
            pooling,
        };
        Self::start(path, model, info, tokenizer, template, config, facts)
    }

    /// Loads a Hugging Face model directory.
    fn load_hf(dir: &Path, config: &LoadConfig) -> Result<Self, BackendError> {
        let load_err = |reason: String| BackendError::Load {
            path: dir.display().to_string(),
            reason,
        };
        let hf = crate::engine::model::hf::HfConfig::read(dir).map_err(|e| load_err(e.to_string()))?;
        let tokenizer =
            Arc::new(tokenizer::GgufTokenizer::from_hf_dir(dir, &hf.eos_ids()).map_err(|e| load_err(e.to_string()))?);
        let context_len = context_for(hf.max_position_embeddings.unwrap_or(DEFAULT_CONTEXT), config);
        let params = hf.params();
        let model = crate::engine::model::hf::load_model(dir, &hf, context_len).map_err(|e| load_err(e.to_string()))?;
        let info = ModelInfo {
            architecture: params.arch.clone(),
            vocab_size: tokenizer.vocab_size() as u32,
            num_layers: params.n_layer as u32,
            hidden_size: params.n_embd as u32,
            quant_bits: 16,
            quant_group: 0,
            context_len: context_len as u32,
            kernels: crate::engine::kernels::isa::active().name().into(),
            // Our own pass: it returns hidden states.
            embedding_dim: params.n_embd as u32,
            ..ModelInfo::default()
        };
        // tokenizer_config.json carries the chat template and the BOS/EOS texts.
        let tc: serde_json::Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let token_text = |key: &str| match &tc[key] {
            serde_json::Value::String(s) => s.clone(),
            v => v["content"].as_str().unwrap_or_default().to_string(),
        };
        let template_src = std::fs::read_to_string(dir.join("chat_template.jinja"))
            .ok()
            .or_else(|| tc["chat_template"].as_str().map(str::to_string))
            .unwrap_or_else(|| template::CHATML.to_string());
        let template = template::ChatTemplate::new(&template_src, &token_text("bos_token"), &token_text("eos_token"))
            .map_err(|e| load_err(format!("chat template does not compile: {e}")))?;
        let model = forward::CpuForward::new(model, slots_for(config));
        let weights = std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        let facts = Facts {
            model_ctx: hf.max_position_embeddings.unwrap_or(DEFAULT_CONTEXT) as u32,
            weights,
            pooling: pooling::sentence_transformers(dir).map_err(load_err)?,
        };
        Self::start(dir, Box::new(model), info, tokenizer, template, config, facts)
    }

    /// Starts the compute thread around a loaded model.
    fn start(
        path: &Path,
        model: Box<dyn forward::Forward>,
        info: ModelInfo,
        tokenizer: Arc<tokenizer::GgufTokenizer>,
        template: template::ChatTemplate,
        config: &LoadConfig,
        facts: Facts,
    ) -> Result<Self, BackendError> {
        let load_err = |reason: String| BackendError::Load {
            path: path.display().to_string(),
            reason,
        };
        let architecture = info.architecture.clone();
        let context_len = info.context_len as usize;
        let slots = model.sequences();
        let memory = switchyard_messages::ModelMemory {
            model_max_context: facts.model_ctx,
            kv_bytes_per_token: model.kv_bytes_per_token() as u64,
            kv_fixed_bytes: model
                .kv_bytes(context_len)
                .saturating_sub(context_len * model.kv_bytes_per_token()) as u64,
            weights_bytes: facts.weights,
        };
        tracing::info!(engine = model.kind(), slots, "cpu model loaded");
        let last_metrics = Arc::new(Mutex::new(GenerateMetrics::default()));
        let template = Arc::new(template);
        let mut engine = compute::Engine::new(
            model,
            tokenizer.clone(),
            template.clone(),
            context_len,
            last_metrics.clone(),
        );
        engine.store = kvstore::KvStore::new(config.kv_cache_mb as usize * 1024 * 1024);
        engine.model.share_prefixes(!config.copy_kv_prefixes);
        engine.prefill_chunk = config.prefill_chunk as usize;
        engine.pooling = pooling::Pooling::parse(&config.pooling)
            .map_err(load_err)?
            .or(facts.pooling)
            .unwrap_or(pooling::Pooling::Mean);
        engine.speculative = speculate::Mode::parse(&config.speculative).map_err(load_err)?;
        engine.draft_max = match config.draft_max {
            0 => 8,
            n => n.clamp(1, 32) as usize,
        };
        match (engine.speculative, config.draft_model.as_str()) {
            (speculate::Mode::Draft, "") => {
                return Err(load_err(
                    "speculative \"draft\" needs a draft model (draft_model)".into(),
                ))
            }
            (speculate::Mode::Draft, draft) => {
                let model = speculate::DraftModel::load(Path::new(draft), &tokenizer, context_len, slots)
                    .map_err(|e| load_err(format!("draft model {draft}: {e}")))?;
                engine.draft = Some(model);
            }
            (_, "") => {}
            (_, draft) => {
                return Err(load_err(format!(
                    "a draft model ({draft}) is set but speculative is not \"draft\""
                )))
            }
        }
        // Block hashes are only comparable within one model: seed them with its identity.
        engine.kv_seed = switchyard_messages::kv::fnv1a(format!("{}|{}", path.display(), facts.weights).as_bytes());
        let stats = engine.stats.clone();
        engine.publish_usage();
        let usage = engine.usage.clone();
        let jobs = batcher::spawn(engine, config.threads as usize)
            .map_err(|e| load_err(format!("starting the compute thread: {e}")))?;
        Ok(Self {
            jobs: Mutex::new(jobs),
            info,
            architecture,
            tokenizer,
            template,
            last_metrics,
            slots,
            stats,
            memory,
            usage,
        })
    }

    /// The batcher's decode-step counters.
    pub fn batch_stats(&self) -> &compute::BatchStats {
        &self.stats
    }

    /// switchyard's own engine with `slots` KV sequences. A tensor type the engine
    /// lacks is refused with an error naming tensor and type.
    fn forward_impl(
        content: gguf_file::Content,
        file: &mut std::fs::File,
        context_len: usize,
        slots: usize,
    ) -> Result<Box<dyn forward::Forward>, String> {
        LlamaModel::load(&content, file, context_len)
            .map(|m| Box::new(forward::CpuForward::new(m, slots)) as Box<dyn forward::Forward>)
            .map_err(|e| e.to_string())
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &tokenizer::GgufTokenizer {
        &self.tokenizer
    }

    /// Renders a conversation with the model's chat template, ending with the
    /// assistant's turn opener (what `chat` tokenizes).
    pub fn render_chat(&self, messages: &[switchyard_messages::Message]) -> Result<String, BackendError> {
        self.template
            .render(messages, &[], true)
            .map_err(|e| BackendError::Invalid(format!("chat template: {e}")))
    }

    /// Sends a job and returns its event stream (used by [`TextModel::generate`]).
    pub fn submit(
        &self,
        prompt: Prompt,
        config: GenerateConfig,
        cancel: CancelFlag,
        deadline_ms: Option<u64>,
    ) -> GenerateStream {
        let (tx, rx) = GenerateStream::channel();
        let job = compute::GenerateJob {
            prompt,
            config,
            cancel,
            deadline_ms,
            enqueued: Instant::now(),
            events: tx.clone(),
            session_slot: None,
        };
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(compute::Job::Generate(job));
        if sent.is_err() {
            let _ = tx.send(Err(BackendError::Unavailable("the compute thread has stopped".into())));
        }
        drop(tx);
        rx
    }
}

impl TextModel for EngineModel {
    fn generate(&self, prompt: Prompt, config: GenerateConfig, cancel: CancelFlag) -> GenerateStream {
        self.submit(prompt, config, cancel, None)
    }

    fn classify(&self, prompts: Vec<Prompt>, return_logits: bool) -> ClassifyFuture {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let n = prompts.len();
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(compute::Job::Classify {
                prompts,
                return_logits,
                reply,
            });
        compute::per_input(sent.is_ok(), answer, n)
    }

    fn embed(&self, inputs: Vec<Prompt>) -> switchyard_messages::EmbedFuture {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let n = inputs.len();
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(compute::Job::Embed { inputs, reply });
        compute::per_input(sent.is_ok(), answer, n)
    }

    fn batch_generate(&self, prompts: Vec<Prompt>, config: GenerateConfig, cancel: CancelFlag) -> BatchFuture {
        // One stream per prompt, queued on the engine in order: they decode together
        // as far as slots allow, and each collects alone.
        let streams: Vec<GenerateStream> = prompts
            .into_iter()
            .map(|p| self.submit(p, config.clone(), cancel.clone(), None))
            .collect();
        Box::pin(async move {
            let mut results = Vec::with_capacity(streams.len());
            for stream in streams {
                results.push(switchyard_messages::backend::collect_batch_result(stream).await);
            }
            results
        })
    }

    fn inspect_attention(&self, prompt: Prompt) -> switchyard_messages::InspectFuture {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(compute::Job::Inspect {
                prompt,
                architecture: self.architecture.clone(),
                reply,
            });
        Box::pin(async move {
            let stopped = || BackendError::Unavailable("the compute thread has stopped".into());
            if sent.is_err() {
                return Err(stopped());
            }
            answer.await.unwrap_or_else(|_| Err(stopped()))
        })
    }

    fn resumes(&self) -> bool {
        true
    }

    fn tool_format(&self) -> switchyard_messages::ToolFormat {
        self.template.tool_format()
    }

    fn model_type(&self) -> &str {
        &self.architecture
    }

    fn info(&self) -> ModelInfo {
        self.info.clone()
    }

    fn metrics(&self) -> GenerateMetrics {
        self.last_metrics.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn parallel_slots(&self) -> u32 {
        self.slots as u32
    }

    fn open_session(&self) -> switchyard_messages::BackendFuture<Arc<dyn switchyard_messages::ModelSession>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let sent = jobs.send(compute::Job::Session(compute::SessionOp::Open { reply }));
        let tokenizer = self.tokenizer.clone();
        let slots = self.slots;
        Box::pin(async move {
            let stopped = || BackendError::Unavailable("the compute thread has stopped".into());
            sent.map_err(|_| stopped())?;
            let slot = answer.await.map_err(|_| stopped())?.ok_or_else(|| {
                BackendError::Overloaded(format!(
                    "every KV slot but one is held by a session ({slots} slots; one stays for requests)"
                ))
            })?;
            Ok(Arc::new(session::CpuSession {
                jobs: std::sync::Mutex::new(jobs),
                slot,
                tokenizer,
                closed: std::sync::atomic::AtomicBool::new(false),
            }) as Arc<dyn switchyard_messages::ModelSession>)
        })
    }

    fn memory(&self) -> switchyard_messages::ModelMemory {
        self.memory
    }

    fn kv_usage(&self) -> switchyard_messages::KvUsage {
        *self.usage.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// KV slots for a load: `parallel_slots`, or [`DEFAULT_SLOTS`].
fn slots_for(config: &LoadConfig) -> usize {
    if config.parallel_slots > 0 {
        config.parallel_slots as usize
    } else {
        DEFAULT_SLOTS
    }
}

/// The context a model gets: the model's own ceiling, capped by the configured
/// `context_len`, or by [`DEFAULT_CONTEXT`] when none is configured.
fn context_for(model_ctx: usize, config: &LoadConfig) -> usize {
    if config.context_len > 0 {
        model_ctx.min(config.context_len as usize)
    } else {
        model_ctx.min(DEFAULT_CONTEXT)
    }
}
