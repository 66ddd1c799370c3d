//! Quantized blocks in ggml's layouts and the dot products between weight blocks and
//! quantized activations, with ggml's arithmetic: activations are quantized per
//! 32-value block (round-half-even, scale stored as f16), and the AVX2 dot products
//! accumulate in the same 8 lanes in the same order, so results track llama.cpp's.

use half::f16;

/// Values per block for the 32-wide formats.
pub const QK: usize = 32;

/// ggml `block_q4_0`: 32 weights = f16 scale + 16 bytes of 4-bit values (offset 8).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; 16],
}

/// ggml `block_q4_1`: 32 weights = f16 scale + f16 min + 16 bytes of 4-bit values.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; 16],
}

/// ggml `block_q5_0`: 32 weights = f16 scale + 32 high bits + 16 bytes of low nibbles,
/// `x = d * ((nibble | high << 4) - 16)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// ggml `block_q8_0`: 32 values = f16 scale + 32 signed bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; 32],
}

/// ggml `block_q8_1`: like Q8_0 plus `s = d * sum(qs)` (f16), for Q4_1's minimum.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_1 {
    pub d: u16,
    pub s: u16,
    pub qs: [i8; 32],
}

/// f16 bits → f32. With F16C this is `vmovd` + `vcvtph2ps` from a general register.
/// (LLVM compiles the intrinsic form — and the `half` crate's — to `vpinsrw` into
/// whatever vector register it likes, which makes the conversion wait on that
/// register's last writer: in the dot products, the running sum, so every block
/// joined one long dependency chain. The asm keeps the conversion independent;
/// measured on SmolLM2 decode, with the activation scales precomputed: 0.96× → 1.05×
/// of llama.cpp.)
#[inline(always)]
pub fn h2f(h: u16) -> f32 {
    #[cfg(all(target_arch = "x86_64", target_feature = "f16c"))]
    {
        let r: f32;
        // SAFETY: F16C is enabled at compile time; register-only, no memory access.
        unsafe {
            std::arch::asm!(
                "vmovd {x}, {g:e}",
                "vcvtph2ps {x}, {x}",
                g = in(reg) h as u32,
                x = out(xmm_reg) r,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        r
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "f16c")))]
    {
        f16::from_bits(h).to_f32()
    }
}

#[inline]
pub fn f2h(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// Scale and rounded values of one 32-value block, as ggml's AVX2 quantizer does.
#[inline]
fn quantize_block(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        let r = (v * id).round_ties_even() as i32;
        *q = r as i8;
        sum += r;
    }
    (d, sum)
}

/// Quantizes `x` (a multiple of 32 long) into Q8_0 blocks.
pub fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    for (b, chunk) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let (d, _) = quantize_block(chunk, &mut b.qs);
        b.d = f2h(d);
    }
}

/// Quantizes `x` into Q8_1 blocks.
pub fn quantize_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
    for (b, chunk) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let (d, sum) = quantize_block(chunk, &mut b.qs);
        b.d = f2h(d);
        b.s = f2h(d * sum as f32);
    }
}

/// Dequantizes Q4_0 blocks.
pub fn dequantize_q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = h2f(b.d);
        for j in 0..16 {
            o[j] = ((b.qs[j] & 0x0f) as i32 - 8) as f32 * d;
            o[j + 16] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// Dequantizes Q4_1 blocks.
pub fn dequantize_q4_1(blocks: &[BlockQ4_1], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (h2f(b.d), h2f(b.m));
        for j in 0..16 {
            o[j] = (b.qs[j] & 0x0f) as f32 * d + m;
            o[j + 16] = (b.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// The 5-bit values of one Q5_0 block, offset by −16.
#[inline]
fn q5_0_values(b: &BlockQ5_0) -> [i32; 32] {
    let qh = u32::from_le_bytes(b.qh);
    let mut v = [0i32; 32];
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        v[j] = ((b.qs[j] & 0x0f) as u32 | h0) as i32 - 16;
        v[j + 16] = ((b.qs[j] >> 4) as u32 | h1) as i32 - 16;
    }
    v
}

/// Dequantizes Q5_0 blocks.
pub fn dequantize_q5_0(blocks: &[BlockQ5_0], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = h2f(b.d);
        for (dst, q) in o.iter_mut().zip(q5_0_values(b)) {
            *dst = q as f32 * d;
        }
    }
}

/// Dequantizes Q8_0 blocks.
pub fn dequantize_q8_0(blocks: &[BlockQ8_0], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = h2f(b.d);
        for (dst, &q) in o.iter_mut().zip(&b.qs) {
            *dst = q as f32 * d;
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    #[inline(always)]
    pub unsafe fn hsum_float_8(x: __m256) -> f32 {
        let mut res = _mm256_extractf128_ps(x, 1);
        res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }

    #[inline(always)]
    unsafe fn bytes_from_nibbles_32(qs: &[u8; 16]) -> __m256i {
        let tmp = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
        let bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
        _mm256_and_si256(_mm256_set1_epi8(0x0f), bytes)
    }

    #[inline(always)]
    unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
        let dot = _mm256_maddubs_epi16(ax, sy);
        _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)))
    }

    #[inline(always)]
    unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        mul_sum_us8_pairs_float(ax, sy)
    }

    pub fn dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
        // SAFETY: compiled only with AVX2+FMA enabled; loads are unaligned-safe.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            let mut summs = 0.0f32;
            for (a, b) in x.iter().zip(y) {
                let d0 = h2f(a.d);
                let d1 = h2f(b.d);
                summs += h2f(a.m) * h2f(b.s);
                let d0d1 = _mm256_mul_ps(_mm256_set1_ps(d0), _mm256_set1_ps(d1));
                let qx = bytes_from_nibbles_32(&a.qs);
                let qy = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                let xy = mul_sum_us8_pairs_float(qx, qy);
                acc = _mm256_fmadd_ps(d0d1, xy, acc);
            }
            hsum_float_8(acc) + summs
        }
    }

    /// `N` activation rows (their scales already in f32) against one weight row: the
    /// nibbles are unpacked once per block; each output uses exactly the single-row
    /// arithmetic of [`dot_q4_1_q8_1`], so the results are bit-identical to it.
    #[inline(always)]
    unsafe fn rows_q4_1<const N: usize>(
        x: &[BlockQ4_1],
        y: [&[BlockQ8_1]; N],
        yd: [&[f32]; N],
        ys: [&[f32]; N],
    ) -> [f32; N] {
        let mut acc = [_mm256_setzero_ps(); N];
        let mut summs = [0.0f32; N];
        for (i, a) in x.iter().enumerate() {
            let d0 = h2f(a.d);
            let m = h2f(a.m);
            let qx = bytes_from_nibbles_32(&a.qs);
            for r in 0..N {
                summs[r] += m * ys[r][i];
                let d0d1 = _mm256_set1_ps(d0 * yd[r][i]);
                let qy = _mm256_loadu_si256(y[r][i].qs.as_ptr() as *const __m256i);
                acc[r] = _mm256_fmadd_ps(d0d1, mul_sum_us8_pairs_float(qx, qy), acc[r]);
            }
        }
        let mut out = [0.0f32; N];
        for r in 0..N {
            out[r] = hsum_float_8(acc[r]) + summs[r];
        }
        out
    }

    /// [`dot_q4_1_q8_1`] with the activations' `d` and `s` already converted to f32
    /// (once per matmul instead of once per weight row).
    pub fn dot_q4_1_q8_1_pre(x: &[BlockQ4_1], y: &[BlockQ8_1], yd: &[f32], ys: &[f32]) -> f32 {
        // SAFETY: as above.
        unsafe { rows_q4_1(x, [y], [yd], [ys])[0] }
    }

    /// Four activation rows against one weight row (prefill).
    pub fn dot_q4_1_q8_1_x4(x: &[BlockQ4_1], y: [&[BlockQ8_1]; 4], yd: [&[f32]; 4], ys: [&[f32]; 4]) -> [f32; 4] {
        // SAFETY: as above.
        unsafe { rows_q4_1(x, y, yd, ys) }
    }

    pub fn dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
        // SAFETY: as above.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for (a, b) in x.iter().zip(y) {
                let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
                let qx = _mm256_sub_epi8(bytes_from_nibbles_32(&a.qs), _mm256_set1_epi8(8));
                let qy = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                let q = mul_sum_i8_pairs_float(qx, qy);
                acc = _mm256_fmadd_ps(d, q, acc);
            }
            hsum_float_8(acc)
        }
    }

    /// ggml's `bytes_from_bits_32`: byte `i` is 0xFF where bit `i` of `x` is set.
    #[inline(always)]
    unsafe fn bytes_from_bits_32(x: &[u8; 4]) -> __m256i {
        let x32 = i32::from_le_bytes(*x);
        let shuf_mask = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuf_mask);
        let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
        _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1))
    }

    pub fn dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
        // SAFETY: as above.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for (a, b) in x.iter().zip(y) {
                let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
                let qx = bytes_from_nibbles_32(&a.qs);
                let hi = _mm256_andnot_si256(bytes_from_bits_32(&a.qh), _mm256_set1_epi8(0xF0u8 as i8));
                let qx = _mm256_or_si256(qx, hi);
                let qy = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                let q = mul_sum_i8_pairs_float(qx, qy);
                acc = _mm256_fmadd_ps(d, q, acc);
            }
            hsum_float_8(acc)
        }
    }

    /// `N` Q8_0 activation rows (scales already in f32) against one weight row whose
    /// blocks `unpack` into signed bytes and a scale: each block is unpacked once; each
    /// output uses exactly the single-row arithmetic (so the results are bit-identical
    /// to `dot_*_q8_0`).
    #[inline(always)]
    unsafe fn rows_q8_0<B, const N: usize>(
        x: &[B],
        y: [&[BlockQ8_0]; N],
        yd: [&[f32]; N],
        unpack: impl Fn(&B) -> (__m256i, f32),
    ) -> [f32; N] {
        let mut acc = [_mm256_setzero_ps(); N];
        for (i, a) in x.iter().enumerate() {
            let (qx, dx) = unpack(a);
            let ax = _mm256_sign_epi8(qx, qx);
            for r in 0..N {
                let d = _mm256_set1_ps(dx * yd[r][i]);
                let qy = _mm256_loadu_si256(y[r][i].qs.as_ptr() as *const __m256i);
                let q = mul_sum_us8_pairs_float(ax, _mm256_sign_epi8(qy, qx));
                acc[r] = _mm256_fmadd_ps(d, q, acc[r]);
            }
        }
        acc.map(|a| hsum_float_8(a))
    }

    #[inline(always)]
    unsafe fn unpack_q4_0(a: &BlockQ4_0) -> (__m256i, f32) {
        (
            _mm256_sub_epi8(bytes_from_nibbles_32(&a.qs), _mm256_set1_epi8(8)),
            h2f(a.d),
        )
    }

    #[inline(always)]
    unsafe fn unpack_q5_0(a: &BlockQ5_0) -> (__m256i, f32) {
        let hi = _mm256_andnot_si256(bytes_from_bits_32(&a.qh), _mm256_set1_epi8(0xF0u8 as i8));
        (_mm256_or_si256(bytes_from_nibbles_32(&a.qs), hi), h2f(a.d))
    }

    #[inline(always)]
    unsafe fn unpack_q8_0(a: &BlockQ8_0) -> (__m256i, f32) {
        (_mm256_loadu_si256(a.qs.as_ptr() as *const __m256i), h2f(a.d))
    }

    pub fn dot_q4_0_q8_0_pre(x: &[BlockQ4_0], y: &[BlockQ8_0], yd: &[f32]) -> f32 {
        // SAFETY: as above.
        unsafe { rows_q8_0(x, [y], [yd], |a| unpack_q4_0(a))[0] }
    }

    pub fn dot_q5_0_q8_0_pre(x: &[BlockQ5_0], y: &[BlockQ8_0], yd: &[f32]) -> f32 {
        // SAFETY: as above.
        unsafe { rows_q8_0(x, [y], [yd], |a| unpack_q5_0(a))[0] }
    }

    pub fn dot_q8_0_q8_0_pre(x: &[BlockQ8_0], y: &[BlockQ8_0], yd: &[f32]) -> f32 {
        // SAFETY: as above.
        unsafe { rows_q8_0(x, [y], [yd], |a| unpack_q8_0(a))[0] }
    }

    pub fn dot_q4_0_q8_0_x4(x: &[BlockQ4_0], y: [&[BlockQ8_0]; 4], yd: [&[f32]; 4]) -> [f32; 4] {
        // SAFETY: as above.
        unsafe { rows_q8_0(x, y, yd, |a| unpack_q4_0(a)) }
    }

    pub fn dot_q5_0_q8_0_x4(x: &[BlockQ5_0], y: [&[BlockQ8_0]; 4], yd: [&[f32]; 4]) -> [f32; 4] {
        // SAFETY: as above.
        unsafe { rows_q8_0(x, y, yd, |a| unpack_q5_0(a)) }
    }

    pub fn dot_q8_0_q8_0_x4(x: &[BlockQ8_0], y: [&[BlockQ8_0]; 4], yd: [&[f32]; 4]) -> [f32; 4] {
        // SAFETY: as above.
        unsafe { rows_q8_0(x, y, yd, |a| unpack_q8_0(a)) }
    }

    pub fn dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
        // SAFETY: as above.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for (a, b) in x.iter().zip(y) {
                let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
                let qx = _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i);
                let qy = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                let q = mul_sum_i8_pairs_float(qx, qy);
                acc = _mm256_fmadd_ps(d, q, acc);
            }
            hsum_float_8(acc)
        }
    }

    /// f32 dot product, 8 lanes with FMA, then the lane sum.
    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: as above; the tail is handled in scalar code.
        unsafe {
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
    }
}

mod scalar {
    use super::*;

    // The `_pre` and `_x4` forms take the activations' scales in f32; the portable code
    // converts them itself (to the same values).
    pub fn dot_q4_1_q8_1_pre(x: &[BlockQ4_1], y: &[BlockQ8_1], _yd: &[f32], _ys: &[f32]) -> f32 {
        dot_q4_1_q8_1(x, y)
    }

    pub fn dot_q4_1_q8_1_x4(x: &[BlockQ4_1], y: [&[BlockQ8_1]; 4], _yd: [&[f32]; 4], _ys: [&[f32]; 4]) -> [f32; 4] {
        y.map(|row| dot_q4_1_q8_1(x, row))
    }

    pub fn dot_q4_0_q8_0_pre(x: &[BlockQ4_0], y: &[BlockQ8_0], _yd: &[f32]) -> f32 {
        dot_q4_0_q8_0(x, y)
    }

    pub fn dot_q5_0_q8_0_pre(x: &[BlockQ5_0], y: &[BlockQ8_0], _yd: &[f32]) -> f32 {
        dot_q5_0_q8_0(x, y)
    }

    pub fn dot_q8_0_q8_0_pre(x: &[BlockQ8_0], y: &[BlockQ8_0], _yd: &[f32]) -> f32 {
        dot_q8_0_q8_0(x, y)
    }

    pub fn dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
        let mut sum = 0.0f32;
        for (a, b) in x.iter().zip(y) {
            let mut acc = 0i32;
            for j in 0..16 {
                acc += (a.qs[j] & 0x0f) as i32 * b.qs[j] as i32 + (a.qs[j] >> 4) as i32 * b.qs[j + 16] as i32;
            }
            sum += h2f(a.d) * h2f(b.d) * acc as f32 + h2f(a.m) * h2f(b.s);
        }
        sum
    }

    pub fn dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
        let mut sum = 0.0f32;
        for (a, b) in x.iter().zip(y) {
            let mut acc = 0i32;
            for j in 0..16 {
                acc +=
                    ((a.qs[j] & 0x0f) as i32 - 8) * b.qs[j] as i32 + ((a.qs[j] >> 4) as i32 - 8) * b.qs[j + 16] as i32;
            }
            sum += h2f(a.d) * h2f(b.d) * acc as f32;
        }
        sum
    }

    pub fn dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
        let mut sum = 0.0f32;
        for (a, b) in x.iter().zip(y) {
            let acc: i32 = q5_0_values(a).iter().zip(&b.qs).map(|(&p, &q)| p * q as i32).sum();
            sum += h2f(a.d) * h2f(b.d) * acc as f32;
        }
        sum
    }

    pub fn dot_q4_0_q8_0_x4(x: &[BlockQ4_0], y: [&[BlockQ8_0]; 4], _yd: [&[f32]; 4]) -> [f32; 4] {
        y.map(|row| dot_q4_0_q8_0(x, row))
    }

    pub fn dot_q5_0_q8_0_x4(x: &[BlockQ5_0], y: [&[BlockQ8_0]; 4], _yd: [&[f32]; 4]) -> [f32; 4] {
        y.map(|row| dot_q5_0_q8_0(x, row))
    }

    pub fn dot_q8_0_q8_0_x4(x: &[BlockQ8_0], y: [&[BlockQ8_0]; 4], _yd: [&[f32]; 4]) -> [f32; 4] {
        y.map(|row| dot_q8_0_q8_0(x, row))
    }

    pub fn dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
        let mut sum = 0.0f32;
        for (a, b) in x.iter().zip(y) {
            let acc: i32 = a.qs.iter().zip(&b.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
            sum += h2f(a.d) * h2f(b.d) * acc as f32;
        }
        sum
    }

    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
pub use avx2::{
    dot_f32, dot_q4_0_q8_0, dot_q4_0_q8_0_pre, dot_q4_0_q8_0_x4, dot_q4_1_q8_1, dot_q4_1_q8_1_pre, dot_q4_1_q8_1_x4,
    dot_q5_0_q8_0, dot_q5_0_q8_0_pre, dot_q5_0_q8_0_x4, dot_q8_0_q8_0, dot_q8_0_q8_0_pre, dot_q8_0_q8_0_x4,
};
#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
pub use scalar::{
    dot_f32, dot_q4_0_q8_0, dot_q4_0_q8_0_pre, dot_q4_0_q8_0_x4, dot_q4_1_q8_1, dot_q4_1_q8_1_pre, dot_q4_1_q8_1_x4,
    dot_q5_0_q8_0, dot_q5_0_q8_0_pre, dot_q5_0_q8_0_x4, dot_q8_0_q8_0, dot_q8_0_q8_0_pre, dot_q8_0_q8_0_x4,
};

/// `Σ h2f(a[i]) · b[i]` in exactly [`dot_f32`]'s order (8 FMA lanes, then the lane
/// sum): the f16 keys are widened in registers instead of through an f32 copy.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
pub fn dot_f16_f32(a: &[u16], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: AVX2, FMA and F16C are enabled at compile time; loads are unaligned-safe
    // and stay within `n`.
    unsafe {
        let n = a.len().min(b.len());
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            let k = _mm256_cvtph_ps(_mm_loadu_si128(a.as_ptr().add(i) as *const __m128i));
            acc = _mm256_fmadd_ps(k, _mm256_loadu_ps(b.as_ptr().add(i)), acc);
            i += 8;
        }
        let mut s = avx2::hsum_float_8(acc);
        while i < n {
            s += h2f(a[i]) * b[i];
            i += 1;
        }
        s
    }
}

/// `acc[i] = fma(h2f(v[i]), w, acc[i])`, vectorised (the same single rounding as the
/// scalar `mul_add`).
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
pub fn axpy_f16(acc: &mut [f32], v: &[u16], w: f32) {
    use std::arch::x86_64::*;
    // SAFETY: as above.
    unsafe {
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

/// Portable [`dot_f16_f32`].
#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
)))]
pub fn dot_f16_f32(a: &[u16], b: &[f32]) -> f32 {
    let k: Vec<f32> = a.iter().map(|&h| h2f(h)).collect();
    dot_f32(&k, b)
}

/// Portable [`axpy_f16`].
#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
)))]
pub fn axpy_f16(acc: &mut [f32], v: &[u16], w: f32) {
    for (a, &h) in acc.iter_mut().zip(v) {
        *a = h2f(h).mul_add(w, *a);
    }
}

/// The portable versions, for tests against the SIMD ones.
pub mod reference {
    pub use super::scalar::*;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    fn q8_0(x: &[f32]) -> Vec<BlockQ8_0> {
        let mut b = vec![BlockQ8_0 { d: 0, qs: [0; 32] }; x.len() / QK];
        quantize_q8_0(x, &mut b);
        b
    }

    #[test]
    fn quantize_rounds_half_to_even_and_round_trips() {
        let x = data(64, 1);
        let b = q8_0(&x);
        let mut back = vec![0.0; 64];
        dequantize_q8_0(&b, &mut back);
        for (a, r) in x.iter().zip(&back) {
            assert!((a - r).abs() <= h2f(b[0].d).max(h2f(b[1].d)) * 0.51, "{a} vs {r}");
        }
        let mut q = [0i8; 32];
        let mut v = [0.0f32; 32];
        v[0] = 127.0;
        v[1] = 2.5;
        v[2] = 3.5;
        quantize_block(&v, &mut q);
        assert_eq!((q[1], q[2]), (2, 4), "round half to even");
    }

    #[test]
    fn simd_dots_match_the_reference() {
        let x = data(256, 2);
        let w = data(256, 3);
        let xq = q8_0(&x);
        let wq = q8_0(&w);
        let a = dot_q8_0_q8_0(&wq, &xq);
        let b = reference::dot_q8_0_q8_0(&wq, &xq);
        assert!((a - b).abs() <= 1e-3 * b.abs().max(1.0), "{a} vs {b}");

        let mut x1 = vec![
            BlockQ8_1 {
                d: 0,
                s: 0,
                qs: [0; 32]
            };
            8
        ];
        quantize_q8_1(&x, &mut x1);
        let w1: Vec<BlockQ4_1> = (0..8)
            .map(|i| BlockQ4_1 {
                d: f2h(0.05 + i as f32 * 0.01),
                m: f2h(-0.3),
                qs: [(i * 37 % 256) as u8; 16],
            })
            .collect();
        let a = dot_q4_1_q8_1(&w1, &x1);
        let b = reference::dot_q4_1_q8_1(&w1, &x1);
        assert!((a - b).abs() <= 1e-3 * b.abs().max(1.0), "{a} vs {b}");

        let w0: Vec<BlockQ4_0> = (0..8)
            .map(|i| BlockQ4_0 {
                d: f2h(0.07),
                qs: [(i * 91 % 256) as u8; 16],
            })
            .collect();
        let a = dot_q4_0_q8_0(&w0, &xq);
        let b = reference::dot_q4_0_q8_0(&w0, &xq);
        assert!((a - b).abs() <= 1e-3 * b.abs().max(1.0), "{a} vs {b}");

        let w5: Vec<BlockQ5_0> = (0..8)
            .map(|i| BlockQ5_0 {
                d: f2h(0.04),
                qh: [(i * 29) as u8, 0xA5, (i * 7) as u8, 0x3C],
                qs: [(i * 71 % 256) as u8; 16],
            })
            .collect();
        let a = dot_q5_0_q8_0(&w5, &xq);
        let b = reference::dot_q5_0_q8_0(&w5, &xq);
        assert!((a - b).abs() <= 1e-3 * b.abs().max(1.0), "{a} vs {b}");
        // The dot product agrees with the dequantized weights.
        let mut wf = vec![0.0; 256];
        dequantize_q5_0(&w5, &mut wf);
        let mut xf = vec![0.0; 256];
        dequantize_q8_0(&xq, &mut xf);
        let c = reference::dot_f32(&wf, &xf);
        assert!((a - c).abs() <= 1e-3 * c.abs().max(1.0), "{a} vs {c}");

        let a = dot_f32(&x[..100], &w[..100]);
        let b = reference::dot_f32(&x[..100], &w[..100]);
        assert!((a - b).abs() <= 1e-3 * b.abs().max(1.0));
    }

    #[test]
    fn four_row_kernel_is_bit_identical_to_the_single_row_one() {
        let w: Vec<BlockQ4_1> = (0..8)
            .map(|i| BlockQ4_1 {
                d: f2h(0.03 + i as f32 * 0.01),
                m: f2h(-0.2),
                qs: [(i * 53 % 256) as u8; 16],
            })
            .collect();
        let acts: Vec<Vec<BlockQ8_1>> = (0..4)
            .map(|r| {
                let mut b = vec![
                    BlockQ8_1 {
                        d: 0,
                        s: 0,
                        qs: [0; 32]
                    };
                    8
                ];
                quantize_q8_1(&data(256, 10 + r), &mut b);
                b
            })
            .collect();
        // The activations' scales in f32, as QMatrix::prepare passes them.
        let ds1: Vec<Vec<f32>> = acts.iter().map(|a| a.iter().map(|b| h2f(b.d)).collect()).collect();
        let ss1: Vec<Vec<f32>> = acts.iter().map(|a| a.iter().map(|b| h2f(b.s)).collect()).collect();
        let four = dot_q4_1_q8_1_x4(
            &w,
            [&acts[0], &acts[1], &acts[2], &acts[3]],
            [&ds1[0], &ds1[1], &ds1[2], &ds1[3]],
            [&ss1[0], &ss1[1], &ss1[2], &ss1[3]],
        );
        for r in 0..4 {
            let one = dot_q4_1_q8_1(&w, &acts[r]);
            assert_eq!(four[r].to_bits(), one.to_bits());
            assert_eq!(
                dot_q4_1_q8_1_pre(&w, &acts[r], &ds1[r], &ss1[r]).to_bits(),
                one.to_bits()
            );
        }
        let acts0: Vec<Vec<BlockQ8_0>> = (0..4).map(|r| q8_0(&data(256, 20 + r))).collect();
        let ys = [&acts0[0][..], &acts0[1][..], &acts0[2][..], &acts0[3][..]];
        let ds0: Vec<Vec<f32>> = acts0.iter().map(|a| a.iter().map(|b| h2f(b.d)).collect()).collect();
        let yd = [&ds0[0][..], &ds0[1][..], &ds0[2][..], &ds0[3][..]];
        let w0: Vec<BlockQ4_0> = (0..8)
            .map(|i| BlockQ4_0 {
                d: f2h(0.05),
                qs: [(i * 91 % 256) as u8; 16],
            })
            .collect();
        let w5: Vec<BlockQ5_0> = (0..8)
            .map(|i| BlockQ5_0 {
                d: f2h(0.04),
                qh: [(i * 29) as u8, 0xA5, (i * 7) as u8, 0x3C],
                qs: [(i * 71 % 256) as u8; 16],
            })
            .collect();
        let w8 = q8_0(&data(256, 30));
        let (f0, f5, f8) = (
            dot_q4_0_q8_0_x4(&w0, ys, yd),
            dot_q5_0_q8_0_x4(&w5, ys, yd),
            dot_q8_0_q8_0_x4(&w8, ys, yd),
        );
        for r in 0..4 {
            assert_eq!(f0[r].to_bits(), dot_q4_0_q8_0_pre(&w0, ys[r], yd[r]).to_bits());
            assert_eq!(f5[r].to_bits(), dot_q5_0_q8_0_pre(&w5, ys[r], yd[r]).to_bits());
            assert_eq!(f8[r].to_bits(), dot_q8_0_q8_0_pre(&w8, ys[r], yd[r]).to_bits());
            assert_eq!(f0[r].to_bits(), dot_q4_0_q8_0(&w0, ys[r]).to_bits());
            assert_eq!(f5[r].to_bits(), dot_q5_0_q8_0(&w5, ys[r]).to_bits());
            assert_eq!(f8[r].to_bits(), dot_q8_0_q8_0(&w8, ys[r]).to_bits());
        }
    }

    #[test]
    fn layouts_match_ggml() {
        assert_eq!(std::mem::size_of::<BlockQ4_0>(), 18);
        assert_eq!(std::mem::size_of::<BlockQ4_1>(), 20);
        assert_eq!(std::mem::size_of::<BlockQ5_0>(), 22);
        assert_eq!(std::mem::size_of::<BlockQ8_0>(), 34);
        assert_eq!(std::mem::size_of::<BlockQ8_1>(), 36);
    }
}
