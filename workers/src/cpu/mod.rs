//! switchyard's own CPU inference engine: GGUF weights kept in ggml's block formats,
//! SIMD dot products with ggml's arithmetic, and model forward passes with no
//! per-token tensor allocations beyond a few scratch vectors.
//!
//! ## Layout
//! - [`isa`]: which kernel variant this CPU runs (`avx512`, `avx-vnni`, `avx2`,
//!   `portable`), chosen once at start; `SWITCHYARD_CPU_ISA` forces one.
//! - [`kernels`]: one table of dot products and elementwise steps per variant, all
//!   computing ggml's AVX2 bits.
//! - [`quants`]: block layouts, activation quantizers, dequantizers.
//! - [`kquants`]: the same for the 256-value K-quant super-blocks (Q4_K, Q6_K, Q8_K).
//! - [`tensor`]: [`tensor::QMatrix`] — a weight matrix in its block format, loaded
//!   from GGUF, multiplied by prepared activations in parallel over row chunks.
//! - [`math`]: ggml's `expf`, SiLU and softmax, bit for bit.
//! - [`llama`]: the forward pass (Llama, Qwen 2/3, Gemma 3) with an f16 KV cache.
//! - `attention`: causal grouped-query attention over that cache.
//! - [`hf`]: Hugging Face directories (config.json + safetensors) onto that forward pass.

mod attention;
pub mod hf;
pub mod isa;
pub mod kernels;
pub mod kquants;
pub mod llama;
pub mod math;
pub mod quants;
pub mod tensor;
