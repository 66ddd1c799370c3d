//! # switchyard-backend — the in-process contract every backend implements
//!
//! A worker serves whatever implements [`TextModel`]: switchyard's own engine, an
//! existing llama.cpp server, a supervised llama-server child, an MLX child. A
//! generation is a [`GenerateStream`] of [`GenerateEvent`]s ending with
//! [`GenerateEvent::Done`] or a [`BackendError`], cancelled through a [`CancelFlag`]
//! the backend checks at every token boundary. None of this crosses a process
//! boundary: the wire types are `switchyard-messages`'.
//!
//! ## Layout
//! - `contract.rs`: [`TextModel`], [`ModelSession`], [`Prompt`], [`GenerateEvent`],
//!   [`BackendError`] (and its mapping to the wire's error codes), the futures
//!   classify/embed/batch calls return.
//! - [`kv_transfer`]: [`KvTransfer`], the capability of a backend whose KV can move
//!   between workers.
//! - [`stream`]: the stream a generation returns ([`GenerateStream`]), whose
//!   consumer may hold tokens without being woken for each.

mod contract;
pub mod kv_transfer;
pub mod stream;

pub use contract::{
    collect_batch_result, BackendError, BackendFuture, BatchFuture, CancelFlag, ClassifyFuture, EmbedFuture,
    EventSender, GenerateEvent, GenerateItem, GenerateStream, InspectFuture, KvWatcher, ModelMemory, ModelSession,
    Prompt, ResidentUpdate, TextModel, ToolFormat,
};
pub use kv_transfer::{KvBlocks, KvTransfer};
