//! One sequence's f16 KV cache, with rings on sliding-window layers.
//!
//! A global layer holds every position: `[kv_head][pos][head_dim]` for `ctx`
//! positions. A sliding-window layer (Gemma 3's local layers) attends only to the
//! last `window` positions, so with a ring it holds `ring = window + SWA_PASS` rows
//! per KV head, position `p` at row `p % ring`. One pass writes at most
//! [`SWA_PASS`] positions (`LlamaModel::forward_batch` splits longer steps), so the
//! rows a pass reads (its first query's window to its last position, at most
//! `window - 1 + SWA_PASS`) never overlap the rows it overwrites. The rings keep only
//! the positions from [`KvCache::ring_start`] on: a step can resume at position `q`
//! only when `q`'s window is still there ([`KvCache::resumable`]).

use super::params::LlamaParams;
use crate::engine::kernels::quants::h2f;
use std::ops::Range;

/// The most positions one forward pass writes into a cache with rings; a ring holds
/// `window + SWA_PASS` rows. The largest prefill chunk the batcher measures
/// (`ChunkBudget::MAX`), so only a prompt prefilled alone is split.
pub const SWA_PASS: usize = 512;

/// The rows of positions `a..b` (at most `rows` of them) in a layer where position
/// `p` sits at row `p % rows`: one range, or two when they wrap.
pub(super) fn wrap(a: usize, b: usize, rows: usize) -> [Range<usize>; 2] {
    let (s, n) = (a % rows, b - a);
    if s + n <= rows {
        [s..s + n, 0..0]
    } else {
        [s..rows, 0..s + n - rows]
    }
}

/// One sequence's keys and values as f16 bits, per layer `[kv_head][row][head_dim]`.
/// Allocated zeroed, so the operating system commits its pages only as rows are
/// written.
pub struct KvCache {
    pub(super) k: Vec<u16>,
    pub(super) v: Vec<u16>,
    ctx: usize,
    /// Rows per KV head of a sliding-window layer; 0 = no rings (every layer holds
    /// every position).
    ring: usize,
    window: usize,
    /// Where each layer starts in `k` and `v`, and its rows per KV head.
    layers: Vec<(usize, usize)>,
    /// The first position the rings still hold (0 without rings).
    start: usize,
}

impl KvCache {
    /// A cache holding all `ctx` positions on every layer (llama.cpp's `--swa-full`).
    pub fn new(p: &LlamaParams, ctx: usize) -> Self {
        Self::build(p, ctx, 0)
    }

    /// A cache for `ctx` positions whose sliding-window layers keep a ring of
    /// `window + pass` rows (when that is shorter than `ctx`); a forward pass then
    /// writes at most `pass` positions.
    pub fn windowed(p: &LlamaParams, ctx: usize, pass: usize) -> Self {
        let ring = p.swa_window + pass.max(1);
        Self::build(p, ctx, if p.swa_window > 0 && ring < ctx { ring } else { 0 })
    }

    fn build(p: &LlamaParams, ctx: usize, ring: usize) -> Self {
        let mut at = 0;
        let layers = (0..p.n_layer)
            .map(|il| {
                let rows = if ring > 0 && p.is_swa(il) { ring } else { ctx };
                at += p.n_head_kv * rows * p.head_dim;
                (at - p.n_head_kv * rows * p.head_dim, rows)
            })
            .collect();
        Self {
            k: vec![0; at],
            v: vec![0; at],
            ctx,
            ring,
            window: p.swa_window,
            layers,
            start: 0,
        }
    }

    /// Positions the cache holds.
    pub fn context_len(&self) -> usize {
        self.ctx
    }

    /// Rows per KV head of a sliding-window layer's ring (`None`: no rings).
    pub fn ring(&self) -> Option<usize> {
        (self.ring > 0).then_some(self.ring)
    }

    /// The most positions one forward pass may write.
    pub fn max_pass(&self) -> usize {
        if self.ring > 0 {
            self.ring - self.window
        } else {
            usize::MAX
        }
    }

    /// The first position the rings still hold; every layer holds the positions from
    /// here to the last one written.
    pub fn ring_start(&self) -> usize {
        self.start
    }

    /// `want` when a step can resume at position `want` (every key its first query
    /// attends to is still held), else 0: rings lose positions, and a step that
    /// starts within the lost window must start over.
    pub fn resumable(&self, want: usize) -> usize {
        if self.start == 0 || want + 1 >= self.start + self.window {
            want
        } else {
            0
        }
    }

    /// Where layer `il` starts in `k` and `v`, and its rows per KV head.
    pub(super) fn layer(&self, il: usize) -> (usize, usize) {
        self.layers[il]
    }

    /// Positions `pos..pos + n` are about to be written: a write at 0 starts the
    /// sequence over; the rings lose what the new rows overwrite.
    pub(super) fn wrote(&mut self, pos: usize, n: usize) {
        if self.ring == 0 {
            return;
        }
        if pos == 0 {
            self.start = 0;
        }
        self.start = self.start.max((pos + n).saturating_sub(self.ring));
    }

    /// Bytes each position takes on the layers that hold every position.
    pub fn bytes_per_token(&self, p: &LlamaParams) -> usize {
        let full = self.layers.iter().filter(|l| l.1 == self.ctx).count();
        2 * 2 * full * p.n_head_kv * p.head_dim
    }

    /// Bytes `tokens` positions take: the full layers' rows and the rings' rows
    /// written (a ring stops growing at its length).
    pub fn bytes(&self, tokens: usize, p: &LlamaParams) -> usize {
        let rings = self.layers.iter().filter(|l| l.1 < self.ctx).count();
        tokens * self.bytes_per_token(p) + 2 * 2 * rings * p.n_head_kv * p.head_dim * tokens.min(self.ring)
    }

    /// The element ranges of positions `a..b` (held) of layer `il`, head `h`.
    fn spans(&self, il: usize, h: usize, a: usize, b: usize, hd: usize) -> impl Iterator<Item = Range<usize>> {
        let (off, rows) = self.layers[il];
        let head = off + h * rows * hd;
        wrap(a, b, rows)
            .into_iter()
            .filter(|r| !r.is_empty())
            .map(move |r| head + r.start * hd..head + r.end * hd)
    }

    /// Copies positions `0..len` of `from` (same model, same size) into this cache:
    /// a prefix another sequence already computed costs a memory copy, not a prefill.
    /// The rings get what `from`'s hold of the last `ring` positions; `len` should be
    /// [`Self::resumable`] in `from`.
    pub fn copy_prefix(&mut self, from: &KvCache, len: usize, p: &LlamaParams) {
        let lo = if self.ring > 0 {
            from.start.max(len.saturating_sub(self.ring)).min(len)
        } else {
            0
        };
        for il in 0..p.n_layer {
            let a = if self.layers[il].1 < self.ctx { lo } else { 0 };
            for h in 0..p.n_head_kv {
                for r in self.spans(il, h, a, len, p.head_dim).collect::<Vec<_>>() {
                    self.k[r.clone()].copy_from_slice(&from.k[r.clone()]);
                    self.v[r.clone()].copy_from_slice(&from.v[r]);
                }
            }
        }
        self.start = lo;
    }

    /// Keys and values of positions `start..start + n`, every layer and KV head, as
    /// two `[layer][kv_head][n][head_dim]` arrays of f16 bits; `None` when the rings
    /// no longer hold them.
    pub fn read_rows(&self, start: usize, n: usize, p: &LlamaParams) -> Option<(Vec<u16>, Vec<u16>)> {
        if start + n > self.ctx || (self.ring > 0 && (start < self.start || n > self.ring)) {
            return None;
        }
        let hd = p.head_dim;
        let (mut k, mut v) = (Vec::with_capacity(2 * n * hd), Vec::new());
        v.reserve(k.capacity());
        for il in 0..p.n_layer {
            for h in 0..p.n_head_kv {
                for r in self.spans(il, h, start, start + n, hd) {
                    k.extend_from_slice(&self.k[r.clone()]);
                    v.extend_from_slice(&self.v[r]);
                }
            }
        }
        Some((k, v))
    }

    /// Writes what [`Self::read_rows`] returned back at positions `start..start + n`;
    /// false (nothing written) when they do not fit: beyond the context, or, with
    /// rings, neither continuing what they hold nor starting over at 0.
    pub fn write_rows(&mut self, start: usize, n: usize, k: &[u16], v: &[u16], p: &LlamaParams) -> bool {
        let hd = p.head_dim;
        let per_head = n * hd;
        if start + n > self.ctx
            || k.len() != p.n_layer * p.n_head_kv * per_head
            || v.len() != k.len()
            || (self.ring > 0 && ((start > 0 && start < self.start) || n > self.ring))
        {
            return false;
        }
        self.wrote(start, n);
        let mut src = 0;
        for il in 0..p.n_layer {
            for h in 0..p.n_head_kv {
                for r in self.spans(il, h, start, start + n, hd).collect::<Vec<_>>() {
                    let len = r.len();
                    self.k[r.clone()].copy_from_slice(&k[src..src + len]);
                    self.v[r].copy_from_slice(&v[src..src + len]);
                    src += len;
                }
            }
        }
        true
    }

    /// Post-RoPE keys of positions `0..len`, as `[layer][kv_head]` → `len * head_dim`
    /// floats (seed 000's AttentionSnapshot); `None` when the rings no longer hold
    /// them all.
    pub fn keys(&self, len: usize, p: &LlamaParams) -> Option<Vec<Vec<Vec<f32>>>> {
        if len > self.ctx || (self.ring > 0 && (self.start > 0 || len > self.ring)) {
            return None;
        }
        let hd = p.head_dim;
        Some(
            (0..p.n_layer)
                .map(|l| {
                    (0..p.n_head_kv)
                        .map(|h| {
                            self.spans(l, h, 0, len, hd)
                                .flat_map(|r| self.k[r].iter().map(|&b| h2f(b)))
                                .collect()
                        })
                        .collect()
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::params::FfnAct;

    /// Six layers (five sliding-window, one global) of one KV head of 2 values;
    /// window 4.
    fn params() -> LlamaParams {
        LlamaParams {
            n_layer: 6,
            n_embd: 8,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 2,
            n_ff: 8,
            rms_eps: 1e-6,
            rope_base: 10_000.0,
            rope_dims: 2,
            n_vocab: 0,
            arch: "gemma3".into(),
            rope_neox: true,
            embd_scale: None,
            attn_scale: 1.0,
            ffn_act: FfnAct::Gelu,
            swa_window: 4,
            swa_pattern: 6,
            rope_base_swa: 10_000.0,
        }
    }

    /// What `read_rows` gives for positions `start..start + n` when every value of
    /// position `q` is `q` (keys) or `q + 100` (values).
    fn rows(start: usize, n: usize, p: &LlamaParams) -> (Vec<u16>, Vec<u16>) {
        let k: Vec<u16> = (0..p.n_layer)
            .flat_map(|_| (start..start + n).flat_map(|q| [q as u16; 2]))
            .collect();
        let v = k.iter().map(|x| x + 100).collect();
        (k, v)
    }

    #[test]
    fn wrap_splits_a_run_at_the_end_of_the_ring() {
        assert_eq!(wrap(3, 7, 10), [3..7, 0..0]);
        assert_eq!(wrap(13, 20, 10), [3..10, 0..0]);
        assert_eq!(wrap(8, 13, 10), [8..10, 0..3]);
        assert_eq!(wrap(20, 30, 10), [0..10, 0..0]);
    }

    #[test]
    fn rings_keep_the_last_positions_and_resume_only_within_them() {
        let p = params();
        // Rings of 4 + 2 rows on layers 0..5; layer 5 holds all 32 positions.
        let mut c = KvCache::windowed(&p, 32, 2);
        assert_eq!((c.ring(), c.max_pass()), (Some(6), 2));
        assert_eq!((c.layer(4), c.layer(5)), ((4 * 6 * 2, 6), (5 * 6 * 2, 32)));
        assert_eq!(
            (c.bytes_per_token(&p), c.bytes(3, &p), c.bytes(20, &p)),
            (8, 8 * 3 + 40 * 3, 8 * 20 + 40 * 6)
        );
        for s in (0..10).step_by(2) {
            let (k, v) = rows(s, 2, &p);
            assert!(c.write_rows(s, 2, &k, &v, &p));
        }
        // Positions 0..10 written: the rings hold 4..10.
        assert_eq!(c.ring_start(), 4);
        assert_eq!(c.read_rows(4, 6, &p), Some(rows(4, 6, &p)), "wraps at row 6");
        assert_eq!(c.read_rows(3, 2, &p), None);
        assert_eq!(c.keys(4, &p), None);
        // A step at q attends to q - 3..q: resumable from 7 on.
        assert_eq!(
            (c.resumable(10), c.resumable(7), c.resumable(6), c.resumable(0)),
            (10, 7, 0, 0)
        );
        // Rows that neither continue the rings nor start over are refused.
        let (k, v) = rows(2, 2, &p);
        assert!(!c.write_rows(2, 2, &k, &v, &p));
        assert!(!c.write_rows(8, 2, &k[1..], &v, &p), "wrong length");
        assert_eq!(c.read_rows(4, 6, &p), Some(rows(4, 6, &p)), "unchanged");

        // A prefix copy takes the rings' last positions and the global layer's all.
        let mut d = KvCache::windowed(&p, 32, 2);
        d.copy_prefix(&c, 9, &p);
        assert_eq!(d.ring_start(), 4);
        assert_eq!(d.read_rows(4, 5, &p), Some(rows(4, 5, &p)));
        let (g, _) = d.layer(5);
        assert_eq!(d.k[g..g + 18], rows(0, 9, &p).0[..18]);

        // Writing at 0 starts over: everything is readable again.
        let (k, v) = rows(0, 2, &p);
        assert!(c.write_rows(0, 2, &k, &v, &p));
        assert_eq!((c.ring_start(), c.resumable(1)), (0, 1));
        assert_eq!(c.read_rows(0, 2, &p), Some(rows(0, 2, &p)));
        assert_eq!(c.keys(2, &p).unwrap()[0][0], [0, 0, 1, 1].map(h2f));
    }

    #[test]
    fn a_cache_without_window_or_shorter_than_a_ring_keeps_every_position() {
        let p = params();
        for c in [KvCache::new(&p, 32), KvCache::windowed(&p, 6, 2)] {
            assert_eq!((c.ring(), c.max_pass()), (None, usize::MAX));
            assert_eq!(c.bytes(5, &p), 5 * c.bytes_per_token(&p));
        }
        let global = LlamaParams { swa_window: 0, ..p };
        assert_eq!(KvCache::windowed(&global, 32, 2).ring(), None);
    }
}
