//! AVX-512 decode tiles over Q4_0 weights stored eight rows interleaved (block `i` of
//! a group's row `j` at `i * 8 + j`, see [`crate::engine::kernels::tensor`]): eight
//! weight rows against one activation row, two rows per 512-bit register, each
//! activation block loaded, and its lane sums computed, once for the eight. The
//! interleaving makes the eight rows one stream in memory: read row by row, eight
//! rows are eight streams, and the hardware prefetcher falls behind (measured on a
//! 2-core AMD EPYC, one thread, 200 MB of weights: single rows 17 GB/s, eight
//! separate rows in a tile 6.3 GB/s, eight interleaved rows 26.9 GB/s).
//!
//! Weights go in as unsigned bytes `q + 8`, and `vpdpbusd` needs no sign trick:
//! `Σ q·y = Σ (q + 8)·y − 8·Σ y`, exact in 32-bit integers per lane, the second term
//! shared by the eight rows. Each lane then does what the AVX2 kernel's lane does (the
//! same f32 scale product, the same fused multiply-add per block, the same horizontal
//! sum), so every output is bit-identical to [`super::x86::avx2`]'s single row.

use super::avx512::{both, hsum_pair, pair_ps};
use super::x86::h2f;
use crate::engine::kernels::quants::{BlockQ4_0, BlockQ8_0};
use std::arch::x86_64::*;

/// Two blocks' 16 bytes as 32 nibbles each (low nibbles, then high): `a` in the low
/// 256 bits, `b` in the high.
#[inline(always)]
unsafe fn nibble_pair(a: &[u8; 16], b: &[u8; 16]) -> __m512i {
    let lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(a.as_ptr() as *const __m128i));
    let hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(b.as_ptr() as *const __m128i));
    let v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    let shifted = _mm512_srli_epi16(v, 4);
    _mm512_and_si512(_mm512_mask_blend_epi64(0xCC, v, shifted), _mm512_set1_epi8(0x0F))
}

/// Eight interleaved Q4_0 rows of `y.len()` blocks against the Q8_0 row `y`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q4_0_q8_0_x8i(x: &[BlockQ4_0], y: &[BlockQ8_0], yd: &[f32]) -> [f32; 8] {
    let n = y.len();
    assert!(
        x.len() == 8 * n && yd.len() == n,
        "eight interleaved rows of the input's length"
    );
    let offset = _mm512_set1_epi8(8);
    let mut acc = [_mm512_setzero_ps(); 4];
    for i in 0..n {
        let qy = both(_mm256_loadu_si256(y.get_unchecked(i).qs.as_ptr() as *const __m256i));
        // −8 · (each lane's four activations).
        let base = _mm512_sub_epi32(
            _mm512_setzero_si512(),
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, qy),
        );
        let dy = *yd.get_unchecked(i);
        for (p, acc) in acc.iter_mut().enumerate() {
            let (a, b) = (x.get_unchecked(i * 8 + 2 * p), x.get_unchecked(i * 8 + 2 * p + 1));
            let d = pair_ps(h2f(a.d) * dy, h2f(b.d) * dy);
            let s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(base, nibble_pair(&a.qs, &b.qs), qy));
            *acc = _mm512_fmadd_ps(d, s, *acc);
        }
    }
    let mut out = [0.0f32; 8];
    for (p, acc) in acc.iter().enumerate() {
        let [lo, hi] = hsum_pair(*acc);
        out[2 * p] = lo;
        out[2 * p + 1] = hi;
    }
    out
}
