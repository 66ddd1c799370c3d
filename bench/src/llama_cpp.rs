//! `switchyard bench llama-cpp`: the fabric's cost on the llama.cpp path. The same
//! greedy request goes straight to a llama-server (HTTP, streaming `/completion`) and
//! through switchyard (client → NATS → coordinator → `llama_cpp` worker → the same
//! llama-server), alternating, one slot, so the difference is what switchyard adds.
//! Every run gets its own prompt prefix, so neither path reuses the other's cached
//! prompt.

use super::{median, LocalNode, BENCH_PROMPT};
use anyhow::{bail, Context};
use futures::StreamExt;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use switchyard_client::{Client, StreamEvent};
use switchyard_config::Config;
use switchyard_messages::{GenerateConfig, GenerateRequest};
use switchyard_node as node;
use switchyard_procs::llama_server::LlamaServer;
use switchyard_workers::backends::llama_cpp::completion_body;

/// One run as the caller saw it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Run {
    pub ttft: Duration,
    pub total: Duration,
    pub tokens: u32,
}

impl Run {
    fn decode_tps(&self) -> f64 {
        let decode = self.total.saturating_sub(self.ttft);
        if decode.is_zero() {
            0.0
        } else {
            f64::from(self.tokens.saturating_sub(1)) / decode.as_secs_f64()
        }
    }
    fn total_tps(&self) -> f64 {
        f64::from(self.tokens) / self.total.as_secs_f64()
    }
}

/// Streams one completion straight from llama-server.
pub async fn direct(http: &reqwest::Client, url: &str, prompt: &str, max_tokens: u32) -> anyhow::Result<Run> {
    let config = GenerateConfig {
        max_tokens,
        ..GenerateConfig::default()
    };
    // Exactly the body the llama_cpp worker sends for this request.
    let body = completion_body(json!(prompt), &config, true);
    let start = Instant::now();
    let r = http.post(format!("{url}/completion")).json(&body).send().await?;
    if !r.status().is_success() {
        bail!("llama-server /completion: {}", r.status());
    }
    let mut run = Run::default();
    sse_tokens(r, |n| {
        if n > 0 && run.tokens == 0 {
            run.ttft = start.elapsed();
        }
        run.tokens += n;
    })
    .await?;
    run.total = start.elapsed();
    Ok(run)
}

/// Reads a llama-server `/completion` event stream, calling `on_tokens` with the
/// number of tokens each `data:` event carries, as it arrives.
pub async fn sse_tokens(r: reqwest::Response, mut on_tokens: impl FnMut(u32)) -> anyhow::Result<()> {
    let mut body = r.bytes_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk?);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let Some(data) = text.trim().strip_prefix("data:") else {
                continue;
            };
            let v: Value = serde_json::from_str(data.trim())?;
            on_tokens(v["tokens"].as_array().map_or(0, |t| t.len()) as u32);
        }
    }
    Ok(())
}

/// Streams one completion through switchyard.
pub async fn fabric(client: &Client, name: &str, prompt: &str, max_tokens: u32) -> anyhow::Result<Run> {
    let mut req = GenerateRequest::generate(Client::new_request_id(), name, prompt);
    req.config.max_tokens = max_tokens;
    let start = Instant::now();
    let mut stream = client.generate(req).await?;
    let mut run = Run::default();
    while let Some(ev) = stream.next().await {
        if let StreamEvent::Tokens(t) = ev? {
            if !t.is_empty() && run.tokens == 0 {
                run.ttft = start.elapsed();
            }
            run.tokens += t.len() as u32;
        }
    }
    run.total = start.elapsed();
    Ok(run)
}

/// Runs the comparison and prints medians and ratios (switchyard / direct).
pub async fn llama_cpp(
    mut config: Config,
    bin: &Path,
    model: &Path,
    threads: usize,
    runs: usize,
    max_tokens: u32,
) -> anyhow::Result<()> {
    eprintln!(
        "starting llama-server ({threads} threads, 1 slot) on {} …",
        model.display()
    );
    let server = LlamaServer::start(bin, model, threads, 1).await?;
    config.worker.backend = "llama_cpp".into();
    config.worker.llama_url = server.url.clone();
    config.worker.id = "bench-llama-cpp".into();
    config.validate()?;
    let local = LocalNode::start(config).await?;
    let (name, client) = (local.loaded.name.clone(), local.client.clone());
    let http = switchyard_procs::llama_server::http_client();
    let mut n = 0usize;
    let mut prompt = || {
        n += 1;
        format!("Chapter {n}. {BENCH_PROMPT}")
    };
    eprintln!("warming up …");
    direct(&http, &server.url, &prompt(), max_tokens).await?;
    fabric(&client, &name, &prompt(), max_tokens).await?;
    let (mut d, mut f) = (Vec::new(), Vec::new());
    for i in 0..runs {
        eprintln!("run {}/{runs}", i + 1);
        // Alternate the order so drift on a shared machine hits both equally.
        if i % 2 == 0 {
            d.push(direct(&http, &server.url, &prompt(), max_tokens).await?);
            f.push(fabric(&client, &name, &prompt(), max_tokens).await?);
        } else {
            f.push(fabric(&client, &name, &prompt(), max_tokens).await?);
            d.push(direct(&http, &server.url, &prompt(), max_tokens).await?);
        }
    }
    let col = |xs: &[Run], g: fn(&Run) -> f64| median(&xs.iter().map(g).collect::<Vec<_>>());
    let tokens = d[0].tokens;
    if f.iter().chain(&d).any(|r| r.tokens != tokens) {
        eprintln!("note: the runs generated different token counts (the model ended some answers early)");
    }
    println!(
        "llama.cpp path: {name}, {threads} threads, 1 slot, prompt ~100 tokens, {tokens} generated, greedy, {runs} runs each (medians)"
    );
    println!("{:<30} {:>14} {:>14} {:>10}", "", "llama-server", "switchyard", "ratio");
    let row = |label: &str, a: f64, b: f64, digits: usize| {
        println!("{label:<30} {a:>14.digits$} {b:>14.digits$} {:>10.3}", b / a);
    };
    let (d_ttft, f_ttft) = (
        col(&d, |r| r.ttft.as_secs_f64() * 1e3),
        col(&f, |r| r.ttft.as_secs_f64() * 1e3),
    );
    let (d_dec, f_dec) = (col(&d, Run::decode_tps), col(&f, Run::decode_tps));
    row("time to first token ms", d_ttft, f_ttft, 2);
    row("decode tok/s (client-seen)", d_dec, f_dec, 1);
    row("end-to-end tok/s", col(&d, Run::total_tps), col(&f, Run::total_tps), 1);
    println!(
        "switchyard adds {:.2} ms to time to first token and {:.0} µs per token on this path",
        f_ttft - d_ttft,
        (1e6 / f_dec - 1e6 / d_dec).max(0.0)
    );
    local.stop().await;
    drop(server);
    Ok(())
}

/// The llama-server binary for benchmarks: the flag, `$SWITCHYARD_LLAMA_SERVER`, the
/// cache, else built by `scripts/build-llama-server.sh` (run from the repository).
pub fn llama_server_or_build(flag: Option<&Path>) -> anyhow::Result<std::path::PathBuf> {
    if let Some(b) = flag {
        return Ok(b.to_path_buf());
    }
    if let Ok(found) = node::find_llama_server("") {
        return Ok(found);
    }
    let out = std::process::Command::new("bash")
        .arg("scripts/build-llama-server.sh")
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running scripts/build-llama-server.sh (run from the repository root)")?;
    if !out.status.success() {
        bail!("scripts/build-llama-server.sh failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().into())
}
