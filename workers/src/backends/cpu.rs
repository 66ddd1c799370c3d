//! The `cpu` backend: switchyard's own engine ([`switchyard_engine`]).

use super::worker_backend::{capacity, Loaded, WorkerBackend};
use crate::local;
use anyhow::Context;
use futures::future::BoxFuture;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use switchyard_backend::{BackendError, TextModel};
use switchyard_config::WorkerConfig;
use switchyard_engine::ForwardPass;
use switchyard_messages::{BackendKind, Device, LoadConfig};

/// The CPU engine as a backend (registry name `"cpu"`).
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuBackend;

impl WorkerBackend for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn summary(&self) -> &'static str {
        "switchyard's own CPU engine: GGUF or Hugging Face safetensors"
    }

    fn available(&self, _w: &WorkerConfig) -> Result<(), String> {
        Ok(())
    }

    fn load<'a>(&'a self, w: &'a WorkerConfig, _worker_id: &'a str) -> BoxFuture<'a, anyhow::Result<Loaded>> {
        Box::pin(async move {
            let (model, path, name) = load_model(w).await?;
            Ok(Loaded {
                capacity: capacity(w, model.parallel_slots()),
                model,
                path,
                name,
                backend: BackendKind::Cpu,
                device: Device::Cpu,
                supervisor: None,
            })
        })
    }
}

/// Loads the worker's model on the CPU engine, printing progress to stderr.
pub async fn load_model(w: &WorkerConfig) -> anyhow::Result<(Arc<dyn TextModel>, PathBuf, String)> {
    load_model_on(w, ForwardPass::Own).await
}

/// Loads the worker's model on the engine with the forward pass `compute` chooses
/// (the `cuda` backend's native engine is the engine with the candle pass), printing
/// progress to stderr.
pub async fn load_model_on(
    w: &WorkerConfig,
    compute: ForwardPass,
) -> anyhow::Result<(Arc<dyn TextModel>, PathBuf, String)> {
    let path = local::model_path(w)?;
    let name = local::model_name(w, &path);
    let size = if path.is_dir() {
        std::fs::read_dir(&path)
            .map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    } else {
        std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0)
    };
    let place = match compute {
        ForwardPass::Own => "cpu".to_string(),
        ForwardPass::Candle { placement, gpu_layers } => format!("{} (gpu_layers {gpu_layers})", placement.label()),
    };
    eprintln!("loading {} ({:.1} MB) on {place} …", path.display(), size as f64 / 1e6);
    let started = Instant::now();
    let load = LoadConfig {
        backend: w.backend.clone(),
        context_len: w.context_len,
        threads: w.threads,
        parallel_slots: w.parallel_slots,
        kv_cache_mb: w.kv_cache_mb,
        prefill_chunk: w.prefill_chunk,
        speculative: w.speculative.clone(),
        draft_model: w.draft_model.clone(),
        draft_max: w.draft_max,
        gpu_layers: w.gpu_layers,
        pooling: w.pooling.clone(),
        ..LoadConfig::default()
    };
    let p = path.clone();
    let model = tokio::task::spawn_blocking(move || -> Result<Arc<dyn TextModel>, BackendError> {
        switchyard_engine::load_model(&p, &load, compute)
    })
    .await
    .context("model loading task")??;
    let info = model.info();
    eprintln!(
        "loaded {name}: {} layers, hidden {}, vocab {}, context {}, {}-bit, {} kernels{}, in {:.2} s",
        info.num_layers,
        info.hidden_size,
        info.vocab_size,
        info.context_len,
        info.quant_bits,
        info.kernels,
        if compute == ForwardPass::Own {
            " (SWITCHYARD_CPU_ISA forces others)"
        } else {
            ""
        },
        started.elapsed().as_secs_f64()
    );
    Ok((model, path, name))
}
