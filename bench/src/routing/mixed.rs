//! `bench routing --fleet mixed`: predicted-TTFT against block-score routing on a
//! fleet of fast and slow simulated workers whose time to first token follows a model
//! (wait for a slot + uncached prompt tokens ÷ prefill speed), so what differs between
//! the two runs is only where the coordinator sent each request. Both policies get the
//! same requests at the same arrival times, from the same starting state: each worker
//! starts holding a few documents warm, and has measured its speed on two pinned
//! requests (pinned, so routing did not choose them).

use super::corpus::{Corpus, Rng};
use super::harness::{client, error_label, ms, quantile, wait_loaded, CoordinatorProc, MODEL};
use super::sim::{Fleet, SimSpec, Timing, BYTES_PER_TOKEN};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_client::{Client, GenerateRequest, StreamEvent};
use switchyard_config::Config;
use switchyard_config::RoutingPolicy;
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

/// What the mixed fleet is asked to do.
pub struct Plan {
    /// Simulated workers (a quarter fast).
    pub workers: usize,
    /// Requests per policy and round.
    pub requests: usize,
    /// Rounds, each running both policies.
    pub rounds: usize,
    /// Arrival rate as a fraction of the modelled capacity.
    pub load: f64,
    /// Heartbeat period.
    pub heartbeat: Duration,
}

/// A kind of simulated device.
struct Device {
    name: &'static str,
    prefill_tps: f64,
    tpot: Duration,
}

const FAST: Device = Device {
    name: "fast",
    prefill_tps: 8_000.0,
    tpot: Duration::from_millis(5),
};
const SLOW: Device = Device {
    name: "slow",
    prefill_tps: 1_000.0,
    tpot: Duration::from_millis(20),
};
const SLOTS: u32 = 4;
const QUEUE: u32 = 8;
const OUTPUT_TOKENS: u32 = 32;
const DOC_BLOCKS: usize = 16;
const BUDGET_BLOCKS: usize = 240;

/// One policy's run.
#[derive(Default)]
struct Outcome {
    ttft: Vec<Duration>,
    on_fast: usize,
    /// Forwards a full worker refused (the coordinator then tried the next).
    refused: u64,
    errors: BTreeMap<String, usize>,
}

fn specs(n: usize, corpus: &Corpus) -> Vec<SimSpec> {
    let mut rng = Rng::new(7);
    (0..n)
        .map(|i| {
            let device = if i % 4 == 0 { &FAST } else { &SLOW };
            let mut blocks = HashSet::new();
            for _ in 0..4 {
                blocks.extend(corpus.chain(corpus.draw(&mut rng)).iter().copied());
            }
            SimSpec {
                id: format!("{}-{i:03}", device.name),
                backend: "cuda".into(),
                capacity: SLOTS,
                queue_capacity: QUEUE,
                timing: Timing::Modelled {
                    prefill_tps: device.prefill_tps,
                    tpot: device.tpot,
                    output_tokens: OUTPUT_TOKENS,
                },
                initial: blocks.into_iter().collect(),
                budget: BUDGET_BLOCKS,
                nominal: None,
            }
        })
        .collect()
}

/// Requests per second the fleet serves if every request prefills half its prompt.
fn capacity(specs: &[SimSpec], prompt_tokens: f64) -> f64 {
    specs
        .iter()
        .map(|s| match s.timing {
            Timing::Modelled {
                prefill_tps,
                tpot,
                output_tokens,
            } => {
                let service = prompt_tokens / 2.0 / prefill_tps + tpot.as_secs_f64() * f64::from(output_tokens);
                f64::from(s.capacity) / service
            }
            Timing::NoModel => 0.0,
        })
        .sum()
}

/// Generates `prompt` and returns the time to its first token and the worker.
async fn one(client: &Client, prompt: String, worker: Option<String>) -> Result<(Duration, String), String> {
    let mut req = GenerateRequest::generate(Client::new_request_id(), MODEL, prompt);
    req.config.max_tokens = OUTPUT_TOKENS;
    req.head.worker = worker;
    let start = Instant::now();
    let mut stream = client.generate(req).await.map_err(|e| error_label(&e))?;
    let mut first = None;
    while let Some(ev) = stream.next().await {
        match ev.map_err(|e| error_label(&e))? {
            StreamEvent::Tokens(_) => {
                first.get_or_insert_with(|| start.elapsed());
            }
            StreamEvent::Done { .. } => break,
        }
    }
    let ttft = first.ok_or("no token")?;
    Ok((ttft, stream.worker_id().to_string()))
}

async fn run_policy(
    url: &str,
    prefix: &str,
    policy: RoutingPolicy,
    corpus: &Arc<Corpus>,
    specs: Vec<SimSpec>,
    arrivals: &[(Duration, u64)],
    heartbeat: Duration,
) -> anyhow::Result<Outcome> {
    let n = specs.len();
    let ids: Vec<String> = specs.iter().map(|s| s.id.clone()).collect();
    let nats =
        switchyard_fabric::nats::connect(url, &Default::default(), "bench-routing", Duration::from_secs(10)).await?;
    let coordinator = CoordinatorProc::start(url, prefix, Some(policy.as_str()), nats).await?;
    let sim = switchyard_fabric::nats::connect(url, &Default::default(), "simulator", Duration::from_secs(10)).await?;
    let fleet = Fleet::start(sim, prefix, MODEL, specs, heartbeat).await?;
    let client = client(url, prefix).await?;
    wait_loaded(&coordinator, &client, n).await?;
    // Every worker measures its speed on two pinned requests of their own.
    let warmups = ids.iter().enumerate().flat_map(|(i, id)| {
        (0..2).map(move |k| {
            let prompt = format!("warm-up {i} {k}: {}", "calibration text ".repeat(200));
            (prompt, id.clone())
        })
    });
    let results = futures::future::join_all(warmups.map(|(p, id)| {
        let client = client.clone();
        async move { one(&client, p, Some(id)).await }
    }))
    .await;
    if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
        anyhow::bail!("a warm-up request failed: {e}");
    }
    // Their next heartbeats carry the measurement.
    tokio::time::sleep(heartbeat + Duration::from_millis(200)).await;

    let out = Arc::new(Mutex::new(Outcome::default()));
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(arrivals.len());
    for &(at, i) in arrivals {
        tokio::time::sleep_until(start + at).await;
        let (client, corpus, out) = (client.clone(), corpus.clone(), out.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(i.wrapping_mul(0x9e37_79b9));
            let prompt = corpus.prompt(corpus.draw(&mut rng), i);
            let r = one(&client, prompt, None).await;
            let mut o = out.lock().unwrap();
            match r {
                Ok((ttft, worker)) => {
                    o.ttft.push(ttft);
                    o.on_fast += usize::from(worker.starts_with(FAST.name));
                }
                Err(e) => *o.errors.entry(e).or_insert(0) += 1,
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let refused = fleet.counters().refused.load(std::sync::atomic::Ordering::Relaxed);
    fleet.stop();
    coordinator.stop().await;
    let o = std::mem::take(&mut *out.lock().unwrap());
    Ok(Outcome { refused, ..o })
}

fn mean(xs: &[Duration]) -> Duration {
    xs.iter().sum::<Duration>() / xs.len().max(1) as u32
}

/// Runs both policies `a.rounds` times and prints the comparison.
pub async fn run(config: Config, a: Plan) -> anyhow::Result<()> {
    let (n, requests) = (a.workers, a.requests);
    let server = NatsServer::start(&find_nats_server(&config.nats.server_bin)?)?;
    let (url, prefix) = (server.url(), config.nats.prefix.clone());
    let corpus = Arc::new(Corpus::new(11, 4, 64, DOC_BLOCKS, 1.0));
    let template = specs(n, &corpus);
    let prompt_tokens = ((4 + DOC_BLOCKS) * 256 + 500) as f64 / BYTES_PER_TOKEN as f64;
    let rate = a.load * capacity(&template, prompt_tokens);
    let mut rng = Rng::new(99);
    let mut t = 0.0;
    let arrivals: Vec<(Duration, u64)> = (0..requests as u64)
        .map(|i| {
            t += -(1.0 - rng.unit()).ln() / rate;
            (Duration::from_secs_f64(t), 1_000_000 + i)
        })
        .collect();
    let fast = template.iter().filter(|s| s.id.starts_with(FAST.name)).count();
    let heartbeat = a.heartbeat;
    let mut results: BTreeMap<&str, Outcome> = BTreeMap::new();
    for round in 0..a.rounds {
        let order = if round % 2 == 0 {
            [RoutingPolicy::Blocks, RoutingPolicy::Ttft]
        } else {
            [RoutingPolicy::Ttft, RoutingPolicy::Blocks]
        };
        for policy in order {
            eprintln!(
                "round {}: routing = {policy}, {requests} requests at {rate:.0}/s …",
                round + 1
            );
            let o = run_policy(&url, &prefix, policy, &corpus, template.clone(), &arrivals, heartbeat).await?;
            let r = results.entry(policy.as_str()).or_default();
            r.ttft.extend(o.ttft);
            r.on_fast += o.on_fast;
            r.refused += o.refused;
            for (k, v) in o.errors {
                *r.errors.entry(k).or_insert(0) += v;
            }
        }
    }
    println!(
        "routing benchmark, mixed fleet: {n} simulated workers, same backend, {fast} fast (prefill {:.0} tok/s, {} \
         ms/token) and {} slow (prefill {:.0} tok/s, {} ms/token), {SLOTS} slots + {QUEUE} queued each. Their time \
         to first token follows a model — wait for a slot, then uncached prompt tokens ÷ prefill speed — so this \
         measures the routing policy, not a model; each reports the speed it measured on itself",
        FAST.prefill_tps,
        FAST.tpot.as_millis(),
        n - fast,
        SLOW.prefill_tps,
        SLOW.tpot.as_millis()
    );
    println!(
        "workload: {requests} requests per policy and round ({} round(s), policies alternating), Poisson arrivals at \
         {rate:.0}/s ({:.0}% of the fleet's modelled capacity); prompt = system prompt + document (4 × 64, Zipf) + \
         a question, ~{prompt_tokens:.0} tokens; {OUTPUT_TOKENS} output tokens; the same requests, arrival times \
         and starting KV state for both policies",
        a.rounds,
        a.load * 100.0
    );
    println!(
        "{:<26} {:>10} {:>10} {:>10} {:>9} {:>9}  errors",
        "TTFT, client-seen", "mean ms", "p50 ms", "p99 ms", "on fast", "refused"
    );
    let mut means = BTreeMap::new();
    for (policy, o) in &mut results {
        let m = mean(&o.ttft);
        means.insert(*policy, m);
        let done = o.ttft.len();
        let p50 = quantile(&mut o.ttft, 0.5);
        let p99 = quantile(&mut o.ttft, 0.99);
        let label = if *policy == "ttft" {
            "ttft (predicted TTFT)"
        } else {
            "blocks (block score)"
        };
        println!(
            "{label:<26} {:>10.1} {:>10.1} {:>10.1} {:>8.0}% {:>9}  {:?}",
            ms(m),
            ms(p50),
            ms(p99),
            o.on_fast as f64 * 100.0 / done.max(1) as f64,
            o.refused,
            o.errors
        );
    }
    let (t, b) = (means["ttft"], means["blocks"]);
    println!(
        "predicted-TTFT routing: mean TTFT {:.0} ms vs {:.0} ms with the block score: {:.2}×, {:.0}% lower",
        ms(t),
        ms(b),
        t.as_secs_f64() / b.as_secs_f64(),
        (1.0 - t.as_secs_f64() / b.as_secs_f64()) * 100.0
    );
    drop(server);
    Ok(())
}
