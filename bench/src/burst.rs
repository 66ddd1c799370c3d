//! `switchyard bench burst`: bursts of streaming chats at 1×, 4× and 16× the fleet's
//! capacity, through switchyard's OpenAI gateway (HTTP → gateway → NATS → fleet queue
//! at the coordinator → CPU worker with `capacity` slots) and against llama-server's
//! own OpenAI endpoint with as many slots (`--parallel`), same GGUF, same threads, the
//! same requests, alternating which goes first. Per load: requests served within the
//! deadline (the gateway's queue timeout; llama-server queues without one), requests
//! served per second, TTFT p50/p99, and the ratios.

use super::http_chat::{openai_chat, percentile};
use super::LocalNode;
use clap::Args;
use std::path::Path;
use std::time::{Duration, Instant};
use switchyard_config::{Config, GatewayConfig};
use switchyard_procs::llama_server::LlamaServer;

/// `switchyard bench burst`.
#[derive(Args, Debug)]
pub struct BenchBurstArgs {
    /// The worker's settings (its --capacity is the fleet's, and llama-server's
    /// --parallel); --llama-server names the peer's binary.
    #[command(flatten)]
    pub worker: switchyard_node::WorkerFlags,
    /// Loads, as multiples of the capacity: requests in flight at once.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16])]
    pub loads: Vec<usize>,
    /// Requests per load, as a multiple of its concurrency.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: u32,
    /// Every request must be served within this many seconds (the gateway's queue
    /// timeout, and the HTTP timeout on both sides).
    #[arg(long, default_value_t = 120)]
    pub deadline_s: u64,
}

/// One side's run at one load.
struct Run {
    served: usize,
    failed: Vec<String>,
    late: usize,
    rps: f64,
    ttfts: Vec<f64>,
}

/// `n` requests, `c` at a time, to the OpenAI endpoint at `url`.
async fn run(http: &reqwest::Client, url: &str, n: usize, c: usize, max_tokens: u32, deadline: Duration) -> Run {
    use futures::StreamExt;
    let start = Instant::now();
    let results: Vec<_> = futures::stream::iter(0..n)
        .map(|i| {
            let (http, url) = (http.clone(), url.to_string());
            let prompt = format!("Request {i}: count from {i} to {}, one number per line.", i + 40);
            async move {
                let t = Instant::now();
                (openai_chat(&http, &url, &prompt, max_tokens).await, t.elapsed())
            }
        })
        .buffer_unordered(c)
        .collect()
        .await;
    let elapsed = start.elapsed().as_secs_f64();
    let mut r = Run {
        served: 0,
        failed: Vec::new(),
        late: 0,
        rps: 0.0,
        ttfts: Vec::new(),
    };
    for (res, took) in results {
        match res {
            Ok(chat) => {
                r.served += 1;
                r.late += usize::from(took > deadline);
                r.ttfts.push(chat.ttft.as_secs_f64() * 1e3);
            }
            Err(e) => r.failed.push(format!("{e:#}")),
        }
    }
    r.rps = r.served as f64 / elapsed;
    r
}

/// Runs the comparison and prints the table.
pub async fn burst(mut config: Config, bin: &Path, args: &BenchBurstArgs) -> anyhow::Result<()> {
    // The worker's capacity (its KV slots unless --capacity says otherwise; 4 by
    // default on cpu) is llama-server's --parallel.
    let capacity = match (config.worker.capacity, config.worker.parallel_slots) {
        (0, 0) => 4,
        (0, slots) => slots as usize,
        (c, _) => c as usize,
    };
    let threads = match config.worker.threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n as usize,
    };
    let model = switchyard_node::model_path(&config)?;
    let ctx = (512 * capacity).to_string();
    // One HTTP thread per request in flight at the largest load, so llama-server
    // queues every request instead of refusing connections.
    let http_threads = (args.loads.iter().max().copied().unwrap_or(1) * capacity + 2).to_string();
    eprintln!(
        "starting llama-server ({threads} threads, --parallel {capacity}, -c {ctx}, --threads-http {http_threads}) on {} …",
        model.display()
    );
    let server = LlamaServer::start_with(
        bin,
        &model,
        threads,
        capacity,
        &["-c", &ctx, "--threads-http", &http_threads],
    )
    .await?;
    config.worker.parallel_slots = capacity as u32;
    config.worker.capacity = capacity as u32;
    config.worker.context_len = 512;
    config.worker.threads = threads as u32;
    config.worker.id = "bench-burst".into();
    config.validate()?;
    let local = LocalNode::start(config).await?;
    let name = local.loaded.name.clone();
    let deadline = Duration::from_secs(args.deadline_s);
    let listen = GatewayConfig {
        listen: "127.0.0.1:0".into(),
        queue_timeout_ms: deadline.as_millis() as u64,
        ..GatewayConfig::default()
    };
    let gw = switchyard_gateway::start(local.client.clone(), &local.config.nats.prefix, &listen).await?;
    // A fresh connection per request on both sides: llama-server closes idle
    // keep-alive connections, and a pooled one it closed would fail the request
    // ("connection closed before message completed") for want of the client's retry.
    let http = reqwest::Client::builder()
        .timeout(deadline)
        .pool_max_idle_per_host(0)
        .build()?;
    eprintln!("warming up …");
    run(&http, &server.url, capacity, capacity, args.max_tokens, deadline).await;
    run(&http, &gw.url(), capacity, capacity, args.max_tokens, deadline).await;

    println!(
        "Bursts of streaming chats: {name}, {threads} threads, capacity {capacity} (llama-server --parallel \
         {capacity}), {} tokens each, greedy, deadline {} s; served = within the deadline",
        args.max_tokens, args.deadline_s
    );
    println!(
        "{:<6} {:>9} {:>13} {:>13} {:>9} {:>9} {:>7} {:>18} {:>18} {:>9}",
        "load",
        "requests",
        "llama served",
        "sy served",
        "llama r/s",
        "sy r/s",
        "ratio",
        "TTFT p50/p99 (l)",
        "TTFT p50/p99 (sy)",
        "p99 ratio"
    );
    let mut failures = Vec::new();
    for (k, &load) in args.loads.iter().enumerate() {
        let c = load * capacity;
        let n = c * args.rounds.max(1);
        eprintln!("{load}× capacity: {n} requests, {c} at a time …");
        let (l, s) = if k % 2 == 0 {
            let l = run(&http, &server.url, n, c, args.max_tokens, deadline).await;
            (l, run(&http, &gw.url(), n, c, args.max_tokens, deadline).await)
        } else {
            let s = run(&http, &gw.url(), n, c, args.max_tokens, deadline).await;
            (run(&http, &server.url, n, c, args.max_tokens, deadline).await, s)
        };
        let p = |r: &Run, q| percentile(&r.ttfts, q);
        let ok = |r: &Run| format!("{}/{n}", r.served - r.late);
        println!(
            "{:<6} {:>9} {:>13} {:>13} {:>9.2} {:>9.2} {:>7.3} {:>18} {:>18} {:>9.3}",
            format!("{load}×"),
            n,
            ok(&l),
            ok(&s),
            l.rps,
            s.rps,
            s.rps / l.rps.max(1e-9),
            format!("{:.0}/{:.0} ms", p(&l, 0.5), p(&l, 0.99)),
            format!("{:.0}/{:.0} ms", p(&s, 0.5), p(&s, 0.99)),
            p(&s, 0.99) / p(&l, 0.99).max(1e-9),
        );
        for (side, r) in [("llama-server", &l), ("switchyard", &s)] {
            if let Some(e) = r.failed.first() {
                failures.push(format!("{load}× {side}: {} failed, e.g. {e}", r.failed.len()));
            }
            if r.late > 0 {
                failures.push(format!("{load}× {side}: {} served after the deadline", r.late));
            }
        }
    }
    println!("ratio: switchyard's requests/s over llama-server's (goal ≥ 1.1); p99 ratio: TTFT p99, switchyard over llama-server (goal ≤ 1)");
    for f in &failures {
        println!("  {f}");
    }
    gw.shutdown().await;
    local.stop().await;
    drop(server);
    Ok(())
}
