//! A model split into pipeline stages across worker processes (issue 55): real
//! nats-server, coordinator and `switchyard worker --pipeline … --layers …`
//! processes. The demo model (30 layers) served whole, in 2 stages and in 3 gives
//! the same greedy tokens, alone, several at once and under a constraint; the fleet
//! view shows each pipeline with its stages; a stage that hangs (SIGSTOP) mid-stream
//! loses the stream, which resumes on another worker for the model; one killed
//! (SIGKILL) is found gone by the first stage's probe and its stream ends with a
//! retryable error (no hang); once it runs again or is back the pipeline serves.

mod common;

use common::*;
use std::time::{Duration, Instant};
use switchyard::Client;
use switchyard_messages::Constraint;

fn worker(url: &str, id: &str, name: &str, extra: &[&str]) -> Proc {
    let model = demo_model();
    let mut args = vec![
        "--nats",
        url,
        "worker",
        "--worker-id",
        id,
        "--heartbeat-ms",
        "200",
        "--threads",
        "1",
        "--model",
        model.to_str().unwrap(),
    ];
    if !name.is_empty() {
        args.extend_from_slice(&["--model-name", name]);
    }
    args.extend_from_slice(extra);
    let p = switchyard(id, &args);
    p.wait_for("up on", Duration::from_secs(60));
    p
}

async fn ask(client: &Client, model: &str, prompt: &str, constraint: Option<Constraint>) -> Vec<u32> {
    let mut req = switchyard::GenerateRequest::generate(Client::new_request_id(), model, prompt);
    req.config.max_tokens = 20;
    req.config.constraint = constraint;
    let done = client.generate(req).await.unwrap().collect().await.unwrap();
    token_ids(&done)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_split_in_two_and_three_stages_answers_as_one_worker_and_survives_a_lost_stage() {
    let nats = nats();
    let url = nats.url();
    let _coordinator = coordinator_proc(&url, "coordinator");
    let _whole = worker(&url, "whole", "whole", &[]);
    // Later stages first: the first stage's first request needs them.
    let mut s2b = worker(&url, "two-b", "", &["--pipeline", "two", "--layers", "14-29"]);
    let _s2a = worker(
        &url,
        "two-a",
        "split2",
        &["--pipeline", "two", "--layers", "0-13", "--stage-timeout-ms", "15000"],
    );
    let mut s3c = worker(&url, "three-c", "", &["--pipeline", "three", "--layers", "20-29"]);
    let _s3b = worker(&url, "three-b", "", &["--pipeline", "three", "--layers", "10-19"]);
    let _s3a = worker(&url, "three-a", "split3", &["--pipeline", "three", "--layers", "0-9"]);
    let client = client(&url, Duration::from_secs(30)).await;
    // Only first stages are workers of the fleet.
    wait_for_workers(&client, &["whole", "two-a", "three-a"], Duration::from_secs(30)).await;

    let prompts = [
        "The capital of France is",
        "Write a haiku about the sea.",
        "List three prime numbers:",
    ];
    let regex = Constraint::Regex {
        pattern: "(yes|no), because [a-z ]{5,40}\\.".into(),
    };
    for p in prompts {
        let want = ask(&client, "whole", p, None).await;
        assert_eq!(ask(&client, "split2", p, None).await, want, "2 stages: {p}");
        assert_eq!(ask(&client, "split3", p, None).await, want, "3 stages: {p}");
    }
    let want = ask(&client, "whole", "Is water wet?", Some(regex.clone())).await;
    assert_eq!(
        ask(&client, "split2", "Is water wet?", Some(regex.clone())).await,
        want,
        "constrained"
    );
    assert_eq!(
        ask(&client, "split3", "Is water wet?", Some(regex)).await,
        want,
        "constrained, 3 stages"
    );
    // Several at once: one batch on the first stage, cut into micro-batches.
    let mut wants = Vec::new();
    for p in prompts {
        wants.push(ask(&client, "whole", p, None).await);
    }
    let together = futures::future::join_all(prompts.iter().map(|p| ask(&client, "split2", p, None))).await;
    assert_eq!(together, wants, "batched on 2 stages");

    // The fleet view names each pipeline's stages.
    let status = client.status().await.unwrap();
    let head = status.workers.iter().find(|w| w.status.worker_id == "three-a").unwrap();
    let pipe = head.status.models[0].info.pipeline.clone().expect("a pipelined model");
    assert_eq!((pipe.name.as_str(), pipe.layers, pipe.last_layer), ("three", 30, 9));
    let stages: Vec<(String, u32, u32)> = pipe
        .stages
        .iter()
        .map(|s| (s.worker_id.clone(), s.first_layer, s.last_layer))
        .collect();
    assert_eq!(
        stages,
        [("three-b".to_string(), 10, 19), ("three-c".to_string(), 20, 29)]
    );
    assert!(pipe.stages.iter().all(|s| s.rss_bytes > 0));
    // And so do `switchyard status` and `switchyard models`.
    for cmd in ["status", "models"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(["--nats", &url, cmd])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        for want in [
            "pipeline three: layers 0-9 on three-a → 10-19 on three-b (",
            "pipeline two: layers 0-13 on two-a → 14-29 on two-b (",
        ] {
            assert!(text.contains(want), "`switchyard {cmd}` lacks {want:?}:\n{text}");
        }
    }

    // A stage that hangs (SIGSTOP) mid-stream: at the first stage's
    // --stage-timeout-ms the stream is lost (retryable `worker_lost`) and resumes on
    // another worker serving the model — here one started while the stage hung —
    // with the very tokens the pipeline would have given.
    let stream_on = |model: &str, max: u32| {
        let mut req = switchyard::GenerateRequest::generate(Client::new_request_id(), model, "Tell a long story.");
        req.config.max_tokens = max;
        // No end-of-text tokens: the stream is still running when the stage stops.
        req.config.logit_bias = vec![(0, -100.0), (1, -100.0), (2, -100.0)];
        req
    };
    let long_want = {
        let done = client
            .generate(stream_on("whole", 60))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        token_ids(&done)
    };
    let mut stream = client.generate(stream_on("split2", 60)).await.unwrap();
    let mut got = match stream.next().await {
        Some(Ok(switchyard::StreamEvent::Tokens(t))) => t.iter().map(|t| t.id).collect::<Vec<u32>>(),
        other => panic!("expected tokens first, got {other:?}"),
    };
    let pid = s2b.child.id() as i32;
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let spare = worker(&url, "spare", "split2", &[]);
    wait_for_workers(
        &client,
        &["whole", "two-a", "three-a", "spare"],
        Duration::from_secs(30),
    )
    .await;
    let resumes = loop {
        match stream.next().await {
            Some(Ok(switchyard::StreamEvent::Tokens(t))) => got.extend(t.iter().map(|t| t.id)),
            Some(Ok(switchyard::StreamEvent::Done { metrics, .. })) => break metrics.resumes,
            other => panic!("expected the stream to resume and finish, got {other:?}"),
        }
    };
    assert_eq!(resumes, 1, "the stream resumed once");
    assert_eq!(got, long_want, "resumed on the spare worker");
    // While the stage hangs the pipeline is not serving, and says why.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["--nats", &url, "status"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("; not serving: the stage serving layers from 14"),
        "{text}"
    );
    drop(spare);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let want = ask(&client, "whole", prompts[1], None).await;
    assert_eq!(
        served(&client, "split2", prompts[1]).await,
        want,
        "after the stage ran again"
    );

    // A stage killed mid-stream, with no other worker for the model: the first
    // stage's probe finds it gone within a second or two (not at the stall
    // timeout) and the stream ends with a retryable error, no hang.
    let mut stream = client.generate(stream_on("split2", 400)).await.unwrap();
    match stream.next().await {
        Some(Ok(switchyard::StreamEvent::Tokens(_))) => {}
        other => panic!("expected tokens first, got {other:?}"),
    }
    s2b.kill9();
    let started = Instant::now();
    let err = ends_with_error(stream).await;
    eprintln!("after the stage died: {err} ({:?})", started.elapsed());
    assert!(err.to_string().contains("is not running"), "{err}");
    assert_eq!(err.code(), Some(switchyard_messages::ErrorCode::WorkerLost), "{err}");
    // Back again: the pipeline serves as before.
    let _s2b = worker(&url, "two-b", "", &["--pipeline", "two", "--layers", "14-29"]);
    let want = ask(&client, "whole", prompts[0], None).await;
    assert_eq!(
        served(&client, "split2", prompts[0]).await,
        want,
        "after the stage came back"
    );

    // The last of three stages killed: the middle one's rows go nowhere (no one
    // tells the first stage), so only the probe finds it — and says which.
    let mut stream = client.generate(stream_on("split3", 400)).await.unwrap();
    match stream.next().await {
        Some(Ok(switchyard::StreamEvent::Tokens(_))) => {}
        other => panic!("expected tokens first, got {other:?}"),
    }
    s3c.kill9();
    let err = ends_with_error(stream).await;
    assert!(err.to_string().contains("no stage serves layers from 20"), "{err}");
    assert_eq!(err.code(), Some(switchyard_messages::ErrorCode::WorkerLost), "{err}");
}

/// Greedy tokens for `prompt` once `model` serves again (within a minute): its
/// pipeline is not serving until every stage answers the first stage's probe.
async fn served(client: &Client, model: &str, prompt: &str) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut req = switchyard::GenerateRequest::generate(Client::new_request_id(), model, prompt);
        req.config.max_tokens = 20;
        match client.generate(req).await {
            Ok(s) => match s.collect().await {
                Ok(done) => return token_ids(&done),
                Err(e) => eprintln!("not yet: {e}"),
            },
            Err(e) => eprintln!("not yet: {e}"),
        }
        assert!(Instant::now() < deadline, "{model} never served again");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
