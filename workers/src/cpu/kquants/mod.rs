//! K-quant super-blocks (256 values) in ggml's layouts — Q4_K and Q6_K weights, Q8_K
//! activations — and their dot products with ggml's arithmetic: activations are
//! quantized as `quantize_row_q8_K_ref` does (the x86 CPU backend's `from_float` for
//! Q8_K), and the AVX2 dot products mirror `ggml_vec_dot_q{4,6}_K_q8_K`'s AVX2 branches
//! lane for lane, so results track llama.cpp's non-repacked path bit for bit.

use super::quants::h2f;

/// Values per super-block.
pub const QK_K: usize = 256;

/// Bytes of packed 6-bit scales and mins in a Q4_K block.
pub const K_SCALE_SIZE: usize = 12;

/// ggml `block_q4_K`: 256 weights in 8 sub-blocks of 32, `x = d * sc * q - dmin * m`
/// with 6-bit `sc`/`m` packed in `scales` and 4-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// ggml `block_q6_K`: 256 weights in 16 sub-blocks of 16, `x = d * scale * (q - 32)`
/// with 6-bit `q` split into low nibbles (`ql`) and high 2-bit pairs (`qh`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: u16,
}

/// ggml `block_q8_K`: 256 activations = f32 scale + signed bytes + sums of 16-value groups.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

impl BlockQ4K {
    pub const ZERO: Self = Self {
        d: 0,
        dmin: 0,
        scales: [0; K_SCALE_SIZE],
        qs: [0; QK_K / 2],
    };
}

impl BlockQ6K {
    pub const ZERO: Self = Self {
        ql: [0; QK_K / 2],
        qh: [0; QK_K / 4],
        scales: [0; QK_K / 16],
        d: 0,
    };
}

impl BlockQ8K {
    pub const ZERO: Self = Self {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };
}

/// ggml's `nearest_int`: round half to even through the float mantissa.
#[inline]
fn nearest_int(fval: f32) -> i32 {
    debug_assert!(fval.abs() <= 4194303.0);
    let val = fval + 12582912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Quantizes `x` (a multiple of 256 long) into Q8_K blocks, as `quantize_row_q8_K_ref`:
/// `iscale = -127 / max` where `max` is the first value of largest magnitude (so `d`
/// is negative when that value is positive), and `d = 1 / iscale`.
pub fn quantize_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    for (b, chunk) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in chunk {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            // ggml leaves `bsums` as they were; with `d = 0` they contribute nothing.
            *b = BlockQ8K::ZERO;
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(chunk) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = q.iter().map(|&v| v as i32).sum::<i32>() as i16;
        }
        b.d = 1.0 / iscale;
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8).
#[inline]
fn scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The dot products' unpacking of Q4_K scales: words 0-1 hold the 8 scales as bytes,
/// words 2-3 the 8 mins (ggml's `utmp` with `kmask1..3`).
#[inline]
fn q4k_scales_mins(s: &[u8; K_SCALE_SIZE]) -> [u32; 4] {
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let mut utmp = [word(0), word(1), word(2), 0];
    utmp[3] = ((utmp[2] >> 4) & KMASK2) | (((utmp[1] >> 6) & KMASK3) << 4);
    let uaux = utmp[1] & KMASK1;
    utmp[1] = (utmp[2] & KMASK2) | (((utmp[0] >> 6) & KMASK3) << 4);
    utmp[2] = uaux;
    utmp[0] &= KMASK1;
    utmp
}

/// Dequantizes Q4_K blocks (ggml's `dequantize_row_q4_K`).
pub fn dequantize_q4_k(blocks: &[BlockQ4K], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = h2f(b.d);
        let min = h2f(b.dmin);
        for (j, (q, o)) in b.qs.chunks_exact(32).zip(o.chunks_exact_mut(64)).enumerate() {
            let (sc, m) = scale_min_k4(2 * j, &b.scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = scale_min_k4(2 * j + 1, &b.scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            for l in 0..32 {
                o[l] = d1 * (q[l] & 0xf) as f32 - m1;
                o[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// The 6-bit values (minus 32) of one 128-value half of a Q6_K block, in output order.
#[inline]
fn q6k_values(ql: &[u8], qh: &[u8], a: &mut [i8]) {
    for l in 0..32 {
        a[l] = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i8 - 32;
        a[l + 32] = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
        a[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
        a[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
    }
}

/// Dequantizes Q6_K blocks (ggml's `dequantize_row_q6_K`).
pub fn dequantize_q6_k(blocks: &[BlockQ6K], out: &mut [f32]) {
    let mut a = [0i8; 128];
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = h2f(b.d);
        for (n, o) in o.chunks_exact_mut(128).enumerate() {
            q6k_values(&b.ql[64 * n..], &b.qh[32 * n..], &mut a);
            let sc = &b.scales[8 * n..8 * n + 8];
            for (i, (dst, &q)) in o.iter_mut().zip(&a).enumerate() {
                // Sub-block of 16: `is + 0, 2, 4, 6` for the four 32-value quarters.
                *dst = d * sc[i / 16] as f32 * q as f32;
            }
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// ggml's `get_scale_shuffle_k4` table: row `i` repeats bytes `2i, 2i + 1`.
    static SHUFFLE_K4: [u8; 256] = {
        let mut t = [0u8; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = (2 * (i / 32) + i % 2) as u8;
            i += 1;
        }
        t
    };

    /// ggml's `get_scale_shuffle` table: row `i` is 8 × `2i` then 8 × `2i + 1`.
    static SHUFFLE: [u8; 128] = {
        let mut t = [0u8; 128];
        let mut i = 0;
        while i < 128 {
            t[i] = (2 * (i / 16) + (i % 16) / 8) as u8;
            i += 1;
        }
        t
    };

    #[inline(always)]
    unsafe fn get_scale_shuffle_k4(i: usize) -> __m256i {
        debug_assert!(i < 8);
        _mm256_loadu_si256(SHUFFLE_K4.as_ptr().add(32 * i) as *const __m256i)
    }

    #[inline(always)]
    unsafe fn get_scale_shuffle(i: usize) -> __m128i {
        debug_assert!(i < 8);
        _mm_loadu_si128(SHUFFLE.as_ptr().add(16 * i) as *const __m128i)
    }

    #[inline(always)]
    unsafe fn hsum_float_8(x: __m256) -> f32 {
        let mut res = _mm256_extractf128_ps(x, 1);
        res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }

    pub fn dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
        // SAFETY: compiled only with AVX2+FMA enabled; loads are unaligned-safe and stay
        // inside the blocks' arrays (qs: 4 × 32 bytes, q8: 8 × 32, bsums: 32 bytes).
        unsafe { q4k_rows([y], x)[0] }
    }

    /// Four activation rows against one weight row: weights unpacked once per block,
    /// each row's arithmetic exactly the single-row kernel's.
    pub fn dot_q4_k_q8_k_x4(x: &[BlockQ4K], y: [&[BlockQ8K]; 4]) -> [f32; 4] {
        // SAFETY: as above.
        unsafe { q4k_rows(y, x) }
    }

    pub fn dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
        // SAFETY: as above (ql: 4 × 32 bytes, qh: 2 × 32, scales: 16, q8: 8 × 32).
        unsafe { q6k_rows([y], x)[0] }
    }

    /// Four activation rows against one weight row (see [`dot_q4_k_q8_k_x4`]).
    pub fn dot_q6_k_q8_k_x4(x: &[BlockQ6K], y: [&[BlockQ8K]; 4]) -> [f32; 4] {
        // SAFETY: as above.
        unsafe { q6k_rows(y, x) }
    }

    /// `ggml_vec_dot_q4_K_q8_K`'s AVX2 branch for `N` activation rows at once.
    #[inline(always)]
    unsafe fn q4k_rows<const N: usize>(y: [&[BlockQ8K]; N], x: &[BlockQ4K]) -> [f32; N] {
        let m4 = _mm256_set1_epi8(0xf);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut acc_m = [_mm_setzero_ps(); N];
        for (i, a) in x.iter().enumerate() {
            let utmp = q4k_scales_mins(&a.scales);
            let mins_and_scales = _mm256_cvtepu8_epi16(_mm_set_epi32(
                utmp[3] as i32,
                utmp[2] as i32,
                utmp[1] as i32,
                utmp[0] as i32,
            ));
            let mins = _mm256_extracti128_si256(mins_and_scales, 1);
            let sc128 = _mm256_extracti128_si256(mins_and_scales, 0);
            let scales = _mm256_set_m128i(sc128, sc128);
            let (ad, admin) = (h2f(a.d), h2f(a.dmin));

            let q4 = a.qs.as_ptr();
            let mut sumi = [_mm256_setzero_si256(); N];
            for j in 0..QK_K / 64 {
                let scale_l = _mm256_shuffle_epi8(scales, get_scale_shuffle_k4(2 * j));
                let scale_h = _mm256_shuffle_epi8(scales, get_scale_shuffle_k4(2 * j + 1));
                let q4bits = _mm256_loadu_si256(q4.add(32 * j) as *const __m256i);
                let q4l = _mm256_and_si256(q4bits, m4);
                let q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
                for r in 0..N {
                    let q8 = y[r][i].qs.as_ptr();
                    let q8l = _mm256_loadu_si256(q8.add(64 * j) as *const __m256i);
                    let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));
                    let q8h = _mm256_loadu_si256(q8.add(64 * j + 32) as *const __m256i);
                    let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(p16l, p16h));
                }
            }
            for r in 0..N {
                let b = &y[r][i];
                let d = b.d * ad;
                let dmin = -b.d * admin;
                let q8sums = _mm256_loadu_si256(b.bsums.as_ptr() as *const __m256i);
                let q8s = _mm_hadd_epi16(_mm256_extracti128_si256(q8sums, 0), _mm256_extracti128_si256(q8sums, 1));
                let prod = _mm_madd_epi16(mins, q8s);
                acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            }
        }
        let mut out = [0.0f32; N];
        for r in 0..N {
            let mut m = acc_m[r];
            m = _mm_add_ps(m, _mm_movehl_ps(m, m));
            m = _mm_add_ss(m, _mm_movehdup_ps(m));
            out[r] = hsum_float_8(acc[r]) + _mm_cvtss_f32(m);
        }
        out
    }

    /// `ggml_vec_dot_q6_K_q8_K`'s AVX2 branch for `N` activation rows at once.
    #[inline(always)]
    unsafe fn q6k_rows<const N: usize>(y: [&[BlockQ8K]; N], x: &[BlockQ6K]) -> [f32; N] {
        let m3 = _mm256_set1_epi8(3);
        let m15 = _mm256_set1_epi8(15);
        let mut acc = [_mm256_setzero_ps(); N];
        for (i, a) in x.iter().enumerate() {
            let scales = _mm_loadu_si128(a.scales.as_ptr() as *const __m128i);
            let scales_16 = _mm256_cvtepi8_epi16(scales);
            let ad = h2f(a.d);
            let mut sumi = [_mm256_setzero_si256(); N];
            for j in 0..QK_K / 128 {
                let q4 = a.ql.as_ptr().add(64 * j);
                let q4bits1 = _mm256_loadu_si256(q4 as *const __m256i);
                let q4bits2 = _mm256_loadu_si256(q4.add(32) as *const __m256i);
                let q4bits_h = _mm256_loadu_si256(a.qh.as_ptr().add(32 * j) as *const __m256i);

                let q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, m3), 4);
                let q4h_1 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)), 2);
                let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
                let q4h_3 = _mm256_srli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)), 2);

                let q4_0 = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
                let q4_1 = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
                let q4_2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), q4h_2);
                let q4_3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), q4h_3);

                let is = 4 * j;
                let scale_0 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, get_scale_shuffle(is)));
                let scale_1 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, get_scale_shuffle(is + 1)));
                let scale_2 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, get_scale_shuffle(is + 2)));
                let scale_3 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, get_scale_shuffle(is + 3)));

                for r in 0..N {
                    let q8 = y[r][i].qs.as_ptr().add(128 * j);
                    let q8_0 = _mm256_loadu_si256(q8 as *const __m256i);
                    let q8_1 = _mm256_loadu_si256(q8.add(32) as *const __m256i);
                    let q8_2 = _mm256_loadu_si256(q8.add(64) as *const __m256i);
                    let q8_3 = _mm256_loadu_si256(q8.add(96) as *const __m256i);

                    let p16_0 = _mm256_madd_epi16(scale_0, _mm256_maddubs_epi16(q4_0, q8_0));
                    let p16_1 = _mm256_madd_epi16(scale_1, _mm256_maddubs_epi16(q4_1, q8_1));
                    let p16_2 = _mm256_madd_epi16(scale_2, _mm256_maddubs_epi16(q4_2, q8_2));
                    let p16_3 = _mm256_madd_epi16(scale_3, _mm256_maddubs_epi16(q4_3, q8_3));

                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(p16_0, p16_1));
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(p16_2, p16_3));
                }
            }
            for r in 0..N {
                let b = &y[r][i];
                let d = b.d * ad;
                let q8sums = _mm256_loadu_si256(b.bsums.as_ptr() as *const __m256i);
                // The -32 offset of every value, through the activations' group sums.
                let q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales_16), 5);
                let s = _mm256_sub_epi32(sumi[r], q8sclsub);
                acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d), _mm256_cvtepi32_ps(s), acc[r]);
            }
        }
        acc.map(|a| hsum_float_8(a))
    }
}

mod scalar {
    use super::*;

    pub fn dot_q4_k_q8_k_x4(x: &[BlockQ4K], y: [&[BlockQ8K]; 4]) -> [f32; 4] {
        y.map(|row| dot_q4_k_q8_k(x, row))
    }

    pub fn dot_q6_k_q8_k_x4(x: &[BlockQ6K], y: [&[BlockQ8K]; 4]) -> [f32; 4] {
        y.map(|row| dot_q6_k_q8_k(x, row))
    }

    /// ggml's generic version: 8 integer lanes per block, 8 float lane sums, the mins
    /// subtracted per block.
    pub fn dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
        let mut aux8 = [0i8; QK_K];
        let mut sums = [0.0f32; 8];
        let mut sumf = 0.0f32;
        for (a, b) in x.iter().zip(y) {
            for (q4, a8) in a.qs.chunks_exact(32).zip(aux8.chunks_exact_mut(64)) {
                for l in 0..32 {
                    a8[l] = (q4[l] & 0xf) as i8;
                    a8[l + 32] = (q4[l] >> 4) as i8;
                }
            }
            let utmp = q4k_scales_mins(&a.scales);
            let scales = [utmp[0].to_le_bytes(), utmp[1].to_le_bytes()].concat();
            let mins = [utmp[2].to_le_bytes(), utmp[3].to_le_bytes()].concat();

            let sumi: i32 = b
                .bsums
                .iter()
                .enumerate()
                .map(|(j, &s)| s as i32 * mins[j / 2] as i32)
                .sum();
            let mut aux32 = [0i32; 8];
            for ((q8, a8), &scale) in b.qs.chunks_exact(32).zip(aux8.chunks_exact(32)).zip(&scales) {
                for (q8, a8) in q8.chunks_exact(8).zip(a8.chunks_exact(8)) {
                    for l in 0..8 {
                        aux32[l] += scale as i32 * (q8[l] as i16 * a8[l] as i16) as i32;
                    }
                }
            }
            let d = h2f(a.d) * b.d;
            for (s, &v) in sums.iter_mut().zip(&aux32) {
                *s += d * v as f32;
            }
            let dmin = h2f(a.dmin) * b.d;
            sumf -= dmin * sumi as f32;
        }
        for s in sums {
            sumf += s;
        }
        sumf
    }

    /// ggml's generic version: 8 integer lanes per block, 8 float lane sums.
    pub fn dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
        let mut aux8 = [0i8; QK_K];
        let mut sums = [0.0f32; 8];
        for (a, b) in x.iter().zip(y) {
            for (n, a8) in aux8.chunks_exact_mut(128).enumerate() {
                q6k_values(&a.ql[64 * n..], &a.qh[32 * n..], a8);
            }
            let mut aux32 = [0i32; 8];
            for ((q8, a8), &scale) in b.qs.chunks_exact(16).zip(aux8.chunks_exact(16)).zip(&a.scales) {
                for (q8, a8) in q8.chunks_exact(8).zip(a8.chunks_exact(8)) {
                    for l in 0..8 {
                        aux32[l] += scale as i32 * (q8[l] as i16 * a8[l] as i16) as i32;
                    }
                }
            }
            let d = h2f(a.d) * b.d;
            for (s, &v) in sums.iter_mut().zip(&aux32) {
                *s += d * v as f32;
            }
        }
        let mut sumf = 0.0f32;
        for s in sums {
            sumf += s;
        }
        sumf
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
pub use avx2::{dot_q4_k_q8_k, dot_q4_k_q8_k_x4, dot_q6_k_q8_k, dot_q6_k_q8_k_x4};
#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
pub use scalar::{dot_q4_k_q8_k, dot_q4_k_q8_k_x4, dot_q6_k_q8_k, dot_q6_k_q8_k_x4};

/// The portable versions, for tests against the SIMD ones.
pub mod reference {
    pub use super::scalar::*;
}

#[cfg(test)]
mod tests;
