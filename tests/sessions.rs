//! Sessions (seed 002) end to end on a real nats-server, coordinator and CPU worker
//! with the demo model: warm reuse and its manifest rules, the decode answer against
//! a plain generation of the same text, and every session error code provoked.

mod common;

use common::*;
use std::time::Duration;
use switchyard::client::ClientError;
use switchyard_messages::session::{ContextManifest, OpenSessionRequest};
use switchyard_messages::{ErrorCode, GenerateConfig};

const PREFIX: &str = "You are a code reviewer. Be brief and precise. The project is a Rust service that \
    serves language models from a fleet of machines over NATS.";

fn code(e: ClientError) -> ErrorCode {
    match e {
        ClientError::Remote { error, .. } => error.code,
        other => panic!("not a remote error: {other:?}"),
    }
}

fn manifest(profile: &str) -> ContextManifest {
    ContextManifest {
        profile: profile.into(),
        model: "smol".into(),
        template_digest: "t1".into(),
        ..ContextManifest::default()
    }
}

/// A session's decode of 16 greedy tokens and a plain generation of the same text:
/// they must agree. Returns the decoded completion.
async fn decode_matches_plain(
    client: &switchyard::Client,
    session: &switchyard::session::Session,
    text: &str,
) -> switchyard::Completion {
    let cfg = GenerateConfig {
        max_tokens: 16,
        ..GenerateConfig::default()
    };
    let decoded = session.decode(cfg).await.unwrap().collect().await.unwrap();
    let plain = client
        .generate(greedy(text, 16))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let ids = |c: &switchyard::Completion| c.tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(&decoded), ids(&plain), "session decode vs plain generate");
    decoded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_reuse_by_manifest_decode_like_generate_and_fail_with_their_codes() {
    let fleet = fleet(|c| {
        c.worker.parallel_slots = 3;
        c.worker.threads = 1;
    })
    .await;
    let client = fleet.client().await;
    let m = manifest("review");

    let session = client
        .open_session(OpenSessionRequest::new("owner-a", ""))
        .await
        .unwrap();
    assert_eq!(session.opened.worker_id, "w1");
    let info = session.describe().await.unwrap();
    assert!(info.kv_bytes_per_token > 0 && info.weights_bytes > 0, "{info:?}");
    assert!(
        info.effective_context > 0 && info.effective_context <= info.model_max_context,
        "{info:?}"
    );
    assert_eq!(session.opened.num_ctx, info.effective_context);

    // Cold prefix, then the same again: everything reused.
    let cold = session.ensure_prefix(PREFIX, &m).await.unwrap();
    assert_eq!((cold.reused_tokens, cold.dropped_tokens), (0, 0), "{cold:?}");
    assert_eq!(cold.prefilled_tokens, cold.prefix_tokens);
    let warm = session.ensure_prefix(PREFIX, &m).await.unwrap();
    assert_eq!(warm.reused_tokens, warm.prefix_tokens, "{warm:?}");
    assert_eq!(warm.prefilled_tokens, 0);
    assert_eq!(
        (&warm.stable_token_hash, &warm.manifest_digest),
        (&cold.stable_token_hash, &cold.manifest_digest)
    );

    // Suffix, decode: the same tokens a plain generation of prefix + suffix gives
    // (segments are tokenized apart; this boundary, before a newline, tokenizes the
    // same either way).
    let suffix = "\nReview this function: fn add(a: i32, b: i32) -> i32 { a - b }\nReview:";
    let s = session.prefill_suffix(suffix, &m).await.unwrap();
    assert!(s.suffix_tokens > 5 && s.prefilled_tokens == s.suffix_tokens, "{s:?}");
    assert_eq!(s.resident_tokens, warm.prefix_tokens + s.suffix_tokens);
    let decoded = decode_matches_plain(&client, &session, &format!("{PREFIX}{suffix}")).await;
    assert_eq!(decoded.tokens.len(), 16);
    let cfg = GenerateConfig {
        max_tokens: 16,
        ..GenerateConfig::default()
    };
    let report = session.explain().await.unwrap();
    assert_eq!(report.prefix_tokens, warm.prefix_tokens);
    assert!(report.resident_tokens >= s.resident_tokens + 15, "{report:?}");
    assert_eq!(report.available_tokens, report.num_ctx - report.resident_tokens);

    // A new suffix drops the old one and what was generated, keeping the prefix.
    let s2 = session
        .prefill_suffix("\nReview: fn id(x: u8) -> u8 { x }\nReview:", &m)
        .await
        .unwrap();
    assert!(s2.dropped_tokens >= 15, "{s2:?}");
    let again = session.ensure_prefix(PREFIX, &m).await.unwrap();
    assert_eq!(again.reused_tokens, again.prefix_tokens);
    assert_eq!(again.dropped_tokens, s2.suffix_tokens);

    // A changed manifest invalidates byte-identical text; a changed prefix reuses
    // only the common head.
    let other = ContextManifest {
        runtime_digest: "threads=2".into(),
        ..m.clone()
    };
    let invalidated = session.ensure_prefix(PREFIX, &other).await.unwrap();
    assert_eq!(invalidated.reused_tokens, 0, "{invalidated:?}");
    assert_eq!(invalidated.dropped_tokens, again.prefix_tokens);
    assert_ne!(invalidated.manifest_digest, again.manifest_digest);
    let edited = session
        .ensure_prefix(&format!("{PREFIX} Also check error handling."), &other)
        .await
        .unwrap();
    // (the last prefix token may merge with the new text)
    assert!(
        edited.reused_tokens + 2 >= invalidated.prefix_tokens && edited.reused_tokens <= invalidated.prefix_tokens,
        "{edited:?}"
    );
    // A suffix under another manifest than the resident prefix's is refused.
    assert_eq!(
        code(session.prefill_suffix("x", &m).await.unwrap_err()),
        ErrorCode::BadRequest
    );

    // context_overflow: a prefix beyond the session's window, and a decode beyond it.
    let small = client
        .open_session(OpenSessionRequest {
            config: switchyard_messages::session::SessionConfig {
                num_ctx: 64,
                ..Default::default()
            },
            ..OpenSessionRequest::new("owner-a", "")
        })
        .await
        .unwrap();
    assert_eq!(small.opened.num_ctx, 64);
    assert_eq!(
        code(small.ensure_prefix(&PREFIX.repeat(3), &m).await.unwrap_err()),
        ErrorCode::ContextOverflow
    );
    small.ensure_prefix(PREFIX, &m).await.unwrap();
    let big = GenerateConfig {
        max_tokens: 60,
        ..GenerateConfig::default()
    };
    let err = small.decode(big).await.unwrap().collect().await.unwrap_err();
    assert_eq!(code(err), ErrorCode::ContextOverflow);

    // Slots: 3 on this worker, one always stays for requests → a third session is
    // refused (retryably, so a fleet would try another worker).
    let full = client
        .open_session(OpenSessionRequest::new("owner-a", ""))
        .await
        .unwrap_err();
    assert_eq!(code(full), ErrorCode::Overloaded);
    // Plain requests still run beside two sessions.
    client
        .generate(greedy("Hello", 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();

    // not_owner: a call naming another owner.
    let intruder = session.with_fence("owner-b");
    assert_eq!(code(intruder.explain().await.unwrap_err()), ErrorCode::NotOwner);
    assert_eq!(
        code(intruder.ensure_prefix(PREFIX, &m).await.unwrap_err()),
        ErrorCode::NotOwner
    );

    // backend_mismatch: a model type this worker does not serve.
    let openvino = OpenSessionRequest {
        model_type: "openvino".into(),
        ..OpenSessionRequest::new("owner-a", "")
    };
    assert_eq!(
        code(client.open_session(openvino).await.unwrap_err()),
        ErrorCode::BackendMismatch
    );

    // session_closed: close, then any call; closing frees the slot.
    small.close().await.unwrap();
    assert!(small.explain().await.unwrap().closed);
    assert_eq!(
        code(small.ensure_prefix(PREFIX, &m).await.unwrap_err()),
        ErrorCode::SessionClosed
    );
    assert_eq!(code(small.close().await.unwrap_err()), ErrorCode::SessionClosed);

    // stale_fence: a newer open by another owner supersedes owner-a's sessions.
    let b = client
        .open_session(OpenSessionRequest::new("owner-b", ""))
        .await
        .unwrap();
    // The stale session gave its slot back at once: owner-b can open a second one.
    let b2 = client
        .open_session(OpenSessionRequest::new("owner-b", ""))
        .await
        .unwrap();
    assert_eq!(
        code(session.ensure_prefix(PREFIX, &m).await.unwrap_err()),
        ErrorCode::StaleFence
    );
    assert_eq!(
        code(session.decode(cfg).await.unwrap().collect().await.unwrap_err()),
        ErrorCode::StaleFence
    );
    let st = b2.ensure_prefix(PREFIX, &m).await.unwrap();
    assert_eq!(st.prefix_tokens, cold.prefix_tokens);
    b.close().await.unwrap();
    b2.close().await.unwrap();
    drop(fleet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_expires_and_then_nothing_answers() {
    let fleet = fleet(|c| {
        c.worker.parallel_slots = 2;
        c.worker.threads = 1;
        c.worker.session_idle_secs = 1;
    })
    .await;
    let client = fleet.client().await;
    let m = manifest("idle");
    let s = client.open_session(OpenSessionRequest::new("o", "")).await.unwrap();
    s.ensure_prefix("Hello there.", &m).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Expired: closed (its slot back), answered as closed for one more idle period…
    assert_eq!(
        code(s.ensure_prefix("Hello there.", &m).await.unwrap_err()),
        ErrorCode::SessionClosed
    );
    let report = s.explain().await.unwrap();
    assert!(report.closed);
    // …then forgotten: nothing answers, which the client reports the same way.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(code(s.explain().await.unwrap_err()), ErrorCode::SessionClosed);
    // The slot is free again for a new session.
    client.open_session(OpenSessionRequest::new("o", "")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llama_cpp_worker_serves_sessions_on_a_pinned_slot() {
    let Some(bin) = llama_server_bin() else { return };
    let server = switchyard_procs::llama_server::LlamaServer::start_with(&bin, &demo_model(), 1, 2, &[])
        .await
        .unwrap();
    let url = server.url.clone();
    let fleet = fleet(move |c| {
        c.worker.backend = "llama_cpp".into();
        c.worker.llama_url = url;
    })
    .await;
    let client = fleet.client().await;
    let m = manifest("review");
    let session = client
        .open_session(OpenSessionRequest::new("owner-a", ""))
        .await
        .unwrap();
    // Two server slots: one for the session, one stays for requests.
    assert_eq!(
        code(
            client
                .open_session(OpenSessionRequest::new("owner-a", ""))
                .await
                .unwrap_err()
        ),
        ErrorCode::Overloaded
    );
    let cold = session.ensure_prefix(PREFIX, &m).await.unwrap();
    assert_eq!(cold.reused_tokens, 0, "{cold:?}");
    assert_eq!(cold.prefilled_tokens, cold.prefix_tokens);
    // llama.cpp recomputes the last token of a fully cached prompt.
    let warm = session.ensure_prefix(PREFIX, &m).await.unwrap();
    assert_eq!(warm.reused_tokens, warm.prefix_tokens - 1, "{warm:?}");
    let suffix = "\nReview this function: fn add(a: i32, b: i32) -> i32 { a - b }\nReview:";
    let s = session.prefill_suffix(suffix, &m).await.unwrap();
    assert!(s.prefilled_tokens <= s.suffix_tokens + 1, "{s:?}");
    decode_matches_plain(&client, &session, &format!("{PREFIX}{suffix}")).await;
    let report = session.explain().await.unwrap();
    assert_eq!(report.resident_tokens, s.resident_tokens + 16);
    // The manifest rule holds here too.
    let other = ContextManifest {
        template_digest: "t2".into(),
        ..m.clone()
    };
    assert_eq!(session.ensure_prefix(PREFIX, &other).await.unwrap().reused_tokens, 0);
    session.close().await.unwrap();
    client
        .open_session(OpenSessionRequest::new("owner-a", ""))
        .await
        .unwrap();
}
