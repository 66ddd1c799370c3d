//! Rotary position embeddings: ggml's cos/sin cache, applied in place.

use super::params::LlamaParams;

/// cos/sin per (position, pair), computed as ggml's rope cache does.
pub(super) struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
    pairs: usize,
    neox: bool,
}

impl RopeTable {
    /// The table for rows at `positions`.
    pub(super) fn new(p: &LlamaParams, base: f32, positions: &[usize]) -> Self {
        let pairs = p.rope_dims / 2;
        let theta_scale = base.powf(-2.0 / p.rope_dims as f32);
        let mut cos = Vec::with_capacity(positions.len() * pairs);
        let mut sin = Vec::with_capacity(positions.len() * pairs);
        for &pos in positions {
            let mut theta = pos as f32;
            for _ in 0..pairs {
                cos.push(theta.cos());
                sin.push(theta.sin());
                theta *= theta_scale;
            }
        }
        Self {
            cos,
            sin,
            pairs,
            neox: p.rope_neox,
        }
    }

    /// Rotates each head's pairs.
    pub(super) fn apply(&self, x: &mut [f32], heads: usize, hd: usize) {
        let n = self.cos.len() / self.pairs.max(1);
        for t in 0..n {
            for h in 0..heads {
                let row = &mut x[(t * heads + h) * hd..(t * heads + h + 1) * hd];
                for i in 0..self.pairs {
                    let (c, s) = (self.cos[t * self.pairs + i], self.sin[t * self.pairs + i]);
                    // Llama pairs (2i, 2i+1); NeoX pairs (i, i + dims/2).
                    let (a, b) = if self.neox {
                        (i, i + self.pairs)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (x0, x1) = (row[a], row[b]);
                    row[a] = x0 * c - x1 * s;
                    row[b] = x0 * s + x1 * c;
                }
            }
        }
    }
}
