//! A worker process killed mid-stream: the client gets `worker_lost` within its stall
//! limit, the coordinator drops the dead worker, another worker process serves next.

mod common;

use common::*;
use std::time::{Duration, Instant};
use switchyard::{ErrorCode, StreamEvent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_is_worker_lost_then_another_process_serves() {
    let server = nats();
    let url = server.url();
    let _coordinator = coordinator_proc(&url, "coord");
    let mut doomed = worker_proc(&url, "doomed");
    let stall = Duration::from_secs(3);
    let client = client(&url, stall).await;
    wait_for_workers(&client, &["doomed"], Duration::from_secs(10)).await;

    let mut stream = client.generate(greedy("Once upon a time", 2000)).await.unwrap();
    let mut got = 0;
    while got < 3 {
        match stream
            .next()
            .await
            .expect("stream open")
            .expect("tokens before the kill")
        {
            StreamEvent::Tokens(t) => got += t.len(),
            StreamEvent::Done { .. } => panic!("finished too early"),
        }
    }
    doomed.kill9();
    let killed_at = Instant::now();
    let err = loop {
        match stream.next().await {
            Some(Ok(StreamEvent::Tokens(_))) => continue, // already in flight before the kill
            Some(Ok(StreamEvent::Done { .. })) => panic!("a killed worker cannot finish"),
            Some(Err(e)) => break e,
            None => panic!("stream ended without an error"),
        }
    };
    let waited = killed_at.elapsed();
    assert_eq!(err.code(), Some(ErrorCode::WorkerLost), "{err}");
    match &err {
        switchyard::ClientError::Remote { received, .. } => assert!(received.len() >= 3, "what was received is kept"),
        other => panic!("{other}"),
    }
    // Never a hang: the error came after about one stall limit (generous bound for
    // a loaded machine; this checks "no hang", not speed).
    assert!(waited < stall * 4, "worker_lost after {waited:?}");

    // The coordinator forgets the dead worker once its heartbeats stop…
    wait_for_workers(&client, &[], Duration::from_secs(10)).await;
    // …and a new worker process serves the next request.
    let _rescue = worker_proc(&url, "rescue");
    wait_for_workers(&client, &["rescue"], Duration::from_secs(10)).await;
    let done = client
        .generate(greedy("The capital of France is", 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(done.worker_id, "rescue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_worker_process() {
    let server = nats();
    let url = server.url();
    let _coordinator = coordinator_proc(&url, "coord2");
    let mut worker = worker_proc(&url, "drainer");
    let client = client(&url, Duration::from_secs(5)).await;
    wait_for_workers(&client, &["drainer"], Duration::from_secs(10)).await;
    let stream = client.generate(greedy("The capital of France is", 24)).await.unwrap();
    // Give the request time to be admitted, then ask the worker to stop.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = tokio::task::spawn_blocking(move || {
        let s = worker.terminate(Duration::from_secs(30));
        (s, worker)
    });
    let done = stream.collect().await.expect("in-flight request finishes during drain");
    assert!(!done.tokens.is_empty());
    let (exit, _worker) = status.await.unwrap();
    assert!(exit.expect("worker exits after draining").success());
}
