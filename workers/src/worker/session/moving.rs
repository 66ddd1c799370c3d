//! Sessions that move when their worker drains (protocol 1.13).
//!
//! On SIGTERM each live session is offered, between two of its calls, to the
//! coordinators on `{p}.v1.relay.session` ([`AdoptSessionRequest`]: its id, owner,
//! context, resident prefix and every resident token, and this worker as the KV's
//! source). A coordinator places it like an open; the adopting worker pulls the KV
//! from here, computes what it could not pull (the last token), subscribes to
//! the session's subjects and answers. Both workers' subscriptions share one queue
//! group, so every call reaches exactly one of them: what reaches this one after the
//! move (queued behind it, or in flight while it unsubscribes) is passed on to the
//! adopter on `{p}.v1.worker.{wid}.session_relay.{sid}.{verb}` with its reply
//! subject, and answered from there. The caller keeps its session id and fence and
//! sees no error.
//!
//! Nothing takes it (no other worker of the same KV format, none with a free slot, an
//! adopter whose owner differs, no answer in time): the session stays here and ends
//! with the worker, as before.

use super::state::{err, wire, Session};
use crate::worker::context::ServeContext;
use std::time::Duration;
use switchyard_messages::session::{AdoptSessionRequest, MovedPrefix, SessionOpened};
use switchyard_messages::{decode, encode, ErrorCode, ErrorReply, WireError, PROTOCOL_VERSION};

/// The queue group of every session subscription: a moving session's two workers
/// never both answer a call.
pub(super) const QUEUE: &str = "sy-session";

/// The longest a move may take: the adopter pulls the session's KV and computes its
/// tail before it answers.
const MOVE_WAIT: Duration = Duration::from_secs(60);

/// Time kept between the adopter's deadline and this worker's: for its answer to
/// travel back.
const ANSWER_SLACK: Duration = Duration::from_secs(2);

/// Offers session `s` to the coordinators, waiting until `deadline` at most (the
/// drain's grace); the adopting worker's id once it serves the session.
pub(super) async fn ask_adoption(
    ctx: &ServeContext,
    s: &Session,
    deadline: tokio::time::Instant,
) -> Result<String, WireError> {
    let wait = deadline
        .saturating_duration_since(tokio::time::Instant::now())
        .min(MOVE_WAIT);
    if wait <= ANSWER_SLACK {
        return Err(err(ErrorCode::DeadlineExceeded, "no time left in the drain to move it"));
    }
    let format = ctx
        .model
        .kv_transfer()
        .and_then(|kv| kv.kv_format())
        .ok_or_else(|| err(ErrorCode::Unavailable, "this worker's backend does not export KV"))?;
    let resident = s.backend.resident().await.map_err(wire)?;
    let req = AdoptSessionRequest {
        v: PROTOCOL_VERSION,
        session_id: s.id.clone(),
        owner: s.owner.clone(),
        model: ctx.model_name.clone(),
        format: format.key(),
        num_ctx: s.num_ctx,
        bos: s.bos,
        prefix: s.prefix.as_ref().map(|p| MovedPrefix {
            tokens: p.tokens.clone(),
            manifest: p.manifest.clone(),
            digest: p.digest.clone(),
            byte_hash: p.byte_hash.clone(),
        }),
        resident,
        peer: ctx.worker_id.clone(),
        deadline_ms: switchyard_fabric::now_ms() + (wait - ANSWER_SLACK).as_millis() as u64,
    };
    let ask = async_nats::Request::new()
        .payload(encode(&req).into())
        .timeout(Some(wait));
    let answer = ctx
        .client
        .send_request(ctx.subjects.relay("session"), ask)
        .await
        .map_err(|e| {
            err(
                ErrorCode::Unavailable,
                format!("no coordinator placed the session: {e}"),
            )
        })?;
    if let Ok(refused) = decode::<ErrorReply>(&answer.payload) {
        return Err(refused.error);
    }
    let opened: SessionOpened =
        decode(&answer.payload).map_err(|e| err(ErrorCode::Internal, format!("the adoption's answer: {e}")))?;
    Ok(opened.worker_id)
}

/// Passes a call that reached the moved session `session_id` here on to `adopter`,
/// with its reply subject and headers: the adopter answers the caller.
pub(super) async fn relay_call(ctx: &ServeContext, adopter: &str, session_id: &str, msg: async_nats::Message) {
    let Some(reply) = msg.reply else { return };
    let verb = msg.subject.rsplit('.').next().unwrap_or_default();
    let subject = ctx.subjects.session_relay(adopter, session_id, verb);
    let sent = match msg.headers {
        Some(headers) => {
            ctx.client
                .publish_with_reply_and_headers(subject, reply, headers, msg.payload)
                .await
        }
        None => ctx.client.publish_with_reply(subject, reply, msg.payload).await,
    };
    if let Err(e) = sent {
        tracing::warn!(session = %session_id, adopter = %adopter, "a call for the moved session was not passed on: {e}");
    }
}
