//! Where a prompt's keys and values come from before it computes any: the slot it
//! claims, a longer prefix another slot holds, and the block store (blocks saved as
//! slots are overwritten, restored into the slot that needs them). Reuse stays
//! within one LoRA adapter: a slot computed with another adapter (or none) holds
//! other keys and values, and the store's blocks are chained from the adapter.

use super::block_store::{self, common_prefix, Stored, BLOCK_TOKENS};
use super::compute::ComputeState;
use super::model::lora::LoraAdapter;
use std::sync::Arc;

impl ComputeState {
    /// Takes a free slot for a job over `tokens` (non-empty) and returns it with how
    /// many leading tokens are already resident there (at most `len - 1`: the last
    /// token is always computed, for its logits). The free slot holding the longest
    /// prefix of `tokens` wins, the least recently used among equals; when another
    /// slot (even a busy one) holds a longer prefix, its keys and values are copied
    /// over, so a shared system prompt is computed once per worker, not once per slot.
    /// A prefix counts only as far as the model can resume from it
    /// ([`Forward::resumable`]: a sliding-window ring may have lost its window), and
    /// only from slots computed with the same LoRA `adapter`.
    ///
    /// [`Forward::resumable`]: super::model::forward::Forward::resumable
    pub fn claim(&mut self, tokens: &[u32], adapter: Option<&Arc<LoraAdapter>>) -> Option<(usize, usize)> {
        let (reuse, last) = (self.model.reuses_prefix(), tokens.len() - 1);
        let lcp: Vec<usize> = (0..self.slots.len())
            .map(|i| {
                let shared = common_prefix(&self.slots[i].resident, tokens).min(last);
                if reuse && same_adapter(self.slots[i].adapter.as_ref(), adapter) {
                    self.model.resumable(i, shared)
                } else {
                    0
                }
            })
            .collect();
        let slot = (0..self.slots.len())
            .filter(|&i| !self.slots[i].busy && !self.slots[i].pinned)
            .max_by_key(|&i| (lcp[i], std::cmp::Reverse(self.slots[i].last_used)))?;
        self.use_adapter(slot, adapter);
        let have = self.take_longer_prefix(slot, tokens, lcp[slot]);
        let have = self.restore(slot, &tokens[..last], have);
        self.slots[slot].busy = true;
        Some((slot, self.model.resumable(slot, have.min(last))))
    }

    /// Makes `slot`, which holds the first `have` of `tokens`, hold the longest prefix
    /// of `tokens` (short of the last token) that another slot holds, even a busy one,
    /// when that is longer: taken over (pages shared on the CPU engine), not computed
    /// again. Returns how many leading tokens `slot` holds now. A prompt waiting its
    /// turn to prefill calls this again when its turn comes, so prompts arriving
    /// together behind one system prompt compute it once.
    pub fn take_longer_prefix(&mut self, slot: usize, tokens: &[u32], have: usize) -> usize {
        if !self.model.reuses_prefix() {
            return have;
        }
        let last = tokens.len().saturating_sub(1);
        let adapter = self.slots[slot].adapter.as_ref();
        let best = (0..self.slots.len())
            .filter(|&i| i != slot && same_adapter(self.slots[i].adapter.as_ref(), adapter))
            .map(|i| {
                (
                    self.model
                        .resumable(i, common_prefix(&self.slots[i].resident, tokens).min(last)),
                    i,
                )
            })
            .max();
        let Some((longer, from)) = best.filter(|b| b.0 > have) else {
            return have;
        };
        // What the slot held beyond the shared part is about to go.
        self.save_tail(slot, have);
        if !self.model.copy_prefix(from, slot, longer) {
            return have;
        }
        self.slots[slot].resident = tokens[..longer].to_vec();
        longer
    }

    /// Saves the full blocks of `slot` from the one holding position `from` on into
    /// the store (those not there yet): they are about to be overwritten.
    pub(crate) fn save_tail(&mut self, slot: usize, from: usize) {
        let held = self.slots[slot].resident.len();
        if !self.store.enabled() || from / BLOCK_TOKENS >= held / BLOCK_TOKENS {
            return;
        }
        let hashes = block_store::chain(self.seed_of(slot), &self.slots[slot].resident);
        self.save_blocks(slot, &hashes, from / BLOCK_TOKENS);
    }

    /// Saves blocks `first..` of `slot` (chained `hashes` of its resident tokens)
    /// that the store lacks and the slot still holds; a block a ring lost already was
    /// saved as it left, or is gone.
    fn save_blocks(&mut self, slot: usize, hashes: &[u64], first: usize) {
        // What the saved chain covers, in routing terms, for the KV events.
        let s = &self.slots[slot];
        let adapter = s.adapter.as_ref().map(|a| a.name.as_str());
        super::holdings::remember(
            &mut self.stored,
            s.map.as_ref(),
            &s.resident,
            adapter,
            &self.tokenizer,
            hashes,
        );
        for (b, &hash) in hashes.iter().enumerate().skip(first) {
            if self.store.contains(hash) {
                continue;
            }
            let block = match self.model.page(slot, b) {
                Some(page) => Some(Stored::Page(page)),
                None => {
                    (self.model.read_rows(slot, b * BLOCK_TOKENS, BLOCK_TOKENS)).map(|(k, v)| Stored::Rows { k, v })
                }
            };
            if let Some(block) = block {
                self.store.put(hash, block);
            }
        }
    }

    /// Saves the full blocks below `pos` that a step writing `n` positions from `pos`
    /// pushes out of `slot`'s sliding-window rings (those not in the store yet), while
    /// the rings still hold them: so a later prompt sharing only the head of a long
    /// sequence (a system prompt) gets it back from the store.
    pub(crate) fn save_leaving(&mut self, slot: usize, pos: usize, n: usize) {
        let Some(ring) = self.model.ring() else { return };
        // Blocks starting below `before` lost rows already (saved then, or gone).
        let before = pos.saturating_sub(ring).div_ceil(BLOCK_TOKENS);
        let lost = (pos + n).saturating_sub(ring).min(pos);
        let resident = &self.slots[slot].resident;
        let upto = lost.div_ceil(BLOCK_TOKENS).min(pos.min(resident.len()) / BLOCK_TOKENS);
        if !self.store.enabled() || upto <= before {
            return;
        }
        let hashes = block_store::chain(self.seed_of(slot), &resident[..upto * BLOCK_TOKENS]);
        self.save_blocks(slot, &hashes, before);
    }

    /// Copies stored blocks continuing `tokens` past the `have` positions `slot`
    /// already holds into it; returns how many leading tokens it holds now.
    pub(crate) fn restore(&mut self, slot: usize, tokens: &[u32], have: usize) -> usize {
        if !self.store.enabled() || !self.model.reuses_prefix() {
            return have;
        }
        let hashes = block_store::chain(self.seed_of(slot), tokens);
        let n = self.store.leading(&hashes);
        if n * BLOCK_TOKENS <= have {
            return self.restore_tail(slot, tokens, &hashes, have);
        }
        // Taken before the slot's tail is saved: saving it may evict them (a store
        // holding a long prefix a peer just sent, and the slot's old one).
        let first = have / BLOCK_TOKENS;
        let blocks: Vec<Option<Stored>> = hashes[first..n].iter().map(|&h| self.store.get(h)).collect();
        self.save_tail(slot, have);
        self.slots[slot].resident.truncate(have);
        for (b, block) in (first..n).zip(blocks) {
            let restored = match block {
                Some(Stored::Page(page)) => self.model.adopt_page(slot, b, page),
                Some(Stored::Rows { k, v }) => self.model.write_rows(slot, b * BLOCK_TOKENS, BLOCK_TOKENS, &k, &v),
                None => false,
            };
            if !restored {
                break;
            }
            self.slots[slot].resident = tokens[..(b + 1) * BLOCK_TOKENS].to_vec();
        }
        let have = self.slots[slot].resident.len().max(have);
        self.restore_tail(slot, tokens, &hashes, have)
    }

    /// After the whole blocks `slot` holds (`have` tokens of `tokens`, chained as
    /// `hashes`), the rows of a pulled tail that `tokens` continues with; returns how
    /// many leading tokens it holds now.
    fn restore_tail(&mut self, slot: usize, tokens: &[u32], hashes: &[u64], have: usize) -> usize {
        if !have.is_multiple_of(BLOCK_TOKENS) || have >= tokens.len() {
            return have;
        }
        let parent = match have / BLOCK_TOKENS {
            0 => self.seed_of(slot),
            b => hashes[b - 1],
        };
        let Some(tail) = self.store.tail(parent, &tokens[have..]) else {
            return have;
        };
        let (n, k, v) = (tail.tokens.len(), tail.k.clone(), tail.v.clone());
        if self.slots[slot].resident.len() > have {
            self.save_tail(slot, have);
            self.slots[slot].resident.truncate(have);
        }
        if !self.model.write_rows(slot, have, n, &k, &v) {
            return have;
        }
        self.slots[slot].resident = tokens[..have + n].to_vec();
        have + n
    }

    /// Keeps only the leading resident tokens of `slot` that `history` starts with:
    /// a step that checked drafted tokens wrote them all, and those not kept are
    /// not the sequence's (their rows are overwritten by the next step).
    pub fn keep_resident(&mut self, slot: usize, history: &[u32]) {
        let s = &mut self.slots[slot];
        let keep = common_prefix(&s.resident, history);
        s.resident.truncate(keep);
    }

    /// Makes `slot` compute with `adapter` from its next step on. What it held was
    /// computed with another (or none): saved to the store under that one's chain,
    /// then gone from the slot.
    pub fn use_adapter(&mut self, slot: usize, adapter: Option<&Arc<LoraAdapter>>) {
        if same_adapter(self.slots[slot].adapter.as_ref(), adapter) {
            return;
        }
        self.save_tail(slot, 0);
        let s = &mut self.slots[slot];
        s.resident.clear();
        s.map = None;
        s.adapter = adapter.cloned();
        self.model.set_adapter(slot, adapter.cloned());
    }

    /// The seed of the store's block chains for what `slot` holds: the model's, and
    /// its adapter's load.
    pub(crate) fn seed_of(&self, slot: usize) -> u64 {
        seed(self.kv_seed, self.slots[slot].adapter.as_ref())
    }
}

/// Whether KV computed with adapter `a` serves a request for `b` (the same load).
fn same_adapter(a: Option<&Arc<LoraAdapter>>, b: Option<&Arc<LoraAdapter>>) -> bool {
    a.map(|a| a.id) == b.map(|b| b.id)
}

/// The block chains' seed of KV computed with `adapter` on the model seeded `kv_seed`.
pub(crate) fn seed(kv_seed: u64, adapter: Option<&Arc<LoraAdapter>>) -> u64 {
    match adapter {
        Some(a) => kv_seed ^ a.id.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        None => kv_seed,
    }
}
