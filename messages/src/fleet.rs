//! Typed names for what a worker runs on: [`BackendKind`] and [`Device`]. On the
//! wire (heartbeats, pins, metrics attributes) both stay plain strings, so a client
//! in any language, or a worker from a newer release with a backend this one does
//! not know, is never refused for them.

use std::fmt;
use std::str::FromStr;

/// A backend, in seed 000's order of preference (`Default()`): Metal, ROCm, an
/// llama.cpp server, CUDA, then the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    Metal,
    Rocm,
    LlamaCpp,
    Cuda,
    Cpu,
}

impl BackendKind {
    /// Every kind, most preferred first.
    pub const BY_PREFERENCE: [BackendKind; 5] = [
        BackendKind::Metal,
        BackendKind::Rocm,
        BackendKind::LlamaCpp,
        BackendKind::Cuda,
        BackendKind::Cpu,
    ];

    /// The wire name: `metal`, `rocm`, `llama_cpp`, `cuda`, `cpu`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Metal => "metal",
            BackendKind::Rocm => "rocm",
            BackendKind::LlamaCpp => "llama_cpp",
            BackendKind::Cuda => "cuda",
            BackendKind::Cpu => "cpu",
        }
    }

    /// Routing rank of a backend named on the wire: 0 is the most preferred; a name
    /// this build does not know ranks after every known one.
    pub fn rank(name: &str) -> usize {
        Self::BY_PREFERENCE
            .iter()
            .position(|k| k.as_str() == name)
            .unwrap_or(Self::BY_PREFERENCE.len())
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backend name that is not one of [`BackendKind`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend {0:?} (known: metal, rocm, llama_cpp, cuda, cpu)")]
pub struct UnknownBackend(pub String);

impl FromStr for BackendKind {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::BY_PREFERENCE
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownBackend(s.to_string()))
    }
}

/// The device a worker computes on, as it announces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Device {
    /// The host's CPU (`cpu`).
    Cpu,
    /// Apple silicon's GPU (`metal`).
    Metal,
    /// NVIDIA GPU `N` (`cuda:N`); `on_cpu` when its llama-server was told to run on
    /// the CPU instead (`cuda:N(cpu)`, for tests on machines without the GPU).
    Cuda { index: u32, on_cpu: bool },
    /// AMD GPU `N` (`rocm:N`); `on_cpu` as for [`Device::Cuda`] (`rocm:N(cpu)`).
    Rocm { index: u32, on_cpu: bool },
    /// Whatever an llama.cpp server this worker does not own runs on (`llama_cpp`).
    LlamaCppServer,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Metal => f.write_str("metal"),
            Device::Cuda { index, on_cpu } => write!(f, "cuda:{index}{}", if *on_cpu { "(cpu)" } else { "" }),
            Device::Rocm { index, on_cpu } => write!(f, "rocm:{index}{}", if *on_cpu { "(cpu)" } else { "" }),
            Device::LlamaCppServer => f.write_str("llama_cpp"),
        }
    }
}

/// A device string that is not one [`Device`] writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device {0:?} (known: cpu, metal, cuda:N, cuda:N(cpu), rocm:N, rocm:N(cpu), llama_cpp)")]
pub struct UnknownDevice(pub String);

impl FromStr for Device {
    type Err = UnknownDevice;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || UnknownDevice(s.to_string());
        // `N` or `N(cpu)`.
        let gpu = |t: &str| match t.strip_suffix("(cpu)") {
            Some(n) => n.parse::<u32>().map(|i| (i, true)).map_err(|_| bad()),
            None => t.parse::<u32>().map(|i| (i, false)).map_err(|_| bad()),
        };
        match s {
            "cpu" => Ok(Device::Cpu),
            "metal" => Ok(Device::Metal),
            "llama_cpp" => Ok(Device::LlamaCppServer),
            _ => {
                if let Some(n) = s.strip_prefix("cuda:") {
                    let (index, on_cpu) = gpu(n)?;
                    Ok(Device::Cuda { index, on_cpu })
                } else if let Some(n) = s.strip_prefix("rocm:") {
                    let (index, on_cpu) = gpu(n)?;
                    Ok(Device::Rocm { index, on_cpu })
                } else {
                    Err(bad())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_rank_in_seed_order() {
        for (i, k) in BackendKind::BY_PREFERENCE.into_iter().enumerate() {
            assert_eq!(k.as_str().parse::<BackendKind>(), Ok(k));
            assert_eq!(BackendKind::rank(k.as_str()), i);
        }
        assert_eq!(BackendKind::rank("tpu"), 5);
        assert!("tpu".parse::<BackendKind>().unwrap_err().to_string().contains("tpu"));
        for d in [
            Device::Cpu,
            Device::Metal,
            Device::Cuda {
                index: 1,
                on_cpu: false,
            },
            Device::Cuda { index: 0, on_cpu: true },
            Device::Rocm { index: 0, on_cpu: true },
            Device::Rocm {
                index: 2,
                on_cpu: false,
            },
            Device::LlamaCppServer,
        ] {
            assert_eq!(d.to_string().parse::<Device>(), Ok(d.clone()), "{d}");
        }
        assert!("cuda:x".parse::<Device>().is_err());
        assert!("cuda:(cpu)".parse::<Device>().is_err());
    }
}
