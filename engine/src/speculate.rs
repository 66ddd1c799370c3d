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

use super::block_store::common_prefix;
use super::model::forward::{CpuForward, Forward, SeqStep};
use super::model::llama::LlamaModel;
use super::sampler::argmax;
use super::text::tokenizer::GgufTokenizer;
use candle_core::quantized::gguf_file;
use std::path::Path;
use switchyard_backend::BackendError;

/// How a stream drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No speculation.
    Off,
    /// Prompt lookup: continuations of n-grams that already occurred.
    Lookup,
    /// A smaller model with the same vocabulary drafts greedily ([`DraftModel`]).
    Draft,
}

impl Mode {
    /// Parses `worker.speculative`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "" | "off" => Ok(Self::Off),
            "lookup" | "ngram" => Ok(Self::Lookup),
            "draft" => Ok(Self::Draft),
            other => Err(format!(
                "unknown speculative mode {other:?} (expected \"off\", \"lookup\" or \"draft\")"
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
/// The acceptance assumed before anything was checked: high enough that drafting
/// gets tried.
const PRIOR_ACCEPTANCE: f64 = 0.8;

/// Acceptance over the engine's recent checks (decayed counts), the starting guess
/// of a new stream's: where the traffic's drafts keep failing, a new stream does not
/// spend its first steps finding that out again.
#[derive(Debug, Clone, Default)]
pub struct Prior {
    kept: f64,
    rejected: f64,
}

impl Prior {
    /// A check of `drafted` tokens kept `accepted`.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        if drafted > 0 {
            self.kept = 0.98 * self.kept + accepted as f64;
            self.rejected = 0.98 * self.rejected + f64::from(u8::from(accepted < drafted));
        }
    }

    /// The estimated chance that a drafted token is kept.
    pub fn acceptance(&self) -> f64 {
        estimate(self.kept, self.rejected, PRIOR_ACCEPTANCE)
    }
}

/// The chance that the next drafted token is kept, from decayed counts of kept
/// tokens and of checks that ended on a rejected one, with `prior` weighing as two
/// observations.
fn estimate(kept: f64, rejected: f64, prior: f64) -> f64 {
    (kept + 2.0 * prior) / (kept + rejected + 2.0)
}

/// What a forward step costs by how many positions it computes (all sequences
/// together): measured, exponentially averaged, so the drafter knows what checking
/// `k` more tokens costs on this model and host. A checked position is cheap where
/// decode is bound by reading the weights (they are read once for all positions)
/// and costs nearly a decode step where it is bound by arithmetic (small models).
#[derive(Debug, Clone, Default)]
pub struct StepCosts {
    /// `us[r]`: microseconds of a step of `r` positions (0 = not seen yet).
    us: Vec<f64>,
}

impl StepCosts {
    /// The most positions tracked; larger steps are prefill, not decode.
    const MAX: usize = 64;

    /// A step of `rows` positions took `us` microseconds.
    pub fn observe(&mut self, rows: usize, us: f64) {
        if rows == 0 || rows > Self::MAX {
            return;
        }
        if self.us.len() <= rows {
            self.us.resize(rows + 1, 0.0);
        }
        let avg = &mut self.us[rows];
        *avg = if *avg <= 0.0 { us } else { 0.8 * *avg + 0.2 * us };
    }

    /// Estimated microseconds of a step of `rows` positions: measured, else
    /// interpolated between the nearest measured sizes; larger than any measured,
    /// the largest measured (optimistic, so an untried size gets tried once and is
    /// known from then on); smaller, in proportion to the smallest measured. `None`
    /// before any step was measured.
    pub fn estimate(&self, rows: usize) -> Option<f64> {
        let seen = |r: usize| self.us.get(r).copied().filter(|&u| u > 0.0);
        if let Some(u) = seen(rows) {
            return Some(u);
        }
        let below = (1..rows.min(self.us.len())).rev().find_map(|r| seen(r).map(|u| (r, u)));
        let above = (rows + 1..self.us.len()).find_map(|r| seen(r).map(|u| (r, u)));
        match (below, above) {
            (Some((r0, u0)), Some((r1, u1))) => Some(u0 + (u1 - u0) * (rows - r0) as f64 / (r1 - r0) as f64),
            // Smaller than any measured: in proportion (a step of fewer positions
            // costs no more per position), so plain steps get tried and measured.
            (None, Some((r1, u1))) => Some(u1 * rows as f64 / r1 as f64),
            (Some((_, u)), None) => Some(u),
            (None, None) => None,
        }
    }
}

/// One stream's drafting state: its acceptance, from which the number of tokens to
/// propose is chosen against what checking them costs, and its counts for the
/// metrics.
#[derive(Debug, Clone)]
pub struct Drafter {
    mode: Mode,
    /// The most tokens one step proposes (0: speculation is off).
    max: usize,
    /// Decayed counts of drafted tokens kept, and of checks that ended on a rejected
    /// one: the chance that each next drafted token is kept is about
    /// `kept / (kept + rejected)`.
    kept: f64,
    rejected: f64,
    checks: u32,
    /// Generated-token count before which drafting is paused.
    paused_until: usize,
    /// The acceptance assumed before this stream's own checks.
    prior: f64,
    /// Tokens proposed and tokens accepted, over the stream (counted by the
    /// batcher as it checks them).
    pub drafted: u32,
    pub accepted: u32,
}

impl Drafter {
    /// A stream's drafter, starting from the engine's `prior` acceptance.
    pub fn new(mode: Mode, max: usize, prior: f64) -> Self {
        let max = if mode == Mode::Off { 0 } else { max };
        Self {
            mode,
            max,
            prior,
            kept: 0.0,
            rejected: 0.0,
            checks: 0,
            paused_until: 0,
            drafted: 0,
            accepted: 0,
        }
    }

    /// How this stream drafts.
    pub fn mode(&self) -> Mode {
        if self.max == 0 {
            Mode::Off
        } else {
            self.mode
        }
    }

    /// The estimated chance that a drafted token is kept, given the ones before it
    /// were.
    pub fn acceptance(&self) -> f64 {
        estimate(self.kept, self.rejected, self.prior)
    }

    /// Up to `limit` tokens likely to follow `history` (empty: a plain step), as
    /// many as maximise the expected tokens per microsecond given `cost(k)`, the
    /// estimated time of the step with `k` drafted tokens added (`None`: unknown,
    /// then every drafted token is proposed). `generated` is how many tokens the
    /// stream has generated so far.
    pub fn draft(
        &self,
        history: &[u32],
        generated: usize,
        limit: usize,
        cost: impl Fn(usize) -> Option<f64>,
    ) -> Vec<u32> {
        let k = self.max.min(limit);
        if k == 0 || generated < self.paused_until {
            return Vec::new();
        }
        let mut drafts = lookup(history, k);
        drafts.truncate(self.size(drafts.len(), cost));
        drafts
    }

    /// How many tokens a draft model should propose (up to `limit`), as
    /// [`Self::draft`] chooses.
    pub fn wanted(&self, generated: usize, limit: usize, cost: impl Fn(usize) -> Option<f64>) -> usize {
        if generated < self.paused_until {
            return 0;
        }
        self.size(self.max.min(limit), cost)
    }

    /// The number of drafts, at most `available`, that maximises expected tokens per
    /// microsecond.
    fn size(&self, available: usize, cost: impl Fn(usize) -> Option<f64>) -> usize {
        let a = self.acceptance();
        // Expected tokens from a step checking k drafts: 1 + a + … + a^k.
        let mut best = (0, 1.0 / cost(0).unwrap_or(1.0));
        let mut expected = 1.0;
        for k in 1..=available {
            expected += a.powi(k as i32);
            let rate = expected / cost(k).unwrap_or(1.0);
            if rate > best.1 {
                best = (k, rate);
            }
        }
        best.0
    }

    /// A step proposed `drafted` tokens and the stream kept `accepted` of them;
    /// `generated` is the stream's count after the step.
    pub fn observe(&mut self, drafted: usize, accepted: usize, generated: usize) {
        if drafted == 0 {
            return;
        }
        self.checks += 1;
        self.kept = 0.8 * self.kept + accepted as f64;
        self.rejected = 0.8 * self.rejected + f64::from(u8::from(accepted < drafted));
        if self.checks >= MIN_CHECKS && self.acceptance() < MIN_ACCEPTANCE {
            // Drafts keep failing here: plain steps for a while, then a fresh try.
            self.paused_until = generated + PAUSE_TOKENS;
            (self.kept, self.rejected, self.checks) = (0.0, 0.0, 0);
        }
    }
}

/// A smaller model with the target's vocabulary that drafts greedily, one KV
/// sequence per slot of the target (seed 004's draft model). Greedy drafts are a
/// point mass, so checking them as prompt lookup's keeps output exact.
pub struct DraftModel {
    pub model: Box<dyn Forward>,
    /// Per slot, the tokens whose keys and values the draft model holds.
    resident: Vec<Vec<u32>>,
    /// Microseconds one drafting pass took (exponential average; 0 = none yet).
    pub pass_us: f64,
}

impl DraftModel {
    /// A draft model for speculative decoding: a GGUF whose vocabulary is the
    /// target's token for token, with the target's context and slots.
    pub fn load(path: &Path, target: &GgufTokenizer, context_len: usize, slots: usize) -> Result<Self, String> {
        let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
        let content = gguf_file::Content::read(&mut std::io::BufReader::with_capacity(1 << 20, &file))
            .map_err(|e| format!("not a readable GGUF file: {e}"))?;
        let vocab = GgufTokenizer::from_gguf(&content).map_err(|e| e.to_string())?;
        if vocab.vocab_size() != target.vocab_size() {
            return Err(format!(
                "its vocabulary has {} tokens, the model's {}: a draft must share the vocabulary",
                vocab.vocab_size(),
                target.vocab_size()
            ));
        }
        if let Some(id) = (0..vocab.vocab_size() as u32).find(|&id| vocab.token_bytes(id) != target.token_bytes(id)) {
            return Err(format!(
                "token {id} is {:?} in it and {:?} in the model: a draft must share the vocabulary",
                String::from_utf8_lossy(vocab.token_bytes(id)),
                String::from_utf8_lossy(target.token_bytes(id))
            ));
        }
        drop(vocab);
        let model = LlamaModel::load(&content, &mut file, context_len).map_err(|e| e.to_string())?;
        Ok(Self::new(Box::new(CpuForward::new(model, slots))))
    }

    pub fn new(model: Box<dyn Forward>) -> Self {
        let resident = vec![Vec::new(); model.sequences()];
        Self {
            model,
            resident,
            pass_us: 0.0,
        }
    }

    /// Greedy drafts for each `(slot, history, k)`: up to `k` tokens continuing
    /// `history`. The first pass brings each slot up to its history (only what it
    /// lacks: what it held beyond a rejected draft is overwritten); each further pass
    /// feeds every stream's latest draft, all streams in one batch.
    pub fn draft(&mut self, wants: &[(usize, &[u32], usize)]) -> Result<Vec<Vec<u32>>, BackendError> {
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); wants.len()];
        let active: Vec<usize> = (0..wants.len()).filter(|&i| wants[i].2 > 0).collect();
        if active.is_empty() {
            return Ok(out);
        }
        let steps: Vec<SeqStep<'_>> = active
            .iter()
            .map(|&i| {
                let (slot, history, _) = wants[i];
                let have = common_prefix(&self.resident[slot], history).min(history.len() - 1);
                SeqStep::new(slot, &history[have..], have)
            })
            .collect();
        let logits = self.model.forward_batch(&steps);
        // Whatever happened, a slot holds its history's prefix at most.
        for &i in &active {
            let (slot, history, _) = wants[i];
            let keep = common_prefix(&self.resident[slot], history).min(history.len() - 1);
            self.resident[slot].truncate(keep);
        }
        for (&i, l) in active.iter().zip(logits?) {
            let (slot, history, _) = wants[i];
            self.resident[slot] = history.to_vec();
            out[i].push(argmax(&l));
        }
        // The passes after the first (which may catch up a whole prompt) are what
        // each further drafted token costs.
        let (started, mut passes) = (std::time::Instant::now(), 0);
        loop {
            let more: Vec<usize> = active.iter().copied().filter(|&i| out[i].len() < wants[i].2).collect();
            if more.is_empty() {
                break;
            }
            passes += 1;
            let fed: Vec<[u32; 1]> = more.iter().map(|&i| [*out[i].last().expect("drafted")]).collect();
            let steps: Vec<SeqStep<'_>> = more
                .iter()
                .zip(&fed)
                .map(|(&i, t)| SeqStep::new(wants[i].0, t, self.resident[wants[i].0].len()))
                .collect();
            let logits = self.model.forward_batch(&steps)?;
            for ((&i, t), l) in more.iter().zip(&fed).zip(logits) {
                self.resident[wants[i].0].push(t[0]);
                out[i].push(argmax(&l));
            }
        }
        if passes > 0 {
            let us = started.elapsed().as_micros() as f64 / f64::from(passes);
            self.pass_us = if self.pass_us <= 0.0 {
                us
            } else {
                0.8 * self.pass_us + 0.2 * us
            };
        }
        Ok(out)
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
    fn drafts_are_as_many_as_pay_for_their_check() {
        let h = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3];
        let mut d = Drafter::new(Mode::Lookup, 8, PRIOR_ACCEPTANCE);
        // Unknown costs, or checked positions that cost nothing: every draft.
        assert_eq!(d.draft(&h, 0, 100, |_| None).len(), 8);
        assert_eq!(d.draft(&h, 0, 100, |_| Some(100.0)).len(), 8);
        assert_eq!(d.draft(&h, 0, 3, |_| Some(100.0)).len(), 3, "never past the limit");
        // Each checked position costing a whole step: never worth it.
        assert!(d.draft(&h, 0, 100, |k| Some(100.0 * (k + 1) as f64)).is_empty());
        // Half a step each: two at the first guess of acceptance (0.8: 2.44
        // tokens for two steps' time), none once acceptance is low.
        let half = |k: usize| Some(100.0 + 50.0 * k as f64);
        assert_eq!(d.draft(&h, 0, 100, half).len(), 2);
        for g in 0..3 {
            d.observe(4, 0, g);
        }
        assert!(d.acceptance() < 0.5, "{}", d.acceptance());
        assert!(d.draft(&h, 3, 100, half).is_empty());
        assert!(Drafter::new(Mode::Off, 8, PRIOR_ACCEPTANCE)
            .draft(&h, 0, 100, |_| None)
            .is_empty());
    }

    #[test]
    fn drafting_pauses_while_acceptance_stays_low() {
        let h = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3];
        let mut d = Drafter::new(Mode::Lookup, 8, PRIOR_ACCEPTANCE);
        for g in 1..=3 {
            d.observe(4, 0, g);
        }
        assert!(!d.draft(&h, 3, 100, |_| None).is_empty(), "not yet");
        d.observe(4, 0, 4);
        assert!(d.draft(&h, 4, 100, |_| None).is_empty(), "paused after low acceptance");
        assert_eq!(
            d.draft(&h, 4 + PAUSE_TOKENS, 100, |_| None).len(),
            8,
            "and tries again later"
        );
    }

    #[test]
    fn the_engine_prior_follows_recent_checks() {
        let mut p = Prior::default();
        assert_eq!(p.acceptance(), PRIOR_ACCEPTANCE);
        for _ in 0..10 {
            p.observe(4, 0);
        }
        assert!(p.acceptance() < 0.2, "{}", p.acceptance());
        let d = Drafter::new(Mode::Lookup, 8, p.acceptance());
        let h = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3];
        let half = |k: usize| Some(100.0 + 50.0 * k as f64);
        assert!(d.draft(&h, 0, 100, half).is_empty(), "a new stream starts from it");
        let low = p.acceptance();
        p.observe(0, 0);
        assert_eq!(p.acceptance(), low, "a step without drafts says nothing");
        p.observe(4, 4);
        assert!(p.acceptance() > low + 0.2, "{}", p.acceptance());
    }

    #[test]
    fn step_costs_interpolate_between_measured_sizes() {
        let mut c = StepCosts::default();
        assert_eq!(c.estimate(3), None);
        c.observe(9, 900.0);
        assert_eq!(c.estimate(3), Some(300.0), "in proportion below what was seen");
        let mut c = StepCosts::default();
        c.observe(1, 100.0);
        c.observe(5, 300.0);
        assert_eq!(c.estimate(1), Some(100.0));
        assert_eq!(c.estimate(3), Some(200.0));
        assert_eq!(c.estimate(9), Some(300.0), "optimistic beyond what was seen");
        c.observe(1, 200.0);
        assert_eq!(c.estimate(1), Some(120.0), "averaged");
    }
}
