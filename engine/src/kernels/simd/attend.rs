//! The inner loops of tiled attention over a block of keys: scores of one query
//! against many keys, and one query's weighted sum of many value rows. Written once
//! in plain Rust (`#[inline(always)]`) and compiled per kernel variant like
//! [`super::elementwise`].
//!
//! Each result is computed exactly as the one-row kernels compute it, so tiling
//! changes only the order in which independent values are produced: a score is
//! [`super::Kernels::dot_f32`] (8 FMA lanes over the head, the lane sum in ggml's
//! order, the tail in order) times the scale; a value sum is
//! [`super::Kernels::axpy_f32`] applied row after row. What tiling buys is registers:
//! four keys' dot products run side by side (four independent FMA chains instead of
//! one, the query loaded once for the four), and the value accumulator stays in
//! registers across a whole block of rows instead of being loaded and stored per row.

/// ggml's lane sum of 8 lanes (`hsum_float_8`).
#[inline(always)]
fn hsum8(l: &[f32; 8]) -> f32 {
    let r = [l[4] + l[0], l[5] + l[1], l[6] + l[2], l[7] + l[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// One key's score: `dot_f32(key, q) * scale`.
#[inline(always)]
fn score1(key: &[f32], q: &[f32], scale: f32) -> f32 {
    let n8 = q.len() / 8 * 8;
    let mut acc = [0.0f32; 8];
    for (k, x) in key[..n8].chunks_exact(8).zip(q[..n8].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] = k[l].mul_add(x[l], acc[l]);
        }
    }
    let mut s = hsum8(&acc);
    for i in n8..q.len() {
        s += key[i] * q[i];
    }
    s * scale
}

/// `out[j] = dot_f32(keys[j], q) * scale` for each key row of `q.len()` values.
#[inline(always)]
fn scores(keys: &[f32], q: &[f32], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    let keys = &keys[..out.len() * hd];
    let n8 = hd / 8 * 8;
    let mut quads = out.chunks_exact_mut(4);
    let mut rows = keys.chunks_exact(4 * hd);
    for (o, k) in (&mut quads).zip(&mut rows) {
        let (k0, rest) = k.split_at(hd);
        let (k1, rest) = rest.split_at(hd);
        let (k2, k3) = rest.split_at(hd);
        let mut acc = [[0.0f32; 8]; 4];
        for c in (0..n8).step_by(8) {
            let x: &[f32; 8] = q[c..c + 8].try_into().unwrap();
            let r: [&[f32; 8]; 4] = [
                k0[c..c + 8].try_into().unwrap(),
                k1[c..c + 8].try_into().unwrap(),
                k2[c..c + 8].try_into().unwrap(),
                k3[c..c + 8].try_into().unwrap(),
            ];
            for (a, r) in acc.iter_mut().zip(r) {
                for l in 0..8 {
                    a[l] = r[l].mul_add(x[l], a[l]);
                }
            }
        }
        for ((o, a), k) in o.iter_mut().zip(&acc).zip([k0, k1, k2, k3]) {
            let mut s = hsum8(a);
            for i in n8..hd {
                s += k[i] * q[i];
            }
            *o = s * scale;
        }
    }
    for (o, k) in quads.into_remainder().iter_mut().zip(rows.remainder().chunks_exact(hd)) {
        *o = score1(k, q, scale);
    }
}

/// Columns one pass of [`values`] keeps in registers.
const COLS: usize = 64;

/// `acc[i] = fma(rows[j][i], w[j], acc[i])` for each row `j` in order, rows of
/// `acc.len()` values: the same bits as `axpy_f32` row after row.
#[inline(always)]
fn values(rows: &[f32], w: &[f32], acc: &mut [f32]) {
    let hd = acc.len();
    let mut c0 = 0;
    while c0 + COLS <= hd {
        let mut a: [f32; COLS] = acc[c0..c0 + COLS].try_into().unwrap();
        for (r, &wj) in rows.chunks_exact(hd).zip(w) {
            let v: &[f32; COLS] = r[c0..c0 + COLS].try_into().unwrap();
            for i in 0..COLS {
                a[i] = v[i].mul_add(wj, a[i]);
            }
        }
        acc[c0..c0 + COLS].copy_from_slice(&a);
        c0 += COLS;
    }
    if c0 < hd {
        let a = &mut acc[c0..];
        for (r, &wj) in rows.chunks_exact(hd).zip(w) {
            for (x, v) in a.iter_mut().zip(&r[c0..]) {
                *x = v.mul_add(wj, *x);
            }
        }
    }
}

/// The portable build.
pub mod portable {
    pub fn scores(keys: &[f32], q: &[f32], scale: f32, out: &mut [f32]) {
        super::scores(keys, q, scale, out)
    }
    pub fn values(rows: &[f32], w: &[f32], acc: &mut [f32]) {
        super::values(rows, w, acc)
    }
}

/// [`scores`] in AVX2 intrinsics: four keys' 8-lane sums side by side (LLVM did not
/// keep the plain form's four accumulators in registers).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scores_x86(keys: &[f32], q: &[f32], scale: f32, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let hd = q.len();
    let n8 = hd / 8 * 8;
    let n = out.len();
    assert!(keys.len() >= n * hd);
    let (kp, qp) = (keys.as_ptr(), q.as_ptr());
    let tail = |k: &[f32], s: f32| {
        let mut s = s;
        for i in n8..hd {
            s += k[i] * q[i];
        }
        s * scale
    };
    let mut j = 0;
    while j + 4 <= n {
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
        );
        let base = kp.add(j * hd);
        let mut c = 0;
        while c < n8 {
            let x = _mm256_loadu_ps(qp.add(c));
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(base.add(c)), x, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(base.add(hd + c)), x, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(base.add(2 * hd + c)), x, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(base.add(3 * hd + c)), x, a3);
            c += 8;
        }
        for (r, a) in [a0, a1, a2, a3].into_iter().enumerate() {
            let row = &keys[(j + r) * hd..(j + r + 1) * hd];
            out[j + r] = tail(row, super::x86::hsum_float_8(a));
        }
        j += 4;
    }
    while j < n {
        let mut a = _mm256_setzero_ps();
        let base = kp.add(j * hd);
        let mut c = 0;
        while c < n8 {
            a = _mm256_fmadd_ps(_mm256_loadu_ps(base.add(c)), _mm256_loadu_ps(qp.add(c)), a);
            c += 8;
        }
        out[j] = tail(&keys[j * hd..(j + 1) * hd], super::x86::hsum_float_8(a));
        j += 1;
    }
}

/// The AVX2 + FMA build. SAFETY: callers check the CPU has those features.
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores(keys: &[f32], q: &[f32], scale: f32, out: &mut [f32]) {
        super::scores_x86(keys, q, scale, out)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn values(rows: &[f32], w: &[f32], acc: &mut [f32]) {
        super::values(rows, w, acc)
    }
}

/// The AVX-512 build: the same arithmetic; the value accumulator in 512-bit
/// registers (4 instead of 8 for 64 columns).
#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub unsafe fn scores(keys: &[f32], q: &[f32], scale: f32, out: &mut [f32]) {
        super::scores_x86(keys, q, scale, out)
    }
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub unsafe fn values(rows: &[f32], w: &[f32], acc: &mut [f32]) {
        super::values(rows, w, acc)
    }
}
