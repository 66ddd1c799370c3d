//! Both ends of a session's move (protocol 1.13, [`super::moving`]): the adopting
//! worker's `session_adopt`, and the draining worker offering every live session.

use super::state::{err, wire, Prefix, Session};
use super::SessionHost;
use crate::worker::kv_transfer::{self, TransferState};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use switchyard_backend::Prompt;
use switchyard_messages::session::{AdoptSessionRequest, SessionOpened};
use switchyard_messages::{decode, ErrorCode, WireError, PROTOCOL_VERSION};

impl SessionHost {
    /// Handles `session_adopt`: the answer is a [`SessionOpened`] or an [`ErrorReply`].
    pub async fn handle_adopt(self: &Arc<Self>, payload: &[u8]) -> Vec<u8> {
        let result = match decode::<AdoptSessionRequest>(payload) {
            Ok(req) => self.adopt(req).await,
            Err(e) => Err(err(ErrorCode::BadRequest, e.to_string())),
        };
        super::answer(result)
    }

    /// Adopts a session a draining peer moves here: a slot, the KV of its resident
    /// tokens pulled from the peer (what could not be pulled is computed), its state,
    /// its subscriptions and actor. A refusal a coordinator may try elsewhere is
    /// retryable (`unavailable`, `overloaded`).
    pub async fn adopt(self: &Arc<Self>, req: AdoptSessionRequest) -> Result<SessionOpened, WireError> {
        let ctx = &self.ctx;
        let began = Instant::now();
        if req.v > PROTOCOL_VERSION {
            return Err(err(
                ErrorCode::UnsupportedVersion,
                format!("protocol v{} is newer than this worker's v{PROTOCOL_VERSION}", req.v),
            ));
        }
        if req.owner.is_empty() || !switchyard_messages::subjects::is_valid_token(&req.session_id) {
            return Err(err(
                ErrorCode::BadRequest,
                "a moved session needs its owner and a valid id",
            ));
        }
        let late = || req.deadline_ms > 0 && switchyard_fabric::now_ms() > req.deadline_ms;
        if late() {
            return Err(err(ErrorCode::DeadlineExceeded, "the draining worker no longer waits"));
        }
        if req.model != ctx.model_name {
            return Err(err(
                ErrorCode::UnknownModel,
                format!(
                    "worker {} serves {:?}, not {:?}",
                    ctx.worker_id, ctx.model_name, req.model
                ),
            ));
        }
        let format = ctx.model.kv_transfer().and_then(|kv| kv.kv_format()).map(|f| f.key());
        if format.as_deref() != Some(req.format.as_str()) {
            return Err(err(
                ErrorCode::Unavailable,
                format!(
                    "worker {}: another KV format; the session's KV cannot come here",
                    ctx.worker_id
                ),
            ));
        }
        ctx.check_open()?;
        self.claim(&req.owner)?;
        let backend = ctx.model.open_session().await.map_err(wire)?;
        let info = self.describe();
        if req.resident.len() > req.num_ctx.min(info.effective_context) as usize {
            backend.close();
            return Err(err(
                ErrorCode::Unavailable,
                format!("worker {}: the session's context does not fit here", ctx.worker_id),
            ));
        }
        let request_id = format!("session-{}", req.session_id);
        let prompt = Prompt::Tokens(req.resident.clone());
        let peer = Some((req.peer.clone(), req.resident.len()));
        let pulled = kv_transfer::pull(ctx, peer, true, &request_id, &prompt, None).await;
        let update = match backend.set_resident(req.resident.clone(), false).await {
            Ok(u) => u,
            Err(e) => {
                backend.close();
                return Err(wire(e));
            }
        };
        // Too late: the draining worker has given up and keeps the session itself.
        if late() {
            backend.close();
            return Err(err(ErrorCode::DeadlineExceeded, "the draining worker no longer waits"));
        }
        let session = Session {
            id: req.session_id.clone(),
            owner: req.owner.clone(),
            backend,
            num_ctx: req.num_ctx.min(info.effective_context),
            bos: req.bos,
            stale: Arc::default(),
            closed: false,
            prefix: req.prefix.map(|p| Prefix {
                tokens: p.tokens,
                manifest: p.manifest,
                digest: p.digest,
                byte_hash: p.byte_hash,
            }),
            moved_to: None,
        };
        let num_ctx = session.num_ctx;
        // A race with an open of another owner: another worker may still adopt it.
        self.install(session, true).await.map_err(|e| match e.code {
            ErrorCode::StaleFence => err(ErrorCode::Unavailable, e.message),
            _ => e,
        })?;
        TransferState::add(&ctx.transfer.sessions_adopted, 1);
        tracing::info!(
            worker = %ctx.worker_id,
            session = %req.session_id,
            from = %req.peer,
            resident = req.resident.len(),
            pulled,
            computed = update.computed,
            ms = began.elapsed().as_millis() as u64,
            "session adopted from a draining worker"
        );
        Ok(SessionOpened {
            v: PROTOCOL_VERSION,
            session_id: req.session_id,
            worker_id: ctx.worker_id.clone(),
            num_ctx,
            info,
        })
    }

    /// `owner` may have a session here without superseding anyone: nobody owns this
    /// worker's sessions, or `owner` does, or every session of the current owner is
    /// gone. It is then the owner.
    fn claim(&self, owner: &str) -> Result<(), WireError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let other = st.owner.as_deref().is_some_and(|o| o != owner);
        let live = st.sessions.values().any(|e| !e.stale.load(Ordering::Acquire));
        if other && live {
            return Err(err(
                ErrorCode::Unavailable,
                format!("worker {}: it holds sessions of another owner", self.ctx.worker_id),
            ));
        }
        st.owner = Some(owner.to_string());
        Ok(())
    }

    /// The worker drains: offers each live session to another worker (each between
    /// two of its calls, all at once), each waiting until `deadline` at most; returns
    /// how many moved.
    pub async fn move_all(&self, deadline: tokio::time::Instant) -> usize {
        if !self.ctx.handover.enabled() {
            return 0;
        }
        let actors: Vec<_> = {
            let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.sessions
                .values()
                .filter(|e| !e.stale.load(Ordering::Acquire) && !e.stale.closed.load(Ordering::Acquire))
                .filter_map(|e| e.actor.clone())
                .collect()
        };
        let moves = actors.into_iter().map(|cell| async move {
            let actor: ractor::ActorRef<super::actor::SessionMsg> = cell.into();
            // A decode running on it finishes first, within the deadline.
            let ms = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .as_millis() as u64;
            matches!(
                ractor::call_t!(actor, super::actor::SessionMsg::Move, ms, deadline),
                Ok(true)
            )
        });
        futures::future::join_all(moves)
            .await
            .into_iter()
            .filter(|m| *m)
            .count()
    }
}
