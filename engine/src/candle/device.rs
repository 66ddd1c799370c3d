//! Where the candle engine computes, and what the device says about itself.

use candle_core::Device;

/// The device a model is placed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// NVIDIA GPU `index` (as CUDA numbers them in this process).
    Cuda(usize),
    /// candle's CPU device: the same pass without a GPU (tests, `gpu_allow_cpu`).
    Cpu,
}

impl Placement {
    /// Opens the device. A build without the `cuda` feature has no CUDA device and
    /// says how to get one.
    pub fn open(self) -> Result<Device, String> {
        match self {
            Placement::Cpu => Ok(Device::Cpu),
            Placement::Cuda(index) => open_cuda(index),
        }
    }

    /// What logs and `ModelInfo.kernels` call it.
    pub fn label(self) -> String {
        match self {
            Placement::Cuda(i) => format!("candle-cuda:{i}"),
            Placement::Cpu => "candle-cpu".into(),
        }
    }
}

/// Whether this build can compute on CUDA (the `cuda` cargo feature).
pub const fn cuda_built() -> bool {
    cfg!(feature = "cuda")
}

#[cfg(feature = "cuda")]
fn open_cuda(index: usize) -> Result<Device, String> {
    cuda_libraries()?;
    // cudarc loads the libraries at run time and panics where one is missing; they
    // were all found above, but a panic here must still be an error, not an exit.
    std::panic::catch_unwind(|| Device::new_cuda(index))
        .map_err(|p| format!("CUDA device {index}: {}", switchyard_fabric::panic_message(p)))?
        .map_err(|e| format!("CUDA device {index}: {e}"))
}

/// The NVIDIA libraries the CUDA engine loads when it first runs (the `cuda` build
/// links none of them, so the same binary starts on machines without them): each
/// with the names tried, in the loader's search order (`LD_LIBRARY_PATH`, the
/// `ldconfig` cache), and where it comes from.
pub const CUDA_LIBRARIES: &[(&str, &[&str], &str)] = &[
    (
        "the NVIDIA driver",
        &["libcuda.so.1", "libcuda.so"],
        "an NVIDIA driver, R580 or newer",
    ),
    (
        "cuBLAS",
        &["libcublas.so.13", "libcublas.so"],
        "a CUDA 13 toolkit's lib64, or pip's nvidia-cublas (nvidia/cu13/lib)",
    ),
    (
        "cuBLASLt",
        &["libcublasLt.so.13", "libcublasLt.so"],
        "a CUDA 13 toolkit's lib64, or pip's nvidia-cublas (nvidia/cu13/lib)",
    ),
    (
        "cuRAND",
        &["libcurand.so.10", "libcurand.so"],
        "a CUDA 13 toolkit's lib64, or pip's nvidia-curand (nvidia/cu13/lib)",
    ),
];

/// Whether every library in [`CUDA_LIBRARIES`] loads here; else which do not, what
/// provides them and how to point the loader at them.
pub fn cuda_libraries() -> Result<(), String> {
    let missing: Vec<String> = CUDA_LIBRARIES
        .iter()
        .filter(|(_, names, _)| !names.iter().any(|n| loads(n)))
        .map(|(what, names, from)| format!("{what} ({}; from {from})", names[0]))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "cannot load {}: put their directory in LD_LIBRARY_PATH (docs/cuda.md)",
        missing.join(", ")
    ))
}

/// Whether the dynamic loader finds and loads `name` (it stays loaded: the engine
/// loads it again by the same name).
fn loads(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: dlopen with a valid C string; the handle is never closed or used.
    !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }.is_null()
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_index: usize) -> Result<Device, String> {
    Err("this build has no CUDA engine (build it with scripts/build-cuda.sh, i.e. cargo build --features cuda)".into())
}

/// Bytes in use and in all on the device, from the driver (`cuMemGetInfo`; the whole
/// GPU, other processes included). `None` on the CPU.
pub fn memory(device: &Device) -> Option<(u64, u64)> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        let (free, total) = d.cuda_stream().context().mem_get_info().ok()?;
        return Some(((total - free) as u64, total as u64));
    }
    let _ = device;
    None
}

/// The GPU's name from the driver (e.g. "NVIDIA H100 80GB HBM3"); `None` on the CPU.
pub fn name(device: &Device) -> Option<String> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        return d.cuda_stream().context().name().ok();
    }
    let _ = device;
    None
}

/// Whether layer `il` of `n_layer` goes on the GPU under `gpu_layers` (llama.cpp's
/// `-ngl`): -1 = every layer; N counts the output layer as one and offloads the
/// last layers, so N > `n_layer` is every layer and 0 is none.
pub fn layer_on_gpu(il: usize, n_layer: usize, gpu_layers: i32) -> bool {
    match usize::try_from(gpu_layers) {
        Err(_) => true,
        Ok(n) => il + n > n_layer,
    }
}

/// Whether the output layer (final norm and vocabulary projection) goes on the GPU.
pub fn output_on_gpu(gpu_layers: i32) -> bool {
    gpu_layers != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_layers_offload_the_last_layers_and_count_the_output_as_one() {
        let on = |n: i32| (0..4).filter(|&il| layer_on_gpu(il, 4, n)).collect::<Vec<_>>();
        assert_eq!(on(-1), vec![0, 1, 2, 3]);
        assert_eq!(on(0), Vec::<usize>::new());
        assert_eq!(on(1), Vec::<usize>::new());
        assert_eq!(on(2), vec![3]);
        assert_eq!(on(4), vec![1, 2, 3]);
        assert_eq!(on(5), vec![0, 1, 2, 3]);
        assert_eq!(on(99), vec![0, 1, 2, 3]);
        assert!(output_on_gpu(-1) && output_on_gpu(1) && !output_on_gpu(0));
    }

    #[test]
    fn a_library_that_is_not_there_is_named_with_its_source() {
        assert!(loads("libc.so.6"));
        assert!(!loads("libswitchyard-no-such-library.so.1"));
        match cuda_libraries() {
            // A machine with the NVIDIA libraries.
            Ok(()) => assert!(CUDA_LIBRARIES.iter().all(|(_, n, _)| n.iter().any(|n| loads(n)))),
            Err(e) => assert!(e.contains("LD_LIBRARY_PATH") && e.contains(".so"), "{e}"),
        }
    }

    #[test]
    fn without_the_cuda_feature_a_cuda_placement_says_how_to_build_one() {
        if cuda_built() {
            return;
        }
        let e = Placement::Cuda(0).open().unwrap_err();
        assert!(
            e.contains("scripts/build-cuda.sh") && e.contains("--features cuda"),
            "{e}"
        );
        assert!(Placement::Cpu.open().unwrap().is_cpu());
        assert_eq!(memory(&Device::Cpu), None);
    }
}
