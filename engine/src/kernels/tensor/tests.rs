//! Matrices packed by eight rows (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) dequantize as in the file and multiply
//! to the single-row kernels' bits.

use super::*;
use crate::kernels::isa::Isa;

/// A small xorshift, so the weights are the same on every run.
fn bytes(state: &mut u64) -> u8 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state >> 24) as u8
}

/// A matrix packed by eight rows (`data`, from `blocks` of `block` values): every row
/// dequantizes as in the file (`dequantize`), and every cell of a matmul, for every
/// kernel variant and batch size (the paired 512-bit groups, an odd last group, the
/// rows after the last group), is the portable single-row dot product of that row
/// (`one`: a row's blocks against the prepared input's blocks `ins`).
#[allow(clippy::too_many_arguments)]
fn check_packed<B>(
    blocks: &[B],
    block: usize,
    rows: usize,
    nb: usize,
    data: QData,
    dequantize: fn(&[B], &mut [f32]),
    one: impl Fn(&[B], &QAct, std::ops::Range<usize>) -> f32,
    state: &mut u64,
) {
    let cols = nb * block;
    let m = QMatrix { rows, cols, data };
    let (mut row, mut want_row) = (vec![0.0; cols], vec![0.0; cols]);
    for r in 0..rows {
        m.row_f32(r, &mut row);
        dequantize(&blocks[r * nb..(r + 1) * nb], &mut want_row);
        assert_eq!(row, want_row, "row {r} dequantized");
    }
    for n in [1, 2, 3, 4, 5, 8, 9, 17] {
        let x: Vec<f32> = (0..n * cols).map(|_| bytes(state) as f32 / 64.0 - 2.0).collect();
        for isa in Isa::available() {
            let k = Kernels::get(isa).unwrap();
            let act = m.prepare_with(k, &x, n);
            let mut got = vec![f32::NAN; n * rows];
            m.matmul_with(k, &act, n, &mut got);
            for t in 0..n {
                for r in 0..rows {
                    let want = one(&blocks[r * nb..(r + 1) * nb], &act, t * nb..(t + 1) * nb);
                    assert_eq!(
                        got[t * rows + r].to_bits(),
                        want.to_bits(),
                        "{isa}: {rows} rows, {n} inputs, cell ({t}, {r})"
                    );
                }
            }
        }
    }
}

/// The shapes each type is checked at: 29 rows (three whole groups and five rows after
/// them), 40 (five groups), 5 (no whole group); 1–3 blocks a row.
const SHAPES: [(usize, usize); 3] = [(29, 3), (40, 2), (5, 1)];

/// A Q8_0 input's blocks `ins` and their scales.
fn q8_0_input(act: &QAct, ins: std::ops::Range<usize>) -> (&[BlockQ8_0], &[f32]) {
    let QAct::Q8_0(y, yd, _) = act else {
        unreachable!("Q8_0 inputs")
    };
    (&y[ins.clone()], &yd[ins])
}

/// A Q8_1 input's blocks `ins`, their scales and sums.
fn q8_1_input(act: &QAct, ins: std::ops::Range<usize>) -> (&[BlockQ8_1], &[f32], &[f32]) {
    let QAct::Q8_1(y, yd, ys) = act else {
        unreachable!("Q8_1 inputs")
    };
    (&y[ins.clone()], &yd[ins.clone()], &ys[ins])
}

fn portable() -> &'static Kernels {
    Kernels::get(Isa::Portable).unwrap()
}

#[test]
fn packed_q4_0_gives_the_single_row_bits_for_every_variant_and_batch() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for (rows, nb) in SHAPES {
        let blocks: Vec<BlockQ4_0> = (0..rows * nb)
            .map(|_| BlockQ4_0 {
                d: f2h(0.002 + bytes(&mut state) as f32 * 1e-4),
                qs: std::array::from_fn(|_| bytes(&mut state)),
            })
            .collect();
        let data = packed::q4_0(&blocks, rows, nb);
        let one = |w: &[BlockQ4_0], act: &QAct, ins| {
            let (y, yd) = q8_0_input(act, ins);
            (portable().q4_0)(w, y, yd)
        };
        check_packed(&blocks, QK, rows, nb, data, dequantize_q4_0, one, &mut state);
    }
}

#[test]
fn packed_q5_0_gives_the_single_row_bits_for_every_variant_and_batch() {
    let mut state = 0x2f6b_13a5_9c4e_0d71u64;
    for (rows, nb) in SHAPES {
        let blocks: Vec<BlockQ5_0> = (0..rows * nb)
            .map(|_| BlockQ5_0 {
                d: f2h(0.002 + bytes(&mut state) as f32 * 1e-4),
                qh: std::array::from_fn(|_| bytes(&mut state)),
                qs: std::array::from_fn(|_| bytes(&mut state)),
            })
            .collect();
        let data = packed::q5_0(&blocks, rows, nb);
        let one = |w: &[BlockQ5_0], act: &QAct, ins| {
            let (y, yd) = q8_0_input(act, ins);
            (portable().q5_0)(w, y, yd)
        };
        check_packed(&blocks, QK, rows, nb, data, dequantize_q5_0, one, &mut state);
    }
}

#[test]
fn packed_q8_0_gives_the_single_row_bits_for_every_variant_and_batch() {
    let mut state = 0x51af_d7ed_558c_cd1du64;
    for (rows, nb) in SHAPES {
        let blocks: Vec<BlockQ8_0> = (0..rows * nb)
            .map(|_| BlockQ8_0 {
                d: f2h(0.002 + bytes(&mut state) as f32 * 1e-4),
                qs: std::array::from_fn(|_| bytes(&mut state) as i8),
            })
            .collect();
        let data = packed::q8_0(&blocks, rows, nb);
        let one = |w: &[BlockQ8_0], act: &QAct, ins| {
            let (y, yd) = q8_0_input(act, ins);
            (portable().q8_0)(w, y, yd)
        };
        check_packed(&blocks, QK, rows, nb, data, dequantize_q8_0, one, &mut state);
    }
}

#[test]
fn packed_q5_1_gives_the_single_row_bits_for_every_variant_and_batch() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for (rows, nb) in SHAPES {
        let blocks: Vec<BlockQ5_1> = (0..rows * nb)
            .map(|_| BlockQ5_1 {
                d: f2h(0.002 + bytes(&mut state) as f32 * 1e-4),
                m: f2h(-0.01 * bytes(&mut state) as f32 / 16.0),
                qh: std::array::from_fn(|_| bytes(&mut state)),
                qs: std::array::from_fn(|_| bytes(&mut state)),
            })
            .collect();
        let data = packed::q5_1(&blocks, rows, nb);
        let one = |w: &[BlockQ5_1], act: &QAct, ins| {
            let (y, yd, ys) = q8_1_input(act, ins);
            (portable().q5_1)(w, y, yd, ys)
        };
        check_packed(&blocks, QK, rows, nb, data, dequantize_min, one, &mut state);
    }
}

#[test]
fn packed_q4_1_gives_the_single_row_bits_for_every_variant_and_batch() {
    let mut state = 0x51_7cc1_b727_220au64;
    for (rows, nb) in SHAPES {
        let blocks: Vec<BlockQ4_1> = (0..rows * nb)
            .map(|_| BlockQ4_1 {
                d: f2h(0.002 + bytes(&mut state) as f32 * 1e-4),
                m: f2h(-0.01 * bytes(&mut state) as f32 / 16.0),
                qs: std::array::from_fn(|_| bytes(&mut state)),
            })
            .collect();
        let data = packed::q4_1(&blocks, rows, nb);
        let one = |w: &[BlockQ4_1], act: &QAct, ins| {
            let (y, yd, ys) = q8_1_input(act, ins);
            (portable().q4_1)(w, y, yd, ys)
        };
        check_packed(&blocks, QK, rows, nb, data, dequantize_min, one, &mut state);
    }
}

/// A Q8_K input's blocks `ins`.
fn q8_k_input(act: &QAct, ins: std::ops::Range<usize>) -> &[BlockQ8K] {
    let QAct::Q8K(y, _) = act else {
        unreachable!("Q8_K inputs")
    };
    &y[ins]
}

/// A K-quant packed by eight rows: rows of blocks from `block`, packed by `data`,
/// against `dequantize` and the portable single-row `dot`.
fn packed_k_gives_the_single_row_bits<B: Copy>(
    mut block: impl FnMut(&mut u64) -> B,
    data: fn(&[B], usize, usize) -> QData,
    dequantize: fn(&[B], &mut [f32]),
    dot: fn(&[B], &[BlockQ8K]) -> f32,
) {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for (rows, nk) in [(27usize, 2usize), (16, 1), (3, 1)] {
        let blocks: Vec<B> = (0..rows * nk).map(|_| block(&mut state)).collect();
        let one = |w: &[B], act: &QAct, ins| dot(w, q8_k_input(act, ins));
        check_packed(
            &blocks,
            QK_K,
            rows,
            nk,
            data(&blocks, rows, nk),
            dequantize,
            one,
            &mut state,
        );
    }
}

#[test]
fn packed_q4_k_gives_the_single_row_bits_for_every_variant_and_batch() {
    packed_k_gives_the_single_row_bits(
        |state| BlockQ4K {
            d: f2h(0.002 + bytes(state) as f32 * 1e-4),
            dmin: f2h(0.001 + bytes(state) as f32 * 1e-5),
            scales: std::array::from_fn(|_| bytes(state)),
            qs: std::array::from_fn(|_| bytes(state)),
        },
        packed::q4_k,
        dequantize_q4_k,
        crate::kernels::simd::portable::dot_q4_k_q8_k,
    );
}

#[test]
fn packed_q5_k_gives_the_single_row_bits_for_every_variant_and_batch() {
    packed_k_gives_the_single_row_bits(
        |state| BlockQ5K {
            d: f2h(0.002 + bytes(state) as f32 * 1e-4),
            dmin: f2h(0.001 + bytes(state) as f32 * 1e-5),
            scales: std::array::from_fn(|_| bytes(state)),
            qh: std::array::from_fn(|_| bytes(state)),
            qs: std::array::from_fn(|_| bytes(state)),
        },
        packed::q5_k,
        dequantize_q5_k,
        crate::kernels::simd::portable::dot_q5_k_q8_k,
    );
}

#[test]
fn packed_q6_k_gives_the_single_row_bits_for_every_variant_and_batch() {
    packed_k_gives_the_single_row_bits(
        |state| BlockQ6K {
            ql: std::array::from_fn(|_| bytes(state)),
            qh: std::array::from_fn(|_| bytes(state)),
            scales: std::array::from_fn(|_| bytes(state) as i8),
            d: f2h(0.002 + bytes(state) as f32 * 1e-4),
        },
        packed::q6_k,
        dequantize_q6_k,
        crate::kernels::simd::portable::dot_q6_k_q8_k,
    );
}

/// Reading a tensor eight rows at a time packs exactly what packing it whole does.
#[test]
fn reading_by_groups_packs_as_packing_the_whole_tensor() {
    let mut state = 0x1234_5678_9abc_def1u64;
    let (rows, nb) = (29usize, 3usize);
    let blocks: Vec<BlockQ8_0> = (0..rows * nb)
        .map(|_| BlockQ8_0 {
            d: f2h(0.002 + bytes(&mut state) as f32 * 1e-4),
            qs: std::array::from_fn(|_| bytes(&mut state) as i8),
        })
        .collect();
    let mut file = Vec::new();
    for b in &blocks {
        file.extend_from_slice(&b.d.to_le_bytes());
        file.extend(b.qs.iter().map(|&q| q as u8));
    }
    let (groups, tail): (Vec<BlockQ8_0x8>, Vec<BlockQ8_0>) = packed::read(&mut file.as_slice(), rows, nb).unwrap();
    let (want_groups, want_tail): (Vec<BlockQ8_0x8>, Vec<BlockQ8_0>) = packed::pack(&blocks, rows, nb);
    assert_eq!(groups.len(), want_groups.len());
    for (g, w) in groups.iter().zip(&want_groups) {
        assert_eq!((g.d, g.qs), (w.d, w.qs));
    }
    assert_eq!(tail.len(), want_tail.len());
    for (t, w) in tail.iter().zip(&want_tail) {
        assert_eq!((t.d, t.qs), (w.d, w.qs));
    }
}
