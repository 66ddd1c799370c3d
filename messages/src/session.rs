//! Sessions (seed 002's transport contract): a persistent, manifest-keyed KV
//! sequence on one worker. `{p}.v1.session.open` goes through a coordinator, which
//! picks a worker; the session then answers on `{p}.v1.session.{sid}.{verb}` itself:
//! `ensure_prefix`, `prefill_suffix`, `decode` (streamed like `generate`), `explain`,
//! `describe`, `close`.
//!
//! Reuse is keyed on the [`ContextManifest`]'s digest: a changed profile, model,
//! tokenizer, template or runtime invalidates the resident prefix even when the text
//! is byte-identical.

use crate::kv::fnv1a;
use crate::{GenerateConfig, PROTOCOL_VERSION};
use serde::{Deserialize, Serialize};

/// The explicit runtime configuration of a session (seed 002 `Config`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionConfig {
    /// Context window in tokens; 0 = the worker's effective context.
    pub num_ctx: u32,
    /// Prefill batch size (recorded in the runtime digest; the CPU engine prefills a
    /// whole segment at once).
    pub num_batch: u32,
    /// CPU threads; must be 0 or the worker's own (engines are shared).
    pub num_threads: u32,
    /// GPU layers (recorded; fixed by the worker at start).
    pub num_gpu_layers: i32,
    /// Multi-GPU split (recorded).
    pub tensor_split: Vec<f32>,
    /// Flash attention (recorded).
    pub flash_attn: bool,
    /// KV cache type: `""` or `"f16"` (what every switchyard engine holds).
    pub kv_cache_type: String,
    /// The profile's prompt format, e.g. `"chatml"`.
    pub prompt_format: String,
    /// Digest of the declared prompt template.
    pub prompt_template_digest: String,
    /// Do not prepend the model's BOS token to the prefix.
    pub disable_bos: bool,
}

impl SessionConfig {
    /// A digest of every knob, part of the session's cache identity.
    pub fn digest(&self) -> String {
        let text = format!(
            "{}|{}|{}|{}|{:?}|{}|{}|{}|{}|{}",
            self.num_ctx,
            self.num_batch,
            self.num_threads,
            self.num_gpu_layers,
            self.tensor_split,
            self.flash_attn,
            self.kv_cache_type,
            self.prompt_format,
            self.prompt_template_digest,
            self.disable_bos
        );
        hex(fnv1a(text.as_bytes()))
    }
}

/// `{p}.v1.session.open`: asks for a session on some worker serving `model`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpenSessionRequest {
    pub v: u32,
    /// The owner instance the caller expects to be serving it (seed 002 `Fence`).
    /// A newer open by another owner on the same worker makes older sessions stale.
    pub fence: String,
    /// Logical model name (what requests route on).
    pub model: String,
    /// The backend type the model targets: `""`, `"llama"` or `"gguf"` (every
    /// switchyard worker runs GGUF llama-family models); anything else is
    /// `backend_mismatch`.
    #[serde(rename = "type")]
    pub model_type: String,
    /// Content digest of the model; part of the cache identity.
    pub digest: String,
    /// Where the caller resolved the model on disk (a hint, not identity).
    pub path: String,
    /// Runtime configuration.
    pub config: SessionConfig,
    /// Pin a backend (`cpu`, `llama_cpp`, `rocm`, `cuda`, `metal`); empty = any.
    pub backend: String,
    /// Pin a worker; empty = the coordinator chooses.
    pub worker_id: String,
}

impl OpenSessionRequest {
    /// An open request for `model` owned by `fence`.
    pub fn new(fence: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            fence: fence.into(),
            model: model.into(),
            ..Self::default()
        }
    }
}

/// What a worker reports about a model (seed 002 `ModelInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionModelInfo {
    /// The model's own context ceiling (GGUF metadata).
    pub model_max_context: u32,
    /// What this worker will serve: min(ceiling, the worker's context, what fits in
    /// free memory).
    pub effective_context: u32,
    /// Bytes each further cached position takes (0 when the backend does not say);
    /// `effective_context` also counts a fixed part (sliding-window rings).
    pub kv_bytes_per_token: u64,
    /// Memory available on the worker's host.
    pub free_bytes: u64,
    /// Size of the weights.
    pub weights_bytes: u64,
}

/// The reply to an open.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionOpened {
    pub v: u32,
    /// Use it in `{p}.v1.session.{session_id}.{verb}`.
    pub session_id: String,
    pub worker_id: String,
    /// The session's context window.
    pub num_ctx: u32,
    pub info: SessionModelInfo,
}

/// The cache key shared by caller and worker: reuse is valid only when it matches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContextManifest {
    pub profile: String,
    pub model: String,
    pub tokenizer_digest: String,
    pub template_digest: String,
    pub runtime_digest: String,
    pub disable_bos: bool,
    /// Hash of the stable prefix text (informational; the text itself is sent).
    pub stable_hash: String,
    /// Hash of the volatile suffix text (informational).
    pub volatile_hash: String,
}

impl ContextManifest {
    /// The identity digest: everything but the text hashes. Two prefixes with the
    /// same digest may share their common tokens; a different digest shares nothing.
    pub fn digest(&self) -> String {
        let text = format!(
            "{}|{}|{}|{}|{}|{}",
            self.profile,
            self.model,
            self.tokenizer_digest,
            self.template_digest,
            self.runtime_digest,
            self.disable_bos
        );
        hex(fnv1a(text.as_bytes()))
    }
}

/// `ensure_prefix` and `prefill_suffix`: text plus the manifest that makes reuse valid.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SegmentRequest {
    pub v: u32,
    /// The caller's fence; when set it must be the session's owner (`not_owner`).
    pub fence: String,
    pub text: String,
    pub manifest: ContextManifest,
}

/// What `ensure_prefix` reused versus computed (seed 002 `PrefixStatus`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PrefixStatus {
    pub reused_tokens: u32,
    pub prefilled_tokens: u32,
    pub dropped_tokens: u32,
    pub prefix_tokens: u32,
    pub resident_tokens: u32,
    pub available_tokens: u32,
    pub stable_byte_hash: String,
    pub stable_token_hash: String,
    pub manifest_digest: String,
}

/// What `prefill_suffix` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SuffixStatus {
    pub suffix_tokens: u32,
    /// Suffix tokens already resident from the previous suffix.
    pub reused_tokens: u32,
    pub prefilled_tokens: u32,
    /// Previous suffix and generated tokens dropped.
    pub dropped_tokens: u32,
    pub resident_tokens: u32,
    pub available_tokens: u32,
    pub volatile_byte_hash: String,
}

/// `decode`: generate from the resident context (streamed like `generate`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DecodeRequest {
    pub v: u32,
    pub fence: String,
    /// Client-chosen id, for `{p}.v1.cancel.{request_id}`.
    pub request_id: String,
    pub config: GenerateConfig,
}

/// `explain`, `describe` and `close` carry only the fence.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionCall {
    pub v: u32,
    pub fence: String,
}

/// The session's resident context (seed 002 `ContextReport`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContextReport {
    pub resident_tokens: u32,
    pub prefix_tokens: u32,
    pub num_ctx: u32,
    pub available_tokens: u32,
    pub stable_byte_hash: String,
    pub stable_token_hash: String,
    pub manifest_digest: String,
    pub manifest: ContextManifest,
    pub closed: bool,
}

/// A 64-bit hash as 16 hex digits.
pub fn hex(h: u64) -> String {
    format!("{h:016x}")
}

/// The stable hash of some token ids.
pub fn token_hash(tokens: &[u32]) -> String {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    hex(fnv1a(&bytes))
}

/// (1.13) A draining worker moves a session to another worker: what the session is,
/// sent to the coordinators on `{p}.v1.relay.session` (workers only), which forward it
/// to a worker's `{p}.v1.worker.{wid}.session_adopt`. The adopting worker pulls the KV
/// of `resident` from `peer` (section 11a), makes it resident, answers calls on the
/// session's subjects from then on, and replies [`SessionOpened`] (or an
/// `ErrorReply`; a retryable one moves the coordinator on to the next worker).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdoptSessionRequest {
    pub v: u32,
    /// The session's id: its subjects stay the same.
    pub session_id: String,
    /// Its owner's fence.
    pub owner: String,
    /// The model it runs (logical name), and the source's KV format key: only a
    /// worker of the same format adopts it.
    pub model: String,
    pub format: String,
    pub num_ctx: u32,
    /// The session prepends BOS to its prefix (its open's `disable_bos` false).
    pub bos: bool,
    /// The resident prefix, if any: its tokens and what it was computed under.
    pub prefix: Option<MovedPrefix>,
    /// Every resident token (prefix, suffix and generated), in order.
    pub resident: Vec<u32>,
    /// The worker that holds the KV now (the one draining).
    pub peer: String,
    /// Milliseconds since the Unix epoch by which the adopter must serve the session;
    /// past it, it gives the slot back and refuses (`deadline_exceeded`), as the
    /// draining worker no longer waits. 0: none.
    pub deadline_ms: u64,
}

/// The resident prefix of a moving session ([`AdoptSessionRequest`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MovedPrefix {
    pub tokens: Vec<u32>,
    pub manifest: ContextManifest,
    pub digest: String,
    pub byte_hash: String,
}
