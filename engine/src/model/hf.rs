//! Hugging Face model directories: `config.json` + `*.safetensors` (+ the tokenizer
//! files, read by [`crate::text::tokenizer`]), for the Llama (and Mistral), Qwen2
//! and Qwen3 families, in F32, F16 or BF16.
//!
//! The weights map onto the same forward pass as GGUF files by name
//! (`model.layers.{i}.self_attn.q_proj.weight` → `blk.{i}.attn_q.weight`, …). HF
//! checkpoints keep Q and K in the "rotate half" layout, which is RoPE's NeoX pairing,
//! so Llama from safetensors runs with NeoX RoPE on unpermuted weights, where its GGUF
//! conversion permutes Q and K for the "normal" pairing instead. F16 weights stay F16;
//! BF16 becomes F32 (exact).

use super::llama::{FfnAct, LlamaModel, LlamaParams};
use crate::kernels::tensor::{QData, QMatrix, TensorError};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::DType;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// `model_type` values this loader understands.
pub const MODEL_TYPES: &[&str] = &["llama", "mistral", "qwen2", "qwen3"];

/// The fields of `config.json` the forward pass needs.
#[derive(Debug, Clone, Deserialize)]
pub struct HfConfig {
    pub model_type: String,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    pub intermediate_size: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    #[serde(default)]
    pub hidden_act: Option<String>,
    /// `eos_token_id`: one id or several.
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
}

fn default_eps() -> f32 {
    1e-6
}

fn default_theta() -> f32 {
    10_000.0
}

/// Why a directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("reading {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("config.json: {0}")]
    Config(String),
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

impl HfConfig {
    /// Reads and checks `dir/config.json`.
    pub fn read(dir: &Path) -> Result<Self, HfError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| HfError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let config: HfConfig = serde_json::from_str(&text).map_err(|e| HfError::Config(e.to_string()))?;
        if !MODEL_TYPES.contains(&config.model_type.as_str()) {
            return Err(HfError::Config(format!(
                "model_type {:?} is not supported from safetensors (supported: {})",
                config.model_type,
                MODEL_TYPES.join(", ")
            )));
        }
        if config.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(HfError::Config("rope_scaling is not supported".into()));
        }
        if let Some(act) = &config.hidden_act {
            if act != "silu" {
                return Err(HfError::Config(format!(
                    "hidden_act {act:?} is not supported (supported: silu)"
                )));
            }
        }
        if config.num_attention_heads == 0 || !config.hidden_size.is_multiple_of(config.num_attention_heads) {
            return Err(HfError::Config(
                "hidden_size must be a multiple of num_attention_heads".into(),
            ));
        }
        Ok(config)
    }

    /// The forward pass's parameters.
    pub fn params(&self) -> LlamaParams {
        let head_dim = self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads);
        let arch = match self.model_type.as_str() {
            "mistral" => "llama",
            other => other,
        };
        LlamaParams {
            n_layer: self.num_hidden_layers,
            n_embd: self.hidden_size,
            n_head: self.num_attention_heads,
            n_head_kv: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim,
            n_ff: self.intermediate_size,
            rms_eps: self.rms_norm_eps,
            rope_base: self.rope_theta,
            rope_dims: head_dim,
            n_vocab: 0,
            arch: arch.to_string(),
            rope_neox: true,
            embd_scale: None,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            ffn_act: FfnAct::Silu,
            swa_window: 0,
            swa_pattern: 0,
            rope_base_swa: self.rope_theta,
        }
    }

    /// End-of-generation ids named by the config.
    pub fn eos_ids(&self) -> Vec<u32> {
        match &self.eos_token_id {
            Some(serde_json::Value::Number(n)) => n.as_u64().map(|v| v as u32).into_iter().collect(),
            Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect(),
            _ => Vec::new(),
        }
    }
}

/// The `*.safetensors` files of `dir`, sorted.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, HfError> {
    let read = |e: std::io::Error| HfError::Read {
        path: dir.display().to_string(),
        reason: e.to_string(),
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(HfError::Read {
            path: dir.display().to_string(),
            reason: "no *.safetensors files".into(),
        });
    }
    Ok(files)
}

/// The HF name of a tensor the forward pass asks for by its GGUF name.
fn hf_name(gguf: &str) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let mapped = match tail {
        "attn_norm.weight" => "input_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_q.bias" => "self_attn.q_proj.bias",
        "attn_k.bias" => "self_attn.k_proj.bias",
        "attn_v.bias" => "self_attn.v_proj.bias",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{mapped}"))
}

/// Loads the weights of `dir` into the forward pass, with a KV cache for `ctx`
/// positions.
pub fn load_model(dir: &Path, config: &HfConfig, ctx: usize) -> Result<LlamaModel, HfError> {
    let files = safetensors_files(dir)?;
    // SAFETY: the files are mapped read-only; like every mmap-based loader we rely on
    // them not being truncated while loading (the data is copied out before return).
    let st = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| HfError::Read {
        path: dir.display().to_string(),
        reason: e.to_string(),
    })?;
    let tied = config.tie_word_embeddings;
    let mut fetch = |gguf: &str| -> Result<QMatrix, TensorError> {
        let name = hf_name(gguf).ok_or_else(|| TensorError::Missing(gguf.to_string()))?;
        if tied && gguf == "output.weight" {
            return Err(TensorError::Missing(name));
        }
        let view = st.get(&name).map_err(|_| TensorError::Missing(name.clone()))?;
        let dtype = DType::try_from(view.dtype()).map_err(|_| TensorError::Unsupported {
            name: name.clone(),
            dtype: format!("{:?}", view.dtype()),
        })?;
        matrix(&name, dtype, view.shape(), view.data())
    };
    Ok(LlamaModel::from_tensors(config.params(), &mut fetch, ctx)?)
}

/// One safetensors tensor as a [`QMatrix`] (rows = first dimension).
pub(crate) fn matrix(name: &str, dtype: DType, shape: &[usize], data: &[u8]) -> Result<QMatrix, TensorError> {
    let cols = *shape.last().unwrap_or(&1);
    let rows = shape.iter().product::<usize>() / cols.max(1);
    let data = match dtype {
        DType::F32 => QData::F32(
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        DType::F16 => QData::F16(data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect()),
        DType::BF16 => QData::F32(
            data.chunks_exact(2)
                .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
        ),
        other => {
            return Err(TensorError::Unsupported {
                name: name.to_string(),
                dtype: format!("{other:?}"),
            })
        }
    };
    Ok(QMatrix { rows, cols, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_gguf_names_to_hf_names() {
        assert_eq!(hf_name("token_embd.weight").unwrap(), "model.embed_tokens.weight");
        assert_eq!(
            hf_name("blk.11.attn_q.bias").unwrap(),
            "model.layers.11.self_attn.q_proj.bias"
        );
        assert_eq!(
            hf_name("blk.0.ffn_norm.weight").unwrap(),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert!(hf_name("blk.0.post_ffw_norm.weight").is_none());
    }

    #[test]
    fn refuses_unknown_model_types_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"model_type":"phi3","hidden_size":64,"num_hidden_layers":1,"num_attention_heads":4,"intermediate_size":128}"#,
        )
        .unwrap();
        let err = HfConfig::read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("\"phi3\"") && err.contains("llama"), "{err}");
    }
}
