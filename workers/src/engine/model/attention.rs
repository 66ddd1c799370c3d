//! Causal grouped-query attention over a sequence's f16 KV cache, with llama.cpp's
//! rounding (Q and the attention weights in f16) and the engine's kernel variant.

use super::params::LlamaParams;
use crate::engine::kernels::simd::Kernels;

/// Causal grouped-query attention for the new positions starting at `pos`: Q
/// rounded to f16 like llama.cpp's f16 K·Q matmul, K·Q with 8-lane FMA (tinyBLAS's
/// order for a head size that is a multiple of 8), the scaled softmax with ggml's
/// `expf`, the weights rounded to f16, then V accumulated row by row (vectorised).
/// With `window > 0` a query at position `i` sees only keys at `j > i - window`.
#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    p: &LlamaParams,
    q: &[f32],
    k: &[u16],
    v: &[u16],
    ctx: usize,
    pos: usize,
    window: usize,
    out: &mut [f32],
) {
    use half::slice::HalfFloatSliceExt;
    use rayon::prelude::*;
    let kern = Kernels::active();
    let hd = p.head_dim;
    let group = p.n_head / p.n_head_kv;
    let scale = p.attn_scale;
    let d = p.q_dim();
    let as_f16 = |bits: &[u16]| -> &[half::f16] {
        // SAFETY: f16 is a transparent wrapper of u16 with the same size and alignment.
        unsafe { std::slice::from_raw_parts(bits.as_ptr() as *const half::f16, bits.len()) }
    };
    let rows = out.len() / d;
    let kv_len = (pos + rows) * hd;
    // Every key and value row is read by every query of its group. A prefill (many
    // queries) converts the layer's cache to f32 once; a decode step (one query per
    // head) reads the f16 rows directly, widening them in registers. Both give the
    // same values: widening is exact and the sums run in the same order.
    let convert = rows * group > 8;
    let (mut kf, mut vf) = (Vec::new(), Vec::new());
    if convert {
        kf = vec![0.0f32; p.n_head_kv * kv_len];
        vf = vec![0.0f32; p.n_head_kv * kv_len];
        kf.par_chunks_mut(kv_len)
            .zip(vf.par_chunks_mut(kv_len))
            .enumerate()
            .for_each(|(kvh, (kd, vd))| {
                as_f16(&k[kvh * ctx * hd..kvh * ctx * hd + kv_len]).convert_to_f32_slice(kd);
                as_f16(&v[kvh * ctx * hd..kvh * ctx * hd + kv_len]).convert_to_f32_slice(vd);
            });
    }
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (t, h) = (idx / p.n_head, idx % p.n_head);
        let kvh = h / group;
        let mut qrow = q[t * d + h * hd..t * d + (h + 1) * hd].to_vec();
        (kern.round_f16)(&mut qrow);
        let len = pos + t + 1;
        let first = if window > 0 { len.saturating_sub(window) } else { 0 };
        let mut scores: Vec<f32> = if convert {
            let rows = kvh * kv_len + first * hd..kvh * kv_len + len * hd;
            kf[rows]
                .chunks_exact(hd)
                .map(|kr| (kern.dot_f32)(kr, &qrow) * scale)
                .collect()
        } else {
            let rows = kvh * ctx * hd + first * hd..kvh * ctx * hd + len * hd;
            k[rows]
                .chunks_exact(hd)
                .map(|kr| (kern.dot_f16_f32)(kr, &qrow) * scale)
                .collect()
        };
        (kern.softmax)(&mut scores);
        // The weights as f16, like llama.cpp's f16 KQ·V matmul.
        (kern.round_f16)(&mut scores);
        o.iter_mut().for_each(|x| *x = 0.0);
        if convert {
            let rows = kvh * kv_len + first * hd..kvh * kv_len + len * hd;
            for (vr, &w) in vf[rows].chunks_exact(hd).zip(&scores) {
                (kern.axpy_f32)(o, vr, w);
            }
        } else {
            let rows = kvh * ctx * hd + first * hd..kvh * ctx * hd + len * hd;
            for (vr, &w) in v[rows].chunks_exact(hd).zip(&scores) {
                (kern.axpy_f16)(o, vr, w);
            }
        }
    });
}
