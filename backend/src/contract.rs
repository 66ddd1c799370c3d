//! The traits every backend implements (`TextModel`), in
//! async-stream form: a generation is a stream of [`GenerateEvent`]s ending with
//! [`GenerateEvent::Done`] or an error, cancelled through a [`CancelFlag`] that the
//! backend checks at every token boundary.

use crate::stream::{HoldSender, HoldStream, MayWait};
use futures_core::Stream;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use switchyard_messages::{BatchResult, ClassifyResult};
use switchyard_messages::{
    ErrorCode, FinishReason, GenerateConfig, GenerateMetrics, Message, ModelInfo, Token, WireError,
};

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
    /// A conversation, rendered with the model's chat template; `tools` go to the
    /// template's own tools section (only to a backend whose
    /// [`TextModel::tool_format`] is not [`ToolFormat::Generic`]; the worker renders
    /// them into the messages for the others).
    Chat {
        /// The turns.
        messages: Vec<Message>,
        /// Functions the model may call.
        tools: Vec<switchyard_messages::Tool>,
        /// Extra template variables: a JSON object's text, empty for none (the
        /// request's `chat_template_kwargs`, checked to be an object).
        kwargs: String,
    },
    /// Token ids, used as they are (a client that tokenizes itself).
    Tokens(Vec<u32>),
    /// A resumed stream: `prompt`, then the tokens already generated for it
    /// elsewhere (given to the client before its worker was lost). Generation goes
    /// on after them; they are not emitted again. Only backends whose
    /// [`TextModel::resumes`] is true get it.
    Continue {
        /// The original prompt.
        prompt: Box<Prompt>,
        /// The tokens generated so far.
        generated: Vec<u32>,
    },
}

impl Prompt {
    /// A conversation without tools.
    pub fn chat(messages: Vec<Message>) -> Self {
        Prompt::Chat {
            messages,
            tools: Vec::new(),
            kwargs: String::new(),
        }
    }
}

/// How a model's chat template shows tools and how the model writes its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToolFormat {
    /// The template has no tools section: the worker describes the tools in a
    /// system turn and asks for `<tool_call>{"name": …, "arguments": …}</tool_call>`.
    Generic,
    /// Hermes / Qwen 2.5+ templates: tools rendered by the template, calls written
    /// as `<tool_call>{json}</tool_call>`.
    Hermes,
    /// Llama 3.x templates: tools rendered by the template, a call written as a bare
    /// `{"name": …, "parameters": …}` object (or after `<|python_tag|>`).
    Llama3,
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

/// One item of a generation: an event or the error that ends it.
pub type GenerateItem = Result<GenerateEvent, BackendError>;

/// The stream a generation returns: [`GenerateEvent::Token`]s, then
/// [`GenerateEvent::Done`] or an error. A backend that feeds it through
/// [`GenerateStream::channel`] lets a coalescing consumer hold tokens without being
/// woken for each ([`HoldStream::hold`]); the end and errors always wake it.
pub type GenerateStream = HoldStream<GenerateItem>;

/// The sending half of [`GenerateStream::channel`].
pub type EventSender = HoldSender<GenerateItem>;

impl MayWait for GenerateItem {
    fn may_wait(&self) -> bool {
        matches!(self, Ok(GenerateEvent::Token(_)))
    }
}

/// What `classify` resolves to: one result or error per prompt, in order.
pub type ClassifyFuture = Pin<Box<dyn Future<Output = Vec<Result<ClassifyResult, BackendError>>> + Send>>;

/// What `embed` resolves to: one embedding or error per input, in order.
pub type EmbedFuture = Pin<Box<dyn Future<Output = Vec<Result<switchyard_messages::Embedding, BackendError>>> + Send>>;

/// What `batch_generate` resolves to: one result per prompt, each with its own error.
pub type BatchFuture = Pin<Box<dyn Future<Output = Vec<BatchResult>> + Send>>;

/// What `inspect_attention` resolves to.
pub type InspectFuture =
    Pin<Box<dyn Future<Output = Result<switchyard_messages::AttentionSnapshot, BackendError>> + Send>>;

/// A boxed future of a backend call.
pub type BackendFuture<T> = Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send>>;

/// What making a session's resident tokens equal a target cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResidentUpdate {
    /// Leading tokens that were already resident and kept.
    pub reused: u32,
    /// Tokens computed (prefilled).
    pub computed: u32,
    /// Resident tokens thrown away (beyond the kept prefix).
    pub dropped: u32,
}

/// Sizes a backend knows about its model, for session `describe`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelMemory {
    /// The model's own context ceiling (0 = unknown).
    pub model_max_context: u32,
    /// Bytes each further cached position takes in one sequence (0 = unknown).
    pub kv_bytes_per_token: u64,
    /// Bytes one sequence's cache takes on top of that, at most, whatever its length
    /// (sliding-window layers that keep a fixed ring of positions).
    pub kv_fixed_bytes: u64,
    /// Bytes of weights (0 = unknown).
    pub weights_bytes: u64,
}

/// A persistent KV sequence on a loaded model, in tokens (seed 002's session, minus
/// the manifests, fences and hashes the worker keeps on top). Calls on one session
/// are made one at a time.
pub trait ModelSession: Send + Sync {
    /// Tokenizes session text: with the model's BOS when `bos`, never with EOS.
    fn tokenize(&self, text: String, bos: bool) -> BackendFuture<Vec<u32>>;
    /// Makes the resident tokens equal `target`: keeps the longest resident prefix
    /// (nothing when `invalidate`) and computes the rest.
    fn set_resident(&self, target: Vec<u32>, invalidate: bool) -> BackendFuture<ResidentUpdate>;
    /// Generates from the resident tokens; what it generates becomes resident.
    fn decode(&self, config: GenerateConfig, cancel: CancelFlag) -> GenerateStream;
    /// The tokens resident now.
    fn resident(&self) -> BackendFuture<Vec<u32>>;
    /// Gives the session's KV sequence back; later calls fail.
    fn close(&self);
}

/// Told a backend's KV holdings as they change ([`TextModel::watch_kv`]).
pub type KvWatcher = Box<dyn Fn(Vec<switchyard_messages::KvHolding>) + Send + Sync>;

/// What a backend can fail with. Mapped to the wire by [`BackendError::code`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The prompt is empty (after rendering).
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// Prompt plus `max_tokens` does not fit. (Worded as OpenAI words it: client
    /// libraries such as litellm recognise the sentence.)
    #[error(
        "This model's maximum context length is {context_len} tokens. However, you requested {} tokens \
         ({prompt_tokens} in the prompt, {max_tokens} for the completion). Please reduce the length of the \
         prompt or of max_tokens.",
        prompt_tokens + max_tokens
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
    /// Part of the backend went away mid-request (a pipeline stage died): the
    /// request resumes elsewhere, as when a whole worker is lost.
    #[error("lost: {0}")]
    Lost(String),
    /// Full right now (no free KV slot for a session); another worker may have one.
    #[error("overloaded: {0}")]
    Overloaded(String),
}

impl BackendError {
    /// The wire code for this error — the one place this mapping lives.
    pub fn code(&self) -> ErrorCode {
        match self {
            BackendError::EmptyPrompt | BackendError::Invalid(_) => ErrorCode::BadRequest,
            BackendError::ContextOverflow { .. } => ErrorCode::ContextOverflow,
            BackendError::Load { .. } | BackendError::Compute(_) => ErrorCode::BackendError,
            BackendError::Unavailable(_) => ErrorCode::Unavailable,
            BackendError::Overloaded(_) => ErrorCode::Overloaded,
            BackendError::Lost(_) => ErrorCode::WorkerLost,
            BackendError::DeadlineExceeded => ErrorCode::DeadlineExceeded,
        }
    }

    /// The error as it crosses the wire.
    pub fn to_wire(&self) -> WireError {
        WireError::new(self.code(), self.to_string())
    }
}

/// Reads one prompt's stream to its end as a [`switchyard_messages::BatchResult`]: its tokens, why
/// it ended, its error — how every backend answers `batch_generate`.
pub async fn collect_batch_result(mut stream: GenerateStream) -> switchyard_messages::BatchResult {
    let mut result = switchyard_messages::BatchResult::default();
    while let Some(ev) = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
        match ev {
            Ok(GenerateEvent::Token(t)) => result.tokens.push(t),
            Ok(GenerateEvent::Done { finish_reason, .. }) => result.finish_reason = Some(finish_reason),
            Err(e) => {
                result.finish_reason = Some(FinishReason::Error);
                result.error = Some(e.to_wire());
            }
        }
    }
    result
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
    /// (1.7) One embedding per input (see [`switchyard_messages::Embedding`]). Backends that cannot
    /// compute them keep this default, which says so for every input.
    fn embed(&self, inputs: Vec<Prompt>) -> EmbedFuture {
        let name = self.model_type().to_string();
        let n = inputs.len();
        Box::pin(async move {
            (0..n)
                .map(|_| {
                    Err(BackendError::Unavailable(format!(
                        "{name}: embeddings are not supported"
                    )))
                })
                .collect()
        })
    }
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
    /// How the model's template shows tools ([`ToolFormat::Generic`]: it has no
    /// tools section, and the worker writes them into the messages).
    fn tool_format(&self) -> ToolFormat {
        ToolFormat::Generic
    }
    /// Whether `prompt`, rendered, leaves a reasoning section open (its template ends
    /// the assistant's opener with `<think>`, as DeepSeek-R1's and QwQ's do), so the
    /// answer starts inside the reasoning. A backend that cannot tell keeps this
    /// default: the worker then takes reasoning only where the answer opens it.
    fn opens_reasoning(&self, prompt: &Prompt) -> bool {
        let _ = prompt;
        false
    }
    /// The text of generated token `ids`, as the stream gave it (a resumed stream's
    /// reasoning split goes on from it); `None` where the backend cannot tell. A
    /// backend whose [`TextModel::resumes`] is true should say.
    fn detokenize(&self, ids: &[u32]) -> Option<String> {
        let _ = ids;
        None
    }
    /// Whether this backend enforces `constraint` exactly; `Err` says what it would
    /// not enforce (the worker then refuses the request as retryable `unavailable`,
    /// so a coordinator tries a worker that does).
    fn enforces(&self, constraint: &switchyard_messages::Constraint) -> Result<(), String> {
        let _ = constraint;
        Ok(())
    }
    /// Whether [`Prompt::Continue`] is supported (a lost stream resumes here).
    fn resumes(&self) -> bool {
        false
    }
    /// Whether the model can take requests now. A model behind another process (a
    /// llama.cpp server) says `false` while that process is down or restarting; the
    /// worker then refuses new requests as `unavailable` and its heartbeat says so,
    /// so coordinators route elsewhere.
    fn healthy(&self) -> bool {
        true
    }
    /// Opens a persistent session holding its own KV sequence. Backends without
    /// sessions keep this default, which says so.
    fn open_session(&self) -> BackendFuture<std::sync::Arc<dyn ModelSession>> {
        let name = self.model_type().to_string();
        Box::pin(async move { Err(BackendError::Unavailable(format!("{name}: sessions are not supported"))) })
    }
    /// Sizes for session `describe`.
    fn memory(&self) -> ModelMemory {
        ModelMemory::default()
    }
    /// Sequences the model computes at once (KV slots; a llama.cpp server's
    /// `--parallel`): what a worker admits concurrently unless configured otherwise.
    fn parallel_slots(&self) -> u32 {
        1
    }
    /// What the model's KV slots (and block store) hold now, for heartbeats.
    fn kv_usage(&self) -> switchyard_messages::KvUsage {
        switchyard_messages::KvUsage {
            slots: self.parallel_slots(),
            ..Default::default()
        }
    }
    /// What the model's KV cache holds, in routing terms, refreshed before each
    /// generation's stream ends (`None`: the backend does not say, and the worker
    /// announces its recent requests' prefixes instead).
    fn kv_holdings(&self) -> Option<Vec<switchyard_messages::KvHolding>> {
        None
    }
    /// Calls `on_change` with the holdings whenever they change (a prompt claims a
    /// slot, a stream ends), from the backend's own thread; it
    /// must not block. Replaces an earlier watcher. A backend without holdings ignores it.
    fn watch_kv(&self, _on_change: KvWatcher) {}
    /// The LoRA adapters loaded now, as heartbeats announce them.
    fn adapters(&self) -> Vec<switchyard_messages::ServedAdapter> {
        Vec::new()
    }
    /// Loads the LoRA adapter `name` from `path` (a PEFT directory or a GGUF LoRA
    /// file) at `scale`, replacing one of that name; the error names what is wrong.
    fn load_adapter(
        &self,
        name: String,
        path: String,
        scale: f32,
    ) -> BackendFuture<switchyard_messages::ServedAdapter> {
        let kind = self.model_type().to_string();
        let _ = (name, path, scale);
        Box::pin(async move {
            Err(BackendError::Invalid(format!(
                "{kind}: this backend loads no LoRA adapters"
            )))
        })
    }
    /// Unloads the LoRA adapter `name`: requests already running with it finish;
    /// later ones naming it are refused.
    fn unload_adapter(&self, name: String) -> BackendFuture<()> {
        Box::pin(async move { Err(BackendError::Invalid(format!("no LoRA adapter {name:?} is loaded"))) })
    }
    /// Its KV as something that can travel between workers, when the backend can
    /// export and import it ([`crate::KvTransfer`]).
    fn kv_transfer(&self) -> Option<&dyn crate::KvTransfer> {
        None
    }
    /// The architecture, e.g. `"llama"`.
    fn model_type(&self) -> &str;
    /// Static facts.
    fn info(&self) -> ModelInfo;
    /// Metrics of the most recent finished generation.
    fn metrics(&self) -> GenerateMetrics;
}
