//! Ollama's model listings: `GET /api/tags` (the fleet's models and the aliases of
//! them), `POST /api/show` (one, with its size and capabilities), `GET /api/ps` (the
//! loaded ones: on a fleet, every served model) and `GET /api/version`.
//!
//! switchyard has no Ollama store, so what only a store knows is derived: `digest`
//! is the SHA-256 of the name, `size` is 0, `parameter_size` is estimated from the
//! model's shape.

use super::{refuse, OllamaError};
use crate::errors::ApiError;
use crate::Gateway;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use switchyard_messages::{ModelEntry, ModelInfo};

/// The Ollama API version whose shapes these endpoints follow (`/api/version`).
pub const OLLAMA_API_VERSION: &str = "0.14.0";

/// The served models and the aliases of them: (name, entry).
async fn served(g: &Gateway) -> Result<Vec<(String, ModelEntry)>, OllamaError> {
    let reply = g.client.models().await.map_err(ApiError::from)?;
    let mut out: Vec<(String, ModelEntry)> = reply
        .models
        .iter()
        .filter(|m| !g.aliases.contains_key(&m.name))
        .map(|m| (m.name.clone(), m.clone()))
        .collect();
    for (alias, target) in &g.aliases {
        if let Some(m) = reply.models.iter().find(|m| &m.name == target) {
            out.push((alias.clone(), m.clone()));
        }
    }
    Ok(out)
}

/// Parameters, estimated from the shape: embeddings plus about 12·hidden² per layer.
fn parameters(info: &ModelInfo) -> u64 {
    let h = u64::from(info.hidden_size);
    u64::from(info.vocab_size) * h + u64::from(info.num_layers) * 12 * h * h
}

fn parameter_size(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{:.0}M", n as f64 / 1e6)
    }
}

fn details(info: &ModelInfo) -> Value {
    let quant = match info.quant_bits {
        0 => "unknown".to_string(),
        16 => "F16".to_string(),
        32 => "F32".to_string(),
        b => format!("Q{b}"),
    };
    json!({"parent_model": "", "format": "gguf", "family": info.architecture, "families": [info.architecture],
           "parameter_size": parameter_size(parameters(info)), "quantization_level": quant})
}

fn digest(name: &str) -> String {
    Sha256::digest(name.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `GET /api/tags`.
pub async fn tags(State(g): State<Arc<Gateway>>, headers: HeaderMap) -> Result<Response, OllamaError> {
    g.admit_listing(&headers)?;
    let now = super::answer::timestamp();
    let models: Vec<Value> = served(&g)
        .await?
        .iter()
        .map(|(name, m)| {
            json!({"name": name, "model": name, "modified_at": now, "size": 0, "digest": digest(name),
                   "details": details(&m.info)})
        })
        .collect();
    Ok(axum::Json(json!({ "models": models })).into_response())
}

/// `GET /api/ps`: on a fleet every served model is loaded, on its workers.
pub async fn ps(State(g): State<Arc<Gateway>>, headers: HeaderMap) -> Result<Response, OllamaError> {
    g.admit_listing(&headers)?;
    let models: Vec<Value> = served(&g)
        .await?
        .iter()
        .map(|(name, m)| {
            json!({"name": name, "model": name, "size": 0, "size_vram": 0, "digest": digest(name),
                   "details": details(&m.info), "expires_at": "2318-01-01T00:00:00Z",
                   "context_length": m.info.context_len, "workers": m.workers.len()})
        })
        .collect();
    Ok(axum::Json(json!({ "models": models })).into_response())
}

/// `POST /api/show`.
pub async fn show(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let req: Value = super::parse(&super::body(b)?)?;
    // Ollama's older clients send `name`.
    let Some(name) = req.get("model").or_else(|| req.get("name")).and_then(Value::as_str) else {
        return Err(refuse("model", "is required"));
    };
    g.admit_listing(&headers)?;
    let Some((name, m)) = served(&g).await?.into_iter().find(|(n, _)| n == name) else {
        return Err(OllamaError(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("model '{name}' not found"),
        )));
    };
    let i = &m.info;
    let arch = &i.architecture;
    let mut capabilities = Vec::new();
    if !i.embedding_only {
        capabilities.extend(["completion", "tools"]);
    }
    if i.embedding_dim > 0 {
        capabilities.push("embedding");
    }
    let info = json!({
        "general.architecture": arch,
        "general.parameter_count": parameters(i),
        format!("{arch}.context_length"): i.context_len,
        format!("{arch}.embedding_length"): i.hidden_size,
        format!("{arch}.block_count"): i.num_layers,
        "general.vocab_size": i.vocab_size,
    });
    Ok(axum::Json(json!({
        "modelfile": format!("# served by switchyard workers: {}\nFROM {name}\n", m.workers.join(", ")),
        "parameters": "", "template": "", "license": "",
        "details": details(i), "model_info": info, "capabilities": capabilities,
        "modified_at": super::answer::timestamp(),
    }))
    .into_response())
}

/// `GET /api/version`.
pub async fn version() -> Response {
    axum::Json(json!({"version": OLLAMA_API_VERSION, "switchyard": env!("CARGO_PKG_VERSION")})).into_response()
}
