//! BERT-style encoders, the models RAG pipelines embed with (all-MiniLM-L6-v2,
//! bge-small, …): learned absolute positions, bidirectional attention, post-norm
//! blocks with biases and GELU, pooled into one vector per input.
//!
//! The pass is llama.cpp's `llm_build_bert` (`src/models/bert.cpp`): the sum of the
//! token, position and token-type-0 embeddings, then a LayerNorm; per block,
//! `LN(x + Wo·attn(x))` then `LN(x + Wdown·gelu(Wup·x))` (ggml's tanh GELU); mean, CLS
//! or last-token pooling; L2-normalised, as llama.cpp's `--embd-normalize 2` and
//! sentence-transformers' `Normalize` module do. There is no KV cache: a pass takes whole inputs, several at
//! once as one ragged batch (every input's rows in the same matmuls, attention within
//! each input only).
//!
//! Weights come by their GGUF names (`token_embd`, `blk.N.attn_q`, …) from a GGUF file
//! or, renamed, from a Hugging Face `BertModel` checkpoint ([`hf_name`]).

use crate::kernels::math::{gelu, softmax};
use crate::kernels::quants::h2f;
use crate::kernels::simd::Kernels;
use crate::kernels::tensor::{QData, QMatrix, TensorError};
use rayon::prelude::*;

pub use crate::pooling::Pooling;

/// An encoder's shape.
#[derive(Debug, Clone)]
pub struct BertParams {
    pub n_embd: usize,
    pub n_head: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    /// Learned positions: the longest input.
    pub n_ctx: usize,
    pub eps: f32,
    pub pooling: Pooling,
}

/// LayerNorm's scale and shift.
struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

/// A weight matrix and its optional bias.
struct Linear {
    w: QMatrix,
    b: Option<Vec<f32>>,
}

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    attn_norm: Norm,
    up: Linear,
    down: Linear,
    out_norm: Norm,
}

/// A loaded encoder.
pub struct BertModel {
    pub params: BertParams,
    tok: QMatrix,
    pos: QMatrix,
    /// Token type 0's row (llama.cpp feeds every token as type 0).
    type0: Option<Vec<f32>>,
    embd_norm: Norm,
    layers: Vec<Layer>,
}

/// Fetches a tensor by its GGUF name.
pub type Fetch<'a> = dyn FnMut(&str) -> Result<QMatrix, TensorError> + 'a;

/// F16 matrices are widened to F32 at load: the F32 kernel is vectorised, F16's is
/// not, and an encoder is small (all-MiniLM-L6-v2: 90 MB in F32).
fn widened(m: QMatrix) -> QMatrix {
    match m.data {
        QData::F16(v) => QMatrix {
            rows: m.rows,
            cols: m.cols,
            data: QData::F32(v.iter().map(|h| h2f(*h)).collect()),
        },
        _ => m,
    }
}

impl BertModel {
    /// Builds the model from tensors named as in GGUF.
    pub fn from_tensors(params: BertParams, fetch: &mut Fetch<'_>) -> Result<Self, TensorError> {
        let mut vector = |name: &str| fetch(name).map(|m| m.to_f32());
        let mut norm = |stem: &str| -> Result<Norm, TensorError> {
            Ok(Norm {
                w: vector(&format!("{stem}.weight"))?,
                b: vector(&format!("{stem}.bias"))?,
            })
        };
        let embd_norm = norm("token_embd_norm")?;
        let mut layers = Vec::with_capacity(params.n_layer);
        for i in 0..params.n_layer {
            let mut linear = |stem: &str| -> Result<Linear, TensorError> {
                let w = widened(fetch(&format!("blk.{i}.{stem}.weight"))?);
                let b = match fetch(&format!("blk.{i}.{stem}.bias")) {
                    Ok(b) => Some(b.to_f32()),
                    Err(TensorError::Missing(_)) => None,
                    Err(e) => return Err(e),
                };
                Ok(Linear { w, b })
            };
            let (q, k, v, o) = (
                linear("attn_q")?,
                linear("attn_k")?,
                linear("attn_v")?,
                linear("attn_output")?,
            );
            let (up, down) = (linear("ffn_up")?, linear("ffn_down")?);
            let mut norm = |stem: &str| -> Result<Norm, TensorError> {
                Ok(Norm {
                    w: fetch(&format!("blk.{i}.{stem}.weight"))?.to_f32(),
                    b: fetch(&format!("blk.{i}.{stem}.bias"))?.to_f32(),
                })
            };
            let (attn_norm, out_norm) = (norm("attn_output_norm")?, norm("layer_output_norm")?);
            layers.push(Layer {
                q,
                k,
                v,
                o,
                attn_norm,
                up,
                down,
                out_norm,
            });
        }
        let type0 = match fetch("token_types.weight") {
            Ok(m) => {
                let mut row = vec![0.0; m.cols];
                m.row_f32(0, &mut row);
                Some(row)
            }
            Err(TensorError::Missing(_)) => None,
            Err(e) => return Err(e),
        };
        let tok = fetch("token_embd.weight")?;
        let pos = fetch("position_embd.weight")?;
        if tok.cols != params.n_embd || pos.cols != params.n_embd {
            return Err(TensorError::Missing(format!(
                "embeddings of width {} (the model says {})",
                tok.cols, params.n_embd
            )));
        }
        let params = BertParams {
            n_ctx: params.n_ctx.min(pos.rows),
            ..params
        };
        Ok(BertModel {
            params,
            tok,
            pos,
            type0,
            embd_norm,
            layers,
        })
    }

    /// Vocabulary size (rows of the token embeddings).
    pub fn vocab_size(&self) -> usize {
        self.tok.rows
    }

    /// Bytes of weights held.
    pub fn bytes(&self) -> usize {
        let linear = |l: &Linear| l.w.bytes() + l.b.as_ref().map_or(0, |b| b.len() * 4);
        self.tok.bytes()
            + self.pos.bytes()
            + self
                .layers
                .iter()
                .map(|l| {
                    [&l.q, &l.k, &l.v, &l.o, &l.up, &l.down]
                        .into_iter()
                        .map(linear)
                        .sum::<usize>()
                })
                .sum::<usize>()
    }

    /// One pooled, L2-normalised vector per input, computed in one pass. Every input
    /// must be non-empty, at most `n_ctx` tokens, with ids below the vocabulary size.
    pub fn embed(&self, inputs: &[&[u32]]) -> Vec<Vec<f32>> {
        let hidden = self.encode(inputs);
        let d = self.params.n_embd;
        let mut start = 0;
        inputs
            .iter()
            .map(|seq| {
                let rows = &hidden[start * d..(start + seq.len()) * d];
                start += seq.len();
                self.params.pooling.pool(rows, d)
            })
            .collect()
    }

    /// The last block's output, one row per token of every input, inputs in order.
    pub fn encode(&self, inputs: &[&[u32]]) -> Vec<f32> {
        let d = self.params.n_embd;
        let n: usize = inputs.iter().map(|s| s.len()).sum();
        let mut x = vec![0.0f32; n * d];
        let mut row = vec![0.0f32; d];
        let mut t = 0;
        for seq in inputs {
            for (p, &id) in seq.iter().enumerate() {
                let out = &mut x[t * d..(t + 1) * d];
                self.tok.row_f32(id as usize, out);
                self.pos.row_f32(p, &mut row);
                out.iter_mut().zip(&row).for_each(|(o, r)| *o += r);
                if let Some(ty) = &self.type0 {
                    out.iter_mut().zip(ty).for_each(|(o, r)| *o += r);
                }
                t += 1;
            }
        }
        self.layer_norm(&mut x, &self.embd_norm);
        let lens: Vec<usize> = inputs.iter().map(|s| s.len()).collect();
        for layer in &self.layers {
            let q = linear(&layer.q, &x, n);
            let k = linear(&layer.k, &x, n);
            let v = linear(&layer.v, &x, n);
            let att = self.attention(&q, &k, &v, &lens);
            let o = linear(&layer.o, &att, n);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            self.layer_norm(&mut x, &layer.attn_norm);
            let mut h = linear(&layer.up, &x, n);
            h.par_chunks_mut(layer.up.w.rows)
                .for_each(|r| r.iter_mut().for_each(|v| *v = gelu(*v)));
            let f = linear(&layer.down, &h, n);
            x.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
            self.layer_norm(&mut x, &layer.out_norm);
        }
        x
    }

    /// ggml's `norm` (mean, centred variance, `1/sqrt(var + eps)`), then scale and shift.
    fn layer_norm(&self, x: &mut [f32], norm: &Norm) {
        let (d, eps) = (self.params.n_embd, self.params.eps);
        x.par_chunks_mut(d).for_each(|row| {
            let mean = (row.iter().map(|v| *v as f64).sum::<f64>() / d as f64) as f32;
            let mut var = 0.0f64;
            for v in row.iter_mut() {
                *v -= mean;
                var += (*v * *v) as f64;
            }
            let scale = 1.0 / ((var / d as f64) as f32 + eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(&norm.w).zip(&norm.b) {
                *v = *v * scale * w + b;
            }
        });
    }

    /// Bidirectional attention within each input: rows `q`, `k`, `v` (n × d, inputs
    /// back to back, `lens` tokens each), one task per input and head.
    fn attention(&self, q: &[f32], k: &[f32], v: &[f32], lens: &[usize]) -> Vec<f32> {
        let d = self.params.n_embd;
        let heads = self.params.n_head;
        let hd = d / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let dot = Kernels::active().dot_f32;
        let mut starts = Vec::with_capacity(lens.len());
        let mut s = 0;
        for &len in lens {
            starts.push(s);
            s += len;
        }
        let tasks: Vec<(usize, usize, usize)> = starts
            .iter()
            .zip(lens)
            .flat_map(|(&s, &len)| (0..heads).map(move |h| (s, len, h)))
            .collect();
        let parts: Vec<Vec<f32>> = tasks
            .par_iter()
            .map(|&(s, len, h)| {
                let col = h * hd;
                let mut out = vec![0.0f32; len * hd];
                let mut scores = vec![0.0f32; len];
                for i in 0..len {
                    let qi = &q[(s + i) * d + col..(s + i) * d + col + hd];
                    for (j, sc) in scores.iter_mut().enumerate() {
                        *sc = dot(qi, &k[(s + j) * d + col..(s + j) * d + col + hd]) * scale;
                    }
                    softmax(&mut scores);
                    let o = &mut out[i * hd..(i + 1) * hd];
                    for (j, p) in scores.iter().enumerate() {
                        let vj = &v[(s + j) * d + col..(s + j) * d + col + hd];
                        o.iter_mut().zip(vj).for_each(|(o, v)| *o += p * v);
                    }
                }
                out
            })
            .collect();
        let mut att = vec![0.0f32; q.len()];
        for (&(s, len, h), part) in tasks.iter().zip(&parts) {
            for i in 0..len {
                att[(s + i) * d + h * hd..(s + i) * d + (h + 1) * hd].copy_from_slice(&part[i * hd..(i + 1) * hd]);
            }
        }
        att
    }
}

/// `x · Wᵀ + b` for `n` rows of `x`. F32 weights go through `gemm` (packed,
/// register-blocked; the per-row dot products of the decoder's kernels reach about
/// half of llama.cpp's sgemm on an encoder's long passes); quantized ones through
/// the engine's own kernels, which quantize the activations as ggml does.
fn linear(l: &Linear, x: &[f32], n: usize) -> Vec<f32> {
    let (rows, cols) = (l.w.rows, l.w.cols);
    let mut out = vec![0.0f32; n * rows];
    match &l.w.data {
        QData::F32(w) => {
            assert!(x.len() >= n * cols && w.len() == rows * cols);
            // SAFETY: dst is n × rows (row stride `rows`), lhs is x as n × cols (row
            // stride `cols`), rhs is Wᵀ as cols × rows (W row-major: element (k, j) at
            // j * cols + k); all in bounds by the assertion and `out`'s length.
            unsafe {
                gemm::gemm(
                    n,
                    rows,
                    cols,
                    out.as_mut_ptr(),
                    1,
                    rows as isize,
                    false,
                    x.as_ptr(),
                    1,
                    cols as isize,
                    w.as_ptr(),
                    cols as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::Rayon(0),
                )
            };
        }
        _ => l.w.matmul(&l.w.prepare(x, n), n, &mut out),
    }
    if let Some(b) = &l.b {
        out.par_chunks_mut(rows)
            .for_each(|r| r.iter_mut().zip(b).for_each(|(o, b)| *o += b));
    }
    out
}

/// The Hugging Face (`BertModel`) name of a tensor the encoder asks for by its GGUF
/// name; llama.cpp's converter maps them the other way.
pub fn hf_name(gguf: &str) -> Option<String> {
    let (stem, kind) = gguf.rsplit_once('.')?;
    let fixed = match stem {
        "token_embd" => Some("embeddings.word_embeddings"),
        "token_types" => Some("embeddings.token_type_embeddings"),
        "position_embd" => Some("embeddings.position_embeddings"),
        "token_embd_norm" => Some("embeddings.LayerNorm"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(format!("{f}.{kind}"));
    }
    let (layer, tail) = stem.strip_prefix("blk.")?.split_once('.')?;
    let mapped = match tail {
        "attn_q" => "attention.self.query",
        "attn_k" => "attention.self.key",
        "attn_v" => "attention.self.value",
        "attn_output" => "attention.output.dense",
        "attn_output_norm" => "attention.output.LayerNorm",
        "ffn_up" => "intermediate.dense",
        "ffn_down" => "output.dense",
        "layer_output_norm" => "output.LayerNorm",
        _ => return None,
    };
    Some(format!("encoder.layer.{layer}.{mapped}.{kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_gguf_names_to_bert_names() {
        assert_eq!(
            hf_name("token_embd.weight").unwrap(),
            "embeddings.word_embeddings.weight"
        );
        assert_eq!(hf_name("token_embd_norm.bias").unwrap(), "embeddings.LayerNorm.bias");
        assert_eq!(
            hf_name("blk.5.attn_output_norm.weight").unwrap(),
            "encoder.layer.5.attention.output.LayerNorm.weight"
        );
        assert_eq!(
            hf_name("blk.0.ffn_down.bias").unwrap(),
            "encoder.layer.0.output.dense.bias"
        );
        assert!(hf_name("output.weight").is_none());
    }

    /// A one-block encoder of width 4 with identity-like weights, small enough to
    /// check by hand: every vector is unit length, and pooling picks what it says.
    #[test]
    fn pools_and_normalises() {
        let params = BertParams {
            n_embd: 4,
            n_head: 2,
            n_layer: 1,
            n_ff: 8,
            n_ctx: 8,
            eps: 1e-12,
            pooling: Pooling::Mean,
        };
        let m = |rows: usize, cols: usize, f: &dyn Fn(usize) -> f32| QMatrix {
            rows,
            cols,
            data: QData::F32((0..rows * cols).map(f).collect()),
        };
        let mut fetch = |name: &str| -> Result<QMatrix, TensorError> {
            Ok(match name {
                "token_embd.weight" => m(10, 4, &|i| ((i * 7) % 5) as f32 - 2.0),
                "position_embd.weight" => m(8, 4, &|i| (i % 3) as f32 * 0.1),
                "token_types.weight" => m(2, 4, &|_| 0.05),
                n if n.ends_with("norm.weight") => m(1, 4, &|_| 1.0),
                n if n.ends_with("norm.bias") => m(1, 4, &|i| i as f32 * 0.01),
                n if n.contains("ffn_up.weight") => m(8, 4, &|i| ((i % 4) as f32 - 1.5) * 0.2),
                n if n.contains("ffn_up.bias") => m(1, 8, &|_| 0.0),
                n if n.contains("ffn_down.weight") => m(4, 8, &|i| ((i % 3) as f32 - 1.0) * 0.3),
                n if n.ends_with(".weight") => m(4, 4, &|i| if i % 5 == 0 { 1.0 } else { 0.1 }),
                n if n.ends_with(".bias") => m(1, 4, &|_| 0.0),
                n => return Err(TensorError::Missing(n.into())),
            })
        };
        let model = BertModel::from_tensors(params, &mut fetch).unwrap();
        let a: &[u32] = &[1, 2, 3];
        let b: &[u32] = &[4, 5];
        let together = model.embed(&[a, b]);
        // The same vectors alone as in one ragged batch: attention stays within inputs.
        assert_eq!(model.embed(&[a])[0], together[0]);
        assert_eq!(model.embed(&[b])[0], together[1]);
        for v in &together {
            let n: f32 = v.iter().map(|x| x * x).sum();
            assert!((n - 1.0).abs() < 1e-5, "{n}");
        }
        let hidden = model.encode(&[a]);
        let mean: Vec<f32> = (0..4).map(|c| (0..3).map(|r| hidden[r * 4 + c]).sum::<f32>()).collect();
        let norm = mean.iter().map(|x| x * x).sum::<f32>().sqrt();
        for (got, want) in together[0].iter().zip(&mean) {
            assert!((got - want / norm).abs() < 1e-5);
        }
    }
}
