//! Turning logits into the next token: greedy, or temperature sampling with
//! repeat, presence and frequency penalties, top-k, top-p and min-p, reproducible
//! under a seed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use switchyard_messages::{GenerateConfig, TokenLogprob, TopLogprob};

/// Per-request sampling state.
pub struct Sampler {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    repeat_penalty: f32,
    repeat_last_n: usize,
    presence: f32,
    frequency: f32,
    /// Tokens generated before this sampler's first call (a resumed stream's).
    resumed: usize,
    /// Where the generated tokens start in `history` (known at the first call).
    generated_from: Option<usize>,
    rng: StdRng,
    /// Added to these tokens' logits first.
    bias: Vec<(u32, f32)>,
    /// Scratch buffer of (id, value) pairs, reused across steps.
    scratch: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler for `config`; without a seed the RNG is seeded from the OS.
    pub fn new(config: &GenerateConfig) -> Self {
        let mut rng = match config.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        // A resumed stream: skip the draws its first part took (one per sampled
        // token), so the continuation is the one it would have had.
        if config.temperature > 0.0 {
            for _ in 0..config.rng_position {
                let _: f32 = rng.random();
            }
        }
        Self {
            temperature: config.temperature,
            top_k: config.top_k as usize,
            top_p: config.top_p,
            min_p: config.min_p,
            repeat_penalty: config.repeat_penalty,
            repeat_last_n: config.repeat_last_n as usize,
            presence: config.presence_penalty,
            frequency: config.frequency_penalty,
            resumed: config.rng_position as usize,
            generated_from: None,
            rng,
            bias: config.logit_bias.clone(),
            scratch: Vec::new(),
        }
    }

    /// Picks the next token from `logits` (modified in place by the repeat penalty),
    /// given the tokens so far (`history`: prompt + generated).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        for &(id, b) in &self.bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
        if self.repeat_penalty > 0.0 && self.repeat_penalty != 1.0 {
            let start = history.len().saturating_sub(self.repeat_last_n);
            let mut seen = history[start..].to_vec();
            seen.sort_unstable();
            seen.dedup();
            for id in seen {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / self.repeat_penalty
                    } else {
                        *l * self.repeat_penalty
                    };
                }
            }
        }
        // The first call's history is the prompt (and a resumed stream's tokens).
        let from = *self
            .generated_from
            .get_or_insert(history.len().saturating_sub(self.resumed));
        if self.presence != 0.0 || self.frequency != 0.0 {
            // OpenAI's: over the tokens generated so far, no window.
            let mut seen = history[from.min(history.len())..].to_vec();
            seen.sort_unstable();
            for run in seen.chunk_by(|a, b| a == b) {
                if let Some(l) = logits.get_mut(run[0] as usize) {
                    *l -= self.presence + self.frequency * run.len() as f32;
                }
            }
        }
        if self.temperature <= 0.0 {
            return argmax(logits);
        }
        let c = &mut self.scratch;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l / self.temperature)),
        );
        // Only what the filters need is ordered: a partial selection for top-k, the
        // best few for top-p (grown until they hold the mass), nothing for min-p or
        // plain sampling. Sorting the whole vocabulary per token cost more than a
        // decode step (Gemma 3: 262,144 entries, ~15 ms). Ties go to the lower id.
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if self.top_k > 0 && self.top_k < c.len() {
            c.select_nth_unstable_by(self.top_k - 1, order);
            c.truncate(self.top_k);
        }
        // Softmax over the survivors.
        let max = c.iter().fold(f32::NEG_INFINITY, |m, e| m.max(e.1));
        let mut sum = 0.0f32;
        for e in c.iter_mut() {
            e.1 = (e.1 - max).exp();
            sum += e.1;
        }
        for e in c.iter_mut() {
            e.1 /= sum;
        }
        if self.min_p > 0.0 {
            // The best token's probability is exp(0) / sum.
            let floor = self.min_p / sum;
            c.retain(|e| e.1 >= floor);
        }
        if self.top_p > 0.0 && self.top_p < 1.0 {
            let mut m = 64.min(c.len());
            loop {
                if m < c.len() {
                    c.select_nth_unstable_by(m - 1, order);
                }
                c[..m].sort_unstable_by(order);
                let mut mass = 0.0;
                let keep = c[..m].iter().position(|e| {
                    mass += e.1;
                    mass >= self.top_p
                });
                if let Some(i) = keep {
                    c.truncate(i + 1);
                    break;
                }
                if m == c.len() {
                    break;
                }
                m = (m * 8).min(c.len());
            }
        }
        let total: f32 = c.iter().map(|e| e.1).sum();
        let mut r = self.rng.random::<f32>() * total;
        for e in c.iter() {
            r -= e.1;
            if r <= 0.0 {
                return e.0;
            }
        }
        c[c.len() - 1].0
    }
}

/// `ln Σ exp(logits)`, so that `logits[i] − log_normalizer(logits)` is token `i`'s
/// log-probability (summed in f64 from the largest logit down, so nothing
/// overflows and a 262,144-token vocabulary loses nothing to rounding).
pub fn log_normalizer(logits: &[f32]) -> f32 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    if !max.is_finite() {
        return max;
    }
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    (max as f64 + sum.ln()) as f32
}

/// The `n` largest logits' ids, largest first (the lower id first on ties).
pub fn top_ids(logits: &[f32], n: usize) -> Vec<u32> {
    let order = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(ids.len());
    if n == 0 {
        return Vec::new();
    }
    if n < ids.len() {
        ids.select_nth_unstable_by(n - 1, order);
        ids.truncate(n);
    }
    ids.sort_unstable_by(order);
    ids
}

/// Token `next`'s log-probability under the raw `logits`, with the `top` most
/// likely tokens (`bytes_of` gives a token's bytes).
pub fn token_logprob<'a>(logits: &[f32], next: u32, top: usize, bytes_of: impl Fn(u32) -> &'a [u8]) -> TokenLogprob {
    let z = log_normalizer(logits);
    TokenLogprob {
        logprob: logits[next as usize] - z,
        bytes: bytes_of(next).to_vec(),
        top: top_ids(logits, top)
            .into_iter()
            .map(|id| TopLogprob {
                id,
                bytes: bytes_of(id).to_vec(),
                logprob: logits[id as usize] - z,
            })
            .collect(),
    }
}

/// Index of the largest logit (the first on ties, as llama.cpp).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(t: f32) -> GenerateConfig {
        GenerateConfig {
            temperature: t,
            seed: Some(7),
            ..Default::default()
        }
    }

    #[test]
    fn log_probabilities_normalise_and_rank() {
        let logits = [1.0f32, 3.0, 3.0, -2.0, 0.5];
        let z = log_normalizer(&logits);
        let total: f64 = logits.iter().map(|&l| ((l - z) as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        let exact = (logits.iter().map(|&l| (l as f64).exp()).sum::<f64>()).ln();
        assert!((z as f64 - exact).abs() < 1e-6);
        assert_eq!(top_ids(&logits, 3), vec![1, 2, 0], "largest first, lower id on ties");
        assert_eq!(top_ids(&logits, 0), Vec::<u32>::new());
        assert_eq!(top_ids(&logits, 9), vec![1, 2, 0, 4, 3]);
        // Huge logits neither overflow nor lose the normaliser.
        let big = [1e30f32, 1e30 - 1e24, -1e30];
        assert!(log_normalizer(&big).is_finite());
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(&cfg(0.0));
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0], &[]), 1);
    }

    #[test]
    fn same_seed_same_choices() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = || {
            let mut s = Sampler::new(&cfg(1.0));
            (0..20).map(|_| s.sample(&mut logits.clone(), &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut c = cfg(5.0);
        c.top_k = 1;
        let mut s = Sampler::new(&c);
        for _ in 0..10 {
            assert_eq!(s.sample(&mut [0.0, 1.0, 0.5], &[]), 1);
        }
    }

    #[test]
    fn repeat_penalty_moves_greedy_off_a_seen_token() {
        let mut c = cfg(0.0);
        c.repeat_penalty = 4.0;
        let mut s = Sampler::new(&c);
        assert_eq!(s.sample(&mut [1.0, 2.0, 1.5], &[1]), 2);
    }

    #[test]
    fn presence_and_frequency_penalise_generated_tokens_only() {
        let mut c = cfg(0.0);
        c.presence_penalty = 0.4;
        let mut s = Sampler::new(&c);
        // The prompt is [1, 1]: not penalised.
        assert_eq!(s.sample(&mut [1.0, 2.0, 1.7], &[1, 1]), 1);
        // Token 1 generated once: 2.0 - 0.4 < 1.7.
        assert_eq!(s.sample(&mut [1.0, 2.0, 1.7], &[1, 1, 1]), 2);
        let mut c = cfg(0.0);
        c.frequency_penalty = 0.2;
        let mut s = Sampler::new(&c);
        assert_eq!(s.sample(&mut [1.0, 2.0, 1.7], &[0]), 1);
        assert_eq!(s.sample(&mut [1.0, 2.0, 1.7], &[0, 1]), 1, "2.0 - 0.2 > 1.7");
        assert_eq!(s.sample(&mut [1.0, 2.0, 1.7], &[0, 1, 1]), 2, "2.0 - 0.4 < 1.7");
        // A resumed stream counts the tokens generated before it.
        let mut c = cfg(0.0);
        c.presence_penalty = 0.4;
        c.rng_position = 1;
        let mut s = Sampler::new(&c);
        assert_eq!(s.sample(&mut [1.0, 2.0, 1.7], &[0, 1]), 2);
    }

    #[test]
    fn min_p_drops_the_tail() {
        let mut c = cfg(1.0);
        c.min_p = 0.5;
        let mut s = Sampler::new(&c);
        for _ in 0..50 {
            // Token 2 has ~e^-10 of token 0's mass and must never be picked.
            assert_ne!(s.sample(&mut [10.0, 9.9, 0.0], &[]), 2);
        }
    }

    /// top-p keeps the fewest best tokens holding the mass, however many that is: on a
    /// large vocabulary whose mass is spread over 3,000 equal tokens (beyond the first
    /// guesses of 64 and 512), a draw falls on any of them but never on the tail.
    #[test]
    fn top_p_keeps_the_mass_however_wide_it_is() {
        let mut c = cfg(1.0);
        c.top_p = 0.9;
        c.seed = Some(3);
        let mut s = Sampler::new(&c);
        let mut logits: Vec<f32> = (0..100_000)
            .map(|i: u32| if i.is_multiple_of(20) && i < 60_000 { 5.0 } else { -30.0 })
            .collect();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..300 {
            let t = s.sample(&mut logits.clone(), &[]);
            assert!(t.is_multiple_of(20) && t < 60_000, "{t} is in the tail");
            seen.insert(t);
        }
        assert!(seen.len() > 250, "draws spread over the 3,000: {}", seen.len());
        // A peaked distribution: top-p 0.5 is the best token alone; top-k 2 of three
        // never gives the third.
        logits[7] = 40.0;
        c.top_p = 0.5;
        let mut s = Sampler::new(&c);
        assert!((0..20).all(|_| s.sample(&mut logits.clone(), &[]) == 7));
        let mut c = cfg(1.0);
        c.top_k = 2;
        let mut s = Sampler::new(&c);
        assert!((0..50).all(|_| s.sample(&mut [3.0, -20.0, 3.1], &[]) != 1));
    }
}
