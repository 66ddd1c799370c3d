//! Where switchyard keeps things on this machine: the cache directory
//! (`$SWITCHYARD_CACHE`, else `~/.cache/switchyard`), the demo model that
//! `scripts/setup.sh` installs, and the llama-server builds of
//! `scripts/build-llama-server.sh`.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use switchyard_config::WorkerConfig;

pub use switchyard_config::{cache_dir, demo_model_path, DEMO_MODEL_FILE};

/// The model file a worker serves (`worker.model`, or the demo model).
pub fn model_path(w: &WorkerConfig) -> anyhow::Result<PathBuf> {
    let path = if w.model.is_empty() {
        demo_model_path()
    } else {
        PathBuf::from(&w.model)
    };
    if path.is_dir() && !path.join("config.json").is_file() {
        bail!(
            "worker.model = {} is a directory without config.json (expected a GGUF file or a Hugging Face model directory)",
            path.display()
        );
    }
    if !path.is_file() && !path.is_dir() {
        if w.model.is_empty() {
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
pub fn model_name(w: &WorkerConfig, path: &Path) -> String {
    if !w.model_name.is_empty() {
        return w.model_name.clone();
    }
    let name = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    name.map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "model".into())
}

/// Finds `llama-server`: `configured` if non-empty, `$SWITCHYARD_LLAMA_SERVER`, the
/// cache's build (`scripts/build-llama-server.sh`), then `PATH`.
pub fn find_llama_server(configured: &str) -> anyhow::Result<PathBuf> {
    if !configured.is_empty() {
        return Ok(PathBuf::from(configured));
    }
    if let Some(p) = std::env::var_os("SWITCHYARD_LLAMA_SERVER") {
        return Ok(PathBuf::from(p));
    }
    let mut candidates = cached_llama_servers(&cache_dir());
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("llama-server")));
    }
    candidates.into_iter().find(|p| p.is_file()).context(
        "llama-server not found (looked at worker.llama_server_bin, $SWITCHYARD_LLAMA_SERVER, \
         ~/.cache/switchyard/llama.cpp/*/{native-*,avx2}/bin, PATH); build one with scripts/build-llama-server.sh",
    )
}

/// The llama-server builds of scripts/build-llama-server.sh under `cache`, best first:
/// native builds made on a CPU with exactly this host's feature flags, then the AVX2
/// build (x86-64 hosts with AVX2), then builds of the older flat layout; newer
/// llama.cpp versions first within each kind. A native build from another CPU is
/// skipped: it may use instructions this one lacks.
pub fn cached_llama_servers(cache: &Path) -> Vec<PathBuf> {
    let ours = host_cpu_flags();
    let mut versions: Vec<PathBuf> = std::fs::read_dir(cache.join("llama.cpp"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    versions.sort();
    versions.reverse();
    let (mut native, mut avx2, mut flat) = (Vec::new(), Vec::new(), Vec::new());
    for v in &versions {
        for entry in std::fs::read_dir(v).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let flags = std::fs::read_to_string(entry.path().join("cpu-flags")).ok();
            if name.starts_with("native-") && ours.is_some() && flags.as_deref().map(str::trim) == ours.as_deref() {
                native.push(entry.path().join("bin/llama-server"));
            } else if name == "avx2" && host_has_avx2() {
                avx2.push(entry.path().join("bin/llama-server"));
            }
        }
        flat.push(v.join("bin/llama-server"));
    }
    native
        .into_iter()
        .chain(avx2)
        .chain(flat)
        .filter(|p| p.is_file())
        .collect()
}

/// This CPU's feature flags from /proc/cpuinfo, sorted, one per line (as the build
/// script records them).
fn host_cpu_flags() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info
        .lines()
        .find(|l| l.starts_with("flags") || l.starts_with("Features"))?;
    let mut flags: Vec<&str> = line.split_once(':')?.1.split_whitespace().collect();
    flags.sort_unstable();
    flags.dedup();
    Some(flags.join("\n"))
}

fn host_has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
