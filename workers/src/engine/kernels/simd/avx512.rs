//! AVX-512 (F/BW/VL/DQ + VNNI) tiles for prefill: panels of weight rows against 8
//! activation rows (tiles of four weight rows for Q4_1, two for
//! the K-quants, then single rows), and one weight row against 4, two activation
//! rows per 512-bit register. The low 256 bits hold one row's 8 lanes and the high
//! 256 bits the next row's, each lane doing exactly what the AVX2 kernel's lane does (the same integer sums, the same f32 multiply and
//! fused multiply-add per block, the same horizontal sum), so the results are
//! bit-identical to [`super::x86::avx2`] while each instruction does twice the work.
//! Single rows (decode) use the 256-bit kernels with EVEX `vpdpbusd`
//! (`x86::avx512_vl`).
//!
//! The packed types are different ([`dot_q4_0x8_q8_0`], [`dot_q5_0x8_q8_0`],
//! [`dot_q5_1x8_q8_1`], [`dot_q8_0x8_q8_0`],
//! [`dot_q4_kx8_q8_k`], …): two packed
//! groups of eight rows fill a register, one row per lane, against several inputs at a
//! time, with the blocks finished in integers (the portable kernels' arithmetic for
//! those types).

// Tiles index rows, pairs and accumulators together; index loops say that best.
#![allow(clippy::needless_range_loop)]

use super::x86::{h2f, hsum_float_8};
use super::{eight, panel_rows};
use crate::engine::kernels::kquants::{BlockQ4Kx8, BlockQ5Kx8, BlockQ6Kx8, BlockQ8K, KGroup};
use crate::engine::kernels::quants::{
    ActBlock, BlockQ4_0x8, BlockQ5_0x8, BlockQ5_1x8, BlockQ8_0, BlockQ8_0x8, BlockQ8_1, Extra, Fifth8, MinBlock,
};
use std::arch::x86_64::*;

/// Two rows' 32 bytes side by side.
#[inline(always)]
pub(super) unsafe fn pair_bytes(a: *const i8, b: *const i8) -> __m512i {
    _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(a as *const __m256i)),
        _mm256_loadu_si256(b as *const __m256i),
        1,
    )
}

/// `a` in the low 8 lanes, `b` in the high 8.
#[inline(always)]
pub(super) unsafe fn pair_ps(a: f32, b: f32) -> __m512 {
    _mm512_mask_broadcastss_ps(_mm512_set1_ps(a), 0xFF00, _mm_set_ss(b))
}

/// The two rows' sums of one paired accumulator.
#[inline(always)]
pub(super) unsafe fn hsum_pair(acc: __m512) -> [f32; 2] {
    [
        hsum_float_8(_mm512_castps512_ps256(acc)),
        hsum_float_8(_mm512_extractf32x8_ps(acc, 1)),
    ]
}

/// The rows' sums of `N / 2` paired accumulators, in row order.
#[inline(always)]
unsafe fn unpair<const N: usize>(acc: &[__m512; 4]) -> [f32; N] {
    let mut out = [0.0f32; N];
    for p in 0..N / 2 {
        let [lo, hi] = hsum_pair(acc[p]);
        out[2 * p] = lo;
        out[2 * p + 1] = hi;
    }
    out
}

/// Sums of four u8 × i8 products per 32-bit lane, as floats.
#[inline(always)]
unsafe fn dot_us8(ax: __m512i, sy: __m512i) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy))
}

/// A Q4_1 or Q5_1 block's unsigned values in both halves.
#[inline(always)]
unsafe fn min_both<B: MinBlock>(a: &B) -> __m512i {
    let q = nibbles_both(a.qs());
    if B::FIFTH {
        let qh = u32::from_le_bytes(a.qh()) as u64;
        _mm512_or_si512(q, _mm512_maskz_mov_epi8(qh | qh << 32, _mm512_set1_epi8(0x10)))
    } else {
        q
    }
}

/// `N` (4 or 8) Q8_1 rows against one Q4_1 or Q5_1 weight row.
#[inline(always)]
unsafe fn rows_min<B: MinBlock, const N: usize>(
    x: &[B],
    y: [&[BlockQ8_1]; N],
    yd: [&[f32]; N],
    ys: [&[f32]; N],
) -> [f32; N] {
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut summs = [0.0f32; N];
    for (i, a) in x.iter().enumerate() {
        let d0 = h2f(a.d());
        let m = h2f(a.m());
        let qx = min_both(a);
        let d0v = _mm512_set1_ps(d0);
        for p in 0..N / 2 {
            let (t0, t1) = (2 * p, 2 * p + 1);
            summs[t0] += m * ys[t0][i];
            summs[t1] += m * ys[t1][i];
            let d = _mm512_mul_ps(d0v, pair_ps(yd[t0][i], yd[t1][i]));
            let qy = pair_bytes(y[t0][i].qs.as_ptr(), y[t1][i].qs.as_ptr());
            acc[p] = _mm512_fmadd_ps(d, dot_us8(qx, qy), acc[p]);
        }
    }
    let mut out: [f32; N] = unpair(&acc);
    for (o, s) in out.iter_mut().zip(summs) {
        *o += s;
    }
    out
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_min_q8_1_x4<B: MinBlock>(
    x: &[B],
    y: [&[BlockQ8_1]; 4],
    yd: [&[f32]; 4],
    ys: [&[f32]; 4],
) -> [f32; 4] {
    rows_min(x, y, yd, ys)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_min_q8_1_x8<B: MinBlock>(x: &[B], y: &[BlockQ8_1], yd: &[f32], ys: &[f32], out: &mut [[f32; 8]]) {
    let (y, yd, ys) = (eight(y), eight(yd), eight(ys));
    let n = y[0].len();
    let quads = panel_tiles(x.len(), n, out.len(), 4);
    for q in 0..quads {
        let r = 4 * q;
        let cells = rows4_min(std::array::from_fn(|i| &x[(r + i) * n..(r + i + 1) * n]), y, yd, ys);
        out[r..r + 4].copy_from_slice(&cells);
    }
    for (row, o) in panel_rows(&x[4 * quads * n..], n, &mut out[4 * quads..]) {
        *o = rows_min(row, y, yd, ys);
    }
}

/// How many tiles of `tile` weight rows a panel of `rows` rows of `n` blocks holds
/// (the rest go one row at a time).
#[inline(always)]
fn panel_tiles(weights: usize, n: usize, rows: usize, tile: usize) -> usize {
    assert!(
        n > 0 && weights == n * rows,
        "a panel's weights are out.len() rows of the inputs' length"
    );
    rows / tile
}

/// The 16 bytes at `qs` as 32 nibbles (low nibbles, then high), in both halves.
#[inline(always)]
unsafe fn nibbles_both(qs: &[u8; 16]) -> __m512i {
    let v = _mm512_broadcast_i32x4(_mm_loadu_si128(qs.as_ptr() as *const __m128i));
    let hi = _mm512_srli_epi16(v, 4);
    _mm512_and_si512(_mm512_mask_blend_epi64(0xCC, v, hi), _mm512_set1_epi8(0x0F))
}

/// Four Q4_1 or Q5_1 weight rows against eight Q8_1 rows: `out[r][t] = x[r] · y[t]`, each cell
/// bit-identical to the single-row kernel (the minimum's products are summed per
/// cell in the same order, eight inputs to a register).
#[inline(always)]
unsafe fn rows4_min<B: MinBlock>(
    x: [&[B]; 4],
    y: [&[BlockQ8_1]; 8],
    yd: [&[f32]; 8],
    ys: [&[f32]; 8],
) -> [[f32; 8]; 4] {
    let mut acc = [[_mm512_setzero_ps(); 4]; 4];
    let mut summs = [_mm256_setzero_ps(); 4];
    for i in 0..x[0].len() {
        let mut qx = [_mm512_setzero_si512(); 4];
        let mut dx = [_mm512_setzero_ps(); 4];
        let ysv = _mm256_setr_ps(
            ys[0][i], ys[1][i], ys[2][i], ys[3][i], ys[4][i], ys[5][i], ys[6][i], ys[7][i],
        );
        for r in 0..4 {
            let a = &x[r][i];
            qx[r] = min_both(a);
            dx[r] = _mm512_set1_ps(h2f(a.d()));
            summs[r] = _mm256_add_ps(summs[r], _mm256_mul_ps(_mm256_set1_ps(h2f(a.m())), ysv));
        }
        for p in 0..4 {
            let (t0, t1) = (2 * p, 2 * p + 1);
            let qy = pair_bytes(y[t0][i].qs.as_ptr(), y[t1][i].qs.as_ptr());
            let dy = pair_ps(yd[t0][i], yd[t1][i]);
            for r in 0..4 {
                let d = _mm512_mul_ps(dx[r], dy);
                acc[r][p] = _mm512_fmadd_ps(d, dot_us8(qx[r], qy), acc[r][p]);
            }
        }
    }
    let mut out = [[0.0f32; 8]; 4];
    for r in 0..4 {
        let mut m = [0.0f32; 8];
        _mm256_storeu_ps(m.as_mut_ptr(), summs[r]);
        out[r] = unpair(&acc[r]);
        for (o, s) in out[r].iter_mut().zip(m) {
            *o += s;
        }
    }
    out
}

/// A pair kernel's results for inputs `t..t + acc.len()`: each input's sixteen cells of
/// groups `g` and `g + 1` in an output `width` cells wide per input.
#[inline(always)]
unsafe fn store_pair(out: &mut [f32], acc: &[__m512], t: usize, width: usize, g: usize) {
    for (k, a) in acc.iter().enumerate() {
        let o = &mut out[(t + k) * width + 8 * g..(t + k) * width + 8 * g + 16];
        _mm512_storeu_ps(o.as_mut_ptr(), *a);
    }
}

/// `N` (1–8) Q8_0 rows against two groups of eight packed Q8_0 rows (`x0` in the low
/// eight lanes, `x1` in the high): per block and input, eight `vpdpbusd` of the
/// unsigned bytes against the input's broadcast bytes on top of 16 × its offset,
/// then one multiply (the scales) and one FMA.
#[inline(always)]
unsafe fn groups2_q8_0<const N: usize>(
    x0: &[BlockQ8_0x8],
    x1: &[BlockQ8_0x8],
    y: [&[BlockQ8_0]; N],
    yd: [&[f32]; N],
    yo: [&[i32]; N],
) -> [__m512; N] {
    let nb = x0.len();
    // Checked once here, so the loop indexes without bounds checks.
    assert!(x1.len() == nb);
    for t in 0..N {
        assert!(y[t].len() >= nb && yd[t].len() >= nb && yo[t].len() >= nb);
    }
    let mut acc = [_mm512_setzero_ps(); N];
    for i in 0..nb {
        let (a, b) = (x0.get_unchecked(i), x1.get_unchecked(i));
        super::x86::prefetch_ahead(x0, i);
        super::x86::prefetch_ahead(x1, i);
        let mut sum: [__m512i; N] = std::array::from_fn(|t| _mm512_set1_epi32(16 * *yo[t].get_unchecked(i)));
        for s in 0..8 {
            let w = pair_bytes(
                a.qs.as_ptr().add(32 * s) as *const i8,
                b.qs.as_ptr().add(32 * s) as *const i8,
            );
            for t in 0..N {
                let q = y[t].get_unchecked(i).qs.as_ptr();
                let qy = _mm512_set1_epi32((q.add(4 * s) as *const i32).read_unaligned());
                sum[t] = _mm512_dpbusd_epi32(sum[t], w, qy);
            }
        }
        let d = _mm512_cvtph_ps(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(a.d.as_ptr() as *const __m128i)),
            _mm_loadu_si128(b.d.as_ptr() as *const __m128i),
            1,
        ));
        for t in 0..N {
            let dd = _mm512_mul_ps(d, _mm512_set1_ps(*yd[t].get_unchecked(i)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), dd, acc[t]);
        }
    }
    acc
}

/// [`super::Kernels::q8_0x8`]: pairs of groups against the inputs eight at a time; a
/// last odd group goes through the 256-bit kernel (same arithmetic).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q8_0x8_q8_0(x: &[BlockQ8_0x8], y: &[BlockQ8_0], yd: &[f32], yo: &[i32], n: usize, out: &mut [f32]) {
    let (nb, groups) = super::x8_shape(x, y, yd, yo, n, out);
    let width = 8 * groups;
    let ins = |t: usize| t * nb..(t + 1) * nb;
    for pair in 0..groups / 2 {
        let g = 2 * pair;
        let (x0, x1) = (&x[g * nb..(g + 1) * nb], &x[(g + 1) * nb..(g + 2) * nb]);
        tiles!(n, 8, |t, M| {
            let acc = groups2_q8_0::<M>(
                x0,
                x1,
                std::array::from_fn(|k| &y[ins(t + k)]),
                std::array::from_fn(|k| &yd[ins(t + k)]),
                std::array::from_fn(|k| &yo[ins(t + k)]),
            );
            store_pair(out, &acc, t, width, g);
        });
    }
    if !groups.is_multiple_of(2) {
        let g = groups - 1;
        tiles!(n, 4, |t, M| {
            let acc = super::x86::avx512_vl::group_q8_0::<M>(
                &x[g * nb..(g + 1) * nb],
                std::array::from_fn(|k| &y[ins(t + k)]),
                std::array::from_fn(|k| &yd[ins(t + k)]),
                std::array::from_fn(|k| &yo[ins(t + k)]),
            );
            super::x86::store_tile(out, &acc, t, width, g);
        });
    }
}

/// `N` (1–8) inputs against two groups of eight packed 5-bit rows (`x0` in the low
/// eight lanes, `x1` in the high): [`super::x86`]'s `group_q5` arithmetic sixteen rows
/// at a time, the fifth bits added under a byte mask.
#[inline(always)]
unsafe fn groups2_q5<G: Fifth8, A: ActBlock, E: Extra, const N: usize>(
    x0: &[G],
    x1: &[G],
    y: [&[A]; N],
    yd: [&[f32]; N],
    ye: [&[E]; N],
) -> [__m512; N] {
    let nb = x0.len();
    // Checked once here, so the loop indexes without bounds checks.
    assert!(x1.len() == nb);
    for t in 0..N {
        assert!(y[t].len() >= nb && yd[t].len() >= nb && ye[t].len() >= nb);
    }
    let m4 = _mm512_set1_epi8(0x0f);
    let bit4 = _mm512_set1_epi8(0x10);
    // Row r's byte into each byte of lane r: 128-bit lanes 0 and 2 take rows 0–3 of
    // their group, lanes 1 and 3 rows 4–7.
    let spread = _mm512_broadcast_i64x4(_mm256_setr_epi8(
        0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7,
    ));
    let (lo_bits, hi_bits) = (_mm512_set1_epi32(0x0804_0201), _mm512_set1_epi32(0x8040_2010u32 as i32));
    let halves = |p: *const u16, q: *const u16| {
        _mm512_cvtph_ps(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(p as *const __m128i)),
            _mm_loadu_si128(q as *const __m128i),
            1,
        ))
    };
    let mut acc = [_mm512_setzero_ps(); N];
    for i in 0..nb {
        let (a, b) = (x0.get_unchecked(i), x1.get_unchecked(i));
        super::x86::prefetch_ahead(x0, i);
        super::x86::prefetch_ahead(x1, i);
        let mut sum: [__m512i; N] = std::array::from_fn(|t| {
            if G::MIN {
                _mm512_setzero_si512()
            } else {
                _mm512_set1_epi32(2 * ye[t].get_unchecked(i).offset())
            }
        });
        for s in 0..4 {
            let w = pair_bytes(
                a.qs().as_ptr().add(32 * s) as *const i8,
                b.qs().as_ptr().add(32 * s) as *const i8,
            );
            let h = |q: &[u8; 32]| _mm256_set1_epi64x((q.as_ptr().add(8 * s) as *const i64).read_unaligned());
            let rows = _mm512_shuffle_epi8(
                _mm512_inserti64x4(_mm512_castsi256_si512(h(a.qh())), h(b.qh()), 1),
                spread,
            );
            let lo = _mm512_and_si512(w, m4);
            let lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(rows, lo_bits), lo, bit4);
            let hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
            let hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(rows, hi_bits), hi, bit4);
            for t in 0..N {
                let q = y[t].get_unchecked(i).qs().as_ptr();
                let ql = _mm512_set1_epi32((q.add(4 * s) as *const i32).read_unaligned());
                let qh = _mm512_set1_epi32((q.add(16 + 4 * s) as *const i32).read_unaligned());
                sum[t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum[t], lo, ql), hi, qh);
            }
        }
        let d = halves(a.d().as_ptr(), b.d().as_ptr());
        for t in 0..N {
            let dd = _mm512_mul_ps(d, _mm512_set1_ps(*yd[t].get_unchecked(i)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), dd, acc[t]);
            if G::MIN {
                let m = halves(a.m().as_ptr(), b.m().as_ptr());
                acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(ye[t].get_unchecked(i).sum()), acc[t]);
            }
        }
    }
    acc
}

/// [`super::Kernels::q5_0x8`] and [`super::Kernels::q5_1x8`]: pairs of groups against
/// the inputs eight at a time; a last odd group goes through the 256-bit kernel (same
/// arithmetic).
#[inline(always)]
unsafe fn dot_q5x8<G: Fifth8, A: ActBlock, E: Extra>(
    x: &[G],
    y: &[A],
    yd: &[f32],
    ye: &[E],
    n: usize,
    out: &mut [f32],
) {
    let (nb, groups) = super::x8_shape(x, y, yd, ye, n, out);
    let width = 8 * groups;
    let ins = |t: usize| t * nb..(t + 1) * nb;
    for pair in 0..groups / 2 {
        let g = 2 * pair;
        let (x0, x1) = (&x[g * nb..(g + 1) * nb], &x[(g + 1) * nb..(g + 2) * nb]);
        tiles!(n, 8, |t, M| {
            let acc = groups2_q5::<G, A, E, M>(
                x0,
                x1,
                std::array::from_fn(|k| &y[ins(t + k)]),
                std::array::from_fn(|k| &yd[ins(t + k)]),
                std::array::from_fn(|k| &ye[ins(t + k)]),
            );
            store_pair(out, &acc, t, width, g);
        });
    }
    if !groups.is_multiple_of(2) {
        let g = groups - 1;
        tiles!(n, 4, |t, M| {
            let acc = super::x86::avx512_vl::group_q5::<G, A, E, M>(
                &x[g * nb..(g + 1) * nb],
                std::array::from_fn(|k| &y[ins(t + k)]),
                std::array::from_fn(|k| &yd[ins(t + k)]),
                std::array::from_fn(|k| &ye[ins(t + k)]),
            );
            super::x86::store_tile(out, &acc, t, width, g);
        });
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q5_0x8_q8_0(x: &[BlockQ5_0x8], y: &[BlockQ8_0], yd: &[f32], yo: &[i32], n: usize, out: &mut [f32]) {
    dot_q5x8(x, y, yd, yo, n, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q5_1x8_q8_1(x: &[BlockQ5_1x8], y: &[BlockQ8_1], yd: &[f32], ys: &[f32], n: usize, out: &mut [f32]) {
    dot_q5x8(x, y, yd, ys, n, out)
}

/// `N` (1–8) Q8_0 rows against two groups of eight packed Q4_0 rows (`x0` in the low
/// eight lanes, `x1` in the high): per block and input, eight `vpdpbusd` of the
/// unsigned nibbles against the input's broadcast bytes on top of its offset, then
/// one multiply (the scales) and one FMA.
#[inline(always)]
unsafe fn groups2_q4_0<const N: usize>(
    x0: &[BlockQ4_0x8],
    x1: &[BlockQ4_0x8],
    y: [&[BlockQ8_0]; N],
    yd: [&[f32]; N],
    yo: [&[i32]; N],
) -> [__m512; N] {
    let nb = x0.len();
    // Checked once here, so the loop indexes without bounds checks.
    assert!(x1.len() == nb);
    for t in 0..N {
        assert!(y[t].len() >= nb && yd[t].len() >= nb && yo[t].len() >= nb);
    }
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); N];
    for i in 0..nb {
        let (a, b) = (x0.get_unchecked(i), x1.get_unchecked(i));
        let mut sum: [__m512i; N] = std::array::from_fn(|t| _mm512_set1_epi32(*yo[t].get_unchecked(i)));
        for s in 0..4 {
            let w = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(a.qs.as_ptr().add(32 * s) as *const __m256i)),
                _mm256_loadu_si256(b.qs.as_ptr().add(32 * s) as *const __m256i),
                1,
            );
            let lo = _mm512_and_si512(w, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
            for t in 0..N {
                let q = y[t].get_unchecked(i).qs.as_ptr();
                let ql = _mm512_set1_epi32((q.add(4 * s) as *const i32).read_unaligned());
                let qh = _mm512_set1_epi32((q.add(16 + 4 * s) as *const i32).read_unaligned());
                sum[t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum[t], lo, ql), hi, qh);
            }
        }
        let d = _mm512_cvtph_ps(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(a.d.as_ptr() as *const __m128i)),
            _mm_loadu_si128(b.d.as_ptr() as *const __m128i),
            1,
        ));
        for t in 0..N {
            let dd = _mm512_mul_ps(d, _mm512_set1_ps(*yd[t].get_unchecked(i)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), dd, acc[t]);
        }
    }
    acc
}

/// [`super::Kernels::q4_0x8`]: pairs of groups against the inputs eight at a time;
/// a last odd group goes through the 256-bit kernel (same arithmetic).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q4_0x8_q8_0(x: &[BlockQ4_0x8], y: &[BlockQ8_0], yd: &[f32], yo: &[i32], n: usize, out: &mut [f32]) {
    let (nb, groups) = super::x8_shape(x, y, yd, yo, n, out);
    let width = 8 * groups;
    let ins = |t: usize| t * nb..(t + 1) * nb;
    for pair in 0..groups / 2 {
        let g = 2 * pair;
        let (x0, x1) = (&x[g * nb..(g + 1) * nb], &x[(g + 1) * nb..(g + 2) * nb]);
        tiles!(n, 8, |t, M| {
            let acc = groups2_q4_0::<M>(
                x0,
                x1,
                std::array::from_fn(|k| &y[ins(t + k)]),
                std::array::from_fn(|k| &yd[ins(t + k)]),
                std::array::from_fn(|k| &yo[ins(t + k)]),
            );
            store_pair(out, &acc, t, width, g);
        });
    }
    if !groups.is_multiple_of(2) {
        let g = groups - 1;
        tiles!(n, 4, |t, M| {
            let acc = super::x86::avx512_vl::group_q4_0::<M>(
                &x[g * nb..(g + 1) * nb],
                std::array::from_fn(|k| &y[ins(t + k)]),
                std::array::from_fn(|k| &yd[ins(t + k)]),
                std::array::from_fn(|k| &yo[ins(t + k)]),
            );
            super::x86::store_tile(out, &acc, t, width, g);
        });
    }
}

/// `N` (1–8) Q8_K rows against two groups of eight packed Q4_K or Q5_K rows (`x0` in
/// the low eight lanes, `x1` in the high): per sub-block eight `vpdpbusd` of the
/// unsigned values (Q5_K: the nibbles with their fifth bits) against the input's
/// broadcast bytes, one `vpmulld` by the sub-block scales; the mins in `vpmaddwd`
/// against the input's sub-block sums; two FMAs per super-block and cell.
#[inline(always)]
unsafe fn groups2_k<G: KGroup, const N: usize>(
    x0: &[G],
    x1: &[G],
    y: [&[BlockQ8K]; N],
    ym: [&[[i32; 4]]; N],
) -> [__m512; N] {
    let nb = x0.len();
    // Checked once here, so the loop indexes without bounds checks.
    assert!(x1.len() == nb);
    for t in 0..N {
        assert!(y[t].len() >= nb && ym[t].len() >= nb);
    }
    let m4 = _mm512_set1_epi8(0x0f);
    let bit4 = _mm512_set1_epi8(0x10);
    let pair256 = |a: *const u8, b: *const u8| {
        _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(a as *const __m256i)),
            _mm256_loadu_si256(b as *const __m256i),
            1,
        )
    };
    let pair128 = |a: *const u8, b: *const u8| {
        _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(a as *const __m128i)),
            _mm_loadu_si128(b as *const __m128i),
            1,
        )
    };
    let mut acc = [_mm512_setzero_ps(); N];
    for i in 0..nb {
        let (ga, gb) = (x0.get_unchecked(i), x1.get_unchecked(i));
        if i + 1 < nb {
            super::x86::prefetch_block(x0.get_unchecked(i + 1));
            super::x86::prefetch_block(x1.get_unchecked(i + 1));
        }
        let (a, b) = (ga.low(), gb.low());
        let mut sums = [_mm512_setzero_si512(); N];
        for k in 0..4 {
            // Sub-block 2k's fifth bits are bit 2k of each `qh` byte.
            let hshift = _mm_cvtsi32_si128(2 * k as i32);
            let (mut lo_sum, mut hi_sum) = ([_mm512_setzero_si512(); N], [_mm512_setzero_si512(); N]);
            for s in 0..8 {
                let w = pair256(a.qs.as_ptr().add(256 * k + 32 * s), b.qs.as_ptr().add(256 * k + 32 * s));
                let mut lo = _mm512_and_si512(w, m4);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
                if G::HIGH {
                    let h = pair256(ga.qh().as_ptr().add(32 * s), gb.qh().as_ptr().add(32 * s));
                    let h = _mm512_srl_epi16(h, hshift);
                    lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(h, 4), bit4));
                    hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_slli_epi16(h, 3), bit4));
                }
                for t in 0..N {
                    let q = y[t].get_unchecked(i).qs.as_ptr().add(64 * k + 4 * s);
                    let ql = _mm512_set1_epi32((q as *const i32).read_unaligned());
                    let qh = _mm512_set1_epi32((q.add(32) as *const i32).read_unaligned());
                    lo_sum[t] = _mm512_dpbusd_epi32(lo_sum[t], lo, ql);
                    hi_sum[t] = _mm512_dpbusd_epi32(hi_sum[t], hi, qh);
                }
            }
            let scale = |j: usize| {
                let both = _mm_unpacklo_epi64(
                    _mm_loadl_epi64(a.scales[j].as_ptr() as *const __m128i),
                    _mm_loadl_epi64(b.scales[j].as_ptr() as *const __m128i),
                );
                _mm512_cvtepu8_epi32(both)
            };
            let (sl, sh) = (scale(2 * k), scale(2 * k + 1));
            for t in 0..N {
                let l = _mm512_mullo_epi32(lo_sum[t], sl);
                let h = _mm512_mullo_epi32(hi_sum[t], sh);
                sums[t] = _mm512_add_epi32(sums[t], _mm512_add_epi32(l, h));
            }
        }
        let d = _mm512_cvtph_ps(pair128(a.d.as_ptr() as *const u8, b.d.as_ptr() as *const u8));
        let dmin = _mm512_cvtph_ps(pair128(a.dmin.as_ptr() as *const u8, b.dmin.as_ptr() as *const u8));
        for t in 0..N {
            let pairs = ym[t].get_unchecked(i);
            let mut mins = _mm512_setzero_si512();
            for (p, &pair) in pairs.iter().enumerate() {
                let m = _mm512_cvtepu8_epi16(pair128(a.mins[p].as_ptr(), b.mins[p].as_ptr()));
                mins = _mm512_add_epi32(mins, _mm512_madd_epi16(m, _mm512_set1_epi32(pair)));
            }
            let dy = _mm512_set1_ps(y[t].get_unchecked(i).d);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[t]), _mm512_mul_ps(d, dy), acc[t]);
            let neg = _mm512_xor_ps(_mm512_mul_ps(dmin, dy), _mm512_set1_ps(-0.0));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), neg, acc[t]);
        }
    }
    acc
}

/// [`super::Kernels::q4_kx8`] and [`super::Kernels::q5_kx8`]: pairs of groups against
/// the inputs eight at a time; a last odd group goes through the 256-bit kernel (same
/// arithmetic).
#[inline(always)]
unsafe fn dot_kx8<G: KGroup>(x: &[G], y: &[BlockQ8K], ym: &[[i32; 4]], n: usize, out: &mut [f32]) {
    let (nb, groups) = super::kx8_shape(x, y, ym, n, out);
    let width = 8 * groups;
    let ins = |t: usize| t * nb..(t + 1) * nb;
    for pair in 0..groups / 2 {
        let g = 2 * pair;
        let (x0, x1) = (&x[g * nb..(g + 1) * nb], &x[(g + 1) * nb..(g + 2) * nb]);
        tiles!(n, 8, |t, M| {
            let acc = groups2_k::<G, M>(
                x0,
                x1,
                std::array::from_fn(|k| &y[ins(t + k)]),
                std::array::from_fn(|k| &ym[ins(t + k)]),
            );
            store_pair(out, &acc, t, width, g);
        });
    }
    if !groups.is_multiple_of(2) {
        let g = groups - 1;
        tiles!(n, 4, |t, M| {
            let acc = super::x86::avx512_vl::group_k::<G, M>(
                &x[g * nb..(g + 1) * nb],
                std::array::from_fn(|k| &y[ins(t + k)]),
                std::array::from_fn(|k| &ym[ins(t + k)]),
            );
            super::x86::store_tile(out, &acc, t, width, g);
        });
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q4_kx8_q8_k(x: &[BlockQ4Kx8], y: &[BlockQ8K], ym: &[[i32; 4]], n: usize, out: &mut [f32]) {
    dot_kx8(x, y, ym, n, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q5_kx8_q8_k(x: &[BlockQ5Kx8], y: &[BlockQ8K], ym: &[[i32; 4]], n: usize, out: &mut [f32]) {
    dot_kx8(x, y, ym, n, out)
}

/// `N` (1–8) Q8_K rows against two groups of eight packed Q6_K rows, sixteen rows per
/// register: [`super::x86`]'s `group_q6k` arithmetic, each cell bit for bit.
#[inline(always)]
unsafe fn groups2_q6k<const N: usize>(x0: &[BlockQ6Kx8], x1: &[BlockQ6Kx8], y: [&[BlockQ8K]; N]) -> [__m512; N] {
    let nb = x0.len();
    // Checked once here, so the loop indexes without bounds checks.
    assert!(x1.len() == nb);
    for t in 0..N {
        assert!(y[t].len() >= nb);
    }
    let m4 = _mm512_set1_epi8(0x0f);
    let m2 = _mm512_set1_epi8(0x30);
    let pair256 = |a: *const u8, b: *const u8| {
        _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(a as *const __m256i)),
            _mm256_loadu_si256(b as *const __m256i),
            1,
        )
    };
    let mut acc = [_mm512_setzero_ps(); N];
    for i in 0..nb {
        let (a, b) = (x0.get_unchecked(i), x1.get_unchecked(i));
        // The next super-blocks, a line at a time (see the 256-bit kernel).
        if i + 1 < nb {
            super::x86::prefetch_block(x0.get_unchecked(i + 1));
            super::x86::prefetch_block(x1.get_unchecked(i + 1));
        }
        // Sub-block j's scale in each of the sixteen rows' lanes.
        let scale = |j: usize| {
            let pairs = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128(a.scales[j / 2].as_ptr() as *const __m128i)),
                _mm_loadu_si128(b.scales[j / 2].as_ptr() as *const __m128i),
                1,
            ));
            if j.is_multiple_of(2) {
                _mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16)
            } else {
                _mm512_srai_epi32(pairs, 16)
            }
        };
        let mut sums = [_mm512_setzero_si512(); N];
        // The 32-value chunk `2·half + h` of every row: low nibbles are sub-blocks
        // 8·half + 2h (steps 0–3) and + 1 (steps 4–7), high nibbles the same plus 4.
        // `h` is a literal, so the shifts below are immediates (a shift by a register
        // is two uops), and each run of four steps is straight-line code.
        macro_rules! chunk {
            ($half:literal, $h:literal) => {
                for q in 0..2 {
                    let j = 8 * $half + 2 * $h + q;
                    let (ls, hs) = (scale(j), scale(j + 4));
                    let (mut lo_sum, mut hi_sum) = ([_mm512_setzero_si512(); N], [_mm512_setzero_si512(); N]);
                    for s in 4 * q..4 * q + 4 {
                        let w = pair256(
                            a.ql.as_ptr().add(256 * (2 * $half + $h) + 32 * s),
                            b.ql.as_ptr().add(256 * (2 * $half + $h) + 32 * s),
                        );
                        let bits = pair256(
                            a.qh.as_ptr().add(256 * $half + 32 * s),
                            b.qh.as_ptr().add(256 * $half + 32 * s),
                        );
                        let (up, down) = if $h == 0 {
                            (_mm512_slli_epi16(bits, 4), bits)
                        } else {
                            (_mm512_slli_epi16(bits, 2), _mm512_srli_epi16(bits, 2))
                        };
                        let lo = _mm512_or_si512(_mm512_and_si512(w, m4), _mm512_and_si512(up, m2));
                        let hi = _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16(w, 4), m4),
                            _mm512_and_si512(down, m2),
                        );
                        for t in 0..N {
                            let q = y[t]
                                .get_unchecked(i)
                                .qs
                                .as_ptr()
                                .add(128 * $half + 32 * $h + 4 * s);
                            let ql = _mm512_set1_epi32((q as *const i32).read_unaligned());
                            let qh = _mm512_set1_epi32((q.add(64) as *const i32).read_unaligned());
                            lo_sum[t] = _mm512_dpbusd_epi32(lo_sum[t], lo, ql);
                            hi_sum[t] = _mm512_dpbusd_epi32(hi_sum[t], hi, qh);
                        }
                    }
                    for t in 0..N {
                        let l = _mm512_mullo_epi32(lo_sum[t], ls);
                        let h = _mm512_mullo_epi32(hi_sum[t], hs);
                        sums[t] = _mm512_add_epi32(sums[t], _mm512_add_epi32(l, h));
                    }
                }
            };
        }
        chunk!(0, 0);
        chunk!(0, 1);
        chunk!(1, 0);
        chunk!(1, 1);
        let d = _mm512_cvtph_ps(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(a.d.as_ptr() as *const __m128i)),
            _mm_loadu_si128(b.d.as_ptr() as *const __m128i),
            1,
        ));
        for t in 0..N {
            let yb = y[t].get_unchecked(i);
            let mut offset = _mm512_setzero_si512();
            for p in 0..8 {
                let sc = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128(a.scales[p].as_ptr() as *const __m128i)),
                    _mm_loadu_si128(b.scales[p].as_ptr() as *const __m128i),
                    1,
                ));
                let pair = _mm512_set1_epi32((yb.bsums.as_ptr().add(2 * p) as *const i32).read_unaligned());
                offset = _mm512_add_epi32(offset, _mm512_madd_epi16(sc, pair));
            }
            let sum = _mm512_sub_epi32(sums[t], _mm512_slli_epi32(offset, 5));
            let dy = _mm512_set1_ps(yb.d);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, dy), acc[t]);
        }
    }
    acc
}

/// [`super::Kernels::q6_kx8`]: pairs of groups against the inputs eight at a time; a
/// last odd group goes through the 256-bit kernel (same arithmetic).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q6_kx8_q8_k(x: &[BlockQ6Kx8], y: &[BlockQ8K], ym: &[[i32; 4]], n: usize, out: &mut [f32]) {
    let (nb, groups) = super::kx8_shape(x, y, ym, n, out);
    let width = 8 * groups;
    let ins = |t: usize| t * nb..(t + 1) * nb;
    for pair in 0..groups / 2 {
        let g = 2 * pair;
        let (x0, x1) = (&x[g * nb..(g + 1) * nb], &x[(g + 1) * nb..(g + 2) * nb]);
        tiles!(n, 8, |t, M| {
            let acc = groups2_q6k::<M>(x0, x1, std::array::from_fn(|k| &y[ins(t + k)]));
            store_pair(out, &acc, t, width, g);
        });
    }
    if !groups.is_multiple_of(2) {
        let g = groups - 1;
        tiles!(n, 4, |t, M| {
            let acc = super::x86::avx512_vl::group_q6k::<M>(
                &x[g * nb..(g + 1) * nb],
                std::array::from_fn(|k| &y[ins(t + k)]),
            );
            super::x86::store_tile(out, &acc, t, width, g);
        });
    }
}
