//! llama.cpp's `/completion` parameters for a [`GenerateConfig`], and what its
//! answers say: token log-probabilities and metrics.

use serde_json::{json, Value};
use switchyard_backend::BackendError;
use switchyard_messages::{Constraint, GenerateConfig, GenerateMetrics, TokenLogprob, TopLogprob};

/// `GenerateConfig` as llama.cpp `/completion` parameters (public so benchmarks send
/// llama-server exactly what the worker sends).
pub fn completion_body(prompt: Value, c: &GenerateConfig, stream: bool) -> Value {
    let mut body = json!({
        "prompt": prompt,
        "n_predict": c.max_tokens,
        "temperature": c.temperature,
        // Greedy is the argmax after penalties, which top_k 1 gives without llama.cpp
        // softmaxing the whole vocabulary each token (measured: 97 → 115 tok/s on
        // SmolLM2 at 2 threads).
        "top_k": if c.temperature <= 0.0 { 1 } else { c.top_k },
        "top_p": if c.top_p > 0.0 && c.top_p < 1.0 { c.top_p } else { 1.0 },
        "min_p": c.min_p,
        "repeat_penalty": if c.repeat_penalty > 0.0 { c.repeat_penalty } else { 1.0 },
        "repeat_last_n": c.repeat_last_n,
        "presence_penalty": c.presence_penalty,
        "frequency_penalty": c.frequency_penalty,
        "stop": c.stop,
        "stream": stream,
        "return_tokens": true,
        "cache_prompt": true,
    });
    if let Some(seed) = c.seed {
        body["seed"] = json!(seed);
    }
    if let Some(n) = c.logprobs {
        // The server reports the chosen token's probability only beside at least
        // one alternative; the extra one is dropped ([`token_logprob`]).
        body["n_probs"] = json!(n.max(1));
    }
    if !c.logit_bias.is_empty() {
        body["logit_bias"] = json!(c.logit_bias.iter().map(|&(id, b)| json!([id, b])).collect::<Vec<_>>());
    }
    // llama.cpp enforces a JSON schema itself (converted to its GBNF grammar); what it
    // cannot enforce is refused before this ([`constraint_supported`]).
    match &c.constraint {
        Some(Constraint::JsonObject) => body["json_schema"] = json!({"type": "object"}),
        Some(Constraint::JsonSchema { schema }) => {
            body["json_schema"] = serde_json::from_str(schema).unwrap_or(Value::Null);
        }
        _ => {}
    }
    body
}

/// One entry of llama-server's `completion_probabilities` (`n_probs`, reported
/// before sampling as `logprob` / `top_logprobs`) as a token's log-probability with
/// `top` alternatives.
pub fn token_logprob(p: &Value, top: usize) -> Option<TokenLogprob> {
    let bytes = |v: &Value| -> Vec<u8> {
        v["bytes"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).map(|b| b as u8).collect())
            .unwrap_or_default()
    };
    Some(TokenLogprob {
        logprob: p["logprob"].as_f64()? as f32,
        bytes: bytes(p),
        top: p["top_logprobs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .take(top)
                    .filter_map(|t| {
                        Some(TopLogprob {
                            id: t["id"].as_u64()? as u32,
                            bytes: bytes(t),
                            logprob: t["logprob"].as_f64()? as f32,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// Whether llama-server enforces `c` ([`super::constraint::support`]): checked by the
/// worker before admission, and here again for direct callers.
pub fn constraint_supported(c: &GenerateConfig) -> Result<(), BackendError> {
    match &c.constraint {
        Some(constraint) => super::constraint::support(constraint)
            .map_err(|why| BackendError::Invalid(format!("config.constraint: {why}"))),
        None => Ok(()),
    }
}

/// Metrics from a completion's `timings`.
pub(super) fn metrics_from(timings: &Value) -> GenerateMetrics {
    let f = |k: &str| timings[k].as_f64().unwrap_or(0.0);
    GenerateMetrics {
        // `prompt_n` counts only the tokens computed; `cache_n` the ones reused.
        prompt_tokens: (f("prompt_n") + f("cache_n")) as u32,
        cached_tokens: f("cache_n") as u32,
        generated_tokens: f("predicted_n") as u32,
        prefill_us: (f("prompt_ms") * 1000.0) as u64,
        decode_us: (f("predicted_ms") * 1000.0) as u64,
        total_us: ((f("prompt_ms") + f("predicted_ms")) * 1000.0) as u64,
        prefill_tokens_per_sec: f("prompt_per_second"),
        decode_tokens_per_sec: f("predicted_per_second"),
        ..GenerateMetrics::default()
    }
}
