//! Ollama's API on the gateway (`/api/*`), tested the way Ollama's clients touch it:
//! the official PyPI `ollama` client against a real gateway → coordinator → CPU
//! worker (chat and generate whole and streamed, a schema format, a tool turn,
//! embeddings, the listings, errors), and `curl` for the NDJSON framing of Ollama's
//! default, streamed, answer.

mod common;

use common::*;
use std::process::Command;
use switchyard::gateway::{self, keys::hash_key, GatewayHandle};
use switchyard_config::{ApiKey, GatewayConfig};

const KEY: &str = "sk-switchyard-ollama-3c9a";

async fn start(f: &Fleet) -> GatewayHandle {
    let config = GatewayConfig {
        listen: "127.0.0.1:0".into(),
        keys: vec![ApiKey {
            name: "ollama".into(),
            sha256: hash_key(KEY),
            ..ApiKey::default()
        }],
        ..GatewayConfig::default()
    };
    gateway::start(f.client().await, "sy", &config)
        .await
        .expect("gateway starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_ollama_client_works_against_the_gateway() {
    let f = fleet(|c| c.worker.capacity = 2).await;
    let g = start(&f).await;
    let r = run_check(python(), "ollama_check.py", vec![g.url(), KEY.into(), DEMO_NAME.into()]).await;

    assert_eq!(r["listings"]["tags"], serde_json::json!([DEMO_NAME]));
    assert_eq!(r["listings"]["details"]["format"], "gguf");
    assert!(
        r["listings"]["context_length"].as_u64().unwrap() > 0,
        "{}",
        r["listings"]
    );
    assert!(r["chat"]["pieces"].as_u64().unwrap() >= 3, "{}", r["chat"]);
    assert_eq!(r["format"]["valid"], true, "{}", r["format"]);
    assert_eq!(r["embed"]["dims"], serde_json::json!([576, 576]));
    let e = &r["errors"];
    for (k, status) in [
        ("unknown_model", 404),
        ("show_unknown", 404),
        ("bad_option", 400),
        ("image", 400),
        ("pull", 501),
        ("no_key", 401),
        ("stream_unknown_model", 404),
    ] {
        assert_eq!(e[k]["class"], "ResponseError", "{k}: {}", e[k]);
        assert_eq!(e[k]["status"], status, "{k}: {}", e[k]);
    }
    assert!(
        e["bad_option"]["error"].as_str().unwrap().contains("options.mirostat"),
        "{}",
        e["bad_option"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_request_streams_ndjson_as_ollama_does() {
    let f = fleet(|_| {}).await;
    let g = start(&f).await;
    let url = format!("{}/api/chat", g.url());
    // No `stream` field: Ollama's default is to stream.
    let body = serde_json::json!({"model": DEMO_NAME, "options": {"temperature": 0, "num_predict": 12},
                                  "messages": [{"role": "user", "content": "Say hi."}]})
    .to_string();
    let text = tokio::task::spawn_blocking(move || {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-N",
                "-D",
                "-",
                "-H",
                &format!("Authorization: Bearer {KEY}"),
                "-d",
                &body,
                &url,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .await
    .unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("content-type: application/x-ndjson"),
        "{head}"
    );
    let lines: Vec<serde_json::Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.len() >= 3, "{body}");
    let (last, pieces) = lines.split_last().unwrap();
    assert!(
        pieces
            .iter()
            .all(|l| l["done"] == false && l["message"]["role"] == "assistant"),
        "{body}"
    );
    assert_eq!(last["done"], true);
    assert!(
        ["stop", "length"].contains(&last["done_reason"].as_str().unwrap()),
        "{last}"
    );
    assert!(last["eval_count"].as_u64().unwrap() >= 1);
    assert!(last["created_at"].as_str().unwrap().ends_with('Z'));
}
