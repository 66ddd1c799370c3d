//! A Responses answer: the response object (`output`: a `reasoning` item with the
//! model's `reasoning_text` when it thought, a `message` item with `output_text`,
//! then a `function_call` item per call), whole or as its events —
//! `response.created`, `response.in_progress`, the reasoning's `output_item.added` /
//! `reasoning_text.delta`… / `.done` / `output_item.done`, the message's
//! `output_item.added` / `content_part.added` / `output_text.delta`… / `.done`s,
//! each call's `output_item.added` / `function_call_arguments.delta` / `.done` /
//! `output_item.done`, then `response.completed` (or `response.incomplete` at
//! `max_output_tokens`), numbered by `sequence_number`. A stored response is in the
//! bucket before the client sees its end, so a follow-up can name it at once.

use super::store::Record;
use super::ResponsesRequest;
use crate::errors::ApiError;
use crate::keys::Admitted;
use crate::metrics::Operation;
use crate::Gateway;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::VecDeque;
use switchyard_client::{GenerateRequest, Message, ResponseStream, StreamEvent};
use switchyard_messages::{FinishReason, GenerateMetrics, ToolCall};
use tracing::Instrument;

/// What every form of one response shares: its id and the request's settings,
/// echoed as OpenAI echoes them.
struct Shape {
    id: String,
    created_at: u64,
    model: String,
    echo: Value,
}

impl Shape {
    fn new(id: String, model: String, r: &ResponsesRequest) -> Self {
        let echo = json!({
            "instructions": r.instructions, "previous_response_id": r.previous_response_id,
            "tools": r.tools.clone().unwrap_or_default(), "tool_choice": r.tool_choice.clone().unwrap_or(json!("auto")),
            "parallel_tool_calls": r.parallel_tool_calls.unwrap_or(true), "temperature": r.temperature,
            "top_p": r.top_p, "max_output_tokens": r.max_output_tokens, "metadata": r.metadata.clone().unwrap_or_default(),
            "text": r.text.clone().unwrap_or(json!({"format": {"type": "text"}})), "store": r.store.unwrap_or(true),
            "truncation": r.truncation.clone().unwrap_or("disabled".into()), "reasoning": r.reasoning,
            "user": r.user, "service_tier": r.service_tier.clone().unwrap_or("default".into()),
        });
        let created_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Self {
            id,
            created_at,
            model,
            echo,
        }
    }

    fn message_id(&self) -> String {
        format!("msg_{}", &self.id[5..])
    }

    fn reasoning_id(&self) -> String {
        format!("rs_{}", &self.id[5..])
    }

    fn reasoning(&self, text: &str, status: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([{"type": "reasoning_text", "text": text}])
        };
        json!({"type": "reasoning", "id": self.reasoning_id(), "status": status, "summary": [], "content": content})
    }

    fn message(&self, text: &str, status: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
        };
        json!({"type": "message", "id": self.message_id(), "status": status, "role": "assistant", "content": content})
    }

    fn call(&self, i: usize, c: &ToolCall, status: &str) -> Value {
        let arguments = if status == "in_progress" {
            ""
        } else {
            c.arguments.as_str()
        };
        json!({"type": "function_call", "id": format!("fc_{}_{i}", &self.id[5..]), "call_id": c.id, "name": c.name,
               "arguments": arguments, "status": status})
    }

    fn output(&self, reasoning: &str, text: &str, calls: &[ToolCall]) -> Vec<Value> {
        let mut out = Vec::new();
        if !reasoning.is_empty() {
            out.push(self.reasoning(reasoning, "completed"));
        }
        if !text.is_empty() || calls.is_empty() {
            out.push(self.message(text, "completed"));
        }
        out.extend(calls.iter().enumerate().map(|(i, c)| self.call(i, c, "completed")));
        out
    }

    /// The response object; `thought`: how many of the output tokens were reasoning.
    fn object(&self, status: &str, output: Vec<Value>, m: Option<&GenerateMetrics>, thought: usize) -> Value {
        let mut v = self.echo.clone();
        let usage = m.map(|m| {
            json!({"input_tokens": m.prompt_tokens, "input_tokens_details": {"cached_tokens": m.cached_tokens},
                   "output_tokens": m.generated_tokens, "output_tokens_details": {"reasoning_tokens": thought},
                   "total_tokens": m.prompt_tokens + m.generated_tokens})
        });
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        for (k, x) in [
            ("id", json!(self.id)),
            ("object", json!("response")),
            ("created_at", json!(self.created_at)),
            ("model", json!(self.model)),
            ("status", json!(status)),
            ("output", json!(output)),
            ("usage", json!(usage)),
            ("incomplete_details", json!(incomplete)),
            ("error", Value::Null),
        ] {
            v[k] = x;
        }
        v
    }
}

fn status(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "incomplete",
        _ => "completed",
    }
}

/// What a finished response leaves in the store.
struct Keep {
    messages: Vec<Message>,
    input: Vec<Value>,
}

impl Keep {
    /// Stores the response (with the conversation through it), before the client
    /// sees it; a store that is not there is logged, not the client's failure.
    async fn put(self, g: &Gateway, id: &str, response: &Value, text: &str, calls: &[ToolCall]) {
        let mut messages = self.messages;
        let mut answer = Message::new("assistant", text.to_string());
        answer.tool_calls = calls.to_vec();
        messages.push(answer);
        let record = Record {
            response: response.clone(),
            messages,
            input: self.input,
        };
        if let Err(e) = g.responses.put(id, &record).await {
            tracing::debug!("response {id} answered but not stored: {}", e.message);
        }
    }
}

pub async fn run(
    g: std::sync::Arc<Gateway>,
    headers: &HeaderMap,
    mut req: GenerateRequest,
    r: &ResponsesRequest,
    items: Vec<Value>,
    admitted: Admitted,
) -> Result<Response, ApiError> {
    let span = tracing::info_span!(
        "gateway",
        otel.name = "POST /v1/responses",
        otel.kind = "server",
        http.request.method = "POST",
        http.route = "/v1/responses",
        switchyard.gateway.key = admitted.name(),
    );
    crate::continue_trace(&span, headers);
    let shape = Shape::new(
        format!("resp_{}", req.head.request_id.replace('-', "")),
        g.answering_model(&req.head.model).await,
        r,
    );
    // The conversation a follow-up continues: without this response's instructions.
    let mut messages = req.messages.clone().unwrap_or_default();
    if r.instructions.as_ref().is_some_and(|i| !i.is_empty()) {
        messages.remove(0);
    }
    let keep = r.stores().then_some(Keep { messages, input: items });
    g.prepare(&mut req, &admitted).await;
    let mut op = Operation::start("chat", &req.head.model);
    let fail = |op: &mut Operation, e: ApiError| {
        op.finish(Some(&e.code));
        e
    };
    let mut s = match g.client.start(g.subjects.chat(), req).instrument(span.clone()).await {
        Ok(s) => s,
        Err(e) => return Err(fail(&mut op, e.into())),
    };
    if !r.stream.unwrap_or(false) {
        let done = match s.collect().instrument(span).await {
            Ok(d) => d,
            Err(e) => return Err(fail(&mut op, e.into())),
        };
        admitted.charge(done.metrics.generated_tokens);
        op.finish(None);
        let output = shape.output(&done.reasoning, &done.text, &done.tool_calls);
        let thought = done.tokens.iter().filter(|t| t.reasoning).count();
        let v = shape.object(status(done.finish_reason), output, Some(&done.metrics), thought);
        if let Some(keep) = keep {
            keep.put(&g, &shape.id, &v, &done.text, &done.tool_calls).await;
        }
        return Ok(axum::Json(v).into_response());
    }
    let first = match crate::first_event(&mut s).instrument(span.clone()).await {
        Ok(ev) => ev,
        Err(e) => return Err(fail(&mut op, e)),
    };
    let begun = shape.object("in_progress", Vec::new(), None, 0);
    let mut state = Events {
        stream: s,
        pending: Some(first),
        queue: VecDeque::new(),
        seq: 0,
        text: String::new(),
        reasoning: String::new(),
        thought: 0,
        items: 0,
        open: None,
        keep,
        shape,
        admitted,
        op,
        over: false,
        _span: span,
    };
    state.push("response.created", json!({"response": begun.clone()}));
    state.push("response.in_progress", json!({"response": begun}));
    let events = futures::stream::unfold((state, g), |(mut s, g)| async move {
        let (name, data) = s.step(&g).await?;
        Some((
            Ok::<_, std::convert::Infallible>(Event::default().event(name).data(data.to_string())),
            (s, g),
        ))
    });
    Ok(Sse::new(events).into_response())
}

/// A streamed response in progress; dropping it cancels the request on its worker.
struct Events {
    stream: ResponseStream,
    pending: Option<StreamEvent>,
    queue: VecDeque<(String, Value)>,
    seq: u64,
    text: String,
    reasoning: String,
    /// Reasoning tokens so far.
    thought: usize,
    /// Output items opened so far (the next one's `output_index`).
    items: usize,
    /// The item still open: reasoning (`true`) or the message.
    open: Option<bool>,
    keep: Option<Keep>,
    shape: Shape,
    admitted: Admitted,
    op: Operation,
    over: bool,
    _span: tracing::Span,
}

impl Events {
    fn push(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.queue.push_back((kind.to_string(), data));
    }

    /// Closes the open item: the reasoning's or the message's `.done` events.
    fn close(&mut self) {
        let Some(reasoning) = self.open.take() else {
            return;
        };
        let index = self.items - 1;
        if reasoning {
            let (item_id, text) = (self.shape.reasoning_id(), self.reasoning.clone());
            self.push(
                "response.reasoning_text.done",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text}),
            );
            let item = self.shape.reasoning(&text, "completed");
            self.push(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            return;
        }
        let (item_id, text) = (self.shape.message_id(), self.text.clone());
        let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
        self.push(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
        );
        self.push(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
        );
        let item = self.shape.message(&text, "completed");
        self.push(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
    }

    /// Adds `delta` to the reasoning item or the message, opening one as needed.
    fn add(&mut self, reasoning: bool, delta: String) {
        if self.open != Some(reasoning) {
            self.close();
            self.open = Some(reasoning);
            let index = self.items;
            self.items += 1;
            if reasoning {
                let item = self.shape.reasoning("", "in_progress");
                self.push(
                    "response.output_item.added",
                    json!({"output_index": index, "item": item}),
                );
            } else {
                let item = self.shape.message("", "in_progress");
                self.push(
                    "response.output_item.added",
                    json!({"output_index": index, "item": item}),
                );
                let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
                let item_id = self.shape.message_id();
                self.push(
                    "response.content_part.added",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
                );
            }
        }
        let index = self.items - 1;
        if reasoning {
            self.reasoning.push_str(&delta);
            let item_id = self.shape.reasoning_id();
            self.push(
                "response.reasoning_text.delta",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": delta}),
            );
        } else {
            self.text.push_str(&delta);
            let item_id = self.shape.message_id();
            self.push(
                "response.output_text.delta",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []}),
            );
        }
    }

    async fn step(&mut self, g: &Gateway) -> Option<(String, Value)> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                return Some(ev);
            }
            if self.over {
                return None;
            }
            let ev = match self.pending.take() {
                Some(ev) => Some(Ok(ev)),
                None => self.stream.next().await,
            };
            match ev {
                Some(Ok(StreamEvent::Tokens(t))) => {
                    self.thought += t.iter().filter(|t| t.reasoning).count();
                    for (reasoning, delta) in crate::reasoning::runs(&t) {
                        self.add(reasoning, delta);
                    }
                }
                Some(Ok(StreamEvent::Done {
                    finish_reason,
                    metrics,
                    tool_calls,
                })) => {
                    self.admitted.charge(metrics.generated_tokens);
                    self.op.finish(None);
                    self.over = true;
                    self.close();
                    for (i, c) in tool_calls.iter().enumerate() {
                        let index = self.items + i;
                        let added = self.shape.call(i, c, "in_progress");
                        let item_id = added["id"].clone();
                        self.push(
                            "response.output_item.added",
                            json!({"output_index": index, "item": added}),
                        );
                        self.push(
                            "response.function_call_arguments.delta",
                            json!({"item_id": item_id, "output_index": index, "delta": c.arguments}),
                        );
                        self.push(
                            "response.function_call_arguments.done",
                            json!({"item_id": item_id, "output_index": index, "arguments": c.arguments, "name": c.name}),
                        );
                        let item = self.shape.call(i, c, "completed");
                        self.push(
                            "response.output_item.done",
                            json!({"output_index": index, "item": item}),
                        );
                    }
                    let output = self.shape.output(&self.reasoning, &self.text, &tool_calls);
                    let state = status(finish_reason);
                    let v = self.shape.object(state, output, Some(&metrics), self.thought);
                    if let Some(keep) = self.keep.take() {
                        keep.put(g, &self.shape.id, &v, &self.text, &tool_calls).await;
                    }
                    let kind = if state == "incomplete" {
                        "response.incomplete"
                    } else {
                        "response.completed"
                    };
                    self.push(kind, json!({"response": v}));
                }
                Some(Err(e)) => {
                    self.over = true;
                    let e = ApiError::from(e);
                    self.op.finish(Some(&e.code));
                    let mut failed = self.shape.object("failed", Vec::new(), None, 0);
                    failed["error"] = json!({"code": e.code, "message": e.message});
                    self.push("error", json!({"code": e.code, "message": e.message, "param": e.param}));
                    self.push("response.failed", json!({"response": failed}));
                }
                None => {
                    self.over = true;
                    return None;
                }
            }
        }
    }
}
