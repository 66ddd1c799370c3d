//! Connections to a NATS cluster, the way docs/deploy.md sets one up: two real
//! nats-servers joined by routes with `no_advertise` (so a client knows only the
//! servers it was given), a worker and a coordinator given both as
//! `--nats a,b`; the server the worker is on is killed under it and it moves to the
//! other. And a forward its coordinator no longer waits for is dropped unrun.

mod common;

use common::*;
use std::time::{Duration, Instant};
use switchyard_messages::subjects::{HEADER_ADMIT_BY, HEADER_STREAM_TO};
use switchyard_messages::{decode, encode, Admission, Subjects};
use switchyard_procs::nats_server::{find_nats_server, free_port, NatsServer};

/// Two cluster members named `a` and `b`, routed to each other, not advertising
/// each other to clients.
fn cluster(dir: &std::path::Path) -> (NatsServer, NatsServer) {
    let bin = find_nats_server("").expect("nats-server (run scripts/setup.sh)");
    let (ra, rb) = (free_port().unwrap(), free_port().unwrap());
    let member = |name: &str, own: u16, other: u16| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        let config = format!(
            "server_name: {name}\ncluster {{ name: sy, listen: 127.0.0.1:{own}, no_advertise: true, \
             routes: [nats-route://127.0.0.1:{other}] }}"
        );
        NatsServer::start_with_config(&bin, &config, &d).expect("cluster member starts")
    };
    let a = member("a", ra, rb);
    let b = member("b", rb, ra);
    (a, b)
}

/// The NATS server the worker reports being on (`a` or `b`).
async fn worker_server(client: &switchyard::Client) -> String {
    let s = client.status().await.unwrap();
    let nats = &s.workers[0].status.nats_server;
    nats.split(' ').next().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_given_a_server_list_survive_the_loss_of_their_server() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = cluster(dir.path());
    let list = format!("{},{}", a.url(), b.url());
    let mut servers = [Some(a), Some(b)];
    let worker = worker_proc(&list, "w1");
    let _coordinator = coordinator_proc(&list, "c1");
    let c = client(&list, Duration::from_secs(5)).await;
    wait_for_workers(&c, &["w1"], Duration::from_secs(10)).await;
    assert_serves(&c, "on the first server").await;
    let on = worker_server(&c).await;
    assert!(on == "a" || on == "b", "status names the worker's NATS server: {on:?}");

    // Kill the server the worker is on: it reconnects to the other member, which it
    // knows only from its list (no_advertise).
    let i = usize::from(on == "b");
    drop(servers[i].take());
    let killed = Instant::now();
    worker.wait_for("reconnected to NATS", Duration::from_secs(15));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(s) = c.status().await {
            if s.workers.len() == 1 && !s.workers[0].status.nats_server.starts_with(&on) {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the worker never showed up on the other server"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "the worker moved from {on} to the other member in {:?}",
        killed.elapsed()
    );
    assert_serves(&c, "after its server died").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_its_coordinator_stopped_waiting_for_is_dropped_unrun() {
    let f = fleet(|_| {}).await;
    let c = f.client().await;
    let nats = c.nats().clone();
    let subject = Subjects::new("sy").worker("w1", "generate");
    let payload = encode(&greedy("The capital of France is", 4));
    let forward = |admit_by: u64| {
        let (nats, subject, payload) = (nats.clone(), subject.clone(), payload.clone());
        async move {
            let inbox = nats.new_inbox();
            let mut stream = nats.subscribe(inbox.clone()).await.unwrap();
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(HEADER_STREAM_TO, inbox.as_str());
            headers.insert(HEADER_ADMIT_BY, admit_by.to_string().as_str());
            let request = async_nats::Request::new()
                .payload(payload.into())
                .headers(headers)
                .timeout(Some(Duration::from_secs(1)));
            let answer = nats.send_request(subject, request).await;
            let admitted = answer.ok().and_then(|m| decode::<Admission>(&m.payload).ok());
            let chunk = tokio::time::timeout(Duration::from_millis(500), futures::StreamExt::next(&mut stream)).await;
            (admitted, chunk.is_ok())
        }
    };
    let before = f.worker.status().await.unwrap().completed;
    // Its coordinator gave up a second ago: no admission answer, no chunk, nothing run.
    let (admitted, streamed) = forward(switchyard_actors::now_ms() - 1_000).await;
    assert!(admitted.is_none() && !streamed, "a stale forward was answered or run");
    // The same forward in time is admitted and streams.
    let (admitted, streamed) = forward(switchyard_actors::now_ms() + 2_000).await;
    assert!(admitted.is_some_and(|a| a.accepted) && streamed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = f.worker.status().await.unwrap().completed;
    assert_eq!(after - before, 1, "only the forward in time was computed");
}
