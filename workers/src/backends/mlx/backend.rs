//! The `metal` entry of the registry.

use super::child::BridgeOptions;
use super::supervisor::Supervised;
use super::text_model::MlxModel;
use crate::backends::worker_backend::{capacity, Loaded, WorkerBackend};
use crate::local;
use futures::future::BoxFuture;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_backend::TextModel;
use switchyard_config::WorkerConfig;
use switchyard_messages::{BackendKind, Device};

/// MLX through the Python bridge (registry name `metal`).
#[derive(Debug, Default, Clone, Copy)]
pub struct MlxBackend;

/// Apple silicon: macOS on arm64.
fn apple_silicon() -> bool {
    cfg!(all(target_os = "macos", target_arch = "aarch64"))
}

/// The Python to run the bridge with: `worker.mlx_python`, else the cache's venv.
fn python(w: &WorkerConfig) -> PathBuf {
    if w.mlx_python.is_empty() {
        local::cache_dir().join("venv/bin/python")
    } else {
        PathBuf::from(&w.mlx_python)
    }
}

impl WorkerBackend for MlxBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Metal
    }

    fn summary(&self) -> &'static str {
        "MLX through a supervised Python bridge (mlx-lm), on a Hugging Face directory"
    }

    fn available(&self, w: &WorkerConfig) -> Result<(), String> {
        if !apple_silicon() && !w.mlx_allow_cpu {
            return Err("no Apple GPU here (worker.mlx_allow_cpu runs MLX on the CPU)".into());
        }
        if !python(w).is_file() {
            return Err(format!("no Python at {} (worker.mlx_python)", python(w).display()));
        }
        Ok(())
    }

    fn load<'a>(&'a self, w: &'a WorkerConfig, worker_id: &'a str) -> BoxFuture<'a, anyhow::Result<Loaded>> {
        Box::pin(async move {
            self.available(w).map_err(|e| anyhow::anyhow!("backend metal: {e}"))?;
            let path = local::model_path(w)?;
            if !path.is_dir() {
                anyhow::bail!(
                    "backend metal: worker.model = {} is not a Hugging Face directory (MLX loads config.json + safetensors; scripts/gguf-to-hf.py converts a GGUF)",
                    path.display()
                );
            }
            let device = if apple_silicon() { "gpu" } else { "cpu" };
            eprintln!(
                "starting the MLX bridge ({}) for {} on {device} …",
                python(w).display(),
                path.display()
            );
            let started = Instant::now();
            let opts = BridgeOptions {
                python: python(w),
                cache: local::cache_dir(),
                model: path.clone(),
                device: device.into(),
                max_sessions: w.parallel_slots.max(8),
                startup_timeout: Duration::from_secs(300),
            };
            let (bridge, info) = Supervised::start(opts, worker_id.to_string()).await?;
            let model = MlxModel::new(bridge, &info, &path);
            match info["kv_why"].as_str() {
                Some(why) => tracing::info!("no KV exchange for this MLX model: {why}"),
                None => model.enable_kv_exchange(path.clone()),
            }
            eprintln!(
                "MLX loaded {} in {:.2} s",
                path.display(),
                started.elapsed().as_secs_f64()
            );
            let model: Arc<dyn TextModel> = Arc::new(model);
            Ok(Loaded {
                capacity: capacity(w, model.parallel_slots()),
                name: local::model_name(w, &path),
                model,
                path,
                backend: BackendKind::Metal,
                device: if apple_silicon() { Device::Metal } else { Device::Cpu },
                supervisor: None,
            })
        })
    }
}
