//! `bench routing --fleet big` (the default): one coordinator and 1,000 simulated
//! workers (no model) that answer at once, so what is measured is the coordinator's
//! own cost per decision, heartbeat and KV event, its memory and CPU time.

use super::corpus::{Corpus, Rng};
use super::harness::{client, error_label, mb, ms, quantile, us, wait_loaded, CoordinatorProc, MODEL};
use super::sim::{Fleet, SimSpec, Timing};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_client::{Client, GenerateRequest};
use switchyard_config::Config;
use switchyard_config::RoutingPolicy;
use switchyard_messages::WorkerSpeed;
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

/// What the big fleet is asked to do.
pub struct Plan {
    /// Simulated workers.
    pub workers: usize,
    /// Requests measured.
    pub requests: u64,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Blocks each worker holds.
    pub blocks_per_worker: usize,
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// Rounds of the heartbeat blast.
    pub blast_rounds: usize,
    /// The coordinator's policy.
    pub policy: RoutingPolicy,
}

/// Requests `range`, `concurrency` at a time over `clients`: end-to-end latencies
/// and errors by code.
async fn drive(
    clients: &[Client],
    corpus: &Arc<Corpus>,
    range: std::ops::Range<u64>,
    concurrency: usize,
) -> (Vec<Duration>, BTreeMap<String, usize>) {
    let next = Arc::new(AtomicU64::new(range.start));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(BTreeMap::new()));
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let (client, corpus, next) = (clients[t % clients.len()].clone(), corpus.clone(), next.clone());
            let (latencies, errors, end) = (latencies.clone(), errors.clone(), range.end);
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        break;
                    }
                    let mut rng = Rng::new(i.wrapping_mul(0x9e37_79b9));
                    let prompt = corpus.prompt(corpus.draw(&mut rng), i);
                    let mut req = GenerateRequest::generate(Client::new_request_id(), MODEL, prompt);
                    req.config.max_tokens = 1;
                    let start = Instant::now();
                    let outcome = match client.generate(req).await {
                        Ok(stream) => stream.collect().await.map(|_| ()),
                        Err(e) => Err(e),
                    };
                    match outcome {
                        Ok(()) => latencies.lock().unwrap().push(start.elapsed()),
                        Err(e) => *errors.lock().unwrap().entry(error_label(&e)).or_insert(0) += 1,
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let latencies = std::mem::take(&mut *latencies.lock().unwrap());
    let errors = std::mem::take(&mut *errors.lock().unwrap());
    (latencies, errors)
}

/// Runs the big fleet and prints the report.
pub async fn run(config: Config, a: Plan) -> anyhow::Result<()> {
    let (n, requests) = (a.workers, a.requests);
    let server = NatsServer::start(&find_nats_server(&config.nats.server_bin)?)?;
    let (url, prefix) = (server.url(), config.nats.prefix.clone());
    eprintln!("drawing the prefix sets of {n} simulated workers …");
    let corpus = Arc::new(Corpus::new(17, 8, 2000, 24, 1.0));
    let mut rng = Rng::new(42);
    let specs: Vec<SimSpec> = (0..n)
        .map(|i| {
            let mut blocks = HashSet::new();
            while blocks.len() < a.blocks_per_worker * 9 / 10 {
                blocks.extend(corpus.chain(corpus.draw(&mut rng)).iter().copied());
            }
            SimSpec {
                id: format!("sim-{i:04}"),
                backend: "cpu".into(),
                capacity: 4,
                queue_capacity: 16,
                timing: Timing::NoModel,
                initial: blocks.into_iter().collect(),
                budget: a.blocks_per_worker,
                // A nominal speed, ten kinds of device, so `ttft` routing predicts.
                nominal: Some(WorkerSpeed {
                    requests: 64,
                    prefill_tps: 500.0 + 250.0 * (i % 10) as f64,
                    service_ms: 500.0,
                }),
            }
        })
        .collect();
    let policy = a.policy;
    let nats =
        switchyard_fabric::nats::connect(&url, &Default::default(), "bench-routing", Duration::from_secs(10)).await?;
    let coordinator = CoordinatorProc::start(&url, &prefix, Some(policy.as_str()), nats.clone()).await?;
    let before_fleet = coordinator.report().await?;
    let sim_nats =
        switchyard_fabric::nats::connect(&url, &Default::default(), "simulator", Duration::from_secs(10)).await?;
    let started = Instant::now();
    let fleet = Fleet::start(sim_nats, &prefix, MODEL, specs, a.heartbeat).await?;
    let clients = futures::future::try_join_all((0..4).map(|_| client(&url, &prefix))).await?;
    wait_loaded(&coordinator, &clients[0], n).await?;
    let loaded_in = started.elapsed();
    let loaded = coordinator.report().await?;
    let (held, distinct) = fleet.held();
    eprintln!("fleet loaded in {:.1} s; warming up …", loaded_in.as_secs_f64());
    let (_, warm_errors) = drive(&clients, &corpus, 0..500, a.concurrency).await;
    anyhow::ensure!(warm_errors.is_empty(), "warm-up requests failed: {warm_errors:?}");

    eprintln!("{requests} requests, {} at a time …", a.concurrency);
    let published = |f: &Fleet| {
        let c = f.counters();
        (
            c.heartbeats.load(Ordering::Relaxed),
            c.kv_events.load(Ordering::Relaxed),
        )
    };
    let (hb0, kv0) = published(&fleet);
    let r0 = coordinator.report().await?;
    let t0 = Instant::now();
    let (mut latencies, errors) = drive(&clients, &corpus, 1_000..1_000 + requests, a.concurrency).await;
    let wall = t0.elapsed();
    let r1 = coordinator.report().await?;
    let (hb1, kv1) = published(&fleet);
    let run = r1.stats.since(&r0.stats);

    eprintln!("heartbeat blast: {} rounds of {n} …", a.blast_rounds);
    let b0 = coordinator.report().await?;
    let tb = Instant::now();
    let sent = fleet.blast_heartbeats(a.blast_rounds).await;
    let published_in = tb.elapsed();
    let (mut last, mut last_at) = (b0.stats.heartbeats.count, tb);
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let c = coordinator.report().await?.stats.heartbeats.count;
        if c > last {
            (last, last_at) = (c, Instant::now());
        }
        if c >= b0.stats.heartbeats.count + sent || last_at.elapsed() > Duration::from_secs(1) {
            break;
        }
    }
    let b1 = coordinator.report().await?;
    let blast = b1.stats.heartbeats.since(&b0.stats.heartbeats);
    let blast_time = last_at - tb;

    let decisions = run.decisions;
    println!(
        "routing benchmark, big fleet: 1 coordinator (its own process, routing = {policy}) and {n} simulated workers \
         (no model: each admits and answers at once with a 1-token stream, so this measures the coordinator's and \
         the fabric's own cost; each reports a nominal prefill speed, 500-2,750 tok/s, for the ttft policy to \
         predict from), all played by one simulator task on one connection, over a real nats-server"
    );
    println!(
        "prefix sets: 8 system prompts (4 blocks) × 2,000 documents (24 blocks), popularity Zipf(1.0); each worker \
         holds {:.0} blocks on average ({held} in all, {distinct} distinct); each request = system prompt + \
         document + a question of its own (~31 blocks, ~8 KB)",
        held as f64 / n as f64
    );
    println!(
        "fleet loaded: {n} workers' heartbeats and KV snapshots in {:.2} s (snapshots: mean {:.0} µs each in the \
         coordinator)",
        loaded_in.as_secs_f64(),
        us(loaded.stats.snapshots.since(&before_fleet.stats.snapshots).mean())
    );
    println!(
        "requests: {} completed, errors {errors:?}, {} at a time on 4 connections, {:.2} s: {:.0} requests/s end to end",
        latencies.len(),
        a.concurrency,
        wall.as_secs_f64(),
        latencies.len() as f64 / wall.as_secs_f64()
    );
    let p50 = quantile(&mut latencies, 0.5);
    let p99 = quantile(&mut latencies, 0.99);
    println!(
        "  end-to-end latency (client → coordinator → simulated worker → client, last chunk): p50 {:.2} ms, p99 {:.2} ms",
        ms(p50),
        ms(p99)
    );
    println!(
        "routing decisions (time inside the coordinator's Route handler: filter, order, note the choice): {}; p50 \
         {:.1} µs, p99 {:.1} µs, mean {:.1} µs → {:.0} decisions/s for one coordinator actor ({:.0}/s were asked of it)",
        decisions.count,
        us(run.decision_quantile(0.5)),
        us(run.decision_quantile(0.99)),
        us(decisions.mean()),
        1.0 / decisions.mean().as_secs_f64().max(1e-12),
        decisions.count as f64 / wall.as_secs_f64()
    );
    println!(
        "heartbeats during the run: {} applied of {} published ({:.0}/s: every worker each {} ms, plus one after \
         each request), mean {:.1} µs; KV events: {} applied of {} published, mean {:.1} µs",
        run.heartbeats.count,
        hb1 - hb0,
        run.heartbeats.count as f64 / wall.as_secs_f64(),
        a.heartbeat.as_millis(),
        us(run.heartbeats.mean()),
        run.kv_events.count,
        kv1 - kv0,
        us(run.kv_events.mean())
    );
    println!(
        "heartbeat blast: {sent} published in {:.2} s; {} applied in {:.2} s → {:.0} heartbeats/s (mean {:.1} µs each \
         in the actor)",
        published_in.as_secs_f64(),
        blast.count,
        blast_time.as_secs_f64(),
        blast.count as f64 / blast_time.as_secs_f64().max(1e-9),
        us(blast.mean())
    );
    let cpu = Duration::from_micros(r1.cpu_us - r0.cpu_us);
    println!(
        "coordinator process: RSS {:.1} MB (peak {:.1} MB; {:.1} MB before the fleet), CPU {:.2} s during the {:.2} s \
         run ({:.0}% of one core; {:.0} µs per request)",
        mb(b1.rss),
        mb(b1.peak_rss),
        mb(before_fleet.rss),
        cpu.as_secs_f64(),
        wall.as_secs_f64(),
        cpu.as_secs_f64() / wall.as_secs_f64() * 100.0,
        us(cpu) / requests as f64
    );
    fleet.stop();
    coordinator.stop().await;
    drop(server);
    Ok(())
}
