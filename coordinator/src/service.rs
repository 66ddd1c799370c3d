//! The coordinator's NATS side: request endpoints (queue group), heartbeats in,
//! forwarding to workers with the client's inbox as the stream target.

use crate::actor::CoordinatorMsg;
use crate::registry::RouteQuery;
use async_nats::RequestErrorKind;
use ractor::ActorRef;
use std::time::Duration;
use switchyard_messages::kv;
use switchyard_messages::subjects::{HEADER_REQUEST_ID, HEADER_STREAM_TO};
use switchyard_messages::{
    decode, encode, validate_batch, validate_classify, validate_request, Admission, BatchRequest, ClassifyRequest,
    ErrorCode, ErrorReply, GenerateRequest, InputLimits, RequestHead, StreamChunk, Subjects, WireError,
    PROTOCOL_VERSION,
};

/// What forwarding needs.
#[derive(Clone)]
pub struct ForwardContext {
    pub client: async_nats::Client,
    pub actor: ActorRef<CoordinatorMsg>,
    pub subjects: Subjects,
    pub admission_timeout: Duration,
    pub max_attempts: u32,
    /// KV-aware routing on.
    pub kv_routing: bool,
    /// What one request may ask for.
    pub limits: std::sync::Arc<InputLimits>,
}

/// What a request asks for; decides validation and how a failure is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// Streaming generation from a prompt.
    Generate,
    /// Streaming generation from messages.
    Chat,
    /// Prefill-only, one reply.
    Classify,
    /// Batch generation, one reply.
    Batch,
}

impl Verb {
    /// The worker endpoint's name.
    pub fn name(self) -> &'static str {
        match self {
            Verb::Generate => "generate",
            Verb::Chat => "chat",
            Verb::Classify => "classify",
            Verb::Batch => "batch",
        }
    }

    fn streams(self) -> bool {
        matches!(self, Verb::Generate | Verb::Chat)
    }
}

/// What routing needs of a request: its routing fields and, for generate and chat, the
/// prompt's prefix blocks (KV-aware routing) and its length in bytes (predicted TTFT).
struct Admitted {
    head: RequestHead,
    blocks: Vec<u64>,
    prompt_bytes: usize,
}

/// Decodes and checks a request for `verb`.
fn admit(verb: Verb, payload: &[u8], limits: &InputLimits) -> Result<Admitted, (String, WireError)> {
    let bad = |e: switchyard_messages::DecodeError| WireError::new(ErrorCode::BadRequest, e.to_string());
    let head: RequestHead = decode(payload).map_err(|e| (String::new(), bad(e)))?;
    let id = head.request_id.clone();
    let (mut blocks, mut prompt_bytes) = (Vec::new(), 0);
    let checked = match verb {
        Verb::Generate | Verb::Chat => decode::<GenerateRequest>(payload)
            .map_err(bad)
            .and_then(|r| validate_request(&r, verb == Verb::Chat, limits).map(|()| r))
            .map(|r| {
                let key = kv::routing_key(r.prompt.as_deref(), r.messages.as_deref());
                blocks = kv::prefix_blocks(&key);
                prompt_bytes = key.len();
            }),
        Verb::Classify => decode::<ClassifyRequest>(payload)
            .map_err(bad)
            .and_then(|r| validate_classify(&r, limits)),
        Verb::Batch => decode::<BatchRequest>(payload)
            .map_err(bad)
            .and_then(|r| validate_batch(&r, limits)),
    };
    checked.map_err(|e| (id.clone(), e))?;
    if let Some(d) = head.deadline_ms {
        let now = switchyard_actors::now_ms();
        if now >= d {
            let e = WireError::new(
                ErrorCode::DeadlineExceeded,
                format!("the request's deadline passed {} ms ago", now - d),
            );
            return Err((id, e));
        }
    }
    Ok(Admitted {
        head,
        blocks,
        prompt_bytes,
    })
}

/// Routes one client request to a worker, trying up to `max_attempts` candidates,
/// inside a `route` span that continues the client's trace and is the parent of the
/// worker's span (its context replaces the client's in the forwarded headers).
pub async fn forward(ctx: ForwardContext, msg: async_nats::Message, verb: Verb) {
    let span = tracing::info_span!(
        "route",
        otel.name = %format!("route {}", verb.name()),
        otel.kind = "server",
        gen_ai.request.model = tracing::field::Empty,
        switchyard.routing.worker = tracing::field::Empty,
        switchyard.routing.attempts = tracing::field::Empty,
        switchyard.routing.kv_blocks = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    switchyard_actors::trace::continue_from(&span, msg.headers.as_ref());
    tracing::Instrument::instrument(forward_routed(ctx, msg, verb), span).await;
}

async fn forward_routed(ctx: ForwardContext, msg: async_nats::Message, verb: Verb) {
    let span = tracing::Span::current();
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
        let span = span.clone();
        async move {
            span.record("error.type", error.code.as_str());
            tracing::debug!(request = %request_id, code = %error.code, "request failed: {}", error.message);
            let body = if verb.streams() {
                encode(&StreamChunk::failed(&request_id, 0, error))
            } else {
                encode(&ErrorReply {
                    v: PROTOCOL_VERSION,
                    error,
                })
            };
            let _ = client.publish(inbox, body.into()).await;
        }
    };
    let Admitted {
        head: req,
        blocks,
        prompt_bytes,
    } = match admit(verb, &msg.payload, &ctx.limits) {
        Ok(ok) => ok,
        Err((id, e)) => return fail(if id.is_empty() { header_id } else { id }, e).await,
    };
    let query = RouteQuery {
        model: req.model.clone(),
        backend: req.backend.clone(),
        worker: req.worker.clone(),
        blocks: if ctx.kv_routing { blocks } else { Vec::new() },
        prompt_bytes,
    };
    let query_blocks = query.blocks.clone();
    span.record("gen_ai.request.model", req.model.as_str());
    span.record(
        "switchyard.routing.kv_blocks",
        switchyard_actors::trace::int(query_blocks.len()),
    );
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

    let verb_name = verb.name();
    let mut last_error = WireError::new(ErrorCode::NoWorker, "no worker admitted the request");
    for (attempt, worker_id) in candidates.into_iter().take(ctx.max_attempts as usize).enumerate() {
        let mut headers = msg.headers.clone().unwrap_or_default();
        headers.insert(HEADER_STREAM_TO, inbox.as_str());
        switchyard_actors::trace::inject(&span, &mut headers);
        span.record(
            "switchyard.routing.attempts",
            switchyard_actors::trace::int(attempt + 1),
        );
        // The forward adds headers to a payload that fitted: a request that no longer
        // fits can never be delivered, to any worker — refuse it, do not retry it.
        let size = switchyard_actors::nats::message_size(Some(&headers), msg.payload.len());
        if let Err(max) = switchyard_actors::nats::fits(&ctx.client, size) {
            let e = WireError::new(
                ErrorCode::BadRequest,
                format!(
                    "the request is {size} bytes with the forwarding headers, over the NATS server's max_payload of \
                     {max}; shorten the prompt (or raise max_payload)"
                ),
            );
            return fail(req.request_id, e).await;
        }
        let request = async_nats::Request::new()
            .payload(msg.payload.clone())
            .headers(headers)
            .timeout(Some(ctx.admission_timeout));
        match ctx
            .client
            .send_request(ctx.subjects.worker(&worker_id, verb_name), request)
            .await
        {
            Ok(answer) => match decode::<Admission>(&answer.payload) {
                Ok(a) if a.accepted => {
                    span.record("switchyard.routing.worker", worker_id.as_str());
                    // The first candidate was counted when it was chosen.
                    if attempt > 0 {
                        let _ = ctx.actor.cast(CoordinatorMsg::Routed(worker_id, query_blocks.clone()));
                    }
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
            .timeout(Some(ctx.admission_timeout.max(Duration::from_secs(10))));
        match ctx
            .client
            .send_request(ctx.subjects.worker(&worker_id, "session_open"), forward)
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
                let _ = ctx.actor.cast(CoordinatorMsg::Remove(worker_id.clone()));
                last_error = WireError::new(ErrorCode::NoWorker, format!("worker {worker_id} is gone"));
            }
            Err(e) => {
                last_error = WireError::new(ErrorCode::WorkerLost, format!("worker {worker_id} did not answer: {e}"));
            }
        }
    }
    let _ = request.respond(Ok(error_body(last_error).into())).await;
}
