//! The traits every backend implements (seed 000's `Backend` / `TextModel`), in
//! async-stream form: a generation is a stream of [`GenerateEvent`]s ending with
//! [`GenerateEvent::Done`] or an error, cancelled through a [`CancelFlag`] that the
//! backend checks at every token boundary.

use crate::{BatchResult, ClassifyResult};
use crate::{
    ErrorCode, FinishReason, GenerateConfig, GenerateMetrics, LoadConfig, Message, ModelInfo, Token, WireError,
};
use futures_core::Stream;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared "stop at the next token boundary" flag.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelFlag {
    /// A flag that is not set.
    pub fn new() -> Self {
        Self::default()
    }
    /// Asks the generation to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }
    /// Whether stop was asked.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A raw prompt, tokenized as is.
    Text(String),
    /// A conversation, rendered with the model's chat template.
    Chat(Vec<Message>),
    /// Token ids, used as they are (a client that tokenizes itself).
    Tokens(Vec<u32>),
}

/// One step of a generation.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerateEvent {
    /// A generated token.
    Token(Token),
    /// The generation ended normally (stop, length or cancellation).
    Done {
        /// Why it ended.
        finish_reason: FinishReason,
        /// How it went.
        metrics: GenerateMetrics,
    },
}

/// What `classify` resolves to: one result or error per prompt, in order.
pub type ClassifyFuture = Pin<Box<dyn Future<Output = Vec<Result<ClassifyResult, BackendError>>> + Send>>;

/// What `batch_generate` resolves to: one result per prompt, each with its own error.
pub type BatchFuture = Pin<Box<dyn Future<Output = Vec<BatchResult>> + Send>>;

/// What `inspect_attention` resolves to.
pub type InspectFuture = Pin<Box<dyn Future<Output = Result<crate::AttentionSnapshot, BackendError>> + Send>>;

/// The stream a generation returns.
pub type GenerateStream = Pin<Box<dyn Stream<Item = Result<GenerateEvent, BackendError>> + Send>>;

/// What a backend can fail with. Mapped to the wire by [`BackendError::code`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The prompt is empty (after rendering).
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// Prompt plus `max_tokens` does not fit.
    #[error(
        "prompt of {prompt_tokens} tokens + max_tokens {max_tokens} exceeds the context window of {context_len} tokens"
    )]
    ContextOverflow {
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// Requested generation length.
        max_tokens: usize,
        /// The window.
        context_len: usize,
    },
    /// A setting the backend cannot honour.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The model could not be loaded.
    #[error("loading {path}: {reason}")]
    Load {
        /// The model path.
        path: String,
        /// Why.
        reason: String,
    },
    /// The backend cannot run here or cannot take work now.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The deadline passed.
    #[error("deadline exceeded")]
    DeadlineExceeded,
    /// A compute failure.
    #[error("compute failed: {0}")]
    Compute(String),
}

impl BackendError {
    /// The wire code for this error — the one place this mapping lives.
    pub fn code(&self) -> ErrorCode {
        match self {
            BackendError::EmptyPrompt | BackendError::Invalid(_) => ErrorCode::BadRequest,
            BackendError::ContextOverflow { .. } => ErrorCode::ContextOverflow,
            BackendError::Load { .. } | BackendError::Compute(_) => ErrorCode::BackendError,
            BackendError::Unavailable(_) => ErrorCode::Unavailable,
            BackendError::DeadlineExceeded => ErrorCode::DeadlineExceeded,
        }
    }

    /// The error as it crosses the wire.
    pub fn to_wire(&self) -> WireError {
        WireError::new(self.code(), self.to_string())
    }
}

/// A backend: knows whether it can run here and loads models (seed 000 `Backend`).
pub trait Backend: Send + Sync {
    /// Registry key: `"cpu"`, `"llama_cpp"`, `"rocm"`, `"cuda"`, `"metal"`.
    fn name(&self) -> &str;
    /// Whether this backend can run on this machine.
    fn available(&self) -> bool;
    /// Loads the model at `path` (a GGUF file or an HF model directory).
    fn load_model(&self, path: &Path, config: &LoadConfig) -> Result<Arc<dyn TextModel>, BackendError>;
}

/// A loaded model (seed 000 `TextModel`).
pub trait TextModel: Send + Sync {
    /// Streams a generation for `prompt`; stops at the next token boundary once
    /// `cancel` is set.
    fn generate(&self, prompt: Prompt, config: GenerateConfig, cancel: CancelFlag) -> GenerateStream;
    /// Prefill-only pass over each prompt: the most likely next token, and the
    /// next-token logits when `return_logits` is set. A failing prompt (empty, too
    /// long) fails alone.
    fn classify(&self, prompts: Vec<Prompt>, return_logits: bool) -> ClassifyFuture;
    /// Generates for every prompt with the same settings; each prompt gets its own
    /// tokens or its own error.
    fn batch_generate(&self, prompts: Vec<Prompt>, config: GenerateConfig, cancel: CancelFlag) -> BatchFuture;
    /// Seed 000's AttentionInspector: prefills `prompt` and returns the post-RoPE key
    /// vectors of every layer from the KV cache. Backends that cannot read their cache
    /// keep this default, which says so.
    fn inspect_attention(&self, prompt: Prompt) -> InspectFuture {
        let _ = prompt;
        let name = self.model_type().to_string();
        Box::pin(async move {
            Err(BackendError::Unavailable(format!(
                "{name}: attention inspection is not supported"
            )))
        })
    }
    /// Whether the model can take requests now. A model behind another process (a
    /// llama.cpp server) says `false` while that process is down or restarting; the
    /// worker then refuses new requests as `unavailable` and its heartbeat says so,
    /// so coordinators route elsewhere.
    fn healthy(&self) -> bool {
        true
    }
    /// The architecture, e.g. `"llama"`.
    fn model_type(&self) -> &str;
    /// Static facts.
    fn info(&self) -> ModelInfo;
    /// Metrics of the most recent finished generation.
    fn metrics(&self) -> GenerateMetrics;
}
