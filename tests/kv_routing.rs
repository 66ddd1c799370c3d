//! KV-aware routing end to end: three CPU workers on a real nats-server, one
//! coordinator. Requests sharing a document prefix go back to the worker that holds
//! it warm (and it reuses its KV: `cached_tokens`), new documents spread to workers
//! that hold nothing, and a coordinator started after the workers recovers their
//! warm prefixes from snapshots. Every forward carries the coordinator's prediction
//! of `cached_tokens` from the workers' announced holdings, and it is exact.

mod common;

use common::*;
use std::time::{Duration, Instant};
use switchyard::node;
use switchyard::{Client, Completion, GenerateRequest};

const NAME: &str = "smol";

fn document(topic: &str) -> String {
    let mut doc = format!("Notes on {topic}.\n");
    for i in 1..=6 {
        doc.push_str(&format!(
            "Section {i}: the {topic} was studied from many sides, with careful records of what was seen, \
             measured and argued about by the people who cared for it over the years.\n"
        ));
    }
    doc
}

async fn ask(client: &Client, doc: &str, question: &str) -> Completion {
    let mut req = GenerateRequest::generate(
        Client::new_request_id(),
        NAME,
        format!("{doc}Question: {question}\nAnswer:"),
    );
    req.config.max_tokens = 4;
    let done = client.generate(req).await.unwrap().collect().await.unwrap();
    let m = &done.metrics;
    assert_eq!(
        m.predicted_cached_tokens,
        Some(m.cached_tokens),
        "the coordinator predicted what the worker reused: {m:?}"
    );
    assert!(
        m.block_predicted_cached_tokens.is_some_and(|b| b <= m.cached_tokens),
        "{m:?}"
    );
    // Let the worker's KV event and post-request heartbeat land.
    settle(client).await;
    done
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_follow_their_warm_prefix_and_survive_a_coordinator_restart() {
    let nats = nats();
    let url = nats.url();
    let mut config = fleet_config(&url);
    config.worker.model_name = NAME.into();
    config.worker.threads = 1;
    let coordinator = node::start_coordinator(&config).await.unwrap();
    let mut workers = Vec::new();
    for id in ["w-a", "w-b", "w-c"] {
        let mut c = config.clone();
        c.worker.id = id.into();
        let loaded = node::load(&c).await.unwrap();
        workers.push((node::start_worker(&c, &loaded).await.unwrap(), loaded));
    }
    let client = client(&url, Duration::from_secs(20)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.status().await.unwrap().workers.len() < 3 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Three new documents land on three different workers (each where it evicts
    // nothing).
    let docs = [document("river"), document("harbour"), document("cathedral")];
    let mut home = Vec::new();
    for doc in &docs {
        let done = ask(&client, doc, "What was studied?").await;
        assert_eq!(done.metrics.cached_tokens, 0);
        home.push(done.worker_id);
    }
    let mut distinct = home.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "new prefixes spread: {home:?}");

    // Follow-up questions go back to the worker holding the document, which reuses it.
    for round in 0..2 {
        for (doc, want) in docs.iter().zip(&home) {
            let done = ask(&client, doc, &format!("Who cared for it? ({round})")).await;
            assert_eq!(&done.worker_id, want, "follow-up routed to the warm worker");
            assert!(
                done.metrics.cached_tokens as usize * 2 > done.metrics.prompt_tokens as usize,
                "the warm worker reused the document: {:?}",
                done.metrics
            );
        }
    }

    // A coordinator started after the workers knows their warm prefixes from snapshots.
    coordinator.shutdown().await;
    let coordinator = node::start_coordinator(&config).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.status().await.map(|s| s.workers.len()).unwrap_or(0) < 3 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (doc, want) in docs.iter().zip(&home).rev() {
        let done = ask(&client, doc, "What was measured?").await;
        assert_eq!(&done.worker_id, want, "routed by the snapshot after a restart");
    }

    for (w, mut loaded) in workers {
        w.shutdown(Duration::from_secs(5)).await;
        loaded.stop();
    }
    coordinator.shutdown().await;
}
