//! The Grafana dashboard against a real Prometheus: a nats-server, a coordinator, a CPU
//! worker, a `metal` worker (MLX's CPU build) and a worker that is then killed, each a
//! process serving its metrics on `telemetry.prometheus_listen`; traffic that makes
//! every metric exist (generate, chat, a batch, a session, an `overloaded` refusal, a
//! killed MLX bridge: a failed request and a restart, a lost worker); Debian's
//! `prometheus` scraping them every second; then every query of every panel of
//! `dashboards/switchyard.json`, through Prometheus' HTTP API, must return series with
//! a value.
//!
//! Skipped (with the reason printed) only when no `prometheus` binary is present
//! (scripts/setup.sh installs it; see `common::prometheus_bin`).

mod common;

use common::*;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard::{Client, GenerateRequest, Message, StreamEvent};
use switchyard_messages::session::{ContextManifest, OpenSessionRequest};

/// What the test substitutes for Grafana's variables: every model and worker (the
/// variables' "All"), a rate window of several 1 s scrapes, and a range covering the
/// whole test.
const VARIABLES: &[(&str, &str)] = &[
    ("$__rate_interval", "30s"),
    ("$__range", "5m"),
    ("$model", ".*"),
    ("$worker", ".*"),
];

/// Every `(panel title, expr)` of the dashboard, in order, rows' nested panels included.
fn dashboard_queries() -> Vec<(String, String)> {
    fn walk(panels: &[serde_json::Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    out.push((p["title"].as_str().unwrap_or("?").to_string(), expr.to_string()));
                }
            }
            walk(p["panels"].as_array().map(Vec::as_slice).unwrap_or_default(), out);
        }
    }
    let text = std::fs::read_to_string(repo().join("dashboards/switchyard.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    walk(dash["panels"].as_array().unwrap(), &mut out);
    out
}

/// `expr` with Grafana's variables replaced.
fn substitute(expr: &str) -> String {
    let mut q = expr.to_string();
    for (var, value) in VARIABLES {
        q = q.replace(var, value);
    }
    assert!(
        !q.contains('$'),
        "a Grafana variable the test does not know in {expr:?}"
    );
    q
}

/// Runs an instant query; returns the result's series (metric labels, value).
async fn query(http: &reqwest::Client, prom: &str, q: &str) -> Vec<(serde_json::Value, String)> {
    let url = reqwest::Url::parse_with_params(&format!("http://{prom}/api/v1/query"), &[("query", q)]).unwrap();
    let body: serde_json::Value = http.get(url).send().await.unwrap().json().await.unwrap();
    assert_eq!(body["status"], "success", "{q}: {body}");
    assert_eq!(body["data"]["resultType"], "vector", "{q}: {body}");
    body["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["metric"].clone(), s["value"][1].as_str().unwrap_or("").to_string()))
        .collect()
}

/// A switchyard process serving metrics on a free port; returns it and the address.
fn process(name: &str, args: &[&str], ready: &str) -> (Proc, String) {
    process_with_env(name, args, ready, &[])
}

/// [`process`] with more environment variables.
fn process_with_env(name: &str, args: &[&str], ready: &str, env: &[(&str, &str)]) -> (Proc, String) {
    let mut env = env.to_vec();
    env.push(("SWITCHYARD_TELEMETRY_PROMETHEUS_LISTEN", "127.0.0.1:0"));
    let p = switchyard_with_env(name, args, &env);
    let addr = scrape_address(&p);
    p.wait_for(ready, Duration::from_secs(90));
    (p, addr)
}

/// Starts Prometheus scraping `targets` every second; returns it and its address.
fn start_prometheus(bin: &std::path::Path, dir: &std::path::Path, targets: &[String]) -> (Proc, String) {
    let list = targets.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: switchyard\n    static_configs:\n      - targets: [{list}]\n"
        ),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", switchyard_procs::nats_server::free_port().unwrap());
    let mut cmd = std::process::Command::new(bin);
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={addr}"))
        .arg("--log.level=warn");
    (spawn_logged("prometheus", cmd), addr)
}

/// An OTLP receiver that keeps the names of the metrics it is sent (and drops spans).
#[derive(Clone, Default)]
struct OtlpNames(Arc<Mutex<BTreeSet<String>>>);

#[tonic::async_trait]
impl MetricsService for OtlpNames {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let mut names = self.0.lock().unwrap();
        for rm in &request.get_ref().resource_metrics {
            for sm in &rm.scope_metrics {
                names.extend(sm.metrics.iter().map(|m| m.name.clone()));
            }
        }
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl TraceService for OtlpNames {
    async fn export(
        &self,
        _request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Starts the receiver on a free port; returns its endpoint.
async fn otlp_receiver(names: OtlpNames) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(names.clone()))
            .add_service(MetricsServiceServer::new(names))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{addr}")
}

fn demo(prompt: &str, max_tokens: u32) -> GenerateRequest {
    let mut r = GenerateRequest::generate(Client::new_request_id(), DEMO_NAME, prompt);
    r.config.max_tokens = max_tokens;
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let Some(prometheus) = prometheus_bin() else {
        return;
    };
    let started = Instant::now();
    let queries = dashboard_queries();
    assert!(queries.len() >= 15, "{queries:?}");

    // The fleet: every process serves its metrics on a port of its own; the
    // coordinator also exports them over OTLP (both readers on one meter provider).
    let otlp = OtlpNames::default();
    let endpoint = otlp_receiver(otlp.clone()).await;
    let nats = nats();
    let url = nats.url();
    let (_coordinator, coordinator_at) = process_with_env(
        "coordinator",
        &[
            "--nats",
            &url,
            "coordinator",
            "--worker-expiry-ms",
            "1500",
            "--admission-timeout-ms",
            "2000",
        ],
        "coordinator up",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ],
    );
    let model = demo_model();
    let model = model.to_str().unwrap();
    // Capacity 1 and no queue: full with one request, so the next is refused.
    let cpu = [
        "--nats",
        &url,
        "worker",
        "--worker-id",
        "w1",
        "--heartbeat-ms",
        "200",
        "--capacity",
        "1",
        "--queue-depth",
        "0",
        "--model",
        model,
    ];
    let (_w1, w1_at) = process("w1", &cpu, "up on");
    let hf = converted_demo_model();
    let py = python();
    let (mlx1, mlx1_at) = process(
        "mlx1",
        &[
            "--nats",
            &url,
            "worker",
            "--worker-id",
            "mlx1",
            "--heartbeat-ms",
            "200",
            "--backend",
            "metal",
            "--mlx-allow-cpu",
            "--mlx-python",
            py.to_str().unwrap(),
            "--model",
            hf.to_str().unwrap(),
            "--model-name",
            "smol",
        ],
        "up on",
    );
    // A worker of its own model (so no traffic goes to it), killed below: its
    // heartbeats stop and the coordinator counts it lost.
    let (mut lost, lost_at) = process(
        "w-lost",
        &[
            "--nats",
            &url,
            "worker",
            "--worker-id",
            "w-lost",
            "--heartbeat-ms",
            "200",
            "--threads",
            "1",
            "--model",
            model,
            "--model-name",
            "lost",
        ],
        "up on",
    );
    let client = client(&url, Duration::from_secs(30)).await;
    wait_for_workers(&client, &["mlx1", "w-lost", "w1"], Duration::from_secs(20)).await;

    // Prometheus scraping all four every second, with every target healthy before
    // the traffic starts.
    let dir = tempfile::tempdir().unwrap();
    let targets = [&coordinator_at, &w1_at, &mlx1_at, &lost_at].map(|s| s.to_string());
    let (_prom, prom) = start_prometheus(&prometheus, dir.path(), &targets);
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = match http.get(format!("http://{prom}/-/ready")).send().await {
            Ok(r) if r.status().is_success() => {
                let up = query(&http, &prom, "up == 1").await;
                up.len() == targets.len()
            }
            _ => false,
        };
        if ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus did not scrape all of {targets:?} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("fleet and Prometheus up after {:.1} s", started.elapsed().as_secs_f64());

    // The lost worker: SIGKILL, and the coordinator expires it (1.5 s).
    lost.kill9();

    // Generate, chat, a batch, a session on w1.
    let done = client
        .generate(demo("The capital of France is", 8))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!((done.worker_id.as_str(), done.tokens.len()), ("w1", 8));
    let mut chat = GenerateRequest::chat(
        Client::new_request_id(),
        DEMO_NAME,
        vec![Message::new("user", "Say hello.")],
    );
    chat.config.max_tokens = 8;
    client.chat(chat).await.unwrap().collect().await.unwrap();
    let batch = client
        .batch(switchyard::BatchRequest {
            head: switchyard_messages::RequestHead::new(Client::new_request_id(), DEMO_NAME),
            prompts: vec!["One, two,".into(), "Red, green,".into()],
            config: switchyard::GenerateConfig {
                max_tokens: 4,
                ..Default::default()
            },
        })
        .await
        .unwrap();
    assert_eq!(batch.results.len(), 2);
    let session = client
        .open_session(OpenSessionRequest::new("prometheus-test", DEMO_NAME))
        .await
        .unwrap();
    let manifest = ContextManifest {
        profile: "p".into(),
        model: DEMO_NAME.into(),
        template_digest: "t".into(),
        ..ContextManifest::default()
    };
    session.ensure_prefix("You are brief.", &manifest).await.unwrap();
    session
        .prefill_suffix("\nQ: What is 2 + 2?\nA:", &manifest)
        .await
        .unwrap();
    let config = switchyard::GenerateConfig {
        max_tokens: 4,
        ..Default::default()
    };
    session.decode(config).await.unwrap().collect().await.unwrap();
    session.close().await.unwrap();

    // Overloaded: w1 is full with one request, the next is refused.
    let mut long = client.generate(demo("Once upon a time", 200)).await.unwrap();
    assert!(matches!(long.next().await, Some(Ok(StreamEvent::Tokens(_)))));
    // Sent to the worker itself (a coordinator would let it wait in the fleet queue).
    let refused = client
        .start(
            switchyard_messages::Subjects::new("sy").worker("w1", "generate"),
            demo("hi", 4),
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(switchyard::ErrorCode::Overloaded), "{refused}");
    // Through the coordinator with no time to wait: it passes through the fleet queue
    // (switchyard.queue.depth, switchyard.queue.wait) and is refused there.
    let mut now_or_never = demo("hi", 4);
    now_or_never.head.queue_ms = Some(0);
    let refused = client
        .generate(now_or_never)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(switchyard::ErrorCode::Overloaded), "{refused}");
    long.cancel().await.unwrap();
    long.collect().await.unwrap();

    // The MLX bridge killed mid-stream: the request fails (a duration with
    // error.type), the worker restarts its child (switchyard.backend.restarts).
    let mut smol = GenerateRequest::generate(Client::new_request_id(), "smol", "Once upon a time");
    smol.config.max_tokens = 200;
    let mut stream = client.generate(smol).await.unwrap();
    assert!(matches!(stream.next().await, Some(Ok(_))), "the MLX stream starts");
    assert_eq!(stream.worker_id(), "mlx1");
    let bridges = children_running(mlx1.child.id(), "mlx-bridge.py");
    assert_eq!(bridges.len(), 1, "one bridge child: {bridges:?}");
    // SAFETY: kill(2) on a child of our child, found by its parent pid just now.
    unsafe {
        libc::kill(bridges[0] as i32, libc::SIGKILL);
    }
    let failed = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match stream.next().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => break Some(e),
                None => break None,
            }
        }
    })
    .await
    .expect("the MLX stream ends after its bridge is killed");
    assert!(failed.is_some(), "the MLX stream ends with an error");

    // Fresh successes, so the rate windows hold them when the queries run.
    for prompt in ["The capital of Italy is", "One plus one is"] {
        client.generate(demo(prompt, 6)).await.unwrap().collect().await.unwrap();
    }
    eprintln!("traffic done after {:.1} s", started.elapsed().as_secs_f64());

    // Every query returns series, at least one with a number (not NaN); Prometheus
    // scrapes each second, so poll until all do.
    let deadline = Instant::now() + Duration::from_secs(45);
    let results = loop {
        // Keep a trickle of requests going: rate() over a window needs the histograms
        // to grow between scrapes, and a series' first sample already holds its
        // first observations.
        if let Ok(s) = client.generate(demo("Hello", 2)).await {
            let _ = s.collect().await;
        }
        let mut results = Vec::new();
        for (title, expr) in &queries {
            let series = query(&http, &prom, &substitute(expr)).await;
            let numbers = series
                .iter()
                .filter(|(_, v)| v.parse::<f64>().is_ok_and(f64::is_finite))
                .count();
            results.push((title.clone(), expr.clone(), series, numbers));
        }
        let missing: Vec<_> = results.iter().filter(|r| r.3 == 0).collect();
        if missing.is_empty() {
            break results;
        }
        if Instant::now() >= deadline {
            for (title, expr, series, _) in &missing {
                eprintln!("NO DATA: {title}: {expr}\n  → {series:?}");
            }
            panic!(
                "{} of {} dashboard queries returned no data",
                missing.len(),
                queries.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("panel | query | series (with a number)");
    for (title, expr, series, numbers) in &results {
        eprintln!("{title} | {expr} | {} ({numbers})", series.len());
        for (labels, value) in series {
            eprintln!("    {labels} = {value}");
        }
    }
    // OTLP export went on beside the scrape endpoint.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !otlp.0.lock().unwrap().contains("switchyard.routing.decisions") {
        assert!(
            Instant::now() < deadline,
            "the coordinator's OTLP export has no routing decisions: {:?}",
            otlp.0.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A scrape address already in use stops a process at start, naming the setting.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["--nats", &url, "coordinator"])
        .env("SWITCHYARD_TELEMETRY_PROMETHEUS_LISTEN", &coordinator_at)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("telemetry.prometheus_listen") && stderr.contains("in use"),
        "{stderr}"
    );
    eprintln!(
        "all {} dashboard queries returned data, {:.1} s after the start",
        results.len(),
        started.elapsed().as_secs_f64()
    );
}
