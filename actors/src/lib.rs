//! # switchyard-actors — shared actor plumbing and the NATS bridge
//!
//! ## Layout
//! - [`nats`]: connecting to NATS and publishing contract types.
//! - [`chunks`]: [`ChunkSink`], which numbers a response stream's chunks and sends
//!   keep-alives while a request waits or computes.
//! - [`process`]: child processes that die with us, free loopback ports.
//! - [`host`]: what `/proc` says (host name, available memory, resident sets).
//! - [`root`]: [`RootWatch`], which notices a worker's or coordinator's root actor
//!   ending unasked, drains its NATS connection and says why.
//! - [`cancel`]: [`CancelRegistry`] and [`Cancelled`], request id → cancel flag, fed by
//!   `{p}.v1.cancel.{request_id}`.
//!
//! Workers and coordinators (their own crates) are built from these pieces.

pub mod cancel;
pub mod chunks;
pub mod host;
pub mod nats;
pub mod process;
pub mod root;
pub mod trace;

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
