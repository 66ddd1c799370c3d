//! OpenAI's Responses API on the gateway (`/v1/responses`), tested the way Codex
//! CLI and the OpenAI SDKs touch it: the official PyPI `openai` client against two
//! gateways of one fleet on a nats-server with JetStream — whole and streamed
//! answers, function tools, `text.format`, and a `previous_response_id` chain
//! started on one gateway and continued on the other (the stored responses live
//! in a JetStream key-value bucket); retrieve, input items, delete, errors.

mod common;

use common::*;
use std::process::Command;
use switchyard::gateway::{self, GatewayHandle};
use switchyard_config::GatewayConfig;
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

async fn open_gateway(f: &Fleet) -> GatewayHandle {
    let config = GatewayConfig {
        listen: "127.0.0.1:0".into(),
        ..GatewayConfig::default()
    };
    gateway::start(f.client().await, "sy", &config)
        .await
        .expect("gateway starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_runs_responses_across_two_gateways() {
    let dir = tempfile::tempdir().unwrap();
    let bin = find_nats_server("").expect("nats-server (run scripts/setup.sh)");
    let nats = NatsServer::start_jetstream(&bin, dir.path()).expect("start nats-server -js");
    let f = fleet_on(nats, |c| c.worker.capacity = 2).await;
    let (ga, gb) = (open_gateway(&f).await, open_gateway(&f).await);
    let args = vec![
        format!("{}/v1", ga.url()),
        format!("{}/v1", gb.url()),
        "sk-any".into(),
        DEMO_NAME.into(),
    ];
    let r = run_check(python(), "responses_check.py", args).await;

    assert_eq!(r["create"]["model"], DEMO_NAME);
    assert!(r["stream"]["deltas"].as_u64().unwrap() >= 2, "{}", r["stream"]);
    // The continued turn reuses the first turn's KV on the one worker.
    assert!(r["chain"]["second_cached"].as_u64().unwrap() > 0, "{}", r["chain"]);
    assert_eq!(r["chain"]["input_items"], 1);
    assert_eq!(r["format"]["valid"], true);
    let e = &r["errors"];
    for (k, class, status) in [
        ("unknown_previous", "NotFoundError", 404),
        ("hosted_tool", "BadRequestError", 400),
        ("unknown_field", "BadRequestError", 400),
        ("get_unknown", "NotFoundError", 404),
        ("image", "BadRequestError", 400),
    ] {
        assert_eq!(e[k]["class"], class, "{k}: {}", e[k]);
        assert_eq!(e[k]["status"], status, "{k}: {}", e[k]);
    }
}

/// The OpenAI Agents SDK (its own venv: current releases need openai 3) runs one
/// agent turn with a function tool over /v1/responses: the forced call, the tool's
/// output sent back, the model's answer after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_agents_sdk_runs_a_turn_with_a_tool() {
    let Some(py) = std::env::var_os("SWITCHYARD_AGENTS_PYTHON")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_file())
    else {
        skip(
            Skip::Fixable,
            "no openai-agents venv (SWITCHYARD_AGENTS_PYTHON; scripts/setup.sh makes it)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bin = find_nats_server("").expect("nats-server (run scripts/setup.sh)");
    let nats = NatsServer::start_jetstream(&bin, dir.path()).expect("start nats-server -js");
    let f = fleet_on(nats, |_| {}).await;
    let g = open_gateway(&f).await;
    let args = vec![format!("{}/v1", g.url()), DEMO_NAME.into()];
    let r = run_check(py, "agents_check.py", args).await;
    assert!(!r["cities"][0].as_str().unwrap_or_default().is_empty(), "{r:#}");
}

/// Without JetStream the gateway still answers (storing nothing), and a follow-up
/// says why it cannot continue: 503 `store_unavailable`, not a silent fresh start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_jetstream_responses_are_answered_and_a_follow_up_says_why_not() {
    let f = fleet(|_| {}).await;
    let g = open_gateway(&f).await;
    let url = format!("{}/v1/responses", g.url());
    let post = move |body: serde_json::Value| {
        let url = url.clone();
        let out = Command::new("curl")
            .args(["-sS", "-w", "\n%{http_code}", "-H", "content-type: application/json"])
            .args(["-d", &body.to_string(), &url])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (
            code.to_string(),
            serde_json::from_str::<serde_json::Value>(body).unwrap(),
        )
    };
    let (p1, p2) = (post.clone(), post);
    let (code, first) = tokio::task::spawn_blocking(move || {
        p1(serde_json::json!({"model": DEMO_NAME, "input": "Hi.", "max_output_tokens": 4}))
    })
    .await
    .unwrap();
    assert_eq!(code, "200", "{first}");
    assert_eq!(first["object"], "response");
    let id = first["id"].as_str().unwrap().to_string();
    let (code, e) = tokio::task::spawn_blocking(move || {
        p2(serde_json::json!({"model": DEMO_NAME, "input": "And?", "previous_response_id": id}))
    })
    .await
    .unwrap();
    assert_eq!(code, "503", "{e}");
    assert_eq!(e["error"]["code"], "store_unavailable", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("JetStream"), "{e}");
}

/// Under deploy/nats/roles.conf (JetStream on, every process with its own user) the
/// `gateway` user stores and continues responses in its bucket, while a client
/// user (`ops`) may not read the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_user_of_the_deployed_roles_may_use_the_response_store_and_clients_may_not() {
    use switchyard::ClientOptions;
    use switchyard_config::NatsSecurity;
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(repo().join("deploy/nats/roles.conf"), dir.path().join("roles.conf")).unwrap();
    let secrets = ["COORDINATOR", "WORKER", "EDGE", "GATEWAY", "OPS", "OPERATOR"]
        .map(|u| format!("{u}_PASS: \"{}-pw\"\n", u.to_lowercase()))
        .concat();
    std::fs::write(dir.path().join("secrets.conf"), secrets).unwrap();
    let js = dir.path().join("js");
    let config = format!(
        "jetstream {{ store_dir: {:?} }}\ninclude \"roles.conf\"\n",
        js.display().to_string()
    );
    let bin = find_nats_server("").expect("nats-server (run scripts/setup.sh)");
    let nats = NatsServer::start_with_config(&bin, &config, dir.path()).expect("nats-server with the deployed roles");
    let url = nats.url();
    let as_user = |user: &str, c: &mut switchyard::Config| {
        c.nats.user = user.into();
        c.nats.password = format!("{user}-pw");
        c.nats.inbox_prefix = format!("_INBOX.{user}");
    };
    let mut config = fleet_config(&url);
    as_user("coordinator", &mut config);
    let coordinator = switchyard::node::start_coordinator(&config).await.expect("coordinator");
    as_user("worker", &mut config);
    let loaded = switchyard::node::load(&config).await.unwrap();
    let worker = switchyard::node::start_worker(&config, &loaded).await.unwrap();
    let security = |user: &str| NatsSecurity {
        user: user.into(),
        password: format!("{user}-pw"),
        inbox_prefix: format!("_INBOX.{user}"),
        ..NatsSecurity::default()
    };
    let connect = |user: &str| {
        let opts = ClientOptions {
            security: security(user),
            stall_timeout: std::time::Duration::from_secs(5),
            ..ClientOptions::default()
        };
        switchyard::Client::connect_with(&url, opts)
    };
    let gw_client = connect("gateway").await.expect("the gateway connects");
    wait_for_workers(&gw_client, &["w1"], std::time::Duration::from_secs(10)).await;
    let g = gateway::start(
        gw_client,
        "sy",
        &GatewayConfig {
            listen: "127.0.0.1:0".into(),
            ..GatewayConfig::default()
        },
    )
    .await
    .unwrap();
    let url_r = format!("{}/v1/responses", g.url());
    let post = move |body: serde_json::Value| {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-H",
                "content-type: application/json",
                "-d",
                &body.to_string(),
                &url_r,
            ])
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let (p1, p2) = (post.clone(), post);
    let first = tokio::task::spawn_blocking(move || {
        p1(serde_json::json!({"model": DEMO_NAME, "input": "My name is Ada.", "max_output_tokens": 4}))
    })
    .await
    .unwrap();
    let id = first["id"].as_str().expect("a response").to_string();
    let id2 = id.clone();
    let second = tokio::task::spawn_blocking(move || {
        p2(
            serde_json::json!({"model": DEMO_NAME, "input": "My name?", "previous_response_id": id2,
                              "max_output_tokens": 4}),
        )
    })
    .await
    .unwrap();
    assert_eq!(second["previous_response_id"], id.as_str(), "{second}");
    assert!(second["usage"]["input_tokens"].as_u64() > first["usage"]["input_tokens"].as_u64());

    // A client user cannot read the bucket.
    let ops = async_nats::ConnectOptions::with_user_and_password("ops".into(), "ops-pw".into())
        .custom_inbox_prefix("_INBOX.ops")
        .connect(&url)
        .await
        .unwrap();
    let kv = async_nats::jetstream::new(ops)
        .get_key_value("switchyard-responses")
        .await;
    assert!(kv.is_err(), "ops opened the response bucket");
    g.shutdown().await;
    worker.shutdown(std::time::Duration::from_secs(2)).await;
    coordinator.shutdown().await;
}
