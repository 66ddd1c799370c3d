//! Ollama's API (`/api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings`,
//! `/api/tags`, `/api/show`, `/api/ps`, `/api/version`), so Ollama's clients — PyPI
//! `ollama`, Open WebUI's Ollama connection, editors' Ollama providers — use the fleet
//! unchanged: Ollama's field names and `options` read into switchyard requests, its
//! answers (NDJSON when streamed, which is Ollama's default) written back
//! ([`answer`]). Errors are Ollama's `{"error": "…"}`. Model management (`pull`,
//! `push`, `create`, `copy`, `delete`, blobs) is not Ollama's here: those answer
//! 501 saying how switchyard places models.

mod answer;
mod models;

use super::errors::ApiError;
use super::openai::chat_defaults;
use super::Gateway;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use switchyard_client::{Client, GenerateRequest, Message};
use switchyard_messages::{Constraint, ToolCall};

pub use models::{ps, show, tags, version};

/// Tokens an answer may run to when `num_predict` does not bound it (Ollama's
/// default, -1, is "until the model stops"): fitted to what the window leaves.
pub const UNBOUNDED_TOKENS: u32 = 8192;

/// An error in Ollama's shape, `{"error": "…"}`, with the OpenAI side's status.
pub struct OllamaError(pub ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.0.message}).to_string();
        let mut r = self.0.into_response();
        *r.body_mut() = axum::body::Body::from(body);
        r
    }
}

fn refuse(param: &str, why: &str) -> OllamaError {
    OllamaError(ApiError::bad_request(
        Some(param.to_string()),
        format!("{param}: {why}"),
    ))
}

/// `POST /api/chat`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub messages: Vec<InMessage>,
    pub tools: Option<Vec<Value>>,
    #[serde(flatten)]
    pub common: Common,
}

/// `POST /api/generate`.
#[derive(Debug, Deserialize)]
pub struct GenerateBody {
    #[serde(default)]
    pub model: String,
    pub prompt: Option<String>,
    pub system: Option<String>,
    /// No template: the prompt goes to the model as it is.
    pub raw: Option<bool>,
    pub suffix: Option<String>,
    pub template: Option<String>,
    pub context: Option<Vec<u32>>,
    pub images: Option<Vec<Value>>,
    #[serde(flatten)]
    pub common: Common,
}

/// What chat and generate share.
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    /// Ollama streams unless told not to.
    pub stream: Option<bool>,
    /// `"json"` or a JSON schema.
    pub format: Option<Value>,
    pub options: Option<Map<String, Value>>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    /// Thinking on (`true`, `"low"`, `"medium"`, `"high"`) or off (`false`);
    /// absent, the model thinks as its template does.
    pub think: Option<Value>,
    /// Accepted: workers keep their models loaded.
    pub keep_alive: Option<Value>,
    /// Fields this gateway does not know.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One chat turn in Ollama's shape.
#[derive(Debug, Deserialize)]
pub struct InMessage {
    pub role: String,
    #[serde(default)]
    pub content: String,
    pub images: Option<Vec<Value>>,
    pub tool_calls: Option<Vec<Value>>,
    pub tool_name: Option<String>,
    /// The model's reasoning in an earlier turn: not shown to it again.
    pub thinking: Option<String>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Options that size or place the model when Ollama loads it: the worker decided
/// those when it loaded the model, so they are accepted and ignored.
const LOAD_OPTIONS: &[&str] = &[
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "embedding_only",
    "num_thread",
    "numa",
    "num_keep",
    "penalize_newline",
    "mirostat_tau",
    "mirostat_eta",
];

fn unknown(rest: &Map<String, Value>, prefix: &str) -> Result<(), OllamaError> {
    match rest.iter().find(|(_, v)| !v.is_null()) {
        Some((k, _)) => Err(refuse(
            &format!("{prefix}{k}"),
            "not supported by this gateway (docs/gateway.md lists the fields it takes)",
        )),
        None => Ok(()),
    }
}

impl Common {
    /// Whether the answer streams (Ollama's default: yes).
    fn streams(&self) -> bool {
        self.stream.unwrap_or(true)
    }

    /// `options`, `format` and log-probabilities into `req.config`.
    fn apply(&self, req: &mut GenerateRequest) -> Result<(), OllamaError> {
        unknown(&self.rest, "")?;
        let o = self.options.clone().unwrap_or_default();
        let num = |k: &str| -> Result<Option<f64>, OllamaError> {
            match o.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| refuse(&format!("options.{k}"), "must be a number")),
            }
        };
        for (k, v) in &o {
            let neutral = match k.as_str() {
                "typical_p" | "tfs_z" => v.as_f64().is_none_or(|x| x == 1.0),
                "mirostat" => v.as_f64().is_none_or(|x| x == 0.0),
                _ => true,
            };
            if !neutral {
                return Err(refuse(
                    &format!("options.{k}"),
                    "is not supported (only its neutral value)",
                ));
            }
            let known = matches!(
                k.as_str(),
                "temperature"
                    | "top_k"
                    | "top_p"
                    | "min_p"
                    | "seed"
                    | "num_predict"
                    | "stop"
                    | "repeat_penalty"
                    | "repeat_last_n"
                    | "presence_penalty"
                    | "frequency_penalty"
                    | "typical_p"
                    | "tfs_z"
                    | "mirostat"
            );
            if !known && !LOAD_OPTIONS.contains(&k.as_str()) {
                return Err(refuse(&format!("options.{k}"), "is not an option this gateway knows"));
            }
        }
        let c = &mut req.config;
        chat_defaults(
            c,
            num("temperature")?.map(|t| t as f32),
            num("top_k")?.map(|k| k.max(0.0) as u32),
            num("top_p")?.map(|p| p as f32),
            num("min_p")?.map(|p| p as f32),
        );
        match num("num_predict")? {
            // -1 (until the model stops) and -2 (until the window is full).
            None => (c.max_tokens, c.fit_max_tokens) = (UNBOUNDED_TOKENS, true),
            Some(n) if n < 0.0 => (c.max_tokens, c.fit_max_tokens) = (UNBOUNDED_TOKENS, true),
            Some(0.0) => return Err(refuse("options.num_predict", "must be at least 1 (or -1)")),
            Some(n) => c.max_tokens = n.min(f64::from(u32::MAX)) as u32,
        }
        if let Some(p) = num("repeat_penalty")? {
            c.repeat_penalty = p as f32;
        }
        if let Some(n) = num("repeat_last_n")? {
            c.repeat_last_n = n.max(0.0) as u32;
        }
        for (k, field) in [
            ("presence_penalty", &mut c.presence_penalty),
            ("frequency_penalty", &mut c.frequency_penalty),
        ] {
            if let Some(p) = o.get(k).and_then(Value::as_f64) {
                if !(-2.0..=2.0).contains(&p) {
                    return Err(refuse(&format!("options.{k}"), "must be between -2.0 and 2.0"));
                }
                *field = p as f32;
            }
        }
        c.seed = num("seed")?.map(|s| s as i64 as u64);
        c.stop = match o.get("stop") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
                a.iter().filter_map(Value::as_str).map(str::to_string).collect()
            }
            Some(_) => return Err(refuse("options.stop", "must be a list of strings")),
        };
        c.constraint = match self.format.as_ref() {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) if s == "json" => Some(Constraint::JsonObject),
            Some(v) if v.is_object() => Some(Constraint::JsonSchema { schema: v.to_string() }),
            Some(_) => return Err(refuse("format", "must be \"json\" or a JSON schema object")),
        };
        let max = switchyard_messages::MAX_TOP_LOGPROBS as u32;
        c.logprobs = match (self.logprobs, self.top_logprobs) {
            (Some(true), top) if top.unwrap_or(0) <= max => Some(top.unwrap_or(0) as u8),
            (Some(true), _) => return Err(refuse("top_logprobs", &format!("must be 0 to {max}"))),
            (_, Some(n)) if n > 0 => return Err(refuse("top_logprobs", "only with logprobs: true")),
            _ => None,
        };
        // `think`: on, off or how hard — the template's `enable_thinking` and
        // `reasoning_effort`; the answer's thinking comes back in `thinking`.
        let (enabled, effort) = match self.think.as_ref() {
            None | Some(Value::Null) => (None, None),
            Some(Value::Bool(b)) => (Some(*b), None),
            Some(Value::String(s)) if matches!(s.as_str(), "low" | "medium" | "high") => (Some(true), Some(s.as_str())),
            Some(_) => return Err(refuse("think", "must be true, false, \"low\", \"medium\" or \"high\"")),
        };
        if req.messages.is_some() {
            req.chat_template_kwargs = crate::reasoning::Thinking {
                enabled,
                effort,
                effort_field: "think",
                ..Default::default()
            }
            .template_kwargs()?;
            req.split_reasoning = true;
        }
        Ok(())
    }
}

/// The conversation in switchyard's shape. Ollama's calls carry no ids (newer
/// versions may): each gets one, and a tool turn answers the first call of its
/// `tool_name` (else the first) that no turn answered yet.
fn conversation(messages: &[InMessage]) -> Result<Vec<Message>, OllamaError> {
    let mut out = Vec::with_capacity(messages.len());
    let mut open: Vec<ToolCall> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        unknown(&m.rest, &format!("messages[{i}]."))?;
        if m.images.as_ref().is_some_and(|v| !v.is_empty()) {
            return Err(refuse(
                &format!("messages[{i}].images"),
                "images are not supported (text only)",
            ));
        }
        let role = match m.role.as_str() {
            r @ ("system" | "user" | "assistant" | "tool") => r,
            other => {
                return Err(refuse(
                    &format!("messages[{i}].role"),
                    &format!("{other:?} is not system, user, assistant or tool"),
                ))
            }
        };
        let mut msg = Message::new(role, m.content.clone());
        if let Some(calls) = m.tool_calls.as_ref().filter(|_| role == "assistant") {
            open.clear();
            for (j, c) in calls.iter().enumerate() {
                let field = format!("messages[{i}].tool_calls[{j}]");
                let Some(name) = c.pointer("/function/name").and_then(Value::as_str) else {
                    return Err(refuse(&format!("{field}.function.name"), "is missing"));
                };
                let arguments = match c.pointer("/function/arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Object(_)) => v.to_string(),
                    None | Some(Value::Null) => "{}".into(),
                    Some(_) => return Err(refuse(&format!("{field}.function.arguments"), "must be an object")),
                };
                let id = c
                    .get("id")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("call_{i}_{j}"), str::to_string);
                open.push(ToolCall {
                    id,
                    name: name.to_string(),
                    arguments,
                });
            }
            msg.tool_calls = open.clone();
        }
        if role == "tool" {
            let at = open
                .iter()
                .position(|c| m.tool_name.as_deref() == Some(c.name.as_str()))
                .or((!open.is_empty()).then_some(0));
            msg.tool_call_id = Some(match at {
                Some(at) => open.remove(at).id,
                None => format!("call_{i}"),
            });
        }
        out.push(msg);
    }
    Ok(out)
}

fn body(b: Result<Bytes, BytesRejection>) -> Result<Bytes, OllamaError> {
    b.map_err(|e| {
        OllamaError(ApiError::new(
            e.status(),
            "invalid_request_error",
            "bad_request",
            format!("unreadable request body: {e}"),
        ))
    })
}

fn parse<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, OllamaError> {
    serde_json::from_slice(b).map_err(|e| refuse("body", &format!("invalid request body: {e}")))
}

/// `POST /api/chat`.
pub async fn chat(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let req: ChatRequest = parse(&body(b)?)?;
    let admitted = g.keys.admit(&headers, g.aliased(&req.model))?;
    if req.model.is_empty() {
        return Err(refuse("model", "is required"));
    }
    if req.messages.is_empty() {
        // Ollama loads the model and answers at once.
        return answer::loaded(&g, &req.model, true, &req.common).await;
    }
    let mut sy = GenerateRequest::chat(
        Client::new_request_id(),
        req.model.clone(),
        conversation(&req.messages)?,
    );
    req.common.apply(&mut sy)?;
    super::structured::tools(&mut sy, req.tools.as_deref(), None, None)?;
    answer::run(&g, &headers, sy, true, req.common.streams(), admitted).await
}

/// `POST /api/generate`.
pub async fn generate(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let req: GenerateBody = parse(&body(b)?)?;
    let admitted = g.keys.admit(&headers, g.aliased(&req.model))?;
    if req.model.is_empty() {
        return Err(refuse("model", "is required"));
    }
    for (field, given) in [
        ("suffix", req.suffix.as_ref().is_some_and(|s| !s.is_empty())),
        ("template", req.template.as_ref().is_some_and(|s| !s.is_empty())),
        ("context", req.context.as_ref().is_some_and(|c| !c.is_empty())),
        ("images", req.images.as_ref().is_some_and(|c| !c.is_empty())),
    ] {
        if given {
            return Err(refuse(
                field,
                "is not supported (no fill-in-the-middle, template override, token context or images)",
            ));
        }
    }
    let prompt = req.prompt.clone().unwrap_or_default();
    if prompt.is_empty() {
        return answer::loaded(&g, &req.model, false, &req.common).await;
    }
    let mut sy = if req.raw == Some(true) {
        GenerateRequest::generate(Client::new_request_id(), req.model.clone(), prompt)
    } else {
        let mut turns = Vec::new();
        if let Some(s) = req.system.as_ref().filter(|s| !s.is_empty()) {
            turns.push(Message::new("system", s.clone()));
        }
        turns.push(Message::new("user", prompt));
        GenerateRequest::chat(Client::new_request_id(), req.model.clone(), turns)
    };
    req.common.apply(&mut sy)?;
    answer::run(&g, &headers, sy, false, req.common.streams(), admitted).await
}

/// `POST /api/embed`.
#[derive(Debug, Deserialize)]
struct EmbedBody {
    #[serde(default)]
    model: String,
    input: Value,
    truncate: Option<bool>,
    dimensions: Option<u32>,
    options: Option<Map<String, Value>>,
    keep_alive: Option<Value>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

pub async fn embed(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let req: EmbedBody = parse(&body(b)?)?;
    let admitted = g.keys.admit(&headers, g.aliased(&req.model))?;
    unknown(&req.rest, "")?;
    let _ = (&req.options, &req.keep_alive);
    // `truncate`: workers refuse an input over the window, never cut it silently
    // (what `truncate: false` asks; `true`, Ollama's default, is not honoured).
    let _ = req.truncate;
    let inputs: Vec<_> = match &req.input {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) if a.iter().all(Value::is_string) => {
            a.iter().filter_map(Value::as_str).map(str::to_string).collect()
        }
        _ => return Err(refuse("input", "must be a string or a list of strings")),
    };
    if inputs.is_empty() || inputs.iter().any(String::is_empty) {
        return Err(refuse("input", "must hold non-empty strings"));
    }
    let started = std::time::Instant::now();
    let inputs = inputs.into_iter().map(switchyard_messages::EmbedInput::Text).collect();
    let (vectors, _) = super::embed::embed_inputs(&g, &admitted, &req.model, inputs).await?;
    if let Some(d) = req.dimensions {
        if let Some(have) = vectors.first().map(|v| v.0.len()).filter(|&n| n != d as usize) {
            return Err(refuse(
                "dimensions",
                &format!("this model's embeddings have {have}, not {d}"),
            ));
        }
    }
    let tokens: u64 = vectors.iter().map(|v| u64::from(v.1)).sum();
    let embeddings: Vec<Vec<f32>> = vectors.into_iter().map(|v| v.0).collect();
    Ok(axum::Json(json!({
        "model": req.model, "embeddings": embeddings,
        "total_duration": started.elapsed().as_nanos() as u64, "load_duration": 0, "prompt_eval_count": tokens,
    }))
    .into_response())
}

/// `POST /api/embeddings` (Ollama's older endpoint): `{"embedding"}` of `prompt`.
#[derive(Debug, Deserialize)]
struct EmbeddingsBody {
    #[serde(default)]
    model: String,
    prompt: String,
    options: Option<Map<String, Value>>,
    keep_alive: Option<Value>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

pub async fn embeddings(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let req: EmbeddingsBody = parse(&body(b)?)?;
    let admitted = g.keys.admit(&headers, g.aliased(&req.model))?;
    unknown(&req.rest, "")?;
    let _ = (&req.options, &req.keep_alive);
    if req.prompt.is_empty() {
        return Err(refuse("prompt", "must not be empty"));
    }
    let inputs = vec![switchyard_messages::EmbedInput::Text(req.prompt)];
    let (mut vectors, _) = super::embed::embed_inputs(&g, &admitted, &req.model, inputs).await?;
    Ok(axum::Json(json!({"embedding": vectors.pop().map(|v| v.0).unwrap_or_default()})).into_response())
}

/// `pull`, `push`, `create`, `copy`, `delete`, blobs: 501, saying how models get
/// onto a switchyard fleet.
pub async fn not_here(uri: axum::http::Uri) -> OllamaError {
    OllamaError(ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "invalid_request_error",
        "not_implemented",
        format!(
            "{} manages models in Ollama's store; a switchyard fleet serves what its workers load \
             (`switchyard worker --model …`; `switchyard models push` puts a model in the fleet's store)",
            uri.path()
        ),
    ))
}

#[cfg(test)]
mod tests;
