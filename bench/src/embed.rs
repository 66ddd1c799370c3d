//! `switchyard bench embed`: embeddings throughput of the CPU engine (in this
//! process, one slot) against llama-server's `--embeddings --pooling mean` on the same
//! GGUF, same threads, the same slots (`--slots`, default one) each, alternating runs of the same inputs: inputs/s
//! and tokens/s, the ratio, and the lowest cosine between the two engines' vectors.

use super::median;
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use switchyard_backend::{Prompt, TextModel};
use switchyard_messages::LoadConfig;

/// `switchyard bench embed`.
#[derive(Args, Debug)]
pub struct BenchEmbedArgs {
    /// GGUF model (default: the demo model): a chat model (mean-pooled hidden states)
    /// or an embedding model (e.g. all-MiniLM-L6-v2-f32.gguf from
    /// scripts/embedding-model.sh). llama-server loads the same file.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// llama-server binary (default: $SWITCHYARD_LLAMA_SERVER, else what
    /// scripts/build-llama-server.sh built).
    #[arg(long)]
    pub llama_server: Option<PathBuf>,
    /// Compute threads for both.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Measured runs of each (after one warm-up each).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Inputs per run (sentences of 10–40 tokens, as a RAG loader sends chunks).
    #[arg(long, default_value_t = 32)]
    pub inputs: usize,
    /// Sequences each computes at once: switchyard's KV slots (chat models embed that
    /// many inputs per pass; embedding models batch regardless) and llama-server's
    /// `--parallel`.
    #[arg(long, default_value_t = 1)]
    pub slots: usize,
}

/// Sentences the inputs are made of (each input: one or two of them and its number,
/// so no two inputs are the same).
const SENTENCES: [&str; 8] = [
    "The warehouse ships orders within two business days of payment.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Our refund policy allows returns within thirty days with a receipt.",
    "The function parses the configuration file and validates every field.",
    "Heavy rain is expected tomorrow across the northern coast.",
    "Customers reported that the new firmware drains the battery faster.",
    "The committee approved the budget after a long debate on Tuesday.",
    "Gradient descent updates the weights against the gradient of the loss.",
];

fn inputs(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let a = SENTENCES[i % SENTENCES.len()];
            let b = SENTENCES[(i * 3 + 1) % SENTENCES.len()];
            if i % 2 == 0 {
                format!("{i}. {a}")
            } else {
                format!("{i}. {a} {b}")
            }
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// Runs the comparison and prints the report.
pub async fn embed(model: &Path, server_bin: &Path, args: &BenchEmbedArgs) -> anyhow::Result<()> {
    let (threads, runs, n, slots) = (args.threads, args.runs, args.inputs, args.slots.max(1));
    eprintln!("loading {} in switchyard's cpu engine …", model.display());
    let load = LoadConfig {
        threads: threads as u32,
        context_len: switchyard_procs::llama_server::CONTEXT,
        parallel_slots: slots as u32,
        ..LoadConfig::default()
    };
    let m: Arc<dyn TextModel> = super::engine_model(model, &load)?;
    let server_args = ["--embeddings", "--pooling", "mean"];
    let server =
        switchyard_procs::llama_server::LlamaServer::start_with(server_bin, model, threads, slots, &server_args)
            .await?;
    let texts = inputs(n.max(1));
    let prompts: Vec<Prompt> = texts.iter().cloned().map(Prompt::Text).collect();

    let ours_once = || async {
        let t = Instant::now();
        let out = m.embed(prompts.clone()).await;
        let secs = t.elapsed().as_secs_f64();
        let vectors = out.into_iter().collect::<Result<Vec<_>, _>>()?;
        let tokens: u64 = vectors.iter().map(|e| u64::from(e.tokens)).sum();
        anyhow::Ok((secs, tokens, vectors.into_iter().map(|e| e.vector).collect::<Vec<_>>()))
    };
    let theirs_once = || async {
        let t = Instant::now();
        let v = server
            .post("/v1/embeddings", serde_json::json!({"input": texts}))
            .await?;
        let secs = t.elapsed().as_secs_f64();
        let vectors: Vec<Vec<f32>> = v["data"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter_map(|e| serde_json::from_value(e["embedding"].clone()).ok())
                    .collect()
            })
            .unwrap_or_default();
        anyhow::ensure!(
            vectors.len() == texts.len(),
            "llama-server answered {} of {} inputs",
            vectors.len(),
            texts.len()
        );
        let tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        anyhow::Ok((secs, tokens, vectors))
    };
    eprintln!("warming up both …");
    let (_, _, a) = ours_once().await?;
    let (_, _, b) = theirs_once().await?;
    let worst = a.iter().zip(&b).map(|(x, y)| cosine(x, y)).fold(1.0, f64::min);
    let (mut ours, mut theirs, mut tokens) = (Vec::new(), Vec::new(), 0);
    for r in 0..runs.max(1) {
        let (s, t, _) = ours_once().await?;
        ours.push(s);
        tokens = t;
        let (s2, _, _) = theirs_once().await?;
        theirs.push(s2);
        eprintln!(
            "run {}/{}: {:.1} vs {:.1} inputs/s",
            r + 1,
            runs.max(1),
            n as f64 / s,
            n as f64 / s2
        );
    }
    let (o, t) = (n as f64 / median(&ours), n as f64 / median(&theirs));
    println!(
        "switchyard cpu engine vs llama-server --embeddings --pooling mean: {}, {threads} threads, {slots} slot(s) each, \
         {n} inputs ({tokens} tokens) per run, {} alternating runs, medians",
        model.file_name().unwrap_or_default().to_string_lossy(),
        runs.max(1)
    );
    println!(
        "kernels: switchyard {}",
        switchyard_workers::engine::kernels::isa::active()
    );
    println!("{:<18} {:>12} {:>12} {:>8}", "", "switchyard", "llama.cpp", "ratio");
    println!("{:<18} {o:>12.1} {t:>12.1} {:>8.3}", "inputs/s", o / t);
    let tps = |s: f64| tokens as f64 * s / n as f64;
    println!("{:<18} {:>12.1} {:>12.1}", "tokens/s", tps(o), tps(t));
    println!("lowest cosine between the two engines' vectors: {worst:.6}");
    Ok(())
}
