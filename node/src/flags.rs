//! The worker's command-line flags, shared by `switchyard up`, `switchyard worker`
//! and the benchmarks that start a worker: each names a `worker.*` setting and
//! overrides the layered configuration when given.

use clap::Args;
use std::path::PathBuf;
use switchyard_config::Config;
use switchyard_workers::backends::Registry;

/// `--backend` values: `auto` and the registry's kinds.
fn backend_names() -> Vec<&'static str> {
    std::iter::once("auto")
        .chain(Registry::default().kinds().into_iter().map(|k| k.as_str()))
        .collect()
}

/// Worker settings shared by `up` and `worker`.
#[derive(Args, Debug, Clone)]
pub struct WorkerFlags {
    /// GGUF model file, or Hugging Face model directory (config.json + tokenizer.json + *.safetensors), to serve (default: the demo model installed by scripts/setup.sh) — or
    /// the name of a model in the fleet's store (`switchyard models push`), fetched
    /// into store.cache_dir with every SHA-256 checked (docs/models.md).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Name requests use for the model (default: the file name without .gguf, or the directory name).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Backend: cpu (switchyard's own engine), llama_cpp (a llama.cpp server already running at --llama-url), rocm / cuda (a llama-server child this worker starts, supervises and pins to AMD / NVIDIA GPU --gpu-device), metal (MLX through a supervised Python bridge, on a Hugging Face directory), or auto (the most preferred one available here).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(backend_names()))]
    pub backend: Option<String>,
    /// llama_cpp: the server's base URL, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub llama_url: Option<String>,
    /// cuda: native (switchyard's engine on candle's CUDA device; a build with the cuda feature), llama-server (a supervised llama-server child), or auto (native in a cuda build, else llama-server).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(switchyard_config::CUDA_ENGINES))]
    pub cuda_engine: Option<String>,
    /// rocm/cuda: the llama-server binary, built for that GPU (default: $SWITCHYARD_LLAMA_SERVER, else the cache's CPU build, else PATH).
    #[arg(long)]
    pub llama_server: Option<PathBuf>,
    /// rocm/cuda: more llama-server arguments, split on whitespace (e.g. "-fa on"); a --slot-save-path here is where slots are saved for the KV exchange (default: a directory of the worker's own).
    #[arg(long, allow_hyphen_values = true)]
    pub llama_server_args: Option<String>,
    /// rocm/cuda: GPU index (sets HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES for the child; cuda counts in nvidia-smi's order).
    #[arg(long)]
    pub gpu_device: Option<u32>,
    /// rocm/cuda: layers to offload to the GPU (-ngl; the native cuda engine counts the same way); -1 = all.
    #[arg(long, allow_hyphen_values = true)]
    pub gpu_layers: Option<i32>,
    /// Sequences computed together: the cpu engine's KV slots (default 4), or the rocm/cuda
    /// llama-server's --parallel (default: llama-server's own).
    #[arg(long)]
    pub parallel_slots: Option<u32>,
    /// rocm/cuda: run the supervised llama-server (or cuda's native engine) on the CPU when the GPU is missing (testing; also --rocm-allow-cpu).
    #[arg(long, alias = "rocm-allow-cpu")]
    pub gpu_allow_cpu: bool,
    /// metal: the Python with mlx-lm that runs the MLX bridge (default: the cache's venv).
    #[arg(long)]
    pub mlx_python: Option<PathBuf>,
    /// metal: run MLX on the CPU where there is no Apple GPU (Linux, testing); the worker announces device cpu.
    #[arg(long)]
    pub mlx_allow_cpu: bool,
    /// Worker id, one NATS subject token (default: {backend}-{host}-{pid}).
    #[arg(long)]
    pub worker_id: Option<String>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<u32>,
    /// Context window in tokens (default: the model's own, capped at 8192 on cpu; the KV cache is allocated up front).
    #[arg(long)]
    pub context_len: Option<u32>,
    /// Requests computed at once (default: the KV slots on cpu, the server's slot count on llama_cpp, rocm and cuda).
    #[arg(long)]
    pub capacity: Option<u32>,
    /// Requests that may wait beyond --capacity; more are refused with `overloaded`.
    #[arg(long)]
    pub queue_depth: Option<u32>,
    /// Heartbeat period in milliseconds.
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Close a session after this many seconds without calls (default 600).
    #[arg(long)]
    pub session_idle_secs: Option<u64>,
    /// cpu: MiB of KV blocks kept after their slot moved on, restored by a memory copy
    /// when a prompt starts with them again (default 256; 0 = off).
    #[arg(long)]
    pub kv_cache_mb: Option<u32>,
    /// Pull a prompt's prefix from a peer worker that holds it, when predicted faster
    /// than computing it (default true; `--kv-pull false`: always compute).
    #[arg(long)]
    pub kv_pull: Option<bool>,
    /// On SIGTERM, hand each running stream to another worker, which pulls its KV and
    /// streams on to the same client, and move each session with its KV (default
    /// true; `--handover false`: streams finish here within the drain's grace and
    /// sessions end with the worker).
    #[arg(long)]
    pub handover: Option<bool>,
    /// Disaggregated prefill/decode: `both` (default), `prefill` (computes long
    /// prompts' KV for decode workers; routed requests only when pinned) or `decode`
    /// (long prompts are prefilled on a prefill worker and their KV pulled here).
    #[arg(long)]
    pub role: Option<switchyard_messages::WorkerRole>,
    /// cpu: speculative decoding, `off`, `lookup` (prompt lookup: each step also checks
    /// tokens that continued the stream's last n-gram where it occurred earlier in the
    /// prompt or output; fastest on rewriting, extraction and code editing) or `draft`
    /// (a smaller model with the same vocabulary proposes them: --draft-model).
    /// Lossless: the same tokens as `off`.
    #[arg(long, value_parser = ["off", "lookup", "draft"])]
    pub speculative: Option<String>,
    /// cpu: the draft model's GGUF for --speculative draft (same vocabulary as --model).
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// cpu: the most tokens one step drafts per stream with --speculative (1-32, default 8).
    #[arg(long)]
    pub draft_max: Option<u32>,
    /// cpu / native CUDA engine: how embeddings pool the token rows (default: the
    /// model's own, from the GGUF's pooling_type or sentence-transformers' Pooling
    /// module, else mean).
    #[arg(long, value_parser = ["mean", "cls", "last"])]
    pub pooling: Option<String>,
    /// A LoRA adapter of the model, loaded at start: NAME=PATH or NAME=PATH@SCALE
    /// (PATH: a PEFT directory or a GGUF LoRA; SCALE default 1). Repeat for more;
    /// given, they replace worker.adapters. Requests name one with `adapter` (NATS)
    /// or model "MODEL:NAME" (the OpenAI gateway).
    #[arg(long = "adapter", value_name = "NAME=PATH[@SCALE]")]
    pub adapters: Vec<switchyard_config::AdapterConfig>,
    /// cpu: serve the model as a stage of the pipeline of this name (with --layers):
    /// a model split by layers across workers, each holding only its own layers and
    /// their KV. The stage holding layer 0 serves the model's requests; the others
    /// only compute for it (docs/deploy.md, "A model across machines").
    #[arg(long)]
    pub pipeline: Option<String>,
    /// With --pipeline: this worker's layers, FIRST-LAST inclusive (e.g. 0-13 and
    /// 14-29 for a 30-layer model on two workers).
    #[arg(long, value_name = "FIRST-LAST")]
    pub layers: Option<String>,
    /// With --pipeline, on the first stage: how long one step may wait while the
    /// stages after it answer nothing before its requests end with a retryable
    /// `worker_lost`, ms (default 30000). A stage whose process is gone is found by
    /// the first stage's probe (each second) sooner.
    #[arg(long)]
    pub stage_timeout_ms: Option<u64>,
}

impl WorkerFlags {
    /// Applies the flags that were given.
    pub fn apply(&self, c: &mut Config) {
        let w = &mut c.worker;
        if let Some(v) = &self.model {
            w.model = v.display().to_string();
        }
        if let Some(v) = &self.model_name {
            w.model_name = v.clone();
        }
        if let Some(v) = &self.backend {
            w.backend = v.clone();
        }
        if let Some(v) = &self.llama_url {
            w.llama_url = v.clone();
        }
        if let Some(v) = &self.cuda_engine {
            w.cuda_engine = v.clone();
        }
        if let Some(v) = &self.llama_server {
            w.llama_server_bin = v.display().to_string();
        }
        if let Some(v) = &self.llama_server_args {
            w.llama_server_args = v.clone();
        }
        if let Some(v) = self.gpu_device {
            w.gpu_device = v;
        }
        if let Some(v) = self.gpu_layers {
            w.gpu_layers = v;
        }
        if let Some(v) = self.parallel_slots {
            w.parallel_slots = v;
        }
        if self.gpu_allow_cpu {
            w.gpu_allow_cpu = true;
        }
        if let Some(v) = &self.mlx_python {
            w.mlx_python = v.display().to_string();
        }
        if self.mlx_allow_cpu {
            w.mlx_allow_cpu = true;
        }
        if let Some(v) = &self.worker_id {
            w.id = v.clone();
        }
        if let Some(v) = self.threads {
            w.threads = v;
        }
        if let Some(v) = self.context_len {
            w.context_len = v;
        }
        if let Some(v) = self.capacity {
            w.capacity = v;
        }
        if let Some(v) = self.session_idle_secs {
            w.session_idle_secs = v;
        }
        if let Some(v) = self.kv_cache_mb {
            w.kv_cache_mb = v;
        }
        if let Some(v) = self.kv_pull {
            w.kv_pull = v;
        }
        if let Some(v) = self.handover {
            w.handover = v;
        }
        if let Some(v) = self.role {
            w.role = v;
        }
        if let Some(v) = &self.speculative {
            w.speculative = v.clone();
        }
        if let Some(v) = self.draft_max {
            w.draft_max = v;
        }
        if let Some(v) = &self.pooling {
            w.pooling = v.clone();
        }
        if !self.adapters.is_empty() {
            w.adapters = self.adapters.clone();
        }
        if let Some(v) = &self.pipeline {
            w.pipeline = v.clone();
        }
        if let Some(v) = &self.layers {
            w.layers = v.clone();
        }
        if let Some(v) = self.stage_timeout_ms {
            w.stage_timeout_ms = v;
        }
        if let Some(v) = &self.draft_model {
            w.draft_model = v.display().to_string();
        }
        if let Some(v) = self.queue_depth {
            w.queue_depth = v;
        }
        if let Some(v) = self.heartbeat_ms {
            w.heartbeat_ms = v;
        }
    }
}
