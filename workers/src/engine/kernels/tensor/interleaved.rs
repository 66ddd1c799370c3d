//! Weight matrices stored a few rows interleaved block by block, so that a decode
//! step reads a group of rows as one stream ([`QData::Q4Kx2`]; Q4_0's packed groups
//! are their own layout, `q4_0.rs`).
//!
//! Read row by row, a tile of several rows is several streams, and the hardware
//! prefetcher falls behind: one thread over 200 MB of weights on a 2-core AMD EPYC,
//! Q4_0 single rows 17 GB/s, a tile of eight rows in file order 6.3 GB/s, the same
//! tile over interleaved rows 26.9 GB/s; Q4_K single rows 24.4 GB/s, a pair of rows
//! in file order 7.6 GB/s. Decode (fewer than four inputs) runs the group tiles;
//! prefill puts each chunk of rows back in row order once per matmul (into a buffer
//! each thread keeps) and runs the row kernels, reading the weights once for all
//! inputs. Same bytes as the file: no extra memory.

use super::{chunk_rows, OutPtr, QAct, QData, QMatrix};
use crate::engine::kernels::kquants::{BlockQ4K, QK_K};
use crate::engine::kernels::simd::Kernels;
use rayon::prelude::*;
use std::cell::RefCell;

/// Whether Q4_K matrices are stored interleaved: where the active kernel variant has
/// the pair tile (AVX-512), unless `SWITCHYARD_ROWS_IN_ORDER=1` keeps the file's order.
pub(super) fn wanted() -> bool {
    static KEEP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let keep = *KEEP.get_or_init(|| std::env::var_os("SWITCHYARD_ROWS_IN_ORDER").is_some_and(|v| v == "1"));
    !keep && Kernels::active().isa == crate::engine::kernels::isa::Isa::Avx512
}

/// `v` (`rows` rows of `nb` blocks) with each whole group of `g` rows interleaved
/// (block `i` of the group's row `j` at `i * g + j`), the rows after the last whole
/// group as they were.
pub(super) fn interleave<B: Copy>(v: &[B], rows: usize, nb: usize, g: usize) -> Vec<B> {
    let groups = rows / g;
    let mut out = Vec::with_capacity(v.len());
    for grp in 0..groups {
        for i in 0..nb {
            out.extend((0..g).map(|j| v[(grp * g + j) * nb + i]));
        }
    }
    out.extend_from_slice(&v[groups * g * nb..]);
    out
}

/// Rows `rs` of an [`interleave`]d matrix (groups of `g`, `nb` blocks per row) in
/// row order, into `out` (cleared first).
pub(super) fn rows_in_order<B: Copy>(
    v: &[B],
    rows: usize,
    nb: usize,
    g: usize,
    rs: std::ops::Range<usize>,
    out: &mut Vec<B>,
) {
    let whole = rows / g * g;
    out.clear();
    for r in rs {
        if r < whole {
            let (grp, j) = (r / g, r % g);
            out.extend((0..nb).map(|i| v[grp * g * nb + i * g + j]));
        } else {
            out.extend_from_slice(&v[r * nb..(r + 1) * nb]);
        }
    }
}

/// A block type stored interleaved.
pub(super) trait Grouped: Copy + Send + Sync + 'static {
    /// Rows per group.
    const G: usize;
    /// Weights per block.
    const BLOCK: usize;
    /// Row-order storage of these blocks.
    fn in_order(v: Vec<Self>) -> QData;
    /// The blocks back out of [`Self::in_order`]'s storage.
    fn blocks(d: QData) -> Vec<Self>;
    /// Runs `f` on this thread's buffer for a chunk in row order.
    fn with_buffer(f: impl FnOnce(&mut Vec<Self>));
    /// A group (`x`, interleaved) against prepared input `t`, into `out[..G]`.
    fn tile(k: &Kernels, x: &[Self], act: &QAct, t: usize, out: &mut [f32]);
    /// One row in row order against prepared input `t`.
    fn one(k: &Kernels, x: &[Self], act: &QAct, t: usize) -> f32;
}

impl Grouped for BlockQ4K {
    const G: usize = 2;
    const BLOCK: usize = QK_K;
    fn in_order(v: Vec<Self>) -> QData {
        QData::Q4K(v)
    }
    fn blocks(d: QData) -> Vec<Self> {
        match d {
            QData::Q4K(v) => v,
            _ => Vec::new(),
        }
    }
    fn with_buffer(f: impl FnOnce(&mut Vec<Self>)) {
        thread_local!(static BUF: RefCell<Vec<BlockQ4K>> = const { RefCell::new(Vec::new()) });
        BUF.with(|b| f(&mut b.borrow_mut()))
    }
    fn tile(k: &Kernels, x: &[Self], act: &QAct, t: usize, out: &mut [f32]) {
        let QAct::Q8K(y) = act else {
            unreachable!("prepare() matches the weight type")
        };
        let nk = x.len() / Self::G;
        out[..Self::G].copy_from_slice(&(k.q4_k_x2i)(x, &y[t * nk..(t + 1) * nk]));
    }
    fn one(k: &Kernels, x: &[Self], act: &QAct, t: usize) -> f32 {
        let QAct::Q8K(y) = act else {
            unreachable!("prepare() matches the weight type")
        };
        let nk = x.len();
        (k.q4_k)(x, &y[t * nk..(t + 1) * nk])
    }
}

/// [`QMatrix::matmul_with`] for an interleaved matrix `m` holding `v`.
pub(super) fn matmul<B: Grouped>(m: &QMatrix, k: &Kernels, v: &[B], act: &QAct, n: usize, p: OutPtr) {
    let (rows, nb, g) = (m.rows, m.cols / B::BLOCK, B::G);
    // Whole groups only, so a chunk never splits one.
    let chunk = (chunk_rows(rows) / g * g).max(g);
    let whole = rows / g * g;
    if n < 4 {
        (0..rows.div_ceil(chunk)).into_par_iter().for_each(|ci| {
            let (r0, r1) = (ci * chunk, ((ci + 1) * chunk).min(rows));
            let mut cells = [0.0f32; 8];
            for t in 0..n {
                for grp in r0 / g..r1.min(whole) / g {
                    B::tile(k, &v[grp * g * nb..(grp + 1) * g * nb], act, t, &mut cells);
                    for (j, c) in cells[..g].iter().enumerate() {
                        // SAFETY: (t, grp * g + j) cells are this chunk's and in bounds.
                        unsafe { *p.cell(t * rows + grp * g + j) = *c };
                    }
                }
                for r in r0.max(whole)..r1 {
                    let c = B::one(k, &v[r * nb..(r + 1) * nb], act, t);
                    // SAFETY: as above.
                    unsafe { *p.cell(t * rows + r) = c };
                }
            }
        });
        return;
    }
    (0..rows.div_ceil(chunk)).into_par_iter().for_each(|ci| {
        let (r0, r1) = (ci * chunk, ((ci + 1) * chunk).min(rows));
        B::with_buffer(|buf| {
            let mut blocks = std::mem::take(buf);
            rows_in_order(v, rows, nb, g, r0..r1, &mut blocks);
            let part = QMatrix {
                rows: r1 - r0,
                cols: m.cols,
                data: B::in_order(blocks),
            };
            part.rows_into(k, act, n, 0..r1 - r0, p, rows, r0);
            *buf = B::blocks(part.data);
        });
    });
}
