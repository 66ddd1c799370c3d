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

/// Eight Q4_0 rows' block `i`, packed for kernels that keep one row per 32-bit lane
/// (the layout of llama.cpp's repacked `block_q4_0x8`, with the nibbles kept as they
/// are): the eight scales, then the quantized bytes in four steps of 32, step `s`
/// holding bytes `4s..4s + 4` of row 0, then of row 1, …, of row 7. A 32-byte load of
/// a step puts row `r`'s four bytes in lane `r`: their low nibbles are values
/// `4s..4s + 4` and their high nibbles values `16 + 4s..16 + 4s + 4`. Same 144 bytes
/// as the eight blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_0x8 {
    pub d: [u16; 8],
    pub qs: [u8; 128],
}

impl BlockQ4_0x8 {
    /// Packs block `i` of eight rows.
    pub fn pack(rows: [&BlockQ4_0; 8]) -> Self {
        BlockQ4_0x8 {
            d: rows.map(|b| b.d),
            qs: pack_steps(rows.map(|b| &b.qs)),
        }
    }

    /// Row `r`'s block back.
    pub fn row(&self, r: usize) -> BlockQ4_0 {
        BlockQ4_0 {
            d: self.d[r],
            qs: row_steps(&self.qs, r),
        }
    }
}

/// Eight rows' 16 nibble bytes in four steps of 32: step `s` holds bytes `4s..4s + 4`
/// of row 0, then of row 1, …, of row 7 (see [`BlockQ4_0x8`]).
fn pack_steps(rows: [&[u8; 16]; 8]) -> [u8; 128] {
    let mut qs = [0u8; 128];
    for (r, q) in rows.iter().enumerate() {
        for s in 0..4 {
            qs[32 * s + 4 * r..32 * s + 4 * r + 4].copy_from_slice(&q[4 * s..4 * s + 4]);
        }
    }
    qs
}

/// Row `r`'s 16 nibble bytes back from [`pack_steps`]' layout.
fn row_steps(qs: &[u8; 128], r: usize) -> [u8; 16] {
    let mut q = [0u8; 16];
    for s in 0..4 {
        q[4 * s..4 * s + 4].copy_from_slice(&qs[32 * s + 4 * r..32 * s + 4 * r + 4]);
    }
    q
}

/// `−8 · Σ qs` of an activation block: what the Q4_0 kernels add to `Σ nibble · q`
/// (weights taken as unsigned nibbles) to get `Σ (nibble − 8) · q`.
pub fn q4_0_offset(b: &BlockQ8_0) -> i32 {
    -8 * b.qs.iter().map(|&q| q as i32).sum::<i32>()
}

/// ggml `block_q4_1`: 32 weights = f16 scale + f16 min + 16 bytes of 4-bit values.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; 16],
}

/// Eight Q4_1 rows' block `i`, packed as [`BlockQ4_0x8`] is, with the eight scales and
/// mins. Same 160 bytes as the eight blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_1x8 {
    pub d: [u16; 8],
    pub m: [u16; 8],
    pub qs: [u8; 128],
}

impl BlockQ4_1x8 {
    /// Packs block `i` of eight rows.
    pub fn pack(rows: [&BlockQ4_1; 8]) -> Self {
        BlockQ4_1x8 {
            d: rows.map(|b| b.d),
            m: rows.map(|b| b.m),
            qs: pack_steps(rows.map(|b| &b.qs)),
        }
    }

    /// Row `r`'s block back.
    pub fn row(&self, r: usize) -> BlockQ4_1 {
        BlockQ4_1 {
            d: self.d[r],
            m: self.m[r],
            qs: row_steps(&self.qs, r),
        }
    }
}

/// ggml `block_q5_1`: 32 weights = f16 scale + f16 min + 32 high bits + 16 bytes of
/// low nibbles, `x = d * (nibble | high << 4) + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// Eight Q8_0 rows' block `i`, packed for kernels that keep one row per 32-bit lane:
/// the eight scales, then the values in eight steps of 32 bytes, step `s` holding
/// values `4s..4s + 4` of row 0, then of row 1, …, of row 7, each stored as the
/// unsigned byte `q + 128` (what `vpdpbusd` multiplies; the kernels take
/// `128 · Σ y` off each block's sum through the inputs' [`q4_0_offset`]s, which are
/// `−8 · Σ y`). Same 272 bytes as the eight blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0x8 {
    pub d: [u16; 8],
    pub qs: [u8; 256],
}

impl BlockQ8_0x8 {
    /// Packs block `i` of eight rows.
    pub fn pack(rows: [&BlockQ8_0; 8]) -> Self {
        let mut qs = [0u8; 256];
        for (r, b) in rows.iter().enumerate() {
            for s in 0..8 {
                for k in 0..4 {
                    qs[32 * s + 4 * r + k] = (b.qs[4 * s + k] as u8) ^ 0x80;
                }
            }
        }
        BlockQ8_0x8 {
            d: rows.map(|b| b.d),
            qs,
        }
    }

    /// Row `r`'s block back.
    pub fn row(&self, r: usize) -> BlockQ8_0 {
        let mut qs = [0i8; 32];
        for s in 0..8 {
            for k in 0..4 {
                qs[4 * s + k] = (self.qs[32 * s + 4 * r + k] ^ 0x80) as i8;
            }
        }
        BlockQ8_0 { d: self.d[r], qs }
    }
}

/// Eight Q5_1 rows' block `i`, packed as [`BlockQ4_0x8`] is (the nibbles in four steps
/// of 32, row `r`'s four bytes of a step in lane `r`), with the eight scales and mins,
/// and the fifth bits regrouped by step: byte `8s + r` holds row `r`'s fifth bits of
/// values `4s..4s + 4` (low half) and `16 + 4s..16 + 4s + 4` (high half), the sixteen
/// values step `s` gives lane `r`. Same 192 bytes as the eight blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_1x8 {
    pub d: [u16; 8],
    pub m: [u16; 8],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}

impl BlockQ5_1x8 {
    /// Packs block `i` of eight rows.
    pub fn pack(rows: [&BlockQ5_1; 8]) -> Self {
        BlockQ5_1x8 {
            d: rows.map(|b| b.d),
            m: rows.map(|b| b.m),
            qh: pack_fifth(rows.map(|b| b.qh)),
            qs: pack_steps(rows.map(|b| &b.qs)),
        }
    }

    /// Row `r`'s block back.
    pub fn row(&self, r: usize) -> BlockQ5_1 {
        BlockQ5_1 {
            d: self.d[r],
            m: self.m[r],
            qh: row_fifth(&self.qh, r),
            qs: row_steps(&self.qs, r),
        }
    }
}

/// Eight Q5_0 rows' block `i`, packed as [`BlockQ5_1x8`] is, without the mins. Same
/// 176 bytes as the eight blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_0x8 {
    pub d: [u16; 8],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}

/// Eight rows' fifth bits regrouped by step (see [`BlockQ5_1x8`]).
fn pack_fifth(rows: [[u8; 4]; 8]) -> [u8; 32] {
    let mut pqh = [0u8; 32];
    for (r, qh) in rows.iter().enumerate() {
        let h = u32::from_le_bytes(*qh);
        for s in 0..4 {
            pqh[8 * s + r] = ((h >> (4 * s)) & 0xf) as u8 | ((((h >> (16 + 4 * s)) & 0xf) as u8) << 4);
        }
    }
    pqh
}

/// Row `r`'s fifth bits back from [`pack_fifth`]'s layout.
fn row_fifth(pqh: &[u8; 32], r: usize) -> [u8; 4] {
    let mut h = 0u32;
    for s in 0..4 {
        let b = pqh[8 * s + r] as u32;
        h |= (b & 0xf) << (4 * s) | (b >> 4) << (16 + 4 * s);
    }
    h.to_le_bytes()
}

impl BlockQ5_0x8 {
    /// Packs block `i` of eight rows.
    pub fn pack(rows: [&BlockQ5_0; 8]) -> Self {
        BlockQ5_0x8 {
            d: rows.map(|b| b.d),
            qh: pack_fifth(rows.map(|b| b.qh)),
            qs: pack_steps(rows.map(|b| &b.qs)),
        }
    }

    /// Row `r`'s block back.
    pub fn row(&self, r: usize) -> BlockQ5_0 {
        BlockQ5_0 {
            d: self.d[r],
            qh: row_fifth(&self.qh, r),
            qs: row_steps(&self.qs, r),
        }
    }
}

/// A packed group of eight rows of small unsigned values ([`BlockQ4_1x8`],
/// [`BlockQ5_0x8`], [`BlockQ5_1x8`]): the nibbles, or-ed for Q5_0/Q5_1 with their fifth
/// bits (0–31), in the same lanes and steps; Q5_0 takes 16 off each (through the
/// inputs' Q4_0 offsets, `2 · (−8 · Σ y)`), Q4_1 and Q5_1 add their min (times the
/// inputs' sums `d · Σ y`).
pub trait Nibbles8: Copy + Sync {
    /// Q4_1, Q5_1: a min per row, and Q8_1 activations; Q5_0: neither.
    const MIN: bool;
    /// Q5_0, Q5_1: a fifth bit per value in [`Self::qh`]; Q4_1: none.
    const FIFTH: bool;
    fn d(&self) -> &[u16; 8];
    /// The mins (zero for Q5_0).
    fn m(&self) -> &[u16; 8];
    /// The fifth bits by step (zero for Q4_1).
    fn qh(&self) -> &[u8; 32];
    fn qs(&self) -> &[u8; 128];
}

/// `Nibbles8` for a packed type: whether it has mins and fifth bits, and where.
macro_rules! nibbles8 {
    ($block:ty, min: $min:literal, fifth: $fifth:literal, m: |$bm:ident| $m:expr, qh: |$bh:ident| $qh:expr) => {
        impl Nibbles8 for $block {
            const MIN: bool = $min;
            const FIFTH: bool = $fifth;
            #[inline(always)]
            fn d(&self) -> &[u16; 8] {
                &self.d
            }
            #[inline(always)]
            fn m(&self) -> &[u16; 8] {
                let $bm = self;
                $m
            }
            #[inline(always)]
            fn qh(&self) -> &[u8; 32] {
                let $bh = self;
                $qh
            }
            #[inline(always)]
            fn qs(&self) -> &[u8; 128] {
                &self.qs
            }
        }
    };
}

nibbles8!(BlockQ4_1x8, min: true, fifth: false, m: |b| &b.m, qh: |_b| &[0; 32]);
nibbles8!(BlockQ5_0x8, min: false, fifth: true, m: |_b| &[0; 8], qh: |b| &b.qh);
nibbles8!(BlockQ5_1x8, min: true, fifth: true, m: |b| &b.m, qh: |b| &b.qh);

/// What a [`Nibbles8`] kernel takes per input block beside its scale: Q5_0 the Q4_0
/// offset (`i32`, read with [`Self::offset`]), Q4_1 and Q5_1 the block's sum (`f32`,
/// read with [`Self::sum`]).
pub trait Extra: Copy + Sync {
    fn offset(self) -> i32;
    fn sum(self) -> f32;
}

impl Extra for i32 {
    #[inline(always)]
    fn offset(self) -> i32 {
        self
    }
    #[inline(always)]
    fn sum(self) -> f32 {
        unreachable!("Q5_0 has no min")
    }
}

impl Extra for f32 {
    #[inline(always)]
    fn offset(self) -> i32 {
        unreachable!("Q4_1 and Q5_1 have no offset")
    }
    #[inline(always)]
    fn sum(self) -> f32 {
        self
    }
}

/// The 32 signed bytes of an 8-bit activation block (Q8_0, Q8_1).
pub trait ActBlock: Sync {
    fn qs(&self) -> &[i8; 32];
}

impl ActBlock for BlockQ8_0 {
    #[inline(always)]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
}

impl ActBlock for BlockQ8_1 {
    #[inline(always)]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
}

/// A block `x = d · q + m` with unsigned `q`, as the file stores it: Q4_1 (four bits)
/// and Q5_1 (a fifth bit from `qh`). Both are served packed ([`BlockQ4_1x8`],
/// [`BlockQ5_1x8`]); this trait serves the rows after the last whole group
/// ([`crate::kernels::simd::portable::dot_min_q8_1`]) and dequantization.
pub trait MinBlock: Copy + Sync {
    fn d(&self) -> u16;
    fn m(&self) -> u16;
    fn qs(&self) -> &[u8; 16];
    /// The fifth bits (value `j`'s is bit `j`); zero for Q4_1.
    fn qh(&self) -> [u8; 4];
}

/// `MinBlock` for a block type: where its fifth bits are.
macro_rules! min_block {
    ($block:ty, |$b:ident| $qh:expr) => {
        impl MinBlock for $block {
            #[inline(always)]
            fn d(&self) -> u16 {
                self.d
            }
            #[inline(always)]
            fn m(&self) -> u16 {
                self.m
            }
            #[inline(always)]
            fn qs(&self) -> &[u8; 16] {
                &self.qs
            }
            #[inline(always)]
            fn qh(&self) -> [u8; 4] {
                let $b = self;
                $qh
            }
        }
    };
}

min_block!(BlockQ4_1, |_b| [0; 4]);
min_block!(BlockQ5_1, |b| b.qh);

/// The unsigned values of a [`MinBlock`], in ggml's order (low nibbles, then high).
#[inline]
pub fn min_block_values<B: MinBlock>(b: &B) -> [u8; 32] {
    let (qs, qh) = (b.qs(), u32::from_le_bytes(b.qh()));
    let mut v = [0u8; 32];
    for j in 0..16 {
        v[j] = (qs[j] & 0x0f) | (((qh >> j) & 1) << 4) as u8;
        v[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
    }
    v
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

/// f16 bits → f32 (exact). The SIMD kernels convert in registers instead; this is
/// for the portable kernels and for dequantizing.
#[inline(always)]
pub fn h2f(h: u16) -> f32 {
    f16::from_bits(h).to_f32()
}

#[inline(always)]
pub fn f2h(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// Scale and rounded values of one 32-value block, as ggml's AVX2 quantizer does.
#[inline(always)]
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

/// Quantizes `x` (a multiple of 32 long) into Q8_0 blocks. (The kernel tables run
/// this compiled for the CPU's variant: `Kernels::quantize_q8_0`.)
#[inline(always)]
pub fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    for (b, chunk) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let (d, _) = quantize_block(chunk, &mut b.qs);
        b.d = f2h(d);
    }
}

/// Quantizes `x` into Q8_1 blocks.
#[inline(always)]
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

/// Dequantizes Q4_1 or Q5_1 blocks.
pub fn dequantize_min<B: MinBlock>(blocks: &[B], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (h2f(b.d()), h2f(b.m()));
        for (dst, q) in o.iter_mut().zip(min_block_values(b)) {
            *dst = q as f32 * d + m;
        }
    }
}

/// The 5-bit values of one Q5_0 block, offset by −16.
#[inline]
pub fn q5_0_values(b: &BlockQ5_0) -> [i32; 32] {
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
    fn dots_agree_with_the_dequantized_weights() {
        use crate::kernels::simd::portable as k;
        let x = data(256, 2);
        let xq = q8_0(&x);
        let xd: Vec<f32> = xq.iter().map(|b| h2f(b.d)).collect();
        let mut xf = vec![0.0; 256];
        dequantize_q8_0(&xq, &mut xf);
        let float_dot = |w: &[f32]| -> f32 { w.iter().zip(&xf).map(|(a, b)| a * b).sum() };
        let close = |a: f32, b: f32| assert!((a - b).abs() <= 1e-3 * b.abs().max(1.0), "{a} vs {b}");

        let w8 = q8_0(&data(256, 3));
        let mut wf = vec![0.0; 256];
        dequantize_q8_0(&w8, &mut wf);
        close(k::dot_q8_0_blocks(&w8, &xq, &xd), float_dot(&wf));

        let w0: Vec<BlockQ4_0> = (0..8)
            .map(|i| BlockQ4_0 {
                d: f2h(0.07),
                qs: [(i * 91 % 256) as u8; 16],
            })
            .collect();
        dequantize_q4_0(&w0, &mut wf);
        close(k::dot_q4_0_q8_0(&w0, &xq, &xd), float_dot(&wf));

        let w5: Vec<BlockQ5_0> = (0..8)
            .map(|i| BlockQ5_0 {
                d: f2h(0.04),
                qh: [(i * 29) as u8, 0xA5, (i * 7) as u8, 0x3C],
                qs: [(i * 71 % 256) as u8; 16],
            })
            .collect();
        dequantize_q5_0(&w5, &mut wf);
        close(k::dot_q5_0_blocks(&w5, &xq, &xd), float_dot(&wf));

        // Q4_1 against Q8_1 activations: the minimum enters through the block sums.
        let mut x1 = vec![
            BlockQ8_1 {
                d: 0,
                s: 0,
                qs: [0; 32]
            };
            8
        ];
        quantize_q8_1(&x, &mut x1);
        let (yd, ys): (Vec<f32>, Vec<f32>) = x1.iter().map(|b| (h2f(b.d), h2f(b.s))).unzip();
        let w1: Vec<BlockQ4_1> = (0..8)
            .map(|i| BlockQ4_1 {
                d: f2h(0.05 + i as f32 * 0.01),
                m: f2h(-0.3),
                qs: [(i * 37 % 256) as u8; 16],
            })
            .collect();
        dequantize_min(&w1, &mut wf);
        let want: f32 = wf
            .iter()
            .zip(x1.iter().flat_map(|b| b.qs.map(|q| q as f32 * h2f(b.d))))
            .map(|(a, b)| a * b)
            .sum();
        let got = k::dot_min_q8_1(&w1, &x1, &yd, &ys);
        assert!((got - want).abs() <= 2e-2 * want.abs().max(1.0), "{got} vs {want}");

        // Q5_1 likewise, its fifth bits included (against the float dot product).
        let w51: Vec<BlockQ5_1> = (0..8)
            .map(|i| BlockQ5_1 {
                d: f2h(0.03 + i as f32 * 0.01),
                m: f2h(-0.45),
                qh: [(i * 29) as u8, 0xA5, (i * 7) as u8, 0x3C],
                qs: [(i * 37 % 256) as u8; 16],
            })
            .collect();
        dequantize_min(&w51, &mut wf);
        assert!(
            wf.iter().any(|&v| v > 0.03 * 16.0 - 0.45),
            "fifth bits reach the values"
        );
        let want: f32 = wf
            .iter()
            .zip(x1.iter().flat_map(|b| b.qs.map(|q| q as f32 * h2f(b.d))))
            .map(|(a, b)| a * b)
            .sum();
        let got = k::dot_min_q8_1(&w51, &x1, &yd, &ys);
        assert!((got - want).abs() <= 2e-2 * want.abs().max(1.0), "{got} vs {want}");

        close(
            k::dot_f32(&x[..100], &x[1..101]),
            x[..100].iter().zip(&x[1..101]).map(|(a, b)| a * b).sum(),
        );
    }

    #[test]
    fn layouts_match_ggml() {
        assert_eq!(std::mem::size_of::<BlockQ4_0>(), 18);
        assert_eq!(std::mem::size_of::<BlockQ4_1>(), 20);
        assert_eq!(std::mem::size_of::<BlockQ5_0>(), 22);
        assert_eq!(std::mem::size_of::<BlockQ5_1>(), 24);
        assert_eq!(std::mem::size_of::<BlockQ8_0>(), 34);
        assert_eq!(std::mem::size_of::<BlockQ8_1>(), 36);
    }
}
