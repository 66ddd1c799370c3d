//! The CPU engine's arithmetic: what a weight is stored as and how it is multiplied.
//!
//! ## Layout
//! - [`isa`]: which kernel variant this CPU runs (`avx512`, `avx-vnni`, `avx2`,
//!   `portable`), chosen once at start; `SWITCHYARD_CPU_ISA` forces one.
//! - [`simd`]: one table of dot products and elementwise steps per variant, all
//!   computing ggml's AVX2 bits.
//! - [`quants`]: 32-value block layouts, activation quantizers, dequantizers.
//! - [`kquants`]: the same for the 256-value K-quant super-blocks (Q4_K, Q6_K, Q8_K).
//! - [`team`]: keeps the rayon pool's workers awake for a forward pass's length.
//! - [`tensor`]: [`tensor::QMatrix`] — a weight matrix in its block format, loaded
//!   from GGUF, multiplied by prepared activations in parallel over row chunks.
//! - [`math`]: ggml's `expf`, SiLU and softmax, bit for bit.

pub mod isa;
pub mod kquants;
pub mod math;
pub mod quants;
pub mod simd;
pub mod team;
pub mod tensor;
