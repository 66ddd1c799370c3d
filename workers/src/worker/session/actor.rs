//! The SessionActor: one per session, linked under the WorkerActor. It owns the
//! session's state and answers `{p}.v1.session.{sid}.*` one call at a time, so calls
//! on a session never interleave; a decode streams to the caller's inbox like
//! `generate`.
//!
//! A task beside it forwards the session's NATS messages, the owner's supersession
//! and the idle clock as messages. A call that panics (or fails inside the actor) is
//! answered with an `internal` error naming the session, and the actor stops as
//! failed: the WorkerActor closes the session and forgets it. The worker, and every
//! other session, keeps serving.

use super::moving;
use super::state::{describe, err, wire, HostState, Session, Stale};
use crate::worker::context::ServeContext;
use crate::worker::service::pump;
use futures::{FutureExt, StreamExt};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use switchyard_backend::BackendError;
use switchyard_fabric::ChunkSink;
use switchyard_messages::session::{ContextReport, DecodeRequest, SegmentRequest, SessionCall};
use switchyard_messages::{
    decode, encode, validate_decode, validate_segment, validate_session_call, ErrorCode, ErrorReply, WireError,
    PROTOCOL_VERSION,
};

/// What the SessionActor is told (by its forwarder).
pub(super) enum SessionMsg {
    /// A call on `{p}.v1.session.{sid}.{verb}`.
    Call(async_nats::Message),
    /// A newer owner took over: give the slot back.
    Superseded,
    /// No call for the idle period: close, or (already closed) be forgotten.
    Idle,
    /// (1.13) The worker drains: move to another worker if one adopts the session
    /// by the deadline (true), else stay (false).
    Move(tokio::time::Instant, ractor::RpcReplyPort<bool>),
}

/// The worker's sessions (the actor removes its own when it is forgotten).
pub(super) type Table = Arc<Mutex<HostState>>;

pub(super) struct SessionActor;

pub(super) struct SessionArgs {
    pub(super) ctx: Arc<ServeContext>,
    pub(super) session: Session,
    pub(super) sub: async_nats::Subscriber,
    /// (1.13) An adopted session's calls passed on by the worker it moved from.
    pub(super) relayed: Option<async_nats::Subscriber>,
    pub(super) idle: Duration,
    pub(super) table: Table,
}

pub(super) struct SessionState {
    ctx: Arc<ServeContext>,
    session: Session,
    table: Table,
    forwarder: Option<Forwarder>,
    /// The adopter, once the session moved: the forwarder passes on what it still
    /// receives.
    moved: Arc<OnceLock<String>>,
}

/// The forwarder task and the switch that stops it.
struct Forwarder {
    task: tokio::task::JoinHandle<()>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Forwarder {
    /// Stops it and waits until the subscription is gone.
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// The session's subscriptions.
struct Subs {
    calls: async_nats::Subscriber,
    relayed: Option<async_nats::Subscriber>,
}

impl Subs {
    /// The next call from either (cancel-safe); `None` once one has ended.
    async fn next(&mut self) -> Option<async_nats::Message> {
        match &mut self.relayed {
            Some(r) => tokio::select! {
                m = self.calls.next() => m,
                m = r.next() => m,
            },
            None => self.calls.next().await,
        }
    }
}

/// Turns the session's subscriptions, its supersession and the idle clock into
/// messages for `actor`, until the actor is gone.
#[allow(clippy::too_many_arguments)]
async fn forward(
    ctx: Arc<ServeContext>,
    id: String,
    actor: ActorRef<SessionMsg>,
    mut subs: Subs,
    stale: Arc<Stale>,
    idle: Duration,
    mut stop: tokio::sync::oneshot::Receiver<()>,
    moved: Arc<OnceLock<String>>,
) {
    let client = ctx.client.clone();
    let mut last_call = Instant::now();
    loop {
        let wait = idle.saturating_sub(last_call.elapsed());
        let sent = tokio::select! {
            _ = &mut stop => break,
            msg = subs.next() => match msg {
                Some(m) => {
                    last_call = Instant::now();
                    match actor.cast(SessionMsg::Call(m)) {
                        Ok(()) => Ok(()),
                        Err(e) => {
                            // The actor is gone: answer for it, then stop listening.
                            if let ractor::MessagingErr::SendErr(SessionMsg::Call(m)) = e {
                                closed_reply(&client, m);
                            }
                            Err(())
                        }
                    }
                }
                None => {
                    actor.stop(None);
                    break;
                }
            },
            _ = stale.wake.notified() => actor.cast(SessionMsg::Superseded).map_err(drop),
            _ = tokio::time::sleep(wait) => {
                last_call = Instant::now();
                actor.cast(SessionMsg::Idle).map_err(drop)
            }
        };
        if sent.is_err() {
            break; // the actor is gone
        }
    }
    // Drained (the server confirms the unsubscribe; what it sent before still
    // arrives) before the actor answers its last caller, so any later call finds no
    // responder (or, once it moved, the adopter); calls delivered meanwhile get
    // `session_closed`, or go on to the adopter. Bounded: the server may be gone.
    let _ = subs.calls.drain().await;
    if let Some(r) = subs.relayed.as_mut() {
        let _ = r.drain().await;
    }
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    for sub in std::iter::once(&mut subs.calls).chain(subs.relayed.as_mut()) {
        while let Ok(Some(m)) = tokio::time::timeout_at(until, sub.next()).await {
            match moved.get() {
                Some(adopter) => moving::relay_call(&ctx, adopter, &id, m).await,
                None => closed_reply(&client, m),
            }
        }
    }
}

/// Answers a call the session's actor can no longer take: `session_closed`.
fn closed_reply(client: &async_nats::Client, m: async_nats::Message) {
    if let Some(reply) = m.reply {
        let body = encode(&ErrorReply {
            v: PROTOCOL_VERSION,
            error: err(ErrorCode::SessionClosed, "the session is closed"),
        });
        let client = client.clone();
        tokio::spawn(async move {
            let _ = client.publish(reply, body.into()).await;
        });
    }
}

impl Actor for SessionActor {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SessionMsg>,
        args: SessionArgs,
    ) -> Result<SessionState, ActorProcessingErr> {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let moved = Arc::new(OnceLock::new());
        let subs = Subs {
            calls: args.sub,
            relayed: args.relayed,
        };
        let task = tokio::spawn(forward(
            args.ctx.clone(),
            args.session.id.clone(),
            myself,
            subs,
            args.session.stale.clone(),
            args.idle,
            stopped,
            moved.clone(),
        ));
        Ok(SessionState {
            ctx: args.ctx,
            session: args.session,
            table: args.table,
            forwarder: Some(Forwarder { task, stop }),
            moved,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SessionMsg>,
        msg: SessionMsg,
        st: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        let s = &mut st.session;
        match msg {
            SessionMsg::Superseded => {
                if !s.closed {
                    tracing::info!(session = %s.id, "session owner superseded; slot given back");
                    s.close();
                }
            }
            SessionMsg::Move(deadline, reply) => {
                let moved = match s.closed || s.stale.load(Ordering::Acquire) || s.moved_to.is_some() {
                    true => false,
                    false => match moving::ask_adoption(&st.ctx, s, deadline).await {
                        Ok(adopter) => {
                            tracing::info!(session = %s.id, adopter = %adopter, "session moved to another worker");
                            s.moved_to = Some(adopter.clone());
                            let _ = st.moved.set(adopter);
                            // Listen no more: later calls reach the adopter alone, and
                            // what came meanwhile is passed on to it.
                            if let Some(f) = st.forwarder.take() {
                                f.stop().await;
                            }
                            // The adopter has pulled the KV: the slot is free. Calls
                            // queued here go on to the adopter, then this actor stops.
                            s.close();
                            let _ = myself.cast(SessionMsg::Idle);
                            crate::worker::kv_transfer::TransferState::add(&st.ctx.transfer.sessions_moved, 1);
                            true
                        }
                        Err(e) => {
                            tracing::warn!(session = %s.id, code = %e.code, "session not moved ({}); it ends with this worker", e.message);
                            false
                        }
                    },
                };
                let _ = reply.send(moved);
            }
            SessionMsg::Idle => {
                if let Some(adopter) = &s.moved_to {
                    tracing::debug!(session = %s.id, adopter = %adopter, "moved session forgotten here");
                    myself.stop(None);
                } else if s.closed || s.stale.load(Ordering::Acquire) {
                    myself.stop(None); // forgotten: nothing answers any more
                } else {
                    tracing::info!(session = %s.id, "session idle; closed");
                    s.close();
                }
            }
            SessionMsg::Call(msg) => {
                if let Some(adopter) = &s.moved_to {
                    moving::relay_call(&st.ctx, adopter, &s.id, msg).await;
                    return Ok(());
                }
                if s.stale.load(Ordering::Acquire) && !s.closed {
                    s.close();
                }
                let verb = msg.subject.rsplit('.').next().unwrap_or_default().to_string();
                let Some(reply) = msg.reply.clone() else { return Ok(()) };
                let armed = s.stale.panic_next.swap(false, Ordering::AcqRel);
                let ctx = st.ctx.clone();
                let work = async {
                    if armed {
                        panic!("fault injection: session actor");
                    }
                    if verb == "decode" {
                        stream_decode(&ctx, s, &msg.payload, reply.to_string()).await;
                        return;
                    }
                    let answer = call(&ctx, s, &verb, &msg.payload).await;
                    let body = answer.unwrap_or_else(|error| {
                        encode(&ErrorReply {
                            v: PROTOCOL_VERSION,
                            error,
                        })
                    });
                    let body = switchyard_fabric::nats::fit_reply(&ctx.client, body, "session");
                    if let Err(e) = ctx.client.publish(reply.clone(), body.into()).await {
                        tracing::warn!("session {verb} reply not sent: {e}");
                    }
                };
                if let Err(panic) = AssertUnwindSafe(work).catch_unwind().await {
                    let why = switchyard_fabric::panic_message(panic);
                    let id = st.session.id.clone();
                    // Stop listening first, so the caller's next call finds no one.
                    if let Some(f) = st.forwarder.take() {
                        f.stop().await;
                    }
                    let error = err(
                        ErrorCode::Internal,
                        format!("session {id} failed ({why}); it is closed, open a new one"),
                    );
                    if verb == "decode" {
                        ChunkSink::new(
                            st.ctx.client.clone(),
                            reply.to_string(),
                            String::new(),
                            Some(st.ctx.worker_id.clone()),
                        )
                        .error(error)
                        .await;
                    } else {
                        let body = encode(&ErrorReply {
                            v: PROTOCOL_VERSION,
                            error,
                        });
                        let _ = st.ctx.client.publish(reply, body.into()).await;
                    }
                    let _ = st.ctx.client.flush().await;
                    return Err(format!("session {id}: {why}").into());
                }
            }
        }
        Ok(())
    }

    async fn post_stop(&self, _myself: ActorRef<SessionMsg>, st: &mut SessionState) -> Result<(), ActorProcessingErr> {
        if let Some(f) = st.forwarder.take() {
            f.stop().await;
        }
        st.session.close();
        st.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sessions
            .remove(&st.session.id);
        Ok(())
    }
}

/// One non-streaming call.
async fn call(ctx: &ServeContext, s: &mut Session, verb: &str, payload: &[u8]) -> Result<Vec<u8>, WireError> {
    let bad = |e: switchyard_messages::DecodeError| err(ErrorCode::BadRequest, e.to_string());
    match verb {
        "ensure_prefix" => {
            let req: SegmentRequest = decode(payload).map_err(bad)?;
            validate_segment(&req, &ctx.limits)?;
            s.check(&req.fence)?;
            Ok(encode(&s.ensure_prefix(req).await?))
        }
        "prefill_suffix" => {
            let req: SegmentRequest = decode(payload).map_err(bad)?;
            validate_segment(&req, &ctx.limits)?;
            s.check(&req.fence)?;
            Ok(encode(&s.prefill_suffix(req).await?))
        }
        "explain" => {
            let req: SessionCall = decode(payload).map_err(bad)?;
            validate_session_call(req.v)?;
            s.check_owner(&req.fence)?;
            Ok(encode(&s.report().await))
        }
        "describe" => {
            let req: SessionCall = decode(payload).map_err(bad)?;
            validate_session_call(req.v)?;
            s.check(&req.fence)?;
            Ok(encode(&describe(ctx)))
        }
        "close" => {
            let req: SessionCall = decode(payload).map_err(bad)?;
            validate_session_call(req.v)?;
            s.check(&req.fence)?;
            let report = s.report().await;
            s.close();
            tracing::info!(session = %s.id, "session closed");
            Ok(encode(&ContextReport { closed: true, ..report }))
        }
        other => Err(err(
            ErrorCode::BadRequest,
            format!("unknown session call {other:?} (ensure_prefix, prefill_suffix, decode, explain, describe, close)"),
        )),
    }
}

/// `decode`: streams to `reply` like a generation.
async fn stream_decode(ctx: &ServeContext, s: &mut Session, payload: &[u8], reply: String) {
    let req = decode::<DecodeRequest>(payload).map_err(|e| err(ErrorCode::BadRequest, e.to_string()));
    let request_id = req.as_ref().map(|r| r.request_id.clone()).unwrap_or_default();
    let sink = ChunkSink::new(
        ctx.client.clone(),
        reply,
        request_id.clone(),
        Some(ctx.worker_id.clone()),
    );
    let checked = match req {
        Ok(req) => validate_decode(&req, &ctx.limits)
            .and_then(|()| s.check(&req.fence))
            .map(|()| req),
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
    let cancel = ctx.cancels.insert(&request_id, sink.subject());
    let events = s.backend.decode(req.config, cancel.clone());
    let attrs = crate::worker::telemetry::attributes("text_completion", &ctx.model_name, &ctx.worker_id, &ctx.backend);
    pump(ctx, &sink, events, &cancel, None, &attrs, &mut Default::default(), None).await;
    ctx.cancels.remove(&request_id);
}
