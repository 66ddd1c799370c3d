//! The decoder-only transformer forward pass on our own kernels, for the Llama, Qwen
//! 2/3 and Gemma 3 families: RMSNorm, RoPE (ggml's "normal" or NeoX pairing, θ
//! computed by repeated multiplication as ggml does), grouped-query attention over an
//! f16 KV cache, SwiGLU or GeGLU feed-forward. Activations entering a quantized matmul
//! are quantized per block like ggml; K, V, Q and the attention weights are rounded to
//! f16 where llama.cpp's non-flash-attention path rounds them.
//!
//! Gemma 3 adds: embeddings scaled by √n_embd, RMSNorm on Q and K per head, norms
//! after attention and after the feed-forward block, GELU (tanh form, through ggml's
//! f16 table), and sliding-window attention on five layers of every six with their own
//! RoPE base (llama.cpp's `LLAMA_SWA_TYPE_STANDARD`, pattern 6).

use crate::kernels::simd::Kernels;
use crate::kernels::team;
use crate::kernels::tensor::{load, QMatrix, TensorError};
use candle_core::quantized::gguf_file;

pub use super::kv_cache::{KvCache, SWA_PASS};
use super::lora::{LoraAdapter, Proj};
pub use super::params::{FfnAct, LlamaParams, ARCHITECTURES};
use super::rope::RopeTable;

struct Layer {
    attn_norm: Vec<f32>,
    wq: QMatrix,
    wk: QMatrix,
    wv: QMatrix,
    wo: QMatrix,
    ffn_norm: Vec<f32>,
    w_gate: QMatrix,
    w_up: QMatrix,
    w_down: QMatrix,
    /// Qwen2: biases of the Q, K, V projections.
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    /// Qwen3: RMSNorm weights applied per head to Q and K before RoPE.
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    /// Gemma 3: RMSNorm weights of the attention output and the feed-forward output.
    post_attn_norm: Option<Vec<f32>>,
    post_ffn_norm: Option<Vec<f32>>,
}

/// The weights; each sequence's keys and values live in its own [`KvCache`].
pub struct LlamaModel {
    /// The shape; on a pipeline stage (`model::stage`) `n_layer` counts the layers
    /// it holds, so its KV caches hold those layers only.
    pub params: LlamaParams,
    /// The token embeddings; `None` on a pipeline stage that does not start the
    /// model (it takes hidden states instead of tokens).
    pub(super) embd: Option<QMatrix>,
    layers: Vec<Layer>,
    /// The global index of `layers[0]` (0 but on a later pipeline stage).
    pub(super) first: usize,
    /// The output norm's weights; empty on a stage that does not end the model.
    out_norm: Vec<f32>,
    /// The output projection; `None` when it is tied to the token embeddings.
    output: Option<QMatrix>,
    /// Positions each sequence's cache holds.
    ctx: usize,
    /// Whether sliding-window layers keep every position instead of a ring
    /// (`SWITCHYARD_SWA_FULL=1`, like llama.cpp's `--swa-full`).
    swa_full: bool,
}

/// One sequence's part of a batched forward pass: `tokens` go at positions
/// `pos..pos + tokens.len()` of `cache` (anything beyond `pos` is overwritten).
pub struct Step<'a> {
    pub cache: &'a mut KvCache,
    pub tokens: &'a [u32],
    pub pos: usize,
    /// How many of the step's last positions want logits (1 but when verifying
    /// drafted tokens: then every drafted position does).
    pub outputs: usize,
    /// The LoRA adapter the sequence runs with (its updates apply to its rows only).
    pub lora: Option<&'a LoraAdapter>,
}

impl LlamaModel {
    /// Loads weights from a GGUF file whose `general.architecture` is one of
    /// [`ARCHITECTURES`], with a KV cache for `ctx` positions.
    pub fn load<R: std::io::Read + std::io::Seek>(
        ct: &gguf_file::Content,
        reader: &mut R,
        ctx: usize,
    ) -> Result<Self, TensorError> {
        let params = LlamaParams::from_gguf(ct)?;
        Self::from_tensors(params, &mut |name: &str| load(ct, reader, name), ctx)
    }

    /// Builds the model from `params` and tensors fetched by their GGUF names
    /// (`token_embd.weight`, `blk.{i}.attn_q.weight`, …), with a KV cache for `ctx`
    /// positions. `params.n_vocab` is taken from the embedding matrix.
    pub fn from_tensors(
        params: LlamaParams,
        load_t: &mut dyn FnMut(&str) -> Result<QMatrix, TensorError>,
        ctx: usize,
    ) -> Result<Self, TensorError> {
        let all = 0..params.n_layer;
        Self::from_tensors_span(params, load_t, ctx, all, true)
    }

    /// [`Self::from_tensors`] holding only the layers `span` (global indices), and
    /// the token embeddings, output norm and output projection only when `ends`
    /// (the first stage of a pipeline, which embeds and samples).
    pub(super) fn from_tensors_span(
        mut params: LlamaParams,
        load_t: &mut dyn FnMut(&str) -> Result<QMatrix, TensorError>,
        ctx: usize,
        span: std::ops::Range<usize>,
        ends: bool,
    ) -> Result<Self, TensorError> {
        let gemma = params.arch == "gemma3";
        let (embd, output) = if ends {
            let embd = load_t("token_embd.weight")?;
            params.n_vocab = embd.rows;
            let output = match load_t("output.weight") {
                Ok(m) => Some(m),
                Err(TensorError::Missing(_)) => None,
                Err(e) => return Err(e),
            };
            (Some(embd), output)
        } else {
            (None, None)
        };
        let mut layers = Vec::with_capacity(span.len());
        for i in span.clone() {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: load_t(&p("attn_norm"))?.to_f32(),
                wq: load_t(&p("attn_q"))?,
                wk: load_t(&p("attn_k"))?,
                wv: load_t(&p("attn_v"))?,
                wo: load_t(&p("attn_output"))?,
                ffn_norm: load_t(&p("ffn_norm"))?.to_f32(),
                w_gate: load_t(&p("ffn_gate"))?,
                w_up: load_t(&p("ffn_up"))?,
                w_down: load_t(&p("ffn_down"))?,
                bq: optional(load_t(&format!("blk.{i}.attn_q.bias")))?,
                bk: optional(load_t(&format!("blk.{i}.attn_k.bias")))?,
                bv: optional(load_t(&format!("blk.{i}.attn_v.bias")))?,
                q_norm: optional(load_t(&p("attn_q_norm")))?,
                k_norm: optional(load_t(&p("attn_k_norm")))?,
                post_attn_norm: optional(load_t(&p("post_attention_norm")))?,
                post_ffn_norm: optional(load_t(&p("post_ffw_norm")))?,
            });
            let l = layers.last().expect("pushed");
            if gemma && (l.post_attn_norm.is_none() || l.post_ffn_norm.is_none()) {
                return Err(TensorError::Missing(format!(
                    "blk.{i}.post_attention_norm / post_ffw_norm"
                )));
            }
        }
        let out_norm = if ends {
            load_t("output_norm.weight")?.to_f32()
        } else {
            Vec::new()
        };
        params.n_layer = span.len();
        Ok(Self {
            params,
            embd,
            layers,
            first: span.start,
            out_norm,
            output,
            ctx,
            swa_full: std::env::var_os("SWITCHYARD_SWA_FULL").is_some_and(|v| v != "0"),
        })
    }

    /// Positions each sequence's cache holds.
    pub fn context_len(&self) -> usize {
        self.ctx
    }

    /// An empty cache for one sequence: sliding-window layers keep a ring of
    /// `window + SWA_PASS` rows unless `SWITCHYARD_SWA_FULL` is set.
    pub fn new_cache(&self) -> KvCache {
        if self.swa_full {
            KvCache::new(&self.params, self.ctx)
        } else {
            KvCache::windowed(&self.params, self.ctx, SWA_PASS)
        }
    }

    /// Runs `tokens` at positions `pos..pos + n` of `cache` and returns the logits
    /// of the last one.
    pub fn forward(&self, cache: &mut KvCache, tokens: &[u32], pos: usize) -> Vec<f32> {
        let mut steps = [Step {
            cache,
            tokens,
            pos,
            outputs: 1,
            lora: None,
        }];
        self.forward_batch(&mut steps).pop().unwrap_or_default()
    }

    /// One pass over several sequences at once: their rows go through every matmul
    /// together (each weight block is read once for all of them), attention runs per
    /// sequence over its own cache. Returns the logits of each step's last
    /// `outputs` positions, step after step, in order.
    /// A row's arithmetic does not depend on its neighbours, so a sequence gets the
    /// same logits batched as alone.
    ///
    /// A step longer than its cache takes in one pass ([`KvCache::max_pass`], caches
    /// with rings) runs its leading tokens in passes of that many first, without
    /// logits; the same arithmetic row by row, so the same logits as one pass.
    pub fn forward_batch(&self, steps: &mut [Step<'_>]) -> Vec<Vec<f32>> {
        team::awake(|| self.passes(steps, Out::Logits))
    }

    /// [`Self::forward_batch`], returning instead of logits the final hidden states
    /// (after the output norm, `n_embd` values) of each step's last `outputs`
    /// positions: what embeddings pool.
    pub fn hidden_batch(&self, steps: &mut [Step<'_>]) -> Vec<Vec<f32>> {
        team::awake(|| self.passes(steps, Out::Hidden))
    }

    /// [`Self::forward_batch`]'s passes, with the compute team awake around them.
    fn passes(&self, steps: &mut [Step<'_>], out: Out) -> Vec<Vec<f32>> {
        for s in steps.iter() {
            assert!(!s.tokens.is_empty(), "a step without tokens");
            assert!(
                s.pos + s.tokens.len() <= s.cache.context_len(),
                "forward beyond the KV cache"
            );
            assert!(
                (1..=s.tokens.len().min(s.cache.max_pass())).contains(&s.outputs),
                "a step wants logits of {} of its {} positions (at most {} in one pass)",
                s.outputs,
                s.tokens.len(),
                s.cache.max_pass()
            );
            assert_eq!(
                s.cache.resumable(s.pos),
                s.pos,
                "a step at {} after its sliding window left the ring",
                s.pos
            );
        }
        let mut rest: Vec<(&[u32], usize)> = steps.iter().map(|s| (s.tokens, s.pos)).collect();
        loop {
            let mut lead = Vec::new();
            for (s, (tokens, pos)) in steps.iter_mut().zip(&mut rest) {
                // The positions that want logits stay in the last pass.
                let max = s.cache.max_pass().min(tokens.len() - s.outputs);
                if tokens.len() > s.cache.max_pass() && max > 0 {
                    lead.push(Step {
                        cache: &mut *s.cache,
                        tokens: &tokens[..max],
                        pos: *pos,
                        outputs: 0,
                        lora: s.lora,
                    });
                    *tokens = &tokens[max..];
                    *pos += max;
                }
            }
            if lead.is_empty() {
                break;
            }
            self.pass(&mut lead, Out::Nothing);
        }
        let mut last: Vec<Step<'_>> = steps
            .iter_mut()
            .zip(rest)
            .map(|(s, (tokens, pos))| Step {
                cache: &mut *s.cache,
                tokens,
                pos,
                outputs: s.outputs,
                lora: s.lora,
            })
            .collect();
        self.pass(&mut last, out)
    }

    /// One forward pass; what `out` asks of each step's last `outputs` positions.
    fn pass(&self, steps: &mut [Step<'_>], out: Out) -> Vec<Vec<f32>> {
        match self.layer_pass(steps, None, out) {
            Some((rows, m)) => self.finish(&rows, m, out),
            None => Vec::new(),
        }
    }

    /// The layers this model holds over the steps' rows: from their tokens'
    /// embeddings, or from `input` (the hidden states of every row, as the stage
    /// before returned them). Returns, unless `out` is [`Out::Nothing`], the hidden
    /// states (before the output norm) of the rows `out` keeps — every row for
    /// [`Out::Rows`], else each step's last `outputs` — and how many rows that is.
    pub(super) fn layer_pass(
        &self,
        steps: &mut [Step<'_>],
        input: Option<Vec<f32>>,
        out: Out,
    ) -> Option<(Vec<f32>, usize)> {
        let p = &self.params;
        let kern = Kernels::active();
        for s in steps.iter_mut() {
            s.cache.wrote(s.pos, s.tokens.len());
        }
        // Row r of the batch is token `tokens[t]` of step `owner[r]` at `positions[r]`.
        let positions: Vec<usize> = steps.iter().flat_map(|s| s.pos..s.pos + s.tokens.len()).collect();
        let n = positions.len();
        let (d, hd) = (p.n_embd, p.head_dim);
        let kv_d = p.n_head_kv * hd;
        let q_d = p.q_dim();
        let mut x = match input {
            Some(x) => {
                assert_eq!(x.len(), n * d, "hidden states for {n} rows of {d}");
                x
            }
            None => {
                let embd = self
                    .embd
                    .as_ref()
                    .expect("a pass from tokens on a stage without the embeddings");
                let mut x = vec![0.0f32; n * d];
                for (r, &tok) in steps.iter().flat_map(|s| s.tokens).enumerate() {
                    embd.row_f32(tok as usize, &mut x[r * d..(r + 1) * d]);
                }
                if let Some(s) = p.embd_scale {
                    x.iter_mut().for_each(|v| *v *= s);
                }
                x
            }
        };
        let mut xn = vec![0.0f32; n * d];
        let mut q = vec![0.0f32; n * q_d];
        let mut k = vec![0.0f32; n * kv_d];
        let mut v = vec![0.0f32; n * kv_d];
        let mut attn = vec![0.0f32; n * q_d];
        let mut proj = vec![0.0f32; n * d];
        let mut normed = vec![0.0f32; n * d];
        let mut gate = vec![0.0f32; n * p.n_ff];
        let mut up = vec![0.0f32; n * p.n_ff];
        let rope_global = RopeTable::new(p, p.rope_base, &positions);
        let rope_local = (p.swa_window > 0).then(|| RopeTable::new(p, p.rope_base_swa, &positions));
        for (li, layer) in self.layers.iter().enumerate() {
            // Global index: LoRA adapters and the sliding-window pattern count from
            // the model's first layer; the cache from the stage's.
            let gl = self.first + li;
            let swa = p.is_swa(gl);
            let rope = match (&rope_local, swa) {
                (Some(r), true) => r,
                _ => &rope_global,
            };
            rms_norm(&x, &layer.attn_norm, p.rms_eps, d, &mut xn);
            let act = layer.wq.prepare(&xn, n);
            layer.wq.matmul(&act, n, &mut q);
            lora(steps, gl, Proj::Q, &xn, &mut q);
            let act_k = if layer.wk.same_input_kind(&layer.wq) {
                act
            } else {
                layer.wk.prepare(&xn, n)
            };
            layer.wk.matmul(&act_k, n, &mut k);
            lora(steps, gl, Proj::K, &xn, &mut k);
            let act_v = if layer.wv.same_input_kind(&layer.wk) {
                act_k
            } else {
                layer.wv.prepare(&xn, n)
            };
            layer.wv.matmul(&act_v, n, &mut v);
            lora(steps, gl, Proj::V, &xn, &mut v);
            add_bias(&mut q, layer.bq.as_deref());
            add_bias(&mut k, layer.bk.as_deref());
            add_bias(&mut v, layer.bv.as_deref());
            if let Some(w) = &layer.q_norm {
                let rows = q.clone();
                rms_norm(&rows, w, p.rms_eps, hd, &mut q);
            }
            if let Some(w) = &layer.k_norm {
                let rows = k.clone();
                rms_norm(&rows, w, p.rms_eps, hd, &mut k);
            }
            rope.apply(&mut q, p.n_head, hd);
            rope.apply(&mut k, p.n_head_kv, hd);
            let mut row = 0;
            for s in steps.iter_mut() {
                let rows = s.tokens.len();
                for t in 0..rows {
                    for h in 0..p.n_head_kv {
                        let src = (row + t) * kv_d + h * hd;
                        let (kd, vd) = s.cache.row_mut(li, h, s.pos + t);
                        (kern.to_f16)(&k[src..src + hd], kd);
                        (kern.to_f16)(&v[src..src + hd], vd);
                    }
                }
                super::attention::attention(
                    p,
                    &q[row * q_d..(row + rows) * q_d],
                    s.cache.view(li),
                    s.pos,
                    if swa { p.swa_window } else { 0 },
                    &mut attn[row * q_d..(row + rows) * q_d],
                );
                row += rows;
            }
            let act = layer.wo.prepare(&attn, n);
            layer.wo.matmul(&act, n, &mut proj);
            lora(steps, gl, Proj::O, &attn, &mut proj);
            add_residual(
                &mut x,
                &mut proj,
                layer.post_attn_norm.as_deref(),
                p.rms_eps,
                &mut normed,
            );
            rms_norm(&x, &layer.ffn_norm, p.rms_eps, d, &mut xn);
            let act = layer.w_gate.prepare(&xn, n);
            layer.w_gate.matmul(&act, n, &mut gate);
            lora(steps, gl, Proj::Gate, &xn, &mut gate);
            let act_u = if layer.w_up.same_input_kind(&layer.w_gate) {
                act
            } else {
                layer.w_up.prepare(&xn, n)
            };
            layer.w_up.matmul(&act_u, n, &mut up);
            lora(steps, gl, Proj::Up, &xn, &mut up);
            match p.ffn_act {
                FfnAct::Silu => elementwise_rows(&mut gate, &up, p.n_ff, n, kern.silu_mul),
                FfnAct::Gelu => elementwise_rows(&mut gate, &up, p.n_ff, n, kern.gelu_mul),
            }
            let act = layer.w_down.prepare(&gate, n);
            layer.w_down.matmul(&act, n, &mut proj);
            lora(steps, gl, Proj::Down, &gate, &mut proj);
            add_residual(
                &mut x,
                &mut proj,
                layer.post_ffn_norm.as_deref(),
                p.rms_eps,
                &mut normed,
            );
        }
        match out {
            Out::Nothing => return None,
            Out::Rows => return Some((x, n)),
            _ => {}
        }
        // Only each step's last `outputs` positions need logits.
        let m: usize = steps.iter().map(|s| s.outputs).sum();
        let mut last = vec![0.0f32; m * d];
        let (mut end, mut i) = (0, 0);
        for s in steps.iter() {
            end += s.tokens.len();
            let rows = &x[(end - s.outputs) * d..end * d];
            last[i * d..i * d + rows.len()].copy_from_slice(rows);
            i += s.outputs;
        }
        Some((last, m))
    }

    /// The output norm over `m` rows of final hidden states, then what `out` asks:
    /// those rows' logits, the normed rows ([`Out::Hidden`]), or the rows as they
    /// are ([`Out::Last`]).
    pub(super) fn finish(&self, last: &[f32], m: usize, out: Out) -> Vec<Vec<f32>> {
        let p = &self.params;
        let d = p.n_embd;
        if out == Out::Last {
            return last.chunks_exact(d).map(<[f32]>::to_vec).collect();
        }
        let mut normed = vec![0.0f32; m * d];
        rms_norm(last, &self.out_norm, p.rms_eps, d, &mut normed);
        if out == Out::Hidden {
            return normed.chunks_exact(d).map(<[f32]>::to_vec).collect();
        }
        let output = self
            .output
            .as_ref()
            .or(self.embd.as_ref())
            .expect("logits on a stage without the output projection");
        let act = output.prepare(&normed, m);
        let mut logits = vec![0.0f32; m * output.rows];
        output.matmul(&act, m, &mut logits);
        logits.chunks_exact(output.rows).map(<[f32]>::to_vec).collect()
    }
}

/// Adds each step's LoRA update of `proj` in `layer` to its rows of `out`, from its
/// rows of the projection's input `x`; rows over the compute pool.
fn lora(steps: &[Step<'_>], layer: usize, proj: Proj, x: &[f32], out: &mut [f32]) {
    use rayon::prelude::*;
    if steps.iter().all(|s| s.lora.is_none()) {
        return;
    }
    let rows: Vec<Option<&LoraAdapter>> = steps
        .iter()
        .flat_map(|s| std::iter::repeat_n(s.lora, s.tokens.len()))
        .collect();
    let (d_in, d_out) = (x.len() / rows.len(), out.len() / rows.len());
    x.par_chunks_exact(d_in)
        .zip(out.par_chunks_exact_mut(d_out))
        .zip(rows.par_iter())
        .for_each(|((xr, or), adapter)| {
            if let Some(adapter) = adapter {
                adapter.apply_row(layer, proj, xr, or);
            }
        });
}

/// What a pass returns for the positions that want outputs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Out {
    /// Nothing (the leading passes of a long step).
    Nothing,
    /// Every row's hidden state after the layers (for the next pipeline stage).
    Rows,
    /// The hidden states after the layers, before the output norm, of each step's
    /// last `outputs` positions (what a pipeline's last stage returns).
    Last,
    /// The logits.
    Logits,
    /// The hidden states after the output norm.
    Hidden,
}

/// `f(gate_row, up_row)` for each of the `n` rows of `width` values, over the rayon
/// pool when there are several (elementwise, so the split changes nothing).
fn elementwise_rows(gate: &mut [f32], up: &[f32], width: usize, n: usize, f: fn(&mut [f32], &[f32])) {
    use rayon::prelude::*;
    if n < 4 {
        f(gate, up);
        return;
    }
    gate.par_chunks_mut(width)
        .zip(up.par_chunks(width))
        .for_each(|(g, u)| f(g, u));
}

/// A tensor that may be absent (biases, Qwen3's norms), as f32 values.
fn optional(t: Result<QMatrix, TensorError>) -> Result<Option<Vec<f32>>, TensorError> {
    match t {
        Ok(m) => Ok(Some(m.to_f32())),
        Err(TensorError::Missing(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Adds a per-column bias to every row.
fn add_bias(x: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in x.chunks_exact_mut(b.len()) {
            for (v, bi) in row.iter_mut().zip(b) {
                *v += bi;
            }
        }
    }
}

/// `x += out`, with `out` first RMS-normalised by `norm` when the model has one
/// (Gemma 3's post-attention and post-feed-forward norms).
fn add_residual(x: &mut [f32], out: &mut [f32], norm: Option<&[f32]>, eps: f32, scratch: &mut [f32]) {
    let out: &[f32] = match norm {
        Some(w) => {
            rms_norm(out, w, eps, w.len(), scratch);
            &scratch[..out.len()]
        }
        None => out,
    };
    for (xi, oi) in x.iter_mut().zip(out) {
        *xi += oi;
    }
}

/// ggml's RMSNorm: the sum of squares in f64, the scale in f32, then the weight.
fn rms_norm(x: &[f32], w: &[f32], eps: f32, d: usize, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let sum: f64 = xr.iter().map(|v| (v * v) as f64).sum();
        let mean = (sum / d as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, v), wi) in or.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * wi;
        }
    }
}
