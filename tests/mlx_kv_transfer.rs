//! KV that travels between MLX workers (protocol 1.11 over the bridge's `kv_*` ops),
//! end to end: a real nats-server, a coordinator and `metal` workers running MLX's CPU
//! build (`mlx_allow_cpu`) on the demo model converted to F32 safetensors.
//!
//! - A document computed on worker A is pulled by worker B — read out of A's prompt
//!   cache, kept in B's bridge until the generation, which takes it as its cache —
//!   and B then holds A's KV bit for bit and answers with A's tokens: greedy, seeded,
//!   and with a LoRA adapter (the adapter's key travels with it).
//! - A pull of another format, with an adapter not loaded or of tokens no cache holds
//!   is refused or empty.
//! - A `prefill` and a `decode` MLX worker split long prompts between them and answer
//!   as one worker does, greedy and seeded.
//! - A session on a draining MLX worker moves to another with its KV and decodes on.
//!
//! MLX's CPU build computes a prompt at some 20 tokens a second on a 2-core VM, so the
//! documents here are short (~250 tokens).

mod common;

use common::*;
use std::path::Path;
use std::time::Duration;
use switchyard::node::{self, Loaded};
use switchyard::{Client, Completion, Config, GenerateRequest};
use switchyard_backend::Prompt;
use switchyard_messages::WorkerRole;

const NAME: &str = "smol";

fn worker_config(url: &str, id: &str, role: WorkerRole, adapter: Option<&Path>) -> Config {
    let mut c = fleet_config(url);
    c.worker.id = id.into();
    c.worker.role = role;
    c.worker.model = converted_demo_model().display().to_string();
    c.worker.model_name = NAME.into();
    c.worker.backend = "metal".into();
    c.worker.mlx_allow_cpu = true;
    c.worker.mlx_python = python().display().to_string();
    if let Some(path) = adapter {
        c.worker.adapters = vec![switchyard_config::AdapterConfig {
            name: "one".into(),
            path: path.display().to_string(),
            scale: 1.0,
        }];
    }
    c.validate().expect("valid config");
    c
}

fn question(topic: &str, sections: usize) -> String {
    format!(
        "{}Question: who cared for the {topic}?\nAnswer:",
        document(topic, sections)
    )
}

/// A document A computes cold, then B (pinned) pulls it from A: B then holds A's KV
/// bit for bit and answers with A's tokens.
async fn pulled_equals_cold(
    client: &Client,
    models: [&Loaded; 2],
    topic: &str,
    seed: Option<u64>,
    adapter: Option<&str>,
) {
    let prompt = question(topic, 7);
    let cold = ask_pinned(client, NAME, "w-a", &prompt, seed, adapter).await;
    let before = kv_transfer_of(client, "w-b").await;
    let pulled = ask_pinned(client, NAME, "w-b", &prompt, seed, adapter).await;
    let m = &pulled.metrics;
    let prompt_tokens = m.prompt_tokens as usize;
    assert!(prompt_tokens > 150, "{m:?}");
    assert_eq!(
        m.pulled_tokens as usize,
        prompt_tokens - 1,
        "B pulled every whole block of the prompt and its tail (all but its last token) from A: {m:?}"
    );
    assert_eq!(
        m.cached_tokens, m.pulled_tokens,
        "B's bridge took the pulled blocks as its cache and computed only the rest: {m:?}"
    );
    // The KV B holds for the pulled prefix is the KV A computed.
    let kv = |i: usize| models[i].model.kv_transfer().expect("an MLX worker exchanges KV");
    let tokens = kv(1).prompt_tokens(&Prompt::Text(prompt.clone())).await.unwrap();
    let blocks = m.pulled_tokens as usize / 16; // the tail is compared through the answer
    let prefix = tokens[..blocks * 16].to_vec();
    let adapter = adapter.map(str::to_string);
    let a = kv(0)
        .export_kv(prefix.clone(), adapter.clone(), 0, blocks)
        .await
        .unwrap();
    let b = kv(1).export_kv(prefix, adapter.clone(), 0, blocks).await.unwrap();
    assert_eq!((a.count, b.count), (blocks, blocks), "both hold the prefix");
    assert!(a.data == b.data, "{topic}: B holds A's KV bit for bit");
    assert_eq!(
        token_ids(&pulled),
        token_ids(&cold),
        "{topic} (seed {seed:?}, adapter {adapter:?}): B's answer after the pull is A's cold answer"
    );
    eprintln!(
        "{topic}: {prompt_tokens} prompt tokens; A computed them in {} ms, B pulled {} in {} ms and computed {} in {} ms",
        cold.metrics.prefill_us / 1000,
        m.pulled_tokens,
        m.pull_us / 1000,
        prompt_tokens - m.cached_tokens as usize,
        m.prefill_us / 1000
    );
    let after = kv_transfer_of(client, "w-b").await;
    assert_eq!(after.pulls, before.pulls + 1, "{after:?}");
    assert_eq!(after.pulled_tokens - before.pulled_tokens, u64::from(m.pulled_tokens));
    assert_eq!(after.pull_fallbacks, before.pull_fallbacks, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mlx_workers_pull_a_peers_prefix_and_answer_as_if_they_had_computed_it() {
    let adapters = tempfile::tempdir().unwrap();
    let lora = make_lora(adapters.path(), 1);
    let nats = nats();
    let url = nats.url();
    let coordinator = node::start_coordinator(&fleet_config(&url)).await.unwrap();
    let mut workers = Vec::new();
    for id in ["w-a", "w-b"] {
        let c = worker_config(&url, id, WorkerRole::Both, Some(&lora));
        let loaded = node::load(&c).await.expect("the MLX bridge loads");
        workers.push((node::start_worker(&c, &loaded).await.unwrap(), loaded));
    }
    let client = client(&url, Duration::from_secs(120)).await;
    wait_for_workers(&client, &["w-a", "w-b"], Duration::from_secs(20)).await;
    let formats = wait_for_kv_formats(&client, &["w-a", "w-b"], Duration::from_secs(60)).await;
    let a = formats[0].clone();
    assert_eq!(a, formats[1], "two bridges of one MLX and model share a format");
    assert!(a.engine.starts_with("mlx-") && a.engine.ends_with("/cpu"), "{a:?}");
    assert_eq!(
        (a.dtype.as_str(), a.layers, a.kv_heads, a.head_dim),
        ("f32", 30, 3, 64),
        "{a:?}"
    );
    assert_eq!(a.block_tokens, 16);

    let models = [&workers[0].1, &workers[1].1];
    pulled_equals_cold(&client, models, "river", None, None).await;
    pulled_equals_cold(&client, models, "harbour", Some(7), None).await;
    pulled_equals_cold(&client, models, "orchard", None, Some("one")).await;
    let served = kv_transfer_of(&client, "w-a").await;
    assert!(served.served_bytes > 0, "{served:?}");

    // Pulls of another format, an adapter not loaded or under another key, or tokens
    // no cache holds get nothing.
    check_kv_refusals(&url, "w-a", &a, "nope", "nope").await;
    check_kv_refusals(&url, "w-a", &a, "one", "one").await;

    stop_workers(workers).await;
    coordinator.shutdown().await;
}

/// Disaggregated prefill and decode between MLX workers (protocol 1.12): a long
/// prompt sent to the fleet streams from the `decode` worker, whose bridge computed
/// only its last tokens — the `prefill` worker's computed the rest and the decode
/// worker pulled it — and the answer is the one a single worker gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prefill_mlx_worker_feeds_a_decode_mlx_worker() {
    let cases = [("lighthouse", None), ("meadow", Some(11))];
    let request = |topic: &str, seed: Option<u64>| {
        let mut req = GenerateRequest::generate(Client::new_request_id(), NAME, question(topic, 7));
        req.config.max_tokens = 24;
        if let Some(seed) = seed {
            req.config.temperature = 0.8;
            req.config.seed = Some(seed);
        }
        req
    };
    // What one worker answers, computing each prompt whole (a fleet of its own).
    let mut want = Vec::new();
    {
        let nats = nats();
        let url = nats.url();
        let coordinator = node::start_coordinator(&fleet_config(&url)).await.unwrap();
        let client = client(&url, Duration::from_secs(120)).await;
        let c = worker_config(&url, "w-a", WorkerRole::Both, None);
        let mut loaded = node::load(&c).await.expect("the MLX bridge loads");
        let w = node::start_worker(&c, &loaded).await.unwrap();
        wait_for_workers(&client, &["w-a"], Duration::from_secs(20)).await;
        for (topic, seed) in cases {
            let done: Completion = client
                .generate(request(topic, seed))
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
            want.push(token_ids(&done));
        }
        w.shutdown(Duration::from_secs(5)).await;
        loaded.stop();
        coordinator.shutdown().await;
    }
    let nats = nats();
    let url = nats.url();
    // The documents are short (MLX's CPU build is slow): disaggregate from 128 tokens.
    let mut fleet = fleet_config(&url);
    fleet.coordinator.disagg_min_tokens = 128;
    let coordinator = node::start_coordinator(&fleet).await.unwrap();
    let client = client(&url, Duration::from_secs(120)).await;
    let mut workers = Vec::new();
    for (id, role) in [("w-p", WorkerRole::Prefill), ("w-d", WorkerRole::Decode)] {
        let c = worker_config(&url, id, role, None);
        let loaded = node::load(&c).await.expect("the MLX bridge loads");
        workers.push((node::start_worker(&c, &loaded).await.unwrap(), loaded));
    }
    wait_for_workers(&client, &["w-p", "w-d"], Duration::from_secs(20)).await;
    wait_for_kv_formats(&client, &["w-p", "w-d"], Duration::from_secs(60)).await;
    for ((topic, seed), want) in cases.into_iter().zip(&want) {
        let done = client
            .generate(request(topic, seed))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_disaggregated(&done, want, &format!("{topic} (seed {seed:?})"), true);
        settle(&client).await;
    }
    let p = kv_transfer_of(&client, "w-p").await;
    let d = kv_transfer_of(&client, "w-d").await;
    assert_eq!((p.prefills_served, d.remote_prefills), (2, 2), "{p:?} {d:?}");
    stop_workers(workers).await;
    coordinator.shutdown().await;
}

/// A session on an MLX worker moves with its KV when that worker drains (protocol
/// 1.13): the adopting MLX worker pulls the session's cache from the draining one's
/// bridge, computes only its last partial block, and decodes as the undisturbed
/// session does, greedy and seeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_mlx_worker_moves_its_sessions_with_their_kv() {
    use switchyard_messages::session::{ContextManifest, OpenSessionRequest};
    use switchyard_messages::GenerateConfig;
    let nats = nats();
    let url = nats.url();
    let coordinator = node::start_coordinator(&fleet_config(&url)).await.unwrap();
    let mut workers = Vec::new();
    for id in ["w-a", "w-b"] {
        let c = worker_config(&url, id, WorkerRole::Both, None);
        let loaded = node::load(&c).await.expect("the MLX bridge loads");
        workers.push((node::start_worker(&c, &loaded).await.unwrap(), loaded));
    }
    let client = client(&url, Duration::from_secs(120)).await;
    wait_for_workers(&client, &["w-a", "w-b"], Duration::from_secs(20)).await;
    wait_for_kv_formats(&client, &["w-a", "w-b"], Duration::from_secs(60)).await;
    let manifest = ContextManifest {
        profile: "reader".into(),
        model: NAME.into(),
        ..ContextManifest::default()
    };
    let open = |worker: &str| OpenSessionRequest {
        fence: "owner-1".into(),
        worker_id: worker.into(),
        ..OpenSessionRequest::default()
    };
    let prefix = document("harbour", 7);
    let suffix = "\nQuestion: who kept the harbour lights?\nAnswer:";
    let greedy = GenerateConfig {
        max_tokens: 12,
        ..GenerateConfig::default()
    };
    let seeded = GenerateConfig {
        max_tokens: 12,
        temperature: 0.8,
        seed: Some(7),
        ..GenerateConfig::default()
    };
    // The undisturbed session, on w-a.
    let reference = client.open_session(open("w-a")).await.unwrap();
    reference.ensure_prefix(&prefix, &manifest).await.unwrap();
    reference.prefill_suffix(suffix, &manifest).await.unwrap();
    let mut want = Vec::new();
    for cfg in [&greedy, &greedy, &seeded] {
        let c = reference.decode(cfg.clone()).await.unwrap().collect().await.unwrap();
        want.push(token_ids(&c));
    }
    reference.close().await.unwrap();

    let s = client.open_session(open("w-a")).await.unwrap();
    s.ensure_prefix(&prefix, &manifest).await.unwrap();
    s.prefill_suffix(suffix, &manifest).await.unwrap();
    let first = s.decode(greedy.clone()).await.unwrap().collect().await.unwrap();
    assert_eq!((token_ids(&first), first.worker_id.as_str()), (want[0].clone(), "w-a"));
    let before = s.explain().await.unwrap();
    let (a, mut loaded_a) = workers.remove(0);
    a.shutdown(Duration::from_secs(60)).await;
    loaded_a.stop();
    let after = s.explain().await.unwrap();
    assert_eq!(
        (after.resident_tokens, &after.stable_token_hash),
        (before.resident_tokens, &before.stable_token_hash),
        "the session's state moved"
    );
    for (cfg, want) in [(&greedy, &want[1]), (&seeded, &want[2])] {
        let c = s.decode(cfg.clone()).await.unwrap().collect().await.unwrap();
        assert_eq!(c.worker_id, "w-b", "the adopter decodes");
        assert_eq!(&token_ids(&c), want, "as the undisturbed session");
    }
    let b = kv_transfer_of(&client, "w-b").await;
    assert_eq!(b.sessions_adopted, 1, "{b:?}");
    assert_eq!(
        b.pulled_tokens,
        u64::from(before.resident_tokens) - 1,
        "the session's KV pulled, all but the token its next decode feeds: {b:?}"
    );
    s.close().await.unwrap();
    stop_workers(workers).await;
    coordinator.shutdown().await;
}
