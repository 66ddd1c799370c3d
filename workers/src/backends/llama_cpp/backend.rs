//! The `llama_cpp` entry of the registry, and what a worker announces for a model
//! behind any llama.cpp server (also the `rocm` and `cuda` backends' own).

use super::client::LlamaCppModel;
use crate::backends::llama_server::supervisor::Supervisor;
use crate::backends::worker_backend::{Loaded, WorkerBackend};
use futures::future::BoxFuture;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use switchyard_config::WorkerConfig;
use switchyard_messages::{BackendKind, Device};

/// An llama.cpp server that already runs, at `worker.llama_url` (registry name
/// `llama_cpp`).
#[derive(Debug, Default, Clone, Copy)]
pub struct LlamaCppBackend;

impl WorkerBackend for LlamaCppBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::LlamaCpp
    }

    fn summary(&self) -> &'static str {
        "an llama.cpp server already running at --llama-url"
    }

    fn available(&self, w: &WorkerConfig) -> Result<(), String> {
        if w.llama_url.is_empty() {
            Err("worker.llama_url is not set".into())
        } else {
            Ok(())
        }
    }

    fn load<'a>(&'a self, w: &'a WorkerConfig, _worker_id: &'a str) -> BoxFuture<'a, anyhow::Result<Loaded>> {
        Box::pin(async move {
            use anyhow::Context;
            eprintln!("connecting to the llama.cpp server at {} …", w.llama_url);
            let model = LlamaCppModel::connect(&w.llama_url, Duration::from_secs(120))
                .await
                .with_context(|| format!("worker.llama_url = {}", w.llama_url))?;
            Ok(served(w, model, BackendKind::LlamaCpp, Device::LlamaCppServer, None))
        })
    }
}

/// A model behind a llama.cpp server: named after what the server reports, with the
/// server's slot count as capacity unless `worker.capacity` says otherwise.
pub(crate) fn served(
    w: &WorkerConfig,
    model: LlamaCppModel,
    backend: BackendKind,
    device: Device,
    supervisor: Option<Supervisor>,
) -> Loaded {
    let props = model.props().clone();
    let path = PathBuf::from(&props.model_path);
    let name = if !w.model_name.is_empty() {
        w.model_name.clone()
    } else {
        path.file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| props.model_alias.clone())
    };
    let capacity = if w.capacity > 0 {
        if w.capacity > props.total_slots {
            eprintln!(
                "note: worker.capacity {} exceeds the server's {} slots; the extra requests wait inside llama-server",
                w.capacity, props.total_slots
            );
        }
        w.capacity
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
        backend,
        device,
        capacity,
        supervisor,
    }
}
