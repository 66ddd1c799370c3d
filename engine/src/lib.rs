//! # switchyard-engine — switchyard's own inference engine
//!
//! GGUF (and Hugging Face safetensors) models computed by
//! our own kernels, served from one compute thread per loaded model with continuous
//! batching, KV slots and a KV block store. (candle is only the GGUF file reader.)
//!
//! ## Layout
//! - [`kernels`]: the arithmetic — block formats, SIMD dot products per CPU variant,
//!   weight matrices, ggml's math.
//! - [`model`]: the decoder (Llama, Qwen 2/3, Gemma 3), its KV cache and RoPE,
//!   attention, Hugging Face directories, and the [`model::forward::Forward`] trait
//!   the serving side drives.
//! - [`encoder`]: embedding models (BERT-style encoders), which only embed.
//! - [`text`]: tokenizers (GGUF vocabularies as BPE or SentencePiece, streaming
//!   decode) and chat templates.
//! - The serving side: [`compute`] (the compute thread's state: slots, jobs,
//!   sessions), [`batcher`] (continuous batching on that thread), [`block_store`] (KV
//!   blocks kept after slots are overwritten), [`sampler`], [`constraint`] (JSON
//!   schema / regex / grammar masks per sequence), [`stops`], [`session`],
//!   [`holdings`] (what the slots hold, in the routing key's terms, for KV events),
//!   [`adapters`] (the LoRA adapters a model serves; applied per sequence by
//!   [`model::lora`]), [`kv_transfer`] (KV read out for peers and taken in from
//!   them, under a compatibility key), [`pipeline`] (a model split into layer
//!   ranges across workers: the first stage as a `Forward`, a later stage's server).
//!
//! - [`EngineModel`] (`handle.rs`): the handle on a loaded model, which implements
//!   the backend contract; `load.rs`: GGUF and Hugging Face loading.
//!
//! [`EngineModel::load`] reads the GGUF once, builds the tokenizer and the template,
//! and starts the compute thread; [`EngineModel::generate`] sends it a job and
//! returns its events as a stream. The workers' `cpu` backend serves it, and their
//! native `cuda` backend serves it on candle's CUDA device ([`ForwardPass::Candle`]).

pub mod adapters;
pub mod batcher;
pub mod block_store;
pub mod candle;
pub mod chunking;
pub mod compute;
pub mod constraint;
pub mod encoder;
mod handle;
pub mod holdings;
pub mod kernels;
pub mod kv_transfer;
mod load;
pub mod model;
mod passes;
pub mod pipeline;
pub mod pooling;
mod reuse;
pub mod sampler;
pub mod session;
pub mod speculate;
pub mod stops;
pub mod text;

/// Context positions a model gets when `LoadConfig.context_len` is 0.
pub const DEFAULT_CONTEXT: usize = 8192;

/// KV slots (sequences decoded together) when `LoadConfig.parallel_slots` is 0.
/// Each slot's cache is reserved for the whole context but committed only as
/// positions are written.
pub const DEFAULT_SLOTS: usize = 4;

/// Architectures this backend runs.
pub const SUPPORTED_ARCHITECTURES: &[&str] = model::llama::ARCHITECTURES;

/// The plain prompts (text and code) the engine's numerics are checked on: against
/// llama.cpp (engine/tests/engine/greedy_reference.rs) and, by `switchyard bench
/// agree`, the candle pass against this engine.
pub const REFERENCE_PROMPTS: &[&str] = &[
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "Question: What is 12 times 7?\nAnswer:",
    "The three primary colors are",
    "import numpy as np\n\ndef softmax(x):",
    "In 1969, Neil Armstrong",
];

/// Which forward pass computes a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardPass {
    /// switchyard's own CPU kernels ([`model::forward::CpuForward`]).
    Own,
    /// candle on a device ([`candle::CandleForward`]); `gpu_layers` as llama.cpp's
    /// `-ngl` (-1 = all).
    Candle {
        placement: candle::Placement,
        gpu_layers: i32,
    },
}

pub use handle::EngineModel;
pub use load::load_model;
