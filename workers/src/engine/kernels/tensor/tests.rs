//! Matrices packed by eight rows (Q4_0, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) dequantize as in the file and multiply
//! to the single-row kernels' bits.

use super::*;
use crate::engine::kernels::isa::Isa;

/// A small xorshift, so the weights are the same on every run.
fn bytes(state: &mut u64) -> u8 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state >> 24) as u8
}

/// Q4_0 packed by eight rows: every row dequantizes as in the file, and every cell of
/// a matmul, for every kernel variant and batch size (the paired 512-bit groups, an
/// odd last group, the rows after the last group), is the portable single-row dot
/// product of that row.
#[test]
fn packed_q4_0_gives_the_single_row_bits_for_every_variant_and_batch() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    // 29 rows: three whole groups and five rows after them; 40: five groups.
    for (rows, nb) in [(29usize, 3usize), (40, 2), (5, 1)] {
        let cols = nb * QK;
        let blocks: Vec<BlockQ4_0> = (0..rows * nb)
            .map(|_| BlockQ4_0 {
                d: f2h(0.002 + bytes(&mut state) as f32 * 1e-4),
                qs: std::array::from_fn(|_| bytes(&mut state)),
            })
            .collect();
        let m = QMatrix {
            rows,
            cols,
            data: packed::q4_0(&blocks, rows, nb),
        };
        let (mut row, mut want_row) = (vec![0.0; cols], vec![0.0; cols]);
        for r in 0..rows {
            m.row_f32(r, &mut row);
            dequantize_q4_0(&blocks[r * nb..(r + 1) * nb], &mut want_row);
            assert_eq!(row, want_row, "row {r} dequantized");
        }
        let p = Kernels::get(Isa::Portable).unwrap();
        for n in [1, 2, 3, 4, 5, 8, 9, 17] {
            let x: Vec<f32> = (0..n * cols).map(|_| bytes(&mut state) as f32 / 64.0 - 2.0).collect();
            for isa in Isa::available() {
                let k = Kernels::get(isa).unwrap();
                let act = m.prepare_with(k, &x, n);
                let QAct::Q8_0(y, yd, _) = &act else { unreachable!() };
                let mut got = vec![f32::NAN; n * rows];
                m.matmul_with(k, &act, n, &mut got);
                for t in 0..n {
                    for r in 0..rows {
                        let w = &blocks[r * nb..(r + 1) * nb];
                        let want = (p.q4_0)(w, &y[t * nb..(t + 1) * nb], &yd[t * nb..(t + 1) * nb]);
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
}

/// Q5_0 packed by eight rows, as Q4_0 above.
#[test]
fn packed_q5_0_gives_the_single_row_bits_for_every_variant_and_batch() {
    let mut state = 0x2f6b_13a5_9c4e_0d71u64;
    for (rows, nb) in [(29usize, 3usize), (40, 2), (5, 1)] {
        let cols = nb * QK;
        let blocks: Vec<BlockQ5_0> = (0..rows * nb)
            .map(|_| BlockQ5_0 {
                d: f2h(0.002 + bytes(&mut state) as f32 * 1e-4),
                qh: std::array::from_fn(|_| bytes(&mut state)),
                qs: std::array::from_fn(|_| bytes(&mut state)),
            })
            .collect();
        let m = QMatrix {
            rows,
            cols,
            data: packed::q5_0(&blocks, rows, nb),
        };
        let (mut row, mut want_row) = (vec![0.0; cols], vec![0.0; cols]);
        for r in 0..rows {
            m.row_f32(r, &mut row);
            dequantize_q5_0(&blocks[r * nb..(r + 1) * nb], &mut want_row);
            assert_eq!(row, want_row, "row {r} dequantized");
        }
        let p = Kernels::get(Isa::Portable).unwrap();
        for n in [1, 2, 3, 4, 5, 8, 9, 17] {
            let x: Vec<f32> = (0..n * cols).map(|_| bytes(&mut state) as f32 / 64.0 - 2.0).collect();
            for isa in Isa::available() {
                let k = Kernels::get(isa).unwrap();
                let act = m.prepare_with(k, &x, n);
                let QAct::Q8_0(y, yd, _) = &act else { unreachable!() };
                let mut got = vec![f32::NAN; n * rows];
                m.matmul_with(k, &act, n, &mut got);
                for t in 0..n {
                    for r in 0..rows {
                        let w = &blocks[r * nb..(r + 1) * nb];
                        let want = (p.q5_0)(w, &y[t * nb..(t + 1) * nb], &yd[t * nb..(t + 1) * nb]);
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
}

/// Q8_0 packed by eight rows, as Q4_0 above.
#[test]
fn packed_q8_0_gives_the_single_row_bits_for_every_variant_and_batch() {
    let mut state = 0x51af_d7ed_558c_cd1du64;
    for (rows, nb) in [(29usize, 3usize), (40, 2), (5, 1)] {
        let cols = nb * QK;
        let blocks: Vec<BlockQ8_0> = (0..rows * nb)
            .map(|_| BlockQ8_0 {
                d: f2h(0.002 + bytes(&mut state) as f32 * 1e-4),
                qs: std::array::from_fn(|_| bytes(&mut state) as i8),
            })
            .collect();
        let m = QMatrix {
            rows,
            cols,
            data: packed::q8_0(&blocks, rows, nb),
        };
        let (mut row, mut want_row) = (vec![0.0; cols], vec![0.0; cols]);
        for r in 0..rows {
            m.row_f32(r, &mut row);
            dequantize_q8_0(&blocks[r * nb..(r + 1) * nb], &mut want_row);
            assert_eq!(row, want_row, "row {r} dequantized");
        }
        let p = Kernels::get(Isa::Portable).unwrap();
        for n in [1, 2, 3, 4, 5, 8, 9, 17] {
            let x: Vec<f32> = (0..n * cols).map(|_| bytes(&mut state) as f32 / 64.0 - 2.0).collect();
            for isa in Isa::available() {
                let k = Kernels::get(isa).unwrap();
                let act = m.prepare_with(k, &x, n);
                let QAct::Q8_0(y, yd, _) = &act else { unreachable!() };
                let mut got = vec![f32::NAN; n * rows];
                m.matmul_with(k, &act, n, &mut got);
                for t in 0..n {
                    for r in 0..rows {
                        let w = &blocks[r * nb..(r + 1) * nb];
                        let want = (p.q8_0)(w, &y[t * nb..(t + 1) * nb], &yd[t * nb..(t + 1) * nb]);
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
}

/// Q5_1 packed by eight rows, as Q4_0 above.
#[test]
fn packed_q5_1_gives_the_single_row_bits_for_every_variant_and_batch() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for (rows, nb) in [(29usize, 3usize), (40, 2), (5, 1)] {
        let cols = nb * QK;
        let blocks: Vec<BlockQ5_1> = (0..rows * nb)
            .map(|_| BlockQ5_1 {
                d: f2h(0.002 + bytes(&mut state) as f32 * 1e-4),
                m: f2h(-0.01 * bytes(&mut state) as f32 / 16.0),
                qh: std::array::from_fn(|_| bytes(&mut state)),
                qs: std::array::from_fn(|_| bytes(&mut state)),
            })
            .collect();
        let m = QMatrix {
            rows,
            cols,
            data: packed::q5_1(&blocks, rows, nb),
        };
        let (mut row, mut want_row) = (vec![0.0; cols], vec![0.0; cols]);
        for r in 0..rows {
            m.row_f32(r, &mut row);
            dequantize_min(&blocks[r * nb..(r + 1) * nb], &mut want_row);
            assert_eq!(row, want_row, "row {r} dequantized");
        }
        let p = Kernels::get(Isa::Portable).unwrap();
        for n in [1, 2, 3, 4, 5, 8, 9, 17] {
            let x: Vec<f32> = (0..n * cols).map(|_| bytes(&mut state) as f32 / 64.0 - 2.0).collect();
            for isa in Isa::available() {
                let k = Kernels::get(isa).unwrap();
                let act = m.prepare_with(k, &x, n);
                let QAct::Q8_1(y, yd, ys) = &act else { unreachable!() };
                let mut got = vec![f32::NAN; n * rows];
                m.matmul_with(k, &act, n, &mut got);
                for t in 0..n {
                    let ins = t * nb..(t + 1) * nb;
                    for r in 0..rows {
                        let w = &blocks[r * nb..(r + 1) * nb];
                        let want = (p.q5_1)(w, &y[ins.clone()], &yd[ins.clone()], &ys[ins.clone()]);
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
}

/// Q4_K packed by eight rows, as Q4_0 above.
#[test]
fn packed_q4_k_gives_the_single_row_bits_for_every_variant_and_batch() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for (rows, nk) in [(29usize, 2usize), (40, 1), (3, 1)] {
        let cols = nk * QK_K;
        let blocks: Vec<BlockQ4K> = (0..rows * nk)
            .map(|_| BlockQ4K {
                d: f2h(0.002 + bytes(&mut state) as f32 * 1e-4),
                dmin: f2h(0.001 + bytes(&mut state) as f32 * 1e-5),
                scales: std::array::from_fn(|_| bytes(&mut state)),
                qs: std::array::from_fn(|_| bytes(&mut state)),
            })
            .collect();
        let m = QMatrix {
            rows,
            cols,
            data: packed::q4_k(&blocks, rows, nk),
        };
        let (mut row, mut want_row) = (vec![0.0; cols], vec![0.0; cols]);
        for r in 0..rows {
            m.row_f32(r, &mut row);
            dequantize_q4_k(&blocks[r * nk..(r + 1) * nk], &mut want_row);
            assert_eq!(row, want_row, "row {r} dequantized");
        }
        let p = Kernels::get(Isa::Portable).unwrap();
        for n in [1, 2, 3, 4, 5, 8, 9] {
            let x: Vec<f32> = (0..n * cols).map(|_| bytes(&mut state) as f32 / 64.0 - 2.0).collect();
            for isa in Isa::available() {
                let k = Kernels::get(isa).unwrap();
                let act = m.prepare_with(k, &x, n);
                let QAct::Q8K(y, _) = &act else { unreachable!() };
                let mut got = vec![f32::NAN; n * rows];
                m.matmul_with(k, &act, n, &mut got);
                for t in 0..n {
                    for r in 0..rows {
                        let want = (p.q4_k)(&blocks[r * nk..(r + 1) * nk], &y[t * nk..(t + 1) * nk]);
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
}

/// A K-quant packed by eight rows, as Q4_K above: rows of blocks from `block`,
/// packed by `data`, against `dequantize` and the portable single-row `dot`.
fn packed_k_gives_the_single_row_bits<B: Copy>(
    mut block: impl FnMut(&mut u64) -> B,
    data: fn(&[B], usize, usize) -> QData,
    dequantize: fn(&[B], &mut [f32]),
    dot: fn(&[B], &[BlockQ8K]) -> f32,
) {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for (rows, nk) in [(27usize, 2usize), (16, 1)] {
        let cols = nk * QK_K;
        let blocks: Vec<B> = (0..rows * nk).map(|_| block(&mut state)).collect();
        let m = QMatrix {
            rows,
            cols,
            data: data(&blocks, rows, nk),
        };
        let (mut row, mut want_row) = (vec![0.0; cols], vec![0.0; cols]);
        for r in 0..rows {
            m.row_f32(r, &mut row);
            dequantize(&blocks[r * nk..(r + 1) * nk], &mut want_row);
            assert_eq!(row, want_row, "row {r} dequantized");
        }
        for n in [1, 2, 4, 5, 7, 9] {
            let x: Vec<f32> = (0..n * cols).map(|_| bytes(&mut state) as f32 / 64.0 - 2.0).collect();
            for isa in Isa::available() {
                let k = Kernels::get(isa).unwrap();
                let act = m.prepare_with(k, &x, n);
                let QAct::Q8K(y, _) = &act else { unreachable!() };
                let mut got = vec![f32::NAN; n * rows];
                m.matmul_with(k, &act, n, &mut got);
                for t in 0..n {
                    for r in 0..rows {
                        let want = dot(&blocks[r * nk..(r + 1) * nk], &y[t * nk..(t + 1) * nk]);
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
        crate::engine::kernels::simd::portable::dot_q5_k_q8_k,
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
        crate::engine::kernels::simd::portable::dot_q6_k_q8_k,
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
