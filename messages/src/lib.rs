//! # switchyard-messages — the wire contract
//!
//! Everything that crosses a process boundary in switchyard is defined here, and
//! nothing here knows about tokio, NATS or actors, so any crate (or a client in any
//! language reading `docs/protocol.md`) can depend on it.
//!
//! ## Layout
//! - [`types`]: the contract's value types — [`Token`], [`Message`],
//!   [`GenerateConfig`], [`LoadConfig`], [`ModelInfo`], [`GenerateMetrics`],
//!   [`ClassifyResult`], [`BatchResult`], [`AttentionSnapshot`].
//! - [`wire`]: envelopes — [`GenerateRequest`] in, [`StreamChunk`]s out,
//!   [`Admission`] between coordinator and worker.
//! - [`fleet_view`]: [`WorkerStatus`] heartbeats (models, adapters, load, KV),
//!   [`FleetStatus`] and [`ModelsReply`].
//! - [`error`]: the closed set of [`ErrorCode`]s with their `retryable` flag.
//! - [`subjects`]: every NATS subject, under a configurable prefix.
//! - [`codec`]: MessagePack with named fields (`encode` / `decode`).
//! - [`fleet`]: [`BackendKind`] (with its preference order) and [`Device`],
//!   typed; strings on the wire.
//! - [`embed`]: embeddings requests and replies.
//! - [`kv`]: prefix blocks for KV-aware routing.
//! - [`kv_transfer`]: KV that travels between workers (formats, pulls, chunks).
//! - [`session`]: persistent sessions (open, ensure_prefix, …).
//! - [`structured`]: a generation's [`Constraint`] (JSON schema, regex, grammar)
//!   and the [`Tool`]s a chat may call, with the [`ToolCall`]s parsed out of answers.
//! - [`validate`]: what every receiver checks, against the [`InputLimits`].
//! - [`admin`]: loading and unloading a worker's LoRA adapters at run time
//!   (requests name one with [`RequestHead::adapter`]).
//!
//! A request's path: a client encodes a [`GenerateRequest`] to
//! [`Subjects::generate`]; a coordinator routes it on [`WorkerStatus`] heartbeats and
//! forwards it to [`Subjects::worker`]; the worker answers the coordinator with an
//! [`Admission`] and streams [`StreamChunk`]s straight to the client's inbox.

pub mod admin;
pub mod codec;
pub mod embed;
pub mod error;
pub mod fleet;
pub mod fleet_view;
pub mod kv;
pub mod kv_transfer;
pub mod queueing;
pub mod session;
pub mod stage;
pub mod structured;
pub mod subjects;
pub mod types;
pub mod validate;
pub mod wire;

pub use admin::{AdapterOp, AdapterReply, AdapterRequest};
pub use codec::{decode, encode, DecodeError};
pub use embed::{EmbedInput, EmbedItem, EmbedReply, EmbedRequest};
pub use error::{ErrorCode, WireError};
pub use fleet::{BackendKind, Device, UnknownBackend, UnknownDevice};
pub use fleet_view::*;
pub use kv::{KvEvent, KvHolding, KvSnapshot};
pub use kv_transfer::{KvChunk, KvFormat, KvPullRequest, KvTransferStats, PrefillReply, PrefillRequest};
pub use queueing::{Priority, QueueView};
pub use structured::{Constraint, Tool, ToolCall, ToolChoice};
pub use subjects::Subjects;
pub use types::*;
pub use validate::*;
pub use wire::*;

/// The protocol version this build speaks. Every envelope carries it as `v`; a peer
/// receiving a higher major version answers `unsupported_version`.
pub const PROTOCOL_VERSION: u32 = 1;

/// The minor version of the protocol (`docs/protocol.md` says what each changed).
/// Minor versions only add fields or tighten checks; `v` stays the major version.
/// 1.1: session calls require the owner's fence and check `v`; cancels name the
/// requester's inbox; `BatchResult.finish_reason`; input limits; a session starts
/// empty and keeps every generated token resident. 1.2: heartbeats may carry `speed`
/// ([`Heartbeat`], [`WorkerSpeed`]). 1.3: `config.constraint`, chat `tools` /
/// `tool_choice` / `parallel_tool_calls`, messages with `tool_calls` / `tool_call_id`,
/// and `tool_calls` with finish reason `tool_calls` on a stream's last chunk. 1.4:
/// fleet queueing — the head's `tenant`, `priority` and `queue_ms`, keep-alive chunks
/// from a coordinator while a request waits (the forward's `Sy-First-Seq` tells the
/// worker where its chunks' `seq` starts), `fleet_queue_us` in the final metrics,
/// `queues` in the fleet status. 1.5: speculative decoding's `draft_tokens` and
/// `accepted_tokens` in the final metrics and, summed, in `RecentLatency`. 1.6:
/// `config.fit_max_tokens` and `config.logit_bias`. 1.7: `config.logprobs` and
/// `Token.logprob` ([`TokenLogprob`]). 1.8: `ModelInfo.embedding_only` (embedding
/// models: routed embed requests only). 1.9: KV holdings ([`KvHolding`]: `precise`,
/// `holdings`, `released` in [`KvEvent`] and [`KvSnapshot`]) and the coordinator's
/// prediction of `cached_tokens` in the final metrics. 1.10: LoRA adapters — the head's
/// `adapter`, `ServedModel.adapters`, `ModelEntry.adapters`, `KvHolding.adapter`,
/// adapter-seeded prefix blocks ([`kv::adapter_blocks`]) and a worker's `adapters`
/// endpoint ([`admin`]). 1.11: KV between workers ([`kv_transfer`]) —
/// `ServedModel.kv_format`, `KvUsage.transfer`, the forward's `Sy-Kv-Peer`, the
/// `{p}.v1.kv.{wid}.pull` exchange and `pulled_tokens` in the final metrics. 1.12:
/// live hand-over of a draining worker's streams — a stream relayed to a coordinator
/// (`Sy-Stream-To` + `Sy-Handover`, answered with an [`Admission`]), `handovers` in the
/// final metrics, hand-over counters in [`KvTransferStats`]; disaggregated prefill —
/// `WorkerStatus.role`, the forward's `Sy-Kv-Prefill`, a worker's `prefill` endpoint
/// ([`PrefillRequest`] → [`PrefillReply`]), `remote_prefill_us` in the final metrics.
/// 1.13: sessions that move with their KV. 1.14: the `tail` of a KV pull (the tokens
/// past a prefix's last whole block travel too). 1.15: `config.presence_penalty` and
/// `config.frequency_penalty` (OpenAI's). 1.16: pipeline stages ([`stage`]: a model's
/// layers split across workers, `{p}.v1.stage.{pipeline}.{layer}`, `ServedModel.pipeline`).
/// 1.17: `PipelineInfo.broken`; a stage answers an empty probe with its own report.
/// 1.18: reasoning — `chat_template_kwargs` and `split_reasoning` in a generate
/// request, [`Token::reasoning`] on the tokens of a `<think>` section.
pub const PROTOCOL_MINOR: u32 = 18;
