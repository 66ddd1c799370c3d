//! The 256-bit kernels over the packed types and the f32/f16 vector helpers, compiled
//! three times: for AVX2 + FMA + F16C ([`avx2`], `vpmaddubsw` + `vpmaddwd` for the
//! 8-bit multiply-adds), with AVX-VNNI's `vpdpbusd` ([`avx_vnni`]), and with AVX-512
//! VNNI's EVEX `vpdpbusd` on 256-bit registers ([`avx512_vl`], for the AVX-512 table's
//! f32 helpers and a last odd packed group). `vpdpbusd` sums the same four products
//! per 32-bit lane that `vpmaddubsw` + `vpmaddwd` do, and the kernels bound the 16-bit
//! sums so that neither saturates: every variant gives the same integers and floats.
//!
//! Every function is `unsafe`: the caller guarantees the CPU has the module's
//! features ([`super::Kernels::get`] hands them out only then).

/// ggml's `hsum_float_8`: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
#[inline(always)]
pub(super) unsafe fn hsum_float_8(x: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let mut res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}

/// f16 bits → f32 with F16C, as `vmovd` + `vcvtph2ps` from a general register.
/// (LLVM compiles the intrinsic form to `vpinsrw` into whatever vector register it
/// likes, which makes the conversion wait on that register's last writer: in the dot
/// products, the running sum, so every block joined one long dependency chain.)
#[inline(always)]
pub(super) unsafe fn h2f(h: u16) -> f32 {
    let r: f32;
    // SAFETY: the caller runs on a CPU with F16C; register-only, no memory access.
    std::arch::asm!(
        "vmovd {x}, {g:e}",
        "vcvtph2ps {x}, {x}",
        g = in(reg) h as u32,
        x = out(xmm_reg) r,
        options(pure, nomem, nostack, preserves_flags),
    );
    r
}

/// Asks for the cache line `PREFETCH_BYTES` past block `i` of a weight row. A decode
/// step streams every row once, and measured on a 0.5B Q5_K_M model (mostly Q5_1),
/// the row kernels spent most of their time waiting on the weights' loads: the
/// hardware prefetchers, shared by the threads' streams, run too little ahead.
/// (A prefetch past the row's end is harmless: it cannot fault.)
#[inline(always)]
pub(super) unsafe fn prefetch_ahead<B>(x: &[B], i: usize) {
    use std::arch::x86_64::*;
    const PREFETCH_BYTES: usize = 768;
    let p = (x.as_ptr() as *const i8).wrapping_add(i * std::mem::size_of::<B>() + PREFETCH_BYTES);
    _mm_prefetch(p, _MM_HINT_T0);
}

/// Step `s`'s fifth bits of a packed Q5_0 or Q5_1 group ([`crate::kernels::quants::BlockQ5_1x8`])
/// as 0x10 in the bytes of the values they belong to: lane `r`'s four low-nibble
/// values, then its four high-nibble values.
#[inline(always)]
pub(super) unsafe fn fifth_bits(qh: &[u8; 32], s: usize) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    let rows = _mm256_set1_epi64x((qh.as_ptr().add(8 * s) as *const i64).read_unaligned());
    // Row r's byte into each byte of lane r (both halves hold the eight bytes).
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7,
    );
    let b = _mm256_shuffle_epi8(rows, spread);
    let (lo, hi) = (_mm256_set1_epi32(0x0804_0201), _mm256_set1_epi32(0x8040_2010u32 as i32));
    let bit4 = _mm256_set1_epi8(0x10);
    let set = |mask: __m256i| _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, mask), mask), bit4);
    (set(lo), set(hi))
}

/// A group kernel's results for inputs `t..t + acc.len()`: each input's eight cells of
/// group `g` in an output `width` cells wide per input.
#[inline(always)]
pub(super) unsafe fn store_tile(out: &mut [f32], acc: &[std::arch::x86_64::__m256], t: usize, width: usize, g: usize) {
    for (k, a) in acc.iter().enumerate() {
        let o = &mut out[(t + k) * width + 8 * g..(t + k) * width + 8 * g + 8];
        std::arch::x86_64::_mm256_storeu_ps(o.as_mut_ptr(), *a);
    }
}

/// Which instruction does the 8-bit multiply-adds.
#[derive(PartialEq, Eq)]
enum Dot {
    /// `vpmaddubsw` + `vpmaddwd` (AVX2).
    Madd,
    /// VEX `vpdpbusd` (AVX-VNNI).
    AvxVnni,
    /// EVEX `vpdpbusd` on 256-bit registers (AVX-512 VNNI + VL: Ice Lake, Zen 4 and
    /// others have it without AVX-VNNI).
    Avx512Vnni,
}

macro_rules! x86_kernels {
    ($(#[$attr:meta])* $module:ident, $features:literal, $dot:expr) => {
        $(#[$attr])*
        pub mod $module {
            use super::*;
            use crate::kernels::kquants::{BlockQ4Kx8, BlockQ5Kx8, BlockQ6Kx8, BlockQ8K, KGroup};
            use crate::kernels::quants::{ActBlock, BlockQ4_0x8, BlockQ4_1x8, BlockQ5_0x8, BlockQ5_1x8, BlockQ8_0, BlockQ8_0x8, BlockQ8_1, Extra, Nibbles8};
            use std::arch::x86_64::*;

            /// `N` (1–4) Q8_0 rows against one group of eight packed Q4_0 rows, one
            /// row per lane: the nibbles taken as unsigned bytes, each block's
            /// integer sums plus the inputs' offsets, then one f32 multiply (the
            /// scales) and one FMA per block and cell, as the portable kernel.
            #[inline(always)]
            pub(in crate::kernels::simd) unsafe fn group_q4_0<const N: usize>(
                x: &[BlockQ4_0x8],
                y: [&[BlockQ8_0]; N],
                yd: [&[f32]; N],
                yo: [&[i32]; N],
            ) -> [__m256; N] {
                // Checked once here, so the loop indexes without bounds checks.
                for t in 0..N {
                    assert!(y[t].len() >= x.len() && yd[t].len() >= x.len() && yo[t].len() >= x.len());
                }
                let m4 = _mm256_set1_epi8(0x0f);
                let mut acc = [_mm256_setzero_ps(); N];
                for (i, a) in x.iter().enumerate() {
                    // i16 sums (AVX2: sixteen products each, at most 16 · 15 · 128 =
                    // 30,720 in magnitude, so nothing saturates or wraps) or i32
                    // lanes (VNNI).
                    let mut sum = [_mm256_setzero_si256(); N];
                    for s in 0..4 {
                        let w = _mm256_loadu_si256(a.qs.as_ptr().add(32 * s) as *const __m256i);
                        let lo = _mm256_and_si256(w, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                        for t in 0..N {
                            let q = y[t].get_unchecked(i).qs.as_ptr();
                            let ql = _mm256_set1_epi32((q.add(4 * s) as *const i32).read_unaligned());
                            let qh = _mm256_set1_epi32((q.add(16 + 4 * s) as *const i32).read_unaligned());
                            sum[t] = if $dot == Dot::AvxVnni {
                                _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(sum[t], lo, ql), hi, qh)
                            } else if $dot == Dot::Avx512Vnni {
                                _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(sum[t], lo, ql), hi, qh)
                            } else {
                                let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ql), _mm256_maddubs_epi16(hi, qh));
                                _mm256_add_epi16(sum[t], p)
                            };
                        }
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(a.d.as_ptr() as *const __m128i));
                    for t in 0..N {
                        let mut isum = sum[t];
                        if $dot == Dot::Madd {
                            isum = _mm256_madd_epi16(isum, _mm256_set1_epi16(1));
                        }
                        isum = _mm256_add_epi32(isum, _mm256_set1_epi32(*yo[t].get_unchecked(i)));
                        let dd = _mm256_mul_ps(d, _mm256_set1_ps(*yd[t].get_unchecked(i)));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[t]);
                    }
                }
                acc
            }

            /// [`super::super::Kernels::q4_0x8`]: each group against the inputs four
            /// at a time.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_q4_0x8_q8_0(
                x: &[BlockQ4_0x8],
                y: &[BlockQ8_0],
                yd: &[f32],
                yo: &[i32],
                n: usize,
                out: &mut [f32],
            ) {
                let (nb, groups) = crate::kernels::simd::x8_shape(x, y, yd, yo, n, out);
                let width = 8 * groups;
                for g in 0..groups {
                    let xg = &x[g * nb..(g + 1) * nb];
                    tiles!(n, 4, |t, M| {
                        let ins = |k: usize| (t + k) * nb..(t + k + 1) * nb;
                        let acc = group_q4_0::<M>(
                            xg,
                            std::array::from_fn(|k| &y[ins(k)]),
                            std::array::from_fn(|k| &yd[ins(k)]),
                            std::array::from_fn(|k| &yo[ins(k)]),
                        );
                        store_tile(out, &acc, t, width, g);
                    });
                }
            }

            /// `N` (1–4) Q8_0 rows against one group of eight packed Q8_0 rows, one
            /// row per lane: the values as unsigned bytes `q + 128` against the
            /// input's broadcast bytes on top of 16 × its offset (`−128 · Σ y`), then
            /// one multiply (the scales) and one FMA per block and cell, as the
            /// portable kernel.
            #[inline(always)]
            pub(in crate::kernels::simd) unsafe fn group_q8_0<const N: usize>(
                x: &[BlockQ8_0x8],
                y: [&[BlockQ8_0]; N],
                yd: [&[f32]; N],
                yo: [&[i32]; N],
            ) -> [__m256; N] {
                // Checked once here, so the loop indexes without bounds checks.
                for t in 0..N {
                    assert!(y[t].len() >= x.len() && yd[t].len() >= x.len() && yo[t].len() >= x.len());
                }
                let mut acc = [_mm256_setzero_ps(); N];
                for (i, a) in x.iter().enumerate() {
                    prefetch_ahead(x, i);
                    // VNNI: the unsigned bytes on top of the offset. AVX2: ggml's sign
                    // trick on the signed values (|q| · ±y in `vpmaddubsw`: at most
                    // 2 · 128 · 127 per pair, no saturation), no offset.
                    let mut sum: [__m256i; N] = std::array::from_fn(|t| {
                        if $dot == Dot::Madd {
                            _mm256_setzero_si256()
                        } else {
                            _mm256_set1_epi32(16 * *yo[t].get_unchecked(i))
                        }
                    });
                    for s in 0..8 {
                        let w = _mm256_loadu_si256(a.qs.as_ptr().add(32 * s) as *const __m256i);
                        let signed = _mm256_xor_si256(w, _mm256_set1_epi8(-128));
                        let abs = _mm256_sign_epi8(signed, signed);
                        for t in 0..N {
                            let q = y[t].get_unchecked(i).qs.as_ptr();
                            let qy = _mm256_set1_epi32((q.add(4 * s) as *const i32).read_unaligned());
                            sum[t] = if $dot == Dot::AvxVnni {
                                _mm256_dpbusd_avx_epi32(sum[t], w, qy)
                            } else if $dot == Dot::Avx512Vnni {
                                _mm256_dpbusd_epi32(sum[t], w, qy)
                            } else {
                                let p = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(qy, signed));
                                _mm256_add_epi32(sum[t], _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
                            };
                        }
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(a.d.as_ptr() as *const __m128i));
                    for t in 0..N {
                        let dd = _mm256_mul_ps(d, _mm256_set1_ps(*yd[t].get_unchecked(i)));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), dd, acc[t]);
                    }
                }
                acc
            }

            /// [`super::super::Kernels::q8_0x8`]: each group against the inputs four
            /// at a time.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_q8_0x8_q8_0(
                x: &[BlockQ8_0x8],
                y: &[BlockQ8_0],
                yd: &[f32],
                yo: &[i32],
                n: usize,
                out: &mut [f32],
            ) {
                let (nb, groups) = crate::kernels::simd::x8_shape(x, y, yd, yo, n, out);
                let width = 8 * groups;
                for g in 0..groups {
                    let xg = &x[g * nb..(g + 1) * nb];
                    tiles!(n, 4, |t, M| {
                        let ins = |k: usize| (t + k) * nb..(t + k + 1) * nb;
                        let acc = group_q8_0::<M>(
                            xg,
                            std::array::from_fn(|k| &y[ins(k)]),
                            std::array::from_fn(|k| &yd[ins(k)]),
                            std::array::from_fn(|k| &yo[ins(k)]),
                        );
                        store_tile(out, &acc, t, width, g);
                    });
                }
            }

            /// `N` (1–4) inputs against one group of eight packed rows of small
            /// unsigned values (Q5_0 against Q8_0, Q4_1 and Q5_1 against Q8_1), one
            /// row per lane: the values (nibbles, or-ed with their fifth bits where
            /// there are any) against the input's broadcast bytes, each block's integer
            /// sum (Q5_0: on top of `2 ·` the input's offset, `−16 · Σ y`), then one
            /// multiply (the scales) and one FMA per block and cell, and for Q4_1 and
            /// Q5_1 a second FMA (the min times the input's sum), as the portable
            /// kernels.
            #[inline(always)]
            pub(in crate::kernels::simd) unsafe fn group_nibbles<G: Nibbles8, A: ActBlock, E: Extra, const N: usize>(
                x: &[G],
                y: [&[A]; N],
                yd: [&[f32]; N],
                ye: [&[E]; N],
            ) -> [__m256; N] {
                // Checked once here, so the loop indexes without bounds checks.
                for t in 0..N {
                    assert!(y[t].len() >= x.len() && yd[t].len() >= x.len() && ye[t].len() >= x.len());
                }
                let m4 = _mm256_set1_epi8(0x0f);
                let mut acc = [_mm256_setzero_ps(); N];
                for (i, a) in x.iter().enumerate() {
                    prefetch_ahead(x, i);
                    let mut sum: [__m256i; N] = std::array::from_fn(|t| {
                        if G::MIN {
                            _mm256_setzero_si256()
                        } else {
                            _mm256_set1_epi32(2 * ye[t].get_unchecked(i).offset())
                        }
                    });
                    // AVX2's i16 sums: eight products of at most 31 · 127 each per
                    // step pair (31,496), widened to i32 after every second step.
                    let mut sum16 = [_mm256_setzero_si256(); N];
                    for s in 0..4 {
                        let w = _mm256_loadu_si256(a.qs().as_ptr().add(32 * s) as *const __m256i);
                        let mut lo = _mm256_and_si256(w, m4);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                        if G::FIFTH {
                            let (fl, fh) = fifth_bits(a.qh(), s);
                            (lo, hi) = (_mm256_or_si256(lo, fl), _mm256_or_si256(hi, fh));
                        }
                        for t in 0..N {
                            let q = y[t].get_unchecked(i).qs().as_ptr();
                            let ql = _mm256_set1_epi32((q.add(4 * s) as *const i32).read_unaligned());
                            let qh = _mm256_set1_epi32((q.add(16 + 4 * s) as *const i32).read_unaligned());
                            if $dot == Dot::AvxVnni {
                                sum[t] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(sum[t], lo, ql), hi, qh);
                            } else if $dot == Dot::Avx512Vnni {
                                sum[t] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(sum[t], lo, ql), hi, qh);
                            } else {
                                let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ql), _mm256_maddubs_epi16(hi, qh));
                                sum16[t] = _mm256_add_epi16(sum16[t], p);
                                if s % 2 == 1 {
                                    sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(sum16[t], _mm256_set1_epi16(1)));
                                    sum16[t] = _mm256_setzero_si256();
                                }
                            }
                        }
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(a.d().as_ptr() as *const __m128i));
                    for t in 0..N {
                        let dd = _mm256_mul_ps(d, _mm256_set1_ps(*yd[t].get_unchecked(i)));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), dd, acc[t]);
                        if G::MIN {
                            let m = _mm256_cvtph_ps(_mm_loadu_si128(a.m().as_ptr() as *const __m128i));
                            let s = _mm256_set1_ps(ye[t].get_unchecked(i).sum());
                            acc[t] = _mm256_fmadd_ps(m, s, acc[t]);
                        }
                    }
                }
                acc
            }

            /// [`super::super::Kernels::q4_1x8`], [`super::super::Kernels::q5_0x8`] and
            /// [`super::super::Kernels::q5_1x8`]:
            /// each group against the inputs four at a time.
            #[inline(always)]
            unsafe fn dot_nibbles_x8<G: Nibbles8, A: ActBlock, E: Extra>(
                x: &[G],
                y: &[A],
                yd: &[f32],
                ye: &[E],
                n: usize,
                out: &mut [f32],
            ) {
                let (nb, groups) = crate::kernels::simd::x8_shape(x, y, yd, ye, n, out);
                let width = 8 * groups;
                for g in 0..groups {
                    let xg = &x[g * nb..(g + 1) * nb];
                    tiles!(n, 4, |t, M| {
                        let ins = |k: usize| (t + k) * nb..(t + k + 1) * nb;
                        let acc = group_nibbles::<G, A, E, M>(
                            xg,
                            std::array::from_fn(|k| &y[ins(k)]),
                            std::array::from_fn(|k| &yd[ins(k)]),
                            std::array::from_fn(|k| &ye[ins(k)]),
                        );
                        store_tile(out, &acc, t, width, g);
                    });
                }
            }

            #[target_feature(enable = $features)]
            pub unsafe fn dot_q5_0x8_q8_0(
                x: &[BlockQ5_0x8],
                y: &[BlockQ8_0],
                yd: &[f32],
                yo: &[i32],
                n: usize,
                out: &mut [f32],
            ) {
                dot_nibbles_x8(x, y, yd, yo, n, out)
            }

            #[target_feature(enable = $features)]
            pub unsafe fn dot_q4_1x8_q8_1(
                x: &[BlockQ4_1x8],
                y: &[BlockQ8_1],
                yd: &[f32],
                ys: &[f32],
                n: usize,
                out: &mut [f32],
            ) {
                dot_nibbles_x8(x, y, yd, ys, n, out)
            }

            #[target_feature(enable = $features)]
            pub unsafe fn dot_q5_1x8_q8_1(
                x: &[BlockQ5_1x8],
                y: &[BlockQ8_1],
                yd: &[f32],
                ys: &[f32],
                n: usize,
                out: &mut [f32],
            ) {
                dot_nibbles_x8(x, y, yd, ys, n, out)
            }

            /// `N` (1–4) Q8_K rows against one group of eight packed Q4_K or Q5_K rows,
            /// one row per lane: per sub-block the integer sums of the unsigned values
            /// (Q5_K: the nibble and its fifth bit) times the inputs' bytes, times the
            /// sub-block scale (AVX2: as 16-bit pairs in `vpmaddwd`; VNNI: `vpmulld`),
            /// the mins against the inputs' sub-block sums in `vpmaddwd`, then two FMAs
            /// per super-block and cell, as the portable kernel.
            #[inline(always)]
            pub(in crate::kernels::simd) unsafe fn group_k<G: KGroup, const N: usize>(
                x: &[G],
                y: [&[BlockQ8K]; N],
                ym: [&[[i32; 4]]; N],
            ) -> [__m256; N] {
                // Checked once here, so the loop indexes without bounds checks.
                for t in 0..N {
                    assert!(y[t].len() >= x.len() && ym[t].len() >= x.len());
                }
                let m4 = _mm256_set1_epi8(0x0f);
                let bit4 = _mm256_set1_epi8(0x10);
                // AVX2 sums sixteen products per 16-bit lane: at most 30,720 for
                // nibbles, but 5-bit values reach 63,488, so Q5_K's are scaled into
                // 32 bits after every eight (31,744).
                let flush = if G::HIGH && $dot == Dot::Madd { 4 } else { 8 };
                let mut acc = [_mm256_setzero_ps(); N];
                for (i, g) in x.iter().enumerate() {
                    let a = g.low();
                    let mut sums = [_mm256_setzero_si256(); N];
                    for k in 0..4 {
                        let scale = |j: usize| {
                            _mm256_cvtepu8_epi32(_mm_loadl_epi64(a.scales[j].as_ptr() as *const __m128i))
                        };
                        let (sl, sh) = (scale(2 * k), scale(2 * k + 1));
                        // Sub-block 2k's fifth bits are bit 2k of each `qh` byte.
                        let hshift = _mm_cvtsi32_si128(2 * k as i32);
                        // Sub-blocks 2k (low nibbles) and 2k + 1 (high): i16 sums for
                        // AVX2, i32 for VNNI.
                        let (mut lo_sum, mut hi_sum) = ([_mm256_setzero_si256(); N], [_mm256_setzero_si256(); N]);
                        for s in 0..8 {
                            let w = _mm256_loadu_si256(a.qs.as_ptr().add(256 * k + 32 * s) as *const __m256i);
                            let mut lo = _mm256_and_si256(w, m4);
                            let mut hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                            if G::HIGH {
                                let h = _mm256_loadu_si256(g.qh().as_ptr().add(32 * s) as *const __m256i);
                                let h = _mm256_srl_epi16(h, hshift);
                                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4));
                                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(h, 3), bit4));
                            }
                            for t in 0..N {
                                let q = y[t].get_unchecked(i).qs.as_ptr().add(64 * k + 4 * s);
                                let ql = _mm256_set1_epi32((q as *const i32).read_unaligned());
                                let qh = _mm256_set1_epi32((q.add(32) as *const i32).read_unaligned());
                                if $dot == Dot::AvxVnni {
                                    lo_sum[t] = _mm256_dpbusd_avx_epi32(lo_sum[t], lo, ql);
                                    hi_sum[t] = _mm256_dpbusd_avx_epi32(hi_sum[t], hi, qh);
                                } else if $dot == Dot::Avx512Vnni {
                                    lo_sum[t] = _mm256_dpbusd_epi32(lo_sum[t], lo, ql);
                                    hi_sum[t] = _mm256_dpbusd_epi32(hi_sum[t], hi, qh);
                                } else {
                                    lo_sum[t] = _mm256_add_epi16(lo_sum[t], _mm256_maddubs_epi16(lo, ql));
                                    hi_sum[t] = _mm256_add_epi16(hi_sum[t], _mm256_maddubs_epi16(hi, qh));
                                }
                            }
                            if (s + 1) % flush != 0 {
                                continue;
                            }
                            for t in 0..N {
                                let (l, h) = if $dot == Dot::Madd {
                                    // (scale, scale) in each lane's two 16-bit halves.
                                    let pair = |v: __m256i| _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
                                    (_mm256_madd_epi16(lo_sum[t], pair(sl)), _mm256_madd_epi16(hi_sum[t], pair(sh)))
                                } else {
                                    (_mm256_mullo_epi32(lo_sum[t], sl), _mm256_mullo_epi32(hi_sum[t], sh))
                                };
                                sums[t] = _mm256_add_epi32(sums[t], _mm256_add_epi32(l, h));
                                (lo_sum[t], hi_sum[t]) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                            }
                        }
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(a.d.as_ptr() as *const __m128i));
                    let dmin = _mm256_cvtph_ps(_mm_loadu_si128(a.dmin.as_ptr() as *const __m128i));
                    for t in 0..N {
                        let pairs = ym[t].get_unchecked(i);
                        let mut mins = _mm256_setzero_si256();
                        for (p, &pair) in pairs.iter().enumerate() {
                            let m = _mm256_cvtepu8_epi16(_mm_loadu_si128(a.mins[p].as_ptr() as *const __m128i));
                            mins = _mm256_add_epi32(mins, _mm256_madd_epi16(m, _mm256_set1_epi32(pair)));
                        }
                        let dy = _mm256_set1_ps(y[t].get_unchecked(i).d);
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[t]), _mm256_mul_ps(d, dy), acc[t]);
                        let neg = _mm256_xor_ps(_mm256_mul_ps(dmin, dy), _mm256_set1_ps(-0.0));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), neg, acc[t]);
                    }
                }
                acc
            }

            /// [`super::super::Kernels::q4_kx8`] and [`super::super::Kernels::q5_kx8`]:
            /// each group against the inputs four at a time.
            #[inline(always)]
            pub(in crate::kernels::simd) unsafe fn dot_kx8<G: KGroup>(
                x: &[G],
                y: &[BlockQ8K],
                ym: &[[i32; 4]],
                n: usize,
                out: &mut [f32],
            ) {
                let (nb, groups) = crate::kernels::simd::kx8_shape(x, y, ym, n, out);
                let width = 8 * groups;
                for g in 0..groups {
                    let xg = &x[g * nb..(g + 1) * nb];
                    tiles!(n, 4, |t, M| {
                        let ins = |k: usize| (t + k) * nb..(t + k + 1) * nb;
                        let acc = group_k::<G, M>(
                            xg,
                            std::array::from_fn(|k| &y[ins(k)]),
                            std::array::from_fn(|k| &ym[ins(k)]),
                        );
                        store_tile(out, &acc, t, width, g);
                    });
                }
            }

            #[target_feature(enable = $features)]
            pub unsafe fn dot_q4_kx8_q8_k(x: &[BlockQ4Kx8], y: &[BlockQ8K], ym: &[[i32; 4]], n: usize, out: &mut [f32]) {
                dot_kx8(x, y, ym, n, out)
            }

            #[target_feature(enable = $features)]
            pub unsafe fn dot_q5_kx8_q8_k(x: &[BlockQ5Kx8], y: &[BlockQ8K], ym: &[[i32; 4]], n: usize, out: &mut [f32]) {
                dot_kx8(x, y, ym, n, out)
            }

            /// Sub-block `j`'s scale in each row's lane of a packed Q6_K group: as
            /// a 32-bit integer for `vpmulld` (VNNI), or twice in 16 bits for
            /// `vpmaddwd` (AVX2).
            #[inline(always)]
            unsafe fn q6k_scale(g: &BlockQ6Kx8, j: usize) -> __m256i {
                let pairs = _mm256_cvtepi8_epi16(_mm_loadu_si128(g.scales[j / 2].as_ptr() as *const __m128i));
                let s = if j.is_multiple_of(2) {
                    _mm256_srai_epi32(_mm256_slli_epi32(pairs, 16), 16)
                } else {
                    _mm256_srai_epi32(pairs, 16)
                };
                if $dot == Dot::Madd {
                    _mm256_or_si256(_mm256_and_si256(s, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(s, 16))
                } else {
                    s
                }
            }

            /// `N` (1–4) Q8_K rows against one group of eight packed Q6_K rows, one
            /// row per lane: per 16-value sub-block the integer sum of the unsigned
            /// values times the inputs' bytes, times the sub-block scale (AVX2: the
            /// 16-bit sums of two steps in `vpmaddwd`; VNNI: `vpmulld`), less 32 ×
            /// the scales against the inputs' sub-block sums, then one FMA per
            /// super-block and cell, as the portable kernel.
            #[inline(always)]
            pub(in crate::kernels::simd) unsafe fn group_q6k<const N: usize>(
                x: &[BlockQ6Kx8],
                y: [&[BlockQ8K]; N],
            ) -> [__m256; N] {
                // Checked once here, so the loop indexes without bounds checks.
                for t in 0..N {
                    assert!(y[t].len() >= x.len());
                }
                let m4 = _mm256_set1_epi8(0x0f);
                let m2 = _mm256_set1_epi8(0x30);
                // AVX2's 16-bit sums hold two steps (2 · 2 · 63 · 127 = 32,004).
                let flush = if $dot == Dot::Madd { 2 } else { 4 };
                let mut acc = [_mm256_setzero_ps(); N];
                // No software prefetch: the group is read front to back, which the
                // hardware prefetchers follow; asking for the next super-block's lines
                // as well halved decode on a Zen 4 EPYC (kernel 55 → 41 GB/s).
                for (i, g) in x.iter().enumerate() {
                    let mut sums = [_mm256_setzero_si256(); N];
                    // One chunk of 64 values per (half, h): sub-blocks 8·half + 2h
                    // (low nibbles, steps 0–3) and + 1 (steps 4–7), high nibbles the
                    // same plus 4.
                    macro_rules! chunk {
                        ($half:literal, $h:literal) => {{
                            let j = 8 * $half + 2 * $h;
                            let (lo_sc, hi_sc) = ([q6k_scale(g, j), q6k_scale(g, j + 1)], [q6k_scale(g, j + 4), q6k_scale(g, j + 5)]);
                            let (mut lo_sum, mut hi_sum) = ([_mm256_setzero_si256(); N], [_mm256_setzero_si256(); N]);
                            for s in 0..8 {
                                let w = _mm256_loadu_si256(g.q.as_ptr().add(BlockQ6Kx8::ql_at(2 * $half + $h, s)) as *const __m256i);
                                let bits = _mm256_loadu_si256(g.q.as_ptr().add(BlockQ6Kx8::qh_at($half, s)) as *const __m256i);
                                // Bits 2h..2h + 2 of each `qh` byte to bits 4–5 (low
                                // nibbles' values), bits 2h + 4.. likewise (high).
                                // (Immediate shifts: `$h` is a literal. When `h` was
                                // a loop variable LLVM made them `vpsllvw` by a vector
                                // of counts, which a Zen 4 EPYC runs slowly: 1.5B
                                // Q6_K decode 0.46× of llama.cpp there.)
                                let (up, down) = if $h == 0 {
                                    (_mm256_slli_epi16(bits, 4), bits)
                                } else {
                                    (_mm256_slli_epi16(bits, 2), _mm256_srli_epi16(bits, 2))
                                };
                                let lo = _mm256_or_si256(_mm256_and_si256(w, m4), _mm256_and_si256(up, m2));
                                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4), _mm256_and_si256(down, m2));
                                for t in 0..N {
                                    let q = y[t].get_unchecked(i).qs.as_ptr().add(128 * $half + 32 * $h + 4 * s);
                                    let ql = _mm256_set1_epi32((q as *const i32).read_unaligned());
                                    let qh = _mm256_set1_epi32((q.add(64) as *const i32).read_unaligned());
                                    if $dot == Dot::AvxVnni {
                                        lo_sum[t] = _mm256_dpbusd_avx_epi32(lo_sum[t], lo, ql);
                                        hi_sum[t] = _mm256_dpbusd_avx_epi32(hi_sum[t], hi, qh);
                                    } else if $dot == Dot::Avx512Vnni {
                                        lo_sum[t] = _mm256_dpbusd_epi32(lo_sum[t], lo, ql);
                                        hi_sum[t] = _mm256_dpbusd_epi32(hi_sum[t], hi, qh);
                                    } else {
                                        lo_sum[t] = _mm256_add_epi16(lo_sum[t], _mm256_maddubs_epi16(lo, ql));
                                        hi_sum[t] = _mm256_add_epi16(hi_sum[t], _mm256_maddubs_epi16(hi, qh));
                                    }
                                }
                                if (s + 1) % flush != 0 {
                                    continue;
                                }
                                let (ls, hs) = (lo_sc[s / 4], hi_sc[s / 4]);
                                for t in 0..N {
                                    let (l, h) = if $dot == Dot::Madd {
                                        (_mm256_madd_epi16(lo_sum[t], ls), _mm256_madd_epi16(hi_sum[t], hs))
                                    } else {
                                        (_mm256_mullo_epi32(lo_sum[t], ls), _mm256_mullo_epi32(hi_sum[t], hs))
                                    };
                                    sums[t] = _mm256_add_epi32(sums[t], _mm256_add_epi32(l, h));
                                    (lo_sum[t], hi_sum[t]) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                                }
                            }
                        }};
                    }
                    chunk!(0, 0);
                    chunk!(0, 1);
                    chunk!(1, 0);
                    chunk!(1, 1);
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(g.d.as_ptr() as *const __m128i));
                    for t in 0..N {
                        let b = y[t].get_unchecked(i);
                        // The −32 of every value, through the inputs' sub-block sums.
                        let mut offset = _mm256_setzero_si256();
                        for p in 0..8 {
                            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(g.scales[p].as_ptr() as *const __m128i));
                            let pair = _mm256_set1_epi32((b.bsums.as_ptr().add(2 * p) as *const i32).read_unaligned());
                            offset = _mm256_add_epi32(offset, _mm256_madd_epi16(sc, pair));
                        }
                        let sum = _mm256_sub_epi32(sums[t], _mm256_slli_epi32(offset, 5));
                        let dy = _mm256_set1_ps(b.d);
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, dy), acc[t]);
                    }
                }
                acc
            }

            /// [`super::super::Kernels::q6_kx8`]: each group against the inputs four
            /// at a time.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_q6_kx8_q8_k(x: &[BlockQ6Kx8], y: &[BlockQ8K], ym: &[[i32; 4]], n: usize, out: &mut [f32]) {
                let (nb, groups) = crate::kernels::simd::kx8_shape(x, y, ym, n, out);
                let width = 8 * groups;
                for g in 0..groups {
                    let xg = &x[g * nb..(g + 1) * nb];
                    tiles!(n, 4, |t, M| {
                        let ins = |k: usize| (t + k) * nb..(t + k + 1) * nb;
                        let acc = group_q6k::<M>(xg, std::array::from_fn(|k| &y[ins(k)]));
                        store_tile(out, &acc, t, width, g);
                    });
                }
            }

            /// f32 dot product: 8 FMA lanes, the lane sum, then the tail in order.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
                let n = a.len().min(b.len());
                let mut acc = _mm256_setzero_ps();
                let mut i = 0;
                while i + 8 <= n {
                    acc = _mm256_fmadd_ps(
                        _mm256_loadu_ps(a.as_ptr().add(i)),
                        _mm256_loadu_ps(b.as_ptr().add(i)),
                        acc,
                    );
                    i += 8;
                }
                let mut s = hsum_float_8(acc);
                while i < n {
                    s += a[i] * b[i];
                    i += 1;
                }
                s
            }

            /// `Σ h2f(a[i]) · b[i]` in exactly [`dot_f32`]'s order, the f16 keys
            /// widened in registers.
            #[target_feature(enable = $features)]
            pub unsafe fn dot_f16_f32(a: &[u16], b: &[f32]) -> f32 {
                let n = a.len().min(b.len());
                let mut acc = _mm256_setzero_ps();
                let mut i = 0;
                while i + 8 <= n {
                    let k = _mm256_cvtph_ps(_mm_loadu_si128(a.as_ptr().add(i) as *const __m128i));
                    acc = _mm256_fmadd_ps(k, _mm256_loadu_ps(b.as_ptr().add(i)), acc);
                    i += 8;
                }
                let mut s = hsum_float_8(acc);
                while i < n {
                    s += h2f(a[i]) * b[i];
                    i += 1;
                }
                s
            }

            /// `acc[i] = fma(h2f(v[i]), w, acc[i])`.
            #[target_feature(enable = $features)]
            pub unsafe fn axpy_f16(acc: &mut [f32], v: &[u16], w: f32) {
                let n = acc.len().min(v.len());
                let wv = _mm256_set1_ps(w);
                let mut i = 0;
                while i + 8 <= n {
                    let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i) as *const __m128i));
                    let a = _mm256_loadu_ps(acc.as_ptr().add(i));
                    _mm256_storeu_ps(acc.as_mut_ptr().add(i), _mm256_fmadd_ps(x, wv, a));
                    i += 8;
                }
                while i < n {
                    acc[i] = h2f(v[i]).mul_add(w, acc[i]);
                    i += 1;
                }
            }
        }
    };
}

x86_kernels!(avx2, "avx2,fma,f16c", Dot::Madd);
x86_kernels!(avx_vnni, "avx2,fma,f16c,avxvnni", Dot::AvxVnni);
x86_kernels!(
    /// The AVX-512 table takes only the single-row kernels from here.
    #[allow(dead_code)]
    avx512_vl,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni",
    Dot::Avx512Vnni
);
