//! NATS outages: while nats-server is down a client fails at once with a retryable
//! code (never a stall); a worker process told to stop while its NATS server is gone
//! exits within seconds; after the server comes back on the same port, coordinator
//! and worker reconnect by themselves and the fleet serves again — measured.

mod common;

use common::*;
use std::time::{Duration, Instant};
use switchyard_messages::ErrorCode;
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fast_while_down_exit_on_sigterm_recover_after() {
    let bin = find_nats_server("").unwrap();
    let nats = NatsServer::start(&bin).unwrap();
    let (url, port) = (nats.url(), nats.port());
    let mut coordinator = coordinator_proc(&url, "coordinator");
    let _w1 = worker_proc(&url, "stays");
    let mut w2 = worker_proc(&url, "leaves");
    // The stall limit is long, so "at once" below is told from a stall by a wide margin
    // on a loaded machine.
    let stall = Duration::from_secs(20);
    let client = client(&url, stall).await;
    wait_for_workers(&client, &["leaves", "stays"], Duration::from_secs(20)).await;

    drop(nats); // SIGKILL: the server is gone.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A request now fails at once, retryably: well before the stall limit (the
    // figure is printed; on an idle machine it is milliseconds).
    let started = Instant::now();
    let e = match client.generate(greedy("Hello", 4)).await {
        Ok(s) => s.collect().await.unwrap_err(),
        Err(e) => e,
    };
    let took = started.elapsed();
    eprintln!("a request with NATS down failed after {took:?}");
    assert!(took < stall / 4, "took {took:?}: that is waiting, not failing at once");
    assert_eq!(e.code(), Some(ErrorCode::Unavailable), "{e}");
    assert!(matches!(&e, switchyard::ClientError::Remote { error, .. } if error.retryable));

    // A worker told to stop with its server gone exits within seconds.
    let started = Instant::now();
    let status = tokio::task::block_in_place(|| w2.terminate(Duration::from_secs(15)));
    let took = started.elapsed();
    assert!(status.is_some(), "the worker did not exit within 15 s of SIGTERM");
    assert!(
        took < Duration::from_secs(10),
        "the worker took {took:?} to exit without NATS"
    );
    eprintln!("worker exit without NATS: {took:?}");

    // The server comes back on its port; the fleet serves again without help.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _nats = NatsServer::start_on(&bin, port).unwrap();
    let back = Instant::now();
    let deadline = back + Duration::from_secs(30);
    loop {
        let ok = match client.generate(greedy("The capital of France is", 3)).await {
            Ok(s) => s.collect().await.is_ok(),
            Err(_) => false,
        };
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "the fleet did not serve again within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovered = back.elapsed();
    eprintln!("serving again {recovered:?} after nats-server restarted");
    wait_for_workers(&client, &["stays"], Duration::from_secs(10)).await;
    let status = tokio::task::block_in_place(|| coordinator.terminate(Duration::from_secs(15)));
    assert!(status.is_some_and(|s| s.success()));
}
