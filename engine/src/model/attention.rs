//! Causal grouped-query attention over a sequence's f16 KV cache, with llama.cpp's
//! rounding (Q and the attention weights in f16) and the engine's kernel variant.
//!
//! A layer's keys and values come as runs of whole rows in position order
//! ([`LayerView::runs`]): one per page on a layer that holds every position, one or
//! two (where the window wraps) on a sliding-window layer's ring. The sums run over
//! the runs in position order, so they are the same however the rows are stored.

use super::kv_cache::LayerView;
use super::params::LlamaParams;
use crate::kernels::simd::Kernels;

/// Causal grouped-query attention for the new positions starting at `pos`: Q
/// rounded to f16 like llama.cpp's f16 K·Q matmul, K·Q with 8-lane FMA (tinyBLAS's
/// order for a head size that is a multiple of 8), the scaled softmax with ggml's
/// `expf`, the weights rounded to f16, then V accumulated row by row (vectorised).
/// With `window > 0` a query at position `i` sees only keys at `j > i - window`.
/// `kv` is the sequence's layer.
pub(super) fn attention(p: &LlamaParams, q: &[f32], kv: LayerView<'_>, pos: usize, window: usize, out: &mut [f32]) {
    use rayon::prelude::*;
    let kern = Kernels::active();
    let hd = p.head_dim;
    let group = p.n_head / p.n_head_kv;
    let scale = p.attn_scale;
    let d = p.q_dim();
    if out.len() / d * group > 8 {
        return tiled(p, q, kv, pos, window, out);
    }
    // A decode step (one query per head, a few sequences' worth at most) reads the
    // f16 rows directly, widening them in registers: the same values as [`tiled`]
    // (widening is exact and the sums run in the same order).
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (t, h) = (idx / p.n_head, idx % p.n_head);
        let kvh = h / group;
        let mut qrow = q[t * d + h * hd..t * d + (h + 1) * hd].to_vec();
        (kern.round_f16)(&mut qrow);
        let len = pos + t + 1;
        let first = if window > 0 { len.saturating_sub(window) } else { 0 };
        let mut seen = Vec::new();
        kv.runs(kvh, first, len, |k, v| seen.push((k, v)));
        let mut scores: Vec<f32> = seen
            .iter()
            .flat_map(|(k, _)| k.chunks_exact(hd))
            .map(|kr| (kern.dot_f16_f32)(kr, &qrow) * scale)
            .collect();
        (kern.softmax)(&mut scores);
        // The weights as f16, like llama.cpp's f16 KQ·V matmul.
        (kern.round_f16)(&mut scores);
        o.iter_mut().for_each(|x| *x = 0.0);
        for (vr, &w) in seen.iter().flat_map(|(_, v)| v.chunks_exact(hd)).zip(&scores) {
            (kern.axpy_f16)(o, vr, w);
        }
    });
}

/// Attention for many queries (a prefill), tiled: each task takes a few consecutive
/// tokens and, per KV head, every query of those tokens in the head's group. It walks
/// the keys the tile can see in blocks: a block of f16 keys is widened once into a
/// small buffer (it stays in L1) and scored against every query of the tile; then
/// each query's softmax, the weights rounded to f16, and the same walk over the value
/// blocks accumulates each query's output. Every score and every output value is
/// computed exactly as in the one-query path (see `kernels::simd::attend`).
fn tiled(p: &LlamaParams, q: &[f32], kv: LayerView<'_>, pos: usize, window: usize, out: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    use rayon::prelude::*;
    let kern = Kernels::active();
    let hd = p.head_dim;
    let group = p.n_head / p.n_head_kv;
    let d = p.q_dim();
    // Enough tasks for the pool on short prompts, few key-block conversions per
    // query on long ones.
    let tile = (out.len() / d / 4).clamp(1, 8);
    // Keys per block: 16 KB of f32.
    let block = (4096 / hd).max(8);
    let first = |t: usize| {
        if window > 0 {
            (pos + t + 1).saturating_sub(window)
        } else {
            0
        }
    };
    out.par_chunks_mut(tile * d).enumerate().for_each(|(ti, o)| {
        let t0 = ti * tile;
        let nt = o.len() / d;
        let (lo, hi) = (first(t0), pos + t0 + nt);
        let span = hi - lo;
        let nq = nt * group;
        let mut buf = vec![0.0f32; block * hd];
        let mut qt = vec![0.0f32; nq * hd];
        let mut sc = vec![0.0f32; nq * span];
        // Query `i` of the tile is token `t0 + i / group`, head `kvh * group + i % group`;
        // it sees keys `first(t)..pos + t + 1`, stored at `[i * span + j - lo]`.
        let seen = |i: usize| {
            let t = t0 + i / group;
            (first(t), pos + t + 1)
        };
        for kvh in 0..p.n_head_kv {
            for (i, qr) in qt.chunks_exact_mut(hd).enumerate() {
                let (t, h) = (t0 + i / group, kvh * group + i % group);
                qr.copy_from_slice(&q[t * d + h * hd..t * d + (h + 1) * hd]);
            }
            (kern.round_f16)(&mut qt);
            // Keys (`values` false) or values of positions `b0..b1` into `buf`, in order.
            let widen = |values: bool, b0: usize, b1: usize, buf: &mut [f32]| {
                let mut at = 0;
                kv.runs(kvh, b0, b1, |k, v| {
                    let bits = if values { v } else { k };
                    // SAFETY: f16 is a transparent wrapper of u16 with the same size and alignment.
                    let halves = unsafe { std::slice::from_raw_parts(bits.as_ptr() as *const half::f16, bits.len()) };
                    halves.convert_to_f32_slice(&mut buf[at..at + bits.len()]);
                    at += bits.len();
                });
            };
            for b0 in (lo..hi).step_by(block) {
                let b1 = (b0 + block).min(hi);
                widen(false, b0, b1, &mut buf);
                for (i, qr) in qt.chunks_exact(hd).enumerate() {
                    let (f, l) = seen(i);
                    let (s, e) = (b0.max(f), b1.min(l));
                    if s < e {
                        let dst = &mut sc[i * span + s - lo..i * span + e - lo];
                        (kern.attend_scores)(&buf[(s - b0) * hd..(e - b0) * hd], qr, p.attn_scale, dst);
                    }
                }
            }
            for i in 0..nq {
                let (f, l) = seen(i);
                let w = &mut sc[i * span + f - lo..i * span + l - lo];
                (kern.softmax)(w);
                // The weights as f16, like llama.cpp's f16 KQ·V matmul.
                (kern.round_f16)(w);
                let (tt, h) = (i / group, kvh * group + i % group);
                o[tt * d + h * hd..tt * d + (h + 1) * hd].fill(0.0);
            }
            for b0 in (lo..hi).step_by(block) {
                let b1 = (b0 + block).min(hi);
                widen(true, b0, b1, &mut buf);
                for i in 0..nq {
                    let (f, l) = seen(i);
                    let (s, e) = (b0.max(f), b1.min(l));
                    if s < e {
                        let (tt, h) = (i / group, kvh * group + i % group);
                        (kern.attend_values)(
                            &buf[(s - b0) * hd..(e - b0) * hd],
                            &sc[i * span + s - lo..i * span + e - lo],
                            &mut o[tt * d + h * hd..tt * d + (h + 1) * hd],
                        );
                    }
                }
            }
        }
    });
}
