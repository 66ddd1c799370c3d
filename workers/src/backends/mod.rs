//! The backends a worker can serve a model with, one folder or file each, and the
//! registry that picks one (seed 000's `Backend` registry).
//!
//! ## Layout
//! - [`cpu`]: switchyard's own CPU engine ([`switchyard_engine`]).
//! - [`llama_cpp`]: an existing llama.cpp server over HTTP, and its sessions.
//! - [`llama_server`]: a llama-server this worker starts and supervises on a GPU:
//!   `rocm` (AMD) and `cuda` (NVIDIA), one supervisor parameterised by the vendor.
//! - [`cuda`]: the `cuda` entry: the engine with candle's CUDA pass (`native`) or
//!   the supervised llama-server, as `worker.cuda_engine` says.
//! - [`mlx`]: MLX (Metal on Apple silicon) through a Python bridge child.
//! - [`stage`]: the `cpu` engine's model split into pipeline stages across workers
//!   (`worker.pipeline`): the first stage's link over NATS and a later stage's service.
//! - [`backoff`]: the restart policy every supervised child (llama-server, the MLX
//!   bridge) shares.
//!
//! A worker asks the [`Registry`] for its backend: `worker.backend` pins one by name;
//! `auto` takes the most preferred one that is available here, in the preference order
//! (`metal > rocm > llama_cpp > cuda > cpu`, [`BackendKind::BY_PREFERENCE`]). Kinds
//! this build has no backend for are simply not in the registry.

pub mod backoff;
pub mod cpu;
pub mod cuda;
pub mod llama_cpp;
pub mod llama_server;
pub mod mlx;
mod registry;
pub mod stage;
pub(crate) mod worker_backend;

pub use registry::Registry;
pub use worker_backend::{Loaded, WorkerBackend};
