//! A decoder's shape: hyper-parameters from GGUF metadata or config.json.

use crate::kernels::tensor::TensorError;
use candle_core::quantized::gguf_file;

/// Architectures the decoder implements (switchyard's own forward pass and the
/// candle one).
pub const ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "gemma3"];

fn md_u32(ct: &gguf_file::Content, key: &str) -> Option<usize> {
    ct.metadata.get(key).and_then(|v| v.to_u32().ok()).map(|v| v as usize)
}

fn md_f32(ct: &gguf_file::Content, key: &str) -> Option<f32> {
    ct.metadata.get(key).and_then(|v| v.to_f32().ok())
}

/// Model hyper-parameters from GGUF metadata.
#[derive(Debug, Clone)]
pub struct LlamaParams {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub rope_dims: usize,
    pub n_vocab: usize,
    /// `general.architecture`: `llama`, `qwen2`, `qwen3` or `gemma3`.
    pub arch: String,
    /// RoPE pairs (i, i + dims/2) ("NeoX", Qwen, Gemma) instead of (2i, 2i+1) (Llama).
    pub rope_neox: bool,
    /// Multiplier of the token embeddings (Gemma: √n_embd).
    pub embd_scale: Option<f32>,
    /// Multiplier of Q·K (1/√head_dim unless the model says otherwise).
    pub attn_scale: f32,
    /// The feed-forward block's gate activation.
    pub ffn_act: FfnAct,
    /// Sliding-window attention: a query sees keys fewer than `window` positions back
    /// on layers where `layer % pattern < pattern - 1`; 0 = every layer is global.
    pub swa_window: usize,
    pub swa_pattern: usize,
    /// RoPE base of the sliding-window layers.
    pub rope_base_swa: f32,
}

/// The gate activation of the feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnAct {
    /// SwiGLU: `silu(gate) * up`.
    Silu,
    /// GeGLU: `gelu(gate) * up` (tanh approximation).
    Gelu,
}

impl LlamaParams {
    /// The shape a GGUF file's metadata gives, for an architecture in
    /// [`ARCHITECTURES`]. `n_vocab` is left 0: it comes from the embedding matrix.
    pub fn from_gguf(ct: &gguf_file::Content) -> Result<Self, TensorError> {
        let arch = ct
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default();
        if !ARCHITECTURES.contains(&arch.as_str()) {
            return Err(TensorError::Missing(format!("support for architecture {arch:?}")));
        }
        let a = arch.as_str();
        let need =
            |k: &str| md_u32(ct, &format!("{a}.{k}")).ok_or_else(|| TensorError::Missing(format!("metadata {a}.{k}")));
        let n_embd = need("embedding_length")?;
        let n_head = need("attention.head_count")?;
        let head_dim = md_u32(ct, &format!("{a}.attention.key_length")).unwrap_or(n_embd / n_head);
        if let Some(v) = md_u32(ct, &format!("{a}.attention.value_length")) {
            if v != head_dim {
                return Err(TensorError::Missing(format!(
                    "support for {a}.attention.value_length {v} != key_length {head_dim}"
                )));
            }
        }
        let gemma = a == "gemma3";
        let params = LlamaParams {
            n_layer: need("block_count")?,
            n_embd,
            n_head,
            n_head_kv: md_u32(ct, &format!("{a}.attention.head_count_kv")).unwrap_or(n_head),
            head_dim,
            n_ff: need("feed_forward_length")?,
            rms_eps: md_f32(ct, &format!("{a}.attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            rope_base: md_f32(ct, &format!("{a}.rope.freq_base")).unwrap_or(10_000.0),
            rope_dims: md_u32(ct, &format!("{a}.rope.dimension_count")).unwrap_or(head_dim),
            n_vocab: 0, // from token_embd
            rope_neox: a != "llama",
            arch: arch.clone(),
            embd_scale: gemma.then(|| (n_embd as f32).sqrt()),
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            ffn_act: if gemma { FfnAct::Gelu } else { FfnAct::Silu },
            swa_window: if gemma {
                md_u32(ct, &format!("{a}.attention.sliding_window")).unwrap_or(0)
            } else {
                0
            },
            swa_pattern: 6,
            // llama.cpp's default when the file names none.
            rope_base_swa: md_f32(ct, &format!("{a}.rope.swa_freq_base")).unwrap_or(10_000.0),
        };
        if md_f32(ct, &format!("{a}.final_logit_softcapping")).is_some_and(|v| v != 0.0) {
            return Err(TensorError::Missing(format!("support for {a}.final_logit_softcapping")));
        }
        Ok(params)
    }

    /// Whether layer `il` attends through the sliding window.
    pub fn is_swa(&self, il: usize) -> bool {
        self.swa_window > 0 && self.swa_pattern > 0 && il % self.swa_pattern < self.swa_pattern - 1
    }

    /// Width of the concatenated attention heads (Q and attention output rows).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
}
