//! Envelopes: what travels on each subject (see `docs/protocol.md`).

use crate::{GenerateConfig, GenerateMetrics, Message, ModelInfo, Priority, QueueView, Token, WireError};
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

/// A model a worker serves, as announced in its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedModel {
    /// The name requests use.
    pub name: String,
    /// Where the worker loaded it from.
    #[serde(default)]
    pub path: String,
    /// Static facts.
    #[serde(default)]
    pub info: ModelInfo,
}

/// A worker's heartbeat, published on `{p}.v1.heartbeat.{wid}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Protocol version.
    pub v: u32,
    /// Unique worker id (one subject token).
    pub worker_id: String,
    /// Device the worker is pinned to: `cpu`, `cuda:0`, `rocm:1`, `metal`, `llama_cpp@URL`.
    pub device: String,
    /// Backend name: `metal`, `rocm`, `llama_cpp`, `cuda`, `cpu`.
    pub backend: String,
    /// Models served.
    pub models: Vec<ServedModel>,
    /// Requests computed concurrently.
    pub capacity: u32,
    /// Requests that may wait for a slot beyond `capacity`.
    pub queue_capacity: u32,
    /// Requests computing now.
    pub in_flight: u32,
    /// Requests waiting for a slot.
    pub queued: u32,
    /// Whether the backend can take requests (false while loading or restarting).
    pub available: bool,
    /// Whether the worker is shutting down (finishing in-flight work, taking none).
    pub draining: bool,
    /// Host name.
    #[serde(default)]
    pub host: String,
    /// Process id.
    #[serde(default)]
    pub pid: u32,
    /// When the worker started, Unix milliseconds.
    #[serde(default)]
    pub started_at_ms: u64,
    /// Heartbeat sequence number.
    #[serde(default)]
    pub seq: u64,
    /// Requests finished since start.
    #[serde(default)]
    pub completed: u64,
    /// switchyard version of the worker.
    #[serde(default)]
    pub version: String,
    /// What the worker's KV slots and block store hold.
    #[serde(default)]
    pub kv: KvUsage,
    /// Latency of its recent requests.
    #[serde(default)]
    pub recent: RecentLatency,
    /// The NATS server it is connected to: its name (or id) and address (protocol
    /// 1.4; empty from older workers).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nats_server: String,
}

/// A worker's KV state, as of its heartbeat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KvUsage {
    /// KV slots (sequences computed together).
    pub slots: u32,
    /// Slots running a request now.
    pub busy: u32,
    /// Slots held by sessions.
    pub sessions: u32,
    /// Tokens resident across slots.
    pub resident_tokens: u64,
    /// Bytes of KV the resident tokens take (0 when the backend does not say).
    pub resident_bytes: u64,
    /// Blocks and bytes in the block store, and its budget.
    pub store_blocks: u64,
    pub store_bytes: u64,
    pub store_budget_bytes: u64,
    /// Prompt tokens served from KV (slots or store) / prompt tokens, over the recent
    /// requests.
    pub hit_ratio: f64,
}

/// Medians over a worker's most recent requests (up to 64).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecentLatency {
    /// Requests the medians cover.
    pub requests: u32,
    /// Time to first token (queue + prefill), milliseconds.
    pub ttft_ms: f64,
    /// Time per output token after the first, milliseconds.
    pub tpot_ms: f64,
    /// Tokens speculative decoding proposed over these requests, and those the
    /// model kept (protocol 1.5; zero where nothing was drafted).
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
}

/// What a worker measured of its own speed over its recent requests: the heartbeat
/// field `speed` (protocol 1.2), beside [`WorkerStatus`]'s fields. Coordinators
/// routing by predicted time to first token read it; all zeros (an older worker, or
/// one with no finished request yet) means "not measured".
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkerSpeed {
    /// Requests the medians cover.
    pub requests: u32,
    /// Prompt tokens computed per second of prefill, cached tokens not counted (median).
    pub prefill_tps: f64,
    /// Milliseconds a request holds a slot, from its prefill's start to its last token
    /// (median).
    pub service_ms: f64,
}

impl WorkerSpeed {
    /// Whether there is a measurement to predict from.
    pub fn measured(&self) -> bool {
        self.requests > 0 && self.prefill_tps > 0.0 && self.prefill_tps.is_finite() && self.service_ms.is_finite()
    }
}

/// A heartbeat as published on `{p}.v1.heartbeat.{wid}`: the [`WorkerStatus`] fields
/// and, beside them in the same map, `speed` (protocol 1.2). A heartbeat without
/// `speed` decodes with zeros; a [`WorkerStatus`] decoder ignores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// Every field of the status.
    #[serde(flatten)]
    pub status: WorkerStatus,
    /// The worker's measured speed.
    #[serde(default)]
    pub speed: WorkerSpeed,
}

impl From<WorkerStatus> for Heartbeat {
    fn from(status: WorkerStatus) -> Self {
        Self {
            status,
            speed: WorkerSpeed::default(),
        }
    }
}

/// One worker as a coordinator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerView {
    /// Its last heartbeat.
    pub status: WorkerStatus,
    /// Milliseconds since that heartbeat arrived.
    pub age_ms: u64,
}

/// Reply on `{p}.v1.status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetStatus {
    /// Protocol version.
    pub v: u32,
    /// The coordinator that answered.
    pub coordinator_id: String,
    /// Live workers.
    pub workers: Vec<WorkerView>,
    /// Requests waiting at this coordinator for a worker with room, by model,
    /// priority and tenant (protocol 1.4).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<QueueView>,
}

/// A model and where it is served, in a [`ModelsReply`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    /// Model name.
    pub name: String,
    /// Workers serving it.
    pub workers: Vec<String>,
    /// Backends serving it.
    pub backends: Vec<String>,
    /// Facts from one of the workers.
    pub info: ModelInfo,
}

/// Reply on `{p}.v1.models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelsReply {
    /// Protocol version.
    pub v: u32,
    /// Models served by live workers.
    pub models: Vec<ModelEntry>,
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode, encode};

    #[test]
    fn heartbeat_speed_travels_beside_the_status_and_old_peers_still_decode() {
        let status = WorkerStatus {
            v: crate::PROTOCOL_VERSION,
            worker_id: "w-1".into(),
            device: "cpu".into(),
            backend: "cpu".into(),
            models: Vec::new(),
            capacity: 4,
            queue_capacity: 8,
            in_flight: 1,
            queued: 0,
            available: true,
            draining: false,
            host: "h".into(),
            pid: 1,
            started_at_ms: 5,
            seq: 9,
            completed: 3,
            version: "t".into(),
            kv: KvUsage::default(),
            recent: RecentLatency::default(),
            nats_server: String::new(),
        };
        let beat = Heartbeat {
            status: status.clone(),
            speed: WorkerSpeed {
                requests: 3,
                prefill_tps: 812.5,
                service_ms: 420.0,
            },
        };
        let new = encode(&beat);
        assert_eq!(decode::<Heartbeat>(&new).unwrap(), beat);
        assert_eq!(
            decode::<WorkerStatus>(&new).unwrap(),
            status,
            "an old coordinator ignores speed"
        );
        let old: Heartbeat = decode(&encode(&status)).unwrap();
        assert_eq!(old, Heartbeat::from(status), "an old worker's heartbeat: speed zeros");
        assert!(!old.speed.measured() && beat.speed.measured());
    }
}
