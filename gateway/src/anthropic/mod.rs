//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`),
//! as Claude Code and the Anthropic SDKs call it: the request read into a switchyard
//! chat request — system, text and tool blocks, `tool_choice`, stop sequences,
//! sampling — and the answer written back in Anthropic's shapes ([`answer`]), whole
//! or as its event stream. Errors take Anthropic's shape,
//! `{"type": "error", "error": {"type", "message"}}`.
//!
//! As with OpenAI's fields, everything the API defines is honoured, ignored because
//! it asks nothing of a local answer (`metadata`, `cache_control`, `thinking`,
//! `service_tier`, `speed`, `inference_geo`, …), or refused with a 400 naming it
//! (docs/gateway.md has the table). `temperature`, `top_p` and `top_k`, which the
//! 2026 SDKs no longer send but older clients do, are honoured.

mod answer;

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
use switchyard_messages::{Constraint, Priority, ToolCall, ToolChoice};

/// An error in Anthropic's shape and status: the same status as the OpenAI side,
/// `type` from it (`invalid_request_error`, `authentication_error`,
/// `permission_error`, `not_found_error`, `request_too_large`, `rate_limit_error`,
/// `overloaded_error` for a fleet with no room or no worker, `api_error`).
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl AnthropicError {
    fn kind(&self) -> &'static str {
        match self.0.status {
            StatusCode::BAD_REQUEST | StatusCode::METHOD_NOT_ALLOWED => "invalid_request_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            _ => "api_error",
        }
    }

    /// The body (also a stream's `error` event).
    pub fn body(&self) -> Value {
        json!({"type": "error", "error": {"type": self.kind(), "message": self.0.message}})
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let body = self.body();
        let mut r = self.0.into_response();
        *r.body_mut() = axum::body::Body::from(body.to_string());
        r
    }
}

fn refuse(param: &str, why: &str) -> AnthropicError {
    AnthropicError(ApiError::bad_request(
        Some(param.to_string()),
        format!("{param}: {why}"),
    ))
}

/// `POST /v1/messages`.
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    #[serde(default)]
    pub model: String,
    pub max_tokens: Option<u32>,
    pub messages: Vec<InMessage>,
    pub system: Option<Value>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// `{"format": {"type": "json_schema", "schema"}, "effort"}`: the format is
    /// enforced (a constraint), the effort accepted.
    pub output_config: Option<Value>,
    /// Code-execution containers: refused unless null.
    pub container: Option<Value>,
    /// Thinking on or off: the template's `enable_thinking`.
    pub thinking: Option<Value>,
    // Accepted, asking nothing of a local answer (docs/gateway.md).
    pub metadata: Option<Value>,
    pub service_tier: Option<String>,
    pub cache_control: Option<Value>,
    pub diagnostics: Option<Value>,
    pub inference_geo: Option<Value>,
    pub speed: Option<Value>,
    pub user_profile_id: Option<Value>,
    pub workspace_id: Option<Value>,
    // switchyard's extras, as on the OpenAI side.
    pub backend: Option<String>,
    pub worker: Option<String>,
    pub priority: Option<String>,
    /// A regular expression the answer must match (llguidance's dialect).
    pub regex: Option<String>,
    /// Fields this gateway does not know.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One turn: `content` is a string or a list of blocks.
#[derive(Debug, Deserialize)]
pub struct InMessage {
    pub role: String,
    pub content: Value,
}

/// `POST /v1/messages/count_tokens`: the same fields, less the answer's.
#[derive(Debug, Deserialize)]
pub struct CountRequest {
    #[serde(default)]
    pub model: String,
    pub messages: Vec<InMessage>,
    pub system: Option<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub thinking: Option<Value>,
    pub output_config: Option<Value>,
    // Accepted and ignored, as in MessagesRequest.
    pub cache_control: Option<Value>,
    pub inference_geo: Option<Value>,
    pub speed: Option<Value>,
    pub user_profile_id: Option<Value>,
    pub workspace_id: Option<Value>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// The text of a `system` or `tool_result` content: a string or text blocks.
fn text_of(field: &str, v: &Value) -> Result<String, AnthropicError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for (j, b) in blocks.iter().enumerate() {
                match (
                    b.get("type").and_then(Value::as_str),
                    b.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(t);
                    }
                    (kind, _) => {
                        return Err(refuse(
                            &format!("{field}[{j}].type"),
                            &format!(
                                "{:?} blocks are not supported here (text only)",
                                kind.unwrap_or("untyped")
                            ),
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(refuse(field, "must be a string or a list of text blocks")),
    }
}

/// Turn `i` as chat messages: an assistant turn with its text and `tool_use`
/// calls; a user turn's `tool_result` blocks as tool messages, then its text.
fn turn(i: usize, m: &InMessage, out: &mut Vec<Message>) -> Result<(), AnthropicError> {
    let assistant = match m.role.as_str() {
        "user" => false,
        "assistant" => true,
        other => {
            return Err(refuse(
                &format!("messages[{i}].role"),
                &format!("{other:?} is not user or assistant (the system prompt is the top-level system field)"),
            ))
        }
    };
    let blocks = match &m.content {
        Value::String(s) => {
            out.push(Message::new(&m.role, s.clone()));
            return Ok(());
        }
        Value::Array(b) => b,
        _ => {
            return Err(refuse(
                &format!("messages[{i}].content"),
                "must be a string or a list of blocks",
            ))
        }
    };
    let (mut text, mut calls, mut results) = (String::new(), Vec::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let field = format!("messages[{i}].content[{j}]");
        match (b.get("type").and_then(Value::as_str), assistant) {
            (Some("text"), _) => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or_default()),
            (Some("tool_use"), true) => {
                let (Some(id), Some(name)) = (
                    b.get("id").and_then(Value::as_str),
                    b.get("name").and_then(Value::as_str),
                ) else {
                    return Err(refuse(&field, "a tool_use block needs its id and name"));
                };
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(ToolCall {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments: input.to_string(),
                });
            }
            (Some("tool_result"), false) => {
                let Some(id) = b.get("tool_use_id").and_then(Value::as_str).filter(|s| !s.is_empty()) else {
                    return Err(refuse(&format!("{field}.tool_use_id"), "names the tool_use it answers"));
                };
                let mut content = text_of(&format!("{field}.content"), b.get("content").unwrap_or(&Value::Null))?;
                if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    content = format!("Error: {content}");
                }
                let mut msg = Message::new("tool", content);
                msg.tool_call_id = Some(id.to_string());
                results.push(msg);
            }
            // The model's reasoning from earlier turns is not shown to it again.
            (Some("thinking" | "redacted_thinking"), true) => {}
            (kind, _) => {
                return Err(refuse(
                    &format!("{field}.type"),
                    &format!(
                        "{:?} blocks are not supported in a{} turn (text, {})",
                        kind.unwrap_or("untyped"),
                        if assistant { "n assistant" } else { " user" },
                        if assistant { "tool_use, thinking" } else { "tool_result" }
                    ),
                ))
            }
        }
    }
    if assistant {
        let mut msg = Message::new("assistant", text);
        msg.tool_calls = calls;
        out.push(msg);
    } else {
        out.extend(results);
        if !text.is_empty() {
            out.push(Message::new("user", text));
        }
    }
    Ok(())
}

/// The conversation: the system prompt, then every turn.
fn conversation(system: Option<&Value>, turns: &[InMessage]) -> Result<Vec<Message>, AnthropicError> {
    if turns.is_empty() {
        return Err(refuse("messages", "must not be empty"));
    }
    if turns.last().is_some_and(|m| m.role == "assistant") {
        return Err(refuse(
            "messages",
            "the last turn is the assistant's: continuing a prefilled answer is not supported; end with a user turn",
        ));
    }
    let mut out = Vec::with_capacity(turns.len() + 1);
    let system = text_of("system", system.unwrap_or(&Value::Null))?;
    if !system.is_empty() {
        out.push(Message::new("system", system));
    }
    for (i, m) in turns.iter().enumerate() {
        turn(i, m, &mut out)?;
    }
    Ok(out)
}

/// `tools` and `tool_choice` into `req`.
fn tools(req: &mut GenerateRequest, tools: Option<&[Value]>, choice: Option<&Value>) -> Result<(), AnthropicError> {
    for (i, t) in tools.unwrap_or_default().iter().enumerate() {
        let field = format!("tools[{i}]");
        if let Some(kind) = t.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
            return Err(refuse(
                &format!("{field}.type"),
                &format!(
                    "{kind:?}: Anthropic's server tools are not served here; give custom tools with an input_schema"
                ),
            ));
        }
        req.tools
            .push(crate::structured::function_tool(&field, t, "input_schema", true)?);
    }
    let choice = choice.filter(|c| !c.is_null());
    req.tool_choice = match choice.map(|c| (c.get("type").and_then(Value::as_str), c)) {
        None | Some((Some("auto"), _)) => ToolChoice::Auto,
        Some((Some("any"), _)) => ToolChoice::Required,
        Some((Some("none"), _)) => ToolChoice::None,
        Some((Some("tool"), c)) => match c.get("name").and_then(Value::as_str) {
            Some(name) if req.tools.iter().any(|t| t.name == name) => ToolChoice::Function { name: name.to_string() },
            Some(name) => {
                return Err(refuse(
                    "tool_choice.name",
                    &format!("{name:?} is not among the request's tools"),
                ))
            }
            None => return Err(refuse("tool_choice.name", "is missing")),
        },
        Some(_) => return Err(refuse("tool_choice.type", "must be auto, any, tool or none")),
    };
    crate::structured::check_forced(req)?;
    req.parallel_tool_calls = choice
        .and_then(|c| c.get("disable_parallel_tool_use"))
        .and_then(Value::as_bool)
        != Some(true);
    Ok(())
}

/// Refuses a field this gateway does not know (Anthropic's API refuses them too).
fn unknown(rest: &Map<String, Value>) -> Result<(), AnthropicError> {
    match rest.iter().find(|(_, v)| !v.is_null()) {
        Some((k, _)) => Err(refuse(
            k,
            "not supported by this gateway (docs/gateway.md lists the fields it takes)",
        )),
        None => Ok(()),
    }
}

/// `thinking`: `{"type": "enabled", "budget_tokens"}`, `adaptive` or
/// `between_tools` (thinking on), `disabled` (off): the template's
/// `enable_thinking`; absent, the model thinks as its template does.
fn thinking(v: Option<&Value>) -> Result<Option<bool>, AnthropicError> {
    match v
        .filter(|v| !v.is_null())
        .map(|v| v.get("type").and_then(Value::as_str))
    {
        None => Ok(None),
        Some(Some("enabled" | "adaptive" | "between_tools")) => Ok(Some(true)),
        Some(Some("disabled")) => Ok(Some(false)),
        Some(_) => Err(refuse(
            "thinking.type",
            "must be enabled, disabled, adaptive or between_tools",
        )),
    }
}

/// The template's variables: `enable_thinking` from `thinking`, and
/// `output_config.effort` as `reasoning_effort` (`max` as `xhigh`).
fn template_kwargs(thinks: Option<bool>, output_config: Option<&Value>) -> Result<String, AnthropicError> {
    let effort = output_config
        .and_then(|o| o.get("effort"))
        .and_then(Value::as_str)
        .map(|e| if e == "max" { "xhigh" } else { e });
    Ok(crate::reasoning::Thinking {
        enabled: thinks,
        effort,
        effort_field: "output_config.effort",
        ..Default::default()
    }
    .template_kwargs()?)
}

/// `output_config`: its `format` as the constraint it asks for; `effort` checked.
fn output_config(v: Option<&Value>) -> Result<Option<Constraint>, AnthropicError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    if let Some((k, _)) = v
        .as_object()
        .ok_or_else(|| refuse("output_config", "must be an object"))?
        .iter()
        .find(|(k, x)| !x.is_null() && !matches!(k.as_str(), "format" | "effort"))
    {
        return Err(refuse(&format!("output_config.{k}"), "not supported by this gateway"));
    }
    match v.get("effort").filter(|e| !e.is_null()).map(Value::as_str) {
        None | Some(Some("low" | "medium" | "high" | "xhigh" | "max")) => {}
        Some(_) => {
            return Err(refuse(
                "output_config.effort",
                "must be low, medium, high, xhigh or max",
            ))
        }
    }
    let Some(format) = v.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    if format.get("type").and_then(Value::as_str) != Some("json_schema") {
        return Err(refuse("output_config.format.type", "must be json_schema"));
    }
    match format.get("schema") {
        Some(s) if s.is_object() => Ok(Some(Constraint::JsonSchema { schema: s.to_string() })),
        _ => Err(refuse("output_config.format.schema", "must be a JSON Schema object")),
    }
}

impl MessagesRequest {
    /// The switchyard chat request.
    pub fn to_request(&self) -> Result<GenerateRequest, AnthropicError> {
        unknown(&self.rest)?;
        let thinks = thinking(self.thinking.as_ref())?;
        if self.container.as_ref().is_some_and(|c| !c.is_null()) {
            return Err(refuse("container", "code-execution containers are not served here"));
        }
        let Some(max) = self.max_tokens else {
            return Err(refuse("max_tokens", "is required"));
        };
        if self.temperature.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
            return Err(refuse("temperature", "must be from 0 to 1"));
        }
        if self.top_p.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
            return Err(refuse("top_p", "must be from 0 to 1"));
        }
        let messages = conversation(self.system.as_ref(), &self.messages)?;
        let mut req = GenerateRequest::chat(Client::new_request_id(), self.model.clone(), messages);
        let c = &mut req.config;
        // `max_tokens` is required by the API, so clients send large ones (Claude
        // Code 32000): it is a ceiling, fitted to what the model's window leaves.
        // 0 warms the cache with the prompt and answers nothing: one token is
        // generated and dropped ([`MessagesRequest::prewarm`]).
        c.max_tokens = max.max(1);
        c.fit_max_tokens = true;
        c.constraint = output_config(self.output_config.as_ref())?;
        if let Some(pattern) = self.regex.as_ref() {
            if c.constraint.is_some() {
                return Err(refuse("regex", "cannot be combined with output_config.format"));
            }
            c.constraint = Some(Constraint::Regex {
                pattern: pattern.clone(),
            });
        }
        chat_defaults(c, Some(self.temperature.unwrap_or(1.0)), self.top_k, self.top_p, None);
        c.stop = self.stop_sequences.clone().unwrap_or_default();
        req.head.backend = self.backend.clone().filter(|b| !b.is_empty());
        req.head.worker = self.worker.clone().filter(|w| !w.is_empty());
        req.head.priority = match (self.priority.as_deref(), self.service_tier.as_deref()) {
            (Some(p), _) => {
                Some(Priority::parse(p).ok_or_else(|| refuse("priority", "must be \"interactive\" or \"batch\""))?)
            }
            (None, Some("auto" | "standard_only")) | (None, None) => None,
            (None, Some(_)) => return Err(refuse("service_tier", "must be auto or standard_only")),
        };
        tools(&mut req, self.tools.as_deref(), self.tool_choice.as_ref())?;
        req.chat_template_kwargs = template_kwargs(thinks, self.output_config.as_ref())?;
        req.split_reasoning = true;
        if req.config.constraint.is_some()
            && matches!(req.tool_choice, ToolChoice::Required | ToolChoice::Function { .. })
        {
            return Err(refuse(
                "output_config.format",
                "cannot be combined with tool_choice any or tool",
            ));
        }
        Ok(req)
    }

    /// `max_tokens: 0`: only warm the prompt's KV; the answer is empty.
    fn prewarm(&self) -> bool {
        self.max_tokens == Some(0)
    }

    /// Whether the answer streams.
    fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }
}

/// The body, or a 413/400.
fn body(b: Result<Bytes, BytesRejection>, limit: u32) -> Result<Bytes, AnthropicError> {
    b.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => AnthropicError(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("request body over gateway.max_body_bytes = {limit}"),
        )),
        _ => refuse("body", &format!("unreadable request body: {e}")),
    })
}

fn parse<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, AnthropicError> {
    serde_json::from_slice(b).map_err(|e| refuse("body", &format!("invalid request body: {e}")))
}

/// `POST /v1/messages`.
pub async fn messages(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let req: MessagesRequest = parse(&body(b, g.max_body)?)?;
    let admitted = g.keys.admit(&headers, g.aliased(&req.model))?;
    let sy = req.to_request()?;
    answer::run(&g, &headers, sy, req.streams(), req.prewarm(), admitted).await
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}`, the prompt as the model's
/// template renders it, counted by a worker serving the model (it computes the
/// prompt, one token is generated and dropped; the prompt's KV stays warm for the
/// request that usually follows).
pub async fn count_tokens(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let req: CountRequest = parse(&body(b, g.max_body)?)?;
    let admitted = g.keys.admit(&headers, g.aliased(&req.model))?;
    unknown(&req.rest)?;
    let thinks = thinking(req.thinking.as_ref())?;
    output_config(req.output_config.as_ref())?;
    let messages = conversation(req.system.as_ref(), &req.messages)?;
    let mut sy = GenerateRequest::chat(Client::new_request_id(), req.model.clone(), messages);
    sy.chat_template_kwargs = template_kwargs(thinks, req.output_config.as_ref())?;
    tools(&mut sy, req.tools.as_deref(), req.tool_choice.as_ref())?;
    // Counting needs no forced call: the tools are in the prompt either way.
    if sy.tool_choice != ToolChoice::None {
        sy.tool_choice = ToolChoice::Auto;
    }
    sy.config.max_tokens = 1;
    sy.config.temperature = 0.0;
    let n = answer::count(&g, sy, admitted).await?;
    Ok(axum::Json(json!({"input_tokens": n})).into_response())
}

#[cfg(test)]
mod tests;
