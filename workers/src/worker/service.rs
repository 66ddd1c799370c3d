//! The worker's NATS side: one request from arrival to its last chunk.
//!
//! A request forwarded by a coordinator carries `Sy-Stream-To` (the client's inbox);
//! the worker answers the coordinator on the NATS reply subject with an
//! [`Admission`], and streams chunks to the client. A request sent straight to the
//! worker (no header) streams to its reply subject and gets no admission message;
//! refusals then go to the stream as a terminal error chunk.

use super::coalesce::Coalescer;
use async_nats::service::Request;
use futures::{FutureExt, StreamExt};
use std::sync::Arc;
use std::time::Instant;
use switchyard_backend::{GenerateEvent, Prompt};
use switchyard_fabric::ChunkSink;
use switchyard_messages::subjects::{HEADER_ADMIT_BY, HEADER_FIRST_SEQ, HEADER_QUEUED_US, HEADER_STREAM_TO};
use switchyard_messages::{
    check_deadline, decode, encode, validate_request, Admission as AdmissionMsg, Constraint, ErrorCode, FinishReason,
    GenerateRequest, RequestHead, WireError, PROTOCOL_VERSION,
};

pub use super::context::ServeContext;
use super::handover::Pumped;
use super::reasoning::{Filters, ReasoningFilter};

/// Where a request's answer goes, and whether a coordinator waits for an
/// [`AdmissionMsg`] on the NATS reply subject.
pub(super) struct Target {
    pub to: String,
    pub via_coordinator: bool,
}

/// `Sy-Stream-To` when a coordinator forwarded the request, else the reply subject;
/// `None` (logged) when there is nowhere to answer.
pub(super) fn target(msg: &async_nats::Message) -> Option<Target> {
    let header = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(HEADER_STREAM_TO))
        .map(|v| v.as_str().to_string());
    let via_coordinator = header.is_some();
    match header.or_else(|| msg.reply.as_ref().map(|r| r.to_string())) {
        Some(to) => Some(Target { to, via_coordinator }),
        None => {
            tracing::warn!(subject = %msg.subject, "request without a reply subject or Sy-Stream-To; dropped");
            None
        }
    }
}

/// Tells the forwarding coordinator whether the request was admitted.
pub(super) async fn answer_admission(ctx: &ServeContext, request: &Request, refusal: Option<WireError>) {
    let answer = AdmissionMsg {
        v: PROTOCOL_VERSION,
        worker_id: ctx.worker_id.clone(),
        accepted: refusal.is_none(),
        error: refusal,
    };
    let _ = request.respond(Ok(encode(&answer).into())).await;
}

/// Handles one request on the `generate` (`chat == false`) or `chat` endpoint.
pub async fn handle(ctx: Arc<ServeContext>, request: Request, chat: bool) {
    let msg = &request.message;
    let Some(Target {
        to: stream_to,
        via_coordinator,
    }) = target(msg)
    else {
        return;
    };

    let decoded = decode::<GenerateRequest>(&msg.payload);
    // A refusal names the request: from the decoded request, or (only when it did not
    // decode) from its head read alone.
    let refused_id = match &decoded {
        Ok(req) => req.head.request_id.clone(),
        Err(_) => decode::<RequestHead>(&msg.payload)
            .map(|h| h.request_id)
            .unwrap_or_default(),
    };
    let parsed = decoded
        .map_err(|e| WireError::new(ErrorCode::BadRequest, e.to_string()))
        .and_then(|req| validate_request(&req, chat, &ctx.limits).map(|()| req))
        .and_then(|req| check_deadline(&req, switchyard_fabric::now_ms()).map(|()| req));
    let admitted = parsed.and_then(|req| {
        if !req.head.model.is_empty() && req.head.model != ctx.model_name {
            return Err(WireError::new(
                ErrorCode::UnknownModel,
                format!(
                    "worker {} serves {:?}, not {:?}",
                    ctx.worker_id, ctx.model_name, req.head.model
                ),
            ));
        }
        ctx.check_open()?;
        ctx.check_adapter(req.head.adapter.as_deref())?;
        if !req.resume_tokens.is_empty() && !ctx.model.resumes() {
            // Retryable: another worker (a cpu one) may take the resumed stream.
            return Err(WireError::new(
                ErrorCode::Unavailable,
                format!("worker {} ({}) cannot resume a stream", ctx.worker_id, ctx.backend),
            ));
        }
        // A schema or regex that cannot compile is refused before admission, the same
        // way on every backend. (Lark grammars may name the model's special tokens:
        // the backend checks them against its vocabulary.)
        if let Some(c) = req
            .config
            .constraint
            .as_ref()
            .filter(|c| !matches!(c, Constraint::Lark { .. }))
        {
            switchyard_engine::constraint::check(c).map_err(|e| e.to_wire())?;
        }
        if let Some(c) = &req.config.constraint {
            // Retryable: another worker (cpu, metal) enforces what this one cannot.
            ctx.model.enforces(c).map_err(|why| {
                WireError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "worker {} ({}) cannot enforce config.constraint: {why}",
                        ctx.worker_id, ctx.backend
                    ),
                )
            })?;
        }
        // Tools: the prompt the backend runs and what parses calls out of it.
        let plan = if chat {
            Some(super::tools::plan(&req, ctx.model.tool_format(), &|c| {
                ctx.model.enforces(c)
            })?)
        } else {
            None
        };
        Ok((req, plan))
    });
    let admitted = match admitted {
        Ok((req, plan)) => ctx.admission.admit().map(|permit| (req, plan, permit)),
        Err(e) => Err(e),
    };

    let (req, plan, permit) = match admitted {
        Ok(ok) => ok,
        Err(error) => {
            tracing::debug!(worker = %ctx.worker_id, code = %error.code, "refused: {}", error.message);
            crate::worker::telemetry::record_rejection(&ctx.worker_id, error.code.as_str());
            if via_coordinator {
                answer_admission(&ctx, &request, Some(error)).await;
            } else {
                ChunkSink::new(ctx.client.clone(), stream_to, refused_id, Some(ctx.worker_id.clone()))
                    .error(error)
                    .await;
            }
            return;
        }
    };

    let header = |name: &str| -> u64 {
        msg.headers
            .as_ref()
            .and_then(|h| h.get(name))
            .and_then(|v| v.as_str().parse().ok())
            .unwrap_or(0)
    };
    if via_coordinator {
        // A forward its coordinator no longer waits for (it came late, e.g. after a
        // partition healed): the request went to another worker or failed, so running
        // it would be work for nobody.
        let admit_by = header(HEADER_ADMIT_BY);
        let now = switchyard_fabric::now_ms();
        if admit_by > 0 && now > admit_by {
            tracing::info!(
                worker = %ctx.worker_id,
                request = %req.head.request_id,
                late_ms = now - admit_by,
                "dropped a forward its coordinator had stopped waiting for"
            );
            crate::worker::telemetry::record_stale_forward(&ctx.worker_id);
            return;
        }
        answer_admission(&ctx, &request, None).await;
    }
    // A request that waited at a coordinator: its client has had keep-alives
    // numbered before ours, and the final metrics say how long it waited.
    let sink = ChunkSink::new(
        ctx.client.clone(),
        stream_to,
        req.head.request_id.clone(),
        Some(ctx.worker_id.clone()),
    )
    .after_queue(header(HEADER_FIRST_SEQ), header(HEADER_QUEUED_US))
    .predicted(kv_predicted(msg))
    .handovers(super::handover::taken(&ctx, msg));
    sink.tokens(Vec::new()).await;
    let cancel = ctx.cancels.insert(&req.head.request_id, sink.subject());
    let mut config = req.config.clone();
    config.adapter = req.head.adapter.clone();
    let (mut prompt, calls) = match plan {
        Some(plan) => {
            if plan.constraint.is_some() {
                config.constraint = plan.constraint;
            }
            (plan.prompt, plan.filter)
        }
        None => (Prompt::Text(req.prompt.clone().unwrap_or_default()), None),
    };
    let mut filters = Filters { reasoning: None, calls };
    if req.split_reasoning && chat {
        // A resumed stream's filter goes through the text its client was given
        // first, so it splits on exactly as the lost one would have.
        let mut f = ReasoningFilter::new(ctx.model.opens_reasoning(&prompt));
        if !req.resume_tokens.is_empty() {
            match ctx.model.detokenize(&req.resume_tokens) {
                Some(text) => f.replay(&text),
                None => f = ReasoningFilter::answering(),
            }
        }
        filters.reasoning = Some(f);
    }
    if !req.resume_tokens.is_empty() {
        prompt = Prompt::Continue {
            prompt: Box::new(prompt),
            generated: req.resume_tokens.clone(),
        };
    }
    tracing::debug!(worker = %ctx.worker_id, request = %req.head.request_id, "admitted");
    let op = if chat { "chat" } else { "text_completion" };
    let model = if req.head.model.is_empty() {
        &ctx.model_name
    } else {
        &req.head.model
    };
    let c = &req.config;
    // One span per generation, named and attributed by the GenAI conventions, a
    // child of the coordinator's span (trace context from the NATS headers).
    let span = tracing::info_span!(
        "gen_ai",
        otel.name = %format!("{op} {model}"),
        otel.kind = "server",
        gen_ai.operation.name = op,
        gen_ai.provider.name = crate::worker::telemetry::PROVIDER,
        gen_ai.request.model = %model,
        gen_ai.request.max_tokens = i64::from(c.max_tokens),
        gen_ai.request.temperature = f64::from(c.temperature),
        gen_ai.request.top_p = f64::from(c.top_p),
        gen_ai.request.top_k = i64::from(c.top_k),
        gen_ai.request.seed = c.seed.map(|s| s as i64),
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        error.type = tracing::field::Empty,
        switchyard.worker.id = %ctx.worker_id,
        switchyard.device = %ctx.device,
        switchyard.backend = %ctx.backend,
        switchyard.request.id = %req.head.request_id,
        switchyard.kv.cached_tokens = tracing::field::Empty,
        switchyard.handed_over = tracing::field::Empty,
        switchyard.queue_us = tracing::field::Empty,
        switchyard.speculative.draft_tokens = tracing::field::Empty,
        switchyard.speculative.accepted_tokens = tracing::field::Empty,
    );
    switchyard_fabric::trace::continue_from(&span, msg.headers.as_ref());
    let attrs = crate::worker::telemetry::attributes(op, model, &ctx.worker_id, &ctx.backend);
    let run = async {
        // A peer holding more of the prefix: its KV, where that beats computing it.
        let sink = super::kv_transfer::pull_for(&ctx, msg, &req.head, &prompt, &cancel, sink).await;
        let signal = super::handover::signal(&ctx, filters.calls.is_none());
        let events = ctx.model.generate(prompt.clone(), config.clone(), cancel.clone());
        let Pumped::HandOver(emitted) = pump(
            &ctx,
            &sink,
            events,
            &cancel,
            req.head.deadline_ms,
            &attrs,
            &mut filters,
            signal,
        )
        .await
        else {
            return;
        };
        // Draining: another worker streams on from here, or (none took it) this one.
        // The client's cancel lands on a fresh flag meanwhile (the engine's is spent).
        let cancel = ctx.cancels.insert(&req.head.request_id, sink.subject());
        let Some(next) = super::handover::continued(&req, &emitted) else {
            // Every token it may have is out: that is the end.
            sink.done(Vec::new(), FinishReason::Length, Default::default()).await;
            return;
        };
        let prompt = super::handover::continued_prompt(&prompt, &next);
        if super::handover::relay(&ctx, msg, &next, chat, &prompt, &sink, &cancel).await {
            return;
        }
        if cancel.is_cancelled() {
            sink.done(Vec::new(), FinishReason::Cancelled, Default::default()).await;
            return;
        }
        config.max_tokens = next.config.max_tokens;
        config.rng_position = next.config.rng_position;
        let events = ctx.model.generate(prompt, config, cancel.clone());
        pump(
            &ctx,
            &sink,
            events,
            &cancel,
            req.head.deadline_ms,
            &attrs,
            &mut filters,
            None,
        )
        .await;
    };
    tracing::Instrument::instrument(run, span).await;
    ctx.cancels.remove(&req.head.request_id);
    ctx.record_kv(&req);
    drop(permit);
    (ctx.on_complete)();
}

/// The coordinator's `Sy-Kv-Predicted` (`precise,blocks`), when it sent one.
fn kv_predicted(msg: &async_nats::Message) -> Option<(u32, u32)> {
    let v = msg
        .headers
        .as_ref()?
        .get(switchyard_messages::subjects::HEADER_KV_PREDICTED)?
        .as_str();
    let (precise, blocks) = v.split_once(',')?;
    Some((precise.parse().ok()?, blocks.parse().ok()?))
}

/// Streams a backend's events to `sink` until the end: tokens coalesced into chunks
/// (see [`super::coalesce`]), keep-alives while the backend is quiet, cancel when the
/// client is gone, `deadline_exceeded` when `deadline_ms` passes. Runs inside the
/// generation's span: opens `prefill` (until the first token) and `decode` child
/// spans, fills the span's usage fields, and records the GenAI metrics with `attrs`.
/// With `calls` (a request that offered tools), the calls' text is held back and
/// parsed into the last chunk's `tool_calls`. With `handover`, once the worker
/// drains (and the first token is out) it stops to be handed over
/// ([`super::handover`]).
#[allow(clippy::too_many_arguments)]
pub async fn pump(
    ctx: &ServeContext,
    sink: &ChunkSink,
    mut events: switchyard_backend::GenerateStream,
    cancel: &switchyard_backend::CancelFlag,
    deadline_ms: Option<u64>,
    attrs: &[opentelemetry::KeyValue],
    filters: &mut Filters,
    mut handover: Option<tokio::sync::watch::Receiver<bool>>,
) -> Pumped {
    let started = Instant::now();
    let span = tracing::Span::current();
    // `decode` is a live span from the first token on; `queue` and `prefill` are
    // written afterwards with their exact bounds (the queue wait is known only from
    // the final metrics).
    let admitted_at = std::time::SystemTime::now();
    let mut first_token_at = None;
    let mut phase: Option<tracing::Span> = None;
    let fail = |code: ErrorCode| {
        span.record("error.type", code.as_str());
        crate::worker::telemetry::record_failure(attrs, started.elapsed().as_secs_f64(), code.as_str());
    };
    let mut keepalive = tokio::time::interval(ctx.keepalive);
    keepalive.tick().await;
    let mut sent_since_tick = false;
    let mut out = Coalescer::new(ctx.coalesce);
    // Token ids sent or held for the client (with no `calls`: all it will get).
    let mut emitted = Vec::new();
    let mut handing = false;
    loop {
        let due = out.due();
        // While tokens are held, more of them need not wake this task: the timer
        // below comes for them. The end of the stream and errors still do.
        events.hold(due.is_some());
        let ev = tokio::select! {
            ev = events.next() => Some(ev),
            () = tokio::time::sleep_until(due.unwrap_or(started).into()), if due.is_some() => None,
            () = super::handover::begun(&mut handover), if !handing => {
                handing = true;
                None
            }
            _ = keepalive.tick() => {
                if deadline_ms.is_some_and(|d| switchyard_fabric::now_ms() >= d) {
                    // Tokens computed before the deadline reach the client, those
                    // queued quietly while a chunk was held too.
                    while let Some(Some(Ok(GenerateEvent::Token(t)))) = events.next().now_or_never() {
                        for t in filters.push(t) {
                            out.push(t, Instant::now());
                        }
                        if !out.has_room() {
                            send_held(sink, &mut out, cancel).await;
                        }
                    }
                    // Held text (of a call cut short: as text) goes out.
                    for t in filters.finish().0 {
                        out.push(t, Instant::now());
                    }
                    send_held(sink, &mut out, cancel).await;
                    fail(ErrorCode::DeadlineExceeded);
                    cancel.cancel();
                    sink.error(WireError::new(ErrorCode::DeadlineExceeded, "the request's deadline passed")).await;
                    return Pumped::Ended;
                }
                if !send_held(sink, &mut out, cancel).await && !sent_since_tick {
                    sink.tokens(Vec::new()).await;
                }
                sent_since_tick = false;
                continue;
            }
        };
        // This event (or, when the held tokens fell due, none), then every one
        // already waiting: those share the chunk at no cost in latency.
        let mut next = match ev {
            Some(ev) => Some(ev),
            None => events.next().now_or_never(),
        };
        while let Some(ev) = next.take() {
            match ev {
                Some(Ok(GenerateEvent::Token(t))) => {
                    if first_token_at.is_none() {
                        first_token_at = Some(std::time::SystemTime::now());
                        phase = Some(tracing::info_span!("decode"));
                    }
                    if filters.calls.is_none() {
                        emitted.push(t.id);
                    }
                    for t in filters.push(t) {
                        out.push(t, Instant::now());
                    }
                    if out.has_room() {
                        next = events.next().now_or_never();
                    }
                }
                Some(Ok(GenerateEvent::Done {
                    mut finish_reason,
                    metrics,
                })) => {
                    drop(phase.take());
                    let mut tool_calls = Vec::new();
                    let (tail, parsed) = filters.finish();
                    for t in tail {
                        out.push(t, Instant::now());
                    }
                    // Calls cut off by max_tokens keep `length`; the whole ones still
                    // come back.
                    if finish_reason == FinishReason::Stop && !parsed.is_empty() {
                        finish_reason = FinishReason::ToolCalls;
                    }
                    if matches!(finish_reason, FinishReason::ToolCalls | FinishReason::Length) {
                        tool_calls = parsed;
                    }
                    if let Some(first) = first_token_at {
                        crate::worker::telemetry::record_phases(&span, admitted_at, metrics.queue_us, first);
                    }
                    ctx.recent.lock().unwrap_or_else(|p| p.into_inner()).record(&metrics);
                    span.record("gen_ai.usage.input_tokens", i64::from(metrics.prompt_tokens));
                    span.record("gen_ai.usage.output_tokens", i64::from(metrics.generated_tokens));
                    span.record("gen_ai.response.finish_reasons", finish_reason.as_str());
                    span.record("switchyard.kv.cached_tokens", i64::from(metrics.cached_tokens));
                    span.record("switchyard.queue_us", switchyard_fabric::trace::int(metrics.queue_us));
                    if metrics.draft_tokens > 0 {
                        span.record("switchyard.speculative.draft_tokens", i64::from(metrics.draft_tokens));
                        span.record(
                            "switchyard.speculative.accepted_tokens",
                            i64::from(metrics.accepted_tokens),
                        );
                    }
                    crate::worker::telemetry::record_success(attrs, &metrics);
                    // The held tokens ride on the final chunk.
                    sink.finish(out.take(), finish_reason, metrics, tool_calls).await;
                    return Pumped::Ended;
                }
                Some(Err(e)) => {
                    // Tokens before an error reach the client (it resumes after them).
                    send_held(sink, &mut out, cancel).await;
                    fail(e.code());
                    sink.error(e.to_wire()).await;
                    return Pumped::Ended;
                }
                None => {
                    send_held(sink, &mut out, cancel).await;
                    fail(ErrorCode::Internal);
                    sink.error(WireError::new(
                        ErrorCode::Internal,
                        "the backend ended the stream without a result",
                    ))
                    .await;
                    return Pumped::Ended;
                }
            }
        }
        if out.ready(Instant::now()) {
            sent_since_tick |= send_held(sink, &mut out, cancel).await;
        }
        if handing && first_token_at.is_some() {
            drop(phase.take());
            span.record("switchyard.handed_over", true);
            return super::handover::stop(sink, &mut events, cancel, out.take(), emitted, filters).await;
        }
    }
}

/// Sends the tokens `out` holds as one chunk; false when it held none. A refused
/// publish cancels the generation (nobody can receive it).
async fn send_held(sink: &ChunkSink, out: &mut Coalescer, cancel: &switchyard_backend::CancelFlag) -> bool {
    let tokens = out.take();
    if tokens.is_empty() {
        return false;
    }
    if !sink.tokens(tokens).await {
        cancel.cancel();
    }
    true
}
