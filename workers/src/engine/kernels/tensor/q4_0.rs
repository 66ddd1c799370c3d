//! Q4_0 matrices, stored as packed groups of eight rows ([`BlockQ4_0x8`]: one row per
//! 32-bit lane, llama.cpp's repacked layout) whatever the CPU, because the Q4_0
//! arithmetic is defined on them: one integer sum and one fused multiply-add per
//! block and cell ([`crate::engine::kernels::simd::portable::dot_q4_0_q8_0`]).
//!
//! Why: ggml's row kernel keeps eight float lanes per cell and block (a convert, a
//! multiply and an FMA each), so its prefill is float-bound — eight times the float
//! work of a per-block sum, which no layout of its lanes removes. With rows in lanes,
//! a block of sixteen rows against one input is eight `vpdpbusd` and three float
//! instructions on AVX-512, and the group is one stream in memory for decode. Same
//! bytes as the file (144 per group and block): no extra memory.

use super::{chunk_rows, OutPtr, QAct, QData, QMatrix};
use crate::engine::kernels::quants::{BlockQ4_0, BlockQ4_0x8};
use crate::engine::kernels::simd::Kernels;
use rayon::prelude::*;
use std::cell::RefCell;

/// `rows` rows of `nb` blocks (file order) as packed groups plus the rows after the
/// last whole group.
pub(super) fn pack(blocks: &[BlockQ4_0], rows: usize, nb: usize) -> QData {
    let groups = rows / 8;
    let mut packed = Vec::with_capacity(groups * nb);
    for g in 0..groups {
        for i in 0..nb {
            packed.push(BlockQ4_0x8::pack(std::array::from_fn(|r| {
                &blocks[(8 * g + r) * nb + i]
            })));
        }
    }
    QData::Q4_0x8(packed, blocks[groups * 8 * nb..].to_vec())
}

/// Row `r`'s blocks in file order.
pub(super) fn row(groups: &[BlockQ4_0x8], tail: &[BlockQ4_0], nb: usize, r: usize) -> Vec<BlockQ4_0> {
    let whole = groups.len() / nb.max(1) * 8;
    if r < whole {
        let g = &groups[r / 8 * nb..(r / 8 + 1) * nb];
        g.iter().map(|b| b.row(r % 8)).collect()
    } else {
        tail[(r - whole) * nb..(r - whole + 1) * nb].to_vec()
    }
}

/// [`QMatrix::matmul_with`] for a Q4_0 matrix: chunks of groups in parallel, each
/// against all `n` inputs (its weights stay in cache while the inputs stream), and
/// the tail rows one at a time.
pub(super) fn matmul(
    m: &QMatrix,
    k: &Kernels,
    groups: &[BlockQ4_0x8],
    tail: &[BlockQ4_0],
    act: &QAct,
    n: usize,
    p: OutPtr,
) {
    let QAct::Q8_0(y, yd, yo) = act else {
        unreachable!("prepare() matches the weight type")
    };
    let (rows, nb) = (m.rows, m.cols / crate::engine::kernels::quants::QK);
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
                        let c = (k.q4_0)(w, &y[t * nb..(t + 1) * nb], &yd[t * nb..(t + 1) * nb]);
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
                let (y, yd, yo) = (&y[..n * nb], &yd[..n * nb], &yo[..n * nb]);
                (k.q4_0x8)(&groups[g0 * nb..g1 * nb], y, yd, yo, n, &mut cells);
                for t in 0..n {
                    for (j, c) in cells[t * width..(t + 1) * width].iter().enumerate() {
                        // SAFETY: rows 8·g0.. of this chunk belong to this task alone.
                        unsafe { *p.cell(t * rows + 8 * g0 + j) = *c };
                    }
                }
            });
        });
}
