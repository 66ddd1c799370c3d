//! AVX-512 (F/BW/VL/DQ + VNNI) kernels over the packed types ([`dot_q4_0x8_q8_0`],
//! [`dot_q4_1x8_q8_1`], [`dot_q5_0x8_q8_0`], [`dot_q5_1x8_q8_1`], [`dot_q8_0x8_q8_0`],
//! [`dot_q4_kx8_q8_k`], …): two packed groups of eight rows fill a register, one row
//! per lane, against up to eight inputs at a time, with the blocks finished in
//! integers (the portable kernels' arithmetic for those types). A last odd group, and
//! every group of a one-input call (decode, see [`paired`]), goes through the 256-bit
//! kernels with EVEX `vpdpbusd` (`x86::avx512_vl`), which also serve the f32 and f16
//! vector helpers.

// Tiles index rows, pairs and accumulators together; index loops say that best.
#![allow(clippy::needless_range_loop)]

use crate::kernels::kquants::{BlockQ4Kx8, BlockQ5Kx8, BlockQ6Kx8, BlockQ8K, KGroup};
use crate::kernels::quants::{
    ActBlock, BlockQ4_0x8, BlockQ4_1x8, BlockQ5_0x8, BlockQ5_1x8, BlockQ8_0, BlockQ8_0x8, BlockQ8_1, Extra, Nibbles8,
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

/// How many pairs of groups go through the 512-bit kernels for `n` inputs; the rest go
/// one group at a time through the 256-bit ones (same bits). A decode step (one input)
/// goes through the 256-bit kernels only: measured on a 2-core AMD EPYC (Zen 4, whose
/// 512-bit instructions are double-pumped), reading two groups' streams at a time cost
/// a third of the decode rate at 1.5B (Q4_0 29.6 → 44.8 tok/s one group at a time,
/// Q4_1 24.1 → 35.6, Q4_K_M 19.9 → 28.4), while prefill measured the same either way
/// there; on the Intel Xeon where the pairs were measured, prefill gained from them
/// (the K-quants' eight-input tiles: 1.5B Q6_K 1.05× → 1.27× of llama.cpp).
#[inline(always)]
fn paired(n: usize, groups: usize) -> usize {
    if n >= 2 {
        groups / 2
    } else {
        0
    }
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
/// other groups (see [`paired`]) go through the 256-bit kernel (same arithmetic).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q8_0x8_q8_0(x: &[BlockQ8_0x8], y: &[BlockQ8_0], yd: &[f32], yo: &[i32], n: usize, out: &mut [f32]) {
    let (nb, groups) = super::x8_shape(x, y, yd, yo, n, out);
    let width = 8 * groups;
    let ins = |t: usize| t * nb..(t + 1) * nb;
    let pairs = paired(n, groups);
    for pair in 0..pairs {
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
    for g in 2 * pairs..groups {
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

/// `N` (1–8) inputs against two groups of eight packed rows of small unsigned values
/// (`x0` in the low eight lanes, `x1` in the high): [`super::x86`]'s `group_nibbles`
/// arithmetic sixteen rows at a time, the fifth bits (where there are any) added under
/// a byte mask.
#[inline(always)]
unsafe fn groups2_nibbles<G: Nibbles8, A: ActBlock, E: Extra, const N: usize>(
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
            let mut lo = _mm512_and_si512(w, m4);
            let mut hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
            if G::FIFTH {
                let h = |q: &[u8; 32]| _mm256_set1_epi64x((q.as_ptr().add(8 * s) as *const i64).read_unaligned());
                let rows = _mm512_shuffle_epi8(
                    _mm512_inserti64x4(_mm512_castsi256_si512(h(a.qh())), h(b.qh()), 1),
                    spread,
                );
                lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(rows, lo_bits), lo, bit4);
                hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(rows, hi_bits), hi, bit4);
            }
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

/// [`super::Kernels::q4_1x8`], [`super::Kernels::q5_0x8`] and [`super::Kernels::q5_1x8`]: pairs of groups against
/// the inputs eight at a time; the other groups (see [`paired`]) go
/// through the 256-bit kernel (same arithmetic).
#[inline(always)]
unsafe fn dot_nibbles_x8<G: Nibbles8, A: ActBlock, E: Extra>(
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
    let pairs = paired(n, groups);
    for pair in 0..pairs {
        let g = 2 * pair;
        let (x0, x1) = (&x[g * nb..(g + 1) * nb], &x[(g + 1) * nb..(g + 2) * nb]);
        tiles!(n, 8, |t, M| {
            let acc = groups2_nibbles::<G, A, E, M>(
                x0,
                x1,
                std::array::from_fn(|k| &y[ins(t + k)]),
                std::array::from_fn(|k| &yd[ins(t + k)]),
                std::array::from_fn(|k| &ye[ins(t + k)]),
            );
            store_pair(out, &acc, t, width, g);
        });
    }
    for g in 2 * pairs..groups {
        tiles!(n, 4, |t, M| {
            let acc = super::x86::avx512_vl::group_nibbles::<G, A, E, M>(
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
    dot_nibbles_x8(x, y, yd, yo, n, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q4_1x8_q8_1(x: &[BlockQ4_1x8], y: &[BlockQ8_1], yd: &[f32], ys: &[f32], n: usize, out: &mut [f32]) {
    dot_nibbles_x8(x, y, yd, ys, n, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q5_1x8_q8_1(x: &[BlockQ5_1x8], y: &[BlockQ8_1], yd: &[f32], ys: &[f32], n: usize, out: &mut [f32]) {
    dot_nibbles_x8(x, y, yd, ys, n, out)
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
/// the other groups (see [`paired`]) go
/// through the 256-bit kernel (same arithmetic).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q4_0x8_q8_0(x: &[BlockQ4_0x8], y: &[BlockQ8_0], yd: &[f32], yo: &[i32], n: usize, out: &mut [f32]) {
    let (nb, groups) = super::x8_shape(x, y, yd, yo, n, out);
    let width = 8 * groups;
    let ins = |t: usize| t * nb..(t + 1) * nb;
    let pairs = paired(n, groups);
    for pair in 0..pairs {
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
    for g in 2 * pairs..groups {
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
/// the inputs eight at a time; the other groups (see [`paired`]) go
/// through the 256-bit kernel (same arithmetic).
#[inline(always)]
unsafe fn dot_kx8<G: KGroup>(x: &[G], y: &[BlockQ8K], ym: &[[i32; 4]], n: usize, out: &mut [f32]) {
    let (nb, groups) = super::kx8_shape(x, y, ym, n, out);
    let width = 8 * groups;
    let ins = |t: usize| t * nb..(t + 1) * nb;
    let pairs = paired(n, groups);
    for pair in 0..pairs {
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
    for g in 2 * pairs..groups {
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
                            a.q.as_ptr().add(BlockQ6Kx8::ql_at(2 * $half + $h, s)),
                            b.q.as_ptr().add(BlockQ6Kx8::ql_at(2 * $half + $h, s)),
                        );
                        let bits = pair256(
                            a.q.as_ptr().add(BlockQ6Kx8::qh_at($half, s)),
                            b.q.as_ptr().add(BlockQ6Kx8::qh_at($half, s)),
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
/// other groups (see [`paired`]) go through the 256-bit kernel (same arithmetic).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q6_kx8_q8_k(x: &[BlockQ6Kx8], y: &[BlockQ8K], ym: &[[i32; 4]], n: usize, out: &mut [f32]) {
    let (nb, groups) = super::kx8_shape(x, y, ym, n, out);
    let width = 8 * groups;
    let ins = |t: usize| t * nb..(t + 1) * nb;
    let pairs = paired(n, groups);
    for pair in 0..pairs {
        let g = 2 * pair;
        let (x0, x1) = (&x[g * nb..(g + 1) * nb], &x[(g + 1) * nb..(g + 2) * nb]);
        tiles!(n, 8, |t, M| {
            let acc = groups2_q6k::<M>(x0, x1, std::array::from_fn(|k| &y[ins(t + k)]));
            store_pair(out, &acc, t, width, g);
        });
    }
    for g in 2 * pairs..groups {
        tiles!(n, 4, |t, M| {
            let acc = super::x86::avx512_vl::group_q6k::<M>(
                &x[g * nb..(g + 1) * nb],
                std::array::from_fn(|k| &y[ins(t + k)]),
            );
            super::x86::store_tile(out, &acc, t, width, g);
        });
    }
}
