//! The KvCacheActor's store: keys and values in fixed-size token blocks, keyed by a
//! chained hash, kept under a byte budget and evicted least recently used.
//!
//! KV slots hold what running jobs and sessions use; when a slot is about to
//! overwrite positions it holds (a new job reuses only part of it), the full blocks it
//! would lose are saved here first. A later job whose prompt starts with a chain of
//! stored blocks gets them copied back into its slot — a memory copy instead of a
//! prefill — whichever slot, request or session computed them. Block `i`'s hash
//! covers the model identity and tokens `0..(i + 1) * BLOCK_TOKENS`, so equal hashes
//! mean equal prefixes of the same model.
//!
//! A block is the CPU engine's KV page itself where the page holds every layer (no
//! sliding-window rings): saving it takes a reference, restoring it shares it with the
//! slot again — no copy either way, and a slot that writes into it copies it first.
//! Otherwise (rings, other engines) a block is a copy of the slot's rows. Either way,
//! evicting a block never touches what a slot is using.

use super::model::kv_cache::KvPage;
use std::collections::HashMap;
use std::sync::Arc;

/// Length of the common prefix of `a` and `b` (tokens a slot holds and tokens wanted).
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Tokens per block: a KV page's positions, so a page can be stored as a block.
pub const BLOCK_TOKENS: usize = 32;
const _: () = assert!(BLOCK_TOKENS == super::model::kv_cache::PAGE);

const PRIME: u64 = 0x0000_0100_0000_01b3;

/// Chained hashes of every full block of `tokens`, starting from `seed` (the model
/// identity).
pub fn chain(seed: u64, tokens: &[u32]) -> Vec<u64> {
    let mut h = seed;
    tokens
        .chunks_exact(BLOCK_TOKENS)
        .map(|block| {
            for t in block {
                for b in t.to_le_bytes() {
                    h = (h ^ u64::from(b)).wrapping_mul(PRIME);
                }
            }
            h
        })
        .collect()
}

/// A stored block's keys and values.
#[derive(Clone)]
pub enum Stored {
    /// Rows copied out of a slot, `[layer][kv_head][row][head_dim]` f16 bits.
    Rows { k: Vec<u16>, v: Vec<u16> },
    /// A KV page, shared with the slots that hold it.
    Page(Arc<KvPage>),
}

impl Stored {
    /// Bytes the block holds (a page counts whole, shared or not).
    pub fn bytes(&self) -> usize {
        match self {
            Stored::Rows { k, v } => (k.len() + v.len()) * 2,
            Stored::Page(p) => p.bytes(),
        }
    }
}

struct Block {
    data: Stored,
    last_used: u64,
}

/// The keys and values of a prefix's tail — fewer tokens than a block, past the
/// whole blocks whose chain ends in `parent` (the chain's seed when none) — pulled
/// from a peer: restored after those blocks (a hand-over's stream then computes only
/// its next token).
pub struct Tail {
    pub parent: u64,
    pub tokens: Vec<u32>,
    /// `[layer][kv_head][row][head_dim]` f16 bits, one row per token.
    pub k: Vec<u16>,
    pub v: Vec<u16>,
}

/// Tails kept at once (the most recent): each serves one pulled prefix.
const MAX_TAILS: usize = 8;

/// Counters for observation and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    /// Blocks held now.
    pub blocks: usize,
    /// Bytes held now.
    pub bytes: usize,
    /// Blocks saved, ever.
    pub saved: u64,
    /// Blocks copied back into a slot, ever.
    pub restored: u64,
    /// Blocks evicted to stay under the budget, ever.
    pub evicted: u64,
}

/// Blocks under a byte budget.
pub struct KvStore {
    budget: usize,
    blocks: HashMap<u64, Block>,
    clock: u64,
    stats: StoreStats,
    /// Pulled tails, oldest first (outside the budget: at most `MAX_TAILS` of
    /// fewer than a block each).
    tails: Vec<Tail>,
}

impl KvStore {
    /// A store holding at most `budget` bytes (0 = off).
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            blocks: HashMap::new(),
            clock: 0,
            stats: StoreStats::default(),
            tails: Vec::new(),
        }
    }

    /// The byte budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Whether the store keeps anything.
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            blocks: self.blocks.len(),
            ..self.stats
        }
    }

    pub fn contains(&self, hash: u64) -> bool {
        self.blocks.contains_key(&hash)
    }

    /// How many leading blocks of `hashes` are stored.
    pub fn leading(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|h| self.blocks.contains_key(h)).count()
    }

    /// The block, neither marked as used nor counted as restored (a peer reads it).
    pub fn peek(&self, hash: u64) -> Option<&Stored> {
        self.blocks.get(&hash).map(|b| &b.data)
    }

    /// The block (a copy of its rows, or the shared page), marked as just used.
    pub fn get(&mut self, hash: u64) -> Option<Stored> {
        self.clock += 1;
        let clock = self.clock;
        let b = self.blocks.get_mut(&hash)?;
        b.last_used = clock;
        self.stats.restored += 1;
        Some(b.data.clone())
    }

    /// Keeps a pulled tail (replacing one of the same tokens; the oldest goes past
    /// `MAX_TAILS`).
    pub fn put_tail(&mut self, tail: Tail) {
        self.tails
            .retain(|t| t.parent != tail.parent || t.tokens != tail.tokens);
        if self.tails.len() >= MAX_TAILS {
            self.tails.remove(0);
        }
        self.tails.push(tail);
    }

    /// The longest kept tail after the blocks chained to `parent` that `tokens` (what
    /// follows them) starts with.
    pub fn tail(&self, parent: u64, tokens: &[u32]) -> Option<&Tail> {
        self.tails
            .iter()
            .filter(|t| t.parent == parent && tokens.starts_with(&t.tokens))
            .max_by_key(|t| t.tokens.len())
    }

    /// Saves a block, evicting the least recently used ones to stay in budget. A
    /// block larger than the whole budget is not kept.
    pub fn put(&mut self, hash: u64, data: Stored) {
        self.clock += 1;
        let block = Block {
            data,
            last_used: self.clock,
        };
        let size = block.data.bytes();
        if size > self.budget || self.blocks.contains_key(&hash) {
            return;
        }
        while self.stats.bytes + size > self.budget {
            let Some(oldest) = self.blocks.iter().min_by_key(|(_, b)| b.last_used).map(|(h, _)| *h) else {
                break;
            };
            if let Some(b) = self.blocks.remove(&oldest) {
                self.stats.bytes -= b.data.bytes();
                self.stats.evicted += 1;
            }
        }
        self.stats.bytes += size;
        self.stats.saved += 1;
        self.blocks.insert(hash, block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_depend_on_everything_before_and_eviction_is_lru_under_budget() {
        let a: Vec<u32> = (0..100).collect();
        let mut b = a.clone();
        b[40] = 999;
        let (ha, hb) = (chain(1, &a), chain(1, &b));
        assert_eq!(ha.len(), 3, "only full blocks");
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        assert_ne!(ha[2], hb[2], "a change poisons every later block");
        assert_ne!(chain(2, &a)[0], ha[0], "another model, other hashes");

        // Room for two blocks of 8 bytes.
        let rows = |k: Vec<u16>, v: Vec<u16>| Stored::Rows { k, v };
        let mut s = KvStore::new(16);
        s.put(ha[0], rows(vec![1, 2], vec![3, 4]));
        s.put(ha[1], rows(vec![5, 6], vec![7, 8]));
        assert_eq!(s.leading(&ha), 2);
        assert!(s.get(ha[0]).is_some()); // block 0 is now the most recent
        s.put(ha[2], rows(vec![9, 9], vec![9, 9])); // evicts block 1
        assert!(s.contains(ha[0]) && !s.contains(ha[1]) && s.contains(ha[2]));
        assert_eq!(s.leading(&ha), 1);
        let st = s.stats();
        assert_eq!(
            (st.blocks, st.bytes, st.saved, st.evicted, st.restored),
            (2, 16, 3, 1, 1)
        );
        assert!(matches!(s.get(ha[0]), Some(Stored::Rows { k, v }) if k == [1, 2] && v == [3, 4]));
        assert!(!KvStore::new(0).enabled());
    }

    #[test]
    fn a_tail_is_found_after_its_blocks_for_tokens_it_starts() {
        let mut s = KvStore::new(16);
        let tail = |parent: u64, tokens: Vec<u32>| Tail {
            parent,
            tokens,
            k: vec![1],
            v: vec![2],
        };
        s.put_tail(tail(7, vec![1, 2]));
        s.put_tail(tail(7, vec![1, 2, 3]));
        assert_eq!(s.tail(7, &[1, 2, 3, 4]).map(|t| t.tokens.len()), Some(3), "the longest");
        assert_eq!(s.tail(7, &[1, 2, 9]).map(|t| t.tokens.len()), Some(2));
        assert!(s.tail(8, &[1, 2, 3]).is_none(), "after other blocks");
        assert!(s.tail(7, &[5]).is_none());
        for i in 0..MAX_TAILS as u64 {
            s.put_tail(tail(100 + i, vec![1]));
        }
        assert!(s.tail(7, &[1, 2, 3]).is_none(), "the oldest went");
    }
}
