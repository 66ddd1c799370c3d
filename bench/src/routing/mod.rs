//! `switchyard bench routing`: one coordinator against a simulated fleet over a real
//! nats-server. The coordinator is a child process of this binary (so its memory and
//! CPU time are its own) and reports its actor's counters on a benchmark-only subject;
//! every simulated worker is played by one simulator ([`sim`]) in this process, which
//! is also the client.
//!
//! - `--fleet big` (default): 1,000 *simulated workers (no model)*, each holding a
//!   few thousand KV blocks drawn from shared system prompts and documents ([`corpus`]),
//!   heartbeating every second; 10,000 requests with shared prefixes. Reports routing
//!   decisions/s and their latency inside the coordinator, end-to-end request latency,
//!   the coordinator's RSS and CPU time, and how fast it applies heartbeats.
//! - `--fleet mixed` ([`mixed`]): fast and slow simulated workers whose time to first
//!   token follows a model; the same requests under predicted-TTFT and block-score
//!   routing, TTFT compared.

pub mod big;
pub mod corpus;
pub mod harness;
pub mod mixed;
pub mod sim;

use clap::{Args, ValueEnum};
use std::process::ExitCode;
use std::time::Duration;
use switchyard_config::Config;
use switchyard_config::RoutingPolicy;

/// Which simulated fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FleetKind {
    /// 1,000 simulated workers (no model): the coordinator's own cost.
    Big,
    /// Fast and slow simulated workers with modelled TTFT: routing policies compared.
    Mixed,
}

/// `switchyard bench routing`.
#[derive(Args, Debug)]
pub struct BenchRoutingArgs {
    /// `big`: 1,000 simulated workers (no model) that answer at once — the
    /// coordinator's own cost per decision, heartbeat and KV event. `mixed`: fast and
    /// slow simulated workers whose time to first token follows a model —
    /// predicted-TTFT against block-score routing on the same requests.
    #[arg(long, value_enum, default_value = "big")]
    pub fleet: FleetKind,
    /// Simulated workers (default: big 1000, mixed 32).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Requests (default: big 10000; mixed 2000 per policy and round).
    #[arg(long)]
    pub requests: Option<usize>,
    /// big: requests in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// big: KV blocks each simulated worker holds, drawn from the shared documents.
    #[arg(long, default_value_t = 3000)]
    pub blocks_per_worker: usize,
    /// Heartbeat period of every simulated worker, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// big: heartbeats of every worker published back to back, to measure how fast
    /// the coordinator applies them.
    #[arg(long, default_value_t = 20)]
    pub blast_rounds: usize,
    /// big: the coordinator's routing policy, `ttft` or `blocks` (default: the config's).
    #[arg(long)]
    pub routing: Option<String>,
    /// mixed: rounds; each runs both policies on the same requests, in alternating order.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// mixed: arrival rate, as a fraction of the fleet's modelled capacity.
    #[arg(long, default_value_t = 0.6)]
    pub load: f64,
    /// (internal) Run as the benchmark's coordinator process.
    #[arg(long, hide = true)]
    pub serve_coordinator: bool,
}

/// Runs the benchmark (or, with `--serve-coordinator`, its coordinator).
pub async fn run(config: Config, a: BenchRoutingArgs) -> anyhow::Result<ExitCode> {
    if a.serve_coordinator {
        return harness::serve_coordinator(config, a.routing.as_deref()).await;
    }
    let policy: Option<RoutingPolicy> = a
        .routing
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let heartbeat = Duration::from_millis(a.heartbeat_ms);
    match a.fleet {
        FleetKind::Big => {
            let plan = big::Plan {
                workers: a.workers.unwrap_or(1000),
                requests: a.requests.unwrap_or(10_000) as u64,
                concurrency: a.concurrency.max(1),
                blocks_per_worker: a.blocks_per_worker,
                heartbeat,
                blast_rounds: a.blast_rounds,
                policy: policy.unwrap_or(config.coordinator.routing),
            };
            big::run(config, plan).await?
        }
        FleetKind::Mixed => {
            let plan = mixed::Plan {
                workers: a.workers.unwrap_or(32).max(2),
                requests: a.requests.unwrap_or(2_000),
                rounds: a.rounds.max(1),
                load: a.load,
                heartbeat,
            };
            mixed::run(config, plan).await?
        }
    }
    Ok(ExitCode::SUCCESS)
}
