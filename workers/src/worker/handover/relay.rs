//! The relaying side of a hand-over: the continuation sent to a coordinator, its
//! answer, and the wait for the taker's pulls.

use crate::worker::context::ServeContext;
use crate::worker::kv_transfer::TransferState;
use std::time::{Duration, Instant};
use switchyard_backend::Prompt;
use switchyard_fabric::ChunkSink;
use switchyard_messages::subjects::{
    HEADER_ADMIT_BY, HEADER_FIRST_SEQ, HEADER_HANDOVER, HEADER_KV_PEER, HEADER_REQUEST_ID, HEADER_STREAM_TO,
};
use switchyard_messages::{decode, encode, Admission, CancelRequest, ErrorCode, GenerateRequest, WireError};
use tokio::sync::watch;

/// The longest the relaying worker waits for a coordinator to place the stream
/// (the forward's `Sy-Admit-By`: no worker admits it later).
const PLACE_WITHIN: Duration = Duration::from_secs(3);

/// What a stream of `ctx`'s model watches to hand itself over; `None` when it
/// cannot be (hand-overs off, a backend that cannot export KV or resume, or
/// `eligible` false).
pub fn signal(ctx: &ServeContext, eligible: bool) -> Option<watch::Receiver<bool>> {
    let h = &ctx.handover;
    let able = h.enabled && eligible && ctx.model.resumes() && ctx.model.kv_transfer().is_some();
    able.then(|| h.begun.subscribe())
}

/// Hand-overs a stream had before it reached this worker (its `Sy-Handover`),
/// counted as taken over when there were any.
pub fn taken(ctx: &ServeContext, msg: &async_nats::Message) -> u32 {
    let n = handovers_before(msg);
    if n > 0 {
        TransferState::add(&ctx.transfer.taken_over, 1);
    }
    n
}

/// Hand-overs the stream had before reaching this worker (its `Sy-Handover`).
fn handovers_before(msg: &async_nats::Message) -> u32 {
    msg.headers
        .as_ref()
        .and_then(|h| h.get(HEADER_HANDOVER))
        .and_then(|v| v.as_str().rsplit(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Relays the continuation `next` (whose prompt and tokens are `prompt`) to a
/// coordinator for another worker to stream on `sink`'s subject from its next `seq`.
/// True when a worker took it: this worker's KV of it has been pulled (or the taker
/// chose to compute) when this returns, and a client's cancel that came meanwhile
/// (on `cancel`) has been passed on. False: nobody took it; go on here (or end, if
/// `cancel` is set).
pub async fn relay(
    ctx: &ServeContext,
    msg: &async_nats::Message,
    next: &GenerateRequest,
    chat: bool,
    prompt: &Prompt,
    sink: &ChunkSink,
    cancel: &switchyard_backend::CancelFlag,
) -> bool {
    let id = next.head.request_id.as_str();
    let Some(kv) = ctx.model.kv_transfer() else {
        return false;
    };
    let tokens = match kv.prompt_tokens(prompt).await {
        Ok(t) => t.len(),
        Err(_) => return false,
    };
    let mut req = next.clone();
    // The coordinator places it now or not at all: this worker goes on meanwhile.
    req.head.queue_ms = Some(0);
    req.head.worker = None;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(HEADER_STREAM_TO, sink.subject());
    headers.insert(HEADER_REQUEST_ID, id);
    headers.insert(HEADER_FIRST_SEQ, sink.next_seq().to_string().as_str());
    let hops = handovers_before(msg) + 1;
    headers.insert(HEADER_HANDOVER, format!("{},{hops}", ctx.worker_id).as_str());
    headers.insert(HEADER_KV_PEER, format!("{},{tokens}", ctx.worker_id).as_str());
    let admit_by = switchyard_fabric::now_ms() + PLACE_WITHIN.as_millis() as u64;
    headers.insert(HEADER_ADMIT_BY, admit_by.to_string().as_str());
    switchyard_fabric::trace::inject(&tracing::Span::current(), &mut headers);
    let subject = ctx.subjects.relay(if chat { "chat" } else { "generate" });
    ctx.handover.expect(id);
    let request = async_nats::Request::new()
        .payload(encode(&req).into())
        .headers(headers)
        .timeout(Some(PLACE_WITHIN + Duration::from_secs(1)));
    let began = Instant::now();
    let answer = match ctx.client.send_request(subject, request).await {
        Ok(answer) => decode::<Admission>(&answer.payload)
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("the coordinator answered garbage: {e}"))),
        Err(e) => Err(WireError::new(
            ErrorCode::Unavailable,
            format!("no coordinator placed it: {e}"),
        )),
    };
    let taker = match answer {
        Ok(a) if a.accepted => a.worker_id,
        Ok(a) => {
            if a.error.as_ref().is_some_and(|e| e.code == ErrorCode::Cancelled) {
                cancel.cancel();
            }
            let why = a
                .error
                .map_or_else(|| "refused".to_string(), |e| format!("{}: {}", e.code, e.message));
            return refused(ctx, id, &why);
        }
        Err(e) => return refused(ctx, id, &format!("{}: {}", e.code, e.message)),
    };
    if cancel.is_cancelled() {
        // The client cancelled while the stream moved: the taker has it now.
        let body = encode(&CancelRequest::new(sink.subject()));
        let _ = ctx.client.publish(ctx.subjects.cancel(id), body.into()).await;
    }
    TransferState::add(&ctx.transfer.handed_over, 1);
    tracing::info!(
        worker = %ctx.worker_id,
        request = %id,
        %taker,
        tokens,
        placed_ms = began.elapsed().as_millis() as u64,
        "stream handed over"
    );
    ctx.handover.await_pulls(id).await;
    true
}

fn refused(ctx: &ServeContext, request_id: &str, why: &str) -> bool {
    ctx.handover.forget(request_id);
    TransferState::add(&ctx.transfer.handover_fallbacks, 1);
    tracing::info!(worker = %ctx.worker_id, request = %request_id, "stream not handed over ({why}); it finishes here");
    false
}
