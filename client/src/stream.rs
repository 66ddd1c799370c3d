//! A request's answer as the client reads it: [`ResponseStream`] (ordered chunks,
//! stall detection, cancellation, resuming on another worker), its events and errors.

use async_nats::{StatusCode, Subscriber};
use futures::StreamExt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use switchyard_messages::{
    decode, ErrorCode, FinishReason, GenerateMetrics, GenerateRequest, StreamChunk, Token, WireError,
};

/// What can go wrong for a client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The fleet answered with an error (or the client detected `worker_lost`).
    #[error("{error}")]
    Remote {
        /// The error.
        error: WireError,
        /// Tokens received before the error.
        received: Vec<Token>,
    },
    /// NATS failed.
    #[error("NATS: {0}")]
    Nats(String),
    /// A peer broke the protocol (undecodable chunk, sequence gap).
    #[error("protocol violation: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The wire code, when the fleet (or stall detection) produced one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Remote { error, .. } => Some(error.code),
            _ => None,
        }
    }
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The generated text (without the reasoning, when the request split it).
    pub text: String,
    /// The model's reasoning, split from the answer (a request with
    /// `split_reasoning`; empty otherwise).
    pub reasoning: String,
    /// The generated tokens.
    pub tokens: Vec<Token>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Metrics reported by the worker.
    pub metrics: GenerateMetrics,
    /// The worker that served it.
    pub worker_id: String,
    /// The calls the answer made (a chat that offered tools; `finish_reason` is then
    /// `ToolCalls`).
    pub tool_calls: Vec<switchyard_messages::ToolCall>,
}

/// One step of a response stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// New tokens.
    Tokens(Vec<Token>),
    /// The end.
    Done {
        /// Why it ended.
        finish_reason: FinishReason,
        /// Worker metrics.
        metrics: GenerateMetrics,
        /// The calls the answer made (a chat that offered tools).
        tool_calls: Vec<switchyard_messages::ToolCall>,
    },
}

/// The chunks of one request, in order. Dropping it before the end cancels the
/// request.
pub struct ResponseStream {
    /// The request's client span: it ends when the stream is dropped.
    pub(crate) span: tracing::Span,
    sub: Subscriber,
    nats: async_nats::Client,
    cancel_subject: String,
    /// The cancel's body: names this stream's inbox, which ties it to us.
    cancel_body: bytes::Bytes,
    stall: Duration,
    next_seq: u64,
    pub(crate) finished: bool,
    received: Vec<Token>,
    worker_id: String,
    pending_done: Option<StreamEvent>,
    /// How to resume on another worker if this one is lost (`None`: do not).
    pub(crate) resume: Option<Box<Resume>>,
}

impl ResponseStream {
    /// A stream reading `sub` (the request's inbox), cancellable on `cancel_subject`
    /// with `cancel_body`.
    pub(crate) fn new(
        span: tracing::Span,
        sub: Subscriber,
        nats: async_nats::Client,
        cancel_subject: String,
        cancel_body: bytes::Bytes,
        stall: Duration,
    ) -> Self {
        Self {
            span,
            sub,
            nats,
            cancel_subject,
            cancel_body,
            stall,
            next_seq: 0,
            finished: false,
            received: Vec::new(),
            worker_id: String::new(),
            pending_done: None,
            resume: None,
        }
    }
}

impl ResponseStream {
    /// The next event; `None` after the end. A worker lost mid-stream is resumed on
    /// another one (see the resume section below) unless resuming is off: the caller sees
    /// one uninterrupted stream.
    pub async fn next(&mut self) -> Option<Result<StreamEvent, ClientError>> {
        loop {
            let ev = self.next_chunk().await;
            match after(self, ev).await {
                Next::Deliver(ev) => return ev,
                Next::Resumed => continue,
            }
        }
    }

    /// Turns resuming off for this stream: a lost worker ends it with `worker_lost`.
    pub fn without_resume(mut self) -> Self {
        self.resume = None;
        self
    }

    /// The next event of the current worker's stream.
    async fn next_chunk(&mut self) -> Option<Result<StreamEvent, ClientError>> {
        if let Some(done) = self.pending_done.take() {
            return Some(Ok(done));
        }
        while !self.finished {
            let msg = match tokio::time::timeout(self.stall, self.sub.next()).await {
                Ok(Some(msg)) => msg,
                Ok(None) => return Some(Err(self.end(ClientError::Nats("subscription closed".into())))),
                Err(_) => {
                    let error = WireError::new(
                        ErrorCode::WorkerLost,
                        format!(
                            "no chunk for {} ms after {} chunks (worker {:?})",
                            self.stall.as_millis(),
                            self.next_seq,
                            self.worker_id
                        ),
                    );
                    self.send_cancel();
                    let received = std::mem::take(&mut self.received);
                    return Some(Err(self.end(ClientError::Remote { error, received })));
                }
            };
            if msg.status == Some(StatusCode::NO_RESPONDERS) {
                let error = WireError::new(ErrorCode::NoWorker, format!("nothing listens on {}", msg.subject));
                return Some(Err(self.end(ClientError::Remote {
                    error,
                    received: Vec::new(),
                })));
            }
            let chunk: StreamChunk = match decode(&msg.payload) {
                Ok(c) => c,
                Err(e) => return Some(Err(self.end(ClientError::Protocol(e.to_string())))),
            };
            if chunk.seq != self.next_seq {
                let e = ClientError::Protocol(format!("sequence gap: expected {}, got {}", self.next_seq, chunk.seq));
                return Some(Err(self.end(e)));
            }
            self.next_seq += 1;
            if let Some(w) = &chunk.worker_id {
                self.worker_id = w.clone();
            }
            if let Some(error) = chunk.error {
                let received = std::mem::take(&mut self.received);
                return Some(Err(self.end(ClientError::Remote { error, received })));
            }
            self.received.extend(chunk.tokens.iter().cloned());
            if chunk.done {
                self.finished = true;
                let done = StreamEvent::Done {
                    finish_reason: chunk.finish_reason.unwrap_or(FinishReason::Stop),
                    metrics: chunk.metrics.unwrap_or_default(),
                    tool_calls: chunk.tool_calls,
                };
                if chunk.tokens.is_empty() {
                    return Some(Ok(done));
                }
                // Deliver the tail first; the next call returns Done.
                self.pending_done = Some(done);
                return Some(Ok(StreamEvent::Tokens(chunk.tokens)));
            }
            if !chunk.tokens.is_empty() {
                return Some(Ok(StreamEvent::Tokens(chunk.tokens)));
            }
            // A keep-alive: keep waiting.
        }
        None
    }

    fn end(&mut self, e: ClientError) -> ClientError {
        self.finished = true;
        e
    }

    fn send_cancel(&self) {
        let nats = self.nats.clone();
        let subject = self.cancel_subject.clone();
        let body = self.cancel_body.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = nats.publish(subject, body).await;
                let _ = nats.flush().await;
            });
        }
    }

    /// Asks the worker to stop; the stream then ends with `cancelled`.
    pub async fn cancel(&self) -> Result<(), ClientError> {
        self.nats
            .publish(self.cancel_subject.clone(), self.cancel_body.clone())
            .await
            .map_err(|e| ClientError::Nats(e.to_string()))
    }

    /// The worker serving this request (known after the first chunk).
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Reads the stream to the end.
    pub async fn collect(mut self) -> Result<Completion, ClientError> {
        let mut tokens = Vec::new();
        while let Some(ev) = self.next().await {
            match ev? {
                StreamEvent::Tokens(t) => tokens.extend(t),
                StreamEvent::Done {
                    finish_reason,
                    metrics,
                    tool_calls,
                } => {
                    let pick = |reasoning: bool| {
                        tokens
                            .iter()
                            .filter(|t| t.reasoning == reasoning)
                            .map(|t| t.text.as_str())
                            .collect()
                    };
                    return Ok(Completion {
                        text: pick(false),
                        reasoning: pick(true),
                        tokens,
                        finish_reason,
                        metrics,
                        worker_id: self.worker_id.clone(),
                        tool_calls,
                    });
                }
            }
        }
        Err(ClientError::Protocol("stream ended without a final chunk".into()))
    }
}

impl Drop for ResponseStream {
    fn drop(&mut self) {
        if !self.finished {
            self.send_cancel();
        }
    }
}

// Resumable streams: when the worker serving a stream is lost (`worker_lost`: it
// went silent past the stall limit, or a coordinator saw it go), the client sends
// the request again with the tokens it already received (`resume_tokens`), the
// remaining `max_tokens`, and the sampler's position (`config.rng_position`: one
// draw per token so far). A worker that can resume (the CPU engine) prefills prompt
// and those tokens and generates on: greedy output is the uninterrupted one, and so
// is seeded sampling. The caller sees one stream; the final metrics say how many
// times it was resumed (`resumes`), and so does the client span
// (`switchyard.resumes`). Bounded by `ClientOptions::resume_attempts`; off per
// stream with [`crate::ResponseStream::without_resume`].

/// Sends a request again (to the subject the stream started on) and returns its
/// stream; made by the client that started the stream.
pub(crate) type Restart = Box<
    dyn Fn(GenerateRequest, tracing::Span) -> Pin<Box<dyn Future<Output = Result<ResponseStream, ClientError>> + Send>>
        + Send
        + Sync,
>;

/// What a stream needs to resume.
pub(crate) struct Resume {
    restart: Restart,
    req: GenerateRequest,
    attempts_left: u32,
    /// Tokens delivered to the caller so far (all workers).
    tokens: Vec<Token>,
    resumes: u32,
    /// Why the stream last moved (the lost worker's error), for the error a failed
    /// resume ends with.
    lost: String,
}

impl Resume {
    pub(crate) fn new(restart: Restart, req: GenerateRequest, attempts: u32) -> Self {
        Self {
            restart,
            req,
            attempts_left: attempts,
            tokens: Vec::new(),
            resumes: 0,
            lost: String::new(),
        }
    }
}

/// What to do with an event from the current worker.
pub(crate) enum Next {
    /// Give it to the caller.
    Deliver(Option<Result<StreamEvent, ClientError>>),
    /// The stream moved to another worker: read on.
    Resumed,
}

/// Notes delivered tokens, stamps `resumes` on the final metrics, and turns a
/// `worker_lost` into a resumed stream when it can.
pub(crate) async fn after(s: &mut ResponseStream, ev: Option<Result<StreamEvent, ClientError>>) -> Next {
    let Some(r) = s.resume.as_mut() else {
        return Next::Deliver(ev);
    };
    match ev {
        Some(Ok(StreamEvent::Tokens(t))) => {
            r.tokens.extend(t.iter().cloned());
            Next::Deliver(Some(Ok(StreamEvent::Tokens(t))))
        }
        Some(Ok(StreamEvent::Done {
            finish_reason,
            mut metrics,
            tool_calls,
        })) => {
            metrics.resumes = r.resumes;
            Next::Deliver(Some(Ok(StreamEvent::Done {
                finish_reason,
                metrics,
                tool_calls,
            })))
        }
        // A sequence gap (chunks lost, e.g. while the NATS server restarted): drop
        // the rest of this worker's stream and resume from what arrived in order.
        Some(Err(ClientError::Protocol(m))) if m.starts_with("sequence gap") => {
            s.send_cancel();
            match resume(s).await {
                Ok(()) => Next::Resumed,
                Err(why) => {
                    tracing::debug!("stream not resumed after a gap: {why}");
                    Next::Deliver(Some(Err(ClientError::Protocol(m))))
                }
            }
        }
        Some(Err(ClientError::Remote { error, received })) => {
            let lost = error.code == ErrorCode::WorkerLost;
            if lost {
                if let Some(r) = s.resume.as_mut() {
                    r.lost.clone_from(&error.message);
                }
                match resume(s).await {
                    Ok(()) => return Next::Resumed,
                    Err(why) => tracing::debug!("stream not resumed: {why}"),
                }
            }
            let Some(r) = s.resume.as_ref().filter(|r| r.resumes > 0) else {
                return Next::Deliver(Some(Err(ClientError::Remote { error, received })));
            };
            // A resumed stream that fails is reported as the loss it came from, with
            // every token the caller got.
            let error = if lost {
                error
            } else {
                WireError::new(
                    ErrorCode::WorkerLost,
                    format!(
                        "the stream's worker was lost ({}) and resuming it failed: {}: {}",
                        r.lost, error.code, error.message
                    ),
                )
            };
            Next::Deliver(Some(Err(ClientError::Remote {
                error,
                received: r.tokens.clone(),
            })))
        }
        other => Next::Deliver(other),
    }
}

/// Starts the rest of the stream on another worker and swaps it in.
async fn resume(s: &mut ResponseStream) -> Result<(), String> {
    let span = s.span.clone();
    let Some(r) = s.resume.as_mut() else {
        return Err("resuming is off".into());
    };
    if r.attempts_left == 0 {
        return Err("no resume attempts left".into());
    }
    r.attempts_left -= 1;
    let got = r.tokens.len() as u32;
    let mut req = r.req.clone();
    if got >= req.config.max_tokens {
        return Err("every token was delivered; only the end was lost".into());
    }
    req.config.max_tokens -= got;
    if req.config.temperature > 0.0 {
        req.config.rng_position += u64::from(got);
    }
    req.resume_tokens.extend(r.tokens.iter().map(|t| t.id));
    r.resumes += 1;
    let base: String = r.req.head.request_id.chars().take(120).collect();
    req.head.request_id = format!("{base}-r{}", r.resumes);
    span.record("switchyard.resumes", i64::from(r.resumes));
    tracing::info!(
        request = %r.req.head.request_id,
        tokens = got,
        attempt = r.resumes,
        "worker lost mid-stream; resuming on another worker"
    );
    let mut next = (r.restart)(req, span).await.map_err(|e| e.to_string())?;
    // The old stream has ended (finished), so dropping it sends no cancel.
    let r = s.resume.take();
    std::mem::swap(s, &mut next);
    s.resume = r;
    Ok(())
}
