//! Numbered response chunks to one subject (a client's inbox).

use async_nats::{Client, Subject};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use switchyard_messages::{FinishReason, GenerateMetrics, StreamChunk, Token, WireError, PROTOCOL_VERSION};

/// Sends one request's response stream: seq 0, 1, 2, … with the last chunk marked
/// `done`. Cheap to clone; clones share the sequence counter.
///
/// A chunk may carry several tokens (the worker coalesces tokens that come close
/// together, see `switchyard_workers::worker::coalesce`). Nothing here flushes: the
/// NATS connection writes what is queued when its task next runs.
#[derive(Clone)]
pub struct ChunkSink {
    client: Client,
    /// Shares its bytes between clones and chunks (no copy per publish).
    subject: Subject,
    request_id: String,
    worker_id: Option<String>,
    seq: Arc<AtomicU64>,
    /// The first chunk's `seq` (a coordinator sent keep-alives before it).
    first: u64,
    /// Microseconds the request waited at a coordinator, for the final metrics.
    fleet_queue_us: u64,
    /// Times the stream was handed over before it came here (`Sy-Handover`).
    handovers: u32,
    /// Microseconds a prefill worker took for this request's prompt.
    remote_prefill_us: u64,
    /// The coordinator's prediction of `cached_tokens` (precise, by whole blocks).
    predicted: Option<(u32, u32)>,
    /// Prompt tokens whose KV was pulled from a peer for this request, and the
    /// microseconds the pull took.
    pulled: (u32, u64),
}

impl ChunkSink {
    /// The subject the chunks go to (the requester's inbox).
    pub fn subject(&self) -> &str {
        self.subject.as_str()
    }

    /// A sink publishing to `subject` for `request_id`; `worker_id` is stamped on the
    /// first and last chunk.
    pub fn new(client: Client, subject: String, request_id: String, worker_id: Option<String>) -> Self {
        Self {
            client,
            subject: Subject::from(subject),
            request_id,
            worker_id,
            seq: Arc::new(AtomicU64::new(0)),
            first: 0,
            fleet_queue_us: 0,
            handovers: 0,
            remote_prefill_us: 0,
            predicted: None,
            pulled: (0, 0),
        }
    }

    /// The final metrics carry the coordinator's prediction of `cached_tokens` (its
    /// `Sy-Kv-Predicted`: precise, and by whole blocks).
    pub fn predicted(self, predicted: Option<(u32, u32)>) -> Self {
        Self { predicted, ..self }
    }

    /// The final metrics say `tokens` prompt tokens' KV came from a peer, in `us`.
    pub fn pulled(self, tokens: u32, us: u64) -> Self {
        Self {
            pulled: (tokens, us),
            ..self
        }
    }

    /// Chunks numbered from `first` on (the coordinator's `Sy-First-Seq`), and the
    /// final metrics' `fleet_queue_us` set to `fleet_queue_us` (its `Sy-Queued-Us`).
    pub fn after_queue(self, first: u64, fleet_queue_us: u64) -> Self {
        self.seq.store(first, Ordering::Release);
        Self {
            first,
            fleet_queue_us,
            ..self
        }
    }

    /// The final metrics say the stream was handed over `n` times on its way here.
    pub fn handovers(self, n: u32) -> Self {
        Self { handovers: n, ..self }
    }

    /// The final metrics say a prefill worker computed the prompt in `us` (as seen
    /// from here).
    pub fn remote_prefill(self, us: u64) -> Self {
        Self {
            remote_prefill_us: us,
            ..self
        }
    }

    /// The `seq` the next chunk will carry.
    pub fn next_seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// Chunks sent so far.
    pub fn sent(&self) -> u64 {
        self.seq.load(Ordering::Acquire) - self.first
    }

    async fn send(&self, mut chunk: StreamChunk) -> bool {
        chunk.seq = self.seq.fetch_add(1, Ordering::AcqRel);
        if chunk.seq == self.first || chunk.done {
            chunk.worker_id = self.worker_id.clone();
        }
        let payload = switchyard_messages::encode(&chunk);
        self.client.publish(self.subject.clone(), payload.into()).await.is_ok()
    }

    fn chunk(&self) -> StreamChunk {
        StreamChunk {
            v: PROTOCOL_VERSION,
            request_id: self.request_id.clone(),
            seq: 0,
            tokens: Vec::new(),
            done: false,
            finish_reason: None,
            metrics: None,
            error: None,
            worker_id: None,
            tool_calls: Vec::new(),
        }
    }

    /// Sends tokens, one or several (an empty list is a keep-alive). Returns false if
    /// NATS refused.
    pub async fn tokens(&self, tokens: Vec<Token>) -> bool {
        let mut c = self.chunk();
        c.tokens = tokens;
        self.send(c).await
    }

    /// Sends the final chunk of a successful stream.
    pub async fn done(&self, tokens: Vec<Token>, reason: FinishReason, metrics: GenerateMetrics) -> bool {
        self.finish(tokens, reason, metrics, Vec::new()).await
    }

    /// Sends the final chunk of a successful stream with the calls the answer made.
    pub async fn finish(
        &self,
        tokens: Vec<Token>,
        reason: FinishReason,
        metrics: GenerateMetrics,
        tool_calls: Vec<switchyard_messages::ToolCall>,
    ) -> bool {
        let mut c = self.chunk();
        c.tokens = tokens;
        c.done = true;
        c.finish_reason = Some(reason);
        c.metrics = Some(GenerateMetrics {
            fleet_queue_us: self.fleet_queue_us,
            predicted_cached_tokens: self.predicted.map(|p| p.0),
            block_predicted_cached_tokens: self.predicted.map(|p| p.1),
            pulled_tokens: self.pulled.0,
            pull_us: self.pulled.1,
            handovers: self.handovers,
            remote_prefill_us: self.remote_prefill_us,
            ..metrics
        });
        c.tool_calls = tool_calls;
        self.send(c).await
    }

    /// Sends the final chunk of a failed stream.
    pub async fn error(&self, error: WireError) -> bool {
        let mut c = self.chunk();
        c.done = true;
        c.finish_reason = Some(FinishReason::Error);
        c.error = Some(error);
        self.send(c).await
    }
}
