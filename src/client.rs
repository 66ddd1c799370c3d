//! `switchyard::Client`: send requests to a switchyard fleet over NATS and read the
//! streamed answer, with stall detection and cancellation.

use async_nats::{HeaderMap, StatusCode, Subscriber};
use futures::StreamExt;
use std::time::Duration;
use switchyard_messages::subjects::HEADER_REQUEST_ID;
use switchyard_messages::{
    decode, encode, BatchReply, BatchRequest, CancelRequest, ClassifyReply, ClassifyRequest, ErrorCode, ErrorReply,
    FinishReason, FleetStatus, GenerateMetrics, GenerateRequest, ModelsReply, StreamChunk, Subjects, Token, WireError,
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
    /// The generated text.
    pub text: String,
    /// The generated tokens.
    pub tokens: Vec<Token>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Metrics reported by the worker.
    pub metrics: GenerateMetrics,
    /// The worker that served it.
    pub worker_id: String,
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
    },
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Subject prefix.
    pub prefix: String,
    /// A stream with no chunk for this long ends with `worker_lost`.
    pub stall_timeout: Duration,
    /// Timeout for status/models calls.
    pub request_timeout: Duration,
    /// Timeout for one-reply compute calls (classify, batch).
    pub compute_timeout: Duration,
    /// Credentials and TLS for the NATS connection (docs/security.md).
    pub security: switchyard_config::NatsSecurity,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            prefix: "sy".into(),
            stall_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            compute_timeout: Duration::from_secs(120),
            security: switchyard_config::NatsSecurity::default(),
        }
    }
}

/// A connection to a switchyard fleet.
///
/// ```no_run
/// # async fn demo() -> anyhow::Result<()> {
/// use switchyard::{Client, GenerateRequest};
/// let client = Client::connect("nats://127.0.0.1:4222").await?;
/// let mut req = GenerateRequest::generate(Client::new_request_id(), "", "The capital of France is");
/// req.config.max_tokens = 16;
/// let done = client.generate(req).await?.collect().await?;
/// println!("{}", done.text);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) nats: async_nats::Client,
    pub(crate) subjects: Subjects,
    pub(crate) opts: ClientOptions,
}

impl Client {
    /// Connects with default options.
    pub async fn connect(url: &str) -> Result<Self, ClientError> {
        Self::connect_with(url, ClientOptions::default()).await
    }

    /// Connects with `opts`.
    pub async fn connect_with(url: &str, opts: ClientOptions) -> Result<Self, ClientError> {
        let nats = switchyard_actors::nats::connect(url, &opts.security, "switchyard-client", Duration::from_secs(5))
            .await
            .map_err(|e| ClientError::Nats(e.to_string()))?;
        Ok(Self::from_nats(nats, opts))
    }

    /// Wraps an existing NATS connection.
    pub fn from_nats(nats: async_nats::Client, opts: ClientOptions) -> Self {
        Self {
            subjects: Subjects::new(&opts.prefix),
            nats,
            opts,
        }
    }

    /// A fresh request id.
    pub fn new_request_id() -> String {
        nuid::next().to_string()
    }

    /// Starts a generation from `req.prompt`.
    pub async fn generate(&self, req: GenerateRequest) -> Result<ResponseStream, ClientError> {
        self.start(self.subjects.generate(), req).await
    }

    /// Starts a generation from `req.messages`.
    pub async fn chat(&self, req: GenerateRequest) -> Result<ResponseStream, ClientError> {
        self.start(self.subjects.chat(), req).await
    }

    /// Sends `req` to `subject` (a coordinator subject or a worker's endpoint).
    pub async fn start(&self, subject: String, req: GenerateRequest) -> Result<ResponseStream, ClientError> {
        let op = if req.messages.is_some() {
            "chat"
        } else {
            "text_completion"
        };
        let model = if req.head.model.is_empty() {
            "any"
        } else {
            req.head.model.as_str()
        };
        // The client's span is the root of the request's trace; its context travels
        // in the NATS headers to the coordinator and on to the worker.
        let span = tracing::info_span!(
            "gen_ai.client",
            otel.name = %format!("{op} {model}"),
            otel.kind = "client",
            gen_ai.operation.name = op,
            gen_ai.provider.name = "switchyard",
            gen_ai.request.model = %model,
            gen_ai.request.max_tokens = i64::from(req.config.max_tokens),
            switchyard.request.id = %req.head.request_id,
        );
        self.start_encoded(subject, &req.head.request_id, encode(&req), span)
            .await
    }

    /// Sends an encoded streaming request and returns its chunks.
    pub(crate) async fn start_encoded(
        &self,
        subject: String,
        request_id: &str,
        payload: Vec<u8>,
        span: tracing::Span,
    ) -> Result<ResponseStream, ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_REQUEST_ID, request_id);
        switchyard_actors::trace::inject(&span, &mut headers);
        self.fits(&subject, Some(&headers), payload.len())?;
        let inbox = self.nats.new_inbox();
        let sub = self
            .nats
            .subscribe(inbox.clone())
            .await
            .map_err(|e| ClientError::Nats(e.to_string()))?;
        let cancel_body = encode(&CancelRequest::new(inbox.as_str())).into();
        self.nats
            .publish_with_reply_and_headers(subject, inbox, headers, payload.into())
            .await
            .map_err(|e| ClientError::Nats(e.to_string()))?;
        Ok(ResponseStream {
            cancel_body,
            _span: span,
            sub,
            nats: self.nats.clone(),
            cancel_subject: self.subjects.cancel(request_id),
            stall: self.opts.stall_timeout,
            next_seq: 0,
            finished: false,
            received: Vec::new(),
            worker_id: String::new(),
            pending_done: None,
        })
    }

    /// Prefill-only passes over `req.prompts`: the most likely next token (and the
    /// logits if asked) for each, or that prompt's own error.
    pub async fn classify(&self, req: ClassifyRequest) -> Result<ClassifyReply, ClientError> {
        self.unary(self.subjects.classify(), &req.head.request_id, &req).await
    }

    /// Generates for every prompt of `req` with the same settings; each result has its
    /// own tokens or error.
    pub async fn batch(&self, req: BatchRequest) -> Result<BatchReply, ClientError> {
        self.unary(self.subjects.batch(), &req.head.request_id, &req).await
    }

    /// Sends a one-reply request and waits up to `compute_timeout` for the answer.
    async fn unary<Q: serde::Serialize, A: serde::de::DeserializeOwned>(
        &self,
        subject: String,
        request_id: &str,
        req: &Q,
    ) -> Result<A, ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_REQUEST_ID, request_id);
        let remote = |error: WireError| ClientError::Remote {
            error,
            received: Vec::new(),
        };
        let inbox = self.nats.new_inbox();
        let answer = self
            .ask_on(inbox.clone(), subject.clone(), Some(headers), encode(req))
            .await;
        let msg = match answer {
            Err(e) => {
                if matches!(&e, ClientError::Remote { error, .. } if error.code == ErrorCode::WorkerLost) {
                    let body = encode(&CancelRequest::new(inbox));
                    let _ = self.nats.publish(self.subjects.cancel(request_id), body.into()).await;
                }
                return Err(e);
            }
            Ok(msg) => msg,
        };
        if msg.status == Some(StatusCode::NO_RESPONDERS) {
            return Err(remote(WireError::new(
                ErrorCode::NoWorker,
                format!("nothing listens on {subject}"),
            )));
        }
        if let Ok(err) = decode::<ErrorReply>(&msg.payload) {
            return Err(remote(err.error));
        }
        decode(&msg.payload).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// Publishes `payload` to `subject` with a fresh inbox as the reply subject and
    /// waits up to `compute_timeout` for the first answer (a timeout is `worker_lost`).
    pub(crate) async fn ask(
        &self,
        subject: String,
        headers: Option<HeaderMap>,
        payload: Vec<u8>,
    ) -> Result<async_nats::Message, ClientError> {
        self.ask_on(self.nats.new_inbox(), subject, headers, payload).await
    }

    /// [`Client::ask`] with the reply inbox given.
    async fn ask_on(
        &self,
        inbox: String,
        subject: String,
        headers: Option<HeaderMap>,
        payload: Vec<u8>,
    ) -> Result<async_nats::Message, ClientError> {
        self.fits(&subject, headers.as_ref(), payload.len())?;
        let mut sub = self
            .nats
            .subscribe(inbox.clone())
            .await
            .map_err(|e| ClientError::Nats(e.to_string()))?;
        self.nats
            .publish_with_reply_and_headers(subject.clone(), inbox, headers.unwrap_or_default(), payload.into())
            .await
            .map_err(|e| ClientError::Nats(e.to_string()))?;
        match tokio::time::timeout(self.opts.compute_timeout, sub.next()).await {
            Ok(Some(msg)) => Ok(msg),
            Ok(None) => Err(ClientError::Nats("subscription closed".into())),
            Err(_) => {
                let ms = self.opts.compute_timeout.as_millis();
                Err(ClientError::Remote {
                    error: WireError::new(ErrorCode::WorkerLost, format!("no answer on {subject} within {ms} ms")),
                    received: Vec::new(),
                })
            }
        }
    }

    /// Refuses, before sending, a request the NATS server would refuse for exceeding
    /// its `max_payload` (headers and body together).
    fn fits(&self, subject: &str, headers: Option<&HeaderMap>, payload: usize) -> Result<(), ClientError> {
        let len = switchyard_actors::nats::message_size(headers, payload);
        if let Err(max) = switchyard_actors::nats::fits(&self.nats, len) {
            return Err(ClientError::Remote {
                error: WireError::new(
                    ErrorCode::BadRequest,
                    format!(
                        "the request to {subject} is {len} bytes, over the NATS server's max_payload of {max} bytes \
                         (shorten the prompt, or raise max_payload in nats-server's configuration)"
                    ),
                ),
                received: Vec::new(),
            });
        }
        Ok(())
    }

    /// The fleet view from one coordinator.
    pub async fn status(&self) -> Result<FleetStatus, ClientError> {
        self.call(self.subjects.status()).await
    }

    /// Models served by the fleet.
    pub async fn models(&self) -> Result<ModelsReply, ClientError> {
        self.call(self.subjects.models()).await
    }

    async fn call<T: serde::de::DeserializeOwned>(&self, subject: String) -> Result<T, ClientError> {
        let request = async_nats::Request::new().timeout(Some(self.opts.request_timeout));
        let answer = self
            .nats
            .send_request(subject.clone(), request)
            .await
            .map_err(|e| match e.kind() {
                async_nats::RequestErrorKind::NoResponders => ClientError::Remote {
                    error: WireError::new(ErrorCode::NoWorker, format!("no coordinator answers on {subject}")),
                    received: Vec::new(),
                },
                _ => ClientError::Nats(format!("{subject}: {e}")),
            })?;
        if let Ok(err) = decode::<ErrorReply>(&answer.payload) {
            return Err(ClientError::Remote {
                error: err.error,
                received: Vec::new(),
            });
        }
        decode(&answer.payload).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// The underlying NATS connection.
    pub fn nats(&self) -> &async_nats::Client {
        &self.nats
    }
}

/// The chunks of one request, in order. Dropping it before the end cancels the
/// request.
pub struct ResponseStream {
    /// The request's client span: it ends when the stream is dropped.
    _span: tracing::Span,
    sub: Subscriber,
    nats: async_nats::Client,
    cancel_subject: String,
    /// The cancel's body: names this stream's inbox, which ties it to us.
    cancel_body: bytes::Bytes,
    stall: Duration,
    next_seq: u64,
    finished: bool,
    received: Vec<Token>,
    worker_id: String,
    pending_done: Option<StreamEvent>,
}

impl ResponseStream {
    /// The next event; `None` after the end.
    pub async fn next(&mut self) -> Option<Result<StreamEvent, ClientError>> {
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
                StreamEvent::Done { finish_reason, metrics } => {
                    let text = tokens.iter().map(|t| t.text.as_str()).collect();
                    return Ok(Completion {
                        text,
                        tokens,
                        finish_reason,
                        metrics,
                        worker_id: self.worker_id.clone(),
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
