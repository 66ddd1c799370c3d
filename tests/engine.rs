//! The CPU engine's non-streaming calls on the real demo model: Classify
//! (prefill-only, optional logits, per-prompt errors) and BatchGenerate (each prompt
//! its own result or error).

mod common;

use common::*;
use futures::StreamExt;
use switchyard_messages::{CancelFlag, ErrorCode, GenerateConfig, GenerateEvent, LoadConfig, Prompt, TextModel};
use switchyard_workers::CandleModel;

async fn alone(model: &CandleModel, prompt: &str, n: u32) -> Vec<u32> {
    let cfg = GenerateConfig {
        max_tokens: n,
        ..GenerateConfig::default()
    };
    let mut events = model.generate(Prompt::Text(prompt.into()), cfg, CancelFlag::new());
    let mut ids = Vec::new();
    while let Some(ev) = events.next().await {
        if let GenerateEvent::Token(t) = ev.unwrap() {
            ids.push(t.id);
        }
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classify_and_batch_generate_report_per_prompt() {
    let model = CandleModel::load(&demo_model(), &LoadConfig::default()).unwrap();
    let prompts = vec![
        Prompt::Text("The capital of France is".into()),
        Prompt::Text(String::new()),
        Prompt::Text("def fibonacci(n):".into()),
        Prompt::Tokens(vec![1, 999_999]),
    ];

    let results = model.classify(prompts.clone(), true).await;
    assert_eq!(results.len(), 4);
    let first = results[0].as_ref().unwrap();
    assert_eq!(
        first.token.id,
        alone(&model, "The capital of France is", 1).await[0],
        "argmax = greedy's first token"
    );
    assert!(first.token.text.contains("Paris"), "{:?}", first.token);
    assert_eq!(first.logits.len(), model.info().vocab_size as usize);
    let best = first.logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    assert_eq!(first.logits[first.token.id as usize], best);
    assert_eq!(
        results[1].as_ref().unwrap_err().code(),
        ErrorCode::BadRequest,
        "empty prompt fails alone"
    );
    assert!(results[2].is_ok());
    assert_eq!(
        results[3].as_ref().unwrap_err().code(),
        ErrorCode::BadRequest,
        "token id outside the vocabulary"
    );
    let without = model.classify(prompts[..1].to_vec(), false).await;
    assert!(without[0].as_ref().unwrap().logits.is_empty(), "logits only when asked");

    let cfg = GenerateConfig {
        max_tokens: 6,
        ..GenerateConfig::default()
    };
    let batch = model
        .batch_generate(prompts[..3].to_vec(), cfg, CancelFlag::new())
        .await;
    assert_eq!(batch.len(), 3);
    let ids = |i: usize| batch[i].tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(0), alone(&model, "The capital of France is", 6).await);
    assert_eq!(batch[1].error.as_ref().unwrap().code, ErrorCode::BadRequest);
    assert!(batch[1].tokens.is_empty());
    assert_eq!(ids(2), alone(&model, "def fibonacci(n):", 6).await);
    assert!(batch[0].error.is_none() && batch[2].error.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attention_inspector_returns_post_rope_keys_of_every_layer() {
    let model = CandleModel::load(&demo_model(), &LoadConfig::default()).unwrap();
    let prompt = "The capital of France is";
    let n = model.tokenizer().encode(prompt).unwrap().len();
    let snap = model.inspect_attention(Prompt::Text(prompt.into())).await.unwrap();
    let info = model.info();
    assert_eq!(snap.architecture, "llama");
    assert_eq!(snap.num_layers, info.num_layers);
    assert_eq!(
        (snap.num_heads, snap.head_dim, snap.seq_len as usize),
        (3, 64, n),
        "SmolLM2: 3 KV heads of 64"
    );
    assert_eq!(snap.keys.len(), info.num_layers as usize);
    for layer in &snap.keys {
        assert_eq!(layer.len(), 3);
        for head in layer {
            assert_eq!(head.len(), n * 64);
            assert!(head.iter().all(|v| v.is_finite()));
            assert_ne!(head[..64], head[64..128], "positions differ");
        }
    }
    // Causality: position 0's keys depend on token 0 only, in every layer.
    let first = model.inspect_attention(Prompt::Text("The".into())).await.unwrap();
    assert_eq!(first.seq_len, 1);
    for (a, b) in first.keys.iter().zip(&snap.keys) {
        for (ha, hb) in a.iter().zip(b) {
            assert_eq!(ha[..], hb[..64]);
        }
    }
    let err = model.inspect_attention(Prompt::Text(String::new())).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::BadRequest);
}
