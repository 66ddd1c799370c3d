//! # switchyard-bench — benchmarks that print ratios against a peer measured in the same run
//!
//! The `switchyard bench …` subcommands ([`BenchCommand`], run by [`run`]): each
//! measures switchyard against a peer in the same run (llama-server on the same GGUF,
//! mlx-lm, plain HTTP, the in-process backend) and prints the ratio. The commands,
//! what each measures and the latest figures are in docs/benchmarks.md.
//!
//! `fabric`: the same greedy request through the in-process backend call and through
//! NATS + coordinator + worker (real TCP loopback, real nats-server), alternating, so
//! the difference is the fabric's own cost.

pub mod agree;
pub mod batch;
pub mod burst;
pub mod chaos;
mod command;
pub mod embed;
pub mod gateway;
mod gateway_apis;
mod http_chat;
pub mod kv;
pub mod kv_moves;
pub mod kv_transfer;
pub mod limit;
pub mod link;
pub mod llama;
pub mod llama_cpp;
pub mod lora;
pub mod mlx;
pub mod pages;
pub mod pipeline;
pub mod prefix;
pub mod probe;
pub mod pull;
pub mod routing;
pub mod spec;
pub mod stall;
pub mod structured;

pub use command::{run, BenchCommand};

use futures::StreamExt;
use std::time::{Duration, Instant};
use switchyard_backend::{CancelFlag, GenerateEvent, Prompt, TextModel};
use switchyard_client::{Client, ClientOptions, StreamEvent};
use switchyard_config::Config;
use switchyard_messages::{GenerateConfig, GenerateRequest};
use switchyard_node as node;
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

/// A prompt of roughly 100 tokens that continues for a long time.
pub const BENCH_PROMPT: &str = "The history of the city begins with a small settlement on the banks of a wide river. \
Farmers grew wheat and barley in the fertile soil, and traders arrived by boat to exchange salt, cloth and tools. \
Over the centuries the settlement grew into a market town, then into a walled city with a cathedral, a university \
and a busy harbour. In the nineteenth century, railways and factories transformed the city again, and its \
population doubled within a single generation. Today, visitors can still walk";

/// One run's measurements, taken where the caller sees them.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunTiming {
    /// Time to first token.
    pub ttft: Duration,
    /// Time from the first to the last token.
    pub decode: Duration,
    /// Tokens generated.
    pub tokens: u32,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Prefill time the worker measured.
    pub prefill: Duration,
}

impl RunTiming {
    /// Tokens/s after the first token, as the caller saw them arrive.
    pub fn decode_tps(&self) -> f64 {
        if self.decode.is_zero() {
            0.0
        } else {
            self.tokens.saturating_sub(1) as f64 / self.decode.as_secs_f64()
        }
    }
    /// Prefill tokens/s as the worker measured it.
    pub fn prefill_tps(&self) -> f64 {
        if self.prefill.is_zero() {
            0.0
        } else {
            self.prompt_tokens as f64 / self.prefill.as_secs_f64()
        }
    }
}

/// Times one run as the caller sees tokens arrive.
struct RunClock {
    start: Instant,
    first: Option<Instant>,
    last: Instant,
    timing: RunTiming,
}

impl RunClock {
    fn start() -> Self {
        let now = Instant::now();
        Self {
            start: now,
            first: None,
            last: now,
            timing: RunTiming::default(),
        }
    }

    /// `n` tokens arrived now.
    fn tokens(&mut self, n: u32) {
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = now;
        self.timing.tokens += n;
    }

    /// The final metrics arrived.
    fn done(&mut self, metrics: &switchyard_messages::GenerateMetrics) {
        self.timing.prompt_tokens = metrics.prompt_tokens;
        self.timing.prefill = Duration::from_micros(metrics.prefill_us);
    }

    fn finish(mut self) -> RunTiming {
        let first = self.first.unwrap_or(self.last);
        self.timing.ttft = first - self.start;
        self.timing.decode = self.last - first;
        self.timing
    }
}

/// Median of `xs` (sorted copy).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

/// A one-worker fleet in this process for benchmarks: its own nats-server unless
/// `nats.url` is set, a coordinator, the configured worker, and a client that has
/// seen the worker.
pub struct LocalNode {
    _nats: Option<NatsServer>,
    /// The coordinator.
    pub coordinator: switchyard_coordinator::CoordinatorHandle,
    /// The loaded model.
    pub loaded: node::Loaded,
    /// The worker.
    pub worker: switchyard_workers::WorkerHandle,
    /// A client of the fleet.
    pub client: Client,
    /// The configuration, with `nats.url` filled in.
    pub config: Config,
}

impl LocalNode {
    /// Starts it and waits until the coordinator routes to the worker.
    pub async fn start(mut config: Config) -> anyhow::Result<Self> {
        let nats = if config.nats.url.is_empty() {
            let s = NatsServer::start(&find_nats_server(&config.nats.server_bin)?)?;
            config.nats.url = s.url();
            Some(s)
        } else {
            None
        };
        let coordinator = node::start_coordinator(&config).await?;
        let loaded = node::load(&config).await?;
        let worker = node::start_worker(&config, &loaded).await?;
        let opts = ClientOptions {
            prefix: config.nats.prefix.clone(),
            security: config.nats.security(),
            ..ClientOptions::default()
        };
        let client = Client::connect_with(&config.nats.url, opts).await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.status().await.map(|s| s.workers.is_empty()).unwrap_or(true) {
            if Instant::now() > deadline {
                anyhow::bail!("the coordinator did not see the worker within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Self {
            _nats: nats,
            coordinator,
            loaded,
            worker,
            client,
            config,
        })
    }

    /// The nats-server this node started (`None` when it uses `nats.url`).
    pub fn nats_pid(&self) -> Option<u32> {
        self._nats.as_ref().map(NatsServer::pid)
    }

    /// Shuts the worker, its model and the coordinator down.
    pub async fn stop(mut self) {
        self.worker.shutdown(Duration::from_secs(5)).await;
        self.loaded.stop();
        self.coordinator.shutdown().await;
    }
}

/// CPU use beside the compute threads (Linux `/proc`; zeros elsewhere): what the
/// fabric takes from them, counted in CPU time and wake-ups rather than wall time,
/// so a busy shared machine blurs it less.
#[derive(Debug, Clone, Copy, Default)]
struct FabricCpu {
    /// Run by this process's threads other than the engine's (`sy-compute-*`,
    /// `sy-engine`), i.e. tokio's (worker service, client, coordinator), plus every
    /// thread of process `nats`, µs.
    us: f64,
    /// Of `us`, nats-server's.
    nats_us: f64,
    /// Times those threads were put on a CPU (each one a wake-up).
    wakeups: f64,
    /// Times the compute threads were taken off a CPU while runnable.
    preempted: f64,
}

impl FabricCpu {
    /// The counters now, totals since each thread started.
    fn now(nats: Option<u32>) -> Self {
        let mut total = Self::default();
        for t in switchyard_fabric::host::threads(None) {
            if t.name.starts_with("sy-compute") {
                total.preempted += t.preempted as f64;
            } else if !t.name.starts_with("sy-engine") {
                total.us += t.ran_ns as f64 / 1e3;
                total.wakeups += t.slices as f64;
            }
        }
        for t in nats
            .map(|pid| switchyard_fabric::host::threads(Some(pid)))
            .unwrap_or_default()
        {
            total.us += t.ran_ns as f64 / 1e3;
            total.nats_us += t.ran_ns as f64 / 1e3;
            total.wakeups += t.slices as f64;
        }
        total
    }

    /// What was used since `before`, per token of `tokens`.
    fn per_token_since(self, before: Self, tokens: u32) -> Self {
        let n = f64::from(tokens.max(1));
        Self {
            us: (self.us - before.us).max(0.0) / n,
            nats_us: (self.nats_us - before.nats_us).max(0.0) / n,
            wakeups: (self.wakeups - before.wakeups).max(0.0) / n,
            preempted: (self.preempted - before.preempted).max(0.0) / n,
        }
    }
}

/// Runs the fabric benchmark and prints the report.
pub async fn fabric(config: Config, runs: usize, max_tokens: u32) -> anyhow::Result<()> {
    let local = LocalNode::start(config).await?;
    let (model, name, client, config) = (
        local.loaded.model.clone(),
        local.loaded.name.clone(),
        local.client.clone(),
        local.config.clone(),
    );
    let gen_config = GenerateConfig {
        max_tokens,
        ..GenerateConfig::default()
    };

    // Every run gets a prompt of its own from the first token on, so prefill is cold
    // on both paths (the same prompt repeated measured a warm prefix: 21,878 tok/s).
    let prompt = |n: usize| format!("{n} {BENCH_PROMPT}");
    let direct = |cfg: GenerateConfig, text: String| {
        let model = model.clone();
        async move {
            let mut clock = RunClock::start();
            let mut events = model.generate(Prompt::Text(text), cfg, CancelFlag::new());
            while let Some(ev) = events.next().await {
                match ev? {
                    GenerateEvent::Token(_) => clock.tokens(1),
                    GenerateEvent::Done { metrics, .. } => clock.done(&metrics),
                }
            }
            anyhow::Ok(clock.finish())
        }
    };
    let fabric = |cfg: GenerateConfig, text: String| {
        let client = client.clone();
        let name = name.clone();
        async move {
            let mut req = GenerateRequest::generate(Client::new_request_id(), name, text);
            req.config = cfg;
            let mut clock = RunClock::start();
            let mut stream = client.generate(req).await?;
            // Chunks that carried tokens (the worker coalesces tokens that come
            // close together, `worker.coalesce_ms`).
            let mut chunks = 0u32;
            while let Some(ev) = stream.next().await {
                match ev? {
                    StreamEvent::Tokens(tokens) => {
                        chunks += 1;
                        clock.tokens(tokens.len() as u32)
                    }
                    StreamEvent::Done { metrics, .. } => clock.done(&metrics),
                }
            }
            anyhow::Ok((clock.finish(), chunks))
        }
    };
    eprintln!("warming up …");
    direct(gen_config.clone(), prompt(0)).await?;
    fabric(gen_config.clone(), prompt(1)).await?;
    let mut d = Vec::new();
    let mut f = Vec::new();
    let mut f_chunks = Vec::new();
    let (mut d_cpu, mut f_cpu) = (Vec::new(), Vec::new());
    let nats_pid = local.nats_pid();
    for i in 0..runs {
        eprintln!("run {}/{runs}", i + 1);
        let (pd, pf) = (prompt(2 + 2 * i), prompt(3 + 2 * i));
        // Alternate the order so drift on a shared machine hits both equally.
        let timed_direct = |text| async {
            let before = FabricCpu::now(nats_pid);
            let run = direct(gen_config.clone(), text).await?;
            let cpu = FabricCpu::now(nats_pid).per_token_since(before, run.tokens);
            anyhow::Ok((run, cpu))
        };
        let timed_fabric = |text| async {
            let before = FabricCpu::now(nats_pid);
            let (run, chunks) = fabric(gen_config.clone(), text).await?;
            let cpu = FabricCpu::now(nats_pid).per_token_since(before, run.tokens);
            anyhow::Ok((run, chunks, cpu))
        };
        let ((dr, dc), (fr, chunks, fc)) = if i % 2 == 0 {
            let dr = timed_direct(pd).await?;
            (dr, timed_fabric(pf).await?)
        } else {
            let fr = timed_fabric(pf).await?;
            (timed_direct(pd).await?, fr)
        };
        d.push(dr);
        d_cpu.push(dc);
        f_cpu.push(fc);
        f.push(fr);
        f_chunks.push(f64::from(fr.tokens) / f64::from(chunks.max(1)));
    }
    let col = |xs: &[RunTiming], g: fn(&RunTiming) -> f64| median(&xs.iter().map(g).collect::<Vec<_>>());
    let (d_dec, f_dec) = (col(&d, RunTiming::decode_tps), col(&f, RunTiming::decode_tps));
    let (d_pre, f_pre) = (col(&d, RunTiming::prefill_tps), col(&f, RunTiming::prefill_tps));
    let (d_ttft, f_ttft) = (
        col(&d, |t| t.ttft.as_secs_f64() * 1e3),
        col(&f, |t| t.ttft.as_secs_f64() * 1e3),
    );
    let tokens = d[0].tokens;
    let prompt_tokens = d[0].prompt_tokens;
    let us_per_token = (1e6 / f_dec - 1e6 / d_dec).max(0.0);
    println!(
        "fabric benchmark: {name}, cold prompts of {prompt_tokens} tokens (each run its own), {tokens} generated, greedy, {runs} runs each (medians)"
    );
    println!("{:<28} {:>14} {:>14} {:>10}", "", "in-process", "via NATS", "ratio");
    println!(
        "{:<28} {:>14.1} {:>14.1} {:>10.3}",
        "decode tok/s (client-seen)",
        d_dec,
        f_dec,
        f_dec / d_dec
    );
    println!(
        "{:<28} {:>14.1} {:>14.1} {:>10.3}",
        "prefill tok/s (worker)",
        d_pre,
        f_pre,
        f_pre / d_pre
    );
    println!(
        "{:<28} {:>14.2} {:>14.2} {:>10.3}",
        "time to first token ms",
        d_ttft,
        f_ttft,
        f_ttft / d_ttft
    );
    // Each pair ran back to back, so its ratio is less exposed to drift on a shared
    // machine than the ratio of the two columns' medians.
    let paired: Vec<f64> = d.iter().zip(&f).map(|(d, f)| f.decode_tps() / d.decode_tps()).collect();
    println!(
        "fabric overhead: {:.2}% of decode throughput ({:.2}% by the median pair), {:.0} µs/token, {:.2} ms on time to first token",
        (1.0 - f_dec / d_dec) * 100.0,
        (1.0 - median(&paired)) * 100.0,
        us_per_token,
        f_ttft - d_ttft
    );
    let shown: Vec<String> = paired.iter().map(|r| format!("{r:.3}")).collect();
    println!(
        "decode ratio of each back-to-back pair: {} (median {:.3})",
        shown.join(" "),
        median(&paired)
    );
    println!(
        "via NATS: {:.2} tokens per chunk (median; worker.coalesce_ms = {}); {} async runtime thread(s) (worker.async_threads)",
        median(&f_chunks),
        config.worker.coalesce_ms,
        tokio::runtime::Handle::current().metrics().num_workers()
    );
    let cpu = |xs: &[FabricCpu], g: fn(&FabricCpu) -> f64| median(&xs.iter().map(g).collect::<Vec<_>>());
    if cpu(&f_cpu, |c| c.us) > 0.0 {
        println!(
            "CPU beside the compute threads (tokio: worker service, client, coordinator; nats-server): \
             {:.0} µs/token via NATS (nats-server {:.0}) vs {:.0} µs/token in-process (medians)",
            cpu(&f_cpu, |c| c.us),
            cpu(&f_cpu, |c| c.nats_us),
            cpu(&d_cpu, |c| c.us)
        );
        println!(
            "per token: {:.2} wake-ups of those threads via NATS vs {:.2} in-process; \
             compute threads preempted {:.2} vs {:.2} times (medians)",
            cpu(&f_cpu, |c| c.wakeups),
            cpu(&d_cpu, |c| c.wakeups),
            cpu(&f_cpu, |c| c.preempted),
            cpu(&d_cpu, |c| c.preempted)
        );
    }
    // The fabric alone: a compute-free probe model behind a second worker.
    let mut probe_cfg = config.clone();
    probe_cfg.worker.id = "fabric-probe".into();
    let probe_worker = probe::start_worker(&probe_cfg).await?;
    while client
        .status()
        .await
        .map(|s| s.workers.iter().all(|w| w.status.worker_id != "fabric-probe"))
        .unwrap_or(true)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let probe_tokens = 1000u32;
    let probe_cfg_gen = GenerateConfig {
        max_tokens: probe_tokens,
        ..GenerateConfig::default()
    };
    let mut per_token = Vec::new();
    let mut first_chunk = Vec::new();
    let mut probe_chunk = Vec::new();
    for _ in 0..runs.max(3) {
        let mut req = GenerateRequest::generate(Client::new_request_id(), "fabric-probe", "x");
        req.config = probe_cfg_gen.clone();
        let start = Instant::now();
        let mut stream = client.generate(req).await?;
        let mut first = None;
        let mut n = 0u32;
        let mut chunks = 0u32;
        while let Some(ev) = stream.next().await {
            if let StreamEvent::Tokens(t) = ev? {
                first.get_or_insert_with(Instant::now);
                n += t.len() as u32;
                chunks += 1;
            }
        }
        let total = start.elapsed();
        let first = first.map(|f| f - start).unwrap_or(total);
        first_chunk.push(first.as_secs_f64() * 1e6);
        per_token.push((total - first).as_secs_f64() * 1e6 / f64::from(n.max(2) - 1));
        probe_chunk.push(f64::from(n) / f64::from(chunks.max(1)));
    }
    let mut in_process = Vec::new();
    for _ in 0..runs.max(3) {
        let start = Instant::now();
        let mut events =
            probe::FabricProbe.generate(Prompt::Text("x".into()), probe_cfg_gen.clone(), CancelFlag::new());
        while events.next().await.is_some() {}
        in_process.push(start.elapsed().as_secs_f64() * 1e6 / f64::from(probe_tokens));
    }
    println!(
        "fabric alone (fabric-probe, a compute-free fake model; {probe_tokens} tokens, medians): \
         {:.1} µs/token via NATS + coordinator + worker vs {:.2} µs/token in-process; \
         request to first token {:.0} µs; {:.1} tokens per chunk (all are ready at once)",
        median(&per_token),
        median(&in_process),
        median(&first_chunk),
        median(&probe_chunk)
    );
    probe_worker.shutdown(Duration::from_secs(5)).await;
    local.stop().await;
    Ok(())
}

/// A model loaded in switchyard's engine on its own CPU kernels, as the `cpu` backend
/// would load it (an embedding model or a decoder).
pub(crate) fn engine_model(
    path: &std::path::Path,
    load: &switchyard_messages::LoadConfig,
) -> Result<std::sync::Arc<dyn switchyard_backend::TextModel>, switchyard_backend::BackendError> {
    switchyard_workers::engine::load_model(path, load, switchyard_workers::engine::ForwardPass::Own)
}
