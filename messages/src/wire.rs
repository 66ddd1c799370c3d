//! Envelopes: what travels on each subject (see `docs/protocol.md`).

use crate::{GenerateConfig, GenerateMetrics, Message, Priority, Token, WireError};
use serde::{Deserialize, Serialize};

/// A generation request, sent to `{p}.v1.generate` (with `prompt`) or `{p}.v1.chat`
/// (with `messages`), or straight to a worker's `generate` / `chat` endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// Version, id, model and routing: the same first fields as every request.
    #[serde(flatten)]
    pub head: RequestHead,
    /// The raw prompt (generate).
    #[serde(default)]
    pub prompt: Option<String>,
    /// The conversation (chat); rendered with the model's own chat template.
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    /// Generation settings; omitted fields take their defaults.
    #[serde(default)]
    pub config: GenerateConfig,
    /// Resuming a lost stream (protocol 1.1): the tokens it already gave the client.
    /// The worker continues after them (`config.max_tokens` counts only new tokens;
    /// `config.rng_position` says how many sampler draws they took).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resume_tokens: Vec<u32>,
    /// (1.3) Functions a chat's model may call; their calls come back in the last
    /// chunk's `tool_calls`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<crate::Tool>,
    /// (1.3) Whether the model must, may or must not call, or which function.
    #[serde(default, skip_serializing_if = "is_auto")]
    pub tool_choice: crate::ToolChoice,
    /// (1.3) Whether one answer may hold several calls (default true).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub parallel_tool_calls: bool,
    /// (1.18) Extra variables for a chat's template, as a JSON object's text
    /// (`{"enable_thinking": false}`, as Hugging Face's `apply_chat_template` takes
    /// them); empty = none. They cannot replace `messages`, `tools`,
    /// `add_generation_prompt`, `bos_token` or `eos_token`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub chat_template_kwargs: String,
    /// (1.18) Split a reasoning model's reasoning from its answer: the text of a
    /// `<think>…</think>` section (opening the answer, or opened by the template)
    /// comes in tokens marked [`crate::Token::reasoning`], without the tags. Off: the
    /// raw text, tags and all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub split_reasoning: bool,
}

fn is_auto(c: &crate::ToolChoice) -> bool {
    *c == crate::ToolChoice::Auto
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl GenerateRequest {
    /// A generate request for `prompt` with default settings.
    pub fn generate(request_id: impl Into<String>, model: impl Into<String>, prompt: impl Into<String>) -> Self {
        Self {
            head: RequestHead::new(request_id, model),
            prompt: Some(prompt.into()),
            messages: None,
            config: GenerateConfig::default(),
            resume_tokens: Vec::new(),
            tools: Vec::new(),
            tool_choice: crate::ToolChoice::Auto,
            parallel_tool_calls: true,
            chat_template_kwargs: String::new(),
            split_reasoning: false,
        }
    }

    /// A chat request for `messages` with default settings.
    pub fn chat(request_id: impl Into<String>, model: impl Into<String>, messages: Vec<Message>) -> Self {
        Self {
            prompt: None,
            messages: Some(messages),
            ..Self::generate(request_id, model, "")
        }
    }
}

/// Why a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FinishReason {
    /// An end-of-generation token, a stop token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// Cancelled by the client.
    Cancelled,
    /// Ended by an error (see the chunk's `error`).
    Error,
    /// (1.3) The model called tools (the last chunk's `tool_calls`); only for a
    /// request that offered tools.
    ToolCalls,
}

impl FinishReason {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// One message of a response stream, published to the client's inbox.
///
/// `seq` starts at 0 and grows by one per chunk. The first chunk (seq 0) is sent on
/// admission and names the worker. Chunks with no tokens and `done == false` are
/// keep-alives, sent while the worker is busy (queued or prefilling) so a client can
/// tell a slow worker from a dead one. The last chunk has `done == true` with a
/// `finish_reason`, the metrics, or an `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamChunk {
    /// Protocol version.
    pub v: u32,
    /// The request this chunk belongs to.
    pub request_id: String,
    /// Position in the stream.
    pub seq: u64,
    /// Tokens since the previous chunk: one or several (a worker coalesces tokens
    /// that come close together; count tokens, not chunks).
    #[serde(default)]
    pub tokens: Vec<Token>,
    /// Whether this is the last chunk.
    #[serde(default)]
    pub done: bool,
    /// Set on the last chunk.
    #[serde(default)]
    pub finish_reason: Option<FinishReason>,
    /// Set on the last chunk of a successful stream.
    #[serde(default)]
    pub metrics: Option<GenerateMetrics>,
    /// Set on the last chunk of a failed stream.
    #[serde(default)]
    pub error: Option<WireError>,
    /// The worker serving the request; set on the first and the last chunk.
    #[serde(default)]
    pub worker_id: Option<String>,
    /// (1.3) On the last chunk of a request that offered tools: the calls parsed out
    /// of the answer (their text is not among the tokens).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<crate::ToolCall>,
}

impl StreamChunk {
    /// A terminal error chunk (used by coordinators and workers alike).
    pub fn failed(request_id: &str, seq: u64, error: WireError) -> Self {
        Self {
            v: crate::PROTOCOL_VERSION,
            request_id: request_id.to_string(),
            seq,
            tokens: Vec::new(),
            done: true,
            finish_reason: Some(FinishReason::Error),
            metrics: None,
            error: Some(error),
            worker_id: None,
            tool_calls: Vec::new(),
        }
    }

    /// A keep-alive: no tokens, not the end (a coordinator sends them while the
    /// request waits for a worker).
    pub fn keepalive(request_id: &str, seq: u64) -> Self {
        Self {
            done: false,
            finish_reason: None,
            error: None,
            ..Self::failed(request_id, seq, WireError::new(crate::ErrorCode::Internal, ""))
        }
    }

    /// The last chunk of a request cancelled before it started.
    pub fn cancelled(request_id: &str, seq: u64) -> Self {
        Self {
            finish_reason: Some(FinishReason::Cancelled),
            metrics: Some(crate::GenerateMetrics::default()),
            error: None,
            ..Self::failed(request_id, seq, WireError::new(crate::ErrorCode::Internal, ""))
        }
    }
}

/// The body of a cancel on `{p}.v1.cancel.{request_id}`: it must name the inbox the
/// request's answer goes to (the reply subject the client sent it with), which only
/// the requester knows; other cancels are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CancelRequest {
    /// Protocol version.
    pub v: u32,
    /// The request's reply subject.
    pub inbox: String,
}

impl CancelRequest {
    /// A cancel for the request answered on `inbox`.
    pub fn new(inbox: impl Into<String>) -> Self {
        Self {
            v: crate::PROTOCOL_VERSION,
            inbox: inbox.into(),
        }
    }
}

/// A worker's answer to a coordinator's forward: admitted (the stream has started
/// towards the client) or refused with a reason (the coordinator may try another).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Admission {
    /// Protocol version.
    pub v: u32,
    /// The worker answering.
    pub worker_id: String,
    /// Whether the request was admitted.
    pub accepted: bool,
    /// Why not.
    #[serde(default)]
    pub error: Option<WireError>,
}

/// Reply to a request/reply call that failed (status, models): the error alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// Protocol version.
    pub v: u32,
    /// What went wrong.
    pub error: WireError,
}

/// A prefill-only request on `{p}.v1.classify` (or a worker's `classify` endpoint).
/// Answered by one [`ClassifyReply`], or an [`ErrorReply`] when the whole request
/// fails.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyRequest {
    /// Version, id, model and routing.
    #[serde(flatten)]
    pub head: RequestHead,
    /// Raw prompts (no chat template).
    pub prompts: Vec<String>,
    /// Return each prompt's next-token logits.
    #[serde(default)]
    pub return_logits: bool,
}

/// One prompt's outcome in a [`ClassifyReply`]: a result or its own error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyItem {
    /// The result, when this prompt succeeded.
    #[serde(default)]
    pub result: Option<crate::ClassifyResult>,
    /// This prompt's error; the other prompts are unaffected.
    #[serde(default)]
    pub error: Option<WireError>,
}

/// Reply to a [`ClassifyRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyReply {
    /// Protocol version.
    pub v: u32,
    /// The request answered.
    pub request_id: String,
    /// The worker that computed it.
    pub worker_id: String,
    /// One item per prompt, in order.
    pub results: Vec<ClassifyItem>,
}

/// A batch generation request on `{p}.v1.batch`: every prompt with the same
/// settings. Answered by one [`BatchReply`], or an [`ErrorReply`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchRequest {
    /// Version, id, model and routing.
    #[serde(flatten)]
    pub head: RequestHead,
    /// Raw prompts (no chat template).
    pub prompts: Vec<String>,
    /// Settings for every prompt.
    #[serde(default)]
    pub config: GenerateConfig,
}

/// Reply to a [`BatchRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchReply {
    /// Protocol version.
    pub v: u32,
    /// The request answered.
    pub request_id: String,
    /// The worker that computed it.
    pub worker_id: String,
    /// One result per prompt, in order, each with its own error.
    pub results: Vec<crate::BatchResult>,
}

/// The fields every request starts with — what routing and admission need. Each
/// request envelope flattens it in (on the wire they are top-level fields), and it
/// decodes from any of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestHead {
    /// Protocol version ([`crate::PROTOCOL_VERSION`]).
    pub v: u32,
    /// Client-chosen id, unique per request: letters, digits, `-`, `_`.
    pub request_id: String,
    /// Model name as workers announce it; `""` = any model the fleet serves.
    pub model: String,
    /// Only workers of this backend (`"cpu"`, `"llama_cpp"`, `"rocm"`, …).
    #[serde(default)]
    pub backend: Option<String>,
    /// Only this worker id.
    #[serde(default)]
    pub worker: Option<String>,
    /// Absolute deadline, Unix milliseconds; past it the worker stops with
    /// `deadline_exceeded`.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Who the request is for (an API key's name, a NATS user): coordinators serve
    /// their waiting requests round robin across tenants. Absent = the default tenant.
    /// Self-declared on NATS; the gateway sets it from the API key (protocol 1.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// `interactive` (the default) is served before `batch` when requests wait for a
    /// worker (protocol 1.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// The longest this request may wait at a coordinator for a worker with room,
    /// milliseconds; past it (or past `deadline_ms`) it is refused with `overloaded`.
    /// Absent = the coordinator's `queue_timeout_ms` (protocol 1.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_ms: Option<u64>,
    /// (1.10) The LoRA adapter of `model` to run with (a name a worker announces in
    /// [`ServedModel::adapters`]); absent = the base model. Only workers holding it
    /// are candidates; none = `unknown_model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
}

impl RequestHead {
    /// This protocol version, `request_id`, `model`, no pins, no deadline.
    pub fn new(request_id: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            v: crate::PROTOCOL_VERSION,
            request_id: request_id.into(),
            model: model.into(),
            backend: None,
            worker: None,
            deadline_ms: None,
            tenant: None,
            priority: None,
            queue_ms: None,
            adapter: None,
        }
    }
}
