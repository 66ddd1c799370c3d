//! The `cuda` backend's native engine: switchyard's engine with the candle forward
//! pass ([`CandleForward`]). Without an NVIDIA GPU (as here) the pass runs on
//! candle's CPU device: the same code but the device. In a `cuda` build on a machine
//! with a GPU it runs on GPU 0 (`SWITCHYARD_TEST_CUDA=0` keeps it on the CPU).
//!
//! - Agreement with the CPU engine (the engine engine/tests/engine/greedy_reference.rs checks
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

use switchyard_bench::agree::{self, argmax, gap, TIE};

use common::*;
use std::path::Path;
use std::time::Duration;
use switchyard::node;
use switchyard::{Client, FinishReason, GenerateRequest, Message, StreamEvent};
use switchyard_backend::{BackendError, CancelFlag, Prompt};
use switchyard_messages::{ErrorCode, GenerateConfig};
use switchyard_workers::backends::llama_server::GpuVendor;
use switchyard_workers::engine::candle::{device, CandleForward, Placement};
use switchyard_workers::engine::model::forward::{CpuForward, Forward, SeqStep};
use switchyard_workers::engine::model::lora::LoraAdapter;
use switchyard_workers::engine::text::tokenizer::GgufTokenizer;

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
    agree::load_both(path, ctx, slots, placement()).unwrap()
}

fn step(seq: usize, tokens: &[u32], pos: usize) -> SeqStep<'_> {
    SeqStep::new(seq, tokens, pos)
}

fn one(f: &mut dyn Forward, seq: usize, tokens: &[u32], pos: usize) -> Vec<f32> {
    f.forward_batch(&[step(seq, tokens, pos)]).unwrap().pop().unwrap()
}

fn agreement(path: &Path, chat: &str) {
    agreement_with(path, chat, None)
}

/// `switchyard bench agree`'s comparison ([`agree::agreement`]), both passes running
/// slot 0 with the GGUF LoRA `adapter` when given, at the reference tests'
/// tolerances.
fn agreement_with(path: &Path, chat: &str, adapter: Option<&Path>) {
    let a = agree::agreement(path, placement(), chat, adapter, 32).unwrap();
    eprintln!("{a:?}");
    assert!(a.passes(), "{}: {:?}", a.model, a.failures());
}

/// LoRA on the candle pass: with an adapter, the same agreement with the CPU
/// engine; in one batch, a base slot and an adapter slot each get what they get alone.
#[test]
fn a_lora_adapter_on_candle_agrees_with_the_cpu_engine() {
    let dir = tempfile::tempdir().unwrap();
    let lora = make_lora(dir.path(), 1).join("adapter.gguf");
    agreement_with(&demo_model(), "Hello! How are you?", Some(&lora));

    let (own, mut candle, tok) = load_both(&demo_model(), 512, 2);
    let adapter = std::sync::Arc::new(LoraAdapter::load("one", &lora, &own.model.params, 1.0).unwrap());
    let tokens = tok.encode("The capital of France is").unwrap();
    let base = one(&mut candle, 0, &tokens, 0);
    assert!(candle.set_adapter(1, Some(adapter)));
    let adapted = one(&mut candle, 1, &tokens, 0);
    assert!(max_diff(&base, &adapted) > 0.1, "the adapter changes the logits");
    let both = candle
        .forward_batch(&[step(0, &tokens, 0), step(1, &tokens, 0)])
        .unwrap();
    assert!(max_diff(&both[0], &base) < 1e-3 && max_diff(&both[1], &adapted) < 1e-3);
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

    // Logits at every position (how speculative decoding checks drafted tokens):
    // those of each prefix run alone. candle's quantized matmul computes a pass of
    // up to 8 rows differently from a longer one (differences up to ~1 in the
    // logits here), so a prefix of 2–9 tokens is held to the reference tolerance:
    // the same argmax but at a near tie.
    let every = SeqStep {
        outputs: a.len(),
        ..step(0, &a, 0)
    };
    let rows = candle.forward_batch(&[every, step(1, &b, 0)]).unwrap();
    assert_eq!(rows.len(), a.len() + 1, "a's positions, then b's last");
    assert!(max_diff(&rows[a.len() - 1], &alone_a) <= tol);
    assert!(max_diff(&rows[a.len()], &alone_b) <= tol);
    for i in 0..a.len() {
        let head = one(&mut candle, 2, &a[..=i], 0);
        let d = max_diff(&rows[i], &head);
        assert!(d <= tol || (2..=9).contains(&(i + 1)), "position {i}: {d}");
        assert!(
            argmax(&rows[i]) == argmax(&head) || gap(&head) < TIE,
            "position {i}: argmax {} vs {}",
            argmax(&rows[i]),
            argmax(&head)
        );
    }

    // Beyond the context: an error, not a panic.
    let long = vec![1u32; 600];
    assert!(candle.forward_batch(&[step(0, &long, 0)]).is_err());
    assert!(candle.forward_batch(&[step(0, &a, 0), step(0, &b, 0)]).is_err());
}

const NAME: &str = "smol";

fn native_config(url: &str, id: &str, allow_cpu: bool) -> switchyard::Config {
    let mut c = fleet_config(url);
    c.worker.id = id.into();
    c.worker.model_name = NAME.into();
    c.worker.backend = "cuda".into();
    c.worker.cuda_engine = "native".into();
    c.worker.gpu_allow_cpu = allow_cpu;
    c.worker.gpu_device = if placement() == Placement::Cpu { 1 } else { 0 };
    c.worker.parallel_slots = 2;
    c.worker.context_len = 1024;
    c.validate().expect("valid config");
    c
}

fn request(prompt: &str, max_tokens: u32) -> GenerateRequest {
    let mut r = GenerateRequest::generate(Client::new_request_id(), NAME, prompt);
    r.config.max_tokens = max_tokens;
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_native_cuda_worker_streams_chat_stops_cancels_and_reuses_prefixes() {
    let nats = nats();
    let url = nats.url();
    let coordinator = node::start_coordinator(&fleet_config(&url)).await.unwrap();
    let config = native_config(&url, "w-native", true);
    let loaded = node::load(&config).await.expect("model loads");
    let worker = node::start_worker(&config, &loaded).await.expect("worker starts");
    let client = client(&url, Duration::from_secs(30)).await;
    wait_available(&client, "w-native", true, Duration::from_secs(15)).await;

    // Announced: backend cuda, the device (on the CPU here), its KV slots as capacity.
    let status = client.status().await.unwrap();
    let s = &status.workers[0].status;
    assert_eq!((s.backend.as_str(), s.capacity), ("cuda", 2));
    let info = &s.models[0].info;
    match placement() {
        Placement::Cpu => {
            assert_eq!(s.device, "cuda:1(cpu)");
            assert_eq!(info.kernels, "candle-cpu");
        }
        Placement::Cuda(_) => {
            assert_eq!(s.device, "cuda:0");
            assert!(info.kernels.starts_with("candle-cuda:0"), "{}", info.kernels);
        }
    }
    assert_eq!(info.context_len, 1024);

    // Greedy text, then the same prompt with a stop string cut before it.
    let free = client
        .generate(request("The capital of France is", 8))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(free.text.contains("Paris"), "{:?}", free.text);
    assert_eq!(free.worker_id, "w-native");
    let m = &free.metrics;
    assert!(m.prompt_tokens >= 5 && m.generated_tokens == 8, "{m:?}");
    assert!(m.prefill_tokens_per_sec > 0.0 && m.decode_tokens_per_sec > 0.0, "{m:?}");
    assert!(m.peak_memory_bytes > 0 && m.active_memory_bytes > 0, "{m:?}");
    // Classify (a prefill-only pass) picks the first greedy token; batch gives each
    // prompt the tokens it gets alone.
    let prompt = || Prompt::Text("The capital of France is".into());
    let classified = loaded
        .model
        .classify(vec![prompt()], true)
        .await
        .pop()
        .unwrap()
        .unwrap();
    assert_eq!(classified.token.id, free.tokens[0].id);
    assert_eq!(classified.logits.len(), info.vocab_size as usize);
    let greedy_cfg = GenerateConfig {
        max_tokens: 8,
        temperature: 0.0,
        ..GenerateConfig::default()
    };
    let batch = loaded
        .model
        .batch_generate(
            vec![prompt(), Prompt::Text("def fibonacci(n):".into())],
            greedy_cfg,
            CancelFlag::new(),
        )
        .await;
    let ids = |t: &[switchyard_messages::Token]| t.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(&batch[0].tokens), ids(&free.tokens));
    assert_eq!(batch[1].tokens.len(), 8, "{:?}", batch[1]);

    let mut stop = request("The capital of France is", 8);
    stop.config.stop = vec!["ari".into()];
    let stopped = client.generate(stop).await.unwrap().collect().await.unwrap();
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.text, free.text[..free.text.find("ari").unwrap()]);

    // Chat goes through the GGUF's template and ends at the end of the turn.
    let mut chat = GenerateRequest::chat(Client::new_request_id(), NAME, vec![Message::new("user", "Say hello.")]);
    chat.config.max_tokens = 48;
    let c = client.chat(chat).await.unwrap().collect().await.unwrap();
    assert!(
        !c.text.trim().is_empty() && !c.text.contains("<|im_end|>"),
        "{:?}",
        c.text
    );
    assert!(c.metrics.prompt_tokens > 20, "the template's system prompt is included");

    // A prompt that extends a served one reuses its prefix from the slot.
    let long = "The history of the printing press begins in the fifteenth century, when";
    let first = client
        .generate(request(long, 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(
        first.metrics.cached_tokens <= 1,
        "at most BOS is warm: {:?}",
        first.metrics
    );
    let again = client
        .generate(request(&format!("{long} Johannes Gutenberg"), 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(
        again.metrics.cached_tokens + 1 >= first.metrics.prompt_tokens,
        "{:?} after {:?}",
        again.metrics,
        first.metrics
    );

    // Cancel mid-stream.
    let mut stream = client.generate(request("Once upon a time", 400)).await.unwrap();
    let mut n = 0;
    while let Some(ev) = stream.next().await {
        match ev.unwrap() {
            StreamEvent::Tokens(t) => {
                let before = n;
                n += t.len();
                if before < 3 && n >= 3 {
                    stream.cancel().await.unwrap();
                }
            }
            StreamEvent::Done {
                finish_reason, metrics, ..
            } => {
                assert_eq!(finish_reason, FinishReason::Cancelled);
                assert!(metrics.generated_tokens < 400);
                break;
            }
        }
    }

    worker.shutdown(Duration::from_secs(5)).await;
    coordinator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_gpu_a_native_cuda_worker_refuses_clearly_and_the_fleet_routes_elsewhere() {
    if GpuVendor::Cuda.gpus().is_ok() {
        skip(
            Skip::Expected,
            "this machine has an NVIDIA GPU, so a cuda worker does not refuse",
        );
        return;
    }
    let fleet = fleet(|c| c.worker.id = "w-cpu".into()).await;
    let client = fleet.client().await;

    // In-process: loading refuses with `unavailable` naming the backend and what is
    // missing, before any weights are read.
    let config = native_config(&fleet.url, "w-native", false);
    let err = node::load(&config).await.err().expect("no GPU: refused");
    let backend_err = err.downcast_ref::<BackendError>().expect("a BackendError");
    assert!(matches!(backend_err, BackendError::Unavailable(_)), "{backend_err:?}");
    assert_eq!(backend_err.to_wire().code, ErrorCode::Unavailable);
    let msg = backend_err.to_string();
    assert!(
        msg.starts_with("backend unavailable: cuda: no /dev/nvidiactl") && msg.contains("gpu_allow_cpu"),
        "{msg}"
    );

    // The process says so and exits non-zero, so it never joins the fleet.
    let mut worker = switchyard(
        "worker",
        &[
            "--nats",
            &fleet.url,
            "worker",
            "--backend",
            "cuda",
            "--cuda-engine",
            "native",
        ],
    );
    worker.wait_for("backend unavailable: cuda: no /dev/nvidiactl", Duration::from_secs(20));
    assert!(!worker.child.wait().unwrap().success());

    // The fleet routes elsewhere; a request pinned to cuda finds no worker.
    assert_eq!(client.status().await.unwrap().workers.len(), 1);
    let free = client
        .generate(greedy("The capital of France is", 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!((free.worker_id.as_str(), free.tokens.len()), ("w-cpu", 4));
    let mut pinned = greedy("The capital of France is", 4);
    pinned.head.backend = Some("cuda".into());
    let err = ends_with_error(client.generate(pinned).await.unwrap()).await;
    assert_eq!(err.code(), Some(ErrorCode::NoWorker), "{err}");
}
