//! OpenTelemetry end to end: an OTLP gRPC receiver inside the test collects what
//! three processes export — this test as the client, a coordinator process and a
//! worker process — and the test checks one trace across them with the right
//! parent/child links, the GenAI span attributes, and the GenAI metrics' names, units,
//! buckets and attributes; then a disaggregated request's trace, which holds a
//! prefill worker's and a decode worker's spans.

mod common;

use common::*;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::trace::v1::Span;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing_subscriber::layer::{Layer as _, SubscriberExt};

#[derive(Clone, Default)]
struct Collected {
    traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
}

#[tonic::async_trait]
impl TraceService for Collected {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.traces.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Collected {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.metrics.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// Starts the receiver on a free port; returns its endpoint.
async fn receiver(collected: Collected) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collected.clone()))
            .add_service(MetricsServiceServer::new(collected))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{addr}")
}

fn text(kv: &[KeyValue], key: &str) -> Option<String> {
    kv.iter()
        .find(|a| a.key == key)
        .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            any_value::Value::IntValue(i) => Some(i.to_string()),
            any_value::Value::DoubleValue(d) => Some(d.to_string()),
            any_value::Value::BoolValue(b) => Some(b.to_string()),
            _ => None,
        })
}

/// The attribute's value when it was exported as an OTLP `int_value`; `Err` names the
/// type it arrived as instead (or that it is missing), so a failure shows what was sent.
fn int(kv: &[KeyValue], key: &str) -> Result<i64, String> {
    let value = kv
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.as_ref())
        .ok_or_else(|| format!("{key} missing"))?;
    match value {
        any_value::Value::IntValue(i) => Ok(*i),
        other => Err(format!("{key} exported as {other:?}, not an int_value")),
    }
}

/// Every exported span with its service name.
fn spans(c: &Collected) -> Vec<(String, Span)> {
    let mut out = Vec::new();
    for req in c.traces.lock().unwrap().iter() {
        for rs in &req.resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| text(&r.attributes, "service.name"))
                .unwrap_or_default();
            for ss in &rs.scope_spans {
                out.extend(ss.spans.iter().map(|s| (service.clone(), s.clone())));
            }
        }
    }
    out
}

/// A prompt the demo model continues by repeating it (prompt lookup's ground).
const COUNTING: &str = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_spans_client_coordinator_and_worker_with_genai_spans_and_metrics() {
    let collected = Collected::default();
    let endpoint = receiver(collected.clone()).await;
    // The child processes export here, quickly (this test binary runs only this test).
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint);
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "100");
    std::env::set_var("OTEL_METRIC_EXPORT_INTERVAL", "300");

    // This process is the client: its spans go to the same receiver.
    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .unwrap();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("telemetry-test-client")
                .build(),
        )
        .with_batch_exporter(exporter)
        .build();
    // Only the project's own spans: unfiltered, the OTLP receiver and exporter in this
    // process (tonic, h2, hyper) trace their own work, every export makes more spans to
    // export, and the flood overflows the batch queue until the spans looked for below
    // are dropped.
    let ours = tracing_subscriber::filter::filter_fn(|m| m.target().starts_with("switchyard"));
    let subscriber = tracing_subscriber::registry().with(
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("test"))
            .with_filter(ours),
    );
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let nats = nats();
    let url = nats.url();
    let mut coordinator = coordinator_proc(&url, "coordinator");
    // With prompt lookup on, and a prompt it continues by repeating itself, so the
    // generation reports speculative decoding's counts.
    let model = demo_model();
    let mut worker = switchyard(
        "w-otel",
        &[
            "--nats",
            &url,
            "worker",
            "--worker-id",
            "w-otel",
            "--heartbeat-ms",
            "200",
            "--speculative",
            "lookup",
            "--model",
            model.to_str().unwrap(),
        ],
    );
    worker.wait_for("up on", Duration::from_secs(60));
    let client = client(&url, Duration::from_secs(20)).await;
    wait_for_workers(&client, &["w-otel"], Duration::from_secs(20)).await;
    let done = client
        .generate(greedy(COUNTING, 8))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(done.tokens.len(), 8);
    // The worker's gauges read its live state (a stopped worker reports none), so wait
    // for one periodic export of them before stopping it (the export interval is 300
    // ms; a fast engine can finish the request and be told to stop before the first).
    let deadline = Instant::now() + Duration::from_secs(15);
    while !metric_names(&collected).contains("switchyard.worker.requests.in_flight") {
        assert!(Instant::now() < deadline, "the worker exported no gauges within 15 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let p = provider.clone();
    tokio::task::spawn_blocking(move || p.force_flush())
        .await
        .unwrap()
        .unwrap();
    // A gateway continues an HTTP caller's W3C trace into the NATS hops.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut gateway = switchyard("gateway", &["--nats", &url, "gateway", "--listen", &listen]);
    gateway.wait_for("gateway listening", Duration::from_secs(20));
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let answer = reqwest::Client::new()
        .post(format!("http://{listen}/v1/chat/completions"))
        .header("traceparent", format!("00-{caller_trace}-00f067aa0ba902b7-01"))
        .json(&serde_json::json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    // A disaggregated request (docs/kv-transfer.md): the decode worker has a prefill
    // worker compute the prompt, pulls its KV and streams; one trace holds both.
    let role_worker = |id: &str, role: &str| {
        let w = switchyard(
            id,
            &[
                "--nats",
                &url,
                "worker",
                "--worker-id",
                id,
                "--heartbeat-ms",
                "200",
                "--role",
                role,
                "--model",
                model.to_str().unwrap(),
            ],
        );
        w.wait_for("up on", Duration::from_secs(60));
        w
    };
    let mut prefiller = role_worker("w-prefill", "prefill");
    let mut decoder = role_worker("w-decode", "decode");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = client.status().await.unwrap();
        let formats = s
            .workers
            .iter()
            .filter(|w| w.status.worker_id.starts_with("w-") && w.status.models[0].kv_format.is_some())
            .count();
        if formats == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the workers announced no KV format within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let long: String = (0..70)
        .map(|i| format!("Entry {i}: the harbour master counted {i} boats and wrote it down.\n"))
        .collect();
    let mut req = greedy(&format!("{long}Question: how many entries?\nAnswer:"), 4);
    req.head.worker = Some("w-decode".into());
    let disagg = client.generate(req).await.unwrap().collect().await.unwrap();
    assert!(
        disagg.metrics.remote_prefill_us > 0,
        "not disaggregated: {:?}",
        disagg.metrics
    );
    assert!(disagg.metrics.pulled_tokens > 0, "nothing pulled: {:?}", disagg.metrics);
    let p = provider.clone();
    tokio::task::spawn_blocking(move || p.force_flush())
        .await
        .unwrap()
        .unwrap();
    // SIGTERM: the processes drain and flush their exporters on the way out.
    for proc in [
        &mut gateway,
        &mut worker,
        &mut prefiller,
        &mut decoder,
        &mut coordinator,
    ] {
        let status = tokio::task::block_in_place(|| proc.terminate(Duration::from_secs(20)));
        assert!(status.is_some_and(|s| s.success()), "clean exit");
    }

    // Generous: the exporters flush on exit, but a loaded 2-core CI host once took
    // over 15 s to deliver every span.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (client_span, route, generation) = loop {
        let all = spans(&collected);
        let caller = |sp: &Span| sp.trace_id.iter().map(|b| format!("{b:02x}")).collect::<String>() == caller_trace;
        let find = |service: &str, pred: &dyn Fn(&Span) -> bool| {
            all.iter()
                .find(|(s, sp)| s == service && !caller(sp) && pred(sp))
                .map(|(_, sp)| sp.clone())
        };
        // The first request (8 tokens; the disaggregated one asks 4), and its trace.
        let first = find("telemetry-test-client", &|s| {
            s.name.starts_with("text_completion") && int(&s.attributes, "gen_ai.request.max_tokens") == Ok(8)
        });
        if let Some(a) = first {
            let found = (
                find("switchyard-coordinator", &|s| {
                    s.name == "route generate" && s.trace_id == a.trace_id
                }),
                find("switchyard-worker", &|s| {
                    s.name.starts_with("text_completion ") && s.trace_id == a.trace_id
                }),
            );
            if let (Some(b), Some(c)) = found {
                break (a, b, c);
            }
        }
        assert!(
            Instant::now() < deadline,
            "spans seen: {:?}",
            all.iter().map(|(s, sp)| (s, &sp.name)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    disaggregated_trace(&collected).await;
    // The gateway's request: its span and the worker's carry the caller's trace id.
    let all = spans(&collected);
    let in_caller_trace = |service: &str| {
        all.iter().any(|(s, sp)| {
            s == service && sp.trace_id.iter().map(|b| format!("{b:02x}")).collect::<String>() == caller_trace
        })
    };
    for service in ["switchyard-gateway", "switchyard-coordinator", "switchyard-worker"] {
        assert!(in_caller_trace(service), "no {service} span in the HTTP caller's trace");
    }
    // One trace: client → coordinator → worker → prefill/decode.
    assert_eq!(route.trace_id, client_span.trace_id);
    assert_eq!(generation.trace_id, client_span.trace_id);
    assert_eq!(
        route.parent_span_id, client_span.span_id,
        "coordinator span is the client's child"
    );
    assert_eq!(
        generation.parent_span_id, route.span_id,
        "worker span is the coordinator's child"
    );
    let all = spans(&collected);
    for phase in ["queue", "prefill", "decode"] {
        let s = all
            .iter()
            .find(|(svc, s)| svc == "switchyard-worker" && s.name == phase && s.trace_id == generation.trace_id)
            .unwrap_or_else(|| panic!("no {phase} span"));
        assert_eq!(s.1.parent_span_id, generation.span_id, "{phase} under the generation");
    }
    // GenAI attributes on the worker's span.
    let a = &generation.attributes;
    assert_eq!(text(a, "gen_ai.operation.name").as_deref(), Some("text_completion"));
    assert_eq!(text(a, "gen_ai.provider.name").as_deref(), Some("switchyard"));
    assert!(text(a, "gen_ai.request.model").is_some_and(|m| m.contains("SmolLM2")));
    assert_eq!(text(a, "gen_ai.request.max_tokens").as_deref(), Some("8"));
    assert_eq!(text(a, "gen_ai.usage.output_tokens").as_deref(), Some("8"));
    assert!(text(a, "gen_ai.usage.input_tokens").is_some_and(|n| n.parse::<u32>().unwrap() > 3));
    assert_eq!(text(a, "gen_ai.response.finish_reasons").as_deref(), Some("length"));
    assert_eq!(text(a, "switchyard.worker.id").as_deref(), Some("w-otel"));
    assert_eq!(
        text(&route.attributes, "switchyard.routing.worker").as_deref(),
        Some("w-otel")
    );
    // Integer attributes are OTLP ints (GenAI conventions), not strings: dashboards
    // sum and compare them.
    let ints = |kv: &[KeyValue], keys: &[&str]| -> std::collections::BTreeMap<String, i64> {
        let (ok, bad): (Vec<_>, Vec<_>) = keys
            .iter()
            .map(|k| (k.to_string(), int(kv, k)))
            .partition(|(_, v)| v.is_ok());
        let bad: Vec<String> = bad.into_iter().map(|(_, v)| v.unwrap_err()).collect();
        assert!(
            bad.is_empty(),
            "integer span attributes not exported as int_value: {bad:#?}"
        );
        ok.into_iter().map(|(k, v)| (k, v.unwrap())).collect()
    };
    assert_eq!(
        int(&client_span.attributes, "gen_ai.request.max_tokens"),
        Ok(8),
        "the client span's max_tokens"
    );
    let g = ints(
        a,
        &[
            "gen_ai.request.max_tokens",
            "gen_ai.request.top_k",
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "switchyard.kv.cached_tokens",
            "switchyard.queue_us",
            "switchyard.speculative.draft_tokens",
            "switchyard.speculative.accepted_tokens",
        ],
    );
    let sent = greedy(COUNTING, 8).config;
    assert!(g["switchyard.speculative.draft_tokens"] > 0, "{g:?}");
    assert!(
        (1..=g["switchyard.speculative.draft_tokens"]).contains(&g["switchyard.speculative.accepted_tokens"]),
        "{g:?}"
    );
    assert_eq!(g["gen_ai.request.max_tokens"], 8);
    assert_eq!(g["gen_ai.request.top_k"], i64::from(sent.top_k));
    assert_eq!(g["gen_ai.usage.output_tokens"], 8);
    assert!(g["gen_ai.usage.input_tokens"] > 3, "{g:?}");
    assert!(
        (0..=g["gen_ai.usage.input_tokens"]).contains(&g["switchyard.kv.cached_tokens"]),
        "{g:?}"
    );
    assert!(g["switchyard.queue_us"] >= 0, "{g:?}");
    let r = ints(
        &route.attributes,
        &["switchyard.routing.attempts", "switchyard.routing.kv_blocks"],
    );
    assert_eq!(r["switchyard.routing.attempts"], 1, "{r:?}");
    assert!(r["switchyard.routing.kv_blocks"] >= 0, "{r:?}");
    for key in ["gen_ai.request.temperature", "gen_ai.request.top_p"] {
        assert!(
            matches!(
                a.iter()
                    .find(|kv| kv.key == key)
                    .and_then(|kv| kv.value.as_ref()?.value.as_ref()),
                Some(any_value::Value::DoubleValue(_))
            ),
            "{key} is a double_value"
        );
    }

    // GenAI metrics from the worker: names, units, bucket boundaries, attributes.
    let metrics = collected.metrics.lock().unwrap().clone();
    let mut seen = std::collections::BTreeMap::new();
    for req in &metrics {
        for rm in &req.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    if let Some(Data::Histogram(h)) = &m.data {
                        if let Some(dp) = h.data_points.iter().find(|dp| dp.count > 0) {
                            seen.insert(
                                m.name.clone(),
                                (m.unit.clone(), dp.explicit_bounds.clone(), dp.attributes.clone()),
                            );
                        }
                    }
                }
            }
        }
    }
    let (unit, _, attrs) = seen
        .get("gen_ai.client.operation.duration")
        .expect("the gateway records gen_ai.client.operation.duration");
    assert_eq!(unit, "s");
    assert_eq!(text(attrs, "gen_ai.operation.name").as_deref(), Some("chat"));
    for (name, unit) in [
        ("gen_ai.server.time_to_first_token", "s"),
        ("gen_ai.server.time_per_output_token", "s"),
        ("gen_ai.server.request.duration", "s"),
        ("gen_ai.client.token.usage", "{token}"),
    ] {
        let (u, bounds, attrs) = seen
            .get(name)
            .unwrap_or_else(|| panic!("no {name}; seen {:?}", seen.keys()));
        assert_eq!(u, unit, "{name}");
        assert!(!bounds.is_empty(), "{name}");
        // The client's generate or the gateway's chat.
        assert!(
            matches!(
                text(attrs, "gen_ai.operation.name").as_deref(),
                Some("text_completion" | "chat")
            ),
            "{name}"
        );
        assert_eq!(
            text(attrs, "gen_ai.provider.name").as_deref(),
            Some("switchyard"),
            "{name}"
        );
        assert!(text(attrs, "gen_ai.request.model").is_some(), "{name}");
    }
    assert_eq!(
        seen["gen_ai.server.time_to_first_token"].1,
        switchyard_workers::worker::telemetry::TTFT_BUCKETS.to_vec()
    );
    // The worker's gauges and the coordinator's routing counter, by service.
    let mut names = std::collections::BTreeSet::new();
    for req in &metrics {
        for rm in &req.resource_metrics {
            let service = rm
                .resource
                .as_ref()
                .and_then(|r| text(&r.attributes, "service.name"))
                .unwrap_or_default();
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    names.insert((service.clone(), m.name.clone(), m.unit.clone()));
                }
            }
        }
    }
    for (service, name, unit) in [
        ("switchyard-worker", "switchyard.worker.requests.in_flight", "{request}"),
        ("switchyard-worker", "switchyard.kv.slots.total", "{slot}"),
        ("switchyard-worker", "switchyard.kv.resident_tokens", "{token}"),
        ("switchyard-worker", "switchyard.kv.store.budget", "By"),
        ("switchyard-worker", "switchyard.kv.hit_ratio", "1"),
        ("switchyard-worker", "switchyard.model.weights", "By"),
        ("switchyard-worker", "switchyard.speculative.draft_tokens", "{token}"),
        ("switchyard-worker", "switchyard.speculative.accepted_tokens", "{token}"),
        ("switchyard-coordinator", "switchyard.routing.decisions", "{request}"),
    ] {
        assert!(
            names.contains(&(service.to_string(), name.to_string(), unit.to_string())),
            "{service} {name} [{unit}] not among {names:?}"
        );
    }
    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .unwrap()
        .unwrap();
}

/// The disaggregated request's trace: the decode worker's generation holds its
/// remote prefill (a client span) and its pull; the prefill worker's span is the
/// child of that client span, in the same trace.
async fn disaggregated_trace(collected: &Collected) {
    let worker_of = |sp: &Span| text(&sp.attributes, "switchyard.worker.id");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (generation, asked, served, pull) = loop {
        let all = spans(collected);
        let generation = all
            .iter()
            .find(|(_, sp)| sp.name.starts_with("text_completion ") && worker_of(sp).as_deref() == Some("w-decode"))
            .map(|(_, sp)| sp.clone());
        let in_trace = |name: &str| {
            let g = generation.as_ref()?;
            all.iter()
                .find(|(svc, sp)| svc == "switchyard-worker" && sp.name == name && sp.trace_id == g.trace_id)
                .map(|(_, sp)| sp.clone())
        };
        let found = (
            in_trace("kv prefill (remote)"),
            in_trace("kv prefill"),
            in_trace("kv pull"),
        );
        if let (Some(g), (Some(a), Some(s), Some(p))) = (generation.clone(), found) {
            break (g, a, s, p);
        }
        assert!(
            Instant::now() < deadline,
            "disaggregated spans seen: {:?}",
            all.iter()
                .map(|(s, sp)| (s, &sp.name, worker_of(sp)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        worker_of(&served).as_deref(),
        Some("w-prefill"),
        "the prefill worker's span"
    );
    assert_eq!(served.parent_span_id, asked.span_id, "the prefill is the ask's child");
    let all = spans(collected);
    // Both the ask and the pull sit under the decode worker's generation.
    for (what, sp) in [("the remote prefill", &asked), ("the pull", &pull)] {
        let mut parent = sp.parent_span_id.clone();
        let mut hops = 0;
        while parent != generation.span_id {
            let up = all
                .iter()
                .find(|(_, s)| s.span_id == parent)
                .unwrap_or_else(|| panic!("{what}: its parent span was not exported"));
            parent = up.1.parent_span_id.clone();
            hops += 1;
            assert!(hops < 8, "{what} is not under the decode worker's generation");
        }
    }
    assert_eq!(
        text(&pull.attributes, "switchyard.kv.peer").as_deref(),
        Some("w-prefill")
    );
}

/// Names of all metrics received so far.
fn metric_names(collected: &Collected) -> std::collections::BTreeSet<String> {
    let metrics = collected.metrics.lock().unwrap().clone();
    metrics
        .iter()
        .flat_map(|req| &req.resource_metrics)
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .map(|m| m.name.clone())
        .collect()
}
