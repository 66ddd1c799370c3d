//! The `metal` backend (seed 001's `mlx_lm` backend): MLX through a Python child
//! running switchyard's bridge script over `mlx-lm`, driven in JSON Lines
//! (docs/protocol.md §14). On Apple silicon MLX runs on Metal and the worker
//! announces device `metal`; elsewhere it refuses unless `worker.mlx_allow_cpu`, and
//! then runs MLX's CPU build and announces device `cpu`.
//!
//! - `child`: one bridge process (the script ships inside the binary), its reader
//!   task, request ids, cancels; the child dies with the worker.
//! - `supervisor`: restarts the child with the shared backoff when it exits.
//! - `requests`: request bodies, base64 floats, the token stream with stop strings
//!   cut and cancels forwarded.
//! - `text_model`: the contract over the bridge (generation streaming with stop
//!   strings and cancel, prefix reuse, classify with logits, batch, the attention
//!   inspector).
//! - `session`: seed 002's sessions, each on its own prompt cache in the child.
//! - `holdings`: what the shared prompt cache holds, in routing terms (KV events).
//! - `exchange`, `kv_exchange`: KV that travels to and from peer MLX workers (the
//!   bridge's `kv_*` ops): the state, and the model's side of the exchange.
//! - `backend`: the registry entry.

mod backend;
pub mod child;
mod exchange;
mod holdings;
mod kv_exchange;
mod requests;
mod session;
pub mod supervisor;
mod text_model;

pub use backend::MlxBackend;
pub use text_model::MlxModel;
