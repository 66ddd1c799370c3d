//! The CPU engine's inner loops, one table per kernel variant ([`Isa`]), chosen at
//! run time. Every variant computes the same bits (see [`crate::kernels::isa`]).
//!
//! ## Layout
//! - [`portable`]: plain Rust, any CPU; the definition of the arithmetic.
//! - `x86`: 256-bit kernels, compiled for AVX2, for AVX-VNNI and for AVX-512 VL.
//! - `avx512`: 512-bit kernels, two packed groups to a register.
//! - Every quantized type is served as packed groups of eight rows (Q4_0, Q4_1, Q5_0,
//!   Q5_1, Q8_0, the K-quants); the rows after the last whole group go through
//!   the portable single-row kernels, which compute the same arithmetic.
//!
//! [`Kernels::get`] hands out a table only for a variant the CPU supports; that check
//! is what makes calling the `#[target_feature]` functions behind it sound.

/// Runs `$body` over inputs `0..$n` in tiles of at most 4 or 8: `$t` is a tile's first
/// input and the constant `$m` its size (a group kernel takes the tile's inputs as
/// `[_; $m]`, so each size is its own instance).
#[cfg(target_arch = "x86_64")]
macro_rules! tiles {
    ($n:expr, 4, |$t:ident, $m:ident| $body:block) => {
        tiles!(@run $n, [1 2 3] 4, $t, $m, $body)
    };
    ($n:expr, 8, |$t:ident, $m:ident| $body:block) => {
        tiles!(@run $n, [1 2 3 4 5 6 7] 8, $t, $m, $body)
    };
    (@run $n:expr, [$($k:literal)*] $last:literal, $t:ident, $m:ident, $body:block) => {{
        let n = $n;
        let mut $t = 0;
        while $t < n {
            match n - $t {
                $($k => {
                    const $m: usize = $k;
                    $body
                    $t += $k;
                })*
                _ => {
                    const $m: usize = $last;
                    $body
                    $t += $last;
                }
            }
        }
    }};
}

mod attend;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod elementwise;
pub mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use super::isa::Isa;
use super::kquants::{BlockQ4K, BlockQ4Kx8, BlockQ5Kx8, BlockQ6K, BlockQ6Kx8, BlockQ8K};
use super::quants::{
    BlockQ4_0, BlockQ4_0x8, BlockQ4_1, BlockQ4_1x8, BlockQ5_0, BlockQ5_0x8, BlockQ5_1, BlockQ5_1x8, BlockQ8_0,
    BlockQ8_0x8, BlockQ8_1,
};
use elementwise as ew;

type Q81<B> = fn(&[B], &[BlockQ8_1], &[f32], &[f32]) -> f32;
type Q80<B> = fn(&[B], &[BlockQ8_0], &[f32]) -> f32;
/// Packed groups against `n` Q8_0 inputs (their scales and offsets).
type Q80x8<G> = fn(&[G], &[BlockQ8_0], &[f32], &[i32], usize, &mut [f32]);
/// Packed groups against `n` Q8_1 inputs (their scales and sums).
type Q81x8<G> = fn(&[G], &[BlockQ8_1], &[f32], &[f32], usize, &mut [f32]);
type Kx8<G> = fn(&[G], &[BlockQ8K], &[[i32; 4]], usize, &mut [f32]);
type QK<B> = fn(&[B], &[BlockQ8K]) -> f32;

/// One variant's kernels. Weight blocks come first, then the prepared activations
/// (Q8_0/Q8_1/Q8_K blocks with their scales, and Q8_1's sums or the offsets and min
/// pairs, already computed once per input).
///
/// Every quantized type has its own layout and arithmetic: `q4_0x8`, `q4_1x8`, `q5_0x8`, `q5_1x8`, `q8_0x8`, `q4_kx8`, … take groups of eight rows packed as [`BlockQ4_0x8`],
/// [`BlockQ5_1x8`], [`BlockQ4Kx8`], … (one row per 32-bit
/// lane) against any number of inputs, and each cell finishes a block in integers and
/// does one fused multiply-add per block and sum, in block order — as llama.cpp's
/// repacked kernels do, not the 8-lane float sums of ggml's row kernels (see
/// [`portable::dot_q4_0_q8_0`], [`portable::dot_q4_k_q8_k`]). `q4_0`, `q4_1`, `q4_k`, …
/// (the same arithmetic, one row in file order, portable in every table) serve the
/// rows after the last whole group.
pub struct Kernels {
    pub isa: Isa,
    /// One Q4_1 row in file order (the rows after the last whole group), with
    /// [`Self::q4_1x8`]'s arithmetic: portable in every table.
    pub q4_1: Q81<BlockQ4_1>,
    /// Groups of eight packed Q4_1 rows ([`BlockQ4_1x8`]) against `n` inputs (`y`,
    /// their scales and sums), as [`Self::q4_0x8`].
    pub q4_1x8: Q81x8<BlockQ4_1x8>,
    /// One Q5_1 row in file order (the rows after the last whole group), with
    /// [`Self::q5_1x8`]'s arithmetic: portable in every table.
    pub q5_1: Q81<BlockQ5_1>,
    /// Groups of eight packed Q5_1 rows ([`BlockQ5_1x8`]) against `n` inputs (`y`,
    /// their scales and sums), as [`Self::q4_0x8`].
    pub q5_1x8: Q81x8<BlockQ5_1x8>,
    pub q4_0: Q80<BlockQ4_0>,
    /// Groups of eight packed rows (`x`, group after group) against `n` inputs (`y`,
    /// their scales and [`crate::kernels::quants::q4_0_offset`]s, input after
    /// input): `out[t * 8 * groups + 8 * g + r]`.
    pub q4_0x8: Q80x8<BlockQ4_0x8>,
    /// One Q5_0 row in file order (the rows after the last whole group), with
    /// [`Self::q5_0x8`]'s arithmetic: portable in every table.
    pub q5_0: Q80<BlockQ5_0>,
    /// Groups of eight packed Q5_0 rows ([`BlockQ5_0x8`]) against `n` inputs, as
    /// [`Self::q4_0x8`] (the same offsets, twice).
    pub q5_0x8: Q80x8<BlockQ5_0x8>,
    /// One Q8_0 row in file order (the rows after the last whole group), with
    /// [`Self::q8_0x8`]'s arithmetic: portable in every table.
    pub q8_0: Q80<BlockQ8_0>,
    /// Groups of eight packed Q8_0 rows ([`BlockQ8_0x8`]) against `n` inputs, as
    /// [`Self::q4_0x8`] (the same offsets, times 16).
    pub q8_0x8: Q80x8<BlockQ8_0x8>,
    pub q4_k: QK<BlockQ4K>,
    /// Groups of eight packed rows against `n` inputs (`y` and their
    /// [`crate::kernels::kquants::q4_k_min_pairs`]), as [`Self::q4_0x8`].
    pub q4_kx8: Kx8<BlockQ4Kx8>,
    /// Q5_K's groups ([`BlockQ5Kx8`]) likewise: Q4_K's kernel with the fifth bits.
    pub q5_kx8: Kx8<BlockQ5Kx8>,
    pub q6_k: QK<BlockQ6K>,
    /// Q6_K's groups ([`BlockQ6Kx8`]) likewise, with its own arithmetic (the inputs'
    /// min pairs are not used: the −32 offset takes the sub-block sums themselves).
    pub q6_kx8: Kx8<BlockQ6Kx8>,
    /// `Σ a[i]·b[i]`: 8 FMA lanes, the lane sum, then the tail.
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    /// [`Self::dot_f32`] with `a` in f16 bits (widened exactly).
    pub dot_f16_f32: fn(&[u16], &[f32]) -> f32,
    /// `acc[i] = fma(h2f(v[i]), w, acc[i])`.
    pub axpy_f16: fn(&mut [f32], &[u16], f32),
    /// `acc[i] = fma(x[i], w, acc[i])`.
    pub axpy_f32: fn(&mut [f32], &[f32], f32),
    /// `out[j] = dot_f32(keys[j], q) * scale` for key rows of `q.len()` values.
    pub attend_scores: fn(keys: &[f32], q: &[f32], scale: f32, out: &mut [f32]),
    /// `axpy_f32(acc, rows[j], w[j])` for each row `j` in order (rows of `acc.len()`).
    pub attend_values: fn(rows: &[f32], w: &[f32], acc: &mut [f32]),
    /// Activations quantized for Q4_0/Q5_0/Q8_0 weights (ggml's `quantize_row_q8_0`).
    pub quantize_q8_0: fn(&[f32], &mut [BlockQ8_0]),
    /// ... for Q4_1 weights (`quantize_row_q8_1`).
    pub quantize_q8_1: fn(&[f32], &mut [BlockQ8_1]),
    /// ... for K-quant weights (`quantize_row_q8_K_ref`).
    pub quantize_q8_k: fn(&[f32], &mut [BlockQ8K]),
    /// ggml's softmax in place ([`crate::kernels::math::softmax`]).
    pub softmax: fn(&mut [f32]),
    /// `gate[i] = silu(gate[i]) * up[i]`.
    pub silu_mul: fn(&mut [f32], &[f32]),
    /// `gate[i] = gelu(gate[i]) * up[i]`.
    pub gelu_mul: fn(&mut [f32], &[f32]),
    /// Each value rounded to f16 and back.
    pub round_f16: fn(&mut [f32]),
    /// f32 → f16 bits (round to nearest even).
    pub to_f16: fn(&[f32], &mut [u16]),
}

/// The elementwise fields of a table, from the portable build.
macro_rules! portable_elementwise {
    () => {
        Elementwise {
            axpy_f32: ew::portable::axpy_f32,
            quantize_q8_0: ew::portable::quantize_q8_0,
            quantize_q8_1: ew::portable::quantize_q8_1,
            quantize_q8_k: ew::portable::quantize_q8_k,
            softmax: ew::portable::softmax,
            silu_mul: ew::portable::silu_mul,
            gelu_mul: ew::portable::gelu_mul,
            round_f16: ew::portable::round_f16,
            to_f16: ew::portable::to_f16,
        }
    };
}

/// The elementwise fields of a table, from the AVX2 + FMA + F16C build. SAFETY (of
/// every wrapper): only in tables for variants that include those features.
#[cfg(target_arch = "x86_64")]
macro_rules! avx2_elementwise {
    () => {
        Elementwise {
            axpy_f32: |a, x, w| unsafe { ew::avx2::axpy_f32(a, x, w) },
            quantize_q8_0: |x, o| unsafe { ew::avx2::quantize_q8_0(x, o) },
            quantize_q8_1: |x, o| unsafe { ew::avx2::quantize_q8_1(x, o) },
            quantize_q8_k: |x, o| unsafe { ew::avx2::quantize_q8_k(x, o) },
            softmax: |x| unsafe { ew::avx2::softmax(x) },
            silu_mul: |g, u| unsafe { ew::avx2::silu_mul(g, u) },
            gelu_mul: |g, u| unsafe { ew::avx2::gelu_mul(g, u) },
            round_f16: |x| unsafe { ew::avx2::round_f16(x) },
            to_f16: |x, o| unsafe { ew::avx2::to_f16(x, o) },
        }
    };
}

/// The elementwise part of [`Kernels`], spliced into each table.
struct Elementwise {
    axpy_f32: fn(&mut [f32], &[f32], f32),
    quantize_q8_0: fn(&[f32], &mut [BlockQ8_0]),
    quantize_q8_1: fn(&[f32], &mut [BlockQ8_1]),
    quantize_q8_k: fn(&[f32], &mut [BlockQ8K]),
    softmax: fn(&mut [f32]),
    silu_mul: fn(&mut [f32], &[f32]),
    gelu_mul: fn(&mut [f32], &[f32]),
    round_f16: fn(&mut [f32]),
    to_f16: fn(&[f32], &mut [u16]),
}

/// Splices an [`Elementwise`] into a table literal.
macro_rules! with_elementwise {
    ($e:expr, { $($field:ident: $value:expr,)* }) => {{
        let e = $e;
        Kernels {
            $($field: $value,)*
            axpy_f32: e.axpy_f32,
            quantize_q8_0: e.quantize_q8_0,
            quantize_q8_1: e.quantize_q8_1,
            quantize_q8_k: e.quantize_q8_k,
            softmax: e.softmax,
            silu_mul: e.silu_mul,
            gelu_mul: e.gelu_mul,
            round_f16: e.round_f16,
            to_f16: e.to_f16,
        }
    }};
}

/// Checks a [`Kernels::q4_0x8`] or [`Kernels::q5_1x8`] call's slices (packed groups,
/// the inputs' blocks, their scales and their offsets or sums) and returns (blocks per
/// row, groups).
#[inline(always)]
fn x8_shape<G, A, E>(x: &[G], y: &[A], yd: &[f32], ye: &[E], n: usize, out: &[f32]) -> (usize, usize) {
    assert!(n > 0 && y.len().is_multiple_of(n), "n inputs of equal length");
    let nb = y.len() / n;
    assert!(nb > 0 && x.len().is_multiple_of(nb), "groups of the inputs' length");
    let groups = x.len() / nb;
    assert!(
        yd.len() == y.len() && ye.len() == y.len() && out.len() >= n * 8 * groups,
        "a scale and an offset or sum per input block, a cell per output"
    );
    (nb, groups)
}

/// Checks a [`Kernels::q4_kx8`] or [`Kernels::q5_kx8`] call's slices and returns
/// (blocks per row, groups).
#[inline(always)]
fn kx8_shape<G>(x: &[G], y: &[BlockQ8K], ym: &[[i32; 4]], n: usize, out: &[f32]) -> (usize, usize) {
    assert!(n > 0 && y.len().is_multiple_of(n), "n inputs of equal length");
    let nb = y.len() / n;
    assert!(nb > 0 && x.len().is_multiple_of(nb), "groups of the inputs' length");
    let groups = x.len() / nb;
    assert!(
        ym.len() == y.len() && out.len() >= n * 8 * groups,
        "min pairs per input block, a cell per output"
    );
    (nb, groups)
}

static PORTABLE: Kernels = with_elementwise!(portable_elementwise!(), {
    isa: Isa::Portable,
    q4_1: portable::dot_min_q8_1,
    q4_1x8: portable::dot_q4_1x8_q8_1,
    q5_1: portable::dot_min_q8_1,
    q5_1x8: portable::dot_q5_1x8_q8_1,
    q4_0: portable::dot_q4_0_q8_0,
    q4_0x8: portable::dot_q4_0x8_q8_0,
    q5_0: portable::dot_q5_0_blocks,
    q5_0x8: portable::dot_q5_0x8_q8_0,
    q8_0: portable::dot_q8_0_blocks,
    q8_0x8: portable::dot_q8_0x8_q8_0,
    q4_k: portable::dot_q4_k_q8_k,
    q4_kx8: portable::dot_kx8_q8_k,
    q5_kx8: portable::dot_kx8_q8_k,
    q6_k: portable::dot_q6_k_q8_k,
    q6_kx8: portable::dot_q6_kx8_q8_k,
    dot_f32: portable::dot_f32,
    dot_f16_f32: portable::dot_f16_f32,
    axpy_f16: portable::axpy_f16,
    attend_scores: attend::portable::scores,
    attend_values: attend::portable::values,
});

/// A table of safe wrappers around one x86 module's `unsafe` kernels. SAFETY (of
/// every wrapper): the table is reachable only through [`Kernels::get`], which checks
/// that the CPU has the module's features.
#[cfg(target_arch = "x86_64")]
macro_rules! x86_table {
    ($isa:expr, $m:path) => {{
        use $m as k;
        with_elementwise!(avx2_elementwise!(), {
            isa: $isa,
            q4_1: portable::dot_min_q8_1,
            q4_1x8: |x, y, yd, ys, n, o| unsafe { k::dot_q4_1x8_q8_1(x, y, yd, ys, n, o) },
            q5_1: portable::dot_min_q8_1,
            q5_1x8: |x, y, yd, ys, n, o| unsafe { k::dot_q5_1x8_q8_1(x, y, yd, ys, n, o) },
            q4_0: portable::dot_q4_0_q8_0,
            q4_0x8: |x, y, yd, yo, n, o| unsafe { k::dot_q4_0x8_q8_0(x, y, yd, yo, n, o) },
            q5_0: portable::dot_q5_0_blocks,
            q5_0x8: |x, y, yd, yo, n, o| unsafe { k::dot_q5_0x8_q8_0(x, y, yd, yo, n, o) },
            q8_0: portable::dot_q8_0_blocks,
            q8_0x8: |x, y, yd, yo, n, o| unsafe { k::dot_q8_0x8_q8_0(x, y, yd, yo, n, o) },
            q4_k: portable::dot_q4_k_q8_k,
            q4_kx8: |x, y, ym, n, o| unsafe { k::dot_q4_kx8_q8_k(x, y, ym, n, o) },
            q5_kx8: |x, y, ym, n, o| unsafe { k::dot_q5_kx8_q8_k(x, y, ym, n, o) },
            q6_k: portable::dot_q6_k_q8_k,
            q6_kx8: |x, y, ym, n, o| unsafe { k::dot_q6_kx8_q8_k(x, y, ym, n, o) },
            dot_f32: |a, b| unsafe { k::dot_f32(a, b) },
            dot_f16_f32: |a, b| unsafe { k::dot_f16_f32(a, b) },
            axpy_f16: |acc, v, w| unsafe { k::axpy_f16(acc, v, w) },
            attend_scores: |k, q, s, o| unsafe { attend::avx2::scores(k, q, s, o) },
            attend_values: |r, w, a| unsafe { attend::avx2::values(r, w, a) },
        })
    }};
}

#[cfg(target_arch = "x86_64")]
static AVX2: Kernels = x86_table!(Isa::Avx2, x86::avx2);

#[cfg(target_arch = "x86_64")]
static AVX_VNNI: Kernels = x86_table!(Isa::AvxVnni, x86::avx_vnni);

/// AVX-512: the packed groups go two to a 512-bit register where there are several
/// inputs; a one-input call (decode), a last odd group and the f32/f16 vector helpers
/// use the 256-bit kernels with EVEX `vpdpbusd` (not AVX-VNNI's VEX form, which Ice
/// Lake and Zen 4 lack).
#[cfg(target_arch = "x86_64")]
static AVX512: Kernels = {
    use avx512 as k;
    use x86::avx512_vl as v;
    with_elementwise!(avx2_elementwise!(), {
        isa: Isa::Avx512,
        q4_1: portable::dot_min_q8_1,
        q4_1x8: |x, y, yd, ys, n, o| unsafe { k::dot_q4_1x8_q8_1(x, y, yd, ys, n, o) },
        q5_1: portable::dot_min_q8_1,
        q5_1x8: |x, y, yd, ys, n, o| unsafe { k::dot_q5_1x8_q8_1(x, y, yd, ys, n, o) },
        q4_0: portable::dot_q4_0_q8_0,
        q4_0x8: |x, y, yd, yo, n, o| unsafe { k::dot_q4_0x8_q8_0(x, y, yd, yo, n, o) },
        q5_0: portable::dot_q5_0_blocks,
        q5_0x8: |x, y, yd, yo, n, o| unsafe { k::dot_q5_0x8_q8_0(x, y, yd, yo, n, o) },
        q8_0: portable::dot_q8_0_blocks,
        q8_0x8: |x, y, yd, yo, n, o| unsafe { k::dot_q8_0x8_q8_0(x, y, yd, yo, n, o) },
        q4_k: portable::dot_q4_k_q8_k,
        q4_kx8: |x, y, ym, n, o| unsafe { k::dot_q4_kx8_q8_k(x, y, ym, n, o) },
        q5_kx8: |x, y, ym, n, o| unsafe { k::dot_q5_kx8_q8_k(x, y, ym, n, o) },
        q6_k: portable::dot_q6_k_q8_k,
        q6_kx8: |x, y, ym, n, o| unsafe { k::dot_q6_kx8_q8_k(x, y, ym, n, o) },
        dot_f32: |a, b| unsafe { v::dot_f32(a, b) },
        dot_f16_f32: |a, b| unsafe { v::dot_f16_f32(a, b) },
        axpy_f16: |acc, v_, w| unsafe { v::axpy_f16(acc, v_, w) },
        attend_scores: |k, q, s, o| unsafe { attend::avx512::scores(k, q, s, o) },
        attend_values: |r, w, a| unsafe { attend::avx512::values(r, w, a) },
    })
};

impl Kernels {
    /// The table for `isa`, or `None` when this CPU cannot run it.
    pub fn get(isa: Isa) -> Option<&'static Kernels> {
        if !isa.supported() {
            return None;
        }
        Some(match isa {
            Isa::Portable => &PORTABLE,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => &AVX2,
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => &AVX_VNNI,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => &AVX512,
            #[cfg(not(target_arch = "x86_64"))]
            _ => return None,
        })
    }

    /// The table the engine uses ([`crate::kernels::isa::active`]), looked up once per
    /// process (the CPU feature checks are not repeated per matmul).
    #[inline]
    pub fn active() -> &'static Kernels {
        static ACTIVE: std::sync::OnceLock<&'static Kernels> = std::sync::OnceLock::new();
        ACTIVE.get_or_init(|| Self::get(super::isa::active()).unwrap_or(&PORTABLE))
    }
}

#[cfg(test)]
mod tests;
