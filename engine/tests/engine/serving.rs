//! The CPU engine's non-streaming calls on the real demo model: Classify
//! (prefill-only, optional logits, per-prompt errors) and BatchGenerate (each prompt
//! its own result or error).

use futures::StreamExt;
use std::sync::atomic::Ordering;
use switchyard_backend::{CancelFlag, GenerateEvent, Prompt, TextModel};
use switchyard_engine::EngineModel;
use switchyard_messages::{ErrorCode, GenerateConfig, GenerateMetrics, LoadConfig};
use switchyard_testkit::*;

async fn alone(model: &EngineModel, prompt: &str, n: u32) -> Vec<u32> {
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
    let model = EngineModel::load(&demo_model(), &LoadConfig::default()).unwrap();
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
    let model = EngineModel::load(&demo_model(), &LoadConfig::default()).unwrap();
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

/// Generates greedily and returns the ids and the metrics.
async fn run(model: &EngineModel, prompt: &str, n: u32) -> (Vec<u32>, switchyard_messages::GenerateMetrics) {
    greedy_ids(model, Prompt::Text(prompt.into()), n).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resident_prefix_is_reused_and_gives_the_cold_answer() {
    let warm = EngineModel::load(&demo_model(), &LoadConfig::default()).unwrap();
    let tok = |s: &str| warm.tokenizer().encode(s).unwrap();
    let story = "Once upon a time, in a small village by the sea, there lived an old fisherman who";
    let question = "Question: What is 12 times 7?\nAnswer:";

    // Cold, then the same prompt again: all but the last prompt token reused.
    let (cold_ids, cold) = run(&warm, story, 24).await;
    assert_eq!(cold.cached_tokens, 0);
    let (again_ids, again) = run(&warm, story, 24).await;
    assert_eq!(again.cached_tokens as usize, tok(story).len() - 1, "{again:?}");
    assert_eq!(again.prompt_tokens, cold.prompt_tokens);
    assert_eq!(again_ids, cold_ids, "a warm prefix must not change the answer");

    // The story continued by its own answer: prompt and generated tokens are resident.
    let continued = format!("{story}{}", warm.tokenizer().decode(&cold_ids));
    let (_, m) = run(&warm, &continued, 4).await;
    let common = switchyard_engine::compute::common_prefix(&[tok(story), cold_ids.clone()].concat(), &tok(&continued));
    assert_eq!(m.cached_tokens as usize, common.min(tok(&continued).len() - 1), "{m:?}");
    assert!(m.cached_tokens as usize > tok(story).len(), "{m:?}");

    // A divergent tail: only the shared head is reused; the answer equals a cold
    // engine's on the same prompt.
    let fork = "Once upon a time, in a small village by the sea, there lived a young girl who";
    let (fork_ids, m) = run(&warm, fork, 24).await;
    let shared = switchyard_engine::compute::common_prefix(&tok(story), &tok(fork));
    assert!(shared > 10);
    assert_eq!(m.cached_tokens as usize, shared, "{m:?}");
    let cold_model = EngineModel::load(&demo_model(), &LoadConfig::default()).unwrap();
    assert_eq!(alone(&cold_model, fork, 24).await, fork_ids, "warm fork vs cold");

    // Nothing shared: nothing reused. Classify reuses too.
    let (_, m) = run(&warm, question, 8).await;
    assert_eq!(m.cached_tokens, 0);
    let classified = warm.classify(vec![Prompt::Text(question.into())], false).await;
    let direct = cold_model.classify(vec![Prompt::Text(question.into())], false).await;
    assert_eq!(
        classified[0].as_ref().unwrap().token.id,
        direct[0].as_ref().unwrap().token.id
    );
}

/// Everything a generation produced: token ids, finish reason, metrics.
async fn collect(mut events: switchyard_backend::GenerateStream) -> (Vec<u32>, String, GenerateMetrics) {
    let (mut ids, mut reason, mut metrics) = (Vec::new(), String::new(), None);
    while let Some(ev) = events.next().await {
        match ev.unwrap() {
            GenerateEvent::Token(t) => ids.push(t.id),
            GenerateEvent::Done {
                finish_reason,
                metrics: m,
            } => {
                reason = format!("{finish_reason:?}");
                metrics = Some(m);
            }
        }
    }
    (ids, reason, metrics.expect("a final event"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_batching_gives_each_request_its_solo_tokens() {
    let slots = LoadConfig {
        parallel_slots: 4,
        ..LoadConfig::default()
    };
    let story = "Once upon a time, in a small village by the sea, there lived an old fisherman who";
    let fork = "Once upon a time, in a small village by the sea, there lived a young girl who";
    let greedy = GenerateConfig {
        max_tokens: 40,
        ..GenerateConfig::default()
    };
    // Different sampling, limits and stops per request.
    let jobs: Vec<(&str, GenerateConfig)> = vec![
        (story, greedy.clone()),
        (
            fork,
            GenerateConfig {
                temperature: 0.8,
                top_k: 40,
                seed: Some(7),
                max_tokens: 32,
                ..GenerateConfig::default()
            },
        ),
        (
            "def fibonacci(n):",
            GenerateConfig {
                temperature: 1.0,
                top_p: 0.9,
                repeat_penalty: 1.3,
                seed: Some(1),
                max_tokens: 24,
                ..GenerateConfig::default()
            },
        ),
        (
            "The capital of France is",
            GenerateConfig {
                max_tokens: 12,
                stop: vec![".".into()],
                ..GenerateConfig::default()
            },
        ),
    ];
    let solo_model = EngineModel::load(&demo_model(), &slots).unwrap();
    let mut solo = Vec::new();
    for (prompt, cfg) in &jobs {
        let events = solo_model.generate(Prompt::Text(prompt.to_string()), cfg.clone(), CancelFlag::new());
        solo.push(collect(events).await);
    }
    assert_eq!(
        solo_model.batch_stats().peak.load(Ordering::Relaxed),
        1,
        "one at a time"
    );

    // All at once on a fresh model: one decode batch, the same tokens for each.
    let model = EngineModel::load(&demo_model(), &slots).unwrap();
    let streams: Vec<_> = jobs
        .iter()
        .map(|(prompt, cfg)| model.generate(Prompt::Text(prompt.to_string()), cfg.clone(), CancelFlag::new()))
        .collect();
    let together = futures::future::join_all(streams.into_iter().map(collect)).await;
    for (i, ((ids, reason, _), (solo_ids, solo_reason, _))) in together.iter().zip(&solo).enumerate() {
        assert!(!ids.is_empty(), "request {i}");
        assert_eq!((ids, reason), (solo_ids, solo_reason), "request {i}: batched vs alone");
    }
    let stats = model.batch_stats();
    assert!(stats.peak.load(Ordering::Relaxed) >= 3, "{stats:?}");
    // The fork arrived while the story was running: the shared head was copied from
    // the story's slot instead of being prefilled again.
    let tok = |s: &str| model.tokenizer().encode(s).unwrap();
    let shared = switchyard_engine::compute::common_prefix(&tok(story), &tok(fork));
    assert_eq!(together[1].2.cached_tokens as usize, shared, "{:?}", together[1].2);

    // More requests than slots: the rest wait for a free slot, then run.
    let streams: Vec<_> = (0..6)
        .map(|i| {
            let cfg = GenerateConfig {
                max_tokens: 8,
                ..GenerateConfig::default()
            };
            model.generate(Prompt::Text(format!("Count to {i}:")), cfg, CancelFlag::new())
        })
        .collect();
    for (ids, reason, _) in futures::future::join_all(streams.into_iter().map(collect)).await {
        assert!(!ids.is_empty() && ids.len() <= 8, "{ids:?} {reason}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_evicted_from_its_slot_comes_back_from_the_block_store() {
    let story = "Once upon a time, in a small village by the sea, there lived an old fisherman who \
                 went out every morning before dawn. He knew every rock of the bay, every current and \
                 every bird that followed the boats. One winter the fish did not come, and the village \
                 began to worry about the long months ahead, the empty nets and the cold houses.";
    let other = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n";
    let load = |mb: u32| {
        let config = LoadConfig {
            parallel_slots: 1,
            kv_cache_mb: mb,
            ..LoadConfig::default()
        };
        EngineModel::load(&demo_model(), &config).unwrap()
    };
    let store = load(64);
    let tok = store.tokenizer().encode(story).unwrap();
    let blocks = (tok.len() - 1) / switchyard_engine::block_store::BLOCK_TOKENS;
    assert!(blocks >= 2, "{} tokens", tok.len());
    let (cold_ids, cold) = run(&store, story, 12).await;
    assert_eq!(cold.cached_tokens, 0);
    // One slot: the other prompt overwrites the story there; its blocks go to the store…
    run(&store, other, 4).await;
    // …and come back by copy, with the cold answer.
    let (ids, warm) = run(&store, story, 12).await;
    assert_eq!(warm.cached_tokens as usize, blocks * 32, "{warm:?}");
    assert_eq!(ids, cold_ids, "restored blocks must not change the answer");

    // Without a store, or with one too small for the chain's head, nothing comes back.
    for mb in [0, 1] {
        let model = load(mb);
        run(&model, story, 4).await;
        run(&model, other, 4).await;
        let (_, m) = run(&model, story, 4).await;
        assert_eq!(m.cached_tokens, 0, "kv_cache_mb {mb}: {m:?}");
    }
}

/// A long prompt that arrives while another request generates is prefilled in
/// chunks between that request's decode steps: the running stream keeps getting
/// tokens during the prefill, and both get exactly the tokens they get alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_is_prefilled_in_chunks_between_decode_steps() {
    let load = LoadConfig {
        parallel_slots: 2,
        prefill_chunk: 16,
        ..LoadConfig::default()
    };
    let runner = "Once upon a time, in a small village by the sea, there lived an old fisherman who";
    let long: String = (0..12)
        .map(|i| format!("Paragraph {i}. The river flows past the old mill, and the town grows around it. "))
        .collect();
    let model = EngineModel::load(&demo_model(), &load).unwrap();
    let solo_runner = alone(&model, runner, 96).await;
    let long_tokens = model.tokenizer().encode(&long).unwrap().len();
    assert!(long_tokens > 160, "{long_tokens} prompt tokens");

    let cfg = |n| GenerateConfig {
        max_tokens: n,
        ..GenerateConfig::default()
    };
    // A different first word, so nothing of the long prompt is resident.
    let long2 = format!("Notes. {long}");
    let solo_long2 = {
        let fresh = EngineModel::load(&demo_model(), &load).unwrap();
        alone(&fresh, &long2, 8).await
    };
    let mut a = model.generate(Prompt::Text(runner.into()), cfg(96), CancelFlag::new());
    // Let the runner get going, then send the long prompt.
    let mut a_ids = Vec::new();
    while a_ids.len() < 4 {
        if let Some(GenerateEvent::Token(t)) = a.next().await.map(Result::unwrap) {
            a_ids.push(t.id);
        }
    }
    let mut b = model.generate(Prompt::Text(long2.clone()), cfg(8), CancelFlag::new());
    // Count the runner's tokens that arrive before the long prompt's first token.
    let (mut b_ids, mut a_during, mut b_metrics) = (Vec::new(), None, None);
    let mut a_done = false;
    loop {
        if a_done && b_metrics.is_some() {
            break;
        }
        tokio::select! {
            ev = b.next(), if b_metrics.is_none() => match ev.map(Result::unwrap) {
                Some(GenerateEvent::Token(t)) => {
                    if b_ids.is_empty() {
                        // Everything the runner produced before this token is already
                        // in its channel (one compute thread sends both, in order).
                        while let Some(Some(ev)) = futures::FutureExt::now_or_never(a.next()) {
                            match ev.unwrap() {
                                GenerateEvent::Token(t) => a_ids.push(t.id),
                                GenerateEvent::Done { .. } => a_done = true,
                            }
                        }
                        a_during = Some(a_ids.len());
                    }
                    b_ids.push(t.id);
                }
                Some(GenerateEvent::Done { metrics, .. }) => b_metrics = Some(metrics),
                None => panic!("the long prompt's stream ended without Done"),
            },
            ev = a.next(), if !a_done => match ev.map(Result::unwrap) {
                Some(GenerateEvent::Token(t)) => a_ids.push(t.id),
                Some(GenerateEvent::Done { .. }) | None => a_done = true,
            },
            else => break,
        }
    }
    assert_eq!(a_ids, solo_runner, "the running stream, interleaved vs alone");
    assert_eq!(b_ids, solo_long2, "the chunked prompt vs prefilled at once");
    let during = a_during.expect("the long prompt produced tokens") - 4;
    let chunks = long_tokens / 16;
    // Every chunk step also advanced the runner (a stall would show ~0 here).
    assert!(
        during + 2 >= chunks,
        "{during} runner tokens during a prefill of {long_tokens} tokens in chunks of 16"
    );
}

/// Prompts a stream answers partly by repeating them (prompt lookup's ground), and
/// one that it does not.
const QUOTED: &str = "Copy the list exactly.\nList: apples, pears, plums, cherries, grapes, lemons, limes, figs, dates, melons.\nCopy: apples, pears, plums, cherries, grapes, lemons, limes, figs, dates, melons.\nList: red, green, blue, yellow, orange, purple, pink, brown, black, white.\nCopy:";
const CODE: &str = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n\ndef div(a, b):\n";

/// Speculative decoding with prompt lookup changes no token: greedy and seeded
/// sampled streams (repeat penalty, a stop string) give exactly what they give
/// without it, alone and in one batch with each other, on the demo model, Gemma 3
/// (sliding-window rings) and a random-weight Qwen2 model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_decoding_changes_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let random = dir.path().join("random-qwen2-q4_0.gguf");
    let out = std::process::Command::new(python())
        .arg(repo().join("scripts/make-random-qwen-gguf.py"))
        .arg(demo_model())
        .arg(&random)
        .args(["qwen2", "1234", "q4_0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let jobs: Vec<(&str, GenerateConfig)> = vec![
        (
            QUOTED,
            GenerateConfig {
                max_tokens: 48,
                ..GenerateConfig::default()
            },
        ),
        (
            CODE,
            GenerateConfig {
                temperature: 0.7,
                top_k: 20,
                repeat_penalty: 1.1,
                seed: Some(3),
                max_tokens: 40,
                ..GenerateConfig::default()
            },
        ),
        (
            QUOTED,
            GenerateConfig {
                temperature: 1.0,
                seed: Some(11),
                max_tokens: 40,
                stop: vec!["white".into()],
                ..GenerateConfig::default()
            },
        ),
        (
            "Once upon a time, in a small village by the sea,",
            GenerateConfig {
                max_tokens: 24,
                ..GenerateConfig::default()
            },
        ),
    ];
    let mut models = vec![("demo", demo_model()), ("random qwen2", random)];
    models.extend(gemma_model().map(|p| ("gemma 3", p)));
    for (name, path) in models {
        let load = |speculative: &str| {
            let cfg = LoadConfig {
                parallel_slots: 4,
                speculative: speculative.into(),
                ..LoadConfig::default()
            };
            EngineModel::load(&path, &cfg).unwrap()
        };
        let run = |model: &EngineModel, (prompt, cfg): &(&str, GenerateConfig)| {
            model.generate(Prompt::Text(prompt.to_string()), cfg.clone(), CancelFlag::new())
        };
        let plain = load("off");
        let mut want = Vec::new();
        for job in &jobs {
            let (ids, reason, m) = collect(run(&plain, job)).await;
            assert_eq!(m.draft_tokens, 0, "{name}: no drafts when off");
            want.push((ids, reason));
        }
        // The last prompt, its greedy answer and the prompt again.
        let head = plain.tokenizer().encode(jobs[3].0).unwrap();
        let echo = [head.clone(), want[3].0.clone(), head].concat();
        // A repeat penalty below 1 favours what was said: even a random model loops.
        let echo_job = GenerateConfig {
            max_tokens: 64,
            repeat_penalty: 0.3,
            ..GenerateConfig::default()
        };
        let events = plain.generate(Prompt::Tokens(echo.clone()), echo_job.clone(), CancelFlag::new());
        let (echo_want, ..) = collect(events).await;
        let events = load("lookup").generate(Prompt::Tokens(echo), echo_job, CancelFlag::new());
        let (ids, _, m) = collect(events).await;
        assert_eq!(ids, echo_want, "{name}: the echo");
        assert!(m.accepted_tokens > 0, "{name}: the echo's drafts were kept: {m:?}");
        eprintln!(
            "{name} echo: drafted {}, accepted {}",
            m.draft_tokens, m.accepted_tokens
        );
        let spec = load("lookup");
        let mut accepted = 0;
        for (i, job) in jobs.iter().enumerate() {
            let (ids, reason, m) = collect(run(&spec, job)).await;
            assert_eq!((&ids, &reason), (&want[i].0, &want[i].1), "{name}: job {i} alone");
            assert!(m.accepted_tokens <= m.draft_tokens, "{m:?}");
            accepted += m.accepted_tokens;
            eprintln!(
                "{name} job {i}: {} tokens, drafted {}, accepted {}",
                ids.len(),
                m.draft_tokens,
                m.accepted_tokens
            );
        }
        if name == "demo" {
            assert!(
                accepted > 20,
                "prompt lookup's drafts were checked and kept ({accepted})"
            );
        }
        let together = futures::future::join_all(jobs.iter().map(|j| collect(run(&spec, j)))).await;
        for (i, (ids, reason, _)) in together.into_iter().enumerate() {
            assert_eq!((&ids, &reason), (&want[i].0, &want[i].1), "{name}: job {i} in a batch");
        }
        assert!(spec.batch_stats().peak.load(Ordering::Relaxed) >= 3, "{name}: batched");
        if name != "demo" {
            continue;
        }
        // A draft model: the demo model drafting for itself (every greedy draft is
        // right) and the random model drafting for it (nearly every draft is wrong).
        for (draft_name, draft) in [
            ("itself", demo_model()),
            ("random", dir.path().join("random-qwen2-q4_0.gguf")),
        ] {
            let cfg = LoadConfig {
                parallel_slots: 4,
                speculative: "draft".into(),
                draft_model: draft.display().to_string(),
                ..LoadConfig::default()
            };
            let spec = EngineModel::load(&path, &cfg).unwrap();
            let mut drafted = 0;
            for (i, job) in jobs.iter().enumerate() {
                let (ids, reason, m) = collect(run(&spec, job)).await;
                assert_eq!(
                    (&ids, &reason),
                    (&want[i].0, &want[i].1),
                    "draft {draft_name}: job {i} alone"
                );
                drafted += m.draft_tokens;
                eprintln!(
                    "draft {draft_name} job {i}: drafted {}, accepted {}",
                    m.draft_tokens, m.accepted_tokens
                );
            }
            assert!(drafted > 0, "draft {draft_name}: nothing drafted");
            let together = futures::future::join_all(jobs.iter().map(|j| collect(run(&spec, j)))).await;
            for (i, (ids, reason, _)) in together.into_iter().enumerate() {
                assert_eq!(
                    (&ids, &reason),
                    (&want[i].0, &want[i].1),
                    "draft {draft_name}: job {i} in a batch"
                );
            }
        }
    }
    // A draft whose vocabulary is not the model's is refused by name.
    if let Some(gemma) = gemma_model() {
        let cfg = LoadConfig {
            speculative: "draft".into(),
            draft_model: gemma.display().to_string(),
            ..LoadConfig::default()
        };
        let err = EngineModel::load(&demo_model(), &cfg).err().expect("refused");
        assert!(err.to_string().contains("vocabulary"), "{err}");
    }
}

/// `logit_bias` is added before any other sampling step: +100 on one token makes
/// greedy decoding repeat it, −100 on the greedy first token bans it; an id outside
/// the vocabulary is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_forces_and_bans_tokens() {
    let model = EngineModel::load(&demo_model(), &LoadConfig::default()).unwrap();
    let run = |bias: Vec<(u32, f32)>| {
        let cfg = GenerateConfig {
            max_tokens: 6,
            logit_bias: bias,
            ..GenerateConfig::default()
        };
        let mut s = model.generate(Prompt::Text("The capital of France is".into()), cfg, CancelFlag::new());
        async move {
            let mut ids = Vec::new();
            while let Some(ev) = s.next().await {
                if let GenerateEvent::Token(t) = ev? {
                    ids.push(t.id);
                }
            }
            Ok::<_, switchyard_backend::BackendError>(ids)
        }
    };
    let plain = run(Vec::new()).await.unwrap();
    assert_eq!(run(vec![(1234, 100.0)]).await.unwrap(), vec![1234; 6]);
    let banned = run(vec![(plain[0], -100.0)]).await.unwrap();
    assert_ne!(banned[0], plain[0]);
    let err = run(vec![(49152, 1.0)]).await.unwrap_err();
    assert!(err.to_string().contains("logit_bias: token id 49152"), "{err}");
}
