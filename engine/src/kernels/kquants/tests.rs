use super::super::quants::f2h;
use super::*;
use crate::kernels::isa::Isa;
use crate::kernels::simd::Kernels;

fn lcg(s: &mut u32) -> u32 {
    *s = s.wrapping_mul(1664525).wrapping_add(1013904223);
    *s
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| ((lcg(&mut s) >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 4.0)
        .collect()
}

fn bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed;
    (0..n).map(|_| (lcg(&mut s) >> 24) as u8).collect()
}

fn q8_k(x: &[f32]) -> Vec<BlockQ8K> {
    let mut b = vec![BlockQ8K::ZERO; x.len() / QK_K];
    quantize_q8_k(x, &mut b);
    b
}

/// Test-only Q4_K quantizer: per sub-block min/max, 6-bit scales and mins relative
/// to the block's largest, packed as ggml packs them.
fn q4_k(x: &[f32]) -> Vec<BlockQ4K> {
    x.chunks_exact(QK_K)
        .map(|x| {
            let mut sc = [0.0f32; 8];
            let mut mn = [0.0f32; 8];
            for (j, sub) in x.chunks_exact(32).enumerate() {
                let lo = sub.iter().fold(0.0f32, |m, &v| m.min(v));
                let hi = sub.iter().fold(f32::MIN, |m, &v| m.max(v));
                sc[j] = (hi - lo) / 15.0;
                mn[j] = -lo;
            }
            let max_sc = sc.iter().fold(0.0f32, |m, &v| m.max(v));
            let max_mn = mn.iter().fold(0.0f32, |m, &v| m.max(v));
            let d = if max_sc > 0.0 { max_sc / 63.0 } else { 0.0 };
            let dmin = if max_mn > 0.0 { max_mn / 63.0 } else { 0.0 };
            let mut b = BlockQ4K::ZERO;
            b.d = f2h(d);
            b.dmin = f2h(dmin);
            let (d, dmin) = (h2f(b.d), h2f(b.dmin));
            for j in 0..8 {
                let ls = if d > 0.0 {
                    (sc[j] / d).round().min(63.0) as u8
                } else {
                    0
                };
                let lm = if dmin > 0.0 {
                    (mn[j] / dmin).round().min(63.0) as u8
                } else {
                    0
                };
                if j < 4 {
                    b.scales[j] = ls;
                    b.scales[j + 4] = lm;
                } else {
                    b.scales[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
                    b.scales[j - 4] |= (ls >> 4) << 6;
                    b.scales[j] |= (lm >> 4) << 6;
                }
            }
            for j in 0..4 {
                let (s0, m0) = scale_min_k4(2 * j, &b.scales);
                let (s1, m1) = scale_min_k4(2 * j + 1, &b.scales);
                let q = |v: f32, s: u8, m: u8| {
                    let ds = d * s as f32;
                    if ds == 0.0 {
                        0
                    } else {
                        ((v + dmin * m as f32) / ds).round().clamp(0.0, 15.0) as u8
                    }
                };
                for l in 0..32 {
                    let lo = q(x[64 * j + l], s0, m0);
                    let hi = q(x[64 * j + 32 + l], s1, m1);
                    b.qs[32 * j + l] = lo | (hi << 4);
                }
            }
            b
        })
        .collect()
}

/// Test-only Q6_K quantizer: per-16 scales as i8 relative to the block's largest,
/// values packed as ggml packs them.
fn q6_k(x: &[f32]) -> Vec<BlockQ6K> {
    x.chunks_exact(QK_K)
        .map(|x| {
            let mut sc = [0.0f32; 16];
            for (j, sub) in x.chunks_exact(16).enumerate() {
                sc[j] = sub.iter().fold(0.0f32, |m, &v| m.max(v.abs())) / 31.0;
            }
            let max_sc = sc.iter().fold(0.0f32, |m, &v| m.max(v));
            let mut b = BlockQ6K::ZERO;
            b.d = f2h(max_sc / 127.0);
            let d = h2f(b.d);
            let mut l = [0u8; QK_K];
            let groups = x.chunks_exact(16).zip(l.chunks_exact_mut(16));
            for ((&sc, bs), (x, l)) in sc.iter().zip(b.scales.iter_mut()).zip(groups) {
                let s = if d > 0.0 { (sc / d).round().min(127.0) } else { 0.0 };
                *bs = s as i8;
                let ds = d * s;
                for (l, &v) in l.iter_mut().zip(x) {
                    let q = if ds > 0.0 {
                        (v / ds).round().clamp(-32.0, 31.0)
                    } else {
                        0.0
                    };
                    *l = (q as i32 + 32) as u8;
                }
            }
            for n in 0..2 {
                let (l, ql, qh) = (&l[128 * n..], &mut b.ql[64 * n..], &mut b.qh[32 * n..]);
                for i in 0..32 {
                    ql[i] = (l[i] & 0xf) | ((l[i + 64] & 0xf) << 4);
                    ql[i + 32] = (l[i + 32] & 0xf) | ((l[i + 96] & 0xf) << 4);
                    qh[i] = (l[i] >> 4) | ((l[i + 32] >> 4) << 2) | ((l[i + 64] >> 4) << 4) | ((l[i + 96] >> 4) << 6);
                }
            }
            b
        })
        .collect()
}

/// Blocks straight from pseudo-random bytes (every scale and value pattern),
/// with sane super-block scales.
fn random_q4_k(n: usize, seed: u32) -> Vec<BlockQ4K> {
    let r = bytes(n * 140, seed);
    r.chunks_exact(140)
        .enumerate()
        .map(|(i, r)| {
            let mut b = BlockQ4K::ZERO;
            b.d = f2h(0.001 + 0.0005 * i as f32);
            b.dmin = f2h(0.002 + 0.0003 * i as f32);
            b.scales.copy_from_slice(&r[..12]);
            b.qs.copy_from_slice(&r[12..]);
            b
        })
        .collect()
}

/// Q4_K's random blocks with random fifth bits.
fn random_q5_k(n: usize, seed: u32) -> Vec<BlockQ5K> {
    let qh = bytes(n * 32, seed ^ 0x55);
    random_q4_k(n, seed)
        .iter()
        .zip(qh.chunks_exact(32))
        .map(|(b, h)| BlockQ5K {
            d: b.d,
            dmin: b.dmin,
            scales: b.scales,
            qh: h.try_into().unwrap(),
            qs: b.qs,
        })
        .collect()
}

fn random_q6_k(n: usize, seed: u32) -> Vec<BlockQ6K> {
    let r = bytes(n * 208, seed);
    r.chunks_exact(208)
        .enumerate()
        .map(|(i, r)| {
            let mut b = BlockQ6K::ZERO;
            b.d = f2h(0.0007 + 0.0002 * i as f32);
            b.ql.copy_from_slice(&r[..128]);
            b.qh.copy_from_slice(&r[128..192]);
            for (s, &v) in b.scales.iter_mut().zip(&r[192..]) {
                *s = v as i8;
            }
            b
        })
        .collect()
}

#[test]
fn layouts_match_ggml() {
    assert_eq!(std::mem::size_of::<BlockQ4K>(), 144);
    assert_eq!(std::mem::size_of::<BlockQ5K>(), 176);
    assert_eq!(std::mem::size_of::<BlockQ5Kx8>(), 1440);
    assert_eq!(std::mem::size_of::<BlockQ6K>(), 210);
    assert_eq!(std::mem::size_of::<BlockQ6Kx8>(), 8 * 210);
    assert_eq!(std::mem::size_of::<BlockQ8K>(), 292);
    assert_eq!(std::mem::align_of::<BlockQ4K>(), 2);
    assert_eq!(std::mem::align_of::<BlockQ6K>(), 2);
    assert_eq!(std::mem::align_of::<BlockQ8K>(), 4);
}

#[test]
fn nearest_int_rounds_half_to_even() {
    for (v, r) in [
        (2.5, 2),
        (3.5, 4),
        (-2.5, -2),
        (-3.5, -4),
        (0.49, 0),
        (-126.6, -127),
        (127.0, 127),
    ] {
        assert_eq!(nearest_int(v), r, "{v}");
        assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
    }
}

#[test]
fn quantize_q8_k_matches_ggml_ref() {
    let mut x = data(512, 5);
    x[37] = 3.0; // the largest magnitude, positive: d < 0 and qs[37] == -127
    x[300] = -2.5; // second block: negative extreme
    x[301] = 2.5; // same magnitude later: the first one wins
    let b = q8_k(&x);
    assert_eq!(b[0].qs[37], -127);
    assert_eq!(b[0].d, 1.0 / (-127.0 / 3.0f32));
    assert!(b[0].d < 0.0);
    assert_eq!(b[1].qs[300 - 256], -127);
    assert_eq!(b[1].qs[301 - 256], 127);
    assert!(b[1].d > 0.0);
    for (blk, xs) in b.iter().zip(x.chunks_exact(QK_K)) {
        for (j, s) in blk.bsums.iter().enumerate() {
            let sum: i32 = blk.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
            assert_eq!(*s as i32, sum);
        }
        for (&q, &v) in blk.qs.iter().zip(xs) {
            assert!((q as f32 * blk.d - v).abs() <= blk.d.abs() * 0.5 + 1e-6, "{q} {v}");
        }
    }
    let z = q8_k(&[0.0; QK_K]);
    assert_eq!(z[0].d, 0.0);
    assert!(z[0].qs.iter().all(|&q| q == 0) && z[0].bsums.iter().all(|&s| s == 0));
}

/// Packing eight Q4_K rows for the row-per-lane kernels keeps every scale and min (as
/// ggml unpacks them) and every byte: each row comes back exactly.
#[test]
fn packed_q4_k_rows_round_trip() {
    let rows = random_q4_k(8, 77);
    let packed = BlockQ4Kx8::pack(std::array::from_fn(|r| &rows[r]));
    for (r, b) in rows.iter().enumerate() {
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &b.scales);
            assert_eq!(
                (packed.scales[j][r], packed.mins[j / 2][2 * r + j % 2]),
                (sc, m),
                "row {r} j {j}"
            );
        }
        let back = packed.row(r);
        assert_eq!(
            (back.d, back.dmin, back.scales, back.qs),
            (b.d, b.dmin, b.scales, b.qs),
            "row {r}"
        );
    }
}

/// Q5_K's rows likewise, fifth bits included.
#[test]
fn packed_q5_k_rows_round_trip() {
    let rows = random_q5_k(8, 78);
    let packed = BlockQ5Kx8::pack(std::array::from_fn(|r| &rows[r]));
    for (r, b) in rows.iter().enumerate() {
        let back = packed.row(r);
        assert_eq!(
            (back.d, back.dmin, back.scales, back.qh, back.qs),
            (b.d, b.dmin, b.scales, b.qh, b.qs),
            "row {r}"
        );
    }
}

/// Q6_K's rows likewise, and each packed value is where ggml's layout puts it: the
/// packed bytes read the way the kernels read them give the row's dequantized values.
#[test]
fn packed_q6_k_rows_round_trip() {
    let rows = random_q6_k(8, 79);
    let packed = BlockQ6Kx8::pack(std::array::from_fn(|r| &rows[r]));
    let mut deq = vec![0.0f32; QK_K];
    for (r, b) in rows.iter().enumerate() {
        let back = packed.row(r);
        assert_eq!(
            (back.d, back.ql, back.qh, back.scales),
            (b.d, b.ql, b.qh, b.scales),
            "row {r}"
        );
        dequantize_q6_k(std::slice::from_ref(b), &mut deq);
        for c in 0..4 {
            let (half, h) = (c / 2, c % 2);
            for s in 0..8 {
                for l in 0..4 {
                    let w = packed.q[BlockQ6Kx8::ql_at(c, s) + 4 * r + l];
                    let high = packed.q[BlockQ6Kx8::qh_at(half, s) + 4 * r + l];
                    let v = 128 * half + 32 * h + 4 * s + l;
                    for (q, v) in [
                        ((w & 0xf) | ((high >> (2 * h)) & 3) << 4, v),
                        ((w >> 4) | ((high >> (2 * h + 4)) & 3) << 4, v + 64),
                    ] {
                        let sc = packed.scales[v / 32][2 * r + v / 16 % 2];
                        let want = h2f(b.d) * sc as f32 * (q as i32 - 32) as f32;
                        assert_eq!(deq[v], want, "row {r} value {v}");
                    }
                }
            }
        }
    }
}

/// A Q5_K value is its Q4_K nibble plus 16 when its bit in `qh` (bit `j` of byte `l`
/// for value `l` of sub-block `j`) is set: with no bits set it dequantizes as the
/// Q4_K block of the same bytes; with one bit set, exactly one value moves, by
/// `16·d·sc`.
#[test]
fn q5_k_fifth_bits_are_where_ggml_puts_them() {
    let mut b = random_q5_k(1, 5)[0];
    b.qh = [0; 32];
    let (mut q4, mut q5) = (vec![0.0f32; QK_K], vec![0.0f32; QK_K]);
    dequantize_q4_k(&[b.low()], &mut q4);
    dequantize_q5_k(&[b], &mut q5);
    assert_eq!(q4, q5);
    for (j, l) in [(0, 0), (1, 5), (2, 31), (5, 17), (7, 9)] {
        let mut one = b;
        one.qh[l] = 1 << j;
        dequantize_q5_k(&[one], &mut q5);
        let (sc, _) = scale_min_k4(j, &b.scales);
        for (i, (a, c)) in q4.iter().zip(&q5).enumerate() {
            let want = if i == 32 * j + l {
                a + 16.0 * h2f(b.d) * sc as f32
            } else {
                *a
            };
            assert!(
                (c - want).abs() <= 1e-6 * want.abs().max(1.0),
                "j {j} l {l} value {i}: {c} vs {want}"
            );
        }
    }
}

#[test]
fn dequantize_round_trips_the_test_quantizers() {
    let w = data(4 * QK_K, 7);
    let mut back = vec![0.0f32; w.len()];
    dequantize_q4_k(&q4_k(&w), &mut back);
    let err4 = w.iter().zip(&back).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    // Range 4 over 15 steps: half a step plus the 6-bit scale/min rounding.
    assert!(err4 < 0.35, "q4_k max error {err4}");
    dequantize_q6_k(&q6_k(&w), &mut back);
    let err6 = w.iter().zip(&back).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(err6 < 0.06, "q6_k max error {err6}");
}

fn fnv(bytes: impl IntoIterator<Item = u8>, mut h: u64) -> u64 {
    for b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Golden values from ggml's own C (`quantize_row_q8_K_ref`, `dequantize_row_q{4,6}_K`
/// built without FMA as ggml-base is, and the AVX2 `ggml_vec_dot_q{4,6}_K_q8_K`) on the
/// same inputs. The dot products have their own arithmetic here (integer sums per
/// super-block, see `simd::portable::dot_q4_k_q8_k`), so they are held to ggml's
/// values within a few units in the last place instead of bit for bit.
#[test]
fn matches_ggml_bit_for_bit() {
    const SEED: u64 = 0xcbf29ce484222325;
    let yq = q8_k(&data(4 * QK_K, 21));
    let h = yq.iter().fold(SEED, |h, b| {
        let h = fnv(b.d.to_le_bytes(), h);
        let h = fnv(b.qs.iter().map(|&q| q as u8), h);
        fnv(b.bsums.iter().flat_map(|s| s.to_le_bytes()), h)
    });
    assert_eq!(yq[0].d.to_bits(), 0xbc80e330);
    assert_eq!(h, 0x5cb4e15708534c0d);

    let w4 = random_q4_k(4, 22);
    let w6 = random_q6_k(4, 23);
    let mut deq = vec![0.0f32; 4 * QK_K];
    dequantize_q4_k(&w4, &mut deq);
    assert_eq!(fnv(deq.iter().flat_map(|v| v.to_le_bytes()), SEED), 0x5c2ddde2c836e5e8);
    dequantize_q6_k(&w6, &mut deq);
    assert_eq!(fnv(deq.iter().flat_map(|v| v.to_le_bytes()), SEED), 0xf8b869cf6b596b3c);

    // Every kernel variant computes the AVX2 kernels' values.
    for isa in Isa::available() {
        let k = Kernels::get(isa).unwrap();
        // ulps: ggml's Q6_K sums 8 float lanes per super-block (64 roundings here), ours one.
        for (ours, ggml, ulps) in [
            ((k.q4_k)(&w4, &yq), f32::from_bits(0xc0e17a5c), 4.0),
            ((k.q6_k)(&w6, &yq), f32::from_bits(0xc20c7edc), 8.0),
        ] {
            assert!(
                (ours - ggml).abs() <= ulps * f32::EPSILON * ggml.abs(),
                "{isa}: {ours} vs ggml {ggml}"
            );
        }
    }
}

/// dot(w, q8_k(y)) ≈ Σ dequant(w)·y, within the activations' rounding error.
#[test]
fn dots_agree_with_dequantized_weights() {
    let n = 4;
    let y = data(n * QK_K, 11);
    let yq = q8_k(&y);
    let ymax_d = yq.iter().fold(0.0f32, |m, b| m.max(b.d.abs()));
    let check = |deq: &[f32], got: f32, what: &str| {
        let want: f64 = deq.iter().zip(&y).map(|(&a, &b)| a as f64 * b as f64).sum();
        let l1: f64 = deq.iter().map(|&a| a.abs() as f64).sum();
        let tol = l1 * ymax_d as f64 * 0.5 + 1e-3 * want.abs() + 1e-3;
        assert!((got as f64 - want).abs() <= tol, "{what}: {got} vs {want} (tol {tol})");
    };
    let mut deq = vec![0.0f32; n * QK_K];
    for w in [q4_k(&data(n * QK_K, 12)), random_q4_k(n, 13)] {
        dequantize_q4_k(&w, &mut deq);
        check(&deq, (Kernels::active().q4_k)(&w, &yq), "q4_k");
    }
    let w = random_q5_k(n, 16);
    dequantize_q5_k(&w, &mut deq);
    check(&deq, crate::kernels::simd::portable::dot_q5_k_q8_k(&w, &yq), "q5_k");
    for w in [q6_k(&data(n * QK_K, 14)), random_q6_k(n, 15)] {
        dequantize_q6_k(&w, &mut deq);
        check(&deq, (Kernels::active().q6_k)(&w, &yq), "q6_k");
    }
}
