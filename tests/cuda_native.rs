//! The `cuda` backend's native engine: switchyard's engine with the candle forward
//! pass ([`CandleForward`]). Without an NVIDIA GPU (as here) the pass runs on
//! candle's CPU device: the same code but the device. In a `cuda` build on a machine
//! with a GPU it runs on GPU 0 (`SWITCHYARD_TEST_CUDA=0` keeps it on the CPU).
//!
//! - Agreement with the CPU engine (the engine tests/greedy_reference.rs checks
//!   against llama.cpp): the CPU engine's 32 greedy tokens per reference prompt are
//!   fed through the candle pass (teacher forcing) and compared at that test's
//!   tolerances: mean |Δ log p| ≤ 0.06, max ≤ 1.0, a different argmax only at a
//!   near tie (top-2 gap < 0.75 nats for both).
//! - The pass over several sequences gives each the logits it gets alone; a step
//!   below what a slot holds overwrites the rest (prefix reuse); a prefix copied to
//!   another slot, and rows read out and written back, continue like the original.
//! - The worker (tests/cuda_workers.rs has the supervised llama-server engine):
//!   `worker.cuda_engine = "native"` with `gpu_allow_cpu` announces backend `cuda`,
//!   device `cuda:1(cpu)` and its KV slots as capacity, streams chat with stop
//!   strings, cancels, reuses prefixes and reports metrics; without a GPU and
//!   without `gpu_allow_cpu` it refuses with `unavailable` naming the reason, and
//!   the fleet routes elsewhere.

mod common;

use candle_core::quantized::gguf_file;
use common::*;
use std::path::Path;
use switchyard_workers::backends::llama_server::GpuVendor;
use switchyard_workers::engine::candle::{device, CandleForward, Placement};
use switchyard_workers::engine::model::forward::{CpuForward, Forward, SeqStep};
use switchyard_workers::engine::model::llama::LlamaModel;
use switchyard_workers::engine::text::tokenizer::GgufTokenizer;

/// Tokens generated per prompt.
const STEPS: usize = 32;
/// greedy_reference.rs's tolerances.
const MEAN_TOL: f32 = 0.06;
const MAX_TOL: f32 = 1.0;
const TIE: f32 = 0.75;

const PROMPTS: &[&str] = &[
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "Question: What is 12 times 7?\nAnswer:",
    "The three primary colors are",
    "import numpy as np\n\ndef softmax(x):",
    "In 1969, Neil Armstrong",
];

/// GPU 0 in a `cuda` build on a machine with one (unless `SWITCHYARD_TEST_CUDA=0`),
/// else candle's CPU device.
fn placement() -> Placement {
    let off = std::env::var("SWITCHYARD_TEST_CUDA").is_ok_and(|v| v == "0");
    if device::cuda_built() && GpuVendor::Cuda.gpus().is_ok() && !off {
        Placement::Cuda(0)
    } else {
        Placement::Cpu
    }
}

fn load_both(path: &Path, ctx: usize, slots: usize) -> (CpuForward, CandleForward, GgufTokenizer) {
    let mut file = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let own = CpuForward::new(LlamaModel::load(&content, &mut file, ctx).unwrap(), 1);
    let candle = CandleForward::load(&content, &mut file, ctx, slots, placement(), -1).unwrap();
    (own, candle, GgufTokenizer::from_gguf(&content).unwrap())
}

fn step(seq: usize, tokens: &[u32], pos: usize) -> SeqStep<'_> {
    SeqStep { seq, tokens, pos }
}

fn one(f: &mut dyn Forward, seq: usize, tokens: &[u32], pos: usize) -> Vec<f32> {
    f.forward_batch(&[step(seq, tokens, pos)]).unwrap().pop().unwrap()
}

fn log_sum_exp(x: &[f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + x.iter().map(|v| (v - max).exp()).sum::<f32>().ln()
}

fn argmax(x: &[f32]) -> u32 {
    (0..x.len()).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap() as u32
}

/// Top-1 minus top-2 logit.
fn gap(x: &[f32]) -> f32 {
    let best = argmax(x) as usize;
    let second = (0..x.len())
        .filter(|&i| i != best)
        .map(|i| x[i])
        .fold(f32::NEG_INFINITY, f32::max);
    x[best] - second
}

fn agreement(path: &Path, chat: &str) {
    let (mut own, mut candle, tok) = load_both(path, 512, 1);
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let (mut exact, mut diffs, mut worst) = (0, Vec::new(), 0.0f32);
    let prompts: Vec<&str> = PROMPTS.iter().copied().chain([chat]).collect();
    for prompt in &prompts {
        let tokens = tok.encode(prompt).unwrap();
        let mut ours = one(&mut own, 0, &tokens, 0);
        let mut theirs = one(&mut candle, 0, &tokens, 0);
        let mut first_difference = None;
        for i in 0..STEPS {
            let next = argmax(&ours);
            let delta =
                ((ours[next as usize] - log_sum_exp(&ours)) - (theirs[next as usize] - log_sum_exp(&theirs))).abs();
            diffs.push(delta);
            worst = worst.max(delta);
            let pick = argmax(&theirs);
            if pick != next {
                first_difference.get_or_insert(i);
                let margin = theirs[pick as usize] - theirs[next as usize];
                assert!(
                    gap(&ours) < TIE && margin < TIE,
                    "{name}, {prompt:?}, step {i}: the CPU engine picks {next} (gap {:.3}), candle picks {pick} \
                     (by {margin:.3}): not a near tie",
                    gap(&ours)
                );
            }
            let pos = tokens.len() + i;
            ours = one(&mut own, 0, &[next], pos);
            theirs = one(&mut candle, 0, &[next], pos);
        }
        match first_difference {
            None => exact += 1,
            Some(i) => eprintln!("{name}: {prompt:?} first differs at step {i} (a near tie)"),
        }
    }
    let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
    eprintln!(
        "{name}, candle on {:?} vs the CPU engine: {exact}/{} prompts identical for {STEPS} greedy tokens; \
         |Δ log p| mean {mean:.4}, max {worst:.4}",
        placement(),
        prompts.len()
    );
    assert!(mean <= MEAN_TOL, "{name}: mean |Δ log p| {mean} > {MEAN_TOL}");
    assert!(worst <= MAX_TOL, "{name}: max |Δ log p| {worst} > {MAX_TOL}");
}

#[test]
fn smollm2_on_candle_agrees_with_the_cpu_engine() {
    let chat = "<|im_start|>user\nWrite a haiku about the ocean.<|im_end|>\n<|im_start|>assistant\n";
    agreement(&demo_model(), chat);
}

#[test]
fn gemma3_on_candle_agrees_with_the_cpu_engine() {
    let Some(model) = gemma_model() else { return };
    let chat = "<start_of_turn>user\nWrite a haiku about the ocean.<end_of_turn>\n<start_of_turn>model\n";
    agreement(&model, chat);
}

/// Largest |a - b| over two logit vectors.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn batched_sequences_prefix_reuse_and_copied_rows_continue_like_the_original() {
    let (_, mut candle, tok) = load_both(&demo_model(), 512, 3);
    let a = tok
        .encode("The capital of France is Paris, and the capital of Italy is")
        .unwrap();
    let b = tok.encode("def fibonacci(n):").unwrap();
    // Alone, in slot 0, then the next token.
    let alone_a = one(&mut candle, 0, &a, 0);
    let next_a = one(&mut candle, 0, &[argmax(&alone_a)], a.len());
    let alone_b = one(&mut candle, 1, &b, 0);

    // Together in one pass (slots 2 and 1): each gets what it got alone.
    let both = candle.forward_batch(&[step(2, &a, 0), step(1, &b, 0)]).unwrap();
    let tol = 1e-3 * alone_a.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    assert!(
        max_diff(&both[0], &alone_a) <= tol,
        "batched a: {}",
        max_diff(&both[0], &alone_a)
    );
    assert!(
        max_diff(&both[1], &alone_b) <= tol,
        "batched b: {}",
        max_diff(&both[1], &alone_b)
    );

    // Slot 1 now holds b; writing a at position 0 overwrites it entirely.
    let reused = one(&mut candle, 1, &a, 0);
    assert!(max_diff(&reused, &alone_a) <= tol);
    // Prefix reuse: keep a[..4] in slot 1, recompute from there.
    let tail = one(&mut candle, 1, &a[4..], 4);
    assert!(
        max_diff(&tail, &alone_a) <= tol,
        "prefix reuse: {}",
        max_diff(&tail, &alone_a)
    );

    // A copied prefix, and rows read out and written back, continue like slot 0.
    assert!(candle.copy_prefix(0, 2, a.len()));
    let copied = one(&mut candle, 2, &[argmax(&alone_a)], a.len());
    assert!(
        max_diff(&copied, &next_a) <= tol,
        "copy_prefix: {}",
        max_diff(&copied, &next_a)
    );
    let (k, v) = candle.read_rows(0, 0, a.len()).expect("rows");
    assert_eq!(k.len(), a.len() * candle.kv_bytes_per_token() / 4);
    one(&mut candle, 2, &b, 0);
    assert!(candle.write_rows(2, 0, a.len(), &k, &v));
    let written = one(&mut candle, 2, &[argmax(&alone_a)], a.len());
    assert!(
        max_diff(&written, &next_a) <= tol,
        "write_rows: {}",
        max_diff(&written, &next_a)
    );

    // Beyond the context: an error, not a panic.
    let long = vec![1u32; 600];
    assert!(candle.forward_batch(&[step(0, &long, 0)]).is_err());
    assert!(candle.forward_batch(&[step(0, &a, 0), step(0, &b, 0)]).is_err());
}
