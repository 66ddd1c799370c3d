//! The contract through the `metal` backend (MLX's CPU build here, a real bridge
//! child) against switchyard's CPU engine on the same F32 weights (the demo model
//! converted by scripts/gguf-to-hf.py), call by call: greedy and chat tokens, stop
//! strings and tokens, seeded sampling, classify with logits, batch with a failing
//! prompt, cancel, context overflow, prefix reuse, a session round trip and the
//! attention inspector.

mod common;

use common::*;
use futures::StreamExt;
use std::sync::Arc;
use switchyard_backend::{BackendError, CancelFlag, GenerateEvent, ModelSession, Prompt, TextModel};
use switchyard_messages::{FinishReason, GenerateConfig, GenerateMetrics, LoadConfig, Message};

async fn mlx_model() -> Arc<dyn TextModel> {
    let mut config = fleet_config("nats://127.0.0.1:1");
    config.worker.model = converted_demo_model().display().to_string();
    config.worker.backend = "metal".into();
    config.worker.mlx_allow_cpu = true;
    config.worker.mlx_python = python().display().to_string();
    let loaded = switchyard::node::load(&config)
        .await
        .expect("the MLX bridge starts and loads");
    loaded.model.clone()
}

fn cpu_model() -> Arc<dyn TextModel> {
    let load = LoadConfig {
        context_len: 2048,
        threads: 1,
        ..LoadConfig::default()
    };
    let own = switchyard_workers::engine::ForwardPass::Own;
    switchyard_workers::engine::load_model(&converted_demo_model(), &load, own)
        .expect("the HF directory loads on the CPU engine")
}

struct Run {
    ids: Vec<u32>,
    text: String,
    finish: Option<FinishReason>,
    metrics: GenerateMetrics,
    error: Option<BackendError>,
}

async fn drain(mut s: switchyard_backend::GenerateStream) -> Run {
    let mut run = Run {
        ids: Vec::new(),
        text: String::new(),
        finish: None,
        metrics: GenerateMetrics::default(),
        error: None,
    };
    while let Some(ev) = s.next().await {
        match ev {
            Ok(GenerateEvent::Token(t)) => {
                run.ids.push(t.id);
                run.text.push_str(&t.text);
            }
            Ok(GenerateEvent::Done { finish_reason, metrics }) => {
                run.finish = Some(finish_reason);
                run.metrics = metrics;
            }
            Err(e) => run.error = Some(e),
        }
    }
    run
}

async fn gen(m: &Arc<dyn TextModel>, prompt: Prompt, config: GenerateConfig) -> Run {
    drain(m.generate(prompt, config, CancelFlag::default())).await
}

fn greedy(max_tokens: u32) -> GenerateConfig {
    GenerateConfig {
        max_tokens,
        ..GenerateConfig::default()
    }
}

fn text(s: &str) -> Prompt {
    Prompt::Text(s.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlx_keeps_the_contract_like_the_cpu_engine() {
    let mlx = mlx_model().await;
    let cpu = cpu_model();
    let info = mlx.info();
    assert_eq!(
        (info.architecture.as_str(), info.num_layers, info.vocab_size),
        ("llama", 30, 49152)
    );
    assert!(info.kernels.starts_with("mlx"), "{}", info.kernels);

    // Greedy text and chat: the same tokens, the same rendered prompt length.
    for prompt in [
        text("The capital of France is"),
        Prompt::chat(vec![
            Message::new("system", "You answer briefly."),
            Message::new("user", "What is the capital of France?"),
        ]),
    ] {
        let (a, b) = (
            gen(&mlx, prompt.clone(), greedy(16)).await,
            gen(&cpu, prompt, greedy(16)).await,
        );
        assert_eq!(a.ids, b.ids, "MLX {:?} vs CPU {:?}", a.text, b.text);
        assert_eq!(
            a.metrics.prompt_tokens, b.metrics.prompt_tokens,
            "the same rendered prompt"
        );
        assert!(a.metrics.peak_memory_bytes > 0 && a.metrics.active_memory_bytes > 0);
    }

    // Presence and frequency penalties (OpenAI's, over the generated tokens): the
    // same tokens as the CPU engine, and not the unpenalised ones.
    let listing = text("Colors: red, blue, green,");
    let mut penalised = greedy(16);
    penalised.presence_penalty = 1.5;
    penalised.frequency_penalty = 1.0;
    let (a, b) = (
        gen(&mlx, listing.clone(), penalised.clone()).await,
        gen(&cpu, listing.clone(), penalised).await,
    );
    assert_eq!(a.ids, b.ids, "penalised: MLX {:?} vs CPU {:?}", a.text, b.text);
    let plain = gen(&cpu, listing, greedy(16)).await;
    assert_ne!(plain.ids, b.ids, "the penalties change the answer: {:?}", plain.text);

    // Prefix reuse: the same prompt again keeps all but its last token; a sibling
    // prompt keeps the shared words. The tokens do not change.
    let once = gen(&mlx, text("The capital of France is"), greedy(4)).await;
    assert_eq!(once.metrics.cached_tokens, 0, "the cache held the chat");
    let again = gen(&mlx, text("The capital of France is"), greedy(4)).await;
    assert_eq!(
        again.metrics.cached_tokens,
        again.metrics.prompt_tokens - 1,
        "{:?}",
        again.metrics
    );
    assert_eq!(again.ids, once.ids);
    let sibling = gen(&mlx, text("The capital of Italy is"), greedy(4)).await;
    assert_eq!(sibling.metrics.cached_tokens, 3, "'The capital of' is reused");
    assert_eq!(
        sibling.ids,
        gen(&cpu, text("The capital of Italy is"), greedy(4)).await.ids
    );

    // Stop strings are cut and never emitted; a stop token ends the stream.
    let full = gen(&mlx, text("The capital of France is"), greedy(16)).await;
    let mut cfg = greedy(16);
    cfg.stop = vec!["Paris".into()];
    let cut = gen(&mlx, text("The capital of France is"), cfg).await;
    assert_eq!(cut.finish, Some(FinishReason::Stop));
    assert!(
        !cut.text.contains("Paris") && full.text.contains("Paris"),
        "{:?}",
        cut.text
    );
    assert_eq!(
        cut.metrics.stop_sequence.as_deref(),
        Some("Paris"),
        "the stop that matched"
    );
    assert_eq!(full.metrics.stop_sequence, None);
    let mut cfg = greedy(16);
    cfg.stop_tokens = vec![full.ids[2]];
    let by_token = gen(&mlx, text("The capital of France is"), cfg).await;
    assert_eq!(
        (by_token.ids.as_slice(), by_token.finish),
        (&full.ids[..2], Some(FinishReason::Stop))
    );

    // Seeded sampling is reproducible; another seed goes elsewhere.
    let sampled = |seed| GenerateConfig {
        max_tokens: 24,
        temperature: 1.0,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        repeat_penalty: 1.1,
        seed: Some(seed),
        ..GenerateConfig::default()
    };
    let s1 = gen(&mlx, text("Once upon a time"), sampled(7)).await;
    let s2 = gen(&mlx, text("Once upon a time"), sampled(7)).await;
    assert_eq!(s1.ids, s2.ids, "the same seed, the same tokens");
    let others: Vec<Vec<u32>> =
        futures::future::join_all((8..11).map(|s| gen(&mlx, text("Once upon a time"), sampled(s))))
            .await
            .into_iter()
            .map(|r| r.ids)
            .collect();
    assert!(others.iter().any(|o| *o != s1.ids), "other seeds sample other tokens");

    // Classify: the same next token and logits close to the CPU engine's.
    let prompts = vec![text("The capital of France is"), text("")];
    let (a, b) = (
        mlx.classify(prompts.clone(), true).await,
        cpu.classify(prompts, true).await,
    );
    let (a0, b0) = (a[0].as_ref().unwrap(), b[0].as_ref().unwrap());
    assert_eq!(a0.token.id, b0.token.id);
    assert_eq!(a0.logits.len(), 49152);
    let worst = a0
        .logits
        .iter()
        .zip(&b0.logits)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst < 0.05, "largest logit difference {worst}");
    assert!(a[1].is_err(), "an empty prompt fails alone");

    // Batch: each prompt its own tokens or its own error.
    let batch = mlx
        .batch_generate(
            vec![text("The capital of France is"), text("")],
            greedy(6),
            CancelFlag::default(),
        )
        .await;
    assert_eq!(batch[0].tokens.iter().map(|t| t.id).collect::<Vec<_>>(), full.ids[..6]);
    assert!(batch[1].error.is_some() && batch[1].tokens.is_empty());

    // Cancel: the stream ends early, cancelled.
    let cancel = CancelFlag::default();
    let mut s = mlx.generate(text("Once upon a time"), greedy(400), cancel.clone());
    let mut seen = 0;
    let mut finish = None;
    while let Some(ev) = s.next().await {
        match ev.unwrap() {
            GenerateEvent::Token(_) => {
                seen += 1;
                if seen == 3 {
                    cancel.cancel();
                }
            }
            GenerateEvent::Done { finish_reason, .. } => finish = Some(finish_reason),
        }
    }
    assert_eq!(finish, Some(FinishReason::Cancelled));
    assert!(seen < 20, "{seen} tokens despite the cancel");

    // Context overflow is refused before any compute.
    let over = gen(&mlx, text("Hi"), greedy(1_000_000)).await;
    assert!(
        over.error.as_ref().is_some_and(|e| e.to_string().contains("context")),
        "{:?}",
        over.error
    );

    // A session: tokenize, make resident, decode, extend — as on the CPU engine.
    let (ms, cs) = (mlx.open_session().await.unwrap(), cpu.open_session().await.unwrap());
    let round = |s: Arc<dyn ModelSession>| async move {
        let t = s.tokenize("The capital of France is".into(), false).await.unwrap();
        let first = s.set_resident(t.clone(), false).await.unwrap();
        let out = drain(s.decode(greedy(6), CancelFlag::default())).await;
        let resident = s.resident().await.unwrap();
        let mut longer = t.clone();
        longer.extend(
            s.tokenize(" Paris. The capital of Spain is".into(), false)
                .await
                .unwrap(),
        );
        let second = s.set_resident(longer, false).await.unwrap();
        let out2 = drain(s.decode(greedy(4), CancelFlag::default())).await;
        (t, first, out.ids, resident, second, out2.ids)
    };
    let (mt, mfirst, mout, mres, msecond, mout2) = round(ms.clone()).await;
    let (ct, _, cout, _, _, cout2) = round(cs).await;
    assert_eq!(mt, ct, "the same session tokens");
    assert_eq!((mfirst.reused, mfirst.computed), (0, 5));
    assert_eq!((mout, mout2), (cout, cout2), "session decodes agree");
    assert!(
        mres.starts_with(&mt) && mres.len() > mt.len(),
        "generated tokens stay resident: {mres:?}"
    );
    assert!(
        msecond.reused >= 5,
        "the first prompt (and matching generated tokens) kept: {msecond:?}"
    );
    ms.close();
    assert!(ms.resident().await.is_err(), "a closed session refuses");

    // The attention inspector: post-RoPE keys like the CPU engine's.
    let (a, b) = (
        mlx.inspect_attention(text("Hello there, world")).await.unwrap(),
        cpu.inspect_attention(text("Hello there, world")).await.unwrap(),
    );
    assert_eq!(
        (a.num_layers, a.num_heads, a.seq_len, a.head_dim),
        (b.num_layers, b.num_heads, b.seq_len, b.head_dim)
    );
    let mut worst = 0f32;
    for (la, lb) in a.keys.iter().zip(&b.keys) {
        for (ha, hb) in la.iter().zip(lb) {
            for (x, y) in ha.iter().zip(hb) {
                worst = worst.max((x - y).abs() / (1.0 + y.abs()));
            }
        }
    }
    assert!(worst < 0.02, "largest relative key difference {worst}");
}
