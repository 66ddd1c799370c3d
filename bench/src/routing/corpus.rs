//! The prompts of `bench routing`: a few system prompts and many documents, both
//! drawn by popularity (Zipf), and a question of its own per request. A worker's
//! warm prefixes are (system prompt + document) chains, hashed into routing blocks
//! exactly as coordinators and workers hash them (`switchyard_messages::kv`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use switchyard_messages::kv::{prefix_blocks, BLOCK_BYTES};

/// SplitMix64: small, seedable, good enough to draw workloads.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// Draws `0..n` with probability ∝ 1 / (rank + 1)^s.
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// Over `n` items with exponent `s`.
    pub fn new(n: usize, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (0..n.max(1))
            .map(|i| {
                acc += 1.0 / ((i + 1) as f64).powf(s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Self { cdf }
    }

    /// One draw.
    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

const WORDS: &[&str] = &[
    "river", "market", "harbour", "engine", "ledger", "garden", "signal", "bridge", "lantern", "orchard", "copper",
    "meadow", "archive", "quarry", "beacon", "canal", "furnace", "granary", "pilot", "compass", "vessel", "timber",
    "summit", "valley", "cipher", "station", "thread", "mirror", "anchor", "kernel", "the", "of", "and", "to", "in",
    "with", "under", "before", "after", "across",
];

/// `bytes` bytes of word salad (ASCII, so any cut is a character boundary).
fn text(rng: &mut Rng, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 16);
    while s.len() < bytes {
        s.push_str(WORDS[rng.below(WORDS.len())]);
        s.push(' ');
    }
    s.truncate(bytes);
    s
}

/// System prompt + document pairs, indexed (system, document).
pub type Chain = (usize, usize);

/// The shared texts and their popularity.
pub struct Corpus {
    systems: Vec<String>,
    docs: Vec<String>,
    system_pop: Zipf,
    doc_pop: Zipf,
    chains: Mutex<HashMap<Chain, Arc<[u64]>>>,
}

impl Corpus {
    /// `systems` system prompts of 4 blocks and `docs` documents of `doc_blocks`
    /// blocks (whole blocks, so a chain's blocks are a prefix of every prompt built on
    /// it), popularity Zipf(`s`).
    pub fn new(seed: u64, systems: usize, docs: usize, doc_blocks: usize, s: f64) -> Self {
        let mut rng = Rng::new(seed);
        Self {
            systems: (0..systems).map(|_| text(&mut rng, 4 * BLOCK_BYTES)).collect(),
            docs: (0..docs).map(|_| text(&mut rng, doc_blocks * BLOCK_BYTES)).collect(),
            system_pop: Zipf::new(systems, s),
            doc_pop: Zipf::new(docs, s),
            chains: Mutex::new(HashMap::new()),
        }
    }

    /// A chain drawn by popularity.
    pub fn draw(&self, rng: &mut Rng) -> Chain {
        (self.system_pop.sample(rng), self.doc_pop.sample(rng))
    }

    /// The routing blocks of a chain (computed once).
    pub fn chain(&self, c: Chain) -> Arc<[u64]> {
        let mut chains = self.chains.lock().unwrap_or_else(|p| p.into_inner());
        chains
            .entry(c)
            .or_insert_with(|| {
                let mut key = self.systems[c.0].clone().into_bytes();
                key.extend_from_slice(self.docs[c.1].as_bytes());
                prefix_blocks(&key).into()
            })
            .clone()
    }

    /// A prompt: the chain, then a question of its own (300–700 bytes, from `question`).
    pub fn prompt(&self, c: Chain, question: u64) -> String {
        let mut rng = Rng::new(question ^ 0x5eed);
        let len = 300 + rng.below(400);
        format!(
            "{}{}Question {question}: {}",
            self.systems[c.0],
            self.docs[c.1],
            text(&mut rng, len)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_start_with_their_chain() {
        let corpus = Corpus::new(7, 2, 5, 3, 1.0);
        let c = (1, 4);
        let blocks = prefix_blocks(corpus.prompt(c, 99).as_bytes());
        let chain = corpus.chain(c);
        assert_eq!(chain.len(), 7);
        assert_eq!(&blocks[..7], &chain[..]);
        assert!(blocks.len() > 7);
        let mut rng = Rng::new(1);
        let z = Zipf::new(10, 1.0);
        let n0 = (0..1000).filter(|_| z.sample(&mut rng) == 0).count();
        assert!(n0 > 250, "the first item is the most popular: {n0}");
    }
}
