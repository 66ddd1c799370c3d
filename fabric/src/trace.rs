//! W3C trace context (`traceparent`, `tracestate`) across NATS hops: every hop
//! injects its current span's context into the headers it sends and continues the
//! trace from the headers it receives, so one request is one trace across client,
//! coordinator, worker and backend. Without an OpenTelemetry layer installed the
//! spans have no context and nothing is injected.

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::Context;
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct HeaderInjector<'a>(&'a mut async_nats::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

struct HeaderExtractor<'a>(&'a async_nats::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .iter()
            .filter_map(|(k, _)| std::str::from_utf8(k.as_ref()).ok())
            .collect()
    }
}

/// Writes `span`'s trace context into `headers` (replacing any from upstream).
pub fn inject(span: &tracing::Span, headers: &mut async_nats::HeaderMap) {
    let cx = span.context();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut HeaderInjector(headers)));
}

/// The trace context carried by `headers` (empty when there is none).
pub fn extract(headers: Option<&async_nats::HeaderMap>) -> Context {
    match headers {
        Some(h) => opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(h))),
        None => Context::new(),
    }
}

/// Makes `span` a child of the trace context in `headers`. Call before entering it.
pub fn continue_from(span: &tracing::Span, headers: Option<&async_nats::HeaderMap>) {
    let parent = extract(headers);
    // Fails only when no OpenTelemetry layer is installed or the span is disabled:
    // then there is no trace to continue.
    let _ = span.set_parent(parent);
}

/// An unsigned integer as a span attribute value: `i64`, saturating at `i64::MAX`.
/// tracing-opentelemetry exports `u64` (and `u32`/`usize`, which tracing widens to
/// `u64`) as *string* attributes; `i64` is exported as an OTLP `int_value`, the type the
/// GenAI semantic conventions give token counts and the like. Record every integer
/// span field through this (or `i64::from` for `u32`).
pub fn int(value: impl TryInto<i64>) -> i64 {
    value.try_into().unwrap_or(i64::MAX)
}

/// The trace context of `span` as HTTP headers (`traceparent`, `tracestate`), for
/// calls to llama.cpp servers.
pub fn http_headers(span: &tracing::Span) -> Vec<(String, String)> {
    let cx = span.context();
    let mut map = std::collections::HashMap::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut map));
    map.into_iter().collect()
}
