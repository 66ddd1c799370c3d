//! KV that travels between llama-server workers (protocol 1.11 on llama.cpp's slot
//! files), end to end: a real nats-server, a coordinator and `rocm` workers whose
//! supervised llama-servers (the project's llama.cpp build) run on the CPU
//! (`gpu_allow_cpu`).
//!
//! - A document computed on worker A is pulled by worker B — A's slot saved, read and
//!   cut into blocks, B's written back as a slot file and restored — and B's server
//!   then holds A's KV bit for bit and answers with A's tokens: greedy, and seeded
//!   too with `-fa off` (V stored transposed, as tests/llama_cpp_workers.rs runs
//!   them); with `-fa on` (V in rows) greedy only, as flash attention rounds the few
//!   tokens computed after the prefix differently.
//! - A pull of another format, with a LoRA adapter or of tokens no slot holds is
//!   refused or empty.
//! - A `prefill` and a `decode` llama-server worker split long prompts between them
//!   and answer as one server does, greedy and seeded.

mod common;

use common::*;
use std::time::{Duration, Instant};
use switchyard::node::{self, Loaded};
use switchyard::{Client, Completion, Config, GenerateRequest};
use switchyard_backend::Prompt;
use switchyard_messages::WorkerRole;

const NAME: &str = "smol";

fn worker_config(url: &str, id: &str, bin: &std::path::Path, flash_attn: &str) -> Config {
    worker_config_as(url, id, bin, flash_attn, WorkerRole::Both)
}

fn worker_config_as(url: &str, id: &str, bin: &std::path::Path, flash_attn: &str, role: WorkerRole) -> Config {
    let mut c = fleet_config(url);
    c.worker.id = id.into();
    c.worker.role = role;
    c.worker.model_name = NAME.into();
    c.worker.threads = 1;
    c.worker.backend = "rocm".into();
    c.worker.gpu_allow_cpu = true;
    c.worker.llama_server_bin = bin.display().to_string();
    c.worker.llama_server_args = format!("-fa {flash_attn}");
    c.worker.parallel_slots = 2;
    c.worker.context_len = 8192;
    c.validate().expect("valid config");
    c
}

async fn ask(client: &Client, worker: &str, prompt: &str, seed: Option<u64>) -> Completion {
    ask_pinned(client, NAME, worker, prompt, seed, None).await
}

/// A document A computes cold, then B (pinned) pulls it from A: B then holds A's KV
/// bit for bit, and answers with A's tokens — greedy always; seeded (`same_sampled`)
/// where the few prompt tokens B computes after the pulled prefix come out in the
/// same bits as inside A's whole prompt (without flash attention: llama.cpp's CPU
/// flash attention rounds a short batch differently, as its own prompt cache does).
async fn pulled_equals_cold(
    client: &Client,
    models: [&Loaded; 2],
    topic: &str,
    sections: usize,
    seed: Option<u64>,
    same_sampled: bool,
) {
    let prompt = format!(
        "{}Question: who cared for the {topic}?\nAnswer:",
        document(topic, sections)
    );
    let cold = ask(client, "w-a", &prompt, seed).await;
    let before = kv_transfer_of(client, "w-b").await;
    let pulled = ask(client, "w-b", &prompt, seed).await;
    let m = &pulled.metrics;
    let prompt_tokens = m.prompt_tokens as usize;
    assert!(prompt_tokens > 200, "{m:?}");
    assert_eq!(
        m.pulled_tokens as usize,
        (prompt_tokens - 1) / 16 * 16,
        "B pulled every whole block of the prompt (short of its last token) from A: {m:?}"
    );
    assert!(
        m.cached_tokens >= m.pulled_tokens,
        "B's llama-server reused the restored slot rather than computing the prompt: {m:?}"
    );
    // The KV B's server holds for the pulled prefix is the KV A computed.
    let kv = |i: usize| {
        models[i]
            .model
            .kv_transfer()
            .expect("a llama-server worker exchanges KV")
    };
    let tokens = kv(1).prompt_tokens(&Prompt::Text(prompt.clone())).await.unwrap();
    let blocks = m.pulled_tokens as usize / 16;
    let prefix = tokens[..blocks * 16].to_vec();
    let a = kv(0).export_kv(prefix.clone(), None, 0, blocks).await.unwrap();
    let b = kv(1).export_kv(prefix, None, 0, blocks).await.unwrap();
    assert_eq!((a.count, b.count), (blocks, blocks), "both hold the prefix");
    assert!(a.data == b.data, "{topic}: B holds A's KV bit for bit");
    if seed.is_none() || same_sampled {
        assert_eq!(
            token_ids(&pulled),
            token_ids(&cold),
            "{topic} (seed {seed:?}): B's answer after the pull is A's cold answer"
        );
    } else if token_ids(&pulled) != token_ids(&cold) {
        eprintln!("{topic} (seed {seed:?}): B's sampled answer parts from A's cold one (flash attention's rounding)");
    }
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
async fn llama_server_workers_pull_a_peers_prefix_and_answer_as_if_they_had_computed_it() {
    // V stored transposed (no flash attention), as the other llama.cpp tests run.
    pull_between_llama_servers("off").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_flash_attention_v_is_stored_in_rows_and_travels_too() {
    pull_between_llama_servers("on").await;
}

async fn pull_between_llama_servers(flash_attn: &str) {
    let Some(bin) = llama_server_bin() else { return };
    let nats = nats();
    let url = nats.url();
    let coordinator = node::start_coordinator(&fleet_config(&url)).await.unwrap();
    let mut workers: Vec<(switchyard_workers::WorkerHandle, Loaded)> = Vec::new();
    for id in ["w-a", "w-b"] {
        let c = worker_config(&url, id, &bin, flash_attn);
        let loaded = node::load(&c).await.expect("llama-server starts");
        workers.push((node::start_worker(&c, &loaded).await.unwrap(), loaded));
    }
    let client = client(&url, Duration::from_secs(120)).await;
    wait_for_workers(&client, &["w-a", "w-b"], Duration::from_secs(20)).await;
    // Each server's format is learned from a probe once its model and binary are hashed.
    let deadline = Instant::now() + Duration::from_secs(120);
    let (a, b) = loop {
        if let (Some(a), Some(b)) = (kv_format_of(&client, "w-a").await, kv_format_of(&client, "w-b").await) {
            break (a, b);
        }
        assert!(
            Instant::now() < deadline,
            "the llama-server workers never announced a KV format"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(a, b, "two servers of one build and model share a format");
    assert!(
        a.engine.starts_with("llama.cpp-") && a.engine.ends_with("/cpu"),
        "{a:?}"
    );
    let transposed = if flash_attn == "off" { "vtrans=1" } else { "vtrans=0" };
    assert!(a.params.contains(transposed), "-fa {flash_attn}: {a:?}");
    assert_eq!(a.block_tokens, 16);

    // About 1,500 tokens, greedy; then another document, seeded sampling.
    let models = [&workers[0].1, &workers[1].1];
    let same_sampled = flash_attn == "off";
    pulled_equals_cold(&client, models, "river", 36, None, same_sampled).await;
    pulled_equals_cold(&client, models, "harbour", 12, Some(7), same_sampled).await;
    let served = kv_transfer_of(&client, "w-a").await;
    assert!(served.served_bytes > 0, "{served:?}");

    // Pulls another format, an adapter or tokens no slot holds cannot get.
    check_kv_refusals(&url, "w-a", &a, "nope", "LoRA adapter").await;

    stop_workers(workers).await;
    coordinator.shutdown().await;
}

/// Disaggregated prefill and decode between llama-servers (protocol 1.12): a long
/// prompt sent to the fleet streams from the `decode` worker, whose server computed
/// only its last tokens — the `prefill` worker's server computed the rest and the
/// decode worker pulled it — and the answer is the one a single server gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prefill_llama_server_feeds_a_decode_llama_server() {
    let Some(bin) = llama_server_bin() else { return };
    let question = |topic: &str| format!("{}Question: who cared for the {topic}?\nAnswer:", document(topic, 20));
    let cases = [("lighthouse", None), ("orchard", Some(11))];
    // What one server answers, computing each prompt whole (a fleet of its own, so
    // no worker of the pair's fleet holds the prompts).
    let mut want = Vec::new();
    {
        let nats = nats();
        let url = nats.url();
        let coordinator = node::start_coordinator(&fleet_config(&url)).await.unwrap();
        let client = client(&url, Duration::from_secs(120)).await;
        let c = worker_config(&url, "w-a", &bin, "off");
        let mut loaded = node::load(&c).await.expect("llama-server starts");
        let w = node::start_worker(&c, &loaded).await.unwrap();
        wait_for_workers(&client, &["w-a"], Duration::from_secs(20)).await;
        for (topic, seed) in cases {
            want.push(token_ids(&ask(&client, "w-a", &question(topic), seed).await));
        }
        w.shutdown(Duration::from_secs(5)).await;
        loaded.stop();
        coordinator.shutdown().await;
    }
    let nats = nats();
    let url = nats.url();
    let coordinator = node::start_coordinator(&fleet_config(&url)).await.unwrap();
    let client = client(&url, Duration::from_secs(120)).await;
    let mut workers = Vec::new();
    for (id, role) in [("w-p", WorkerRole::Prefill), ("w-d", WorkerRole::Decode)] {
        let c = worker_config_as(&url, id, &bin, "off", role);
        let loaded = node::load(&c).await.expect("llama-server starts");
        workers.push((node::start_worker(&c, &loaded).await.unwrap(), loaded));
    }
    wait_for_workers(&client, &["w-p", "w-d"], Duration::from_secs(20)).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while kv_format_of(&client, "w-p").await.is_none() || kv_format_of(&client, "w-d").await.is_none() {
        assert!(
            Instant::now() < deadline,
            "the llama-server workers never announced a KV format"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for ((topic, seed), want) in cases.into_iter().zip(&want) {
        let mut req = GenerateRequest::generate(Client::new_request_id(), NAME, question(topic));
        req.config.max_tokens = 24;
        if let Some(seed) = seed {
            req.config.temperature = 0.8;
            req.config.seed = Some(seed);
        }
        let done = client.generate(req).await.unwrap().collect().await.unwrap();
        assert_disaggregated(&done, want, &format!("{topic} (seed {seed:?})"), false);
        settle(&client).await;
    }
    let p = kv_transfer_of(&client, "w-p").await;
    let d = kv_transfer_of(&client, "w-d").await;
    assert_eq!((p.prefills_served, d.remote_prefills), (2, 2), "{p:?} {d:?}");
    stop_workers(workers).await;
    coordinator.shutdown().await;
}
