//! `switchyard bench kv`: what many streams behind one long system prompt hold in KV,
//! with the CPU engine's shared pages and with a copy per slot (the layout before
//! pages), in this process. A first request computes the prompt (cold); then all
//! streams arrive at once, each with its own question, and generate; the engine's
//! accounting of the KV it holds (each page once, however many slots share it) is
//! read when they are done, with the process's RSS growth beside it.

use clap::Args;
use futures::StreamExt;
use std::path::{Path, PathBuf};
use std::time::Instant;
use switchyard_backend::{CancelFlag, GenerateEvent, Prompt, TextModel};
use switchyard_messages::{GenerateConfig, GenerateMetrics, LoadConfig};
use switchyard_workers::EngineModel;

/// `switchyard bench kv`.
#[derive(Args, Debug)]
pub struct BenchKvPagesArgs {
    /// The GGUF model (default: the demo model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Concurrent streams (KV slots).
    #[arg(long, default_value_t = 32)]
    pub streams: usize,
    /// Tokens of the system prompt they share.
    #[arg(long, default_value_t = 1500)]
    pub prompt_tokens: usize,
    /// Tokens each stream generates.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: u32,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// One layout's figures.
struct Outcome {
    /// KV bytes the engine holds after the streams, and the tokens the slots hold.
    held: u64,
    tokens: u64,
    /// Tokens beyond the shared prompt, over all streams.
    own: u64,
    rss_growth: u64,
    cold_ttft_ms: f64,
    /// Time to first token of the streams, in arrival order.
    ttft_ms: Vec<f64>,
    /// Prompt tokens the last stream got from KV.
    last_cached: u32,
}

fn ttft_ms(m: &GenerateMetrics) -> f64 {
    (m.queue_us + m.prefill_us) as f64 / 1000.0
}

async fn finish(model: &EngineModel, prompt: Vec<u32>, max_tokens: u32) -> anyhow::Result<GenerateMetrics> {
    let config = GenerateConfig {
        max_tokens,
        ..GenerateConfig::default()
    };
    let mut events = model.generate(Prompt::Tokens(prompt), config, CancelFlag::new());
    while let Some(ev) = events.next().await {
        if let GenerateEvent::Done { metrics, .. } = ev? {
            return Ok(metrics);
        }
    }
    anyhow::bail!("the stream ended without a result")
}

/// For each of `streams + 1` streams: the shared prompt (exactly `n` tokens), then
/// its own question.
fn prompts(model: &EngineModel, n: usize, streams: usize) -> anyhow::Result<Vec<Vec<u32>>> {
    let tok = model.tokenizer();
    let mut text = String::from("You are the archive's assistant. The archive holds these records:\n");
    let mut ids = Vec::new();
    for i in 1.. {
        text.push_str(&format!(
            "Record {i}: the harbour committee met on day {i} to review the accounts, the bridges and the \
             grain stores, and recorded decision number {} for the council.\n",
            i * 37 % 1000
        ));
        ids = tok.encode(&text).map_err(anyhow::Error::msg)?;
        if ids.len() >= n {
            break;
        }
    }
    ids.truncate(n);
    (0..=streams)
        .map(|i| {
            let q = tok.encode(&format!(
                "\nQuestion {i}: what did record {} decide?\nAnswer:",
                i * 7 + 3
            ));
            q.map(|q| [ids.as_slice(), &q].concat()).map_err(anyhow::Error::msg)
        })
        .collect()
}

async fn measure(path: &Path, args: &BenchKvPagesArgs, copy: bool) -> anyhow::Result<Outcome> {
    let config = LoadConfig {
        threads: args.threads as u32,
        parallel_slots: args.streams as u32,
        context_len: (args.prompt_tokens + 64 + args.max_tokens as usize).next_power_of_two() as u32,
        copy_kv_prefixes: copy,
        ..LoadConfig::default()
    };
    let model = EngineModel::load(path, &config)?;
    let mut questions = prompts(&model, args.prompt_tokens, args.streams)?;
    let rss0 = switchyard_fabric::host::process_memory(None).1;
    let cold = finish(&model, questions.remove(0), args.max_tokens).await?;
    let started = Instant::now();
    let runs = questions.iter().map(|q| finish(&model, q.clone(), args.max_tokens));
    let done: Vec<GenerateMetrics> = futures::future::try_join_all(runs).await?;
    eprintln!(
        "  {} streams done in {:.1} s",
        done.len(),
        started.elapsed().as_secs_f64()
    );
    let usage = model.kv_usage();
    let own = done
        .iter()
        .chain([&cold])
        .map(|m| (m.prompt_tokens as usize + m.generated_tokens as usize - args.prompt_tokens) as u64)
        .sum();
    Ok(Outcome {
        held: usage.resident_bytes,
        tokens: usage.resident_tokens,
        own,
        rss_growth: switchyard_fabric::host::process_memory(None).1.saturating_sub(rss0),
        cold_ttft_ms: ttft_ms(&cold),
        ttft_ms: done.iter().map(ttft_ms).collect(),
        last_cached: done.last().map_or(0, |m| m.cached_tokens),
    })
}

/// Runs both layouts and prints them side by side.
pub async fn run(args: &BenchKvPagesArgs) -> anyhow::Result<()> {
    let path = args
        .model
        .clone()
        .unwrap_or_else(switchyard_workers::local::demo_model_path);
    anyhow::ensure!(
        args.streams >= 1 && args.prompt_tokens >= 1,
        "--streams and --prompt-tokens must be at least 1"
    );
    // Shared pages first: memory a layout frees stays with the allocator and is
    // reused by the next, so only the first layout's RSS growth is exact.
    let mut rows = Vec::new();
    for (name, copy) in [("shared pages", false), ("copy per slot", true)] {
        eprintln!("{name}: {} …", path.display());
        rows.push(measure(&path, args, copy).await?);
    }
    rows.reverse();
    // Bytes per token from the copying layout, where every slot holds each of its
    // tokens once (exact for models without sliding-window rings).
    let per_token = rows[0].held as f64 / rows[0].tokens.max(1) as f64;
    let ideal = per_token * (args.prompt_tokens as u64 + rows[0].own) as f64;
    let mib = |b: f64| b / (1024.0 * 1024.0);
    println!(
        "kv pages: {} streams share a {}-token system prompt, {} tokens each; {} ({:.1} KiB of KV per token)",
        args.streams,
        args.prompt_tokens,
        args.max_tokens,
        path.file_name().unwrap_or_default().to_string_lossy(),
        per_token / 1024.0
    );
    println!("{:<40} {:>16} {:>16}", "", "copy per slot", "shared pages");
    let row = |label: &str, f: &dyn Fn(&Outcome) -> String| {
        println!("{label:<40} {:>16} {:>16}", f(&rows[0]), f(&rows[1]));
    };
    let streams = (args.streams + 1) as f64;
    row("KV held, MiB", &|o| format!("{:.1}", mib(o.held as f64)));
    row("× (one prompt copy + own tokens)", &|o| {
        format!("{:.2}", o.held as f64 / ideal)
    });
    row("KV per stream, MiB", &|o| {
        format!("{:.2}", mib(o.held as f64 / streams))
    });
    row("streams per GiB of KV", &|o| {
        format!("{:.0}", 1024.0 / mib(o.held as f64 / streams))
    });
    row("process RSS growth, MiB", &|o| {
        format!("{:.1}", mib(o.rss_growth as f64))
    });
    row("cold TTFT (first stream), ms", &|o| format!("{:.0}", o.cold_ttft_ms));
    row("TTFT of the others, median ms", &|o| {
        format!("{:.0}", super::median(&o.ttft_ms))
    });
    row("TTFT of the last, ms", &|o| {
        format!("{:.0}", o.ttft_ms.last().copied().unwrap_or(0.0))
    });
    row("prompt tokens the last got from KV", &|o| o.last_cached.to_string());
    println!(
        "(all {} streams counted: the cold one and the {} that arrive together; KV held = the engine's \
         accounting once they are done, each page once; shared pages ran first, so the copying layout's \
         RSS growth is net of memory the allocator kept from it)",
        args.streams + 1,
        args.streams
    );
    Ok(())
}
