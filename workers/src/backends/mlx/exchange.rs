//! The MLX KV exchange's state ([`MlxKv`]): the layout the bridge said at load, the
//! format once the weights are hashed, and the adapters' keys. The exchange itself is
//! `kv_exchange`.

use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use switchyard_messages::KvFormat;

/// What the bridge said of its KV at load, and the format once the weights are hashed.
pub(super) struct MlxKv {
    /// The bridge's `info.kv`: `dtype`, `layers`, `kv_heads`, `head_dim`,
    /// `block_tokens`, `engine`, `params`.
    layout: Value,
    pub(super) format: OnceLock<KvFormat>,
    /// Adapter name → (path, scale, key), hashed once per load.
    pub(super) adapter_keys: Mutex<HashMap<String, (String, f32, String)>>,
}

impl MlxKv {
    /// From the bridge's load info: `None` when its KV cannot travel.
    pub(super) fn from_info(info: &Value) -> Option<Arc<Self>> {
        let layout = info.get("kv").filter(|v| v.is_object())?.clone();
        Some(Arc::new(Self {
            layout,
            format: OnceLock::new(),
            adapter_keys: Mutex::default(),
        }))
    }

    /// Hashes the model directory's weights (in the background) and sets the format.
    pub(super) fn learn_format(self: &Arc<Self>, dir: PathBuf) {
        let me = self.clone();
        tokio::task::spawn_blocking(move || match switchyard_engine::kv_transfer::weights_sha256(&dir) {
            Ok(sha) => {
                let format = me.format_with(sha);
                tracing::info!(key = %format.key(), "MLX KV exchange ready");
                let _ = me.format.set(format);
            }
            Err(e) => tracing::warn!("no MLX KV exchange: hashing {}: {e}", dir.display()),
        });
    }

    fn format_with(&self, model_sha256: String) -> KvFormat {
        let l = &self.layout;
        let n = |k: &str| l[k].as_u64().unwrap_or(0) as u32;
        let s = |k: &str| l[k].as_str().unwrap_or_default().to_string();
        KvFormat {
            engine: s("engine"),
            model_sha256,
            dtype: s("dtype"),
            layers: n("layers"),
            kv_heads: n("kv_heads"),
            head_dim: n("head_dim"),
            block_tokens: n("block_tokens"),
            params: s("params"),
        }
    }
}
