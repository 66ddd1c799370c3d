//! A model as pipeline stages: [`LlamaModel`] holding a contiguous range of layers
//! (the first stage also the token embeddings, output norm and projection), and the
//! passes a stage runs — from tokens or from the previous stage's hidden states, to
//! every row's hidden state (for the next stage) or the last positions' (for the
//! first stage's logits). [`crate::pipeline`] runs stages as one model.

use super::llama::{LlamaModel, LlamaParams, Out, Step};
use crate::kernels::team;
use crate::kernels::tensor::load;
use candle_core::quantized::gguf_file;

impl LlamaModel {
    /// A pipeline stage of the GGUF model in `ct`: the layers `span` (global
    /// indices), with the token embeddings, output norm and output projection when
    /// `ends` (the first stage, which embeds tokens and turns the last stage's
    /// hidden states into logits). Models with sliding-window layers are refused
    /// (their rings follow the global layer pattern a stage's cache does not see).
    pub fn load_stage<R: std::io::Read + std::io::Seek>(
        ct: &gguf_file::Content,
        reader: &mut R,
        ctx: usize,
        span: std::ops::Range<usize>,
        ends: bool,
    ) -> Result<Self, String> {
        let params = LlamaParams::from_gguf(ct).map_err(|e| e.to_string())?;
        if span.is_empty() || span.end > params.n_layer {
            return Err(format!(
                "layers {}-{} are not a range of the model's {} layers (0-{})",
                span.start,
                span.end.saturating_sub(1),
                params.n_layer,
                params.n_layer.saturating_sub(1)
            ));
        }
        if params.swa_window > 0 {
            return Err(format!(
                "{} has sliding-window layers, which pipeline stages do not split",
                params.arch
            ));
        }
        Self::from_tensors_span(params, &mut |name: &str| load(ct, reader, name), ctx, span, ends)
            .map_err(|e| e.to_string())
    }

    /// The global indices of the layers this model holds.
    pub fn span(&self) -> std::ops::Range<usize> {
        self.first..self.first + self.params.n_layer
    }

    /// Whether this model holds the token embeddings, output norm and projection.
    pub fn ends(&self) -> bool {
        self.embd.is_some()
    }

    /// A pipeline stage's pass: its layers over the steps' rows, from their tokens
    /// (`input` `None`: the first stage) or from the previous stage's hidden states
    /// of every row. Returns every row's hidden state (`all`: for the next stage),
    /// or those of each step's last `outputs` positions (the last stage's answer),
    /// before the output norm. A step is never split: a stage's caches hold every
    /// position (no rings), so one pass takes any step whole.
    pub fn stage_pass(&self, steps: &mut [Step<'_>], input: Option<Vec<f32>>, all: bool) -> Vec<f32> {
        let out = if all { Out::Rows } else { Out::Last };
        team::awake(|| self.layer_pass(steps, input, out)).map_or_else(Vec::new, |(rows, _)| rows)
    }

    /// The logits of final hidden states (`n_embd` values per row, before the
    /// output norm, as the last stage returns them), row after row.
    pub fn stage_logits(&self, rows: &[f32]) -> Vec<Vec<f32>> {
        let m = rows.len() / self.params.n_embd.max(1);
        team::awake(|| self.finish(rows, m, Out::Logits))
    }
}
