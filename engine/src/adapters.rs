//! The LoRA adapters a loaded model serves: loaded at start or at run time, looked
//! up by name when a generation is submitted (the job holds its adapter, so one
//! unloaded meanwhile still finishes the requests that started with it).

use crate::model::lora::LoraAdapter;
use crate::model::params::LlamaParams;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use switchyard_backend::BackendError;
use switchyard_messages::ServedAdapter;

/// A model's adapters.
pub struct Adapters {
    /// The base model's shape, when its forward pass applies adapters.
    base: Option<LlamaParams>,
    /// Which forward pass, for the error when it applies none.
    kind: &'static str,
    loaded: Mutex<BTreeMap<String, (Arc<LoraAdapter>, ServedAdapter)>>,
}

impl Adapters {
    /// The adapters of a model shaped `base` (`None`: the `kind` pass applies none).
    pub fn new(base: Option<LlamaParams>, kind: &'static str) -> Self {
        Self {
            base,
            kind,
            loaded: Mutex::default(),
        }
    }

    /// Reads the adapter at `path` (a PEFT directory or a GGUF LoRA) and serves it as
    /// `name`, replacing one of that name. Blocking: it reads the whole file.
    pub fn load(&self, name: &str, path: &str, scale: f32) -> Result<ServedAdapter, BackendError> {
        switchyard_messages::check_adapter_name(name).map_err(|e| BackendError::Invalid(e.message))?;
        let invalid = |why: String| BackendError::Invalid(format!("LoRA adapter {name:?} ({path}): {why}"));
        let Some(base) = &self.base else {
            return Err(invalid(format!("the {} engine applies no LoRA adapters", self.kind)));
        };
        if !scale.is_finite() {
            return Err(invalid(format!("scale {scale} is not a finite number")));
        }
        if !Path::new(path).exists() {
            return Err(invalid("no such file or directory".into()));
        }
        let adapter = LoraAdapter::load(name, Path::new(path), base, scale).map_err(invalid)?;
        let served = ServedAdapter {
            name: name.to_string(),
            path: path.to_string(),
            scale,
            exclusive: false,
        };
        self.lock()
            .insert(name.to_string(), (Arc::new(adapter), served.clone()));
        tracing::info!(adapter = name, path, scale, "LoRA adapter loaded");
        Ok(served)
    }

    /// Stops serving `name`.
    pub fn unload(&self, name: &str) -> Result<(), BackendError> {
        match self.lock().remove(name) {
            Some(_) => {
                tracing::info!(adapter = name, "LoRA adapter unloaded");
                Ok(())
            }
            None => Err(BackendError::Invalid(format!("no LoRA adapter {name:?} is loaded"))),
        }
    }

    /// The adapter a request names (none: the base model).
    pub fn get(&self, name: Option<&str>) -> Result<Option<Arc<LoraAdapter>>, BackendError> {
        let Some(name) = name else { return Ok(None) };
        match self.lock().get(name) {
            Some((a, _)) => Ok(Some(a.clone())),
            None => Err(BackendError::Invalid(format!("no LoRA adapter {name:?} is loaded"))),
        }
    }

    /// What is loaded, by name.
    pub fn list(&self) -> Vec<ServedAdapter> {
        self.lock().values().map(|(_, s)| s.clone()).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (Arc<LoraAdapter>, ServedAdapter)>> {
        self.loaded.lock().unwrap_or_else(|p| p.into_inner())
    }
}
