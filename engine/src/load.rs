//! Loading a model into the engine: a GGUF file or a Hugging Face directory becomes
//! weights on a forward pass ([`ForwardPass`]), a tokenizer and a chat template, and a
//! compute thread that serves them ([`EngineModel::start`]).

use crate::model::forward;
use crate::model::llama::LlamaModel;
use crate::text::{template, tokenizer};
use candle_core::quantized::gguf_file;
use std::path::Path;
use std::sync::{Arc, Mutex};
use switchyard_backend::{BackendError, TextModel};
use switchyard_messages::{GenerateMetrics, LoadConfig, ModelInfo};

use crate::EngineModel;
use crate::{batcher, block_store, candle, kernels, pooling, speculate, SUPPORTED_ARCHITECTURES};
use crate::{compute, ForwardPass, DEFAULT_CONTEXT, DEFAULT_SLOTS};

/// What loading learned about a model beside its weights: its own context ceiling,
/// its weights' size in bytes, and the pooling its files name (if any).
pub(crate) struct Facts {
    model_ctx: u32,
    weights: u64,
    pooling: Option<pooling::Pooling>,
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

/// Builds a GGUF model's forward pass from its content, file, context, slots (and
/// may name its kernels in the model's info).
type MakeForward<'a> = dyn FnMut(
        gguf_file::Content,
        &mut std::fs::File,
        usize,
        usize,
        &mut ModelInfo,
    ) -> Result<Box<dyn forward::Forward>, String>
    + 'a;

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
        Self::load_on(path, config, ForwardPass::Own)
    }

    /// [`Self::load`] with the forward pass `compute` chooses (the candle one loads
    /// GGUF files only).
    pub fn load_on(path: &Path, config: &LoadConfig, compute: ForwardPass) -> Result<Self, BackendError> {
        crate::kernels::isa::init().map_err(|e| BackendError::Load {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let load_err = |reason: String| BackendError::Load {
            path: path.display().to_string(),
            reason,
        };
        if path.is_dir() {
            if compute != ForwardPass::Own {
                return Err(load_err(
                    "the candle engine loads GGUF files, not Hugging Face directories".into(),
                ));
            }
            return Self::load_hf(path, config);
        }
        Self::load_gguf(path, config, &mut |content, file, ctx, slots, info| match compute {
            ForwardPass::Own => Self::forward_impl(content, file, ctx, slots),
            ForwardPass::Candle { placement, gpu_layers } => {
                candle::CandleForward::load(&content, file, ctx, slots, placement, gpu_layers).map(|m| {
                    info.kernels = match m.gpu_name() {
                        Some(gpu) => format!("{} ({gpu})", placement.label()),
                        None => placement.label(),
                    };
                    Box::new(m) as Box<dyn forward::Forward>
                })
            }
        })
    }

    /// Loads the GGUF file at `path` as the first stage of a pipeline
    /// ([`crate::pipeline`]): layers `0..end` with the embeddings, output norm and
    /// projection, the rest of the model behind `link`. Its info names the pipeline
    /// and the later stages as their last answer named them.
    pub fn load_first_stage(
        path: &Path,
        config: &LoadConfig,
        end: usize,
        link: Box<dyn crate::pipeline::StageLink>,
        pipeline: &str,
    ) -> Result<Self, BackendError> {
        crate::kernels::isa::init().map_err(|e| BackendError::Load {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let mut link = Some(link);
        let mut view = None;
        let mut model = Self::load_gguf(path, config, &mut |content, file, ctx, slots, info| {
            let layers = crate::model::params::LlamaParams::from_gguf(&content)
                .map_err(|e| e.to_string())?
                .n_layer;
            let model = LlamaModel::load_stage(&content, file, ctx, 0..end, true)?;
            let first = crate::pipeline::PipelineForward::new(
                model,
                slots,
                link.take().expect("one model per load"),
                pipeline,
                layers,
            )?;
            view = Some(first.stages());
            info.kernels = format!("{} (pipeline)", info.kernels);
            // Embeddings need every layer's hidden states here: not on a pipeline.
            info.embedding_dim = 0;
            info.pipeline = Some(switchyard_messages::stage::PipelineInfo {
                name: pipeline.to_string(),
                layers: layers as u32,
                last_layer: end as u32 - 1,
                stages: Vec::new(),
                broken: None,
            });
            Ok(Box::new(first) as Box<dyn forward::Forward>)
        })?;
        model.stages = view;
        Ok(model)
    }

    /// Loads the GGUF file at `path` onto the forward pass `make` builds from its
    /// content (which may name its kernels in the model's info).
    fn load_gguf(path: &Path, config: &LoadConfig, make: &mut MakeForward<'_>) -> Result<Self, BackendError> {
        let load_err = |reason: String| BackendError::Load {
            path: path.display().to_string(),
            reason,
        };
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
            kernels: crate::kernels::isa::active().name().into(),
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
        let model = make(content, &mut file, context_len, slots, &mut info).map_err(load_err)?;
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
        let hf = crate::model::hf::HfConfig::read(dir).map_err(|e| load_err(e.to_string()))?;
        let tokenizer =
            Arc::new(tokenizer::GgufTokenizer::from_hf_dir(dir, &hf.eos_ids()).map_err(|e| load_err(e.to_string()))?);
        let context_len = context_for(hf.max_position_embeddings.unwrap_or(DEFAULT_CONTEXT), config);
        let params = hf.params();
        let model = crate::model::hf::load_model(dir, &hf, context_len).map_err(|e| load_err(e.to_string()))?;
        let info = ModelInfo {
            architecture: params.arch.clone(),
            vocab_size: tokenizer.vocab_size() as u32,
            num_layers: params.n_layer as u32,
            hidden_size: params.n_embd as u32,
            quant_bits: 16,
            quant_group: 0,
            context_len: context_len as u32,
            kernels: crate::kernels::isa::active().name().into(),
            // Our own pass: it returns hidden states.
            embedding_dim: params.n_embd as u32,
            ..ModelInfo::default()
        };
        // tokenizer_config.json carries the chat template and the BOS/EOS texts.
        let (source, bos, eos) = template::hf_template_parts(dir);
        let template = template::ChatTemplate::new(&source, &bos, &eos)
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
        let memory = switchyard_backend::ModelMemory {
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
        let adapters = Arc::new(crate::adapters::Adapters::new(model.lora_base().cloned(), model.kind()));
        let mut engine = compute::ComputeState::new(
            model,
            tokenizer.clone(),
            template.clone(),
            context_len,
            last_metrics.clone(),
        );
        engine.store = block_store::KvStore::new(config.kv_cache_mb as usize * 1024 * 1024);
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
        let kv_format = Arc::new(std::sync::OnceLock::new());
        if let Some(params) = engine.model.lora_base() {
            // Hashing the weights takes a while on large models: KV travels from
            // when it is done, and loading does not wait for it.
            let (set, params, kind, file) = (
                kv_format.clone(),
                params.clone(),
                engine.model.kind(),
                path.to_path_buf(),
            );
            let _ = std::thread::Builder::new().name("kv-digest".into()).spawn(move || {
                match crate::kv_transfer::weights_sha256(&file) {
                    Ok(sha) => {
                        let _ = set.set(crate::kv_transfer::format(kind, &params, sha));
                    }
                    Err(e) => tracing::warn!(path = %file.display(), "no KV transfer: hashing the model failed: {e}"),
                }
            });
        }
        let stats = engine.stats.clone();
        engine.publish_usage();
        let usage = engine.usage.clone();
        let holdings = engine.holdings.clone();
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
            holdings,
            adapters,
            kv_format,
            adapter_keys: Mutex::default(),
            stages: None,
        })
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

/// Loads the model at `path` for serving: an embedding model (a BERT-style encoder,
/// [`crate::encoder::EncoderModel`]) or a decoder ([`EngineModel`]) on the forward
/// pass `pass` names.
pub fn load_model(path: &Path, config: &LoadConfig, pass: ForwardPass) -> Result<Arc<dyn TextModel>, BackendError> {
    if crate::encoder::is_encoder(path) {
        if pass != ForwardPass::Own {
            return Err(BackendError::Load {
                path: path.display().to_string(),
                reason: "embedding models (bert) run on the cpu backend only".into(),
            });
        }
        return Ok(Arc::new(crate::encoder::EncoderModel::load(path, config)?));
    }
    Ok(Arc::new(EngineModel::load_on(path, config, pass)?))
}
