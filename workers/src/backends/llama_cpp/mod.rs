//! A model served by an llama.cpp server that already runs (go-ml's adapter): every
//! call goes to the server's own HTTP API.
//!
//! - `generate`: streaming `/completion` (SSE) with `return_tokens`, so each event
//!   carries token ids; every `GenerateConfig` field maps onto llama.cpp's sampling
//!   parameters (`n_predict`, `temperature`, `top_k`, `top_p`, `min_p`,
//!   `repeat_penalty`, `repeat_last_n`, `seed`, `stop`). Stop token ids, which the
//!   server has no parameter for, are applied here: the stream ends before the token,
//!   and dropping the response makes the server stop generating.
//! - Chat prompts are rendered by the server's own template (`/apply-template`).
//! - Constraints: JSON schemas go to the server as `json_schema`; what its converter
//!   would not enforce is refused before admission ([`constraint`]).
//! - `classify`: one-token completions with `n_probs`, concurrently (the server
//!   spreads them over its slots).
//! - KV holdings: what each server slot (and llama-server's prompt cache) holds,
//!   followed from the completions' `id_slot` ([`holdings`]).
//! - KV exchange with peers (a server this worker supervises): slots saved and
//!   restored as files, cut into the exchange's blocks ([`kv_exchange`], [`slot_state`]).
//! - LoRA adapters: those the server loaded at start (`--lora`), applied per request
//!   ([`adapters`]).
//! - `info`: `/props` (context size); metrics from each completion's `timings`.
//! - Health: a background loop asks `/health` four times a second; a failed request
//!   or a failed check marks the model unhealthy (the worker then refuses requests as
//!   retryable `unavailable` and its heartbeat says `available: false`), and the first
//!   good check with the same model behind it marks it healthy again.
//!
//! The `rocm` and `cuda` backends ([`crate::backends::llama_server`]) serve through this
//! same type, pointed at the llama-server child they supervise.

pub mod adapters;
mod backend;
pub mod body;
pub mod client;
pub mod constraint;
mod exchange;
pub mod holdings;
mod kv_exchange;
pub mod session;
pub mod slot_state;
mod text_model;

pub(crate) use backend::served;
pub use backend::LlamaCppBackend;
pub use body::completion_body;
pub use client::{LlamaCppModel, ServerProps};
