//! What every backend gives the worker: [`WorkerBackend`] (kind, availability,
//! loading) and the [`Loaded`] model.

use super::llama_server::supervisor::Supervisor;
use futures::future::BoxFuture;
use std::path::PathBuf;
use std::sync::Arc;
use switchyard_backend::{BatchFuture, GenerateStream, TextModel};
use switchyard_config::WorkerConfig;
use switchyard_messages::{BackendKind, Device};

/// A loaded model, ready for a worker: what it serves and how it announces itself.
pub struct Loaded {
    /// The model.
    pub model: Arc<dyn TextModel>,
    /// Where it came from (a file, a directory, or the llama.cpp server's URL).
    pub path: PathBuf,
    /// The name requests use.
    pub name: String,
    /// The backend that loaded it.
    pub backend: BackendKind,
    /// The device the worker announces.
    pub device: Device,
    /// Requests computed at once: `worker.capacity`, else the backend's own.
    pub capacity: u32,
    /// The supervised llama-server of a `rocm` or `cuda` worker; stop it after the worker.
    pub supervisor: Option<Supervisor>,
}

impl Loaded {
    /// Stops what the model owns (a `rocm`/`cuda` worker's llama-server child). Call after
    /// the worker has shut down.
    pub fn stop(&mut self) {
        if let Some(mut s) = self.supervisor.take() {
            s.stop();
        }
    }
}

/// `worker.capacity` when set, else what the backend computes at once.
pub(crate) fn capacity(w: &WorkerConfig, own: u32) -> u32 {
    if w.capacity > 0 {
        w.capacity
    } else {
        own.max(1)
    }
}

/// `batch_generate` for backends that generate one stream per prompt: the streams
/// run together, each prompt gets its tokens or its own error.
pub(crate) fn batch_of_streams(streams: Vec<GenerateStream>) -> BatchFuture {
    Box::pin(async move {
        let jobs = streams.into_iter().map(switchyard_backend::collect_batch_result);
        futures::future::join_all(jobs).await
    })
}

/// A backend as a worker sees it.
pub trait WorkerBackend: Send + Sync {
    /// Its kind (registry key and routing rank).
    fn kind(&self) -> BackendKind;
    /// One line for `--help`: what it serves with.
    fn summary(&self) -> &'static str;
    /// `Ok` when it can run here with this configuration, else why not.
    fn available(&self, w: &WorkerConfig) -> Result<(), String>;
    /// Loads the worker's model, printing progress to stderr.
    fn load<'a>(&'a self, w: &'a WorkerConfig, worker_id: &'a str) -> BoxFuture<'a, anyhow::Result<Loaded>>;
}
