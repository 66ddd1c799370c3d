//! `{p}.v1.session.open` at the coordinator: a session opened on the worker routing
//! picks.

use crate::actor::CoordinatorMsg;
use crate::registry::RouteQuery;
use crate::service::ForwardContext;
use async_nats::RequestErrorKind;
use std::time::Duration;
use switchyard_messages::{decode, encode, ErrorCode, ErrorReply, WireError, PROTOCOL_VERSION};

/// `{p}.v1.session.open`: picks a worker like a request (model, backend and worker
/// pins, load) and forwards the open to it; a worker that is full or unavailable is
/// skipped for the next. The worker's answer — [`switchyard_messages::session::SessionOpened`]
/// or an [`ErrorReply`] — goes back to the client as is.
pub async fn open_session(ctx: ForwardContext, request: async_nats::service::Request) {
    use switchyard_messages::session::OpenSessionRequest;
    let error_body = |error: WireError| {
        encode(&ErrorReply {
            v: PROTOCOL_VERSION,
            error,
        })
    };
    let req = match decode::<OpenSessionRequest>(&request.message.payload) {
        Ok(r) => r,
        Err(e) => {
            let body = error_body(WireError::new(ErrorCode::BadRequest, e.to_string()));
            let _ = request.respond(Ok(body.into())).await;
            return;
        }
    };
    let query = RouteQuery {
        model: req.model.clone(),
        backend: Some(req.backend.clone()).filter(|b| !b.is_empty()),
        worker: Some(req.worker_id.clone()).filter(|w| !w.is_empty()),
        ..RouteQuery::default()
    };
    let wait = ctx.admission_timeout.max(Duration::from_secs(10));
    place(ctx, request, query, "session_open", wait).await
}

/// (1.13) `{p}.v1.relay.session`: a draining worker moves a session; placed like an
/// open (the model's workers by load; the draining one refuses, being closed) and
/// forwarded to the worker's `session_adopt`. The answer goes back to the mover.
pub async fn adopt_session(ctx: ForwardContext, request: async_nats::service::Request) {
    use switchyard_messages::session::AdoptSessionRequest;
    let req = match decode::<AdoptSessionRequest>(&request.message.payload) {
        Ok(r) => r,
        Err(e) => {
            let body = encode(&ErrorReply {
                v: PROTOCOL_VERSION,
                error: WireError::new(ErrorCode::BadRequest, e.to_string()),
            });
            let _ = request.respond(Ok(body.into())).await;
            return;
        }
    };
    let query = RouteQuery {
        model: req.model.clone(),
        ..RouteQuery::default()
    };
    // Until the draining worker's deadline (the adopter pulls the KV and computes the
    // tail first); a worker that does not answer by then is not tried after (it may
    // still adopt: two workers would serve one session).
    let left = req.deadline_ms.saturating_sub(switchyard_fabric::now_ms());
    let wait = match req.deadline_ms {
        0 => Duration::from_secs(60),
        _ => Duration::from_millis(left + 1_000).min(Duration::from_secs(60)),
    };
    place(ctx, request, query, "session_adopt", wait).await
}

/// Forwards `request` to the first worker routing finds for `query` that does not
/// refuse it retryably, on that worker's `verb`; answers with its reply or the last
/// refusal.
async fn place(
    ctx: ForwardContext,
    request: async_nats::service::Request,
    query: RouteQuery,
    verb: &str,
    wait: Duration,
) {
    let error_body = |error: WireError| {
        encode(&ErrorReply {
            v: PROTOCOL_VERSION,
            error,
        })
    };
    let candidates = match ractor::call_t!(ctx.actor, CoordinatorMsg::Route, 5_000, query) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            let _ = request.respond(Ok(error_body(e).into())).await;
            return;
        }
        Err(e) => {
            let body = error_body(WireError::new(ErrorCode::Internal, format!("coordinator actor: {e}")));
            let _ = request.respond(Ok(body.into())).await;
            return;
        }
    };
    let mut last_error = WireError::new(ErrorCode::NoWorker, "no worker opened the session");
    for worker_id in candidates.into_iter().take(ctx.max_attempts as usize) {
        let forward = async_nats::Request::new()
            .payload(request.message.payload.clone())
            .timeout(Some(wait));
        match ctx
            .client
            .send_request(ctx.subjects.worker(&worker_id, verb), forward)
            .await
        {
            Ok(answer) => match decode::<ErrorReply>(&answer.payload) {
                Ok(refused) if refused.error.retryable => {
                    tracing::debug!(worker = %worker_id, code = %refused.error.code, "session refused; trying the next worker");
                    last_error = refused.error;
                }
                _ => {
                    let _ = request.respond(Ok(answer.payload)).await;
                    return;
                }
            },
            Err(e) if e.kind() == RequestErrorKind::NoResponders => {
                ctx.holdings.remove(&worker_id);
                let _ = ctx.actor.cast(CoordinatorMsg::Remove(worker_id.clone()));
                last_error = WireError::new(ErrorCode::NoWorker, format!("worker {worker_id} is gone"));
            }
            Err(e) => {
                last_error = WireError::new(ErrorCode::WorkerLost, format!("worker {worker_id} did not answer: {e}"));
                if verb == "session_adopt" {
                    break;
                }
            }
        }
    }
    let _ = request.respond(Ok(error_body(last_error).into())).await;
}
