//! # switchyard-fabric — what every process on the NATS fabric shares
//!
//! Workers, coordinators, the gateway and the client library connect to NATS,
//! propagate trace context and size their messages the same way; the services
//! also share the chunk sink, cancellation and the root-actor watch. No actors
//! live here: they are in `switchyard-workers` and `switchyard-coordinator`.
//!
//! ## Layout
//! - [`nats`]: connecting to NATS (with the configured security), publishing
//!   contract types, the endpoint loop, message-size checks.
//! - [`trace`]: W3C trace context into and out of NATS headers.
//! - [`chunks`]: [`ChunkSink`], which numbers a response stream's chunks and sends
//!   keep-alives while a request waits or computes.
//! - [`process`]: child processes that die with us, free loopback ports.
//! - [`host`]: what `/proc` says (host name, available memory, resident sets).
//! - [`root`]: [`RootWatch`], which notices a worker's or coordinator's root actor
//!   ending unasked, drains its NATS connection and says why.
//! - [`cancel`]: [`CancelRegistry`] and [`Cancelled`], request id → cancel flag, fed by
//!   `{p}.v1.cancel.{request_id}`.
//! - [`transfer`]: chunked request/reply transfers between two processes (a window
//!   of requests outstanding, every reply digest-checked), for KV between workers.
//!

pub mod cancel;
pub mod chunks;
pub mod host;
pub mod nats;
pub mod process;
pub mod root;
pub mod trace;
pub mod transfer;

pub use cancel::{CancelRegistry, Cancelled};
pub use chunks::ChunkSink;
pub use root::RootWatch;

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The message of a caught panic.
pub fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
