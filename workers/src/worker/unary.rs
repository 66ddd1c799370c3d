//! The one-reply verbs — classify, batch and embed: admitted like a generation
//! (same admission, same answer to a coordinator), answered with one reply.

use super::context::ServeContext;
use super::service::{answer_admission, target, Target};
use async_nats::service::Request;
use std::sync::Arc;
use switchyard_backend::Prompt;
use switchyard_messages::{
    decode, encode, validate_batch, validate_classify, validate_embed, BatchReply, BatchRequest, ClassifyItem,
    ClassifyReply, ClassifyRequest, EmbedRequest, ErrorCode, ErrorReply, WireError, PROTOCOL_VERSION,
};

/// The one-reply verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unary {
    /// Prefill-only: [`ClassifyRequest`] → [`ClassifyReply`].
    Classify,
    /// Batch generation: [`BatchRequest`] → [`BatchReply`].
    Batch,
    /// (1.7) Embeddings: [`EmbedRequest`] → [`EmbedReply`].
    Embed,
}

enum UnaryRequest {
    Classify(ClassifyRequest),
    Batch(BatchRequest),
    Embed(EmbedRequest),
}

/// Handles one request on the `classify` or `batch` endpoint: admitted like a
/// generation (same admission, same answer to a coordinator), answered with one
/// reply to the stream target, or an [`ErrorReply`] when refused on a direct call.
pub async fn handle_unary(ctx: Arc<ServeContext>, request: Request, verb: Unary) {
    let msg = &request.message;
    let Some(Target {
        to: reply_to,
        via_coordinator,
    }) = target(msg)
    else {
        return;
    };
    let bad = |e: switchyard_messages::DecodeError| WireError::new(ErrorCode::BadRequest, e.to_string());
    // One decode: the whole request, its head taken from it.
    let decoded = match verb {
        Unary::Classify => decode::<ClassifyRequest>(&msg.payload).map(|r| (r.head.clone(), UnaryRequest::Classify(r))),
        Unary::Batch => decode::<BatchRequest>(&msg.payload).map(|r| (r.head.clone(), UnaryRequest::Batch(r))),
        Unary::Embed => decode::<EmbedRequest>(&msg.payload).map(|r| (r.head.clone(), UnaryRequest::Embed(r))),
    };
    let parsed = decoded.map_err(bad).and_then(|(head, req)| {
        match &req {
            UnaryRequest::Classify(r) => validate_classify(r, &ctx.limits)?,
            UnaryRequest::Batch(r) => validate_batch(r, &ctx.limits)?,
            UnaryRequest::Embed(r) => validate_embed(r, &ctx.limits)?,
        }
        if head.deadline_ms.is_some_and(|d| switchyard_fabric::now_ms() >= d) {
            return Err(WireError::new(
                ErrorCode::DeadlineExceeded,
                "the request's deadline passed",
            ));
        }
        if !head.model.is_empty() && head.model != ctx.model_name {
            return Err(WireError::new(
                ErrorCode::UnknownModel,
                format!(
                    "worker {} serves {:?}, not {:?}",
                    ctx.worker_id, ctx.model_name, head.model
                ),
            ));
        }
        ctx.check_open()?;
        ctx.check_adapter(head.adapter.as_deref())?;
        Ok((head, req))
    });
    let parsed = match parsed {
        Ok((head, req)) => ctx.admission.admit().map(|permit| (head, req, permit)),
        Err(e) => Err(e),
    };
    let (head, req, permit) = match parsed {
        Ok(ok) => ok,
        Err(error) => {
            if via_coordinator {
                answer_admission(&ctx, &request, Some(error)).await;
            } else {
                let _ = ctx
                    .client
                    .publish(
                        reply_to,
                        encode(&ErrorReply {
                            v: PROTOCOL_VERSION,
                            error,
                        })
                        .into(),
                    )
                    .await;
            }
            return;
        }
    };
    if via_coordinator {
        answer_admission(&ctx, &request, None).await;
    }
    let body = match req {
        UnaryRequest::Classify(r) => {
            let prompts = r.prompts.into_iter().map(Prompt::Text).collect();
            let results = ctx
                .model
                .classify(prompts, r.return_logits)
                .await
                .into_iter()
                .map(|res| match res {
                    Ok(result) => ClassifyItem {
                        result: Some(result),
                        error: None,
                    },
                    Err(e) => ClassifyItem {
                        result: None,
                        error: Some(e.to_wire()),
                    },
                })
                .collect();
            encode(&ClassifyReply {
                v: PROTOCOL_VERSION,
                request_id: head.request_id.clone(),
                worker_id: ctx.worker_id.clone(),
                results,
            })
        }
        UnaryRequest::Embed(r) => super::embed::reply(&ctx, &head.request_id, r).await,
        UnaryRequest::Batch(r) => {
            let cancel = ctx.cancels.insert(&head.request_id, &reply_to);
            let prompts = r.prompts.into_iter().map(Prompt::Text).collect();
            let config = switchyard_messages::GenerateConfig {
                adapter: head.adapter.clone(),
                ..r.config
            };
            let results = ctx.model.batch_generate(prompts, config, cancel).await;
            ctx.cancels.remove(&head.request_id);
            encode(&BatchReply {
                v: PROTOCOL_VERSION,
                request_id: head.request_id.clone(),
                worker_id: ctx.worker_id.clone(),
                results,
            })
        }
    };
    let what = match verb {
        Unary::Classify => "classify",
        Unary::Batch => "batch",
        Unary::Embed => "embed",
    };
    let body = switchyard_fabric::nats::fit_reply(&ctx.client, body, what);
    if let Err(e) = ctx.client.publish(reply_to, body.into()).await {
        tracing::warn!(worker = %ctx.worker_id, "{what} reply not sent: {e}");
    }
    drop(permit);
    (ctx.on_complete)();
}
