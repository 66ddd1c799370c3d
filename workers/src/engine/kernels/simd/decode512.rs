//! The AVX-512 decode tile over Q4_K weights stored two rows interleaved (block `i`
//! of a pair's row `j` at `2i + j`, see `tensor/interleaved.rs`): the pair is one
//! stream in memory, where two rows read side by side are two, and the hardware
//! prefetcher falls behind (measured on a 2-core AMD EPYC, one thread: Q4_K single
//! rows 24.4 GB/s, a pair of rows in file order 7.6 GB/s).

use super::avx512::{both, hsum_pair, pair_bytes, pair_ps};
use super::x86::{get_scale_shuffle_k4, h2f, q4k_mins_scales};
use crate::engine::kernels::kquants::{BlockQ4K, BlockQ8K, QK_K};
use std::arch::x86_64::*;

/// Two Q4_K weight rows stored interleaved (block `i` of row `j` at `2i + j`) against
/// one Q8_K row, the first row in the low 256 bits and the second in the high: each
/// row's lanes do what ggml's AVX2 Q4_K kernel's lanes do (the same integer sums,
/// scale products and FMAs, the mins in their own 128-bit sum).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q4_k_q8_k_x2i(x: &[BlockQ4K], y: &[BlockQ8K]) -> [f32; 2] {
    let n = y.len();
    assert!(x.len() == 2 * n, "two interleaved rows of the input's length");
    let m4 = _mm512_set1_epi8(0xf);
    let mut acc = _mm512_setzero_ps();
    let mut acc_m = [_mm_setzero_ps(); 2];
    for i in 0..n {
        let a = [x.get_unchecked(2 * i), x.get_unchecked(2 * i + 1)];
        let b = y.get_unchecked(i);
        let (mins0, scales0) = q4k_mins_scales(a[0]);
        let (mins1, scales1) = q4k_mins_scales(a[1]);
        let mut sumi = _mm512_setzero_si512();
        for j in 0..QK_K / 64 {
            let halves = |s: usize| {
                _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_shuffle_epi8(scales0, get_scale_shuffle_k4(s))),
                    _mm256_shuffle_epi8(scales1, get_scale_shuffle_k4(s)),
                    1,
                )
            };
            let (scale_l, scale_h) = (halves(2 * j), halves(2 * j + 1));
            let q4bits = pair_bytes(
                a[0].qs.as_ptr().add(32 * j) as *const i8,
                a[1].qs.as_ptr().add(32 * j) as *const i8,
            );
            let q4l = _mm512_and_si512(q4bits, m4);
            let q4h = _mm512_and_si512(_mm512_srli_epi16(q4bits, 4), m4);
            let q8l = both(_mm256_loadu_si256(b.qs.as_ptr().add(64 * j) as *const __m256i));
            let q8h = both(_mm256_loadu_si256(b.qs.as_ptr().add(64 * j + 32) as *const __m256i));
            let p16l = _mm512_madd_epi16(scale_l, _mm512_maddubs_epi16(q4l, q8l));
            let p16h = _mm512_madd_epi16(scale_h, _mm512_maddubs_epi16(q4h, q8h));
            sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(p16l, p16h));
        }
        let q8sums = _mm256_loadu_si256(b.bsums.as_ptr() as *const __m256i);
        let q8s = _mm_hadd_epi16(_mm256_extracti128_si256(q8sums, 0), _mm256_extracti128_si256(q8sums, 1));
        for (w, mins) in [mins0, mins1].into_iter().enumerate() {
            let dmin = -b.d * h2f(a[w].dmin);
            let prod = _mm_madd_epi16(mins, q8s);
            acc_m[w] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[w]);
        }
        let d = pair_ps(b.d * h2f(a[0].d), b.d * h2f(a[1].d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
    }
    let mut out = hsum_pair(acc);
    for (o, mut m) in out.iter_mut().zip(acc_m) {
        m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        *o += _mm_cvtss_f32(m);
    }
    out
}
