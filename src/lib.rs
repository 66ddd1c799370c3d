//! # switchyard — serve LLMs from a mixed fleet over NATS
//!
//! This crate is the CLI (`switchyard …`) and the client library.
//!
//! ## Layout
//! - [`client`]: [`Client`] — send a request, read the streamed answer, detect a
//!   dead worker (`worker_lost`), cancel.
//! - [`node`]: assembling coordinators and workers from a [`Config`] (what
//!   `switchyard up`, `coordinator` and `worker` run); the worker's backend comes
//!   from the registry in [`switchyard_workers::backends`].
//! - [`session`]: seed 002's sessions from the client side.
//! - [`telemetry`]: tracing and OpenTelemetry set-up for the binary.
//!
//! The benchmarks live in the binary (`src/cli/bench/`), the nats-server and
//! llama-server spawners in `switchyard-procs`.
//!
//! The path of a request: [`Client::generate`] publishes to `{p}.v1.generate` →
//! a coordinator ([`switchyard_coordinator`]) routes it → a worker
//! ([`switchyard_workers`]) streams chunks straight back to the client's inbox.

pub mod client;
pub mod gateway;
pub mod node;
pub mod session;
mod stream;
pub mod telemetry;

pub use client::{Client, ClientError, ClientOptions, Completion, ResponseStream, StreamEvent};
pub use switchyard_config::Config;
pub use switchyard_messages::{
    BatchReply, BatchRequest, ClassifyReply, ClassifyRequest, ErrorCode, FinishReason, GenerateConfig, GenerateMetrics,
    GenerateRequest, Message, Token, WireError,
};
