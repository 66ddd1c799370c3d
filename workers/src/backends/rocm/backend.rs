//! The `rocm` entry of the registry: start the supervised llama-server on the
//! worker's GPU, then serve through it like any llama.cpp server.

use super::supervisor::{rocm_devices, RocmOptions, Supervisor};
use crate::backends::llama_cpp::served;
use crate::backends::worker_backend::{Loaded, WorkerBackend};
use crate::local;
use futures::future::BoxFuture;
use std::time::{Duration, Instant};
use switchyard_config::WorkerConfig;
use switchyard_messages::{BackendKind, Device};

/// A llama-server this worker starts and supervises on an AMD GPU (registry name
/// `rocm`).
#[derive(Debug, Default, Clone, Copy)]
pub struct RocmBackend;

impl WorkerBackend for RocmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Rocm
    }

    fn summary(&self) -> &'static str {
        "a llama-server child this worker starts, supervises and pins to AMD GPU --gpu-device"
    }

    fn available(&self, w: &WorkerConfig) -> Result<(), String> {
        if w.rocm_allow_cpu {
            return Ok(());
        }
        rocm_devices().map(|_| ())
    }

    fn load<'a>(&'a self, w: &'a WorkerConfig, worker_id: &'a str) -> BoxFuture<'a, anyhow::Result<Loaded>> {
        Box::pin(async move {
            let path = local::model_path(w)?;
            let bin = local::find_llama_server(&w.llama_server_bin)?;
            let opts = RocmOptions {
                bin,
                model: path.clone(),
                device: w.gpu_device,
                gpu_layers: w.gpu_layers,
                context_len: w.context_len,
                parallel_slots: w.parallel_slots,
                threads: w.threads,
                extra_args: w.llama_server_args.split_whitespace().map(str::to_string).collect(),
                allow_cpu: w.rocm_allow_cpu,
                worker_id: worker_id.to_string(),
                startup_timeout: Duration::from_secs(300),
            };
            eprintln!(
                "starting llama-server on {} for {} …",
                if w.rocm_allow_cpu {
                    "the CPU (rocm_allow_cpu)".to_string()
                } else {
                    format!("ROCm GPU {}", w.gpu_device)
                },
                opts.model.display()
            );
            let started = Instant::now();
            let (supervisor, model) = Supervisor::start(opts).await?;
            eprintln!(
                "llama-server up at {} (pid {}) in {:.2} s",
                supervisor.url(),
                supervisor.pid().unwrap_or(0),
                started.elapsed().as_secs_f64()
            );
            let device = Device::Rocm {
                index: w.gpu_device,
                on_cpu: rocm_devices().is_err(),
            };
            let mut loaded = served(w, model, BackendKind::Rocm, device, Some(supervisor));
            loaded.name = local::model_name(w, &path);
            loaded.path = path;
            Ok(loaded)
        })
    }
}
