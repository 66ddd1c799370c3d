//! # switchyard — serve LLMs from a mixed fleet over NATS
//!
//! This crate is the CLI (`switchyard …`) and its telemetry set-up, with the client
//! ([`switchyard_client`]), the OpenAI gateway ([`switchyard_gateway`]) and node
//! assembly ([`switchyard_node`]) re-exported so `switchyard::Client` and
//! `switchyard::node` keep working. An application that only sends
//! requests depends on `switchyard-client` alone.
//!
//! ## Layout
//! - [`telemetry`]: tracing and OpenTelemetry set-up for the binary.
//! - [`client`], [`session`], [`gateway`], [`node`]: re-exported from their crates.
//!
//! The benchmarks are `switchyard-bench`'s (`switchyard bench …`), the nats-server
//! and llama-server spawners `switchyard-procs`'.
//!
//! The path of a request: [`Client::generate`] publishes to `{p}.v1.generate` →
//! a coordinator ([`switchyard_coordinator`]) routes it → a worker
//! ([`switchyard_workers`]) streams chunks straight back to the client's inbox.

pub use switchyard_gateway as gateway;
pub use switchyard_node as node;
pub mod telemetry;

pub use switchyard_client::{client, session};
pub use switchyard_client::{Client, ClientError, ClientOptions, Completion, ResponseStream, StreamEvent};
pub use switchyard_config::Config;
pub use switchyard_messages::{
    BatchReply, BatchRequest, ClassifyReply, ClassifyRequest, ErrorCode, FinishReason, GenerateConfig, GenerateMetrics,
    GenerateRequest, Message, Token, WireError,
};
