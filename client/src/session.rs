//! The client side of sessions: open one through a coordinator, then
//! talk to its worker directly on `{p}.v1.session.{sid}.*`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), switchyard_client::ClientError> {
//! use switchyard_client::Client;
//! use switchyard_messages::session::{ContextManifest, OpenSessionRequest};
//! let client = Client::connect("nats://127.0.0.1:4222").await?;
//! let session = client.open_session(OpenSessionRequest::new("my-instance", "")).await?;
//! let manifest = ContextManifest { profile: "coder".into(), ..ContextManifest::default() };
//! let status = session.ensure_prefix("You are a careful reviewer.\n", &manifest).await?;
//! println!("reused {} tokens", status.reused_tokens);
//! session.prefill_suffix("Review: fn main() {}\n", &manifest).await?;
//! let answer = session.decode(Default::default()).await?.collect().await?;
//! println!("{}", answer.text);
//! session.close().await?;
//! # Ok(()) }
//! ```

use crate::client::{Client, ClientError, ResponseStream};
use async_nats::StatusCode;
use switchyard_messages::session::{
    ContextManifest, ContextReport, DecodeRequest, OpenSessionRequest, PrefixStatus, SegmentRequest, SessionCall,
    SessionModelInfo, SessionOpened, SuffixStatus,
};
use switchyard_messages::{decode, encode, ErrorCode, ErrorReply, GenerateConfig, WireError, PROTOCOL_VERSION};

/// An open session.
#[derive(Clone)]
pub struct Session {
    client: Client,
    fence: String,
    /// What the worker said when it opened the session.
    pub opened: SessionOpened,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.opened.session_id)
            .field("worker_id", &self.opened.worker_id)
            .field("fence", &self.fence)
            .finish()
    }
}

fn remote(error: WireError) -> ClientError {
    ClientError::Remote {
        error,
        received: Vec::new(),
    }
}

impl Client {
    /// Opens a session through a coordinator (which picks the worker).
    pub async fn open_session(&self, mut req: OpenSessionRequest) -> Result<Session, ClientError> {
        req.v = PROTOCOL_VERSION;
        let fence = req.fence.clone();
        let subject = self.subjects.session_open();
        let opened: SessionOpened = self.session_request(subject, encode(&req), ErrorCode::NoWorker).await?;
        Ok(Session {
            client: self.clone(),
            fence,
            opened,
        })
    }

    /// One request/reply; "no responders" becomes `missing`.
    async fn session_request<T: serde::de::DeserializeOwned>(
        &self,
        subject: String,
        payload: Vec<u8>,
        missing: ErrorCode,
    ) -> Result<T, ClientError> {
        let msg = self.ask(subject.clone(), None, payload).await?;
        if msg.status == Some(StatusCode::NO_RESPONDERS) {
            let what = match missing {
                ErrorCode::SessionClosed => {
                    format!("nothing answers on {subject}: the session is closed, expired or its worker stopped")
                }
                _ => format!("nothing listens on {subject}"),
            };
            return Err(remote(WireError::new(missing, what)));
        }
        if let Ok(err) = decode::<ErrorReply>(&msg.payload) {
            return Err(remote(err.error));
        }
        decode(&msg.payload).map_err(|e| ClientError::Protocol(e.to_string()))
    }
}

impl Session {
    /// The session id.
    pub fn id(&self) -> &str {
        &self.opened.session_id
    }

    /// This session as seen by another owner (`fence`): for tests of fencing, and
    /// for a process that takes a session over by id.
    pub fn with_fence(&self, fence: &str) -> Session {
        Session {
            fence: fence.to_string(),
            ..self.clone()
        }
    }

    async fn call<T: serde::de::DeserializeOwned>(&self, verb: &str, payload: Vec<u8>) -> Result<T, ClientError> {
        let subject = self.client.subjects.session(self.id(), verb);
        self.client
            .session_request(subject, payload, ErrorCode::SessionClosed)
            .await
    }

    fn segment(&self, text: &str, manifest: &ContextManifest) -> Vec<u8> {
        encode(&SegmentRequest {
            v: PROTOCOL_VERSION,
            fence: self.fence.clone(),
            text: text.to_string(),
            manifest: manifest.clone(),
        })
    }

    fn plain(&self) -> Vec<u8> {
        encode(&SessionCall {
            v: PROTOCOL_VERSION,
            fence: self.fence.clone(),
        })
    }

    /// Makes the resident context equal `prefix`, reusing what is resident under the
    /// same manifest and prefilling only the divergent tail.
    pub async fn ensure_prefix(&self, prefix: &str, manifest: &ContextManifest) -> Result<PrefixStatus, ClientError> {
        self.call("ensure_prefix", self.segment(prefix, manifest)).await
    }

    /// Prefills `suffix` after the stable prefix (replacing any earlier suffix and
    /// generated tokens).
    pub async fn prefill_suffix(&self, suffix: &str, manifest: &ContextManifest) -> Result<SuffixStatus, ClientError> {
        self.call("prefill_suffix", self.segment(suffix, manifest)).await
    }

    /// Generates from the resident context, streamed like `generate`.
    pub async fn decode(&self, config: GenerateConfig) -> Result<ResponseStream, ClientError> {
        let request_id = Client::new_request_id();
        let req = DecodeRequest {
            v: PROTOCOL_VERSION,
            fence: self.fence.clone(),
            request_id: request_id.clone(),
            config,
        };
        let subject = self.client.subjects.session(self.id(), "decode");
        let span = tracing::info_span!(
            "gen_ai.client",
            otel.name = "text_completion session",
            otel.kind = "client",
            switchyard.session.id = %self.id(),
        );
        self.client
            .start_encoded(subject, &request_id, encode(&req), span)
            .await
    }

    /// The resident context.
    pub async fn explain(&self) -> Result<ContextReport, ClientError> {
        self.call("explain", self.plain()).await
    }

    /// The model's context ceiling, effective context and memory figures.
    pub async fn describe(&self) -> Result<SessionModelInfo, ClientError> {
        self.call("describe", self.plain()).await
    }

    /// Closes the session; its KV slot goes back to the worker.
    pub async fn close(&self) -> Result<ContextReport, ClientError> {
        self.call("close", self.plain()).await
    }
}
