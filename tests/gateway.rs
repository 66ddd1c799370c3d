//! The OpenAI-compatible gateway, tested the way users touch it: the official
//! `openai` Python package against a real gateway → coordinator → CPU worker; `curl
//! -N` for the raw SSE framing; bad bodies answered 4xx while it keeps serving; a
//! client that hangs up cancels its request on the worker.

mod common;

use common::*;
use std::process::Command;
use std::time::{Duration, Instant};
use switchyard::gateway::{self, keys::hash_key, GatewayHandle};
use switchyard_config::{ApiKey, GatewayConfig};

const GOOD: &str = "sk-switchyard-good-7f3a";
const LIMITED: &str = "sk-switchyard-limited-19c2";
const RESTRICTED: &str = "sk-switchyard-restricted-44d0";

const DEMO_ONLY: &str = "sk-switchyard-demo-only-5b1e";

async fn start(f: &Fleet) -> GatewayHandle {
    start_with(f, Default::default()).await
}

/// A gateway with the test keys and model `aliases`.
async fn start_with(f: &Fleet, aliases: std::collections::BTreeMap<String, String>) -> GatewayHandle {
    let config = GatewayConfig {
        listen: "127.0.0.1:0".into(),
        keys: vec![
            ApiKey {
                name: "good".into(),
                sha256: hash_key(GOOD),
                ..ApiKey::default()
            },
            ApiKey {
                name: "limited".into(),
                sha256: hash_key(LIMITED),
                requests_per_min: 1,
                ..ApiKey::default()
            },
            ApiKey {
                name: "restricted".into(),
                sha256: hash_key(RESTRICTED),
                models: vec!["some-other-model".into()],
                ..ApiKey::default()
            },
            ApiKey {
                name: "demo-only".into(),
                sha256: hash_key(DEMO_ONLY),
                models: vec![DEMO_NAME.into()],
                ..ApiKey::default()
            },
        ],
        aliases,
        ..GatewayConfig::default()
    };
    gateway::start(f.client().await, "sy", &config)
        .await
        .expect("gateway starts")
}

fn curl(args: &[&str]) -> (String, String) {
    let out = Command::new("curl")
        .args(["-sS", "-N", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
    (code.to_string(), body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_works_against_the_gateway() {
    let f = fleet(|c| c.worker.capacity = 2).await;
    let g = start(&f).await;
    let base = format!("{}/v1", g.url());
    let script = repo().join("tests/python/openai_check.py");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(script)
            .args([&base, GOOD, LIMITED, RESTRICTED, DEMO_NAME])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "openai_check.py failed:\n{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("{r:#}");

    let chat = &r["chat"];
    assert_eq!(chat["object"], "chat.completion");
    assert!(!chat["content"].as_str().unwrap().trim().is_empty());
    assert!(["stop", "length"].contains(&chat["finish"].as_str().unwrap()));
    assert!(chat["prompt_tokens"].as_u64().unwrap() > 10);
    assert!(chat["completion_tokens"].as_u64().unwrap() >= 1);
    assert!(chat["cached"].is_u64());
    assert_eq!(r["greedy_same"], true, "temperature 0 is greedy");
    let s = &r["chat_stream"];
    assert!(s["chunks"].as_u64().unwrap() >= 2, "{s}");
    assert!(["stop", "length"].contains(&s["finish"].as_str().unwrap()));
    assert!(s["usage"].as_u64().unwrap() >= 1, "stream_options.include_usage");
    assert!(r["completion"]["completion_tokens"].as_u64().unwrap() >= 1);
    assert_eq!(
        r["completion_stream_same"], true,
        "streamed and whole greedy completions agree"
    );
    assert_eq!(r["models"], serde_json::json!([DEMO_NAME]));
    assert_eq!(r["embedding_dimension"], 576, "/v1/models names the embedding width");

    let err = |k: &str, class: &str, status: u64| {
        assert_eq!(r[k]["class"], class, "{k}: {}", r[k]);
        assert_eq!(r[k]["status"], status, "{k}: {}", r[k]);
    };
    err("bad_key", "AuthenticationError", 401);
    err("unknown_model", "NotFoundError", 404);
    err("presence_penalty", "BadRequestError", 400); // 3.0: outside [-2, 2]
    let p = &r["penalties"];
    assert_ne!(
        p["plain"], p["penalised"],
        "presence and frequency penalties change a greedy list: {p}"
    );
    assert_eq!(p["penalised"], p["again"], "and are deterministic: {p}");
    err("n0", "BadRequestError", 400);
    err("n1000", "BadRequestError", 400);
    assert_eq!(r["retrieve"], DEMO_NAME, "models.retrieve");
    let n3 = &r["n3"];
    assert_eq!(n3["indexes"], serde_json::json!([0, 1, 2]), "{n3}");
    assert_eq!(n3["same_again"], true, "a seeded n=3 request is reproducible: {n3}");
    assert_eq!(
        n3["streamed"], n3["texts"],
        "streamed choices equal the whole ones: {n3}"
    );
    let texts: Vec<&str> = n3["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "seeds differ per choice: {texts:?}"
    );
    assert!(
        n3["completion_tokens"].as_u64().unwrap() > n3["prompt_tokens"].as_u64().unwrap() / 4,
        "{n3}"
    );
    err("overflow", "BadRequestError", 400);
    err("top_logprobs21", "BadRequestError", 400);
    for k in [
        "embed_empty_list",
        "embed_empty_string",
        "embed_2049",
        "embed_bad_token",
    ] {
        err(k, "BadRequestError", 400);
    }
    err("embed_too_long", "BadRequestError", 400);
    assert_eq!(
        r["embed_too_long"]["code"], "context_length_exceeded",
        "{}",
        r["embed_too_long"]
    );
    let e = &r["embeddings"];
    let vec =
        |v: &serde_json::Value| -> Vec<f64> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect() };
    let one = vec(&e["one"]);
    assert_eq!(one.len(), 576, "SmolLM2-135M's width");
    assert!(
        (one.iter().map(|x| x * x).sum::<f64>().sqrt() - 1.0).abs() < 1e-4,
        "unit length"
    );
    assert_eq!(vec(&e["floats"]), one, "float and base64 give the same vector");
    assert_eq!(vec(&e["many"][2]), one, "the same text gives the same vector in a list");
    assert_eq!(e["indexes"], serde_json::json!([0, 1, 2]));
    assert_eq!(e["ids"], serde_json::json!([576, 576]), "token-id inputs");
    assert!(e["prompt_tokens"].as_u64().unwrap() >= 5, "{e}");
    let lp = &r["logprobs"];
    let whole = lp["whole"].as_array().unwrap();
    assert!(!whole.is_empty(), "{lp}");
    assert_eq!(
        lp["streamed"], lp["whole"],
        "streamed log-probabilities equal the whole ones: {lp}"
    );
    assert_eq!(lp["plain_logprobs"], true, "no logprobs unless asked");
    let joined: Vec<u8> = whole
        .iter()
        .flat_map(|t| t["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8))
        .collect();
    assert_eq!(
        String::from_utf8_lossy(&joined),
        lp["text"].as_str().unwrap(),
        "the tokens' bytes spell the answer"
    );
    for t in whole {
        let top = t["top"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{t}");
        let p = |v: &serde_json::Value| v.as_f64().unwrap();
        // Greedy: the token is the most likely one, and the alternatives come in order.
        assert_eq!(top[0][0], t["token"], "{t}");
        assert!((p(&top[0][1]) - p(&t["logprob"])).abs() < 1e-6, "{t}");
        assert!(p(&top[0][1]) >= p(&top[1][1]) && p(&top[1][1]) >= p(&top[2][1]), "{t}");
        let mass: f64 = top.iter().map(|a| p(&a[1]).exp()).sum();
        assert!(p(&t["logprob"]) <= 0.0 && mass <= 1.0 + 1e-5, "{t}");
    }
    let c = &lp["completion"];
    let n = c["tokens"].as_array().unwrap().len();
    assert!(n >= 1, "{c}");
    assert_eq!(c["token_logprobs"].as_array().unwrap().len(), n, "{c}");
    assert_eq!(c["top_logprobs"].as_array().unwrap().len(), n, "{c}");
    assert_eq!(c["top_logprobs"][0].as_object().unwrap().len(), 2, "{c}");
    assert_eq!(c["text_offset"][0], 0, "{c}");
    assert!(r["limited_first"].is_null(), "{}", r["limited_first"]);
    err("limited_second", "RateLimitError", 429);
    err("restricted", "PermissionDeniedError", 403);
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_http_sse_framing_bad_bodies_and_hangups() {
    let f = fleet(|c| c.worker.capacity = 2).await;
    let g = start(&f).await;
    let url = format!("{}/v1/chat/completions", g.url());
    let auth = format!("Authorization: Bearer {GOOD}");
    let json = "Content-Type: application/json";

    // SSE framing, with curl -N: `data: {json}` events separated by blank lines,
    // ending with `data: [DONE]`.
    let body = r#"{"model":"","messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"stream":true}"#;
    let (code, text) = curl(&[&url, "-H", &auth, "-H", json, "-d", body]);
    assert_eq!(code, "200", "{text}");
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.trim().is_empty()).collect();
    assert!(events.iter().all(|e| e.starts_with("data: ")), "{text}");
    assert_eq!(events.last().unwrap().trim(), "data: [DONE]");
    let first: serde_json::Value = serde_json::from_str(&events[0][6..]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");

    // Bad bodies: 4xx in OpenAI's error shape, never a crash.
    for (what, body, want) in [
        ("malformed JSON", "{\"model\": ", "400"),
        ("wrong type", r#"{"model":"","messages":"hello"}"#, "400"),
        ("no messages", r#"{"model":""}"#, "400"),
        ("bad role", r#"{"messages":[{"role":"tool","content":"x"}]}"#, "400"),
        (
            "unknown field",
            r#"{"messages":[{"role":"user","content":"x"}],"tools":[{}]}"#,
            "400",
        ),
        (
            "NaN-like temperature",
            r#"{"messages":[{"role":"user","content":"x"}],"temperature":-1}"#,
            "400",
        ),
    ] {
        let (code, text) = curl(&[&url, "-H", &auth, "-H", json, "-d", body]);
        assert_eq!(code, want, "{what}: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
        assert!(v["error"]["message"].is_string(), "{what}: {text}");
    }
    let big = format!(
        r#"{{"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "a".repeat(2 << 20)
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), big).unwrap();
    let data = format!("@{}", file.path().display());
    let (code, text) = curl(&[&url, "-H", &auth, "-H", json, "--data-binary", &data]);
    assert_eq!(code, "413", "{text}");
    let (code, _) = curl(&[&format!("{}/health", g.url())]);
    assert_eq!(code, "200", "the gateway keeps serving");

    // A client that hangs up mid-stream cancels its request on the worker.
    let client = f.client().await;
    let http = reqwest::Client::new();
    let mut resp = http
        .post(&url)
        .header("Authorization", format!("Bearer {GOOD}"))
        .json(
            &serde_json::json!({"messages":[{"role":"user","content":"Tell me a long story."}],
                                   "max_tokens": 4000, "stream": true, "temperature": 0.8}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let _first = resp.chunk().await.unwrap();
    // Heartbeats carry in_flight; wait until one shows the stream running.
    let deadline = Instant::now() + Duration::from_secs(5);
    while client.status().await.unwrap().workers[0].status.in_flight != 1 {
        assert!(Instant::now() < deadline, "the stream never showed as running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(resp);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = client.status().await.unwrap();
        if s.workers[0].status.in_flight == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the worker still runs the abandoned stream");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_keys_means_loopback_only_unless_told() {
    let f = fleet(|_| {}).await;
    let open = GatewayConfig {
        listen: "0.0.0.0:0".into(),
        ..GatewayConfig::default()
    };
    let err = match gateway::start(f.client().await, "sy", &open).await {
        Ok(_) => panic!("a keyless gateway listened beyond loopback"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("allow_no_keys"), "{err}");
    let told = GatewayConfig {
        allow_no_keys: true,
        ..open
    };
    let g = gateway::start(f.client().await, "sy", &told)
        .await
        .expect("allowed explicitly");
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_mid_stream_is_an_error_event_then_the_end() {
    let nats = nats();
    let url = nats.url();
    let coordinator = switchyard::node::start_coordinator(&fleet_config(&url)).await.unwrap();
    let mut worker = worker_proc(&url, "doomed");
    let client = client(&url, Duration::from_secs(2)).await;
    wait_for_workers(&client, &["doomed"], Duration::from_secs(20)).await;
    let config = GatewayConfig {
        listen: "127.0.0.1:0".into(),
        ..GatewayConfig::default()
    };
    let g = gateway::start(client, "sy", &config).await.unwrap();
    let mut resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", g.url()))
        .json(
            &serde_json::json!({"messages": [{"role": "user", "content": "Tell me a long story."}],
                                   "max_tokens": 4000, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut text = String::from_utf8_lossy(&resp.chunk().await.unwrap().unwrap()).into_owned();
    worker.kill9();
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Some(c) = tokio::time::timeout_at(deadline.into(), resp.chunk())
        .await
        .expect("the stream ends after the worker is lost")
        .unwrap()
    {
        text.push_str(&String::from_utf8_lossy(&c));
    }
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.trim().is_empty()).collect();
    let last: serde_json::Value = serde_json::from_str(&events.last().unwrap()[6..]).unwrap();
    assert_eq!(last["error"]["code"], "worker_lost", "{text}");
    assert!(!text.contains("[DONE]"), "an error ends the stream without [DONE]");
    g.shutdown().await;
    coordinator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_worker_is_503_and_a_full_worker_429_both_with_retry_after() {
    let nats = nats();
    let url = nats.url();
    let mut config = fleet_config(&url);
    config.worker.capacity = 1;
    config.worker.queue_depth = 0;
    let coordinator = switchyard::node::start_coordinator(&config).await.unwrap();
    // No wait in the fleet queue: a request no worker has room for is 429 at once.
    let listen = GatewayConfig {
        listen: "127.0.0.1:0".into(),
        queue_timeout_ms: 0,
        ..GatewayConfig::default()
    };
    let g = gateway::start(client(&url, Duration::from_secs(5)).await, "sy", &listen)
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let chat = |max_tokens: u32, stream: bool| {
        http.post(format!("{}/v1/chat/completions", g.url())).json(
            &serde_json::json!({"messages": [{"role": "user", "content": "Tell me a story."}],
                                "max_tokens": max_tokens, "stream": stream}),
        )
    };
    // No worker yet: 503 with Retry-After, OpenAI's error shape.
    let r = chat(2, false).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_worker", "{body}");

    // One worker with room for one request: a second one at the same time is 429.
    let loaded = switchyard::node::load(&config).await.unwrap();
    let worker = switchyard::node::start_worker(&config, &loaded).await.unwrap();
    let c = client(&url, Duration::from_secs(5)).await;
    wait_for_workers(&c, &["w1"], Duration::from_secs(10)).await;
    let mut long = chat(2000, true).send().await.unwrap();
    assert_eq!(long.status(), 200);
    let _ = long.chunk().await.unwrap();
    let r = chat(2, false).send().await.unwrap();
    assert_eq!(r.status(), 429);
    let wait: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(wait >= 1);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    drop(long);
    g.shutdown().await;
    worker.shutdown(Duration::from_secs(2)).await;
    coordinator.shutdown().await;
}

/// What OpenAI clients send and expect beyond the happy path: a lower-case `bearer`
/// scheme; fields at their neutral values accepted (others still refused, naming the
/// field); a GET on a POST route is a 405 in OpenAI's error shape; `GET
/// /v1/models/{id}`; a prompt over the window is `context_length_exceeded`, while a
/// request without `max_tokens` generates up to the window instead of being refused;
/// CORS only for the configured origins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_clients_defaults_errors_and_cors() {
    let f = fleet(|c| c.worker.context_len = 512).await;
    let config = GatewayConfig {
        listen: "127.0.0.1:0".into(),
        keys: vec![ApiKey {
            name: "good".into(),
            sha256: hash_key(GOOD),
            ..ApiKey::default()
        }],
        cors_origins: vec!["https://app.example.com".into()],
        ..GatewayConfig::default()
    };
    let g = gateway::start(f.client().await, "sy", &config).await.unwrap();
    let http = reqwest::Client::new();
    let chat = format!("{}/v1/chat/completions", g.url());
    let post = |body: serde_json::Value, auth: String| {
        let (http, chat) = (http.clone(), chat.clone());
        async move {
            let r = http
                .post(&chat)
                .header("Authorization", auth)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let hi = serde_json::json!([{"role": "user", "content": "Hi"}]);
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let (s, v) = post(
            serde_json::json!({"messages": hi, "max_tokens": 2}),
            format!("{scheme} {GOOD}"),
        )
        .await;
        assert_eq!(s, 200, "{scheme}: {v}");
    }
    let auth = format!("Bearer {GOOD}");
    let neutral = serde_json::json!({"messages": hi, "max_tokens": 2, "store": false, "metadata": {},
        "service_tier": "auto", "modalities": ["text"], "logit_bias": {},
        "response_format": {"type": "text"}});
    let (s, v) = post(neutral, auth.clone()).await;
    assert_eq!(s, 200, "neutral fields: {v}");
    // logit_bias: +100 on one token makes greedy decoding repeat it.
    let (s, v) = post(
        serde_json::json!({"messages": hi, "max_tokens": 3, "temperature": 0, "logit_bias": {"1234": 100}}),
        auth.clone(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(!text.is_empty() && text == text[..text.len() / 3].repeat(3), "{text:?}");
    for (field, value) in [
        ("store", serde_json::json!(true)),
        ("logit_bias", serde_json::json!({"forty-two": 5})),
        ("logit_bias", serde_json::json!({"42": 101})),
        ("modalities", serde_json::json!(["text", "audio"])),
    ] {
        let mut body = serde_json::json!({"messages": hi, "max_tokens": 2});
        body[field] = value;
        let (s, v) = post(body, auth.clone()).await;
        assert_eq!((s, v["error"]["param"].as_str()), (400, Some(field)), "{v}");
    }

    // The window is 512 tokens: a prompt over it is context_length_exceeded; one of
    // ~450 tokens without max_tokens gets what is left, not a refusal.
    let long = |words: usize| serde_json::json!([{"role": "user", "content": "word ".repeat(words)}]);
    for (body, why) in [
        (
            serde_json::json!({"messages": long(600), "max_tokens": 2}),
            "over the window",
        ),
        (
            serde_json::json!({"messages": long(450), "max_tokens": 1024}),
            "an explicit max_tokens is kept",
        ),
    ] {
        let (s, v) = post(body, auth.clone()).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (400, Some("context_length_exceeded")),
            "{why}: {v}"
        );
    }
    let (s, v) = post(
        serde_json::json!({"messages": long(450), "temperature": 0.9, "seed": 1}),
        auth.clone(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (p, c) = (
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    );
    assert!(p > 400 && p + c <= 512 && c >= 1, "prompt {p} + completion {c}");

    // Methods, models.
    let r = http.get(&chat).header("Authorization", &auth).send().await.unwrap();
    assert_eq!(r.status(), 405);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "method_not_allowed", "{v}");
    let model = |id: &str| {
        http.get(format!("{}/v1/models/{id}", g.url()))
            .header("Authorization", &auth)
            .send()
    };
    let r = model(DEMO_NAME).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["id"], DEMO_NAME);
    let r = model("no-such-model").await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["error"]["code"],
        "model_not_found"
    );

    // CORS: a preflight from the configured origin, then its request; another origin.
    let preflight = |origin: &str| {
        http.request(reqwest::Method::OPTIONS, &chat)
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .header("Access-Control-Request-Headers", "authorization, content-type")
            .send()
    };
    let r = preflight("https://app.example.com").await.unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(r.headers()["access-control-allow-origin"], "https://app.example.com");
    assert!(r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .contains("authorization"));
    let r = http
        .post(&chat)
        .header("Origin", "https://app.example.com")
        .header("Authorization", &auth)
        .json(&serde_json::json!({"messages": hi, "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], "https://app.example.com");
    let r = preflight("https://evil.example.net").await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["error"]["code"],
        "cors_origin_not_allowed"
    );
    g.shutdown().await;
}

/// Model aliases (`gateway.aliases`): the names apps hard-code reach the served model
/// — chat and embeddings answer as the model itself does, `/v1/models` lists each
/// alias whose target is served (with `alias_of`), a key restricted to the model may
/// use its aliases, and an alias of a model nobody serves is `model_not_found`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliases_answer_for_the_model_they_name() {
    let f = fleet(|_| {}).await;
    let aliases = [
        ("gpt-4o-mini", DEMO_NAME),
        ("text-embedding-3-small", DEMO_NAME),
        ("ghost", "no-such-model"),
    ];
    let g = start_with(
        &f,
        aliases.iter().map(|(a, t)| (a.to_string(), t.to_string())).collect(),
    )
    .await;
    let base = format!("{}/v1", g.url());
    let script = repo().join("tests/python/alias_check.py");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(script)
            .args([&base, GOOD, DEMO_ONLY, DEMO_NAME])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "alias_check.py failed:\n{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        r["models"],
        serde_json::json!([DEMO_NAME, "gpt-4o-mini", "text-embedding-3-small"]),
        "the served model and the aliases of it; not the alias of nothing"
    );
    assert_eq!(r["retrieve"]["id"], "gpt-4o-mini");
    assert_eq!(r["retrieve"]["alias_of"], DEMO_NAME);
    assert_eq!(r["aliased"]["content"], r["direct"]["content"], "{r}");
    assert_eq!(
        r["aliased"]["model"], "gpt-4o-mini",
        "the answer names what was asked for"
    );
    assert_eq!(r["embed_aliased"], r["embed_direct"]);
    for name in ["ghost", "gpt-4o"] {
        assert_eq!(r[name]["class"], "NotFoundError", "{name}: {}", r[name]);
    }
    assert!(
        r["ghost"]["message"].as_str().unwrap().contains("no-such-model"),
        "{}",
        r["ghost"]
    );
    g.shutdown().await;
}
