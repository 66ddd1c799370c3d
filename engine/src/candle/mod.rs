//! The decoder computed by candle on a candle device: the `cuda` backend's native
//! engine (candle-core's CUDA device on cudarc, its quantized matmul kernels), which
//! also runs on candle's CPU device, so everything but the GPU itself is tested on
//! machines without one.
//!
//! It is a [`Forward`](super::model::forward::Forward) like switchyard's own CPU pass,
//! so the serving side is the engine's: continuous batching with chunked prefill, KV
//! slots with prefix reuse, the KV block store, sessions on pinned slots, the sampler,
//! stop strings, classify and the attention inspector.
//!
//! ## Layout
//! - [`device`]: where it computes ([`Placement`]), opening the device (a build
//!   without the `cuda` feature says so), the driver's memory figures, which layers a
//!   `gpu_layers` setting puts on the GPU.
//! - `weights`: the GGUF tensors on their devices (quantized matrices stay quantized).
//! - `forward`: [`CandleForward`]: one f16 KV cache per slot and layer on the layer's
//!   device, grown as positions are written; the pass over several sequences.
//!
//! What differs from the CPU pass: attention runs in f32 over f16 keys and values
//! (llama.cpp's non-flash path also rounds Q and the softmax to f16), and matmul
//! activations are quantized the way candle's kernels do it. Greedy output agrees
//! with the CPU engine on the reference prompts; logits are not bit-identical.

pub mod device;
mod forward;
mod weights;

pub use device::Placement;
pub use forward::CandleForward;
