//! The coordinator's NATS side: request endpoints (queue group), heartbeats in,
//! forwarding to workers with the client's inbox as the stream target.

use crate::actor::CoordinatorMsg;
use crate::registry::RouteQuery;
use async_nats::RequestErrorKind;
use ractor::ActorRef;
use std::time::Duration;
use switchyard_messages::subjects::{HEADER_REQUEST_ID, HEADER_STREAM_TO};
use switchyard_messages::{
    check_deadline, decode, encode, validate_request, Admission, ErrorCode, GenerateRequest, StreamChunk, Subjects,
    WireError,
};

/// What forwarding needs.
#[derive(Clone)]
pub struct ForwardContext {
    pub client: async_nats::Client,
    pub actor: ActorRef<CoordinatorMsg>,
    pub subjects: Subjects,
    pub admission_timeout: Duration,
    pub max_attempts: u32,
}

/// Routes one client request to a worker, trying up to `max_attempts` candidates.
pub async fn forward(ctx: ForwardContext, msg: async_nats::Message, chat: bool) {
    let Some(inbox) = msg.reply.clone() else {
        tracing::warn!(subject = %msg.subject, "request without a reply subject; dropped");
        return;
    };
    let header_id = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(HEADER_REQUEST_ID))
        .map(|v| v.as_str().to_string())
        .unwrap_or_default();
    let fail = |request_id: String, error: WireError| {
        let client = ctx.client.clone();
        let inbox = inbox.clone();
        async move {
            tracing::debug!(request = %request_id, code = %error.code, "request failed: {}", error.message);
            let chunk = StreamChunk::failed(&request_id, 0, error);
            let _ = client.publish(inbox, encode(&chunk).into()).await;
        }
    };
    let req = match decode::<GenerateRequest>(&msg.payload) {
        Ok(r) => r,
        Err(e) => return fail(header_id, WireError::new(ErrorCode::BadRequest, e.to_string())).await,
    };
    if let Err(e) = validate_request(&req, chat).and_then(|()| check_deadline(&req, switchyard_actors::now_ms())) {
        return fail(req.request_id.clone(), e).await;
    }
    let query = RouteQuery {
        model: req.model.clone(),
        backend: req.backend.clone(),
        worker: req.worker.clone(),
    };
    let candidates = match ractor::call_t!(ctx.actor, CoordinatorMsg::Route, 5_000, query) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return fail(req.request_id, e).await,
        Err(e) => {
            return fail(
                req.request_id,
                WireError::new(ErrorCode::Internal, format!("coordinator actor: {e}")),
            )
            .await
        }
    };

    let verb = if chat { "chat" } else { "generate" };
    let mut last_error = WireError::new(ErrorCode::NoWorker, "no worker admitted the request");
    for worker_id in candidates.into_iter().take(ctx.max_attempts as usize) {
        let mut headers = msg.headers.clone().unwrap_or_default();
        headers.insert(HEADER_STREAM_TO, inbox.as_str());
        let request = async_nats::Request::new()
            .payload(msg.payload.clone())
            .headers(headers)
            .timeout(Some(ctx.admission_timeout));
        match ctx
            .client
            .send_request(ctx.subjects.worker(&worker_id, verb), request)
            .await
        {
            Ok(answer) => match decode::<Admission>(&answer.payload) {
                Ok(a) if a.accepted => {
                    let _ = ctx.actor.cast(CoordinatorMsg::Routed(worker_id));
                    return;
                }
                Ok(a) => {
                    let error = a
                        .error
                        .unwrap_or_else(|| WireError::new(ErrorCode::Internal, "refused without a reason"));
                    if !error.retryable {
                        return fail(req.request_id, error).await;
                    }
                    tracing::debug!(worker = %worker_id, code = %error.code, "refused; trying the next worker");
                    last_error = error;
                }
                Err(e) => {
                    last_error =
                        WireError::new(ErrorCode::Internal, format!("worker {worker_id} answered garbage: {e}"));
                }
            },
            Err(e) if e.kind() == RequestErrorKind::NoResponders => {
                let _ = ctx.actor.cast(CoordinatorMsg::Remove(worker_id.clone()));
                last_error = WireError::new(ErrorCode::NoWorker, format!("worker {worker_id} is gone"));
            }
            Err(e) => {
                tracing::warn!(worker = %worker_id, "no admission answer: {e}");
                last_error = WireError::new(ErrorCode::WorkerLost, format!("worker {worker_id} did not answer: {e}"));
            }
        }
    }
    fail(req.request_id, last_error).await;
}
