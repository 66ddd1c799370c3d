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
//!
//! (1.9) A worker whose engine says what its KV cache really holds also announces
//! [`KvHolding`]s: each resident sequence (or chain of stored blocks) as the key it
//! was rendered from and, per held token, how many leading key bytes a request must
//! share to reuse it. From them a coordinator predicts, to the token, how much of a
//! request the worker will reuse ([`predict_reuse`]); it sends the prediction with
//! the forward and the worker reports it beside `cached_tokens`.

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
    adapter_blocks(None, key)
}

/// [`prefix_blocks`] of a request run with LoRA `adapter` (1.10): the chain starts
/// from the adapter's name, so no block is shared with the base model's or another
/// adapter's (their keys and values differ).
pub fn adapter_blocks(adapter: Option<&str>, key: &[u8]) -> Vec<u64> {
    let mut h = match adapter {
        Some(a) => fnv1a_from(fnv1a_from(FNV_OFFSET, b"lora\0"), a.as_bytes()),
        None => FNV_OFFSET,
    };
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

/// A request's prediction key: its routing key, and for chat the `assistant \0` turn
/// the generation prompt opens (a held conversation continues with the reply there).
pub fn prediction_key(prompt: Option<&str>, messages: Option<&[Message]>) -> Vec<u8> {
    let mut key = routing_key(prompt, messages);
    if messages.is_some() {
        key.extend_from_slice(ASSISTANT_TURN);
    }
    key
}

/// The key bytes that open an assistant turn (what a chat's generation prompt renders from).
pub const ASSISTANT_TURN: &[u8] = b"assistant\0";

/// One sequence a worker's KV cache holds, in routing terms (1.9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvHolding {
    /// Names this holding; a holding whose content changes gets a new id.
    pub id: u64,
    /// The prediction key its tokens were rendered from ([`prediction_key`]; a held
    /// reply continues it).
    pub key: String,
    /// Per held token `i`: the leading key bytes a request must share for tokens
    /// `0..=i` to be reused (a token of text: its bytes and the next byte; template
    /// text: the key up to the content it leads into). Non-decreasing; its length is
    /// the tokens held.
    #[serde(default)]
    pub bounds: Vec<u32>,
    /// A request that would reuse fewer tokens than this reuses none (a sliding-window
    /// ring no longer holds what an earlier resume point attends to).
    #[serde(default)]
    pub min_reuse: u32,
    /// Reuse comes in whole blocks of this many tokens (1: any count).
    #[serde(default = "one")]
    pub granule: u32,
    /// A request reuses this holding only when the key bytes its reused tokens need
    /// are more than this many thousandths of its key (a llama.cpp server's slot is
    /// taken for a prompt sharing more than a tenth of it); 0: any reuse counts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_share: u32,
    /// (1.10) The LoRA adapter its keys and values were computed with; a request
    /// reuses it only with the same adapter (none: the base model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

fn one() -> u32 {
    1
}

impl KvHolding {
    /// This holding as computed with LoRA `adapter` (its id then names the adapter
    /// too).
    pub fn with_adapter(mut self, adapter: Option<&str>) -> Self {
        if let Some(a) = adapter {
            self.id ^= fnv1a_from(fnv1a(b"lora\0"), a.as_bytes());
        }
        self.adapter = adapter.map(str::to_string);
        self
    }

    /// Tokens a request with prediction key `key` would reuse from this holding.
    pub fn reuse(&self, key: &[u8]) -> u32 {
        let shared = self.shared(key);
        let mut tokens = self.within(shared);
        // Keys that part on a digit after a non-digit (`"Question 1"` / `"Question
        // 2"`): tokenizers split digits from what precedes them, so the token ending
        // where they part is the same in both and needs no byte past it.
        let at = shared as usize;
        let held = self.key.as_bytes();
        let digit = |k: &[u8]| k.get(at).is_some_and(u8::is_ascii_digit);
        if at > 0 && digit(held) && digit(key) && !held[at - 1].is_ascii_digit() {
            tokens += usize::from(self.bounds.get(tokens) == Some(&(shared + 1)));
        }
        self.reuse_of(tokens, shared, key)
    }

    /// The same, knowing only which whole [`BLOCK_BYTES`] blocks the request shares
    /// (what the block index alone can tell).
    pub fn reuse_by_blocks(&self, key: &[u8]) -> u32 {
        let shared = self.shared(key);
        let blocks = shared - shared % BLOCK_BYTES as u32;
        self.reuse_of(self.within(blocks), blocks, key)
    }

    fn shared(&self, key: &[u8]) -> u32 {
        self.key.as_bytes().iter().zip(key).take_while(|(a, b)| a == b).count() as u32
    }

    /// Held tokens whose bound is within `shared` bytes.
    fn within(&self, shared: u32) -> usize {
        self.bounds.partition_point(|&b| b <= shared)
    }

    fn reuse_of(&self, tokens: usize, shared: u32, key: &[u8]) -> u32 {
        let mut tokens = tokens as u32;
        // A request reuses all but its last token (that one runs again for its
        // logits). A raw prompt's last token needs a byte past the key, so it never
        // counts; a chat's is the generation prompt's last, ending at the key's end.
        let whole_chat = ends_in_generation_prompt(shared, key);
        if whole_chat && tokens > 0 && self.bounds[tokens as usize - 1] == shared {
            tokens -= 1;
        }
        let tokens = tokens - tokens % self.granule.max(1);
        let needs = |t: u32| t.checked_sub(1).map_or(0, |i| u64::from(self.bounds[i as usize]));
        let too_little = needs(tokens) * 1000 <= u64::from(self.min_share) * key.len() as u64;
        if tokens < self.min_reuse || (self.min_share > 0 && too_little) {
            0
        } else {
            tokens
        }
    }
}

/// Whether `shared` bytes are all of `key` and it is a chat's (ends with the
/// assistant turn the generation prompt opens).
fn ends_in_generation_prompt(shared: u32, key: &[u8]) -> bool {
    shared as usize == key.len() && key.ends_with(ASSISTANT_TURN)
}

/// The most tokens any of `holdings` would give a request with prediction key `key`
/// run with `adapter` (only holdings of the same adapter count).
pub fn predict_reuse<'a>(holdings: impl IntoIterator<Item = &'a KvHolding>, adapter: Option<&str>, key: &[u8]) -> u32 {
    let same = |h: &&KvHolding| h.adapter.as_deref() == adapter;
    holdings
        .into_iter()
        .filter(same)
        .map(|h| h.reuse(key))
        .max()
        .unwrap_or(0)
}

/// [`predict_reuse`] knowing only whole blocks ([`KvHolding::reuse_by_blocks`]).
pub fn predict_reuse_by_blocks<'a>(
    holdings: impl IntoIterator<Item = &'a KvHolding>,
    adapter: Option<&str>,
    key: &[u8],
) -> u32 {
    let same = |h: &&KvHolding| h.adapter.as_deref() == adapter;
    holdings
        .into_iter()
        .filter(same)
        .map(|h| h.reuse_by_blocks(key))
        .max()
        .unwrap_or(0)
}

/// Blocks a worker started or stopped holding warm (`{p}.v1.kv.{wid}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// (1.9) The worker announces what its engine holds ([`KvHolding`]s), not a guess
    /// from its recent requests.
    #[serde(default)]
    pub precise: bool,
    /// (1.9) Holdings new since the previous event.
    #[serde(default)]
    pub holdings: Vec<KvHolding>,
    /// (1.9) Ids of holdings no longer held.
    #[serde(default)]
    pub released: Vec<u64>,
}

/// Everything a worker holds warm, as of event `seq` (reply on `{p}.v1.kv.{wid}.snapshot`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// (1.9) See [`KvEvent::precise`].
    #[serde(default)]
    pub precise: bool,
    /// (1.9) Every holding.
    #[serde(default)]
    pub holdings: Vec<KvHolding>,
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
        // An adapter's blocks are its own.
        let tuned = adapter_blocks(Some("tuned"), text.as_bytes());
        assert_eq!(adapter_blocks(None, text.as_bytes()), a);
        assert!(tuned.iter().all(|h| !a.contains(h)));
        assert_ne!(tuned, adapter_blocks(Some("tuned2"), text.as_bytes()));
        let chat = routing_key(None, Some(&[Message::new("user", "hi")]));
        assert_eq!(chat, b"user\0hi\0");
        let chat = prediction_key(None, Some(&[Message::new("user", "hi")]));
        assert_eq!(chat, b"user\0hi\0assistant\0");
    }

    #[test]
    fn a_holding_gives_the_tokens_whose_bytes_a_request_shares() {
        // "The cat sat" as tokens "The", " cat", " sat": each counts once the byte
        // after it is shared too.
        let h = KvHolding {
            id: 1,
            key: "The cat sat".into(),
            bounds: vec![4, 8, 12],
            min_reuse: 0,
            granule: 1,
            min_share: 0,
            adapter: None,
        };
        assert_eq!(h.reuse(b"The cat sat down"), 2, "the last token needs a byte past it");
        assert_eq!(h.reuse(b"The cat is"), 2);
        assert_eq!(h.reuse(b"The cats"), 1, "' cat' may become ' cats'");
        assert_eq!(h.reuse(b"The cat"), 1, "the request's own last token runs again");
        assert_eq!(h.reuse(b"The cat "), 2);
        assert_eq!(h.reuse(b"Thy"), 0);
        let numbered = KvHolding {
            id: 3,
            key: "Question 1".into(),
            bounds: vec![9, 10, 10],
            min_reuse: 0,
            granule: 1,
            min_share: 0,
            adapter: None,
        };
        assert_eq!(numbered.reuse(b"Question 2?"), 2, "' ' before a digit ends hard");
        assert_eq!(numbered.reuse(b"Question x?"), 1);
        let ring = KvHolding {
            min_reuse: 2,
            ..h.clone()
        };
        assert_eq!((ring.reuse(b"The cat sat"), ring.reuse(b"The cats")), (2, 0));
        let blocks = KvHolding {
            granule: 2,
            ..h.clone()
        };
        assert_eq!(blocks.reuse(b"The cat sat."), 2);
        assert_eq!(blocks.reuse(b"The cats"), 0);
        assert_eq!(predict_reuse([&h, &blocks], None, b"The cat sat."), 2);
        // Keys and values of another adapter are not the request's.
        let tuned = KvHolding {
            adapter: Some("tuned".into()),
            ..h.clone()
        };
        assert_eq!(predict_reuse([&tuned], None, b"The cat sat."), 0);
        assert_eq!(predict_reuse([&tuned], Some("other"), b"The cat sat."), 0);
        assert_eq!(predict_reuse([&tuned, &h], Some("tuned"), b"The cat sat."), 2);
        // A llama.cpp slot counts only for a request it covers more than a tenth of.
        let slot = KvHolding {
            min_share: 100,
            ..h.clone()
        };
        assert_eq!(
            slot.reuse(format!("The cat sat {}", "x".repeat(67)).as_bytes()),
            2,
            "8 of 79 bytes"
        );
        assert_eq!(
            slot.reuse(format!("The cat sat {}", "x".repeat(68)).as_bytes()),
            0,
            "8 of 80"
        );
        // A chat: template tokens end where the content starts, and a request whose
        // whole key is held gives back its last token.
        let chat = KvHolding {
            id: 2,
            key: "user\0hi\0assistant\0Hello\0".into(),
            bounds: vec![5, 5, 8, 18, 18, 24],
            min_reuse: 0,
            granule: 1,
            min_share: 0,
            adapter: None,
        };
        assert_eq!(chat.reuse(b"user\0hi\0assistant\0"), 4);
        assert_eq!(chat.reuse(b"user\0hi\0assistant\0Hello\0user\0"), 6);
        assert_eq!(chat.reuse(b"user\0ho\0assistant\0"), 2);
        assert_eq!(predict_reuse([], None, b"x"), 0);
    }
}
