//! `switchyard bench kv-routing`: prefix hit rate and load spread of KV-aware routing
//! against load-only routing, on the same workload and the same fleet shape. Many
//! conversations share a few long documents; each turn asks a new question about its
//! conversation's document. A request "hits" when its worker reused the document from
//! its KV cache (more than half the prompt came from `cached_tokens`). The first
//! request of each document cannot hit anywhere, so the rate counts the others.

use futures::StreamExt;
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};
use switchyard_client::{Client, ClientOptions};
use switchyard_config::Config;
use switchyard_messages::GenerateRequest;
use switchyard_node as node;
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

/// The workload's shape.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// CPU workers.
    pub workers: usize,
    /// Distinct documents.
    pub prefixes: usize,
    /// Conversations (each on document `c % prefixes`).
    pub conversations: usize,
    /// Questions per conversation.
    pub turns: usize,
    /// Requests in flight at once.
    pub concurrency: usize,
}

fn document(i: usize) -> String {
    let mut doc = format!("Archive file {i}.\n");
    for s in 1..=8 {
        doc.push_str(&format!(
            "Entry {s} of file {i}: the committee met again to review the harbour accounts, the state of \
             the bridges and the grain stores, and recorded its decisions for the council.\n"
        ));
    }
    doc
}

struct Outcome {
    hit_rate: f64,
    per_worker: BTreeMap<String, usize>,
    wall: Duration,
}

async fn run(mut config: Config, w: Workload, kv_routing: bool) -> anyhow::Result<Outcome> {
    let nats = NatsServer::start(&find_nats_server(&config.nats.server_bin)?)?;
    config.nats.url = nats.url();
    config.coordinator.kv_routing = kv_routing;
    let coordinator = node::start_coordinator(&config).await?;
    let mut workers = Vec::new();
    for i in 0..w.workers {
        let mut c = config.clone();
        c.worker.id = format!("kv-bench-{i}");
        let loaded = node::load(&c).await?;
        workers.push((node::start_worker(&c, &loaded).await?, loaded));
    }
    let client = Client::connect_with(
        &config.nats.url,
        ClientOptions {
            prefix: config.nats.prefix.clone(),
            security: config.nats.security(),
            ..ClientOptions::default()
        },
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.status().await.map(|s| s.workers.len()).unwrap_or(0) < w.workers {
        if Instant::now() > deadline {
            anyhow::bail!("the coordinator did not see {} workers", w.workers);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Turn by turn across conversations, so a document's follow-ups interleave with
    // other documents' requests.
    let mut requests = Vec::new();
    for t in 0..w.turns {
        for c in 0..w.conversations {
            requests.push((
                c % w.prefixes,
                format!(
                    "{}Question {c}.{t}: what did the committee decide?\nAnswer:",
                    document(c % w.prefixes)
                ),
            ));
        }
    }
    let name = workers[0].1.name.clone();
    let started = Instant::now();
    let results: Vec<anyhow::Result<(usize, String, bool)>> = futures::stream::iter(requests)
        .map(|(doc, prompt)| {
            let (client, name) = (client.clone(), name.clone());
            async move {
                let mut req = GenerateRequest::generate(Client::new_request_id(), name, prompt);
                req.config.max_tokens = 4;
                let done = client.generate(req).await?.collect().await?;
                let hit = done.metrics.cached_tokens * 2 > done.metrics.prompt_tokens;
                Ok((doc, done.worker_id, hit))
            }
        })
        .buffered(w.concurrency.max(1))
        .collect()
        .await;
    let wall = started.elapsed();
    let (mut seen, mut eligible, mut hits) = (HashSet::new(), 0usize, 0usize);
    let mut per_worker = BTreeMap::new();
    for r in results {
        let (doc, worker, hit) = r?;
        *per_worker.entry(worker).or_insert(0) += 1;
        if !seen.insert(doc) {
            eligible += 1;
            hits += usize::from(hit);
        }
    }
    for (worker, mut loaded) in workers {
        worker.shutdown(Duration::from_secs(5)).await;
        loaded.stop();
    }
    coordinator.shutdown().await;
    Ok(Outcome {
        hit_rate: hits as f64 / eligible.max(1) as f64,
        per_worker,
        wall,
    })
}

/// Runs the workload with KV-aware routing and with load-only routing, and prints
/// both and the ratio.
pub async fn kv_routing(mut config: Config, w: Workload) -> anyhow::Result<()> {
    if config.worker.threads == 0 {
        config.worker.threads = 1;
    }
    let mut rows = Vec::new();
    for kv in [true, false] {
        eprintln!("running the workload with kv_routing = {kv} …");
        rows.push(run(config.clone(), w, kv).await?);
    }
    let requests = w.conversations * w.turns;
    println!(
        "kv routing: {} CPU workers, {} documents, {} conversations × {} turns = {requests} requests, {} in flight",
        w.workers, w.prefixes, w.conversations, w.turns, w.concurrency
    );
    println!("{:<32} {:>14} {:>14}", "", "kv-aware", "load only");
    println!(
        "{:<32} {:>13.1}% {:>13.1}%",
        "prefix hit rate (after 1st use)",
        rows[0].hit_rate * 100.0,
        rows[1].hit_rate * 100.0
    );
    let spread = |o: &Outcome| {
        let counts: Vec<usize> = o.per_worker.values().copied().collect();
        format!(
            "{}..{}",
            counts.iter().min().copied().unwrap_or(0),
            counts.iter().max().copied().unwrap_or(0)
        )
    };
    println!(
        "{:<32} {:>14} {:>14}",
        "requests per worker (min..max)",
        spread(&rows[0]),
        spread(&rows[1])
    );
    println!(
        "{:<32} {:>14.1} {:>14.1}",
        "wall time s",
        rows[0].wall.as_secs_f64(),
        rows[1].wall.as_secs_f64()
    );
    println!(
        "hit rate ratio kv-aware / load-only: {:.2}; throughput ratio: {:.2}",
        rows[0].hit_rate / rows[1].hit_rate.max(1e-9),
        rows[1].wall.as_secs_f64() / rows[0].wall.as_secs_f64()
    );
    Ok(())
}
