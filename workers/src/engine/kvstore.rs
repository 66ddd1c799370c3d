//! The KvCacheActor's store: keys and values in fixed-size token blocks, keyed by a
//! chained hash, kept under a byte budget and evicted least recently used.
//!
//! KV slots hold what running jobs and sessions use; when a slot is about to
//! overwrite positions it holds (a new job reuses only part of it), the full blocks it
//! would lose are saved here first. A later job whose prompt starts with a chain of
//! stored blocks gets them copied back into its slot — a memory copy instead of a
//! prefill — whichever slot, request or session computed them. Block `i`'s hash
//! covers the model identity and tokens `0..(i + 1) * BLOCK_TOKENS`, so equal hashes
//! mean equal prefixes of the same model. Stored blocks are copies: evicting one
//! never touches a block a slot is using.

use std::collections::HashMap;

/// Length of the common prefix of `a` and `b` (tokens a slot holds and tokens wanted).
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Tokens per block.
pub const BLOCK_TOKENS: usize = 32;

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

struct Block {
    k: Vec<u16>,
    v: Vec<u16>,
    last_used: u64,
}

impl Block {
    fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 2
    }
}

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
}

impl KvStore {
    /// A store holding at most `budget` bytes (0 = off).
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            blocks: HashMap::new(),
            clock: 0,
            stats: StoreStats::default(),
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

    /// The block's keys and values, marked as just used.
    pub fn get(&mut self, hash: u64) -> Option<(&[u16], &[u16])> {
        self.clock += 1;
        let clock = self.clock;
        let b = self.blocks.get_mut(&hash)?;
        b.last_used = clock;
        self.stats.restored += 1;
        Some((&b.k, &b.v))
    }

    /// Saves a block, evicting the least recently used ones to stay in budget. A
    /// block larger than the whole budget is not kept.
    pub fn put(&mut self, hash: u64, k: Vec<u16>, v: Vec<u16>) {
        self.clock += 1;
        let block = Block {
            k,
            v,
            last_used: self.clock,
        };
        let size = block.bytes();
        if size > self.budget || self.blocks.contains_key(&hash) {
            return;
        }
        while self.stats.bytes + size > self.budget {
            let Some(oldest) = self.blocks.iter().min_by_key(|(_, b)| b.last_used).map(|(h, _)| *h) else {
                break;
            };
            if let Some(b) = self.blocks.remove(&oldest) {
                self.stats.bytes -= b.bytes();
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
        let mut s = KvStore::new(16);
        s.put(ha[0], vec![1, 2], vec![3, 4]);
        s.put(ha[1], vec![5, 6], vec![7, 8]);
        assert_eq!(s.leading(&ha), 2);
        assert!(s.get(ha[0]).is_some()); // block 0 is now the most recent
        s.put(ha[2], vec![9, 9], vec![9, 9]); // evicts block 1
        assert!(s.contains(ha[0]) && !s.contains(ha[1]) && s.contains(ha[2]));
        assert_eq!(s.leading(&ha), 1);
        let st = s.stats();
        assert_eq!(
            (st.blocks, st.bytes, st.saved, st.evicted, st.restored),
            (2, 16, 3, 1, 1)
        );
        assert_eq!(s.get(ha[0]), Some((&[1u16, 2][..], &[3u16, 4][..])));
        assert!(!KvStore::new(0).enabled());
    }
}
