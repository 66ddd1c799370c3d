//! Qwen2 and Qwen3 against llama.cpp on random-weight GGUFs made by
//! scripts/make-random-qwen-gguf.py (no small Qwen GGUF ships on PyPI), with weights
//! stored as F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K and Q5_K: the same tokens from
//! Qwen's pre-tokenizer, and the same argmax at every prompt position (a near tie,
//! top-2 within 0.15 nats for both engines, may go either way).

use futures::StreamExt;
use serde_json::json;
use std::process::Command;
use switchyard_backend::{CancelFlag, GenerateEvent, Prompt};
use switchyard_engine::EngineModel;
use switchyard_messages::{GenerateConfig, LoadConfig};
use switchyard_testkit::*;

const TEXT: &str = "The quick brown fox jumps over 12 lazy dogs; Zürich's café opened in 1998!\n\tOK?";

/// Top-2 gap (nats) under which the engines may pick differently. On these random
/// models the log-probability of llama's token differs from ours by 0.001–0.002 nats
/// on average for F32/F16 weights and 0.025–0.03 (at most 0.11) for the quantized
/// types, where an upstream difference in the last bits can flip an activation's
/// 8-bit rounding.
const NEAR_TIE: f32 = 0.15;

async fn ours_logits(model: &EngineModel, prefix: &[u32]) -> Vec<f32> {
    use switchyard_backend::TextModel;
    let mut items = model.classify(vec![Prompt::Tokens(prefix.to_vec())], true).await;
    items.remove(0).unwrap().logits
}

async fn next_token(model: &EngineModel, prefix: &[u32]) -> Option<u32> {
    let cfg = GenerateConfig {
        max_tokens: 1,
        ..GenerateConfig::default()
    };
    let mut events = model.submit(Prompt::Tokens(prefix.to_vec()), cfg, CancelFlag::new(), None);
    let mut first = None;
    while let Some(ev) = events.next().await {
        if let GenerateEvent::Token(t) = ev.unwrap() {
            first = Some(t.id);
        }
    }
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_qwen2_and_qwen3_match_llama_server() {
    let Some(bin) = llama_server_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    // Each architecture, and each weight storage the engine has kernels for.
    for (arch, wtype) in [
        ("qwen2", "f32"),
        ("qwen3", "f32"),
        ("qwen2", "f16"),
        ("qwen3", "q8_0"),
        ("qwen2", "q4_0"),
        ("qwen3", "q4_1"),
        ("qwen2", "q5_0"),
        ("qwen3", "q5_1"),
        ("qwen3", "q4_k"),
        ("qwen2", "q5_k"),
    ] {
        let path = dir.path().join(format!("random-{arch}-{wtype}.gguf"));
        let out = Command::new(python())
            .arg(repo().join("scripts/make-random-qwen-gguf.py"))
            .arg(demo_model())
            .arg(&path)
            .arg(arch)
            .args(["1234", wtype])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let arch = format!("{arch}/{wtype}");
        let model = EngineModel::load(&path, &LoadConfig::default()).unwrap();
        let server = LlamaServer::start(&bin, &path, 1, 1).await.unwrap();

        let theirs = server
            .post("/tokenize", json!({"content": TEXT, "add_special": true}))
            .await
            .unwrap();
        let theirs: Vec<u32> = serde_json::from_value(theirs["tokens"].clone()).unwrap();
        let ids = model.tokenizer().encode(TEXT).unwrap();
        assert_eq!(ids, theirs, "{arch}: Qwen pre-tokenizer");

        for i in 1..=ids.len() {
            let prefix = &ids[..i];
            let answer = server
                .post(
                    "/completion",
                    json!({"prompt": prefix, "n_predict": 1, "temperature": 0.0, "cache_prompt": false,
                           "return_tokens": true, "n_probs": 2}),
                )
                .await
                .unwrap();
            let theirs = answer["tokens"][0].as_u64().unwrap() as u32;
            match next_token(&model, prefix).await {
                Some(ours) if ours != theirs => {
                    // Only a near tie may go either way (see greedy_reference.rs).
                    let top = &answer["completion_probabilities"][0]["top_logprobs"];
                    let their_gap = top[0]["logprob"].as_f64().unwrap() - top[1]["logprob"].as_f64().unwrap();
                    let logits = ours_logits(&model, prefix).await;
                    let our_gap = logits[ours as usize] - logits[theirs as usize];
                    eprintln!("{arch}: after {i} tokens llama picks {theirs} (gap {their_gap:.4}), we pick {ours} (by {our_gap:.4})");
                    assert!(
                        their_gap < NEAR_TIE as f64 && our_gap < NEAR_TIE,
                        "{arch}: argmax after {i} tokens: ours {ours}, llama.cpp {theirs} — not a near tie"
                    );
                }
                Some(_) => {}
                None => assert!(
                    model.tokenizer().eog_ids().contains(&theirs),
                    "{arch}: we ended the generation after {i} tokens, llama.cpp chose {theirs}"
                ),
            }
        }
    }
}

#[test]
fn an_unsupported_architecture_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mamba.gguf");
    let script = "import sys, numpy as np\nfrom gguf import GGUFWriter\nw = GGUFWriter(sys.argv[1], 'mamba')\n\
                  w.add_block_count(1)\nw.add_tensor('token_embd.weight', np.zeros((4, 32), dtype=np.float32))\n\
                  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()\n";
    let out = Command::new(python()).args(["-c", script]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = EngineModel::load(&path, &LoadConfig::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("\"mamba\"") && err.contains("llama, qwen2, qwen3, gemma3"),
        "{err}"
    );
    // A weight type without a kernel (BF16 in a GGUF) is refused, naming the tensor
    // and the type.
    let bf16 = dir.path().join("random-bf16.gguf");
    let out = Command::new(python())
        .arg(repo().join("scripts/make-random-qwen-gguf.py"))
        .arg(demo_model())
        .arg(&bf16)
        .args(["qwen2", "1234", "bf16"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = EngineModel::load(&bf16, &LoadConfig::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("token_embd.weight") && err.contains("BF16"), "{err}");

    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"not a gguf file at all").unwrap();
    let err = EngineModel::load(&garbage, &LoadConfig::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("GGUF"), "{err}");
}
