//! A model split into pipeline stages (`engine/src/pipeline/`) computes what the whole
//! model computes, bit for bit: the same logits for prefills, batched decode steps
//! cut into micro-batches, prefixes shared between slots, rewinds and multi-output
//! verification steps, in 2 and 3 stages; served through the engine, the same tokens
//! greedy, sampled, under a constraint and with speculation. A failing stage ends
//! the requests with a retryable error and the pipeline starts over after it.

use candle_core::quantized::gguf_file;
use futures::StreamExt;
use switchyard_backend::{BackendError, CancelFlag, GenerateEvent, Prompt, TextModel};
use switchyard_engine::model::forward::{CpuForward, Forward, SeqStep};
use switchyard_engine::model::llama::LlamaModel;
use switchyard_engine::pipeline::{LocalLink, PipelineForward, StageServer};
use switchyard_engine::EngineModel;
use switchyard_messages::{Constraint, ErrorCode, GenerateConfig, LoadConfig};
use switchyard_testkit::*;

const CTX: usize = 256;

fn ids(n: usize, salt: u32) -> Vec<u32> {
    (1..=n as u32)
        .map(|i| (i * 7919 + salt * 104_729) % 20000 + 100)
        .collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The later stages for the cut points `cuts` (e.g. `[14]`: layers 14.. on one
/// stage), behind one in-process link carrying at most `max_bytes` a batch.
fn link(name: &str, cuts: &[usize], layers: usize, max_bytes: usize) -> LocalLink {
    let path = demo_model();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let bounds: Vec<usize> = cuts.iter().copied().chain([layers]).collect();
    let stages = bounds
        .windows(2)
        .map(|w| {
            let model = LlamaModel::load_stage(&content, &mut file, CTX, w[0]..w[1], false).unwrap();
            StageServer::new(model, name, layers, 8).unwrap()
        })
        .collect();
    LocalLink::new(stages, max_bytes)
}

fn first_stage(cuts: &[usize], slots: usize, max_bytes: usize) -> PipelineForward {
    let path = demo_model();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let whole = LlamaModel::load(&content, &mut file, CTX).unwrap();
    let layers = whole.params.n_layer;
    let model = LlamaModel::load_stage(&content, &mut file, CTX, 0..cuts[0], true).unwrap();
    PipelineForward::new(model, slots, Box::new(link("t", cuts, layers, max_bytes)), "t", layers).unwrap()
}

/// One scripted step: (sequence, position, tokens, outputs).
type Scripted = (usize, usize, Vec<u32>, usize);

/// Runs the same steps (and one prefix copy) on the whole model and on `split`,
/// comparing every logit's bits.
fn agree(split: &mut dyn Forward, whole: &mut dyn Forward, what: &str) {
    // Prefills long enough to be cut into micro-batches (and, the first, into
    // chunks sent on before the rest).
    let a = ids(150, 1);
    let b = ids(60, 2);
    let c = ids(5, 3);
    let rounds: Vec<Vec<Scripted>> = vec![
        // Prefills of different lengths in one batch.
        vec![(0, 0, a.clone(), 1), (1, 0, b.clone(), 1)],
        // Decode steps of four sequences (micro-batches), one starting fresh.
        vec![(0, 150, vec![7], 1), (1, 60, vec![8], 1), (2, 0, c.clone(), 1)],
        vec![(0, 151, vec![9], 1), (1, 61, vec![10], 1), (2, 5, vec![11], 1)],
        // A verification step wanting logits of its last 3 positions, and a rewind
        // (sequence 1 goes back to 20 and overwrites what followed).
        vec![(0, 152, vec![12, 13, 14], 3), (1, 20, vec![15, 16], 1)],
    ];
    let mut n = 0;
    for (r, steps) in rounds.iter().enumerate() {
        if r == 3 {
            // Slot 3 takes sequence 0's first 30 positions and continues from there.
            assert!(split.copy_prefix(0, 3, 30) && whole.copy_prefix(0, 3, 30));
        }
        let mut steps = steps.clone();
        if r == 3 {
            steps.push((3, 30, vec![17, 18], 2));
        }
        let seq: Vec<SeqStep<'_>> = steps
            .iter()
            .map(|(s, p, t, o)| SeqStep {
                seq: *s,
                tokens: t,
                pos: *p,
                outputs: *o,
            })
            .collect();
        let got = split.forward_batch(&seq).unwrap();
        let want = whole.forward_batch(&seq).unwrap();
        assert_eq!(got.len(), want.len(), "{what}: round {r}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                same_bits(g, w),
                "{what}: round {r}, output {i} differs from the whole model's"
            );
            n += 1;
        }
    }
    assert_eq!(n, 2 + 3 + 3 + 3 + 1 + 2);
}

#[test]
fn two_and_three_stages_compute_the_whole_models_logits_bit_for_bit() {
    let path = demo_model();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let whole = || {
        CpuForward::new(
            LlamaModel::load(&content, &mut std::fs::File::open(&path).unwrap(), CTX).unwrap(),
            4,
        )
    };
    let layers = LlamaModel::load(&content, &mut file, CTX).unwrap().params.n_layer;
    assert!(layers >= 6, "the demo model has {layers} layers");
    let (half, third) = (layers / 2, layers / 3);
    agree(&mut first_stage(&[half], 4, 1 << 20), &mut whole(), "2 stages");
    agree(
        &mut first_stage(&[third, 2 * third], 4, 1 << 20),
        &mut whole(),
        "3 stages",
    );
    // A transport that carries only 16 rows per batch: a 40-token prefill beside a
    // decode step goes as 16 + 16 rows without logits, then the rest with the
    // other step, in micro-batches of their own.
    let mut small = first_stage(&[half], 4, 16 * 576 * 4).with_micro_batches(3);
    let mut w = whole();
    let (long, short) = (ids(40, 9), ids(3, 10));
    let steps = [SeqStep::new(0, &long, 0), SeqStep::new(1, &short, 0)];
    let (g, r) = (small.forward_batch(&steps).unwrap(), w.forward_batch(&steps).unwrap());
    assert_eq!(g.len(), 2);
    assert!(
        g.iter().zip(&r).all(|(a, b)| same_bits(a, b)),
        "split into small batches"
    );
    let next = [SeqStep::new(0, &short, 40)];
    let (g, r) = (small.forward_batch(&next).unwrap(), w.forward_batch(&next).unwrap());
    assert!(same_bits(&g[0], &r[0]), "a step after the split prefill");
}

#[test]
fn stage_ranges_and_sliding_window_models_are_refused_clearly() {
    let path = demo_model();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let err = LlamaModel::load_stage(&content, &mut file, CTX, 10..99, false)
        .err()
        .unwrap();
    assert!(err.contains("not a range of the model's"), "{err}");
    let model = LlamaModel::load_stage(&content, &mut file, CTX, 0..4, true).unwrap();
    assert!(StageServer::new(model, "p", 30, 4)
        .err()
        .unwrap()
        .contains("later stage"));
    if let Some(gemma) = gemma_model() {
        let mut file = std::fs::File::open(&gemma).unwrap();
        let content = gguf_file::Content::read(&mut file).unwrap();
        let err = LlamaModel::load_stage(&content, &mut file, CTX, 0..4, true)
            .err()
            .unwrap();
        assert!(err.contains("sliding-window"), "{err}");
    }
}

fn engine(cuts: &[usize], layers: usize, speculative: &str, link_name: &str) -> EngineModel {
    let config = LoadConfig {
        parallel_slots: 4,
        context_len: CTX as u32,
        speculative: speculative.into(),
        ..LoadConfig::default()
    };
    let link = link(link_name, cuts, layers, 1 << 20);
    EngineModel::load_first_stage(&demo_model(), &config, cuts[0], Box::new(link), "t").unwrap()
}

async fn generate(model: &EngineModel, prompt: &str, config: GenerateConfig) -> Result<Vec<u32>, BackendError> {
    let mut events = model.generate(Prompt::Text(prompt.into()), config, CancelFlag::default());
    let mut out = Vec::new();
    while let Some(ev) = events.next().await {
        match ev? {
            GenerateEvent::Token(t) => out.push(t.id),
            GenerateEvent::Done { .. } => return Ok(out),
        }
    }
    panic!("the stream ended without a result")
}

fn cases() -> Vec<(&'static str, GenerateConfig)> {
    let greedy = GenerateConfig {
        max_tokens: 24,
        temperature: 0.0,
        ..GenerateConfig::default()
    };
    vec![
        ("greedy", greedy.clone()),
        (
            "sampled",
            GenerateConfig {
                temperature: 0.9,
                seed: Some(7),
                ..greedy.clone()
            },
        ),
        (
            "constrained",
            GenerateConfig {
                constraint: Some(Constraint::Regex {
                    pattern: "(yes|no), because [a-z ]{5,40}\\.".into(),
                }),
                ..greedy.clone()
            },
        ),
    ]
}

/// Served through the engine (batcher, sampler, constraints, speculation), a
/// 2-stage pipeline gives each request the tokens the whole model gives, alone and
/// with the others in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_engine_answers_as_the_whole_model_alone_and_batched() {
    let layers = 30;
    let whole = EngineModel::load(
        &demo_model(),
        &LoadConfig {
            parallel_slots: 4,
            context_len: CTX as u32,
            ..LoadConfig::default()
        },
    )
    .unwrap();
    assert_eq!(whole.info().num_layers, layers as u32, "the demo model's layers");
    let split = engine(&[12], layers, "", "t");
    let spec = engine(&[12], layers, "lookup", "t");
    let prompt = "Is the sky blue? Answer yes or no, then say why. The sky is";
    for (what, config) in cases() {
        let want = generate(&whole, prompt, config.clone()).await.unwrap();
        assert!(!want.is_empty(), "{what}");
        assert_eq!(generate(&split, prompt, config.clone()).await.unwrap(), want, "{what}");
        assert_eq!(
            generate(&spec, prompt, config.clone()).await.unwrap(),
            want,
            "{what} with speculation"
        );
    }
    // All three at once: one batch, cut into micro-batches.
    let alone: Vec<Vec<u32>> = {
        let mut v = Vec::new();
        for (_, c) in cases() {
            v.push(generate(&whole, prompt, c).await.unwrap());
        }
        v
    };
    let together = futures::future::join_all(cases().into_iter().map(|(_, c)| generate(&split, prompt, c))).await;
    for ((got, want), (what, _)) in together.into_iter().zip(&alone).zip(cases()) {
        assert_eq!(&got.unwrap(), want, "{what} batched");
    }
}

/// A stage that refuses every batch (another pipeline's name) ends the request with
/// a retryable `worker_lost` naming the pipeline — no hang — and the first stage
/// keeps serving errors, not stale KV, after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_stage_ends_requests_with_a_retryable_error() {
    let broken = engine(&[12], 30, "", "another");
    let config = GenerateConfig {
        max_tokens: 4,
        temperature: 0.0,
        ..GenerateConfig::default()
    };
    for _ in 0..2 {
        let err = generate(&broken, "Hello", config.clone()).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::WorkerLost, "{err}");
        assert!(err.code().retryable());
        assert!(err.to_string().contains("pipeline t"), "{err}");
    }
}
