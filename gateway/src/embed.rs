//! `POST /v1/embeddings`: one switchyard [`EmbedRequest`] on `{p}.v1.embed`,
//! answered in OpenAI's shape (`float` arrays or `base64` of little-endian f32s).

use super::errors::ApiError;
use super::keys::Admitted;
use super::metrics::Operation;
use super::openai::parse;
use super::Gateway;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use switchyard_client::Client;
use switchyard_messages::{EmbedInput, EmbedRequest, RequestHead, MAX_EMBED_INPUTS};

/// OpenAI's embeddings body.
#[derive(Debug, Deserialize)]
struct EmbeddingsRequest {
    #[serde(default)]
    model: String,
    input: Value,
    encoding_format: Option<String>,
    dimensions: Option<u32>,
    user: Option<String>,
    /// Fields this gateway does not know.
    #[serde(flatten)]
    rest: Map<String, Value>,
}

fn refuse(param: &str, why: &str) -> ApiError {
    ApiError::bad_request(Some(param.to_string()), format!("{param}: {why}"))
}

/// `input` as the wire's inputs: a string, a list of strings, a list of token ids,
/// or a list of such lists.
fn inputs(input: &Value) -> Result<Vec<EmbedInput>, ApiError> {
    let tokens = |v: &[Value]| -> Option<Vec<u32>> {
        v.iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect()
    };
    let out = match input {
        Value::String(s) => vec![EmbedInput::Text(s.clone())],
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_number) => {
            vec![EmbedInput::Tokens(tokens(items).ok_or_else(|| {
                refuse("input", "token ids are integers from 0 to 4294967295")
            })?)]
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(EmbedInput::Text(s.clone())),
                Value::Array(ids) => tokens(ids)
                    .map(EmbedInput::Tokens)
                    .ok_or_else(|| refuse(&format!("input[{i}]"), "token ids are integers")),
                _ => Err(refuse(
                    &format!("input[{i}]"),
                    "must be a string or a list of token ids",
                )),
            })
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(refuse(
                "input",
                "must be a string, a list of strings or token ids, or a list of token-id lists",
            ))
        }
    };
    if out.is_empty() {
        return Err(refuse("input", "must not be empty"));
    }
    if out.len() > MAX_EMBED_INPUTS {
        return Err(refuse(
            "input",
            &format!("at most {MAX_EMBED_INPUTS} inputs per request"),
        ));
    }
    for (i, one) in out.iter().enumerate() {
        let empty = match one {
            EmbedInput::Text(t) => t.is_empty(),
            EmbedInput::Tokens(t) => t.is_empty(),
        };
        if empty {
            return Err(refuse(&format!("input[{i}]"), "must not be empty"));
        }
    }
    Ok(out)
}

/// A vector as OpenAI's `base64`: the little-endian bytes of its f32s.
fn base64(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub async fn embeddings(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = b.map_err(|e| ApiError::bad_request(None, format!("unreadable request body: {e}")))?;
    let req: EmbeddingsRequest = parse(&body)?;
    let admitted = g.keys.admit(&headers, g.aliased(&req.model))?;
    let _ = &req.user; // accepted and ignored, as for completions
    if let Some((k, _)) = req.rest.iter().find(|(_, v)| !v.is_null()) {
        return Err(refuse(
            k,
            "not supported by this gateway (docs/gateway.md lists the fields it takes)",
        ));
    }
    let base64_out = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(_) => return Err(refuse("encoding_format", "must be \"float\" or \"base64\"")),
    };
    let inputs = inputs(&req.input)?;
    let (vectors, worker) = embed_inputs(&g, &admitted, &req.model, inputs).await?;
    let mut data = Vec::with_capacity(vectors.len());
    let mut tokens = 0u64;
    for (i, (vector, n)) in vectors.into_iter().enumerate() {
        let dim = vector.len();
        if let Some(want) = req.dimensions.filter(|&d| d as usize != dim) {
            return Err(refuse(
                "dimensions",
                &format!("this model's embeddings have {dim}, not {want}"),
            ));
        }
        tokens += u64::from(n);
        let embedding = if base64_out {
            json!(base64(&vector))
        } else {
            json!(vector)
        };
        data.push(json!({"object": "embedding", "index": i, "embedding": embedding}));
    }
    let model = if req.model.is_empty() { worker } else { req.model };
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

/// Embeds `inputs` with `model` for the key `admitted` (charged per token): each
/// input's vector and token count, and the worker that answered. An input's error
/// is an error naming `input[i]`.
pub(crate) async fn embed_inputs(
    g: &Gateway,
    admitted: &Admitted,
    model: &str,
    inputs: Vec<EmbedInput>,
) -> Result<(Vec<(Vec<f32>, u32)>, String), ApiError> {
    let mut head = RequestHead::new(Client::new_request_id(), model.to_string());
    super::resolve_adapter(g, &mut head).await;
    head.tenant = Some(admitted.name().to_string()).filter(|n| !n.is_empty());
    let mut op = Operation::start("embeddings", model);
    let reply = match g.client.embed(EmbedRequest { head, inputs }).await {
        Ok(r) => r,
        Err(e) => {
            let e = ApiError::from(e);
            op.finish(Some(&e.code));
            return Err(e);
        }
    };
    let mut out = Vec::with_capacity(reply.results.len());
    for (i, item) in reply.results.into_iter().enumerate() {
        if let Some(error) = item.error {
            let mut e = ApiError::from_wire(&error);
            e.param = Some(format!("input[{i}]"));
            op.finish(Some(&e.code));
            return Err(e);
        }
        admitted.charge(item.tokens);
        out.push((item.embedding, item.tokens));
    }
    op.finish(None);
    Ok((out, reply.worker_id))
}
