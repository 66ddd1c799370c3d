//! Bounded input on a real fleet: each `[limits]` entry refuses one over the limit
//! with `bad_request` naming it — through a coordinator and straight to the worker —
//! accepts exactly the limit, and the worker keeps serving. The fuzzing run's
//! findings, replayed as raw bytes: an empty fence, session calls of a future
//! version, `batch` and session `decode` with broken configs, decode ids that cannot
//! form a cancel subject. And a request over the server's `max_payload` fails in
//! the client at once.

mod common;

use common::*;
use std::time::Duration;
use switchyard::Client;
use switchyard_messages::session::{ContextManifest, ContextReport, OpenSessionRequest};
use switchyard_messages::*;

fn small(c: &mut switchyard::Config) {
    c.limits = InputLimits {
        max_prompt_bytes: 64,
        max_messages: 2,
        max_stop_strings: 1,
        max_stop_bytes: 4,
        max_stop_tokens: 1,
        max_tokens: 6,
        max_batch_prompts: 2,
        max_classify_prompts: 2,
        max_logits_prompts: 1,
        max_session_text_bytes: 40,
        ..InputLimits::default()
    };
}

#[track_caller]
fn names(e: switchyard::ClientError, limit: &str) {
    assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e}");
    assert!(
        e.to_string().contains(&format!("limits.{limit}")),
        "{limit} not named: {e}"
    );
}

/// Both paths: the coordinator's subject and the worker's endpoint.
async fn both(client: &Client, req: &GenerateRequest, chat: bool) -> Vec<Result<usize, switchyard::ClientError>> {
    let verb = if chat { "chat" } else { "generate" };
    let mut out = Vec::new();
    for subject in [format!("sy.v1.{verb}"), format!("sy.v1.worker.w1.{verb}")] {
        let r = match client.start(subject, req.clone()).await {
            Ok(s) => s.collect().await.map(|c| c.tokens.len()),
            Err(e) => Err(e),
        };
        out.push(r);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_at_and_over_on_a_real_fleet() {
    let f = fleet(small).await;
    let client = f.client().await;

    // Prompt bytes: 64 accepted, 65 refused, on both paths.
    for r in both(&client, &greedy(&"a".repeat(64), 2), false).await {
        assert_eq!(r.expect("at the limit"), 2);
    }
    for r in both(&client, &greedy(&"a".repeat(65), 2), false).await {
        names(r.unwrap_err(), "max_prompt_bytes");
    }
    // max_tokens: 6 accepted, 7 refused.
    for r in both(&client, &greedy("Hello", 6), false).await {
        assert!(r.expect("at the limit") <= 6);
    }
    for r in both(&client, &greedy("Hello", 7), false).await {
        names(r.unwrap_err(), "max_tokens");
    }
    // Messages.
    let chat = |n: usize| {
        let mut r = GenerateRequest::chat(
            Client::new_request_id(),
            "",
            (0..n).map(|_| Message::new("user", "Hi")).collect(),
        );
        r.config.max_tokens = 2;
        r
    };
    for r in both(&client, &chat(2), true).await {
        r.expect("two messages");
    }
    for r in both(&client, &chat(3), true).await {
        names(r.unwrap_err(), "max_messages");
    }
    // Stop strings: count and length; stop tokens.
    let mut r = greedy("Hello", 2);
    r.config.stop = vec!["abcd".into()];
    for r in both(&client, &r, false).await {
        r.expect("a 4-byte stop string");
    }
    r.config.stop = vec!["abcde".into()];
    for r in both(&client, &r, false).await {
        names(r.unwrap_err(), "max_stop_bytes");
    }
    r.config.stop = vec!["a".into(), "b".into()];
    for r in both(&client, &r, false).await {
        names(r.unwrap_err(), "max_stop_strings");
    }
    r.config.stop = vec![];
    r.config.stop_tokens = vec![1, 2];
    for r in both(&client, &r, false).await {
        names(r.unwrap_err(), "max_stop_tokens");
    }

    // Batch and classify sizes, logits.
    let batch = |n: usize, config: GenerateConfig| BatchRequest {
        head: RequestHead::new(Client::new_request_id(), ""),
        prompts: vec!["Hello".into(); n],
        config,
    };
    let two = GenerateConfig {
        max_tokens: 2,
        ..Default::default()
    };
    let reply = client.batch(batch(2, two.clone())).await.expect("two prompts");
    assert!(reply
        .results
        .iter()
        .all(|r| r.finish_reason == Some(FinishReason::Length)));
    names(
        client.batch(batch(3, two.clone())).await.unwrap_err(),
        "max_batch_prompts",
    );
    let classify = |n: usize, logits: bool| ClassifyRequest {
        head: RequestHead::new(Client::new_request_id(), ""),
        prompts: vec!["Hello".into(); n],
        return_logits: logits,
    };
    client.classify(classify(2, false)).await.expect("two prompts");
    names(
        client.classify(classify(3, false)).await.unwrap_err(),
        "max_classify_prompts",
    );
    client.classify(classify(1, true)).await.expect("one with logits");
    names(
        client.classify(classify(2, true)).await.unwrap_err(),
        "max_logits_prompts",
    );

    // Batch gets generate's config checks (the fuzzer's NaN temperature).
    for (field, config) in [
        (
            "temperature",
            GenerateConfig {
                temperature: f32::NAN,
                ..two.clone()
            },
        ),
        (
            "top_p",
            GenerateConfig {
                top_p: 1.5,
                ..two.clone()
            },
        ),
        (
            "max_tokens",
            GenerateConfig {
                max_tokens: 0,
                ..two.clone()
            },
        ),
    ] {
        let e = client.batch(batch(1, config)).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{field}: {e}");
        assert!(e.to_string().contains(field), "{field}: {e}");
    }

    // Sessions: text size, decode config and ids, fences, versions.
    let session = client
        .open_session(OpenSessionRequest::new("owner-1", ""))
        .await
        .unwrap();
    let fresh = session.explain().await.unwrap();
    assert_eq!(fresh.resident_tokens, 0, "a session starts empty");
    let manifest = ContextManifest::default();
    session
        .ensure_prefix(&"b".repeat(40), &manifest)
        .await
        .expect("at the limit");
    let e = session.ensure_prefix(&"b".repeat(41), &manifest).await.unwrap_err();
    names(e, "max_session_text_bytes");
    let before = session.explain().await.unwrap().resident_tokens;
    assert!(before > 0);
    let nats = client.nats();
    let subject = |verb: &str| format!("sy.v1.session.{}.{verb}", session.id());
    // A bare MessagePack [] (no fence) to ensure_prefix: refused, nothing changes.
    let reply = nats
        .request(subject("ensure_prefix"), vec![0x90u8].into())
        .await
        .unwrap();
    let err: ErrorReply = decode(&reply.payload).expect("an ErrorReply");
    assert_eq!(err.error.code, ErrorCode::NotOwner, "{err:?}");
    assert_eq!(session.explain().await.unwrap().resident_tokens, before);
    // A session call from a future protocol version.
    for v in [2u32, 99, 255, u32::MAX] {
        let call = session::SessionCall {
            v,
            fence: "owner-1".into(),
        };
        let reply = nats.request(subject("describe"), encode(&call).into()).await.unwrap();
        let err: ErrorReply = decode(&reply.payload).expect("an ErrorReply");
        assert_eq!(err.error.code, ErrorCode::UnsupportedVersion, "v {v}");
    }
    // Decode: a broken config, and ids that cannot form a cancel subject.
    let e = session
        .decode(GenerateConfig {
            temperature: f32::INFINITY,
            ..two.clone()
        })
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e}");
    for id in ["", "a.b", &"x".repeat(129)] {
        let req = session::DecodeRequest {
            v: 1,
            fence: "owner-1".into(),
            request_id: id.into(),
            config: two.clone(),
        };
        let reply = nats.request(subject("decode"), encode(&req).into()).await.unwrap();
        let chunk: StreamChunk = decode(&reply.payload).expect("an error chunk");
        assert_eq!(chunk.error.map(|e| e.code), Some(ErrorCode::BadRequest), "id {id:?}");
    }
    // The owner's decode still works, and every generated token is resident.
    let out = session.decode(two.clone()).await.unwrap().collect().await.unwrap();
    let after: ContextReport = session.explain().await.unwrap();
    assert_eq!(
        after.resident_tokens as usize,
        before as usize + out.tokens.len(),
        "generated tokens become resident, the last one too"
    );

    // The worker kept serving through all of it.
    assert_serves(&client, "the worker kept serving").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_max_payload_fails_in_the_client_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let nats = switchyard_procs::nats_server::NatsServer::start_with_config(
        &switchyard_procs::nats_server::find_nats_server("").unwrap(),
        "max_payload: 8192",
        dir.path(),
    )
    .unwrap();
    let client = client(&nats.url(), Duration::from_secs(5)).await;
    let started = std::time::Instant::now();
    let e = client
        .generate(greedy(&"a ".repeat(5000), 4))
        .await
        .err()
        .expect("refused before sending");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e}");
    assert!(e.to_string().contains("max_payload of 8192"), "{e}");
    let e = client
        .batch(BatchRequest {
            head: RequestHead::new("b1", ""),
            prompts: vec!["a".repeat(9000)],
            config: GenerateConfig::default(),
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("max_payload"), "{e}");
}
