//! Embedding models: BERT-style encoders ([`BertModel`]) served on the CPU engine's
//! kernels. They embed and do nothing else: generation and classification are
//! refused with a clear error, and the worker announces their width
//! (`ModelInfo.embedding_dim`) so coordinators route embed requests to them.
//!
//! One compute thread per model. Requests queue on it; each turn takes every request
//! waiting and runs their inputs as ragged batches of up to [`PASS_TOKENS`] tokens,
//! so concurrent callers share passes. A bad input (empty, over the window, a token id
//! outside the vocabulary) fails alone.
//!
//! Loads a GGUF file of architecture `bert` (as llama.cpp's converter writes it) or a
//! sentence-transformers / Hugging Face `BertModel` directory (config.json,
//! model.safetensors, tokenizer.json, modules.json + 1_Pooling/config.json).

use super::kernels::tensor::{self, QMatrix, TensorError};
use super::model::bert::{self, BertModel, BertParams, Pooling};
use super::text::wordpiece;
use candle_core::quantized::gguf_file;
use std::path::Path;
use std::sync::{mpsc, Mutex};
use switchyard_backend::{
    BackendError, BatchFuture, CancelFlag, ClassifyFuture, EmbedFuture, GenerateStream, Prompt, TextModel,
};
use switchyard_messages::{Embedding, GenerateConfig, GenerateMetrics, LoadConfig, ModelInfo};
use tokenizers::Tokenizer;

/// The most tokens one pass computes (several inputs together).
pub const PASS_TOKENS: usize = 2048;

/// The architectures this module loads (GGUF `general.architecture`, HF `model_type`).
pub const ARCHITECTURES: &[&str] = &["bert"];

type Reply = tokio::sync::oneshot::Sender<Vec<Result<Embedding, BackendError>>>;

/// One `embed` call waiting for the compute thread.
struct Job {
    inputs: Vec<Prompt>,
    reply: Reply,
}

/// An embedding model loaded on the CPU.
pub struct EncoderModel {
    jobs: Mutex<mpsc::Sender<Job>>,
    info: ModelInfo,
}

/// Whether `path` holds a model this module loads: a GGUF file whose first metadata
/// key is `general.architecture` = `bert` (llama.cpp writes it first), or a
/// directory whose config.json says `"model_type": "bert"`.
pub fn is_encoder(path: &Path) -> bool {
    if path.is_dir() {
        return std::fs::read_to_string(path.join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["model_type"].as_str().map(|s| ARCHITECTURES.contains(&s)))
            .unwrap_or(false);
    }
    gguf_architecture(path).is_some_and(|a| ARCHITECTURES.contains(&a.as_str()))
}

/// The first metadata value of a GGUF file if it is `general.architecture` (read
/// from the header alone: a few hundred bytes, not the vocabulary).
fn gguf_architecture(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut head = [0u8; 512];
    let n = f.read(&mut head).ok()?;
    let head = &head[..n];
    let u64_at = |at: usize| head.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    if head.get(..4)? != b"GGUF" {
        return None;
    }
    // magic, version u32, tensor count u64, metadata count u64, then key: len u64 + bytes.
    let key_len = u64_at(24)? as usize;
    let key = head.get(32..32 + key_len)?;
    let at = 32 + key_len;
    // value type u32 (8 = string), then len u64 + bytes.
    if key != b"general.architecture" || head.get(at..at + 4)? != 8u32.to_le_bytes() {
        return None;
    }
    let len = u64_at(at + 4)? as usize;
    String::from_utf8(head.get(at + 12..at + 12 + len)?.to_vec()).ok()
}

impl EncoderModel {
    /// Loads the GGUF file or Hugging Face directory at `path` and starts its compute
    /// thread (`config.threads`, 0 = all cores).
    pub fn load(path: &Path, config: &LoadConfig) -> Result<Self, BackendError> {
        super::kernels::isa::init().map_err(|e| load_err(path, e.to_string()))?;
        let pooling = Pooling::parse(&config.pooling).map_err(|e| load_err(path, e))?;
        let (model, tokenizer, quant_bits) = if path.is_dir() {
            load_hf(path, pooling)
        } else {
            load_gguf(path, pooling)
        }
        .map_err(|e| load_err(path, e))?;
        let p = &model.params;
        let info = ModelInfo {
            architecture: "bert".into(),
            vocab_size: model.vocab_size() as u32,
            num_layers: p.n_layer as u32,
            hidden_size: p.n_embd as u32,
            quant_bits,
            quant_group: 0,
            context_len: p.n_ctx as u32,
            kernels: super::kernels::isa::active().name().into(),
            embedding_dim: p.n_embd as u32,
            embedding_only: true,
            pipeline: None,
        };
        tracing::info!(
            layers = p.n_layer,
            width = p.n_embd,
            pooling = p.pooling.name(),
            bytes = model.bytes(),
            "embedding model loaded"
        );
        let (tx, rx) = mpsc::channel();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.threads as usize)
            .thread_name(|i| format!("sy-embed-{i}"))
            .build()
            .map_err(|e| load_err(path, e.to_string()))?;
        std::thread::Builder::new()
            .name("sy-encoder".into())
            .spawn(move || pool.install(move || serve(&model, &tokenizer, rx)))
            .map_err(|e| load_err(path, e.to_string()))?;
        Ok(EncoderModel {
            jobs: Mutex::new(tx),
            info,
        })
    }

    fn refusal(&self, what: &str) -> BackendError {
        BackendError::Invalid(format!(
            "this is an embedding model ({}, {} dimensions): it cannot {what}; use embeddings",
            self.info.architecture, self.info.embedding_dim
        ))
    }
}

fn load_err(path: &Path, reason: String) -> BackendError {
    BackendError::Load {
        path: path.display().to_string(),
        reason,
    }
}

/// The compute thread: every waiting request's inputs, tokenized, in passes of up
/// to [`PASS_TOKENS`] tokens.
fn serve(model: &BertModel, tokenizer: &Tokenizer, jobs: mpsc::Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        batch.extend(jobs.try_iter());
        let mut results: Vec<Vec<Option<Result<Embedding, BackendError>>>> = Vec::new();
        // (job, input, tokens) of every input that can run.
        let mut ready: Vec<(usize, usize, Vec<u32>)> = Vec::new();
        for (j, job) in batch.iter().enumerate() {
            let mut out = Vec::with_capacity(job.inputs.len());
            for (i, prompt) in job.inputs.iter().enumerate() {
                match tokens_of(model, tokenizer, prompt) {
                    Ok(t) => {
                        ready.push((j, i, t));
                        out.push(None);
                    }
                    Err(e) => out.push(Some(Err(e))),
                }
            }
            results.push(out);
        }
        let mut start = 0;
        while start < ready.len() {
            let mut end = start;
            let mut tokens = 0;
            while end < ready.len() && (end == start || tokens + ready[end].2.len() <= PASS_TOKENS) {
                tokens += ready[end].2.len();
                end += 1;
            }
            let seqs: Vec<&[u32]> = ready[start..end].iter().map(|r| r.2.as_slice()).collect();
            let vectors = super::kernels::team::awake(|| model.embed(&seqs));
            for ((j, i, t), vector) in ready[start..end].iter().zip(vectors) {
                results[*j][*i] = Some(Ok(Embedding {
                    vector,
                    tokens: t.len() as u32,
                }));
            }
            start = end;
        }
        for (job, out) in batch.into_iter().zip(results) {
            let out = out
                .into_iter()
                .map(|r| r.unwrap_or_else(|| Err(BackendError::Compute("input not computed".into()))))
                .collect();
            let _ = job.reply.send(out);
        }
    }
}

/// An input's tokens: a text with the tokenizer's [CLS] … [SEP] around it, or token
/// ids as given.
fn tokens_of(model: &BertModel, tokenizer: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>, BackendError> {
    let vocab = model.vocab_size() as u32;
    let tokens = match prompt {
        Prompt::Text(t) if t.is_empty() => return Err(BackendError::EmptyPrompt),
        Prompt::Text(t) => tokenizer
            .encode_fast(t.as_str(), true)
            .map_err(|e| BackendError::Invalid(format!("tokenizing: {e}")))?
            .get_ids()
            .to_vec(),
        Prompt::Tokens(ids) => {
            if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
                return Err(BackendError::Invalid(format!(
                    "token id {bad} is outside the vocabulary of {vocab}"
                )));
            }
            ids.clone()
        }
        Prompt::Chat { .. } | Prompt::Continue { .. } => {
            return Err(BackendError::Invalid(
                "an embedding model takes texts or token ids, not a conversation".into(),
            ))
        }
    };
    if tokens.is_empty() {
        return Err(BackendError::EmptyPrompt);
    }
    let n_ctx = model.params.n_ctx;
    if tokens.len() > n_ctx {
        return Err(BackendError::ContextOverflow {
            prompt_tokens: tokens.len(),
            max_tokens: 0,
            context_len: n_ctx,
        });
    }
    Ok(tokens)
}

/// Loads a GGUF encoder; `pooling` overrides the file's.
fn load_gguf(path: &Path, pooling: Option<Pooling>) -> Result<(BertModel, Tokenizer, u32), String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let ct = gguf_file::Content::read(&mut reader).map_err(|e| format!("not a readable GGUF file: {e}"))?;
    let md = |k: &str| ct.metadata.get(&format!("bert.{k}")).and_then(|v| v.to_u32().ok());
    let need = |k: &str| {
        md(k)
            .map(|v| v as usize)
            .ok_or_else(|| format!("GGUF metadata has no bert.{k}"))
    };
    let pooling_code = md("pooling_type").unwrap_or(1);
    let params = BertParams {
        n_embd: need("embedding_length")?,
        n_head: need("attention.head_count")?,
        n_layer: need("block_count")?,
        n_ff: need("feed_forward_length")?,
        n_ctx: need("context_length")?,
        eps: ct
            .metadata
            .get("bert.attention.layer_norm_epsilon")
            .and_then(|v| v.to_f32().ok())
            .unwrap_or(1e-12),
        pooling: pooling
            .or(Pooling::from_gguf(pooling_code))
            .ok_or_else(|| format!("pooling type {pooling_code} gives no sentence vector (mean, cls or last)"))?,
    };
    let tokenizer = wordpiece::from_gguf(&ct)?;
    let bits = tensor::dominant_quant(&ct).0;
    let mut fetch = |name: &str| tensor::load(&ct, &mut reader, name);
    let model = BertModel::from_tensors(params, &mut fetch).map_err(|e| e.to_string())?;
    Ok((model, tokenizer, bits))
}

/// config.json fields of a Hugging Face `BertModel`.
#[derive(serde::Deserialize)]
struct BertConfig {
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f32,
    #[serde(default)]
    hidden_act: Option<String>,
}

fn default_eps() -> f32 {
    1e-12
}

/// Loads a Hugging Face encoder directory; `pooling` overrides its own.
fn load_hf(dir: &Path, pooling: Option<Pooling>) -> Result<(BertModel, Tokenizer, u32), String> {
    let text = std::fs::read_to_string(dir.join("config.json")).map_err(|e| format!("config.json: {e}"))?;
    let cfg: BertConfig = serde_json::from_str(&text).map_err(|e| format!("config.json: {e}"))?;
    if let Some(act) = cfg.hidden_act.as_deref().filter(|a| !a.starts_with("gelu")) {
        return Err(format!("hidden_act {act:?}: this loader runs GELU encoders"));
    }
    let params = BertParams {
        n_embd: cfg.hidden_size,
        n_head: cfg.num_attention_heads,
        n_layer: cfg.num_hidden_layers,
        n_ff: cfg.intermediate_size,
        n_ctx: cfg.max_position_embeddings,
        eps: cfg.layer_norm_eps,
        pooling: match pooling {
            Some(p) => p,
            None => super::pooling::sentence_transformers(dir)?.unwrap_or(Pooling::Mean),
        },
    };
    let tokenizer = wordpiece::from_hf_dir(dir)?;
    let files = super::model::hf::safetensors_files(dir).map_err(|e| e.to_string())?;
    // SAFETY: mapped read-only and copied out before return, as the decoder's loader.
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }.map_err(|e| e.to_string())?;
    let mut fetch = |gguf: &str| -> Result<QMatrix, TensorError> {
        let name = bert::hf_name(gguf).ok_or_else(|| TensorError::Missing(gguf.to_string()))?;
        // Checkpoints saved from BertForMaskedLM and friends prefix "bert.".
        let view = st
            .get(&name)
            .or_else(|_| st.get(&format!("bert.{name}")))
            .map_err(|_| TensorError::Missing(name.clone()))?;
        let dtype = candle_core::DType::try_from(view.dtype()).map_err(|_| TensorError::Unsupported {
            name: name.clone(),
            dtype: format!("{:?}", view.dtype()),
        })?;
        super::model::hf::matrix(&name, dtype, view.shape(), view.data())
    };
    let model = BertModel::from_tensors(params, &mut fetch).map_err(|e| e.to_string())?;
    // Unquantised (F32, F16 or BF16).
    Ok((model, tokenizer, 0))
}

impl TextModel for EncoderModel {
    fn generate(&self, _prompt: Prompt, _config: GenerateConfig, _cancel: CancelFlag) -> GenerateStream {
        let e = self.refusal("generate text");
        GenerateStream::new(futures::stream::once(async move { Err(e) }))
    }

    fn classify(&self, prompts: Vec<Prompt>, _return_logits: bool) -> ClassifyFuture {
        let errors: Vec<_> = prompts.iter().map(|_| Err(self.refusal("classify"))).collect();
        Box::pin(async move { errors })
    }

    fn embed(&self, inputs: Vec<Prompt>) -> EmbedFuture {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let n = inputs.len();
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Job { inputs, reply });
        super::compute::per_input(sent.is_ok(), answer, n)
    }

    fn batch_generate(&self, prompts: Vec<Prompt>, config: GenerateConfig, cancel: CancelFlag) -> BatchFuture {
        let jobs = prompts
            .into_iter()
            .map(|p| switchyard_backend::collect_batch_result(self.generate(p, config.clone(), cancel.clone())));
        Box::pin(futures::future::join_all(jobs))
    }

    fn parallel_slots(&self) -> u32 {
        super::DEFAULT_SLOTS as u32
    }

    fn model_type(&self) -> &str {
        &self.info.architecture
    }

    fn info(&self) -> ModelInfo {
        self.info.clone()
    }

    fn metrics(&self) -> GenerateMetrics {
        GenerateMetrics::default()
    }
}
