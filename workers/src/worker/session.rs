//! Sessions on a worker (seed 002): the SessionActors and the owner fence.
//!
//! A coordinator forwards `{p}.v1.session.open` to `{p}.v1.worker.{wid}.session_open`;
//! [`SessionHost::open`] checks the request, applies the fence and opens a
//! [`ModelSession`] on the backend (a pinned KV slot). Each session is then one task
//! (its actor) that owns its state and answers `{p}.v1.session.{sid}.*` one call at a
//! time, so calls on a session never interleave; a decode streams to the caller's
//! inbox like `generate`.
//!
//! Fencing: the worker remembers the owner of the latest open. An open by another
//! owner supersedes it: the older owner's sessions give their slots back and answer
//! `stale_fence` from then on. A call whose `fence` names someone other than the
//! session's owner is `not_owner`. A closed (or idle-expired) session answers
//! `session_closed` until it is forgotten a while later; after that nothing answers,
//! which clients report as `session_closed` too.

use crate::worker::service::{pump, ServeContext};
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_actors::ChunkSink;
use switchyard_messages::session::{
    hex, token_hash, ContextManifest, ContextReport, DecodeRequest, OpenSessionRequest, PrefixStatus, SegmentRequest,
    SessionCall, SessionModelInfo, SessionOpened, SuffixStatus,
};
use switchyard_messages::{
    decode, encode, kv::fnv1a, BackendError, ErrorCode, ErrorReply, ModelSession, WireError, PROTOCOL_VERSION,
};

/// Model types every switchyard worker serves (GGUF, llama family).
pub const MODEL_TYPES: &[&str] = &["", "llama", "gguf"];

/// The sessions of one worker.
pub struct SessionHost {
    ctx: Arc<ServeContext>,
    subjects: switchyard_messages::Subjects,
    /// A session unused this long is closed (its slot given back).
    idle: Duration,
    state: Mutex<HostState>,
}

#[derive(Default)]
struct HostState {
    /// The owner of the latest open.
    owner: Option<String>,
    /// Live sessions: id → (owner, staleness shared with the session's actor).
    sessions: HashMap<String, (String, Arc<Stale>)>,
}

/// Set when a newer owner takes over; the actor wakes and gives its slot back.
#[derive(Default)]
struct Stale {
    flag: AtomicBool,
    wake: tokio::sync::Notify,
}

impl Stale {
    fn load(&self, order: Ordering) -> bool {
        self.flag.load(order)
    }
}

/// What one session's actor owns.
struct Session {
    id: String,
    owner: String,
    backend: Arc<dyn ModelSession>,
    num_ctx: u32,
    bos: bool,
    stale: Arc<Stale>,
    closed: bool,
    /// The resident prefix and the manifest it was computed under.
    prefix: Option<Prefix>,
}

struct Prefix {
    tokens: Vec<u32>,
    manifest: ContextManifest,
    digest: String,
    byte_hash: String,
}

fn err(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError::new(code, message)
}

fn wire(e: BackendError) -> WireError {
    e.to_wire()
}

impl SessionHost {
    /// Sessions of the worker behind `ctx`, closed after `idle` without calls.
    pub fn new(ctx: Arc<ServeContext>, subjects: switchyard_messages::Subjects, idle: Duration) -> Arc<Self> {
        Arc::new(Self {
            ctx,
            subjects,
            idle,
            state: Mutex::new(HostState::default()),
        })
    }

    /// Live (not closed, not stale) sessions.
    pub fn open_sessions(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.sessions
            .values()
            .filter(|(_, stale)| !stale.load(Ordering::Acquire))
            .count()
    }

    /// Handles `session_open`: the answer is a [`SessionOpened`] or an [`ErrorReply`].
    pub async fn handle_open(self: &Arc<Self>, payload: &[u8]) -> Vec<u8> {
        let result = match decode::<OpenSessionRequest>(payload) {
            Ok(req) => self.open(req).await,
            Err(e) => Err(err(ErrorCode::BadRequest, e.to_string())),
        };
        match result {
            Ok(opened) => encode(&opened),
            Err(error) => encode(&ErrorReply {
                v: PROTOCOL_VERSION,
                error,
            }),
        }
    }

    /// Opens a session: checks, fence, a backend session, its actor.
    pub async fn open(self: &Arc<Self>, req: OpenSessionRequest) -> Result<SessionOpened, WireError> {
        let ctx = &self.ctx;
        if req.v > PROTOCOL_VERSION {
            return Err(err(
                ErrorCode::UnsupportedVersion,
                format!("protocol v{} is newer than this worker's v{PROTOCOL_VERSION}", req.v),
            ));
        }
        if !MODEL_TYPES.contains(&req.model_type.as_str()) {
            return Err(err(
                ErrorCode::BackendMismatch,
                format!(
                    "model type {:?} is not served by this worker (it runs GGUF llama-family models: {:?})",
                    req.model_type, MODEL_TYPES
                ),
            ));
        }
        if !req.model.is_empty() && req.model != ctx.model_name {
            return Err(err(
                ErrorCode::UnknownModel,
                format!(
                    "worker {} serves {:?}, not {:?}",
                    ctx.worker_id, ctx.model_name, req.model
                ),
            ));
        }
        if req.fence.is_empty() {
            return Err(err(ErrorCode::BadRequest, "fence (the owner instance id) is required"));
        }
        if !["", "f16"].contains(&req.config.kv_cache_type.as_str()) {
            return Err(err(
                ErrorCode::BadRequest,
                format!(
                    "kv_cache_type {:?}: this worker's KV cache is f16",
                    req.config.kv_cache_type
                ),
            ));
        }
        ctx.check_open()?;
        self.take_over(&req.fence);
        let backend = ctx.model.open_session().await.map_err(wire)?;
        let info = self.describe();
        let num_ctx = match req.config.num_ctx {
            0 => info.effective_context,
            n => n.min(info.effective_context),
        };
        let id = format!("s{}", nuid::next().to_string().to_lowercase());
        let sub = match ctx.client.subscribe(self.subjects.session_all(&id)).await {
            Ok(sub) => sub,
            Err(e) => {
                backend.close();
                return Err(err(ErrorCode::Internal, format!("subscribing for the session: {e}")));
            }
        };
        let stale = Arc::new(Stale::default());
        {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            // Another owner may have opened while this one waited for its slot.
            if st.owner.as_deref() != Some(req.fence.as_str()) {
                backend.close();
                return Err(err(
                    ErrorCode::StaleFence,
                    "a newer owner opened a session on this worker meanwhile",
                ));
            }
            st.sessions.insert(id.clone(), (req.fence.clone(), stale.clone()));
        }
        let session = Session {
            id: id.clone(),
            owner: req.fence.clone(),
            backend,
            num_ctx,
            bos: !req.config.disable_bos,
            stale,
            closed: false,
            prefix: None,
        };
        tracing::info!(worker = %ctx.worker_id, session = %id, owner = %req.fence, num_ctx, "session opened");
        tokio::spawn(self.clone().run(session, sub));
        Ok(SessionOpened {
            v: PROTOCOL_VERSION,
            session_id: id,
            worker_id: ctx.worker_id.clone(),
            num_ctx,
            info,
        })
    }

    /// `fence` opens a session: if it is not the current owner, every session of
    /// earlier owners goes stale (their actors give their slots back).
    fn take_over(&self, fence: &str) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.owner.as_deref() == Some(fence) {
            return;
        }
        if let Some(old) = st.owner.replace(fence.to_string()) {
            tracing::info!(worker = %self.ctx.worker_id, old = %old, new = %fence, "session owner superseded");
        }
        for (owner, stale) in st.sessions.values() {
            if owner != fence {
                stale.flag.store(true, Ordering::Release);
                stale.wake.notify_one();
            }
        }
    }

    /// What this worker reports about its model (seed 002 `Describe`).
    pub fn describe(&self) -> SessionModelInfo {
        let mem = self.ctx.model.memory();
        let info = self.ctx.model.info();
        let free = switchyard_actors::host::available_memory();
        let ceiling = if mem.model_max_context > 0 {
            mem.model_max_context
        } else {
            info.context_len
        };
        let fits = match mem.kv_bytes_per_token {
            0 => u32::MAX,
            b => (free / b).min(u64::from(u32::MAX)) as u32,
        };
        SessionModelInfo {
            model_max_context: ceiling,
            effective_context: ceiling.min(info.context_len).min(fits),
            kv_bytes_per_token: mem.kv_bytes_per_token,
            free_bytes: free,
            weights_bytes: mem.weights_bytes,
        }
    }

    /// The session's actor: its calls in order until it is closed and forgotten.
    async fn run(self: Arc<Self>, mut s: Session, mut sub: async_nats::Subscriber) {
        let mut last_call = Instant::now();
        loop {
            let wait = self.idle.saturating_sub(last_call.elapsed());
            let msg = tokio::select! {
                msg = sub.next() => msg,
                _ = s.stale.wake.notified() => {
                    if !s.closed {
                        tracing::info!(session = %s.id, "session owner superseded; slot given back");
                        s.close();
                    }
                    continue;
                }
                _ = tokio::time::sleep(wait) => {
                    if s.closed || s.stale.load(Ordering::Acquire) {
                        break; // forgotten: nothing answers any more
                    }
                    tracing::info!(session = %s.id, "session idle for {:?}; closed", self.idle);
                    s.close();
                    last_call = Instant::now();
                    continue;
                }
            };
            let Some(msg) = msg else { break };
            last_call = Instant::now();
            if s.stale.load(Ordering::Acquire) && !s.closed {
                s.close();
            }
            let verb = msg.subject.rsplit('.').next().unwrap_or_default().to_string();
            let Some(reply) = msg.reply.clone() else { continue };
            if verb == "decode" {
                self.decode(&mut s, &msg.payload, reply.to_string()).await;
                continue;
            }
            let answer = self.call(&mut s, &verb, &msg.payload).await;
            let body = answer.unwrap_or_else(|error| {
                encode(&ErrorReply {
                    v: PROTOCOL_VERSION,
                    error,
                })
            });
            let _ = self.ctx.client.publish(reply, body.into()).await;
        }
        s.close();
        let _ = sub.unsubscribe().await;
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sessions
            .remove(&s.id);
    }

    /// One non-streaming call.
    async fn call(&self, s: &mut Session, verb: &str, payload: &[u8]) -> Result<Vec<u8>, WireError> {
        let bad = |e: switchyard_messages::DecodeError| err(ErrorCode::BadRequest, e.to_string());
        match verb {
            "ensure_prefix" => {
                let req: SegmentRequest = decode(payload).map_err(bad)?;
                s.check(&req.fence)?;
                Ok(encode(&s.ensure_prefix(req).await?))
            }
            "prefill_suffix" => {
                let req: SegmentRequest = decode(payload).map_err(bad)?;
                s.check(&req.fence)?;
                Ok(encode(&s.prefill_suffix(req).await?))
            }
            "explain" => {
                let req: SessionCall = decode(payload).map_err(bad)?;
                s.check_owner(&req.fence)?;
                Ok(encode(&s.report().await))
            }
            "describe" => {
                let req: SessionCall = decode(payload).map_err(bad)?;
                s.check(&req.fence)?;
                Ok(encode(&self.describe()))
            }
            "close" => {
                let req: SessionCall = decode(payload).map_err(bad)?;
                s.check(&req.fence)?;
                let report = s.report().await;
                s.close();
                tracing::info!(session = %s.id, "session closed");
                Ok(encode(&ContextReport { closed: true, ..report }))
            }
            other => Err(err(
                ErrorCode::BadRequest,
                format!(
                    "unknown session call {other:?} (ensure_prefix, prefill_suffix, decode, explain, describe, close)"
                ),
            )),
        }
    }

    /// `decode`: streams to `reply` like a generation.
    async fn decode(&self, s: &mut Session, payload: &[u8], reply: String) {
        let req = decode::<DecodeRequest>(payload).map_err(|e| err(ErrorCode::BadRequest, e.to_string()));
        let request_id = req.as_ref().map(|r| r.request_id.clone()).unwrap_or_default();
        let sink = ChunkSink::new(
            self.ctx.client.clone(),
            reply,
            request_id.clone(),
            Some(self.ctx.worker_id.clone()),
        );
        let checked = match req {
            Ok(req) => s.check(&req.fence).map(|()| req),
            Err(e) => Err(e),
        };
        let req = match checked {
            Ok(r) => r,
            Err(e) => {
                sink.error(e).await;
                return;
            }
        };
        if s.prefix.is_none() {
            sink.error(err(ErrorCode::BadRequest, "nothing resident: call ensure_prefix first"))
                .await;
            return;
        }
        let resident = match s.backend.resident().await {
            Ok(r) => r.len() as u32,
            Err(e) => {
                sink.error(wire(e)).await;
                return;
            }
        };
        if resident + req.config.max_tokens > s.num_ctx {
            sink.error(
                BackendError::ContextOverflow {
                    prompt_tokens: resident as usize,
                    max_tokens: req.config.max_tokens as usize,
                    context_len: s.num_ctx as usize,
                }
                .to_wire(),
            )
            .await;
            return;
        }
        sink.tokens(Vec::new()).await;
        let cancel = self.ctx.cancels.insert(&request_id);
        let events = s.backend.decode(req.config, cancel.clone());
        let attrs = crate::worker::telemetry::attributes(
            "text_completion",
            &self.ctx.model_name,
            &self.ctx.worker_id,
            &self.ctx.backend,
        );
        pump(&self.ctx, &sink, events, &cancel, None, &attrs).await;
        self.ctx.cancels.remove(&request_id);
    }
}

impl Session {
    /// The session is usable by `fence` (empty = unchecked).
    fn check(&self, fence: &str) -> Result<(), WireError> {
        self.check_owner(fence)?;
        if self.stale.load(Ordering::Acquire) {
            return Err(err(
                ErrorCode::StaleFence,
                format!(
                    "session {}: its owner {:?} was superseded by a newer open",
                    self.id, self.owner
                ),
            ));
        }
        if self.closed {
            return Err(err(ErrorCode::SessionClosed, format!("session {} is closed", self.id)));
        }
        Ok(())
    }

    fn check_owner(&self, fence: &str) -> Result<(), WireError> {
        if !fence.is_empty() && fence != self.owner {
            return Err(err(
                ErrorCode::NotOwner,
                format!("session {} belongs to {:?}, not {fence:?}", self.id, self.owner),
            ));
        }
        Ok(())
    }

    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            self.backend.close();
        }
    }

    fn overflow(&self, tokens: usize) -> Result<(), WireError> {
        if tokens > self.num_ctx as usize {
            return Err(BackendError::ContextOverflow {
                prompt_tokens: tokens,
                max_tokens: 0,
                context_len: self.num_ctx as usize,
            }
            .to_wire());
        }
        Ok(())
    }

    async fn ensure_prefix(&mut self, req: SegmentRequest) -> Result<PrefixStatus, WireError> {
        let digest = req.manifest.digest();
        let bos = self.bos && !req.manifest.disable_bos;
        let tokens = self.backend.tokenize(req.text.clone(), bos).await.map_err(wire)?;
        self.overflow(tokens.len())?;
        // Reuse only under the same manifest: byte-identical text under another
        // profile, template, tokenizer or runtime starts over.
        let invalidate = self.prefix.as_ref().is_none_or(|p| p.digest != digest);
        let update = self
            .backend
            .set_resident(tokens.clone(), invalidate)
            .await
            .map_err(wire)?;
        let byte_hash = hex(fnv1a(req.text.as_bytes()));
        let status = PrefixStatus {
            reused_tokens: update.reused,
            prefilled_tokens: update.computed,
            dropped_tokens: update.dropped,
            prefix_tokens: tokens.len() as u32,
            resident_tokens: tokens.len() as u32,
            available_tokens: self.num_ctx - tokens.len() as u32,
            stable_byte_hash: byte_hash.clone(),
            stable_token_hash: token_hash(&tokens),
            manifest_digest: digest.clone(),
        };
        self.prefix = Some(Prefix {
            tokens,
            manifest: req.manifest,
            digest,
            byte_hash,
        });
        Ok(status)
    }

    async fn prefill_suffix(&mut self, req: SegmentRequest) -> Result<SuffixStatus, WireError> {
        let prefix = self
            .prefix
            .as_ref()
            .ok_or_else(|| err(ErrorCode::BadRequest, "nothing resident: call ensure_prefix first"))?;
        let digest = req.manifest.digest();
        if digest != prefix.digest {
            return Err(err(
                ErrorCode::BadRequest,
                format!(
                    "the suffix's manifest ({digest}) is not the resident prefix's ({}); call ensure_prefix with it first",
                    prefix.digest
                ),
            ));
        }
        let suffix = self.backend.tokenize(req.text.clone(), false).await.map_err(wire)?;
        let mut target = prefix.tokens.clone();
        let prefix_len = target.len() as u32;
        target.extend_from_slice(&suffix);
        self.overflow(target.len())?;
        let update = self.backend.set_resident(target.clone(), false).await.map_err(wire)?;
        Ok(SuffixStatus {
            suffix_tokens: suffix.len() as u32,
            reused_tokens: update.reused.saturating_sub(prefix_len),
            prefilled_tokens: update.computed,
            dropped_tokens: update.dropped,
            resident_tokens: target.len() as u32,
            available_tokens: self.num_ctx - target.len() as u32,
            volatile_byte_hash: hex(fnv1a(req.text.as_bytes())),
        })
    }

    async fn report(&self) -> ContextReport {
        let resident = if self.closed {
            0
        } else {
            self.backend.resident().await.map(|r| r.len() as u32).unwrap_or(0)
        };
        let (prefix_tokens, byte_hash, tok_hash, digest, manifest) = match &self.prefix {
            Some(p) => (
                p.tokens.len() as u32,
                p.byte_hash.clone(),
                token_hash(&p.tokens),
                p.digest.clone(),
                p.manifest.clone(),
            ),
            None => Default::default(),
        };
        ContextReport {
            resident_tokens: resident,
            prefix_tokens,
            num_ctx: self.num_ctx,
            available_tokens: self.num_ctx.saturating_sub(resident),
            stable_byte_hash: byte_hash,
            stable_token_hash: tok_hash,
            manifest_digest: digest,
            manifest,
            closed: self.closed,
        }
    }
}
