//! LoRA adapters, unmerged: a targeted projection `y = W·x` becomes
//! `y = W·x + scale·B·(A·x)` for the rows of sequences that use the adapter, so
//! requests for different adapters and the bare base model share one batch.
//!
//! Two formats load: PEFT (a directory with `adapter_config.json` and
//! `adapter_model.safetensors`, Hugging Face's layout) and llama.cpp's GGUF LoRA
//! (`general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`, tensors
//! `blk.{i}.{attn_q,…}.weight.lora_a` / `.lora_b`, Q and K rows in llama.cpp's RoPE
//! order). `scale` is llama.cpp's: the user's scale × alpha / each pair's rank (alpha 0: the
//! user's scale alone; PEFT's `use_rslora`: alpha / √rank). A and B are kept in f16
//! (llama.cpp's converter writes f16 adapters by default) and the update is computed
//! in f32 (the engine's f16·f32 dot and axpy kernels).

use super::params::LlamaParams;
use crate::kernels::simd::Kernels;
use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// The projections an adapter may target, in the layer's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

const PROJS: [Proj; 7] = [Proj::Q, Proj::K, Proj::V, Proj::O, Proj::Gate, Proj::Up, Proj::Down];

impl Proj {
    /// Hugging Face's module name (PEFT's `target_modules`).
    fn hf(self) -> &'static str {
        match self {
            Proj::Q => "q_proj",
            Proj::K => "k_proj",
            Proj::V => "v_proj",
            Proj::O => "o_proj",
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
        }
    }

    /// llama.cpp's tensor name.
    fn gguf(self) -> &'static str {
        match self {
            Proj::Q => "attn_q",
            Proj::K => "attn_k",
            Proj::V => "attn_v",
            Proj::O => "attn_output",
            Proj::Gate => "ffn_gate",
            Proj::Up => "ffn_up",
            Proj::Down => "ffn_down",
        }
    }

    /// (input width, output width) of the projection in `p`.
    fn dims(self, p: &LlamaParams) -> (usize, usize) {
        let kv = p.n_head_kv * p.head_dim;
        match self {
            Proj::Q => (p.n_embd, p.q_dim()),
            Proj::K | Proj::V => (p.n_embd, kv),
            Proj::O => (p.q_dim(), p.n_embd),
            Proj::Gate | Proj::Up => (p.n_embd, p.n_ff),
            Proj::Down => (p.n_ff, p.n_embd),
        }
    }
}

/// One projection's update: A is `rank × d_in` and B transposed, `rank × d_out`,
/// row-major (so both products run on contiguous rows), in f16 bits: decode reads
/// every adapter a batch uses once per step, so half the bytes is most of its cost.
#[derive(Debug, Clone)]
struct LowRank {
    d_in: usize,
    d_out: usize,
    /// alpha / rank of this pair (llama.cpp's rule: each tensor's own rank).
    factor: f32,
    a: Vec<u16>,
    bt: Vec<u16>,
}

/// One projection's update, `out += scale · Bᵀ(A·x)`: A is `rank × d_in` and Bᵀ
/// `rank × d_out`, row-major, f16 bits.
pub struct LoraPair<'a> {
    pub a: &'a [u16],
    pub bt: &'a [u16],
    pub rank: usize,
    pub d_in: usize,
    pub d_out: usize,
    /// The user's scale × alpha / rank.
    pub scale: f32,
}

/// A loaded adapter.
#[derive(Debug)]
pub struct LoraAdapter {
    /// The name requests use.
    pub name: String,
    /// Unique to this load in the process: KV computed with one load is reused only
    /// by the same load (an adapter reloaded under its name computes other values).
    pub id: u64,
    /// The user's scale (each projection's update is also multiplied by its alpha /
    /// rank).
    pub scale: f32,
    /// Per layer, per [`Proj`] (in [`PROJS`] order), the update when targeted.
    layers: Vec<[Option<LowRank>; 7]>,
}

/// The file holding an adapter's A and B, read into (layer, projection) → (A, B)
/// tensors in the file's own layout.
type Pairs = HashMap<(usize, usize), (Option<Tensor>, Option<Tensor>)>;

impl LoraAdapter {
    /// Loads the adapter at `path` (a PEFT directory or a GGUF LoRA file) for a base
    /// model shaped `base`, at `scale`. Errors name what is wrong: a missing file, a
    /// tensor the engine does not adapt, a shape or architecture that is not the
    /// base model's.
    pub fn load(name: &str, path: &Path, base: &LlamaParams, scale: f32) -> Result<Self, String> {
        let (pairs, alpha, rslora, permuted) = if path.is_dir() {
            let (pairs, alpha, rslora) = read_peft(path)?;
            (pairs, alpha, rslora, false)
        } else {
            let (pairs, alpha, arch) = read_gguf(path)?;
            if arch != base.arch {
                return Err(format!("it is an adapter for {arch}, the model is {}", base.arch));
            }
            // llama.cpp's conversion permutes Llama's Q and K rows, and its LoRA's B.
            (pairs, alpha, false, arch == "llama")
        };
        // The base's layout: a Llama GGUF runs permuted Q and K ("normal" RoPE).
        let base_permuted = base.arch == "llama" && !base.rope_neox;
        let mut layers: Vec<[Option<LowRank>; 7]> = (0..base.n_layer).map(|_| Default::default()).collect();
        let factor = |rank: usize| match (alpha, rslora) {
            (0.0, _) => 1.0,
            (a, true) => a / (rank as f32).sqrt(),
            (a, false) => a / rank as f32,
        };
        let mut any = false;
        for ((layer, pi), pair) in pairs {
            let proj = PROJS[pi];
            let what = format!("layer {layer} {}", proj.hf());
            if layer >= base.n_layer {
                return Err(format!(
                    "{what}: the model has {} layers (an adapter for another model?)",
                    base.n_layer
                ));
            }
            let (Some(a), Some(b)) = pair else {
                return Err(format!("{what}: A or B is missing"));
            };
            let (d_in, d_out) = proj.dims(base);
            let (a_dims, b_dims) = (a.dims().to_vec(), b.dims().to_vec());
            let r = a_dims.first().copied().unwrap_or(0);
            if a_dims != [r, d_in] || b_dims != [d_out, r] || r == 0 {
                return Err(format!(
                    "{what}: A is {a_dims:?} and B {b_dims:?}, the model needs [rank, {d_in}] and [{d_out}, rank] \
                     (an adapter for another model?)"
                ));
            }
            any = true;
            let f32s = |t: Tensor| -> Result<Vec<f32>, String> {
                t.to_dtype(DType::F32)
                    .and_then(|t| t.flatten_all())
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(|e| format!("{what}: {e}"))
            };
            let mut b = f32s(b)?;
            if matches!(proj, Proj::Q | Proj::K) && permuted != base_permuted {
                let heads = if proj == Proj::Q { base.n_head } else { base.n_head_kv };
                b = reorder_rows(&b, heads, r, permuted);
            }
            let mut bt = vec![0.0f32; b.len()];
            for (o, row) in b.chunks_exact(r).enumerate() {
                for (j, v) in row.iter().enumerate() {
                    bt[j * d_out + o] = *v;
                }
            }
            let f16 = |v: &[f32]| {
                let mut out = vec![0u16; v.len()];
                (Kernels::active().to_f16)(v, &mut out);
                out
            };
            layers[layer][pi] = Some(LowRank {
                d_in,
                d_out,
                factor: factor(r),
                a: f16(&f32s(a)?),
                bt: f16(&bt),
            });
        }
        if !any {
            return Err("it holds no LoRA tensors".into());
        }
        static LOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Self {
            name: name.to_string(),
            id: LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            scale,
            layers,
        })
    }

    /// The update of `proj` in `layer`, when the adapter targets it: for forward
    /// passes that apply it their own way (the candle one).
    pub fn pair(&self, layer: usize, proj: Proj) -> Option<LoraPair<'_>> {
        let lr = self.layers.get(layer)?[proj as usize].as_ref()?;
        Some(LoraPair {
            a: &lr.a,
            bt: &lr.bt,
            rank: lr.a.len() / lr.d_in,
            d_in: lr.d_in,
            d_out: lr.d_out,
            scale: self.scale * lr.factor,
        })
    }

    /// Adds the update of `proj` in `layer` to one row `out` (`d_out` values) for the
    /// input row `x` (`d_in` values).
    pub fn apply_row(&self, layer: usize, proj: Proj, x: &[f32], out: &mut [f32]) {
        let Some(Some(lr)) = self.layers.get(layer).map(|l| &l[proj as usize]) else {
            return;
        };
        debug_assert_eq!((x.len(), out.len()), (lr.d_in, lr.d_out));
        let kern = Kernels::active();
        // out += Σ_j (scale · A_j·x) · Bᵀ_j
        let scale = self.scale * lr.factor;
        for (ar, bt) in lr.a.chunks_exact(lr.d_in).zip(lr.bt.chunks_exact(lr.d_out)) {
            (kern.axpy_f16)(out, bt, scale * (kern.dot_f16_f32)(ar, x));
        }
    }
}

/// B's rows of Q or K from Hugging Face's order into llama.cpp's (`to_gguf`) or back:
/// within each head the two rotary halves interleave.
fn reorder_rows(b: &[f32], heads: usize, rank: usize, from_gguf: bool) -> Vec<f32> {
    let rows = b.len() / rank;
    let half = rows / heads / 2;
    let mut out = vec![0.0f32; b.len()];
    for h in 0..heads {
        for j in 0..half {
            for s in 0..2 {
                // HF row h·2·half + s·half + j is GGUF row h·2·half + 2j + s.
                let hf = h * 2 * half + s * half + j;
                let gg = h * 2 * half + 2 * j + s;
                let (src, dst) = if from_gguf { (gg, hf) } else { (hf, gg) };
                out[dst * rank..(dst + 1) * rank].copy_from_slice(&b[src * rank..(src + 1) * rank]);
            }
        }
    }
    out
}

/// A PEFT directory's pairs, `lora_alpha` and `use_rslora`.
fn read_peft(dir: &Path) -> Result<(Pairs, f32, bool), String> {
    let config_path = dir.join("adapter_config.json");
    let config: serde_json::Value = std::fs::read_to_string(&config_path)
        .map_err(|e| format!("{}: {e}", config_path.display()))
        .and_then(|s| serde_json::from_str(&s).map_err(|e| format!("{}: {e}", config_path.display())))?;
    if config["peft_type"].as_str().is_some_and(|t| t != "LORA") {
        return Err(format!("it is a {} adapter, not LoRA", config["peft_type"]));
    }
    if config["fan_in_fan_out"].as_bool() == Some(true) {
        return Err("fan_in_fan_out adapters (GPT-2 style Conv1D) are not supported".into());
    }
    // PEFT's LoraConfig default.
    let alpha = config["lora_alpha"].as_f64().unwrap_or(8.0) as f32;
    let rslora = config["use_rslora"].as_bool().unwrap_or(false);
    let weights = dir.join("adapter_model.safetensors");
    let tensors =
        candle_core::safetensors::load(&weights, &Device::Cpu).map_err(|e| format!("{}: {e}", weights.display()))?;
    let mut pairs = Pairs::new();
    for (name, t) in tensors {
        // base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight
        let parsed = (|| {
            let rest = name.split(".layers.").nth(1)?;
            let mut parts = rest.split('.');
            let layer: usize = parts.next()?.parse().ok()?;
            let _group = parts.next()?;
            let module = parts.next()?;
            let side = parts.next()?;
            let pi = PROJS.iter().position(|p| p.hf() == module)?;
            Some((layer, pi, side))
        })();
        let Some((layer, pi, side)) = parsed else {
            return Err(format!(
                "tensor {name}: not a LoRA update of a projection the engine adapts"
            ));
        };
        let pair = pairs.entry((layer, pi)).or_default();
        match side {
            "lora_A" => pair.0 = Some(t),
            "lora_B" => pair.1 = Some(t),
            _ => return Err(format!("tensor {name}: neither lora_A nor lora_B")),
        }
    }
    Ok((pairs, alpha, rslora))
}

/// A GGUF LoRA's pairs, `adapter.lora.alpha` and architecture.
fn read_gguf(path: &Path) -> Result<(Pairs, f32, String), String> {
    let err = |e: String| format!("{}: {e}", path.display());
    let mut file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let content = gguf_file::Content::read(&mut file).map_err(|e| err(format!("not a readable GGUF file: {e}")))?;
    let md_str = |k: &str| content.metadata.get(k).and_then(|v| v.to_string().ok()).cloned();
    if md_str("general.type").as_deref() != Some("adapter") || md_str("adapter.type").as_deref() != Some("lora") {
        return Err(err(
            "not a LoRA adapter (general.type adapter, adapter.type lora)".into()
        ));
    }
    let arch = md_str("general.architecture").unwrap_or_default();
    let alpha = content
        .metadata
        .get("adapter.lora.alpha")
        .and_then(|v| v.to_f32().ok())
        .unwrap_or(0.0);
    let mut pairs = Pairs::new();
    let names: Vec<String> = content.tensor_infos.keys().cloned().collect();
    for name in names {
        let parsed = (|| {
            let rest = name.strip_prefix("blk.")?;
            let (layer, rest) = rest.split_once('.')?;
            let (tensor, side) = rest.split_once(".weight.")?;
            let pi = PROJS.iter().position(|p| p.gguf() == tensor)?;
            Some((layer.parse::<usize>().ok()?, pi, side.to_string()))
        })();
        let Some((layer, pi, side)) = parsed else {
            return Err(err(format!(
                "tensor {name}: not a LoRA update of a projection the engine adapts"
            )));
        };
        let t = content
            .tensor(&mut file, &name, &Device::Cpu)
            .and_then(|q| q.dequantize(&Device::Cpu))
            .map_err(|e| err(format!("tensor {name}: {e}")))?;
        let pair = pairs.entry((layer, pi)).or_default();
        match side.as_str() {
            "lora_a" => pair.0 = Some(t),
            "lora_b" => pair.1 = Some(t),
            _ => return Err(err(format!("tensor {name}: neither lora_a nor lora_b"))),
        }
    }
    Ok((pairs, alpha, arch))
}
