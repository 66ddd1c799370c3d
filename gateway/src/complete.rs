//! `POST /v1/chat/completions` and `POST /v1/completions`: one switchyard request
//! each, answered whole or streamed as server-sent events.

use super::errors::ApiError;
use super::keys::Admitted;
use super::metrics::Operation;
use super::openai::{parse, ChatRequest, CompletionRequest, Sampling};
use super::structured::calls_json;
use super::Gateway;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::Arc;
use switchyard_client::{GenerateRequest, ResponseStream, StreamEvent};
use switchyard_messages::{FinishReason, GenerateMetrics, Token, ToolCall};
use tracing::Instrument;

/// Which endpoint: the shapes of its answers.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

/// The body, or a 413/400 in OpenAI's shape.
fn body(b: Result<Bytes, BytesRejection>, limit: u32) -> Result<Bytes, ApiError> {
    b.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("request body over gateway.max_body_bytes = {limit}"),
        ),
        _ => ApiError::bad_request(None, format!("unreadable request body: {e}")),
    })
}

pub async fn chat(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = parse(&body(b, g.max_body)?)?;
    let admitted = g.keys.admit(&headers, g.aliased(&req.model))?;
    let sy = req.to_request()?;
    run(&g, &headers, sy, &req.sampling, Kind::Chat, admitted).await
}

pub async fn completion(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse(&body(b, g.max_body)?)?;
    let admitted = g.keys.admit(&headers, g.aliased(&req.model))?;
    let sy = req.to_request()?;
    run(&g, &headers, sy, &req.sampling, Kind::Completion, admitted).await
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// OpenAI's `finish_reason`.
fn finish(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        _ => "stop",
    }
}

fn usage(m: &GenerateMetrics) -> Value {
    json!({
        "prompt_tokens": m.prompt_tokens,
        "completion_tokens": m.generated_tokens,
        "total_tokens": m.prompt_tokens + m.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": m.cached_tokens},
    })
}

/// What every answer of one request shares.
struct Shape {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    /// The request asked for log-probabilities.
    logprobs: bool,
}

/// A token's text as OpenAI shows it: its bytes as UTF-8, a piece of a character
/// replaced by U+FFFD (the exact bytes are in `bytes`).
fn token_str(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Chat's `logprobs` of `tokens`: `{"content": [{token, logprob, bytes,
/// top_logprobs}]}`.
fn chat_logprobs(tokens: &[Token]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .filter_map(|t| t.logprob.as_ref())
        .map(|lp| {
            let top: Vec<Value> = lp
                .top
                .iter()
                .map(|a| json!({"token": token_str(&a.bytes), "logprob": a.logprob, "bytes": a.bytes}))
                .collect();
            json!({"token": token_str(&lp.bytes), "logprob": lp.logprob, "bytes": lp.bytes, "top_logprobs": top})
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions' (legacy) `logprobs` of `tokens`, whose text starts at `offset` of
/// the generated text: `{tokens, token_logprobs, top_logprobs, text_offset}`.
fn completion_logprobs(tokens: &[Token], mut offset: usize) -> Value {
    let (mut strs, mut lps, mut tops, mut offsets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for t in tokens {
        if let Some(lp) = &t.logprob {
            strs.push(token_str(&lp.bytes));
            lps.push(lp.logprob);
            let top: serde_json::Map<String, Value> =
                lp.top.iter().map(|a| (token_str(&a.bytes), json!(a.logprob))).collect();
            tops.push(Value::Object(top));
            offsets.push(offset);
        }
        offset += t.text.len();
    }
    json!({"tokens": strs, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

impl Shape {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// The `logprobs` of a choice or chunk holding `tokens` (`null` unless asked
    /// for); `offset`: where their text starts in the choice's text.
    fn logprobs(&self, tokens: &[Token], offset: usize) -> Value {
        match (self.logprobs, self.kind) {
            (false, _) => Value::Null,
            (true, Kind::Chat) => chat_logprobs(tokens),
            (true, Kind::Completion) => completion_logprobs(tokens, offset),
        }
    }

    /// Choice `index` of a whole answer.
    fn choice(&self, index: usize, done: &switchyard_client::Completion) -> Value {
        let mut choice = self.choice_of(
            index,
            done.text.clone(),
            done.finish_reason,
            &done.tool_calls,
            &done.tokens,
        );
        if !done.reasoning.is_empty() {
            choice["message"]["reasoning_content"] = json!(done.reasoning);
        }
        choice
    }

    fn choice_of(
        &self,
        index: usize,
        text: String,
        reason: FinishReason,
        calls: &[ToolCall],
        tokens: &[Token],
    ) -> Value {
        let logprobs = self.logprobs(tokens, 0);
        match self.kind {
            Kind::Chat if !calls.is_empty() => {
                let content = if text.trim().is_empty() {
                    Value::Null
                } else {
                    json!(text)
                };
                json!({"index": index, "message": {"role": "assistant", "content": content,
                                                   "tool_calls": calls_json(calls)},
                       "finish_reason": finish(reason), "logprobs": logprobs})
            }
            Kind::Chat => json!({"index": index, "message": {"role": "assistant", "content": text},
                                 "finish_reason": finish(reason), "logprobs": logprobs}),
            Kind::Completion => {
                json!({"index": index, "text": text, "finish_reason": finish(reason), "logprobs": logprobs})
            }
        }
    }

    /// A whole answer of `choices`.
    fn whole(&self, choices: Vec<Value>, m: &GenerateMetrics) -> Value {
        json!({"id": self.id, "object": self.object(false), "created": self.created, "model": self.model,
               "choices": choices, "usage": usage(m)})
    }

    /// A streamed chunk of choice `index` carrying `text` (and, at the end, the
    /// finish reason); `logprobs`: those of its tokens, or `null`.
    fn chunk(&self, index: usize, text: Option<&str>, reason: Option<FinishReason>, first: bool) -> Value {
        self.chunk_with(index, text, reason, first, Value::Null)
    }

    fn chunk_with(
        &self,
        index: usize,
        text: Option<&str>,
        reason: Option<FinishReason>,
        first: bool,
        logprobs: Value,
    ) -> Value {
        let reason = reason.map(finish);
        let choice = match self.kind {
            Kind::Chat => {
                let delta = match (first, text) {
                    (true, t) => json!({"role": "assistant", "content": t.unwrap_or("")}),
                    (false, Some(t)) => json!({"content": t}),
                    (false, None) => json!({}),
                };
                json!({"index": index, "delta": delta, "finish_reason": reason, "logprobs": logprobs})
            }
            Kind::Completion => {
                json!({"index": index, "text": text.unwrap_or(""), "finish_reason": reason, "logprobs": logprobs})
            }
        };
        json!({"id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
               "choices": [choice]})
    }

    /// A streamed chunk of choice `choice` carrying its call `index` whole (OpenAI
    /// streams the arguments in pieces; one piece is a valid stream).
    fn call_chunk(&self, choice: usize, index: usize, call: &ToolCall) -> Value {
        let delta = json!({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                           "function": {"name": call.name, "arguments": call.arguments}}]});
        json!({"id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
               "choices": [{"index": choice, "delta": delta, "finish_reason": null, "logprobs": null}]})
    }

    fn usage_chunk(&self, m: &GenerateMetrics) -> Value {
        json!({"id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
               "choices": [], "usage": usage(m)})
    }
}

/// Sends `req` and answers it: whole, or as server-sent events once the first
/// tokens are there (so a refusal or an error before them is a proper HTTP status).
async fn run(
    g: &Gateway,
    headers: &HeaderMap,
    req: GenerateRequest,
    sampling: &Sampling,
    kind: Kind,
    admitted: Admitted,
) -> Result<Response, ApiError> {
    let route = if kind == Kind::Chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let span = tracing::info_span!(
        "gateway",
        otel.name = %format!("POST {route}"),
        otel.kind = "server",
        http.request.method = "POST",
        http.route = route,
        switchyard.gateway.key = admitted.name(),
    );
    super::continue_trace(&span, headers);
    let subject = match kind {
        Kind::Chat => g.subjects.chat(),
        Kind::Completion => g.subjects.generate(),
    };
    let shape = Shape {
        kind,
        id: format!(
            "{}-{}",
            if kind == Kind::Chat { "chatcmpl" } else { "cmpl" },
            req.head.request_id
        ),
        created: now_secs(),
        model: g.answering_model(&req.head.model).await,
        logprobs: req.config.logprobs.is_some(),
    };
    // Fleet queueing: the key is the tenant, its priority the default, and the
    // gateway's queue timeout bounds the wait for a worker.
    let mut req = req;
    g.prepare(&mut req, &admitted).await;
    let mut op = Operation::start(
        if kind == Kind::Chat { "chat" } else { "text_completion" },
        &req.head.model,
    );
    let failed = |op: &mut Operation, e: ApiError| {
        op.finish(Some(&e.code));
        e
    };
    // `n` choices: n requests over the same prompt (a worker computes the prompt
    // once and shares its KV pages; the choices decode in one batch), seeds derived
    // from `seed` so a seeded request is reproducible.
    let n = sampling.n.unwrap_or(1) as usize;
    let requests = (0..n).map(|i| {
        let mut r = req.clone();
        if i > 0 {
            r.head.request_id = switchyard_client::Client::new_request_id();
            r.config.seed = r.config.seed.map(|s| s.wrapping_add(i as u64));
        }
        g.client.start(subject.clone(), r)
    });
    let streams = match futures::future::try_join_all(requests).instrument(span.clone()).await {
        Ok(s) => s,
        Err(e) => return Err(failed(&mut op, e.into())),
    };
    if !sampling.streams() {
        let all = futures::future::join_all(streams.into_iter().map(ResponseStream::collect));
        let mut choices = Vec::with_capacity(n);
        let mut metrics = GenerateMetrics::default();
        for (i, done) in all.instrument(span).await.into_iter().enumerate() {
            let done = match done {
                Ok(d) => d,
                Err(e) => return Err(failed(&mut op, e.into())),
            };
            admitted.charge(done.metrics.generated_tokens);
            add_usage(&mut metrics, &done.metrics, i);
            choices.push(shape.choice(i, &done));
        }
        op.finish(None);
        return Ok(axum::Json(shape.whole(choices, &metrics)).into_response());
    }
    let mut stream: Choices = futures::stream::select_all(streams.into_iter().enumerate().map(|(i, s)| {
        let tagged = futures::stream::unfold(s, move |mut s| async move {
            let ev = s.next().await?;
            Some(((i, ev), s))
        });
        Box::pin(tagged) as ChoiceStream
    }));
    // The first event decides the status: an error before any token is an HTTP error.
    let first = match stream.next().instrument(span.clone()).await {
        Some((i, Ok(ev))) => (i, ev),
        Some((_, Err(e))) => return Err(failed(&mut op, e.into())),
        None => {
            let e = ApiError::new(
                StatusCode::BAD_GATEWAY,
                "api_error",
                "worker_lost",
                "the stream ended at once",
            );
            return Err(failed(&mut op, e));
        }
    };
    let state = Streaming {
        stream,
        pending: Some(first),
        queue: (0..n).map(|i| shape.chunk(i, None, None, true).to_string()).collect(),
        offsets: vec![0; n],
        open: n,
        metrics: GenerateMetrics::default(),
        shape,
        include_usage: sampling.include_usage(),
        admitted,
        op,
        over: false,
        _span: span,
    };
    let events = futures::stream::unfold(state, |mut s| async move {
        let data = s.step().await?;
        Some((Ok::<_, std::convert::Infallible>(Event::default().data(data)), s))
    });
    Ok(Sse::new(events).into_response())
}

/// A streamed answer in progress. Dropping it (the HTTP client went away) drops the
/// [`ResponseStream`], which cancels the request on its worker.
/// The events of the choices' streams, tagged with their choice.
type ChoiceStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = (usize, Result<StreamEvent, switchyard_client::ClientError>)> + Send>>;
type Choices = futures::stream::SelectAll<ChoiceStream>;

/// Adds choice `i`'s usage to `total`: the prompt counts once (OpenAI's usage for
/// `n` choices), the generated tokens of every choice.
fn add_usage(total: &mut GenerateMetrics, m: &GenerateMetrics, i: usize) {
    if i == 0 {
        total.prompt_tokens = m.prompt_tokens;
        total.cached_tokens = m.cached_tokens;
    }
    total.generated_tokens += m.generated_tokens;
}

struct Streaming {
    stream: Choices,
    pending: Option<(usize, StreamEvent)>,
    /// Choices not finished yet.
    open: usize,
    /// Their usage so far.
    metrics: GenerateMetrics,
    /// Events ready to send, before anything more is read.
    queue: VecDeque<String>,
    /// Bytes of text each choice has sent (completions' `text_offset`).
    offsets: Vec<usize>,
    shape: Shape,
    include_usage: bool,
    admitted: Admitted,
    op: Operation,
    /// Nothing more to read.
    over: bool,
    _span: tracing::Span,
}

impl Streaming {
    /// The next SSE `data`, `None` at the end: a first chunk with the role, a chunk
    /// per text, a chunk per tool call, the finish chunk, the usage chunk if asked,
    /// `[DONE]`; or an error event, which ends the stream.
    async fn step(&mut self) -> Option<String> {
        loop {
            if let Some(data) = self.queue.pop_front() {
                return Some(data);
            }
            if self.over {
                return None;
            }
            let ev = match self.pending.take() {
                Some((i, ev)) => Some((i, Ok(ev))),
                None => self.stream.next().await,
            };
            match ev {
                Some((i, Ok(StreamEvent::Tokens(t)))) => {
                    let (reasoning, text) = crate::reasoning::split(&t);
                    // A token that ends inside a character has no text yet, but
                    // its log-probability goes out with it.
                    if !text.is_empty() || !reasoning.is_empty() || self.shape.logprobs {
                        let logprobs = self.shape.logprobs(&t, self.offsets[i]);
                        self.offsets[i] += text.len();
                        let content = (!text.is_empty() || reasoning.is_empty()).then_some(text.as_str());
                        let mut chunk = self.shape.chunk_with(i, content, None, false, logprobs);
                        if !reasoning.is_empty() {
                            chunk["choices"][0]["delta"]["reasoning_content"] = json!(reasoning);
                        }
                        return Some(chunk.to_string());
                    }
                }
                Some((
                    i,
                    Ok(StreamEvent::Done {
                        finish_reason,
                        metrics,
                        tool_calls,
                    }),
                )) => {
                    self.admitted.charge(metrics.generated_tokens);
                    add_usage(&mut self.metrics, &metrics, i);
                    for (c, call) in tool_calls.iter().enumerate() {
                        self.queue.push_back(self.shape.call_chunk(i, c, call).to_string());
                    }
                    self.queue
                        .push_back(self.shape.chunk(i, None, Some(finish_reason), false).to_string());
                    self.open -= 1;
                    if self.open == 0 {
                        self.op.finish(None);
                        self.over = true;
                        if self.include_usage {
                            self.queue.push_back(self.shape.usage_chunk(&self.metrics).to_string());
                        }
                        self.queue.push_back("[DONE]".to_string());
                    }
                }
                Some((_, Err(e))) => {
                    self.over = true;
                    let e = ApiError::from(e);
                    self.op.finish(Some(&e.code));
                    return Some(e.body().to_string());
                }
                None => {
                    self.over = true;
                    return None;
                }
            }
        }
    }
}
