//! `switchyard bench gateway`: N concurrent streaming chats (default 1, 8, 32)
//! through switchyard's OpenAI gateway (HTTP → gateway → NATS → coordinator → CPU
//! worker) against the same load on llama-server's own OpenAI endpoint, same GGUF,
//! same threads, both with as many slots as the largest N; aggregate tok/s and TTFT
//! p50/p99, rounds alternating. Then the gateway's own cost: one stream through the
//! gateway against the same request through the NATS client directly; and its
//! other APIs (Anthropic, Responses, Ollama) against chat completions.

use super::http_chat::{openai_chat, percentile, Chat};
use super::{median, LocalNode};
use std::path::Path;
use std::time::Instant;
use switchyard_client::{Client, GenerateRequest, Message, StreamEvent};
use switchyard_config::{Config, GatewayConfig};
use switchyard_procs::llama_server::LlamaServer;

/// The same chat through the NATS client, no HTTP.
async fn nats_chat(client: &Client, name: &str, prompt: &str, max_tokens: u32) -> anyhow::Result<Chat> {
    let mut req = GenerateRequest::chat(Client::new_request_id(), name, vec![Message::new("user", prompt)]);
    req.config.max_tokens = max_tokens;
    let start = Instant::now();
    let mut stream = client.chat(req).await?;
    let mut chat = Chat::default();
    while let Some(ev) = stream.next().await {
        if let StreamEvent::Tokens(t) = ev? {
            if chat.tokens == 0 && !t.is_empty() {
                chat.ttft = start.elapsed();
            }
            chat.tokens += t.len() as u32;
        }
    }
    chat.total = start.elapsed();
    Ok(chat)
}

/// A round's figures.
struct Round {
    tps: f64,
    ttfts: Vec<f64>,
}

fn prompt(r: usize, i: usize) -> String {
    format!(
        "Story {}: write a short story about a train that crosses a mountain pass at night.",
        1000 * r + i
    )
}

/// Runs the comparison and prints two tables.
pub async fn gateway(
    mut config: Config,
    bin: &Path,
    streams: &[usize],
    runs: usize,
    max_tokens: u32,
) -> anyhow::Result<()> {
    let slots = streams.iter().copied().max().unwrap_or(1);
    let threads = match config.worker.threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n as usize,
    };
    let model = switchyard_node::model_path(&config)?;
    // 512 positions per slot on both sides: a ~40-token chat prompt and its answer.
    let ctx = (512 * slots).to_string();
    eprintln!(
        "starting llama-server ({threads} threads, --parallel {slots}, -c {ctx}) on {} …",
        model.display()
    );
    let server = LlamaServer::start_with(bin, &model, threads, slots, &["-c", &ctx]).await?;
    config.worker.parallel_slots = slots as u32;
    config.worker.context_len = 512;
    config.worker.threads = threads as u32;
    config.worker.id = "bench-gateway".into();
    config.validate()?;
    let local = LocalNode::start(config).await?;
    let name = local.loaded.name.clone();
    let listen = GatewayConfig {
        listen: "127.0.0.1:0".into(),
        ..GatewayConfig::default()
    };
    let gw = switchyard_gateway::start(local.client.clone(), &local.config.nats.prefix, &listen).await?;
    let http = reqwest::Client::new();
    let round = |url: String, r: usize, n: usize| {
        let http = http.clone();
        async move {
            let start = Instant::now();
            let all = futures::future::try_join_all((0..n).map(|i| {
                let (http, url, p) = (http.clone(), url.clone(), prompt(r, i));
                async move { openai_chat(&http, &url, &p, max_tokens).await }
            }))
            .await?;
            let tokens: u32 = all.iter().map(|c| c.tokens).sum();
            anyhow::Ok(Round {
                tps: f64::from(tokens) / start.elapsed().as_secs_f64(),
                ttfts: all.iter().map(|c| c.ttft.as_secs_f64() * 1e3).collect(),
            })
        }
    };
    eprintln!("warming up …");
    round(server.url.clone(), 0, slots.min(4)).await?;
    round(gw.url(), 0, slots.min(4)).await?;

    println!(
        "OpenAI streaming chat: {name}, {threads} threads, both with {slots} slots, {max_tokens} tokens per \
         stream, greedy, {runs} rounds each (aggregate t/s medians; TTFT over all streams of all rounds)"
    );
    println!(
        "{:<8} {:>13} {:>13} {:>7} {:>17} {:>17}",
        "streams", "llama t/s", "gateway t/s", "ratio", "TTFT p50/p99 (l)", "TTFT p50/p99 (gw)"
    );
    let mut r_no = 1;
    for &n in streams {
        let (mut l, mut g) = (Vec::new(), Vec::new());
        for i in 0..runs {
            eprintln!("{n} streams, round {}/{runs}", i + 1);
            let (rl, rg) = (r_no, r_no + 1);
            r_no += 2;
            if i % 2 == 0 {
                l.push(round(server.url.clone(), rl, n).await?);
                g.push(round(gw.url(), rg, n).await?);
            } else {
                g.push(round(gw.url(), rg, n).await?);
                l.push(round(server.url.clone(), rl, n).await?);
            }
        }
        let tps = |xs: &[Round]| median(&xs.iter().map(|r| r.tps).collect::<Vec<_>>());
        let ttft = |xs: &[Round]| {
            let all: Vec<f64> = xs.iter().flat_map(|r| r.ttfts.iter().copied()).collect();
            format!("{:.0}/{:.0} ms", percentile(&all, 0.5), percentile(&all, 0.99))
        };
        println!(
            "{n:<8} {:>13.1} {:>13.1} {:>7.3} {:>17} {:>17}",
            tps(&l),
            tps(&g),
            tps(&g) / tps(&l),
            ttft(&l),
            ttft(&g)
        );
    }

    // The gateway's own cost: one stream, the same greedy request each way.
    let (mut via_gw, mut via_nats) = (Vec::new(), Vec::new());
    let decode = |c: &Chat| f64::from(c.tokens.saturating_sub(1)) / (c.total - c.ttft).as_secs_f64().max(1e-9);
    for i in 0..runs.max(5) {
        let p = prompt(9000, 0);
        if i % 2 == 0 {
            via_gw.push(openai_chat(&http, &gw.url(), &p, max_tokens).await?);
            via_nats.push(nats_chat(&local.client, &name, &p, max_tokens).await?);
        } else {
            via_nats.push(nats_chat(&local.client, &name, &p, max_tokens).await?);
            via_gw.push(openai_chat(&http, &gw.url(), &p, max_tokens).await?);
        }
    }
    let (g_tps, n_tps) = (
        median(&via_gw.iter().map(decode).collect::<Vec<_>>()),
        median(&via_nats.iter().map(decode).collect::<Vec<_>>()),
    );
    println!(
        "gateway cost, one stream, {} runs each: decode {g_tps:.1} t/s via gateway vs {n_tps:.1} t/s via the NATS client \
         = {:+.2}% of decode time",
        via_gw.len(),
        (n_tps / g_tps - 1.0) * 100.0
    );
    super::gateway_apis::compare(&http, &gw.url(), runs, max_tokens).await?;
    gw.shutdown().await;
    local.stop().await;
    drop(server);
    Ok(())
}
