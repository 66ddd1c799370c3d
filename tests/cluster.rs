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
    let (admitted, streamed) = forward(switchyard_fabric::now_ms() - 1_000).await;
    assert!(admitted.is_none() && !streamed, "a stale forward was answered or run");
    // The same forward in time is admitted and streams.
    let (admitted, streamed) = forward(switchyard_fabric::now_ms() + 2_000).await;
    assert!(admitted.is_some_and(|a| a.accepted) && streamed);
    // Wait for it to finish (a loaded CI host may take seconds), then a little more:
    // nothing else may be computed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while f.worker.status().await.unwrap().completed == before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = f.worker.status().await.unwrap().completed;
    assert_eq!(after - before, 1, "only the forward in time was computed");
}

/// A TCP link to `to` with `delay` added each way, on a free loopback port: what a
/// host far away looks like (this kernel has no netem). Order is kept: every chunk
/// is written `delay` after it was read.
async fn delayed_link(to: u16, delay: Duration) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let pipe = move |mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf| async move {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
        tokio::spawn(async move {
            while let Some((at, bytes)) = rx.recv().await {
                tokio::time::sleep_until(at).await;
                if to.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        });
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0
                || tx
                    .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                return;
            }
        }
    };
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(pipe(cr, sw));
            tokio::spawn(pipe(sr, cw));
        }
    });
    port
}

/// `n` rounds of two short requests at once: who served each, and each one's time
/// to first token (ms).
async fn pairs(c: &switchyard::Client, n: usize) -> (std::collections::BTreeMap<String, usize>, Vec<f64>) {
    let mut served_by = std::collections::BTreeMap::<String, usize>::new();
    let mut ttfts = Vec::new();
    for _ in 0..n {
        let pair: Vec<_> = (0..2)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move {
                    let sent = Instant::now();
                    let mut s = c.generate(greedy("The capital of France is", 4)).await.unwrap();
                    let _ = s.next().await;
                    let ttft = sent.elapsed();
                    let worker = s.worker_id().to_string();
                    while s.next().await.is_some() {}
                    (worker, ttft)
                })
            })
            .collect();
        for p in pair {
            let (w, t) = p.await.unwrap();
            *served_by.entry(w).or_default() += 1;
            ttfts.push(t.as_secs_f64() * 1e3);
        }
    }
    (served_by, ttfts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_far_away_gets_a_small_share_while_a_near_one_has_room() {
    let nats = nats();
    let _near = worker_proc(&nats.url(), "near");
    let _coordinator = coordinator_proc(&nats.url(), "c1");
    let c = client(&nats.url(), Duration::from_secs(10)).await;
    // The same fleet with no delay first: its mean time to first token is what the
    // far worker's network should cost little against (printed, not asserted: the
    // machines are shared and noisy).
    let baseline = {
        let mut second = worker_proc(&nats.url(), "near-2");
        wait_for_workers(&c, &["near", "near-2"], Duration::from_secs(15)).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (_, ttfts) = pairs(&c, 12).await;
        second.kill9();
        ttfts.iter().sum::<f64>() / ttfts.len() as f64
    };
    let far_port = delayed_link(nats.port(), Duration::from_millis(200)).await;
    let far_url = format!("nats://127.0.0.1:{far_port}");
    let _far = worker_proc(&far_url, "far");
    wait_for_workers(&c, &["far", "near"], Duration::from_secs(15)).await;
    // Each worker's first round trip comes from the probe sent when it joins (far's
    // takes 400 ms); until then a worker counts as next door.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Both measure the same speed; only the network differs. Two at a time: near
    // (capacity 4) always has room.
    let (served_by, ttfts) = pairs(&c, 12).await;
    let far = served_by.get("far").copied().unwrap_or(0);
    let mean = ttfts.iter().sum::<f64>() / ttfts.len() as f64;
    eprintln!(
        "served by {served_by:?}; mean TTFT {mean:.0} ms with a worker 400 ms away, {baseline:.0} ms with both near: {:.2}x",
        mean / baseline
    );
    assert!(
        far <= 2,
        "the worker 400 ms away took {far} of 24 while the near one had room"
    );
    // Ten at once: more than near has room for (capacity 4 + 1 sent ahead), so far
    // takes the rest rather than leaving them to wait.
    let burst: Vec<_> = (0..10)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move {
                let s = c.generate(greedy("Once upon a time", 32)).await.unwrap();
                s.collect().await.unwrap().worker_id
            })
        })
        .collect();
    let mut far_in_burst = 0;
    for b in burst {
        far_in_burst += usize::from(b.await.unwrap() == "far");
    }
    eprintln!("far served {far_in_burst} of a burst of 10");
    assert!(
        far_in_burst > 0,
        "the far worker idled while requests waited for the near one"
    );
}
