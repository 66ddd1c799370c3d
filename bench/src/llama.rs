//! `switchyard bench llama`: switchyard's CPU engine against llama.cpp's llama-server
//! on the same GGUF, same prompt, same thread count, alternating runs; with `--cuda N`
//! the native cuda engine against a CUDA llama-server, both on GPU N.

use super::{median, BENCH_PROMPT};
use clap::Args;
use futures::StreamExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use switchyard_backend::{CancelFlag, GenerateEvent, Prompt, TextModel};
use switchyard_messages::{GenerateConfig, LoadConfig};
use switchyard_workers::engine::candle::Placement;
use switchyard_workers::engine::{EngineModel, ForwardPass};

/// `switchyard bench llama`.
#[derive(Args, Debug)]
pub struct BenchLlamaArgs {
    /// GGUF model (default: the demo model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// llama-server binary (default: $SWITCHYARD_LLAMA_SERVER, else what
    /// scripts/build-llama-server.sh built).
    #[arg(long)]
    pub llama_server: Option<PathBuf>,
    /// Threads for both engines.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Measured runs of each engine (after one warm-up each).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u32,
    /// Paragraphs of ~100 tokens per prompt (15 gives the ~1,500-token long prompt).
    #[arg(long, default_value_t = 1)]
    pub paragraphs: usize,
    /// bench llama on NVIDIA GPU N: the native cuda engine (a cuda build) against a CUDA llama-server with every layer offloaded (-ngl 999 --device CUDA<N>).
    #[arg(long)]
    pub cuda: Option<usize>,
}

struct Sample {
    prompt_tokens: u64,
    prefill_tps: f64,
    decode_tps: f64,
    generated: u64,
}

/// First words of the benchmark prompts: distinct first tokens, so no run shares a
/// prefix with another.
const OPENERS: [&str; 12] = [
    "Chapter", "Notes", "Summary", "Draft", "Report", "Essay", "Story", "Lecture", "Overview", "Memo", "Article",
    "Outline",
];

/// Runs the comparison and prints the report.
/// `shape` is (threads, runs, tokens generated per run, paragraphs of ~100 tokens per
/// prompt).
pub async fn llama(
    model: &Path,
    server_bin: &Path,
    (threads, runs, max_tokens, paragraphs): (usize, usize, u32, usize),
    cuda: Option<usize>,
) -> anyhow::Result<()> {
    let cpu = switchyard_procs::llama_server::cpu_features(server_bin);
    let engine = match cuda {
        Some(i) => format!("cuda engine ({})", Placement::Cuda(i).label()),
        None => "cpu engine".into(),
    };
    eprintln!("loading {} in switchyard's {engine} …", model.display());
    // One KV slot, like llama-server's `--parallel 1`: every run prefills into the
    // same (already touched) cache memory.
    let load = LoadConfig {
        threads: threads as u32,
        context_len: switchyard_procs::llama_server::CONTEXT,
        parallel_slots: 1,
        ..LoadConfig::default()
    };
    let m: Arc<dyn TextModel> = match cuda {
        None => super::engine_model(model, &load)?,
        Some(i) => {
            let compute = ForwardPass::Candle {
                placement: Placement::Cuda(i),
                gpu_layers: -1,
            };
            Arc::new(EngineModel::load_on(model, &load, compute)?)
        }
    };
    // Loaded first: a build without CUDA says so before llama-server starts.
    let offload = cuda.map(|i| ["-ngl".to_string(), "999".into(), "--device".into(), format!("CUDA{i}")]);
    let extra: Vec<&str> = offload.iter().flatten().map(String::as_str).collect();
    let server = switchyard_procs::llama_server::LlamaServer::start_with(server_bin, model, threads, 1, &extra).await?;
    let (url, pid) = (server.url.clone(), server.pid());
    let http = switchyard_procs::llama_server::http_client();

    // Both engines reuse a cached prompt prefix; this compares cold prefill, so every
    // run (the warm-up too) gets a prompt of its own from the first token on, and
    // llama.cpp also gets `cache_prompt: false`. (Alternating two prompts used to let
    // switchyard's third run start warm: it then computed one token and reported the
    // fixed cost of that as a very low prefill rate, so the median depended on --runs.)
    // A run that still reused anything is an error, not a sample.
    let paragraphs = paragraphs.max(1);
    let prompt = |i: usize| {
        let mut text = format!("{} {i}.", OPENERS[i % OPENERS.len()]);
        for p in 0..paragraphs {
            if paragraphs > 1 {
                text.push_str(&format!("\n\nPart {}.", p + 1));
            }
            text.push(' ');
            text.push_str(BENCH_PROMPT);
        }
        text
    };
    let llama_once = |i: usize| {
        let http = http.clone();
        let url = url.clone();
        let prompt = prompt(i);
        async move {
            let body = serde_json::json!({
                "prompt": prompt, "n_predict": max_tokens, "temperature": 0.0,
                "cache_prompt": false, "ignore_eos": true,
            });
            let v: serde_json::Value = http
                .post(format!("{url}/completion"))
                .json(&body)
                .send()
                .await?
                .json()
                .await?;
            let t = &v["timings"];
            let cached = t["cache_n"].as_u64().unwrap_or(0);
            anyhow::ensure!(
                cached == 0,
                "llama.cpp reused {cached} cached prompt tokens; runs must be cold"
            );
            anyhow::Ok(Sample {
                prompt_tokens: t["prompt_n"].as_u64().unwrap_or(0),
                prefill_tps: t["prompt_per_second"].as_f64().unwrap_or(0.0),
                decode_tps: t["predicted_per_second"].as_f64().unwrap_or(0.0),
                generated: t["predicted_n"].as_u64().unwrap_or(0),
            })
        }
    };
    let ours_once = |i: usize| {
        let m = m.clone();
        let prompt = prompt(i);
        async move {
            let cfg = GenerateConfig {
                max_tokens,
                ..GenerateConfig::default()
            };
            let mut events = m.generate(Prompt::Text(prompt), cfg, CancelFlag::new());
            let mut sample = Sample {
                prompt_tokens: 0,
                prefill_tps: 0.0,
                decode_tps: 0.0,
                generated: 0,
            };
            while let Some(ev) = events.next().await {
                if let GenerateEvent::Done { metrics, .. } = ev? {
                    // At most the BOS token every prompt of a model like Gemma starts with.
                    anyhow::ensure!(
                        metrics.cached_tokens <= 1,
                        "switchyard reused {} cached prompt tokens; runs must be cold",
                        metrics.cached_tokens
                    );
                    sample = Sample {
                        prompt_tokens: metrics.prompt_tokens as u64,
                        prefill_tps: metrics.prefill_tokens_per_sec,
                        decode_tps: metrics.decode_tokens_per_sec,
                        generated: metrics.generated_tokens as u64,
                    };
                }
            }
            anyhow::Ok(sample)
        }
    };
    eprintln!("warming up both …");
    llama_once(0).await?;
    ours_once(0).await?;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    // Each side's idle threads keep spinning for a while after a request (llama.cpp's
    // OpenMP threads longest), which steals the cores from whatever runs next: the
    // other engine's prefill measured 20% slower when it followed directly. So every
    // request starts after a pause.
    let settle = || tokio::time::sleep(std::time::Duration::from_millis(500));
    for i in 1..=runs {
        if i % 2 == 1 {
            settle().await;
            ours.push(ours_once(i).await?);
            settle().await;
            theirs.push(llama_once(i).await?);
        } else {
            settle().await;
            theirs.push(llama_once(i).await?);
            settle().await;
            ours.push(ours_once(i).await?);
        }
        let (o, t) = (&ours[i - 1], &theirs[i - 1]);
        eprintln!(
            "run {i}/{runs}: prefill {:.1} vs {:.1} tok/s, decode {:.1} vs {:.1} tok/s",
            o.prefill_tps, t.prefill_tps, o.decode_tps, t.decode_tps
        );
    }
    let med = |xs: &[Sample], f: fn(&Sample) -> f64| median(&xs.iter().map(f).collect::<Vec<_>>());
    let (op, od) = (med(&ours, |s| s.prefill_tps), med(&ours, |s| s.decode_tps));
    let (lp, ld) = (med(&theirs, |s| s.prefill_tps), med(&theirs, |s| s.decode_tps));
    let our_rss = switchyard_fabric::host::process_memory(None).0;
    let their_rss = switchyard_fabric::host::process_memory(Some(pid)).0;
    println!(
        "switchyard {engine} vs llama-server{}: {}, {threads} threads, {} prompt tokens (llama.cpp: {}), {max_tokens} greedy tokens \
         (switchyard generated {}, llama.cpp {}), {runs} alternating runs, medians",
        if cuda.is_some() { " (-ngl 999)" } else { "" },
        model.file_name().map(|f| f.to_string_lossy()).unwrap_or_default(),
        ours[0].prompt_tokens,
        theirs[0].prompt_tokens,
        ours[0].generated,
        theirs[0].generated,
    );
    let kernels = match cuda {
        Some(_) => m.info().kernels,
        None => switchyard_workers::engine::kernels::isa::active().to_string(),
    };
    println!(
        "kernels: switchyard {kernels} (this CPU offers: {}); llama.cpp {} built for {}",
        switchyard_workers::engine::kernels::isa::Isa::available()
            .iter()
            .map(|i| i.name())
            .collect::<Vec<_>>()
            .join(", "),
        server_bin.display(),
        cpu.as_deref().unwrap_or("(unknown CPU features)")
    );
    println!("{:<20} {:>12} {:>12} {:>8}", "", "switchyard", "llama.cpp", "ratio");
    println!("{:<20} {:>12.1} {:>12.1} {:>8.3}", "prefill tok/s", op, lp, op / lp);
    println!("{:<20} {:>12.1} {:>12.1} {:>8.3}", "decode tok/s", od, ld, od / ld);
    if cuda.is_some() {
        // Both processes share the GPU; the driver's figure is their sum.
        return Ok(());
    }
    println!(
        "{:<20} {:>12.1} {:>12.1} {:>8.3}",
        "peak RSS MB",
        our_rss as f64 / 1e6,
        their_rss as f64 / 1e6,
        our_rss as f64 / their_rss.max(1) as f64
    );
    // The physical limit, measured after both engines are done (nothing else reading).
    drop(server);
    let step = super::limit::StepBytes::of(model)?;
    let position = ours[0].prompt_tokens + ours[0].generated / 2;
    let bytes = step.at(position) as f64;
    let bandwidth = super::limit::read_bandwidth(threads);
    let limit = bandwidth / bytes;
    println!(
        "physical limit: this host reads {:.1} GB/s ({threads} threads, streaming 1 GiB); a decode step \
         at position {position} reads {:.1} MB (weights {:.1} + KV {:.1} at f16) → at most {limit:.1} tok/s",
        bandwidth / 1e9,
        bytes / 1e6,
        step.weights as f64 / 1e6,
        (step.kv_per_position * position) as f64 / 1e6,
    );
    println!(
        "{:<20} {:>11.1}% {:>11.1}%",
        "decode / limit",
        100.0 * od / limit,
        100.0 * ld / limit
    );
    Ok(())
}
