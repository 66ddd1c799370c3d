//! The wire format against an independent MessagePack implementation (Python's
//! `msgpack`), and the documented Python example client against a real fleet.

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;
use switchyard::FinishReason;
use switchyard_messages::{decode, encode, ErrorCode, GenerateRequest, StreamChunk, Token, WireError};

#[test]
fn python_msgpack_and_rust_read_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let from_py = dir.path().join("py.msgpack");
    let from_rust = dir.path().join("rust.msgpack");
    let rust_chunk = StreamChunk {
        v: 1,
        request_id: "rs-1".into(),
        seq: 2,
        tokens: vec![Token {
            id: 9,
            text: "naïve 🚀".into(),
            logprob: None,
            reasoning: false,
        }],
        done: true,
        finish_reason: Some(FinishReason::Stop),
        metrics: None,
        error: Some(WireError::new(ErrorCode::Overloaded, "full").with_retry_after(50)),
        worker_id: Some("w".into()),
        tool_calls: Vec::new(),
    };
    std::fs::write(&from_rust, encode(&rust_chunk)).unwrap();
    let out = Command::new(python())
        .arg(repo().join("examples/python/write_fixture.py"))
        .arg(&from_py)
        .arg(&from_rust)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Python decoded Rust's bytes.
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["tokens"][0]["text"], "naïve 🚀");
    assert_eq!(seen["error"]["code"], "overloaded");
    assert_eq!(seen["error"]["retry_after_ms"], 50);
    assert_eq!(seen["finish_reason"], "stop");

    // Rust decodes Python's bytes: an array of two requests and a chunk.
    let bytes = std::fs::read(&from_py).unwrap();
    let items: Vec<serde_json::Value> = decode(&bytes).unwrap();
    let gen: GenerateRequest = decode(&encode(&items[0])).unwrap();
    let gen_direct: (GenerateRequest, GenerateRequest, StreamChunk) = decode(&bytes).unwrap();
    assert_eq!(gen_direct.0, gen);
    assert_eq!(gen.prompt.as_deref(), Some("Hello, naïve café 🚀"));
    assert_eq!(gen.config.max_tokens, 7);
    assert_eq!(gen.config.seed, Some(123));
    assert_eq!(gen.config.stop, vec!["\n\n".to_string()]);
    assert!((gen.config.top_p - 0.9).abs() < 1e-6, "float64 on the wire fits f32");
    let chat = gen_direct.1;
    assert_eq!(chat.messages.as_ref().unwrap()[1].content, "Hi");
    assert_eq!(
        chat.config,
        switchyard::GenerateConfig::default(),
        "omitted config takes the seed defaults"
    );
    let chunk = gen_direct.2;
    assert_eq!(chunk.tokens[0].text, "é");
    assert_eq!(chunk.finish_reason, Some(FinishReason::Length));
    assert_eq!(chunk.metrics.unwrap().generated_tokens, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_example_client_gets_the_same_tokens_as_the_rust_client() {
    let fleet = fleet(|_| {}).await;
    let client = fleet.client().await;
    let rust = client
        .generate(greedy("The capital of France is", 12))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let url = fleet.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(repo().join("examples/python/client.py"))
            .args([
                "--nats",
                &url,
                "--prompt",
                "The capital of France is",
                "--max-tokens",
                "12",
                "--json",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let py: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<u32> = rust.tokens.iter().map(|t| t.id).collect();
    assert_eq!(py["token_ids"], serde_json::json!(ids));
    assert_eq!(py["text"], rust.text);
    assert_eq!(py["worker_id"], "w1");
    // Errors reach Python clients as codes too.
    let url = fleet.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(repo().join("examples/python/client.py"))
            .args(["--nats", &url, "--prompt", "hi", "--model", "missing"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown_model"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_session_example_reuses_its_prefix_and_decodes_like_rust() {
    let fleet = fleet(|c| c.worker.parallel_slots = 2).await;
    let client = fleet.client().await;
    let prefix = "You are a careful reviewer of Rust code. Answer in one short sentence.";
    let suffix = "\nReview: fn add(a: u8, b: u8) -> u8 { a - b }\nReview:";
    let rust = client
        .generate(greedy(&format!("{prefix}{suffix}"), 16))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let url = fleet.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(repo().join("examples/python/session.py"))
            .args(["--nats", &url, "--prefix-text", prefix, "--suffix", suffix])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let py: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(py["cold"]["reused_tokens"], 0, "{py}");
    assert_eq!(py["warm"]["reused_tokens"], py["warm"]["prefix_tokens"], "{py}");
    assert_eq!(py["warm"]["prefilled_tokens"], 0);
    let ids: Vec<u32> = rust.tokens.iter().map(|t| t.id).collect();
    assert_eq!(py["token_ids"], serde_json::json!(ids));
    assert_eq!(py["closed"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_resumes_a_stream_whose_worker_dies() {
    let nats = nats();
    let url = nats.url();
    let coordinator = switchyard::node::start_coordinator(&fleet_config(&url)).await.unwrap();
    let mut procs: std::collections::HashMap<String, Proc> = ["pa", "pb"]
        .iter()
        .map(|id| (id.to_string(), worker_proc(&url, id)))
        .collect();
    let client = client(&url, Duration::from_secs(5)).await;
    wait_for_workers(&client, &["pa", "pb"], Duration::from_secs(20)).await;
    let prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,";
    let reference = client
        .generate(greedy(prompt, 500))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(
        reference.tokens.len() >= 300,
        "the reference run is long enough to interrupt"
    );

    // The reference run's last heartbeats must not be mistaken for the Python run's.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client
        .status()
        .await
        .unwrap()
        .workers
        .iter()
        .any(|w| w.status.in_flight > 0)
    {
        assert!(std::time::Instant::now() < deadline, "the workers never showed idle");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let child = Command::new(python())
        .arg(repo().join("examples/python/client.py"))
        .args([
            "--nats",
            &url,
            "--prompt",
            prompt,
            "--max-tokens",
            "500",
            "--stall-ms",
            "1500",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Kill whichever worker is running the Python client's request.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let victim = loop {
        let s = client.status().await.unwrap();
        if let Some(w) = s.workers.iter().find(|w| w.status.in_flight > 0) {
            break w.status.worker_id.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the Python request never showed up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    procs.get_mut(&victim).unwrap().kill9();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("resuming on another worker"), "{stderr}");
    let py: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<u32> = reference.tokens.iter().map(|t| t.id).collect();
    assert_eq!(
        py["token_ids"],
        serde_json::json!(ids),
        "the resumed stream equals the uninterrupted one"
    );
    assert_eq!(py["metrics"]["resumes"], 1);
    assert_ne!(py["worker_id"], victim);
    coordinator.shutdown().await;
}
