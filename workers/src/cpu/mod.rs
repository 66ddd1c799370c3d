//! switchyard's own CPU inference engine: GGUF weights kept in ggml's block formats,
//! SIMD dot products with ggml's arithmetic, and model forward passes with no
//! per-token tensor allocations beyond a few scratch vectors.
//!
//! ## Layout
//! - [`quants`]: block layouts, activation quantizers, AVX2 and portable dot products.
//! - [`tensor`]: [`tensor::QMatrix`] — a weight matrix in its block format, loaded
//!   from GGUF, multiplied by prepared activations in parallel over row chunks.
//! - [`llama`]: the Llama-architecture forward pass with an f16 KV cache.

pub mod llama;
pub mod quants;
pub mod tensor;
