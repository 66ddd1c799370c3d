//! KV that travels between workers (1.11): one worker asks a peer for the keys and
//! values of a token prefix the peer holds, instead of computing them again.
//!
//! **Compatibility.** KV is only meaningful to the weights and the arithmetic that
//! computed it. A worker announces what it can exchange as a [`KvFormat`] in its
//! heartbeat ([`crate::ServedModel::kv_format`]); its [`KvFormat::key`] names the
//! engine's numerics and layout version, the model file's SHA-256, the storage type
//! and the cache's shape. Only workers announcing equal keys exchange KV: a
//! coordinator pairs no others, and a source refuses a request whose key is not its
//! own ([`KvPullRequest::format`]). A LoRA adapter changes every key and value: a
//! request run with one names it and its own key ([`KvPullRequest::adapter_key`]:
//! name, scale and the adapter file's SHA-256), checked the same way.
//!
//! **The exchange.** Worker to worker, never through a coordinator: the puller sends
//! [`KvPullRequest`]s to `{p}.v1.kv.{source}.pull` (request/reply, a few in flight)
//! and each reply is one [`KvChunk`] under the server's `max_payload`, its bytes
//! digest-checked by the transport (`Sy-Digest`). A chunk carries whole blocks of
//! [`KvFormat::block_tokens`] tokens, or, when one block is larger than a chunk may
//! be, one part of one block.
//!
//! **Block bytes.** A block is its keys then its values, each `[layer][kv_head]
//! [position][head_dim]` of the storage type (`f16`: IEEE half floats, little-endian):
//! [`KvFormat::block_bytes`] in all.

use crate::WireError;
use serde::{Deserialize, Serialize};

/// The version of this exchange's own layout ([`KvChunk`] bytes); a source refuses
/// a request of another.
pub const KV_TRANSFER_VERSION: u32 = 1;

/// What KV a worker's model exports and imports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvFormat {
    /// The engine whose arithmetic computed the KV and its numerics/layout version,
    /// e.g. `switchyard-cpu/1` (every CPU kernel variant computes the same bits, so
    /// AVX2, AVX-512 and portable hosts share it).
    pub engine: String,
    /// SHA-256 of the model file (hex): the weights.
    pub model_sha256: String,
    /// The storage type of keys and values (`f16`).
    pub dtype: String,
    /// Layers, KV heads per layer and the width of one head.
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Tokens per block.
    pub block_tokens: u32,
    /// What else the keys depend on: RoPE base and dimensions, sliding window.
    #[serde(default)]
    pub params: String,
}

impl KvFormat {
    /// The compatibility key: equal keys exchange KV, others never.
    pub fn key(&self) -> String {
        format!(
            "kv{KV_TRANSFER_VERSION}|{}|{}|{}|{}x{}x{}|b{}|{}",
            self.engine,
            self.model_sha256,
            self.dtype,
            self.layers,
            self.kv_heads,
            self.head_dim,
            self.block_tokens,
            self.params
        )
    }

    /// Bytes of one block: keys and values of every layer and KV head.
    pub fn block_bytes(&self) -> usize {
        2 * self.layers as usize
            * self.kv_heads as usize
            * self.head_dim as usize
            * self.block_tokens as usize
            * self.dtype_bytes()
    }

    /// Bytes per token ([`Self::block_bytes`] / block tokens).
    pub fn token_bytes(&self) -> usize {
        self.block_bytes() / (self.block_tokens.max(1) as usize)
    }

    fn dtype_bytes(&self) -> usize {
        match self.dtype.as_str() {
            "f32" => 4,
            _ => 2,
        }
    }
}

/// How a puller cuts a transfer into chunks of at most `budget` bytes: `(blocks per
/// chunk, parts per block)` — several whole blocks per chunk, or one block in parts.
pub fn chunking(block_bytes: usize, budget: usize) -> (usize, usize) {
    let budget = budget.max(1);
    if block_bytes <= budget {
        ((budget / block_bytes.max(1)).max(1), 1)
    } else {
        (1, block_bytes.div_ceil(budget))
    }
}

/// Asks a worker for the KV of blocks `first_block..first_block + blocks` (or part
/// `part` of `parts` of block `first_block`) of a token prefix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvPullRequest {
    pub v: u32,
    /// The exchange's layout version ([`KV_TRANSFER_VERSION`]).
    pub transfer: u32,
    /// The request this pull serves (for logs and traces).
    #[serde(default)]
    pub request_id: String,
    /// The puller's [`KvFormat::key`]: the source refuses unless it is its own.
    pub format: String,
    /// The LoRA adapter the prefix was computed with (none: the base model).
    #[serde(default)]
    pub adapter: Option<String>,
    /// The adapter's key on the puller (name, scale, file SHA-256): the source
    /// refuses unless its adapter of that name has the same.
    #[serde(default)]
    pub adapter_key: Option<String>,
    /// The prefix's tokens, whole blocks (the source finds them by these).
    pub tokens: Vec<u32>,
    pub first_block: u32,
    /// Blocks asked for (with `parts` > 1: 1).
    pub blocks: u32,
    #[serde(default)]
    pub part: u32,
    /// Parts the block is cut into (1: whole blocks).
    #[serde(default = "one")]
    pub parts: u32,
    /// (1.14) The prefix's tail: `tokens` ends with this many tokens past its last
    /// whole block (fewer than a block), and the request asks for their KV alone
    /// (`first_block` is the block they start, `blocks` 0). 0: whole blocks.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tail: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

fn one() -> u32 {
    1
}

/// One chunk of a pull's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvChunk {
    pub v: u32,
    /// The source's [`KvFormat::key`].
    pub format: String,
    pub first_block: u32,
    /// Whole blocks in `data` (parts: 1, or 0 when the source no longer holds it).
    pub blocks: u32,
    #[serde(default)]
    pub part: u32,
    /// Leading blocks of the prefix the source held when it answered.
    pub held_blocks: u32,
    /// (1.14) Tokens of the prefix's tail in `data` (the answer to a request's
    /// `tail`: their keys then values, `[layer][kv_head][position][head_dim]`); 0
    /// when the source does not hold them or does not send tails.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tail: u32,
    /// The blocks' bytes (see the module docs), or the part's.
    #[serde(with = "bin")]
    pub data: Vec<u8>,
    /// Why nothing was sent (a format or adapter mismatch, a source that cannot
    /// export, a malformed request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
}

/// `Vec<u8>` as MessagePack `bin` (not an array of integers).
pub mod bin {
    use serde::de::{Error, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl<'de> Visitor<'de> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        d.deserialize_bytes(Bytes)
    }
}

/// A worker's KV transfers since it started, in its heartbeat's KV usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KvTransferStats {
    /// Pulls this worker made that imported KV, and the tokens and bytes imported.
    pub pulls: u64,
    pub pulled_tokens: u64,
    pub pulled_bytes: u64,
    /// Pulls given up (a refusal, a bad digest, a timeout, a source that no longer
    /// held the prefix, a link slower than computing): the rest was computed.
    pub pull_fallbacks: u64,
    /// Prefixes a peer held that this worker computed instead, as predicted faster.
    pub recomputed: u64,
    /// Chunks and bytes this worker served to peers.
    pub served_chunks: u64,
    pub served_bytes: u64,
    /// (1.12) Streams this worker handed to another while draining, streams it
    /// continued for a draining peer, and hand-overs that found no taker (the
    /// stream then finished here).
    pub handed_over: u64,
    pub taken_over: u64,
    pub handover_fallbacks: u64,
    /// (1.12) Disaggregated prefill: prompts this worker prefilled for decode
    /// workers, prompts it had a prefill worker compute, and those it computed
    /// itself after all (the prefill worker refused, failed or was too slow).
    pub prefills_served: u64,
    pub remote_prefills: u64,
    pub remote_prefill_fallbacks: u64,
    /// (1.13) Sessions this worker moved to another while draining, and sessions it
    /// adopted from a draining peer.
    pub sessions_moved: u64,
    pub sessions_adopted: u64,
}

/// (1.12) Asks a prefill worker (`{p}.v1.worker.{wid}.prefill`) to compute the KV of
/// a prompt, given as the asking worker's own tokens, and keep it for a pull.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefillRequest {
    pub v: u32,
    /// The request it serves (logs, traces; the pull names it too).
    pub request_id: String,
    /// The model it must serve.
    pub model: String,
    /// The asker's [`KvFormat::key`]: refused unless it is the prefill worker's own.
    pub format: String,
    #[serde(default)]
    pub adapter: Option<String>,
    /// The prompt's tokens.
    pub tokens: Vec<u32>,
    /// The Unix millisecond past which nobody waits for it (absent: none).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
}

/// (1.12) The answer to a [`PrefillRequest`]: the leading tokens whose KV the
/// prefill worker now holds, or why it computed none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefillReply {
    pub v: u32,
    pub worker_id: String,
    #[serde(default)]
    pub tokens: u32,
    /// Microseconds it took there.
    #[serde(default)]
    pub prefill_us: u64,
    #[serde(default)]
    pub error: Option<WireError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cut_whole_blocks_or_parts_of_one() {
        assert_eq!(chunking(100, 1000), (10, 1));
        assert_eq!(chunking(1000, 1000), (1, 1));
        assert_eq!(chunking(2500, 1000), (1, 3));
    }

    #[test]
    fn chunk_bytes_travel_as_bin() {
        let c = KvChunk {
            v: 1,
            format: "f".into(),
            first_block: 2,
            blocks: 1,
            part: 0,
            held_blocks: 3,
            data: (0..=255).collect(),
            error: None,
            tail: 0,
        };
        let bytes = crate::encode(&c);
        assert!(
            bytes.len() < 256 + 64,
            "bin, not an array of integers: {} bytes",
            bytes.len()
        );
        assert_eq!(crate::decode::<KvChunk>(&bytes).unwrap(), c);
    }

    #[test]
    fn the_key_names_everything_the_kv_depends_on() {
        let f = KvFormat {
            engine: "switchyard-cpu/1".into(),
            model_sha256: "ab".into(),
            dtype: "f16".into(),
            layers: 30,
            kv_heads: 3,
            head_dim: 64,
            block_tokens: 32,
            params: "rope=10000".into(),
        };
        assert_eq!(f.block_bytes(), 2 * 30 * 3 * 64 * 32 * 2);
        let other = |g: KvFormat| assert_ne!(g.key(), f.key());
        other(KvFormat {
            model_sha256: "cd".into(),
            ..f.clone()
        });
        other(KvFormat {
            engine: "switchyard-candle-cuda/1".into(),
            ..f.clone()
        });
        other(KvFormat {
            params: "rope=500000".into(),
            ..f.clone()
        });
    }
}
