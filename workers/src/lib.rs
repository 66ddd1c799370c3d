//! # switchyard-workers — the engine, the backends and the WorkerActor
//!
//! ## Layout
//! - [`engine`]: switchyard's own CPU inference engine — kernels, the decoder,
//!   tokenizers and templates, and the serving side (slots, batcher, KV store).
//! - [`backends`]: one folder per backend (`cpu` = the engine, `llama_cpp`,
//!   `llama_server` = `rocm` and `cuda`, `mlx` = `metal`) and the registry that picks one by priority or pin.
//! - [`worker`]: the `WorkerActor`, pinned to one device and one loaded model, with
//!   its NATS service, sessions, KV events and telemetry.
//! - [`discover`]: finding GGUF files and HF model directories on disk.
//! - [`local`]: where switchyard keeps things on this machine (cache, demo model,
//!   llama-server builds).
//!
//! A request arrives on `{p}.v1.worker.{wid}.generate` ([`worker::service`]), is
//! admitted by the worker's BatcherActor ([`worker::batcher`], bounded), runs on
//! the model's backend (for `cpu`, the engine's compute thread) and streams back as
//! numbered chunks.

pub mod backends;
pub mod discover;
pub mod engine;
pub mod local;
pub mod worker;

pub use backends::cpu::CpuBackend;
pub use engine::EngineModel;
pub use worker::{WorkerHandle, WorkerOptions};
