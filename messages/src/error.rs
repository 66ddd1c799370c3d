//! The closed set of errors that cross the wire.
//!
//! Every failure a client can see is one [`ErrorCode`]; code that maps an internal
//! error to the wire does it in one exhaustive `match` (see `BackendError::code`), never
//! by matching strings.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What went wrong, as a stable, low-cardinality code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// The request could not be decoded or a field is invalid.
    BadRequest,
    /// The request's protocol version is newer than this peer understands.
    UnsupportedVersion,
    /// No live worker serves the named model.
    UnknownModel,
    /// The model is known but no live worker can take the request right now.
    NoWorker,
    /// The chosen worker's admission queue is full.
    Overloaded,
    /// The worker stopped answering mid-request (crash, network partition).
    WorkerLost,
    /// Prompt plus `max_tokens` does not fit the context window.
    ContextOverflow,
    /// The client cancelled the request.
    Cancelled,
    /// The request's deadline passed.
    DeadlineExceeded,
    /// The backend is temporarily unavailable (loading, restarting).
    Unavailable,
    /// The backend failed while computing.
    BackendError,
    /// A bug or an unexpected condition in switchyard itself.
    Internal,
    /// A session call from an owner the session is not bound to.
    NotOwner,
    /// The session's owner was superseded by a newer open from another owner.
    StaleFence,
    /// The session was closed (or expired, or its worker stopped).
    SessionClosed,
    /// The model type is not one this worker's backend serves.
    BackendMismatch,
    /// The answer was computed but is larger than the NATS server's `max_payload`
    /// (e.g. classify logits for many prompts); ask for less (protocol 1.1).
    ReplyTooLarge,
}

impl ErrorCode {
    /// Every code, for documentation and exhaustive tests.
    pub const ALL: [ErrorCode; 17] = [
        ErrorCode::BadRequest,
        ErrorCode::UnsupportedVersion,
        ErrorCode::UnknownModel,
        ErrorCode::NoWorker,
        ErrorCode::Overloaded,
        ErrorCode::WorkerLost,
        ErrorCode::ContextOverflow,
        ErrorCode::Cancelled,
        ErrorCode::DeadlineExceeded,
        ErrorCode::Unavailable,
        ErrorCode::BackendError,
        ErrorCode::Internal,
        ErrorCode::NotOwner,
        ErrorCode::StaleFence,
        ErrorCode::SessionClosed,
        ErrorCode::BackendMismatch,
        ErrorCode::ReplyTooLarge,
    ];

    /// Whether the same request may succeed if sent again (possibly to another worker).
    pub fn retryable(self) -> bool {
        match self {
            ErrorCode::NoWorker | ErrorCode::Overloaded | ErrorCode::WorkerLost | ErrorCode::Unavailable => true,
            ErrorCode::BadRequest
            | ErrorCode::UnsupportedVersion
            | ErrorCode::UnknownModel
            | ErrorCode::ContextOverflow
            | ErrorCode::Cancelled
            | ErrorCode::DeadlineExceeded
            | ErrorCode::BackendError
            | ErrorCode::Internal
            | ErrorCode::NotOwner
            | ErrorCode::StaleFence
            | ErrorCode::SessionClosed
            | ErrorCode::BackendMismatch
            | ErrorCode::ReplyTooLarge => false,
        }
    }

    /// The wire spelling, also used as a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::UnknownModel => "unknown_model",
            ErrorCode::NoWorker => "no_worker",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::WorkerLost => "worker_lost",
            ErrorCode::ContextOverflow => "context_overflow",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::DeadlineExceeded => "deadline_exceeded",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::BackendError => "backend_error",
            ErrorCode::Internal => "internal",
            ErrorCode::NotOwner => "not_owner",
            ErrorCode::StaleFence => "stale_fence",
            ErrorCode::SessionClosed => "session_closed",
            ErrorCode::BackendMismatch => "backend_mismatch",
            ErrorCode::ReplyTooLarge => "reply_too_large",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error as it travels: code, human message, and whether a retry may help.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct WireError {
    /// The stable code.
    pub code: ErrorCode,
    /// What happened, for people.
    pub message: String,
    /// Copy of `code.retryable()`, so clients need no table.
    pub retryable: bool,
    /// For `overloaded`: a suggested wait before retrying, milliseconds.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
}

impl WireError {
    /// An error with the given code and message; `retryable` follows the code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            retryable: code.retryable(),
            retry_after_ms: None,
        }
    }

    /// Adds a retry hint.
    pub fn with_retry_after(mut self, ms: u64) -> Self {
        self.retry_after_ms = Some(ms);
        self
    }
}
