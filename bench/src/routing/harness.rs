//! What both fleets of `bench routing` share: the coordinator child process and its
//! report, clients, and the statistics printed.

use anyhow::Context;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use switchyard_client::{Client, ClientError, ClientOptions};
use switchyard_config::Config;
use switchyard_coordinator::stats::StatsSnapshot;
use switchyard_node as node;
use switchyard_procs::nats_server::kill_with_parent;

/// The model the simulated workers serve.
pub const MODEL: &str = "sim-model";

fn stats_subject(prefix: &str) -> String {
    format!("{prefix}.bench.routing.stats")
}

/// What the coordinator process says about itself.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CoordinatorReport {
    /// Its actor's counters.
    pub stats: StatsSnapshot,
    /// Resident memory now, bytes.
    pub rss: u64,
    /// Peak resident memory, bytes.
    pub peak_rss: u64,
    /// User + system CPU time since it started, microseconds.
    pub cpu_us: u64,
}

fn cpu_time_us() -> u64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}

/// The child: a coordinator as `switchyard coordinator` runs it, plus a responder
/// for its counters.
pub async fn serve_coordinator(mut config: Config, routing: Option<&str>) -> anyhow::Result<ExitCode> {
    if let Some(r) = routing {
        config.coordinator.routing = r.parse().map_err(anyhow::Error::msg)?;
    }
    config.validate()?;
    let stop = node::shutdown_signal(Duration::from_secs(10));
    let coordinator = node::start_coordinator(&config).await?;
    let stats = coordinator.stats();
    let nats = switchyard_fabric::nats::connect(
        &config.nats.url,
        &config.nats.security(),
        "bench-routing",
        Duration::from_secs(10),
    )
    .await?;
    let mut asks = nats.subscribe(stats_subject(&config.nats.prefix)).await?;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(msg) = asks.next() => {
                let (peak_rss, rss) = switchyard_fabric::host::process_memory(None);
                let report = CoordinatorReport { stats: stats.snapshot(), rss, peak_rss, cpu_us: cpu_time_us() };
                if let Some(reply) = msg.reply {
                    let _ = nats.publish(reply, rmp_serde::to_vec_named(&report)?.into()).await;
                }
            }
        }
    }
    coordinator.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// The coordinator child process.
pub struct CoordinatorProc {
    child: Child,
    nats: async_nats::Client,
    subject: String,
}

impl CoordinatorProc {
    /// Starts it with `routing` (or the config's) and waits until it answers.
    pub async fn start(
        url: &str,
        prefix: &str,
        routing: Option<&str>,
        nats: async_nats::Client,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("finding this binary")?;
        let mut cmd = Command::new(exe);
        cmd.args([
            "--nats",
            url,
            "--prefix",
            prefix,
            "bench",
            "routing",
            "--serve-coordinator",
        ]);
        if let Some(r) = routing {
            cmd.args(["--routing", r]);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
        kill_with_parent(&mut cmd);
        let child = cmd.spawn().context("starting the coordinator process")?;
        let me = Self {
            child,
            nats,
            subject: stats_subject(prefix),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while me.report().await.is_err() {
            anyhow::ensure!(Instant::now() < deadline, "the coordinator did not come up within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(me)
    }

    /// Its counters, memory and CPU time now.
    pub async fn report(&self) -> anyhow::Result<CoordinatorReport> {
        let ask = self.nats.request(self.subject.clone(), Vec::new().into());
        let msg = tokio::time::timeout(Duration::from_secs(5), ask)
            .await
            .context("the coordinator's report timed out")??;
        Ok(rmp_serde::from_slice(&msg.payload)?)
    }

    /// Stops it (SIGTERM, then SIGKILL after 5 s).
    pub async fn stop(mut self) {
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A client for the benchmark's own nats-server.
pub async fn client(url: &str, prefix: &str) -> anyhow::Result<Client> {
    let opts = ClientOptions {
        prefix: prefix.to_string(),
        stall_timeout: Duration::from_secs(60),
        resume_attempts: 0,
        ..ClientOptions::default()
    };
    Ok(Client::connect_with(url, opts).await?)
}

/// The `p`-quantile of `xs` (sorted in place).
pub fn quantile(xs: &mut [Duration], p: f64) -> Duration {
    xs.sort_unstable();
    if xs.is_empty() {
        return Duration::ZERO;
    }
    xs[((xs.len() as f64 * p).ceil() as usize).clamp(1, xs.len()) - 1]
}

/// A request's failure, by code.
pub fn error_label(e: &ClientError) -> String {
    match e {
        ClientError::Remote { error, .. } => error.code.as_str().to_string(),
        other => format!("client: {other}"),
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Waits until the coordinator knows `n` workers and has applied `n` snapshots.
pub async fn wait_loaded(coordinator: &CoordinatorProc, client: &Client, n: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = coordinator.report().await?;
        if r.stats.snapshots.count >= n as u64 && client.status().await.map(|s| s.workers.len()).unwrap_or(0) >= n {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the coordinator did not load {n} workers within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
