//! OpenAI's Responses API (`POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}`,
//! `GET /v1/responses/{id}/input_items`), as Codex CLI and the OpenAI Agents SDK call
//! it: `input` (text or items: messages, function calls and their outputs),
//! `instructions`, function `tools`, `text.format`, streaming events ([`answer`]),
//! and stored responses continued with `previous_response_id` from any gateway of
//! the fleet ([`store`]: a JetStream key-value bucket).
//!
//! Errors are OpenAI's shape, as on chat completions.

mod answer;
pub mod store;

use super::errors::ApiError;
use super::openai::{chat_defaults, DEFAULT_MAX_TOKENS};
use super::Gateway;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use switchyard_client::{Client, GenerateRequest, Message};
use switchyard_messages::{Priority, ToolCall, ToolChoice};

fn refuse(param: &str, why: &str) -> ApiError {
    ApiError::bad_request(Some(param.to_string()), format!("{param}: {why}"))
}

/// `POST /v1/responses`.
#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    #[serde(default)]
    pub model: String,
    pub input: Option<Value>,
    pub instructions: Option<String>,
    pub previous_response_id: Option<String>,
    pub store: Option<bool>,
    pub stream: Option<bool>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub text: Option<Value>,
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub metadata: Option<Map<String, Value>>,
    pub top_logprobs: Option<u32>,
    pub include: Option<Vec<Value>>,
    pub truncation: Option<String>,
    pub background: Option<bool>,
    /// `{"effort"}`: the template's `reasoning_effort` (`none`: no thinking).
    pub reasoning: Option<Value>,
    /// switchyard's extra: a regular expression the answer must match.
    pub regex: Option<String>,
    // Accepted, asking nothing of a local answer (docs/gateway.md).
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub prompt_cache_retention: Option<Value>,
    pub service_tier: Option<String>,
    pub stream_options: Option<Value>,
    pub max_tool_calls: Option<u32>,
    /// Fields this gateway does not know (and `conversation`, `prompt`: refused).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// The text of an input message's `content`: a string or `input_text` /
/// `output_text` parts.
fn content_text(field: &str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(refuse(
                            &format!("{field}[{j}].type"),
                            &format!("{:?} is not supported (text only)", kind.unwrap_or("untyped")),
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(refuse(field, "must be a string or a list of text parts")),
    }
}

/// `input` as chat turns, appended to `out`: a string is a user turn; items are
/// messages, `function_call`s (joined to the assistant turn they follow) and
/// `function_call_output`s (tool turns). Earlier `reasoning` items are dropped.
fn input_turns(input: &Value, out: &mut Vec<Message>) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(s) => {
            out.push(Message::new("user", s.clone()));
            return Ok(vec![
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": s}]}),
            ]);
        }
        Value::Array(items) => items,
        _ => return Err(refuse("input", "must be a string or a list of items")),
    };
    for (i, item) in items.iter().enumerate() {
        let field = format!("input[{i}]");
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            None | Some("message") => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("system" | "developer") => "system",
                    Some(r @ ("user" | "assistant")) => r,
                    other => {
                        return Err(refuse(
                            &format!("{field}.role"),
                            &format!("{other:?} is not user, assistant, system or developer"),
                        ))
                    }
                };
                let text = content_text(&format!("{field}.content"), item.get("content").unwrap_or(&Value::Null))?;
                out.push(Message::new(role, text));
            }
            Some("function_call") => {
                let (Some(call_id), Some(name)) = (
                    item.get("call_id").and_then(Value::as_str),
                    item.get("name").and_then(Value::as_str),
                ) else {
                    return Err(refuse(&field, "a function_call needs its call_id and name"));
                };
                let call = ToolCall {
                    id: call_id.to_string(),
                    name: name.to_string(),
                    arguments: item
                        .get("arguments")
                        .and_then(Value::as_str)
                        .unwrap_or("{}")
                        .to_string(),
                };
                match out.last_mut() {
                    Some(m) if m.role == "assistant" => m.tool_calls.push(call),
                    _ => {
                        let mut m = Message::new("assistant", String::new());
                        m.tool_calls.push(call);
                        out.push(m);
                    }
                }
            }
            Some("function_call_output") => {
                let Some(call_id) = item.get("call_id").and_then(Value::as_str) else {
                    return Err(refuse(&format!("{field}.call_id"), "is missing"));
                };
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(&format!("{field}.output"), v)?,
                    _ => return Err(refuse(&format!("{field}.output"), "must be a string")),
                };
                let mut m = Message::new("tool", output);
                m.tool_call_id = Some(call_id.to_string());
                out.push(m);
            }
            Some("reasoning") => {}
            Some(other) => {
                return Err(refuse(
                    &format!("{field}.type"),
                    &format!("{other:?} items are not supported (message, function_call, function_call_output)"),
                ))
            }
        }
    }
    Ok(items.clone())
}

/// `tools`, `tool_choice` and `parallel_tool_calls` into `req`.
fn tools(req: &mut GenerateRequest, r: &ResponsesRequest) -> Result<(), ApiError> {
    for (i, t) in r.tools.iter().flatten().enumerate() {
        let field = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                return Err(refuse(
                    &format!("{field}.type"),
                    &format!("{other:?}: only function tools are served here (no hosted tools)"),
                ))
            }
        }
        req.tools
            .push(crate::structured::function_tool(&field, t, "parameters", false)?);
    }
    req.tool_choice = match r.tool_choice.as_ref() {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(refuse(
                    "tool_choice",
                    &format!("{other:?} is not auto, none or required"),
                ))
            }
        },
        Some(v) => match (
            v.get("type").and_then(Value::as_str),
            v.get("name").and_then(Value::as_str),
        ) {
            (Some("function"), Some(name)) if req.tools.iter().any(|t| t.name == name) => {
                ToolChoice::Function { name: name.to_string() }
            }
            (Some("function"), _) => return Err(refuse("tool_choice.name", "must name one of the request's tools")),
            _ => {
                return Err(refuse(
                    "tool_choice",
                    "must be auto, none, required or {\"type\": \"function\", \"name\"}",
                ))
            }
        },
    };
    crate::structured::check_forced(req)?;
    req.parallel_tool_calls = r.parallel_tool_calls.unwrap_or(true);
    Ok(())
}

/// `text.format` as a constraint (`text.verbosity` accepted).
fn text_format(text: Option<&Value>) -> Result<Option<switchyard_messages::Constraint>, ApiError> {
    let Some(format) = text.and_then(|t| t.get("format")).filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(switchyard_messages::Constraint::JsonObject)),
        Some("json_schema") => match format.get("schema") {
            Some(s) if s.is_object() => Ok(Some(switchyard_messages::Constraint::JsonSchema {
                schema: s.to_string(),
            })),
            _ => Err(refuse("text.format.schema", "must be a JSON Schema object")),
        },
        _ => Err(refuse("text.format.type", "must be text, json_object or json_schema")),
    }
}

impl ResponsesRequest {
    fn check(&self) -> Result<(), ApiError> {
        if let Some((k, _)) = self.rest.iter().find(|(_, v)| !v.is_null()) {
            return Err(refuse(
                k,
                "not supported by this gateway (docs/gateway.md lists the fields it takes)",
            ));
        }
        if self.background == Some(true) {
            return Err(refuse("background", "background responses are not supported"));
        }
        // Codex asks for its reasoning items' encrypted content (to pass them back
        // statelessly); a local model's reasoning has none, and earlier reasoning
        // items are dropped from the input anyway.
        if self
            .include
            .iter()
            .flatten()
            .any(|i| i != "reasoning.encrypted_content")
        {
            return Err(refuse(
                "include",
                "nothing extra can be included (reasoning.encrypted_content is accepted: there is none)",
            ));
        }
        if self.top_logprobs.is_some_and(|n| n > 0) {
            return Err(refuse(
                "top_logprobs",
                "log-probabilities are not served on /v1/responses",
            ));
        }
        if !matches!(self.truncation.as_deref(), None | Some("disabled" | "auto")) {
            return Err(refuse("truncation", "must be disabled or auto"));
        }
        if self.max_output_tokens == Some(0) {
            return Err(refuse("max_output_tokens", "must be at least 1"));
        }
        Ok(())
    }

    /// Whether the response is kept (OpenAI's default: yes).
    fn stores(&self) -> bool {
        self.store.unwrap_or(true)
    }

    /// The chat request for `history` (the stored conversation this continues)
    /// plus this request's input; and the input items as given.
    fn to_request(&self, history: Vec<Message>) -> Result<(GenerateRequest, Vec<Value>), ApiError> {
        self.check()?;
        let mut messages = Vec::new();
        if let Some(i) = self.instructions.as_ref().filter(|i| !i.is_empty()) {
            messages.push(Message::new("system", i.clone()));
        }
        messages.extend(history);
        let items = match &self.input {
            Some(input) => input_turns(input, &mut messages)?,
            None => Vec::new(),
        };
        if !messages.iter().any(|m| m.role != "system") {
            return Err(refuse("input", "is required (a string or items)"));
        }
        let mut req = GenerateRequest::chat(Client::new_request_id(), self.model.clone(), messages);
        let c = &mut req.config;
        c.max_tokens = self.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        c.fit_max_tokens = self.max_output_tokens.is_none();
        chat_defaults(c, self.temperature, None, self.top_p, None);
        c.constraint = text_format(self.text.as_ref())?;
        if let Some(pattern) = self.regex.as_ref() {
            if c.constraint.is_some() {
                return Err(refuse("regex", "cannot be combined with a text.format other than text"));
            }
            c.constraint = Some(switchyard_messages::Constraint::Regex {
                pattern: pattern.clone(),
            });
        }
        req.head.priority = match self.service_tier.as_deref() {
            Some("flex") => Some(Priority::Batch),
            _ => None,
        };
        tools(&mut req, self)?;
        // `reasoning.effort`: the template's `reasoning_effort` (`none`: thinking
        // off); the answer's reasoning comes back as a `reasoning` item.
        let effort = match self.reasoning.as_ref().and_then(|r| r.get("effort")) {
            None | Some(Value::Null) => None,
            Some(Value::String(e)) => Some(e.as_str()),
            Some(_) => return Err(refuse("reasoning.effort", "must be a string")),
        };
        req.chat_template_kwargs = crate::reasoning::Thinking {
            effort,
            effort_field: "reasoning.effort",
            ..Default::default()
        }
        .template_kwargs()?;
        req.split_reasoning = true;
        Ok((req, items))
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "response_not_found",
        format!("no stored response {id:?} (never stored, deleted, or older than gateway.responses_max_age_s)"),
    )
}

/// `POST /v1/responses`.
pub async fn create(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let b = b.map_err(|e| ApiError::bad_request(None, format!("unreadable request body: {e}")))?;
    let req: ResponsesRequest = super::openai::parse(&b)?;
    let admitted = g.keys.admit(&headers, g.aliased(&req.model))?;
    let history = match req.previous_response_id.as_deref().filter(|p| !p.is_empty()) {
        None => Vec::new(),
        Some(id) => g.responses.get(id).await?.ok_or_else(|| not_found(id))?.messages,
    };
    let (sy, items) = req.to_request(history)?;
    answer::run(g.clone(), &headers, sy, &req, items, admitted).await
}

/// `GET /v1/responses/{id}`: a stored response.
pub async fn get(
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    g.admit_listing(&headers)?;
    let record = g.responses.get(&id).await?.ok_or_else(|| not_found(&id))?;
    Ok(axum::Json(record.response).into_response())
}

/// `GET /v1/responses/{id}/input_items`: the items a stored response was given.
pub async fn input_items(
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    g.admit_listing(&headers)?;
    let record = g.responses.get(&id).await?.ok_or_else(|| not_found(&id))?;
    let data: Vec<Value> = record
        .input
        .into_iter()
        .enumerate()
        .map(|(i, mut item)| {
            if item.get("id").is_none() {
                item["id"] = json!(format!("{id}_in{i}"));
            }
            item
        })
        .collect();
    Ok(axum::Json(
        json!({"object": "list", "data": data, "first_id": data.first().map(|d| d["id"].clone()),
                         "last_id": data.last().map(|d| d["id"].clone()), "has_more": false}),
    )
    .into_response())
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(g): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    g.admit_listing(&headers)?;
    if !g.responses.delete(&id).await? {
        return Err(not_found(&id));
    }
    Ok(axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response())
}
