//! `switchyard bench kv-transfer`: a prefix pulled from a peer against the same
//! prefix computed, through NATS + coordinator + workers in this process (CPU
//! workers, or any backend the worker flags name: supervised llama-servers too). Three
//! workers serve one model: `src` computes each run's new document (its first line is
//! unique), then the same request goes to `cmp` (pulls turned off: it computes the
//! whole prompt) and to `pull` (it pulls the document's KV from `src` and computes
//! only the last block), alternating which goes first. Prints, per prefix length, the
//! medians of time to first token and of the pull itself, their ratio, the KV moved
//! and its rate. One compute at a time: the workers share the host's cores.

use super::link::{Link, LinkSpec};
use super::median;
use super::prefix::document;
use anyhow::Context;
use clap::Args;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use switchyard_client::{Client, ClientOptions, StreamEvent};
use switchyard_config::Config;
use switchyard_messages::{GenerateMetrics, GenerateRequest, WorkerRole};
use switchyard_node::{self as node, WorkerFlags};
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

/// `switchyard bench kv-transfer`.
#[derive(Args, Debug)]
pub struct BenchKvTransferArgs {
    #[command(flatten)]
    pub worker: WorkerFlags,
    /// Prefix lengths to measure, in tokens (about; a document of ~100-token parts).
    #[arg(long, value_delimiter = ',', default_value = "1500,6000")]
    pub tokens: Vec<usize>,
    /// Measured runs per length (each a new document).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Puts `src` on a second "host": a network namespace whose link to this one has
    /// this round trip and rate, e.g. `1ms,1gbit` (needs root, `ip` and `tc`; see
    /// docs/benchmarks.md). Without it every worker is on loopback NATS.
    #[arg(long, value_name = "RTT,RATE")]
    pub link: Option<LinkSpec>,
}

/// Sends `prompt` to `worker` and returns (time to first token, metrics).
pub(crate) async fn ask(
    client: &Client,
    name: &str,
    worker: &str,
    prompt: String,
) -> anyhow::Result<(Duration, GenerateMetrics)> {
    let mut req = GenerateRequest::generate(Client::new_request_id(), name, prompt);
    req.head.worker = Some(worker.into());
    req.config.max_tokens = 2;
    let start = Instant::now();
    let mut stream = client.generate(req).await?;
    let mut first = None;
    while let Some(ev) = stream.next().await {
        match ev? {
            StreamEvent::Tokens(t) if !t.is_empty() => {
                first.get_or_insert_with(|| start.elapsed());
            }
            StreamEvent::Tokens(_) => {}
            StreamEvent::Done { metrics, .. } => return Ok((first.unwrap_or_else(|| start.elapsed()), metrics)),
        }
    }
    anyhow::bail!("the stream ended without a final event")
}

/// Waits until every worker's heartbeat shows nothing running (its KV event landed).
pub(crate) async fn settle(client: &Client) -> anyhow::Result<()> {
    let before: Vec<u64> = client.status().await?.workers.iter().map(|w| w.status.seq).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = client.status().await?;
        let fresh = s.workers.len() == before.len()
            && s.workers
                .iter()
                .zip(&before)
                .all(|(w, seq)| w.status.seq > *seq && w.status.in_flight + w.status.queued == 0);
        if fresh {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("the workers did not settle within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A nats-server, a coordinator and CPU workers in this process, for the KV benches;
/// with a [`Link`], workers may also live behind it ([`BenchFleet::add_far`]).
pub(crate) struct BenchFleet {
    nats: NatsServer,
    coordinator: switchyard_coordinator::CoordinatorHandle,
    pub workers: Vec<(switchyard_workers::WorkerHandle, node::Loaded)>,
    /// Workers behind the link: each runs on its own runtime in the namespace until
    /// its sender is dropped.
    far: Vec<(
        tokio::sync::oneshot::Sender<()>,
        std::thread::JoinHandle<anyhow::Result<()>>,
    )>,
    pub client: Client,
    /// The model's name.
    pub name: String,
    config: Config,
    link: Option<Link>,
}

impl BenchFleet {
    /// Starts workers `(id, role, pulls)` and waits until each announces its KV
    /// format; makes the link to a second "host" when `link` is given.
    pub async fn start_linked(
        mut config: Config,
        workers: &[(&str, WorkerRole, bool)],
        link: Option<LinkSpec>,
    ) -> anyhow::Result<Self> {
        let nats = NatsServer::start(&find_nats_server(&config.nats.server_bin)?)?;
        let link = link.map(|spec| Link::up(spec, nats.port())).transpose()?;
        config.nats.url = nats.url();
        config.worker.heartbeat_ms = 200;
        config.validate()?;
        let coordinator = node::start_coordinator(&config).await?;
        let client = Client::connect_with(
            &config.nats.url,
            ClientOptions {
                stall_timeout: Duration::from_secs(600),
                ..ClientOptions::default()
            },
        )
        .await?;
        let mut fleet = Self {
            nats,
            coordinator,
            workers: Vec::new(),
            far: Vec::new(),
            client,
            name: String::new(),
            config,
            link,
        };
        for &(id, role, pull) in workers {
            fleet.add(id, role, pull).await?;
        }
        Ok(fleet)
    }

    /// Starts one more worker and waits until the fleet knows its KV format.
    pub async fn add(&mut self, id: &str, role: WorkerRole, pull: bool) -> anyhow::Result<()> {
        let mut c = self.config.clone();
        c.worker.id = id.into();
        c.worker.role = role;
        c.worker.kv_pull = pull;
        let loaded = node::load(&c).await?;
        self.name = loaded.name.clone();
        self.workers.push((node::start_worker(&c, &loaded).await?, loaded));
        self.known(id).await
    }

    /// Starts one more worker behind the link (its NATS connection crosses it) and
    /// waits until the fleet knows its KV format.
    pub async fn add_far(&mut self, id: &str, role: WorkerRole, pull: bool) -> anyhow::Result<()> {
        let link = self.link.as_ref().context("add_far without a link")?;
        let mut c = self.config.clone();
        c.worker.id = id.into();
        c.worker.role = role;
        c.worker.kv_pull = pull;
        c.nats.url = link.url();
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = link.spawn(async move {
            let mut loaded = match node::load(&c).await {
                Ok(l) => l,
                Err(e) => return drop(started_tx.send(Err(e))),
            };
            let name = loaded.name.clone();
            match node::start_worker(&c, &loaded).await {
                Ok(worker) => {
                    let _ = started_tx.send(Ok(name));
                    let _ = stopped.await;
                    worker.shutdown(Duration::from_secs(5)).await;
                }
                Err(e) => drop(started_tx.send(Err(e))),
            }
            loaded.stop();
        });
        match started.await {
            Ok(Ok(name)) => self.name = name,
            Ok(Err(e)) => return Err(e.context(format!("worker {id} behind the link"))),
            Err(_) => anyhow::bail!("worker {id} behind the link: {:?}", thread.join()),
        }
        self.far.push((stop, thread));
        self.known(id).await
    }

    /// Waits until the fleet knows worker `id`'s KV format.
    async fn known(&self, id: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let s = self.client.status().await?;
            let known = |w: &switchyard_messages::WorkerView| {
                w.status.worker_id == id && w.status.models[0].kv_format.is_some()
            };
            if s.workers.iter().any(known) {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("worker {id} did not announce a KV format within 120 s (hashing the model)");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// KV bytes per token of the model.
    pub async fn token_bytes(&self) -> anyhow::Result<usize> {
        let format = self.client.status().await?.workers[0].status.models[0]
            .kv_format
            .clone();
        Ok(format.map_or(0, |f| f.token_bytes()))
    }

    pub async fn stop(self) {
        for (w, mut loaded) in self.workers {
            w.shutdown(Duration::from_secs(5)).await;
            loaded.stop();
        }
        for (stop, thread) in self.far {
            drop(stop);
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        self.coordinator.shutdown().await;
        drop(self.client);
        drop(self.nats);
        drop(self.link);
    }
}

/// Runs the comparison.
pub async fn run(mut config: Config, args: &BenchKvTransferArgs) -> anyhow::Result<ExitCode> {
    args.worker.apply(&mut config);
    let both = WorkerRole::Both;
    let mut fleet = BenchFleet::start_linked(config, &[("cmp", both, false), ("pull", both, true)], args.link).await?;
    match args.link {
        Some(_) => fleet.add_far("src", both, true).await?,
        None => fleet.add("src", both, true).await?,
    }
    let (client, name) = (&fleet.client, fleet.name.clone());
    let token_bytes = fleet.token_bytes().await?;
    let path = match args.link {
        Some(spec) => format!("src behind a link of {spec} (tbf + a delaying relay)"),
        None => "loopback NATS".into(),
    };
    println!(
        "kv-transfer: {name}, {} KB of KV per token, {path}, {} runs per length (medians)",
        token_bytes / 1024,
        args.runs
    );
    println!(
        "{:>7} {:>9} {:>13} {:>13} {:>10} {:>11} {:>9} {:>9}",
        "tokens", "KV MB", "recompute ms", "pull TTFT ms", "pull ms", "recompute/", "MB/s", "pulled"
    );
    println!(
        "{:>7} {:>9} {:>13} {:>13} {:>10} {:>11}",
        "", "", "(TTFT)", "", "", "pull TTFT"
    );
    let mut run = 0;
    for &tokens in &args.tokens {
        let (mut cold, mut pulled, mut pull_ms, mut got) = (Vec::new(), Vec::new(), Vec::new(), (0, 0));
        for i in 0..args.runs + 1 {
            run += 1;
            eprintln!(
                "{tokens} tokens: run {i}/{} {}",
                args.runs,
                if i == 0 { "(warm-up)" } else { "" }
            );
            let prompt = format!("{}\nQuestion: what came first?\nAnswer:", document(run, tokens / 100));
            ask(client, &name, "src", prompt.clone()).await?;
            settle(client).await?;
            let order: [&str; 2] = if i % 2 == 0 { ["cmp", "pull"] } else { ["pull", "cmp"] };
            for w in order {
                let (ttft, m) = ask(client, &name, w, prompt.clone()).await?;
                settle(client).await?;
                if i == 0 {
                    continue;
                }
                if w == "cmp" {
                    cold.push(ttft.as_secs_f64() * 1e3);
                } else {
                    if m.pulled_tokens == 0 {
                        eprintln!("note: nothing was pulled ({m:?})");
                    }
                    pulled.push(ttft.as_secs_f64() * 1e3);
                    pull_ms.push(m.pull_us as f64 / 1e3);
                    got = (m.pulled_tokens, m.prompt_tokens);
                }
            }
        }
        let (c, p, pm) = (median(&cold), median(&pulled), median(&pull_ms));
        let mb = (got.0 as usize * token_bytes) as f64 / 1e6;
        println!(
            "{:>7} {:>9.1} {:>13.1} {:>13.1} {:>10.1} {:>10.1}× {:>9.0} {:>9}",
            got.1,
            mb,
            c,
            p,
            pm,
            c / p,
            mb / (pm / 1e3),
            got.0
        );
    }
    fleet.stop().await;
    Ok(ExitCode::SUCCESS)
}
