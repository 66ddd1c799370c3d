//! KV-aware routing: which prompt prefixes a worker holds warm.
//!
//! A request's *routing key* is its prompt as the client sent it: the raw prompt, or
//! each chat message as `role \0 content \0`. Both sides cut the key into blocks of
//! [`BLOCK_BYTES`] and hash them chained (block `i`'s hash covers blocks `0..=i` and
//! the model name), so equal hashes mean equal prefixes of the same model. Workers
//! announce the blocks they hold warm as sequence-numbered [`KvEvent`]s on
//! `{p}.v1.kv.{wid}`; a coordinator that misses one asks `{p}.v1.kv.{wid}.snapshot`
//! for a [`KvSnapshot`]. Coordinators hash each request the same way and prefer the
//! worker holding the longest run of its leading blocks, weighed against load.
//!
//! Bytes, not tokens: the coordinator has no tokenizer, and the same bytes always
//! render and tokenize to the same tokens on one model.

use crate::Message;
use serde::{Deserialize, Serialize};

/// Bytes per routing block.
pub const BLOCK_BYTES: usize = 256;

/// A request's routing key: the raw prompt, or the messages as `role \0 content \0`.
pub fn routing_key(prompt: Option<&str>, messages: Option<&[Message]>) -> Vec<u8> {
    let mut key = Vec::new();
    if let Some(p) = prompt {
        key.extend_from_slice(p.as_bytes());
    }
    for m in messages.unwrap_or_default() {
        key.extend_from_slice(m.role.as_bytes());
        key.push(0);
        key.extend_from_slice(m.content.as_bytes());
        key.push(0);
    }
    key
}

const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Continues an FNV-1a hash `h` over `bytes`.
fn fnv1a_from(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h = (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME);
    }
    h
}

/// The 64-bit FNV-1a hash of `bytes` (a cache key, not a cryptographic digest).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_from(FNV_OFFSET, bytes)
}

/// Chained FNV-1a hashes of every complete block of `key`.
pub fn prefix_blocks(key: &[u8]) -> Vec<u64> {
    let mut h = FNV_OFFSET;
    key.chunks_exact(BLOCK_BYTES)
        .map(|block| {
            h = fnv1a_from(h, block);
            h
        })
        .collect()
}

/// How many leading blocks of `blocks` satisfy `held`.
pub fn leading_overlap(blocks: &[u64], held: impl Fn(u64) -> bool) -> usize {
    blocks.iter().take_while(|b| held(**b)).count()
}

/// Blocks a worker started or stopped holding warm (`{p}.v1.kv.{wid}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvEvent {
    /// Protocol version.
    pub v: u32,
    /// The worker.
    pub worker_id: String,
    /// 1 for the worker's first event, then +1 per event; a gap means one was lost.
    pub seq: u64,
    /// Block hashes now held.
    #[serde(default)]
    pub stored: Vec<u64>,
    /// Block hashes no longer held.
    #[serde(default)]
    pub removed: Vec<u64>,
}

/// Everything a worker holds warm, as of event `seq` (reply on `{p}.v1.kv.{wid}.snapshot`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvSnapshot {
    /// Protocol version.
    pub v: u32,
    /// The worker.
    pub worker_id: String,
    /// The last event this snapshot includes.
    pub seq: u64,
    /// Every block hash held.
    #[serde(default)]
    pub blocks: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_chain() {
        let text = "x".repeat(BLOCK_BYTES * 3 + 10);
        let a = prefix_blocks(text.as_bytes());
        assert_eq!(a.len(), 3, "only complete blocks");
        let mut other = text.clone().into_bytes();
        other[5] = b'y';
        let b = prefix_blocks(&other);
        assert!(
            a.iter().zip(&b).all(|(x, y)| x != y),
            "a change in block 0 changes every later hash"
        );
        let mut tail = text.clone().into_bytes();
        tail[BLOCK_BYTES * 2 + 1] = b'y';
        let c = prefix_blocks(&tail);
        assert_eq!(a[..2], c[..2]);
        assert_ne!(a[2], c[2]);
        assert_eq!(leading_overlap(&a, |h| c.contains(&h)), 2);
        let chat = routing_key(None, Some(&[Message::new("user", "hi")]));
        assert_eq!(chat, b"user\0hi\0");
    }
}
