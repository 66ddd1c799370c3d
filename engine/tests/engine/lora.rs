//! LoRA adapters on the CPU engine's forward pass, against llama.cpp: two test
//! adapters for the demo model (`scripts/make-lora.py`: fixed random A and B, PEFT and
//! GGUF), llama-server `--lora` on the same GGUF as the reference.
//!
//! - PEFT and GGUF forms of one adapter give the same logits (Q and K reordered for
//!   llama.cpp's RoPE on load); scale 0 gives the base model's exactly.
//! - Teacher-forced greedy decoding against llama-server with the same adapter: the
//!   rules of `greedy_reference.rs` (mean and max |Δ log p|, differences only at near
//!   ties); the adapter changes the output.
//! - One batch holding base, adapter-1 and adapter-2 rows gives each what it gets alone.
//! - Bad adapters are clear errors naming what is wrong.

use candle_core::quantized::gguf_file;
use serde_json::json;
use std::path::Path;
use switchyard_engine::model::llama::{LlamaModel, LlamaParams, Step};
use switchyard_engine::model::lora::LoraAdapter;
use switchyard_testkit::*;

const STEPS: usize = 24;
const MEAN_TOL: f32 = 0.06;
const MAX_TOL: f32 = 1.0;
const TIE: f32 = 0.75;

fn demo() -> LlamaModel {
    let path = demo_model();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    LlamaModel::load(&content, &mut file, 512).unwrap()
}

/// Logits of the last of `tokens`, run from position 0 with `lora`.
fn logits(model: &LlamaModel, tokens: &[u32], lora: Option<&LoraAdapter>) -> Vec<f32> {
    let mut cache = model.new_cache();
    let mut steps = [Step {
        cache: &mut cache,
        tokens,
        pos: 0,
        outputs: 1,
        lora,
    }];
    model.forward_batch(&mut steps).pop().unwrap()
}

fn argmax(x: &[f32]) -> u32 {
    (0..x.len()).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap() as u32
}

fn log_sum_exp(x: &[f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + x.iter().map(|v| (v - max).exp()).sum::<f32>().ln()
}

/// Greedy tokens from `prompt` with `lora`.
fn greedy(model: &LlamaModel, prompt: &[u32], lora: Option<&LoraAdapter>, n: usize) -> Vec<u32> {
    let mut cache = model.new_cache();
    let mut out = Vec::new();
    let (mut tokens, mut pos) = (prompt.to_vec(), 0);
    for _ in 0..n {
        let mut steps = [Step {
            cache: &mut cache,
            tokens: &tokens,
            pos,
            outputs: 1,
            lora,
        }];
        let next = argmax(&model.forward_batch(&mut steps).pop().unwrap());
        pos += tokens.len();
        out.push(next);
        tokens = vec![next];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_match_llama_server_and_share_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (make_lora(dir.path(), 1), make_lora(dir.path(), 2));
    let model = demo();
    let p = &model.params;
    let a1 = LoraAdapter::load("one", &one.join("adapter.gguf"), p, 1.0).unwrap();
    let a1_peft = LoraAdapter::load("one", &one, p, 1.0).unwrap();
    let a2 = LoraAdapter::load("two", &two.join("adapter.gguf"), p, 1.0).unwrap();
    let off = LoraAdapter::load("off", &one.join("adapter.gguf"), p, 0.0).unwrap();

    let Some(bin) = llama_server_bin() else { return };
    let gguf = |d: &Path| d.join("adapter.gguf").display().to_string();
    let (g1, g2) = (gguf(&one), gguf(&two));
    let server = LlamaServer::start_with(&bin, &demo_model(), 1, 1, &["-fa", "off", "--lora", &g1, "--lora", &g2])
        .await
        .unwrap();
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village,",
    ];
    let mut diffs = Vec::new();
    let mut changed = 0;
    for prompt in prompts {
        let tokens: Vec<u32> = serde_json::from_value(
            server
                .post("/tokenize", json!({"content": prompt, "add_special": true}))
                .await
                .unwrap()["tokens"]
                .clone(),
        )
        .unwrap();

        // The two formats, scale 0, and a batch.
        let base = logits(&model, &tokens, None);
        assert_eq!(
            logits(&model, &tokens, Some(&a1)),
            logits(&model, &tokens, Some(&a1_peft)),
            "PEFT = GGUF"
        );
        assert_eq!(logits(&model, &tokens, Some(&off)), base, "scale 0 is the base model");
        let alone = [
            base.clone(),
            logits(&model, &tokens, Some(&a1)),
            logits(&model, &tokens, Some(&a2)),
        ];
        let mut caches: Vec<_> = (0..3).map(|_| model.new_cache()).collect();
        let loras = [None, Some(&a1), Some(&a2)];
        let mut steps: Vec<Step<'_>> = caches
            .iter_mut()
            .zip(loras)
            .map(|(cache, lora)| Step {
                cache,
                tokens: &tokens,
                pos: 0,
                outputs: 1,
                lora,
            })
            .collect();
        assert_eq!(
            model.forward_batch(&mut steps),
            alone,
            "{prompt:?}: one batch, each as alone"
        );
        if greedy(&model, &tokens, Some(&a1), 12) != greedy(&model, &tokens, None, 12) {
            changed += 1;
        }

        // llama-server with adapter 1 (adapter 2 loaded at scale 0), teacher-forced.
        let reply = server
            .post(
                "/completion",
                json!({"prompt": tokens, "n_predict": STEPS, "temperature": 0.0, "n_probs": 2,
                       "cache_prompt": false, "lora": [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]}),
            )
            .await
            .unwrap();
        let mut cache = model.new_cache();
        let mut steps = [Step {
            cache: &mut cache,
            tokens: &tokens,
            pos: 0,
            outputs: 1,
            lora: Some(&a1),
        }];
        let mut ours = model.forward_batch(&mut steps).pop().unwrap();
        let probs = reply["completion_probabilities"]
            .as_array()
            .expect("completion_probabilities");
        for (i, p) in probs.iter().enumerate() {
            let token = p["id"].as_u64().unwrap() as u32;
            let top = p["top_logprobs"].as_array().unwrap();
            let gap = (top[0]["logprob"].as_f64().unwrap() - top[1]["logprob"].as_f64().unwrap()) as f32;
            let delta = (ours[token as usize] - log_sum_exp(&ours) - p["logprob"].as_f64().unwrap() as f32).abs();
            diffs.push(delta);
            let pick = argmax(&ours);
            if pick != token {
                let margin = ours[pick as usize] - ours[token as usize];
                assert!(
                    gap < TIE && margin < TIE,
                    "{prompt:?} step {i}: llama-server picks {token} (gap {gap:.3}), we pick {pick} (by {margin:.3})"
                );
            }
            let mut steps = [Step {
                cache: &mut cache,
                tokens: &[token],
                pos: tokens.len() + i,
                outputs: 1,
                lora: Some(&a1),
            }];
            ours = model.forward_batch(&mut steps).pop().unwrap();
        }
    }
    let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
    let worst = diffs.iter().copied().fold(0.0, f32::max);
    eprintln!("lora vs llama-server --lora: |Δ log p| mean {mean:.4}, max {worst:.4}; adapter changed {changed}/3 greedy outputs");
    assert!(mean <= MEAN_TOL && worst <= MAX_TOL, "mean {mean}, max {worst}");
    assert!(changed == 3, "the adapter changes the output ({changed}/3 prompts)");
}

#[test]
fn bad_adapters_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let one = make_lora(dir.path(), 1);
    let model = demo();
    let err = LoraAdapter::load("x", &dir.path().join("missing.gguf"), &model.params, 1.0).unwrap_err();
    assert!(err.contains("missing.gguf"), "{err}");
    let err = LoraAdapter::load("x", &dir.path().join("nothing"), &model.params, 1.0).unwrap_err();
    assert!(err.contains("nothing"), "{err}");
    // The model file itself is a GGUF but not an adapter.
    let err = LoraAdapter::load("x", &demo_model(), &model.params, 1.0).unwrap_err();
    assert!(err.contains("not a LoRA adapter"), "{err}");
    // Another model: Gemma 3's shapes and architecture.
    let Some(gemma) = gemma_model() else { return };
    let content = gguf_file::Content::read(&mut std::fs::File::open(&gemma).unwrap()).unwrap();
    let gemma_params = LlamaParams::from_gguf(&content).unwrap();
    let err = LoraAdapter::load("x", &one.join("adapter.gguf"), &gemma_params, 1.0).unwrap_err();
    assert!(err.contains("adapter for llama, the model is gemma3"), "{err}");
    let err = LoraAdapter::load("x", &one, &gemma_params, 1.0).unwrap_err();
    assert!(err.contains("another model"), "{err}");
}
