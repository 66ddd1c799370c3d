//! Disaggregated prefill (protocol 1.12): a `prefill` worker computes a long
//! prompt's KV for the worker that streams the request, which then pulls it
//! ([`super::pull`]) instead of computing it.
//!
//! [`serve`] is the prefill worker's `{p}.v1.worker.{wid}.prefill` endpoint: it
//! computes the prompt (given as the asker's own tokens, so both sides key the same
//! chain of blocks) under its ordinary admission, keeps the KV where a pull finds it
//! and answers how many tokens it holds. [`remote`] is the asking side, run when the
//! coordinator's forward names a prefill worker (`Sy-Kv-Prefill`). Any failure
//! there — a refusal, a full prefill worker, a timeout — leaves the prompt to be
//! computed where the request streams.

use super::TransferState;
use crate::worker::context::ServeContext;
use async_nats::service::Request;
use futures::StreamExt;
use std::time::{Duration, Instant};
use switchyard_backend::{GenerateEvent, Prompt};
use switchyard_messages::subjects::HEADER_KV_PREFILL;
use switchyard_messages::{
    decode, encode, ErrorCode, FinishReason, GenerateConfig, PrefillReply, PrefillRequest, WireError, PROTOCOL_VERSION,
};

/// The longest a decode worker waits for a prefill worker (a request's own deadline
/// may be sooner).
const PREFILL_TIMEOUT: Duration = Duration::from_secs(120);

/// The prefill worker's side: computes the asked prompt and answers.
/// The prefill worker's side: computes the asked prompt and answers; then keeps the
/// request's slot (its admission) until the asker's pull has gone quiet, so no other
/// request takes the KV before it is read.
pub async fn serve(ctx: std::sync::Arc<ServeContext>, request: Request) {
    let began = Instant::now();
    let (tokens, error, lease) = match compute(&ctx, &request.message).await {
        Ok((n, id, permit)) => (n, None, Some((id, permit))),
        Err(e) => {
            tracing::debug!(worker = %ctx.worker_id, code = %e.code, "prefill refused: {}", e.message);
            (0, Some(e), None)
        }
    };
    let reply = PrefillReply {
        v: PROTOCOL_VERSION,
        worker_id: ctx.worker_id.clone(),
        tokens,
        prefill_us: began.elapsed().as_micros() as u64,
        error,
    };
    if let Some((id, _)) = &lease {
        ctx.handover.expect(id);
    }
    let _ = request.respond(Ok(encode(&reply).into())).await;
    if let Some((id, permit)) = lease {
        ctx.handover.await_pulls(&id).await;
        drop(permit);
        (ctx.on_complete)();
    }
}

/// Computes a prefill: the prompt's tokens, the request id and the admission it holds.
async fn compute(
    ctx: &ServeContext,
    msg: &async_nats::Message,
) -> Result<(u32, String, crate::worker::admission::AdmissionPermit), WireError> {
    let req: PrefillRequest = decode(&msg.payload)
        .map_err(|e| WireError::new(ErrorCode::BadRequest, format!("not a prefill request: {e}")))?;
    if !req.model.is_empty() && req.model != ctx.model_name {
        return Err(WireError::new(
            ErrorCode::UnknownModel,
            format!(
                "worker {} serves {:?}, not {:?}",
                ctx.worker_id, ctx.model_name, req.model
            ),
        ));
    }
    ctx.check_open()?;
    ctx.check_adapter(req.adapter.as_deref())?;
    let unavailable = |why: &str| WireError::new(ErrorCode::Unavailable, format!("worker {}: {why}", ctx.worker_id));
    let kv = ctx
        .model
        .kv_transfer()
        .ok_or_else(|| unavailable("its backend does not export KV"))?;
    let format = kv
        .kv_format()
        .ok_or_else(|| unavailable("its model's digest is not computed yet"))?;
    if req.format != format.key() {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("KV format mismatch: worker {} computes {}", ctx.worker_id, format.key()),
        ));
    }
    if req.tokens.is_empty() {
        return Err(WireError::new(ErrorCode::BadRequest, "a prefill of no tokens"));
    }
    if req.deadline_ms.is_some_and(|d| switchyard_fabric::now_ms() >= d) {
        return Err(WireError::new(
            ErrorCode::DeadlineExceeded,
            "the request's deadline passed",
        ));
    }
    let permit = ctx.admission.admit()?;
    let span = tracing::info_span!(
        "kv_prefill",
        otel.name = "kv prefill",
        otel.kind = "server",
        switchyard.worker.id = %ctx.worker_id,
        switchyard.request.id = %req.request_id,
        gen_ai.usage.input_tokens = req.tokens.len() as i64,
    );
    switchyard_fabric::trace::continue_from(&span, msg.headers.as_ref());
    let n = req.tokens.len() as u32;
    // One token sampled and dropped: the prompt's KV is all computed and stays in
    // the slot (then the block store) for the pull.
    let config = GenerateConfig {
        max_tokens: 1,
        temperature: 0.0,
        adapter: req.adapter.clone(),
        ..GenerateConfig::default()
    };
    // Not a client's request: nobody may cancel it (the asker stops waiting instead).
    let cancel = switchyard_backend::CancelFlag::new();
    let run = async {
        let mut events = ctx.model.generate(Prompt::Tokens(req.tokens), config, cancel);
        while let Some(ev) = events.next().await {
            match ev {
                Ok(GenerateEvent::Done {
                    finish_reason: FinishReason::Cancelled,
                    ..
                }) => break,
                Ok(GenerateEvent::Done { metrics, .. }) => {
                    // Its prefill speed, as heartbeats announce it, counts these too.
                    ctx.recent.lock().unwrap_or_else(|p| p.into_inner()).record(&metrics);
                    return Ok(n);
                }
                Ok(GenerateEvent::Token(_)) => {}
                Err(e) => return Err(e.to_wire()),
            }
        }
        Err(WireError::new(
            ErrorCode::Internal,
            "the backend ended the prefill without a result",
        ))
    };
    let done = tracing::Instrument::instrument(run, span).await?;
    TransferState::add(&ctx.transfer.prefills_served, 1);
    Ok((done, req.request_id, permit))
}

/// What a prefill elsewhere gave: the worker holding the prompt's KV now, the tokens
/// it holds, and how long it took from here.
pub struct Prefilled {
    pub peer: String,
    pub tokens: usize,
    pub us: u64,
}

/// The asking side: when the forward names a prefill worker (`Sy-Kv-Prefill`) and the
/// prompt is longer than what this worker holds by two blocks or more, has it
/// compute the prompt; `None` (computing here) when it is not asked, not worth it, or
/// fails.
pub async fn remote(
    ctx: &ServeContext,
    msg: &async_nats::Message,
    request_id: &str,
    prompt: &Prompt,
    adapter: Option<&str>,
    deadline_ms: Option<u64>,
) -> Option<Prefilled> {
    let peer = msg.headers.as_ref()?.get(HEADER_KV_PREFILL)?.as_str().to_string();
    // A worker that does not pull would wait for KV it then never reads.
    if peer.is_empty() || peer == ctx.worker_id || !ctx.kv_pull {
        return None;
    }
    let kv = ctx.model.kv_transfer()?;
    let format = kv.kv_format()?;
    let tokens = kv.prompt_tokens(prompt).await.ok()?;
    let bt = format.block_tokens as usize;
    let held = kv
        .held_prefix(tokens.clone(), adapter.map(str::to_string))
        .await
        .unwrap_or(0);
    if held + 2 * bt >= tokens.len() {
        return None;
    }
    let span = tracing::info_span!(
        "kv_prefill",
        otel.name = "kv prefill (remote)",
        otel.kind = "client",
        switchyard.kv.peer = %peer,
        gen_ai.usage.input_tokens = tokens.len() as i64,
        error.type = tracing::field::Empty,
    );
    let req = PrefillRequest {
        v: PROTOCOL_VERSION,
        request_id: request_id.to_string(),
        model: ctx.model_name.clone(),
        format: format.key(),
        adapter: adapter.map(str::to_string),
        tokens,
        deadline_ms,
    };
    let mut headers = async_nats::HeaderMap::new();
    switchyard_fabric::trace::inject(&span, &mut headers);
    let wait = deadline_ms
        .map(|d| Duration::from_millis(d.saturating_sub(switchyard_fabric::now_ms())))
        .map_or(PREFILL_TIMEOUT, |left| left.min(PREFILL_TIMEOUT));
    let request = async_nats::Request::new()
        .payload(encode(&req).into())
        .headers(headers)
        .timeout(Some(wait));
    let began = Instant::now();
    let subject = ctx.subjects.worker(&peer, "prefill");
    let ask = async {
        let answer = ctx
            .client
            .send_request(subject, request)
            .await
            .map_err(|e| format!("no answer from {peer}: {e}"))?;
        let reply: PrefillReply = decode(&answer.payload).map_err(|e| format!("{peer} answered garbage: {e}"))?;
        match reply.error {
            Some(e) => Err(format!("{peer} refused: {}: {}", e.code, e.message)),
            None => Ok(reply.tokens as usize),
        }
    };
    match tracing::Instrument::instrument(ask, span.clone()).await {
        Ok(n) => {
            TransferState::add(&ctx.transfer.remote_prefills, 1);
            Some(Prefilled {
                peer,
                tokens: n,
                us: began.elapsed().as_micros() as u64,
            })
        }
        Err(why) => {
            span.record("error.type", "kv_prefill");
            tracing::info!(worker = %ctx.worker_id, request = %request_id, "remote prefill failed, computing here: {why}");
            TransferState::add(&ctx.transfer.remote_prefill_fallbacks, 1);
            None
        }
    }
}
