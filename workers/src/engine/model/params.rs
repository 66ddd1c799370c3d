//! A decoder's shape: hyper-parameters from GGUF metadata or config.json.

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
    /// Whether layer `il` attends through the sliding window.
    pub fn is_swa(&self, il: usize) -> bool {
        self.swa_window > 0 && self.swa_pattern > 0 && il % self.swa_pattern < self.swa_pattern - 1
    }

    /// Width of the concatenated attention heads (Q and attention output rows).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
}
