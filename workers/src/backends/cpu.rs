//! The `cpu` backend: switchyard's own engine ([`crate::engine`]).

use crate::engine::EngineModel;
use std::path::Path;
use std::sync::Arc;
use switchyard_messages::{Backend, BackendError, LoadConfig, TextModel};

/// The CPU engine as a backend (registry name `"cpu"`).
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn available(&self) -> bool {
        true
    }

    fn load_model(&self, path: &Path, config: &LoadConfig) -> Result<Arc<dyn TextModel>, BackendError> {
        Ok(Arc::new(EngineModel::load(path, config)?))
    }
}
