//! Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K matrices — every quantized type
//! the engine reads — stored as packed groups of eight rows ([`BlockQ4_0x8`],
//! [`BlockQ4_1x8`], [`BlockQ5_0x8`], [`BlockQ5_1x8`], [`BlockQ8_0x8`], [`BlockQ4Kx8`], [`BlockQ5Kx8`], [`BlockQ6Kx8`]: one row per 32-bit
//! lane, llama.cpp's repacked layouts, Q4_K's with a plane of fifth bits, Q6_K's
//! nibbles and two-bit planes) whatever the
//! CPU, because their arithmetic is defined on them: each block finished in integers,
//! then one fused multiply-add per block and sum
//! ([`crate::kernels::simd::portable::dot_q4_0_q8_0`],
//! [`crate::kernels::simd::portable::dot_q4_k_q8_k`]).
//!
//! Why: ggml's row kernels keep eight float lanes per cell and block (a convert, a
//! multiply and an FMA each), so a Q4_0 prefill is float-bound — eight times the float
//! work of a per-block sum, which no layout of its lanes removes — and a Q4_K row tile
//! spends its time on 16-bit products and shuffles of the scales. With rows in lanes,
//! a 32-value block of sixteen rows against one input is eight `vpdpbusd` on AVX-512,
//! the scales are applied per sub-block to the integer sums, and a decode step reads
//! each group as one stream (read row by row, eight rows are eight streams and the
//! hardware prefetcher falls behind: one thread on a 2-core EPYC, Q4_0 single rows 17
//! GB/s, eight rows in file order 6.3, eight interleaved 26.9). Q4_0: the same 144
//! bytes per group and block as the file; Q4_K: 1,184 per group and super-block for
//! the file's 1,152 (the sub-block scales and mins unpacked to bytes); Q5_K: 1,440 for
//! 1,408; Q6_K: the file's 1,680.

#[cfg(test)]
use super::QData;
use super::{chunk_rows, OutPtr, QAct, QMatrix};
use crate::kernels::kquants::{BlockQ4K, BlockQ4Kx8, BlockQ5K, BlockQ5Kx8, BlockQ6K, BlockQ6Kx8, QK_K};
use crate::kernels::quants::{
    BlockQ4_0, BlockQ4_0x8, BlockQ4_1, BlockQ4_1x8, BlockQ5_0, BlockQ5_0x8, BlockQ5_1, BlockQ5_1x8, BlockQ8_0,
    BlockQ8_0x8, QK,
};
use crate::kernels::simd::Kernels;
use rayon::prelude::*;
use std::cell::RefCell;

/// A packed block of eight rows.
pub(super) trait Packed: Copy + Send + Sync + 'static {
    /// The file's block.
    type Row: Copy + Send + Sync;
    /// Values per block.
    const BLOCK: usize;
    fn pack(rows: [&Self::Row; 8]) -> Self;
    fn row(&self, r: usize) -> Self::Row;
    /// Groups `x` (`nb` blocks a row) against the first `n` prepared inputs:
    /// `out[t * 8 * groups + r]`.
    fn groups(k: &Kernels, x: &[Self], act: &QAct, n: usize, nb: usize, out: &mut [f32]);
    /// One row in file order against prepared input `t`.
    fn one(k: &Kernels, x: &[Self::Row], act: &QAct, t: usize) -> f32;
}

impl Packed for BlockQ4_0x8 {
    type Row = BlockQ4_0;
    const BLOCK: usize = QK;
    fn pack(rows: [&BlockQ4_0; 8]) -> Self {
        BlockQ4_0x8::pack(rows)
    }
    fn row(&self, r: usize) -> BlockQ4_0 {
        BlockQ4_0x8::row(self, r)
    }
    fn groups(k: &Kernels, x: &[Self], act: &QAct, n: usize, nb: usize, out: &mut [f32]) {
        let QAct::Q8_0(y, yd, yo) = act else {
            unreachable!("prepare() matches the weight type")
        };
        (k.q4_0x8)(x, &y[..n * nb], &yd[..n * nb], &yo[..n * nb], n, out)
    }
    fn one(k: &Kernels, x: &[BlockQ4_0], act: &QAct, t: usize) -> f32 {
        let QAct::Q8_0(y, yd, _) = act else {
            unreachable!("prepare() matches the weight type")
        };
        let nb = x.len();
        (k.q4_0)(x, &y[t * nb..(t + 1) * nb], &yd[t * nb..(t + 1) * nb])
    }
}

impl Packed for BlockQ5_0x8 {
    type Row = BlockQ5_0;
    const BLOCK: usize = QK;
    fn pack(rows: [&BlockQ5_0; 8]) -> Self {
        BlockQ5_0x8::pack(rows)
    }
    fn row(&self, r: usize) -> BlockQ5_0 {
        BlockQ5_0x8::row(self, r)
    }
    fn groups(k: &Kernels, x: &[Self], act: &QAct, n: usize, nb: usize, out: &mut [f32]) {
        let QAct::Q8_0(y, yd, yo) = act else {
            unreachable!("prepare() matches the weight type")
        };
        (k.q5_0x8)(x, &y[..n * nb], &yd[..n * nb], &yo[..n * nb], n, out)
    }
    fn one(k: &Kernels, x: &[BlockQ5_0], act: &QAct, t: usize) -> f32 {
        let QAct::Q8_0(y, yd, _) = act else {
            unreachable!("prepare() matches the weight type")
        };
        let nb = x.len();
        (k.q5_0)(x, &y[t * nb..(t + 1) * nb], &yd[t * nb..(t + 1) * nb])
    }
}

impl Packed for BlockQ8_0x8 {
    type Row = BlockQ8_0;
    const BLOCK: usize = QK;
    fn pack(rows: [&BlockQ8_0; 8]) -> Self {
        BlockQ8_0x8::pack(rows)
    }
    fn row(&self, r: usize) -> BlockQ8_0 {
        BlockQ8_0x8::row(self, r)
    }
    fn groups(k: &Kernels, x: &[Self], act: &QAct, n: usize, nb: usize, out: &mut [f32]) {
        let QAct::Q8_0(y, yd, yo) = act else {
            unreachable!("prepare() matches the weight type")
        };
        (k.q8_0x8)(x, &y[..n * nb], &yd[..n * nb], &yo[..n * nb], n, out)
    }
    fn one(k: &Kernels, x: &[BlockQ8_0], act: &QAct, t: usize) -> f32 {
        let QAct::Q8_0(y, yd, _) = act else {
            unreachable!("prepare() matches the weight type")
        };
        let nb = x.len();
        (k.q8_0)(x, &y[t * nb..(t + 1) * nb], &yd[t * nb..(t + 1) * nb])
    }
}

impl Packed for BlockQ4_1x8 {
    type Row = BlockQ4_1;
    const BLOCK: usize = QK;
    fn pack(rows: [&BlockQ4_1; 8]) -> Self {
        BlockQ4_1x8::pack(rows)
    }
    fn row(&self, r: usize) -> BlockQ4_1 {
        BlockQ4_1x8::row(self, r)
    }
    fn groups(k: &Kernels, x: &[Self], act: &QAct, n: usize, nb: usize, out: &mut [f32]) {
        let QAct::Q8_1(y, yd, ys) = act else {
            unreachable!("prepare() matches the weight type")
        };
        (k.q4_1x8)(x, &y[..n * nb], &yd[..n * nb], &ys[..n * nb], n, out)
    }
    fn one(k: &Kernels, x: &[BlockQ4_1], act: &QAct, t: usize) -> f32 {
        let QAct::Q8_1(y, yd, ys) = act else {
            unreachable!("prepare() matches the weight type")
        };
        let ins = t * x.len()..(t + 1) * x.len();
        (k.q4_1)(x, &y[ins.clone()], &yd[ins.clone()], &ys[ins])
    }
}

impl Packed for BlockQ5_1x8 {
    type Row = BlockQ5_1;
    const BLOCK: usize = QK;
    fn pack(rows: [&BlockQ5_1; 8]) -> Self {
        BlockQ5_1x8::pack(rows)
    }
    fn row(&self, r: usize) -> BlockQ5_1 {
        BlockQ5_1x8::row(self, r)
    }
    fn groups(k: &Kernels, x: &[Self], act: &QAct, n: usize, nb: usize, out: &mut [f32]) {
        let QAct::Q8_1(y, yd, ys) = act else {
            unreachable!("prepare() matches the weight type")
        };
        (k.q5_1x8)(x, &y[..n * nb], &yd[..n * nb], &ys[..n * nb], n, out)
    }
    fn one(k: &Kernels, x: &[BlockQ5_1], act: &QAct, t: usize) -> f32 {
        let QAct::Q8_1(y, yd, ys) = act else {
            unreachable!("prepare() matches the weight type")
        };
        let ins = t * x.len()..(t + 1) * x.len();
        (k.q5_1)(x, &y[ins.clone()], &yd[ins.clone()], &ys[ins])
    }
}

impl Packed for BlockQ4Kx8 {
    type Row = BlockQ4K;
    const BLOCK: usize = QK_K;
    fn pack(rows: [&BlockQ4K; 8]) -> Self {
        BlockQ4Kx8::pack(rows)
    }
    fn row(&self, r: usize) -> BlockQ4K {
        BlockQ4Kx8::row(self, r)
    }
    fn groups(k: &Kernels, x: &[Self], act: &QAct, n: usize, nb: usize, out: &mut [f32]) {
        let QAct::Q8K(y, ym) = act else {
            unreachable!("prepare() matches the weight type")
        };
        (k.q4_kx8)(x, &y[..n * nb], &ym[..n * nb], n, out)
    }
    fn one(k: &Kernels, x: &[BlockQ4K], act: &QAct, t: usize) -> f32 {
        let QAct::Q8K(y, _) = act else {
            unreachable!("prepare() matches the weight type")
        };
        let nb = x.len();
        (k.q4_k)(x, &y[t * nb..(t + 1) * nb])
    }
}

impl Packed for BlockQ5Kx8 {
    type Row = BlockQ5K;
    const BLOCK: usize = QK_K;
    fn pack(rows: [&BlockQ5K; 8]) -> Self {
        BlockQ5Kx8::pack(rows)
    }
    fn row(&self, r: usize) -> BlockQ5K {
        BlockQ5Kx8::row(self, r)
    }
    fn groups(k: &Kernels, x: &[Self], act: &QAct, n: usize, nb: usize, out: &mut [f32]) {
        let QAct::Q8K(y, ym) = act else {
            unreachable!("prepare() matches the weight type")
        };
        (k.q5_kx8)(x, &y[..n * nb], &ym[..n * nb], n, out)
    }
    fn one(_: &Kernels, x: &[BlockQ5K], act: &QAct, t: usize) -> f32 {
        let QAct::Q8K(y, _) = act else {
            unreachable!("prepare() matches the weight type")
        };
        let nb = x.len();
        crate::kernels::simd::portable::dot_q5_k_q8_k(x, &y[t * nb..(t + 1) * nb])
    }
}

impl Packed for BlockQ6Kx8 {
    type Row = BlockQ6K;
    const BLOCK: usize = QK_K;
    fn pack(rows: [&BlockQ6K; 8]) -> Self {
        BlockQ6Kx8::pack(rows)
    }
    fn row(&self, r: usize) -> BlockQ6K {
        BlockQ6Kx8::row(self, r)
    }
    fn groups(k: &Kernels, x: &[Self], act: &QAct, n: usize, nb: usize, out: &mut [f32]) {
        let QAct::Q8K(y, ym) = act else {
            unreachable!("prepare() matches the weight type")
        };
        (k.q6_kx8)(x, &y[..n * nb], &ym[..n * nb], n, out)
    }
    fn one(k: &Kernels, x: &[BlockQ6K], act: &QAct, t: usize) -> f32 {
        let QAct::Q8K(y, _) = act else {
            unreachable!("prepare() matches the weight type")
        };
        let nb = x.len();
        (k.q6_k)(x, &y[t * nb..(t + 1) * nb])
    }
}

/// `rows` rows of `nb` blocks read from `reader` (file order) as packed groups, then
/// the rows after the last whole group. Eight rows are read at a time, so a load holds
/// the packed matrix and one group of file blocks, never the file's copy of the whole
/// tensor beside it (Gemma 3's 178 MB embedding table doubled its load's peak).
pub(super) fn read<P: Packed, R: std::io::Read>(
    reader: &mut R,
    rows: usize,
    nb: usize,
) -> std::io::Result<(Vec<P>, Vec<P::Row>)> {
    let groups = rows / 8;
    let size = std::mem::size_of::<P::Row>();
    let mut packed = Vec::with_capacity(groups * nb);
    for _ in 0..groups {
        let blocks: Vec<P::Row> = super::read_blocks(reader, 8 * nb * size)?;
        for i in 0..nb {
            packed.push(P::pack(std::array::from_fn(|r| &blocks[r * nb + i])));
        }
    }
    let tail = super::read_blocks(reader, (rows - 8 * groups) * nb * size)?;
    Ok((packed, tail))
}

/// `rows` rows of `nb` blocks (file order) as packed groups, then the rows after the
/// last whole group.
#[cfg(test)]
pub(super) fn pack<P: Packed>(blocks: &[P::Row], rows: usize, nb: usize) -> (Vec<P>, Vec<P::Row>) {
    let groups = rows / 8;
    let mut packed = Vec::with_capacity(groups * nb);
    for g in 0..groups {
        for i in 0..nb {
            packed.push(P::pack(std::array::from_fn(|r| &blocks[(8 * g + r) * nb + i])));
        }
    }
    (packed, blocks[groups * 8 * nb..].to_vec())
}

/// Row `r`'s blocks in file order.
pub(super) fn row<P: Packed>(groups: &[P], tail: &[P::Row], nb: usize, r: usize) -> Vec<P::Row> {
    let whole = groups.len() / nb.max(1) * 8;
    if r < whole {
        let g = &groups[r / 8 * nb..(r / 8 + 1) * nb];
        g.iter().map(|b| b.row(r % 8)).collect()
    } else {
        tail[(r - whole) * nb..(r - whole + 1) * nb].to_vec()
    }
}

/// [`QMatrix::matmul_with`] for a packed matrix: chunks of groups in parallel, each
/// against all `n` inputs (its weights stay in cache while the inputs stream), and
/// the tail rows one at a time.
pub(super) fn matmul<P: Packed>(
    m: &QMatrix,
    k: &Kernels,
    groups: &[P],
    tail: &[P::Row],
    act: &QAct,
    n: usize,
    p: OutPtr,
) {
    let (rows, nb) = (m.rows, m.cols / P::BLOCK);
    let ng = rows / 8;
    let per_task = (chunk_rows(rows) / 8).max(1);
    let tasks = ng.div_ceil(per_task);
    (0..tasks + usize::from(!tail.is_empty()))
        .into_par_iter()
        .for_each(|ci| {
            if ci == tasks {
                for r in 8 * ng..rows {
                    let w = &tail[(r - 8 * ng) * nb..(r - 8 * ng + 1) * nb];
                    for t in 0..n {
                        let c = P::one(k, w, act, t);
                        // SAFETY: the tail's cells belong to this task alone and are in bounds.
                        unsafe { *p.cell(t * rows + r) = c };
                    }
                }
                return;
            }
            let (g0, g1) = (ci * per_task, ((ci + 1) * per_task).min(ng));
            let width = 8 * (g1 - g0);
            thread_local!(static CELLS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) });
            CELLS.with(|cells| {
                let mut cells = cells.borrow_mut();
                cells.resize(n * width, 0.0);
                P::groups(k, &groups[g0 * nb..g1 * nb], act, n, nb, &mut cells);
                for t in 0..n {
                    for (j, c) in cells[t * width..(t + 1) * width].iter().enumerate() {
                        // SAFETY: rows 8·g0.. of this chunk belong to this task alone.
                        unsafe { *p.cell(t * rows + 8 * g0 + j) = *c };
                    }
                }
            });
        });
}

/// A Q4_0 matrix's [`QData`].
#[cfg(test)]
pub(super) fn q4_0(blocks: &[BlockQ4_0], rows: usize, nb: usize) -> QData {
    let (groups, tail) = pack(blocks, rows, nb);
    QData::Q4_0x8(groups, tail)
}

/// A Q5_0 matrix's [`QData`].
#[cfg(test)]
pub(super) fn q5_0(blocks: &[BlockQ5_0], rows: usize, nb: usize) -> QData {
    let (groups, tail) = pack(blocks, rows, nb);
    QData::Q5_0x8(groups, tail)
}

/// A Q8_0 matrix's [`QData`].
#[cfg(test)]
pub(super) fn q8_0(blocks: &[BlockQ8_0], rows: usize, nb: usize) -> QData {
    let (groups, tail) = pack(blocks, rows, nb);
    QData::Q8_0x8(groups, tail)
}

/// A Q4_1 matrix's [`QData`].
#[cfg(test)]
pub(super) fn q4_1(blocks: &[BlockQ4_1], rows: usize, nb: usize) -> QData {
    let (groups, tail) = pack(blocks, rows, nb);
    QData::Q4_1x8(groups, tail)
}

/// A Q5_1 matrix's [`QData`].
#[cfg(test)]
pub(super) fn q5_1(blocks: &[BlockQ5_1], rows: usize, nb: usize) -> QData {
    let (groups, tail) = pack(blocks, rows, nb);
    QData::Q5_1x8(groups, tail)
}

/// A Q4_K matrix's [`QData`].
#[cfg(test)]
pub(super) fn q4_k(blocks: &[BlockQ4K], rows: usize, nb: usize) -> QData {
    let (groups, tail) = pack(blocks, rows, nb);
    QData::Q4Kx8(groups, tail)
}

/// A Q5_K matrix's [`QData`].
#[cfg(test)]
pub(super) fn q5_k(blocks: &[BlockQ5K], rows: usize, nb: usize) -> QData {
    let (groups, tail) = pack(blocks, rows, nb);
    QData::Q5Kx8(groups, tail)
}

/// A Q6_K matrix's [`QData`].
#[cfg(test)]
pub(super) fn q6_k(blocks: &[BlockQ6K], rows: usize, nb: usize) -> QData {
    let (groups, tail) = pack(blocks, rows, nb);
    QData::Q6Kx8(groups, tail)
}
