//! The seed contract's value types (seed `000`, go-inference), ported to Rust.
//!
//! Every struct here is MessagePack-encoded with named fields; fields added later
//! carry `#[serde(default)]` so older peers' payloads still decode.

use serde::{Deserialize, Serialize};

/// The atomic unit of streamed output: a vocabulary id and its decoded text.
///
/// `text` is the UTF-8 text this token completes; a token that ends in the middle of
/// a multi-byte character carries `""` and the next token carries the whole character.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Token {
    /// Vocabulary index.
    pub id: u32,
    /// Decoded text (may be empty, see above).
    pub text: String,
    /// (1.7) The token's log-probability and the most likely alternatives, when the
    /// request asked for them (`config.logprobs`). Omitted otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob: Option<TokenLogprob>,
    /// (1.18) Part of the model's reasoning, not of its answer (a request with
    /// `split_reasoning`); the `<think>` tags themselves have empty text.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reasoning: bool,
}

impl Token {
    /// A token without log-probabilities.
    pub fn new(id: u32, text: impl Into<String>) -> Self {
        Self {
            id,
            text: text.into(),
            logprob: None,
            reasoning: false,
        }
    }
}

/// A generated token's log-probability under the model (natural log of the softmax
/// of the raw logits: before temperature, penalties, bias, top-k/top-p/min-p and any
/// constraint, as OpenAI and llama.cpp's server report it), with the `top` most
/// likely tokens at that position (most likely first; ties by lower id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token's log-probability (≤ 0).
    pub logprob: f32,
    /// The token's bytes (a token may hold part of a UTF-8 character), as OpenAI's
    /// `bytes`: an array of integers.
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position; as many as asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<TopLogprob>,
}

/// One of the most likely tokens at a position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// Vocabulary index.
    pub id: u32,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
}

/// (1.7) One input's embedding: the mean of its final hidden states (after the
/// model's output norm), L2-normalised, and how many tokens it held.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    pub vector: Vec<f32>,
    pub tokens: u32,
}

/// The most inputs one embeddings request may hold (OpenAI's limit).
pub const MAX_EMBED_INPUTS: usize = 2048;

/// The most alternatives a request may ask for per token (OpenAI's `top_logprobs`
/// limit).
pub const MAX_TOP_LOGPROBS: u8 = 20;

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `"system"`, `"user"`, `"assistant"` or `"tool"` (a tool's answer; templates
    /// may accept others).
    pub role: String,
    /// The turn's text.
    pub content: String,
    /// (1.3) The calls an assistant turn made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<crate::ToolCall>,
    /// (1.3) On a `"tool"` turn: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// Generation settings. Defaults follow the seed's `DefaultGenerateConfig()`:
/// 256 tokens, temperature 0 (greedy), every other knob off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerateConfig {
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// `max_tokens` is a default the caller did not choose: generate at most what
    /// the context window leaves after the prompt instead of refusing the request
    /// (`context_overflow` only when the prompt alone fills the window). Protocol 1.6.
    pub fit_max_tokens: bool,
    /// Sampling temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` = off.
    pub top_k: u32,
    /// Nucleus sampling mass; `0` or `>= 1` = off.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` × the best one; `0` = off.
    pub min_p: f32,
    /// Penalty on tokens seen in the last `repeat_last_n` tokens; `0` or `1` = off.
    pub repeat_penalty: f32,
    /// Window for `repeat_penalty`.
    pub repeat_last_n: u32,
    /// (1.15) OpenAI's presence penalty (−2 to 2): subtracted once from the logit of
    /// every token already generated; `0` = off.
    #[serde(skip_serializing_if = "is_zero_f32")]
    pub presence_penalty: f32,
    /// (1.15) OpenAI's frequency penalty (−2 to 2): subtracted from a token's logit
    /// as many times as it was generated; `0` = off.
    #[serde(skip_serializing_if = "is_zero_f32")]
    pub frequency_penalty: f32,
    /// Sampling seed; the same seed and settings give the same tokens.
    pub seed: Option<u64>,
    /// Token ids that end generation (in addition to the model's end-of-generation ids).
    pub stop_tokens: Vec<u32>,
    /// Strings that end generation; the matched text is not emitted.
    pub stop: Vec<String>,
    /// Return the logits with a classify result.
    pub return_logits: bool,
    /// Draws already taken from the seeded sampler (a resumed stream: one per token
    /// sampled before; protocol 1.1). The sampler skips them, so a seeded stream
    /// resumed elsewhere continues exactly as it would have.
    pub rng_position: u64,
    /// (1.6) `(token id, bias)` pairs added to those tokens' logits before any
    /// other sampling step (OpenAI's `logit_bias`: −100 all but bans a token, 100 all
    /// but forces it); a token id outside the vocabulary is `bad_request`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logit_bias: Vec<(u32, f32)>,
    /// (1.7) Log-probabilities: `Some(n)` puts on every generated token its
    /// log-probability and the `n` (0–20) most likely tokens at its position
    /// ([`Token::logprob`]); `None` = off (the default: they cost a pass over the
    /// vocabulary per token, and bytes on the wire).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u8>,
    /// (1.3) What the generated text must be (a JSON schema, any JSON object, a
    /// regex or a grammar), enforced at every token; `None` = free text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub constraint: Option<crate::Constraint>,
    /// The LoRA adapter to run with, in-process only: a worker copies it from the
    /// request's [`crate::RequestHead::adapter`] (where it travels) for its backend.
    #[serde(skip)]
    pub adapter: Option<String>,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            max_tokens: 256,
            fit_max_tokens: false,
            temperature: 0.0,
            top_k: 0,
            top_p: 0.0,
            min_p: 0.0,
            repeat_penalty: 0.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            stop_tokens: Vec::new(),
            stop: Vec::new(),
            return_logits: false,
            rng_position: 0,
            logit_bias: Vec::new(),
            logprobs: None,
            constraint: None,
            adapter: None,
        }
    }
}

/// How a backend should load a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadConfig {
    /// Pin a backend by name (`"cpu"`, `"llama_cpp"`, …); empty = the default.
    pub backend: String,
    /// Context window in tokens; `0` = the model's own (capped by the backend).
    pub context_len: u32,
    /// Layers to offload to a GPU; `-1` = all, `0` = CPU only.
    pub gpu_layers: i32,
    /// Concurrent inference slots; `0` = the backend's default.
    pub parallel_slots: u32,
    /// Optional LoRA adapter path.
    pub adapter_path: Option<String>,
    /// CPU threads for compute; `0` = all cores.
    pub threads: u32,
    /// MiB for KV blocks saved from slots before they are overwritten (the CPU
    /// engine's block store); `0` = none.
    pub kv_cache_mb: u32,
    /// Prompt tokens a new request prefills per decode step while others generate;
    /// `0` = chosen per step from measured speeds.
    pub prefill_chunk: u32,
    /// Speculative decoding: `"off"` (or empty), `"lookup"` (prompt lookup) or
    /// `"draft"` (a draft model, `draft_model`).
    pub speculative: String,
    /// The draft model's GGUF (same vocabulary), with `speculative = "draft"`.
    pub draft_model: String,
    /// The most tokens one step drafts per generation; `0` = the engine's default.
    pub draft_max: u32,
    /// The CPU engine copies a prefix another slot computed instead of sharing its
    /// KV pages (each slot holding its own copy, as before pages): only for `bench
    /// kv`'s before/after comparison.
    pub copy_kv_prefixes: bool,
    /// How embeddings pool token rows: `"mean"`, `"cls"` or `"last"`; empty = the
    /// model's own (GGUF `pooling_type`, sentence-transformers' Pooling), else mean.
    pub pooling: String,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            backend: String::new(),
            context_len: 0,
            gpu_layers: -1,
            parallel_slots: 0,
            adapter_path: None,
            threads: 0,
            kv_cache_mb: 0,
            prefill_chunk: 0,
            speculative: String::new(),
            draft_model: String::new(),
            draft_max: 0,
            copy_kv_prefixes: false,
            pooling: String::new(),
        }
    }
}

/// Static facts about a loaded model.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelInfo {
    /// `general.architecture`, e.g. `"llama"`.
    pub architecture: String,
    /// Vocabulary size.
    pub vocab_size: u32,
    /// Transformer blocks.
    pub num_layers: u32,
    /// Embedding width.
    pub hidden_size: u32,
    /// Bits per weight of the dominant quantisation; `0` = unquantised.
    pub quant_bits: u32,
    /// Weights per quantisation group; `0` = unquantised.
    pub quant_group: u32,
    /// The context window this worker serves, in tokens.
    pub context_len: u32,
    /// The compute kernels the backend chose for this host: on `cpu`, `avx512`,
    /// `avx-vnni`, `avx2` or `portable` (all compute the same bits); empty where the
    /// backend does not say.
    pub kernels: String,
    /// (1.7) The width of the vectors `embed` returns; `0`: this backend cannot embed
    /// with this model (coordinators send embed requests only where it is not 0).
    pub embedding_dim: u32,
    /// (1.8) The model embeds and does nothing else (an encoder such as BERT):
    /// coordinators send it embed requests only, and no generation or classification.
    pub embedding_only: bool,
    /// (1.16) A model served as pipeline stages: the pipeline, this worker's
    /// layers (the first stage's) and the stages after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<crate::stage::PipelineInfo>,
}

/// Performance of one finished generation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerateMetrics {
    /// Tokens in the (rendered) prompt.
    pub prompt_tokens: u32,
    /// Prompt tokens reused from the backend's KV cache instead of computed again
    /// (llama.cpp's `cache_n`); `0` where the backend does not reuse prefixes.
    pub cached_tokens: u32,
    /// Tokens generated.
    pub generated_tokens: u32,
    /// Time spent in prefill, microseconds.
    pub prefill_us: u64,
    /// Time spent decoding after the first token, microseconds.
    pub decode_us: u64,
    /// Wall time from admission to the last token, microseconds.
    pub total_us: u64,
    /// Time the request waited for the engine, microseconds.
    pub queue_us: u64,
    /// Prompt tokens per second during prefill.
    pub prefill_tokens_per_sec: f64,
    /// Generated tokens per second during decode.
    pub decode_tokens_per_sec: f64,
    /// Times the client resumed this stream on another worker after losing one
    /// (set by the client library on the final metrics; protocol 1.1).
    #[serde(default)]
    pub resumes: u32,
    /// Peak resident memory of the process, bytes (0 if unknown).
    pub peak_memory_bytes: u64,
    /// Resident memory at the end, bytes (0 if unknown).
    pub active_memory_bytes: u64,
    /// Time the request waited at a coordinator for a worker with room (the fleet
    /// queue), microseconds; `queue_us` is the wait inside the worker after that
    /// (protocol 1.4).
    #[serde(skip_serializing_if = "is_zero")]
    pub fleet_queue_us: u64,
    /// Tokens proposed by speculative decoding (prompt lookup or a draft model)
    /// and checked by the model (protocol 1.5).
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub draft_tokens: u32,
    /// Of those, the tokens the model confirmed: generated without a step of their
    /// own (`accepted_tokens / draft_tokens` is the acceptance rate).
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub accepted_tokens: u32,
    /// (1.9) What the routing coordinator predicted `cached_tokens` would be, from the
    /// worker's announced KV holdings; absent when it made no prediction (KV-aware
    /// routing off, or a worker that announces no holdings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_cached_tokens: Option<u32>,
    /// (1.9) The same prediction knowing only whole 256-byte routing blocks (what the
    /// block index alone can say), for comparison.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_predicted_cached_tokens: Option<u32>,
    /// (1.11) Of `cached_tokens`, those whose KV was pulled from a peer for this
    /// request ([`crate::kv_transfer`]) instead of computed. The prediction above is
    /// of the worker's own KV: compare it with `cached_tokens - pulled_tokens`.
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub pulled_tokens: u32,
    /// (1.11) Microseconds spent pulling them (before `prefill_us`; in the time to
    /// first token).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pull_us: u64,
    /// (1.12) Times a draining worker handed this stream to another worker, which
    /// continued it from the KV it pulled (`Sy-Handover`); the stream's tokens are
    /// those of an undisturbed run. `cached_tokens` and `pulled_tokens` are the
    /// last worker's, over the prompt and the tokens generated before.
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub handovers: u32,
    /// (1.12) Microseconds this request waited for a prefill worker to compute its
    /// prompt's KV (disaggregated prefill), before pulling it (`pull_us`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub remote_prefill_us: u64,
    /// (1.18) The stop string (`config.stop`) that ended the generation; absent when
    /// none did (end of generation, a stop token, the limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequence: Option<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero32(v: &u32) -> bool {
    *v == 0
}

/// Output of a prefill-only pass over one prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyResult {
    /// The most likely next token.
    pub token: Token,
    /// The next-token logits, only when `return_logits` was set.
    #[serde(default)]
    pub logits: Vec<f32>,
}

/// One prompt's outcome in a batch: its tokens, why they ended, or its own error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchResult {
    /// Tokens generated for this prompt.
    #[serde(default)]
    pub tokens: Vec<Token>,
    /// Why this prompt's generation ended: `stop`, `length`, `cancelled` (the batch
    /// was cancelled; `tokens` are what came before) or `error`. Absent only from
    /// peers older than protocol 1.1.
    #[serde(default)]
    pub finish_reason: Option<crate::FinishReason>,
    /// This prompt's failure, if any; the other prompts are unaffected.
    #[serde(default)]
    pub error: Option<crate::WireError>,
}

/// Post-RoPE key vectors of every layer after one prefill (seed 000).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AttentionSnapshot {
    /// Layers captured.
    pub num_layers: u32,
    /// KV heads (may be fewer than query heads under GQA).
    pub num_heads: u32,
    /// Prompt length in tokens.
    pub seq_len: u32,
    /// Width of one head.
    pub head_dim: u32,
    /// `[layer][head]` → `seq_len * head_dim` floats, position-major.
    pub keys: Vec<Vec<Vec<f32>>>,
    /// Model architecture.
    pub architecture: String,
}

fn is_zero_f32(v: &f32) -> bool {
    *v == 0.0
}
