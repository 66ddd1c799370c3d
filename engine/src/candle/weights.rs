//! A GGUF decoder's tensors on candle devices: quantized matrices stay quantized
//! ([`QMatMul`] over candle's kernels), norms and biases become f32 vectors. Each
//! layer lives on the GPU or the CPU as `gpu_layers` says; the token embeddings stay
//! in host memory (a row is looked up per token, as llama.cpp does).

use super::device::{layer_on_gpu, output_on_gpu};
use crate::kernels::tensor::{self as host, QMatrix};
use crate::model::params::LlamaParams;
use candle_core::quantized::{gguf_file, QMatMul};
use candle_core::{Device, Tensor};
use std::io::{Read, Seek};

/// One decoder layer's weights, all on `dev`.
pub(super) struct Layer {
    pub dev: Device,
    pub attn_norm: Tensor,
    pub wq: QMatMul,
    pub wk: QMatMul,
    pub wv: QMatMul,
    pub wo: QMatMul,
    pub ffn_norm: Tensor,
    pub w_gate: QMatMul,
    pub w_up: QMatMul,
    pub w_down: QMatMul,
    /// Qwen2: biases of the Q, K, V projections.
    pub bq: Option<Tensor>,
    pub bk: Option<Tensor>,
    pub bv: Option<Tensor>,
    /// Qwen3 and Gemma 3: RMSNorm of Q and K per head.
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    /// Gemma 3: RMSNorm of the attention and feed-forward outputs.
    pub post_attn_norm: Option<Tensor>,
    pub post_ffn_norm: Option<Tensor>,
}

/// The model's weights.
pub(super) struct Weights {
    pub params: LlamaParams,
    /// Token embeddings in host memory.
    pub embd: QMatrix,
    pub layers: Vec<Layer>,
    pub out_norm: Tensor,
    /// The vocabulary projection (the embeddings when the model ties them).
    pub output: QMatMul,
    pub out_dev: Device,
    /// Bytes of weights placed on the GPU (0 when everything is on the CPU).
    pub gpu_bytes: u64,
}

/// Loads every tensor of `ct` (its `params` already read) onto `gpu` or the CPU as
/// `gpu_layers` says. Errors name the tensor.
pub(super) fn load<R: Read + Seek>(
    ct: &gguf_file::Content,
    reader: &mut R,
    mut params: LlamaParams,
    gpu: &Device,
    gpu_layers: i32,
) -> Result<Weights, String> {
    let gemma = params.arch == "gemma3";
    let embd = host::load(ct, reader, "token_embd.weight").map_err(|e| e.to_string())?;
    params.n_vocab = embd.rows;
    let mut gpu_bytes = 0u64;
    let mut tensor = |name: &str, dev: &Device| -> Result<Option<candle_core::quantized::QTensor>, String> {
        let Some(info) = ct.tensor_infos.get(name) else {
            return Ok(None);
        };
        let t = ct
            .tensor(reader, name, dev)
            .map_err(|e| format!("tensor {name}: {e}"))?;
        if !dev.is_cpu() {
            let elems = info.shape.elem_count();
            gpu_bytes += (elems / info.ggml_dtype.block_size() * info.ggml_dtype.type_size()) as u64;
        }
        Ok(Some(t))
    };
    let need =
        |t: Option<candle_core::quantized::QTensor>, name: &str| t.ok_or_else(|| format!("tensor {name} is missing"));
    let mut layers = Vec::with_capacity(params.n_layer);
    for il in 0..params.n_layer {
        let dev = if layer_on_gpu(il, params.n_layer, gpu_layers) {
            gpu.clone()
        } else {
            Device::Cpu
        };
        let name = |s: &str| format!("blk.{il}.{s}");
        let mut matrix = |s: &str| -> Result<QMatMul, String> {
            let n = name(&format!("{s}.weight"));
            let t = need(tensor(&n, &dev)?, &n)?;
            QMatMul::from_qtensor(t).map_err(|e| format!("tensor {n}: {e}"))
        };
        let (wq, wk, wv, wo) = (
            matrix("attn_q")?,
            matrix("attn_k")?,
            matrix("attn_v")?,
            matrix("attn_output")?,
        );
        let (w_gate, w_up, w_down) = (matrix("ffn_gate")?, matrix("ffn_up")?, matrix("ffn_down")?);
        let mut vector = |n: String| -> Result<Option<Tensor>, String> {
            match tensor(&n, &dev)? {
                None => Ok(None),
                Some(t) => t.dequantize(&dev).map(Some).map_err(|e| format!("tensor {n}: {e}")),
            }
        };
        let attn_norm = vector(name("attn_norm.weight"))?
            .ok_or_else(|| format!("tensor {} is missing", name("attn_norm.weight")))?;
        let ffn_norm =
            vector(name("ffn_norm.weight"))?.ok_or_else(|| format!("tensor {} is missing", name("ffn_norm.weight")))?;
        let layer = Layer {
            attn_norm,
            ffn_norm,
            wq,
            wk,
            wv,
            wo,
            w_gate,
            w_up,
            w_down,
            bq: vector(name("attn_q.bias"))?,
            bk: vector(name("attn_k.bias"))?,
            bv: vector(name("attn_v.bias"))?,
            q_norm: vector(name("attn_q_norm.weight"))?,
            k_norm: vector(name("attn_k_norm.weight"))?,
            post_attn_norm: vector(name("post_attention_norm.weight"))?,
            post_ffn_norm: vector(name("post_ffw_norm.weight"))?,
            dev,
        };
        if gemma && (layer.post_attn_norm.is_none() || layer.post_ffn_norm.is_none()) {
            return Err(format!(
                "tensor blk.{il}.post_attention_norm / post_ffw_norm is missing"
            ));
        }
        layers.push(layer);
    }
    let out_dev = if output_on_gpu(gpu_layers) {
        gpu.clone()
    } else {
        Device::Cpu
    };
    let out_norm = need(tensor("output_norm.weight", &out_dev)?, "output_norm.weight")?
        .dequantize(&out_dev)
        .map_err(|e| format!("tensor output_norm.weight: {e}"))?;
    let output = match tensor("output.weight", &out_dev)? {
        Some(t) => t,
        None => need(tensor("token_embd.weight", &out_dev)?, "token_embd.weight")?,
    };
    let output = QMatMul::from_qtensor(output).map_err(|e| format!("the output projection: {e}"))?;
    Ok(Weights {
        params,
        embd,
        layers,
        out_norm,
        output,
        out_dev,
        gpu_bytes,
    })
}
