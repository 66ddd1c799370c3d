//! KV that leaves and enters the engine ([`KvTransfer`]): the blocks of a token
//! prefix read out of the slots or the block store for a peer, and blocks a peer
//! computed put into the block store, where the next generation over that prefix
//! restores them as it would its own (`reuse.rs`) — a memory copy instead of a
//! prefill.
//!
//! Only KV of the same weights and arithmetic is taken: the format names the
//! engine's numerics version, the model file's SHA-256 and the cache's shape
//! ([`KvFormat::key`]); the worker checks keys before anything reaches here, and an
//! import checks the sizes again. Block `b` is keyed in the store by this engine's
//! own chain of the prefix's tokens, so an imported block is found exactly where a
//! block this engine computed would be.

use super::block_store::{self, common_prefix, Stored, BLOCK_TOKENS};
use super::compute::{ComputeState, Job, KvOp};
use super::model::lora::LoraAdapter;
use super::model::params::LlamaParams;
use crate::EngineModel;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use switchyard_backend::{BackendError, BackendFuture, KvBlocks, KvTransfer, Prompt};
use switchyard_messages::KvFormat;
use tokio::sync::oneshot;

/// The version of the engine's KV numerics and layout: raised whenever a change
/// makes the keys and values it computes differ in any bit, so no worker imports KV
/// of another version.
pub const KV_NUMERICS_VERSION: u32 = 1;

/// The format of a model computed by the forward pass `kind` with `params`, whose
/// weights hash to `sha256`.
pub fn format(kind: &str, params: &LlamaParams, sha256: String) -> KvFormat {
    // The own pass is "switchyard"; candle's name their device ("candle-cuda").
    let engine = if kind == "switchyard" { "switchyard-cpu" } else { kind };
    KvFormat {
        engine: format!("{engine}/{KV_NUMERICS_VERSION}"),
        model_sha256: sha256,
        dtype: "f16".into(),
        layers: params.n_layer as u32,
        kv_heads: params.n_head_kv as u32,
        head_dim: params.head_dim as u32,
        block_tokens: BLOCK_TOKENS as u32,
        params: format!(
            "rope={}/{}/{}/{},swa={}/{}",
            params.rope_base,
            params.rope_dims,
            params.rope_base_swa,
            if params.rope_neox { "neox" } else { "norm" },
            params.swa_window,
            params.swa_pattern
        ),
    }
}

/// SHA-256 (hex) of a model file, or of a directory's weight files in name order.
pub fn weights_sha256(path: &Path) -> std::io::Result<String> {
    let mut files = if path.is_dir() {
        let mut f: Vec<_> = std::fs::read_dir(path)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors" || x == "gguf"))
            .collect();
        f.sort();
        f
    } else {
        vec![path.to_path_buf()]
    };
    if path.is_dir() && files.is_empty() {
        // A PEFT directory's adapter weights, whatever their extension.
        files = std::fs::read_dir(path)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
    }
    let mut sum = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for f in files {
        let mut file = std::fs::File::open(&f)?;
        loop {
            let n = std::io::Read::read(&mut file, &mut buf)?;
            if n == 0 {
                break;
            }
            sum.update(&buf[..n]);
        }
    }
    Ok(sum.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn to_bytes(out: &mut Vec<u8>, rows: &[u16]) {
    let at = out.len();
    out.resize(at + rows.len() * 2, 0);
    for (o, x) in out[at..].chunks_exact_mut(2).zip(rows) {
        o.copy_from_slice(&x.to_le_bytes());
    }
}

fn from_bytes(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect()
}

impl ComputeState {
    /// Answers a KV job.
    pub fn kv_op(&mut self, op: KvOp) {
        match op {
            KvOp::Held { tokens, adapter, reply } => {
                let _ = reply.send(self.held_prefix(&tokens, adapter.as_ref()));
            }
            KvOp::Export {
                tokens,
                adapter,
                first,
                count,
                reply,
            } => {
                let _ = reply.send(self.export(&tokens, adapter.as_ref(), first, count));
            }
            KvOp::Import {
                tokens,
                adapter,
                blocks,
                reply,
            } => {
                let _ = reply.send(self.import(&tokens, adapter.as_ref(), blocks));
            }
            KvOp::ExportTail { tokens, adapter, reply } => {
                let _ = reply.send(self.export_tail(&tokens, adapter.as_ref()));
            }
            KvOp::ImportTail {
                tokens,
                adapter,
                data,
                reply,
            } => {
                let _ = reply.send(self.import_tail(&tokens, adapter.as_ref(), &data));
            }
        }
    }

    /// The rows of `tokens` past its last whole block, from a slot holding all of it.
    fn export_tail(&self, tokens: &[u32], adapter: Option<&Arc<LoraAdapter>>) -> Option<Vec<u8>> {
        let whole = tokens.len() / BLOCK_TOKENS * BLOCK_TOKENS;
        let n = tokens.len() - whole;
        let (slot, held) = self.best_slot(tokens, adapter)?;
        if n == 0 || held < tokens.len() {
            return None;
        }
        let (k, v) = self.model.read_rows(slot, whole, n)?;
        let mut out = Vec::with_capacity((k.len() + v.len()) * 2);
        to_bytes(&mut out, &k);
        to_bytes(&mut out, &v);
        Some(out)
    }

    /// Keeps a peer's rows of `tokens` past its last whole block, for the generation
    /// that restores the blocks before them.
    fn import_tail(
        &mut self,
        tokens: &[u32],
        adapter: Option<&Arc<LoraAdapter>>,
        data: &[u8],
    ) -> Result<bool, BackendError> {
        let Some(p) = self.model.lora_base() else {
            return Err(BackendError::Unavailable("this engine cannot import KV".into()));
        };
        let whole = tokens.len() / BLOCK_TOKENS * BLOCK_TOKENS;
        let n = tokens.len() - whole;
        let rows = p.n_layer * p.n_head_kv * p.head_dim * n;
        if n == 0 || data.len() != rows * 4 {
            return Err(BackendError::Invalid(format!(
                "a KV tail of {n} tokens should be {} bytes, not {}",
                rows * 4,
                data.len()
            )));
        }
        if !self.store.enabled() {
            return Ok(false);
        }
        let hashes = block_store::chain(self.seed(adapter), &tokens[..whole]);
        let parent = hashes.last().copied().unwrap_or_else(|| self.seed(adapter));
        let (k, v) = data.split_at(rows * 2);
        self.store.put_tail(block_store::Tail {
            parent,
            tokens: tokens[whole..].to_vec(),
            k: from_bytes(k),
            v: from_bytes(v),
        });
        Ok(true)
    }

    /// The slot computed with `adapter` holding the most leading tokens of `tokens`,
    /// as far as a step could resume from them, and that many.
    fn best_slot(&self, tokens: &[u32], adapter: Option<&Arc<LoraAdapter>>) -> Option<(usize, usize)> {
        let id = adapter.map(|a| a.id);
        (0..self.slots.len())
            .filter(|&i| self.slots[i].adapter.as_ref().map(|a| a.id) == id)
            .map(|i| {
                (
                    i,
                    self.model.resumable(i, common_prefix(&self.slots[i].resident, tokens)),
                )
            })
            .max_by_key(|&(_, n)| n)
    }

    fn held_prefix(&self, tokens: &[u32], adapter: Option<&Arc<LoraAdapter>>) -> usize {
        let in_slot = self.best_slot(tokens, adapter).map_or(0, |(_, n)| n);
        let hashes = block_store::chain(self.seed(adapter), tokens);
        let stored = if self.store.enabled() {
            self.store.leading(&hashes) * BLOCK_TOKENS
        } else {
            0
        };
        in_slot.max(stored).min(tokens.len())
    }

    /// The store's chain seed for KV computed with `adapter`.
    fn seed(&self, adapter: Option<&Arc<LoraAdapter>>) -> u64 {
        super::reuse::seed(self.kv_seed, adapter)
    }

    fn export(&mut self, tokens: &[u32], adapter: Option<&Arc<LoraAdapter>>, first: usize, count: usize) -> KvBlocks {
        let hashes = block_store::chain(self.seed(adapter), tokens);
        let slot = self.best_slot(tokens, adapter);
        let block = |s: &Self, b: usize| -> Option<(Vec<u16>, Vec<u16>)> {
            let from_slot = slot
                .filter(|&(_, n)| n >= (b + 1) * BLOCK_TOKENS)
                .and_then(|(i, _)| s.model.read_rows(i, b * BLOCK_TOKENS, BLOCK_TOKENS));
            from_slot.or_else(|| match s.store.peek(*hashes.get(b)?)? {
                Stored::Rows { k, v } => Some((k.clone(), v.clone())),
                Stored::Page(p) => {
                    let (k, v) = p.rows();
                    Some((k.to_vec(), v.to_vec()))
                }
            })
        };
        let held_blocks = (0..hashes.len())
            .take_while(|&b| self.holds_block(slot, &hashes, b))
            .count();
        let mut out = KvBlocks {
            first_block: first,
            held_blocks,
            ..KvBlocks::default()
        };
        for b in first..(first + count).min(hashes.len()) {
            let Some((k, v)) = block(self, b) else { break };
            to_bytes(&mut out.data, &k);
            to_bytes(&mut out.data, &v);
            out.count += 1;
        }
        out
    }

    fn holds_block(&self, slot: Option<(usize, usize)>, hashes: &[u64], b: usize) -> bool {
        slot.is_some_and(|(_, n)| n >= (b + 1) * BLOCK_TOKENS) || self.store.contains(hashes[b])
    }

    fn import(
        &mut self,
        tokens: &[u32],
        adapter: Option<&Arc<LoraAdapter>>,
        blocks: KvBlocks,
    ) -> Result<usize, BackendError> {
        let Some(p) = self.model.lora_base() else {
            return Err(BackendError::Unavailable("this engine cannot import KV".into()));
        };
        let rows = p.n_layer * p.n_head_kv * p.head_dim * BLOCK_TOKENS;
        let want = blocks.count * rows * 2 * 2;
        if blocks.data.len() != want {
            return Err(BackendError::Invalid(format!(
                "{} KV blocks should be {want} bytes, not {}",
                blocks.count,
                blocks.data.len()
            )));
        }
        if !self.store.enabled() {
            return Err(BackendError::Unavailable(
                "the block store is off (kv_cache_mb = 0): nowhere to put imported KV".into(),
            ));
        }
        let hashes = block_store::chain(self.seed(adapter), tokens);
        if blocks.first_block + blocks.count > hashes.len() {
            return Err(BackendError::Invalid("KV blocks past the prefix's tokens".into()));
        }
        // A generation restores the store's blocks from the prefix's start: the head a
        // slot holds (what was not pulled) goes in first.
        if let Some((slot, held)) = self.best_slot(tokens, adapter) {
            let head = blocks.first_block.min(held / BLOCK_TOKENS);
            for (b, &hash) in hashes.iter().enumerate().take(head) {
                if self.store.contains(hash) {
                    continue;
                }
                let block = match self.model.page(slot, b) {
                    Some(page) => Some(Stored::Page(page)),
                    None => self
                        .model
                        .read_rows(slot, b * BLOCK_TOKENS, BLOCK_TOKENS)
                        .map(|(k, v)| Stored::Rows { k, v }),
                };
                if let Some(block) = block {
                    self.store.put(hash, block);
                }
            }
        }
        for (i, block) in blocks.data.chunks_exact(rows * 4).enumerate() {
            let (k, v) = block.split_at(rows * 2);
            let data = Stored::Rows {
                k: from_bytes(k),
                v: from_bytes(v),
            };
            self.store.put(hashes[blocks.first_block + i], data);
        }
        Ok(self.store.leading(&hashes))
    }
}

impl EngineModel {
    fn send_kv(&self, op: KvOp) -> bool {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Job::Kv(op))
            .is_ok()
    }

    fn adapter_for(&self, name: Option<&str>) -> Result<Option<Arc<LoraAdapter>>, BackendError> {
        self.adapters.get(name)
    }

    /// Sends the KV job `op` makes (with the adapter `adapter` names) and returns its
    /// answer: an unknown adapter, or a stopped compute thread, as an error.
    fn ask_kv<T: Send + 'static>(
        &self,
        adapter: Option<String>,
        op: impl FnOnce(Option<Arc<LoraAdapter>>, oneshot::Sender<T>) -> KvOp,
    ) -> impl std::future::Future<Output = Result<T, BackendError>> + Send + 'static {
        let (reply, rx) = oneshot::channel();
        let sent = self.adapter_for(adapter.as_deref()).map(|a| self.send_kv(op(a, reply)));
        async move {
            match sent? {
                true => rx.await.map_err(|_| stopped()),
                false => Err(stopped()),
            }
        }
    }
}

fn stopped() -> BackendError {
    BackendError::Unavailable("the compute thread has stopped".into())
}

impl KvTransfer for EngineModel {
    fn kv_format(&self) -> Option<KvFormat> {
        self.kv_format.get().cloned()
    }

    fn adapter_key(&self, name: &str) -> Result<String, BackendError> {
        let Some(a) = self.adapter_for(Some(name))? else {
            return Err(BackendError::Invalid(format!("no LoRA adapter {name:?} is loaded")));
        };
        let mut keys = self.adapter_keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = keys.get(&a.id) {
            return Ok(k.clone());
        }
        let served = self.adapters.list().into_iter().find(|s| s.name == name);
        let path = served.map(|s| s.path).unwrap_or_default();
        let sha = weights_sha256(Path::new(&path))
            .map_err(|e| BackendError::Unavailable(format!("reading adapter {name:?} at {path}: {e}")))?;
        let key = format!("{name}|{}|{sha}", a.scale);
        keys.insert(a.id, key.clone());
        Ok(key)
    }

    fn prompt_tokens(&self, prompt: &Prompt) -> BackendFuture<Vec<u32>> {
        let tokens = super::compute::tokenize_prompt(&self.tokenizer, &self.template, prompt);
        Box::pin(std::future::ready(tokens))
    }

    fn held_prefix(&self, tokens: Vec<u32>, adapter: Option<String>) -> BackendFuture<usize> {
        let answer = self.ask_kv(adapter, |adapter, reply| KvOp::Held { tokens, adapter, reply });
        Box::pin(answer)
    }

    fn export_kv(
        &self,
        tokens: Vec<u32>,
        adapter: Option<String>,
        first: usize,
        count: usize,
    ) -> BackendFuture<KvBlocks> {
        let answer = self.ask_kv(adapter, |adapter, reply| KvOp::Export {
            tokens,
            adapter,
            first,
            count,
            reply,
        });
        Box::pin(answer)
    }

    fn import_kv(&self, tokens: Vec<u32>, adapter: Option<String>, blocks: KvBlocks) -> BackendFuture<usize> {
        let answer = self.ask_kv(adapter, |adapter, reply| KvOp::Import {
            tokens,
            adapter,
            blocks,
            reply,
        });
        Box::pin(async move { answer.await? })
    }

    fn export_tail(&self, tokens: Vec<u32>, adapter: Option<String>) -> BackendFuture<Option<Vec<u8>>> {
        let answer = self.ask_kv(adapter, |adapter, reply| KvOp::ExportTail { tokens, adapter, reply });
        Box::pin(answer)
    }

    fn import_tail(&self, tokens: Vec<u32>, adapter: Option<String>, data: Vec<u8>) -> BackendFuture<bool> {
        let answer = self.ask_kv(adapter, |adapter, reply| KvOp::ImportTail {
            tokens,
            adapter,
            data,
            reply,
        });
        Box::pin(async move { answer.await? })
    }
}
