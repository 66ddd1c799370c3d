//! The kernels in plain Rust, for any CPU, with exactly the SIMD kernels' arithmetic,
//! so the portable path computes the same bits as AVX2 and AVX-512, only slower (LLVM
//! vectorises the loops with the target's baseline SIMD, SSE2 or NEON). Every quantized
//! type is packed by eight rows and finishes each block (or super-block) in integers,
//! then does one fused multiply-add per block and sum ([`dot_q4_0_q8_0`],
//! [`dot_min_q8_1`], [`dot_q4_k_q8_k`]); the f32 dot products keep eight FMA lanes
//! summed in ggml's `hsum_float_8` order.

use crate::kernels::kquants::{scale_min_k4, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ6Kx8, BlockQ8K, KGroup};
use crate::kernels::quants::*;

/// `hsum_float_8`'s order: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
#[inline]
fn hsum8(l: &[f32; 8]) -> f32 {
    let r = [l[4] + l[0], l[5] + l[1], l[6] + l[2], l[7] + l[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// A 4-bit block's 32 values in the SIMD order: low nibbles, then high nibbles.
#[inline]
fn nibbles(qs: &[u8; 16]) -> [i8; 32] {
    let mut v = [0i8; 32];
    for j in 0..16 {
        v[j] = (qs[j] & 0x0f) as i8;
        v[j + 16] = (qs[j] >> 4) as i8;
    }
    v
}

fn unpack_q4_0(a: &BlockQ4_0) -> ([i8; 32], f32) {
    (nibbles(&a.qs).map(|v| v - 8), h2f(a.d))
}

/// One Q4_0 row against a Q8_0 row with the arithmetic every Q4_0 kernel shares:
/// each block's exact integer sum `Σ (q − 8)·y`, then `acc = fma(sum, d_x·d_y, acc)`
/// block after block. llama.cpp's repacked Q4_0 kernels (`ggml_gemv_q4_0_8x8_q8_0`,
/// `ggml_gemm_q4_0_8x8_q8_0`, what its x86 CPU backend runs for Q4_0 by default)
/// compute the same; ggml's row kernel instead keeps 8 float lanes per cell, which
/// costs eight times the float work in a prefill and is what the other types here
/// follow.
pub fn dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0], yd: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (i, (a, b)) in x.iter().zip(y).enumerate() {
        let (q, dx) = unpack_q4_0(a);
        let s: i32 = q.iter().zip(&b.qs).map(|(&q, &y)| q as i32 * y as i32).sum();
        acc = (s as f32).mul_add(dx * yd[i], acc);
    }
    acc
}

/// Packed groups of eight Q4_0 rows against `n` Q8_0 rows (see
/// [`crate::kernels::simd::Kernels::q4_0x8`]): each cell exactly
/// [`dot_q4_0_q8_0`] of the row unpacked.
pub fn dot_q4_0x8_q8_0(x: &[BlockQ4_0x8], y: &[BlockQ8_0], yd: &[f32], yo: &[i32], n: usize, out: &mut [f32]) {
    let (nb, groups) = super::x8_shape(x, y, yd, yo, n, out);
    let width = 8 * groups;
    for g in 0..groups {
        for t in 0..n {
            let mut acc = [0.0f32; 8];
            for i in 0..nb {
                let (a, b) = (&x[g * nb + i], &y[t * nb + i]);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let mut s = yo[t * nb + i];
                    for step in 0..4 {
                        for k in 0..4 {
                            let q = a.qs[32 * step + 4 * r + k];
                            s += (q & 0x0f) as i32 * b.qs[4 * step + k] as i32
                                + (q >> 4) as i32 * b.qs[16 + 4 * step + k] as i32;
                        }
                    }
                    *acc = (s as f32).mul_add(h2f(a.d[r]) * yd[t * nb + i], *acc);
                }
            }
            out[t * width + 8 * g..t * width + 8 * g + 8].copy_from_slice(&acc);
        }
    }
}

/// One Q8_0 row against a Q8_0 row with the arithmetic every packed Q8_0 kernel
/// shares: each block's exact integer sum `Σ q·y`, then `acc = fma(sum, d_x·d_y, acc)`.
pub fn dot_q8_0_blocks(x: &[BlockQ8_0], y: &[BlockQ8_0], yd: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (i, (a, b)) in x.iter().zip(y).enumerate() {
        let s: i32 = a.qs.iter().zip(&b.qs).map(|(&q, &y)| q as i32 * y as i32).sum();
        acc = (s as f32).mul_add(h2f(a.d) * yd[i], acc);
    }
    acc
}

/// Packed groups of eight Q8_0 rows against `n` Q8_0 rows (see
/// [`crate::kernels::simd::Kernels::q8_0x8`]; `yo` unused here): each cell
/// exactly [`dot_q8_0_blocks`] of the row unpacked.
pub fn dot_q8_0x8_q8_0(x: &[BlockQ8_0x8], y: &[BlockQ8_0], yd: &[f32], yo: &[i32], n: usize, out: &mut [f32]) {
    let (nb, _) = super::x8_shape(x, y, yd, yo, n, out);
    by_rows(x, nb, n, out, BlockQ8_0x8::row, |w, t| {
        dot_q8_0_blocks(w, &y[t.clone()], &yd[t])
    })
}

/// One Q5_0 row against a Q8_0 row with the arithmetic every packed Q5_0 kernel
/// shares: each block's exact integer sum `Σ (q − 16)·y`, then
/// `acc = fma(sum, d_x·d_y, acc)` (ggml's row kernel keeps eight float lanes).
pub fn dot_q5_0_blocks(x: &[BlockQ5_0], y: &[BlockQ8_0], yd: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (i, (a, b)) in x.iter().zip(y).enumerate() {
        let s: i32 = q5_0_values(a).iter().zip(&b.qs).map(|(&q, &y)| q * y as i32).sum();
        acc = (s as f32).mul_add(h2f(a.d) * yd[i], acc);
    }
    acc
}

/// Packed groups of eight Q5_0 rows against `n` Q8_0 rows (see
/// [`crate::kernels::simd::Kernels::q5_0x8`]; `yo` unused here): each cell
/// exactly [`dot_q5_0_blocks`] of the row unpacked.
pub fn dot_q5_0x8_q8_0(x: &[BlockQ5_0x8], y: &[BlockQ8_0], yd: &[f32], yo: &[i32], n: usize, out: &mut [f32]) {
    let (nb, _) = super::x8_shape(x, y, yd, yo, n, out);
    by_rows(x, nb, n, out, BlockQ5_0x8::row, |w, t| {
        dot_q5_0_blocks(w, &y[t.clone()], &yd[t])
    })
}

/// One Q4_1 or Q5_1 row against a Q8_1 row with the arithmetic every packed Q4_1 and
/// Q5_1 kernel shares, one step per block: the exact integer sum `Σ q·y` of the
/// unsigned values, then `acc = fma(sum, d_x·d_y, acc)` and `acc = fma(m_x, s_y, acc)`
/// (where ggml's row kernel keeps eight float lanes and a second sum for the mins).
pub fn dot_min_q8_1<B: MinBlock>(x: &[B], y: &[BlockQ8_1], yd: &[f32], ys: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (i, (a, b)) in x.iter().zip(y).enumerate() {
        let s: i32 = min_block_values(a)
            .iter()
            .zip(&b.qs)
            .map(|(&q, &y)| q as i32 * y as i32)
            .sum();
        acc = (s as f32).mul_add(h2f(a.d()) * yd[i], acc);
        acc = h2f(a.m()).mul_add(ys[i], acc);
    }
    acc
}

/// Packed groups of eight Q4_1 rows against `n` Q8_1 rows (see
/// [`crate::kernels::simd::Kernels::q4_1x8`]): each cell exactly
/// [`dot_min_q8_1`] of the row unpacked.
pub fn dot_q4_1x8_q8_1(x: &[BlockQ4_1x8], y: &[BlockQ8_1], yd: &[f32], ys: &[f32], n: usize, out: &mut [f32]) {
    let (nb, _) = super::x8_shape(x, y, yd, ys, n, out);
    by_rows(x, nb, n, out, BlockQ4_1x8::row, |w, t| {
        dot_min_q8_1(w, &y[t.clone()], &yd[t.clone()], &ys[t])
    })
}

/// Packed groups of eight Q5_1 rows against `n` Q8_1 rows (see
/// [`crate::kernels::simd::Kernels::q5_1x8`]): each cell exactly
/// [`dot_min_q8_1`] of the row unpacked.
pub fn dot_q5_1x8_q8_1(x: &[BlockQ5_1x8], y: &[BlockQ8_1], yd: &[f32], ys: &[f32], n: usize, out: &mut [f32]) {
    let (nb, _) = super::x8_shape(x, y, yd, ys, n, out);
    by_rows(x, nb, n, out, BlockQ5_1x8::row, |w, t| {
        dot_min_q8_1(w, &y[t.clone()], &yd[t.clone()], &ys[t])
    })
}

/// The portable form of a packed kernel: each group's eight rows unpacked to file
/// order (`row(block, r)`), each cell `dot(row, input t's blocks)`, written at
/// `out[t * 8 * groups + 8 * g + r]`.
fn by_rows<G, R>(
    x: &[G],
    nb: usize,
    n: usize,
    out: &mut [f32],
    row: impl Fn(&G, usize) -> R,
    dot: impl Fn(&[R], std::ops::Range<usize>) -> f32,
) {
    let groups = x.len() / nb;
    let width = 8 * groups;
    for g in 0..groups {
        for r in 0..8 {
            let w: Vec<R> = x[g * nb..(g + 1) * nb].iter().map(|b| row(b, r)).collect();
            for t in 0..n {
                out[t * width + 8 * g + r] = dot(&w, t * nb..(t + 1) * nb);
            }
        }
    }
}

/// One Q4_K row against a Q8_K row with the arithmetic every Q4_K kernel shares, one
/// step per super-block: the exact integer sums `Σ_j sc_j · Σ q·y` over its eight
/// sub-blocks and `Σ_j m_j · Σ y`, then `acc = fma(sums, d_x·d_y, acc)` and
/// `acc = fma(mins, −(dmin_x·d_y), acc)`, unlike ggml's row kernel, which keeps eight
/// float lanes per cell. llama.cpp's repacked Q4_K kernels (`ggml_gemv/gemm_q4_K_8x8_q8_K`,
/// its x86 CPU backend's default for Q4_K) compute the same integers but keep the
/// mins in a second float sum subtracted at the end; measured against llama-server
/// on Gemma 3 (`engine/tests/engine/greedy_reference.rs`), that form agreed worse with both of its
/// builds (mean |Δ log p| 0.037–0.040, max 0.96) than this one (0.034, max 0.52): the
/// two sums are each larger than their difference, so their rounding errors are too.
pub fn dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let (mut sums, mut mins) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &a.scales);
            let (q4, shift) = (&a.qs[32 * (j / 2)..32 * (j / 2) + 32], 4 * (j % 2));
            let q8 = &b.qs[32 * j..32 * j + 32];
            let p: i32 = q4
                .iter()
                .zip(q8)
                .map(|(&q, &y)| ((q >> shift) & 0xf) as i32 * y as i32)
                .sum();
            sums += sc as i32 * p;
            mins += m as i32 * (b.bsums[2 * j] as i32 + b.bsums[2 * j + 1] as i32);
        }
        acc = (sums as f32).mul_add(h2f(a.d) * b.d, acc);
        acc = (mins as f32).mul_add(-(h2f(a.dmin) * b.d), acc);
    }
    acc
}

/// One Q5_K row against a Q8_K row: [`dot_q4_k_q8_k`]'s arithmetic with the fifth
/// bit of every value (so values 0–31 instead of 0–15).
pub fn dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let (mut sums, mut mins) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &a.scales);
            let (q4, shift) = (&a.qs[32 * (j / 2)..32 * (j / 2) + 32], 4 * (j % 2));
            let q8 = &b.qs[32 * j..32 * j + 32];
            let p: i32 = (0..32)
                .map(|l| (((q4[l] >> shift) & 0xf) | ((a.qh[l] >> j) & 1) << 4) as i32 * q8[l] as i32)
                .sum();
            sums += sc as i32 * p;
            mins += m as i32 * (b.bsums[2 * j] as i32 + b.bsums[2 * j + 1] as i32);
        }
        acc = (sums as f32).mul_add(h2f(a.d) * b.d, acc);
        acc = (mins as f32).mul_add(-(h2f(a.dmin) * b.d), acc);
    }
    acc
}

/// Packed groups of eight Q4_K or Q5_K rows against `n` Q8_K rows (see
/// [`crate::kernels::simd::Kernels::q4_kx8`]): each cell exactly
/// [`dot_q4_k_q8_k`] / [`dot_q5_k_q8_k`] of the row unpacked.
pub fn dot_kx8_q8_k<G: KGroup>(x: &[G], y: &[BlockQ8K], ym: &[[i32; 4]], n: usize, out: &mut [f32]) {
    let (nb, groups) = super::kx8_shape(x, y, ym, n, out);
    let width = 8 * groups;
    for g in 0..groups {
        for t in 0..n {
            let mut acc = [0.0f32; 8];
            for i in 0..nb {
                let (a, b, pairs) = (x[g * nb + i].low(), &y[t * nb + i], &ym[t * nb + i]);
                let qh = x[g * nb + i].qh();
                for (r, acc) in acc.iter_mut().enumerate() {
                    let (mut sums, mut mins) = (0i32, 0i32);
                    for j in 0..8 {
                        let (k, shift) = (j / 2, 4 * (j % 2));
                        let mut p = 0i32;
                        for s in 0..8 {
                            for l in 0..4 {
                                let at = 32 * s + 4 * r + l;
                                let mut q = (a.qs[256 * k + at] >> shift) & 0xf;
                                if G::HIGH {
                                    q |= ((qh[at] >> j) & 1) << 4;
                                }
                                p += q as i32 * b.qs[32 * j + 4 * s + l] as i32;
                            }
                        }
                        sums += a.scales[j][r] as i32 * p;
                        let pair = pairs[j / 2];
                        let sum = if j % 2 == 0 { pair as i16 } else { (pair >> 16) as i16 };
                        mins += a.mins[j / 2][2 * r + j % 2] as i32 * sum as i32;
                    }
                    *acc = (sums as f32).mul_add(h2f(a.d[r]) * b.d, *acc);
                    *acc = (mins as f32).mul_add(-(h2f(a.dmin[r]) * b.d), *acc);
                }
            }
            out[t * width + 8 * g..t * width + 8 * g + 8].copy_from_slice(&acc);
        }
    }
}

/// Value `v` (0–255) of a Q6_K block, unsigned (0–63: the stored value, before
/// its offset of −32).
#[inline(always)]
fn q6k_unsigned(a: &BlockQ6K, v: usize) -> i32 {
    let (n, c, l) = (v / 128, v % 128 / 32, v % 32);
    let low = a.ql[64 * n + 32 * (c % 2) + l] >> (4 * (c / 2));
    ((low & 0xf) | ((a.qh[32 * n + l] >> (2 * c)) & 3) << 4) as i32
}

/// One Q6_K row against a Q8_K row with the arithmetic every Q6_K kernel shares, one
/// step per super-block: the exact integer `Σ_j sc_j · (Σ q·y − 32 · Σ y)` over its
/// sixteen sub-blocks (`q` unsigned, the offset through the inputs' sub-block sums),
/// then `acc = fma(sum, d_x·d_y, acc)` — ggml's AVX2 kernel computes the same integers
/// but in eight lanes of floats per cell.
pub fn dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        let mut sum = 0i32;
        for j in 0..16 {
            let p: i32 = (16 * j..16 * j + 16).map(|v| q6k_unsigned(a, v) * b.qs[v] as i32).sum();
            sum += a.scales[j] as i32 * (p - 32 * b.bsums[j] as i32);
        }
        acc = (sum as f32).mul_add(h2f(a.d) * b.d, acc);
    }
    acc
}

/// Packed groups of eight Q6_K rows against `n` Q8_K rows (see
/// [`crate::kernels::simd::Kernels::q6_kx8`]): each cell exactly
/// [`dot_q6_k_q8_k`] of the row unpacked.
pub fn dot_q6_kx8_q8_k(x: &[BlockQ6Kx8], y: &[BlockQ8K], ym: &[[i32; 4]], n: usize, out: &mut [f32]) {
    let (nb, groups) = super::kx8_shape(x, y, ym, n, out);
    let width = 8 * groups;
    for g in 0..groups {
        for t in 0..n {
            let mut acc = [0.0f32; 8];
            for i in 0..nb {
                let (a, b) = (&x[g * nb + i], &y[t * nb + i]);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let mut p = [0i32; 16];
                    for c in 0..4 {
                        let (half, h) = (c / 2, c % 2);
                        for s in 0..8 {
                            for l in 0..4 {
                                let w = a.q[BlockQ6Kx8::ql_at(c, s) + 4 * r + l];
                                let high = a.q[BlockQ6Kx8::qh_at(half, s) + 4 * r + l];
                                let lo = (w & 0xf) | ((high >> (2 * h)) & 3) << 4;
                                let hi = (w >> 4) | ((high >> (2 * h + 4)) & 3) << 4;
                                let v = 128 * half + 32 * h + 4 * s + l;
                                p[v / 16] += lo as i32 * b.qs[v] as i32;
                                p[v / 16 + 4] += hi as i32 * b.qs[v + 64] as i32;
                            }
                        }
                    }
                    let sum: i32 = (0..16)
                        .map(|j| a.scales[j / 2][2 * r + j % 2] as i32 * (p[j] - 32 * b.bsums[j] as i32))
                        .sum();
                    *acc = (sum as f32).mul_add(h2f(a.d[r]) * b.d, *acc);
                }
            }
            out[t * width + 8 * g..t * width + 8 * g + 8].copy_from_slice(&acc);
        }
    }
}

pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0.0f32; 8];
    let n8 = n / 8 * 8;
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] = ca[l].mul_add(cb[l], acc[l]);
        }
    }
    let mut s = hsum8(&acc);
    for i in n8..n {
        s += a[i] * b[i];
    }
    s
}

pub fn dot_f16_f32(a: &[u16], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0.0f32; 8];
    let n8 = n / 8 * 8;
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] = h2f(ca[l]).mul_add(cb[l], acc[l]);
        }
    }
    let mut s = hsum8(&acc);
    for i in n8..n {
        s += h2f(a[i]) * b[i];
    }
    s
}

pub fn axpy_f16(acc: &mut [f32], v: &[u16], w: f32) {
    for (a, &h) in acc.iter_mut().zip(v) {
        *a = h2f(h).mul_add(w, *a);
    }
}
