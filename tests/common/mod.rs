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
    let nats = nats();
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
