//! Resumable streams: a worker kill -9'd mid-stream, the client resumes on the other
//! worker with the tokens it already has and the sampler's position; the caller's
//! stream completes, marked resumed, and equals an uninterrupted run — greedy and
//! seeded sampling alike. With resuming off, the same loss is `worker_lost`.

mod common;

use common::*;
use std::collections::HashMap;
use std::time::Duration;
use switchyard::{ClientError, StreamEvent};
use switchyard_messages::{ErrorCode, GenerateRequest};

fn request(seed: Option<u64>) -> GenerateRequest {
    let mut r = greedy("Once upon a time, in a small village by the sea, there lived", 80);
    if let Some(s) = seed {
        r.config.temperature = 0.9;
        r.config.top_k = 40;
        r.config.seed = Some(s);
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_its_worker_and_equals_an_uninterrupted_run() {
    let nats = nats();
    let url = nats.url();
    let coordinator = switchyard::node::start_coordinator(&fleet_config(&url)).await.unwrap();
    let mut procs: HashMap<String, Proc> = ["ra", "rb", "rc"]
        .iter()
        .map(|id| (id.to_string(), worker_proc(&url, id)))
        .collect();
    let client = client(&url, Duration::from_secs(2)).await;
    wait_for_workers(&client, &["ra", "rb", "rc"], Duration::from_secs(20)).await;

    for seed in [None, Some(7)] {
        let reference = client.generate(request(seed)).await.unwrap().collect().await.unwrap();
        assert!(
            reference.tokens.len() > 30,
            "the reference run is long enough to interrupt"
        );
        assert_eq!(reference.metrics.resumes, 0);

        let mut stream = client.generate(request(seed)).await.unwrap();
        let mut ids = Vec::new();
        while ids.len() < 12 {
            match stream.next().await.unwrap().unwrap() {
                StreamEvent::Tokens(t) => ids.extend(t.iter().map(|t| t.id)),
                StreamEvent::Done { .. } => panic!("ended before the kill"),
            }
        }
        let victim = stream.worker_id().to_string();
        procs.get_mut(&victim).expect("a known worker").kill9();
        procs.remove(&victim);
        let (finish, metrics) = loop {
            match stream.next().await.expect("the stream goes on") {
                Ok(StreamEvent::Tokens(t)) => ids.extend(t.iter().map(|t| t.id)),
                Ok(StreamEvent::Done {
                    finish_reason, metrics, ..
                }) => break (finish_reason, metrics),
                Err(e) => panic!("seed {seed:?}: the resumed stream failed: {e}"),
            }
        };
        assert_ne!(stream.worker_id(), victim, "finished elsewhere");
        assert_eq!(metrics.resumes, 1, "marked resumed");
        let want: Vec<u32> = reference.tokens.iter().map(|t| t.id).collect();
        assert_eq!(
            ids, want,
            "seed {seed:?}: the resumed stream equals the uninterrupted run"
        );
        assert_eq!(finish, reference.finish_reason);
    }

    // Resuming off: the same loss ends the stream with worker_lost.
    let mut stream = client.generate(request(None)).await.unwrap().without_resume();
    let mut got = 0;
    while got < 8 {
        if let StreamEvent::Tokens(t) = stream.next().await.unwrap().unwrap() {
            got += t.len();
        }
    }
    let victim = stream.worker_id().to_string();
    procs.get_mut(&victim).unwrap().kill9();
    let end = loop {
        match stream.next().await {
            Some(Ok(StreamEvent::Tokens(_))) => {}
            Some(Ok(StreamEvent::Done { .. })) => panic!("finished without its worker"),
            Some(Err(e)) => break e,
            None => panic!("ended without an error"),
        }
    };
    assert!(
        matches!(&end, ClientError::Remote { error, .. } if error.code == ErrorCode::WorkerLost),
        "{end}"
    );
    coordinator.shutdown().await;
}
