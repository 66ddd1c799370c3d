//! The `rocm` and `cuda` entries of the registry: start the supervised llama-server
//! on the worker's GPU, then serve through it like any llama.cpp server.

use super::supervisor::{ServerOptions, Supervisor};
use super::vendor::GpuVendor;
use crate::backends::llama_cpp::served;
use crate::backends::worker_backend::{Loaded, WorkerBackend};
use crate::local;
use futures::future::BoxFuture;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use switchyard_config::WorkerConfig;
use switchyard_messages::BackendKind;

/// A llama-server this worker starts and supervises on one GPU of `vendor`
/// (registry names `rocm` and `cuda`).
#[derive(Debug, Clone, Copy)]
pub struct LlamaServerBackend {
    vendor: GpuVendor,
}

impl LlamaServerBackend {
    /// On an AMD GPU (`rocm`, pinned with `HIP_VISIBLE_DEVICES`).
    pub const ROCM: Self = Self {
        vendor: GpuVendor::Rocm,
    };
    /// On an NVIDIA GPU (`cuda`, pinned with `CUDA_VISIBLE_DEVICES`).
    pub const CUDA: Self = Self {
        vendor: GpuVendor::Cuda,
    };

    /// Whose GPU it runs on.
    pub fn vendor(&self) -> GpuVendor {
        self.vendor
    }
}

impl WorkerBackend for LlamaServerBackend {
    fn kind(&self) -> BackendKind {
        self.vendor.kind()
    }

    fn summary(&self) -> &'static str {
        match self.vendor {
            GpuVendor::Rocm => "a llama-server child this worker starts, supervises and pins to AMD GPU --gpu-device",
            GpuVendor::Cuda => {
                "a llama-server child this worker starts, supervises and pins to NVIDIA GPU --gpu-device"
            }
        }
    }

    /// The GPU is there (or `gpu_allow_cpu`), and a llama-server binary is found.
    fn available(&self, w: &WorkerConfig) -> Result<(), String> {
        if !w.gpu_allow_cpu {
            self.vendor.check(w.gpu_device).map_err(|e| e.to_string())?;
        }
        local::find_llama_server(&w.llama_server_bin)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn load<'a>(&'a self, w: &'a WorkerConfig, worker_id: &'a str) -> BoxFuture<'a, anyhow::Result<Loaded>> {
        Box::pin(async move {
            let vendor = self.vendor;
            let path = local::model_path(w)?;
            let bin = local::find_llama_server(&w.llama_server_bin)?;
            // Allowed onto the CPU and the GPU is not there: say so in the device.
            let on_cpu = w.gpu_allow_cpu && vendor.check(w.gpu_device).is_err();
            let extra_args: Vec<String> = w.llama_server_args.split_whitespace().map(str::to_string).collect();
            // Slots are saved and restored as files there: the KV exchange with peers.
            let (slot_dir, own_slot_dir) = slot_dir(&extra_args, worker_id);
            let opts = ServerOptions {
                vendor,
                bin: bin.clone(),
                model: path.clone(),
                device: w.gpu_device,
                gpu_layers: w.gpu_layers,
                context_len: w.context_len,
                parallel_slots: w.parallel_slots,
                threads: w.threads,
                // llama-server loads adapters only at start: the configured GGUF LoRAs go
                // on its command line (anything else would stop it starting; loading
                // that adapter by name then says why).
                lora: w
                    .adapters
                    .iter()
                    .map(|a| PathBuf::from(&a.path))
                    .filter(|p| is_gguf_lora(p))
                    .collect(),
                extra_args,
                slot_dir: own_slot_dir.clone(),
                allow_cpu: w.gpu_allow_cpu,
                worker_id: worker_id.to_string(),
                startup_timeout: Duration::from_secs(300),
            };
            eprintln!(
                "starting llama-server on {} for {} …",
                if on_cpu {
                    format!("the CPU (gpu_allow_cpu, no {} GPU {})", vendor.label(), w.gpu_device)
                } else {
                    format!("{} GPU {}", vendor.label(), w.gpu_device)
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
            let device = vendor.device(w.gpu_device, on_cpu);
            let own_dir = own_slot_dir.is_some();
            if let Some(dir) = slot_dir {
                let computes_on = if on_cpu {
                    "cpu".to_string()
                } else {
                    vendor.label().to_lowercase()
                };
                model.enable_kv_exchange(dir, own_dir, bin.clone(), computes_on);
            }
            let mut loaded = served(w, model, vendor.kind(), device, Some(supervisor));
            loaded.name = local::model_name(w, &path);
            loaded.path = path;
            Ok(loaded)
        })
    }
}

/// The directory llama-server saves slots in: the one `--slot-save-path` in the
/// extra arguments names, else a fresh one of this worker's (also returned second,
/// for the command line); `None` when it cannot be made (no KV exchange then).
fn slot_dir(extra_args: &[String], worker_id: &str) -> (Option<PathBuf>, Option<PathBuf>) {
    if let Some(i) = extra_args.iter().position(|a| a == "--slot-save-path") {
        return (extra_args.get(i + 1).map(PathBuf::from), None);
    }
    let safe: String = worker_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
        .collect();
    remove_stale_slot_dirs();
    // One per server, even for workers of one id in one process (tests).
    static SERVERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("switchyard-slots-{safe}-{}-{n}", std::process::id()));
    match std::fs::create_dir_all(&dir) {
        Ok(()) => (Some(dir.clone()), Some(dir)),
        Err(e) => {
            tracing::info!(dir = %dir.display(), "no KV exchange: the slot directory: {e}");
            (None, None)
        }
    }
}

/// Removes the slot directories of worker processes that are gone (killed before
/// they could remove their own): `switchyard-slots-<worker>-<pid>-<n>` whose `<pid>`
/// no longer runs (Linux only: where `/proc` says which processes run).
fn remove_stale_slot_dirs() {
    if !cfg!(target_os = "linux") {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix("switchyard-slots-") else {
            continue;
        };
        let mut parts = rest.rsplit('-');
        let (Some(_n), Some(pid)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Whether `path` is a llama.cpp GGUF LoRA (`general.type = adapter`, `adapter.type =
/// lora`), what llama-server's `--lora` takes.
fn is_gguf_lora(path: &std::path::Path) -> bool {
    use candle_core::quantized::gguf_file;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let Ok(content) = gguf_file::Content::read(&mut std::io::BufReader::new(f)) else {
        return false;
    };
    let text = |k: &str| content.metadata.get(k).and_then(|v| v.to_string().ok()).cloned();
    text("general.type").as_deref() == Some("adapter") && text("adapter.type").as_deref() == Some("lora")
}
