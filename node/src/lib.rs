//! # switchyard-node — assembling coordinators and workers from a [`Config`]
//!
//! What `switchyard up`, `coordinator` and `worker` run, and what the benchmarks and
//! tests start in process: resolving the worker's model (a file, a directory or a
//! name in the fleet's store), loading it on the backend the registry picks, and
//! starting the WorkerActor and the CoordinatorActor. [`WorkerFlags`] are the
//! worker's command-line flags.

mod flags;

pub use flags::WorkerFlags;

use std::path::PathBuf;
use std::time::Duration;
use switchyard_config::Config;
use switchyard_coordinator::{CoordinatorHandle, CoordinatorOptions};
use switchyard_messages::Subjects;
use switchyard_workers::backends::Registry;
use switchyard_workers::{WorkerHandle, WorkerOptions};

pub use switchyard_workers::backends::Loaded;
pub use switchyard_workers::local::{cached_llama_servers, demo_model_path, find_llama_server, DEMO_MODEL_FILE};

/// The model file a worker serves (`worker.model`, or the demo model).
pub fn model_path(config: &Config) -> anyhow::Result<PathBuf> {
    switchyard_workers::local::model_path(&config.worker)
}

/// The name requests use for the model: `worker.model_name`, else the file stem.
pub fn model_name(config: &Config, path: &std::path::Path) -> String {
    switchyard_workers::local::model_name(&config.worker, path)
}

/// When `worker.model` is not a file or directory here but a model name, gets it
/// from the fleet's store (docs/models.md): the cached copy when its digest is the
/// store's, else fetched with progress on stderr and every SHA-256 checked. Then
/// `worker.model` points at the local copy and the model keeps its store name.
/// With the store unreachable, a cached copy is served (with a warning).
pub async fn resolve_model(config: &mut Config) -> anyhow::Result<()> {
    let model = config.worker.model.clone();
    if model.is_empty() || std::path::Path::new(&model).exists() || !switchyard_store::name::is_name(&model) {
        return Ok(());
    }
    // A store not reachable yet (a leaf node still linking to its hub, a cluster
    // electing its JetStream leader) is waited for, within STORE_WAIT.
    let started = std::time::Instant::now();
    let fetched = loop {
        match fetch(config, &model).await {
            Ok(f) => break f,
            // Only an unreachable store falls back to the cache: a model removed from the
            // store, or a newer version that failed its digest, is not served stale.
            Err(e) if store_refused(&e) => {
                return Err(e.context(format!("worker.model = {model:?} comes from the model store")))
            }
            Err(e) => match switchyard_store::fetch::cached(&config.store.cache_path(), &model) {
                Some(c) => {
                    tracing::warn!(model, error = %format!("{e:#}"), "the model store is unreachable; serving the cached copy");
                    eprintln!("warning: {e:#}; serving the cached copy of {model} ({})", c.manifest.short_digest());
                    break c;
                }
                None if started.elapsed() < STORE_WAIT => {
                    eprintln!("waiting for the model store: {e:#}");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                None => {
                    return Err(e.context(format!(
                        "worker.model = {model:?} is not a file or directory on this machine, so it was looked up in the model store"
                    )))
                }
            },
        }
    };
    if fetched.fetched_bytes > 0 {
        eprintln!(
            "fetched {model} from the model store: {:.1} MB, {}",
            fetched.fetched_bytes as f64 / 1e6,
            fetched.manifest.short_digest()
        );
    }
    tracing::info!(model, path = %fetched.path.display(), digest = %fetched.manifest.digest, "model from the store");
    config.worker.model = fetched.path.display().to_string();
    if config.worker.model_name.is_empty() {
        config.worker.model_name = model;
    }
    Ok(())
}

/// How long a worker waits for an unreachable model store before giving up.
const STORE_WAIT: Duration = Duration::from_secs(30);

/// Whether the store answered and said no (as opposed to being unreachable).
fn store_refused(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}");
    [
        "holds no model",
        "SHA-256",
        "does not match",
        "model name",
        "disk",
        "manifest",
        "has lost",
        "replaced or removed",
    ]
    .iter()
    .any(|s| text.contains(s))
}

async fn fetch(config: &Config, name: &str) -> anyhow::Result<switchyard_store::Fetched> {
    let nats = connect(config, "switchyard-worker-fetch").await?;
    switchyard_store::Store::new(nats, &config.store)
        .fetch(name, false)
        .await
}

/// A NATS connection as `config` says (URL, credentials, TLS), named `name` for the
/// server's monitoring, waiting up to 10 s for the server.
async fn connect(config: &Config, name: &str) -> anyhow::Result<async_nats::Client> {
    Ok(
        switchyard_fabric::nats::connect(&config.nats.url, &config.nats.security(), name, Duration::from_secs(10))
            .await?,
    )
}

/// Loads the worker's model on the backend the registry picks for
/// `worker.backend` (a pin, or `auto`), printing progress to stderr.
pub async fn load(config: &Config) -> anyhow::Result<Loaded> {
    if is_later_stage(config) {
        anyhow::bail!("a later pipeline stage serves no model of its own: start it with serve_stage");
    }
    if !config.worker.pipeline.is_empty() {
        // The first stage of a pipeline: its link to the stages after it has a
        // connection of its own (rows are bulky; requests keep theirs).
        let nats = connect(config, "switchyard-stage").await?;
        let subjects = Subjects::new(&config.nats.prefix);
        return switchyard_workers::backends::stage::load_first_stage(&config.worker, nats, &subjects).await;
    }
    Registry::default().load(&config.worker, &worker_id(config)).await
}

/// Whether the worker is a pipeline stage past the first (`worker.layers` not from
/// 0): it computes its layers for the first stage and serves no requests itself.
pub fn is_later_stage(config: &Config) -> bool {
    matches!(config.worker.stage_layers(), Ok(Some(r)) if r.start > 0)
}

/// Loads and serves a later pipeline stage.
pub async fn serve_stage(config: &Config) -> anyhow::Result<switchyard_workers::backends::stage::StageHandle> {
    let nats = connect(config, "switchyard-stage").await?;
    let id = if config.worker.id.is_empty() {
        switchyard_workers::worker::default_worker_id("stage")
    } else {
        config.worker.id.clone()
    };
    let subjects = Subjects::new(&config.nats.prefix);
    switchyard_workers::backends::stage::serve_stage(&config.worker, nats, &subjects, &id).await
}

/// The worker id: `worker.id`, else `{backend}-{host}-{pid}` (for `auto`, the
/// backend the registry picks).
pub fn worker_id(config: &Config) -> String {
    if config.worker.id.is_empty() {
        let backend = Registry::default()
            .select(&config.worker)
            .map(|b| b.kind().as_str())
            .unwrap_or(config.worker.backend.as_str());
        switchyard_workers::worker::default_worker_id(backend)
    } else {
        config.worker.id.clone()
    }
}

/// Starts a worker for a loaded model.
pub async fn start_worker(config: &Config, loaded: &Loaded) -> anyhow::Result<WorkerHandle> {
    let nats = connect(config, "switchyard-worker").await?;
    let opts = WorkerOptions {
        worker_id: worker_id(config),
        device: loaded.device.clone(),
        backend: loaded.backend,
        model_name: loaded.name.clone(),
        model_path: loaded.path.clone(),
        subjects: Subjects::new(&config.nats.prefix),
        heartbeat: Duration::from_millis(config.worker.heartbeat_ms),
        keepalive: Duration::from_millis(config.worker.keepalive_ms),
        coalesce: Duration::from_millis(config.worker.coalesce_ms),
        capacity: loaded.capacity,
        queue_depth: config.worker.queue_depth,
        session_idle: Duration::from_secs(config.worker.session_idle_secs),
        kv_pull: config.worker.kv_pull,
        handover: config.worker.handover,
        role: config.worker.role,
        limits: config.limits.clone(),
    };
    WorkerHandle::start(nats, loaded.model.clone(), opts).await
}

/// Starts a coordinator.
pub async fn start_coordinator(config: &Config) -> anyhow::Result<CoordinatorHandle> {
    let nats = connect(config, "switchyard-coordinator").await?;
    let opts = CoordinatorOptions::from_config(config);
    CoordinatorHandle::start(nats, opts).await
}

/// Catches Ctrl-C and SIGTERM from now on (call it before announcing readiness, so a
/// signal that arrives at once still shuts down cleanly); the future resolves on the
/// first of them. Must be called inside the tokio runtime.
///
/// The stop is bounded whatever the process is doing when the signal comes (loading
/// a model, answering a prompt, waiting on a NATS server that is gone): from the first
/// signal, a second one exits at once (status 130), and a process still running
/// `bound` later exits with status 1. Both say so on stderr.
pub fn shutdown_signal(bound: Duration) -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    let (first, signalled) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        tokio::select! {
            _ = recv(term.as_mut()) => {}
            _ = recv(int.as_mut()) => {}
        }
        let _ = first.send(());
        // A thread, not a task: it fires even if the runtime is wedged.
        std::thread::spawn(move || {
            std::thread::sleep(bound);
            eprintln!("still stopping after {} s: exiting now", bound.as_secs());
            exit_now(1);
        });
        tokio::select! {
            _ = recv(term.as_mut()) => {}
            _ = recv(int.as_mut()) => {}
        }
        eprintln!("second signal: exiting now");
        exit_now(130);
    });
    async move {
        // Never resolves without a signal (the sender lives until one comes).
        let _ = signalled.await;
    }
}

/// Exits without running exit handlers or destructors: compute threads may still
/// be running (children die with this process: they are started with a parent-death
/// signal).
fn exit_now(code: i32) -> ! {
    // SAFETY: _exit(2) ends the process at once; nothing after it runs.
    unsafe { libc::_exit(code) }
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
