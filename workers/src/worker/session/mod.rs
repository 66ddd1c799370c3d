//! Sessions on a worker (seed 002): the SessionActors and the owner fence.
//!
//! A coordinator forwards `{p}.v1.session.open` to `{p}.v1.worker.{wid}.session_open`;
//! [`SessionHost::open`] checks the request, applies the fence and opens a
//! [`switchyard_backend::ModelSession`] on the backend (a pinned KV slot). Each
//! session is then a SessionActor ([`actor`]), linked under the WorkerActor, that owns
//! its state ([`state`]) and answers `{p}.v1.session.{sid}.*` one call at a time.
//!
//! Fencing: the worker remembers the owner of the latest open. An open by another
//! owner supersedes it: the older owner's sessions give their slots back and answer
//! `stale_fence` from then on. A call whose `fence` names someone other than the
//! session's owner is `not_owner`. A closed (or idle-expired) session answers
//! `session_closed` until it is forgotten a while later; after that nothing answers,
//! which clients report as `session_closed` too.

mod actor;
mod adopt;
mod moving;
mod state;

use crate::worker::context::ServeContext;
use actor::{SessionActor, SessionArgs};
use ractor::{Actor, ActorCell, ActorId};
use state::{describe, err, wire, HostState, Session};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_messages::session::{OpenSessionRequest, SessionModelInfo, SessionOpened};
use switchyard_messages::{decode, encode, ErrorCode, ErrorReply, WireError, PROTOCOL_VERSION};

/// An open's (or adoption's) answer: [`SessionOpened`], or an [`ErrorReply`].
fn answer(result: Result<SessionOpened, WireError>) -> Vec<u8> {
    match result {
        Ok(opened) => encode(&opened),
        Err(error) => encode(&ErrorReply {
            v: PROTOCOL_VERSION,
            error,
        }),
    }
}

/// Model types every switchyard worker serves (GGUF, llama family).
pub const MODEL_TYPES: &[&str] = &["", "llama", "gguf"];

/// The sessions of one worker.
pub struct SessionHost {
    ctx: Arc<ServeContext>,
    subjects: switchyard_messages::Subjects,
    /// A session unused this long is closed (its slot given back).
    idle: Duration,
    state: Arc<Mutex<HostState>>,
    /// The WorkerActor: every SessionActor is linked under it.
    supervisor: ActorCell,
}

impl SessionHost {
    /// Sessions of the worker behind `ctx`, closed after `idle` without calls.
    pub fn new(
        ctx: Arc<ServeContext>,
        subjects: switchyard_messages::Subjects,
        idle: Duration,
        supervisor: ActorCell,
    ) -> Arc<Self> {
        Arc::new(Self {
            ctx,
            subjects,
            idle,
            state: Arc::default(),
            supervisor,
        })
    }

    /// Live (not closed, not stale) sessions.
    pub fn open_sessions(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.sessions
            .values()
            .filter(|e| !e.stale.load(Ordering::Acquire) && !e.stale.closed.load(Ordering::Acquire))
            .count()
    }

    /// Handles `session_open`: the answer is a [`SessionOpened`] or an [`ErrorReply`].
    pub async fn handle_open(self: &Arc<Self>, payload: &[u8]) -> Vec<u8> {
        let result = match decode::<OpenSessionRequest>(payload) {
            Ok(req) => self.open(req).await,
            Err(e) => Err(err(ErrorCode::BadRequest, e.to_string())),
        };
        answer(result)
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
        let fresh = Session {
            id: id.clone(),
            owner: req.fence.clone(),
            backend,
            num_ctx,
            bos: !req.config.disable_bos,
            stale: Arc::default(),
            closed: false,
            prefix: None,
            moved_to: None,
        };
        self.install(fresh, false).await?;
        tracing::info!(worker = %ctx.worker_id, session = %id, owner = %req.fence, num_ctx, "session opened");
        Ok(SessionOpened {
            v: PROTOCOL_VERSION,
            session_id: id,
            worker_id: ctx.worker_id.clone(),
            num_ctx,
            info,
        })
    }

    /// Makes `session` live: its subscriptions (and, when `adopted`, the one for
    /// calls passed on by the worker it moved from), its entry, its actor. Refused
    /// as `stale_fence` when another owner opened on this worker meanwhile; the
    /// session's slot is then given back.
    async fn install(&self, session: Session, adopted: bool) -> Result<(), WireError> {
        let (ctx, id) = (&self.ctx, session.id.clone());
        let subs = async {
            let calls = ctx
                .client
                .queue_subscribe(self.subjects.session_all(&id), moving::QUEUE.into())
                .await?;
            let relayed = match adopted {
                true => Some(
                    ctx.client
                        .subscribe(self.subjects.session_relay(&ctx.worker_id, &id, "*"))
                        .await?,
                ),
                false => None,
            };
            Ok::<_, async_nats::SubscribeError>((calls, relayed))
        };
        let (sub, relayed) = match subs.await {
            Ok(s) => s,
            Err(e) => {
                session.backend.close();
                return Err(err(ErrorCode::Internal, format!("subscribing for the session: {e}")));
            }
        };
        {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if st.owner.as_deref() != Some(session.owner.as_str()) {
                session.backend.close();
                return Err(err(
                    ErrorCode::StaleFence,
                    "a newer owner opened a session on this worker meanwhile",
                ));
            }
            st.sessions.insert(
                id.clone(),
                state::Entry {
                    owner: session.owner.clone(),
                    stale: session.stale.clone(),
                    backend: session.backend.clone(),
                    actor: None,
                },
            );
        }
        let args = SessionArgs {
            ctx: ctx.clone(),
            session,
            sub,
            relayed,
            idle: self.idle,
            table: self.state.clone(),
        };
        match Actor::spawn_linked(None, SessionActor, args, self.supervisor.clone()).await {
            Ok((actor, _)) => {
                if let Some(e) = self
                    .state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .sessions
                    .get_mut(&id)
                {
                    e.actor = Some(actor.get_cell());
                }
                Ok(())
            }
            Err(e) => {
                self.forget(&id);
                Err(err(ErrorCode::Internal, format!("starting the session's actor: {e}")))
            }
        }
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
        for e in st.sessions.values() {
            if e.owner != fence {
                e.stale.flag.store(true, Ordering::Release);
                e.stale.wake.notify_one();
            }
        }
    }

    /// What this worker reports about its model (seed 002 `Describe`).
    pub fn describe(&self) -> SessionModelInfo {
        describe(&self.ctx)
    }

    /// Closes session `id`'s slot and forgets it.
    fn forget(&self, id: &str) {
        let entry = self.state.lock().unwrap_or_else(|p| p.into_inner()).sessions.remove(id);
        if let Some(e) = entry {
            e.backend.close();
        }
    }

    /// The SessionActor `actor` failed (its caller got an error reply): close its
    /// session and forget it. Returns the session id, `None` if it was not a session's.
    pub fn actor_failed(&self, actor: ActorId) -> Option<String> {
        let id = {
            let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.sessions
                .iter()
                .find(|(_, e)| e.actor.as_ref().map(|a| a.get_id()) == Some(actor))
                .map(|(id, _)| id.clone())
        }?;
        self.forget(&id);
        Some(id)
    }

    /// Fault injection (supervision tests): session `id`'s actor panics on its next
    /// call.
    pub fn arm_panic(&self, id: &str) {
        if let Some(e) = self.state.lock().unwrap_or_else(|p| p.into_inner()).sessions.get(id) {
            e.stale.panic_next.store(true, Ordering::Release);
        }
    }
}
