//! The decoder the CPU engine runs.
//!
//! ## Layout
//! - [`llama`]: the forward pass (Llama, Qwen 2/3, Gemma 3) over prepared weights.
//! - [`params`]: the shape (hyper-parameters); [`kv_cache`]: one sequence's f16
//!   KV cache; `rope`: rotary embeddings.
//! - `attention`: causal grouped-query attention over the f16 KV cache.
//! - [`bert`]: BERT-style encoders (embedding models): bidirectional, post-norm,
//!   pooled; no KV cache.
//! - [`lora`]: LoRA adapters (PEFT, GGUF), applied per sequence in a batch.
//! - [`hf`]: Hugging Face directories (config.json + safetensors) onto that forward pass.
//! - [`forward`]: the [`forward::Forward`] trait the serving side drives: independent
//!   KV sequences (slots), batched steps, cache rows in and out.

mod attention;
pub mod bert;
pub mod forward;
pub mod hf;
pub mod kv_cache;
pub mod llama;
pub mod lora;
pub mod params;
mod rope;
pub mod stage;
