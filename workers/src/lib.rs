//! # switchyard-workers — the backends and the WorkerActor
//!
//! ## Layout
//! - [`engine`]: `switchyard-engine` re-exported — switchyard's own inference
//!   engine, which the `cpu` and native `cuda` backends serve.
//! - [`backends`]: one folder per backend (`cpu` = the engine, `llama_cpp`,
//!   `llama_server` = `rocm` and `cuda`, `mlx` = `metal`) and the registry that picks one by priority or pin.
//! - [`worker`]: the `WorkerActor`, pinned to one device and one loaded model, with
//!   its NATS service, sessions, KV events and telemetry.
//! - [`discover`]: finding GGUF files and HF model directories on disk.
//! - [`local`]: where switchyard keeps things on this machine (cache, demo model,
//!   llama-server builds).
//!
//! A request arrives on `{p}.v1.worker.{wid}.generate` ([`worker::service`]), is
//! admitted by the worker's bounded counter ([`worker::admission`]), runs on
//! the model's backend (for `cpu`, the engine's compute thread) and streams back as
//! numbered chunks.

pub mod backends;
pub mod discover;
pub use switchyard_engine as engine;
pub mod local;
pub mod worker;

pub use backends::cpu::CpuBackend;
pub use engine::EngineModel;
pub use worker::{WorkerHandle, WorkerOptions};
