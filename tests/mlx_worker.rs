//! A `metal` worker (MLX's CPU build here, `--mlx-allow-cpu`) in a real fleet beside a
//! `cpu` worker, both serving the demo model converted to F32 safetensors: the MLX
//! worker is preferred (seed 000: metal > cpu), its greedy tokens are the CPU
//! engine's, stop strings are never emitted, and a request pinned to `cpu` goes there;
//! the bridge dies with a kill -9'd worker process; `bench mlx` runs end to end.
//! (Spill-over and restarts: tests/mlx_supervision.rs.)

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

/// LoRA on the MLX bridge: one PEFT adapter applied per request (the bridge runs
/// requests one by one and switches between them), the same greedy tokens as the CPU
/// engine with the same adapter on the same weights, unloaded at run time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metal_worker_applies_lora_adapters_as_the_cpu_engine_does() {
    use switchyard_messages::{AdapterOp, AdapterRequest, PROTOCOL_VERSION};
    let dir = converted_demo_model();
    let adapters = tempfile::tempdir().unwrap();
    let one = make_lora(adapters.path(), 1);
    let nats = nats();
    let mut config = fleet_config(&nats.url());
    config.worker.model = dir.display().to_string();
    config.worker.model_name = "smol".into();
    config.worker.adapters = vec![switchyard_config::AdapterConfig {
        name: "one".into(),
        path: one.display().to_string(),
        scale: 1.0,
    }];
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
    let mlx = switchyard::node::load(&mlx_cfg).await.expect("the MLX bridge loads");
    let mlx_worker = switchyard::node::start_worker(&mlx_cfg, &mlx).await.unwrap();
    let client = client(&nats.url(), Duration::from_secs(30)).await;
    wait_for_workers(&client, &["cpu1", "mlx1"], Duration::from_secs(10)).await;

    let ask = |backend: &str, adapter: Option<&str>| {
        let mut r = greedy("The capital of France is", 12);
        r.head.model = "smol".into();
        r.head.backend = Some(backend.into());
        r.head.adapter = adapter.map(str::to_string);
        let client = client.clone();
        async move {
            let done = client.generate(r).await?.collect().await?;
            Ok::<_, switchyard::ClientError>(done.tokens.iter().map(|t| t.id).collect::<Vec<_>>())
        }
    };
    let base = ask("metal", None).await.unwrap();
    let on_mlx = ask("metal", Some("one")).await.unwrap();
    let on_cpu = ask("cpu", Some("one")).await.unwrap();
    assert_eq!(on_mlx, on_cpu, "MLX vs the CPU engine with the same adapter, greedy");
    assert_ne!(on_mlx, base, "the adapter changes the output");
    assert_eq!(ask("metal", None).await.unwrap(), base, "the base model again after it");

    let op = |op, name: &str, path: &str| AdapterRequest {
        v: PROTOCOL_VERSION,
        op,
        name: name.into(),
        path: path.into(),
        scale: 1.0,
    };
    let e = client
        .adapters("mlx1", op(AdapterOp::Load, "bad", "/no/such/adapter"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("bad"), "{e}");
    let left = client.adapters("mlx1", op(AdapterOp::Unload, "one", "")).await.unwrap();
    assert!(left.adapters.is_empty());
    // Refused: by the worker (unknown_model) or, once its heartbeat landed, by the
    // coordinator (no metal worker holds it; cpu1 still does).
    let e = ask("metal", Some("one")).await.unwrap_err().to_string();
    assert!(e.contains("unknown_model") || e.contains("no_worker"), "{e}");
    assert_eq!(ask("metal", None).await.unwrap(), base);
    drop((mlx_worker, cpu_worker, coordinator));
}
