//! End-to-end: real nats-server, real coordinator and worker, the real demo model.

mod common;

use common::*;
use std::time::{Duration, Instant};
use switchyard::{Client, ErrorCode, FinishReason, GenerateRequest, Message, StreamEvent};
use switchyard_messages::{decode, encode, StreamChunk, Subjects};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_is_fixed_and_coherent() {
    let fleet = fleet(|_| {}).await;
    let client = fleet.client().await;
    let a = client
        .generate(greedy("The capital of France is", 8))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let b = client
        .generate(greedy("The capital of France is", 8))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(
        a.text.contains("Paris"),
        "coherent continuation expected, got {:?}",
        a.text
    );
    assert_eq!(a.tokens, b.tokens, "greedy decoding is deterministic");
    assert_eq!(a.worker_id, "w1");
    assert!(
        a.metrics.prompt_tokens >= 5 && a.metrics.generated_tokens >= 1,
        "{:?}",
        a.metrics
    );
    assert!(a.metrics.prefill_tokens_per_sec > 0.0);

    // Chat goes through the GGUF's template and stops on <|im_end|>, not on length.
    let mut chat = GenerateRequest::chat(
        Client::new_request_id(),
        DEMO_NAME,
        vec![Message::new("user", "Say hello.")],
    );
    chat.config.max_tokens = 64;
    let c = client.chat(chat).await.unwrap().collect().await.unwrap();
    assert!(!c.text.trim().is_empty());
    assert!(
        !c.text.contains("<|im_end|>"),
        "end-of-turn token must not be emitted: {:?}",
        c.text
    );
    assert!(
        c.metrics.prompt_tokens > 20,
        "system prompt from the template is included"
    );

    // Heartbeats carry the measured speed (routing by predicted time to first token):
    // the chat's prefill (its system prompt included) was long enough to tell a rate.
    let nc = async_nats::connect(fleet.url.as_str()).await.unwrap();
    let mut beats = nc.subscribe(Subjects::default().heartbeat("w1")).await.unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(5), futures::StreamExt::next(&mut beats))
        .await
        .expect("a heartbeat within 5 s")
        .unwrap();
    let beat: switchyard_messages::Heartbeat = decode(&msg.payload).unwrap();
    assert!(beat.speed.measured(), "{:?}", beat.speed);
    assert!(
        beat.speed.prefill_tps > 0.0 && beat.speed.service_ms > 0.0,
        "{:?}",
        beat.speed
    );
    assert_eq!(beat.status.worker_id, "w1");

    fleet.worker.shutdown(Duration::from_secs(5)).await;
    fleet.coordinator.shutdown().await;
}

/// Publishes raw bytes to `subject` with an inbox and returns the first chunk.
async fn raw(client: &Client, subject: String, payload: Vec<u8>) -> StreamChunk {
    let nats = client.nats();
    let inbox = nats.new_inbox();
    let mut sub = nats.subscribe(inbox.clone()).await.unwrap();
    nats.publish_with_reply(subject, inbox, payload.into()).await.unwrap();
    use futures::StreamExt;
    let msg = tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("an answer, not silence")
        .unwrap();
    decode(&msg.payload).expect("a StreamChunk")
}

fn err_code(chunk: &StreamChunk) -> ErrorCode {
    assert!(chunk.done, "{chunk:?}");
    chunk
        .error
        .as_ref()
        .unwrap_or_else(|| panic!("error expected: {chunk:?}"))
        .code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_the_worker_keeps_serving() {
    let fleet = fleet(|c| c.worker.context_len = 512).await;
    let client = fleet.client().await;
    let s = Subjects::default();
    let via_worker = s.worker("w1", "generate");
    for subject in [s.generate(), via_worker.clone()] {
        // Not MessagePack at all.
        let c = raw(&client, subject.clone(), b"\xc1\xff garbage".to_vec()).await;
        assert_eq!(err_code(&c), ErrorCode::BadRequest, "{subject}");
        // A missing field: the message names it.
        let c = raw(
            &client,
            subject.clone(),
            encode(&serde_json::json!({"v": 1, "request_id": "r1", "prompt": "hi"})),
        )
        .await;
        assert_eq!(err_code(&c), ErrorCode::BadRequest);
        assert!(c.error.unwrap().message.contains("model"));
        // Invalid UTF-8 in a string field.
        let mut bytes = encode(&serde_json::json!({"v": 1, "request_id": "r2", "model": "", "prompt": "abcd"}));
        let pos = bytes.windows(4).position(|w| w == b"abcd").unwrap();
        bytes[pos + 1] = 0xff;
        let c = raw(&client, subject.clone(), bytes).await;
        assert_eq!(err_code(&c), ErrorCode::BadRequest);
    }
    let cases: Vec<(GenerateRequest, ErrorCode)> = vec![
        (
            {
                let mut r = greedy("hi", 4);
                r.head.model = "no-such-model".into();
                r
            },
            ErrorCode::UnknownModel,
        ),
        (greedy("", 4), ErrorCode::BadRequest),
        (greedy("hi", 30_000), ErrorCode::ContextOverflow),
        (
            {
                let mut r = greedy("hi", 4);
                r.config.temperature = -1.0;
                r
            },
            ErrorCode::BadRequest,
        ),
        (
            {
                let mut r = greedy("hi", 4);
                r.head.v = 99;
                r
            },
            ErrorCode::UnsupportedVersion,
        ),
    ];
    for (req, want) in cases {
        let got = client.generate(req.clone()).await.unwrap().collect().await.unwrap_err();
        assert_eq!(got.code(), Some(want), "{req:?}: {got}");
        // The same straight to the worker.
        let got = client
            .start(via_worker.clone(), req.clone())
            .await
            .unwrap()
            .collect()
            .await
            .unwrap_err();
        assert_eq!(got.code(), Some(want), "direct {req:?}: {got}");
    }
    let ok = client
        .generate(greedy("The capital of France is", 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(!ok.tokens.is_empty(), "the worker still serves");
    fleet.worker.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_worker_is_an_immediate_error_not_a_timeout() {
    let server = nats();
    let mut config = fleet_config(&server.url());
    config.client.stall_timeout_ms = 60_000;
    let coordinator = switchyard::node::start_coordinator(&config).await.unwrap();
    let client = client(&server.url(), Duration::from_secs(60)).await;
    let started = Instant::now();
    let err = client
        .generate(greedy("hi", 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NoWorker), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "answered before the stall limit"
    );
    coordinator.shutdown().await;
    // And with no coordinator at all, NATS says no one is listening. (Wait until the
    // server has processed the stopped coordinator's unsubscribes.)
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.status().await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "the coordinator is still answering after shutdown"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let err = client
        .generate(greedy("hi", 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NoWorker), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_worker_answers_overloaded() {
    let fleet = fleet(|c| {
        c.worker.capacity = 1;
        c.worker.queue_depth = 0;
    })
    .await;
    let client = fleet.client().await;
    let mut long = client.generate(greedy("Once upon a time", 200)).await.unwrap();
    // Wait until the first request is computing.
    match long.next().await.unwrap().unwrap() {
        StreamEvent::Tokens(_) => {}
        other => panic!("{other:?}"),
    }
    // `queue_ms: 0`: no wait in the fleet queue, refused at once when no worker has room.
    let mut now_or_never = greedy("hi", 4);
    now_or_never.head.queue_ms = Some(0);
    let err = client
        .generate(now_or_never)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Overloaded), "{err}");
    match err {
        switchyard::ClientError::Remote { error, .. } => assert!(error.retryable && error.retry_after_ms.is_some()),
        other => panic!("{other}"),
    }
    long.cancel().await.unwrap();
    let rest = long.collect().await.unwrap();
    assert_eq!(rest.finish_reason, FinishReason::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_stop_strings_end_generation() {
    let fleet = fleet(|_| {}).await;
    let client = fleet.client().await;
    let mut stream = client.generate(greedy("Once upon a time", 500)).await.unwrap();
    let mut n = 0;
    while let Some(ev) = stream.next().await {
        match ev.unwrap() {
            StreamEvent::Tokens(t) => {
                // A chunk may carry several tokens (worker.coalesce_ms).
                let before = n;
                n += t.len();
                if before < 3 && n >= 3 {
                    stream.cancel().await.unwrap();
                }
            }
            StreamEvent::Done {
                finish_reason, metrics, ..
            } => {
                assert_eq!(finish_reason, FinishReason::Cancelled);
                assert!(metrics.generated_tokens < 500);
                break;
            }
        }
    }
    // A stop string is not emitted, even when it spans tokens.
    let free = client
        .generate(greedy("The capital of France is", 8))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let word = "Paris";
    assert!(free.text.contains(word));
    let mut req = greedy("The capital of France is", 8);
    req.config.stop = vec!["ari".into()];
    let stopped = client.generate(req).await.unwrap().collect().await.unwrap();
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.text, free.text[..free.text.find("ari").unwrap()]);
    // Sampling with a seed is reproducible.
    let mut sampled = greedy("Once upon a time", 16);
    sampled.config.temperature = 0.9;
    sampled.config.top_p = 0.95;
    sampled.config.seed = Some(11);
    let a = client.generate(sampled.clone()).await.unwrap().collect().await.unwrap();
    sampled.head.request_id = Client::new_request_id();
    let b = client.generate(sampled).await.unwrap().collect().await.unwrap();
    assert_eq!(a.tokens, b.tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_and_coordinators_are_nats_micro_services() {
    let fleet = fleet(|_| {}).await;
    let client = fleet.client().await;
    let nats = client.nats();
    let info = nats.request("$SRV.INFO.switchyard-worker", "".into()).await.unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.payload).unwrap();
    assert_eq!(info["name"], "switchyard-worker");
    assert_eq!(info["metadata"]["worker_id"], "w1");
    let subjects: Vec<&str> = info["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["subject"].as_str().unwrap())
        .collect();
    assert!(subjects.contains(&"sy.v1.worker.w1.generate"), "{subjects:?}");
    let info = nats
        .request("$SRV.INFO.switchyard-coordinator", "".into())
        .await
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.payload).unwrap();
    let subjects: Vec<&str> = info["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["subject"].as_str().unwrap())
        .collect();
    assert!(
        subjects.contains(&"sy.v1.generate") && subjects.contains(&"sy.v1.status"),
        "{subjects:?}"
    );
    // The fleet view.
    let status = client.status().await.unwrap();
    let w = &status.workers[0].status;
    assert_eq!(
        (w.worker_id.as_str(), w.backend.as_str(), w.device.as_str()),
        ("w1", "cpu", "cpu")
    );
    assert_eq!(w.models[0].name, DEMO_NAME);
    assert_eq!(w.models[0].info.architecture, "llama");
    let models = client.models().await.unwrap();
    assert_eq!(models.models[0].workers, vec!["w1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_coordinators_share_one_queue_group() {
    let fleet = fleet(|c| c.worker.queue_depth = 16).await;
    let second = switchyard::node::start_coordinator(&fleet.config).await.unwrap();
    let client = fleet.client().await;
    common::wait_for_workers(&client, &["w1"], Duration::from_secs(5)).await;
    let mut streams = Vec::new();
    for _ in 0..6 {
        streams.push(client.generate(greedy("The capital of France is", 3)).await.unwrap());
    }
    for s in streams {
        // A request handled twice would show up as a sequence error here.
        let done = s.collect().await.unwrap();
        assert_eq!(done.worker_id, "w1");
    }
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classify_and_batch_over_nats_answer_per_prompt() {
    let fleet = fleet(|_| {}).await;
    let client = fleet.client().await;
    let prompts = vec![
        "The capital of France is".to_string(),
        String::new(),
        "def f(x):".to_string(),
    ];
    let reply = client
        .classify(switchyard::ClassifyRequest {
            head: switchyard_messages::RequestHead {
                v: 1,
                request_id: Client::new_request_id(),
                model: DEMO_NAME.into(),
                backend: None,
                worker: None,
                deadline_ms: None,
                tenant: None,
                priority: None,
                queue_ms: None,
                adapter: None,
            },
            prompts: prompts.clone(),
            return_logits: false,
        })
        .await
        .unwrap();
    assert_eq!(reply.worker_id, "w1");
    assert_eq!(reply.results.len(), 3);
    let first = reply.results[0].result.as_ref().unwrap();
    assert!(first.token.text.contains("Paris"), "{first:?}");
    assert!(first.logits.is_empty());
    assert_eq!(reply.results[1].error.as_ref().unwrap().code, ErrorCode::BadRequest);
    assert!(reply.results[2].result.is_some());

    let config = switchyard::GenerateConfig {
        max_tokens: 4,
        ..Default::default()
    };
    let batch = client
        .batch(switchyard::BatchRequest {
            head: switchyard_messages::RequestHead::new(Client::new_request_id(), ""),
            prompts,
            config,
        })
        .await
        .unwrap();
    let alone = client
        .generate(greedy("The capital of France is", 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(batch.results[0].tokens, alone.tokens);
    assert_eq!(batch.results[1].error.as_ref().unwrap().code, ErrorCode::BadRequest);
    assert_eq!(batch.results[2].tokens.len(), 4);

    // A failure of the whole request is an error reply with a code.
    let err = client
        .classify(switchyard::ClassifyRequest {
            head: switchyard_messages::RequestHead {
                v: 1,
                request_id: Client::new_request_id(),
                model: "missing".into(),
                backend: None,
                worker: None,
                deadline_ms: None,
                tenant: None,
                priority: None,
                queue_ms: None,
                adapter: None,
            },
            prompts: vec!["x".into()],
            return_logits: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::UnknownModel), "{err}");
}
