//! Logging and, when configured, OpenTelemetry export of traces and metrics (OTLP
//! over gRPC), and a Prometheus scrape endpoint for the metrics.
//!
//! Export is on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or the signal-specific
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `…_METRICS_ENDPOINT`) is set; the exporter
//! reads the standard variables itself (`OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT`,
//! `…_COMPRESSION`, `OTEL_BSP_*`, `OTEL_METRIC_EXPORT_INTERVAL`), and the resource
//! honours `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`. A configuration the
//! exporter cannot use is an error at start, not a silent no-op.
//!
//! The scrape endpoint is on when `telemetry.prometheus_listen` (carried here as
//! [`PROMETHEUS_LISTEN_VAR`]) names a `host:port`: the same meter provider then has a
//! second reader, the OpenTelemetry Prometheus exporter, served as the text format on
//! `GET /metrics`. Names follow the OpenTelemetry collector's Prometheus translation
//! (dots to underscores, unit suffixes, `_total` on counters), so one dashboard fits
//! both paths.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{MetricExporter, SpanExporter};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer as _};

/// The variable that holds `telemetry.prometheus_listen` when [`init`] runs: the
/// config loader reads it as that field, and the binary sets it from the config file
/// when it is not set (`TelemetryConfig::as_env`).
pub const PROMETHEUS_LISTEN_VAR: &str = "SWITCHYARD_TELEMETRY_PROMETHEUS_LISTEN";

/// Installed exporters; [`Telemetry::shutdown`] flushes them.
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: SdkMeterProvider,
    scrape: Option<tokio::task::JoinHandle<()>>,
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

/// The Prometheus scrape address asked for, if any.
pub fn prometheus_listen() -> Option<String> {
    std::env::var(PROMETHEUS_LISTEN_VAR)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
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

/// Logs to stderr with `filter`; exports traces and metrics over OTLP when the
/// environment configures it; serves the metrics for Prometheus when
/// [`PROMETHEUS_LISTEN_VAR`] is set (printing where on stderr). Must run inside a
/// Tokio runtime (the gRPC exporter and the scrape endpoint start tasks there).
pub fn init(filter: &str, default_service: &str) -> anyhow::Result<Option<Telemetry>> {
    let fmt_filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("warn"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(fmt_filter);
    let otlp = export_configured();
    let listen = prometheus_listen();
    if !otlp && listen.is_none() {
        let _ = tracing_subscriber::registry().with(fmt).try_init();
        return Ok(None);
    }
    let resource = resource(default_service);
    let mut meter = SdkMeterProvider::builder().with_resource(resource.clone());
    let mut tracer = None;
    if otlp {
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
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        tracer = Some(
            SdkTracerProvider::builder()
                .with_resource(resource)
                .with_batch_exporter(spans)
                .build(),
        );
        meter = meter.with_reader(opentelemetry_sdk::metrics::PeriodicReader::builder(metrics).build());
    }
    let mut scrape = None;
    if let Some(listen) = &listen {
        let listener = bind(listen)?;
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .map_err(|e| anyhow::anyhow!("Prometheus exporter (telemetry.prometheus_listen): {e}"))?;
        meter = meter.with_reader(exporter);
        let addr = listener.local_addr()?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| anyhow::anyhow!("telemetry.prometheus_listen = {listen}: {e}"))?;
        scrape = Some(tokio::spawn(serve(listener, registry)));
        eprintln!("metrics: Prometheus scrape endpoint on http://{addr}/metrics (telemetry.prometheus_listen)");
    }
    let meter = meter.build();
    opentelemetry::global::set_meter_provider(meter.clone());
    // switchyard's own spans only: the HTTP/gRPC stack's internals would otherwise
    // trace the exporter itself.
    let otel = tracer.as_ref().map(|tracer| {
        opentelemetry::global::set_tracer_provider(tracer.clone());
        tracing_opentelemetry::layer()
            .with_tracer(tracer.tracer("switchyard"))
            .with_filter(EnvFilter::new(
            "info,h2=off,hyper=off,hyper_util=off,tonic=off,tower=off,reqwest=off,opentelemetry=off,opentelemetry_sdk=off",
        ))
    });
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the tracing subscriber: {e}"))?;
    Ok(Some(Telemetry { tracer, meter, scrape }))
}

impl Telemetry {
    /// Exports what is still queued and stops the exporters and the scrape endpoint.
    /// Blocking: call it from a blocking thread while the runtime is still alive.
    pub fn shutdown(self) {
        if let Some(scrape) = self.scrape {
            scrape.abort();
        }
        if let Some(tracer) = self.tracer {
            if let Err(e) = tracer.force_flush() {
                eprintln!("warning: flushing traces: {e}");
            }
            if let Err(e) = tracer.shutdown() {
                eprintln!("warning: stopping the trace exporter: {e}");
            }
        }
        if let Err(e) = self.meter.shutdown() {
            eprintln!("warning: stopping the metric exporter: {e}");
        }
    }
}

/// Binds the scrape endpoint now, so that a bad or busy address stops the process
/// at start with an error naming the setting.
fn bind(listen: &str) -> anyhow::Result<std::net::TcpListener> {
    use std::net::ToSocketAddrs;
    let named = format!("telemetry.prometheus_listen = {listen:?} ({PROMETHEUS_LISTEN_VAR})");
    let addrs: Vec<_> = listen
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("{named}: not a host:port to listen on ({e})"))?
        .collect();
    let listener =
        std::net::TcpListener::bind(&addrs[..]).map_err(|e| anyhow::anyhow!("{named}: cannot listen there: {e}"))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Answers scrapes until aborted: one request per connection.
async fn serve(listener: tokio::net::TcpListener, registry: prometheus::Registry) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: retry shortly, never spin.
                tracing::warn!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(10), answer(stream, &registry)).await;
        });
    }
}

/// Reads one HTTP/1.x request head and answers it: the metrics in the Prometheus text
/// format for `GET /metrics` (or `HEAD`), 404 elsewhere, 405 for other methods. The
/// connection then closes.
async fn answer(mut stream: tokio::net::TcpStream, registry: &prometheus::Registry) -> std::io::Result<()> {
    const MAX_HEAD: usize = 16 * 1024;
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"",
                true,
            )
            .await;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let with_body = method == "GET";
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let text = scrape_text(registry);
            respond(
                &mut stream,
                "200 OK",
                prometheus::TEXT_FORMAT,
                text.as_bytes(),
                with_body,
            )
            .await
        }
        ("GET" | "HEAD", _) => {
            respond(
                &mut stream,
                "404 Not Found",
                "text/plain",
                b"metrics are at /metrics\n",
                with_body,
            )
            .await
        }
        _ => respond(&mut stream, "405 Method Not Allowed", "text/plain", b"", with_body).await,
    }
}

async fn respond(
    stream: &mut tokio::net::TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
    with_body: bool,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if with_body {
        stream.write_all(body).await?;
    }
    stream.shutdown().await
}

/// The current metrics in the Prometheus text format, named as the collector names them.
fn scrape_text(registry: &prometheus::Registry) -> String {
    let mut families = registry.gather();
    for family in &mut families {
        if let Some(name) = collector_name(family.name()) {
            family.set_name(name);
        }
    }
    let mut text = String::new();
    if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut text) {
        tracing::warn!("metrics endpoint: encoding failed: {e}");
    }
    text
}

/// Unit suffixes the exporter appends (its UCUM → Prometheus table).
const UNIT_WORDS: &[&str] = &[
    "days",
    "hours",
    "minutes",
    "seconds",
    "milliseconds",
    "microseconds",
    "nanoseconds",
    "bytes",
    "kibibytes",
    "mebibytes",
    "gibibytes",
    "tibibytes",
    "kilobytes",
    "megabytes",
    "gigabytes",
    "terabytes",
    "meters",
    "volts",
    "amperes",
    "joules",
    "watts",
    "grams",
    "celsius",
    "hertz",
    "ratio",
    "percent",
];

/// The name the OpenTelemetry collector (and Prometheus' own OTLP receiver) gives a
/// metric where the exporter's differs: they add a unit suffix only when the name does
/// not already hold that word, the exporter always does (`switchyard.kv.store.bytes`
/// in `By` becomes `switchyard_kv_store_bytes`, not `…_bytes_bytes`;
/// `switchyard.kv.hit_ratio` in `1` becomes `switchyard_kv_hit_ratio`). `None` when
/// the name stands.
fn collector_name(name: &str) -> Option<String> {
    let (stem, total) = match name.strip_suffix("_total") {
        Some(stem) => (stem, "_total"),
        None => (name, ""),
    };
    let (base, unit) = stem.rsplit_once('_')?;
    (UNIT_WORDS.contains(&unit) && base.split('_').any(|t| t == unit)).then(|| format!("{base}{total}"))
}

#[cfg(test)]
mod tests {
    use super::{collector_name, scrape_text};
    use opentelemetry::metrics::MeterProvider as _;

    #[test]
    fn the_scrape_names_metrics_as_the_collector_does() {
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .unwrap();
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(exporter)
            .build();
        let m = provider.meter("switchyard");
        let _bytes = m
            .u64_observable_gauge("switchyard.kv.store.bytes")
            .with_unit("By")
            .with_callback(|o| o.observe(7, &[]))
            .build();
        let _ratio = m
            .f64_observable_gauge("switchyard.kv.hit_ratio")
            .with_unit("1")
            .with_callback(|o| o.observe(0.5, &[]))
            .build();
        let _budget = m
            .u64_observable_gauge("switchyard.kv.store.budget")
            .with_unit("By")
            .with_callback(|o| o.observe(9, &[]))
            .build();
        m.u64_counter("switchyard.routing.decisions")
            .with_unit("{request}")
            .build()
            .add(1, &[]);
        // The exporter alone repeats a unit the name already holds…
        let raw: Vec<String> = registry.gather().iter().map(|f| f.name().to_string()).collect();
        assert!(raw.contains(&"switchyard_kv_store_bytes_bytes".to_string()), "{raw:?}");
        // …the endpoint serves the collector's names.
        let text = scrape_text(&registry);
        for name in [
            "switchyard_kv_store_bytes{",
            "switchyard_kv_hit_ratio{",
            "switchyard_kv_store_budget_bytes{",
            "switchyard_routing_decisions_total{",
        ] {
            assert!(text.contains(name), "{name} not in {text}");
        }
        assert!(
            !text.contains("_bytes_bytes") && !text.contains("_ratio_ratio"),
            "{text}"
        );
    }

    #[test]
    fn a_unit_already_in_the_name_is_not_repeated() {
        assert_eq!(
            collector_name("switchyard_kv_store_bytes_bytes").as_deref(),
            Some("switchyard_kv_store_bytes")
        );
        assert_eq!(
            collector_name("switchyard_kv_hit_ratio_ratio").as_deref(),
            Some("switchyard_kv_hit_ratio")
        );
        assert_eq!(
            collector_name("x_seconds_used_seconds_total").as_deref(),
            Some("x_seconds_used_total")
        );
        for stands in [
            "switchyard_model_weights_bytes",
            "switchyard_kv_store_budget_bytes",
            "gen_ai_server_time_to_first_token_seconds",
            "switchyard_routing_decisions_total",
            "gen_ai_client_token_usage",
            "target_info",
        ] {
            assert_eq!(collector_name(stands), None, "{stands}");
        }
    }
}
