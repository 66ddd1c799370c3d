//! (1.7) Embeddings on `{p}.v1.embed`: the request, its inputs and the reply (see
//! `docs/protocol.md`, section 5a).

use serde::{Deserialize, Serialize};

/// (1.7) An embeddings request on `{p}.v1.embed` (or a worker's `embed` endpoint):
/// one vector per input, mean-pooled over the input's tokens and L2-normalised.
/// Answered by one [`EmbedReply`], or an [`ErrorReply`] when the whole request fails.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedRequest {
    /// Version, id, model and routing.
    #[serde(flatten)]
    pub head: crate::RequestHead,
    /// The inputs, 1 to [`crate::MAX_EMBED_INPUTS`].
    pub inputs: Vec<EmbedInput>,
}

/// One input of an [`EmbedRequest`]: text (tokenized by the model, no chat template)
/// or token ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EmbedInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// One input's outcome in an [`EmbedReply`]: its vector, or its own error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedItem {
    /// The vector (`dim` values, unit length); empty on error.
    #[serde(default)]
    pub embedding: Vec<f32>,
    /// Tokens the input held.
    #[serde(default)]
    pub tokens: u32,
    /// This input's error; the others are unaffected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::WireError>,
}

/// Reply to an [`EmbedRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedReply {
    /// Protocol version.
    pub v: u32,
    /// The request answered.
    pub request_id: String,
    /// The worker that computed it.
    pub worker_id: String,
    /// One item per input, in order.
    pub results: Vec<EmbedItem>,
}
