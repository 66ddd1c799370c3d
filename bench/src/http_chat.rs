//! Streaming chats over HTTP as a client sees them (OpenAI's
//! `/v1/chat/completions`, switchyard's gateway or llama-server): what `bench
//! gateway`, its API comparison and `bench burst` share.

use futures::StreamExt;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// One streamed chat, as its client saw it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Chat {
    pub ttft: Duration,
    pub total: Duration,
    pub tokens: u32,
}

/// Streams one chat from an OpenAI endpoint: TTFT is the first content chunk; the
/// token count is `usage.completion_tokens` when the server sends it, else the
/// content chunks.
pub(super) async fn openai_chat(
    http: &reqwest::Client,
    url: &str,
    prompt: &str,
    max_tokens: u32,
) -> anyhow::Result<Chat> {
    let body = json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    });
    let start = Instant::now();
    let r = http
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await?;
    anyhow::ensure!(r.status().is_success(), "{url}: {}", r.status());
    let (mut chat, mut chunks, mut usage) = (Chat::default(), 0u32, None);
    let mut stream = r.bytes_stream();
    let mut buf = Vec::new();
    while let Some(part) = stream.next().await {
        buf.extend_from_slice(&part?);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let Some(data) = text.trim().strip_prefix("data:").map(str::trim) else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(data)?;
            anyhow::ensure!(v.get("error").is_none(), "{url}: {}", v["error"]);
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                usage = Some(n as u32);
            }
            let content = v["choices"][0]["delta"]["content"].as_str().unwrap_or("");
            if !content.is_empty() {
                if chunks == 0 {
                    chat.ttft = start.elapsed();
                }
                chunks += 1;
            }
        }
    }
    chat.total = start.elapsed();
    chat.tokens = usage.unwrap_or(chunks);
    Ok(chat)
}

pub(super) fn percentile(xs: &[f64], p: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}
