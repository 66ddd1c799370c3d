//! Every kernel variant this CPU supports computes exactly the portable kernels' bits,
//! for every packed type, group count and input tile. (On an AVX-512 host this covers
//! all four variants; on an AVX2-only host, three.)

use super::*;
use crate::kernels::kquants::{q4_k_min_pairs, quantize_q8_k, BlockQ5K, QK_K};
use crate::kernels::quants::{
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
    let f: Vec<f32> = (0..cols + 6).map(|_| rng.f32()).collect();
    let h: Vec<u16> = (0..cols + 5).map(|_| f2h(rng.f32())).collect();

    let isas = Isa::available();
    eprintln!("variants on this CPU: {isas:?}");
    for isa in isas {
        let k = Kernels::get(isa).unwrap();
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

/// Every variant's packed Q8_0-input kernel (`kernel`) on one to five groups of `rows`
/// (packed by `pack`; the 512-bit kernels pair them, an odd one goes alone) against
/// 1–8 inputs gives each cell the portable single-row bits (`one`). Inputs 0 and 1
/// hold blocks of ±127, the worst case for AVX2's 16-bit sums.
fn check_q8_0_groups<R: Copy, G: Copy>(
    name: &str,
    rows: &[Vec<R>],
    pack: fn([&R; 8]) -> G,
    kernel: fn(&Kernels) -> super::Q80x8<G>,
    one: fn(&Kernels) -> super::Q80<R>,
) {
    let p = Kernels::get(Isa::Portable).unwrap();
    let nb = rows[0].len();
    let mut a = acts(&mut Rng(33), nb * QK);
    a.q8_0[0][0].qs = [127; 32];
    a.q8_0[1][2].qs = [-127; 32];
    let offsets: Vec<Vec<i32>> = a.q8_0.iter().map(|r| r.iter().map(q4_0_offset).collect()).collect();
    let packed: Vec<G> = (0..5)
        .flat_map(|g| (0..nb).map(move |i| pack(std::array::from_fn(|r| &rows[8 * g + r][i]))))
        .collect();
    for isa in Isa::available() {
        let k = Kernels::get(isa).unwrap();
        for groups in 1..=5 {
            for n in 1..=8 {
                let mut out = vec![f32::NAN; n * 8 * groups];
                let (y, yd, yo) = (a.q8_0[..n].concat(), a.q8_0d[..n].concat(), offsets[..n].concat());
                kernel(k)(&packed[..groups * nb], &y, &yd, &yo, n, &mut out);
                for t in 0..n {
                    for r in 0..8 * groups {
                        let want = one(p)(&rows[r], &a.q8_0[t], &a.q8_0d[t]);
                        assert_eq!(
                            out[t * 8 * groups + r].to_bits(),
                            want.to_bits(),
                            "{isa} {name}: {groups} groups, {n} inputs, row {r} input {t}"
                        );
                    }
                }
            }
        }
    }
}

/// Row `r` of each packed block of `rows` (groups of eight) is the file's block, by `same`.
fn check_round_trip<R, G>(rows: &[Vec<R>], pack: fn([&R; 8]) -> G, row: fn(&G, usize) -> R, same: fn(&R, &R) -> bool) {
    for (g, group) in rows.chunks_exact(8).enumerate() {
        for i in 0..group[0].len() {
            let b = pack(std::array::from_fn(|r| &group[r][i]));
            for (r, want) in group.iter().map(|row| &row[i]).enumerate() {
                assert!(same(&row(&b, r), want), "group {g} block {i} row {r}");
            }
        }
    }
}

#[test]
fn packed_q4_0_groups_compute_the_portable_bits() {
    let rows = q4_0_rows(&mut Rng(29), 40, 7);
    check_round_trip(&rows, BlockQ4_0x8::pack, BlockQ4_0x8::row, |a, b| {
        (a.d, a.qs) == (b.d, b.qs)
    });
    check_q8_0_groups("q4_0x8", &rows, BlockQ4_0x8::pack, |k| k.q4_0x8, |k| k.q4_0);
}

/// Q8_0's packed groups, as Q4_0's. Row 0 holds −128 and 127 (files may hold −128;
/// ggml's quantizer never writes it): the AVX2 kernel's 16-bit pairs reach their
/// largest there.
#[test]
fn packed_q8_0_groups_compute_the_portable_bits() {
    let mut rng = Rng(33);
    let nb = 7;
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
    check_round_trip(&rows, BlockQ8_0x8::pack, BlockQ8_0x8::row, |a, b| {
        (a.d, a.qs) == (b.d, b.qs)
    });
    check_q8_0_groups("q8_0x8", &rows, BlockQ8_0x8::pack, |k| k.q8_0x8, |k| k.q8_0);
}

/// Q5_0's packed groups, as Q4_0's. Row 0 holds the largest values (all nibbles and
/// fifth bits set) and row 1 the smallest (none).
#[test]
fn packed_q5_0_groups_compute_the_portable_bits() {
    let mut rng = Rng(34);
    let nb = 7;
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
    check_round_trip(&rows, BlockQ5_0x8::pack, BlockQ5_0x8::row, |a, b| {
        (a.d, a.qh, a.qs) == (b.d, b.qh, b.qs)
    });
    check_q8_0_groups("q5_0x8", &rows, BlockQ5_0x8::pack, |k| k.q5_0x8, |k| k.q5_0);
}

/// Every variant's packed Q8_1-input kernel (`kernel`) on one to five groups of `rows`
/// (packed by `pack`) against 1–8 inputs gives each cell the portable single-row
/// bits (`one`). The first row holds the largest values and inputs 0 and 1 the
/// extreme bytes, the worst case for AVX2's 16-bit sums.
fn check_min_groups<R: Copy, G: Copy>(
    name: &str,
    rows: &[Vec<R>],
    pack: fn([&R; 8]) -> G,
    kernel: fn(&Kernels) -> super::Q81x8<G>,
    one: fn(&Kernels) -> super::Q81<R>,
) {
    let p = Kernels::get(Isa::Portable).unwrap();
    let nb = rows[0].len();
    let mut a = acts(&mut Rng(30), nb * QK);
    a.q8_1[0][0].qs = [127; 32];
    a.q8_1[1][2].qs = [-127; 32];
    let packed: Vec<G> = (0..5)
        .flat_map(|g| (0..nb).map(move |i| pack(std::array::from_fn(|r| &rows[8 * g + r][i]))))
        .collect();
    for isa in Isa::available() {
        let k = Kernels::get(isa).unwrap();
        for groups in 1..=5 {
            for n in [1, 2, 3, 4, 5, 7, 8] {
                let mut out = vec![f32::NAN; n * 8 * groups];
                let (y, yd, ys) = (a.q8_1[..n].concat(), a.q8_1d[..n].concat(), a.q8_1s[..n].concat());
                kernel(k)(&packed[..groups * nb], &y, &yd, &ys, n, &mut out);
                for t in 0..n {
                    for r in 0..8 * groups {
                        let want = one(p)(&rows[r], &a.q8_1[t], &a.q8_1d[t], &a.q8_1s[t]);
                        assert_eq!(
                            out[t * 8 * groups + r].to_bits(),
                            want.to_bits(),
                            "{isa} {name}: {groups} groups, {n} inputs, row {r} input {t}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn packed_q5_1_groups_compute_the_portable_bits() {
    let mut rng = Rng(30);
    let nb = 7;
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
    check_round_trip(&rows, BlockQ5_1x8::pack, BlockQ5_1x8::row, |a, b| {
        (a.d, a.m, a.qh, a.qs) == (b.d, b.m, b.qh, b.qs)
    });
    check_min_groups("q5_1x8", &rows, BlockQ5_1x8::pack, |k| k.q5_1x8, |k| k.q5_1);
}

#[test]
fn packed_q4_1_groups_compute_the_portable_bits() {
    let mut rng = Rng(31);
    let nb = 7;
    let rows: Vec<Vec<BlockQ4_1>> = (0..40)
        .map(|r| {
            (0..nb)
                .map(|_| BlockQ4_1 {
                    d: rng.scale(),
                    m: f2h(-0.01 * (rng.next() % 50) as f32),
                    qs: if r == 0 { [0xff; 16] } else { rng.bytes() },
                })
                .collect()
        })
        .collect();
    check_round_trip(&rows, BlockQ4_1x8::pack, BlockQ4_1x8::row, |a, b| {
        (a.d, a.m, a.qs) == (b.d, b.m, b.qs)
    });
    check_min_groups("q4_1x8", &rows, BlockQ4_1x8::pack, |k| k.q4_1x8, |k| k.q4_1);
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
