//! What the KV slots hold, said in routing terms ([`switchyard_messages::KvHolding`]).
//!
//! A coordinator has no tokenizer: it knows a request by its prediction key
//! ([`switchyard_messages::kv::prediction_key`]: the prompt, or the messages as
//! `role \0 content \0` and the `assistant \0` turn the generation prompt opens). So
//! each slot remembers, per token it holds, how many leading key bytes a request must
//! share to reuse it ([`KeyMap`]): a token of text (a message's content, a raw
//! prompt, a reply) needs its own bytes and the next byte — the byte after decides
//! whether the text tokenizes the same (`" cat"` followed by `"s"` becomes `" cats"`),
//! except after a digit where the vocabulary splits numbers into digits;
//! template text between messages needs the key up to the content it leads into (its
//! role is known by then, and special tokens and the newline before a content split
//! hard); control tokens need nothing more. Generated tokens continue the key with
//! their bytes; the token sampled last (not yet run) or the end of the turn adds the
//! bytes that follow the reply.

use super::text::tokenizer::GgufTokenizer;
use std::sync::Mutex;
use switchyard_backend::KvWatcher;
use switchyard_backend::Prompt;
use switchyard_messages::kv::{fnv1a, prediction_key};
use switchyard_messages::{KvHolding, Message};

/// Where each of a prompt's tokens ends in its prediction key.
#[derive(Debug, Clone, Default)]
pub struct KeyMap {
    /// The prompt's prediction key.
    pub key: String,
    /// Per prompt token, the leading key bytes a request must share to reuse it
    /// (`u32::MAX`: unmapped, the rendering did not line up with the key from there
    /// on). Non-decreasing.
    pub bounds: Vec<u32>,
    /// A chat prompt (an end-of-turn token closes the reply's content).
    pub chat: bool,
}

impl KeyMap {
    /// The map of `tokens`, rendered from `prompt` as `rendered`; `None` for prompts
    /// with no key (token ids, resumed streams).
    pub fn new(tokenizer: &GgufTokenizer, prompt: &Prompt, rendered: &str, tokens: &[u32]) -> Option<Self> {
        let (key, segments) = match prompt {
            Prompt::Text(t) => (t.as_bytes().to_vec(), None),
            Prompt::Chat { messages, .. } => (
                prediction_key(None, Some(messages)),
                Some(content_segments(rendered, messages)),
            ),
            _ => return None,
        };
        let key_len = key.len() as u32;
        // Rendered offset → (key offset, inside text).
        let to_key = |r: usize| -> (u32, bool) {
            let Some(segments) = &segments else {
                return (r as u32, true);
            };
            for s in segments {
                match s {
                    Some((start, end, k)) if r <= *end => {
                        return if r <= *start {
                            (*k, false)
                        } else {
                            (k + (r - start) as u32, true)
                        };
                    }
                    Some(_) => continue,
                    None => return (u32::MAX, false),
                }
            }
            (key_len, false)
        };
        let mut bounds = Vec::with_capacity(tokens.len());
        let (mut cursor, mut floor) = (0usize, 0u32);
        let digits = tokenizer.splits_digits();
        let rendered_bytes = rendered.as_bytes();
        for &id in tokens {
            let b = tokenizer.token_bytes(id);
            let rest = &rendered_bytes[cursor.min(rendered_bytes.len())..];
            let control = tokenizer.is_control(id);
            if rest.starts_with(b) {
                cursor += b.len();
            } else if control {
                // BOS/EOS added by the tokenizer: no text.
            } else if cursor == 0 && b.first() == Some(&b' ') && rest.starts_with(&b[1..]) {
                // SentencePiece's prefix space.
                cursor += b.len() - 1;
            } else {
                bounds.resize(tokens.len(), u32::MAX);
                break;
            }
            let (end, text) = to_key(cursor);
            let after_digit = digits && cursor > 0 && rendered_bytes[cursor - 1].is_ascii_digit();
            let bound = if text && !control && !after_digit {
                end.saturating_add(1)
            } else {
                end
            };
            floor = floor.max(bound);
            bounds.push(floor);
        }
        Some(Self {
            key: String::from_utf8(key).ok()?,
            bounds,
            chat: segments.is_some(),
        })
    }
}

/// Each message's content as `(start, end)` in `rendered` and its start in the key,
/// in order; `None` from the first content the rendering does not hold verbatim.
fn content_segments(rendered: &str, messages: &[Message]) -> Vec<Option<(usize, usize, u32)>> {
    let mut out = Vec::with_capacity(messages.len());
    let (mut cursor, mut k) = (0usize, 0u32);
    for m in messages {
        k += m.role.len() as u32 + 1;
        match rendered[cursor..].find(m.content.as_str()) {
            Some(at) => {
                let start = cursor + at;
                cursor = start + m.content.len();
                out.push(Some((start, cursor, k)));
            }
            None => {
                out.push(None);
                return out;
            }
        }
        k += m.content.len() as u32 + 1;
    }
    out
}

/// What a slot holding `held`, claimed by the prompt `map` maps, holds as a holding;
/// `None` when it holds nothing mapped. `prefilling`: its prompt is still being
/// computed — it counts whole, since prompts prefill in turn and any later one that
/// shares it starts after it is done. `history`: the slot's generation history when
/// it is finishing (its last sampled token, not yet run, says what bytes follow the
/// held reply). `min_reuse(n)`: the slot's resume floor with `n` tokens held.
pub fn holding(
    map: &KeyMap,
    held: &[u32],
    prefilling: bool,
    history: Option<&[u32]>,
    tokenizer: &GgufTokenizer,
    min_reuse: impl Fn(usize) -> usize,
) -> Option<KvHolding> {
    let prompt_len = map.bounds.len();
    let counted = if prefilling {
        prompt_len.max(held.len())
    } else {
        held.len()
    };
    if counted == 0 {
        return None;
    }
    let mut key = map.key.as_bytes().to_vec();
    let mut bounds: Vec<u32> = map.bounds[..prompt_len.min(counted)].to_vec();
    if held.len() > prompt_len {
        // Generated tokens continue the key with their bytes.
        let mut floor = bounds.last().copied().unwrap_or(0);
        let digits = tokenizer.splits_digits();
        for &id in &held[prompt_len..] {
            let bound = if tokenizer.is_control(id) {
                key.len() as u32
            } else {
                key.extend_from_slice(tokenizer.token_bytes(id));
                let after_digit = digits && key.last().is_some_and(u8::is_ascii_digit);
                key.len() as u32 + u32::from(!after_digit)
            };
            floor = floor.max(bound);
            bounds.push(floor);
        }
        // The token sampled last follows the reply: its bytes, or the 0 byte that
        // closes a chat's reply at the end of the turn.
        if let Some(&next) = history.filter(|h| h.starts_with(held)).and_then(|h| h.get(held.len())) {
            if !tokenizer.is_control(next) {
                key.extend_from_slice(tokenizer.token_bytes(next));
            } else if map.chat {
                key.push(0);
            }
        }
    }
    // At most MAX_KEY_BYTES of key (events stay well under NATS's max_payload), and
    // a reply cut inside a character keeps the whole characters only.
    if key.len() > MAX_KEY_BYTES {
        key.truncate(MAX_KEY_BYTES);
    }
    let key = match String::from_utf8(key) {
        Ok(k) => k,
        Err(e) => {
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).ok()?
        }
    };
    let kept = bounds.partition_point(|&b| b as usize <= key.len() + 1);
    bounds.truncate(kept);
    let n = bounds.len();
    let min_reuse = min_reuse(n);
    let mut id_bytes = key.as_bytes().to_vec();
    id_bytes.extend_from_slice(&(n as u64).to_le_bytes());
    id_bytes.extend_from_slice(&(min_reuse as u64).to_le_bytes());
    Some(KvHolding {
        id: fnv1a(&id_bytes),
        key,
        bounds,
        min_reuse: min_reuse as u32,
        granule: 1,
        min_share: 0,
        adapter: None,
    })
}

/// The holdings last published, and the watcher told when they change.
#[derive(Default)]
pub struct Shared {
    now: Mutex<Vec<KvHolding>>,
    watcher: Mutex<Option<KvWatcher>>,
}

impl Shared {
    /// The holdings now.
    pub fn get(&self) -> Vec<KvHolding> {
        self.now.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the watcher.
    pub fn watch(&self, watcher: KvWatcher) {
        *self.watcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(watcher);
    }

    /// Publishes `all`; the watcher hears of it when it differs from before.
    pub fn set(&self, all: Vec<KvHolding>) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        let same = now.len() == all.len() && now.iter().zip(&all).all(|(a, b)| a.id == b.id);
        *now = all;
        if same {
            return;
        }
        let told = now.clone();
        drop(now);
        if let Some(w) = self.watcher.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            w(told);
        }
    }
}

/// A chain of blocks saved to the block store from a slot, as the slot's holding
/// was then: the store holds its leading blocks until they are evicted.
pub struct StoredChain {
    pub holding: KvHolding,
    /// The chain's block hashes (`block_store::chain` of the slot's tokens).
    pub hashes: Vec<u64>,
}

impl StoredChain {
    /// The chain as a holding of its first `blocks` blocks (reused in whole blocks).
    pub fn holding(&self, blocks: usize, block_tokens: usize) -> Option<KvHolding> {
        let tokens = (blocks * block_tokens).min(self.holding.bounds.len());
        if tokens < block_tokens {
            return None;
        }
        let h = &self.holding;
        let mut id_bytes = h.key.as_bytes().to_vec();
        id_bytes.extend_from_slice(b"\0store");
        id_bytes.extend_from_slice(&(tokens as u64).to_le_bytes());
        Some(
            KvHolding {
                id: fnv1a(&id_bytes),
                key: h.key.clone(),
                bounds: h.bounds[..tokens].to_vec(),
                min_reuse: 0,
                granule: block_tokens as u32,
                min_share: 0,
                adapter: None,
            }
            .with_adapter(h.adapter.as_deref()),
        )
    }
}

/// Chains saved to the block store that the KV events keep track of.
pub const STORED_CHAINS: usize = 8;

/// The most key bytes a holding carries: a request sharing more is predicted to reuse
/// what lies within them (a snapshot of 16 slots and the stored chains stays under
/// 1 MiB).
pub const MAX_KEY_BYTES: usize = 32 * 1024;

/// Notes that a slot holding `held` (its prompt mapped by `map`, computed with LoRA
/// `adapter`) saves blocks `hashes` to the store: the newest [`STORED_CHAINS`]
/// chains are kept, one per chain.
pub fn remember(
    stored: &mut std::collections::VecDeque<StoredChain>,
    map: Option<&KeyMap>,
    held: &[u32],
    adapter: Option<&str>,
    tokenizer: &GgufTokenizer,
    hashes: &[u64],
) {
    let Some(holding) = map.and_then(|m| holding(m, held, false, None, tokenizer, |_| 0)) else {
        return;
    };
    let holding = holding.with_adapter(adapter);
    stored.retain(|c| c.hashes.last() != hashes.last());
    stored.push_back(StoredChain {
        holding,
        hashes: hashes.to_vec(),
    });
    while stored.len() > STORED_CHAINS {
        stored.pop_front();
    }
}
