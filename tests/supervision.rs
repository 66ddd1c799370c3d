//! The worker's supervision tree, with faults injected on purpose into a real fleet
//! (nats-server, coordinator, CPU worker with the demo model, in this process):
//! - a SessionActor that panics answers its caller with an `internal` error, its
//!   session is closed and its KV slot given back, and the worker and its other
//!   sessions keep serving;
//! - a KvCacheActor that panics is started again and announces a fresh start
//!   (snapshot `seq` 1) with what the engine still holds, and counts on from the next
//!   requests;
//! - a root actor that panics (a WorkerActor, a CoordinatorActor) is noticed: its
//!   handle's `failed()` resolves (the CLI then exits non-zero), its NATS connection
//!   is drained, and the rest of the fleet serves every request.

mod common;

use common::*;
use std::time::{Duration, Instant};
use switchyard::client::ClientError;
use switchyard_messages::session::{ContextManifest, OpenSessionRequest};
use switchyard_messages::{ErrorCode, KvSnapshot, Subjects};
use switchyard_workers::worker::Fault;

const PREFIX: &str = "You are a careful assistant. Answer in one short sentence, and say when you do not know.";

fn code(e: ClientError) -> (ErrorCode, String) {
    match e {
        ClientError::Remote { error, .. } => (error.code, error.message),
        other => panic!("not a remote error: {other:?}"),
    }
}

/// The worker's KV snapshot, asked over NATS like a coordinator does; `None` while
/// nothing answers (the actor being restarted).
async fn snapshot(nats: &async_nats::Client, subjects: &Subjects) -> Option<KvSnapshot> {
    let reply = tokio::time::timeout(
        Duration::from_secs(2),
        nats.request(subjects.kv_snapshot("w1"), bytes::Bytes::new()),
    )
    .await
    .ok()?
    .ok()?;
    switchyard_messages::decode(&reply.payload).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_session_and_kv_cache_actors_never_take_the_worker_down() {
    let fleet = fleet(|c| {
        c.worker.parallel_slots = 3; // two sessions at most: one slot stays for requests
        c.worker.threads = 1;
    })
    .await;
    let client = fleet.client().await;
    let subjects = Subjects::new(&fleet.config.nats.prefix);
    let m = ContextManifest {
        profile: "p".into(),
        model: "smol".into(),
        ..ContextManifest::default()
    };

    // --- A SessionActor panics while handling a call.
    let good = client
        .open_session(OpenSessionRequest::new("owner-a", ""))
        .await
        .unwrap();
    let doomed = client
        .open_session(OpenSessionRequest::new("owner-a", ""))
        .await
        .unwrap();
    good.ensure_prefix(PREFIX, &m).await.unwrap();
    fleet
        .worker
        .inject_fault(Fault::PanicSessionOnNextCall(doomed.opened.session_id.clone()));
    fleet.worker.status().await.unwrap(); // the worker actor has handled the fault by now
    let (code1, message) = code(doomed.ensure_prefix(PREFIX, &m).await.unwrap_err());
    assert_eq!(code1, ErrorCode::Internal, "{message}");
    assert!(
        message.contains(&doomed.opened.session_id) && message.contains("fault injection"),
        "{message}"
    );
    // The failed session is gone; the other one and the worker serve on.
    let (code2, _) = code(doomed.describe().await.unwrap_err());
    assert_eq!(code2, ErrorCode::SessionClosed);
    let warm = good.ensure_prefix(PREFIX, &m).await.unwrap();
    assert_eq!(warm.prefilled_tokens, 0, "{warm:?}");
    let done = client
        .generate(greedy("The capital of France is", 8))
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(done.unwrap().tokens.len(), 8);
    // Its slot was given back: a second session fits beside `good` again.
    let again = client
        .open_session(OpenSessionRequest::new("owner-a", ""))
        .await
        .unwrap();
    again.ensure_prefix(PREFIX, &m).await.unwrap();
    again.close().await.unwrap();
    good.close().await.unwrap();

    // --- The KvCacheActor panics.
    // (Prefix blocks are 256 bytes of prompt: a long prompt leaves some warm.)
    let long = format!("{PREFIX} {PREFIX} {PREFIX} Now, what is two plus two?");
    client
        .generate(greedy(&long, 4))
        .await
        .unwrap()
        .collect()
        .await
        .expect("served");
    let nats = client.nats().clone();
    let before = snapshot(&nats, &subjects).await.expect("a snapshot");
    assert!(before.seq >= 1 && !before.blocks.is_empty(), "{before:?}");
    fleet.worker.inject_fault(Fault::PanicKvCache);
    let deadline = Instant::now() + Duration::from_secs(10);
    let fresh = loop {
        assert!(Instant::now() < deadline, "the kv cache actor was not restarted");
        if let Some(s) = snapshot(&nats, &subjects).await {
            if s.seq == 1 {
                break s;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(fresh.worker_id, "w1");
    // The engine still holds the prompt: the new actor says so at once.
    let sorted = |mut b: Vec<u64>| {
        b.sort();
        b
    };
    assert!(fresh.precise, "{fresh:?}");
    assert_eq!(sorted(fresh.blocks.clone()), sorted(before.blocks.clone()));
    // Requests are served, and the index counts on from them.
    let other = format!("{PREFIX} Something else: {PREFIX} {PREFIX} What is three plus three?");
    client
        .generate(greedy(&other, 4))
        .await
        .unwrap()
        .collect()
        .await
        .expect("served");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = snapshot(&nats, &subjects).await.expect("a snapshot");
        if s.seq >= 2 && !s.blocks.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the index did not fill again: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(fleet.worker.status().await.unwrap().available);
}

/// Five greedy requests through `client`, each answered in full.
async fn serves(client: &switchyard::Client, what: &str) {
    for i in 0..5 {
        let reply = tokio::time::timeout(Duration::from_secs(60), async {
            client
                .generate(greedy("The capital of France is", 4))
                .await?
                .collect()
                .await
        })
        .await
        .unwrap_or_else(|_| panic!("{what}: request {i} timed out"))
        .unwrap_or_else(|e| panic!("{what}: request {i} failed: {e}"));
        assert_eq!(reply.tokens.len(), 4, "{what}: request {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_root_actor_is_noticed_and_the_rest_of_the_fleet_serves() {
    let fleet = fleet(|c| c.worker.threads = 1).await;
    let client = fleet.client().await;
    serves(&client, "before any fault").await;

    // --- A second coordinator, then the first one's actor panics.
    let second = switchyard::node::start_coordinator(&fleet.config)
        .await
        .expect("second coordinator");
    let deadline = Instant::now() + Duration::from_secs(10);
    while second.status().await.unwrap().workers.is_empty() {
        assert!(Instant::now() < deadline, "the second coordinator never saw the worker");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fleet.coordinator.inject_panic();
    let why = tokio::time::timeout(Duration::from_secs(15), fleet.coordinator.failed())
        .await
        .expect("the coordinator's failure is noticed");
    assert!(why.contains("coordinator"), "{why}");
    serves(&client, "after the first coordinator failed").await;

    // --- A second worker, then the first one's actor panics.
    let mut config = fleet.config.clone();
    config.worker.id = "w2".into();
    let loaded = switchyard::node::load(&config).await.expect("model loads");
    let w2 = switchyard::node::start_worker(&config, &loaded)
        .await
        .expect("second worker");
    let deadline = Instant::now() + Duration::from_secs(10);
    while second.status().await.unwrap().workers.len() < 2 {
        assert!(Instant::now() < deadline, "the coordinator never saw the second worker");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fleet.worker.inject_fault(Fault::PanicWorker);
    let why = tokio::time::timeout(Duration::from_secs(15), fleet.worker.failed())
        .await
        .expect("the worker's failure is noticed");
    assert!(why.contains("w1"), "{why}");
    serves(&client, "after worker w1 failed").await;
    // w1 is gone from the fleet (no heartbeats, no subscriptions), w2 serves on.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let workers = second.status().await.unwrap().workers;
        if workers.iter().all(|w| w.status.worker_id != "w1") {
            assert!(workers.iter().any(|w| w.status.worker_id == "w2"));
            break;
        }
        assert!(Instant::now() < deadline, "w1 still listed: {workers:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w2.shutdown(Duration::from_secs(5)).await;
    second.shutdown().await;
}
