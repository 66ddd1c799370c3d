//! Logging and, when configured, OpenTelemetry export of traces and metrics (OTLP
//! over gRPC).
//!
//! Export is on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or the signal-specific
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `…_METRICS_ENDPOINT`) is set; the exporter
//! reads the standard variables itself (`OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT`,
//! `…_COMPRESSION`, `OTEL_BSP_*`, `OTEL_METRIC_EXPORT_INTERVAL`), and the resource
//! honours `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`. A configuration the
//! exporter cannot use is an error at start, not a silent no-op.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{MetricExporter, SpanExporter};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Installed exporters; [`Telemetry::shutdown`] flushes them.
pub struct Telemetry {
    tracer: SdkTracerProvider,
    meter: SdkMeterProvider,
}

/// Whether the environment asks for OTLP export.
pub fn export_configured() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ]
    .iter()
    .any(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()))
}

/// The resource: `service.name` from `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`
/// when given, else `default_service`.
fn resource(default_service: &str) -> Resource {
    let from_env = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let mut b = Resource::builder().with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if !from_env {
        b = b.with_service_name(default_service.to_string());
    }
    b.build()
}

/// Logs to stderr with `filter`, and exports traces and metrics over OTLP when the
/// environment configures it. Must run inside a Tokio runtime (the gRPC exporter
/// starts its connection task there).
pub fn init(filter: &str, default_service: &str) -> anyhow::Result<Option<Telemetry>> {
    let fmt_filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("warn"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(fmt_filter);
    if !export_configured() {
        let _ = tracing_subscriber::registry().with(fmt).try_init();
        return Ok(None);
    }
    for key in ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] {
        if let Ok(p) = std::env::var(key) {
            if !p.is_empty() && p != "grpc" {
                anyhow::bail!("{key}={p}: this build exports OTLP over gRPC only (set it to grpc or unset it)");
            }
        }
    }
    let spans = SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|e| anyhow::anyhow!("OTLP trace exporter (OTEL_EXPORTER_OTLP_*): {e}"))?;
    let metrics = MetricExporter::builder()
        .with_tonic()
        .build()
        .map_err(|e| anyhow::anyhow!("OTLP metric exporter (OTEL_EXPORTER_OTLP_*): {e}"))?;
    let resource = resource(default_service);
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let tracer = SdkTracerProvider::builder()
        .with_resource(resource.clone())
        .with_batch_exporter(spans)
        .build();
    let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(metrics).build();
    let meter = SdkMeterProvider::builder()
        .with_resource(resource)
        .with_reader(reader)
        .build();
    opentelemetry::global::set_tracer_provider(tracer.clone());
    opentelemetry::global::set_meter_provider(meter.clone());
    // switchyard's own spans only: the HTTP/gRPC stack's internals would otherwise
    // trace the exporter itself.
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer.tracer("switchyard"))
        .with_filter(EnvFilter::new(
        "info,h2=off,hyper=off,hyper_util=off,tonic=off,tower=off,reqwest=off,opentelemetry=off,opentelemetry_sdk=off",
    ));
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the tracing subscriber: {e}"))?;
    Ok(Some(Telemetry { tracer, meter }))
}

impl Telemetry {
    /// Exports what is still queued and stops the exporters. Blocking: call it from
    /// a blocking thread while the runtime is still alive.
    pub fn shutdown(self) {
        if let Err(e) = self.tracer.force_flush() {
            eprintln!("warning: flushing traces: {e}");
        }
        if let Err(e) = self.tracer.shutdown() {
            eprintln!("warning: stopping the trace exporter: {e}");
        }
        if let Err(e) = self.meter.shutdown() {
            eprintln!("warning: stopping the metric exporter: {e}");
        }
    }
}
