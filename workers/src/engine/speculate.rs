//! Speculative decoding's drafting half: proposing tokens a stream is likely to
//! generate next, so one forward pass can check several of them at once.
//!
//! Prompt lookup (n-gram drafting, no draft model): when the last few tokens of a
//! stream occurred earlier in its prompt or output, the tokens that followed them
//! there are proposed. Rewriting, extraction, code editing and quoting summaries
//! repeat long runs of their input, and there most drafts are right.
//!
//! Checking is the batcher's: the stream's last token and its drafts run as one
//! step whose every position yields logits; the stream samples from each in turn
//! exactly as it would have, one token per row, and keeps going while the sampled
//! token is the drafted one. The drafts are a point mass (the drafter is
//! deterministic), so "sample from the target, accept the draft when they agree"
//! *is* standard speculative sampling's acceptance rule: the output follows the
//! target's distribution exactly, and since the CPU engine's rows do not depend on
//! the rows beside them, the logits are bit for bit those of plain decoding: greedy
//! and seeded sampled output are identical token for token with and without
//! speculation.

/// How a stream drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No speculation.
    Off,
    /// Prompt lookup: continuations of n-grams that already occurred.
    Lookup,
}

impl Mode {
    /// Parses `worker.speculative`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "" | "off" => Ok(Self::Off),
            "lookup" | "ngram" => Ok(Self::Lookup),
            other => Err(format!(
                "unknown speculative mode {other:?} (expected \"off\" or \"lookup\")"
            )),
        }
    }
}

/// The longest and shortest n-grams prompt lookup matches.
const NGRAM_MAX: usize = 3;
const NGRAM_MIN: usize = 2;
/// Below this rolling acceptance drafting pauses (seed 004's rule) ...
const MIN_ACCEPTANCE: f64 = 0.4;
/// ... for this many generated tokens, then tries again.
const PAUSE_TOKENS: usize = 32;
/// Verifications a rate needs before it can pause drafting.
const MIN_CHECKS: u32 = 4;

/// One stream's drafting state: how many tokens to propose, adapted to how many
/// were accepted, and its counts for the metrics.
#[derive(Debug, Clone)]
pub struct Drafter {
    mode: Mode,
    /// The most tokens one step proposes.
    max: usize,
    /// Tokens the next step proposes (at most `max`).
    k: usize,
    /// Rolling acceptance rate (accepted / drafted, exponentially averaged).
    rate: f64,
    checks: u32,
    /// Generated-token count before which drafting is paused.
    paused_until: usize,
    /// Tokens proposed and tokens accepted, over the stream.
    pub drafted: u32,
    pub accepted: u32,
}

impl Drafter {
    pub fn new(mode: Mode, max: usize) -> Self {
        let max = if mode == Mode::Off { 0 } else { max };
        Self {
            mode,
            max,
            k: max.min(4),
            rate: 1.0,
            checks: 0,
            paused_until: 0,
            drafted: 0,
            accepted: 0,
        }
    }

    /// Up to `limit` tokens likely to follow `history` (empty: a plain step).
    /// `generated` is how many tokens the stream has generated so far.
    pub fn draft(&self, history: &[u32], generated: usize, limit: usize) -> Vec<u32> {
        let k = self.k.min(limit);
        if self.mode == Mode::Off || k == 0 || generated < self.paused_until {
            return Vec::new();
        }
        lookup(history, k)
    }

    /// A step proposed `drafted` tokens and the stream kept `accepted` of them;
    /// `generated` is the stream's count after the step.
    pub fn observe(&mut self, drafted: usize, accepted: usize, generated: usize) {
        if drafted == 0 {
            return;
        }
        self.drafted += drafted as u32;
        self.accepted += accepted as u32;
        self.checks += 1;
        self.rate = 0.7 * self.rate + 0.3 * accepted as f64 / drafted as f64;
        self.k = if accepted == drafted {
            (self.k * 2).min(self.max)
        } else {
            (accepted + 1).clamp(1, self.max)
        };
        if self.checks >= MIN_CHECKS && self.rate < MIN_ACCEPTANCE {
            // Drafts keep failing here: plain steps for a while, then a fresh try.
            self.paused_until = generated + PAUSE_TOKENS;
            self.rate = 1.0;
            self.checks = 0;
            self.k = self.max.min(4);
        }
    }
}

/// Prompt lookup: the tokens that followed the most recent earlier occurrence of
/// `history`'s last n tokens (n from [`NGRAM_MAX`] down to [`NGRAM_MIN`]), at
/// most `k` of them.
pub fn lookup(history: &[u32], k: usize) -> Vec<u32> {
    let len = history.len();
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let tail = &history[len - n..];
        // Most recent first: a stream that quotes its input tends to go on where it
        // last was. `start + n < len`, so at least one token follows the match.
        if let Some(start) = (0..len - n).rev().find(|&s| history[s..s + n] == *tail) {
            let from = start + n;
            return history[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_proposes_what_followed_the_latest_match() {
        // "1 2 3 4 5 … 1 2 3" → 4 5 (n = 3).
        let h = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3];
        assert_eq!(lookup(&h, 2), vec![4, 5]);
        assert_eq!(lookup(&h, 10), vec![4, 5, 9, 9, 1, 2, 3]);
        // The most recent occurrence wins.
        let h = [7, 8, 1, 7, 8, 2, 7, 8];
        assert_eq!(lookup(&h, 1), vec![2]);
        // A bigram when no trigram repeats; nothing when no bigram does.
        assert_eq!(lookup(&[5, 1, 2, 6, 0, 1, 2], 3), vec![6, 0, 1]);
        assert!(lookup(&[1, 2, 3, 4], 3).is_empty());
        assert!(lookup(&[1], 3).is_empty());
    }

    #[test]
    fn k_follows_acceptance_and_drafting_pauses_when_it_stays_low() {
        let mut d = Drafter::new(Mode::Lookup, 8);
        let h = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3];
        assert_eq!(d.draft(&h, 0, 100).len(), 4);
        d.observe(4, 4, 5);
        assert_eq!(d.draft(&h, 5, 100).len(), 8);
        assert_eq!(d.draft(&h, 5, 3).len(), 3, "never past the limit");
        d.observe(8, 2, 8);
        assert_eq!(d.draft(&h, 8, 100).len(), 3);
        d.observe(3, 0, 9);
        assert_eq!(d.draft(&h, 9, 100).len(), 1);
        d.observe(1, 0, 10);
        assert!(d.draft(&h, 12, 100).is_empty(), "paused after low acceptance");
        assert_eq!(d.draft(&h, 10 + PAUSE_TOKENS, 100).len(), 4, "and tries again later");
        assert_eq!((d.drafted, d.accepted), (16, 6));
        assert!(Drafter::new(Mode::Off, 8).draft(&h, 0, 100).is_empty());
    }
}
