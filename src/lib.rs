//! # switchyard — serve LLMs from a mixed fleet over NATS
//!
//! This crate is the CLI (`switchyard …`): node assembly and telemetry set-up, with
//! the client ([`switchyard_client`]) and the OpenAI gateway ([`switchyard_gateway`])
//! re-exported so `switchyard::Client` keeps working. An application that only sends
//! requests depends on `switchyard-client` alone.
//!
//! ## Layout
//! - [`node`]: assembling coordinators and workers from a [`Config`] (what
//!   `switchyard up`, `coordinator` and `worker` run); the worker's backend comes
//!   from the registry in [`switchyard_workers::backends`].
//! - [`telemetry`]: tracing and OpenTelemetry set-up for the binary.
//! - [`client`], [`session`], [`gateway`]: re-exported from their crates.
//!
//! The benchmarks live in the binary (`src/cli/bench/`), the nats-server and
//! llama-server spawners in `switchyard-procs`.
//!
//! The path of a request: [`Client::generate`] publishes to `{p}.v1.generate` →
//! a coordinator ([`switchyard_coordinator`]) routes it → a worker
//! ([`switchyard_workers`]) streams chunks straight back to the client's inbox.

pub use switchyard_gateway as gateway;
pub mod node;
pub mod telemetry;

pub use switchyard_client::{client, session};
pub use switchyard_client::{Client, ClientError, ClientOptions, Completion, ResponseStream, StreamEvent};
pub use switchyard_config::Config;
pub use switchyard_messages::{
    BatchReply, BatchRequest, ClassifyReply, ClassifyRequest, ErrorCode, FinishReason, GenerateConfig, GenerateMetrics,
    GenerateRequest, Message, Token, WireError,
};
