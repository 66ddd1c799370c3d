//! The three-role permission template, docs/nats-roles.conf, on a real nats-server:
//! a fleet (coordinator, worker, two clients) works under it exactly as shipped; a
//! misbehaving client is refused by the server when it publishes a heartbeat, a KV
//! event or a worker's chunk, reads another client's inbox or joins the
//! coordinators' queue group, and none of it changes what the fleet routes or
//! serves. A cancel that does not name the requester's inbox is ignored.

mod common;

use common::*;
use futures::StreamExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard::{Client, ClientOptions};
use switchyard_config::NatsSecurity;
use switchyard_messages::{encode, CancelRequest, FinishReason, KvEvent, StreamChunk, Subjects, WorkerStatus};
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

const SECRETS: &str = r#"
COORDINATOR_PASS: "coord-pw-1"
WORKER_PASS: "worker-pw-2"
ALICE_PASS: "alice-pw-3"
BOB_PASS: "bob-pw-4"
OPERATOR_PASS: "operator-pw-5"
"#;

fn role(user: &str, password: &str, inbox: &str) -> NatsSecurity {
    NatsSecurity {
        user: user.into(),
        password: password.into(),
        inbox_prefix: inbox.into(),
        ..NatsSecurity::default()
    }
}

async fn client_as(url: &str, security: NatsSecurity) -> Client {
    let opts = ClientOptions {
        security,
        stall_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    Client::connect_with(url, opts).await.expect("client connects")
}

/// A raw connection as bob, recording the server's errors (permission violations).
async fn raw_bob(url: &str) -> (async_nats::Client, Arc<Mutex<Vec<String>>>) {
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let nc = async_nats::ConnectOptions::with_user_and_password("bob".into(), "bob-pw-4".into())
        .custom_inbox_prefix("_INBOX.bob")
        .event_callback(move |event| {
            let seen = seen.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    seen.lock().unwrap().push(e.to_string().to_lowercase());
                }
            }
        })
        .connect(url)
        .await
        .expect("bob connects");
    (nc, errors)
}

/// Waits until the server has reported a violation mentioning `subject`.
async fn violation(errors: &Arc<Mutex<Vec<String>>>, subject: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if errors
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.contains("permissions violation") && e.contains(&subject.to_lowercase()))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no permissions violation for {subject}; errors: {:?}",
            errors.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_three_roles_serve_and_refuse_what_docs_say() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secrets.conf"), SECRETS).unwrap();
    let template = std::fs::read_to_string(repo().join("docs/nats-roles.conf")).unwrap();
    let nats = NatsServer::start_with_config(&find_nats_server("").unwrap(), &template, dir.path())
        .expect("nats-server takes the template as shipped");
    let url = nats.url();

    // The fleet, each process in its role.
    let mut config = fleet_config(&url);
    config.worker.capacity = 2;
    let security = |s: NatsSecurity, mut c: switchyard::Config| {
        c.nats.user = s.user;
        c.nats.password = s.password;
        c.nats.inbox_prefix = s.inbox_prefix;
        c.validate().expect("valid config");
        c
    };
    let coordinator = switchyard::node::start_coordinator(&security(
        role("coordinator", "coord-pw-1", "_INBOX.coordinator"),
        config.clone(),
    ))
    .await
    .expect("the coordinator starts in its role");
    let worker_config = security(role("worker", "worker-pw-2", ""), config.clone());
    let loaded = switchyard::node::load(&worker_config).await.unwrap();
    let worker = switchyard::node::start_worker(&worker_config, &loaded)
        .await
        .expect("the worker starts in its role");
    let alice = client_as(&url, role("alice", "alice-pw-3", "_INBOX.alice")).await;
    wait_for_workers(&alice, &["w1"], Duration::from_secs(10)).await;

    // Everything a client does works: generate, chat, classify, batch, status,
    // models, a session, its own cancel.
    let done = alice
        .generate(greedy("The capital of France is", 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(done.tokens.len(), 4);
    let batch = alice
        .batch(switchyard_messages::BatchRequest {
            head: switchyard_messages::RequestHead::new(Client::new_request_id(), ""),
            prompts: vec!["Hello".into()],
            config: switchyard_messages::GenerateConfig {
                max_tokens: 3,
                ..Default::default()
            },
        })
        .await
        .expect("batch works for a client");
    assert_eq!(batch.results[0].tokens.len(), 3);
    assert_eq!(batch.results[0].finish_reason, Some(FinishReason::Length));
    assert_eq!(alice.models().await.unwrap().models.len(), 1);
    let session = alice
        .open_session(switchyard_messages::session::OpenSessionRequest::new("alice-app-1", ""))
        .await
        .expect("a client opens a session");
    session.close().await.expect("and closes it");
    let mut cancelled = alice.generate(greedy("Once upon a time", 200)).await.unwrap();
    while !matches!(cancelled.next().await, Some(Ok(switchyard::StreamEvent::Tokens(_)))) {}
    cancelled.cancel().await.unwrap();
    let c = cancelled.collect().await.unwrap();
    assert_eq!(
        c.finish_reason,
        FinishReason::Cancelled,
        "a client cancels its own request"
    );

    // A request that waits in the fleet queue behind three long ones gets keep-alives
    // from its coordinator (several answers to one request) and is then served.
    let long: Vec<_> = (0..3)
        .map(|_| {
            let a = alice.clone();
            tokio::spawn(async move {
                a.generate(greedy("Once upon a time", 400))
                    .await
                    .unwrap()
                    .collect()
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A stall limit of 1 s and no resuming: only the keep-alives keep it alive.
    let impatient = Client::connect_with(
        &url,
        ClientOptions {
            security: role("alice", "alice-pw-3", "_INBOX.alice"),
            stall_timeout: Duration::from_secs(1),
            resume_attempts: 0,
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    let waited = impatient
        .generate(greedy("The capital of France is", 4))
        .await
        .unwrap()
        .collect()
        .await
        .expect("a request that waited in the fleet queue is served");
    assert!(
        waited.metrics.fleet_queue_us > 1_000_000,
        "it should have waited past its stall limit on keep-alives alone: {:?}",
        waited.metrics
    );
    for l in long {
        l.await.unwrap().expect("the long requests finish");
    }

    // Bob misbehaves; the server refuses each attempt.
    let (bob, errors) = raw_bob(&url).await;
    let subjects = Subjects::default();
    let fake = WorkerStatus {
        worker_id: "evil".into(),
        ..alice.status().await.unwrap().workers[0].status.clone()
    };
    bob.publish(subjects.heartbeat("evil"), encode(&fake).into())
        .await
        .unwrap();
    violation(&errors, "sy.v1.heartbeat.evil").await;
    let event = KvEvent {
        v: 1,
        worker_id: "w1".into(),
        seq: 999,
        stored: vec![1, 2, 3],
        removed: vec![],
        ..Default::default()
    };
    bob.publish(subjects.kv("w1"), encode(&event).into()).await.unwrap();
    violation(&errors, "sy.v1.kv.w1").await;
    // Answering into alice's inbox as if it were a worker.
    let chunk = StreamChunk::failed(
        "r1",
        0,
        switchyard_messages::WireError::new(switchyard_messages::ErrorCode::Overloaded, "fake"),
    );
    bob.publish("_INBOX.alice.x.y", encode(&chunk).into()).await.unwrap();
    violation(&errors, "_INBOX.alice.x.y").await;
    // Reading alice's streams.
    let mut spy = bob.subscribe("_INBOX.alice.>").await.unwrap();
    violation(&errors, "_INBOX.alice.>").await;
    // Taking requests from the coordinators' queue group.
    let mut thief = bob
        .queue_subscribe(subjects.generate(), "sy-coordinators".into())
        .await
        .unwrap();
    violation(&errors, "sy.v1.generate").await;
    // KV is the workers' alone (protocol 1.11): a client can neither ask a worker
    // for what it holds nor pose as one to serve (or inject) KV.
    let pull = switchyard_messages::KvPullRequest {
        v: 1,
        transfer: switchyard_messages::kv_transfer::KV_TRANSFER_VERSION,
        request_id: "r1".into(),
        format: String::new(),
        adapter: None,
        adapter_key: None,
        tokens: vec![1; 32],
        first_block: 0,
        blocks: 1,
        part: 0,
        parts: 1,
        tail: 0,
    };
    bob.publish(subjects.kv_pull("w1"), encode(&pull).into()).await.unwrap();
    violation(&errors, "sy.v1.kv.w1.pull").await;
    let mut kv_thief = bob.subscribe(subjects.kv_pull("w2")).await.unwrap();
    violation(&errors, "sy.v1.kv.w2.pull").await;
    // Nor have a prefill worker compute for it (1.12): prefills are asked by workers.
    let prefill = switchyard_messages::PrefillRequest {
        v: 1,
        request_id: "r1".into(),
        model: String::new(),
        format: String::new(),
        adapter: None,
        tokens: vec![1; 64],
        deadline_ms: None,
    };
    bob.publish(subjects.worker("w1", "prefill"), encode(&prefill).into())
        .await
        .unwrap();
    violation(&errors, "sy.v1.worker.w1.prefill").await;
    // Nor move a session onto a worker, or pass calls on as a draining worker does
    // (1.13).
    for subject in [
        subjects.relay("session"),
        subjects.worker("w1", "session_adopt"),
        subjects.session_relay("w1", "s1", "decode"),
    ] {
        bob.publish(subject.clone(), Vec::new().into()).await.unwrap();
        violation(&errors, &subject).await;
    }
    // Unloading a worker's LoRA adapters is the operator's, not a client's.
    let unload = switchyard_messages::AdapterRequest {
        v: 1,
        op: switchyard_messages::AdapterOp::Unload,
        name: "x".into(),
        path: String::new(),
        scale: 1.0,
    };
    bob.publish(subjects.worker("w1", "adapters"), encode(&unload).into())
        .await
        .unwrap();
    violation(&errors, "sy.v1.worker.w1.adapters").await;
    let operator = client_as(&url, role("operator", "operator-pw-5", "_INBOX.operator")).await;
    let listed = operator
        .adapters(
            "w1",
            switchyard_messages::AdapterRequest {
                op: switchyard_messages::AdapterOp::List,
                ..unload
            },
        )
        .await
        .expect("the operator lists a worker's adapters");
    assert!(listed.adapters.is_empty(), "{listed:?}");

    // None of it changed routing or service: still one worker (w1), its KV view its
    // own; alice's requests are all served, and bob saw none of them.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let status = alice.status().await.unwrap();
    let ids: Vec<_> = status.workers.iter().map(|w| w.status.worker_id.as_str()).collect();
    assert_eq!(ids, ["w1"], "a client's heartbeat must not add a worker");
    for _ in 0..4 {
        let done = alice
            .generate(greedy("The capital of France is", 3))
            .await
            .unwrap()
            .collect()
            .await
            .expect("served by the fleet, not by the thief");
        assert_eq!(done.tokens.len(), 3);
    }
    let nothing = tokio::time::timeout(Duration::from_millis(300), async {
        tokio::select! {
            m = spy.next() => m.map(|m| m.subject.to_string()),
            m = thief.next() => m.map(|m| m.subject.to_string()),
            m = kv_thief.next() => m.map(|m| m.subject.to_string()),
        }
    })
    .await;
    assert!(matches!(nothing, Err(_) | Ok(None)), "bob received {nothing:?}");

    // A cancel for alice's request that does not name her inbox is ignored, even
    // with the request id known.
    let mut req = greedy("Once upon a time", 48);
    req.head.request_id = "alice-known-id".into();
    let mut stream = alice.generate(req).await.unwrap();
    let mut got = 0;
    while got == 0 {
        // The request is running before bob's cancels arrive.
        if let switchyard::StreamEvent::Tokens(t) = stream.next().await.unwrap().unwrap() {
            got += t.len();
        }
    }
    bob.publish(subjects.cancel("alice-known-id"), bytes::Bytes::new())
        .await
        .unwrap();
    bob.publish(
        subjects.cancel("alice-known-id"),
        encode(&CancelRequest::new("_INBOX.bob.guess")).into(),
    )
    .await
    .unwrap();
    bob.flush().await.unwrap();
    let done = stream.collect().await.unwrap();
    assert_eq!(
        done.finish_reason,
        FinishReason::Length,
        "a forged cancel stopped alice's request"
    );
    assert_eq!(got + done.tokens.len(), 48);

    worker.shutdown(Duration::from_secs(2)).await;
    coordinator.shutdown().await;
}

/// A model split into pipeline stages (protocol §11h) runs under the worker role as
/// docs/nats-roles.conf ships it: the stages pass rows on `sy.v1.stage.>`, a client's
/// request on the pipelined model is served, and a client can neither feed a stage
/// nor listen to one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_stages_run_under_the_worker_role_and_clients_cannot_reach_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secrets.conf"), SECRETS).unwrap();
    let template = std::fs::read_to_string(repo().join("docs/nats-roles.conf")).unwrap();
    let nats = NatsServer::start_with_config(&find_nats_server("").unwrap(), &template, dir.path()).unwrap();
    let url = nats.url();
    let mut config = fleet_config(&url);
    let security = |s: NatsSecurity, mut c: switchyard::Config| {
        c.nats.user = s.user;
        c.nats.password = s.password;
        c.nats.inbox_prefix = s.inbox_prefix;
        c.validate().expect("valid config");
        c
    };
    let coordinator = switchyard::node::start_coordinator(&security(
        role("coordinator", "coord-pw-1", "_INBOX.coordinator"),
        config.clone(),
    ))
    .await
    .unwrap();
    config.worker.pipeline = "p".into();
    config.worker.threads = 1;
    let mut later = config.clone();
    later.worker.layers = "14-29".into();
    later.worker.id = "stage-b".into();
    let stage = switchyard::node::serve_stage(&security(role("worker", "worker-pw-2", "_INBOX.worker"), later))
        .await
        .expect("a later stage starts in the worker role");
    config.worker.layers = "0-13".into();
    config.worker.model_name = "split".into();
    let first = security(role("worker", "worker-pw-2", "_INBOX.worker"), config);
    let loaded = switchyard::node::load(&first).await.unwrap();
    let worker = switchyard::node::start_worker(&first, &loaded).await.unwrap();
    let alice = client_as(&url, role("alice", "alice-pw-3", "_INBOX.alice")).await;
    wait_for_workers(&alice, &["w1"], Duration::from_secs(10)).await;
    let mut req = greedy("The capital of France is", 4);
    req.head.model = "split".into();
    let done = alice.generate(req).await.unwrap().collect().await.unwrap();
    assert_eq!(done.tokens.len(), 4);

    let (bob, errors) = raw_bob(&url).await;
    let subject = Subjects::default().stage("p", 14);
    bob.publish(subject.clone(), bytes::Bytes::from_static(b"\x80"))
        .await
        .unwrap();
    violation(&errors, &subject).await;
    let _spy = bob.subscribe(subject.clone()).await.unwrap();
    violation(&errors, &subject).await;

    worker.shutdown(Duration::from_secs(2)).await;
    stage.stop();
    coordinator.shutdown().await;
}
