//! Command-line definitions (clap) and dispatch. Every flag is documented here so
//! `--help` explains itself.

mod bench;
mod commands;
mod connect;
mod coordinator;
pub use coordinator::CoordinatorFlags;
mod constrain;
mod gateway;
mod runtime;
mod secure_up;
mod security;
mod status;
mod store;
pub use store::ModelsArgs;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use switchyard::Config;
use switchyard_workers::backends::Registry;

pub use runtime::async_threads;

pub use commands::run;
pub use security::SecurityFlags;

/// The top of `--help`: what switchyard is, with the backends this build has (the
/// list grows with the registry).
fn about() -> String {
    let kinds: Vec<String> = Registry::default().kinds().iter().map(|k| k.to_string()).collect();
    format!(
        "switchyard: serve LLMs from a mixed fleet as one system over NATS (backends in this build: {})",
        kinds.join(", ")
    )
}

fn long_about() -> String {
    format!(
        "{}.\n\nBackends, most preferred first:\n  {}\n\nConfiguration is layered: built-in defaults, then the TOML file (--config or \
         $SWITCHYARD_CONFIG), then SWITCHYARD_{{SECTION}}_{{FIELD}} environment variables \
         (e.g. SWITCHYARD_WORKER_CAPACITY=2), then flags.",
        about(),
        Registry::default().describe().join("\n  ")
    )
}

/// `--backend` values: `auto` and the registry's kinds.
fn backend_names() -> Vec<&'static str> {
    std::iter::once("auto")
        .chain(Registry::default().kinds().into_iter().map(|k| k.as_str()))
        .collect()
}

#[derive(Parser, Debug)]
#[command(name = "switchyard", version, about = about(), long_about = long_about())]
pub struct Cli {
    /// TOML configuration file (sections: nats, coordinator, worker, client).
    #[arg(long, global = true, env = "SWITCHYARD_CONFIG")]
    pub config: Option<PathBuf>,
    /// NATS server URL, e.g. nats://10.0.0.5:4222, or the members of a cluster
    /// separated by commas (nats://a:4222,nats://b:4222): the process reconnects to any
    /// of them. `up` starts a local server when
    /// this is not given.
    #[arg(long, global = true)]
    pub nats: Option<String>,
    /// Subject prefix ({prefix}.v1.*), to run several fleets on one NATS account.
    #[arg(long, global = true)]
    pub prefix: Option<String>,
    /// Log filter (tracing EnvFilter syntax), e.g. `info`, `switchyard=debug`.
    #[arg(long, global = true, default_value = "warn", env = "RUST_LOG")]
    pub log: String,
    #[command(flatten)]
    pub security: SecurityFlags,
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a single node: a local nats-server (unless --nats), a coordinator and a
    /// CPU worker serving the demo model (or --model). Stays up until Ctrl-C.
    Up(UpArgs),
    /// Run a coordinator only (routes requests to workers found by heartbeat).
    Coordinator(CoordinatorArgs),
    /// Run a worker only, serving one model on one device.
    Worker(WorkerArgs),
    /// Run an OpenAI-compatible HTTP gateway to the fleet (docs/gateway.md).
    Gateway(gateway::GatewayArgs),
    /// Generate from a raw prompt; tokens stream to stdout as they arrive.
    Generate(GenerateArgs),
    /// Chat with a model (rendered with the model's chat template). With no message,
    /// starts an interactive session that keeps the conversation.
    Chat(ChatArgs),
    /// Show live workers: device, backend, model, load.
    Status(StatusArgs),
    /// List models served by the fleet and held in its store (or found on disk with
    /// --dir); push, pull and remove models in the store (docs/models.md).
    Models(ModelsArgs),
    /// Benchmarks that print ratios against a peer measured in the same run.
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// Benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The fabric's own cost: the same greedy request through the in-process backend
    /// and through NATS + coordinator + worker, alternating. Starts its own
    /// nats-server unless --nats is given.
    Fabric(BenchFabricArgs),
    /// switchyard's CPU engine against llama.cpp's llama-server on the same GGUF, same
    /// prompt (~100 tokens), same threads, alternating runs: prefill and decode tok/s,
    /// ratios, peak RSS.
    Llama(bench::llama::BenchLlamaArgs),
    /// The fabric's cost on the llama.cpp path: the same greedy request straight to a
    /// llama-server and through NATS + coordinator + a llama_cpp worker in front of
    /// that same server, alternating: time to first token and tok/s, ratios. Starts
    /// its own nats-server unless --nats is given.
    #[command(name = "llama-cpp")]
    LlamaCpp(bench::llama::BenchLlamaArgs),
    /// Time to first token with a warm prefix against a cold one: a new ~1,500-token
    /// document per run and two questions about it, through NATS + coordinator +
    /// worker. Starts its own nats-server unless --nats is given.
    Prefix(BenchPrefixArgs),
    /// KV-aware routing against load-only routing on the same workload: many
    /// conversations sharing a few documents across several CPU workers (in this
    /// process, each with its own engine and NATS connection). Prints the prefix hit
    /// rate, requests per worker and wall time. Starts its own nats-servers.
    #[command(name = "kv-routing")]
    KvRouting(BenchKvArgs),
    /// KV of 32 streams behind one 1,500-token prompt: shared pages vs a copy per slot.
    Kv(bench::pages::BenchKvPagesArgs),
    /// Continuous batching: aggregate tok/s with 1, 4 and 8 concurrent streams on one
    /// CPU worker (through NATS) against llama-server with --parallel 8 on the same
    /// GGUF and threads, alternating rounds: ratios and time to first token. Starts
    /// its own nats-server unless --nats is given.
    Batch(BenchBatchArgs),
    /// Concurrent streaming chats through the OpenAI gateway against llama-server's
    /// own OpenAI endpoint (same GGUF, threads and slots): aggregate tok/s, TTFT
    /// p50/p99, ratios; and the gateway's own cost against the NATS client.
    Gateway(BenchGatewayArgs),
    /// Faults under load: workers, a coordinator and nats-server killed during a run
    /// of short requests; outcome counts, recovery per fault, RSS (tests/fleet/chaos.rs, longer).
    Chaos(bench::chaos::BenchChaosArgs),
    /// One coordinator and 1,000 simulated workers over nats-server: decisions/s and
    /// their latency, coordinator RSS/CPU, heartbeat rate; `--fleet mixed`: TTFT under
    /// predicted-TTFT vs block-score routing.
    Routing(bench::routing::BenchRoutingArgs),
    /// MLX through switchyard (NATS + coordinator + a metal worker and its bridge)
    /// against mlx-lm called directly in Python, same Hugging Face directory, same
    /// cold prompts, alternating runs: decode and prefill tok/s, time to first token,
    /// ratios; the CPU engine on the same weights for context. Runs MLX on the CPU
    /// where there is no Apple GPU. Starts its own nats-server unless --nats is given.
    Mlx(bench::mlx::BenchMlxArgs),
    /// Inter-token latency of running streams while a ~1,500-token prompt arrives:
    /// chunked prefill vs whole-prompt prefill vs llama-server.
    Stall(bench::stall::BenchStallArgs),
    /// Bursts of streaming chats at 1×, 4× and 16× the fleet's capacity through the
    /// gateway and the fleet queue, against llama-server with as many slots, same
    /// GGUF: requests served within the deadline, requests/s, TTFT p50/p99, ratios.
    Burst(bench::burst::BenchBurstArgs),
    /// What a JSON schema costs at decode: the CPU engine answering the same chat free
    /// and constrained to a nested schema, alternating runs: decode tok/s and ratio,
    /// per model (default: both reference models).
    Structured(bench::structured::BenchStructuredArgs),
    /// Embeddings throughput: the CPU engine against llama-server's `--embeddings
    /// --pooling mean` on the same GGUF, same threads, one slot each, alternating runs
    /// of the same inputs: inputs/s, ratio, and the lowest cosine between their vectors.
    Embed(bench::embed::BenchEmbedArgs),
    /// Speculative decoding by prompt lookup on tasks whose answers repeat their input
    /// (rewrite, extract, edit code): the CPU engine without and with it, and
    /// llama-server plain and with its n-gram speculation, same GGUF, alternating greedy
    /// runs: decode tok/s, speed-ups, acceptance rates; checks the answers are identical.
    Spec(bench::spec::BenchSpecArgs),
    /// Fetching a model over NATS (JetStream's object store, as workers do) against
    /// the same bytes over plain HTTP on the same host, alternating: MB/s and ratio.
    /// Starts its own JetStream nats-server unless --nats is given.
    Pull(bench::pull::BenchPullArgs),
}

/// `switchyard bench batch`.
#[derive(Args, Debug)]
pub struct BenchBatchArgs {
    /// The worker's settings; --llama-server names the peer's llama-server binary
    /// (default: $SWITCHYARD_LLAMA_SERVER, else what scripts/build-llama-server.sh
    /// built).
    #[command(flatten)]
    pub worker: WorkerFlags,
    /// Concurrent stream counts to measure, comma-separated; the largest is both
    /// sides' slot count.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 8])]
    pub streams: Vec<usize>,
    /// Rounds per stream count and side.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Tokens generated per stream.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u32,
}

/// `switchyard bench gateway`.
#[derive(Args, Debug)]
pub struct BenchGatewayArgs {
    /// The worker's settings; --llama-server names the peer's binary.
    #[command(flatten)]
    pub worker: WorkerFlags,
    /// Concurrent stream counts, comma-separated; the largest is both sides' slots.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8, 32])]
    pub streams: Vec<usize>,
    /// Rounds per stream count and side.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Tokens generated per stream.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
}

/// `switchyard bench kv-routing`.
#[derive(Args, Debug)]
pub struct BenchKvArgs {
    #[command(flatten)]
    pub worker: WorkerFlags,
    /// CPU workers.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Distinct documents (shared prefixes, ~330 tokens each).
    #[arg(long, default_value_t = 3)]
    pub prefixes: usize,
    /// Conversations; conversation c asks about document c % prefixes.
    #[arg(long, default_value_t = 12)]
    pub conversations: usize,
    /// Questions per conversation.
    #[arg(long, default_value_t = 3)]
    pub turns: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 3)]
    pub concurrency: usize,
}

/// `switchyard bench prefix`.
#[derive(Args, Debug)]
pub struct BenchPrefixArgs {
    #[command(flatten)]
    pub worker: WorkerFlags,
    /// Measured runs (one cold and one warm request each).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Paragraphs of ~100 tokens in the shared document.
    #[arg(long, default_value_t = 15)]
    pub paragraphs: usize,
}

/// `switchyard bench fabric`.
#[derive(Args, Debug)]
pub struct BenchFabricArgs {
    #[command(flatten)]
    pub worker: WorkerFlags,
    /// Measured runs of each path (after one warm-up each), alternating; nine pairs
    /// of ~1 s keep one hiccup of a shared machine from moving the medians.
    #[arg(long, default_value_t = 9)]
    pub runs: usize,
    /// Tokens generated per run (greedy; fewer if the model ends its answer).
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
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
    /// rocm/cuda: more llama-server arguments, split on whitespace (e.g. "-fa on").
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
}

/// `switchyard up`.
#[derive(Args, Debug)]
pub struct UpArgs {
    #[command(flatten)]
    pub worker: WorkerFlags,
    #[command(flatten)]
    pub coordinator: CoordinatorFlags,
    /// Once up, answer this prompt (chat) through NATS and print the answer and the
    /// time from start to answer.
    #[arg(long)]
    pub prompt: Option<String>,
    /// With --prompt: exit after answering instead of staying up.
    #[arg(long, requires = "prompt")]
    pub exit_after_prompt: bool,
    #[command(flatten)]
    pub gateway: gateway::UpGatewayFlags,
    /// Start the local nats-server with TLS (a fresh CA) and generated passwords for
    /// three users in the roles of docs/nats-roles.conf; writes a client.toml for
    /// other commands' --config. Not with --nats.
    #[arg(long)]
    pub secure: bool,
}

/// `switchyard coordinator`.
#[derive(Args, Debug)]
pub struct CoordinatorArgs {
    #[command(flatten)]
    pub coordinator: CoordinatorFlags,
}

/// `switchyard worker`.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub worker: WorkerFlags,
}

/// Generation settings for `generate` and `chat`.
#[derive(Args, Debug, Clone)]
pub struct SamplingFlags {
    /// Model name (default: any model the fleet serves).
    #[arg(long, default_value = "")]
    pub model: String,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// Sampling temperature; 0 = greedy. Default: 0 for generate, 0.8 for chat.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Keep only the K most likely tokens (0 = off). Default: off for generate and
    /// greedy chat, 40 for chat.
    #[arg(long)]
    pub top_k: Option<u32>,
    /// Nucleus sampling mass (0 = off). Default: off for generate, 0.95 for chat.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens below this fraction of the best token's probability (0 = off).
    /// Default: off for generate, 0.05 for chat.
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Penalise tokens seen in the last 64 (1 or 0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub repeat_penalty: f32,
    /// Sampling seed, for reproducible sampled output.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this string is generated (not printed); repeatable.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Only use workers of this backend (cpu, llama_cpp, rocm, cuda, metal).
    #[arg(long)]
    pub backend: Option<String>,
    /// Only use this worker id.
    #[arg(long)]
    pub worker: Option<String>,
    /// End with worker_lost when no chunk arrives for this long (ms).
    #[arg(long)]
    pub stall_timeout_ms: Option<u64>,
    /// Print one JSON object with text, tokens, finish reason and metrics instead of
    /// streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub constraint: constrain::ConstraintFlags,
}

/// `switchyard generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The prompt, used as is (no chat template).
    pub prompt: String,
    #[command(flatten)]
    pub sampling: SamplingFlags,
}

/// `switchyard chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    /// The user's message; without it, an interactive session reads lines from stdin.
    pub message: Option<String>,
    /// A system message to start the conversation with.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingFlags,
}

/// `switchyard status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Print the coordinator's answer as JSON (one object; with --watch, one per line
    /// per refresh).
    #[arg(long)]
    pub json: bool,
    /// Refresh every this many milliseconds until interrupted (the table is redrawn in
    /// place); without a value, every 1000 ms.
    #[arg(long, num_args = 0..=1, default_missing_value = "1000", value_name = "MS")]
    pub watch: Option<u64>,
}

impl Command {
    /// The default OpenTelemetry `service.name` of this command's process.
    pub fn service_name(&self) -> &'static str {
        match self {
            Command::Worker(_) => "switchyard-worker",
            Command::Coordinator(_) => "switchyard-coordinator",
            Command::Up(_) => "switchyard",
            Command::Gateway(_) => "switchyard-gateway",
            _ => "switchyard-client",
        }
    }
}

/// Loads the layered configuration and applies the global flags.
pub fn load_config(cli: &Cli) -> anyhow::Result<Config> {
    let mut config = Config::load(cli.config.as_deref(), std::env::vars())?;
    if let Some(url) = &cli.nats {
        config.nats.url = url.clone();
    }
    if let Some(p) = &cli.prefix {
        config.nats.prefix = p.clone();
    }
    cli.security.apply(&mut config);
    Ok(config)
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
        if let Some(v) = &self.speculative {
            w.speculative = v.clone();
        }
        if let Some(v) = self.draft_max {
            w.draft_max = v;
        }
        if let Some(v) = &self.pooling {
            w.pooling = v.clone();
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
