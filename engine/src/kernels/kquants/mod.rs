//! K-quant super-blocks (256 values) in ggml's layouts — Q4_K, Q5_K and Q6_K weights, Q8_K
//! activations — and their packed groups of eight rows. Activations are quantized as
//! `quantize_row_q8_K_ref` does (the x86 CPU backend's `from_float` for Q8_K), bit for
//! bit; the dot products finish each super-block in integers and do one fused
//! multiply-add per super-block and sum (see `simd::portable::dot_q4_k_q8_k`), as
//! llama.cpp's repacked kernels do.

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

/// ggml `block_q5_K`: as [`BlockQ4K`] with a fifth bit per value: value `l` of
/// sub-block `j` is `(qs[32 * (j / 2) + l] >> 4 * (j % 2)) & 0xf | ((qh[l] >> j) & 1) << 4`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
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

/// Eight Q4_K rows' super-block `i`, packed for kernels that keep one row per 32-bit
/// lane: the scales as `f16` bits, the sub-block scales and mins unpacked to bytes,
/// and the quantized bytes in steps of 4: `qs[256k + 32s + 4r..+4]` holds bytes
/// `32k + 4s..+4` of row `r` (k < 4, s < 8), so a 32-byte load puts row `r`'s four
/// bytes in lane `r` — their low nibbles are values `4s..+4` of sub-block `2k`, their
/// high nibbles the same of sub-block `2k + 1`. 1,184 bytes for eight rows' 1,152.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4Kx8 {
    pub d: [u16; 8],
    pub dmin: [u16; 8],
    /// `scales[j][r]`: sub-block `j`'s scale in row `r`.
    pub scales: [[u8; 8]; 8],
    /// `mins[p][2r + h]`: sub-block `2p + h`'s min in row `r` (pairs side by side, as
    /// `vpmaddwd` takes them once widened to 16 bits).
    pub mins: [[u8; 16]; 4],
    pub qs: [u8; 1024],
}

impl BlockQ4Kx8 {
    /// Packs super-block `i` of eight rows.
    pub fn pack(rows: [&BlockQ4K; 8]) -> Self {
        let mut out = BlockQ4Kx8 {
            d: rows.map(|b| b.d),
            dmin: rows.map(|b| b.dmin),
            scales: [[0; 8]; 8],
            mins: [[0; 16]; 4],
            qs: [0; 1024],
        };
        for (r, b) in rows.iter().enumerate() {
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, &b.scales);
                out.scales[j][r] = sc;
                out.mins[j / 2][2 * r + j % 2] = m;
            }
            for k in 0..4 {
                for s in 0..8 {
                    let to = 256 * k + 32 * s + 4 * r;
                    out.qs[to..to + 4].copy_from_slice(&b.qs[32 * k + 4 * s..32 * k + 4 * s + 4]);
                }
            }
        }
        out
    }

    /// Row `r`'s super-block back (its scales re-packed as ggml packs them).
    pub fn row(&self, r: usize) -> BlockQ4K {
        let mut b = BlockQ4K {
            d: self.d[r],
            dmin: self.dmin[r],
            scales: [0; K_SCALE_SIZE],
            qs: [0; QK_K / 2],
        };
        for j in 0..8 {
            let (sc, m) = (self.scales[j][r], self.mins[j / 2][2 * r + j % 2]);
            if j < 4 {
                b.scales[j] = sc;
                b.scales[j + 4] = m;
            } else {
                b.scales[j + 4] = (sc & 0xf) | ((m & 0xf) << 4);
                b.scales[j - 4] |= (sc >> 4) << 6;
                b.scales[j] |= (m >> 4) << 6;
            }
        }
        for k in 0..4 {
            for s in 0..8 {
                let from = 256 * k + 32 * s + 4 * r;
                b.qs[32 * k + 4 * s..32 * k + 4 * s + 4].copy_from_slice(&self.qs[from..from + 4]);
            }
        }
        b
    }
}

/// Eight Q5_K rows' super-block `i`: their low four bits, scales and mins packed as
/// [`BlockQ4Kx8`], and the fifth bits in the same lanes: `qh[32s + 4r..+4]` holds
/// bytes `4s..+4` of row `r`'s `qh`, whose bit `j` belongs to sub-block `j`. 1,440
/// bytes for eight rows' 1,408. The fifth bits come first: the kernels read them with
/// the first 256 bytes of `qs`, so the block is read nearly front to back, as
/// [`BlockQ6Kx8`] (whose split planes stalled decode on a Zen 4 EPYC; for Q5_K, whose
/// plane is smaller, the move measured within noise there).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5Kx8 {
    pub qh: [u8; 256],
    pub low: BlockQ4Kx8,
}

impl BlockQ5Kx8 {
    /// Packs super-block `i` of eight rows.
    pub fn pack(rows: [&BlockQ5K; 8]) -> Self {
        let lows = rows.map(|b| b.low());
        let low = BlockQ4Kx8::pack(lows.each_ref());
        let mut qh = [0; 256];
        for (r, b) in rows.iter().enumerate() {
            for s in 0..8 {
                qh[32 * s + 4 * r..32 * s + 4 * r + 4].copy_from_slice(&b.qh[4 * s..4 * s + 4]);
            }
        }
        BlockQ5Kx8 { low, qh }
    }

    /// Row `r`'s super-block back.
    pub fn row(&self, r: usize) -> BlockQ5K {
        let low = self.low.row(r);
        let mut qh = [0; QK_K / 8];
        for s in 0..8 {
            qh[4 * s..4 * s + 4].copy_from_slice(&self.qh[32 * s + 4 * r..32 * s + 4 * r + 4]);
        }
        BlockQ5K {
            d: low.d,
            dmin: low.dmin,
            scales: low.scales,
            qh,
            qs: low.qs,
        }
    }
}

/// Eight Q6_K rows' super-block `i`, packed for kernels that keep one row per 32-bit
/// lane, in exactly the file's 1,680 bytes. Chunk `c = 2n + h` (n, h < 2) of the low
/// bits, step `s` < 8, is the 32 bytes at [`Self::ql_at`]`(c, s)`: bytes
/// `64n + 32h + 4s..+4` of each row `r`'s `ql` at `+4r` — their low nibbles are values
/// `128n + 32h + 4s..+4`, their high nibbles the same plus 64. Half `n`'s high bits
/// for step `s` are the 32 bytes at [`Self::qh_at`]`(n, s)`: bytes `32n + 4s..+4` of
/// row `r`'s `qh` at `+4r`, whose bits `2c'..2c' + 2` are the high bits of value
/// `128n + 32c' + l`. A step's two low-bit chunks and its high bits lie side by side
/// (96 bytes), so a kernel reads the block front to back in one stream: with the
/// planes apart, the high bits' loads stalled decode on a Zen 4 EPYC (15 GB/s against
/// Q4_K's 31). The sub-block scales go in pairs per row (`scales[p][2r + e]`:
/// sub-block `2p + e`), as `vpmaddwd` takes them once widened to 16 bits.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ6Kx8 {
    pub d: [u16; 8],
    pub scales: [[i8; 16]; 8],
    pub q: [u8; 1536],
}

impl BlockQ6Kx8 {
    /// Where chunk `c`'s low bits for step `s` start in [`Self::q`].
    #[inline(always)]
    pub const fn ql_at(c: usize, s: usize) -> usize {
        768 * (c / 2) + 96 * s + 32 * (c % 2)
    }

    /// Where half `n`'s high bits for step `s` start in [`Self::q`].
    #[inline(always)]
    pub const fn qh_at(n: usize, s: usize) -> usize {
        768 * n + 96 * s + 64
    }

    /// Packs super-block `i` of eight rows.
    pub fn pack(rows: [&BlockQ6K; 8]) -> Self {
        let mut out = BlockQ6Kx8 {
            d: rows.map(|b| b.d),
            scales: [[0; 16]; 8],
            q: [0; 1536],
        };
        for (r, b) in rows.iter().enumerate() {
            for j in 0..16 {
                out.scales[j / 2][2 * r + j % 2] = b.scales[j];
            }
            for s in 0..8 {
                for c in 0..4 {
                    let to = Self::ql_at(c, s) + 4 * r;
                    out.q[to..to + 4].copy_from_slice(&b.ql[32 * c + 4 * s..32 * c + 4 * s + 4]);
                }
                for n in 0..2 {
                    let to = Self::qh_at(n, s) + 4 * r;
                    out.q[to..to + 4].copy_from_slice(&b.qh[32 * n + 4 * s..32 * n + 4 * s + 4]);
                }
            }
        }
        out
    }

    /// Row `r`'s super-block back.
    pub fn row(&self, r: usize) -> BlockQ6K {
        let mut b = BlockQ6K {
            d: self.d[r],
            ..BlockQ6K::ZERO
        };
        for j in 0..16 {
            b.scales[j] = self.scales[j / 2][2 * r + j % 2];
        }
        for s in 0..8 {
            for c in 0..4 {
                let from = Self::ql_at(c, s) + 4 * r;
                b.ql[32 * c + 4 * s..32 * c + 4 * s + 4].copy_from_slice(&self.q[from..from + 4]);
            }
            for n in 0..2 {
                let from = Self::qh_at(n, s) + 4 * r;
                b.qh[32 * n + 4 * s..32 * n + 4 * s + 4].copy_from_slice(&self.q[from..from + 4]);
            }
        }
        b
    }
}

/// Packed groups of eight Q4_K-like rows, for kernels written once for Q4_K and Q5_K:
/// the low four bits of every value are [`Self::low`]; with [`Self::HIGH`] the fifth
/// bits are [`Self::qh`] ([`BlockQ5Kx8`]'s layout).
pub trait KGroup: Copy + Send + Sync + 'static {
    const HIGH: bool;
    fn low(&self) -> &BlockQ4Kx8;
    fn qh(&self) -> &[u8; 256];
}

impl KGroup for BlockQ4Kx8 {
    const HIGH: bool = false;
    #[inline(always)]
    fn low(&self) -> &BlockQ4Kx8 {
        self
    }
    #[inline(always)]
    fn qh(&self) -> &[u8; 256] {
        static NONE: [u8; 256] = [0; 256];
        &NONE
    }
}

impl KGroup for BlockQ5Kx8 {
    const HIGH: bool = true;
    #[inline(always)]
    fn low(&self) -> &BlockQ4Kx8 {
        &self.low
    }
    #[inline(always)]
    fn qh(&self) -> &[u8; 256] {
        &self.qh
    }
}

/// An activation block's sub-block sums (`bsums` in pairs), two to a 32-bit word
/// (`sum(2p)` in the low 16 bits, `sum(2p + 1)` in the high), as the Q4_K kernels
/// multiply them with the mins: `|sum| ≤ 32 · 128` fits 16 bits.
pub fn q4_k_min_pairs(b: &BlockQ8K) -> [i32; 4] {
    std::array::from_fn(|p| {
        let sum = |j: usize| (b.bsums[2 * j] as i32 + b.bsums[2 * j + 1] as i32) as u16 as u32;
        (sum(2 * p) | (sum(2 * p + 1) << 16)) as i32
    })
}

impl BlockQ4K {
    pub const ZERO: Self = Self {
        d: 0,
        dmin: 0,
        scales: [0; K_SCALE_SIZE],
        qs: [0; QK_K / 2],
    };
}

impl BlockQ5K {
    /// Its low four bits as a Q4_K block (same scales and mins).
    pub fn low(&self) -> BlockQ4K {
        BlockQ4K {
            d: self.d,
            dmin: self.dmin,
            scales: self.scales,
            qs: self.qs,
        }
    }
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
pub(crate) fn scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
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

/// Dequantizes Q5_K blocks (ggml's `dequantize_row_q5_K`).
pub fn dequantize_q5_k(blocks: &[BlockQ5K], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = h2f(b.d);
        let min = h2f(b.dmin);
        for (j, o) in o.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(j, &b.scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            for (l, o) in o.iter_mut().enumerate() {
                let q = (b.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf | ((b.qh[l] >> j) & 1) << 4;
                *o = d1 * q as f32 - m1;
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
