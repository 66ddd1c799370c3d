//! The `[worker]` section: how a worker serves its model.

use crate::{ConfigError, WORKER_BACKENDS};
use serde::{Deserialize, Serialize};

/// What `worker.cuda_engine` accepts.
pub const CUDA_ENGINES: &[&str] = &["auto", "native", "llama-server"];

/// Worker behaviour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Worker id (one subject token); empty = `{backend}-{host}-{pid}`.
    pub id: String,
    /// Model file (GGUF) to serve; empty = the demo model in the cache.
    pub model: String,
    /// Name requests use for the model; empty = the file name without `.gguf`.
    pub model_name: String,
    /// Backend: `cpu` (switchyard's own engine), `llama_cpp` (a llama.cpp server
    /// already running at `llama_url`), `rocm` / `cuda` (a `llama-server` child this
    /// worker starts and supervises, pinned to AMD / NVIDIA GPU `gpu_device`), `metal`
    /// (MLX through a supervised Python bridge; a Hugging Face directory as `model`),
    /// or `auto` (the most preferred one available here: metal > rocm > llama_cpp >
    /// cuda > cpu).
    pub backend: String,
    /// `llama_cpp`: the server's base URL, e.g. `http://127.0.0.1:8080`.
    pub llama_url: String,
    /// `cuda`: which engine computes: `native` (switchyard's engine on candle's CUDA
    /// device, in a build with the `cuda` feature), `llama-server` (a supervised
    /// `llama-server` child, as `rocm` has), or `auto` (native in a `cuda` build,
    /// else llama-server).
    pub cuda_engine: String,
    /// `rocm`/`cuda`: the `llama-server` binary (built for that GPU); empty =
    /// `$SWITCHYARD_LLAMA_SERVER`, else the one `scripts/build-llama-server.sh` built
    /// in the cache (a CPU build), else `PATH`.
    pub llama_server_bin: String,
    /// `rocm`/`cuda`: more `llama-server` arguments, split on whitespace (e.g.
    /// `"-fa on"`). A `--slot-save-path` here is where the server saves slots for the
    /// KV exchange with peers (else a directory of the worker's own).
    pub llama_server_args: String,
    /// `rocm`/`cuda`: the GPU index, as the child's `HIP_VISIBLE_DEVICES` /
    /// `CUDA_VISIBLE_DEVICES` takes it (for `cuda` in `nvidia-smi`'s order); when the
    /// worker itself runs with that variable set, an index into its list.
    pub gpu_device: u32,
    /// `rocm`/`cuda`: layers to offload (`-ngl`; the native engine counts the same
    /// way, the last layers first); -1 = all.
    pub gpu_layers: i32,
    /// `rocm`/`cuda`: llama-server slots (`--parallel`); 0 = llama-server's default.
    pub parallel_slots: u32,
    /// `rocm`/`cuda`: run the supervised llama-server (or the native engine, on
    /// candle's CPU device) even where the GPU is missing (then on the CPU; the
    /// device is announced as e.g. `cuda:0(cpu)`), for tests and machines without one. Also read under its old name `rocm_allow_cpu`.
    #[serde(alias = "rocm_allow_cpu")]
    pub gpu_allow_cpu: bool,
    /// `metal`: the Python that runs the MLX bridge (it needs `mlx-lm`); empty = the
    /// cache's venv (`scripts/setup.sh` installs it there).
    pub mlx_python: String,
    /// `metal`: run MLX on the CPU where there is no Apple GPU (Linux, tests); the
    /// worker then announces device `cpu`.
    pub mlx_allow_cpu: bool,
    /// Compute threads; 0 = all cores.
    pub threads: u32,
    /// Threads of the async runtime (NATS, worker service, coordinator, gateway) in a
    /// process that runs a worker; 0 = one on the `cpu` backend, whose compute threads
    /// take every core (a second async thread there only adds wake-ups between the
    /// two), and one per core on the others. `TOKIO_WORKER_THREADS`, when set, wins.
    pub async_threads: u32,
    /// Context window in tokens; 0 = the model's own, capped by the backend.
    pub context_len: u32,
    /// Requests computed at once; 0 = the backend's own (the KV slots on `cpu`, the
    /// server's slot count on `llama_cpp`, `rocm` and `cuda`).
    pub capacity: u32,
    /// Requests that may wait beyond `capacity`; more are refused with `overloaded`.
    pub queue_depth: u32,
    /// Heartbeat period, milliseconds.
    pub heartbeat_ms: u64,
    /// Keep-alive chunk period while a request is queued or computing, milliseconds.
    pub keepalive_ms: u64,
    /// Longest a generated token may wait to share a chunk (one NATS message) with
    /// the tokens after it, milliseconds. Only tokens that come faster than one per
    /// `coalesce_ms` wait; the first token of a stream never does; tokens already
    /// waiting always share a chunk. 0 = every token is sent when it is read.
    pub coalesce_ms: u64,
    /// A session with no calls for this many seconds is closed and its KV slot given
    /// back.
    pub session_idle_secs: u64,
    /// `cpu`: MiB of KV blocks kept after their slot moved on (restored by a memory
    /// copy when a prompt starts with them again); 0 = none.
    pub kv_cache_mb: u32,
    /// Pull a request's prefix from a peer that holds it (`cpu` and other backends
    /// whose KV travels) when that is predicted faster than computing it; peers can
    /// pull from this worker either way.
    pub kv_pull: bool,
    /// When it drains (SIGTERM), hand each running stream to another worker, which
    /// pulls its KV and streams on, and move each session with its KV (`cpu` and other
    /// backends whose KV travels); false: streams finish here within the drain's
    /// grace, sessions end with the worker.
    pub handover: bool,
    /// Its part in disaggregated prefill/decode: `both` (default: serves requests
    /// whole), `prefill` (computes long prompts' KV for decode workers; routed
    /// requests only when pinned) or `decode` (a long prompt's KV is computed by a
    /// prefill worker of the same KV format and pulled here). docs/kv-transfer.md.
    pub role: switchyard_messages::WorkerRole,
    /// `cpu`: prompt tokens a new request prefills per decode step while other
    /// requests are generating (chunked prefill, so running streams keep flowing);
    /// 0 = chosen per step from measured speeds (a chunk costs about one decode
    /// step). A request that arrives at an idle worker is prefilled at once.
    pub prefill_chunk: u32,
    /// `cpu`: speculative decoding. `"lookup"`: each step also checks tokens
    /// proposed by prompt lookup (continuations of n-grams that already occurred in
    /// the prompt or output), so a stream that repeats its input generates several
    /// tokens per step. `"draft"`: a smaller model with the same vocabulary
    /// (`draft_model`) proposes them greedily. Lossless (greedy and seeded output
    /// are identical to `"off"`). `"off"`: one token per step.
    pub speculative: String,
    /// `cpu`: the draft model's GGUF for `speculative = "draft"`: same vocabulary
    /// as the model, token for token (e.g. a smaller quant or size of the same family).
    pub draft_model: String,
    /// `cpu`: the most tokens one step drafts per stream (1–32; the drafter adapts
    /// below this to how many get accepted).
    pub draft_max: u32,
    /// `cpu` (and the native CUDA engine): how embeddings pool token rows — `"mean"`,
    /// `"cls"` or `"last"`; empty = the model's own (GGUF `pooling_type`,
    /// sentence-transformers' Pooling module), else mean.
    pub pooling: String,
    /// LoRA adapters of the model loaded at start (`[[worker.adapters]]`: `name`,
    /// `path` to a PEFT directory or a GGUF LoRA, `scale`, default 1): requests
    /// naming one run with it (`cpu` and the native CUDA engine per sequence;
    /// llama-server per request; MLX one per worker). One that fails to load is
    /// logged and left out; the worker serves the rest.
    pub adapters: Vec<AdapterConfig>,
    /// `cpu`: serve the model as stages of the pipeline of this name, this worker
    /// holding the layers `layers` (docs/deploy.md, "A model across machines"). The
    /// stage with layer 0 serves the model's requests; the others only compute
    /// their layers for it.
    pub pipeline: String,
    /// With `pipeline`: this worker's layers, first and last inclusive (`0-13`).
    pub layers: String,
    /// With `pipeline`: how long the first stage waits for the stages after it to
    /// answer one step before it ends the step's requests (retryable), ms.
    pub stage_timeout_ms: u64,
}

/// One LoRA adapter of `worker.adapters`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdapterConfig {
    /// The name requests use (no `:`, spaces or control characters).
    pub name: String,
    /// A PEFT directory (`adapter_config.json` + `adapter_model.safetensors`) or a
    /// llama.cpp GGUF LoRA file.
    pub path: String,
    /// The update's scale (× the adapter's alpha / rank).
    #[serde(default = "unit_scale")]
    pub scale: f32,
}

fn unit_scale() -> f32 {
    1.0
}

impl std::str::FromStr for AdapterConfig {
    type Err = String;

    /// `name=path`, or `name=path@scale`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: an adapter is name=path or name=path@scale"))?;
        let (path, scale) = match rest.rsplit_once('@') {
            Some((p, sc)) => (p, sc.parse().map_err(|e| format!("{s:?}: scale {sc:?}: {e}"))?),
            None => (rest, 1.0),
        };
        Ok(Self {
            name: name.to_string(),
            path: path.to_string(),
            scale,
        })
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            id: String::new(),
            model: String::new(),
            model_name: String::new(),
            backend: "cpu".into(),
            llama_url: String::new(),
            cuda_engine: "auto".into(),
            llama_server_bin: String::new(),
            llama_server_args: String::new(),
            gpu_device: 0,
            gpu_layers: -1,
            parallel_slots: 0,
            gpu_allow_cpu: false,
            mlx_python: String::new(),
            mlx_allow_cpu: false,
            threads: 0,
            async_threads: 0,
            context_len: 0,
            capacity: 0,
            queue_depth: 16,
            session_idle_secs: 600,
            kv_cache_mb: 256,
            kv_pull: true,
            handover: true,
            role: Default::default(),
            pipeline: String::new(),
            layers: String::new(),
            stage_timeout_ms: 30_000,
            prefill_chunk: 0,
            speculative: "off".into(),
            draft_model: String::new(),
            draft_max: 8,
            pooling: String::new(),
            adapters: Vec::new(),
            heartbeat_ms: 1_000,
            keepalive_ms: 1_000,
            coalesce_ms: 20,
        }
    }
}

impl WorkerConfig {
    /// Checks this section's own ranges; the error names the field.
    /// `layers` as global layer indices (`"0-13"` → `0..14`), when `pipeline` is set.
    pub fn stage_layers(&self) -> Result<Option<std::ops::Range<usize>>, String> {
        if self.pipeline.is_empty() && self.layers.is_empty() {
            return Ok(None);
        }
        let bad = || format!("{:?}: layers are FIRST-LAST, e.g. 0-13", self.layers);
        let (a, b) = self.layers.split_once('-').ok_or_else(bad)?;
        let (a, b): (usize, usize) = (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        );
        if a > b {
            return Err(bad());
        }
        Ok(Some(a..b + 1))
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, value: String, reason| Err(ConfigError::Invalid { field, value, reason });
        let token_ok = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !self.id.is_empty() && !token_ok(&self.id) {
            return invalid("worker.id", self.id.clone(), "must be letters, digits, '-' or '_'");
        }
        if !token_ok(&self.pipeline) {
            return invalid(
                "worker.pipeline",
                self.pipeline.clone(),
                "must be letters, digits, '-' or '_'",
            );
        }
        if self.pipeline.is_empty() != self.layers.is_empty() {
            return invalid(
                "worker.layers",
                self.layers.clone(),
                "a pipeline stage needs both pipeline and layers",
            );
        }
        if self.stage_layers().is_err() {
            return invalid("worker.layers", self.layers.clone(), "must be FIRST-LAST (e.g. 0-13)");
        }
        if !self.pipeline.is_empty() && !matches!(self.backend.as_str(), "cpu" | "auto") {
            return invalid(
                "worker.pipeline",
                self.pipeline.clone(),
                "pipeline stages run on the cpu backend (llama.cpp, MLX and CUDA workers serve whole models)",
            );
        }
        if !WORKER_BACKENDS.contains(&self.backend.as_str()) {
            return invalid(
                "worker.backend",
                self.backend.clone(),
                "must be one of: auto, cpu, llama_cpp, rocm, cuda, metal",
            );
        }
        if self.backend == "llama_cpp"
            && !(self.llama_url.starts_with("http://") || self.llama_url.starts_with("https://"))
        {
            return invalid(
                "worker.llama_url",
                format!("{:?}", self.llama_url),
                "backend llama_cpp needs the server's http:// or https:// URL",
            );
        }
        if !CUDA_ENGINES.contains(&self.cuda_engine.as_str()) {
            return invalid(
                "worker.cuda_engine",
                self.cuda_engine.clone(),
                "must be one of: auto, native, llama-server",
            );
        }
        if self.gpu_layers < -1 {
            return invalid(
                "worker.gpu_layers",
                self.gpu_layers.to_string(),
                "must be -1 (all) or a layer count",
            );
        }
        for a in &self.adapters {
            // The rule requests are checked by (the wire crate's), so a loaded name is askable.
            if switchyard_messages::check_adapter_name(&a.name).is_err() {
                return invalid(
                    "worker.adapters.name",
                    format!("{:?}", a.name),
                    "must be 1-128 bytes without ':', spaces or control characters",
                );
            }
            if a.path.is_empty() {
                return invalid(
                    "worker.adapters.path",
                    format!("{:?}", a.name),
                    "must name a file or directory",
                );
            }
            if !a.scale.is_finite() {
                return invalid("worker.adapters.scale", a.scale.to_string(), "must be a finite number");
            }
        }
        if self.heartbeat_ms < 50 {
            return invalid(
                "worker.heartbeat_ms",
                self.heartbeat_ms.to_string(),
                "must be at least 50",
            );
        }
        if self.keepalive_ms < 50 {
            return invalid(
                "worker.keepalive_ms",
                self.keepalive_ms.to_string(),
                "must be at least 50",
            );
        }
        if self.coalesce_ms > 100 || self.coalesce_ms >= self.keepalive_ms {
            return invalid(
                "worker.coalesce_ms",
                self.coalesce_ms.to_string(),
                "must be at most 100 and below worker.keepalive_ms",
            );
        }
        if !["off", "lookup", "draft"].contains(&self.speculative.as_str()) {
            return invalid(
                "worker.speculative",
                self.speculative.clone(),
                "must be \"off\", \"lookup\" or \"draft\"",
            );
        }
        if (self.speculative == "draft") == self.draft_model.is_empty() {
            return invalid(
                "worker.draft_model",
                format!("{:?}", self.draft_model),
                "is needed by speculative = \"draft\" and only by it",
            );
        }
        if !["", "mean", "cls", "last"].contains(&self.pooling.as_str()) {
            return invalid(
                "worker.pooling",
                format!("{:?}", self.pooling),
                "must be \"mean\", \"cls\", \"last\" or empty (the model's own)",
            );
        }
        if !(1..=32).contains(&self.draft_max) {
            return invalid("worker.draft_max", self.draft_max.to_string(), "must be 1 to 32");
        }
        if self.async_threads > 1024 {
            return invalid(
                "worker.async_threads",
                self.async_threads.to_string(),
                "must be at most 1024 (0 = chosen by backend)",
            );
        }
        Ok(())
    }
}
