//! A Messages answer in Anthropic's shapes: whole (`{"type": "message", "content":
//! [thinking, text, tool_use…], "stop_reason", "usage"}`) or as its event stream
//! (`message_start`, `ping`, per block `content_block_start` / `_delta` / `_stop`
//! with its index, `message_delta` with the stop reason and usage, `message_stop`).

use super::AnthropicError;
use crate::errors::ApiError;
use crate::keys::Admitted;
use crate::metrics::Operation;
use crate::Gateway;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::VecDeque;
use switchyard_client::{GenerateRequest, ResponseStream, StreamEvent};
use switchyard_messages::{FinishReason, GenerateMetrics, ToolCall};
use tracing::Instrument;

/// Anthropic's `stop_reason`.
/// Anthropic's `stop_reason` and `stop_sequence` (the stop string that matched).
fn stop_reason(reason: FinishReason, m: &GenerateMetrics) -> (&'static str, Option<&str>) {
    match reason {
        FinishReason::Length => ("max_tokens", None),
        FinishReason::ToolCalls => ("tool_use", None),
        _ => match m.stop_sequence.as_deref() {
            Some(s) => ("stop_sequence", Some(s)),
            None => ("end_turn", None),
        },
    }
}

/// Anthropic's `usage`: `input_tokens` are the prompt tokens computed for this
/// request, `cache_read_input_tokens` those reused from KV a worker held.
fn usage(m: &GenerateMetrics) -> Value {
    json!({
        "input_tokens": m.prompt_tokens.saturating_sub(m.cached_tokens),
        "cache_read_input_tokens": m.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": m.generated_tokens,
    })
}

/// A call as a `tool_use` block (its arguments parsed; the worker checked they are
/// JSON, an object when the tool has a schema).
fn tool_use(call: &ToolCall, input: bool) -> Value {
    let parsed = serde_json::from_str::<Value>(&call.arguments).unwrap_or_else(|_| json!({}));
    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": if input { parsed } else { json!({}) }})
}

/// Sends `req` and answers it, whole or as events once the first tokens are there
/// (an error before them is an HTTP error in Anthropic's shape).
pub async fn run(
    g: &Gateway,
    headers: &HeaderMap,
    req: GenerateRequest,
    stream: bool,
    prewarm: bool,
    admitted: Admitted,
) -> Result<Response, AnthropicError> {
    let span = tracing::info_span!(
        "gateway",
        otel.name = "POST /v1/messages",
        otel.kind = "server",
        http.request.method = "POST",
        http.route = "/v1/messages",
        switchyard.gateway.key = admitted.name(),
    );
    crate::continue_trace(&span, headers);
    let id = format!("msg_{}", req.head.request_id);
    let model = g.answering_model(&req.head.model).await;
    let mut op = Operation::start("chat", &req.head.model);
    let started = start(g, req, &admitted).instrument(span.clone()).await;
    let mut s = match started {
        Ok(s) => s,
        Err(e) => {
            op.finish(Some(&e.code));
            return Err(e.into());
        }
    };
    if !stream || prewarm {
        let mut done = match s.collect().instrument(span).await {
            Ok(d) => d,
            Err(e) => {
                let e = ApiError::from(e);
                op.finish(Some(&e.code));
                return Err(e.into());
            }
        };
        admitted.charge(done.metrics.generated_tokens);
        op.finish(None);
        if prewarm {
            // The prompt is warm; the token computed to get there is not an answer.
            done.text.clear();
            done.tool_calls.clear();
            done.metrics.generated_tokens = 0;
            done.finish_reason = FinishReason::Length;
        }
        if stream {
            return Ok(prewarmed_events(&id, &model, &done.metrics));
        }
        let mut content = Vec::new();
        if !done.reasoning.is_empty() && !prewarm {
            // A local model's thinking carries no signature to verify.
            content.push(json!({"type": "thinking", "thinking": done.reasoning, "signature": ""}));
        }
        if !done.text.is_empty() {
            content.push(json!({"type": "text", "text": done.text}));
        }
        content.extend(done.tool_calls.iter().map(|c| tool_use(c, true)));
        let (reason, stop) = stop_reason(done.finish_reason, &done.metrics);
        return Ok(axum::Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": stop, "usage": usage(&done.metrics),
        }))
        .into_response());
    }
    // The first event decides the status.
    let first = match crate::first_event(&mut s).instrument(span.clone()).await {
        Ok(ev) => ev,
        Err(e) => {
            op.finish(Some(&e.code));
            return Err(e.into());
        }
    };
    let start = json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 0, "output_tokens": 0}}});
    let state = Streaming {
        stream: s,
        pending: Some(first),
        queue: VecDeque::from([("message_start", start), ("ping", json!({"type": "ping"}))]),
        blocks: 0,
        open: None,
        admitted,
        op,
        over: false,
        _span: span,
    };
    let events = futures::stream::unfold(state, |mut s| async move {
        let (name, data) = s.step().await?;
        Some((
            Ok::<_, std::convert::Infallible>(Event::default().event(name).data(data.to_string())),
            s,
        ))
    });
    Ok(Sse::new(events).into_response())
}

/// The events of a `max_tokens: 0` answer: no content, stopped at `max_tokens`.
fn prewarmed_events(id: &str, model: &str, m: &GenerateMetrics) -> Response {
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}}}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                   "usage": usage(m)}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]
    .map(|(name, data)| Ok::<_, std::convert::Infallible>(Event::default().event(name).data(data.to_string())));
    Sse::new(futures::stream::iter(events)).into_response()
}

/// Starts `req` on the fleet as the gateway's chat requests start (aliases,
/// adapters, the key as tenant, the queue timeout).
async fn start(g: &Gateway, mut req: GenerateRequest, admitted: &Admitted) -> Result<ResponseStream, ApiError> {
    g.prepare(&mut req, admitted).await;
    Ok(g.client.start(g.subjects.chat(), req).await?)
}

/// The prompt tokens of `req` (a one-token greedy request).
pub async fn count(g: &Gateway, req: GenerateRequest, admitted: Admitted) -> Result<u32, AnthropicError> {
    let done = start(g, req, &admitted)
        .await?
        .collect()
        .await
        .map_err(ApiError::from)?;
    admitted.charge(done.metrics.generated_tokens);
    Ok(done.metrics.prompt_tokens)
}

/// A streamed answer in progress; dropping it (the client went away) cancels the
/// request on its worker.
struct Streaming {
    stream: ResponseStream,
    pending: Option<StreamEvent>,
    /// Events ready to send, before anything more is read.
    queue: VecDeque<(&'static str, Value)>,
    /// Content blocks opened so far (the next one's index).
    blocks: usize,
    /// The last block, still open: thinking (`true`) or text.
    open: Option<bool>,
    admitted: Admitted,
    op: Operation,
    over: bool,
    _span: tracing::Span,
}

impl Streaming {
    /// Closes the open block (a thinking block with its empty signature).
    fn close_block(&mut self) {
        let Some(thinking) = self.open.take() else {
            return;
        };
        let index = self.blocks - 1;
        if thinking {
            self.queue.push_back((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "signature_delta", "signature": ""}}),
            ));
        }
        self.queue.push_back((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }

    /// Adds `text` to a thinking or text block, opening one as needed.
    fn add(&mut self, thinking: bool, text: String) {
        if self.open != Some(thinking) {
            self.close_block();
            self.open = Some(thinking);
            let block = if thinking {
                json!({"type": "thinking", "thinking": "", "signature": ""})
            } else {
                json!({"type": "text", "text": ""})
            };
            self.queue.push_back((
                "content_block_start",
                json!({"type": "content_block_start", "index": self.blocks, "content_block": block}),
            ));
            self.blocks += 1;
        }
        let delta = if thinking {
            json!({"type": "thinking_delta", "thinking": text})
        } else {
            json!({"type": "text_delta", "text": text})
        };
        self.queue.push_back((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}),
        ));
    }

    /// The next event (name and data), `None` at the end.
    async fn step(&mut self) -> Option<(&'static str, Value)> {
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
                    for (thinking, text) in crate::reasoning::runs(&t) {
                        self.add(thinking, text);
                    }
                }
                Some(Ok(StreamEvent::Done {
                    finish_reason,
                    metrics,
                    tool_calls,
                })) => {
                    self.admitted.charge(metrics.generated_tokens);
                    self.close_block();
                    for call in &tool_calls {
                        let index = self.blocks;
                        self.blocks += 1;
                        self.queue.extend([
                            (
                                "content_block_start",
                                json!({"type": "content_block_start", "index": index,
                                       "content_block": tool_use(call, false)}),
                            ),
                            (
                                "content_block_delta",
                                json!({"type": "content_block_delta", "index": index,
                                       "delta": {"type": "input_json_delta", "partial_json": call.arguments}}),
                            ),
                            (
                                "content_block_stop",
                                json!({"type": "content_block_stop", "index": index}),
                            ),
                        ]);
                    }
                    let (reason, stop) = stop_reason(finish_reason, &metrics);
                    self.queue.push_back((
                        "message_delta",
                        json!({"type": "message_delta",
                               "delta": {"stop_reason": reason, "stop_sequence": stop},
                               "usage": usage(&metrics)}),
                    ));
                    self.queue.push_back(("message_stop", json!({"type": "message_stop"})));
                    self.op.finish(None);
                    self.over = true;
                }
                Some(Err(e)) => {
                    self.over = true;
                    let e = ApiError::from(e);
                    self.op.finish(Some(&e.code));
                    return Some(("error", AnthropicError(e).body()));
                }
                None => {
                    self.over = true;
                    return None;
                }
            }
        }
    }
}
