//! Greedy decoding against llama.cpp on the same GGUF: SmolLM2 (Llama, Q4_1) and
//! Gemma 3 270M (Q4_K_M: Q4_K, Q6_K, Q5_0, Q8_0).
//!
//! llama-server (temperature 0, its non-flash-attention path, `-fa off`, which our
//! attention follows) generates 32 tokens per prompt and reports the top-2
//! log-probabilities at each step. We then feed llama's own tokens through our engine
//! (teacher forcing), so every position is compared on the same context, and check:
//!
//! - our log-probability of llama's token is within [`MEAN_TOL`] of llama's on
//!   average and within the model's [`Bounds::max`] everywhere;
//! - where our argmax differs from llama's token, it is a near tie for both engines
//!   (top-2 gap under the model's [`Bounds::tie`] nats).
//!
//! Why not "32 identical tokens, always": these small models meet near ties within a
//! few dozen tokens, and there llama.cpp disagrees with itself. Switching llama-server
//! between its two attention paths (`-fa on` / `-fa off`) changes the greedy output
//! of 6 of 8 Gemma prompts and 4 of 8 SmolLM2 prompts within 32 tokens, with a mean
//! log-probability difference of 0.035–0.039 nats; ours against `-fa off` measures
//! 0.034–0.035 (Gemma 3 since its Q6_K matrices went the same way: 0.042). Some
//! prompts match llama.cpp exactly for all 32 tokens (SmolLM2: four of eight — five
//! while its Q4_1 matrices ran ggml's eight float lanes; once they finished each block
//! in integers, two prompts parted at near ties and one other joined, mean |Δ log p|
//! 0.035 either way; Gemma
//! 3: three — five with ggml's eight float lanes everywhere, two once its Q4_K and
//! Q6_K matrices computed one integer sum per super-block, three since its Q8_0 ones
//! (and the Q5_0 ones widened to Q8_0) do too, when the mean |Δ log p| went 0.042 →
//! 0.037 and the max 1.37 → 0.49; the softmax prompt now parts at step 2); those are
//! asserted to stay exact (any change in the arithmetic that moves a decision shows
//! up there). The others first differ at a near tie.
//!
//! The reference is a llama-server built for AVX2: switchyard's engine computes ggml's
//! AVX2 arithmetic whichever kernel variant the CPU runs (AVX2, AVX-VNNI, AVX-512,
//! portable), so the exact prompts hold on every host. Where the CPU has more than
//! AVX2, the `native` tests also compare against a `-march=native` llama-server by the
//! tolerance rules alone: its AVX-512 attention and softmax sum in other orders, which
//! moves near ties (ggml does not promise the same tokens across ISAs).

use candle_core::quantized::gguf_file;
use serde_json::json;
use std::path::Path;
use switchyard_engine::model::llama::LlamaModel;
use switchyard_testkit::*;

/// Tokens generated per prompt.
const STEPS: usize = 32;
/// Bound on the mean |Δ log p| of llama's token.
const MEAN_TOL: f32 = 0.06;

/// Per model: the bound on any single |Δ log p|, and the top-2 gap (nats) below which
/// a step is a near tie, where the engines may pick differently.
struct Bounds {
    max: f32,
    tie: f32,
}

/// SmolLM2's Q4_1 matrices finish each block in integers, as llama.cpp's Q4_0 and
/// Q4_K repacked kernels do (its Q4_1 kernel keeps eight float lanes).
const SMOLLM2: Bounds = Bounds { max: 1.0, tie: 0.75 };

/// Gemma 3's Q4_K and Q6_K matrices (its FFN-down projections) finish each super-block
/// in integers, closer to the exact product than llama.cpp's x86 row kernels (Q6_K:
/// 3.6× less error on average, [`gemma3_q6_k_products_are_closer_to_exact_than_ggmls_lanes`]).
/// The engines then part where Gemma amplifies a rounding difference — an activation
/// quantized to the next Q8 step flips a later decision — measured: max |Δ log p|
/// 1.34–1.37 and one teacher-forced step where llama.cpp's gap is 0.40–0.63 and our
/// margin the other way 1.67; the mean stays at 0.042. (Since its Q8_0 matrices also
/// finish blocks in integers: max 0.46–0.49, mean 0.037–0.039; the bounds are kept.)
const GEMMA3: Bounds = Bounds { max: 1.6, tie: 2.0 };

const PLAIN: &[&str] = switchyard_engine::REFERENCE_PROMPTS;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_greedy_matches_llama_server() {
    let Some(bin) = llama_server_bin() else { return };
    let chat = "<|im_start|>user\nWrite a haiku about the ocean.<|im_end|>\n<|im_start|>assistant\n";
    let exact = [PLAIN[2], PLAIN[3], PLAIN[5], chat];
    compare(&bin, &demo_model(), chat, &SMOLLM2, Some(&exact)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_agrees_with_a_native_llama_server() {
    let Some(bin) = native_llama_server_bin() else { return };
    let chat = "<|im_start|>user\nWrite a haiku about the ocean.<|im_end|>\n<|im_start|>assistant\n";
    compare(&bin, &demo_model(), chat, &SMOLLM2, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma3_agrees_with_a_native_llama_server() {
    let Some(bin) = native_llama_server_bin() else { return };
    let Some(model) = gemma_model() else { return };
    let chat = "<start_of_turn>user\nWrite a haiku about the ocean.<end_of_turn>\n<start_of_turn>model\n";
    compare(&bin, &model, chat, &GEMMA3, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma3_greedy_matches_llama_server() {
    let Some(bin) = llama_server_bin() else { return };
    let Some(model) = gemma_model() else { return };
    let chat = "<start_of_turn>user\nWrite a haiku about the ocean.<end_of_turn>\n<start_of_turn>model\n";
    let exact = [PLAIN[0], PLAIN[1], PLAIN[6]];
    compare(&bin, &model, chat, &GEMMA3, Some(&exact)).await;
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
async fn compare(bin: &Path, path: &Path, chat: &str, bounds: &Bounds, exact_prompts: Option<&[&str]>) {
    let server = LlamaServer::start_with(bin, path, 1, 1, &["-fa", "off"]).await.unwrap();
    let mut file = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let model = LlamaModel::load(&content, &mut file, 512).unwrap();
    let mut cache = model.new_cache();

    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let (mut exact, mut diffs, mut worst, mut broken) = (0, Vec::new(), 0.0f32, Vec::new());
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
                    step.gap < bounds.tie && our_margin < bounds.tie,
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
                if exact_prompts.is_some_and(|e| e.contains(prompt)) {
                    broken.push(format!("{prompt:?} (at step {i})"));
                }
            }
        }
    }
    let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
    eprintln!(
        "{name} vs {}: {exact}/{} prompts identical for {STEPS} greedy tokens; |Δ log p| mean {mean:.4}, max {worst:.4} \
         (kernels: {})",
        bin.display(),
        prompts.len(),
        switchyard_engine::kernels::isa::active()
    );
    assert!(
        broken.is_empty(),
        "{name}: these prompts used to match llama.cpp for all {STEPS} tokens and now differ: {}",
        broken.join(", ")
    );
    assert!(mean <= MEAN_TOL, "{name}: mean |Δ log p| {mean} > {MEAN_TOL}");
    assert!(worst <= bounds.max, "{name}: max |Δ log p| {worst} > {}", bounds.max);
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

/// Gemma 3's real Q6_K matrices (nine of its FFN-down projections) against heavy-tailed
/// activations: the engine's packed kernel and ggml's AVX2 arithmetic (eight float
/// lanes per cell, what llama.cpp runs for Q6_K on x86), each against the exact value
/// of the same quantized product (f64 over the same integers). Ours must be no further
/// from it, which is why [`GEMMA3`]'s bounds are wider than [`SMOLLM2`]'s.
#[test]
fn gemma3_q6_k_products_are_closer_to_exact_than_ggmls_lanes() {
    use std::io::{Read, Seek, SeekFrom};
    use switchyard_engine::kernels::kquants::{BlockQ6K, QK_K};
    use switchyard_engine::kernels::quants::h2f;
    use switchyard_engine::kernels::tensor::{load, QAct};
    let Some(path) = gemma_model() else { return };
    let mut f = std::fs::File::open(path).unwrap();
    let ct = gguf_file::Content::read(&mut f).unwrap();
    let mut names: Vec<&String> = ct
        .tensor_infos
        .iter()
        .filter(|(_, i)| i.ggml_dtype == candle_core::quantized::GgmlDType::Q6K)
        .map(|(n, _)| n)
        .collect();
    names.sort();
    assert!(!names.is_empty(), "Gemma 3 Q4_K_M holds Q6_K matrices");
    let (mut err_ours, mut err_ggml, mut size, mut closer, mut cells) = (0f64, 0f64, 0f64, 0usize, 0usize);
    let mut seed = 7u32;
    let mut uniform = || {
        seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
        seed as f32 / u32::MAX as f32
    };
    for name in names {
        let m = load(&ct, &mut f, name).unwrap();
        let nk = m.cols / QK_K;
        let info = &ct.tensor_infos[name];
        f.seek(SeekFrom::Start(ct.tensor_data_offset + info.offset)).unwrap();
        let mut raw = vec![0u8; m.rows * nk * 210];
        f.read_exact(&mut raw).unwrap();
        let blocks: Vec<BlockQ6K> = raw
            .chunks_exact(210)
            .map(|b| {
                let mut out = BlockQ6K::ZERO;
                out.ql.copy_from_slice(&b[..128]);
                out.qh.copy_from_slice(&b[128..192]);
                for (s, &v) in out.scales.iter_mut().zip(&b[192..208]) {
                    *s = v as i8;
                }
                out.d = u16::from_le_bytes([b[208], b[209]]);
                out
            })
            .collect();
        // One in a hundred activations a hundred times larger, as Gemma's are.
        let n = 4;
        let x: Vec<f32> = (0..n * m.cols)
            .map(|_| {
                let (u, v) = (uniform(), uniform() - 0.5);
                if u < 0.01 {
                    v * 400.0
                } else {
                    v * 4.0
                }
            })
            .collect();
        let act = m.prepare(&x, n);
        let QAct::Q8K(y, _) = &act else { unreachable!() };
        let mut out = vec![0f32; n * m.rows];
        m.matmul(&act, n, &mut out);
        for r in (0..m.rows).step_by(5) {
            for t in 0..n {
                let (mut exact, mut terms, mut lanes) = (0f64, 0f64, [0f32; 8]);
                for (a, b) in blocks[r * nk..(r + 1) * nk].iter().zip(&y[t * nk..(t + 1) * nk]) {
                    let (mut sum, mut lane) = (0i64, [0i32; 8]);
                    for v in 0..QK_K {
                        let (half, c, l) = (v / 128, v % 128 / 32, v % 32);
                        let low = (a.ql[64 * half + 32 * (c % 2) + l] >> (4 * (c / 2))) & 0xf;
                        let q = (low | ((a.qh[32 * half + l] >> (2 * c)) & 3) << 4) as i32;
                        let sc = a.scales[v / 16] as i32;
                        let p = sc * (q - 32) * b.qs[v] as i32;
                        sum += p as i64;
                        terms += (p as f64 * h2f(a.d) as f64 * b.d as f64).abs();
                        // ggml's lanes: the unsigned products by position in the
                        // 32-value chunk / 4, less 32 × sub-blocks 2l and 2l + 1.
                        lane[l / 4] += sc * q * b.qs[v] as i32;
                    }
                    for (l, s) in lane.iter_mut().enumerate() {
                        let (s0, s1) = (a.scales[2 * l] as i32, a.scales[2 * l + 1] as i32);
                        *s -= (b.bsums[2 * l] as i32 * s0 + b.bsums[2 * l + 1] as i32 * s1) << 5;
                    }
                    exact += sum as f64 * h2f(a.d) as f64 * b.d as f64;
                    let d = b.d * h2f(a.d);
                    for (acc, &v) in lanes.iter_mut().zip(&lane) {
                        *acc = d.mul_add(v as f32, *acc);
                    }
                }
                // `hsum_float_8`'s order.
                let h = [
                    lanes[4] + lanes[0],
                    lanes[5] + lanes[1],
                    lanes[6] + lanes[2],
                    lanes[7] + lanes[3],
                ];
                let ggml = ((h[0] + h[2]) + (h[1] + h[3])) as f64;
                let ours = out[t * m.rows + r] as f64;
                let (e_ours, e_ggml) = ((ours - exact).abs(), (ggml - exact).abs());
                err_ours += e_ours;
                err_ggml += e_ggml;
                size += terms;
                closer += usize::from(e_ours < e_ggml);
                cells += 1;
            }
        }
    }
    eprintln!(
        "{cells} cells: mean |error| / Σ|terms|: ours {:.2e}, ggml's lanes {:.2e}; ours closer in {closer}",
        err_ours / size,
        err_ggml / size
    );
    assert!(err_ours <= err_ggml, "ours {err_ours} vs ggml's lanes {err_ggml}");
}
