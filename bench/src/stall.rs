//! `switchyard bench stall`: what a long new prompt does to streams already running.
//! Four streams generate; once each has a few tokens, a ~1,500-token prompt arrives.
//! Every token's arrival time is recorded, and the gaps between a stream's tokens
//! give the inter-token latency (ITL): median, p99 and the longest gap, beside the
//! same streams with no long prompt (the baseline). Three engines on the same GGUF,
//! threads and slots, rounds alternating: switchyard's CPU engine with chunked
//! prefill (`worker.prefill_chunk` 0: a chunk costs about one decode step), the same
//! engine prefilling the whole prompt at once (what it did before), and llama-server
//! `--parallel` (streams over its HTTP API).

use super::{median, BENCH_PROMPT};
use clap::Args;
use futures::StreamExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_backend::{CancelFlag, GenerateEvent, Prompt, TextModel};
use switchyard_messages::{GenerateConfig, LoadConfig};
use tokio::sync::Notify;

/// `switchyard bench stall`.
#[derive(Args, Debug)]
pub struct BenchStallArgs {
    /// GGUF model (default: the demo model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// llama-server binary (default: $SWITCHYARD_LLAMA_SERVER, else what
    /// scripts/build-llama-server.sh built).
    #[arg(long)]
    pub llama_server: Option<PathBuf>,
    /// Threads for every engine.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Running streams the long prompt interrupts.
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// Tokens each running stream generates.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// Tokens every running stream has before the long prompt is sent.
    #[arg(long, default_value_t = 8)]
    pub after: u32,
    /// Paragraphs of ~100 tokens in the long prompt.
    #[arg(long, default_value_t = 15)]
    pub paragraphs: usize,
    /// Rounds of each engine, with and without the long prompt.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
}

/// Arrival times of one round: each running stream's tokens, and the long prompt's
/// time to first token (when there was one).
struct Round {
    arrivals: Vec<Vec<Instant>>,
    long_ttft: Option<Duration>,
}

impl Round {
    /// Gaps between consecutive tokens of each stream, in milliseconds.
    fn gaps(&self) -> Vec<f64> {
        self.arrivals
            .iter()
            .flat_map(|a| a.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3))
            .collect()
    }
}

/// One engine under test.
enum Engine {
    Ours(Arc<dyn TextModel>),
    Llama { url: String, http: reqwest::Client },
}

/// Streams one completion, sending each token's arrival time.
async fn stream(
    engine: &Engine,
    prompt: String,
    max_tokens: u32,
    mut on_token: impl FnMut(Instant, u32),
) -> anyhow::Result<()> {
    match engine {
        Engine::Ours(m) => {
            let cfg = GenerateConfig {
                max_tokens,
                ..GenerateConfig::default()
            };
            let mut events = m.generate(Prompt::Text(prompt), cfg, CancelFlag::new());
            let mut n = 0;
            while let Some(ev) = events.next().await {
                if let GenerateEvent::Token(_) = ev? {
                    n += 1;
                    on_token(Instant::now(), n);
                }
            }
        }
        Engine::Llama { url, http } => {
            let body = serde_json::json!({
                "prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "stream": true,
                "cache_prompt": false, "ignore_eos": true,
            });
            let r = http.post(format!("{url}/completion")).json(&body).send().await?;
            anyhow::ensure!(r.status().is_success(), "llama-server /completion: {}", r.status());
            let mut n = 0;
            super::llama_cpp::sse_tokens(r, |k| {
                for _ in 0..k {
                    n += 1;
                    on_token(Instant::now(), n);
                }
            })
            .await?;
        }
    }
    Ok(())
}

/// One round: `streams` running streams and, with `long`, the long prompt once every
/// stream has `after` tokens.
async fn round(engine: &Engine, args: &BenchStallArgs, tag: usize, long: Option<String>) -> anyhow::Result<Round> {
    let ready = Arc::new(Notify::new());
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let runs = (0..args.streams).map(|i| {
        let (ready, started) = (ready.clone(), started.clone());
        let prompt = format!("Stream {tag}-{i}. {BENCH_PROMPT}");
        async move {
            let mut times = Vec::new();
            let after = args.after;
            stream(engine, prompt, args.max_tokens, |t, n| {
                times.push(t);
                if n == after && started.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == args.streams {
                    ready.notify_one();
                }
            })
            .await?;
            anyhow::Ok(times)
        }
    });
    let long_run = async {
        let Some(prompt) = long else { return anyhow::Ok(None) };
        ready.notified().await;
        let sent = Instant::now();
        let mut first = None;
        stream(engine, prompt, 4, |t, _| {
            first.get_or_insert(t - sent);
        })
        .await?;
        anyhow::Ok(first)
    };
    let (arrivals, long_ttft) = tokio::join!(futures::future::try_join_all(runs), long_run);
    Ok(Round {
        arrivals: arrivals?,
        long_ttft: long_ttft?,
    })
}

/// p-th percentile (nearest rank) of `xs`.
fn percentile(xs: &[f64], p: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Runs the comparison and prints the table.
pub async fn run(args: &BenchStallArgs) -> anyhow::Result<ExitCode> {
    let model = args.model.clone().unwrap_or_else(switchyard_node::demo_model_path);
    let bin = super::llama_cpp::llama_server_or_build(args.llama_server.as_deref())?;
    let slots = args.streams + 1;
    eprintln!("starting llama-server ({} threads, --parallel {slots}) …", args.threads);
    // llama-server splits its context among its slots: give each slot what ours has.
    let ctx = (switchyard_procs::llama_server::CONTEXT as usize * slots).to_string();
    let server =
        switchyard_procs::llama_server::LlamaServer::start_with(&bin, &model, args.threads, slots, &["-c", &ctx])
            .await?;
    let load = |chunk: u32| -> anyhow::Result<Arc<dyn TextModel>> {
        let cfg = LoadConfig {
            threads: args.threads as u32,
            context_len: switchyard_procs::llama_server::CONTEXT,
            parallel_slots: slots as u32,
            prefill_chunk: chunk,
            kv_cache_mb: 0,
            ..LoadConfig::default()
        };
        Ok(super::engine_model(&model, &cfg)?)
    };
    eprintln!("loading {} twice in switchyard's cpu engine …", model.display());
    let engines = [
        ("switchyard, chunked prefill", Engine::Ours(load(0)?)),
        ("switchyard, whole prefill", Engine::Ours(load(u32::MAX)?)),
        (
            "llama-server",
            Engine::Llama {
                url: server.url.clone(),
                http: switchyard_procs::llama_server::http_client(),
            },
        ),
    ];
    let long = |tag: usize| {
        let mut doc = format!("Archive record {tag}.");
        for p in 0..args.paragraphs {
            doc.push_str(&format!("\n\nPart {}. {BENCH_PROMPT}", p + 1));
        }
        doc
    };
    eprintln!("warming up …");
    for (i, (_, e)) in engines.iter().enumerate() {
        round(e, args, 900 + i, Some(long(900 + i))).await?;
    }
    // Per engine: gaps with the long prompt, gaps without, the long prompt's TTFTs.
    let mut with: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    let mut without: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    let mut ttft: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    let mut tag = 0;
    for r in 0..args.runs {
        for k in 0..engines.len() {
            // Rotate the order so drift hits every engine alike.
            let i = (k + r) % engines.len();
            let (name, e) = &engines[i];
            tag += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let base = round(e, args, tag, None).await?;
            without[i].extend(base.gaps());
            tokio::time::sleep(Duration::from_millis(500)).await;
            let hit = round(e, args, tag + 1000, Some(long(tag))).await?;
            with[i].extend(hit.gaps());
            let t = hit.long_ttft.unwrap_or_default().as_secs_f64() * 1e3;
            ttft[i].push(t);
            eprintln!(
                "round {}/{}: {name}: long prompt first token after {t:.0} ms",
                r + 1,
                args.runs
            );
        }
    }
    println!(
        "stalls: {}, {} threads, {} running streams × {} tokens, a {}-paragraph (~{} token) prompt arrives after {} \
         tokens each; {} rounds per engine, with and without the long prompt",
        model.file_name().map(|f| f.to_string_lossy()).unwrap_or_default(),
        args.threads,
        args.streams,
        args.max_tokens,
        args.paragraphs,
        args.paragraphs * 100,
        args.after,
        args.runs
    );
    println!(
        "{:<30} {:>10} {:>10} {:>10} {:>10} {:>12} {:>14} {:>12}",
        "ITL ms", "base p50", "p50", "p99", "max", "p99/p50", "p99/base p50", "long TTFT"
    );
    for (i, (name, _)) in engines.iter().enumerate() {
        let (b50, p50) = (median(&without[i]), median(&with[i]));
        let (p99, max) = (percentile(&with[i], 99.0), percentile(&with[i], 100.0));
        println!(
            "{name:<30} {b50:>10.1} {p50:>10.1} {p99:>10.1} {max:>10.1} {:>12.2} {:>14.2} {:>10.0}ms",
            p99 / p50,
            p99 / b50,
            median(&ttft[i])
        );
    }
    println!("ITL = gaps between consecutive tokens of each running stream, over all rounds");
    drop(server);
    Ok(ExitCode::SUCCESS)
}
