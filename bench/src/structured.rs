//! `switchyard bench structured`: what a JSON schema costs at decode. The CPU engine
//! (in this process, one KV slot) answers the same chat prompt free and constrained
//! to a nested schema, alternating runs, seeded sampling at temperature 0.7 (the
//! first draw is checked against the grammar and the whole vocabulary masked only
//! when it is rejected, so greedy would hide the mask's cost): decode tok/s of each,
//! the ratio, and how many tokens each run generated. Every constrained answer is
//! checked to parse as JSON.

use super::median;
use clap::Args;
use futures::StreamExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use switchyard_backend::{CancelFlag, GenerateEvent, Prompt, TextModel};
use switchyard_messages::{Constraint, GenerateConfig, LoadConfig, Message};

/// `switchyard bench structured`.
#[derive(Args, Debug)]
pub struct BenchStructuredArgs {
    /// GGUF models, one `--model` each (default: the demo model and Gemma 3 270M when
    /// installed).
    #[arg(long)]
    pub model: Vec<PathBuf>,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Measured runs of each kind (after one warm-up each).
    #[arg(long, default_value_t = 7)]
    pub runs: usize,
    /// Most tokens per run.
    #[arg(long, default_value_t = 300)]
    pub max_tokens: u32,
}

/// A realistic nested schema: a list of objects with an enum, bounds, an optional
/// field and a nested object.
pub const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "team": {"type": "string", "maxLength": 40},
    "users": {
      "type": "array", "minItems": 3, "maxItems": 6,
      "items": {
        "type": "object",
        "properties": {
          "name": {"type": "string", "maxLength": 30},
          "age": {"type": "integer", "minimum": 18, "maximum": 99},
          "role": {"enum": ["admin", "editor", "viewer"]},
          "email": {"type": "string", "maxLength": 40},
          "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "zip": {"type": "string", "pattern": "[0-9]{5}"}},
            "required": ["city", "zip"], "additionalProperties": false
          }
        },
        "required": ["name", "age", "role", "address"],
        "additionalProperties": false
      }
    }
  },
  "required": ["team", "users"],
  "additionalProperties": false
}"#;

const PROMPT: &str = "Describe the users of a small team wiki as JSON: a team name and a list of users, each with name, age, role, email and address.";

/// One run: decode tok/s and tokens generated.
struct Sample {
    decode_tps: f64,
    generated: u32,
    text: String,
}

async fn once(m: &Arc<dyn TextModel>, seed: u64, max_tokens: u32, constrained: bool) -> anyhow::Result<Sample> {
    let config = GenerateConfig {
        max_tokens,
        temperature: 0.7,
        top_k: 40,
        top_p: 0.95,
        seed: Some(seed),
        constraint: constrained.then(|| Constraint::JsonSchema { schema: SCHEMA.into() }),
        ..GenerateConfig::default()
    };
    // A fresh prompt per run (the seed first), so prefill is cold on both sides.
    let prompt = Prompt::chat(vec![Message::new("user", format!("Request {seed}. {PROMPT}"))]);
    let mut events = m.generate(prompt, config, CancelFlag::new());
    let mut text = String::new();
    while let Some(ev) = events.next().await {
        match ev? {
            GenerateEvent::Token(t) => text.push_str(&t.text),
            GenerateEvent::Done { metrics, .. } => {
                return Ok(Sample {
                    decode_tps: metrics.decode_tokens_per_sec,
                    generated: metrics.generated_tokens,
                    text,
                })
            }
        }
    }
    anyhow::bail!("the stream ended without a result")
}

/// The models to measure: those given, else the demo model and Gemma 3 270M when
/// `scripts/setup.sh` installed it.
pub fn default_models() -> Vec<PathBuf> {
    let demo = switchyard_workers::local::demo_model_path();
    let gemma = demo.with_file_name("gemma-3-270m-q4_k_m.gguf");
    let mut models = vec![demo];
    if gemma.exists() {
        models.push(gemma);
    }
    models
}

/// Runs the comparison on each model and prints one line per model.
pub async fn structured(models: &[PathBuf], threads: usize, runs: usize, max_tokens: u32) -> anyhow::Result<()> {
    println!(
        "{:<36} {:>10} {:>10} {:>7} {:>14} {:>14}",
        "model", "free tok/s", "json tok/s", "ratio", "free tokens", "json tokens"
    );
    for model in models {
        let (free, json) = measure(model, threads, runs, max_tokens).await?;
        let tps = |s: &[Sample]| median(&s.iter().map(|s| s.decode_tps).collect::<Vec<_>>());
        let toks = |s: &[Sample]| median(&s.iter().map(|s| f64::from(s.generated)).collect::<Vec<_>>());
        let (f, j) = (tps(&free), tps(&json));
        let name = model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        println!(
            "{name:<36} {f:>10.1} {j:>10.1} {:>6.3}x {:>14.0} {:>14.0}",
            j / f.max(1e-9),
            toks(&free),
            toks(&json)
        );
    }
    println!("(decode tok/s medians of {runs} runs each, alternating, after a warm-up; ratio = json / free, 1.0 = free of cost)");
    Ok(())
}

async fn measure(
    model: &Path,
    threads: usize,
    runs: usize,
    max_tokens: u32,
) -> anyhow::Result<(Vec<Sample>, Vec<Sample>)> {
    eprintln!("loading {} in switchyard's cpu engine …", model.display());
    let load = LoadConfig {
        threads: threads as u32,
        parallel_slots: 1,
        ..LoadConfig::default()
    };
    let m = super::engine_model(model, &load)?;
    // Warm-up: the grammar vocabulary is built on the first constrained request.
    once(&m, 1_000_000, 8, true).await?;
    once(&m, 1_000_001, 8, false).await?;
    let (mut free, mut json) = (Vec::new(), Vec::new());
    for run in 0..runs as u64 {
        free.push(once(&m, run, max_tokens, false).await?);
        let s = once(&m, run, max_tokens, true).await?;
        if s.generated < max_tokens {
            serde_json::from_str::<serde_json::Value>(&s.text)
                .map_err(|e| anyhow::anyhow!("a constrained answer is not JSON ({e}): {}", s.text))?;
        }
        json.push(s);
    }
    Ok((free, json))
}
