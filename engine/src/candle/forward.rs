//! [`CandleForward`]: the decoder pass on candle tensors over independent KV slots.
//!
//! Rows of every step in a pass go through each matmul together (the weights are
//! read once for the whole batch); RoPE, the cache writes and attention run per
//! sequence. Each slot keeps `[kv_head, capacity, head_dim]` f16 keys and values per
//! layer on that layer's device, allocated at the first write and doubled as
//! positions are written (up to the context), so idle slots cost nothing.

use super::device::{self, Placement};
use super::weights::{self, Layer, Weights};
use crate::model::forward::{CachedKeys, Forward, SeqStep};
use crate::model::lora::{LoraAdapter, Proj};
use crate::model::params::{FfnAct, LlamaParams};
use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Module, Tensor};
use std::collections::HashMap;
use std::io::{Read, Seek};
use std::sync::{Arc, Mutex};
use switchyard_backend::BackendError;

/// Positions a slot's cache is first allocated for.
const FIRST_CAPACITY: usize = 256;

/// One slot's keys and values: per layer `[kv_head, cap, head_dim]` f16.
#[derive(Default)]
struct SlotCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    cap: usize,
}

/// cos/sin tables `[ctx, head_dim / 2]` for one RoPE base on one device.
struct RopeTables {
    cos: Tensor,
    sin: Tensor,
}

/// The decoder on candle devices with one KV cache per slot.
pub struct CandleForward {
    w: Weights,
    placement: Placement,
    gpu: Device,
    /// `[global, sliding-window]` RoPE tables per device: `[on the GPU, on the CPU]`.
    rope: [[Option<RopeTables>; 2]; 2],
    slots: Vec<SlotCache>,
    ctx: usize,
    peak_memory: std::sync::atomic::AtomicU64,
    /// Per slot, the LoRA adapter its steps run with.
    adapters: Vec<Option<Arc<LoraAdapter>>>,
    /// Adapters' A and Bᵀ on their layer's device, f32 `[d_in, rank]` and `[rank,
    /// d_out]`: uploaded on first use, dropped once no slot runs the adapter.
    lora_tensors: Mutex<LoraTensors>,
}

/// Adapters' A (transposed) and Bᵀ by (adapter load, layer, projection).
type LoraTensors = HashMap<(u64, usize, usize), (Tensor, Tensor)>;

fn err(e: candle_core::Error) -> BackendError {
    BackendError::Compute(format!("candle: {e}"))
}

impl CandleForward {
    /// [`Forward::forward_batch`] (or, with `hidden`, `hidden_batch`) after checking
    /// the steps.
    fn checked(&mut self, steps: &[SeqStep<'_>], hidden: bool) -> Result<Vec<Vec<f32>>, BackendError> {
        let mut seen = vec![false; self.slots.len()];
        for s in steps {
            if s.tokens.is_empty() || !(1..=s.tokens.len()).contains(&s.outputs) {
                return Err(BackendError::Compute(format!(
                    "a step of {} tokens wanting {} logits",
                    s.tokens.len(),
                    s.outputs
                )));
            }
            if s.pos + s.tokens.len() > self.ctx {
                return Err(BackendError::Compute(format!(
                    "position {} beyond the KV cache of {}",
                    s.pos + s.tokens.len(),
                    self.ctx
                )));
            }
            match seen.get_mut(s.seq) {
                Some(b) if !*b => *b = true,
                _ => {
                    return Err(BackendError::Compute(format!(
                        "sequence {} missing or named twice",
                        s.seq
                    )))
                }
            }
        }
        let rows = self.run(steps, hidden).map_err(err)?;
        self.gpu_memory();
        Ok(rows)
    }

    /// Loads a GGUF decoder (`general.architecture` in
    /// [`crate::model::params::ARCHITECTURES`]) on `placement`, layers on the
    /// GPU as `gpu_layers` says, with `slots` KV sequences of `ctx` positions.
    pub fn load<R: Read + Seek>(
        ct: &gguf_file::Content,
        reader: &mut R,
        ctx: usize,
        slots: usize,
        placement: Placement,
        gpu_layers: i32,
    ) -> Result<Self, String> {
        let params = LlamaParams::from_gguf(ct).map_err(|e| e.to_string())?;
        if params.rope_dims != params.head_dim {
            return Err(format!(
                "rope.dimension_count {} != head size {}: partial RoPE is not supported by the candle engine",
                params.rope_dims, params.head_dim
            ));
        }
        let gpu = placement.open()?;
        let w = weights::load(ct, reader, params, &gpu, gpu_layers)?;
        let mut rope: [[Option<RopeTables>; 2]; 2] = Default::default();
        let p = &w.params;
        for (di, dev) in [gpu.clone(), Device::Cpu].iter().enumerate() {
            let used = w.layers.iter().any(|l| l.dev.same_device(dev));
            if !used {
                continue;
            }
            rope[di][0] = Some(tables(p, p.rope_base, ctx, dev).map_err(|e| e.to_string())?);
            if p.swa_window > 0 {
                rope[di][1] = Some(tables(p, p.rope_base_swa, ctx, dev).map_err(|e| e.to_string())?);
            }
        }
        let forward = Self {
            w,
            placement,
            gpu,
            rope,
            slots: (0..slots.max(1)).map(|_| SlotCache::default()).collect(),
            ctx,
            peak_memory: Default::default(),
            adapters: vec![None; slots.max(1)],
            lora_tensors: Mutex::default(),
        };
        forward.gpu_memory();
        Ok(forward)
    }

    /// The decoder's shape.
    pub fn params(&self) -> &LlamaParams {
        &self.w.params
    }

    /// Where it computes.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// The GPU's name, when on one.
    pub fn gpu_name(&self) -> Option<String> {
        device::name(&self.gpu)
    }

    /// Bytes of weights on the GPU.
    pub fn gpu_weight_bytes(&self) -> u64 {
        self.w.gpu_bytes
    }

    /// Grows slot `seq`'s cache to hold `needed` positions.
    fn reserve(&mut self, seq: usize, needed: usize) -> candle_core::Result<()> {
        let p = &self.w.params;
        let slot = &mut self.slots[seq];
        if needed <= slot.cap {
            return Ok(());
        }
        let cap = needed.max(slot.cap * 2).max(FIRST_CAPACITY).min(self.ctx);
        let (mut k, mut v) = (Vec::with_capacity(p.n_layer), Vec::with_capacity(p.n_layer));
        for (il, layer) in self.w.layers.iter().enumerate() {
            let shape = (p.n_head_kv, cap, p.head_dim);
            let nk = Tensor::zeros(shape, DType::F16, &layer.dev)?;
            let nv = Tensor::zeros(shape, DType::F16, &layer.dev)?;
            if slot.cap > 0 {
                nk.slice_set(&slot.k[il], 1, 0)?;
                nv.slice_set(&slot.v[il], 1, 0)?;
            }
            k.push(nk);
            v.push(nv);
        }
        *slot = SlotCache { k, v, cap };
        Ok(())
    }

    /// The pass: logits of each step's last `outputs` positions, or with `hidden` the
    /// hidden states there after the output norm (embeddings).
    fn run(&mut self, steps: &[SeqStep<'_>], hidden: bool) -> candle_core::Result<Vec<Vec<f32>>> {
        for s in steps {
            self.reserve(s.seq, s.pos + s.tokens.len())?;
        }
        let p = &self.w.params;
        let d = p.n_embd;
        let n: usize = steps.iter().map(|s| s.tokens.len()).sum();
        let mut host = vec![0.0f32; n * d];
        for (r, &tok) in steps.iter().flat_map(|s| s.tokens).enumerate() {
            self.w.embd.row_f32(tok as usize, &mut host[r * d..(r + 1) * d]);
        }
        if let Some(s) = p.embd_scale {
            host.iter_mut().for_each(|v| *v *= s);
        }
        let first_dev = self.w.layers.first().map_or(&self.w.out_dev, |l| &l.dev);
        let mut x = Tensor::from_vec(host, (n, d), first_dev)?;
        let positions: Vec<u32> = steps
            .iter()
            .flat_map(|s| (s.pos..s.pos + s.tokens.len()).map(|i| i as u32))
            .collect();
        // Rows of the RoPE tables for this pass, per (device, global/local).
        let mut rows: [[Option<(Tensor, Tensor)>; 2]; 2] = Default::default();
        for il in 0..self.w.layers.len() {
            let layer = &self.w.layers[il];
            if !x.device().same_device(&layer.dev) {
                x = x.to_device(&layer.dev)?;
            }
            let di = usize::from(layer.dev.is_cpu());
            let swa = p.is_swa(il);
            let ri = usize::from(swa && p.swa_window > 0);
            if rows[di][ri].is_none() {
                let t = self.rope[di][ri].as_ref().expect("RoPE tables for every device in use");
                let idx = Tensor::from_slice(&positions, n, &layer.dev)?;
                rows[di][ri] = Some((t.cos.index_select(&idx, 0)?, t.sin.index_select(&idx, 0)?));
            }
            let (cos, sin) = rows[di][ri].as_ref().expect("filled above");
            let attn = self.attention(il, &x, steps, cos, sin, if swa { p.swa_window } else { 0 })?;
            let layer = &self.w.layers[il];
            let o = self.lora(il, Proj::O, &attn, steps, layer.wo.forward(&attn)?)?;
            x = residual(&x, o, layer.post_attn_norm.as_ref(), p.rms_eps)?;
            let xn = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, p.rms_eps)?;
            let gate = self.lora(il, Proj::Gate, &xn, steps, layer.w_gate.forward(&xn)?)?;
            let up = self.lora(il, Proj::Up, &xn, steps, layer.w_up.forward(&xn)?)?;
            let act = match p.ffn_act {
                FfnAct::Silu => candle_nn::ops::silu(&gate)?,
                FfnAct::Gelu => gate.gelu()?,
            };
            let h = (act * up)?;
            let down = self.lora(il, Proj::Down, &h, steps, layer.w_down.forward(&h)?)?;
            x = residual(&x, down, layer.post_ffn_norm.as_ref(), p.rms_eps)?;
        }
        // Only each step's last `outputs` positions need logits.
        let mut end = 0u32;
        let last: Vec<u32> = steps
            .iter()
            .flat_map(|s| {
                end += s.tokens.len() as u32;
                end - s.outputs as u32..end
            })
            .collect();
        let idx = Tensor::from_slice(&last, last.len(), x.device())?;
        let x = x.index_select(&idx, 0)?.to_device(&self.w.out_dev)?;
        let x = candle_nn::ops::rms_norm(&x, &self.w.out_norm, p.rms_eps)?;
        if hidden {
            return x.to_dtype(DType::F32)?.to_vec2::<f32>();
        }
        let logits = self.w.output.forward(&x)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        debug_assert_eq!(logits.len(), last.len());
        Ok(logits)
    }

    /// `y` (the projection `proj` of layer `il` over the rows `x` of `steps`) plus,
    /// for each step whose slot runs an adapter targeting it, that adapter's update
    /// on the step's rows: `scale · (x·Aᵀ)·Bᵀ`.
    fn lora(&self, il: usize, proj: Proj, x: &Tensor, steps: &[SeqStep<'_>], y: Tensor) -> candle_core::Result<Tensor> {
        let adapter = |s: &SeqStep<'_>| self.adapters.get(s.seq).and_then(Option::as_ref);
        if steps
            .iter()
            .all(|s| adapter(s).and_then(|a| a.pair(il, proj)).is_none())
        {
            return Ok(y);
        }
        let d_out = y.dim(1)?;
        let mut parts = Vec::with_capacity(steps.len());
        let mut start = 0;
        for s in steps {
            let len = s.tokens.len();
            let part = match adapter(s).and_then(|a| Some((a, a.pair(il, proj)?))) {
                Some((a, pair)) => {
                    let (at, bt) = self.lora_tensors(a, il, proj, &pair, x.device())?;
                    let rows = x.narrow(0, start, len)?.to_dtype(DType::F32)?;
                    (rows.matmul(&at)?.matmul(&bt)? * f64::from(pair.scale))?.to_dtype(y.dtype())?
                }
                None => Tensor::zeros((len, d_out), y.dtype(), y.device())?,
            };
            parts.push(part);
            start += len;
        }
        y + Tensor::cat(&parts, 0)?
    }

    /// The adapter's A (transposed) and Bᵀ for `proj` of layer `il` on `dev`.
    fn lora_tensors(
        &self,
        a: &LoraAdapter,
        il: usize,
        proj: Proj,
        pair: &crate::model::lora::LoraPair<'_>,
        dev: &Device,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let key = (a.id, il, proj as usize);
        if let Some(t) = self.lora_tensors.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(t.clone());
        }
        let f32s = |bits: &[u16]| {
            bits.iter()
                .map(|&b| half::f16::from_bits(b).to_f32())
                .collect::<Vec<f32>>()
        };
        let at = Tensor::from_vec(f32s(pair.a), (pair.rank, pair.d_in), dev)?
            .t()?
            .contiguous()?;
        let bt = Tensor::from_vec(f32s(pair.bt), (pair.rank, pair.d_out), dev)?;
        let mut cache = self.lora_tensors.lock().unwrap_or_else(|p| p.into_inner());
        let live: Vec<u64> = self.adapters.iter().flatten().map(|a| a.id).collect();
        cache.retain(|k, _| live.contains(&k.0));
        cache.insert(key, (at.clone(), bt.clone()));
        Ok((at, bt))
    }

    /// Self-attention of layer `il` for every step: projections over all rows, then
    /// per sequence RoPE, the cache write and softmax(QKᵀ)·V over its cache.
    fn attention(
        &self,
        il: usize,
        x: &Tensor,
        steps: &[SeqStep<'_>],
        cos: &Tensor,
        sin: &Tensor,
        window: usize,
    ) -> candle_core::Result<Tensor> {
        let p = &self.w.params;
        let layer: &Layer = &self.w.layers[il];
        let (n, hd) = (x.dim(0)?, p.head_dim);
        let xn = candle_nn::ops::rms_norm(x, &layer.attn_norm, p.rms_eps)?;
        let project = |w: &candle_core::quantized::QMatMul,
                       b: Option<&Tensor>,
                       heads: usize,
                       proj: Proj|
         -> candle_core::Result<Tensor> {
            let mut t = self.lora(il, proj, &xn, steps, w.forward(&xn)?)?;
            if let Some(b) = b {
                t = t.broadcast_add(b)?;
            }
            t.reshape((n, heads, hd))
        };
        let mut q = project(&layer.wq, layer.bq.as_ref(), p.n_head, Proj::Q)?;
        let mut k = project(&layer.wk, layer.bk.as_ref(), p.n_head_kv, Proj::K)?;
        let v = project(&layer.wv, layer.bv.as_ref(), p.n_head_kv, Proj::V)?;
        if let Some(w) = &layer.q_norm {
            q = candle_nn::ops::rms_norm(&q.contiguous()?, w, p.rms_eps)?;
        }
        if let Some(w) = &layer.k_norm {
            k = candle_nn::ops::rms_norm(&k.contiguous()?, w, p.rms_eps)?;
        }
        // [1, heads, rows, head_dim]: every row rotated by its own position.
        let rope = |t: Tensor| -> candle_core::Result<Tensor> {
            let t = t.transpose(0, 1)?.contiguous()?.unsqueeze(0)?;
            if p.rope_neox {
                candle_nn::rotary_emb::rope(&t, cos, sin)
            } else {
                candle_nn::rotary_emb::rope_i(&t, cos, sin)
            }
        };
        let q = rope(q)?.squeeze(0)?;
        let k = rope(k)?.squeeze(0)?.to_dtype(DType::F16)?;
        let v = v.transpose(0, 1)?.to_dtype(DType::F16)?;
        let group = p.n_head / p.n_head_kv;
        let mut outs = Vec::with_capacity(steps.len());
        let mut row = 0;
        for s in steps {
            let t = s.tokens.len();
            let cache = &self.slots[s.seq];
            cache.k[il].slice_set(&k.narrow(1, row, t)?.contiguous()?, 1, s.pos)?;
            cache.v[il].slice_set(&v.narrow(1, row, t)?.contiguous()?, 1, s.pos)?;
            let len = s.pos + t;
            // The earliest key any of these queries sees.
            let first = if window > 0 {
                (s.pos + 1).saturating_sub(window)
            } else {
                0
            };
            let keys = cache.k[il].narrow(1, first, len - first)?.to_dtype(DType::F32)?;
            let values = cache.v[il].narrow(1, first, len - first)?.to_dtype(DType::F32)?;
            let qs = q
                .narrow(1, row, t)?
                .contiguous()?
                .reshape((p.n_head_kv, group * t, hd))?;
            let mut scores = (qs.matmul(&keys.t()?)? * f64::from(p.attn_scale))?;
            if t > 1 || window > 0 {
                let mask = mask(s.pos, t, first, len, window, x.device())?;
                scores = scores
                    .reshape((p.n_head_kv, group, t, len - first))?
                    .broadcast_add(&mask)?
                    .reshape((p.n_head_kv, group * t, len - first))?;
            }
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let out = probs
                .matmul(&values)?
                .reshape((p.n_head, t, hd))?
                .transpose(0, 1)?
                .reshape((t, p.n_head * hd))?;
            outs.push(out);
            row += t;
        }
        Tensor::cat(&outs, 0)
    }

    /// Bytes in use and in all on the GPU now (the use is also kept as the peak seen).
    fn gpu_memory(&self) -> Option<(u64, u64)> {
        let (used, total) = device::memory(&self.gpu)?;
        self.peak_memory.fetch_max(used, std::sync::atomic::Ordering::Relaxed);
        Some((used, total))
    }
}

/// `x + out`, with `out` first RMS-normalised when the model has a post-norm.
fn residual(x: &Tensor, out: Tensor, norm: Option<&Tensor>, eps: f32) -> candle_core::Result<Tensor> {
    match norm {
        Some(w) => x + candle_nn::ops::rms_norm(&out, w, eps)?,
        None => x + out,
    }
}

/// The additive mask `[rows, len - first]` of queries at `pos..pos + rows` over keys
/// `first..len`: a query at `i` sees keys `j <= i`, and with a window only
/// `j > i - window`.
fn mask(pos: usize, rows: usize, first: usize, len: usize, window: usize, dev: &Device) -> candle_core::Result<Tensor> {
    let cols = len - first;
    let mut m = vec![0.0f32; rows * cols];
    for r in 0..rows {
        let i = pos + r;
        let lo = if window > 0 { (i + 1).saturating_sub(window) } else { 0 };
        for c in 0..cols {
            let j = first + c;
            if j > i || j < lo {
                m[r * cols + c] = f32::NEG_INFINITY;
            }
        }
    }
    Tensor::from_vec(m, (rows, cols), dev)
}

/// ggml's RoPE cos/sin for positions `0..ctx`: θ by repeated multiplication in f32.
fn tables(p: &LlamaParams, base: f32, ctx: usize, dev: &Device) -> candle_core::Result<RopeTables> {
    let pairs = p.rope_dims / 2;
    let theta_scale = base.powf(-2.0 / p.rope_dims as f32);
    let (mut cos, mut sin) = (Vec::with_capacity(ctx * pairs), Vec::with_capacity(ctx * pairs));
    for pos in 0..ctx {
        let mut theta = pos as f32;
        for _ in 0..pairs {
            cos.push(theta.cos());
            sin.push(theta.sin());
            theta *= theta_scale;
        }
    }
    Ok(RopeTables {
        cos: Tensor::from_vec(cos, (ctx, pairs), dev)?,
        sin: Tensor::from_vec(sin, (ctx, pairs), dev)?,
    })
}

impl Forward for CandleForward {
    fn sequences(&self) -> usize {
        self.slots.len()
    }

    fn forward_batch(&mut self, steps: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        self.checked(steps, false)
    }

    fn hidden_batch(&mut self, steps: &[SeqStep<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        self.checked(steps, true)
    }

    fn lora_base(&self) -> Option<&LlamaParams> {
        Some(&self.w.params)
    }

    fn set_adapter(&mut self, seq: usize, adapter: Option<Arc<LoraAdapter>>) -> bool {
        match self.adapters.get_mut(seq) {
            Some(a) => {
                *a = adapter;
                true
            }
            None => false,
        }
    }

    fn kind(&self) -> &'static str {
        match self.placement {
            Placement::Cuda(_) => "candle-cuda",
            Placement::Cpu => "candle-cpu",
        }
    }

    fn reuses_prefix(&self) -> bool {
        true
    }

    fn copy_prefix(&mut self, from: usize, to: usize, len: usize) -> bool {
        if from == to || from >= self.slots.len() || to >= self.slots.len() || len > self.slots[from].cap {
            return false;
        }
        let copy = |this: &mut Self| -> candle_core::Result<()> {
            this.reserve(to, len)?;
            for il in 0..this.w.layers.len() {
                let (src, dst) = (&this.slots[from], &this.slots[to]);
                dst.k[il].slice_set(&src.k[il].narrow(1, 0, len)?.contiguous()?, 1, 0)?;
                dst.v[il].slice_set(&src.v[il].narrow(1, 0, len)?.contiguous()?, 1, 0)?;
            }
            Ok(())
        };
        copy(self).is_ok()
    }

    fn kv_bytes_per_token(&self) -> usize {
        let p = &self.w.params;
        2 * 2 * p.n_layer * p.n_head_kv * p.head_dim
    }

    fn read_rows(&self, seq: usize, start: usize, n: usize) -> Option<(Vec<u16>, Vec<u16>)> {
        let slot = self.slots.get(seq)?;
        if start + n > slot.cap {
            return None;
        }
        let read = |t: &[Tensor]| -> candle_core::Result<Vec<u16>> {
            let mut out = Vec::new();
            for layer in t {
                let rows = layer.narrow(1, start, n)?.flatten_all()?.to_vec1::<half::f16>()?;
                out.extend(rows.into_iter().map(half::f16::to_bits));
            }
            Ok(out)
        };
        Some((read(&slot.k).ok()?, read(&slot.v).ok()?))
    }

    fn write_rows(&mut self, seq: usize, start: usize, n: usize, k: &[u16], v: &[u16]) -> bool {
        if seq >= self.slots.len() || start + n > self.ctx {
            return false;
        }
        let p = &self.w.params;
        let per_layer = p.n_head_kv * n * p.head_dim;
        if k.len() != per_layer * p.n_layer || v.len() != k.len() {
            return false;
        }
        let write = |this: &mut Self| -> candle_core::Result<()> {
            this.reserve(seq, start + n)?;
            let shape = (this.w.params.n_head_kv, n, this.w.params.head_dim);
            for il in 0..this.w.layers.len() {
                let dev = &this.w.layers[il].dev;
                let part = |b: &[u16]| {
                    let vals: Vec<half::f16> = b[il * per_layer..(il + 1) * per_layer]
                        .iter()
                        .map(|&x| half::f16::from_bits(x))
                        .collect();
                    Tensor::from_vec(vals, shape, dev)
                };
                this.slots[seq].k[il].slice_set(&part(k)?, 1, start)?;
                this.slots[seq].v[il].slice_set(&part(v)?, 1, start)?;
            }
            Ok(())
        };
        write(self).is_ok()
    }

    fn cached_keys(&self, seq: usize, len: usize) -> Option<CachedKeys> {
        let p = &self.w.params;
        let slot = self.slots.get(seq)?;
        if len > slot.cap {
            return None;
        }
        let keys = slot
            .k
            .iter()
            .map(|layer| {
                (0..p.n_head_kv)
                    .map(|h| {
                        layer
                            .get(h)?
                            .narrow(0, 0, len)?
                            .to_dtype(DType::F32)?
                            .flatten_all()?
                            .to_vec1::<f32>()
                    })
                    .collect::<candle_core::Result<Vec<_>>>()
            })
            .collect::<candle_core::Result<Vec<_>>>()
            .ok()?;
        Some(CachedKeys {
            keys,
            heads: p.n_head_kv,
            head_dim: p.head_dim,
        })
    }

    fn device_memory(&self) -> Option<(u64, u64)> {
        let (used, _total) = self.gpu_memory()?;
        Some((used, self.peak_memory.load(std::sync::atomic::Ordering::Relaxed)))
    }
}
