//! `switchyard bench agree`: does the native CUDA engine compute what the CPU engine
//! computes? The CPU engine's greedy tokens for each reference prompt are fed through
//! the candle pass on the GPU (teacher forcing) and the log-probabilities compared at
//! the tolerances the llama.cpp reference tests use (engine/tests/engine/greedy_reference.rs):
//! mean |Δ log p| ≤ 0.06, max ≤ 1.0, a different argmax only at a near tie (top-2
//! gap < 0.75 nats in both); and the mean-pooled hidden states (embeddings), a
//! cosine above 0.995. Without `--cuda` the candle pass runs on candle's CPU device
//! (the same code but the device). tests/cuda_native.rs asserts the same report.

use candle_core::quantized::gguf_file;
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use switchyard_workers::engine::candle::{CandleForward, Placement};
use switchyard_workers::engine::model::forward::{CpuForward, Forward, SeqStep};
use switchyard_workers::engine::model::llama::LlamaModel;
use switchyard_workers::engine::model::lora::LoraAdapter;
use switchyard_workers::engine::text::tokenizer::GgufTokenizer;

/// Mean |Δ log p| allowed (greedy_reference.rs's tolerance).
pub const MEAN_TOL: f32 = 0.06;
/// Largest |Δ log p| allowed.
pub const MAX_TOL: f32 = 1.0;
/// A different argmax is allowed where both top-2 gaps are below this (nats).
pub const TIE: f32 = 0.75;
/// Lowest cosine between the two passes' mean-pooled hidden states.
pub const COSINE: f64 = 0.995;

/// The reference prompts (text and code); a chat prompt in the model's template is
/// added by the caller.
pub const PROMPTS: &[&str] = switchyard_workers::engine::REFERENCE_PROMPTS;

/// `switchyard bench agree`.
#[derive(Args, Debug)]
pub struct BenchAgreeArgs {
    /// GGUF model (default: the demo model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// NVIDIA GPU N (a `cuda` build); without it the candle pass runs on candle's CPU
    /// device.
    #[arg(long)]
    pub cuda: Option<usize>,
    /// What the candle pass is compared with: `cpu-engine` (switchyard's own CPU
    /// pass, which the reference tests check against llama.cpp) or `candle-cpu` (the
    /// same candle code on the CPU: the GPU's kernels alone, for random-weight models,
    /// whose depth amplifies the two engines' different activation rounding).
    #[arg(long, default_value = "cpu-engine", value_parser = ["cpu-engine", "candle-cpu"])]
    pub reference: String,
    /// A GGUF LoRA adapter both passes run with (scale 1).
    #[arg(long)]
    pub lora: Option<PathBuf>,
    /// Greedy tokens compared per prompt.
    #[arg(long, default_value_t = 32)]
    pub steps: usize,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// What [`agreement`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct Agreement {
    /// The model file's name (and " with a LoRA adapter").
    pub model: String,
    /// Where the candle pass ran (`candle-cuda:0`, `candle-cpu`).
    pub device: String,
    /// What it was compared with (`cpu-engine`, `candle-cpu`).
    pub reference: String,
    /// Prompts compared, and those whose greedy tokens were identical throughout.
    pub prompts: usize,
    pub identical: usize,
    /// Greedy tokens per prompt.
    pub steps: usize,
    /// |Δ log p| of the CPU engine's pick, mean and largest over every step.
    pub mean_delta: f32,
    pub max_delta: f32,
    /// Steps where the passes picked different tokens that were not a near tie.
    pub not_near_ties: Vec<String>,
    /// Lowest cosine between the passes' mean-pooled hidden states over the prompts.
    pub lowest_cosine: f64,
}

impl Agreement {
    /// Within every tolerance.
    pub fn passes(&self) -> bool {
        self.failures().is_empty()
    }

    /// Each tolerance missed, in words.
    pub fn failures(&self) -> Vec<String> {
        let mut out = self.not_near_ties.clone();
        if self.mean_delta.is_nan() || self.mean_delta > MEAN_TOL {
            out.push(format!("mean |Δ log p| {} > {MEAN_TOL}", self.mean_delta));
        }
        if self.max_delta.is_nan() || self.max_delta > MAX_TOL {
            out.push(format!("max |Δ log p| {} > {MAX_TOL}", self.max_delta));
        }
        if self.lowest_cosine.is_nan() || self.lowest_cosine <= COSINE {
            out.push(format!(
                "pooled hidden states: cosine {} <= {COSINE}",
                self.lowest_cosine
            ));
        }
        out
    }
}

fn log_sum_exp(x: &[f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + x.iter().map(|v| (v - max).exp()).sum::<f32>().ln()
}

pub fn argmax(x: &[f32]) -> u32 {
    (0..x.len()).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap_or(0) as u32
}

/// Top-1 minus top-2 logit.
pub fn gap(x: &[f32]) -> f32 {
    let best = argmax(x) as usize;
    let second = (0..x.len())
        .filter(|&i| i != best)
        .map(|i| x[i])
        .fold(f32::NEG_INFINITY, f32::max);
    x[best] - second
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn one(f: &mut dyn Forward, tokens: &[u32], pos: usize) -> anyhow::Result<Vec<f32>> {
    f.forward_batch(&[SeqStep::new(0, tokens, pos)])?
        .pop()
        .ok_or_else(|| anyhow::anyhow!("the pass returned no logits"))
}

/// The CPU engine and the candle pass on `placement`, on the same GGUF.
pub fn load_both(
    path: &Path,
    ctx: usize,
    slots: usize,
    placement: Placement,
) -> anyhow::Result<(CpuForward, CandleForward, GgufTokenizer)> {
    let mut file = std::fs::File::open(path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let own = CpuForward::new(LlamaModel::load(&content, &mut file, ctx)?, 1);
    let candle = CandleForward::load(&content, &mut file, ctx, slots, placement, -1).map_err(anyhow::Error::msg)?;
    Ok((own, candle, GgufTokenizer::from_gguf(&content)?))
}

/// Compares the two passes over [`PROMPTS`] and `chat`, `steps` greedy tokens each,
/// slot 0 running the GGUF LoRA `adapter` in both when given.
pub fn agreement(
    path: &Path,
    placement: Placement,
    chat: &str,
    adapter: Option<&Path>,
    steps: usize,
) -> anyhow::Result<Agreement> {
    agreement_with(path, placement, false, chat, adapter, steps)
}

/// [`agreement`], against the candle pass on the CPU instead of the CPU engine when
/// `candle_reference`.
pub fn agreement_with(
    path: &Path,
    placement: Placement,
    candle_reference: bool,
    chat: &str,
    adapter: Option<&Path>,
    steps: usize,
) -> anyhow::Result<Agreement> {
    let mut file = std::fs::File::open(path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let tok = GgufTokenizer::from_gguf(&content)?;
    let mut candle = CandleForward::load(&content, &mut file, 512, 1, placement, -1).map_err(anyhow::Error::msg)?;
    let params = candle.params().clone();
    let mut own: Box<dyn Forward> = match candle_reference {
        false => Box::new(CpuForward::new(LlamaModel::load(&content, &mut file, 512)?, 1)),
        true => {
            Box::new(CandleForward::load(&content, &mut file, 512, 1, Placement::Cpu, -1).map_err(anyhow::Error::msg)?)
        }
    };
    let own = own.as_mut();
    let mut name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    if let Some(file) = adapter {
        let lora = Arc::new(LoraAdapter::load("one", file, &params, 1.0).map_err(anyhow::Error::msg)?);
        anyhow::ensure!(
            own.set_adapter(0, Some(lora.clone())) && candle.set_adapter(0, Some(lora)),
            "the adapter does not fit the model"
        );
        name.push_str(" with a LoRA adapter");
    }
    let prompts: Vec<&str> = PROMPTS.iter().copied().chain([chat]).collect();
    let (mut identical, mut diffs, mut worst, mut ties) = (0, Vec::new(), 0.0f32, Vec::new());
    for prompt in &prompts {
        let tokens = tok.encode(prompt).map_err(anyhow::Error::msg)?;
        let mut ours = one(own, &tokens, 0)?;
        let mut theirs = one(&mut candle, &tokens, 0)?;
        let mut differs = false;
        for i in 0..steps {
            let next = argmax(&ours);
            let lp = |x: &[f32]| x[next as usize] - log_sum_exp(x);
            let delta = (lp(&ours) - lp(&theirs)).abs();
            diffs.push(delta);
            worst = worst.max(delta);
            let pick = argmax(&theirs);
            if pick != next {
                differs = true;
                let margin = theirs[pick as usize] - theirs[next as usize];
                if gap(&ours) >= TIE || margin >= TIE {
                    ties.push(format!(
                        "{prompt:?}, step {i}: the CPU engine picks {next} (gap {:.3}), candle picks {pick} (by \
                         {margin:.3}): not a near tie",
                        gap(&ours)
                    ));
                }
            }
            let pos = tokens.len() + i;
            ours = one(own, &[next], pos)?;
            theirs = one(&mut candle, &[next], pos)?;
        }
        identical += usize::from(!differs);
    }
    // Hidden states (embeddings): every position's, after the output norm, mean-pooled.
    let mut lowest = 1.0f64;
    for prompt in &prompts {
        let tokens = tok.encode(prompt).map_err(anyhow::Error::msg)?;
        let all = SeqStep {
            outputs: tokens.len(),
            ..SeqStep::new(0, &tokens, 0)
        };
        let pooled = |f: &mut dyn Forward| -> anyhow::Result<Vec<f32>> {
            let rows = f.hidden_batch(std::slice::from_ref(&all))?;
            anyhow::ensure!(
                rows.len() == tokens.len(),
                "{} hidden rows for {} tokens",
                rows.len(),
                tokens.len()
            );
            Ok((0..rows[0].len())
                .map(|c| rows.iter().map(|r| r[c]).sum::<f32>() / rows.len() as f32)
                .collect())
        };
        let (a, b) = (pooled(own)?, pooled(&mut candle)?);
        lowest = lowest.min(cosine(&a, &b));
    }
    Ok(Agreement {
        model: name,
        device: placement.label(),
        reference: if candle_reference { "candle-cpu" } else { "cpu-engine" }.into(),
        prompts: prompts.len(),
        identical,
        steps,
        mean_delta: diffs.iter().sum::<f32>() / diffs.len().max(1) as f32,
        max_delta: worst,
        not_near_ties: ties,
        lowest_cosine: lowest,
    })
}

/// The chat prompt for a model: its own template's turn markers where they are
/// known (ChatML, Gemma), else plain text.
pub fn chat_prompt(path: &Path) -> String {
    let name = path.file_name().unwrap_or_default().to_string_lossy().to_lowercase();
    if name.contains("gemma") {
        "<start_of_turn>user\nWrite a haiku about the ocean.<end_of_turn>\n<start_of_turn>model\n".into()
    } else {
        "<|im_start|>user\nWrite a haiku about the ocean.<|im_end|>\n<|im_start|>assistant\n".into()
    }
}

/// Runs `switchyard bench agree` and prints the report; `Ok(false)` when a tolerance
/// is missed.
pub fn run(args: &BenchAgreeArgs, model: &Path) -> anyhow::Result<bool> {
    let placement = args.cuda.map_or(Placement::Cpu, Placement::Cuda);
    eprintln!(
        "comparing {} on {} with {} ({} prompts, {} greedy tokens each) …",
        model.display(),
        placement.label(),
        args.reference,
        PROMPTS.len() + 1,
        args.steps
    );
    let started = std::time::Instant::now();
    let candle_reference = args.reference == "candle-cpu";
    let a = agreement_with(
        model,
        placement,
        candle_reference,
        &chat_prompt(model),
        args.lora.as_deref(),
        args.steps,
    )?;
    println!(
        "{} on {} vs {}: {}/{} prompts identical for {} greedy tokens; |Δ log p| mean {:.4} (≤ {MEAN_TOL}), max {:.4} \
         (≤ {MAX_TOL}); pooled hidden states, lowest cosine {:.5} (> {COSINE}); {:.1} s",
        a.model,
        a.device,
        a.reference,
        a.identical,
        a.prompts,
        a.steps,
        a.mean_delta,
        a.max_delta,
        a.lowest_cosine,
        started.elapsed().as_secs_f64()
    );
    let failures = a.failures();
    for f in &failures {
        println!("  MISSED: {f}");
    }
    if let Some(path) = &args.json {
        let mut v = serde_json::to_value(&a)?;
        v["passes"] = failures.is_empty().into();
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(failures.is_empty())
}
