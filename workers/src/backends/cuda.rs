//! The `cuda` entry of the registry: an NVIDIA GPU served by one of two engines, as
//! `worker.cuda_engine` says:
//!
//! - `native`: switchyard's engine with the candle forward pass on candle's CUDA
//!   device ([`switchyard_engine::candle`]); in a build with the `cuda` feature.
//! - `llama-server`: a supervised llama-server child pinned to the GPU
//!   ([`super::llama_server`]), as the `rocm` backend has.
//! - `auto`: native in a `cuda` build, else llama-server.
//!
//! Either announces device `cuda:N` (`cuda:N(cpu)` when `gpu_allow_cpu` let it run
//! without the GPU).

use super::cpu::load_model_on;
use super::llama_server::{GpuVendor, LlamaServerBackend};
use super::worker_backend::{capacity, Loaded, WorkerBackend};
use futures::future::BoxFuture;
use switchyard_backend::BackendError;
use switchyard_config::WorkerConfig;
use switchyard_engine::candle::{device, Placement};
use switchyard_engine::ForwardPass;
use switchyard_messages::{BackendKind, Device};

/// The `cuda` backend (registry name `cuda`).
#[derive(Debug, Default, Clone, Copy)]
pub struct CudaBackend;

/// Which engine computes a `cuda` worker's model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaEngine {
    /// switchyard's engine on candle's CUDA device.
    Native,
    /// A supervised llama-server child.
    LlamaServer,
}

impl CudaEngine {
    /// The engine `worker.cuda_engine` names (`auto`: native in a `cuda` build).
    pub fn of(w: &WorkerConfig) -> Self {
        match w.cuda_engine.as_str() {
            "native" => CudaEngine::Native,
            "llama-server" => CudaEngine::LlamaServer,
            _ if device::cuda_built() => CudaEngine::Native,
            _ => CudaEngine::LlamaServer,
        }
    }
}

/// Why the native engine cannot run on GPU `w.gpu_device` here, as the `unavailable`
/// error a worker refuses with: the GPU first, then the build.
pub fn native_refusal(w: &WorkerConfig) -> Option<BackendError> {
    let refuse = |why: String| {
        Some(BackendError::Unavailable(format!(
            "cuda: {why} (worker.gpu_allow_cpu runs the native engine on the CPU instead, for tests)"
        )))
    };
    match GpuVendor::Cuda.gpus() {
        Err(why) => return refuse(why),
        Ok(n) if w.gpu_device >= n => {
            return refuse(format!(
                "device {} asked for, but only {n} NVIDIA GPU(s) are present",
                w.gpu_device
            ))
        }
        Ok(_) => {}
    }
    if !device::cuda_built() {
        return refuse(
            "this build has no native CUDA engine (scripts/build-cuda.sh builds one; worker.cuda_engine = \
             \"llama-server\" serves the GPU through a supervised llama-server instead)"
                .into(),
        );
    }
    // The build loads the NVIDIA libraries at run time: a GPU without them (no
    // driver, no CUDA 13 libraries on the loader's path) is named here, not at the
    // first matmul.
    if let Err(why) = device::cuda_libraries() {
        return refuse(why);
    }
    None
}

impl WorkerBackend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn summary(&self) -> &'static str {
        if device::cuda_built() {
            "NVIDIA GPU --gpu-device: switchyard's engine on candle's CUDA device (this build has it), or a \
             supervised llama-server child (--cuda-engine)"
        } else {
            "NVIDIA GPU --gpu-device: a supervised llama-server child, or switchyard's engine on candle's CUDA \
             device in a build with the cuda feature (--cuda-engine)"
        }
    }

    fn available(&self, w: &WorkerConfig) -> Result<(), String> {
        match CudaEngine::of(w) {
            CudaEngine::LlamaServer => LlamaServerBackend::CUDA.available(w),
            CudaEngine::Native if w.gpu_allow_cpu => Ok(()),
            CudaEngine::Native => native_refusal(w).map_or(Ok(()), |e| Err(e.to_string())),
        }
    }

    fn load<'a>(&'a self, w: &'a WorkerConfig, worker_id: &'a str) -> BoxFuture<'a, anyhow::Result<Loaded>> {
        if CudaEngine::of(w) == CudaEngine::LlamaServer {
            return LlamaServerBackend::CUDA.load(w, worker_id);
        }
        Box::pin(async move {
            let refusal = native_refusal(w);
            let on_cpu = match refusal {
                Some(e) if !w.gpu_allow_cpu => return Err(e.into()),
                Some(_) => true,
                None => false,
            };
            let placement = if on_cpu {
                Placement::Cpu
            } else {
                Placement::Cuda(w.gpu_device as usize)
            };
            let compute = ForwardPass::Candle {
                placement,
                gpu_layers: w.gpu_layers,
            };
            let (model, path, name) = load_model_on(w, compute).await?;
            Ok(Loaded {
                capacity: capacity(w, model.parallel_slots()),
                model,
                path,
                name,
                backend: BackendKind::Cuda,
                device: Device::Cuda {
                    index: w.gpu_device,
                    on_cpu,
                },
                supervisor: None,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_native_only_in_a_cuda_build_and_the_refusal_names_gpu_then_build() {
        let mut w = WorkerConfig::default();
        assert_eq!(w.cuda_engine, "auto");
        let auto = CudaEngine::of(&w);
        assert_eq!(auto == CudaEngine::Native, device::cuda_built());
        w.cuda_engine = "llama-server".into();
        assert_eq!(CudaEngine::of(&w), CudaEngine::LlamaServer);
        w.cuda_engine = "native".into();
        assert_eq!(CudaEngine::of(&w), CudaEngine::Native);
        if GpuVendor::Cuda.gpus().is_err() {
            let e = native_refusal(&w).expect("no GPU here").to_string();
            assert!(e.starts_with("backend unavailable: cuda: no /dev/nvidiactl"), "{e}");
            assert!(e.contains("gpu_allow_cpu"), "{e}");
            assert!(CudaBackend.available(&w).is_err());
            w.gpu_allow_cpu = true;
            assert!(CudaBackend.available(&w).is_ok());
        }
    }
}
