//! LoRA adapters across the fleet: workers load adapters made here
//! (`scripts/make-lora.py`, PEFT and GGUF), heartbeats announce them, the
//! coordinator routes a request naming one only to workers holding it, an adapter
//! nobody holds is `unknown_model` naming it, an operator loads and unloads adapters
//! at run time (coordinators hear of it at once), a bad adapter at start is reported
//! and the worker serves the rest, and the OpenAI gateway takes `model:adapter`.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use switchyard::{node, Client, GenerateRequest};
use switchyard_config::AdapterConfig;
use switchyard_messages::{AdapterOp, AdapterRequest, ErrorCode, PROTOCOL_VERSION};

const NAME: &str = "smol";
const PROMPT: &str = "The capital of France is";

fn request(adapter: Option<&str>) -> GenerateRequest {
    let mut r = GenerateRequest::generate(Client::new_request_id(), NAME, PROMPT);
    r.config.max_tokens = 12;
    r.head.adapter = adapter.map(str::to_string);
    r
}

/// The text and the worker that served it, or the error's code and message.
async fn ask(client: &Client, adapter: Option<&str>) -> Result<(String, String), (ErrorCode, String)> {
    let stream = client.generate(request(adapter)).await;
    let done = match stream {
        Ok(s) => s.collect().await,
        Err(e) => Err(e),
    };
    match done {
        Ok(c) => Ok((c.text, c.worker_id)),
        Err(switchyard::ClientError::Remote { error, .. }) => Err((error.code, error.message)),
        Err(e) => panic!("{e}"),
    }
}

fn op(op: AdapterOp, name: &str, path: &str) -> AdapterRequest {
    AdapterRequest {
        v: PROTOCOL_VERSION,
        op,
        name: name.into(),
        path: path.into(),
        scale: 1.0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adapter_requests_go_only_to_workers_holding_the_adapter() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (make_lora(dir.path(), 1), make_lora(dir.path(), 2));
    let nats = nats();
    let url = nats.url();
    let mut config = fleet_config(&url);
    config.worker.model_name = NAME.into();
    config.worker.threads = 1;
    let coordinator = node::start_coordinator(&config).await.unwrap();
    let adapter = |name: &str, path: &Path| AdapterConfig {
        name: name.into(),
        path: path.display().to_string(),
        scale: 1.0,
    };
    let mut workers = Vec::new();
    for (id, adapters) in [
        ("w-one", vec![adapter("one", &one)]),
        // A missing file and a file for another shape: reported, the rest load.
        (
            "w-two",
            vec![
                adapter("two", &two.join("adapter.gguf")),
                adapter("gone", &dir.path().join("missing")),
                adapter("wrong", &demo_model()),
            ],
        ),
        ("w-base", vec![]),
    ] {
        let mut c = config.clone();
        c.worker.id = id.into();
        c.worker.adapters = adapters;
        c.validate().unwrap();
        let loaded = node::load(&c).await.unwrap();
        workers.push((node::start_worker(&c, &loaded).await.unwrap(), loaded));
    }
    let client = client(&url, Duration::from_secs(20)).await;
    wait_for_workers(&client, &["w-one", "w-two", "w-base"], Duration::from_secs(10)).await;

    // The models list names each adapter under its base, with who holds it.
    let models = client.models().await.unwrap();
    let smol = models.models.iter().find(|m| m.name == NAME).unwrap();
    let held: Vec<(&str, &[String])> = smol
        .adapters
        .iter()
        .map(|a| (a.name.as_str(), &a.workers[..]))
        .collect();
    assert_eq!(
        held,
        [("one", &["w-one".to_string()][..]), ("two", &["w-two".to_string()][..])]
    );

    // Routing: an adapter's requests land on its worker, every time.
    let (base, _) = ask(&client, None).await.unwrap();
    let mut texts = Vec::new();
    for name in ["one", "two"] {
        for _ in 0..3 {
            let (text, worker) = ask(&client, Some(name)).await.unwrap();
            assert_eq!(worker, format!("w-{name}"), "adapter {name} ran on {worker}");
            texts.push(text);
        }
    }
    assert_eq!(texts[0], texts[1], "greedy: the same answer each time");
    assert_ne!(texts[0], base, "adapter one changes the answer");
    assert_ne!(texts[3], base, "adapter two changes the answer");
    assert_ne!(texts[0], texts[3]);

    // One nobody holds: unknown_model, naming it and what is loaded.
    let (code, message) = ask(&client, Some("nope")).await.unwrap_err();
    assert_eq!(code, ErrorCode::UnknownModel);
    assert!(
        message.contains("\"nope\"") && message.contains("smol:one"),
        "{message}"
    );
    // Pinned to a worker that lacks it: refused, naming the adapter.
    let mut pinned = request(Some("two"));
    pinned.head.worker = Some("w-one".into());
    let e = match client.generate(pinned).await {
        Ok(s) => s.collect().await.unwrap_err(),
        Err(e) => e,
    };
    assert!(e.to_string().contains("adapter \"two\""), "{e}");

    // Run time: unloading stops its requests within a heartbeat (one is sent at once);
    // loading it elsewhere moves them there.
    let reply = client
        .adapters("w-one", op(AdapterOp::Unload, "one", ""))
        .await
        .unwrap();
    assert!(reply.adapters.is_empty());
    let unloaded = Instant::now();
    loop {
        match ask(&client, Some("one")).await {
            Err((ErrorCode::UnknownModel, _)) => break,
            other => assert!(
                unloaded.elapsed() < Duration::from_millis(config.worker.heartbeat_ms * 2),
                "still routed {:?} after the unload: {other:?}",
                unloaded.elapsed()
            ),
        }
    }
    let path = one.display().to_string();
    let reply = client
        .adapters("w-base", op(AdapterOp::Load, "one", &path))
        .await
        .unwrap();
    assert_eq!(reply.adapters.len(), 1);
    let loaded = Instant::now();
    let (text, worker) = loop {
        match ask(&client, Some("one")).await {
            Ok(done) => break done,
            Err(e) => assert!(loaded.elapsed() < Duration::from_secs(2), "{e:?}"),
        }
    };
    assert_eq!((text, worker.as_str()), (texts[0].clone(), "w-base"));
    // A bad load is an error naming the adapter; the worker keeps what it had.
    let e = client
        .adapters("w-base", op(AdapterOp::Load, "bad", "/no/such/adapter"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("\"bad\""), "{e}");
    let listed = client.adapters("w-base", op(AdapterOp::List, "", "")).await.unwrap();
    assert_eq!(
        listed.adapters.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
        ["one"]
    );

    // The OpenAI gateway: `model:adapter`, with the official client.
    let g = switchyard::gateway::start(
        client.clone(),
        "sy",
        &switchyard_config::GatewayConfig {
            listen: "127.0.0.1:0".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (base_url, script) = (format!("{}/v1", g.url()), repo().join("tests/python/adapter_check.py"));
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(script)
            .args([&base_url, NAME, "two"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["models"]["smol:two"], NAME, "{r}");
    assert_eq!(r["models"]["smol:one"], NAME, "{r}");
    assert_eq!(r["base"]["text"], base.as_str(), "{r}");
    assert_eq!(r["adapted"]["text"], texts[3].as_str(), "{r}");
    assert_eq!(r["adapted"]["model"], "smol:two", "{r}");
    assert_eq!(r["unknown"]["status"], 404, "{r}");
    g.shutdown().await;
    drop((workers, coordinator));
}

/// A `rocm` worker (its supervised llama-server on the CPU here) with
/// `worker.adapters`: the GGUF LoRA goes on the server's command line and is served by
/// name, a PEFT directory (which llama-server cannot read) is reported and left out,
/// base requests stay the base model's, and the coordinator's `cached_tokens`
/// prediction holds across adapter changes (llama-server clears a slot whose adapters
/// change; the slot book counts a slot only for its own adapter).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_llama_server_worker_serves_the_adapters_it_started_with() {
    let Some(bin) = llama_server_bin() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (make_lora(dir.path(), 1), make_lora(dir.path(), 2));
    let nats = nats();
    let url = nats.url();
    let mut config = fleet_config(&url);
    config.worker.model_name = NAME.into();
    config.worker.id = "w-llama".into();
    config.worker.backend = "rocm".into();
    config.worker.gpu_allow_cpu = true;
    config.worker.llama_server_bin = bin.display().to_string();
    config.worker.llama_server_args = "-fa off".into();
    config.worker.parallel_slots = 2;
    config.worker.threads = 1;
    config.worker.adapters = vec![
        AdapterConfig {
            name: "two".into(),
            path: two.join("adapter.gguf").display().to_string(),
            scale: 1.0,
        },
        AdapterConfig {
            name: "one".into(),
            path: one.display().to_string(),
            scale: 1.0,
        },
    ];
    config.validate().unwrap();
    let coordinator = node::start_coordinator(&config).await.unwrap();
    let mut loaded = node::load(&config).await.unwrap();
    let worker = node::start_worker(&config, &loaded).await.unwrap();
    let client = client(&url, Duration::from_secs(30)).await;
    wait_for_workers(&client, &["w-llama"], Duration::from_secs(10)).await;
    let names: Vec<String> = loaded.model.adapters().into_iter().map(|a| a.name).collect();
    assert_eq!(names, ["two"], "the PEFT directory is not llama-server's to load");

    let doc = "Notes on the harbour. The harbour was studied from many sides, with careful records \
               of what was seen, measured and argued about by the people who cared for it.\n";
    let ask = |adapter: Option<&str>, question: &str| {
        let mut r = GenerateRequest::generate(Client::new_request_id(), NAME, format!("{doc}Q: {question}\nA:"));
        r.config.max_tokens = 8;
        r.head.adapter = adapter.map(str::to_string);
        let client = client.clone();
        async move {
            let done = client.generate(r).await.unwrap().collect().await.unwrap();
            let m = &done.metrics;
            assert_eq!(
                m.predicted_cached_tokens,
                Some(m.cached_tokens),
                "the coordinator predicted what the server reused: {m:?}"
            );
            settle(&client).await;
            (done.text, m.cached_tokens)
        }
    };
    let (base, _) = ask(None, "What was studied?").await;
    let (adapted, cached) = ask(Some("two"), "What was studied?").await;
    assert_ne!(adapted, base, "the adapter changes the answer");
    assert_eq!(cached, 0, "KV computed without the adapter is not the adapter's");
    let (again, cached) = ask(Some("two"), "Who cared for it?").await;
    assert!(cached > 0, "the adapter's own prefix is reused");
    let _ = again;
    let (base_again, _) = ask(None, "What was studied?").await;
    assert_eq!(
        base_again, base,
        "a base request after adapter ones is the base model's"
    );
    let e = client
        .adapters("w-llama", op(AdapterOp::Load, "three", &one.display().to_string()))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("has not loaded it"), "{e}");
    drop((worker, coordinator));
    loaded.stop();
}
