//! The forward pass's elementwise and quantizing steps, written once in plain Rust
//! (`#[inline(always)]`) and compiled per kernel variant: inside an AVX2 + FMA + F16C
//! function `mul_add` is one `vfmadd`, rounding one `vroundps` and the loops
//! vectorise; in the portable build the same code calls the C library. The results
//! are the same bits either way (fused multiply-adds are exact by definition, and no
//! reduction is reordered).

use crate::kernels::kquants::{quantize_q8_k, BlockQ8K};
use crate::kernels::math::{gelu, silu, softmax};
use crate::kernels::quants::{f2h, h2f, quantize_q8_0, quantize_q8_1, BlockQ8_0, BlockQ8_1};

#[inline(always)]
fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

#[inline(always)]
fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = gelu(*g) * u;
    }
}

#[inline(always)]
fn axpy_f32(acc: &mut [f32], x: &[f32], w: f32) {
    for (a, v) in acc.iter_mut().zip(x) {
        *a = v.mul_add(w, *a);
    }
}

#[inline(always)]
fn round_f16(x: &mut [f32]) {
    for v in x {
        *v = h2f(f2h(*v));
    }
}

#[inline(always)]
fn to_f16(x: &[f32], out: &mut [u16]) {
    for (o, v) in out.iter_mut().zip(x) {
        *o = f2h(*v);
    }
}

/// The portable build of the steps.
pub mod portable {
    use super::*;

    pub fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
        super::quantize_q8_0(x, out)
    }
    pub fn quantize_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
        super::quantize_q8_1(x, out)
    }
    pub fn quantize_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
        super::quantize_q8_k(x, out)
    }
    pub fn softmax(x: &mut [f32]) {
        super::softmax(x)
    }
    pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
        super::silu_mul(gate, up)
    }
    pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
        super::gelu_mul(gate, up)
    }
    pub fn axpy_f32(acc: &mut [f32], x: &[f32], w: f32) {
        super::axpy_f32(acc, x, w)
    }
    pub fn round_f16(x: &mut [f32]) {
        super::round_f16(x)
    }
    pub fn to_f16(x: &[f32], out: &mut [u16]) {
        super::to_f16(x, out)
    }
}

/// The same steps compiled for AVX2 + FMA + F16C (every x86 variant's baseline), the
/// f16 conversions done eight at a time with F16C (round to nearest even, as `half`).
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// ggml's AVX2 `quantize_row_q8_0`: the same bits as the portable steps (the
    /// largest magnitude, its scale, each value times the inverse rounded to nearest
    /// even), eight values per instruction.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
        let sign = _mm256_set1_ps(-0.0);
        for (b, chunk) in out.iter_mut().zip(x.chunks_exact(32)) {
            let p = chunk.as_ptr();
            let v = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(p.add(o)));
            let mut m = _mm256_andnot_ps(sign, v[0]);
            for x in &v[1..] {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *x));
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let q = v.map(|x| {
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, id));
                _mm256_cvtps_epi32(r)
            });
            let r = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            let r = _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(b.qs.as_mut_ptr() as *mut __m256i, r);
            b.d = crate::kernels::quants::f2h(amax / 127.0);
        }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
        super::quantize_q8_1(x, out)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
        super::quantize_q8_k(x, out)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn softmax(x: &mut [f32]) {
        super::softmax(x)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
        super::silu_mul(gate, up)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn gelu_mul(gate: &mut [f32], up: &[f32]) {
        super::gelu_mul(gate, up)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_f32(acc: &mut [f32], x: &[f32], w: f32) {
        super::axpy_f32(acc, x, w)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn round_f16(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            let v = _mm256_loadu_ps(c.as_ptr());
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
        super::round_f16(chunks.into_remainder())
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn to_f16(x: &[f32], out: &mut [u16]) {
        let n = x.len().min(out.len()) / 8 * 8;
        for i in (0..n).step_by(8) {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.as_ptr().add(i)));
            _mm_storeu_si128(out.as_mut_ptr().add(i) as *mut __m128i, h);
        }
        super::to_f16(&x[n..], &mut out[n..])
    }
}
