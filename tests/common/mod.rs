//! Shared test fixtures of the root crate: real `switchyard` processes, in-process
//! fleets and clients, on top of `switchyard-testkit` (nats-server, models, child
//! processes, skips). Every child process is killed when its guard drops.

#![allow(dead_code)] // each test binary uses a different subset

use std::process::Command;
use std::time::{Duration, Instant};
use switchyard::{Client, ClientOptions};
use switchyard_procs::nats_server::NatsServer;
pub use switchyard_testkit::*;

/// Runs `switchyard ARGS…` as a child, collecting its output lines.
pub fn switchyard(name: &str, args: &[&str]) -> Proc {
    switchyard_with_env(name, args, &[])
}

/// [`switchyard`] with extra environment variables.
pub fn switchyard_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchyard"));
    cmd.args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "switchyard=info,warn");
    spawn_logged(name, cmd)
}

/// A worker process serving the demo model, with fast heartbeats.
pub fn worker_proc(url: &str, id: &str) -> Proc {
    let model = demo_model();
    let p = switchyard(
        id,
        &[
            "--nats",
            url,
            "worker",
            "--worker-id",
            id,
            "--heartbeat-ms",
            "200",
            "--model",
            model.to_str().unwrap(),
        ],
    );
    p.wait_for("up on", Duration::from_secs(60));
    p
}

/// A coordinator process with a short worker expiry.
pub fn coordinator_proc(url: &str, name: &str) -> Proc {
    let mut cmd_args = vec!["--nats", url, "coordinator", "--worker-expiry-ms", "1500"];
    cmd_args.push("--admission-timeout-ms");
    cmd_args.push("2000");
    let p = switchyard(name, &cmd_args);
    p.wait_for("coordinator up", Duration::from_secs(30));
    p
}

/// A client with the given stall limit.
pub async fn client(url: &str, stall: Duration) -> Client {
    let opts = ClientOptions {
        stall_timeout: stall,
        ..ClientOptions::default()
    };
    Client::connect_with(url, opts).await.expect("client connects")
}

/// Waits until the fleet lists exactly the workers in `ids`.
pub async fn wait_for_workers(client: &Client, ids: &[&str], limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(s) = client.status().await {
            let mut live: Vec<String> = s.workers.iter().map(|w| w.status.worker_id.clone()).collect();
            live.sort();
            let mut want: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
            want.sort();
            if live == want {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "fleet did not become {ids:?} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A whole fleet in this process: nats-server, a coordinator and a CPU worker
/// (actors, not child processes).
pub struct Fleet {
    pub url: String,
    pub worker: switchyard_workers::WorkerHandle,
    pub coordinator: switchyard_coordinator::CoordinatorHandle,
    pub config: switchyard::Config,
    pub nats: NatsServer,
}

/// Config for an in-process fleet on `url`, with fast heartbeats.
pub fn fleet_config(url: &str) -> switchyard::Config {
    let mut c = switchyard::Config::default();
    c.nats.url = url.to_string();
    c.worker.model = demo_model().display().to_string();
    c.worker.id = "w1".into();
    c.worker.heartbeat_ms = 200;
    c.worker.keepalive_ms = 200;
    c.coordinator.worker_expiry_ms = 1000;
    c.client.stall_timeout_ms = 5000;
    c
}

/// Starts a fleet; `tweak` adjusts the config first.
pub async fn fleet(tweak: impl FnOnce(&mut switchyard::Config)) -> Fleet {
    fleet_on(nats(), tweak).await
}

/// Starts a fleet on `nats` (e.g. one with JetStream); `tweak` adjusts the config.
pub async fn fleet_on(nats: NatsServer, tweak: impl FnOnce(&mut switchyard::Config)) -> Fleet {
    let mut config = fleet_config(&nats.url());
    tweak(&mut config);
    config.validate().expect("valid test config");
    let coordinator = switchyard::node::start_coordinator(&config).await.expect("coordinator");
    let loaded = switchyard::node::load(&config).await.expect("model loads");
    let worker = switchyard::node::start_worker(&config, &loaded).await.expect("worker");
    let deadline = Instant::now() + Duration::from_secs(10);
    while coordinator.status().await.unwrap().workers.is_empty() {
        assert!(Instant::now() < deadline, "coordinator never saw the worker");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Fleet {
        url: nats.url(),
        worker,
        coordinator,
        config,
        nats,
    }
}

impl Fleet {
    /// A client of this fleet.
    pub async fn client(&self) -> Client {
        client(&self.url, Duration::from_millis(self.config.client.stall_timeout_ms)).await
    }
}

/// A greedy generate request.
pub fn greedy(prompt: &str, max_tokens: u32) -> switchyard::GenerateRequest {
    let mut r = switchyard::GenerateRequest::generate(Client::new_request_id(), "", prompt);
    r.config.max_tokens = max_tokens;
    r
}

/// Waits until every worker's heartbeat, sent after this call, shows nothing in
/// flight or queued: routing then sees every worker free (the coordinator counts
/// requests routed since a worker's last heartbeat as load), and the workers' KV
/// events have landed.
pub async fn settle(client: &Client) {
    let before: Vec<(String, u64)> = client
        .status()
        .await
        .unwrap()
        .workers
        .iter()
        .map(|w| (w.status.worker_id.clone(), w.status.seq))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = client.status().await.unwrap();
        let fresh = s.workers.iter().all(|w| {
            w.status.in_flight + w.status.queued == 0
                && before
                    .iter()
                    .any(|(id, seq)| *id == w.status.worker_id && w.status.seq > *seq)
        });
        if fresh {
            return;
        }
        assert!(Instant::now() < deadline, "workers did not settle: {:?}", s.workers);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `host:port` a switchyard process serves its metrics on for Prometheus
/// (`telemetry.prometheus_listen`), from the line it prints at start.
pub fn scrape_address(p: &Proc) -> String {
    let line = p.wait_for("Prometheus scrape endpoint on http://", Duration::from_secs(30));
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split("/metrics").next())
        .unwrap_or_else(|| panic!("{}: no address in {line:?}", p.name));
    addr.to_string()
}

/// Asserts the fleet still answers a short greedy request with all its tokens.
pub async fn assert_serves(client: &Client, what: &str) {
    let done = client
        .generate(greedy("The capital of France is", 3))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(done.tokens.len(), 3, "{what}");
}

/// Waits until the coordinator reports `worker` as `available` (or not).
pub async fn wait_available(client: &Client, worker: &str, available: bool, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let status = client.status().await.unwrap();
        if status
            .workers
            .iter()
            .any(|w| w.status.worker_id == worker && w.status.available == available)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{worker} not available={available} within {limit:?}: {:?}",
            status.workers
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads the stream to its end and returns the error it ended with.
pub async fn ends_with_error(mut stream: switchyard::client::ResponseStream) -> switchyard::ClientError {
    loop {
        match stream.next().await {
            Some(Ok(switchyard::StreamEvent::Tokens(_))) => {}
            Some(Ok(done)) => panic!("expected an error, the stream ended with {done:?}"),
            Some(Err(e)) => return e,
            None => panic!("the stream ended without an error"),
        }
    }
}

/// About `sections` × 42 tokens of text on `topic`.
pub fn document(topic: &str, sections: usize) -> String {
    let mut doc = format!("Notes on {topic}.\n");
    for i in 1..=sections {
        doc.push_str(&format!(
            "Section {i}: the {topic} was studied from many sides, with careful records of what was seen, \
             measured and argued about by the people who cared for it over the years.\n"
        ));
    }
    doc
}

/// `prompt` for model `model`, pinned to `worker`: greedy, or sampled at temperature
/// 0.8 with `seed`; with `adapter` when given; 24 tokens. Waits until what the worker
/// holds now (KV events, heartbeat) has reached the coordinator.
pub async fn ask_pinned(
    client: &Client,
    model: &str,
    worker: &str,
    prompt: &str,
    seed: Option<u64>,
    adapter: Option<&str>,
) -> switchyard::Completion {
    let mut req = switchyard::GenerateRequest::generate(Client::new_request_id(), model, prompt);
    req.head.worker = Some(worker.into());
    req.head.adapter = adapter.map(str::to_string);
    req.config.max_tokens = 24;
    if let Some(seed) = seed {
        req.config.temperature = 0.8;
        req.config.seed = Some(seed);
    }
    let done = client.generate(req).await.unwrap().collect().await.unwrap();
    assert_eq!(done.worker_id, worker);
    settle(client).await;
    done
}

/// The token ids of a completion.
pub fn token_ids(c: &switchyard::Completion) -> Vec<u32> {
    c.tokens.iter().map(|t| t.id).collect()
}

/// The KV format `worker`'s first model announces (none yet, or none at all).
pub async fn kv_format_of(client: &Client, worker: &str) -> Option<switchyard_messages::KvFormat> {
    let s = client.status().await.ok()?;
    let w = s.workers.into_iter().find(|w| w.status.worker_id == worker)?;
    w.status.models.first()?.kv_format.clone()
}

/// Waits (up to `limit`) until every worker of `ids` announces a KV format; their
/// formats.
pub async fn wait_for_kv_formats(client: &Client, ids: &[&str], limit: Duration) -> Vec<switchyard_messages::KvFormat> {
    let deadline = Instant::now() + limit;
    loop {
        let mut all = Vec::new();
        for id in ids {
            if let Some(f) = kv_format_of(client, id).await {
                all.push(f);
            }
        }
        if all.len() == ids.len() {
            return all;
        }
        assert!(Instant::now() < deadline, "{ids:?} never all announced a KV format");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `worker`'s KV transfers so far, once the fleet view has settled.
pub async fn kv_transfer_of(client: &Client, worker: &str) -> switchyard_messages::KvTransferStats {
    settle(client).await;
    let s = client.status().await.unwrap();
    let w = s.workers.into_iter().find(|w| w.status.worker_id == worker).unwrap();
    w.status.kv.transfer
}

/// Asks `worker`'s KV source directly (no worker in between) for block 0 of `tokens`
/// in the format whose key is `format`, run with `adapter` (its key made up: an
/// adapter the source holds refuses it).
pub async fn ask_kv_chunk(
    url: &str,
    worker: &str,
    format: String,
    adapter: Option<&str>,
    tokens: Vec<u32>,
) -> switchyard_messages::KvChunk {
    let req = switchyard_messages::KvPullRequest {
        v: 1,
        transfer: switchyard_messages::kv_transfer::KV_TRANSFER_VERSION,
        request_id: "t".into(),
        format,
        adapter: adapter.map(str::to_string),
        adapter_key: adapter.map(|a| format!("{a}|1|00")),
        tokens,
        first_block: 0,
        blocks: 1,
        part: 0,
        parts: 1,
        tail: 0,
    };
    let nc = async_nats::connect(url).await.unwrap();
    let subject = switchyard_messages::Subjects::default().kv_pull(worker);
    let reply = nc
        .request(subject, switchyard_messages::encode(&req).into())
        .await
        .unwrap();
    switchyard_messages::decode(&reply.payload).unwrap()
}

/// Stops in-process workers (5 s of grace each) and their loaded models.
pub async fn stop_workers(workers: Vec<(switchyard_workers::WorkerHandle, switchyard::node::Loaded)>) {
    for (w, mut loaded) in workers {
        w.shutdown(Duration::from_secs(5)).await;
        loaded.stop();
    }
}

/// What `worker`'s KV source (of format `format`) refuses or has nothing for: KV of
/// another model, with `adapter` under a made-up key (its refusal names `needle`),
/// and tokens it never computed.
pub async fn check_kv_refusals(
    url: &str,
    worker: &str,
    format: &switchyard_messages::KvFormat,
    adapter: &str,
    needle: &str,
) {
    let refusal = |chunk: switchyard_messages::KvChunk| chunk.error.expect("refused").message;
    let other = switchyard_messages::KvFormat {
        model_sha256: "0".repeat(64),
        ..format.clone()
    };
    let why = refusal(ask_kv_chunk(url, worker, other.key(), None, vec![1; 16]).await);
    assert!(why.contains("KV format mismatch"), "{why}");
    let why = refusal(ask_kv_chunk(url, worker, format.key(), Some(adapter), vec![1; 16]).await);
    assert!(why.contains(needle), "{why}");
    let none = ask_kv_chunk(url, worker, format.key(), None, vec![7; 32]).await;
    assert!(
        none.error.is_none() && none.blocks == 0 && none.data.is_empty(),
        "{none:?}"
    );
}

/// A disaggregated answer (protocol 1.12): streamed by `w-d`, prefilled on `w-p`,
/// every whole 16-token block of the prompt pulled from there (and, `tail`, the
/// tokens past the last one: all but the prompt's last token), and the tokens `want`
/// (what a single worker answers).
pub fn assert_disaggregated(done: &switchyard::Completion, want: &[u32], what: &str, tail: bool) {
    let m = &done.metrics;
    eprintln!("{what}: {m:?}");
    assert_eq!(done.worker_id, "w-d", "the decode worker streams it");
    assert!(m.remote_prefill_us > 0, "prefilled on w-p: {m:?}");
    let pulled = match tail {
        true => m.prompt_tokens as usize - 1,
        false => (m.prompt_tokens as usize - 1) / 16 * 16,
    };
    assert_eq!(
        m.pulled_tokens as usize, pulled,
        "none computed by w-d but what it must: {m:?}"
    );
    assert_eq!(token_ids(done), want, "{what}: as a single worker answers");
}

/// Runs a client check script (`tests/python/NAME`) with `python` and `args`, and
/// returns its report (the one JSON object it prints) after asserting it exited 0
/// with no failures; the report goes to stderr for the test's log.
pub async fn run_check(python: std::path::PathBuf, name: &str, args: Vec<String>) -> serde_json::Value {
    let script = repo().join("tests/python").join(name);
    let out = tokio::task::spawn_blocking(move || Command::new(python).arg(script).args(args).output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let r: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{name}: {e}\n{stdout}\n{stderr}"));
    eprintln!("{r:#}");
    assert!(out.status.success(), "{name} failed:\n{stderr}");
    assert_eq!(r["failures"].as_array().map(Vec::len), Some(0), "{r:#}");
    r
}
