//! Nothing is answered with silence at NATS's `max_payload` (a nats-server with
//! `max_payload: 65536`): the client refuses one byte over at once; a request exactly
//! at the limit reaches the coordinator, whose forward would add headers, and is
//! refused as `bad_request` naming max_payload — not retried as `worker_lost`;
//! straight to a worker it is answered; a reply too large to send (classify logits)
//! is `reply_too_large`, via a coordinator and direct, and the worker keeps serving.

mod common;

use common::*;
use std::time::{Duration, Instant};
use switchyard::{Client, ClientError};
use switchyard_messages::{ClassifyRequest, ErrorCode, GenerateRequest, RequestHead};
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

const MAX: usize = 65536;

fn sized(n: usize) -> GenerateRequest {
    let mut r = GenerateRequest::generate("limit-probe-request-0001", "", "a".repeat(n));
    r.config.max_tokens = 2;
    r
}

async fn send(client: &Client, subject: &str, n: usize) -> Result<(), ClientError> {
    client
        .start(subject.to_string(), sized(n))
        .await?
        .collect()
        .await
        .map(|_| ())
}

fn refused_locally(e: &ClientError) -> bool {
    e.code() == Some(ErrorCode::BadRequest) && e.to_string().contains("bytes, over the NATS server's max_payload")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_limit_one_over_and_replies_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start_with_config(
        &find_nats_server("").unwrap(),
        &format!("max_payload: {MAX}"),
        dir.path(),
    )
    .unwrap();
    let url = nats.url();
    let config = fleet_config(&url);
    let coordinator = switchyard::node::start_coordinator(&config).await.unwrap();
    let loaded = switchyard::node::load(&config).await.unwrap();
    let worker = switchyard::node::start_worker(&config, &loaded).await.unwrap();
    let client = client(&url, Duration::from_secs(10)).await;
    wait_for_workers(&client, &["w1"], Duration::from_secs(10)).await;

    // The largest prompt the client sends: found by bisection on the client's own
    // check, which counts headers and body against the server's max_payload.
    let (mut lo, mut hi) = (1usize, MAX);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        match send(&client, "sy.v1.generate", mid).await {
            Err(e) if refused_locally(&e) => hi = mid,
            _ => lo = mid,
        }
    }
    // The envelope and the request-id header take the rest.
    assert!(
        lo > MAX - 1000,
        "the client's limit {lo} is far below max_payload {MAX}"
    );

    // One byte over: refused by the client at once.
    let started = Instant::now();
    let e = send(&client, "sy.v1.generate", lo + 1).await.unwrap_err();
    assert!(refused_locally(&e), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused locally, so no reply is awaited"
    );
    assert!(e.to_string().contains(&format!("max_payload of {MAX}")), "{e}");

    // Exactly at the limit, through a coordinator: its forward's headers push it over,
    // and it says so — bad_request naming max_payload, not a retryable worker_lost.
    let e = send(&client, "sy.v1.generate", lo).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e}");
    assert!(e.to_string().contains("forwarding headers"), "{e}");
    // Straight to the worker, the same request arrives and is answered (its tokens do
    // not fit the context: context_overflow) — an answer, not silence.
    let e = send(&client, "sy.v1.worker.w1.generate", lo).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::ContextOverflow), "{e}");

    // A reply too large to send: one prompt's logits (49,152 floats) > 64 KiB.
    for subject in ["sy.v1.classify", "sy.v1.worker.w1.classify"] {
        let req = ClassifyRequest {
            head: RequestHead::new(Client::new_request_id(), ""),
            prompts: vec!["Hello".into()],
            return_logits: true,
        };
        let started = Instant::now();
        let reply = client
            .nats()
            .request(subject.to_string(), switchyard_messages::encode(&req).into())
            .await
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(10));
        let e: switchyard_messages::ErrorReply = switchyard_messages::decode(&reply.payload)
            .unwrap_or_else(|err| panic!("{subject}: not an ErrorReply: {err}"));
        assert_eq!(e.error.code, ErrorCode::ReplyTooLarge, "{subject}: {:?}", e.error);
        assert!(!e.error.retryable);
        assert!(e.error.message.contains("max_payload of 65536"), "{}", e.error.message);
    }
    // Without logits the same classify fits, and generation still works.
    let ok = client
        .classify(ClassifyRequest {
            head: RequestHead::new(Client::new_request_id(), ""),
            prompts: vec!["Hello".into()],
            return_logits: false,
        })
        .await
        .unwrap();
    assert!(ok.results[0].result.is_some());
    assert_serves(&client, "generation still works").await;
    worker.shutdown(Duration::from_secs(2)).await;
    coordinator.shutdown().await;
}
