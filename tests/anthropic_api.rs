//! Anthropic's Messages API on the gateway (`/v1/messages`, `/v1/messages/count_tokens`),
//! tested the way Claude Code and the Anthropic SDKs touch it: the official PyPI
//! `anthropic` client against a real gateway → coordinator → CPU worker (whole and
//! streamed answers, a two-tool loop, count_tokens, errors in Anthropic's shape), the
//! npm `@anthropic-ai/sdk` for a streamed message and a streamed call, and `curl` for
//! the raw event framing and the `x-api-key` header.

mod common;

use common::*;
use std::process::Command;
use switchyard::gateway::{self, keys::hash_key, GatewayHandle};
use switchyard_config::{ApiKey, GatewayConfig};

const GOOD: &str = "sk-switchyard-anthropic-8d21";
const RESTRICTED: &str = "sk-switchyard-anthropic-restricted-0b7e";

async fn start(f: &Fleet) -> GatewayHandle {
    let key = |name: &str, k: &str, models: Vec<String>| ApiKey {
        name: name.into(),
        sha256: hash_key(k),
        models,
        ..ApiKey::default()
    };
    let config = GatewayConfig {
        listen: "127.0.0.1:0".into(),
        keys: vec![
            key("good", GOOD, Vec::new()),
            key("restricted", RESTRICTED, vec!["some-other-model".into()]),
        ],
        ..GatewayConfig::default()
    };
    gateway::start(f.client().await, "sy", &config)
        .await
        .expect("gateway starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_anthropic_client_works_against_the_gateway() {
    let f = fleet(|c| c.worker.capacity = 2).await;
    let g = start(&f).await;
    let args = vec![g.url(), GOOD.into(), RESTRICTED.into(), DEMO_NAME.into()];
    let r = run_check(python(), "anthropic_check.py", args).await;

    let create = &r["create"];
    assert_eq!(create["model"], DEMO_NAME);
    assert!(create["input_tokens"].as_u64().unwrap() + create["cache_read"].as_u64().unwrap() > 5);
    assert!(!create["text"].as_str().unwrap().is_empty());
    let stream = &r["stream"];
    for ev in [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ] {
        assert!(
            stream["events"].as_array().unwrap().iter().any(|e| e == ev),
            "{ev}: {stream}"
        );
    }
    assert!(stream["deltas"].as_u64().unwrap() >= 2, "{stream}");
    // The second time the same prompt is mostly reused KV, and usage says so.
    assert!(stream["cache_read"].as_u64().unwrap() > 0, "{stream}");
    assert!(!r["tool_loop"]["first"]["calls"].as_array().unwrap().is_empty());
    assert_eq!(r["tool_stream"]["calls"][0]["name"], "get_weather");
    assert_eq!(r["output_format"]["valid"], true, "{}", r["output_format"]);
    assert_eq!(r["prewarm"]["content"], 0, "{}", r["prewarm"]);

    let e = &r["errors"];
    let is = |k: &str, class: &str, status: u64, kind: &str| {
        assert_eq!(e[k]["class"], class, "{k}: {}", e[k]);
        assert_eq!(e[k]["status"], status, "{k}: {}", e[k]);
        assert_eq!(e[k]["type"], "error", "{k}: {}", e[k]);
        assert_eq!(e[k]["error_type"], kind, "{k}: {}", e[k]);
    };
    is("no_key", "AuthenticationError", 401, "authentication_error");
    is("not_allowed", "PermissionDeniedError", 403, "permission_error");
    is("unknown_model", "NotFoundError", 404, "not_found_error");
    for k in ["unknown_field", "bad_role", "image", "bad_tool_choice"] {
        is(k, "BadRequestError", 400, "invalid_request_error");
    }
    assert!(e["unknown_field"]["message"].as_str().unwrap().contains("frobnicate"));
    assert!(e["image"]["message"]
        .as_str()
        .unwrap()
        .contains("messages[0].content[0].type"));

    // The npm SDK: a streamed message and a streamed tool call.
    let (base, script) = (g.url(), repo().join("tests/js/anthropic_check.mjs"));
    let out =
        tokio::task::spawn_blocking(move || Command::new("node").arg(script).args([&base, GOOD, DEMO_NAME]).output())
            .await
            .unwrap();
    match out {
        Err(e) => skip(
            Skip::Fixable,
            &format!("node is not on PATH ({e}): the npm SDK's check"),
        ),
        Ok(out) if out.status.code() == Some(3) => skip(
            Skip::Fixable,
            &format!(
                "@anthropic-ai/sdk is not installed (scripts/setup.sh): {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Ok(out) => {
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "anthropic_check.mjs failed:\n{}\n{stdout}",
                String::from_utf8_lossy(&out.stderr)
            );
            let js: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            eprintln!("{js:#}");
            assert!(js["stream"]["deltas"].as_u64().unwrap() >= 2, "{js}");
            assert_eq!(js["tool_stream"]["calls"][0]["name"], "get_weather", "{js}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_events_are_named_and_indexed_and_x_api_key_admits() {
    let f = fleet(|_| {}).await;
    let g = start(&f).await;
    let url = format!("{}/v1/messages", g.url());
    let body = serde_json::json!({"model": DEMO_NAME, "max_tokens": 12, "stream": true, "temperature": 0,
                                  "messages": [{"role": "user", "content": "Say hi."}]})
    .to_string();
    let run = move |key_header: String| {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-N",
                "-w",
                "\n%{http_code}",
                "-H",
                "content-type: application/json",
            ])
            .args([
                "-H",
                "anthropic-version: 2023-06-01",
                "-H",
                &key_header,
                "-d",
                &body,
                &url,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (run, run2) = (run.clone(), run);
    let text = tokio::task::spawn_blocking(move || run(format!("x-api-key: {GOOD}")))
        .await
        .unwrap();
    let (events, code) = text.rsplit_once('\n').unwrap();
    assert_eq!(code, "200", "{text}");
    // Every event is `event: NAME` then `data: {"type": NAME, …}`.
    let mut names = Vec::new();
    for block in events.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut lines = block.lines();
        let name = lines
            .next()
            .unwrap()
            .strip_prefix("event: ")
            .unwrap_or_else(|| panic!("{block}"));
        let data: serde_json::Value =
            serde_json::from_str(lines.next().unwrap().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(data["type"], name, "{block}");
        if name.starts_with("content_block") {
            assert_eq!(data["index"], 0, "one text block: {block}");
        }
        names.push(name.to_string());
    }
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(names[2], "content_block_start");
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"],
        "{names:?}"
    );
    // No key, or a wrong one: 401 in Anthropic's shape, before any event.
    let text = tokio::task::spawn_blocking(move || run2("x-api-key: wrong".into()))
        .await
        .unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    assert_eq!(code, "401", "{text}");
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error");
}
