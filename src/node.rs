//! Assembling coordinators and workers from a [`Config`].

use crate::nats_server::cache_dir;
use anyhow::{bail, Context};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_config::Config;
use switchyard_coordinator::{CoordinatorHandle, CoordinatorOptions};
use switchyard_messages::{Backend, LoadConfig, Subjects, TextModel};
use switchyard_workers::{CpuBackend, WorkerHandle, WorkerOptions};

/// File name of the demo model that `scripts/setup.sh` installs.
pub const DEMO_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The demo model's path: `$SWITCHYARD_DEMO_MODEL`, else the cache's `models/`.
pub fn demo_model_path() -> PathBuf {
    std::env::var_os("SWITCHYARD_DEMO_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("models").join(DEMO_MODEL_FILE))
}

/// The model file a worker serves (config or the demo model).
pub fn model_path(config: &Config) -> anyhow::Result<PathBuf> {
    let path = if config.worker.model.is_empty() {
        demo_model_path()
    } else {
        PathBuf::from(&config.worker.model)
    };
    if path.is_dir() && !path.join("config.json").is_file() {
        bail!(
            "worker.model = {} is a directory without config.json (expected a GGUF file or a Hugging Face model directory)",
            path.display()
        );
    }
    if !path.is_file() && !path.is_dir() {
        if config.worker.model.is_empty() {
            bail!(
                "the demo model is not at {}; run scripts/setup.sh to install it",
                path.display()
            );
        }
        bail!("worker.model = {} does not exist", path.display());
    }
    Ok(path)
}

/// The name requests use for the model: `worker.model_name`, else the file stem (a
/// directory's whole name).
pub fn model_name(config: &Config, path: &std::path::Path) -> String {
    if !config.worker.model_name.is_empty() {
        return config.worker.model_name.clone();
    }
    let name = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    name.map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "model".into())
}

/// Loads the worker's model, printing progress to stderr.
pub async fn load_model(config: &Config) -> anyhow::Result<(Arc<dyn TextModel>, PathBuf, String)> {
    let path = model_path(config)?;
    let name = model_name(config, &path);
    let size = if path.is_dir() {
        std::fs::read_dir(&path)
            .map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    } else {
        std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0)
    };
    eprintln!("loading {} ({:.1} MB) on cpu …", path.display(), size as f64 / 1e6);
    let started = Instant::now();
    let load = LoadConfig {
        backend: config.worker.backend.clone(),
        context_len: config.worker.context_len,
        threads: config.worker.threads,
        ..LoadConfig::default()
    };
    let p = path.clone();
    let model = tokio::task::spawn_blocking(move || CpuBackend.load_model(&p, &load))
        .await
        .context("model loading task")??;
    let info = model.info();
    eprintln!(
        "loaded {name}: {} layers, hidden {}, vocab {}, context {}, {}-bit, in {:.2} s",
        info.num_layers,
        info.hidden_size,
        info.vocab_size,
        info.context_len,
        info.quant_bits,
        started.elapsed().as_secs_f64()
    );
    Ok((model, path, name))
}

/// Starts a worker for an already loaded model.
pub async fn start_worker(
    config: &Config,
    model: Arc<dyn TextModel>,
    path: PathBuf,
    name: String,
) -> anyhow::Result<WorkerHandle> {
    let nats = switchyard_actors::nats::connect(&config.nats.url, "switchyard-worker", Duration::from_secs(10)).await?;
    let worker_id = if config.worker.id.is_empty() {
        switchyard_workers::worker::default_worker_id(&config.worker.backend)
    } else {
        config.worker.id.clone()
    };
    let opts = WorkerOptions {
        worker_id,
        device: "cpu".into(),
        backend: config.worker.backend.clone(),
        model_name: name,
        model_path: path,
        subjects: Subjects::new(&config.nats.prefix),
        heartbeat: Duration::from_millis(config.worker.heartbeat_ms),
        keepalive: Duration::from_millis(config.worker.keepalive_ms),
        capacity: config.worker.capacity,
        queue_depth: config.worker.queue_depth,
    };
    WorkerHandle::start(nats, model, opts).await
}

/// Starts a coordinator.
pub async fn start_coordinator(config: &Config) -> anyhow::Result<CoordinatorHandle> {
    let nats =
        switchyard_actors::nats::connect(&config.nats.url, "switchyard-coordinator", Duration::from_secs(10)).await?;
    let opts = CoordinatorOptions {
        coordinator_id: switchyard_coordinator::default_coordinator_id(),
        subjects: Subjects::new(&config.nats.prefix),
        worker_expiry: Duration::from_millis(config.coordinator.worker_expiry_ms),
        admission_timeout: Duration::from_millis(config.coordinator.admission_timeout_ms),
        max_attempts: config.coordinator.max_attempts,
    };
    CoordinatorHandle::start(nats, opts).await
}

/// Waits for Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}
