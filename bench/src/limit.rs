//! The physical limit of a decode step on this host: every step reads the weights
//! of every layer and the output matrix, plus the KV cache so far, so it can go no
//! faster than the host's memory read bandwidth over those bytes. `bench llama`
//! prints decode as a share of that.

use std::path::Path;
use std::time::Instant;

/// What one decode step reads, from a GGUF's header.
pub struct StepBytes {
    /// Weight bytes: every tensor but the token embedding, which a step reads one row
    /// of, unless the model ties it to the output (then the output matmul reads it
    /// whole).
    pub weights: u64,
    /// K and V bytes per position, all layers, at f16 (llama.cpp's cache type).
    pub kv_per_position: u64,
}

impl StepBytes {
    /// Reads `model`'s header.
    pub fn of(model: &Path) -> anyhow::Result<Self> {
        use candle_core::quantized::gguf_file;
        let mut f = std::fs::File::open(model)?;
        let content = gguf_file::Content::read(&mut f).map_err(|e| anyhow::anyhow!("{}: {e}", model.display()))?;
        let tied = !content.tensor_infos.contains_key("output.weight");
        let weights = content
            .tensor_infos
            .iter()
            .filter(|(name, _)| tied || name.as_str() != "token_embd.weight")
            .map(|(_, t)| (t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size()) as u64)
            .sum();
        let arch = content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default();
        let md = |k: &str| {
            content
                .metadata
                .get(&format!("{arch}.{k}"))
                .and_then(|v| v.to_u32().ok())
                .map(u64::from)
        };
        let (layers, embd) = (md("block_count").unwrap_or(0), md("embedding_length").unwrap_or(0));
        let heads = md("attention.head_count").unwrap_or(1).max(1);
        let kv_heads = md("attention.head_count_kv").unwrap_or(heads);
        let (k_len, v_len) = (
            md("attention.key_length").unwrap_or(embd / heads),
            md("attention.value_length").unwrap_or(embd / heads),
        );
        Ok(StepBytes {
            weights,
            kv_per_position: layers * kv_heads * (k_len + v_len) * 2,
        })
    }

    /// Bytes a step at `position` (tokens already in the cache) reads.
    pub fn at(&self, position: u64) -> u64 {
        self.weights + self.kv_per_position * position
    }
}

/// The host's read bandwidth with `threads` threads, bytes per second: the best of a
/// few passes summing a 1 GiB buffer (far beyond any cache) in 64-bit words, each
/// thread streaming its own contiguous share.
pub fn read_bandwidth(threads: usize) -> f64 {
    const BYTES: usize = 1 << 30;
    let words = vec![1u64; BYTES / 8];
    let threads = threads.max(1);
    let share = words.len().div_ceil(threads);
    let mut best = 0.0f64;
    for _ in 0..5 {
        let t = Instant::now();
        let sum: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = words
                .chunks(share)
                .map(|part| s.spawn(move || sum_words(part)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(sum, words.len() as u64, "every word read");
        best = best.max(BYTES as f64 / secs);
    }
    best
}

/// Σ words, eight independent lanes (the compiler vectorizes it).
fn sum_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for c in &mut chunks {
        for (a, w) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*w);
        }
    }
    let tail: u64 = chunks.remainder().iter().fold(0, |a, w| a.wrapping_add(*w));
    acc.iter().fold(tail, |a, w| a.wrapping_add(*w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_reads_every_word() {
        let words: Vec<u64> = (1..=1003).collect();
        assert_eq!(sum_words(&words), 1003 * 1004 / 2);
    }
}
