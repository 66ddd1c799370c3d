//! KV-aware routing end to end: three CPU workers on a real nats-server, one
//! coordinator. Requests sharing a document prefix go back to the worker that holds
//! it warm (and it reuses its KV: `cached_tokens`), and a coordinator started after
//! the workers recovers their warm prefixes from snapshots. (Where a new document
//! goes is predicted TTFT's choice from speeds measured as the test runs, so the
//! first three are placed; the registry's own tests cover new-prefix placement.) Every forward carries the coordinator's prediction
//! of `cached_tokens` from the workers' announced holdings, and it is exact — also
//! for a llama.cpp worker, whose holdings follow its llama-server's slots and prompt
//! cache.

mod common;

use common::*;
use std::time::{Duration, Instant};
use switchyard::node;
use switchyard::{Client, Completion, GenerateRequest, Message};

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
    ask_on(client, doc, question, None).await
}

/// [`ask`], pinned to `worker` when given.
async fn ask_on(client: &Client, doc: &str, question: &str, worker: Option<&str>) -> Completion {
    let mut req = GenerateRequest::generate(
        Client::new_request_id(),
        NAME,
        format!("{doc}Question: {question}\nAnswer:"),
    );
    req.head.worker = worker.map(str::to_string);
    req.config.max_tokens = 4;
    let done = client.generate(req).await.unwrap().collect().await.unwrap();
    let m = &done.metrics;
    assert_eq!(
        m.predicted_cached_tokens,
        Some(m.cached_tokens - m.pulled_tokens),
        "the coordinator predicted what the worker reused of its own (not what it pulled): {m:?}"
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

    // Three new documents, one on each worker (placed there: where predicted TTFT
    // sends a new document depends on the speeds each worker measured so far, and
    // what is tested here is where the follow-ups go).
    let docs = [document("river"), document("harbour"), document("cathedral")];
    let mut home = Vec::new();
    for (doc, worker) in docs.iter().zip(["w-a", "w-b", "w-c"]) {
        let done = ask_on(&client, doc, "What was studied?", Some(worker)).await;
        assert_eq!(done.metrics.cached_tokens, 0);
        assert_eq!(done.worker_id, worker);
        home.push(done.worker_id);
    }

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
    // Each worker's snapshot applied (a fixed sleep was not always enough on a loaded
    // CI host).
    while coordinator.stats().snapshot().snapshots.count < 3 {
        assert!(Instant::now() < deadline, "the workers' KV snapshots did not arrive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

/// A chat of `turns` (user, assistant, …, user) asked with greedy decoding; its
/// prediction must equal what the worker reused.
async fn chat(client: &Client, turns: &[&str]) -> Completion {
    let roles = ["user", "assistant"];
    let messages = turns
        .iter()
        .enumerate()
        .map(|(i, t)| Message::new(roles[i % 2], *t))
        .collect();
    let mut req = GenerateRequest::chat(Client::new_request_id(), NAME, messages);
    req.config.max_tokens = 6;
    let done = client.chat(req).await.unwrap().collect().await.unwrap();
    let m = &done.metrics;
    assert_eq!(
        m.predicted_cached_tokens,
        Some(m.cached_tokens),
        "the coordinator predicted what the llama.cpp worker reused: {m:?}"
    );
    done
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llama_cpp_worker_announces_what_its_server_holds() {
    let Some(bin) = llama_server_bin() else {
        return;
    };
    // Two slots; the worker picks them.
    let server = switchyard_procs::llama_server::LlamaServer::start_with(&bin, &demo_model(), 1, 2, &["-fa", "off"])
        .await
        .unwrap();
    let nats = nats();
    let url = nats.url();
    let mut config = fleet_config(&url);
    config.worker.model_name = NAME.into();
    config.worker.id = "w-llama".into();
    config.worker.backend = "llama_cpp".into();
    config.worker.llama_url = server.url.clone();
    config.validate().unwrap();
    let coordinator = node::start_coordinator(&config).await.unwrap();
    let loaded = node::load(&config).await.unwrap();
    let worker = node::start_worker(&config, &loaded).await.unwrap();
    let client = client(&url, Duration::from_secs(20)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.status().await.unwrap().workers.is_empty() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Each `ask` checks the prediction against `cached_tokens`.
    let docs = [document("river"), document("harbour"), document("cathedral")];
    let mut reused = 0;
    for (doc, question) in [
        (0, "What was studied?"),
        (1, "What was studied?"),
        (0, "Who cared for it?"),
        // A third document takes the least recently used slot (the harbour's) ...
        (2, "What was studied?"),
        // ... and the harbour is computed again, in the river's.
        (1, "Who cared for it?"),
        (2, "Question 1"),
        (2, "Question 10"),
        (0, "What was measured?"),
    ] {
        reused += ask(&client, &docs[doc], question).await.metrics.cached_tokens;
    }
    assert!(reused > 600, "the documents were reused: {reused} tokens");
    // A chat continued with its reply reuses the reply too.
    let first = chat(&client, &["Tell me about rivers."]).await;
    let reply = first.text.clone();
    let next = chat(&client, &["Tell me about rivers.", &reply, "And harbours?"]).await;
    assert!(
        next.metrics.cached_tokens > first.metrics.prompt_tokens,
        "{:?}",
        next.metrics
    );

    worker.shutdown(Duration::from_secs(5)).await;
    let mut loaded = loaded;
    loaded.stop();
    coordinator.shutdown().await;
}
