//! What the MLX worker sends the bridge and how it reads the answers: request bodies
//! (prompt fields, the generation config), base64 floats, and the token stream of a
//! `generate`/`decode` with stop strings cut and the cancel forwarded. Shared by the
//! model (`text_model`) and its sessions (`session`).

use super::child::{error_from, Bridge, Events};
use super::holdings::Follow;
use super::supervisor::Supervised;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use switchyard_backend::{BackendError, CancelFlag, GenerateEvent, GenerateStream, Prompt};
use switchyard_engine::stops::{StopCheck, StopFilter};
use switchyard_messages::{FinishReason, GenerateConfig, GenerateMetrics, Token};

fn metrics_from(m: &Value) -> GenerateMetrics {
    let u = |k: &str| m[k].as_u64().unwrap_or(0);
    let rate = |n: u64, us: u64| if us == 0 { 0.0 } else { n as f64 * 1e6 / us as f64 };
    GenerateMetrics {
        prompt_tokens: u("prompt_tokens") as u32,
        cached_tokens: u("cached_tokens") as u32,
        generated_tokens: u("generated_tokens") as u32,
        prefill_us: u("prefill_us"),
        decode_us: u("decode_us"),
        total_us: u("total_us"),
        prefill_tokens_per_sec: rate(u("prompt_tokens") - u("cached_tokens"), u("prefill_us")),
        decode_tokens_per_sec: rate(u("generated_tokens"), u("decode_us")),
        peak_memory_bytes: u("peak_memory_bytes"),
        active_memory_bytes: u("active_memory_bytes"),
        ..GenerateMetrics::default()
    }
}

/// Little-endian f32s from the bridge's base64.
pub(super) fn floats(b64: &Value) -> Result<Vec<f32>, BackendError> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.as_str().unwrap_or_default())
        .map_err(|e| BackendError::Compute(format!("the MLX bridge sent bad base64: {e}")))?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The fields of a request that name its prompt.
pub(super) fn prompt_fields(prompt: &Prompt) -> Value {
    match prompt {
        Prompt::Text(t) => json!({"prompt": t}),
        Prompt::Chat { messages, kwargs, .. } => {
            let m: Vec<Value> = messages
                .iter()
                .map(|m| json!({"role": m.role, "content": m.content}))
                .collect();
            let mut fields = json!({"messages": m});
            if !kwargs.is_empty() {
                // Checked to be a JSON object by the worker's validation.
                fields["chat_template_kwargs"] = serde_json::from_str(kwargs).unwrap_or_default();
            }
            fields
        }
        Prompt::Tokens(t) => json!({"tokens": t}),
        // Not offered to this backend (`resumes()` is false); an empty prompt fails.
        Prompt::Continue { .. } => json!({"tokens": []}),
    }
}

/// A request body: `op`, the prompt's fields (if any) and `extra`.
pub(super) fn body(op: &str, prompt: Option<&Prompt>, extra: Value) -> Value {
    let mut b = prompt.map(prompt_fields).unwrap_or_else(|| json!({}));
    b["op"] = json!(op);
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            b[k] = v;
        }
    }
    b
}

/// The `config` object of `generate` and `decode`.
pub(super) fn config_json(config: &GenerateConfig) -> Value {
    json!({
        "max_tokens": config.max_tokens,
        "fit_max_tokens": config.fit_max_tokens,
        "logit_bias": config.logit_bias.iter().map(|(id, b)| (id.to_string(), json!(b))).collect::<serde_json::Map<_, _>>(),
        "temperature": config.temperature,
        "top_k": config.top_k,
        "top_p": config.top_p,
        "min_p": config.min_p,
        "repeat_penalty": config.repeat_penalty,
        "repeat_last_n": config.repeat_last_n,
        "presence_penalty": config.presence_penalty,
        "frequency_penalty": config.frequency_penalty,
        "seed": config.seed,
        "stop_tokens": config.stop_tokens,
        // The same tagged map as on the wire, JSON texts as strings.
        "constraint": config.constraint,
        "logprobs": config.logprobs,
    })
}

/// Streams a generate-like request (`generate`, a session's `decode`): its token
/// events, stop strings cut, the cancel forwarded.
pub(super) fn stream(
    bridge: &Supervised,
    request: Value,
    config: &GenerateConfig,
    cancel: CancelFlag,
    last: Arc<Mutex<GenerateMetrics>>,
    follow: Option<Arc<Follow>>,
) -> GenerateStream {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let stops = config.stop.clone();
    let bridge = bridge.bridge();
    tokio::spawn(async move {
        let started = match bridge {
            Ok((b, _)) => b.request(request).await.map(|ev| (b, ev)),
            Err(e) => Err(e),
        };
        match started {
            Ok((b, events)) => pump(b, events, stops, cancel, last, tx, follow).await,
            Err(e) => {
                if let Some(f) = follow {
                    f.ended(None);
                }
                let _ = tx.send(Err(e)).await;
            }
        }
    });
    GenerateStream::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|ev| (ev, rx))
    }))
}

/// Forwards one request's events into `tx`, cutting stop strings and forwarding a
/// cancel; `follow` (the shared cache's holdings) hears every token and, before the
/// stream ends, what the cache keeps.
async fn pump(
    bridge: Arc<Bridge>,
    mut events: Events,
    stops: Vec<String>,
    cancel: CancelFlag,
    last: Arc<Mutex<GenerateMetrics>>,
    tx: tokio::sync::mpsc::Sender<Result<GenerateEvent, BackendError>>,
    follow: Option<Arc<Follow>>,
) {
    let mut filter = StopFilter::new(&stops);
    let mut cancel_sent = false;
    let mut stopped = false;
    while let Some(ev) = events.next().await {
        if cancel.is_cancelled() && !cancel_sent {
            bridge.cancel(events.id).await;
            cancel_sent = true;
        }
        match ev["event"].as_str() {
            Some("token") if !stopped => {
                if let Some(f) = &follow {
                    f.token(ev["token"].as_u64().unwrap_or(0) as u32);
                }
                let token = Token {
                    id: ev["token"].as_u64().unwrap_or(0) as u32,
                    text: ev["text"].as_str().unwrap_or_default().to_string(),
                    logprob: serde_json::from_value(ev["logprob"].clone()).ok(),
                    reasoning: false,
                };
                let (emit, stop) = match filter.push(token) {
                    StopCheck::Continue(t) => (t, false),
                    StopCheck::Stopped(t) => (t, true),
                };
                for t in emit {
                    if tx.send(Ok(GenerateEvent::Token(t))).await.is_err() && !cancel_sent {
                        bridge.cancel(events.id).await; // the caller went away
                        cancel_sent = true;
                    }
                }
                if stop {
                    stopped = true;
                    bridge.cancel(events.id).await;
                    cancel_sent = true;
                }
            }
            Some("token") => {
                if let Some(f) = &follow {
                    f.token(ev["token"].as_u64().unwrap_or(0) as u32);
                }
            }
            Some("done") => {
                if let Some(f) = &follow {
                    f.ended(ev["metrics"]["cache_tokens"].as_u64().map(|n| n as usize));
                }
                if !stopped {
                    for t in filter.flush() {
                        let _ = tx.send(Ok(GenerateEvent::Token(t))).await;
                    }
                }
                let finish = match (stopped, ev["finish"].as_str()) {
                    (true, _) | (_, Some("stop")) => FinishReason::Stop,
                    (_, Some("cancelled")) => FinishReason::Cancelled,
                    _ => FinishReason::Length,
                };
                let mut metrics = metrics_from(&ev["metrics"]);
                metrics.stop_sequence = filter.matched().filter(|_| stopped).map(str::to_string);
                *last.lock().unwrap_or_else(|p| p.into_inner()) = metrics.clone();
                let _ = tx
                    .send(Ok(GenerateEvent::Done {
                        finish_reason: finish,
                        metrics,
                    }))
                    .await;
                return;
            }
            _ => {
                if let Some(f) = &follow {
                    f.ended(None);
                }
                let _ = tx.send(Err(error_from(&ev))).await;
                return;
            }
        }
    }
    if let Some(f) = &follow {
        f.ended(None);
    }
}

/// A JSON array of token ids.
pub(super) fn token_ids(v: &Value) -> Result<Vec<u32>, BackendError> {
    v.as_array()
        .ok_or_else(|| BackendError::Compute("the MLX bridge sent no tokens".into()))?
        .iter()
        .map(|t| {
            t.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| BackendError::Compute(format!("the MLX bridge sent a bad token id {t}")))
        })
        .collect()
}
