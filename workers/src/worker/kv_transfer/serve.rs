//! The source side: answers each [`KvPullRequest`] with one [`KvChunk`] of what the
//! model holds, after checking the puller's format and adapter keys are its own.

use super::TransferState;
use crate::worker::context::ServeContext;
use futures::StreamExt;
use std::sync::Arc;
use switchyard_messages::kv_transfer::KV_TRANSFER_VERSION;
use switchyard_messages::{ErrorCode, KvChunk, KvPullRequest, WireError, PROTOCOL_VERSION};

/// Pulls answered at once; more wait in the subscription (each holds one chunk).
const CONCURRENT: usize = 4;

/// The most prefix tokens a pull may name.
const MAX_TOKENS: usize = 1 << 20;

/// Serves `{p}.v1.kv.{wid}.pull` until the connection closes.
pub async fn serve(
    ctx: Arc<ServeContext>,
    subject: String,
) -> Result<tokio::task::JoinHandle<()>, async_nats::SubscribeError> {
    let requests = ctx.client.subscribe(subject).await?;
    Ok(tokio::spawn(requests.for_each_concurrent(CONCURRENT, move |msg| {
        let ctx = ctx.clone();
        async move {
            let Some(reply) = msg.reply else { return };
            let chunk = match export(&ctx, &msg.payload).await {
                Ok(chunk) => chunk,
                Err(error) => {
                    tracing::debug!(worker = %ctx.worker_id, code = %error.code, "kv pull refused: {}", error.message);
                    KvChunk {
                        v: PROTOCOL_VERSION,
                        format: String::new(),
                        first_block: 0,
                        blocks: 0,
                        part: 0,
                        held_blocks: 0,
                        data: Vec::new(),
                        error: Some(error),
                        tail: 0,
                    }
                }
            };
            TransferState::add(&ctx.transfer.served_chunks, 1);
            TransferState::add(&ctx.transfer.served_bytes, chunk.data.len() as u64);
            let body = switchyard_messages::encode(&chunk);
            if let Err(e) = switchyard_fabric::transfer::respond(&ctx.client, reply, body).await {
                tracing::debug!(worker = %ctx.worker_id, "kv chunk not sent: {e}");
            }
        }
    })))
}

fn refuse(code: ErrorCode, message: String) -> WireError {
    WireError::new(code, message)
}

async fn export(ctx: &ServeContext, payload: &[u8]) -> Result<KvChunk, WireError> {
    let req: KvPullRequest = switchyard_messages::decode(payload)
        .map_err(|e| refuse(ErrorCode::BadRequest, format!("not a kv pull request: {e}")))?;
    let kv = ctx.model.kv_transfer().ok_or_else(|| {
        refuse(
            ErrorCode::Unavailable,
            format!("worker {}: its backend does not export KV", ctx.worker_id),
        )
    })?;
    let format = kv.kv_format().ok_or_else(|| {
        refuse(
            ErrorCode::Unavailable,
            format!("worker {}: its model's digest is not computed yet", ctx.worker_id),
        )
    })?;
    let key = format.key();
    if req.transfer != KV_TRANSFER_VERSION {
        return Err(refuse(
            ErrorCode::UnsupportedVersion,
            format!(
                "kv transfer version {} asked, {KV_TRANSFER_VERSION} served",
                req.transfer
            ),
        ));
    }
    if req.format != key {
        return Err(refuse(
            ErrorCode::BadRequest,
            format!(
                "KV format mismatch: worker {} computes {key}, the puller {}",
                ctx.worker_id, req.format
            ),
        ));
    }
    if let Some(name) = &req.adapter {
        let ours = kv.adapter_key(name).map_err(|e| e.to_wire())?;
        if req.adapter_key.as_deref() != Some(ours.as_str()) {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!("LoRA adapter {name:?} differs: worker {} has {ours}", ctx.worker_id),
            ));
        }
    }
    let bt = format.block_tokens as usize;
    if req.tail > 0 {
        return export_tail(ctx, kv, req, &format).await;
    }
    if req.tokens.is_empty() || !req.tokens.len().is_multiple_of(bt) || req.tokens.len() > MAX_TOKENS {
        return Err(refuse(
            ErrorCode::BadRequest,
            format!(
                "a pull names whole blocks of {bt} tokens, at most {MAX_TOKENS}: {} given",
                req.tokens.len()
            ),
        ));
    }
    let block_bytes = format.block_bytes();
    let budget = switchyard_fabric::transfer::chunk_budget(&ctx.client);
    let parts = req.parts.max(1) as usize;
    let count = if parts > 1 {
        1
    } else {
        (req.blocks as usize).clamp(1, (budget / block_bytes).max(1))
    };
    if parts > 1 && (req.part as usize >= parts || block_bytes.div_ceil(parts) > budget) {
        return Err(refuse(
            ErrorCode::BadRequest,
            format!("part {} of {parts} does not fit", req.part),
        ));
    }
    let blocks = kv
        .export_kv(req.tokens, req.adapter, req.first_block as usize, count)
        .await
        .map_err(|e| e.to_wire())?;
    ctx.handover.served(&req.request_id);
    let mut data = blocks.data;
    if parts > 1 && blocks.count == 1 {
        let len = block_bytes.div_ceil(parts);
        let at = (req.part as usize * len).min(data.len());
        data = data[at..(at + len).min(data.len())].to_vec();
    }
    Ok(KvChunk {
        v: PROTOCOL_VERSION,
        format: key,
        first_block: req.first_block,
        blocks: blocks.count as u32,
        part: req.part,
        held_blocks: blocks.held_blocks as u32,
        data,
        error: None,
        tail: 0,
    })
}

/// (1.14) The KV of a prefix's tail: `tokens` is `first_block` whole blocks and
/// `tail` tokens more; sent when the model holds them all (else nothing, `tail` 0).
async fn export_tail(
    ctx: &ServeContext,
    kv: &dyn switchyard_backend::KvTransfer,
    req: KvPullRequest,
    format: &switchyard_messages::KvFormat,
) -> Result<KvChunk, WireError> {
    let (bt, tail) = (format.block_tokens as usize, req.tail as usize);
    let whole = req.first_block as usize * bt;
    if tail >= bt || req.tokens.len() != whole + tail || req.tokens.len() > MAX_TOKENS {
        return Err(refuse(
            ErrorCode::BadRequest,
            format!(
                "a tail of {tail} tokens after {} blocks of {bt}: {} tokens given",
                req.first_block,
                req.tokens.len()
            ),
        ));
    }
    let want = tail * format.token_bytes();
    if want > switchyard_fabric::transfer::chunk_budget(&ctx.client) {
        return Err(refuse(
            ErrorCode::BadRequest,
            format!("a tail of {want} bytes does not fit a chunk"),
        ));
    }
    let data = kv
        .export_tail(req.tokens, req.adapter)
        .await
        .map_err(|e| e.to_wire())?
        .filter(|d| d.len() == want);
    ctx.handover.served(&req.request_id);
    Ok(KvChunk {
        v: PROTOCOL_VERSION,
        format: format.key(),
        first_block: req.first_block,
        blocks: 0,
        part: 0,
        held_blocks: req.first_block,
        tail: if data.is_some() { req.tail } else { 0 },
        data: data.unwrap_or_default(),
        error: None,
    })
}
