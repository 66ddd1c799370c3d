//! NATS subjects, all under one prefix (default `sy`) so several tenants can share a
//! NATS account: `{prefix}.v1.generate`, `{prefix}.v1.worker.{wid}.generate`, …

/// Subject names for one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    root: String,
}

/// The queue group every coordinator's request subscriptions join.
pub const COORDINATOR_QUEUE: &str = "sy-coordinators";

impl Default for Subjects {
    fn default() -> Self {
        Self::new("sy")
    }
}

impl Subjects {
    /// Subjects under `prefix` (e.g. `"sy"` → `"sy.v1.…"`).
    pub fn new(prefix: &str) -> Self {
        Self {
            root: format!("{prefix}.v1"),
        }
    }

    /// `{p}.v1.generate`: streaming generation from a raw prompt (coordinators).
    pub fn generate(&self) -> String {
        format!("{}.generate", self.root)
    }
    /// `{p}.v1.chat`: streaming generation from messages (coordinators).
    pub fn chat(&self) -> String {
        format!("{}.chat", self.root)
    }
    /// (1.7) `{p}.v1.embed`: embeddings requests (coordinators).
    pub fn embed(&self) -> String {
        format!("{}.embed", self.root)
    }

    /// `{p}.v1.classify`: prefill-only requests (coordinators).
    pub fn classify(&self) -> String {
        format!("{}.classify", self.root)
    }
    /// `{p}.v1.batch`: batch generation (coordinators).
    pub fn batch(&self) -> String {
        format!("{}.batch", self.root)
    }
    /// `{p}.v1.status`: the fleet view (coordinators).
    pub fn status(&self) -> String {
        format!("{}.status", self.root)
    }
    /// `{p}.v1.models`: models served by the fleet (coordinators).
    pub fn models(&self) -> String {
        format!("{}.models", self.root)
    }
    /// (1.12) `{p}.v1.relay.{verb}` (`generate`, `chat`): a draining worker relays a
    /// running stream to the coordinators for another worker to continue; (1.13)
    /// `session`: it moves a session ([`crate::session::AdoptSessionRequest`]). The
    /// worker role alone may publish here.
    pub fn relay(&self, verb: &str) -> String {
        format!("{}.relay.{verb}", self.root)
    }
    /// `{p}.v1.worker.{wid}.{verb}`: one worker's endpoint.
    pub fn worker(&self, worker_id: &str, verb: &str) -> String {
        format!("{}.worker.{worker_id}.{verb}", self.root)
    }
    /// `{p}.v1.heartbeat.{wid}`: a worker's periodic [`crate::WorkerStatus`].
    pub fn heartbeat(&self, worker_id: &str) -> String {
        format!("{}.heartbeat.{worker_id}", self.root)
    }
    /// `{p}.v1.heartbeat.*`: every worker's heartbeats.
    pub fn heartbeat_all(&self) -> String {
        format!("{}.heartbeat.*", self.root)
    }
    /// `{p}.v1.discover`: a coordinator asks every worker to heartbeat now.
    pub fn discover(&self) -> String {
        format!("{}.discover", self.root)
    }
    /// `{p}.v1.cancel.{request_id}`: stop that request at the next token boundary.
    pub fn cancel(&self, request_id: &str) -> String {
        format!("{}.cancel.{request_id}", self.root)
    }
    /// `{p}.v1.kv.{wid}`: a worker's [`crate::KvEvent`]s.
    pub fn kv(&self, worker_id: &str) -> String {
        format!("{}.kv.{worker_id}", self.root)
    }
    /// `{p}.v1.kv.*`: every worker's KV events.
    pub fn kv_all(&self) -> String {
        format!("{}.kv.*", self.root)
    }
    /// `{p}.v1.session.open`: open a session (coordinators, queue group).
    pub fn session_open(&self) -> String {
        format!("{}.session.open", self.root)
    }
    /// `{p}.v1.session.{sid}.{verb}`: a session's calls, answered by its worker.
    pub fn session(&self, session_id: &str, verb: &str) -> String {
        format!("{}.session.{session_id}.{verb}", self.root)
    }
    /// `{p}.v1.session.{sid}.*`: everything for one session.
    pub fn session_all(&self, session_id: &str) -> String {
        format!("{}.session.{session_id}.*", self.root)
    }
    /// (1.13) `{p}.v1.worker.{wid}.session_relay.{sid}.{verb}`: a call on session
    /// `sid` that the worker it moved from received, passed on to the worker that
    /// adopted it (workers only; the original reply subject kept).
    pub fn session_relay(&self, worker_id: &str, session_id: &str, verb: &str) -> String {
        self.worker(worker_id, &format!("session_relay.{session_id}.{verb}"))
    }
    /// `{p}.v1.kv.{wid}.snapshot`: ask a worker for its [`crate::KvSnapshot`].
    pub fn kv_snapshot(&self, worker_id: &str) -> String {
        format!("{}.kv.{worker_id}.snapshot", self.root)
    }
    /// (1.11) `{p}.v1.kv.{wid}.pull`: ask a worker for KV it holds
    /// ([`crate::KvPullRequest`]; workers only).
    pub fn kv_pull(&self, worker_id: &str) -> String {
        format!("{}.kv.{worker_id}.pull", self.root)
    }
    /// (1.16) `{p}.v1.stage.{pipeline}.{layer}`: the pipeline stage whose layers
    /// start at `layer` ([`crate::stage::StageBatch`]; workers only).
    pub fn stage(&self, pipeline: &str, first_layer: usize) -> String {
        format!("{}.stage.{pipeline}.{first_layer}", self.root)
    }
    /// `{p}.v1.cancel.*`: what workers listen on.
    pub fn cancel_all(&self) -> String {
        format!("{}.cancel.*", self.root)
    }
}

/// Header carrying the subject a worker streams chunks to when the NATS reply subject
/// is used for the coordinator's admission answer.
pub const HEADER_STREAM_TO: &str = "Sy-Stream-To";
/// Header with the request id (also in the body), for tooling that reads headers only.
pub const HEADER_REQUEST_ID: &str = "Sy-Request-Id";
/// On a forward from a coordinator that sent keep-alives while the request waited:
/// the `seq` of the worker's first chunk (protocol 1.4; absent = 0).
pub const HEADER_FIRST_SEQ: &str = "Sy-First-Seq";
/// On a forward: the Unix millisecond past which the coordinator no longer waits for
/// the admission answer (it has tried another worker, or given up); a worker that
/// gets or admits the forward later drops it unrun (protocol 1.4).
pub const HEADER_ADMIT_BY: &str = "Sy-Admit-By";
/// On a forward: microseconds the request waited at the coordinator (protocol 1.4),
/// reported back in the final metrics' `fleet_queue_us`.
pub const HEADER_QUEUED_US: &str = "Sy-Queued-Us";
/// On a forward: the coordinator's prediction of the worker's `cached_tokens` for the
/// request, as `precise,blocks` ([`crate::kv::predict_reuse`] and its whole-block
/// form), reported back in the final metrics (protocol 1.9; absent: no prediction).
pub const HEADER_KV_PREDICTED: &str = "Sy-Kv-Predicted";
/// On a forward: a peer the coordinator predicts holds more of the request's prefix
/// than the worker it goes to, as `worker_id,tokens` (protocol 1.11): the worker may
/// pull that KV from it ([`crate::kv_transfer`]) instead of computing it.
pub const HEADER_KV_PEER: &str = "Sy-Kv-Peer";
/// On a stream relayed by a draining worker to a coordinator, and on the forward that
/// follows (protocol 1.12): `worker_id,handovers` — the worker that ran the stream so
/// far (it holds the KV of its prompt and tokens: the forward's `Sy-Kv-Peer` names
/// it) and how many hand-overs the stream has had, counting this one. A request to a
/// coordinator that carries `Sy-Stream-To` is relayed: the coordinator streams to that
/// subject and answers the relaying worker with an [`crate::Admission`].
pub const HEADER_HANDOVER: &str = "Sy-Handover";
/// On a forward (protocol 1.12): `worker_id` of a prefill worker, of the same KV
/// format, that the coordinator chose to compute this request's prompt; the worker
/// asks it ([`crate::kv_transfer::PrefillRequest`]) and pulls the KV from it.
pub const HEADER_KV_PREFILL: &str = "Sy-Kv-Prefill";
/// On a reply of a chunked transfer: `sha256=<hex>` of the payload (protocol 1.11).
pub const HEADER_DIGEST: &str = "Sy-Digest";
/// W3C trace context.
pub const HEADER_TRACEPARENT: &str = "traceparent";

/// Whether `id` can be used as one subject token (worker ids, request ids).
pub fn is_valid_token(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_use_the_prefix() {
        let s = Subjects::new("tenant7");
        assert_eq!(s.generate(), "tenant7.v1.generate");
        assert_eq!(s.worker("w1", "chat"), "tenant7.v1.worker.w1.chat");
        assert_eq!(s.cancel("r9"), "tenant7.v1.cancel.r9");
        assert_eq!(Subjects::default().heartbeat_all(), "sy.v1.heartbeat.*");
    }

    #[test]
    fn tokens_reject_subject_syntax() {
        assert!(is_valid_token("cpu-0_a"));
        assert!(!is_valid_token("a.b"));
        assert!(!is_valid_token("a*"));
        assert!(!is_valid_token(""));
        assert!(!is_valid_token("a b"));
    }
}
