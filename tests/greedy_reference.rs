//! Greedy decoding against llama.cpp on the same GGUF: SmolLM2 (Llama, Q4_1) and
//! Gemma 3 270M (Q4_K_M: Q4_K, Q6_K, Q5_0, Q8_0).
//!
//! llama-server (temperature 0, its non-flash-attention path, `-fa off`, which our
//! attention follows) generates 32 tokens per prompt and reports the top-2
//! log-probabilities at each step. We then feed llama's own tokens through our engine
//! (teacher forcing), so every position is compared on the same context, and check:
//!
//! - our log-probability of llama's token is within [`MEAN_TOL`] of llama's on
//!   average and within [`MAX_TOL`] everywhere;
//! - where our argmax differs from llama's token, it is a near tie for both engines
//!   (top-2 gap under [`TIE`] nats).
//!
//! Why not "32 identical tokens, always": these small models meet near ties within a
//! few dozen tokens, and there llama.cpp disagrees with itself. Switching llama-server
//! between its two attention paths (`-fa on` / `-fa off`) changes the greedy output
//! of 6 of 8 Gemma prompts and 4 of 8 SmolLM2 prompts within 32 tokens, with a mean
//! log-probability difference of 0.035–0.039 nats; ours against `-fa off` measures
//! 0.034–0.035. Some prompts match llama.cpp exactly for all 32 tokens (SmolLM2: five
//! of eight; Gemma 3: two, since its Q4_K matrices compute one integer sum per
//! super-block instead of ggml's eight float lanes — before that, five); those are
//! asserted to stay exact (any change in the arithmetic that moves a decision shows
//! up there). The others first differ at a near tie.
//!
//! The reference is a llama-server built for AVX2: switchyard's engine computes ggml's
//! AVX2 arithmetic whichever kernel variant the CPU runs (AVX2, AVX-VNNI, AVX-512,
//! portable), so the exact prompts hold on every host. Where the CPU has more than
//! AVX2, the `native` tests also compare against a `-march=native` llama-server by the
//! tolerance rules alone: its AVX-512 attention and softmax sum in other orders, which
//! moves near ties (ggml does not promise the same tokens across ISAs).

mod common;

use candle_core::quantized::gguf_file;
use common::*;
use serde_json::json;
use std::path::Path;
use switchyard_workers::engine::model::llama::LlamaModel;

/// Tokens generated per prompt.
const STEPS: usize = 32;
/// Bound on the mean |Δ log p| of llama's token.
const MEAN_TOL: f32 = 0.06;
/// Bound on any single |Δ log p|.
const MAX_TOL: f32 = 1.0;
/// A top-2 gap below this (nats) is a near tie, where the engines may pick differently.
const TIE: f32 = 0.75;

const PLAIN: &[&str] = &[
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "Question: What is 12 times 7?\nAnswer:",
    "The three primary colors are",
    "import numpy as np\n\ndef softmax(x):",
    "In 1969, Neil Armstrong",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_greedy_matches_llama_server() {
    let Some(bin) = llama_server_bin() else { return };
    let chat = "<|im_start|>user\nWrite a haiku about the ocean.<|im_end|>\n<|im_start|>assistant\n";
    let exact = [PLAIN[0], PLAIN[3], PLAIN[4], PLAIN[5], chat];
    compare(&bin, &demo_model(), chat, Some(&exact)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_agrees_with_a_native_llama_server() {
    let Some(bin) = native_llama_server_bin() else { return };
    let chat = "<|im_start|>user\nWrite a haiku about the ocean.<|im_end|>\n<|im_start|>assistant\n";
    compare(&bin, &demo_model(), chat, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma3_agrees_with_a_native_llama_server() {
    let Some(bin) = native_llama_server_bin() else { return };
    let Some(model) = gemma_model() else { return };
    let chat = "<start_of_turn>user\nWrite a haiku about the ocean.<end_of_turn>\n<start_of_turn>model\n";
    compare(&bin, &model, chat, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma3_greedy_matches_llama_server() {
    let Some(bin) = llama_server_bin() else { return };
    let Some(model) = gemma_model() else { return };
    let chat = "<start_of_turn>user\nWrite a haiku about the ocean.<end_of_turn>\n<start_of_turn>model\n";
    let exact = [PLAIN[1], PLAIN[6]];
    compare(&bin, &model, chat, Some(&exact)).await;
}

/// One position of llama's greedy path.
struct Step {
    token: u32,
    logprob: f32,
    /// Top-1 minus top-2 log-probability.
    gap: f32,
}

/// Compares every prompt by the rules above; the prompts in `exact` (when given) must
/// also give all 32 tokens identical to llama's (they do today against the AVX2
/// reference; this guards the arithmetic).
async fn compare(bin: &Path, path: &Path, chat: &str, exact_prompts: Option<&[&str]>) {
    let server = LlamaServer::start_with(bin, path, 1, 1, &["-fa", "off"]).await.unwrap();
    let mut file = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let model = LlamaModel::load(&content, &mut file, 512).unwrap();
    let mut cache = model.new_cache();

    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let (mut exact, mut diffs, mut worst) = (0, Vec::new(), 0.0f32);
    let prompts: Vec<&str> = PLAIN.iter().copied().chain([chat]).collect();
    for prompt in &prompts {
        let tokens: Vec<u32> = serde_json::from_value(
            server
                .post(
                    "/tokenize",
                    json!({"content": prompt, "add_special": true, "parse_special": true}),
                )
                .await
                .unwrap()["tokens"]
                .clone(),
        )
        .unwrap();
        let reply = server
            .post(
                "/completion",
                json!({"prompt": tokens, "n_predict": STEPS, "temperature": 0.0, "n_probs": 2,
                       "cache_prompt": false, "return_tokens": true}),
            )
            .await
            .unwrap();
        let steps: Vec<Step> = reply["completion_probabilities"]
            .as_array()
            .expect("completion_probabilities")
            .iter()
            .map(|p| {
                let top = p["top_logprobs"].as_array().expect("top_logprobs");
                let lp = |i: usize| top[i]["logprob"].as_f64().unwrap() as f32;
                Step {
                    token: p["id"].as_u64().unwrap() as u32,
                    logprob: p["logprob"].as_f64().unwrap() as f32,
                    gap: lp(0) - lp(1),
                }
            })
            .collect();
        assert!(!steps.is_empty(), "llama-server generated nothing for {prompt:?}");

        // Teacher forcing: our distribution at each step, on llama's context.
        let mut logits = model.forward(&mut cache, &tokens, 0);
        let mut first_difference = None;
        for (i, step) in steps.iter().enumerate() {
            let lse = log_sum_exp(&logits);
            let ours = argmax(&logits);
            let delta = (logits[step.token as usize] - lse - step.logprob).abs();
            diffs.push(delta);
            worst = worst.max(delta);
            if ours != step.token {
                first_difference.get_or_insert(i);
                let our_margin = logits[ours as usize] - logits[step.token as usize];
                assert!(
                    step.gap < TIE && our_margin < TIE,
                    "{name}, {prompt:?}, step {i}: llama picks {} (gap {:.3}), we pick {ours} \
                     (by {our_margin:.3}) — not a near tie",
                    step.token,
                    step.gap
                );
            }
            logits = model.forward(&mut cache, &[step.token], tokens.len() + i);
        }
        match first_difference {
            None => exact += 1,
            Some(i) => {
                eprintln!("{name}: {prompt:?} first differs at step {i} (a near tie)");
                assert!(
                    !exact_prompts.is_some_and(|e| e.contains(prompt)),
                    "{name}: {prompt:?} used to match llama.cpp for all {STEPS} tokens and now differs at step {i}"
                );
            }
        }
    }
    let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
    eprintln!(
        "{name} vs {}: {exact}/{} prompts identical for {STEPS} greedy tokens; |Δ log p| mean {mean:.4}, max {worst:.4} \
         (kernels: {})",
        bin.display(),
        prompts.len(),
        switchyard_workers::engine::kernels::isa::active()
    );
    assert!(mean <= MEAN_TOL, "{name}: mean |Δ log p| {mean} > {MEAN_TOL}");
    assert!(worst <= MAX_TOL, "{name}: max |Δ log p| {worst} > {MAX_TOL}");
}

fn log_sum_exp(x: &[f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + x.iter().map(|v| (v - max).exp()).sum::<f32>().ln()
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}
