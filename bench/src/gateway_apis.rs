//! The gateway's other APIs against its chat completions: one stream of the same
//! greedy chat through `/v1/chat/completions`, Anthropic's `/v1/messages`, OpenAI's
//! `/v1/responses` and Ollama's `/api/chat`, rounds rotating the order; decode tok/s
//! medians and each API's ratio to chat completions (part of `bench gateway`).

use super::http_chat::{openai_chat, Chat};
use super::median;
use futures::StreamExt;
use serde_json::{json, Value};
use std::time::Instant;

/// The APIs compared, chat completions first.
const APIS: [&str; 4] = ["chat/completions", "messages", "responses", "api/chat"];

/// One streamed chat through `api`: TTFT at the first text, tokens from the usage
/// the API reports at its end.
async fn stream(http: &reqwest::Client, base: &str, api: &str, prompt: &str, max_tokens: u32) -> anyhow::Result<Chat> {
    if api == "chat/completions" {
        return openai_chat(http, base, prompt, max_tokens).await;
    }
    let messages = json!([{"role": "user", "content": prompt}]);
    let (path, body) = match api {
        "messages" => (
            "/v1/messages",
            json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": true}),
        ),
        "responses" => (
            "/v1/responses",
            json!({"input": messages, "max_output_tokens": max_tokens, "temperature": 0, "stream": true,
                   "store": false}),
        ),
        _ => (
            "/api/chat",
            json!({"model": "", "messages": messages, "options": {"temperature": 0, "num_predict": max_tokens}}),
        ),
    };
    let mut body = body;
    if api == "api/chat" {
        // Ollama's API names the model; the fleet's one model.
        let models: Value = http.get(format!("{base}/api/tags")).send().await?.json().await?;
        body["model"] = models["models"][0]["name"].clone();
    }
    let start = Instant::now();
    let r = http.post(format!("{base}{path}")).json(&body).send().await?;
    anyhow::ensure!(r.status().is_success(), "{path}: {}", r.status());
    let (mut chat, mut tokens) = (Chat::default(), None);
    let mut first = true;
    let mut bytes = r.bytes_stream();
    let mut buf = Vec::new();
    while let Some(part) = bytes.next().await {
        buf.extend_from_slice(&part?);
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let data = line.trim().strip_prefix("data:").map_or(line.trim(), str::trim);
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            let text = match api {
                "messages" => v["delta"]["text"].as_str(),
                "responses" => (v["type"] == "response.output_text.delta")
                    .then(|| v["delta"].as_str())
                    .flatten(),
                _ => v["message"]["content"].as_str(),
            };
            if first && text.is_some_and(|t| !t.is_empty()) {
                chat.ttft = start.elapsed();
                first = false;
            }
            let n = match api {
                "messages" => v["usage"]["output_tokens"].as_u64(),
                "responses" => v["response"]["usage"]["output_tokens"].as_u64(),
                _ => v["eval_count"].as_u64(),
            };
            tokens = n.or(tokens);
        }
    }
    chat.total = start.elapsed();
    chat.tokens = tokens.unwrap_or(0) as u32;
    anyhow::ensure!(chat.tokens > 0, "{path}: no usage at the end of the stream");
    Ok(chat)
}

/// Prints decode tok/s per API over `runs` rounds.
pub async fn compare(http: &reqwest::Client, base: &str, runs: usize, max_tokens: u32) -> anyhow::Result<()> {
    let decode = |c: &Chat| f64::from(c.tokens.saturating_sub(1)) / (c.total - c.ttft).as_secs_f64().max(1e-9);
    let mut got: Vec<Vec<f64>> = vec![Vec::new(); APIS.len()];
    let prompt = "Write a short story about a train that crosses a mountain pass at night.";
    for r in 0..runs.max(5) {
        for k in 0..APIS.len() {
            let i = (k + r) % APIS.len();
            got[i].push(decode(&stream(http, base, APIS[i], prompt, max_tokens).await?));
        }
    }
    let base_tps = median(&got[0]);
    println!(
        "the gateway's APIs, one stream, the same greedy chat, {} rounds (order rotating): decode t/s median, ratio to chat completions",
        got[0].len()
    );
    for (api, xs) in APIS.iter().zip(&got) {
        let tps = median(xs);
        println!("  {:<18} {tps:>8.1} t/s  {:>6.3}", format!("/{api}"), tps / base_tps);
    }
    Ok(())
}
