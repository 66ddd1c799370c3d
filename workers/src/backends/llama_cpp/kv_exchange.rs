//! KV that travels between llama-server workers: the llama.cpp side of
//! [`KvTransfer`]. Only for a server this worker supervises (the `cuda` and `rocm`
//! backends, or either on the CPU with `gpu_allow_cpu`), started with
//! `--slot-save-path` in a directory of the worker's own, since llama-server saves and
//! restores slots only as files on its own disk.
//!
//! - **Format**: learned once the server is up, from a probe — a one-token completion
//!   on the last slot, saved and read back ([`slot_state`]): the layout (V transposed
//!   or not, rotations, types, row widths) goes into the format with the server's build,
//!   the SHA-256 of its binary, the device it computes on and the model's SHA-256, so
//!   KV moves only between servers of the same build on the same kind of device with
//!   the same weights. Only f16 keys and values of equal widths (the default cache),
//!   no sliding window (the slot book follows none), no LoRA adapter.
//! - **Export** (a peer pulls): the idle slots are saved, most recently used first,
//!   until one holds the asked prefix; its file is read into positions and cut into
//!   the exchange's blocks. What was read stays a while for the pull's next chunks
//!   (KV of a token prefix is that prefix's, whatever the slot did since).
//! - **Import** (this worker pulls): the blocks wait in memory until the generation
//!   they were pulled for; it writes them as a slot file, restores it into the slot
//!   the request takes, and the server computes only the rest.

use super::client::LlamaCppModel;
use super::exchange::{Exchange, Pending, BLOCK_TOKENS, MAX_PENDING, MAX_PENDING_BYTES, PENDING_FOR};
use super::slot_state::{self, SlotState};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use switchyard_backend::{BackendError, BackendFuture, KvBlocks, KvTransfer, Prompt};
use switchyard_messages::KvFormat;

impl LlamaCppModel {
    /// Turns the exchange on for a server started with `--slot-save-path dir` (made
    /// for it when `own_dir`: removed with the model), running the binary `bin` on
    /// `device`: the format is learned in the background (model and binary hashed, a
    /// probe saved), and KV travels once it is known.
    pub fn enable_kv_exchange(&self, dir: PathBuf, own_dir: bool, bin: PathBuf, device: String) {
        if self.shared.slots.is_none() {
            tracing::info!(url = %self.url(), "no KV exchange: the slot book follows nothing here");
            return;
        }
        if self.shared.exchange.set(Arc::new(Exchange::new(dir, own_dir))).is_err() {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            match this.learn_format(bin, device).await {
                Ok(format) => tracing::info!(url = %this.url(), key = %format.key(), "llama.cpp KV exchange ready"),
                Err(why) => tracing::info!(url = %this.url(), "no KV exchange for this llama-server: {why}"),
            }
        });
    }

    fn exchange(&self) -> Option<&Arc<Exchange>> {
        self.shared.exchange.get()
    }

    async fn learn_format(&self, bin: PathBuf, device: String) -> Result<KvFormat, String> {
        let ex = self.exchange().ok_or("no exchange")?.clone();
        let model = PathBuf::from(&self.props().model_path);
        let hashed = tokio::task::spawn_blocking(move || {
            let sha = |p: &PathBuf| {
                switchyard_engine::kv_transfer::weights_sha256(p).map_err(|e| format!("hashing {}: {e}", p.display()))
            };
            Ok::<_, String>((sha(&model)?, sha(&bin)?))
        })
        .await
        .map_err(|e| e.to_string())??;
        let (model_sha, bin_sha) = hashed;
        // The probe: one token on the last slot, saved and read back.
        let slot = self.props().total_slots.saturating_sub(1);
        let body = json!({"prompt": "Hello", "n_predict": 1, "id_slot": slot, "cache_prompt": true,
                          "temperature": 0.0});
        self.post("/completion", body)
            .await
            .map_err(|e| format!("probe: {e}"))?;
        let state = self.save_slot(&ex, slot).await?;
        let l = state.layout;
        if l.k_type != 1 || l.v_type != 1 || l.k_row != l.v_row {
            return Err(format!(
                "the cache is not f16 keys and values of one width (types {}/{}, rows {}/{} bytes)",
                l.k_type, l.v_type, l.k_row, l.v_row
            ));
        }
        let build = &self.props().build_info;
        let format = KvFormat {
            engine: format!("llama.cpp-{build}/{}/{device}", &bin_sha[..16.min(bin_sha.len())]),
            model_sha256: model_sha,
            dtype: "f16".into(),
            layers: l.layers,
            kv_heads: 1,
            head_dim: (l.k_row / 2) as u32,
            block_tokens: BLOCK_TOKENS as u32,
            params: format!("vtrans={},rot={}/{}", u8::from(l.v_trans), l.rot_k, l.rot_v),
        };
        debug_assert_eq!(format.block_bytes(), slot_state::block_bytes(&l, BLOCK_TOKENS));
        let _ = ex.format.set((format.clone(), l));
        Ok(format)
    }

    /// Saves slot `slot` and reads the file back (it is removed).
    async fn save_slot(&self, ex: &Exchange, slot: u32) -> Result<SlotState, String> {
        let name = ex.file_name("out");
        let path = ex.dir.join(&name);
        let saved = self
            .post(&format!("/slots/{slot}?action=save"), json!({ "filename": name }))
            .await;
        let read = tokio::task::spawn_blocking(move || {
            let bytes = std::fs::read(&path);
            let _ = std::fs::remove_file(&path);
            bytes
        });
        saved.map_err(|e| format!("saving slot {slot}: {e}"))?;
        let bytes = read
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("reading slot {slot}'s file: {e}"))?;
        tokio::task::spawn_blocking(move || slot_state::parse(&bytes))
            .await
            .map_err(|e| e.to_string())?
    }

    /// Writes `tokens`' KV as a slot file and restores it into slot `slot`.
    async fn restore_slot(&self, ex: &Exchange, slot: u32, tokens: &[u32], data: Vec<u8>) -> Result<(), String> {
        let (_, layout) = ex.format.get().ok_or("no format")?;
        let (layout, tokens) = (*layout, tokens.to_vec());
        let name = ex.file_name("in");
        let path = ex.dir.join(&name);
        let file = path.clone();
        tokio::task::spawn_blocking(move || {
            let bytes = slot_state::write(&layout, &tokens, &data, BLOCK_TOKENS)?;
            std::fs::write(&file, bytes).map_err(|e| format!("writing {}: {e}", file.display()))
        })
        .await
        .map_err(|e| e.to_string())??;
        let restored = self
            .post(&format!("/slots/{slot}?action=restore"), json!({ "filename": name }))
            .await;
        let _ = tokio::fs::remove_file(&path).await;
        restored.map(|_| ()).map_err(|e| format!("restoring slot {slot}: {e}"))
    }

    /// Before a completion of `value` on `slot`: when KV was pulled for its prefix,
    /// restores it there; returns the tokens restored (0: none).
    pub(super) async fn restore_pulled(&self, value: &serde_json::Value, slot: u32, adapter: Option<&str>) -> usize {
        let Some(ex) = self.exchange().filter(|ex| ex.has_pending()) else {
            return 0;
        };
        if adapter.is_some() {
            return 0;
        }
        let Ok(tokens) = self.server_tokens(value).await else {
            return 0;
        };
        let Some(p) = ex.take_pending(&tokens) else { return 0 };
        let n = p.blocks * BLOCK_TOKENS;
        match self.restore_slot(ex, slot, &p.tokens[..n], p.data).await {
            Ok(()) => n,
            Err(why) => {
                tracing::info!(url = %self.url(), slot, "pulled KV not restored, computing it: {why}");
                0
            }
        }
    }

    /// The state of an idle slot holding at least `need` leading tokens of `tokens`.
    async fn state_holding(&self, ex: &Exchange, tokens: &[u32], need: usize) -> Option<Arc<SlotState>> {
        if let Some(s) = ex.saved_covering(tokens, need) {
            return Some(s);
        }
        let _one = ex.sweep.lock().await;
        if let Some(s) = ex.saved_covering(tokens, need) {
            return Some(s);
        }
        let book = self.shared.slots.as_ref()?;
        for slot in book.idle_slots_recent_first() {
            let state = match self.save_slot(ex, slot).await {
                Ok(state) => state,
                Err(why) => {
                    tracing::info!(url = %self.url(), slot, "slot not read for a peer: {why}");
                    continue;
                }
            };
            let covers = state.shared_prefix(tokens) >= need;
            let state = Arc::new(state);
            ex.keep_saved(state.clone());
            if covers {
                return Some(state);
            }
        }
        None
    }
}

impl LlamaCppModel {
    /// The exchange, for KV computed without an adapter, once its format is known.
    fn ready(&self, adapter: Option<&str>) -> Result<Arc<Exchange>, BackendError> {
        if let Some(a) = adapter {
            return Err(no_adapter(a));
        }
        let ex = self
            .exchange()
            .ok_or_else(|| BackendError::Unavailable("this llama-server exchanges no KV".into()))?;
        if ex.format.get().is_none() {
            return Err(BackendError::Unavailable("the KV format is not known yet".into()));
        }
        Ok(ex.clone())
    }
}

fn no_adapter(what: &str) -> BackendError {
    BackendError::Invalid(format!(
        "llama.cpp workers exchange no KV computed with a LoRA adapter ({what})"
    ))
}

impl KvTransfer for LlamaCppModel {
    fn kv_format(&self) -> Option<KvFormat> {
        self.exchange()?.format.get().map(|(f, _)| f.clone())
    }

    fn adapter_key(&self, name: &str) -> Result<String, BackendError> {
        Err(no_adapter(name))
    }

    fn prompt_tokens(&self, prompt: &Prompt) -> BackendFuture<Vec<u32>> {
        let (this, prompt) = (self.clone(), prompt.clone());
        Box::pin(async move {
            let value = this.render(&prompt).await?;
            this.server_tokens(&value).await
        })
    }

    /// What a pull would not fetch: nothing — a pull here fetches the prefix from its
    /// start, as a restore replaces the slot's whole content.
    fn held_prefix(&self, _tokens: Vec<u32>, _adapter: Option<String>) -> BackendFuture<usize> {
        Box::pin(async { Ok(0) })
    }

    fn export_kv(
        &self,
        tokens: Vec<u32>,
        adapter: Option<String>,
        first: usize,
        count: usize,
    ) -> BackendFuture<KvBlocks> {
        let this = self.clone();
        Box::pin(async move {
            let ex = this.ready(adapter.as_deref())?;
            let need = (first + 1) * BLOCK_TOKENS;
            let Some(state) = this.state_holding(&ex, &tokens, need).await else {
                return Ok(KvBlocks {
                    first_block: first,
                    ..KvBlocks::default()
                });
            };
            let held = state.shared_prefix(&tokens) / BLOCK_TOKENS;
            let count = count.min(held.saturating_sub(first));
            let data = tokio::task::spawn_blocking(move || state.blocks(first, count, BLOCK_TOKENS))
                .await
                .map_err(|e| BackendError::Compute(e.to_string()))?;
            Ok(KvBlocks {
                first_block: first,
                count,
                data,
                held_blocks: held,
            })
        })
    }

    fn import_kv(&self, tokens: Vec<u32>, adapter: Option<String>, blocks: KvBlocks) -> BackendFuture<usize> {
        let this = self.clone();
        Box::pin(async move {
            let ex = this.ready(adapter.as_deref())?;
            let bytes = ex.format.get().map_or(0, |(f, _)| f.block_bytes());
            if blocks.data.len() != blocks.count * bytes
                || (blocks.first_block + blocks.count) * BLOCK_TOKENS > tokens.len()
            {
                return Err(BackendError::Invalid(format!(
                    "{} bytes for blocks {}..{} of a {}-token prefix",
                    blocks.data.len(),
                    blocks.first_block,
                    blocks.first_block + blocks.count,
                    tokens.len()
                )));
            }
            let mut pending = ex.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending.retain(|p| p.at.elapsed() < PENDING_FOR);
            let at = pending.iter().position(|p| p.tokens == tokens);
            let p = match at {
                Some(i) => &mut pending[i],
                None if blocks.first_block == 0 => {
                    if pending.len() >= MAX_PENDING {
                        pending.remove(0);
                    }
                    pending.push(Pending {
                        tokens,
                        data: Vec::new(),
                        blocks: 0,
                        at: Instant::now(),
                    });
                    pending.last_mut().expect("just pushed")
                }
                None => {
                    return Err(BackendError::Invalid(format!(
                        "block {} of a prefix whose first blocks never came",
                        blocks.first_block
                    )))
                }
            };
            if blocks.first_block != p.blocks {
                return Err(BackendError::Invalid(format!(
                    "block {} after {} blocks",
                    blocks.first_block, p.blocks
                )));
            }
            p.data.extend_from_slice(&blocks.data);
            p.blocks += blocks.count;
            p.at = Instant::now();
            let held = p.blocks;
            let total: usize = pending.iter().map(|p| p.data.len()).sum();
            if total > MAX_PENDING_BYTES {
                // Over the bound: the oldest waiting prefixes go first (this one too
                // if it alone is over).
                while pending.iter().map(|p| p.data.len()).sum::<usize>() > MAX_PENDING_BYTES && !pending.is_empty() {
                    pending.remove(0);
                }
                return Err(BackendError::Overloaded(format!(
                    "pulled KV waiting here is over {} MiB",
                    MAX_PENDING_BYTES >> 20
                )));
            }
            Ok(held)
        })
    }
}
