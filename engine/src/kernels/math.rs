//! Elementwise math with ggml's exact arithmetic, so activations match llama.cpp's
//! bit for bit where it matters for greedy decoding.

/// ggml's vectorised `expf` (`ggml_v_expf`, AVX2 + FMA), one lane at a time. The
/// vector code is purely elementwise, so the same fused operations give the same bits.
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(c(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let e = z.to_bits().wrapping_shl(23);
    let k = c(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6) * b);
    // Every case is computed and one is selected (as ggml's vector code blends), so
    // the loop over a block vectorises.
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = c(g.wrapping_add(0x7f00_0000));
    let s2 = c(e.wrapping_sub(g));
    let huge = s1 * s1;
    let large = s2.mul_add(j, s2) * s1;
    let usual = j.mul_add(k, k);
    let other = if n.abs() > 192.0 { huge } else { large };
    if n.abs() <= 126.0 {
        usual
    } else {
        other
    }
}

/// ggml's `ggml_v_silu`: `x / (1 + expf(-x))` with [`expf`].
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(0.0 - x))
}

/// ggml's GELU (tanh form) as its CPU backend computes it for f32 input: values at or
/// below −10 give 0, at or above 10 pass through, and the rest are rounded to f16 and
/// looked up in a table of f16 results (`GGML_GELU_FP16`).
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let table = GELU_F16.get_or_init(gelu_table);
        half::f16::from_bits(table[half::f16::from_f32(x).to_bits() as usize]).to_f32()
    }
}

static GELU_F16: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();

/// `ggml_table_gelu_f16`: GELU of every f16 value, computed in f32 and rounded to f16.
fn gelu_table() -> Vec<u16> {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    (0..=u16::MAX)
        .map(|bits| {
            let x = half::f16::from_bits(bits).to_f32();
            // gcc contracts `1 + a*x*x` into one FMA when building for AVX2+FMA.
            let inner = (GELU_COEF_A * x).mul_add(x, 1.0);
            let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh());
            half::f16::from_f32(y).to_bits()
        })
        .collect()
}

/// ggml's softmax over `x` in place (`ggml_vec_soft_max_f32` then the scaling):
/// `exp(x - max)` in blocks of 8 with a per-block lane sum added in f64, the tail
/// with the C library's `expf`, then multiplied by `1 / sum`.
#[inline(always)]
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    let n8 = x.len() / 8 * 8;
    for block in x[..n8].chunks_exact_mut(8) {
        for v in block.iter_mut() {
            *v = expf(*v - max);
        }
        // hsum order of ggml's AVX2 code: (hi4 + lo4), then pairs, then the last two.
        let s = [
            block[4] + block[0],
            block[5] + block[1],
            block[6] + block[2],
            block[7] + block[3],
        ];
        let t = [s[0] + s[2], s[1] + s[3]];
        sum += (t[0] + t[1]) as f64;
    }
    for v in x[n8..].iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_is_accurate() {
        for i in -2000..2000 {
            let x = i as f32 * 0.05;
            let (a, b) = (expf(x), x.exp());
            if b.is_finite() {
                assert!((a - b).abs() <= b * 2e-6 + 1e-38, "{x}: {a} vs {b}");
            }
        }
        assert_eq!(expf(-200.0), 0.0);
        assert!(expf(100.0).is_infinite());
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut v: Vec<f32> = (0..21).map(|i| (i as f32 * 0.7).sin() * 5.0).collect();
        softmax(&mut v);
        let s: f32 = v.iter().sum();
        assert!((s - 1.0).abs() < 1e-5);
    }

    #[test]
    fn softmax_matches_the_textbook_one() {
        for n in [1usize, 8, 9, 17] {
            let mut x: Vec<f32> = (0..n).map(|i| (i as f32 * 1.3).sin() * 4.0).collect();
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = x.iter().map(|v| (v - max).exp()).collect();
            let s: f32 = e.iter().sum();
            softmax(&mut x);
            for (a, b) in x.iter().zip(&e) {
                assert!((a - b / s).abs() < 1e-5, "n={n}");
            }
        }
    }
}
