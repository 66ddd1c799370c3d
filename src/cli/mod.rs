//! Command-line definitions (clap) and dispatch. Every flag is documented here so
//! `--help` explains itself.

mod adapters;
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
pub use switchyard_node::WorkerFlags;
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
    /// Run the HTTP gateway to the fleet: OpenAI's API (chat, completions, embeddings,
    /// responses), Anthropic's Messages API and Ollama's API (docs/gateway.md).
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
    /// List, load and unload a worker's LoRA adapters at run time (the operator's NATS
    /// role; docs/adapters.md).
    Adapters(adapters::AdaptersArgs),
    /// Benchmarks that print ratios against a peer measured in the same run.
    #[command(subcommand)]
    Bench(switchyard_bench::BenchCommand),
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
    /// Run with this LoRA adapter of the model (a name `switchyard models` lists
    /// under it); only workers that have loaded it are asked.
    #[arg(long)]
    pub adapter: Option<String>,
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
