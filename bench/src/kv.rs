//! `switchyard bench kv-routing`: prefix hit rate and load spread of KV-aware routing
//! against load-only routing, on the same workload and the same fleet shape. Many
//! conversations share a few long documents; each turn asks a new question about its
//! conversation's document. A request "hits" when its worker reused the document from
//! its KV cache (more than half the prompt came from `cached_tokens`). The first
//! request of each document cannot hit anywhere, so the rate counts the others.
//!
//! It also scores the coordinator's prediction of each request's `cached_tokens`
//! (from the workers' announced KV holdings, protocol 1.9) against what the worker
//! reported: the share of requests where they are equal, precise and by whole
//! 256-byte blocks. `--mixed` makes documents of mixed length (long ones past Gemma
//! 3's sliding window) and follow-ups that continue the previous answer.

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
    /// Workers (of the configured backend).
    pub workers: usize,
    /// Distinct documents.
    pub prefixes: usize,
    /// Conversations (each on document `c % prefixes`).
    pub conversations: usize,
    /// Questions per conversation.
    pub turns: usize,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Mixed document lengths and follow-ups that continue an answer.
    pub mixed: bool,
}

fn document(i: usize, mixed: bool) -> String {
    let entries = match (mixed, i % 2) {
        (false, _) => 8,
        (true, 0) => 2,
        (true, _) => 32,
    };
    let mut doc = format!("Archive file {i}.\n");
    for s in 1..=entries {
        doc.push_str(&format!(
            "Entry {s} of file {i}: the committee met again to review the harbour accounts, the state of \
             the bridges and the grain stores, and recorded its decisions for the council.\n"
        ));
    }
    doc
}

/// How the coordinator's predictions of `cached_tokens` went.
#[derive(Default)]
struct Predictions {
    /// Requests with a prediction.
    made: usize,
    /// Of those, equal to `cached_tokens`: precise, by whole blocks.
    exact: usize,
    by_blocks: usize,
    /// Precise predictions above and below what was reused.
    over: usize,
    under: usize,
}

struct Outcome {
    hit_rate: f64,
    predictions: Predictions,
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
    // other documents' requests. With `mixed`, odd turns continue the conversation's
    // previous prompt and answer (so they run after it).
    let name = workers[0].1.name.clone();
    let started = Instant::now();
    let mut results: Vec<anyhow::Result<Asked>> = Vec::new();
    let mut last: Vec<String> = vec![String::new(); w.conversations];
    for t in 0..w.turns {
        let follow_up = w.mixed && t % 2 == 1;
        let requests: Vec<(usize, usize, String)> = (0..w.conversations)
            .map(|c| {
                let doc = c % w.prefixes;
                let prompt = if follow_up {
                    format!("{}\nQuestion {c}.{t}: and then?\nAnswer:", last[c])
                } else {
                    format!(
                        "{}Question {c}.{t}: what did the committee decide?\nAnswer:",
                        document(doc, w.mixed)
                    )
                };
                (c, doc, prompt)
            })
            .collect();
        let turn: Vec<anyhow::Result<Asked>> = futures::stream::iter(requests)
            .map(|(c, doc, prompt)| {
                let (client, name) = (client.clone(), name.clone());
                async move {
                    let mut req = GenerateRequest::generate(Client::new_request_id(), name, prompt.clone());
                    req.config.max_tokens = 4;
                    let done = client.generate(req).await?.collect().await?;
                    let m = &done.metrics;
                    Ok(Asked {
                        conversation: c,
                        doc,
                        worker: done.worker_id.clone(),
                        hit: m.cached_tokens * 2 > m.prompt_tokens,
                        // What the worker reused of its own (pulled KV is a peer's).
                        cached: m.cached_tokens - m.pulled_tokens,
                        predicted: m.predicted_cached_tokens.zip(m.block_predicted_cached_tokens),
                        said: format!("{prompt}{}", done.text),
                    })
                }
            })
            .buffered(w.concurrency.max(1))
            .collect()
            .await;
        for a in turn.iter().flatten() {
            last[a.conversation] = a.said.clone();
        }
        results.extend(turn);
    }
    let wall = started.elapsed();
    let (mut seen, mut eligible, mut hits) = (HashSet::new(), 0usize, 0usize);
    let mut per_worker = BTreeMap::new();
    let mut predictions = Predictions::default();
    for r in results {
        let Asked {
            doc,
            worker,
            hit,
            cached,
            predicted,
            ..
        } = r?;
        if let Some((precise, blocks)) = predicted {
            predictions.made += 1;
            predictions.exact += usize::from(precise == cached);
            predictions.by_blocks += usize::from(blocks == cached);
            predictions.over += usize::from(precise > cached);
            predictions.under += usize::from(precise < cached);
        }
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
        predictions,
        per_worker,
        wall,
    })
}

/// One request's outcome.
struct Asked {
    conversation: usize,
    doc: usize,
    worker: String,
    hit: bool,
    cached: u32,
    /// The coordinator's prediction (precise, by whole blocks).
    predicted: Option<(u32, u32)>,
    /// Its prompt and answer (what a follow-up continues).
    said: String,
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
        "kv routing: {} {} workers, {} documents, {} conversations × {} turns = {requests} requests, {} in flight",
        w.workers, config.worker.backend, w.prefixes, w.conversations, w.turns, w.concurrency
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
    let p = &rows[0].predictions;
    let share = |n: usize| n as f64 * 100.0 / p.made.max(1) as f64;
    println!(
        "cached_tokens predicted (kv-aware): {} of {requests} requests; equal {:.1}% precise ({} over, {} under), \
         {:.1}% by whole blocks",
        p.made,
        share(p.exact),
        p.over,
        p.under,
        share(p.by_blocks)
    );
    println!(
        "hit rate ratio kv-aware / load-only: {:.2}; throughput ratio: {:.2}",
        rows[0].hit_rate / rows[1].hit_rate.max(1e-9),
        rows[1].wall.as_secs_f64() / rows[0].wall.as_secs_f64()
    );
    Ok(())
}
