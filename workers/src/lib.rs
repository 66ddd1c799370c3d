//! # switchyard-workers — backends and the WorkerActor
//!
//! ## Layout
//! - [`candle`]: the CPU backend — GGUF on candle, tokenizer from GGUF metadata,
//!   chat template, sampling, a compute thread per model.
//! - [`discover`]: finding GGUF files and HF model directories on disk.
//! - [`worker`]: the `WorkerActor`, pinned to one device and one loaded model.
//! - [`service`]: the worker's NATS side — endpoints, admission, streaming chunks.
//!
//! A request arrives on `{p}.v1.worker.{wid}.generate` ([`service`]), is admitted
//! through the worker's bounded [`switchyard_actors::Admission`], runs on the
//! model's compute thread ([`candle::engine`]) and streams back as numbered chunks.

pub mod candle;
pub mod cpu;
pub mod discover;
pub mod kv;
pub mod llama_cpp;
pub mod llama_cpp_session;
pub mod probe;
pub mod recent;
pub mod rocm;
pub mod service;
pub mod session;
pub mod telemetry;
pub mod worker;

pub use candle::{CandleModel, CpuBackend};
pub use worker::{WorkerHandle, WorkerOptions};
