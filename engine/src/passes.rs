//! Work outside the continuous batch, run between decode steps on the compute
//! thread: the attention inspector (prefill, then read the post-RoPE keys) and
//! classification and embeddings (prefill-only passes, one ragged batch per group of
//! free slots).

use super::compute::ComputeState;
use super::model::forward::{CachedKeys, SeqStep};
use switchyard_backend::{BackendError, Prompt};
use switchyard_messages::{AttentionSnapshot, ClassifyResult, Embedding, Token};

/// The most tokens one embedding pass takes (several inputs together).
pub const EMBED_PASS_TOKENS: usize = 2048;

impl ComputeState {
    /// Prefills `prompt` in a free slot and returns the post-RoPE keys of every layer.
    pub fn inspect(&mut self, prompt: &Prompt, architecture: String) -> Result<AttentionSnapshot, BackendError> {
        let tokens = self.tokenize(prompt)?;
        self.check_fits(&tokens, 0)?;
        let (slot, reused) = self
            .claim(&tokens, None)
            .ok_or_else(|| BackendError::Unavailable("no free KV slot".into()))?;
        let result = self.forward(&[SeqStep::new(slot, &tokens[reused..], reused)]);
        let keys = result.and_then(|_| {
            self.model.cached_keys(slot, tokens.len()).ok_or_else(|| {
                BackendError::Unavailable(format!(
                    "the {} engine cannot read the keys of these {} positions from its KV cache \
                     (it keeps none, or only a sliding window of them)",
                    self.model.kind(),
                    tokens.len()
                ))
            })
        });
        self.release(slot);
        let CachedKeys { keys, heads, head_dim } = keys?;
        Ok(AttentionSnapshot {
            num_layers: keys.len() as u32,
            num_heads: heads as u32,
            seq_len: tokens.len() as u32,
            head_dim: head_dim as u32,
            keys,
            architecture,
        })
    }

    /// Embeddings: each input's tokens through the model from position 0 in a free
    /// slot, the final hidden states (after the output norm) pooled as
    /// [`ComputeState::pooling`] says (mean unless configured or the model says otherwise)
    /// and L2-normalised — llama.cpp's `--pooling` with its default Euclidean
    /// normalisation. Inputs run together as ragged batches (one per group of
    /// free slots, up to [`EMBED_PASS_TOKENS`] tokens; a longer input runs alone); a
    /// failing input fails alone.
    pub fn embed(&mut self, inputs: &[Prompt]) -> Vec<Result<Embedding, BackendError>> {
        let max = self.model.max_pass();
        let mut results: Vec<Option<Result<Embedding, BackendError>>> = Vec::with_capacity(inputs.len());
        let mut ready: Vec<(usize, Vec<u32>)> = Vec::new();
        for (i, p) in inputs.iter().enumerate() {
            let tokens = self.tokenize(p).and_then(|t| self.check_fits(&t, 0).map(|_| t));
            match tokens {
                Ok(t) if t.len() > max => results.push(Some(Err(BackendError::Invalid(format!(
                    "an input of {} tokens: this model embeds at most {max} in one pass",
                    t.len()
                ))))),
                Ok(t) => {
                    results.push(None);
                    ready.push((i, t));
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let (group, budget) = (self.free_slots().max(1), EMBED_PASS_TOKENS.min(max));
        let mut start = 0;
        while start < ready.len() {
            let (mut end, mut tokens) = (start, 0);
            while end < ready.len() && end - start < group && (end == start || tokens + ready[end].1.len() <= budget) {
                tokens += ready[end].1.len();
                end += 1;
            }
            for (i, outcome) in self.embed_pass(&ready[start..end]) {
                results[i] = Some(outcome);
            }
            start = end;
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(BackendError::Compute("not run".into()))))
            .collect()
    }

    /// One ragged pass over `inputs` (index, tokens), one free slot each.
    fn embed_pass(&mut self, inputs: &[(usize, Vec<u32>)]) -> Vec<(usize, Result<Embedding, BackendError>)> {
        let mut out = Vec::with_capacity(inputs.len());
        let mut claimed = Vec::new();
        for (i, tokens) in inputs {
            match self.claim(tokens, None) {
                Some((slot, _)) => claimed.push((*i, tokens, slot)),
                None => out.push((*i, Err(BackendError::Unavailable("no free KV slot".into())))),
            }
        }
        let steps: Vec<SeqStep<'_>> = claimed
            .iter()
            .map(|(_, t, slot)| SeqStep {
                outputs: t.len(),
                ..SeqStep::new(*slot, t, 0)
            })
            .collect();
        let rows = self.hidden(&steps);
        for (_, _, slot) in &claimed {
            self.release(*slot);
        }
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                out.extend(claimed.iter().map(|(i, ..)| (*i, Err(e.clone()))));
                return out;
            }
        };
        let d = rows.first().map_or(0, Vec::len);
        let mut rows = rows.into_iter();
        for (i, tokens, _) in &claimed {
            let own: Vec<f32> = rows.by_ref().take(tokens.len()).flatten().collect();
            let embedding = Embedding {
                vector: self.pooling.pool(&own, d),
                tokens: tokens.len() as u32,
            };
            out.push((*i, Ok(embedding)));
        }
        out
    }

    /// Prefill-only passes: the argmax token and, if asked, the logits of each
    /// prompt. Prompts run together as one ragged batch per group of free slots
    /// (every prompt's rows in the same matmuls, no padding); a failing prompt fails
    /// alone.
    pub fn classify(&mut self, prompts: &[Prompt], return_logits: bool) -> Vec<Result<ClassifyResult, BackendError>> {
        let mut results: Vec<Option<Result<ClassifyResult, BackendError>>> = Vec::new();
        let mut ready = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            match self.tokenize(p).and_then(|t| self.check_fits(&t, 0).map(|_| t)) {
                Ok(t) => {
                    results.push(None);
                    ready.push((i, t));
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let group = self.free_slots().max(1);
        for chunk in ready.chunks(group) {
            let mut claimed = Vec::new();
            for (i, tokens) in chunk {
                match self.claim(tokens, None) {
                    Some((slot, reused)) => claimed.push((*i, tokens, slot, reused)),
                    None => results[*i] = Some(Err(BackendError::Unavailable("no free KV slot".into()))),
                }
            }
            let steps: Vec<SeqStep<'_>> = claimed
                .iter()
                .map(|(_, t, slot, reused)| SeqStep::new(*slot, &t[*reused..], *reused))
                .collect();
            let outcome = self.forward(&steps);
            for (i, _, slot, _) in &claimed {
                self.release(*slot);
                results[*i] = Some(Err(BackendError::Compute("no logits".into())));
            }
            match outcome {
                Ok(all) => {
                    for ((i, ..), logits) in claimed.iter().zip(all) {
                        let id = super::sampler::argmax(&logits);
                        let text = String::from_utf8_lossy(self.tokenizer.token_bytes(id)).into_owned();
                        results[*i] = Some(Ok(ClassifyResult {
                            token: Token {
                                id,
                                text,
                                logprob: None,
                                reasoning: false,
                            },
                            logits: if return_logits { logits } else { Vec::new() },
                        }));
                    }
                }
                Err(e) => {
                    for (i, ..) in &claimed {
                        results[*i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(BackendError::Compute("not run".into()))))
            .collect()
    }
}
