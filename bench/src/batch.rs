//! `switchyard bench batch`: aggregate decode throughput with 1, 4 and 8 concurrent
//! streams on one CPU worker (continuous batching) against llama-server with
//! `--parallel` set to the largest stream count, on the same GGUF and threads
//! (`--threads`, default every core). Each
//! round sends every stream at once (distinct prompts) and measures from the first
//! send to the last token; rounds alternate between the two so drift hits both.

use super::llama_cpp::{direct, fabric, Run};
use super::{median, LocalNode, BENCH_PROMPT};
use std::path::Path;
use std::time::Instant;
use switchyard_client::Client;
use switchyard_config::Config;
use switchyard_procs::llama_server::LlamaServer;

/// What one round of `n` concurrent streams did.
#[derive(Debug, Clone, Copy)]
struct Round {
    /// Generated tokens over all streams / wall seconds.
    aggregate_tps: f64,
    /// Mean time to first token, ms.
    ttft_ms: f64,
    tokens: u32,
}

fn round(runs: Vec<Run>, wall: f64) -> Round {
    let tokens: u32 = runs.iter().map(|r| r.tokens).sum();
    Round {
        aggregate_tps: f64::from(tokens) / wall,
        ttft_ms: runs.iter().map(|r| r.ttft.as_secs_f64() * 1e3).sum::<f64>() / runs.len().max(1) as f64,
        tokens,
    }
}

/// Prompts of round `r` with `n` streams: distinct from the first token on, so no
/// stream reuses another's prompt on either side.
fn prompts(r: usize, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{} {BENCH_PROMPT}", 1000 * r + i)).collect()
}

/// Runs the comparison and prints a table of medians and ratios.
pub async fn batch(
    mut config: Config,
    bin: &Path,
    streams: &[usize],
    runs: usize,
    max_tokens: u32,
) -> anyhow::Result<()> {
    let slots = streams.iter().copied().max().unwrap_or(1);
    // Both get the worker's --threads (default: every core).
    let threads = match config.worker.threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n as usize,
    };
    let model = switchyard_node::model_path(&config)?;
    eprintln!(
        "starting llama-server ({threads} threads, --parallel {slots}) on {} …",
        model.display()
    );
    let server = LlamaServer::start(bin, &model, threads, slots).await?;
    config.worker.parallel_slots = slots as u32;
    config.worker.threads = threads as u32;
    config.worker.id = "bench-batch".into();
    config.validate()?;
    let local = LocalNode::start(config).await?;
    let (name, client) = (local.loaded.name.clone(), local.client.clone());
    let http = switchyard_procs::llama_server::http_client();

    let direct_round = |ps: Vec<String>| {
        let (http, url) = (http.clone(), server.url.clone());
        async move {
            let start = Instant::now();
            let all = futures::future::try_join_all(ps.iter().map(|p| direct(&http, &url, p, max_tokens))).await?;
            anyhow::Ok(round(all, start.elapsed().as_secs_f64()))
        }
    };
    let fabric_round = |ps: Vec<String>, client: Client| {
        let name = name.clone();
        async move {
            let start = Instant::now();
            let all = futures::future::try_join_all(ps.iter().map(|p| fabric(&client, &name, p, max_tokens))).await?;
            anyhow::Ok(round(all, start.elapsed().as_secs_f64()))
        }
    };
    eprintln!("warming up …");
    direct_round(prompts(0, slots)).await?;
    fabric_round(prompts(0, slots), client.clone()).await?;

    println!(
        "continuous batching: {name}, {threads} threads, llama-server --parallel {slots}, switchyard {slots} KV slots, \
         prompt ~100 tokens, {max_tokens} generated per stream, greedy, {runs} rounds each (medians)"
    );
    println!(
        "{:<8} {:>16} {:>16} {:>8} {:>14} {:>14}",
        "streams", "llama-server t/s", "switchyard t/s", "ratio", "TTFT ms (l-s)", "TTFT ms (sy)"
    );
    let mut round_no = 1;
    for &n in streams {
        let (mut d, mut f) = (Vec::new(), Vec::new());
        for i in 0..runs {
            eprintln!("{n} streams, round {}/{runs}", i + 1);
            let (pd, pf) = (prompts(round_no, n), prompts(round_no + 1, n));
            round_no += 2;
            if i % 2 == 0 {
                d.push(direct_round(pd).await?);
                f.push(fabric_round(pf, client.clone()).await?);
            } else {
                f.push(fabric_round(pf, client.clone()).await?);
                d.push(direct_round(pd).await?);
            }
        }
        let med = |xs: &[Round], g: fn(&Round) -> f64| median(&xs.iter().map(g).collect::<Vec<_>>());
        let (dt, ft) = (med(&d, |r| r.aggregate_tps), med(&f, |r| r.aggregate_tps));
        if d.iter().chain(&f).any(|r| r.tokens != (n as u32) * max_tokens) {
            eprintln!("note: some streams ended early (the model finished its answer); rates count real tokens");
        }
        println!(
            "{n:<8} {dt:>16.1} {ft:>16.1} {:>8.3} {:>14.0} {:>14.0}",
            ft / dt,
            med(&d, |r| r.ttft_ms),
            med(&f, |r| r.ttft_ms)
        );
    }
    println!("aggregate t/s = tokens generated by all streams / wall time from the first send to the last token");
    local.stop().await;
    drop(server);
    Ok(())
}
