//! `Client`: send requests to a switchyard fleet over NATS and read the
//! streamed answer, with stall detection and cancellation.

pub use crate::stream::{ClientError, Completion, ResponseStream, StreamEvent};
use async_nats::{HeaderMap, StatusCode};
use futures::StreamExt;
use std::time::Duration;
use switchyard_messages::subjects::HEADER_REQUEST_ID;
use switchyard_messages::{
    decode, encode, BatchReply, BatchRequest, CancelRequest, ClassifyReply, ClassifyRequest, EmbedReply, EmbedRequest,
    ErrorCode, ErrorReply, FleetStatus, GenerateRequest, ModelsReply, Subjects, WireError,
};

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
    /// Times a stream whose worker is lost is resumed on another (0 = never).
    pub resume_attempts: u32,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            prefix: "sy".into(),
            stall_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            compute_timeout: Duration::from_secs(120),
            security: switchyard_config::NatsSecurity::default(),
            resume_attempts: 2,
        }
    }
}

/// A connection to a switchyard fleet.
///
/// ```no_run
/// # async fn demo() -> anyhow::Result<()> {
/// use switchyard_client::{Client, GenerateRequest};
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
        let nats = switchyard_fabric::nats::connect(url, &opts.security, "switchyard-client", Duration::from_secs(5))
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
            switchyard.resumes = tracing::field::Empty,
        );
        let mut stream = self
            .start_encoded(subject.clone(), &req.head.request_id, encode(&req), span)
            .await?;
        if self.opts.resume_attempts > 0 {
            let client = self.clone();
            let restart: crate::stream::Restart = Box::new(move |req, span| {
                let (client, subject) = (client.clone(), subject.clone());
                Box::pin(async move {
                    let id = req.head.request_id.clone();
                    client.start_encoded(subject, &id, encode(&req), span).await
                })
            });
            stream.resume = Some(Box::new(crate::stream::Resume::new(
                restart,
                req,
                self.opts.resume_attempts,
            )));
        }
        Ok(stream)
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
        switchyard_fabric::trace::inject(&span, &mut headers);
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
        Ok(ResponseStream::new(
            span,
            sub,
            self.nats.clone(),
            self.subjects.cancel(request_id),
            cancel_body,
            self.opts.stall_timeout,
        ))
    }

    /// Prefill-only passes over `req.prompts`: the most likely next token (and the
    /// logits if asked) for each, or that prompt's own error.
    pub async fn classify(&self, req: ClassifyRequest) -> Result<ClassifyReply, ClientError> {
        self.unary(self.subjects.classify(), &req.head.request_id, &req).await
    }

    /// (1.7) One embedding per input of `req` (mean-pooled, unit length), or that
    /// input's own error.
    pub async fn embed(&self, req: EmbedRequest) -> Result<EmbedReply, ClientError> {
        self.unary(self.subjects.embed(), &req.head.request_id, &req).await
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
        // While the connection is down a publish would only be buffered and the
        // request would stall: fail now, retryably.
        if self.nats.connection_state() != async_nats::connection::State::Connected {
            return Err(ClientError::Remote {
                error: WireError::new(
                    ErrorCode::Unavailable,
                    "not connected to the NATS server (it is down or being reconnected to); retry shortly",
                ),
                received: Vec::new(),
            });
        }
        let len = switchyard_fabric::nats::message_size(headers, payload);
        if let Err(max) = switchyard_fabric::nats::fits(&self.nats, len) {
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

    /// (1.10) Lists, loads or unloads the LoRA adapters of worker `worker_id` (the
    /// operator's NATS role may; clients may not): its adapters afterwards, or why
    /// the operation failed.
    pub async fn adapters(
        &self,
        worker_id: &str,
        req: switchyard_messages::AdapterRequest,
    ) -> Result<switchyard_messages::AdapterReply, ClientError> {
        let subject = self.subjects.worker(worker_id, "adapters");
        let msg = self
            .ask_on(self.nats.new_inbox(), subject.clone(), None, encode(&req))
            .await?;
        let remote = |error: WireError| ClientError::Remote {
            error,
            received: Vec::new(),
        };
        if msg.status == Some(StatusCode::NO_RESPONDERS) {
            let e = WireError::new(
                ErrorCode::NoWorker,
                format!("no worker {worker_id:?} listens on {subject}"),
            );
            return Err(remote(e));
        }
        let reply: switchyard_messages::AdapterReply =
            decode(&msg.payload).map_err(|e| ClientError::Protocol(e.to_string()))?;
        match reply.error {
            Some(e) => Err(remote(e)),
            None => Ok(reply),
        }
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
