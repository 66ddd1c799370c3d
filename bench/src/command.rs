//! The `switchyard bench …` subcommands: their flags (clap) and what each runs.

use clap::{Args, Subcommand};
use std::process::ExitCode;
use switchyard_config::Config;
use switchyard_node::{self as node, WorkerFlags};

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
    Llama(crate::llama::BenchLlamaArgs),
    /// Whether the native CUDA engine computes what the CPU engine computes: each
    /// reference prompt's greedy tokens teacher-forced through both on the same GGUF,
    /// |Δ log p| and hidden-state cosine against the reference tests' tolerances;
    /// exits 1 when one is missed. Without --cuda the candle pass runs on the CPU.
    Agree(crate::agree::BenchAgreeArgs),
    /// The fabric's cost on the llama.cpp path: the same greedy request straight to a
    /// llama-server and through NATS + coordinator + a llama_cpp worker in front of
    /// that same server, alternating: time to first token and tok/s, ratios. Starts
    /// its own nats-server unless --nats is given.
    #[command(name = "llama-cpp")]
    LlamaCpp(crate::llama::BenchLlamaArgs),
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
    /// A prefix's KV pulled from a peer worker against the same prefix computed: three
    /// workers in this process (a source, one that computes, one that pulls; CPU
    /// workers, supervised llama-servers with --backend rocm --gpu-allow-cpu, or MLX
    /// workers with --backend metal --mlx-allow-cpu --model <HF dir>), new documents of
    /// each --tokens length; time to first token, the pull's own time,
    /// ratios, MB/s. Starts its own nats-server.
    #[command(name = "kv-transfer")]
    KvTransfer(crate::kv_transfer::BenchKvTransferArgs),
    /// Disaggregated prefill/decode against one worker: a prefill, a decode and a whole
    /// CPU worker in this process, new documents of each --tokens length; time to first
    /// token of each, the prefill and pull times, and the longest stall a stream
    /// already running on the target sees while the long prompt is admitted there.
    /// Starts its own nats-server.
    Disagg(crate::kv_moves::BenchKvMovesArgs),
    /// Live hand-over on drain: --streams streams on a long document run on a worker
    /// that is drained (as on SIGTERM) once each has 16 tokens; another worker takes
    /// them. The longest gap the client saw, tokens computed again, tokens pulled, and
    /// the time to first token of recomputing the document instead. Starts its own
    /// nats-server.
    Handover(crate::kv_moves::BenchKvMovesArgs),
    /// A model split into pipeline stages (one worker process per stage, over NATS)
    /// against one worker holding it whole with all their threads, and llama.cpp's
    /// RPC split of the same GGUF given --rpc-server and --rpc-llama-server: decode
    /// tok/s at each stream count, prefill tok/s, time per token, peak RSS per
    /// process. Starts its own nats-server.
    Pipeline(crate::pipeline::BenchPipelineArgs),
    /// KV of 32 streams behind one 1,500-token prompt: shared pages vs a copy per slot.
    Kv(crate::pages::BenchKvPagesArgs),
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
    /// of short requests; outcome counts, recovery per fault, RSS (tests/chaos.rs, longer).
    Chaos(crate::chaos::BenchChaosArgs),
    /// One coordinator and 1,000 simulated workers over nats-server: decisions/s and
    /// their latency, coordinator RSS/CPU, heartbeat rate; `--fleet mixed`: TTFT under
    /// predicted-TTFT vs block-score routing.
    Routing(crate::routing::BenchRoutingArgs),
    /// MLX through switchyard (NATS + coordinator + a metal worker and its bridge)
    /// against mlx-lm called directly in Python, same Hugging Face directory, same
    /// cold prompts, alternating runs: decode and prefill tok/s, time to first token,
    /// ratios; the CPU engine on the same weights for context. Runs MLX on the CPU
    /// where there is no Apple GPU. Starts its own nats-server unless --nats is given.
    Mlx(crate::mlx::BenchMlxArgs),
    /// Inter-token latency of running streams while a ~1,500-token prompt arrives:
    /// chunked prefill vs whole-prompt prefill vs llama-server.
    Stall(crate::stall::BenchStallArgs),
    /// Bursts of streaming chats at 1×, 4× and 16× the fleet's capacity through the
    /// gateway and the fleet queue, against llama-server with as many slots, same
    /// GGUF: requests served within the deadline, requests/s, TTFT p50/p99, ratios.
    Burst(crate::burst::BenchBurstArgs),
    /// What a JSON schema costs at decode: the CPU engine answering the same chat free
    /// and constrained to a nested schema, alternating runs: decode tok/s and ratio,
    /// per model (default: both reference models).
    Structured(crate::structured::BenchStructuredArgs),
    /// Embeddings throughput: the CPU engine against llama-server's `--embeddings
    /// --pooling mean` on the same GGUF, same threads, one slot each, alternating runs
    /// of the same inputs: inputs/s, ratio, and the lowest cosine between their vectors.
    Embed(crate::embed::BenchEmbedArgs),
    /// Speculative decoding by prompt lookup on tasks whose answers repeat their input
    /// (rewrite, extract, edit code): the CPU engine without and with it, and
    /// llama-server plain and with its n-gram speculation, same GGUF, alternating greedy
    /// runs: decode tok/s, speed-ups, acceptance rates; checks the answers are identical.
    Spec(crate::spec::BenchSpecArgs),
    /// What unmerged LoRA adapters cost the CPU engine's decode: a batch of streams
    /// on the bare base model, all on one adapter, and over four adapters, alternating
    /// runs in this process: tok/s and ratios to the base model.
    Lora(crate::lora::BenchLoraArgs),
    /// Fetching a model over NATS (JetStream's object store, as workers do) against
    /// the same bytes over plain HTTP on the same host, alternating: MB/s and ratio.
    /// Starts its own JetStream nats-server unless --nats is given.
    Pull(crate::pull::BenchPullArgs),
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
    /// Workers, of --backend (cpu by default; rocm with --gpu-allow-cpu runs a
    /// llama-server per worker on the CPU).
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
    /// Documents of mixed length: even ones short (~80 tokens), odd ones long (~1,300
    /// tokens, past Gemma 3's 512-token sliding window), and every other turn a
    /// follow-up that continues the previous answer (the KV cache's real holdings
    /// decide what is warm: rings, overwritten slots, the block store).
    #[arg(long)]
    pub mixed: bool,
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

/// Runs one benchmark with the layered configuration (the global flags applied).
pub async fn run(cmd: BenchCommand, mut config: Config) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Llama(args) => {
            let model = args.model.clone().unwrap_or_else(node::demo_model_path);
            let bin = crate::llama_cpp::llama_server_or_build(args.llama_server.as_deref())?;
            let shape = (args.threads, args.runs, args.max_tokens, args.paragraphs);
            crate::llama::llama(&model, &bin, shape, args.cuda).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Agree(args) => {
            let model = args.model.clone().unwrap_or_else(node::demo_model_path);
            let passes = tokio::task::spawn_blocking(move || crate::agree::run(&args, &model)).await??;
            Ok(if passes { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        BenchCommand::LlamaCpp(args) => {
            let model = args.model.clone().unwrap_or_else(node::demo_model_path);
            let bin = crate::llama_cpp::llama_server_or_build(args.llama_server.as_deref())?;
            crate::llama_cpp::llama_cpp(config, &bin, &model, args.threads, args.runs, args.max_tokens).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::KvRouting(args) => {
            args.worker.apply(&mut config);
            config.validate()?;
            let w = crate::kv::Workload {
                workers: args.workers,
                prefixes: args.prefixes,
                conversations: args.conversations,
                turns: args.turns,
                concurrency: args.concurrency,
                mixed: args.mixed,
            };
            crate::kv::kv_routing(config, w).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Prefix(args) => {
            args.worker.apply(&mut config);
            config.validate()?;
            crate::prefix::prefix(config, args.runs, args.paragraphs).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Batch(args) => {
            args.worker.apply(&mut config);
            config.validate()?;
            let bin = crate::llama_cpp::llama_server_or_build(args.worker.llama_server.as_deref())?;
            crate::batch::batch(config, &bin, &args.streams, args.runs, args.max_tokens).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Pipeline(args) => {
            crate::pipeline::run(config, args).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Chaos(args) => crate::chaos::run(config, args).await,
        BenchCommand::Routing(args) => crate::routing::run(config, args).await,
        BenchCommand::Gateway(args) => {
            args.worker.apply(&mut config);
            config.validate()?;
            let bin = crate::llama_cpp::llama_server_or_build(args.worker.llama_server.as_deref())?;
            crate::gateway::gateway(config, &bin, &args.streams, args.runs, args.max_tokens).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Burst(args) => {
            args.worker.apply(&mut config);
            config.validate()?;
            let bin = crate::llama_cpp::llama_server_or_build(args.worker.llama_server.as_deref())?;
            crate::burst::burst(config, &bin, &args).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Mlx(args) => crate::mlx::run(config, &args).await,
        BenchCommand::Pull(args) => crate::pull::run(config, &args).await,
        BenchCommand::Stall(args) => crate::stall::run(&args).await,
        BenchCommand::Embed(args) => {
            let model = args.model.clone().unwrap_or_else(node::demo_model_path);
            let bin = crate::llama_cpp::llama_server_or_build(args.llama_server.as_deref())?;
            crate::embed::embed(&model, &bin, &args).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Structured(args) => {
            let models = match args.model.is_empty() {
                true => crate::structured::default_models(),
                false => args.model.clone(),
            };
            crate::structured::structured(&models, args.threads, args.runs, args.max_tokens).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Lora(args) => {
            let model = args.model.clone().unwrap_or_else(node::demo_model_path);
            crate::lora::run(&args, &model)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::KvTransfer(args) => crate::kv_transfer::run(config, &args).await,
        BenchCommand::Disagg(args) => crate::kv_moves::disagg(config, &args).await,
        BenchCommand::Handover(args) => crate::kv_moves::handover(config, &args).await,
        BenchCommand::Kv(args) => {
            crate::pages::run(&args).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Spec(args) => {
            let bin = crate::llama_cpp::llama_server_or_build(args.llama_server.as_deref())?;
            crate::spec::run(&args, &bin).await?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Fabric(args) => {
            args.worker.apply(&mut config);
            config.validate()?;
            crate::fabric(config, args.runs, args.max_tokens).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
