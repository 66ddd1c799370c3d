//! Memory under abuse: a worker process takes 12,000 malformed and invalid messages
//! (random bytes, a bare `[]`, NaN configs, empty request ids, on every endpoint and
//! through a coordinator) and its resident memory stays flat; it still serves. What
//! does grow with real traffic — the KV slots' used positions and the KV block store
//! — is bounded by configuration (docs/operations.md, "Memory").

mod common;

use common::*;
use std::time::Duration;

fn rss_mb(pid: u32) -> u64 {
    switchyard_fabric::host::process_memory(Some(pid)).1 >> 20
}

/// A small deterministic generator (no extra dependency).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_leaves_memory_flat() {
    let nats = nats();
    let url = nats.url();
    let coordinator = switchyard::node::start_coordinator(&fleet_config(&url)).await.unwrap();
    let worker = worker_proc(&url, "w1");
    let client = client(&url, Duration::from_secs(10)).await;
    wait_for_workers(&client, &["w1"], Duration::from_secs(20)).await;
    // Warm it up with real requests first, so what is measured is the abuse alone.
    for _ in 0..3 {
        client
            .generate(greedy("Hello there", 4))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
    }
    let pid = worker.child.id();
    let before = rss_mb(pid);
    let nc = client.nats();
    let subjects = [
        "sy.v1.worker.w1.generate",
        "sy.v1.worker.w1.chat",
        "sy.v1.worker.w1.classify",
        "sy.v1.worker.w1.batch",
        "sy.v1.generate",
        "sy.v1.batch",
        "sy.v1.cancel.x",
        "sy.v1.kv.w1.snapshot",
    ];
    let mut rng = Lcg(7);
    for i in 0..12_000u64 {
        let body: Vec<u8> = match i % 4 {
            0 => (0..rng.next() % 2000).map(|_| rng.next() as u8).collect(),
            1 => {
                let mut r = greedy(&"x".repeat((rng.next() % 500) as usize), 2);
                r.config.temperature = f32::NAN;
                r.config.max_tokens = (rng.next() % 2) as u32;
                switchyard_messages::encode(&r)
            }
            2 => vec![0x90],
            _ => {
                let mut r = greedy("", 2);
                r.head.request_id = String::new();
                switchyard_messages::encode(&r)
            }
        };
        let subject = subjects[(rng.next() as usize) % subjects.len()];
        nc.publish_with_reply(subject, nc.new_inbox(), body.into())
            .await
            .unwrap();
        if i % 500 == 0 {
            nc.flush().await.unwrap();
        }
    }
    nc.flush().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_mb(pid);
    eprintln!("worker RSS: {before} MB before, {after} MB after 12,000 malformed messages");
    assert!(
        after <= before + 32,
        "RSS grew {before} → {after} MB on malformed input"
    );
    assert_serves(&client, "the worker still serves").await;
    coordinator.shutdown().await;
}
