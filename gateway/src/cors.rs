//! Cross-origin requests from browsers (CORS), for the origins in
//! `gateway.cors_origins` only (none by default). A preflight (`OPTIONS` with
//! `Access-Control-Request-Method`) from an allowed origin is answered here, 204 with
//! the methods and headers a client may send; from any other origin, 403 in OpenAI's
//! error shape. Answers to an allowed origin carry `Access-Control-Allow-Origin`, so
//! its page can read them (and `Retry-After` on a 429).

use super::errors::ApiError;
use super::Gateway;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The request's `Origin` when the configuration allows it.
fn allowed(g: &Gateway, headers: &HeaderMap) -> Option<HeaderValue> {
    let origin = headers.get("origin")?;
    let text = origin.to_str().ok()?;
    g.cors_origins
        .iter()
        .any(|o| o == "*" || o.eq_ignore_ascii_case(text))
        .then(|| origin.clone())
}

pub(super) async fn cors(State(g): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let origin = allowed(&g, req.headers());
    let preflight = req.method() == Method::OPTIONS && req.headers().contains_key("access-control-request-method");
    if preflight {
        let Some(origin) = origin else {
            let from = req
                .headers()
                .get("origin")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("(none)");
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "permission_error",
                "cors_origin_not_allowed",
                format!("cross-origin requests from {from} are not allowed (gateway.cors_origins)"),
            )
            .into_response();
        };
        let asked = req
            .headers()
            .get("access-control-request-headers")
            .cloned()
            .unwrap_or(HeaderValue::from_static("authorization, content-type"));
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert("access-control-allow-origin", origin);
        h.insert(
            "access-control-allow-methods",
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert("access-control-allow-headers", asked);
        h.insert("access-control-max-age", HeaderValue::from_static("600"));
        h.insert("vary", HeaderValue::from_static("origin"));
        return r;
    }
    let mut r = next.run(req).await;
    if let Some(origin) = origin {
        let h = r.headers_mut();
        h.insert("access-control-allow-origin", origin);
        h.insert("access-control-expose-headers", HeaderValue::from_static("retry-after"));
        h.insert("vary", HeaderValue::from_static("origin"));
    }
    r
}
