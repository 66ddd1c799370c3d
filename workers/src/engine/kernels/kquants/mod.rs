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
#[inline(always)]
fn nearest_int(fval: f32) -> i32 {
    debug_assert!(fval.abs() <= 4194303.0);
    let val = fval + 12582912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Quantizes `x` (a multiple of 256 long) into Q8_K blocks, as `quantize_row_q8_K_ref`:
/// `iscale = -127 / max` where `max` is the first value of largest magnitude (so `d`
/// is negative when that value is positive), and `d = 1 / iscale`.
#[inline(always)]
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
pub(crate) fn q4k_scales_mins(s: &[u8; K_SCALE_SIZE]) -> [u32; 4] {
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

#[cfg(test)]
mod tests;
