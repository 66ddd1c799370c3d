//! A `metal` worker (MLX's CPU build here, `--mlx-allow-cpu`) in a real fleet beside a
//! `cpu` worker, both serving the demo model converted to F32 safetensors: the MLX
//! worker is preferred (seed 000: metal > cpu), its greedy tokens are the CPU
//! engine's, stop strings are never emitted, and a request pinned to `cpu` goes there.

mod common;

use common::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metal_worker_serves_first_and_agrees_with_the_cpu_engine() {
    let dir = converted_demo_model();
    let nats = nats();
    let mut config = fleet_config(&nats.url());
    config.worker.model = dir.display().to_string();
    config.worker.model_name = "smol".into();
    let coordinator = switchyard::node::start_coordinator(&config).await.unwrap();
    let mut cpu_cfg = config.clone();
    cpu_cfg.worker.id = "cpu1".into();
    cpu_cfg.worker.threads = 1;
    let cpu = switchyard::node::load(&cpu_cfg).await.expect("cpu loads");
    let cpu_worker = switchyard::node::start_worker(&cpu_cfg, &cpu).await.unwrap();
    let mut mlx_cfg = config.clone();
    mlx_cfg.worker.id = "mlx1".into();
    mlx_cfg.worker.backend = "metal".into();
    mlx_cfg.worker.mlx_allow_cpu = true;
    mlx_cfg.worker.mlx_python = python().display().to_string();
    mlx_cfg.validate().unwrap();
    let mlx = switchyard::node::load(&mlx_cfg)
        .await
        .expect("the MLX bridge starts and loads");
    assert_eq!(mlx.device.to_string(), "cpu");
    let mlx_worker = switchyard::node::start_worker(&mlx_cfg, &mlx).await.unwrap();
    let client = client(&nats.url(), Duration::from_secs(30)).await;
    wait_for_workers(&client, &["cpu1", "mlx1"], Duration::from_secs(10)).await;

    let prompt = "The capital of France is";
    let on = |backend: Option<&str>| {
        let mut r = greedy(prompt, 12);
        r.head.model = "smol".into();
        r.head.backend = backend.map(str::to_string);
        r
    };
    let first = client.generate(on(None)).await.unwrap().collect().await.unwrap();
    assert_eq!(first.worker_id, "mlx1", "metal is preferred");
    let pinned = client.generate(on(Some("cpu"))).await.unwrap().collect().await.unwrap();
    assert_eq!(pinned.worker_id, "cpu1");
    let ids = |c: &switchyard::Completion| c.tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(&first), ids(&pinned), "MLX vs the CPU engine, greedy");
    assert!(first.text.contains("Paris"), "{}", first.text);

    // A stop string is cut and never emitted.
    let mut stop = on(Some("metal"));
    stop.config.stop = vec!["answer".into()];
    let cut = client.generate(stop).await.unwrap().collect().await.unwrap();
    assert!(!cut.text.contains("answer"), "{:?}", cut.text);
    assert_eq!(cut.finish_reason, switchyard::FinishReason::Stop);

    mlx_worker.shutdown(Duration::from_secs(2)).await;
    cpu_worker.shutdown(Duration::from_secs(2)).await;
    drop(coordinator);
}

/// Pids of the processes whose parent is `parent` and whose command line has `needle`.
fn children_running(parent: u32, needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid …; comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if ppid == Some(parent) && String::from_utf8_lossy(&cmdline).contains(needle) {
            out.push(pid);
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    // A zombie has no command line left; count only live processes.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_dies_with_its_worker_even_on_kill_9() {
    let nats = nats();
    let dir = converted_demo_model();
    let py = python();
    let mut worker = switchyard(
        "mlx-worker",
        &[
            "--nats",
            &nats.url(),
            "worker",
            "--worker-id",
            "m1",
            "--backend",
            "metal",
            "--mlx-allow-cpu",
            "--mlx-python",
            py.to_str().unwrap(),
            "--model",
            dir.to_str().unwrap(),
        ],
    );
    worker.wait_for("up on", Duration::from_secs(120));
    let pids = children_running(worker.child.id(), "mlx-bridge.py");
    assert_eq!(pids.len(), 1, "{pids:?}");
    worker.kill9();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive(pids[0]) {
        assert!(
            std::time::Instant::now() < deadline,
            "the bridge outlived its kill -9'd worker"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bench_mlx_prints_both_sides_and_the_ratio() {
    let dir = converted_demo_model();
    let py = python();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["bench", "mlx", "--runs", "1", "--max-tokens", "6", "--threads", "1"])
        .args(["--model", dir.to_str().unwrap(), "--mlx-python", py.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "mlx-lm direct",
        "decode tok/s",
        "prefill tok/s",
        "time to first token",
        "bridge + fabric cost",
    ] {
        assert!(stdout.contains(needle), "no {needle:?} in:\n{stdout}");
    }
}
