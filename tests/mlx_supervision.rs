//! Supervision of a `metal` worker's bridge child in a real fleet (MLX's CPU build
//! here), beside a `cpu` worker on the same F32 weights: a full metal worker spills to
//! the cpu worker; kill -9 of the bridge mid-stream ends that stream with a retryable
//! error, requests go to the cpu worker meanwhile, and the restarted child serves
//! again. Its own test binary: the only bridge child of this process is the one killed.

mod common;

use common::*;
use std::time::Duration;

/// Starts a fleet of a coordinator, a `cpu1` worker and an `mlx1` metal worker
/// (capacity 1, no queue: full with one request) in this process, all on the demo
/// model as F32 safetensors.
async fn mlx_and_cpu_fleet(
    nats: &switchyard_procs::nats_server::NatsServer,
) -> (
    switchyard::Client,
    Vec<switchyard_workers::WorkerHandle>,
    switchyard_coordinator::CoordinatorHandle,
) {
    let mut config = fleet_config(&nats.url());
    config.worker.model = converted_demo_model().display().to_string();
    config.worker.model_name = "smol".into();
    let coordinator = switchyard::node::start_coordinator(&config).await.unwrap();
    let mut cpu_cfg = config.clone();
    cpu_cfg.worker.id = "cpu1".into();
    cpu_cfg.worker.threads = 1;
    let cpu = switchyard::node::load(&cpu_cfg).await.unwrap();
    let cpu_worker = switchyard::node::start_worker(&cpu_cfg, &cpu).await.unwrap();
    let mut mlx_cfg = config.clone();
    mlx_cfg.worker.id = "mlx1".into();
    mlx_cfg.worker.backend = "metal".into();
    mlx_cfg.worker.mlx_allow_cpu = true;
    mlx_cfg.worker.mlx_python = python().display().to_string();
    mlx_cfg.worker.queue_depth = 0;
    let mlx = switchyard::node::load(&mlx_cfg).await.unwrap();
    let mlx_worker = switchyard::node::start_worker(&mlx_cfg, &mlx).await.unwrap();
    let client = client(&nats.url(), Duration::from_secs(30)).await;
    wait_for_workers(&client, &["cpu1", "mlx1"], Duration::from_secs(10)).await;
    (client, vec![mlx_worker, cpu_worker], coordinator)
}

fn unpinned(prompt: &str, max_tokens: u32) -> switchyard::GenerateRequest {
    let mut r = greedy(prompt, max_tokens);
    r.head.model = "smol".into();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_mlx_worker_spills_and_a_killed_bridge_comes_back() {
    let nats = nats();
    let (client, workers, coordinator) = mlx_and_cpu_fleet(&nats).await;

    // While the MLX worker (capacity 1) streams, the next request spills to cpu1.
    let mut long = client.generate(unpinned("Once upon a time", 200)).await.unwrap();
    assert!(matches!(long.next().await, Some(Ok(_))), "the long stream starts");
    assert_eq!(long.worker_id(), "mlx1");
    let spilled = client
        .generate(unpinned("The capital of France is", 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(spilled.worker_id, "cpu1", "the full metal worker is passed over");

    // kill -9 of the bridge child mid-stream: the stream ends with a retryable error
    // (never a hang), the worker restarts the child and serves again.
    let pids = children_running(std::process::id(), "mlx-bridge.py");
    assert_eq!(pids.len(), 1, "one bridge child: {pids:?}");
    // SAFETY: kill(2) on a child of this process.
    unsafe {
        libc::kill(pids[0] as i32, libc::SIGKILL);
    }
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match long.next().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => break Some(e),
                None => break None,
            }
        }
    })
    .await
    .expect("the stream ends after the kill, no hang");
    let err = ended.expect("an error, not a clean end");
    let wire = match &err {
        switchyard::ClientError::Remote { error, .. } => error.clone(),
        other => panic!("not a remote error: {other:?}"),
    };
    assert!(wire.retryable, "{wire:?}");

    // Meanwhile requests go to cpu1; then the restarted bridge takes them again.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let mut saw_cpu = false;
    loop {
        let c = client
            .generate(unpinned("The capital of France is", 3))
            .await
            .unwrap()
            .collect()
            .await
            .expect("every request is served while the bridge restarts");
        saw_cpu |= c.worker_id == "cpu1";
        if c.worker_id == "mlx1" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the MLX worker did not come back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(saw_cpu, "requests went to cpu1 while the bridge was down");
    let now = children_running(std::process::id(), "mlx-bridge.py");
    assert!(now.len() == 1 && now[0] != pids[0], "a new child: {now:?}");
    assert!(!alive(pids[0]), "the old child is gone");

    for w in workers {
        w.shutdown(Duration::from_secs(2)).await;
    }
    drop(coordinator);
}
