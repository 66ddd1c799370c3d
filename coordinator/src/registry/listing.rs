//! What the registry tells about the fleet rather than routes: the live workers
//! (`status`), the models and adapters they serve (`models`), and the errors naming
//! what is served when a request asks for something no worker has.

use super::Registry;
use std::collections::HashMap;
use std::time::Instant;
use switchyard_messages::{ErrorCode, ModelEntry, WireError, WorkerView};

impl Registry {
    pub(super) fn unknown_model(&self, model: &str) -> WireError {
        let mut served: Vec<&str> = self
            .slots
            .iter()
            .filter_map(|s| s.worker.as_ref())
            .flat_map(|e| e.status.models.iter().map(|m| m.name.as_str()))
            .collect();
        served.sort_unstable();
        served.dedup();
        WireError::new(
            ErrorCode::UnknownModel,
            format!("no worker serves model {model:?}; served: {}", served.join(", ")),
        )
    }

    pub(super) fn unknown_adapter(&self, model: &str, adapter: &str) -> WireError {
        let mut loaded: Vec<String> = self
            .slots
            .iter()
            .filter_map(|s| s.worker.as_ref())
            .flat_map(|e| e.status.models.iter())
            .filter(|m| model.is_empty() || m.name == model)
            .flat_map(|m| m.adapters.iter().map(|a| format!("{}:{}", m.name, a.name)))
            .collect();
        loaded.sort_unstable();
        loaded.dedup();
        let loaded = if loaded.is_empty() {
            "none".to_string()
        } else {
            loaded.join(", ")
        };
        WireError::new(
            ErrorCode::UnknownModel,
            format!("no worker serving {model:?} has loaded the LoRA adapter {adapter:?}; loaded: {loaded}"),
        )
    }

    /// Every live worker, for `status`.
    pub fn views(&self, now: Instant) -> Vec<WorkerView> {
        let mut views: Vec<WorkerView> = self
            .slots
            .iter()
            .filter_map(|s| s.worker.as_ref())
            .map(|e| WorkerView {
                status: e.status.clone(),
                age_ms: now.duration_since(e.seen).as_millis() as u64,
            })
            .collect();
        views.sort_by(|a, b| a.status.worker_id.cmp(&b.status.worker_id));
        views
    }

    /// Models served by live workers, for `models`.
    pub fn models(&self) -> Vec<ModelEntry> {
        let mut by_name: HashMap<&str, ModelEntry> = HashMap::new();
        for e in self.slots.iter().filter_map(|s| s.worker.as_ref()) {
            for m in &e.status.models {
                let entry = by_name.entry(&m.name).or_insert_with(|| ModelEntry {
                    name: m.name.clone(),
                    workers: Vec::new(),
                    backends: Vec::new(),
                    info: m.info.clone(),
                    adapters: Vec::new(),
                });
                for a in &m.adapters {
                    let worker = e.status.worker_id.clone();
                    match entry.adapters.iter_mut().find(|x| x.name == a.name) {
                        Some(x) => x.workers.push(worker),
                        None => entry.adapters.push(switchyard_messages::AdapterEntry {
                            name: a.name.clone(),
                            workers: vec![worker],
                        }),
                    }
                }
                entry.workers.push(e.status.worker_id.clone());
                // Embeddable when any of its workers embeds.
                entry.info.embedding_dim = entry.info.embedding_dim.max(m.info.embedding_dim);
                entry.info.embedding_only &= m.info.embedding_only;
                if !entry.backends.contains(&e.status.backend) {
                    entry.backends.push(e.status.backend.clone());
                }
            }
        }
        let mut models: Vec<ModelEntry> = by_name.into_values().collect();
        for m in &mut models {
            m.workers.sort();
            m.adapters.sort_by(|a, b| a.name.cmp(&b.name));
            for a in &mut m.adapters {
                a.workers.sort();
            }
        }
        models.sort_by(|a, b| a.name.cmp(&b.name));
        models
    }
}
