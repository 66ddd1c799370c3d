//! Assembling coordinators and workers from a [`Config`].

use crate::nats_server::cache_dir;
use anyhow::{bail, Context};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_config::Config;
use switchyard_coordinator::{CoordinatorHandle, CoordinatorOptions};
use switchyard_messages::{Backend, LoadConfig, Subjects, TextModel};
use switchyard_workers::backends::llama_cpp::LlamaCppModel;
use switchyard_workers::backends::rocm::{RocmOptions, Supervisor};
use switchyard_workers::{CpuBackend, WorkerHandle, WorkerOptions};

/// File name of the demo model that `scripts/setup.sh` installs.
pub const DEMO_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The demo model's path: `$SWITCHYARD_DEMO_MODEL`, else the cache's `models/`.
pub fn demo_model_path() -> PathBuf {
    std::env::var_os("SWITCHYARD_DEMO_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("models").join(DEMO_MODEL_FILE))
}

/// The model file a worker serves (config or the demo model).
pub fn model_path(config: &Config) -> anyhow::Result<PathBuf> {
    let path = if config.worker.model.is_empty() {
        demo_model_path()
    } else {
        PathBuf::from(&config.worker.model)
    };
    if path.is_dir() && !path.join("config.json").is_file() {
        bail!(
            "worker.model = {} is a directory without config.json (expected a GGUF file or a Hugging Face model directory)",
            path.display()
        );
    }
    if !path.is_file() && !path.is_dir() {
        if config.worker.model.is_empty() {
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
pub fn model_name(config: &Config, path: &std::path::Path) -> String {
    if !config.worker.model_name.is_empty() {
        return config.worker.model_name.clone();
    }
    let name = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    name.map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "model".into())
}

/// A loaded model, ready for a worker: what it serves and how it announces itself.
pub struct Loaded {
    /// The model.
    pub model: Arc<dyn TextModel>,
    /// Where it came from (a file, a directory, or the llama.cpp server's URL).
    pub path: PathBuf,
    /// The name requests use.
    pub name: String,
    /// The device the worker announces: `cpu`, `llama_cpp`, `rocm:N`.
    pub device: String,
    /// Requests computed at once: `worker.capacity`, else the backend's own.
    pub capacity: u32,
    /// The supervised llama-server of a `rocm` worker; stop it after the worker.
    pub supervisor: Option<Supervisor>,
}

impl Loaded {
    /// Stops what the model owns (a `rocm` worker's llama-server child). Call after
    /// the worker has shut down.
    pub fn stop(&mut self) {
        if let Some(mut s) = self.supervisor.take() {
            s.stop();
        }
    }
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
pub fn cached_llama_servers(cache: &std::path::Path) -> Vec<PathBuf> {
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

/// Loads the worker's model on `worker.backend`, printing progress to stderr.
pub async fn load(config: &Config) -> anyhow::Result<Loaded> {
    let w = &config.worker;
    match w.backend.as_str() {
        "llama_cpp" => {
            eprintln!("connecting to the llama.cpp server at {} …", w.llama_url);
            let model = LlamaCppModel::connect(&w.llama_url, Duration::from_secs(120))
                .await
                .with_context(|| format!("worker.llama_url = {}", w.llama_url))?;
            Ok(served_by_llama_cpp(config, model, "llama_cpp".into(), None))
        }
        "rocm" => {
            let path = model_path(config)?;
            let bin = find_llama_server(&w.llama_server_bin)?;
            let worker_id = worker_id(config);
            let opts = RocmOptions {
                bin,
                model: path,
                device: w.gpu_device,
                gpu_layers: w.gpu_layers,
                context_len: w.context_len,
                parallel_slots: w.parallel_slots,
                threads: w.threads,
                extra_args: w.llama_server_args.split_whitespace().map(str::to_string).collect(),
                allow_cpu: w.rocm_allow_cpu,
                worker_id,
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
            let on_cpu = switchyard_workers::backends::rocm::rocm_devices().is_err();
            let device = format!("rocm:{}{}", w.gpu_device, if on_cpu { "(cpu)" } else { "" });
            let mut loaded = served_by_llama_cpp(config, model, device, Some(supervisor));
            loaded.path = model_path(config)?;
            if w.model_name.is_empty() {
                loaded.name = model_name(config, &loaded.path);
            }
            Ok(loaded)
        }
        _ => {
            let (model, path, name) = load_model(config).await?;
            let capacity = if config.worker.capacity > 0 {
                config.worker.capacity
            } else {
                model.parallel_slots().max(1)
            };
            Ok(Loaded {
                model,
                path,
                name,
                device: "cpu".into(),
                capacity,
                supervisor: None,
            })
        }
    }
}

/// A model behind a llama.cpp server: named after what the server reports, with the
/// server's slot count as capacity unless `worker.capacity` says otherwise.
fn served_by_llama_cpp(
    config: &Config,
    model: LlamaCppModel,
    device: String,
    supervisor: Option<Supervisor>,
) -> Loaded {
    let props = model.props().clone();
    let path = PathBuf::from(&props.model_path);
    let name = if !config.worker.model_name.is_empty() {
        config.worker.model_name.clone()
    } else {
        path.file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| props.model_alias.clone())
    };
    let capacity = if config.worker.capacity > 0 {
        if config.worker.capacity > props.total_slots {
            eprintln!(
                "note: worker.capacity {} exceeds the server's {} slots; the extra requests wait inside llama-server",
                config.worker.capacity, props.total_slots
            );
        }
        config.worker.capacity
    } else {
        props.total_slots
    };
    eprintln!(
        "serving {name} from {} ({} slots, context {} per slot)",
        model.url(),
        props.total_slots,
        props.n_ctx
    );
    Loaded {
        model: Arc::new(model),
        path,
        name,
        device,
        capacity,
        supervisor,
    }
}

/// Loads the worker's model on the CPU engine, printing progress to stderr.
pub async fn load_model(config: &Config) -> anyhow::Result<(Arc<dyn TextModel>, PathBuf, String)> {
    let path = model_path(config)?;
    let name = model_name(config, &path);
    let size = if path.is_dir() {
        std::fs::read_dir(&path)
            .map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    } else {
        std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0)
    };
    eprintln!("loading {} ({:.1} MB) on cpu …", path.display(), size as f64 / 1e6);
    let started = Instant::now();
    let load = LoadConfig {
        backend: config.worker.backend.clone(),
        context_len: config.worker.context_len,
        threads: config.worker.threads,
        parallel_slots: config.worker.parallel_slots,
        kv_cache_mb: config.worker.kv_cache_mb,
        ..LoadConfig::default()
    };
    let p = path.clone();
    let model = tokio::task::spawn_blocking(move || CpuBackend.load_model(&p, &load))
        .await
        .context("model loading task")??;
    let info = model.info();
    eprintln!(
        "loaded {name}: {} layers, hidden {}, vocab {}, context {}, {}-bit, {} kernels \
         (SWITCHYARD_CPU_ISA forces others), in {:.2} s",
        info.num_layers,
        info.hidden_size,
        info.vocab_size,
        info.context_len,
        info.quant_bits,
        info.kernels,
        started.elapsed().as_secs_f64()
    );
    Ok((model, path, name))
}

/// The worker id: `worker.id`, else `{backend}-{host}-{pid}`.
pub fn worker_id(config: &Config) -> String {
    if config.worker.id.is_empty() {
        switchyard_workers::worker::default_worker_id(&config.worker.backend)
    } else {
        config.worker.id.clone()
    }
}

/// Starts a worker for a loaded model.
pub async fn start_worker(config: &Config, loaded: &Loaded) -> anyhow::Result<WorkerHandle> {
    let nats = switchyard_actors::nats::connect(&config.nats.url, "switchyard-worker", Duration::from_secs(10)).await?;
    let opts = WorkerOptions {
        worker_id: worker_id(config),
        device: loaded.device.clone(),
        backend: config.worker.backend.clone(),
        model_name: loaded.name.clone(),
        model_path: loaded.path.clone(),
        subjects: Subjects::new(&config.nats.prefix),
        heartbeat: Duration::from_millis(config.worker.heartbeat_ms),
        keepalive: Duration::from_millis(config.worker.keepalive_ms),
        capacity: loaded.capacity,
        queue_depth: config.worker.queue_depth,
        session_idle: Duration::from_secs(config.worker.session_idle_secs),
    };
    WorkerHandle::start(nats, loaded.model.clone(), opts).await
}

/// Starts a coordinator.
pub async fn start_coordinator(config: &Config) -> anyhow::Result<CoordinatorHandle> {
    let nats =
        switchyard_actors::nats::connect(&config.nats.url, "switchyard-coordinator", Duration::from_secs(10)).await?;
    let opts = CoordinatorOptions {
        coordinator_id: switchyard_coordinator::default_coordinator_id(),
        subjects: Subjects::new(&config.nats.prefix),
        worker_expiry: Duration::from_millis(config.coordinator.worker_expiry_ms),
        admission_timeout: Duration::from_millis(config.coordinator.admission_timeout_ms),
        max_attempts: config.coordinator.max_attempts,
        kv_routing: config.coordinator.kv_routing,
    };
    CoordinatorHandle::start(nats, opts).await
}

/// Catches Ctrl-C and SIGTERM from now on (call it before announcing readiness, so a
/// signal that arrives at once still shuts down cleanly); the future resolves on the
/// first of them. Must be called inside the tokio runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    async move {
        tokio::select! {
            _ = recv(term.as_mut()) => {}
            _ = recv(int.as_mut()) => {}
        }
    }
}

/// The next delivery of `s`; never, without a handler.
async fn recv(s: Option<&mut tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}
