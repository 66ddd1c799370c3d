//! Ollama's answers: whole (one JSON object) or streamed as NDJSON, one object per
//! line — `{"model", "created_at", "message": {"role", "content"}, "done": false}`
//! (chat) or `{…, "response", "done": false}` (generate) per piece of text, a piece
//! with the calls (chat), then `done: true` with `done_reason` and Ollama's counts
//! and durations (nanoseconds). An error after the first line is a line
//! `{"error": "…"}`.

use super::{Common, OllamaError};
use crate::errors::ApiError;
use crate::keys::Admitted;
use crate::metrics::Operation;
use crate::Gateway;
use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use switchyard_client::{GenerateRequest, ResponseStream, StreamEvent};
use switchyard_messages::{FinishReason, GenerateMetrics, Token, ToolCall};
use tracing::Instrument;

/// Now as RFC 3339 in UTC with nanoseconds, as Ollama writes `created_at`.
pub fn timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (days, secs) = ((now.as_secs() / 86_400) as i64, now.as_secs() % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        now.subsec_nanos()
    )
}

/// Ollama's `done_reason`.
fn done_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

/// The counts and durations of a final line.
fn counts(m: &GenerateMetrics) -> Value {
    json!({
        "total_duration": m.total_us * 1000, "load_duration": 0,
        "prompt_eval_count": m.prompt_tokens, "prompt_eval_duration": m.prefill_us * 1000,
        "eval_count": m.generated_tokens, "eval_duration": m.decode_us * 1000,
    })
}

/// Calls in Ollama's shape: arguments as an object.
fn calls(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let arguments = serde_json::from_str::<Value>(&c.arguments).unwrap_or_else(|_| json!({}));
            json!({"id": c.id, "function": {"index": i, "name": c.name, "arguments": arguments}})
        })
        .collect()
}

/// Log-probabilities in Ollama's shape, `[{token, logprob, bytes, top_logprobs}]`.
fn logprobs(tokens: &[Token]) -> Value {
    tokens
        .iter()
        .filter_map(|t| t.logprob.as_ref())
        .map(|lp| {
            let top: Vec<Value> = lp
                .top
                .iter()
                .map(|a| json!({"token": String::from_utf8_lossy(&a.bytes), "logprob": a.logprob, "bytes": a.bytes}))
                .collect();
            json!({"token": String::from_utf8_lossy(&lp.bytes), "logprob": lp.logprob, "bytes": lp.bytes,
                   "top_logprobs": top})
        })
        .collect()
}

/// One object of an answer: `chat` or generate's shape.
struct Shape {
    chat: bool,
    model: String,
    logprobs: bool,
}

impl Shape {
    /// A line (or the whole answer) with `text`, the `thinking` of its tokens (when
    /// any), their log-probabilities (when asked) and `tool_calls`.
    fn piece(&self, text: &str, thinking: &str, tokens: &[Token], tool_calls: &[ToolCall], done: bool) -> Value {
        let mut v = json!({"model": self.model, "created_at": timestamp(), "done": done});
        if self.chat {
            let mut message = json!({"role": "assistant", "content": text});
            if !thinking.is_empty() {
                message["thinking"] = json!(thinking);
            }
            if !tool_calls.is_empty() {
                message["tool_calls"] = calls(tool_calls);
            }
            v["message"] = message;
        } else {
            v["response"] = json!(text);
            if !thinking.is_empty() {
                v["thinking"] = json!(thinking);
            }
        }
        if self.logprobs && !tokens.is_empty() {
            v["logprobs"] = logprobs(tokens);
        }
        v
    }

    fn last(&self, reason: FinishReason, m: &GenerateMetrics) -> Value {
        let mut v = self.piece("", "", &[], &[], true);
        v["done_reason"] = json!(done_reason(reason));
        if let (Value::Object(o), Value::Object(c)) = (&mut v, counts(m)) {
            o.extend(c);
        }
        v
    }
}

/// An answer with no prompt: Ollama loads the model (here: checks some worker
/// serves it) and says so, `done_reason` `load` (or `unload` for `keep_alive: 0`,
/// though workers keep their models).
pub async fn loaded(g: &Gateway, model: &str, chat: bool, common: &Common) -> Result<Response, OllamaError> {
    let reply = g.client.models().await.map_err(ApiError::from)?;
    let target = g.aliased(model);
    if !reply.models.iter().any(|m| m.name == target) {
        return Err(OllamaError(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("model '{model}' not found"),
        )));
    }
    let unload = common
        .keep_alive
        .as_ref()
        .is_some_and(|k| k == &json!(0) || k == &json!("0"));
    let shape = Shape {
        chat,
        model: model.to_string(),
        logprobs: false,
    };
    let mut v = shape.piece("", "", &[], &[], true);
    v["done_reason"] = json!(if unload { "unload" } else { "load" });
    Ok(axum::Json(v).into_response())
}

/// Sends `req` and answers it whole or as NDJSON (once the first tokens are there,
/// so an error before them is an HTTP error in Ollama's shape).
pub async fn run(
    g: &Gateway,
    headers: &HeaderMap,
    mut req: GenerateRequest,
    chat: bool,
    stream: bool,
    admitted: Admitted,
) -> Result<Response, OllamaError> {
    let route = if chat { "/api/chat" } else { "/api/generate" };
    let span = tracing::info_span!(
        "gateway",
        otel.name = %format!("POST {route}"),
        otel.kind = "server",
        http.request.method = "POST",
        http.route = route,
        switchyard.gateway.key = admitted.name(),
    );
    crate::continue_trace(&span, headers);
    let shape = Shape {
        chat,
        model: req.head.model.clone(),
        logprobs: req.config.logprobs.is_some(),
    };
    let subject = if req.messages.is_some() {
        g.subjects.chat()
    } else {
        g.subjects.generate()
    };
    g.prepare(&mut req, &admitted).await;
    let mut op = Operation::start(if chat { "chat" } else { "text_completion" }, &req.head.model);
    let fail = |op: &mut Operation, e: ApiError| {
        op.finish(Some(&e.code));
        OllamaError(e)
    };
    let mut s = match g.client.start(subject, req).instrument(span.clone()).await {
        Ok(s) => s,
        Err(e) => return Err(fail(&mut op, e.into())),
    };
    if !stream {
        let done = match s.collect().instrument(span).await {
            Ok(d) => d,
            Err(e) => return Err(fail(&mut op, e.into())),
        };
        admitted.charge(done.metrics.generated_tokens);
        op.finish(None);
        let mut v = shape.piece(&done.text, &done.reasoning, &done.tokens, &done.tool_calls, true);
        v["done_reason"] = json!(done_reason(done.finish_reason));
        if let (Value::Object(o), Value::Object(c)) = (&mut v, counts(&done.metrics)) {
            o.extend(c);
        }
        return Ok(axum::Json(v).into_response());
    }
    let first = match crate::first_event(&mut s).instrument(span.clone()).await {
        Ok(ev) => ev,
        Err(e) => return Err(fail(&mut op, e)),
    };
    let state = Lines {
        stream: s,
        pending: Some(first),
        queued: None,
        shape,
        admitted,
        op,
        over: false,
        _span: span,
    };
    let lines = futures::stream::unfold(state, |mut s| async move {
        let line = s.step().await?;
        Some((Ok::<_, std::convert::Infallible>(format!("{line}\n")), s))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// A streamed answer in progress; dropping it cancels the request on its worker.
struct Lines {
    stream: ResponseStream,
    pending: Option<StreamEvent>,
    /// A line to send before anything more is read.
    queued: Option<Value>,
    shape: Shape,
    admitted: Admitted,
    op: Operation,
    over: bool,
    _span: tracing::Span,
}

impl Lines {
    /// The next line, `None` at the end.
    async fn step(&mut self) -> Option<Value> {
        loop {
            if let Some(line) = self.queued.take() {
                return Some(line);
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
                    let (thinking, text) = crate::reasoning::split(&t);
                    if !text.is_empty() || !thinking.is_empty() || self.shape.logprobs {
                        return Some(self.shape.piece(&text, &thinking, &t, &[], false));
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
                    let last = self.shape.last(finish_reason, &metrics);
                    if tool_calls.is_empty() {
                        return Some(last);
                    }
                    // The calls on a line of their own, then the last line.
                    self.queued = Some(last);
                    return Some(self.shape.piece("", "", &[], &tool_calls, false));
                }
                Some(Err(e)) => {
                    self.over = true;
                    let e = ApiError::from(e);
                    self.op.finish(Some(&e.code));
                    return Some(json!({"error": e.message}));
                }
                None => {
                    self.over = true;
                    return None;
                }
            }
        }
    }
}
