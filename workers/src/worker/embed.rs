//! The `embed` endpoint's work (1.7): an [`EmbedRequest`]'s inputs through the
//! backend, answered as one [`EmbedReply`] (admission and delivery are
//! `handle_unary` in `unary.rs`'s, as for classify and batch).

use super::context::ServeContext;
use switchyard_backend::Prompt;
use switchyard_messages::{encode, EmbedInput, EmbedItem, EmbedReply, EmbedRequest, PROTOCOL_VERSION};

/// The encoded reply to `r`: one item per input, each its vector or its own error.
pub(super) async fn reply(ctx: &ServeContext, request_id: &str, r: EmbedRequest) -> Vec<u8> {
    let inputs = r
        .inputs
        .into_iter()
        .map(|i| match i {
            EmbedInput::Text(t) => Prompt::Text(t),
            EmbedInput::Tokens(t) => Prompt::Tokens(t),
        })
        .collect();
    let results = ctx
        .model
        .embed(inputs)
        .await
        .into_iter()
        .map(|res| match res {
            Ok(e) => EmbedItem {
                embedding: e.vector,
                tokens: e.tokens,
                error: None,
            },
            Err(e) => EmbedItem {
                embedding: Vec::new(),
                tokens: 0,
                error: Some(e.to_wire()),
            },
        })
        .collect();
    encode(&EmbedReply {
        v: PROTOCOL_VERSION,
        request_id: request_id.to_string(),
        worker_id: ctx.worker_id.clone(),
        results,
    })
}
