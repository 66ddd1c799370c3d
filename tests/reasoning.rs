//! Reasoning models: a `<think>` section split from the answer on every API the
//! gateway speaks (chat completions' `reasoning_content`, Anthropic's `thinking`
//! blocks, a Responses `reasoning` item, Ollama's `thinking`), whole and streamed,
//! and the thinking switches (`chat_template_kwargs`, `reasoning_effort`, Anthropic's
//! `thinking`, Ollama's `think`) reaching the chat template — through the official
//! clients (tests/python/reasoning_check.py) against a real gateway, coordinator
//! and CPU workers serving random-weight Qwen3 models: one with Qwen3's own chat
//! template (the model opens the section) and one whose template opens it, as
//! DeepSeek-R1's does. And over NATS: a stream that loses its worker in the middle
//! of the reasoning resumes there, and the split goes on as if nothing happened; a
//! llama.cpp worker splits a template-opened section and passes the variables on,
//! and so does an MLX worker.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use switchyard::node;
use switchyard_messages::{Message, Token};
use switchyard_procs::llama_server::LlamaServer;

/// Qwen3's template, and the same with the assistant's opener leaving `<think>` open.
fn template(opened: bool) -> String {
    let t = std::fs::read_to_string(repo().join("tests/fixtures/qwen3-chat-template.jinja")).unwrap();
    if !opened {
        return t;
    }
    let opener = r"{{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking";
    assert!(t.contains(opener), "the fixture's assistant opener moved");
    t.replace(
        opener,
        r"{{- '<|im_start|>assistant\n<think>\n' }}
    {%- if enable_thinking",
    )
}

/// A random-weight Qwen3 GGUF named `name` in `dir` with `template`.
fn make_model(dir: &Path, name: &str, template: &str) -> PathBuf {
    let jinja = dir.join(format!("{name}.jinja"));
    std::fs::write(&jinja, template).unwrap();
    let path = dir.join(format!("{name}.gguf"));
    let out = Command::new(python())
        .arg(repo().join("scripts/make-random-qwen-gguf.py"))
        .arg(demo_model())
        .arg(&path)
        .args(["qwen3", "1234", "f32", "tiny"])
        .arg(&jinja)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_is_split_on_every_api_through_the_official_clients() {
    let dir = tempfile::tempdir().unwrap();
    let thinks = make_model(dir.path(), "qwen3-thinks", &template(false));
    let opened = make_model(dir.path(), "qwen3-opened", &template(true));
    let f = fleet(|c| c.worker.model = thinks.display().to_string()).await;
    let mut c = f.config.clone();
    c.worker.id = "w2".into();
    c.worker.model = opened.display().to_string();
    let loaded = node::load(&c).await.unwrap();
    let w2 = node::start_worker(&c, &loaded).await.unwrap();
    let client = f.client().await;
    wait_for_workers(&client, &["w1", "w2"], std::time::Duration::from_secs(10)).await;
    let names: Vec<String> = client
        .models()
        .await
        .unwrap()
        .models
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert!(
        names.iter().any(|n| n == "qwen3-thinks") && names.iter().any(|n| n == "qwen3-opened"),
        "{names:?}"
    );

    let g = switchyard::gateway::start(
        f.client().await,
        "sy",
        &switchyard_config::GatewayConfig {
            listen: "127.0.0.1:0".into(),
            ..Default::default()
        },
    )
    .await
    .expect("gateway starts");
    let args = vec![g.url(), "qwen3-thinks".into(), "qwen3-opened".into()];
    let r = run_check(python(), "reasoning_check.py", args).await;
    // The split is the section's text: a real split, not an empty one.
    assert!(r["chat"]["reasoning"].as_str().unwrap().len() >= 5, "{r:#}");
    assert!(r["opened"]["chat"]["reasoning"].as_str().unwrap().len() >= 5, "{r:#}");
    stop_workers(vec![(w2, loaded)]).await;
}

/// Over NATS, without a gateway: a stream with `split_reasoning` marks the
/// section's tokens, keeps every token (ids and count as without the split), and a
/// stream resumed in the middle of the reasoning (its first worker gone) goes on
/// splitting exactly as the uninterrupted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_split_marks_tokens_and_survives_a_resume_mid_reasoning() {
    let dir = tempfile::tempdir().unwrap();
    let opened = make_model(dir.path(), "qwen3-opened", &template(true));
    let f = fleet(|c| c.worker.model = opened.display().to_string()).await;
    let client = f.client().await;
    let ask = |split: bool, max_tokens: u32| {
        let mut r = switchyard::GenerateRequest::chat(
            switchyard::Client::new_request_id(),
            "qwen3-opened",
            vec![Message::new("user", "Why is the sky blue?")],
        );
        r.config.max_tokens = max_tokens;
        r.config.constraint = Some(switchyard_messages::Constraint::Regex {
            pattern: "[a-z]{5,12}( [a-z]{2,8}){2,4}\n</think>\n\n[a-z]{3,12}".into(),
        });
        r.split_reasoning = split;
        r
    };
    let whole = client.chat(ask(true, 80)).await.unwrap().collect().await.unwrap();
    let raw = client.chat(ask(false, 80)).await.unwrap().collect().await.unwrap();
    assert_eq!(token_ids(&whole), token_ids(&raw), "the split changes no token");
    assert_eq!(raw.text, format!("{}\n</think>\n\n{}", whole.reasoning, whole.text));
    assert!(whole.reasoning.contains(' ') && !whole.text.is_empty(), "{whole:?}");
    let first_answer = whole
        .tokens
        .iter()
        .position(|t: &Token| !t.reasoning && !t.text.is_empty())
        .unwrap();
    assert!(whole.tokens[..first_answer]
        .iter()
        .all(|t| t.reasoning || t.text.is_empty()));

    // Resume in the middle of the reasoning: the first tokens (all reasoning) were
    // given by a worker that is gone; another goes on from them.
    let given = 3;
    assert!(
        whole.tokens[..given].iter().all(|t| t.reasoning),
        "{:?}",
        &whole.tokens[..given]
    );
    let mut rest = ask(true, 80 - given as u32);
    rest.resume_tokens = whole.tokens[..given].iter().map(|t| t.id).collect();
    let resumed = client.chat(rest).await.unwrap().collect().await.unwrap();
    let given_text: String = whole.tokens[..given].iter().map(|t| t.text.as_str()).collect();
    assert_eq!(
        (format!("{given_text}{}", resumed.reasoning), resumed.text.clone()),
        (whole.reasoning.clone(), whole.text.clone()),
        "resumed mid-reasoning, the split goes on"
    );
}

/// A llama.cpp worker: it tells a template-opened section from the server's own
/// template (compiled on the worker for that), and the template variables reach
/// the server's renderer (`/apply-template`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llama_cpp_worker_splits_a_template_opened_section_and_passes_kwargs() {
    let Some(bin) = llama_server_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let opened = make_model(dir.path(), "qwen3-opened", &template(true));
    let thinks = make_model(dir.path(), "qwen3-thinks", &template(false));
    let start = |model: PathBuf| {
        let bin = bin.clone();
        async move { LlamaServer::start_with(&bin, &model, 1, 1, &["--jinja"]).await.unwrap() }
    };
    let (server_opened, server_thinks) = (start(opened).await, start(thinks).await);
    let f = fleet(|c| {
        c.worker.backend = "llama_cpp".into();
        c.worker.llama_url = server_opened.url.clone();
        c.worker.model_name = "qwen3-opened".into();
    })
    .await;
    let mut c = f.config.clone();
    c.worker.id = "w2".into();
    c.worker.llama_url = server_thinks.url.clone();
    c.worker.model_name = "qwen3-thinks".into();
    let loaded = node::load(&c).await.unwrap();
    let w2 = node::start_worker(&c, &loaded).await.unwrap();
    let client = f.client().await;
    wait_for_workers(&client, &["w1", "w2"], std::time::Duration::from_secs(10)).await;
    let ask = |model: &str, split: bool, kwargs: &str| {
        let mut r = switchyard::GenerateRequest::chat(
            switchyard::Client::new_request_id(),
            model,
            vec![Message::new("user", "Why is the sky blue?")],
        );
        r.config.max_tokens = 12;
        r.split_reasoning = split;
        r.chat_template_kwargs = kwargs.into();
        r
    };
    // Random weights never close the section the template opened: all reasoning.
    let split = client
        .chat(ask("qwen3-opened", true, ""))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let raw = client
        .chat(ask("qwen3-opened", false, ""))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(token_ids(&split), token_ids(&raw));
    assert!(!raw.text.trim().is_empty() && !raw.text.contains("</think>"), "{raw:?}");
    assert_eq!((split.reasoning.as_str(), split.text.as_str()), (raw.text.trim(), ""));
    // Thinking off closes an empty section in Qwen3's prompt: more prompt tokens.
    let prompt = |kwargs: &'static str| {
        let client = client.clone();
        let req = ask("qwen3-thinks", true, kwargs);
        async move {
            client
                .chat(req)
                .await
                .unwrap()
                .collect()
                .await
                .unwrap()
                .metrics
                .prompt_tokens
        }
    };
    let (on, off) = (prompt("").await, prompt(r#"{"enable_thinking": false}"#).await);
    assert!(
        off > on,
        "enable_thinking reaches llama-server's template: {on} vs {off}"
    );
    stop_workers(vec![(w2, loaded)]).await;
}

/// An MLX worker (MLX's CPU build here) tells a template-opened section from its
/// model's template (compiled on the worker; the bridge renders with the same one):
/// the demo model with ChatML whose assistant opener leaves `<think>` open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mlx_worker_splits_a_template_opened_section() {
    let dir = tempfile::tempdir().unwrap();
    let src = converted_demo_model();
    let model = dir.path().join("smol-opened");
    std::fs::create_dir(&model).unwrap();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let name = e.file_name();
        if name != "tokenizer_config.json" && name != "chat_template.jinja" {
            std::os::unix::fs::symlink(e.path(), model.join(&name)).unwrap();
        }
    }
    let opened = switchyard_workers::engine::text::template::CHATML
        .replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>\n'");
    assert_ne!(opened, switchyard_workers::engine::text::template::CHATML);
    let mut tc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer_config.json")).unwrap()).unwrap();
    tc["chat_template"] = opened.clone().into();
    std::fs::write(model.join("tokenizer_config.json"), tc.to_string()).unwrap();
    std::fs::write(model.join("chat_template.jinja"), &opened).unwrap();
    let f = fleet(|c| {
        c.worker.model = model.display().to_string();
        c.worker.model_name = "smol-opened".into();
        c.worker.backend = "metal".into();
        c.worker.mlx_allow_cpu = true;
        c.worker.mlx_python = python().display().to_string();
    })
    .await;
    let client = f.client().await;
    let ask = |split: bool| {
        let mut r = switchyard::GenerateRequest::chat(
            switchyard::Client::new_request_id(),
            "smol-opened",
            vec![Message::new("user", "What is the capital of France?")],
        );
        r.config.max_tokens = 16;
        r.split_reasoning = split;
        r
    };
    let split = client.chat(ask(true)).await.unwrap().collect().await.unwrap();
    let raw = client.chat(ask(false)).await.unwrap().collect().await.unwrap();
    assert_eq!(token_ids(&split), token_ids(&raw));
    // The answer began inside the section: up to a `</think>` (if the model wrote
    // one) it is reasoning.
    let (reasoning, answer) = raw.text.split_once("</think>").unwrap_or((&raw.text, ""));
    assert!(!reasoning.trim().is_empty(), "{raw:?}");
    assert_eq!(
        (split.reasoning.as_str(), split.text.as_str()),
        (reasoning.trim(), answer.trim_start()),
        "raw: {:?}",
        raw.text
    );
}
