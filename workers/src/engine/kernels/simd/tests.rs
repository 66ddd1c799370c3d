//! Every kernel variant this CPU supports computes exactly the portable kernels' bits,
//! for single rows and for the 4- and 8-row tiles. (On an AVX-512 host this covers
//! all four variants; on an AVX2-only host, three.)

use super::*;
use crate::engine::kernels::kquants::{q4_k_min_pairs, quantize_q8_k, BlockQ5K, QK_K};
use crate::engine::kernels::quants::{
    dequantize_min, dequantize_q4_0, dequantize_q8_0, f2h, h2f, q4_0_offset, quantize_q8_0, quantize_q8_1, QK,
};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
    }
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        std::array::from_fn(|_| self.next() as u8)
    }
    fn scale(&mut self) -> u16 {
        f2h(0.001 + (self.next() % 1000) as f32 * 1e-4)
    }
}

/// Rows of random activations, quantized three ways.
struct Acts {
    q8_0: Vec<Vec<BlockQ8_0>>,
    q8_0d: Vec<Vec<f32>>,
    q8_1: Vec<Vec<BlockQ8_1>>,
    q8_1d: Vec<Vec<f32>>,
    q8_1s: Vec<Vec<f32>>,
    q8_k: Vec<Vec<BlockQ8K>>,
}

fn acts(rng: &mut Rng, cols: usize) -> Acts {
    let rows: Vec<Vec<f32>> = (0..8).map(|_| (0..cols).map(|_| rng.f32()).collect()).collect();
    let q8_0: Vec<Vec<BlockQ8_0>> = rows
        .iter()
        .map(|x| {
            let mut b = vec![BlockQ8_0 { d: 0, qs: [0; 32] }; cols / QK];
            quantize_q8_0(x, &mut b);
            b
        })
        .collect();
    let q8_1: Vec<Vec<BlockQ8_1>> = rows
        .iter()
        .map(|x| {
            let mut b = vec![
                BlockQ8_1 {
                    d: 0,
                    s: 0,
                    qs: [0; 32]
                };
                cols / QK
            ];
            quantize_q8_1(x, &mut b);
            b
        })
        .collect();
    let q8_k = rows
        .iter()
        .map(|x| {
            let mut b = vec![BlockQ8K::ZERO; cols / QK_K];
            quantize_q8_k(x, &mut b);
            b
        })
        .collect();
    Acts {
        q8_0d: q8_0.iter().map(|r| r.iter().map(|b| h2f(b.d)).collect()).collect(),
        q8_1d: q8_1.iter().map(|r| r.iter().map(|b| h2f(b.d)).collect()).collect(),
        q8_1s: q8_1.iter().map(|r| r.iter().map(|b| h2f(b.s)).collect()).collect(),
        q8_0,
        q8_1,
        q8_k,
    }
}

/// `rows` random Q4_0 rows of `nb` blocks.
fn q4_0_rows(rng: &mut Rng, rows: usize, nb: usize) -> Vec<Vec<BlockQ4_0>> {
    (0..rows)
        .map(|_| {
            (0..nb)
                .map(|_| BlockQ4_0 {
                    d: rng.scale(),
                    qs: rng.bytes(),
                })
                .collect()
        })
        .collect()
}

/// `rows` random Q4_K rows of `nk` blocks.
fn q4_k_rows(rng: &mut Rng, rows: usize, nk: usize) -> Vec<Vec<BlockQ4K>> {
    (0..rows)
        .map(|_| {
            (0..nk)
                .map(|_| BlockQ4K {
                    d: rng.scale(),
                    dmin: rng.scale(),
                    scales: rng.bytes(),
                    qs: rng.bytes(),
                })
                .collect()
        })
        .collect()
}

fn refs<T, const N: usize>(v: &[Vec<T>]) -> [&[T]; N] {
    std::array::from_fn(|i| &v[i][..])
}

fn bits<const N: usize>(v: [f32; N]) -> [u32; N] {
    v.map(f32::to_bits)
}

/// Activations quantized by each variant equal the portable quantizer's, including a
/// block of zeros, negative zeros and values that round to ±127 or halfway.
#[test]
fn every_variant_quantizes_the_portable_bits() {
    let p = Kernels::get(Isa::Portable).unwrap();
    let mut rng = Rng(11);
    let mut x: Vec<f32> = (0..32 * 64).map(|_| rng.f32() * 3.0).collect();
    x[..32].fill(0.0);
    x[32..64].fill(-0.0);
    for (i, v) in x[64..96].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) * 0.5 + 0.25;
    }
    let mut want = vec![BlockQ8_0 { d: 0, qs: [0; 32] }; 64];
    (p.quantize_q8_0)(&x, &mut want);
    for isa in Isa::available().into_iter().filter_map(Kernels::get) {
        let mut got = vec![BlockQ8_0 { d: 1, qs: [1; 32] }; 64];
        (isa.quantize_q8_0)(&x, &mut got);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!((a.d, a.qs), (b.d, b.qs), "{} block {i}", isa.isa);
        }
    }
}

#[test]
fn every_variant_computes_the_portable_bits() {
    let p = Kernels::get(Isa::Portable).unwrap();
    let mut rng = Rng(7);
    let cols = 2 * QK_K;
    let a = acts(&mut rng, cols);
    let nb = cols / QK;
    let w4_1: Vec<BlockQ4_1> = (0..nb)
        .map(|_| BlockQ4_1 {
            d: rng.scale(),
            m: f2h(-0.01 * (rng.next() % 50) as f32),
            qs: rng.bytes(),
        })
        .collect();
    let f: Vec<f32> = (0..cols + 6).map(|_| rng.f32()).collect();
    let h: Vec<u16> = (0..cols + 5).map(|_| f2h(rng.f32())).collect();

    let isas = Isa::available();
    eprintln!("variants on this CPU: {isas:?}");
    for isa in isas {
        let k = Kernels::get(isa).unwrap();
        for t in 0..8 {
            let (y1, yd1, ys1) = (&a.q8_1[t][..], &a.q8_1d[t][..], &a.q8_1s[t][..]);
            let want = (p.q4_1)(&w4_1, y1, yd1, ys1).to_bits();
            assert_eq!((k.q4_1)(&w4_1, y1, yd1, ys1).to_bits(), want, "{isa} q4_1 row {t}");
            let x4 = (k.q4_1_x4)(
                &w4_1,
                refs(&a.q8_1[t / 4 * 4..]),
                refs(&a.q8_1d[t / 4 * 4..]),
                refs(&a.q8_1s[t / 4 * 4..]),
            );
            assert_eq!(x4[t % 4].to_bits(), want, "{isa} q4_1 x4 row {t}");
            let mut x8 = [[0.0f32; 8]];
            (k.q4_1_x8)(&w4_1, &a.q8_1.concat(), &a.q8_1d.concat(), &a.q8_1s.concat(), &mut x8);
            assert_eq!(x8[0][t].to_bits(), want, "{isa} q4_1 x8 row {t}");
        }
        for n in [7, 64, cols + 5] {
            assert_eq!(
                (k.dot_f32)(&f[..n], &f[1..n + 1]).to_bits(),
                (p.dot_f32)(&f[..n], &f[1..n + 1]).to_bits(),
                "{isa} dot_f32 {n}"
            );
            assert_eq!(
                (k.dot_f16_f32)(&h[..n], &f[..n]).to_bits(),
                (p.dot_f16_f32)(&h[..n], &f[..n]).to_bits(),
                "{isa} dot_f16_f32 {n}"
            );
            let (mut x, mut y) = (f[..n].to_vec(), f[..n].to_vec());
            (k.axpy_f16)(&mut x, &h[..n], 0.37);
            (p.axpy_f16)(&mut y, &h[..n], 0.37);
            assert_eq!(
                bits::<1>([x.iter().sum()]),
                bits::<1>([y.iter().sum()]),
                "{isa} axpy_f16 {n}"
            );
            assert!(
                x.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{isa} axpy_f16 {n}"
            );
        }
    }
}

/// Panels of 1 to 7 weight rows × 8 inputs (so every variant's tiles of four and
/// two rows and its single rows after them) give each cell the portable single-row
/// bits.
#[test]
fn panels_compute_the_portable_bits() {
    let p = Kernels::get(Isa::Portable).unwrap();
    let mut rng = Rng(11);
    // Two Q4_K blocks per row.
    let cols = 2 * QK_K;
    let a = acts(&mut rng, cols);
    let nb = cols / QK;
    const ROWS: usize = 7;
    let w4_1: Vec<Vec<BlockQ4_1>> = (0..ROWS)
        .map(|_| {
            (0..nb)
                .map(|_| BlockQ4_1 {
                    d: rng.scale(),
                    m: f2h(-0.01 * (rng.next() % 50) as f32),
                    qs: rng.bytes(),
                })
                .collect()
        })
        .collect();
    let (y1, yd1, ys1) = (a.q8_1.concat(), a.q8_1d.concat(), a.q8_1s.concat());
    let mut checked = 0;
    for isa in Isa::available() {
        let k = Kernels::get(isa).unwrap();
        for rows in 1..=ROWS {
            let mut cells = vec![[f32::NAN; 8]; rows];
            // Each cell against the portable single row.
            let mut check = |name: &str, cells: &[[f32; 8]], want: &dyn Fn(usize, usize) -> f32| {
                for (r, row) in cells.iter().enumerate() {
                    for (t, c) in row.iter().enumerate() {
                        assert_eq!(
                            c.to_bits(),
                            want(r, t).to_bits(),
                            "{isa} {name} panel of {rows}: row {r} input {t}"
                        );
                    }
                }
                checked += 1;
            };
            (k.q4_1_x8)(&w4_1[..rows].concat(), &y1, &yd1, &ys1, &mut cells);
            check("q4_1", &cells, &|r, t| {
                (p.q4_1)(&w4_1[r], &a.q8_1[t], &a.q8_1d[t], &a.q8_1s[t])
            });
        }
    }
    eprintln!("{checked} panels checked");
}

/// Q4_0's packed groups: every variant gives each cell the portable single-row bits
/// of its row, for one to five groups (the 512-bit kernel pairs them, an odd one
/// goes alone) and any number of inputs.
#[test]
fn packed_q4_0_groups_compute_the_portable_bits() {
    let p = Kernels::get(Isa::Portable).unwrap();
    let mut rng = Rng(29);
    let nb = 7;
    let cols = nb * QK;
    let a = acts(&mut rng, cols);
    let rows = q4_0_rows(&mut rng, 40, nb);
    let packed: Vec<BlockQ4_0x8> = (0..5)
        .flat_map(|g| {
            let rows = &rows;
            (0..nb).map(move |i| BlockQ4_0x8::pack(std::array::from_fn(|r| &rows[8 * g + r][i])))
        })
        .collect();
    let offsets: Vec<Vec<i32>> = a.q8_0.iter().map(|r| r.iter().map(q4_0_offset).collect()).collect();
    for isa in Isa::available() {
        let k = Kernels::get(isa).unwrap();
        for groups in 1..=5 {
            for n in [1, 2, 3, 4, 5, 7, 8] {
                let mut out = vec![f32::NAN; n * 8 * groups];
                let (y, yd, yo) = (a.q8_0[..n].concat(), a.q8_0d[..n].concat(), offsets[..n].concat());
                (k.q4_0x8)(&packed[..groups * nb], &y, &yd, &yo, n, &mut out);
                for t in 0..n {
                    for r in 0..8 * groups {
                        let want = (p.q4_0)(&rows[r], &a.q8_0[t], &a.q8_0d[t]);
                        assert_eq!(
                            out[t * 8 * groups + r].to_bits(),
                            want.to_bits(),
                            "{isa} q4_0x8: {groups} groups, {n} inputs, row {r} input {t}"
                        );
                    }
                }
            }
        }
    }
}

/// Q8_0's packed groups, as Q4_0's. Row 0 holds −128 and 127 (files may hold −128;
/// ggml's quantizer never writes it) against input blocks of ±127: the AVX2 kernel's
/// 16-bit pairs reach their largest there.
#[test]
fn packed_q8_0_groups_compute_the_portable_bits() {
    let p = Kernels::get(Isa::Portable).unwrap();
    let mut rng = Rng(33);
    let nb = 7;
    let cols = nb * QK;
    let mut a = acts(&mut rng, cols);
    a.q8_0[0][0].qs = [127; 32];
    a.q8_0[1][2].qs = [-127; 32];
    let rows: Vec<Vec<BlockQ8_0>> = (0..40)
        .map(|r| {
            (0..nb)
                .map(|i| BlockQ8_0 {
                    d: rng.scale(),
                    qs: if r == 0 {
                        [if i % 2 == 0 { -128 } else { 127 }; 32]
                    } else {
                        rng.bytes::<32>().map(|b| b as i8)
                    },
                })
                .collect()
        })
        .collect();
    let packed: Vec<BlockQ8_0x8> = (0..5)
        .flat_map(|g| {
            let rows = &rows;
            (0..nb).map(move |i| BlockQ8_0x8::pack(std::array::from_fn(|r| &rows[8 * g + r][i])))
        })
        .collect();
    for (i, b) in packed.iter().enumerate() {
        for r in 0..8 {
            let (want, got) = (&rows[8 * (i / nb) + r][i % nb], b.row(r));
            assert_eq!((got.d, got.qs), (want.d, want.qs));
        }
    }
    // The offsets of the inputs (with a recomputed first block: its values changed).
    let offsets: Vec<Vec<i32>> = a.q8_0.iter().map(|r| r.iter().map(q4_0_offset).collect()).collect();
    for isa in Isa::available() {
        let k = Kernels::get(isa).unwrap();
        for groups in 1..=5 {
            for n in 1..=8 {
                let mut out = vec![f32::NAN; n * 8 * groups];
                let (y, yd, yo) = (a.q8_0[..n].concat(), a.q8_0d[..n].concat(), offsets[..n].concat());
                (k.q8_0x8)(&packed[..groups * nb], &y, &yd, &yo, n, &mut out);
                for t in 0..n {
                    for r in 0..8 * groups {
                        let want = (p.q8_0)(&rows[r], &a.q8_0[t], &a.q8_0d[t]);
                        assert_eq!(
                            out[t * 8 * groups + r].to_bits(),
                            want.to_bits(),
                            "{isa} q8_0x8: {groups} groups, {n} inputs, row {r} input {t}"
                        );
                    }
                }
            }
        }
    }
}

/// Q5_0's packed groups, as Q4_0's. Row 0 holds the largest values (all nibbles and
/// fifth bits set) and row 1 the smallest (none) against input blocks of ±127.
#[test]
fn packed_q5_0_groups_compute_the_portable_bits() {
    let p = Kernels::get(Isa::Portable).unwrap();
    let mut rng = Rng(34);
    let nb = 7;
    let cols = nb * QK;
    let mut a = acts(&mut rng, cols);
    a.q8_0[0][0].qs = [127; 32];
    a.q8_0[1][2].qs = [-127; 32];
    let rows: Vec<Vec<BlockQ5_0>> = (0..40)
        .map(|r| {
            (0..nb)
                .map(|_| BlockQ5_0 {
                    d: rng.scale(),
                    qh: match r {
                        0 => [0xff; 4],
                        1 => [0; 4],
                        _ => rng.bytes(),
                    },
                    qs: match r {
                        0 => [0xff; 16],
                        1 => [0; 16],
                        _ => rng.bytes(),
                    },
                })
                .collect()
        })
        .collect();
    let packed: Vec<BlockQ5_0x8> = (0..5)
        .flat_map(|g| {
            let rows = &rows;
            (0..nb).map(move |i| BlockQ5_0x8::pack(std::array::from_fn(|r| &rows[8 * g + r][i])))
        })
        .collect();
    for (i, b) in packed.iter().enumerate() {
        for r in 0..8 {
            let (want, got) = (&rows[8 * (i / nb) + r][i % nb], b.row(r));
            assert_eq!((got.d, got.qh, got.qs), (want.d, want.qh, want.qs));
        }
    }
    let offsets: Vec<Vec<i32>> = a.q8_0.iter().map(|r| r.iter().map(q4_0_offset).collect()).collect();
    for isa in Isa::available() {
        let k = Kernels::get(isa).unwrap();
        for groups in 1..=5 {
            for n in 1..=8 {
                let mut out = vec![f32::NAN; n * 8 * groups];
                let (y, yd, yo) = (a.q8_0[..n].concat(), a.q8_0d[..n].concat(), offsets[..n].concat());
                (k.q5_0x8)(&packed[..groups * nb], &y, &yd, &yo, n, &mut out);
                for t in 0..n {
                    for r in 0..8 * groups {
                        let want = (p.q5_0)(&rows[r], &a.q8_0[t], &a.q8_0d[t]);
                        assert_eq!(
                            out[t * 8 * groups + r].to_bits(),
                            want.to_bits(),
                            "{isa} q5_0x8: {groups} groups, {n} inputs, row {r} input {t}"
                        );
                    }
                }
            }
        }
    }
}

/// Q5_1's packed groups, as Q4_0's. Row 0 holds the largest values (all nibbles and
/// fifth bits set) against an input block of 127s: the AVX2 kernel's 16-bit sums
/// reach their largest there.
#[test]
fn packed_q5_1_groups_compute_the_portable_bits() {
    let p = Kernels::get(Isa::Portable).unwrap();
    let mut rng = Rng(30);
    let nb = 7;
    let cols = nb * QK;
    let mut a = acts(&mut rng, cols);
    a.q8_1[0][0].qs = [127; 32];
    a.q8_1[1][2].qs = [-127; 32];
    let rows: Vec<Vec<BlockQ5_1>> = (0..40)
        .map(|r| {
            (0..nb)
                .map(|_| BlockQ5_1 {
                    d: rng.scale(),
                    m: f2h(-0.01 * (rng.next() % 50) as f32),
                    qh: if r == 0 { [0xff; 4] } else { rng.bytes() },
                    qs: if r == 0 { [0xff; 16] } else { rng.bytes() },
                })
                .collect()
        })
        .collect();
    let packed: Vec<BlockQ5_1x8> = (0..5)
        .flat_map(|g| {
            let rows = &rows;
            (0..nb).map(move |i| BlockQ5_1x8::pack(std::array::from_fn(|r| &rows[8 * g + r][i])))
        })
        .collect();
    for (i, b) in packed.iter().enumerate() {
        for r in 0..8 {
            let want = &rows[8 * (i / nb) + r][i % nb];
            let got = b.row(r);
            assert_eq!((got.d, got.m, got.qh, got.qs), (want.d, want.m, want.qh, want.qs));
        }
    }
    for isa in Isa::available() {
        let k = Kernels::get(isa).unwrap();
        for groups in 1..=5 {
            for n in [1, 2, 3, 4, 5, 7, 8] {
                let mut out = vec![f32::NAN; n * 8 * groups];
                let (y, yd, ys) = (a.q8_1[..n].concat(), a.q8_1d[..n].concat(), a.q8_1s[..n].concat());
                (k.q5_1x8)(&packed[..groups * nb], &y, &yd, &ys, n, &mut out);
                for t in 0..n {
                    for r in 0..8 * groups {
                        let want = (p.q5_1)(&rows[r], &a.q8_1[t], &a.q8_1d[t], &a.q8_1s[t]);
                        assert_eq!(
                            out[t * 8 * groups + r].to_bits(),
                            want.to_bits(),
                            "{isa} q5_1x8: {groups} groups, {n} inputs, row {r} input {t}"
                        );
                    }
                }
            }
        }
    }
}

/// The Q5_1 arithmetic (one integer sum and two FMAs per block) is the dot product of
/// the dequantized values, up to f32 rounding (the activations' sums are f16).
#[test]
fn q5_1_block_sums_are_the_dot_product() {
    let p = Kernels::get(Isa::Portable).unwrap();
    let mut rng = Rng(43);
    let nb = 24;
    let a = acts(&mut rng, nb * QK);
    for _ in 0..16 {
        let row: Vec<BlockQ5_1> = (0..nb)
            .map(|_| BlockQ5_1 {
                d: rng.scale(),
                m: f2h(-0.01 * (rng.next() % 50) as f32),
                qh: rng.bytes(),
                qs: rng.bytes(),
            })
            .collect();
        for t in 0..8 {
            let (mut w, mut y) = (vec![0.0f32; nb * QK], vec![0.0f32; nb * QK]);
            dequantize_min(&row, &mut w);
            for (b, out) in a.q8_1[t].iter().zip(y.chunks_mut(QK)) {
                for (o, &q) in out.iter_mut().zip(&b.qs) {
                    *o = h2f(b.d) * q as f32;
                }
            }
            let exact: f64 = w.iter().zip(&y).map(|(&w, &y)| w as f64 * y as f64).sum();
            let scale: f64 = w.iter().zip(&y).map(|(&w, &y)| (w as f64 * y as f64).abs()).sum();
            let got = (p.q5_1)(&row, &a.q8_1[t], &a.q8_1d[t], &a.q8_1s[t]) as f64;
            // s = d · Σ q is rounded to f16: a relative 2⁻¹¹ of each block's min term.
            assert!((got - exact).abs() <= 2e-3 * scale, "{got} vs {exact}");
        }
    }
}

/// The Q4_0 arithmetic (one integer sum and one FMA per block) is the dot product of
/// the dequantized values, up to f32 rounding.
#[test]
fn q4_0_block_sums_are_the_dot_product() {
    let p = Kernels::get(Isa::Portable).unwrap();
    let mut rng = Rng(41);
    let nb = 24;
    let a = acts(&mut rng, nb * QK);
    for row in q4_0_rows(&mut rng, 16, nb) {
        for t in 0..8 {
            let (mut w, mut y) = (vec![0.0f32; nb * QK], vec![0.0f32; nb * QK]);
            dequantize_q4_0(&row, &mut w);
            dequantize_q8_0(&a.q8_0[t], &mut y);
            let exact: f64 = w.iter().zip(&y).map(|(&w, &y)| w as f64 * y as f64).sum();
            let scale: f64 = w.iter().zip(&y).map(|(&w, &y)| (w as f64 * y as f64).abs()).sum();
            let got = (p.q4_0)(&row, &a.q8_0[t], &a.q8_0d[t]) as f64;
            assert!((got - exact).abs() <= 1e-6 * scale, "{got} vs {exact}");
        }
    }
}

/// Q4_K's packed groups, as Q4_0's: every variant gives each cell the portable
/// single-row bits of its row, for one to five groups and any number of inputs
/// (including an all-zero activation block).
#[test]
fn packed_q4_k_groups_compute_the_portable_bits() {
    let p = Kernels::get(Isa::Portable).unwrap();
    let mut rng = Rng(31);
    let nk = 3;
    let mut a = acts(&mut rng, nk * QK_K);
    a.q8_k[2][1] = BlockQ8K::ZERO;
    let rows = q4_k_rows(&mut rng, 40, nk);
    let packed: Vec<BlockQ4Kx8> = (0..5)
        .flat_map(|g| {
            let rows = &rows;
            (0..nk).map(move |i| BlockQ4Kx8::pack(std::array::from_fn(|r| &rows[8 * g + r][i])))
        })
        .collect();
    let pairs: Vec<Vec<[i32; 4]>> = a.q8_k.iter().map(|r| r.iter().map(q4_k_min_pairs).collect()).collect();
    for isa in Isa::available() {
        let k = Kernels::get(isa).unwrap();
        for groups in 1..=5 {
            for n in 1..=8 {
                let mut out = vec![f32::NAN; n * 8 * groups];
                (k.q4_kx8)(
                    &packed[..groups * nk],
                    &a.q8_k[..n].concat(),
                    &pairs[..n].concat(),
                    n,
                    &mut out,
                );
                for t in 0..n {
                    for r in 0..8 * groups {
                        let want = (p.q4_k)(&rows[r], &a.q8_k[t]);
                        assert_eq!(
                            out[t * 8 * groups + r].to_bits(),
                            want.to_bits(),
                            "{isa} q4_kx8: {groups} groups, {n} inputs, row {r} input {t}"
                        );
                    }
                }
            }
        }
    }
}

/// Q5_K's packed groups, as Q4_K's (the AVX2 kernel scales its 16-bit sums twice per
/// sub-block here, so the all-ones fifth bits of row 0 reach its largest sums).
#[test]
fn packed_q5_k_groups_compute_the_portable_bits() {
    let mut rng = Rng(32);
    let nk = 2;
    let mut a = acts(&mut rng, nk * QK_K);
    a.q8_k[1][0] = BlockQ8K::ZERO;
    a.q8_k[0][0].qs = [127; QK_K];
    let rows: Vec<Vec<BlockQ5K>> = q4_k_rows(&mut rng, 24, nk)
        .into_iter()
        .enumerate()
        .map(|(r, row)| {
            row.iter()
                .map(|b| BlockQ5K {
                    d: b.d,
                    dmin: b.dmin,
                    scales: if r == 0 { [0xff; 12] } else { b.scales },
                    qh: if r == 0 { [0xff; 32] } else { rng.bytes() },
                    qs: if r == 0 { [0xff; 128] } else { b.qs },
                })
                .collect()
        })
        .collect();
    let packed: Vec<BlockQ5Kx8> = (0..3)
        .flat_map(|g| {
            let rows = &rows;
            (0..nk).map(move |i| BlockQ5Kx8::pack(std::array::from_fn(|r| &rows[8 * g + r][i])))
        })
        .collect();
    let pairs: Vec<Vec<[i32; 4]>> = a.q8_k.iter().map(|r| r.iter().map(q4_k_min_pairs).collect()).collect();
    for isa in Isa::available() {
        let k = Kernels::get(isa).unwrap();
        for groups in 1..=3 {
            for n in 1..=8 {
                let mut out = vec![f32::NAN; n * 8 * groups];
                let (y, ym) = (a.q8_k[..n].concat(), pairs[..n].concat());
                (k.q5_kx8)(&packed[..groups * nk], &y, &ym, n, &mut out);
                for t in 0..n {
                    for r in 0..8 * groups {
                        let want = portable::dot_q5_k_q8_k(&rows[r], &a.q8_k[t]);
                        assert_eq!(
                            out[t * 8 * groups + r].to_bits(),
                            want.to_bits(),
                            "{isa} q5_kx8: {groups} groups, {n} inputs, row {r} input {t}"
                        );
                    }
                }
            }
        }
    }
}

/// Q6_K's packed groups, as Q4_K's: every variant gives each cell the portable
/// single-row bits of its row, for one to five groups and any number of inputs; row
/// 0 holds the largest values and scales against all-127 inputs (the AVX2 kernel's
/// 16-bit sums of two steps at their largest) and row 1 the most negative scales.
#[test]
fn packed_q6_k_groups_compute_the_portable_bits() {
    let p = Kernels::get(Isa::Portable).unwrap();
    let mut rng = Rng(33);
    let nk = 2;
    let mut a = acts(&mut rng, nk * QK_K);
    a.q8_k[1][0] = BlockQ8K::ZERO;
    a.q8_k[0][0].qs = [127; QK_K];
    a.q8_k[0][0].bsums = [16 * 127; 16];
    let rows: Vec<Vec<BlockQ6K>> = (0..40)
        .map(|r| {
            (0..nk)
                .map(|_| BlockQ6K {
                    ql: if r == 0 { [0xff; 128] } else { rng.bytes() },
                    qh: if r == 0 { [0xff; 64] } else { rng.bytes() },
                    scales: match r {
                        0 => [127; 16],
                        1 => [-128; 16],
                        _ => rng.bytes::<16>().map(|b| b as i8),
                    },
                    d: rng.scale(),
                })
                .collect()
        })
        .collect();
    let packed: Vec<BlockQ6Kx8> = (0..5)
        .flat_map(|g| {
            let rows = &rows;
            (0..nk).map(move |i| BlockQ6Kx8::pack(std::array::from_fn(|r| &rows[8 * g + r][i])))
        })
        .collect();
    let pairs: Vec<Vec<[i32; 4]>> = a.q8_k.iter().map(|r| r.iter().map(q4_k_min_pairs).collect()).collect();
    for isa in Isa::available() {
        let k = Kernels::get(isa).unwrap();
        for groups in 1..=5 {
            for n in 1..=8 {
                let mut out = vec![f32::NAN; n * 8 * groups];
                let (y, ym) = (a.q8_k[..n].concat(), pairs[..n].concat());
                (k.q6_kx8)(&packed[..groups * nk], &y, &ym, n, &mut out);
                for t in 0..n {
                    for r in 0..8 * groups {
                        let want = (p.q6_k)(&rows[r], &a.q8_k[t]);
                        assert_eq!(
                            out[t * 8 * groups + r].to_bits(),
                            want.to_bits(),
                            "{isa} q6_kx8: {groups} groups, {n} inputs, row {r} input {t}"
                        );
                    }
                }
            }
        }
    }
}

/// A panel whose weights are not whole rows of the inputs' length is refused, not
/// read past.
#[test]
#[should_panic(expected = "a panel's weights")]
fn a_panel_with_a_partial_row_is_refused() {
    let k = Kernels::active();
    let y = vec![
        BlockQ8_1 {
            d: 0,
            s: 0,
            qs: [0; 32]
        };
        8 * 2
    ];
    let w = vec![
        BlockQ4_1 {
            d: 0,
            m: 0,
            qs: [0; 16]
        };
        3
    ];
    (k.q4_1_x8)(&w, &y, &[0.0; 16], &[0.0; 16], &mut [[0.0; 8]; 2]);
}

/// The attention tiles give exactly the one-row kernels' bits: each score is
/// `dot_f32 * scale`, each value sum `axpy_f32` row after row, for head sizes that
/// are and are not multiples of 8 and of the 64-column register block, and key
/// counts that are and are not multiples of 4.
#[test]
fn attention_tiles_compute_the_one_row_bits() {
    let mut rng = Rng(11);
    let p = Kernels::get(Isa::Portable).unwrap();
    for hd in [64, 80, 100, 128, 256, 12] {
        for n in [1, 3, 4, 7, 64, 65] {
            let keys: Vec<f32> = (0..n * hd).map(|_| rng.f32()).collect();
            let q: Vec<f32> = (0..hd).map(|_| rng.f32()).collect();
            let w: Vec<f32> = (0..n).map(|_| rng.f32().abs() / 2.0).collect();
            let start: Vec<f32> = (0..hd).map(|_| rng.f32()).collect();
            let scale = 0.125f32;
            let want_scores: Vec<u32> = keys
                .chunks_exact(hd)
                .map(|k| ((p.dot_f32)(k, &q) * scale).to_bits())
                .collect();
            let mut want_acc = start.clone();
            for (r, &wj) in keys.chunks_exact(hd).zip(&w) {
                (p.axpy_f32)(&mut want_acc, r, wj);
            }
            for isa in Isa::available() {
                let k = Kernels::get(isa).unwrap();
                let mut got = vec![0.0f32; n];
                (k.attend_scores)(&keys, &q, scale, &mut got);
                let got: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want_scores, "{isa} scores, head {hd}, {n} keys");
                let mut acc = start.clone();
                (k.attend_values)(&keys, &w, &mut acc);
                let acc: Vec<u32> = acc.iter().map(|x| x.to_bits()).collect();
                let want: Vec<u32> = want_acc.iter().map(|x| x.to_bits()).collect();
                assert_eq!(acc, want, "{isa} values, head {hd}, {n} rows");
            }
        }
    }
}
