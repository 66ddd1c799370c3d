//! The forward pass's elementwise and quantizing steps, written once in plain Rust
//! (`#[inline(always)]`) and compiled per kernel variant: inside an AVX2 + FMA + F16C
//! function `mul_add` is one `vfmadd`, rounding one `vroundps` and the loops
//! vectorise; in the portable build the same code calls the C library. The results
//! are the same bits either way (fused multiply-adds are exact by definition, and no
//! reduction is reordered).

use crate::engine::kernels::kquants::{quantize_q8_k, BlockQ8K};
use crate::engine::kernels::math::{gelu, silu, softmax};
use crate::engine::kernels::quants::{f2h, h2f, quantize_q8_0, quantize_q8_1, BlockQ8_0, BlockQ8_1};

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

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
        super::quantize_q8_0(x, out)
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
