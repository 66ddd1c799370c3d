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
