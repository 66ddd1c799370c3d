//! # switchyard-client — talk to a switchyard fleet over NATS
//!
//! ```no_run
//! # async fn demo() -> Result<(), switchyard_client::ClientError> {
//! use switchyard_client::{Client, GenerateRequest};
//! let client = Client::connect("nats://127.0.0.1:4222").await?;
//! let req = GenerateRequest::generate(Client::new_request_id(), "", "Once upon a time");
//! let answer = client.generate(req).await?.collect().await?;
//! println!("{}", answer.text);
//! # Ok(()) }
//! ```
//!
//! ## Layout
//! - [`client`]: [`Client`] — connect, send a request, cancel, status and models
//!   calls, embeddings, classification, batches.
//! - `stream`: [`ResponseStream`] — the numbered chunks of one answer, stall
//!   detection (`worker_lost`), resuming on another worker.
//! - [`session`]: sessions — open one through a coordinator, then talk to its
//!   worker directly.
//!
//! The path of a request: [`Client::generate`] publishes to `{p}.v1.generate` → a
//! coordinator routes it → a worker streams chunks straight back to the client's inbox.
//! The wire types are `switchyard-messages`' (re-exported here as [`messages`]).

pub mod client;
pub mod session;
mod stream;

pub use client::{Client, ClientError, ClientOptions, Completion, ResponseStream, StreamEvent};
pub use switchyard_config::NatsSecurity;
pub use switchyard_messages as messages;
pub use switchyard_messages::{
    BatchReply, BatchRequest, ClassifyReply, ClassifyRequest, ErrorCode, FinishReason, GenerateConfig, GenerateMetrics,
    GenerateRequest, Message, Token, WireError,
};
