//! Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with
//! the HTTP status an OpenAI client library expects for each switchyard code.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use switchyard_messages::{ErrorCode, WireError};

/// An error answered to an HTTP client.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`,
    /// `permission_error`, `rate_limit_error`, `api_error`.
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable code: switchyard's wire code, or OpenAI's own
    /// (`invalid_api_key`, `model_not_found`, `rate_limit_exceeded`).
    pub code: String,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn bad_request(param: impl Into<Option<String>>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.into(),
            code: "bad_request".into(),
            retry_after: None,
        }
    }

    /// An error with its own status, type and code.
    pub fn new(status: StatusCode, kind: &'static str, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: code.into(),
            retry_after: None,
        }
    }

    /// With a `Retry-After` of `secs`.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs.max(1));
        self
    }

    /// A switchyard error as the status a client library expects: `bad_request`
    /// and `context_overflow` 400 (the latter with OpenAI's code
    /// `context_length_exceeded`), `unknown_model` 404, `overloaded` 429 with
    /// `Retry-After`, `no_worker`/`unavailable` 503, `deadline_exceeded` 504,
    /// `worker_lost` 502, the rest 500.
    pub fn from_wire(e: &WireError) -> Self {
        let (status, kind) = match e.code {
            ErrorCode::BadRequest | ErrorCode::ContextOverflow | ErrorCode::ReplyTooLarge => {
                (StatusCode::BAD_REQUEST, "invalid_request_error")
            }
            ErrorCode::UnknownModel => (StatusCode::NOT_FOUND, "invalid_request_error"),
            ErrorCode::Overloaded => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            ErrorCode::NoWorker | ErrorCode::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "api_error"),
            ErrorCode::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "api_error"),
            ErrorCode::WorkerLost => (StatusCode::BAD_GATEWAY, "api_error"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "api_error"),
        };
        // OpenAI's own codes where clients act on them: LangChain raises its
        // `ContextOverflowError` and litellm its `ContextWindowExceededError` on
        // `context_length_exceeded` (and then trim or fall back).
        let code = match e.code {
            ErrorCode::UnknownModel => "model_not_found",
            ErrorCode::ContextOverflow => "context_length_exceeded",
            other => other.as_str(),
        };
        let mut err = Self::new(status, kind, code, e.message.clone());
        if matches!(status, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) {
            let ms = e.retry_after_ms.unwrap_or(1000);
            err = err.retry_after(ms.div_ceil(1000));
        }
        err
    }

    /// The JSON body (also what a stream's error event carries).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert("retry-after", v);
            }
        }
        r
    }
}

impl From<switchyard_client::ClientError> for ApiError {
    fn from(e: switchyard_client::ClientError) -> Self {
        match e {
            switchyard_client::ClientError::Remote { error, .. } => Self::from_wire(&error),
            other => Self::new(
                StatusCode::BAD_GATEWAY,
                "api_error",
                "gateway_error",
                format!("the gateway could not reach the fleet: {other}"),
            ),
        }
    }
}
