//! KV that travels between MLX workers: the MLX side of [`KvTransfer`], over the
//! bridge's `kv_*` ops (docs/protocol.md §14).
//!
//! - **Format**: the bridge learns its prompt cache's layout at load (one token on a
//!   fresh cache: dtype, layers, KV heads, head width; only plain `KVCache` layers —
//!   no rotating window, no quantized cache); the worker adds the SHA-256 of the
//!   directory's safetensors, hashed in the background. The engine names MLX's and
//!   mlx-lm's versions and the device (`cpu` or `gpu`), so KV moves only between
//!   bridges computing with the same arithmetic on the same weights.
//! - **Export** (a peer pulls): the bridge reads the blocks from whichever cache holds
//!   the prefix — the shared one, also while a generation runs on it (answered between
//!   two tokens), a session's — keys then values of every layer.
//! - **Import** (this worker pulls): the blocks wait in the bridge (≤ 4 prefixes,
//!   1 GiB, 60 s) until a generation whose prompt starts with them, which takes them
//!   as its cache and computes only the rest.
//! - **Adapters**: KV computed with a LoRA adapter travels under the adapter's key
//!   (name, scale, SHA-256 of its files), as between CPU workers.

use super::exchange::MlxKv;
use super::requests::token_ids;
use super::text_model::MlxModel;
use base64::Engine;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use switchyard_backend::{BackendError, BackendFuture, KvBlocks, KvTransfer, Prompt, TextModel};
use switchyard_messages::KvFormat;

impl MlxModel {
    /// Calls the running bridge.
    async fn kv_call(&self, body: Value) -> Result<Value, BackendError> {
        let (b, _) = self.supervisor().bridge()?;
        b.call(body).await
    }

    fn kv_state(&self) -> Result<&Arc<MlxKv>, BackendError> {
        self.kv
            .as_ref()
            .ok_or_else(|| BackendError::Unavailable("this MLX model's KV does not travel".into()))
    }

    fn block_bytes(&self) -> Result<usize, BackendError> {
        let kv = self.kv_state()?;
        kv.format
            .get()
            .map(KvFormat::block_bytes)
            .ok_or_else(|| BackendError::Unavailable("the KV format is not known yet".into()))
    }
}

impl KvTransfer for MlxModel {
    fn kv_format(&self) -> Option<KvFormat> {
        self.kv.as_ref()?.format.get().cloned()
    }

    fn adapter_key(&self, name: &str) -> Result<String, BackendError> {
        let kv = self.kv_state()?;
        let served = self.adapters().into_iter().find(|a| a.name == name);
        let Some(a) = served else {
            return Err(BackendError::Invalid(format!("no LoRA adapter {name:?} is loaded")));
        };
        let mut keys = kv.adapter_keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((path, scale, key)) = keys.get(name) {
            if *path == a.path && *scale == a.scale {
                return Ok(key.clone());
            }
        }
        let sha = switchyard_engine::kv_transfer::weights_sha256(Path::new(&a.path))
            .map_err(|e| BackendError::Unavailable(format!("reading adapter {name:?} at {}: {e}", a.path)))?;
        let key = format!("{name}|{}|{sha}", a.scale);
        keys.insert(name.to_string(), (a.path, a.scale, key.clone()));
        Ok(key)
    }

    fn prompt_tokens(&self, prompt: &Prompt) -> BackendFuture<Vec<u32>> {
        let body = super::requests::body("render", Some(prompt), json!({}));
        let this = self.clone();
        Box::pin(async move {
            let ev = this.kv_call(body).await?;
            token_ids(&ev["tokens"])
        })
    }

    fn held_prefix(&self, tokens: Vec<u32>, adapter: Option<String>) -> BackendFuture<usize> {
        let this = self.clone();
        Box::pin(async move {
            this.kv_state()?;
            let ev = this
                .kv_call(json!({"op": "kv_held", "tokens": tokens, "adapter": adapter}))
                .await?;
            Ok(ev["tokens"].as_u64().unwrap_or(0) as usize)
        })
    }

    fn export_kv(
        &self,
        tokens: Vec<u32>,
        adapter: Option<String>,
        first_block: usize,
        blocks: usize,
    ) -> BackendFuture<KvBlocks> {
        let this = self.clone();
        Box::pin(async move {
            let bytes = this.block_bytes()?;
            let ev = this
                .kv_call(json!({"op": "kv_export", "tokens": tokens, "adapter": adapter,
                                "first_block": first_block, "blocks": blocks}))
                .await?;
            let count = ev["blocks"].as_u64().unwrap_or(0) as usize;
            let data = base64::engine::general_purpose::STANDARD
                .decode(ev["data"].as_str().unwrap_or_default())
                .map_err(|e| BackendError::Compute(format!("the MLX bridge sent bad base64: {e}")))?;
            if data.len() != count * bytes {
                return Err(BackendError::Compute(format!(
                    "the MLX bridge sent {} bytes for {count} blocks of {bytes}",
                    data.len()
                )));
            }
            Ok(KvBlocks {
                first_block,
                count,
                data,
                held_blocks: ev["held_blocks"].as_u64().unwrap_or(0) as usize,
            })
        })
    }

    fn import_kv(&self, tokens: Vec<u32>, adapter: Option<String>, blocks: KvBlocks) -> BackendFuture<usize> {
        let this = self.clone();
        Box::pin(async move {
            let bytes = this.block_bytes()?;
            if blocks.data.len() != blocks.count * bytes {
                return Err(BackendError::Invalid(format!(
                    "{} bytes for {} blocks of {bytes}",
                    blocks.data.len(),
                    blocks.count
                )));
            }
            let data = base64::engine::general_purpose::STANDARD.encode(&blocks.data);
            let ev = this
                .kv_call(json!({"op": "kv_import", "tokens": tokens, "adapter": adapter,
                                "first_block": blocks.first_block, "blocks": blocks.count, "data": data}))
                .await?;
            Ok(ev["held_blocks"].as_u64().unwrap_or(0) as usize)
        })
    }

    fn export_tail(&self, tokens: Vec<u32>, adapter: Option<String>) -> BackendFuture<Option<Vec<u8>>> {
        let this = self.clone();
        Box::pin(async move {
            this.block_bytes()?;
            let ev = this
                .kv_call(json!({"op": "kv_export", "tail": true, "tokens": tokens, "adapter": adapter}))
                .await?;
            if ev["tail"].as_u64().unwrap_or(0) == 0 {
                return Ok(None);
            }
            let data = base64::engine::general_purpose::STANDARD
                .decode(ev["data"].as_str().unwrap_or_default())
                .map_err(|e| BackendError::Compute(format!("the MLX bridge sent bad base64: {e}")))?;
            Ok(Some(data))
        })
    }

    fn import_tail(&self, tokens: Vec<u32>, adapter: Option<String>, data: Vec<u8>) -> BackendFuture<bool> {
        let this = self.clone();
        Box::pin(async move {
            this.block_bytes()?;
            let data = base64::engine::general_purpose::STANDARD.encode(&data);
            let ev = this
                .kv_call(json!({"op": "kv_import", "tail": true, "tokens": tokens, "adapter": adapter, "data": data}))
                .await?;
            Ok(ev["taken"].as_bool().unwrap_or(false))
        })
    }
}
