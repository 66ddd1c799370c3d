//! The engine's integration tests, one binary with a module per area. Each runs the
//! real models `scripts/setup.sh` installs; the reference tests compare with a real
//! llama-server (and Hugging Face `transformers`) on the same weights.

mod cpu_isa;
mod gemma_tokenizer;
mod gguf_to_hf;
mod greedy_reference;
mod hf_reference;
mod holdings;
mod kv_pages;
mod llama_reference;
mod lora;
mod lora_serving;
mod pipeline;
mod qwen_reference;
mod serving;
mod sliding_window;
