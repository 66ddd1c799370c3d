//! Gemma 3's sliding-window layers keep a ring of `window + SWA_PASS` positions
//! instead of the whole context (`engine/model/kv_cache.rs`), on the real Gemma 3
//! 270M (window 512, so a ring of 1,024 rows): the same logits bit for bit as a
//! cache holding every position, with windows that wrap around the ring in prefill
//! and in decode; a long step split into passes; rows read and written for the block
//! store; and where the engine can no longer resume a prefix (it starts over, with
//! the cold answer).

use candle_core::quantized::gguf_file;
use futures::StreamExt;
use switchyard_backend::{CancelFlag, GenerateEvent, Prompt, TextModel};
use switchyard_engine::block_store::BLOCK_TOKENS;
use switchyard_engine::compute::common_prefix;
use switchyard_engine::model::forward::{CpuForward, Forward, SeqStep};
use switchyard_engine::model::llama::{KvCache, LlamaModel, SWA_PASS};
use switchyard_engine::EngineModel;
use switchyard_messages::{ErrorCode, GenerateConfig, GenerateMetrics, LoadConfig};
use switchyard_testkit::*;

/// Synthetic prompt ids (the arithmetic is what is compared, not the text).
fn ids(n: usize) -> Vec<u32> {
    (1..=n as u32).map(|i| (i * 7919) % 20000 + 100).collect()
}

fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .fold(0, |best, (i, v)| if *v > logits[best] { i } else { best }) as u32
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn load(ctx: usize) -> Option<LlamaModel> {
    let path = gemma_model()?;
    let mut file = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    Some(LlamaModel::load(&content, &mut file, ctx).unwrap())
}

/// A 2,100-token prompt in one step: the ring runs it as passes of 512 (the third
/// one's windows wrap around the ring) and decode steps from position 2,100 on read
/// windows that wrap too; every logit equals the full cache's, which runs the prompt
/// as one pass. The rings keep only the last 1,024 positions: the block store reads
/// no rows before them, and the attention inspector gets no keys.
#[test]
fn a_ring_gives_the_full_cache_logits_bit_for_bit() {
    let Some(model) = load(4096) else { return };
    let p = &model.params;
    assert_eq!((p.swa_window, p.n_layer), (512, 18), "Gemma 3 270M");
    let mut full = KvCache::new(p, 4096);
    let mut ring = KvCache::windowed(p, 4096, SWA_PASS);
    assert_eq!(ring.ring(), Some(512 + SWA_PASS));
    assert_eq!(
        (full.ring(), full.max_pass(), ring.max_pass()),
        (None, usize::MAX, SWA_PASS)
    );

    let prompt = ids(2100);
    let (mut a, mut b) = (
        model.forward(&mut full, &prompt, 0),
        model.forward(&mut ring, &prompt, 0),
    );
    assert!(same_bits(&a, &b), "prompt logits, ring vs full");
    for step in 0..4 {
        let next = argmax(&a);
        let pos = prompt.len() + step;
        a = model.forward(&mut full, &[next], pos);
        b = model.forward(&mut ring, &[next], pos);
        assert!(same_bits(&a, &b), "decode step {step}, ring vs full");
    }
    let end = prompt.len() + 4;
    assert_eq!(ring.ring_start(), end - 1024);
    // A step within the ring's reach resumes; one whose window left it cannot.
    assert_eq!(ring.resumable(end - SWA_PASS), end - SWA_PASS);
    assert_eq!(ring.resumable(end - 1024 + 511), end - 1024 + 511);
    assert_eq!(ring.resumable(end - 1024 + 510), 0);
    assert_eq!(full.resumable(5), 5);

    // Rows for the block store: what the rings still hold reads the same as the full
    // cache; older blocks read as nothing.
    let first = ring.ring_start().div_ceil(BLOCK_TOKENS);
    assert!(ring.read_rows((first - 1) * BLOCK_TOKENS, BLOCK_TOKENS, p).is_none());
    for b in [first, end / BLOCK_TOKENS - 1] {
        let rows = ring.read_rows(b * BLOCK_TOKENS, BLOCK_TOKENS, p).expect("held");
        assert_eq!(
            Some(rows),
            full.read_rows(b * BLOCK_TOKENS, BLOCK_TOKENS, p),
            "block {b}"
        );
    }
    assert!(full.keys(end, p).is_some());
    assert!(ring.keys(end, p).is_none(), "keys the ring lost");
    assert!(ring.keys(10, p).is_none(), "positions the ring lost");
}

/// A long step split into passes gives one pass's logits, through the engine's
/// `Forward`; a step whose window left the ring is refused (no wrong answer), while
/// a copied prefix and rows written from block-store-sized blocks continue exactly
/// as the original.
#[test]
fn split_steps_copies_and_written_rows_continue_like_one_pass() {
    let Some(model) = load(4096) else { return };
    let mut fwd = CpuForward::new(model, 3);
    assert_eq!(
        fwd.caches[0].ring(),
        Some(1024),
        "SWITCHYARD_SWA_FULL must be unset for this test"
    );
    let prompt = ids(1700);

    // Sequence 0: the prompt in one step (four passes inside). Sequence 1: the same
    // prompt in chunks of 100 (one pass each, as chunked prefill feeds it).
    let whole = fwd.forward_batch(&[step(0, &prompt, 0)]).unwrap().remove(0);
    let mut chunked = Vec::new();
    for c in (0..prompt.len()).step_by(100) {
        let end = (c + 100).min(prompt.len());
        chunked = fwd.forward_batch(&[step(1, &prompt[c..end], c)]).unwrap().remove(0);
    }
    assert!(same_bits(&whole, &chunked), "one long step vs chunks");

    // Going back 600 positions leaves the window; going back 400 does not.
    let err = fwd.forward_batch(&[step(0, &prompt[1100..1101], 1100)]).unwrap_err();
    assert!(err.to_string().contains("no longer hold"), "{err}");
    assert_eq!(fwd.resumable(0, 1100), 0);
    assert_eq!(fwd.resumable(0, 1300), 1300);
    let redo = fwd.forward_batch(&[step(0, &prompt[1300..], 1300)]).unwrap().remove(0);
    assert!(same_bits(&whole, &redo), "resumed within the ring");

    // Copying positions 0..1699 into sequence 2, then the last token.
    assert!(fwd.copy_prefix(0, 2, 1699));
    let copied = fwd.forward_batch(&[step(2, &prompt[1699..], 1699)]).unwrap().remove(0);
    assert!(same_bits(&whole, &copied), "after copy_prefix");

    // Blocks of 32 read from sequence 1 while it is short, written into sequence 2
    // from 0 (starting it over), then the rest computed: the rings wrap over written rows.
    let head = 640;
    fwd.forward_batch(&[step(1, &prompt[..head], 0)]).unwrap();
    assert_eq!(
        fwd.kv_bytes(head),
        head * fwd.kv_bytes_per_token() + 15 * 2 * 2 * 256 * head
    );
    for b in 0..head / BLOCK_TOKENS {
        let (k, v) = fwd
            .read_rows(1, b * BLOCK_TOKENS, BLOCK_TOKENS)
            .expect("a short sequence's rows");
        assert!(fwd.write_rows(2, b * BLOCK_TOKENS, BLOCK_TOKENS, &k, &v), "block {b}");
    }
    let restored = fwd.forward_batch(&[step(2, &prompt[head..], head)]).unwrap().remove(0);
    assert!(same_bits(&whole, &restored), "after write_rows");
    // The rings no longer hold position 0: rows there neither read nor continue.
    assert!(fwd.read_rows(2, 0, BLOCK_TOKENS).is_none());
    let (k, v) = fwd.read_rows(1, BLOCK_TOKENS, BLOCK_TOKENS).unwrap();
    assert!(!fwd.write_rows(2, BLOCK_TOKENS, BLOCK_TOKENS, &k, &v));
    assert!(fwd.cached_keys(2, prompt.len()).is_none());
    assert!(fwd.cached_keys(1, head).is_some());
}

fn step(seq: usize, tokens: &[u32], pos: usize) -> SeqStep<'_> {
    SeqStep::new(seq, tokens, pos)
}

/// Greedy ids and metrics of `prompt` (token ids).
async fn run(model: &EngineModel, prompt: &[u32], n: u32) -> (Vec<u32>, GenerateMetrics) {
    greedy_ids(model, Prompt::Tokens(prompt.to_vec()), n).await
}

fn paragraphs(n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "Paragraph {i}. The river flows past the old mill at dawn, and the town of {} grows \
                 around it year after year. ",
                ["Ash", "Birch", "Cedar", "Dale", "Elm"][i % 5]
            )
        })
        .collect()
}

fn engine(slots: u32, store_mb: u32) -> Option<EngineModel> {
    let config = LoadConfig {
        parallel_slots: slots,
        context_len: 4096,
        kv_cache_mb: store_mb,
        ..LoadConfig::default()
    };
    Some(EngineModel::load(&gemma_model()?, &config).unwrap())
}

/// One slot with a long conversation: a prompt sharing most of it resumes within
/// the ring; one sharing only its head (a system prompt) starts over, where a cache
/// of every position would have reused the head (llama.cpp without `--swa-full` does
/// the same). Both answers equal a cold engine's. Sessions follow the same rule, and
/// the attention inspector refuses positions the ring lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_whose_window_left_the_ring_is_computed_again() {
    let Some(warm) = engine(1, 0) else { return };
    let cold = engine(1, 0).unwrap();
    let long = warm.tokenizer().encode(&paragraphs(70)).unwrap();
    assert!(long.len() > 1600, "{} tokens", long.len());
    let (_, m) = run(&warm, &long, 4).await;
    assert_eq!(m.cached_tokens, 0);

    // The inspector: these positions' keys are gone from the local layers.
    let err = warm.inspect_attention(Prompt::Tokens(long.clone())).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert!(err.to_string().contains("sliding window"), "{err}");

    // Back 300 tokens and a new ending: resumed.
    let near = [&long[..long.len() - 300], &[108, 3689, 236787]].concat();
    let (near_ids, m) = run(&warm, &near, 6).await;
    assert_eq!(m.cached_tokens as usize, common_prefix(&long, &near), "{m:?}");
    assert!(m.cached_tokens as usize >= long.len() - 300, "{m:?}");
    assert_eq!(near_ids, run(&cold, &near, 6).await.0, "resumed vs cold");

    // Only the head shared: computed from 0.
    let far = [&long[..200], &[108, 3689, 236787]].concat();
    assert!(common_prefix(&long, &far) >= 200);
    let (far_ids, m) = run(&warm, &far, 6).await;
    assert_eq!(m.cached_tokens, 0, "{m:?}");
    assert_eq!(far_ids, run(&cold, &far, 6).await.0, "started over vs cold");
    // Now the slot holds a short sequence: its head is reusable again.
    let (_, m) = run(&warm, &[&long[..200], &[108]].concat(), 1).await;
    assert_eq!(m.cached_tokens, 200, "{m:?}");
    drop(warm);

    // A session: cutting back within the ring keeps the prefix, further does not.
    let Some(many) = engine(2, 0) else { return };
    let session = many.open_session().await.unwrap();
    let u = session.set_resident(long.clone(), false).await.unwrap();
    assert_eq!((u.reused, u.computed), (0, long.len() as u32));
    let u = session
        .set_resident(long[..long.len() - 300].to_vec(), false)
        .await
        .unwrap();
    assert_eq!((u.reused, u.computed), (long.len() as u32 - 300, 0), "{u:?}");
    let u = session.set_resident(long[..200].to_vec(), false).await.unwrap();
    assert_eq!(
        (u.reused, u.computed, u.dropped),
        (0, 200, long.len() as u32 - 300),
        "{u:?}"
    );
    let mut decoded = Vec::new();
    let mut events = session.decode(
        GenerateConfig {
            max_tokens: 6,
            ..GenerateConfig::default()
        },
        CancelFlag::new(),
    );
    while let Some(ev) = events.next().await {
        if let GenerateEvent::Token(t) = ev.unwrap() {
            decoded.push(t.id);
        }
    }
    assert_eq!(decoded, run(&cold, &long[..200], 6).await.0, "session decode vs cold");
}

/// The block store with rings: blocks saved while the slot was short come back and
/// the rings continue from them over positions they wrap; the blocks a long
/// sequence's own passes push out of the rings are saved as they leave, so a prompt
/// sharing only its head (a system prompt) gets the head back from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_blocks_come_back_into_a_ring() {
    let Some(store) = engine(1, 64) else { return };
    let cold = engine(1, 0).unwrap();
    let text = store.tokenizer().encode(&paragraphs(100)).unwrap();
    // Long enough that the rings lose blocks past the head: 900 + 1,024 + a block.
    assert!(text.len() > 900 + 1024 + 64, "{} tokens", text.len());
    let head = &text[..900];
    let other = store.tokenizer().encode("def fibonacci(n):\n    return n").unwrap();
    run(&store, head, 2).await;
    run(&store, &other, 2).await; // saves the head's blocks
    let blocks = head.len() / BLOCK_TOKENS;
    let (ids, m) = run(&store, &text, 6).await;
    assert_eq!(m.cached_tokens as usize, blocks * BLOCK_TOKENS, "{m:?}");
    let (cold_ids, _) = run(&cold, &text, 6).await;
    assert_eq!(ids, cold_ids, "restored into a ring vs cold");

    // Only the head shared, past what the head run stored: the blocks from 900 to
    // 1,000 left the rings while the long prompt was prefilled (its rings now start
    // past 1,000) and were saved then.
    let far = [&text[..1000], &[108, 3689, 236787]].concat();
    let (far_ids, m) = run(&store, &far, 6).await;
    assert_eq!(m.cached_tokens as usize, 1000 / BLOCK_TOKENS * BLOCK_TOKENS, "{m:?}");
    assert_eq!(far_ids, run(&cold, &far, 6).await.0, "restored head vs cold");

    // The long sequence was overwritten by `far`: its tail was still in the rings
    // and its head in the store, so all of it comes back.
    run(&store, &other, 2).await;
    let (again, m) = run(&store, &text, 6).await;
    assert_eq!(
        m.cached_tokens as usize,
        (text.len() - 1) / BLOCK_TOKENS * BLOCK_TOKENS,
        "{m:?}"
    );
    assert_eq!(again, cold_ids);
}
