//! The forward pass behind the engine: the [`Forward`] trait over independent KV
//! sequences, switchyard's own implementation ([`CpuForward`]: one KV cache per
//! slot). The candle pass ([`crate::candle::CandleForward`], the `cuda`
//! backend's native engine) is the other implementation.

use super::kv_cache::KvPage;
use super::llama::{KvCache, LlamaModel, Step};
use super::lora::LoraAdapter;
use std::sync::Arc;
use switchyard_backend::BackendError;

/// Post-RoPE keys read from a KV cache.
pub struct CachedKeys {
    /// `[layer][kv_head]` → `positions * head_dim` floats.
    pub keys: Vec<Vec<Vec<f32>>>,
    /// KV heads per layer.
    pub heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// One sequence's part of a forward step: `tokens` at positions `pos..` of
/// sequence `seq`, with logits wanted for the last `outputs` of them.
#[derive(Debug, Clone, Copy)]
pub struct SeqStep<'a> {
    pub seq: usize,
    pub tokens: &'a [u32],
    pub pos: usize,
    /// 1, but when verifying drafted tokens (speculative decoding): then the
    /// position before each drafted token wants logits too.
    pub outputs: usize,
}

impl<'a> SeqStep<'a> {
    /// `tokens` at `pos..` of `seq`, logits of the last one only.
    pub fn new(seq: usize, tokens: &'a [u32], pos: usize) -> Self {
        Self {
            seq,
            tokens,
            pos,
            outputs: 1,
        }
    }
}

/// A model's forward pass over one or more independent KV sequences.
pub trait Forward: Send {
    /// Independent KV sequences (slots) this implementation holds.
    fn sequences(&self) -> usize {
        1
    }
    /// Runs every step (distinct sequences) as one pass and returns the logits of
    /// each step's last `outputs` positions, step after step (one row per step
    /// when every `outputs` is 1).
    fn forward_batch(&mut self, steps: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>, BackendError>;
    /// [`Forward::forward_batch`], returning instead of logits the hidden states
    /// after the output norm of each step's last `outputs` positions (embeddings).
    fn hidden_batch(&mut self, steps: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        let _ = steps;
        Err(BackendError::Unavailable(format!(
            "the {} engine does not compute embeddings",
            self.kind()
        )))
    }
    /// Which implementation this is (for logs and benchmarks).
    fn kind(&self) -> &'static str;
    /// Post-RoPE keys of positions `0..len` of sequence `seq` with (kv heads, head
    /// size), when the implementation can read its cache.
    fn cached_keys(&self, _seq: usize, _len: usize) -> Option<CachedKeys> {
        None
    }
    /// Whether a step at `pos` below what the sequence holds keeps positions
    /// `0..pos` and overwrites the rest, so a resident prefix can be reused.
    fn reuses_prefix(&self) -> bool {
        false
    }
    /// Where a step of sequence `seq` can resume, given that it holds the tokens of
    /// positions `0..want`: `want`, or less (0: start over) where the cache no longer
    /// holds what a step at `want` attends to (sliding-window layers keeping a ring).
    fn resumable(&self, _seq: usize, want: usize) -> usize {
        want
    }
    /// Whether [`Forward::copy_prefix`] shares memory between the sequences where the
    /// implementation can (true) or copies (false).
    fn share_prefixes(&mut self, _share: bool) {}
    /// Copies positions `0..len` of sequence `from` into sequence `to`; false when
    /// the implementation cannot.
    fn copy_prefix(&mut self, _from: usize, _to: usize, _len: usize) -> bool {
        false
    }
    /// Bytes each further cached position takes in one sequence (0 when unknown):
    /// on the layers that hold every position, when sliding-window layers keep a
    /// ring (a cost that stops growing at the ring's length; see [`Forward::kv_bytes`]).
    fn kv_bytes_per_token(&self) -> usize {
        0
    }
    /// Bytes `tokens` cached positions take in one sequence.
    fn kv_bytes(&self, tokens: usize) -> usize {
        tokens * self.kv_bytes_per_token()
    }
    /// Bytes of KV all sequences hold together, where sequences share memory (pages
    /// of a common prefix counted once); `None`: as [`Forward::kv_bytes`] of each.
    fn kv_held_bytes(&self) -> Option<usize> {
        None
    }
    /// Keys and values of positions `start..start + n` of sequence `seq`, when the
    /// implementation can read them out (and still holds them).
    fn read_rows(&self, _seq: usize, _start: usize, _n: usize) -> Option<(Vec<u16>, Vec<u16>)> {
        None
    }
    /// Block `b` (positions `b * PAGE..(b + 1) * PAGE`) of sequence `seq` as a shared
    /// page, where the implementation keeps every layer of it in one.
    fn page(&self, _seq: usize, _b: usize) -> Option<Arc<KvPage>> {
        None
    }
    /// Makes `page` block `b` of sequence `seq` (see [`KvCache::adopt`]); false when
    /// the implementation cannot (then nothing changed).
    fn adopt_page(&mut self, _seq: usize, _b: usize, _page: Arc<KvPage>) -> bool {
        false
    }
    /// Writes what [`Forward::read_rows`] returned into sequence `seq` at `start`;
    /// false when it cannot (then nothing was written).
    fn write_rows(&mut self, _seq: usize, _start: usize, _n: usize, _k: &[u16], _v: &[u16]) -> bool {
        false
    }
    /// Rows a sliding-window layer keeps per sequence when it keeps a ring (it then
    /// loses position `p` once a step writes position `p + ring`); `None` when every
    /// layer keeps every position.
    fn ring(&self) -> Option<usize> {
        None
    }
    /// The most positions one pass writes into a sequence; a longer step is run as
    /// several passes.
    fn max_pass(&self) -> usize {
        usize::MAX
    }
    /// Bytes in use now and at the peak on the accelerator it computes on, from the
    /// driver; `None` on the CPU (the process's own memory is reported then).
    fn device_memory(&self) -> Option<(u64, u64)> {
        None
    }
    /// The base model's shape when this pass applies LoRA adapters per sequence
    /// ([`Forward::set_adapter`]); `None`: it applies none.
    fn lora_base(&self) -> Option<&super::params::LlamaParams> {
        None
    }
    /// Runs sequence `seq` with `adapter` (none: the base model) from its next step
    /// on; false when the pass applies no adapters.
    fn set_adapter(&mut self, _seq: usize, _adapter: Option<Arc<LoraAdapter>>) -> bool {
        false
    }
}

/// switchyard's own forward pass with one KV cache per slot.
pub struct CpuForward {
    pub model: LlamaModel,
    pub caches: Vec<KvCache>,
    /// Whether a prefix taken from another sequence shares its pages (else: copies
    /// them, each sequence holding its own — the layout before pages, kept for `bench
    /// kv`'s comparison).
    pub share_pages: bool,
    /// Per sequence, the LoRA adapter its steps run with.
    pub adapters: Vec<Option<Arc<LoraAdapter>>>,
}

impl CpuForward {
    /// `model` with `slots` (at least 1) independent sequences.
    pub fn new(model: LlamaModel, slots: usize) -> Self {
        let caches: Vec<KvCache> = (0..slots.max(1)).map(|_| model.new_cache()).collect();
        Self {
            model,
            adapters: vec![None; caches.len()],
            caches,
            share_pages: true,
        }
    }

    /// One pass over `steps`: logits, or (`hidden`) the final hidden states.
    fn run(&mut self, steps: &[SeqStep<'_>], hidden: bool) -> Result<Vec<Vec<f32>>, BackendError> {
        let ctx = self.model.context_len();
        let mut caches: Vec<Option<&mut KvCache>> = self.caches.iter_mut().map(Some).collect();
        let mut batch = Vec::with_capacity(steps.len());
        for s in steps {
            if s.pos + s.tokens.len() > ctx {
                return Err(BackendError::Compute(format!(
                    "position {} beyond the KV cache of {ctx}",
                    s.pos + s.tokens.len()
                )));
            }
            let cache = caches
                .get_mut(s.seq)
                .and_then(Option::take)
                .ok_or_else(|| BackendError::Compute(format!("sequence {} missing or named twice", s.seq)))?;
            if cache.resumable(s.pos) != s.pos {
                return Err(BackendError::Compute(format!(
                    "sequence {}: a step at {} needs keys its sliding-window layers no longer hold",
                    s.seq, s.pos
                )));
            }
            batch.push(Step {
                cache,
                tokens: s.tokens,
                pos: s.pos,
                outputs: s.outputs,
                lora: self.adapters.get(s.seq).and_then(Option::as_deref),
            });
        }
        Ok(if hidden {
            self.model.hidden_batch(&mut batch)
        } else {
            self.model.forward_batch(&mut batch)
        })
    }
}

impl Forward for CpuForward {
    fn sequences(&self) -> usize {
        self.caches.len()
    }

    fn forward_batch(&mut self, steps: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        self.run(steps, false)
    }

    fn hidden_batch(&mut self, steps: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        self.run(steps, true)
    }

    fn kind(&self) -> &'static str {
        "switchyard"
    }

    fn reuses_prefix(&self) -> bool {
        true
    }

    fn resumable(&self, seq: usize, want: usize) -> usize {
        self.caches.get(seq).map_or(0, |c| c.resumable(want))
    }

    fn share_prefixes(&mut self, share: bool) {
        self.share_pages = share;
    }

    /// Shares the pages of positions `0..len` (see [`KvCache::copy_prefix`]).
    fn copy_prefix(&mut self, from: usize, to: usize, len: usize) -> bool {
        if from == to || from >= self.caches.len() || to >= self.caches.len() {
            return false;
        }
        let (src, dst) = if from < to {
            let (a, b) = self.caches.split_at_mut(to);
            (&a[from], &mut b[0])
        } else {
            let (a, b) = self.caches.split_at_mut(from);
            (&b[0], &mut a[to])
        };
        dst.copy_prefix(src, len, self.share_pages);
        true
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.caches[0].bytes_per_token(&self.model.params)
    }

    fn kv_bytes(&self, tokens: usize) -> usize {
        self.caches[0].bytes(tokens, &self.model.params)
    }

    /// Each page once, however many sequences hold it, and each sequence's rings.
    fn kv_held_bytes(&self) -> Option<usize> {
        let rings: usize = self.caches.iter().map(KvCache::ring_bytes_held).sum();
        Some(KvCache::distinct_page_bytes(&self.caches) + rings)
    }

    fn read_rows(&self, seq: usize, start: usize, n: usize) -> Option<(Vec<u16>, Vec<u16>)> {
        self.caches.get(seq)?.read_rows(start, n, &self.model.params)
    }

    fn ring(&self) -> Option<usize> {
        self.caches[0].ring()
    }

    fn page(&self, seq: usize, b: usize) -> Option<Arc<KvPage>> {
        let c = self.caches.get(seq).filter(|c| c.ring().is_none())?;
        c.pages().get(b).cloned()
    }

    fn adopt_page(&mut self, seq: usize, b: usize, page: Arc<KvPage>) -> bool {
        self.caches.get_mut(seq).is_some_and(|c| c.adopt(b, page))
    }

    fn max_pass(&self) -> usize {
        self.caches[0].max_pass()
    }

    fn lora_base(&self) -> Option<&super::params::LlamaParams> {
        Some(&self.model.params)
    }

    fn set_adapter(&mut self, seq: usize, adapter: Option<Arc<LoraAdapter>>) -> bool {
        match self.adapters.get_mut(seq) {
            Some(a) => {
                *a = adapter;
                true
            }
            None => false,
        }
    }

    fn write_rows(&mut self, seq: usize, start: usize, n: usize, k: &[u16], v: &[u16]) -> bool {
        let params = &self.model.params;
        self.caches
            .get_mut(seq)
            .is_some_and(|cache| cache.write_rows(start, n, k, v, params))
    }

    /// `None` too when sliding-window rings no longer hold positions `0..len`.
    fn cached_keys(&self, seq: usize, len: usize) -> Option<CachedKeys> {
        Some(CachedKeys {
            keys: self.caches.get(seq)?.keys(len, &self.model.params)?,
            heads: self.model.params.n_head_kv,
            head_dim: self.model.params.head_dim,
        })
    }
}
