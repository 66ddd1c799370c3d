//! What differs between an AMD and an NVIDIA GPU for a supervised llama-server: the
//! variable that pins the child to one GPU, the device the worker announces, how the
//! GPU is found, and what a refusal says. Everything else is the shared supervisor.

use std::path::Path;
use std::time::Duration;
use switchyard_backend::BackendError;
use switchyard_messages::{BackendKind, Device};

/// Whose GPU a supervised llama-server runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuVendor {
    /// AMD, through ROCm/HIP: backend `rocm`, pinned with `HIP_VISIBLE_DEVICES`.
    Rocm,
    /// NVIDIA, through CUDA: backend `cuda`, pinned with `CUDA_VISIBLE_DEVICES`.
    Cuda,
}

impl GpuVendor {
    /// Both vendors.
    pub const ALL: [GpuVendor; 2] = [GpuVendor::Rocm, GpuVendor::Cuda];

    /// The backend a worker on this vendor's GPU announces.
    pub fn kind(self) -> BackendKind {
        match self {
            GpuVendor::Rocm => BackendKind::Rocm,
            GpuVendor::Cuda => BackendKind::Cuda,
        }
    }

    /// The name people know the GPU stack by, which is also the prefix llama.cpp
    /// gives this vendor's devices (`ROCm0`, `CUDA0`).
    pub fn label(self) -> &'static str {
        match self {
            GpuVendor::Rocm => "ROCm",
            GpuVendor::Cuda => "CUDA",
        }
    }

    /// The variable that limits a process to some of this vendor's GPUs.
    pub fn pin_var(self) -> &'static str {
        match self {
            GpuVendor::Rocm => "HIP_VISIBLE_DEVICES",
            GpuVendor::Cuda => "CUDA_VISIBLE_DEVICES",
        }
    }

    /// The environment that pins a child to GPU `index`. `inherited` is this
    /// process's own [`Self::pin_var`] (a scheduler may have set it): `index` then
    /// counts within that list, so the child gets the entry it names. CUDA also gets
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so `index` counts GPUs as `nvidia-smi` lists
    /// them (CUDA's own default puts the fastest first).
    pub fn pin_env(self, index: u32, inherited: Option<&str>) -> Result<Vec<(&'static str, String)>, String> {
        let value = match inherited.map(str::trim).filter(|v| !v.is_empty()) {
            None => index.to_string(),
            Some(list) => {
                let entries: Vec<&str> = list.split(',').map(str::trim).collect();
                entries.get(index as usize).map(|e| e.to_string()).ok_or_else(|| {
                    format!(
                        "device {index} asked for, but this process's {}={list} lists {} GPU(s)",
                        self.pin_var(),
                        entries.len()
                    )
                })?
            }
        };
        let mut env = vec![(self.pin_var(), value)];
        if self == GpuVendor::Cuda {
            env.push(("CUDA_DEVICE_ORDER", "PCI_BUS_ID".into()));
        }
        Ok(env)
    }

    /// The device a worker announces: `rocm:N` / `cuda:N`, with `(cpu)` when the
    /// llama-server was allowed onto the CPU because the GPU is not there.
    pub fn device(self, index: u32, on_cpu: bool) -> Device {
        match self {
            GpuVendor::Rocm => Device::Rocm { index, on_cpu },
            GpuVendor::Cuda => Device::Cuda { index, on_cpu },
        }
    }

    /// How many of this vendor's GPUs the kernel driver shows, or why there are none.
    pub fn gpus(self) -> Result<u32, String> {
        match self {
            GpuVendor::Rocm => rocm_gpus(),
            GpuVendor::Cuda => nvidia_gpus(Path::new("/dev")),
        }
    }

    /// `Ok` when GPU `index` is there; else the refusal a worker starts with: an
    /// `unavailable` that names the backend and what is missing.
    pub fn check(self, index: u32) -> Result<(), BackendError> {
        let refuse = |why: String| {
            BackendError::Unavailable(format!(
                "{}: {why} (worker.gpu_allow_cpu runs the llama-server on the CPU instead, for tests)",
                self.kind()
            ))
        };
        let gpus = self.gpus().map_err(refuse)?;
        if index >= gpus {
            return Err(refuse(format!(
                "device {index} asked for, but only {gpus} {} GPU(s) are present",
                self.label()
            )));
        }
        Ok(())
    }
}

/// The ROCm GPUs the kernel driver reports: `/dev/kfd` must exist, and each KFD
/// topology node with SIMD units is a GPU. An error says what is missing.
fn rocm_gpus() -> Result<u32, String> {
    if !Path::new("/dev/kfd").exists() {
        return Err("no /dev/kfd (the amdgpu kernel driver is not loaded, or this is not an AMD GPU machine)".into());
    }
    let nodes = std::fs::read_dir("/sys/class/kfd/kfd/topology/nodes")
        .map_err(|e| format!("reading /sys/class/kfd/kfd/topology/nodes: {e}"))?;
    let gpus = nodes
        .flatten()
        .filter_map(|n| std::fs::read_to_string(n.path().join("properties")).ok())
        .filter(|props| {
            props.lines().any(|l| {
                l.strip_prefix("simd_count ")
                    .and_then(|v| v.trim().parse::<u32>().ok())
                    .is_some_and(|v| v > 0)
            })
        })
        .count() as u32;
    if gpus == 0 {
        return Err("/dev/kfd exists but the KFD topology lists no GPU".into());
    }
    Ok(gpus)
}

/// The NVIDIA GPUs under `dev`: `nvidiactl` must exist (the driver is loaded), and
/// each `nvidiaN` is a GPU this process may open (a container sees only its own).
fn nvidia_gpus(dev: &Path) -> Result<u32, String> {
    if !dev.join("nvidiactl").exists() {
        return Err(format!(
            "no {} (the NVIDIA kernel driver is not loaded, or this is not an NVIDIA GPU machine)",
            dev.join("nvidiactl").display()
        ));
    }
    let gpus = std::fs::read_dir(dev)
        .map_err(|e| format!("reading {}: {e}", dev.display()))?
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count() as u32;
    if gpus == 0 {
        return Err(format!(
            "{} exists but there is no nvidiaN GPU device",
            dev.join("nvidiactl").display()
        ));
    }
    Ok(gpus)
}

/// Asks `bin --list-devices` (with the child's pinning environment) which GPUs the
/// binary can use. `Err` when it ran and lists none of `vendor`'s: a llama-server
/// built without GPU support would otherwise run on the CPU under a GPU's name. A
/// binary that cannot answer (older, or it hangs) is let through with a warning.
pub async fn check_binary_sees_gpu(
    bin: &Path,
    vendor: GpuVendor,
    env: &[(&'static str, String)],
) -> Result<(), BackendError> {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("--list-devices")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = match tokio::time::timeout(Duration::from_secs(60), cmd.output()).await {
        Ok(Ok(out)) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        other => {
            tracing::warn!(bin = %bin.display(), "`llama-server --list-devices` did not answer ({other:?}); assuming it was built for {}", vendor.label());
            return Ok(());
        }
    };
    match lists_vendor_device(&out, vendor) {
        Some(true) | None => Ok(()),
        Some(false) => Err(BackendError::Unavailable(format!(
            "{}: the {} GPU is present, but {} lists no {} device (build it with {}); its --list-devices said: {}",
            vendor.kind(),
            vendor.label(),
            bin.display(),
            vendor.label(),
            match vendor {
                GpuVendor::Rocm => "cmake -DGGML_HIP=ON",
                GpuVendor::Cuda => "cmake -DGGML_CUDA=ON",
            },
            out.split_whitespace().collect::<Vec<_>>().join(" ")
        ))),
    }
}

/// Whether `llama-server --list-devices` output names one of `vendor`'s devices
/// (`  CUDA0: NVIDIA H100 … (81079 MiB, 80500 MiB free)`); `None` when the output is
/// not that listing at all.
fn lists_vendor_device(out: &str, vendor: GpuVendor) -> Option<bool> {
    let mut lines = out.lines().skip_while(|l| !l.starts_with("Available devices:"));
    lines.next()?;
    Some(lines.any(|l| {
        l.trim_start()
            .strip_prefix(vendor.label())
            .and_then(|rest| rest.split_once(':'))
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_vendor_pins_with_its_own_variable_and_announces_its_own_device() {
        assert_eq!(
            GpuVendor::Rocm.pin_env(2, None).unwrap(),
            [("HIP_VISIBLE_DEVICES", "2".to_string())]
        );
        assert_eq!(
            GpuVendor::Cuda.pin_env(1, None).unwrap(),
            [
                ("CUDA_VISIBLE_DEVICES", "1".to_string()),
                ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_string())
            ]
        );
        // A scheduler gave this process GPUs 4 and 6: index 1 is GPU 6.
        assert_eq!(GpuVendor::Cuda.pin_env(1, Some("4, 6")).unwrap()[0].1, "6");
        assert_eq!(GpuVendor::Cuda.pin_env(0, Some("")).unwrap()[0].1, "0");
        let e = GpuVendor::Rocm.pin_env(2, Some("0,1")).unwrap_err();
        assert!(e.contains("HIP_VISIBLE_DEVICES=0,1 lists 2"), "{e}");
        assert_eq!(GpuVendor::Cuda.device(1, false).to_string(), "cuda:1");
        assert_eq!(GpuVendor::Cuda.device(0, true).to_string(), "cuda:0(cpu)");
        assert_eq!(GpuVendor::Rocm.device(3, false).to_string(), "rocm:3");
        assert_eq!(GpuVendor::Cuda.kind(), BackendKind::Cuda);
    }

    #[test]
    fn nvidia_gpus_are_the_nvidia_n_device_nodes_once_the_driver_is_loaded() {
        let dev = tempfile::tempdir().unwrap();
        let e = nvidia_gpus(dev.path()).unwrap_err();
        assert!(e.contains("nvidiactl") && e.contains("driver is not loaded"), "{e}");
        std::fs::write(dev.path().join("nvidiactl"), "").unwrap();
        assert!(nvidia_gpus(dev.path()).unwrap_err().contains("no nvidiaN"));
        for name in ["nvidia0", "nvidia1", "nvidia-uvm", "nvidia-modeset", "nvidia-caps"] {
            std::fs::write(dev.path().join(name), "").unwrap();
        }
        assert_eq!(nvidia_gpus(dev.path()), Ok(2));
    }

    #[test]
    fn a_missing_gpu_is_an_unavailable_refusal_that_names_the_backend() {
        if GpuVendor::Cuda.gpus().is_ok() {
            return; // an NVIDIA machine: nothing to refuse
        }
        let e = GpuVendor::Cuda.check(0).unwrap_err();
        assert!(matches!(e, BackendError::Unavailable(_)), "{e:?}");
        let msg = e.to_string();
        assert!(msg.starts_with("backend unavailable: cuda: no /dev/nvidiactl"), "{msg}");
        assert!(msg.contains("gpu_allow_cpu"), "{msg}");
    }

    #[test]
    fn list_devices_output_tells_a_gpu_build_from_a_cpu_one() {
        let cuda = "Available devices:\n  CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80500 MiB free)\n";
        let rocm = "ggml_cuda_init: found 1 ROCm devices\nAvailable devices:\n  ROCm0: AMD Instinct MI300X (196592 MiB, 196000 MiB free)\n";
        let none = "Available devices:\n  (none)\n";
        assert_eq!(lists_vendor_device(cuda, GpuVendor::Cuda), Some(true));
        assert_eq!(lists_vendor_device(cuda, GpuVendor::Rocm), Some(false));
        assert_eq!(lists_vendor_device(rocm, GpuVendor::Rocm), Some(true));
        assert_eq!(lists_vendor_device(none, GpuVendor::Cuda), Some(false));
        assert_eq!(lists_vendor_device("error: unknown argument", GpuVendor::Cuda), None);
    }
}
