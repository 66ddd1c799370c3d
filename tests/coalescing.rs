//! Coalescing (`worker.coalesce_ms`): tokens that are ready together travel
//! in one chunk, and none is lost, duplicated or reordered on the way.
//!
//! Most tests serve `fabric-probe`, a compute-free fake model whose tokens are all
//! ready at once, so what is coalesced does not depend on timing: the worker drains
//! every waiting token into the chunk it builds (up to `MAX_TOKENS`), whatever the
//! window. The hold-while-tokens-come-fast rules are unit-tested on the `Coalescer`
//! itself (`workers/src/worker/coalesce.rs`).

mod common;

use common::*;
use std::time::Duration;
use switchyard::{Client, FinishReason, GenerateRequest, StreamEvent};
use switchyard_workers::worker::coalesce::MAX_TOKENS;

/// Serves the probe behind a coordinator with `coalesce_ms`, generates `n` tokens
/// and returns the sizes of the chunks that carried them, after checking that the
/// ids are exactly 0..n in order and the stream ended normally.
async fn chunk_sizes(coalesce_ms: u64, n: u32) -> Vec<usize> {
    let nats = nats();
    let mut config = fleet_config(&nats.url());
    config.worker.id = "probe".into();
    config.worker.coalesce_ms = coalesce_ms;
    config.validate().expect("valid test config");
    let coordinator = switchyard::node::start_coordinator(&config).await.expect("coordinator");
    let worker = switchyard_bench::probe::start_worker(&config).await.expect("worker");
    let client = client(&nats.url(), Duration::from_secs(5)).await;
    wait_for_workers(&client, &["probe"], Duration::from_secs(10)).await;

    let mut req = GenerateRequest::generate(Client::new_request_id(), "fabric-probe", "x");
    req.config.max_tokens = n;
    let mut stream = client.generate(req).await.expect("admitted");
    let mut ids = Vec::new();
    let mut sizes = Vec::new();
    let (finish, metrics) = loop {
        match stream.next().await.expect("a final chunk").expect("no error") {
            StreamEvent::Tokens(t) => {
                sizes.push(t.len());
                ids.extend(t.iter().map(|t| t.id));
            }
            StreamEvent::Done {
                finish_reason, metrics, ..
            } => break (finish_reason, metrics),
        }
    };
    assert_eq!(finish, FinishReason::Length);
    assert_eq!(metrics.generated_tokens, n);
    assert_eq!(ids, (0..n).collect::<Vec<_>>(), "every token, once, in order");
    worker.shutdown(Duration::from_secs(5)).await;
    coordinator.shutdown().await;
    sizes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_tokens_share_chunks_and_arrive_in_order() {
    for coalesce_ms in [0, 10] {
        let sizes = chunk_sizes(coalesce_ms, 500).await;
        assert!(
            sizes.iter().any(|&s| s > 1),
            "coalesce_ms {coalesce_ms}: tokens ready together share a chunk: {sizes:?}"
        );
        assert!(
            sizes.len() < 500 && sizes.iter().all(|&s| (1..=MAX_TOKENS).contains(&s)),
            "coalesce_ms {coalesce_ms}: between 1 and {MAX_TOKENS} tokens per chunk: {sizes:?}"
        );
    }
}

/// The CPU engine's stream lets the worker hold tokens without being woken for each
/// one (`GenerateStream::hold`; its end and errors still wake it): through
/// NATS the tokens are the in-process greedy ones, each once and in order, and fewer
/// chunks than tokens carry them. One async thread, as a CPU worker runs.
#[tokio::test(flavor = "current_thread")]
async fn held_engine_tokens_arrive_whole_and_in_order() {
    let prompt = "The three primary colors are";
    let n = 48;
    let model =
        switchyard_workers::EngineModel::load(&demo_model(), &switchyard_messages::LoadConfig::default()).unwrap();
    let (want, _) = greedy_ids(&model, switchyard_backend::Prompt::Text(prompt.into()), n).await;
    drop(model);

    // The longest window allowed: tokens come every few ms, so chunks hold many.
    let fleet = fleet(|c| c.worker.coalesce_ms = 100).await;
    let client = fleet.client().await;
    let mut stream = client.generate(greedy(prompt, n)).await.expect("admitted");
    let (mut ids, mut chunks) = (Vec::new(), 0);
    let finish = loop {
        match stream.next().await.expect("a final chunk").expect("no error") {
            StreamEvent::Tokens(t) if t.is_empty() => {} // a keep-alive
            StreamEvent::Tokens(t) => {
                chunks += 1;
                ids.extend(t.iter().map(|t| t.id));
            }
            StreamEvent::Done { finish_reason, .. } => break finish_reason,
        }
    };
    assert_eq!(ids, want, "the in-process greedy tokens, each once, in order");
    assert_eq!(finish, FinishReason::Length);
    assert!(chunks < ids.len(), "{} tokens held into {chunks} chunks", ids.len());
    fleet.worker.shutdown(Duration::from_secs(5)).await;
    fleet.coordinator.shutdown().await;
}

/// A deadline that passes mid-generation ends the stream with `deadline_exceeded`
/// while the worker holds chunks (tokens queue quietly then, so only its timers
/// bring it back), after a gapless prefix of the in-process greedy tokens. (The
/// worker also sends the tokens still queued at that moment; from outside they are
/// indistinguishable from tokens never computed, so this does not pin that part.)
#[tokio::test(flavor = "current_thread")]
async fn a_passed_deadline_sends_the_tokens_computed_before_it() {
    let prompt = "The history of the city begins with a small settlement on the banks of a wide river. \
                  Farmers grew wheat and barley in the fertile soil, and traders arrived by boat.";
    let n = 1024; // seconds of decoding: far more than fits before the deadline
    let model =
        switchyard_workers::EngineModel::load(&demo_model(), &switchyard_messages::LoadConfig::default()).unwrap();
    let (want, _) = greedy_ids(&model, switchyard_backend::Prompt::Text(prompt.into()), n).await;
    assert_eq!(want.len(), n as usize, "the model must not end its answer early here");
    drop(model);

    let fleet = fleet(|c| c.worker.coalesce_ms = 100).await;
    let client = fleet.client().await;
    let mut req = greedy(prompt, n);
    req.head.deadline_ms = Some(switchyard_fabric::now_ms() + 500);
    let mut stream = client.generate(req).await.expect("admitted");
    let mut ids = Vec::new();
    let err = loop {
        match stream.next().await {
            Some(Ok(StreamEvent::Tokens(t))) => ids.extend(t.iter().map(|t| t.id)),
            Some(Ok(done)) => panic!("the deadline should end the stream, it ended with {done:?}"),
            Some(Err(e)) => break e,
            None => panic!("the stream ended without an error"),
        }
    };
    assert_eq!(
        err.code(),
        Some(switchyard_messages::ErrorCode::DeadlineExceeded),
        "{err}"
    );
    assert!(!ids.is_empty(), "tokens were computed before the deadline");
    assert!(ids.len() < want.len(), "the deadline passed before the end");
    assert_eq!(ids[..], want[..ids.len()], "a gapless prefix of the greedy tokens");
    fleet.worker.shutdown(Duration::from_secs(5)).await;
    fleet.coordinator.shutdown().await;
}
