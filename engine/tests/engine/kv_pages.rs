//! KV pages shared between streams (`engine/model/kv_cache.rs`): streams behind one
//! prompt hold it once, diverge by copy-on-write, and give exactly the tokens they
//! give alone; a cancelled stream's pages are freed once nothing holds them; and a
//! stress run of random arrivals, shared prefixes, steps, cancels and restarts over a
//! small pool of sequences, where every step's logits must equal the same tokens
//! computed alone in a cache of their own (a page freed or overwritten while another
//! stream still read it would change them).

use candle_core::quantized::gguf_file;
use futures::StreamExt;
use switchyard_backend::{CancelFlag, GenerateEvent, Prompt, TextModel};
use switchyard_engine::model::forward::{CpuForward, Forward, SeqStep};
use switchyard_engine::model::llama::LlamaModel;
use switchyard_engine::EngineModel;
use switchyard_messages::{GenerateConfig, GenerateMetrics, LoadConfig};
use switchyard_testkit::*;

/// Synthetic prompt ids (the arithmetic is what is compared, not the text).
fn ids(n: usize, salt: u32) -> Vec<u32> {
    (1..=n as u32)
        .map(|i| (i * 7919 + salt * 104_729) % 20000 + 100)
        .collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

async fn tokens(model: &EngineModel, prompt: Vec<u32>, config: GenerateConfig, cancel: CancelFlag) -> Vec<u32> {
    run(model, prompt, config, cancel).await.0
}

async fn run(
    model: &EngineModel,
    prompt: Vec<u32>,
    config: GenerateConfig,
    cancel: CancelFlag,
) -> (Vec<u32>, GenerateMetrics) {
    let mut events = model.generate(Prompt::Tokens(prompt), config, cancel);
    let mut out = Vec::new();
    while let Some(ev) = events.next().await {
        match ev.unwrap() {
            GenerateEvent::Token(t) => out.push(t.id),
            GenerateEvent::Done { metrics, .. } => return (out, metrics),
        }
    }
    panic!("the stream ended without a result")
}

fn jobs(prefix: &[u32]) -> Vec<(Vec<u32>, GenerateConfig)> {
    (0..4)
        .map(|i| {
            let prompt = [prefix, &ids(5 + 3 * i, i as u32 + 1)].concat();
            let config = GenerateConfig {
                max_tokens: 24 + 4 * i as u32,
                temperature: if i % 2 == 0 { 0.0 } else { 0.8 },
                seed: Some(i as u64),
                ..GenerateConfig::default()
            };
            (prompt, config)
        })
        .collect()
}

fn load(slots: u32, copy: bool) -> EngineModel {
    let config = LoadConfig {
        parallel_slots: slots,
        context_len: 1024,
        copy_kv_prefixes: copy,
        ..LoadConfig::default()
    };
    EngineModel::load(&demo_model(), &config).unwrap()
}

/// Four streams behind a 300-token prompt (a warm-up computed it), greedy and
/// sampled, all at once: each gets the tokens it gets alone, and the engine holds the
/// prompt once (less than half of what copies per slot hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_behind_one_prompt_hold_it_once_and_get_their_solo_tokens() {
    let prefix = ids(300, 0);
    let jobs = jobs(&prefix);
    let alone = load(1, false);
    let mut solo = Vec::new();
    for (prompt, config) in &jobs {
        solo.push(tokens(&alone, prompt.clone(), config.clone(), CancelFlag::new()).await);
    }
    let mut held = Vec::new();
    for copy in [false, true] {
        let model = load(5, copy);
        let warm = [prefix.as_slice(), &[7, 8, 9]].concat();
        tokens(&model, warm, GenerateConfig::default(), CancelFlag::new()).await;
        let runs = jobs
            .iter()
            .map(|(p, c)| tokens(&model, p.clone(), c.clone(), CancelFlag::new()));
        let together = futures::future::join_all(runs).await;
        for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
            assert!(!a.is_empty());
            assert_eq!(a, b, "job {i} (copy per slot: {copy})");
        }
        let usage = model.kv_usage();
        held.push(usage.resident_bytes);
        // The warm-up's slot went to one of the four.
        assert!(usage.resident_tokens >= 4 * 300, "{usage:?}");
    }
    assert!(held[0] * 2 < held[1], "shared {} vs copied {} bytes", held[0], held[1]);
}

/// Three prompts behind one 400-token head arrive together while another stream
/// generates, so they are prefilled in chunks, one after another: the first computes
/// the head; the others take it over when their turn comes (and still get their solo
/// tokens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_arriving_together_behind_one_head_compute_it_once() {
    let prefix = ids(400, 9);
    let jobs: Vec<_> = jobs(&prefix).into_iter().take(3).collect();
    let alone = load(1, false);
    let mut solo = Vec::new();
    for (prompt, config) in &jobs {
        solo.push(tokens(&alone, prompt.clone(), config.clone(), CancelFlag::new()).await);
    }
    let model = load(4, false);
    let busy = GenerateConfig {
        max_tokens: 400,
        ..GenerateConfig::default()
    };
    let cancel = CancelFlag::new();
    let mut other = model.generate(Prompt::Tokens(ids(20, 77)), busy, cancel.clone());
    assert!(matches!(other.next().await, Some(Ok(GenerateEvent::Token(_)))));
    let runs = jobs
        .iter()
        .map(|(p, c)| run(&model, p.clone(), c.clone(), CancelFlag::new()));
    let together = futures::future::join_all(runs).await;
    cancel.cancel();
    let cached: Vec<u32> = together.iter().map(|(_, m)| m.cached_tokens).collect();
    for (i, (a, (b, _))) in solo.iter().zip(&together).enumerate() {
        assert_eq!(a, b, "job {i}");
    }
    assert_eq!(
        cached.iter().filter(|&&c| c >= 400).count(),
        2,
        "cached tokens {cached:?}"
    );
}

/// A stream cancelled mid-page, behind a prompt another slot shares: once both slots
/// go to other prompts, the engine holds exactly what a fresh engine holds after the
/// same prompts — the cancelled stream's pages and the shared ones were freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_streams_pages_are_freed_when_its_slot_moves_on() {
    let prefix = ids(400, 3);
    let used = load(2, false);
    tokens(&used, prefix.clone(), GenerateConfig::default(), CancelFlag::new()).await;
    let cancel = CancelFlag::new();
    let config = GenerateConfig {
        max_tokens: 200,
        ..GenerateConfig::default()
    };
    let mut events = used.generate(
        Prompt::Tokens([prefix.as_slice(), &[5, 6]].concat()),
        config,
        cancel.clone(),
    );
    let mut seen = 0;
    while let Some(ev) = events.next().await {
        if let GenerateEvent::Token(_) = ev.unwrap() {
            seen += 1;
            if seen == 11 {
                cancel.cancel();
            }
        }
    }
    assert!((11..200).contains(&seen), "cancelled after {seen} tokens");
    let before = used.kv_usage().resident_bytes;
    let fresh = load(2, false);
    for m in [&used, &fresh] {
        for salt in [40, 41] {
            let config = GenerateConfig {
                max_tokens: 8,
                ..GenerateConfig::default()
            };
            tokens(m, ids(40, salt), config, CancelFlag::new()).await;
        }
    }
    let (a, b) = (used.kv_usage().resident_bytes, fresh.kv_usage().resident_bytes);
    assert_eq!(a, b, "held after moving on (before: {before})");
    assert!(a * 2 < before, "{a} vs {before}");
}

/// A tiny deterministic generator (the test must not depend on a crate's sequence).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// Random arrivals over five sequences of 160 positions: a new stream takes a random
/// prefix of another's (sharing its pages, mid-page too) or starts cold; running
/// streams step 1–4 tokens, several in one batch; streams are cancelled (their slot
/// keeps what it holds, which others may share) and restarted. Every step's logits
/// equal those of the stream's whole history computed alone; at the end the pages
/// held are exactly the distinct ones the sequences reference, and restarting every
/// sequence frees all but one page each.
#[test]
fn random_arrivals_and_cancels_over_a_small_pool_never_lose_a_page() {
    const SEQS: usize = 5;
    const CTX: usize = 160;
    let path = demo_model();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut fwd = CpuForward::new(LlamaModel::load(&content, &mut file, CTX).unwrap(), SEQS);
    let mut alone = CpuForward::new(LlamaModel::load(&content, &mut file, CTX).unwrap(), 1);
    let mut rng = Lcg(2026);
    // What each sequence holds, and whether a stream is running in it.
    let mut history: Vec<Vec<u32>> = vec![Vec::new(); SEQS];
    let mut running = [false; SEQS];
    let (mut shared, mut checked) = (0, 0);
    for round in 0..60 {
        // Arrivals: a free sequence gets a new stream.
        let mut steps: Vec<(usize, usize, Vec<u32>)> = Vec::new();
        for s in 0..SEQS {
            if running[s] || rng.below(3) != 0 {
                continue;
            }
            let donors: Vec<usize> = (0..SEQS).filter(|&d| d != s && !history[d].is_empty()).collect();
            let own = ids(1 + rng.below(30), (round * SEQS + s) as u32);
            let keep = if !donors.is_empty() && rng.below(4) != 0 {
                let d = donors[rng.below(donors.len())];
                let len = 1 + rng.below(history[d].len().min(CTX - own.len()));
                assert!(fwd.copy_prefix(d, s, len));
                history[s] = history[d][..len].to_vec();
                shared += 1;
                len
            } else {
                0
            };
            history[s].truncate(keep);
            running[s] = true;
            steps.push((s, keep, own));
        }
        // Running streams step (or are cancelled, or end at the context).
        for s in 0..SEQS {
            if !running[s] || steps.iter().any(|t| t.0 == s) {
                continue;
            }
            let n = 1 + rng.below(4);
            if rng.below(8) == 0 || history[s].len() + n > CTX {
                running[s] = false;
                continue;
            }
            steps.push((s, history[s].len(), ids(n, 7000 + (round * SEQS + s) as u32)));
        }
        if steps.is_empty() {
            continue;
        }
        let batch: Vec<SeqStep<'_>> = steps.iter().map(|(s, pos, t)| SeqStep::new(*s, t, *pos)).collect();
        let logits = fwd.forward_batch(&batch).unwrap();
        for ((s, _, t), got) in steps.iter().zip(logits) {
            history[*s].extend_from_slice(t);
            let want = alone
                .forward_batch(&[SeqStep::new(0, &history[*s], 0)])
                .unwrap()
                .remove(0);
            assert!(same_bits(&got, &want), "round {round}, sequence {s}");
            checked += 1;
        }
    }
    assert!(
        shared > 10 && checked > 100,
        "{shared} shared prefixes, {checked} steps checked"
    );
    let page = fwd.caches[0].page_bytes();
    let mut distinct: Vec<*const _> = fwd
        .caches
        .iter()
        .flat_map(|c| c.pages().iter().map(std::sync::Arc::as_ptr))
        .collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(fwd.kv_held_bytes(), Some(distinct.len() * page));
    let weak: Vec<_> = fwd
        .caches
        .iter()
        .flat_map(|c| c.pages().iter().map(std::sync::Arc::downgrade))
        .collect();
    for s in 0..SEQS {
        fwd.forward_batch(&[SeqStep::new(s, &[42], 0)]).unwrap();
    }
    assert_eq!(fwd.kv_held_bytes(), Some(SEQS * page));
    assert!(weak.iter().all(|w| w.upgrade().is_none()), "every old page freed");
}
