//! The `metal` backend (seed 001's `mlx_lm` backend): MLX through a Python child
//! running switchyard's bridge script over `mlx-lm`, driven in JSON Lines
//! (docs/protocol.md §14). On Apple silicon MLX runs on Metal and the worker
//! announces device `metal`; elsewhere it refuses unless `worker.mlx_allow_cpu`, and
//! then runs MLX's CPU build and announces device `cpu`.
//!
//! - `child`: the bridge process (the script ships inside the binary), its reader
//!   task, request ids, cancels; the child dies with the worker.
//! - `text_model`: the contract over the bridge (generation streaming with stop
//!   strings and cancel, classify, batch).
//! - `backend`: the registry entry.
//!
//! Not built yet (issue 13): restarting the child with backoff, prompt-cache reuse
//! and sessions, logits, the attention inspector, batched concurrency.

mod backend;
pub mod child;
mod text_model;

pub use backend::MlxBackend;
pub use text_model::MlxModel;
