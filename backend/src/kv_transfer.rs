//! The opt-in capability of a backend whose KV can travel ([`KvTransfer`]): it says
//! in which [`KvFormat`], reads the KV of a token prefix's blocks out, and takes
//! blocks a peer computed in. A worker asks its model for it
//! ([`crate::TextModel::kv_transfer`]) and never matches on the backend's name.
//!
//! Blocks are the wire's ([`switchyard_messages::kv_transfer`]): whole blocks of
//! [`KvFormat::block_tokens`] tokens, each its keys then its values; a prefix's
//! tail (fewer tokens than a block, past its last whole one) travels the same way,
//! as a block of that many positions.

use crate::{BackendError, BackendFuture, Prompt};
use switchyard_messages::KvFormat;

/// Blocks `first_block..first_block + count` of a prefix, read out of an engine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvBlocks {
    pub first_block: usize,
    pub count: usize,
    /// `count` blocks of [`KvFormat::block_bytes`] each.
    pub data: Vec<u8>,
    /// Leading blocks of the prefix the engine holds (slots or store).
    pub held_blocks: usize,
}

/// A model whose KV can be exported to and imported from peers of the same format.
pub trait KvTransfer: Send + Sync {
    /// The KV it exchanges; `None` while it cannot yet (its model's digest is still
    /// being computed) or at all.
    fn kv_format(&self) -> Option<KvFormat>;
    /// The key of the LoRA adapter `name` as loaded here (name, scale, file SHA-256);
    /// an error when it is not loaded.
    fn adapter_key(&self, name: &str) -> Result<String, BackendError>;
    /// The tokens a generation of `prompt` computes, as the engine will render and
    /// tokenize them.
    fn prompt_tokens(&self, prompt: &Prompt) -> BackendFuture<Vec<u32>>;
    /// Leading tokens of `tokens` (run with `adapter`) it holds already, in slots or
    /// its block store: what a generation would not compute.
    fn held_prefix(&self, tokens: Vec<u32>, adapter: Option<String>) -> BackendFuture<usize>;
    /// Reads blocks `first_block..first_block + blocks` of the prefix `tokens` (run
    /// with `adapter`) out, stopping at the first it does not hold.
    fn export_kv(
        &self,
        tokens: Vec<u32>,
        adapter: Option<String>,
        first_block: usize,
        blocks: usize,
    ) -> BackendFuture<KvBlocks>;
    /// Takes `blocks` (of the prefix `tokens`, run with `adapter`) computed by a peer
    /// of the same format into its block store, where the next generation over that
    /// prefix finds them; returns the leading blocks of the prefix it holds now.
    fn import_kv(&self, tokens: Vec<u32>, adapter: Option<String>, blocks: KvBlocks) -> BackendFuture<usize>;
    /// Reads the KV of the prefix's tail — the tokens of `tokens` past its last whole
    /// block, fewer than a block — out, as a block's bytes of that many positions,
    /// when it holds all of `tokens`; `None` when it does not, or sends no tails.
    fn export_tail(&self, tokens: Vec<u32>, adapter: Option<String>) -> BackendFuture<Option<Vec<u8>>> {
        let _ = (tokens, adapter);
        Box::pin(async { Ok(None) })
    }
    /// Takes the KV of `tokens`' tail, computed by a peer of the same format, in,
    /// after the whole blocks before it: the next generation over a prompt starting
    /// with `tokens` computes none of them. Returns whether it was taken.
    fn import_tail(&self, tokens: Vec<u32>, adapter: Option<String>, data: Vec<u8>) -> BackendFuture<bool> {
        let _ = (tokens, adapter, data);
        Box::pin(async { Ok(false) })
    }
}
