//! One sequence's f16 KV cache.

use super::params::LlamaParams;
use crate::engine::kernels::quants::h2f;

/// One sequence's keys and values: `[layer][kv_head][pos][head_dim]` as f16 bits.
/// Allocated zeroed, so the operating system commits its pages only as positions
/// are written.
pub struct KvCache {
    pub(super) k: Vec<u16>,
    pub(super) v: Vec<u16>,
    pub(super) ctx: usize,
}

impl KvCache {
    /// A cache for `ctx` positions of a model with `p`'s shape.
    pub fn new(p: &LlamaParams, ctx: usize) -> Self {
        let n = p.n_layer * p.n_head_kv * ctx * p.head_dim;
        Self {
            k: vec![0; n],
            v: vec![0; n],
            ctx,
        }
    }

    /// Positions the cache holds.
    pub fn context_len(&self) -> usize {
        self.ctx
    }

    /// Bytes one position takes (keys and values of every layer and KV head).
    pub fn bytes_per_token(p: &LlamaParams) -> usize {
        2 * 2 * p.n_layer * p.n_head_kv * p.head_dim
    }

    /// Copies positions `0..len` of `from` (same model, same size) into this cache:
    /// a prefix another sequence already computed costs a memory copy, not a prefill.
    pub fn copy_prefix(&mut self, from: &KvCache, len: usize, p: &LlamaParams) {
        let hd = p.head_dim;
        for lh in 0..p.n_layer * p.n_head_kv {
            let r = lh * self.ctx * hd..lh * self.ctx * hd + len * hd;
            self.k[r.clone()].copy_from_slice(&from.k[r.clone()]);
            self.v[r.clone()].copy_from_slice(&from.v[r]);
        }
    }

    /// Keys and values of positions `start..start + n`, every layer and KV head, as
    /// two `[layer][kv_head][n][head_dim]` arrays of f16 bits.
    pub fn read_rows(&self, start: usize, n: usize, p: &LlamaParams) -> (Vec<u16>, Vec<u16>) {
        let hd = p.head_dim;
        let (mut k, mut v) = (Vec::with_capacity(2 * n * hd), Vec::new());
        v.reserve(k.capacity());
        for lh in 0..p.n_layer * p.n_head_kv {
            let r = lh * self.ctx * hd + start * hd..lh * self.ctx * hd + (start + n) * hd;
            k.extend_from_slice(&self.k[r.clone()]);
            v.extend_from_slice(&self.v[r]);
        }
        (k, v)
    }

    /// Writes what [`Self::read_rows`] returned back at positions `start..start + n`.
    pub fn write_rows(&mut self, start: usize, n: usize, k: &[u16], v: &[u16], p: &LlamaParams) {
        let hd = p.head_dim;
        for lh in 0..p.n_layer * p.n_head_kv {
            let r = lh * self.ctx * hd + start * hd..lh * self.ctx * hd + (start + n) * hd;
            let src = lh * n * hd..(lh + 1) * n * hd;
            self.k[r.clone()].copy_from_slice(&k[src.clone()]);
            self.v[r].copy_from_slice(&v[src]);
        }
    }

    /// Post-RoPE keys of positions `0..len`, as `[layer][kv_head]` → `len * head_dim`
    /// floats (seed 000's AttentionSnapshot).
    pub fn keys(&self, len: usize, p: &LlamaParams) -> Vec<Vec<Vec<f32>>> {
        let (hd, ctx) = (p.head_dim, self.ctx);
        (0..p.n_layer)
            .map(|l| {
                (0..p.n_head_kv)
                    .map(|h| {
                        let start = (l * p.n_head_kv + h) * ctx * hd;
                        self.k[start..start + len * hd].iter().map(|&b| h2f(b)).collect()
                    })
                    .collect()
            })
            .collect()
    }
}
