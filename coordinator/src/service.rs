//! The coordinator's NATS side: request endpoints (queue group), heartbeats in,
//! forwarding to workers with the client's inbox as the stream target.

use crate::actor::{CoordinatorMsg, Waited};
use crate::queue::Ticket;
use crate::registry::ttft::BYTES_PER_TOKEN;
use crate::registry::RouteQuery;
use crate::relay;
use crate::waiting::{self, Wait, Waiter};
use async_nats::RequestErrorKind;
use ractor::ActorRef;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_messages::kv;
use switchyard_messages::subjects::{
    HEADER_ADMIT_BY, HEADER_FIRST_SEQ, HEADER_HANDOVER, HEADER_KV_PEER, HEADER_KV_PREDICTED, HEADER_KV_PREFILL,
    HEADER_QUEUED_US, HEADER_REQUEST_ID, HEADER_STREAM_TO,
};
use switchyard_messages::{
    decode, encode, validate_batch, validate_classify, validate_embed, validate_request, Admission, BatchRequest,
    ClassifyRequest, EmbedRequest, ErrorCode, ErrorReply, GenerateRequest, InputLimits, RequestHead, StreamChunk,
    Subjects, WireError, PROTOCOL_VERSION,
};
use tokio::sync::oneshot;

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
    /// Disaggregated prefill for prompts of at least this many tokens.
    pub disagg_min_tokens: usize,
    /// Workers' KV holdings, to predict each forward's `cached_tokens`.
    pub holdings: crate::holdings::HoldingsBook,
    /// What one request may ask for.
    pub limits: std::sync::Arc<InputLimits>,
    /// How requests wait for a worker with room.
    pub waiter: Waiter,
    /// The next waiting request's ticket id.
    pub tickets: Arc<AtomicU64>,
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
    /// (1.7) Embeddings, one reply.
    Embed,
}

impl Verb {
    /// The worker endpoint's name.
    pub fn name(self) -> &'static str {
        match self {
            Verb::Generate => "generate",
            Verb::Chat => "chat",
            Verb::Classify => "classify",
            Verb::Batch => "batch",
            Verb::Embed => "embed",
        }
    }

    fn streams(self) -> bool {
        matches!(self, Verb::Generate | Verb::Chat)
    }
}

/// What routing needs of a request: its routing fields and, for generate and chat, the
/// prompt's prefix blocks (KV-aware routing), its length in bytes (predicted TTFT)
/// and its prediction key (predicted `cached_tokens`).
struct Admitted {
    head: RequestHead,
    blocks: Vec<u64>,
    prompt_bytes: usize,
    key: Vec<u8>,
}

/// Decodes and checks a request for `verb`: one decode of the whole request (a request
/// that does not decode is read again only for its id, to answer it).
fn admit(verb: Verb, payload: &[u8], limits: &InputLimits) -> Result<Admitted, (String, WireError)> {
    let bad = |e: switchyard_messages::DecodeError| {
        let id = decode::<RequestHead>(payload).map(|h| h.request_id).unwrap_or_default();
        (id, WireError::new(ErrorCode::BadRequest, e.to_string()))
    };
    let (mut blocks, mut prompt_bytes, mut key) = (Vec::new(), 0, Vec::new());
    let (head, checked) = match verb {
        Verb::Generate | Verb::Chat => {
            let r = decode::<GenerateRequest>(payload).map_err(bad)?;
            let checked = validate_request(&r, verb == Verb::Chat, limits);
            if checked.is_ok() {
                key = kv::routing_key(r.prompt.as_deref(), r.messages.as_deref());
                blocks = kv::adapter_blocks(r.head.adapter.as_deref(), &key);
                prompt_bytes = key.len();
                if r.messages.is_some() {
                    key.extend_from_slice(kv::ASSISTANT_TURN);
                }
            }
            (r.head, checked)
        }
        Verb::Classify => {
            let r = decode::<ClassifyRequest>(payload).map_err(bad)?;
            let checked = validate_classify(&r, limits);
            (r.head, checked)
        }
        Verb::Batch => {
            let r = decode::<BatchRequest>(payload).map_err(bad)?;
            let checked = validate_batch(&r, limits);
            (r.head, checked)
        }
        Verb::Embed => {
            let r = decode::<EmbedRequest>(payload).map_err(bad)?;
            let checked = validate_embed(&r, limits);
            (r.head, checked)
        }
    };
    let id = head.request_id.clone();
    checked.map_err(|e| (id.clone(), e))?;
    if let Some(d) = head.deadline_ms {
        let now = switchyard_fabric::now_ms();
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
        key,
    })
}

/// Routes one client request to a worker, trying up to `max_attempts` candidates,
/// inside a `route` span that continues the client's trace and is the parent of the
/// worker's span (its context replaces the client's in the forwarded headers).
pub async fn forward(ctx: ForwardContext, msg: async_nats::Message, verb: Verb) {
    route(ctx, msg, verb, false).await
}

/// (1.12) A stream relayed by a draining worker on `{p}.v1.relay.{verb}`: routed
/// like a request, streamed to its `Sy-Stream-To`, answered to the worker with an
/// [`Admission`].
pub async fn relayed(ctx: ForwardContext, msg: async_nats::Message, verb: Verb) {
    route(ctx, msg, verb, true).await
}

async fn route(ctx: ForwardContext, msg: async_nats::Message, verb: Verb, relayed: bool) {
    let span = tracing::info_span!(
        "route",
        otel.name = %format!("route {}", verb.name()),
        otel.kind = "server",
        gen_ai.request.model = tracing::field::Empty,
        switchyard.routing.worker = tracing::field::Empty,
        switchyard.routing.attempts = tracing::field::Empty,
        switchyard.routing.kv_blocks = tracing::field::Empty,
        switchyard.queue.wait_ms = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    switchyard_fabric::trace::continue_from(&span, msg.headers.as_ref());
    tracing::Instrument::instrument(forward_routed(ctx, msg, verb, relayed), span).await;
}

async fn forward_routed(ctx: ForwardContext, msg: async_nats::Message, verb: Verb, relayed: bool) {
    let span = tracing::Span::current();
    let header = |name: &str| {
        msg.headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    // A stream relayed by a draining worker (1.12): it streams to `Sy-Stream-To`, and
    // the worker, on the reply subject, waits for an admission answer.
    let relay = if relayed { msg.reply.clone() } else { None };
    let inbox = match relayed {
        true => header(HEADER_STREAM_TO).map(Into::into),
        false => msg.reply.clone(),
    };
    let Some(inbox) = inbox else {
        tracing::warn!(subject = %msg.subject, "request without a reply subject (or a relay without Sy-Stream-To); dropped");
        return;
    };
    let header_id = header(HEADER_REQUEST_ID).unwrap_or_default();
    // A request handed over by a stopping coordinator or a draining worker: its client
    // has had chunks already.
    let first_seq: u64 = header(HEADER_FIRST_SEQ).and_then(|v| v.parse().ok()).unwrap_or(0);
    let fail = |request_id: String, error: WireError, seq: u64| {
        let client = ctx.client.clone();
        let inbox = inbox.clone();
        let relay = relay.clone();
        let span = span.clone();
        async move {
            span.record("error.type", error.code.as_str());
            tracing::debug!(request = %request_id, code = %error.code, "request failed: {}", error.message);
            if let Some(relay) = relay {
                // The relaying worker goes on with the stream itself.
                return relay::answer(&client, relay, "", Some(error)).await;
            }
            let body = if verb.streams() {
                encode(&StreamChunk::failed(&request_id, seq, error))
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
        key,
    } = match admit(verb, &msg.payload, &ctx.limits) {
        Ok(ok) => ok,
        Err((id, e)) => return fail(if id.is_empty() { header_id } else { id }, e, first_seq).await,
    };
    let query = RouteQuery {
        model: req.model.clone(),
        backend: req.backend.clone(),
        worker: req.worker.clone(),
        blocks: if ctx.kv_routing { blocks } else { Vec::new() },
        prompt_bytes,
        room: Some(ctx.waiter.options.ahead),
        embed: verb == Verb::Embed,
        adapter: req.adapter.clone(),
    };
    span.record("gen_ai.request.model", req.model.as_str());
    span.record(
        "switchyard.routing.kv_blocks",
        switchyard_fabric::trace::int(query.blocks.len()),
    );

    // Wait in the fleet queue for a worker with room: until the request's own
    // `queue_ms`, its deadline, or the coordinator's queue timeout.
    let arrived = Instant::now();
    let (tenant, priority) = (req.tenant.clone().unwrap_or_default(), req.priority.unwrap_or_default());
    let mut wait_ms = req.queue_ms.unwrap_or(ctx.waiter.options.timeout.as_millis() as u64);
    if let Some(d) = req.deadline_ms {
        wait_ms = wait_ms.min(d.saturating_sub(switchyard_fabric::now_ms()));
    }
    let ticket = Ticket {
        id: ctx.tickets.fetch_add(1, Ordering::Relaxed),
        request_id: req.request_id.clone(),
        inbox: inbox.to_string(),
        model: req.model.clone(),
        tenant: tenant.clone(),
        priority,
        bytes: msg.payload.len() as u64,
        since: arrived,
    };
    let mut wait = Wait {
        id: ticket.id,
        until: arrived + Duration::from_millis(wait_ms),
        stream: verb.streams().then_some((inbox.as_str(), req.request_id.as_str())),
        seq: first_seq,
    };
    let record = |outcome| waiting::record(&req.model, priority, &tenant, outcome, arrived.elapsed());
    let (tx, rx) = oneshot::channel();
    let _ = ctx
        .actor
        .cast(CoordinatorMsg::Enqueue(ticket.clone(), query.clone(), tx));
    let mut answer = {
        let queue_span = tracing::info_span!(
            "queue",
            otel.name = "queue",
            switchyard.priority = priority.as_str(),
            switchyard.tenant = tenant.as_str(),
        );
        tracing::Instrument::instrument(wait.answer(&ctx.waiter, rx), queue_span).await
    };
    loop {
        let queued = arrived.elapsed();
        span.record("switchyard.queue.wait_ms", queued.as_millis() as i64);
        let workers = match answer {
            Waited::Grant(workers) => workers,
            Waited::Refused(e) => {
                record(if e.code == ErrorCode::Overloaded {
                    "timeout"
                } else {
                    "refused"
                });
                return fail(req.request_id.clone(), e, wait.seq).await;
            }
            Waited::Cancelled if relay.is_some() => {
                record("cancelled");
                let e = WireError::new(ErrorCode::Cancelled, "cancelled while waiting for a worker");
                return fail(req.request_id.clone(), e, wait.seq).await;
            }
            Waited::Handoff if relay.is_some() => {
                record("refused");
                let e = WireError::new(ErrorCode::Unavailable, "the coordinator is stopping");
                return fail(req.request_id.clone(), e, wait.seq).await;
            }
            Waited::Cancelled => {
                record("cancelled");
                let body = if verb.streams() {
                    encode(&StreamChunk::cancelled(&req.request_id, wait.seq))
                } else {
                    encode(&ErrorReply {
                        v: PROTOCOL_VERSION,
                        error: WireError::new(ErrorCode::Cancelled, "cancelled while waiting for a worker"),
                    })
                };
                let _ = ctx.client.publish(inbox.clone(), body.into()).await;
                return;
            }
            Waited::Handoff => {
                record("handoff");
                return waiting::hand_off(&ctx.waiter, &msg, &inbox, wait.seq).await;
            }
        };
        let routed = Routed {
            blocks: &query.blocks,
            key: if ctx.kv_routing { &key } else { &[] },
            adapter: query.adapter.as_deref(),
            relayed,
        };
        match try_workers(&ctx, &msg, &inbox, verb, workers, routed, wait.seq, queued).await {
            Tried::Admitted(worker_id) => {
                record("dispatched");
                if let Some(relay) = relay {
                    relay::answer(&ctx.client, relay, &worker_id, None).await;
                }
                return;
            }
            Tried::Failed(e) => {
                record("refused");
                return fail(req.request_id.clone(), e, wait.seq).await;
            }
            // Every worker was full after all (other coordinators filled them): back
            // to the front of the queue, while the request has time.
            Tried::Full(full, e) => {
                if Instant::now() >= wait.until {
                    record("timeout");
                    return fail(req.request_id.clone(), e, wait.seq).await;
                }
                let (tx, rx) = oneshot::channel();
                let _ = ctx
                    .actor
                    .cast(CoordinatorMsg::Requeue(ticket.clone(), query.clone(), tx, full));
                answer = wait.answer(&ctx.waiter, rx).await;
            }
        }
    }
}

/// How forwarding to the granted workers went.
enum Tried {
    /// This one admitted it: it streams to the client now.
    Admitted(String),
    /// Refused for good (or no worker answered): answer the client with this.
    Failed(WireError),
    /// Those workers refused for want of room (the last error says so).
    Full(Vec<String>, WireError),
}

/// What a forward says of the request's prefix: its blocks (counted as routed to the
/// worker that admits it) and its prediction key (empty: no prediction).
#[derive(Clone, Copy)]
struct Routed<'a> {
    blocks: &'a [u64],
    key: &'a [u8],
    adapter: Option<&'a str>,
    /// Relayed by a draining worker: its `Sy-Handover`, `Sy-Kv-Peer` and
    /// `Sy-Admit-By` count (from anyone else they are dropped).
    relayed: bool,
}

/// Forwards the request to `workers` in order until one admits it, with the client's
/// inbox as the stream target, the trace context, where its chunks' `seq` starts, how
/// long it waited and the `cached_tokens` predicted there.
#[allow(clippy::too_many_arguments)]
async fn try_workers(
    ctx: &ForwardContext,
    msg: &async_nats::Message,
    inbox: &str,
    verb: Verb,
    workers: Vec<String>,
    routed: Routed<'_>,
    first_seq: u64,
    queued: Duration,
) -> Tried {
    let span = tracing::Span::current();
    let mut last_error = WireError::new(ErrorCode::NoWorker, "no worker admitted the request");
    let mut full = Vec::new();
    let handover = if routed.relayed {
        relay::handover_peer(msg)
    } else {
        None
    };
    let relay_by = if routed.relayed { relay::admit_by(msg) } else { u64::MAX };
    for (attempt, worker_id) in workers.into_iter().take(ctx.max_attempts as usize).enumerate() {
        if switchyard_fabric::now_ms() >= relay_by {
            // The relaying worker goes on itself now: a later forward would be a
            // second stream to the client.
            return Tried::Failed(WireError::new(ErrorCode::Unavailable, "no worker took it in time"));
        }
        let mut headers = msg.headers.clone().unwrap_or_default();
        headers.insert(HEADER_STREAM_TO, inbox);
        headers.insert(HEADER_QUEUED_US, queued.as_micros().to_string().as_str());
        // A relaying worker's own limit, when sooner: past it, it goes on itself.
        let admit_by = (switchyard_fabric::now_ms() + ctx.admission_timeout.as_millis() as u64).min(relay_by);
        headers.insert(HEADER_ADMIT_BY, admit_by.to_string().as_str());
        if first_seq > 0 {
            headers.insert(HEADER_FIRST_SEQ, first_seq.to_string().as_str());
        }
        // Only this coordinator names a peer: a client's `Sy-Kv-Peer` goes no further.
        // A handed-over stream's names the worker that ran it (it holds the prompt and
        // the tokens so far), kept for a worker that can use its KV.
        let mut coordinators_only = vec![HEADER_KV_PEER, HEADER_KV_PREFILL];
        if !routed.relayed {
            coordinators_only.push(HEADER_HANDOVER);
        }
        for coordinators_only in coordinators_only {
            if headers.get(coordinators_only).is_some() {
                headers.insert(coordinators_only, "");
            }
        }
        let handed_from = handover
            .as_ref()
            .filter(|(from, _)| ctx.holdings.same_format(from, &worker_id));
        if let Some((from, tokens)) = handed_from {
            headers.insert(HEADER_KV_PEER, format!("{from},{tokens}").as_str());
        }
        if !routed.key.is_empty() {
            let predicted = ctx.holdings.predict(&worker_id, routed.adapter, routed.key);
            if let Some((precise, blocks)) = predicted {
                headers.insert(HEADER_KV_PREDICTED, format!("{precise},{blocks}").as_str());
            }
            // A peer holding more of the prefix: the worker may pull it from there.
            let peer = ctx.holdings.best_peer(&worker_id, routed.adapter, routed.key);
            let pullable = peer.as_ref().map_or(0, |(_, tokens)| *tokens as usize);
            if let (Some((peer, tokens)), None) = (peer, handed_from) {
                headers.insert(HEADER_KV_PEER, format!("{peer},{tokens}").as_str());
            }
            // A long prompt nobody holds: a prefill worker may compute it (1.12).
            let held = predicted.map_or(0, |p| p.0 as usize);
            let fresh = (routed.key.len() as f64 / BYTES_PER_TOKEN) as usize;
            let fresh = fresh.saturating_sub(held.max(pullable));
            // Most prompts are short: only a long one looks for a prefill worker.
            if handed_from.is_none() && verb.streams() && fresh >= ctx.disagg_min_tokens {
                if let Some(p) = ctx.holdings.prefiller(&worker_id, fresh, ctx.disagg_min_tokens) {
                    headers.insert(HEADER_KV_PREFILL, p.as_str());
                }
            }
        }
        switchyard_fabric::trace::inject(&span, &mut headers);
        span.record(
            "switchyard.routing.attempts",
            switchyard_fabric::trace::int(attempt + 1),
        );
        // The forward adds headers to a payload that fitted: a request that no longer
        // fits can never be delivered, to any worker — refuse it, do not retry it.
        let size = switchyard_fabric::nats::message_size(Some(&headers), msg.payload.len());
        if let Err(max) = switchyard_fabric::nats::fits(&ctx.client, size) {
            return Tried::Failed(WireError::new(
                ErrorCode::BadRequest,
                format!(
                    "the request is {size} bytes with the forwarding headers, over the NATS server's max_payload of \
                     {max}; shorten the prompt (or raise max_payload)"
                ),
            ));
        }
        let request = async_nats::Request::new()
            .payload(msg.payload.clone())
            .headers(headers)
            .timeout(Some(ctx.admission_timeout));
        let sent = Instant::now();
        let answer = ctx
            .client
            .send_request(ctx.subjects.worker(&worker_id, verb.name()), request)
            .await;
        // Every admission exchange measures the network to the worker; one that timed
        // out counts its whole wait, so a slow worker drops in the order at once.
        if answer.as_ref().is_ok() || answer.as_ref().is_err_and(|e| e.kind() == RequestErrorKind::TimedOut) {
            let _ = ctx
                .actor
                .cast(CoordinatorMsg::RoundTrip(worker_id.clone(), sent.elapsed()));
        }
        match answer {
            Ok(answer) => match decode::<Admission>(&answer.payload) {
                Ok(a) if a.accepted => {
                    span.record("switchyard.routing.worker", worker_id.as_str());
                    // The first candidate was counted when it was chosen.
                    if attempt > 0 {
                        let _ = ctx
                            .actor
                            .cast(CoordinatorMsg::Routed(worker_id.clone(), routed.blocks.to_vec()));
                    }
                    return Tried::Admitted(worker_id);
                }
                Ok(a) => {
                    let error = a
                        .error
                        .unwrap_or_else(|| WireError::new(ErrorCode::Internal, "refused without a reason"));
                    if !error.retryable {
                        return Tried::Failed(error);
                    }
                    tracing::debug!(worker = %worker_id, code = %error.code, "refused; trying the next worker");
                    if error.code == ErrorCode::Overloaded {
                        full.push(worker_id);
                    }
                    last_error = error;
                }
                Err(e) => {
                    last_error =
                        WireError::new(ErrorCode::Internal, format!("worker {worker_id} answered garbage: {e}"));
                }
            },
            Err(e) if e.kind() == RequestErrorKind::NoResponders => {
                ctx.holdings.remove(&worker_id);
                let _ = ctx.actor.cast(CoordinatorMsg::Remove(worker_id.clone()));
                last_error = WireError::new(ErrorCode::NoWorker, format!("worker {worker_id} is gone"));
            }
            Err(e) => {
                tracing::warn!(worker = %worker_id, "no admission answer: {e}");
                last_error = WireError::new(ErrorCode::WorkerLost, format!("worker {worker_id} did not answer: {e}"));
            }
        }
    }
    if full.is_empty() {
        Tried::Failed(last_error)
    } else {
        Tried::Full(full, last_error)
    }
}
