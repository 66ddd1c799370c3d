//! The registry: which backend a worker loads its model with.

use super::worker_backend::{Loaded, WorkerBackend};
use super::{cpu, cuda, llama_cpp, llama_server, mlx};
use switchyard_config::WorkerConfig;
use switchyard_messages::BackendKind;

/// The backends this build has, most preferred first.
pub struct Registry {
    backends: Vec<Box<dyn WorkerBackend>>,
}

impl Default for Registry {
    fn default() -> Self {
        let mut backends: Vec<Box<dyn WorkerBackend>> = vec![
            Box::new(mlx::MlxBackend),
            Box::new(llama_server::LlamaServerBackend::ROCM),
            Box::new(cuda::CudaBackend),
            Box::new(llama_cpp::LlamaCppBackend),
            Box::new(cpu::CpuBackend),
        ];
        backends.sort_by_key(|b| b.kind());
        Self { backends }
    }
}

impl Registry {
    /// The kinds this build has, most preferred first (what `worker.backend` accepts
    /// besides `auto`).
    pub fn kinds(&self) -> Vec<BackendKind> {
        self.backends.iter().map(|b| b.kind()).collect()
    }

    /// `name: summary` per backend, most preferred first, for `--help`.
    pub fn describe(&self) -> Vec<String> {
        self.backends
            .iter()
            .map(|b| format!("{} ({})", b.kind(), b.summary()))
            .collect()
    }

    /// The backend for `worker.backend`: the pinned one (whether or not it reports
    /// itself available: loading it then says what is missing), or for `auto` the
    /// most preferred available one.
    pub fn select(&self, w: &WorkerConfig) -> anyhow::Result<&dyn WorkerBackend> {
        if w.backend == "auto" {
            let mut why = Vec::new();
            for b in &self.backends {
                match b.available(w) {
                    Ok(()) => return Ok(b.as_ref()),
                    Err(e) => why.push(format!("{}: {e}", b.kind())),
                }
            }
            anyhow::bail!("worker.backend = auto: no backend is available ({})", why.join("; "));
        }
        let kind: BackendKind = w.backend.parse().map_err(|e| anyhow::anyhow!("worker.backend: {e}"))?;
        self.backends
            .iter()
            .find(|b| b.kind() == kind)
            .map(|b| b.as_ref())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "worker.backend = {kind}: this build has no {kind} backend (it has: {})",
                    self.kinds().iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
                )
            })
    }

    /// Loads the worker's model on the backend [`Self::select`] picks.
    /// Then loads `worker.adapters` into it: one that fails is reported (naming it and
    /// why) and left out, and the worker serves the rest.
    pub async fn load(&self, w: &WorkerConfig, worker_id: &str) -> anyhow::Result<Loaded> {
        let loaded = self.select(w)?.load(w, worker_id).await?;
        for a in &w.adapters {
            let load = loaded.model.load_adapter(a.name.clone(), a.path.clone(), a.scale);
            match load.await {
                Ok(_) => eprintln!(
                    "[switchyard] LoRA adapter {:?} loaded from {} (scale {})",
                    a.name, a.path, a.scale
                ),
                Err(e) => {
                    tracing::error!(adapter = %a.name, path = %a.path, "LoRA adapter not loaded: {e}");
                    eprintln!("[switchyard] LoRA adapter {:?} NOT loaded: {e}", a.name);
                }
            }
        }
        Ok(loaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::llama_server::GpuVendor;

    #[test]
    fn registry_orders_by_seed_preference_and_pins_bypass_it() {
        let r = Registry::default();
        assert_eq!(
            r.kinds(),
            vec![
                BackendKind::Metal,
                BackendKind::Rocm,
                BackendKind::LlamaCpp,
                BackendKind::Cuda,
                BackendKind::Cpu
            ]
        );
        let mut w = WorkerConfig {
            backend: "auto".into(),
            ..WorkerConfig::default()
        };
        let no_gpu = GpuVendor::ALL.iter().all(|v| v.gpus().is_err());
        // No GPU and no llama.cpp URL here: auto falls through to the CPU.
        if no_gpu {
            assert_eq!(r.select(&w).unwrap().kind(), BackendKind::Cpu);
            let e = r.backends[3].available(&w).unwrap_err();
            assert!(e.contains("cuda: no /dev/nvidiactl"), "{e}");
        }
        w.llama_url = "http://127.0.0.1:1".into();
        if no_gpu {
            assert_eq!(r.select(&w).unwrap().kind(), BackendKind::LlamaCpp);
        }
        w.backend = "cpu".into();
        assert_eq!(r.select(&w).unwrap().kind(), BackendKind::Cpu);
        // A pin is taken even where the backend is not available (loading says why).
        w.backend = "cuda".into();
        assert_eq!(r.select(&w).unwrap().kind(), BackendKind::Cuda);
        let cpu_only = Registry {
            backends: vec![Box::new(cpu::CpuBackend)],
        };
        let e = cpu_only.select(&w).err().unwrap().to_string();
        assert!(e.contains("no cuda backend (it has: cpu)"), "{e}");
        w.backend = "tpu".into();
        assert!(r
            .select(&w)
            .err()
            .unwrap()
            .to_string()
            .contains("unknown backend \"tpu\""));
    }
}
